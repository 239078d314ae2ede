//! Helpers for an addon plugin's `assess`: find an observed object and
//! judge a Deployment or DaemonSet the way `kubectl rollout status` does.
//!
//! `assess` must be total: these helpers never panic, whatever JSON the
//! host passes (missing fields count as zero).

use crate::bindings::addon::exports::capstan::plugin0_2_0::addon::Health;
use serde_json::Value;

/// The observed object of `kind` named `name`, parsed; `None` when the host
/// did not observe it (not applied yet, or deleted) or it is not JSON.
pub fn find_observed(observed: &[String], kind: &str, name: &str) -> Option<Value> {
    observed
        .iter()
        .filter_map(|text| serde_json::from_str::<Value>(text).ok())
        .find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
}

fn count(v: &Value, pointer: &str) -> i64 {
    v.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn rolled_out(v: &Value) -> bool {
    count(v, "/status/observedGeneration") >= count(v, "/metadata/generation")
}

fn health(healthy: bool, message: String, details: Vec<(String, String)>) -> Health {
    Health {
        healthy,
        message: Some(message),
        details,
    }
}

/// A Deployment is healthy when the controller has seen its latest spec and
/// every desired replica is updated and available.
pub fn deployment_health(observed: Option<&Value>, name: &str) -> Health {
    let Some(d) = observed else {
        return health(false, format!("Deployment {name} is not there"), vec![]);
    };
    let desired = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let updated = count(d, "/status/updatedReplicas");
    let available = count(d, "/status/availableReplicas");
    let details = vec![
        ("availableReplicas".into(), format!("{available}/{desired}")),
        ("updatedReplicas".into(), format!("{updated}/{desired}")),
    ];
    if !rolled_out(d) {
        return health(
            false,
            format!("Deployment {name}: the latest spec is not rolled out yet"),
            details,
        );
    }
    let healthy = updated >= desired && available >= desired;
    let message = if healthy {
        format!("Deployment {name}: {available}/{desired} replicas available")
    } else {
        format!("Deployment {name}: {updated}/{desired} updated, {available}/{desired} available")
    };
    health(healthy, message, details)
}

/// A DaemonSet is healthy when the controller has seen its latest spec and
/// every Node that should run it runs an updated, ready pod.
pub fn daemonset_health(observed: Option<&Value>, name: &str) -> Health {
    let Some(d) = observed else {
        return health(false, format!("DaemonSet {name} is not there"), vec![]);
    };
    let desired = count(d, "/status/desiredNumberScheduled");
    let ready = count(d, "/status/numberReady");
    let updated = count(d, "/status/updatedNumberScheduled");
    let details = vec![
        ("numberReady".into(), format!("{ready}/{desired}")),
        (
            "updatedNumberScheduled".into(),
            format!("{updated}/{desired}"),
        ),
    ];
    if !rolled_out(d) {
        return health(
            false,
            format!("DaemonSet {name}: the latest spec is not rolled out yet"),
            details,
        );
    }
    let healthy = ready >= desired && updated >= desired;
    health(
        healthy,
        format!("DaemonSet {name}: {ready}/{desired} ready, {updated}/{desired} updated"),
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_deployment_is_healthy_only_when_rolled_out_and_available() {
        let mut d = json!({"kind": "Deployment", "metadata": {"name": "x", "generation": 2},
                           "spec": {"replicas": 2},
                           "status": {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2}});
        assert!(!deployment_health(Some(&d), "x").healthy);
        d["status"]["observedGeneration"] = 2.into();
        assert!(deployment_health(Some(&d), "x").healthy);
        d["status"]["availableReplicas"] = 1.into();
        let h = deployment_health(Some(&d), "x");
        assert!(!h.healthy);
        assert_eq!(h.details[0], ("availableReplicas".into(), "1/2".into()));
        assert!(!deployment_health(None, "x").healthy);
    }

    #[test]
    fn a_daemonset_is_healthy_when_every_node_runs_an_updated_ready_pod() {
        let d = json!({"kind": "DaemonSet", "metadata": {"name": "x", "generation": 1},
                       "status": {"observedGeneration": 1, "desiredNumberScheduled": 2,
                                  "numberReady": 2, "updatedNumberScheduled": 1}});
        assert!(!daemonset_health(Some(&d), "x").healthy);
        let observed = vec!["not json".to_string(), d.to_string()];
        assert!(find_observed(&observed, "DaemonSet", "x").is_some());
        assert!(find_observed(&observed, "DaemonSet", "y").is_none());
    }
}
