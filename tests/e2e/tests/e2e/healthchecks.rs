//! MachineHealthChecks on a real control plane: the node-lifecycle
//! controller judges Nodes by their (simulated) kubelet's heartbeats, the
//! health check marks machines, and their MachineSet deletes and replaces
//! them — within the short-circuit and `maxInFlight`.

use crate::logs;
use capstan_api::machine_conditions::{HEALTH_CHECK_SUCCEEDED, OWNER_REMEDIATED, PAUSED};
use capstan_api::{
    ANNOTATION_PAUSED, ANNOTATION_REMEDIATE_MACHINE, ANNOTATION_SKIP_REMEDIATION, Machine,
    MachineDeployment, MachineHealthCheck, condition,
};
use capstan_e2e::env::{Env, node_of};
use capstan_e2e::sim_cloud::Faults;
use capstan_e2e::workloads;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);
const HOOK: &str = "pre-drain.delete.hook.machine.capstan.dev/hold";

fn faults() -> Faults {
    Faults {
        boot_latency_ms: 200,
        ..Default::default()
    }
}

async fn start(replicas: i32) -> Env {
    logs();
    Env::start_with_pool(faults(), replicas)
        .await
        .expect("environment starts")
}

/// A health check over the `pool` machines: a Node `Ready=Unknown` or
/// `False` for 2 s is unhealthy.
async fn create_check(env: &Env, remediation: serde_json::Value, startup_seconds: i32) {
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": { "name": "pool", "namespace": NS },
        "spec": {
            "selector": { "matchLabels": { "capstan.dev/pool": "pool" } },
            "checks": {
                "nodeStartupTimeoutSeconds": startup_seconds,
                "unhealthyNodeConditions": [
                    { "type": "Ready", "status": "Unknown", "timeoutSeconds": 2 },
                    { "type": "Ready", "status": "False", "timeoutSeconds": 2 },
                ],
            },
            "remediation": remediation,
        },
    }))
    .expect("a valid MachineHealthCheck");
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .expect("create mhc");
}

async fn check(env: &Env) -> MachineHealthCheck {
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .get("pool")
        .await
        .expect("get mhc")
}

