//! What a simulated kubelet says about its Node: the object it registers,
//! the conditions it reports (healthy by default, bent by fault switches),
//! and whether what the API server holds needs correcting. Pure: no I/O,
//! the clock is passed in.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::time::Duration;

/// What a Node is made from.
#[derive(Debug, Clone, Default)]
pub struct NodeSpec {
    pub name: String,
    pub provider_id: String,
    pub internal_ip: String,
    pub hostname: String,
    pub zone: String,
    pub version: Option<String>,
    /// Labels it registers with besides its own (`--node-labels`).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Taints it registers with (`--register-with-taints`; Node taint
    /// objects).
    pub taints: Vec<Value>,
}

/// Resources every simulated Node offers the scheduler.
pub const CAPACITY_CPU: &str = "4";
/// Memory of every simulated Node.
pub const CAPACITY_MEMORY: &str = "16Gi";
/// Pods per Node, the kubelet's default `--max-pods`.
pub const CAPACITY_PODS: &str = "110";
/// Local disk of every simulated Node.
pub const CAPACITY_EPHEMERAL_STORAGE: &str = "100Gi";

/// The kubelet version reported when the machine names none.
const DEFAULT_KUBELET_VERSION: &str = "v1.20.2";

/// A condition forced by a fault switch, until `until` (or for good).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConditionOverride {
    /// Condition type: `Ready`, `MemoryPressure`, `NetworkUnavailable`, or any other.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// How long the override lasts; absent: until cleared.
    #[serde(default)]
    pub seconds: Option<u64>,
}

impl ConditionOverride {
    /// Checks what the admin API accepts.
    pub fn validate(&self) -> Result<(), String> {
        if self.type_.is_empty() {
            return Err("type must not be empty".into());
        }
        if !matches!(self.status.as_str(), "True" | "False" | "Unknown") {
            return Err(format!(
                "status must be True, False or Unknown, got {:?}",
                self.status
            ));
        }
        Ok(())
    }
}

/// The conditions a healthy kubelet reports: (type, status, reason, message).
const HEALTHY: [(&str, &str, &str, &str); 4] = [
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "False",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
    (
        "Ready",
        "True",
        "KubeletReady",
        "simulated kubelet is posting ready status",
    ),
];

/// The conditions to report: the healthy set with `overrides` (in force at
/// `now`) replacing or adding types. A transition time is kept from
/// `observed` when the status there is the same, as a kubelet does.
pub fn desired_conditions(
    overrides: &[(ConditionOverride, Option<std::time::Instant>)],
    observed: Option<&Node>,
    now: Timestamp,
    instant: std::time::Instant,
) -> Vec<NodeCondition> {
    let mut wanted: Vec<(String, String, String, String)> = HEALTHY
        .iter()
        .map(|(t, s, r, m)| (t.to_string(), s.to_string(), r.to_string(), m.to_string()))
        .collect();
    for (o, until) in overrides {
        if until.is_some_and(|u| instant >= u) {
            continue;
        }
        let entry = (
            o.type_.clone(),
            o.status.clone(),
            o.reason
                .clone()
                .unwrap_or_else(|| "SimulatedFault".to_string()),
            o.message.clone().unwrap_or_else(|| {
                format!(
                    "simulated kubelet was told to report {}={}",
                    o.type_, o.status
                )
            }),
        );
        match wanted.iter_mut().find(|w| w.0 == o.type_) {
            Some(w) => *w = entry,
            None => wanted.push(entry),
        }
    }
    let previous = observed
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref());
    wanted
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let kept = previous
                .and_then(|p| p.iter().find(|c| c.type_ == type_ && c.status == status))
                .and_then(|c| c.last_transition_time.clone());
            NodeCondition {
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: Some(kept.unwrap_or(Time(now))),
                message: Some(message),
                reason: Some(reason),
                status,
                type_,
            }
        })
        .collect()
}

