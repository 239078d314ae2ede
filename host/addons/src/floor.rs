//! The host's floor: what no grant can allow an addon to render.
//!
//! Object grants say which kinds (and, for the kinds that hand out rights,
//! which named objects) a plugin may apply. The floor sits below every
//! grant: a render that binds `cluster-admin` or `system:masters`, grants
//! `*` verbs on `*` resources, or runs a pod above the Pod Security level
//! the Plugin's grant names (`Baseline` unless the admin says `Privileged`)
//! is refused whole, naming the object and the rule, before anything is
//! applied.

use crate::{Object, pod_spec_path};
use capstan_api::PodSecurityLevel;
use serde_json::Value;
use std::fmt;

/// One object that breaks the floor, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The object (`ClusterRoleBinding evil`).
    pub object: String,
    /// The rule, in words.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.rule)
    }
}

/// Capabilities the Baseline level lets a container add (Kubernetes Pod
/// Security Standards).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Every floor violation in a render (empty: the render may be applied).
pub fn violations(objects: &[Object], level: PodSecurityLevel) -> Vec<Violation> {
    let mut found = Vec::new();
    for object in objects {
        let mut refuse = |rule: String| {
            found.push(Violation {
                object: object.entry().to_string(),
                rule,
            })
        };
        match (object.group(), object.kind.as_str()) {
            ("rbac.authorization.k8s.io", "ClusterRoleBinding" | "RoleBinding") => {
                binding_rules(&object.value, &mut refuse)
            }
            ("rbac.authorization.k8s.io", "ClusterRole" | "Role") => {
                role_rules(&object.value, &mut refuse)
            }
            _ => {}
        }
        if level == PodSecurityLevel::Baseline
            && let Some(path) = pod_spec_path(&object.kind)
            && let Some(spec) = object.value.pointer(&format!("/{}", path.join("/")))
        {
            baseline_rules(spec, &mut refuse);
        }
    }
    found
}

fn binding_rules(binding: &Value, refuse: &mut impl FnMut(String)) {
    let role = &binding["roleRef"];
    if role["kind"] == "ClusterRole" && role["name"] == "cluster-admin" {
        refuse("binds ClusterRole cluster-admin, which no addon grant allows".into());
    }
    for subject in binding["subjects"].as_array().into_iter().flatten() {
        if subject["kind"] == "Group" && subject["name"] == "system:masters" {
            refuse("binds group system:masters, which no addon grant allows".into());
        }
    }
}

fn role_rules(role: &Value, refuse: &mut impl FnMut(String)) {
    let has_star = |rule: &Value, field: &str| {
        rule[field]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i == "*"))
    };
    for (i, rule) in role["rules"].as_array().into_iter().flatten().enumerate() {
        if has_star(rule, "verbs") && has_star(rule, "resources") {
            refuse(format!(
                "rules[{i}] grants every verb on every resource (`*` on `*`), which no addon grant allows"
            ));
        }
    }
}

fn baseline_rules(spec: &Value, refuse: &mut impl FnMut(String)) {
    let above = "above Pod Security level Baseline (the Plugin's spec.grants.podSecurity)";
    for field in ["hostPID", "hostIPC", "hostNetwork"] {
        if spec[field] == true {
            refuse(format!("sets {field}: true, {above}"));
        }
    }
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        if volume.get("hostPath").is_some() {
            refuse(format!(
                "mounts hostPath volume {}, {above}",
                volume["name"].as_str().unwrap_or("?")
            ));
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for container in spec[list].as_array().into_iter().flatten() {
            let name = container["name"].as_str().unwrap_or("?");
            let security = &container["securityContext"];
            if security["privileged"] == true {
                refuse(format!("container {name} is privileged, {above}"));
            }
            for cap in security["capabilities"]["add"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let bare = cap.trim_start_matches("CAP_");
                if !BASELINE_CAPABILITIES.contains(&bare) {
                    refuse(format!("container {name} adds capability {cap}, {above}"));
                }
            }
            for port in container["ports"].as_array().into_iter().flatten() {
                if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
                    refuse(format!(
                        "container {name} uses hostPort {}, {above}",
                        port["hostPort"]
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Object {
        Object::from_value(0, value).unwrap()
    }

    fn rules(objects: &[Object], level: PodSecurityLevel) -> Vec<String> {
        violations(objects, level)
            .into_iter()
            .map(|v| v.to_string())
            .collect()
    }

    #[test]
    fn binding_cluster_admin_or_system_masters_is_refused() {
        let crb = object(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "Group", "name": "system:masters"}]
        }));
        let found = rules(&[crb], PodSecurityLevel::Privileged);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("ClusterRoleBinding system:coredns: binds ClusterRole cluster-admin")
        );
        assert!(found[1].contains("group system:masters"));
        let fine = object(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "r", "namespace": "kube-system"},
            "roleRef": {"kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]
        }));
        assert!(rules(&[fine], PodSecurityLevel::Baseline).is_empty());
    }

    #[test]
    fn star_verbs_on_star_resources_is_refused() {
        let role = object(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["list", "watch"]},
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
            ]
        }));
        let found = rules(std::slice::from_ref(&role), PodSecurityLevel::Baseline);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("rules[1] grants every verb on every resource"));
        let mut narrower = role;
        narrower.value["rules"][1]["verbs"] = json!(["get"]);
        assert!(rules(&[narrower], PodSecurityLevel::Baseline).is_empty());
    }

    #[test]
    fn baseline_refuses_host_access_and_privilege_privileged_allows_it() {
        let ds = object(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "monitoring"},
            "spec": {"template": {"spec": {
                "hostPID": true, "hostNetwork": true,
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "containers": [{
                    "name": "agent", "image": "x",
                    "securityContext": {"privileged": true, "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}},
                    "ports": [{"containerPort": 9100, "hostPort": 9100}]
                }]
            }}}
        }));
        let found = rules(std::slice::from_ref(&ds), PodSecurityLevel::Baseline);
        let joined = found.join("\n");
        for expected in [
            "hostPID: true",
            "hostNetwork: true",
            "hostPath volume root",
            "container agent is privileged",
            "adds capability SYS_ADMIN",
            "hostPort 9100",
        ] {
            assert!(joined.contains(expected), "{expected} in {joined}");
        }
        assert!(!joined.contains("NET_BIND_SERVICE"), "{joined}");
        assert_eq!(found.len(), 6, "{joined}");
        assert!(rules(&[ds], PodSecurityLevel::Privileged).is_empty());
    }

    #[test]
    fn pods_of_every_workload_kind_are_checked() {
        for (kind, path) in [
            ("Pod", json!({"spec": {"hostIPC": true}})),
            (
                "Deployment",
                json!({"spec": {"template": {"spec": {"hostIPC": true}}}}),
            ),
            (
                "CronJob",
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"hostIPC": true}}}}}}),
            ),
        ] {
            let mut value = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "p", "namespace": "n"}});
            value["spec"] = path["spec"].clone();
            assert_eq!(
                violations(&[object(value)], PodSecurityLevel::Baseline).len(),
                1,
                "{kind}"
            );
        }
    }
}
