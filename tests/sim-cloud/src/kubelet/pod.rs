//! What a simulated kubelet does with a pod bound to one of its Nodes:
//! start it (Running, an IP, conditions and container statuses), flip its
//! readiness on request, and remove it once its containers exited after a
//! graceful deletion (a stop delay, at most the grace period). Pure: the
//! decision and the status patches, no I/O.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use std::time::Duration;

/// The next thing to do for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStep {
    /// Nothing (settled, or not this kubelet's to act on).
    Wait,
    /// Start it: Running with its conditions, ready unless told otherwise.
    Start,
    /// Set its `Ready`/`ContainersReady` conditions to this.
    SetReady(bool),
    /// Delete it for good (grace 0) after this long: until its containers
    /// exited (the stop delay, at most the grace period).
    Remove { after: Duration },
}

/// What the kubelet of a pod's Node does next. `kubelet_up` is false while
/// the Node's kubelet is stopped (heartbeats off): then nothing happens to
/// its pods, as with a kubelet that died. `stop` is how long containers
/// take to exit once told to.
pub fn next_step(
    pod: &Pod,
    kubelet_up: bool,
    fail_readiness: bool,
    stop: Duration,
    now: Timestamp,
) -> PodStep {
    if !kubelet_up {
        return PodStep::Wait;
    }
    if let Some(deadline) = &pod.metadata.deletion_timestamp {
        // The deletion timestamp is when the grace period ends; it began
        // `deletionGracePeriodSeconds` earlier.
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64));
        let to_deadline = Duration::try_from(deadline.0.duration_since(now)).unwrap_or_default();
        let after = match grace {
            Some(grace) if stop < grace => {
                let exited = grace - stop;
                to_deadline.saturating_sub(exited)
            }
            _ => to_deadline,
        };
        return PodStep::Remove { after };
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    match phase {
        "Pending" => PodStep::Start,
        "Running" => {
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let wanted = !fail_readiness;
            if ready == wanted {
                PodStep::Wait
            } else {
                PodStep::SetReady(wanted)
            }
        }
        _ => PodStep::Wait,
    }
}

fn condition(type_: &str, status: bool, now: Timestamp) -> Value {
    json!({
        "type": type_,
        "status": if status { "True" } else { "False" },
        "lastProbeTime": null,
        "lastTransitionTime": Time(now),
    })
}

fn container_statuses(pod: &Pod, init: bool, ready: bool, now: Timestamp) -> Vec<Value> {
    let spec = pod.spec.as_ref();
    let containers = if init {
        spec.and_then(|s| s.init_containers.clone())
            .unwrap_or_default()
    } else {
        spec.map(|s| s.containers.clone()).unwrap_or_default()
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    containers
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let state = if init {
                json!({ "terminated": {
                    "exitCode": 0, "reason": "Completed", "startedAt": Time(now), "finishedAt": Time(now),
                }})
            } else {
                json!({ "running": { "startedAt": Time(now) } })
            };
            json!({
                "name": c.name,
                "image": image,
                "imageID": format!("sim://{image}"),
                "containerID": format!("sim://{uid}/{}", c.name),
                "ready": if init { true } else { ready },
                "started": !init,
                "restartCount": 0,
                "state": state,
            })
        })
        .collect()
}

/// The status patch (strategic merge on `pods/status`) that starts a pod.
pub fn start_patch(pod: &Pod, host_ip: &str, pod_ip: &str, ready: bool, now: Timestamp) -> Value {
    let mut status = json!({
        "phase": "Running",
        "hostIP": host_ip,
        "podIP": pod_ip,
        "podIPs": [{ "ip": pod_ip }],
        "startTime": Time(now),
        "conditions": [
            condition("Initialized", true, now),
            condition("Ready", ready, now),
            condition("ContainersReady", ready, now),
            condition("PodScheduled", true, now),
        ],
        "containerStatuses": container_statuses(pod, false, ready, now),
    });
    let init = container_statuses(pod, true, ready, now);
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    json!({ "status": status })
}