/// Whether the Node's stored conditions differ from what the kubelet would
/// report (another type, status or reason; a condition missing or extra):
/// for example the node-lifecycle controller set `Ready=Unknown` while the
/// kubelet was away.
pub fn conditions_differ(desired: &[NodeCondition], observed: Option<&Node>) -> bool {
    let Some(current) = observed
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
    else {
        return true;
    };
    current.len() != desired.len()
        || desired.iter().any(|d| {
            !current
                .iter()
                .any(|c| c.type_ == d.type_ && c.status == d.status && c.reason == d.reason)
        })
}

/// The Node object a kubelet registers (status included: the API server
/// keeps a Node's status on create).
pub fn node_object(spec: &NodeSpec, conditions: &[NodeCondition]) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": spec.zone,
        "capstan.dev/simulated": "true",
    });
    if let Some(v) = &spec.version {
        labels["capstan.dev/version"] = json!(v.replace('+', "_"));
    }
    for (k, v) in &spec.labels {
        labels[k.as_str()] = json!(v);
    }
    let resources = json!({
        "cpu": CAPACITY_CPU,
        "memory": CAPACITY_MEMORY,
        "pods": CAPACITY_PODS,
        "ephemeral-storage": CAPACITY_EPHEMERAL_STORAGE,
    });
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": spec.name, "labels": labels },
        "spec": { "providerID": spec.provider_id, "taints": spec.taints },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [
                { "type": "InternalIP", "address": spec.internal_ip },
                { "type": "Hostname", "address": spec.hostname },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": spec.name,
                "systemUUID": spec.name,
                "bootID": spec.provider_id,
                "kernelVersion": "simulated",
                "osImage": "Capstan simulated node",
                "containerRuntimeVersion": "sim://1.0",
                "kubeletVersion": kubelet_version(spec.version.as_deref()),
                "kubeProxyVersion": kubelet_version(spec.version.as_deref()),
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    })
}

/// `v1.30.0` stays; anything that is not a `vX.Y…` version becomes the
/// control plane's own.
fn kubelet_version(version: Option<&str>) -> String {
    match version {
        Some(v) if v.starts_with('v') && v[1..].starts_with(|c: char| c.is_ascii_digit()) => {
            v.to_string()
        }
        _ => DEFAULT_KUBELET_VERSION.to_string(),
    }
}

/// How long a Node's Lease says it is valid: the kubelet's 40 s default, or
/// four heartbeats when they are slower.
pub fn lease_duration_seconds(heartbeat: Duration) -> i64 {
    (heartbeat.as_secs() as i64 * 4).max(40)
}