fn machine_condition(m: &Machine, type_: &str) -> Option<(String, String, String)> {
    let c = condition(&m.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn provider_id(m: &Machine) -> String {
    m.status.as_ref().unwrap().provider_id.clone().unwrap()
}

async fn set_heartbeats(env: &Env, node: &str, on: bool) {
    let (code, body) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{node}/heartbeats"),
            Some(json!({ "enabled": on })),
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
}

async fn machine(env: &Env, name: &str) -> Option<Machine> {
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()
}

async fn annotate(env: &Env, machine: &str, key: &str, value: Option<&str>) {
    let patch = json!({ "metadata": { "annotations": { key: value } } });
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate machine");
}

/// Every machine of the pool Ready and not deleting, `replicas` of them.
async fn wait_pool_healthy(env: &Env, replicas: usize) -> Vec<Machine> {
    env.eventually("the pool back to full health", LONG, async || {
        let machines = env.machines(NS).await;
        let ready = machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| machine_condition(m, "Ready").is_some_and(|c| c.0 == "True"))
            .count();
        (machines.len() == replicas && ready == replicas).then_some(machines)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_whose_node_goes_silent_is_drained_and_replaced() {
    let env = start(2).await;
    // Workload on the pool, to be drained off the broken Node.
    workloads::create(&env.client, &workloads::deployment(NS, "web", 2, 1))
        .await
        .unwrap();
    env.or_describe(workloads::wait_deployment_available(&env.client, NS, "web", LONG).await)
        .await;
    create_check(&env, json!({}), 600).await;
    env.eventually("the check sees 2 healthy machines", LONG, async || {
        let s = check(&env).await.status?;
        (s.expected_machines == 2 && s.current_healthy == 2).then_some(())
    })
    .await;

    let before = env.machines(NS).await;
    let victim = before[0].clone();
    let node = node_of(&victim);
    set_heartbeats(&env, &node, false).await;

    // The node-lifecycle controller marks the Node Unknown (10 s grace), the
    // check marks the machine 2 s later, the set deletes and replaces it.
    let (status, reason, message) = env
        .eventually("the silent machine marked unhealthy", LONG, async || {
            let m = machine(&env, &victim.name_any()).await?;
            let hc = machine_condition(&m, HEALTH_CHECK_SUCCEEDED)?;
            (hc.0 == "False").then_some(hc)
        })
        .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "UnhealthyNode")
    );
    assert!(
        message.contains(&format!("Node {node}: condition Ready=Unknown")),
        "{message}"
    );
    let survivors = wait_pool_healthy(&env, 2).await;
    assert!(survivors.iter().all(|m| m.name_any() != victim.name_any()));
    assert!(
        !env.instance_exists(&provider_id(&victim)).await,
        "the broken machine's instance is released"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    assert!(
        nodes.get_opt(&node).await.unwrap().is_none(),
        "Node object deleted"
    );
    assert_eq!(env.cloud.stats().live_instances, 2);
    // The workload runs on the healthy machines again.
    env.or_describe(workloads::wait_deployment_available(&env.client, NS, "web", LONG).await)
        .await;
    let s = check(&env).await.status.unwrap();
    assert_eq!((s.expected_machines, s.current_healthy), (2, 2));
    let events = env.event_reasons(NS);
    for reason in ["MachineMarkedUnhealthy", "MachineRemediated"] {
        assert!(events.contains(reason), "{reason} not in {events}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_short_circuit_and_max_in_flight_hold_remediation() {
    let env = start(4).await;
    let machines = env.machines(NS).await;
    // A pre-drain hook holds each remediated machine mid-deletion, so
    // "one at a time" can be seen.
    for m in &machines {
        annotate(&env, &m.name_any(), HOOK, Some("")).await;
    }
    let silent: Vec<&Machine> = machines.iter().take(3).collect();
    for m in &silent {
        set_heartbeats(&env, &node_of(m), false).await;
    }
    // The check starts once all three Nodes are Unknown: the node-lifecycle
    // controller marks them a second or so apart, and a check already
    // running would rightly remediate the first while it is the only one.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    env.eventually("three Nodes Unknown", LONG, async || {
        for m in &silent {
            let node = nodes.get(&node_of(m)).await.ok()?;
            let unknown = node
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "Unknown");
            if !unknown {
                return None;
            }
        }
        Some(())
    })
    .await;
    // ... and past the check's 2 s timeout, so all three count at once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    create_check(
        &env,
        json!({ "triggerIf": { "unhealthyLessThanOrEqualTo": 1 }, "maxInFlight": 1 }),
        600,
    )
    .await;
    let mhc = env
        .eventually("the short-circuit trips", LONG, async || {
            let c = check(&env).await;
            let s = c.status.as_ref()?;
            let allowed = condition(&s.conditions, "RemediationAllowed")?;
            (allowed.status == "False" && s.current_healthy == 1).then_some(c)
        })
        .await;
    let s = mhc.status.unwrap();
    let allowed = condition(&s.conditions, "RemediationAllowed").unwrap();
    assert_eq!(allowed.reason, "TooManyUnhealthy");
    assert!(
        allowed.message.contains("3 of 4 machines are unhealthy"),
        "{}",
        allowed.message
    );
    assert_eq!((s.expected_machines, s.remediations_allowed), (4, 0));
    // Nothing is remediated while it holds.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for m in env.machines(NS).await {
        assert!(
            m.metadata.deletion_timestamp.is_none(),
            "{} deleted",
            m.name_any()
        );
        assert!(machine_condition(&m, OWNER_REMEDIATED).is_none(), "{m:?}");
    }
    let events = env.event_reasons(NS);
    assert!(events.contains("RemediationRestricted"), "{events}");

    // One Node comes back: 2 unhealthy, within a widened short-circuit, but
    // maxInFlight 1 lets only one be remediated at a time.
    set_heartbeats(&env, &node_of(silent[2]), true).await;
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "remediation": { "triggerIf": { "unhealthyLessThanOrEqualTo": 2 } } } })),
        )
        .await
        .unwrap();
    let names: Vec<String> = silent[..2].iter().map(|m| m.name_any()).collect();
    let first = env
        .eventually("one machine handed over", LONG, async || {
            for name in &names {
                let m = machine(&env, name).await?;
                if m.metadata.deletion_timestamp.is_some() {
                    return Some(name.clone());
                }
            }
            None
        })
        .await;
    let second = names.iter().find(|n| **n != first).unwrap().clone();
    // The deletion timestamp comes first; the Machine controller then
    // says which step holds it.
    env.eventually("the first waits for its pre-drain hook", LONG, async || {
        let held = machine(&env, &first).await?;
        (machine_condition(&held, "Deleting")?.1 == "WaitingForPreDrainHook").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = machine(&env, &second).await.unwrap();
    assert!(
        waiting.metadata.deletion_timestamp.is_none(),
        "maxInFlight 1 held"
    );
    assert_eq!(
        machine_condition(&waiting, HEALTH_CHECK_SUCCEEDED).map(|c| c.0),
        Some("False".to_string())
    );
    assert!(machine_condition(&waiting, OWNER_REMEDIATED).is_none());

    // The first finishes; then the second goes.
    annotate(&env, &first, HOOK, None).await;
    env.eventually("the second machine handed over", LONG, async || {
        let m = machine(&env, &second).await?;
        m.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    assert!(
        machine(&env, &first).await.is_none(),
        "the first is gone first"
    );
    annotate(&env, &second, HOOK, None).await;
    let after = wait_pool_healthy(&env, 4).await;
    assert!(after.iter().all(|m| !names.contains(&m.name_any())));
    assert_eq!(env.cloud.stats().live_instances, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_whose_node_never_joins_is_replaced() {
    let env = start(1).await;
    create_check(&env, json!({}), 4).await;
    env.cloud.set_faults(Faults {
        register_nodes: false,
        ..faults()
    });
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "replicas": 2 } })),
        )
        .await
        .unwrap();
    let stuck = env
        .eventually("a machine without a Node marked", LONG, async || {
            env.machines(NS).await.into_iter().find(|m| {
                machine_condition(m, HEALTH_CHECK_SUCCEEDED)
                    .is_some_and(|c| c.0 == "False" && c.1 == "NodeStartupTimeout")
            })
        })
        .await;
    let message = machine_condition(&stuck, HEALTH_CHECK_SUCCEEDED).unwrap().2;
    assert!(message.contains("within 4s"), "{message}");
    let instance = provider_id(&stuck);
    env.cloud.set_faults(faults());
    let after = wait_pool_healthy(&env, 2).await;
    assert!(after.iter().all(|m| m.name_any() != stuck.name_any()));
    assert!(!env.instance_exists(&instance).await);
    assert_eq!(env.cloud.stats().live_instances, 2);
}