/// The status patch that makes a running pod ready or not.
pub fn readiness_patch(pod: &Pod, ready: bool, now: Timestamp) -> Value {
    let containers: Vec<Value> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| json!({ "name": c.name, "ready": ready }))
                .collect()
        })
        .unwrap_or_default();
    json!({ "status": {
        "conditions": [condition("Ready", ready, now), condition("ContainersReady", ready, now)],
        "containerStatuses": containers,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, PodStatus};

    fn pod(phase: Option<&str>, ready: Option<bool>) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("web-0".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("nginx:1".into()),
                    ..Default::default()
                }],
                init_containers: Some(vec![Container {
                    name: "setup".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }]),
                node_name: Some("sim-i-000001".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: phase.map(str::to_string),
                conditions: ready.map(|r| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: if r { "True" } else { "False" }.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn bound_pods_start_and_settle() {
        let now = Timestamp::now();
        assert_eq!(
            next_step(&pod(None, None), true, false, FULL_GRACE, now),
            PodStep::Start
        );
        assert_eq!(
            next_step(&pod(Some("Pending"), None), true, false, FULL_GRACE, now),
            PodStep::Start
        );
        assert_eq!(
            next_step(
                &pod(Some("Running"), Some(true)),
                true,
                false,
                FULL_GRACE,
                now
            ),
            PodStep::Wait
        );
        assert_eq!(
            next_step(&pod(Some("Succeeded"), None), true, false, FULL_GRACE, now),
            PodStep::Wait
        );
    }

    #[test]
    fn readiness_follows_the_fault_switch() {
        let now = Timestamp::now();
        assert_eq!(
            next_step(
                &pod(Some("Running"), Some(true)),
                true,
                true,
                FULL_GRACE,
                now
            ),
            PodStep::SetReady(false)
        );
        assert_eq!(
            next_step(
                &pod(Some("Running"), Some(false)),
                true,
                false,
                FULL_GRACE,
                now
            ),
            PodStep::SetReady(true)
        );
        assert_eq!(
            next_step(
                &pod(Some("Running"), Some(false)),
                true,
                true,
                FULL_GRACE,
                now
            ),
            PodStep::Wait
        );
    }

    #[test]
    fn a_stopped_kubelet_does_nothing() {
        let now = Timestamp::now();
        let mut deleting = pod(Some("Running"), Some(true));
        deleting.metadata.deletion_timestamp = Some(Time(now));
        for p in [pod(None, None), pod(Some("Running"), Some(false)), deleting] {
            assert_eq!(next_step(&p, false, false, FULL_GRACE, now), PodStep::Wait);
        }
    }

    /// Containers that hold their whole grace period.
    const FULL_GRACE: Duration = Duration::MAX;

    #[test]
    fn containers_exit_after_the_stop_delay_within_the_grace_period() {
        let start = 1_700_000_000;
        let mut p = pod(Some("Running"), Some(true));
        p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(start + 30).unwrap()));
        p.metadata.deletion_grace_period_seconds = Some(30);
        let at = |s| Timestamp::from_second(start + s).unwrap();
        let one_second = Duration::from_secs(1);
        assert_eq!(
            next_step(&p, true, false, one_second, at(0)),
            PodStep::Remove { after: one_second }
        );
        assert_eq!(
            next_step(&p, true, false, one_second, at(5)),
            PodStep::Remove {
                after: Duration::ZERO
            }
        );
        // A stop delay past the grace period is cut at the grace period.
        assert_eq!(
            next_step(&p, true, false, Duration::from_secs(60), at(0)),
            PodStep::Remove {
                after: Duration::from_secs(30)
            }
        );
    }

    #[test]
    fn graceful_deletion_waits_out_the_grace_period() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let mut p = pod(Some("Running"), Some(true));
        p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_700_000_030).unwrap()));
        assert_eq!(
            next_step(&p, true, false, FULL_GRACE, now),
            PodStep::Remove {
                after: Duration::from_secs(30)
            }
        );
        // Past its deletion time (or never started): remove at once.
        let late = Timestamp::from_second(1_700_000_031).unwrap();
        assert_eq!(
            next_step(&p, true, false, FULL_GRACE, late),
            PodStep::Remove {
                after: Duration::ZERO
            }
        );
    }

    #[test]
    fn a_started_pod_reports_everything_a_kubelet_does() {
        let p = pod(None, None);
        let patch = start_patch(&p, "10.0.0.1", "10.244.0.7", true, Timestamp::now());
        let s = &patch["status"];
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "10.244.0.7");
        assert_eq!(s["hostIP"], "10.0.0.1");
        let types: Vec<&str> = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        );
        assert_eq!(s["containerStatuses"][0]["name"], "app");
        assert_eq!(s["containerStatuses"][0]["ready"], true);
        assert!(s["containerStatuses"][0]["state"]["running"].is_object());
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["terminated"]["exitCode"],
            0
        );

        let not_ready = start_patch(&p, "10.0.0.1", "10.244.0.7", false, Timestamp::now());
        assert_eq!(not_ready["status"]["conditions"][1]["status"], "False");
        assert_eq!(not_ready["status"]["containerStatuses"][0]["ready"], false);

        let flip = readiness_patch(&p, false, Timestamp::now());
        assert_eq!(flip["status"]["conditions"][0]["status"], "False");
        assert_eq!(flip["status"]["containerStatuses"][0]["ready"], false);
    }
}