/// The Node's Lease in `kube-node-lease`, owned by the Node so that garbage
/// collection removes it with the Node.
pub fn lease_object(node: &str, node_uid: &str, heartbeat: Duration, now: Timestamp) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": "kube-node-lease",
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": node_uid,
            }],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": lease_duration_seconds(heartbeat),
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use std::time::Instant;

    fn node_with(conditions: Vec<NodeCondition>) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(conditions),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn status_of<'a>(conditions: &'a [NodeCondition], type_: &str) -> Option<&'a str> {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.as_str())
    }

    fn fault(type_: &str, status: &str) -> ConditionOverride {
        ConditionOverride {
            type_: type_.into(),
            status: status.into(),
            reason: None,
            message: None,
            seconds: None,
        }
    }

    #[test]
    fn a_healthy_node_is_ready_with_no_pressure() {
        let c = desired_conditions(&[], None, Timestamp::now(), Instant::now());
        assert_eq!(status_of(&c, "Ready"), Some("True"));
        for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
            assert_eq!(status_of(&c, t), Some("False"), "{t}");
        }
        assert!(conditions_differ(&c, None), "nothing stored yet");
        assert!(!conditions_differ(&c, Some(&node_with(c.clone()))));
    }

    #[test]
    fn overrides_replace_or_add_types_until_they_expire() {
        let now = Instant::now();
        let faults = vec![
            (fault("Ready", "False"), None),
            (
                fault("NetworkUnavailable", "True"),
                Some(now + Duration::from_secs(5)),
            ),
        ];
        let c = desired_conditions(&faults, None, Timestamp::now(), now);
        assert_eq!(status_of(&c, "Ready"), Some("False"));
        assert_eq!(status_of(&c, "NetworkUnavailable"), Some("True"));
        assert_eq!(c.len(), 5);
        let later = desired_conditions(
            &faults,
            None,
            Timestamp::now(),
            now + Duration::from_secs(6),
        );
        assert_eq!(status_of(&later, "NetworkUnavailable"), None, "expired");
        assert_eq!(status_of(&later, "Ready"), Some("False"), "no expiry");
    }

    #[test]
    fn what_the_lifecycle_controller_wrote_is_corrected() {
        let healthy = desired_conditions(&[], None, Timestamp::now(), Instant::now());
        let mut unknown = healthy.clone();
        for c in &mut unknown {
            c.status = "Unknown".into();
            c.reason = Some("NodeStatusUnknown".into());
        }
        assert!(conditions_differ(&healthy, Some(&node_with(unknown))));
        // A leftover condition from an expired fault is removed too.
        let mut extra = healthy.clone();
        extra.push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "True".into(),
            ..Default::default()
        });
        assert!(conditions_differ(&healthy, Some(&node_with(extra))));
    }

    #[test]
    fn transition_times_survive_an_unchanged_status() {
        let then = Timestamp::from_second(1_700_000_000).unwrap();
        let first = desired_conditions(&[], None, then, Instant::now());
        let now = Timestamp::now();
        let again = desired_conditions(&[], Some(&node_with(first)), now, Instant::now());
        let ready = again.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Some(Time(then)));
        assert_eq!(ready.last_heartbeat_time, Some(Time(now)));
        let flipped = desired_conditions(
            &[(fault("Ready", "False"), None)],
            Some(&node_with(again)),
            now,
            Instant::now(),
        );
        let ready = flipped.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Some(Time(now)));
    }

    #[test]
    fn overrides_are_validated() {
        assert!(fault("Ready", "Maybe").validate().is_err());
        assert!(fault("", "True").validate().is_err());
        assert!(fault("NetworkUnavailable", "True").validate().is_ok());
    }

    #[test]
    fn registered_nodes_are_schedulable_and_describe_themselves() {
        let spec = NodeSpec {
            name: "sim-i-000001".into(),
            provider_id: "sim://i-000001".into(),
            internal_ip: "10.0.0.1".into(),
            hostname: "w.sim.internal".into(),
            zone: "zone-a".into(),
            version: Some("v1.30.0+k3s".into()),
            ..Default::default()
        };
        let node = node_object(&spec, &[]);
        assert_eq!(node["status"]["allocatable"]["pods"], CAPACITY_PODS);
        assert_eq!(node["spec"]["providerID"], "sim://i-000001");
        assert_eq!(
            node["metadata"]["labels"]["capstan.dev/version"],
            "v1.30.0_k3s"
        );
        assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.30.0+k3s");
        assert_eq!(kubelet_version(Some("latest")), DEFAULT_KUBELET_VERSION);
    }

    #[test]
    fn leases_outlive_a_few_missed_heartbeats() {
        assert_eq!(lease_duration_seconds(Duration::from_secs(2)), 40);
        assert_eq!(lease_duration_seconds(Duration::from_secs(30)), 120);
        let lease = lease_object("n1", "uid-1", Duration::from_secs(10), Timestamp::now());
        assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        let renew = lease["spec"]["renewTime"].as_str().unwrap();
        // MicroTime: exactly six fractional digits, as the API server parses it.
        let fraction = renew.split('.').nth(1).unwrap();
        assert_eq!(fraction.trim_end_matches('Z').len(), 6, "{renew}");
    }
}