/// Wait until `name` has failed, or is already being replaced (the health
/// check can act within a second of the failure); how long it took and the
/// failure reason (`replaced` when the failed state was not caught).
async fn wait_failed(env: &Env, name: &str, since: std::time::Instant) -> (Duration, String) {
    env.eventually(&format!("Machine {name} failed"), LONG, async || {
        let Some(m) = machine(env, name).await else {
            return Some((since.elapsed(), "replaced".to_string()));
        };
        if m.metadata.deletion_timestamp.is_some() {
            return Some((since.elapsed(), "replaced".to_string()));
        }
        let reason = m.status.as_ref()?.failure_reason.clone()?;
        Some((since.elapsed(), reason))
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn instances_that_vanish_out_of_band_fail_their_machines_and_are_replaced() {
    logs();
    // The resync stays at its default (10 minutes): what notices a vanished
    // instance is the Node deletion event and the instance check.
    let options = capstan_controllers::Options {
        instance_check: Duration::from_secs(3),
        ..Default::default()
    };
    let env = Env::start_with_pool_and(faults(), 3, options)
        .await
        .expect("environment starts");
    create_check(&env, json!({}), 600).await;
    env.eventually("the check sees 3 healthy machines", LONG, async || {
        let s = check(&env).await.status?;
        (s.expected_machines == 3 && s.current_healthy == 3).then_some(())
    })
    .await;
    let machines = env.machines(NS).await;
    let (terminated, vanished, stopped) = (&machines[0], &machines[1], &machines[2]);
    let id = |m: &Machine| provider_id(m).trim_start_matches("sim://").to_string();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());

    // Terminated in the console: the instance goes, its kubelet's Node too.
    let started = std::time::Instant::now();
    let (code, body) = env
        .cloud_call("DELETE", &format!("/v1/instances/{}", id(terminated)), None)
        .await
        .unwrap();
    // 404 when the cloud reaped it at once (no delete latency here).
    assert!(code == 202 || code == 404, "{code} {body}");
    assert!(!env.instance_exists(&provider_id(terminated)).await);
    let (took, reason) = wait_failed(&env, &terminated.name_any(), started).await;
    eprintln!("terminated with its Node deleted: Machine failed after {took:?} ({reason})");
    assert!(
        reason == "InstanceNotFound" || reason == "replaced",
        "{reason}"
    );

    // Gone with its Node left in place: only the instance check can tell.
    // Then the Node is deleted too and a Node of another instance
    // registers under the same name (EC2 names follow reused IPs).
    let old_node = node_of(vanished);
    let started = std::time::Instant::now();
    let (code, body) = env
        .cloud_call(
            "POST",
            &format!("/admin/instances/{}/vanish", id(vanished)),
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
    assert!(
        nodes.get_opt(&old_node).await.unwrap().is_some(),
        "the Node stays"
    );
    let (took, reason) = wait_failed(&env, &vanished.name_any(), started).await;
    eprintln!("terminated with its Node left in place: Machine failed after {took:?} ({reason})");
    assert!(
        reason == "InstanceNotFound" || reason == "replaced",
        "{reason}"
    );
    assert!(
        took < Duration::from_secs(30),
        "the 3 s instance check, not the 10 min resync: {took:?}"
    );

    // Stopped in the console.
    let started = std::time::Instant::now();
    let (code, body) = env
        .cloud_call(
            "POST",
            &format!("/admin/instances/{}/stop", id(stopped)),
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
    let (took, reason) = wait_failed(&env, &stopped.name_any(), started).await;
    eprintln!("stopped: Machine failed after {took:?} ({reason})");
    assert!(
        reason == "InstanceStopped" || reason == "replaced",
        "{reason}"
    );

    // The health check replaces all three: failed machines are unhealthy
    // at once, whatever their Node says.
    let replaced = wait_pool_healthy(&env, 3).await;
    let gone = [terminated, vanished, stopped].map(|m| m.name_any());
    assert!(
        replaced.iter().all(|m| !gone.contains(&m.name_any())),
        "every failed machine was replaced"
    );
    assert_eq!(env.cloud.stats().live_instances, 3, "nothing leaked");
    assert!(
        nodes.get_opt(&old_node).await.unwrap().is_none(),
        "the vanished instance's own Node was deleted with its machine"
    );
    // Only the Machine controller's failures could have marked the last
    // two (their Nodes stayed Ready): their Events say so.
    let events = env.event_reasons(NS);
    for reason in ["InstanceNotFound", "InstanceStopped", "MachineRemediated"] {
        assert!(events.contains(reason), "{reason} not in {events}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_registered_under_a_reused_name_is_never_drained_for_the_old_machine() {
    let env = start(1).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let old = env.machines(NS).await.remove(0);
    let name = node_of(&old);
    let (code, body) = env
        .cloud_call(
            "POST",
            &format!(
                "/admin/instances/{}/vanish",
                provider_id(&old).trim_start_matches("sim://")
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
    // The Node goes, and another instance's Node takes the name.
    nodes
        .delete(&name, &Default::default())
        .await
        .expect("delete the Node");
    env.eventually("the old Node gone", LONG, async || {
        nodes.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    let impostor: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "providerID": "sim://i-another" },
    }))
    .unwrap();
    let impostor = nodes
        .create(&PostParams::default(), &impostor)
        .await
        .unwrap();
    // The old machine is deleted (its drain would cordon and evict).
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .delete(&old.name_any(), &Default::default())
        .await
        .unwrap();
    env.eventually("the old machine gone", LONG, async || {
        machine(&env, &old.name_any()).await.is_none().then_some(())
    })
    .await;
    let now = nodes.get(&name).await.expect("the new Node is still there");
    assert_eq!(now.metadata.uid, impostor.metadata.uid);
    assert_ne!(
        now.spec.and_then(|s| s.unschedulable),
        Some(true),
        "the new Node was not cordoned"
    );
}

/// Cluster API's well-known keys on Machines: `remediate-machine` has a
/// healthy machine replaced, `skip-remediation` keeps one out of the check
/// (not judged, counted or remediated, even when it asks to be), and
/// `paused` holds a machine, even its deletion, until the annotation goes.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_api_keys_request_skip_and_pause_remediation() {
    let env = start(3).await;
    let machines = wait_pool_healthy(&env, 3).await;
    create_check(&env, json!({}), 600).await;
    let [a, b, c] = [0, 1, 2].map(|i| machines[i].name_any());
    annotate(&env, &b, ANNOTATION_SKIP_REMEDIATION, Some("")).await;
    env.eventually("b out of the check", LONG, async || {
        let status = check(&env).await.status?;
        (status.expected_machines == 2 && !status.targets.contains(&b)).then_some(())
    })
    .await;
    annotate(&env, &b, ANNOTATION_REMEDIATE_MACHINE, Some("")).await;
    annotate(&env, &a, ANNOTATION_REMEDIATE_MACHINE, Some("")).await;
    env.eventually("a replaced", LONG, async || {
        machine(&env, &a).await.is_none().then_some(())
    })
    .await;
    wait_pool_healthy(&env, 3).await;
    let kept = machine(&env, &b).await.expect("b skips remediation");
    assert!(
        machine_condition(&kept, HEALTH_CHECK_SUCCEEDED).is_none_or(|c| c.0 != "False"),
        "{:?}",
        kept.status
    );

    // Paused, then deleted: nothing happens to it, not even its deletion.
    annotate(&env, &c, ANNOTATION_PAUSED, Some("")).await;
    env.eventually("c says it is paused", LONG, async || {
        let m = machine(&env, &c).await?;
        (machine_condition(&m, PAUSED)?.0 == "True").then_some(())
    })
    .await;
    let instance = provider_id(&machine(&env, &c).await.unwrap());
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .delete(&c, &Default::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = machine(&env, &c).await.expect("held while paused");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(env.instance_exists(&instance).await, "its instance is kept");
    annotate(&env, &c, ANNOTATION_PAUSED, None).await;
    env.eventually("c deleted once unpaused", LONG, async || {
        machine(&env, &c).await.is_none().then_some(())
    })
    .await;
    assert!(!env.instance_exists(&instance).await);
}

/// Cluster API's `MachineDeployment.spec.remediation.maxInFlight`: the
/// deployment's set replaces one handed-over machine at a time; a machine
/// that recovers before its turn has `OwnerRemediated` cleared and stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_deployments_max_in_flight_paces_remediation_and_a_recovered_machine_stays() {
    let env = start(3).await;
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "remediation": { "maxInFlight": 1 } } })),
        )
        .await
        .unwrap();
    let machines = env.machines(NS).await;
    for m in &machines {
        annotate(&env, &m.name_any(), HOOK, Some("")).await;
    }
    let silent: Vec<&Machine> = machines.iter().take(2).collect();
    for m in &silent {
        set_heartbeats(&env, &node_of(m), false).await;
    }
    create_check(&env, json!({}), 600).await;
    let handed_over =
        |m: &Machine| machine_condition(m, OWNER_REMEDIATED).is_some_and(|c| c.0 == "False");
    let (deleting, waiting) = env
        .eventually("one remediated, one waiting its turn", LONG, async || {
            let ms = env.machines(NS).await;
            let deleting: Vec<&Machine> = ms
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_some())
                .collect();
            let waiting: Vec<&Machine> = ms
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_none() && handed_over(m))
                .collect();
            (deleting.len() == 1 && waiting.len() == 1)
                .then(|| (deleting[0].name_any(), waiting[0].name_any()))
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = machine(&env, &waiting).await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_none(),
        "maxInFlight 1: {waiting} waits while {deleting} is being remediated"
    );

    // The waiting machine's Node comes back: it is healthy again and no
    // longer handed over.
    let recovering = silent
        .iter()
        .find(|m| m.name_any() == waiting)
        .expect("a silenced machine");
    set_heartbeats(&env, &node_of(recovering), true).await;
    env.eventually("OwnerRemediated cleared on recovery", LONG, async || {
        let m = machine(&env, &waiting).await?;
        let healthy = machine_condition(&m, HEALTH_CHECK_SUCCEEDED).is_some_and(|c| c.0 == "True");
        (healthy && machine_condition(&m, OWNER_REMEDIATED).is_none()).then_some(())
    })
    .await;
    annotate(&env, &deleting, HOOK, None).await;
    env.eventually("the remediated machine goes", LONG, async || {
        machine(&env, &deleting).await.is_none().then_some(())
    })
    .await;
    let after = wait_pool_healthy(&env, 3).await;
    assert!(
        after.iter().any(|m| m.name_any() == waiting),
        "the recovered machine stays"
    );
}

/// `remediation.mode: Report`: an unhealthy machine is marked, and nothing
/// is replaced.
#[tokio::test(flavor = "multi_thread")]
async fn a_report_only_check_marks_and_remediates_nothing() {
    let env = start(2).await;
    let machines = env.machines(NS).await;
    let silent = &machines[0];
    set_heartbeats(&env, &node_of(silent), false).await;
    create_check(&env, json!({ "mode": "Report" }), 600).await;
    let name = silent.name_any();
    env.eventually("the silent machine marked unhealthy", LONG, async || {
        let m = machine(&env, &name).await?;
        machine_condition(&m, HEALTH_CHECK_SUCCEEDED)
            .filter(|c| c.0 == "False")
            .map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let m = machine(&env, &name).await.expect("still there");
    assert!(m.metadata.deletion_timestamp.is_none(), "not remediated");
    assert_eq!(machine_condition(&m, OWNER_REMEDIATED), None);
    assert_eq!(env.machines(NS).await.len(), 2);
    assert_eq!(env.cloud.stats().instances_launched, 2, "nothing replaced");
}
