//! Draining a machine's Node before its instance goes: evictions through
//! the real Eviction API (PodDisruptionBudgets enforced by the API server),
//! DaemonSet pods left alone, `nodeDrainTimeoutSeconds`, the exclude
//! annotation, the pre-drain / pre-terminate hooks, MachineDrainRules and
//! the pod drain label, the wait for volumes to detach, and how often a
//! held drain reads from the API server.

use crate::logs;
use capstan_api::{Machine, MachineDeployment, MachineDrainRule, condition};
use capstan_e2e::env::{Env, node_of};
use capstan_e2e::sim_cloud::{Faults, Moment};
use capstan_e2e::workloads;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

async fn start(replicas: i32) -> Env {
    logs();
    let faults = Faults {
        boot_latency_ms: 200,
        ..Default::default()
    };
    Env::start_with_pool(faults, replicas)
        .await
        .expect("environment starts")
}

async fn scale(env: &Env, replicas: i32) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "replicas": replicas } })),
        )
        .await
        .unwrap();
}

fn deleting(m: &Machine) -> Option<(String, String)> {
    let c = condition(&m.status.as_ref()?.conditions, "Deleting")?;
    Some((c.reason.clone(), c.message.clone()))
}

fn instance_of(m: &Machine) -> String {
    m.status
        .as_ref()
        .unwrap()
        .provider_id
        .clone()
        .unwrap()
        .trim_start_matches("sim://")
        .to_string()
}

fn moment<'a>(timeline: &'a [Moment], event: &str, subject: &str) -> Option<&'a Moment> {
    timeline
        .iter()
        .find(|m| m.event == event && m.subject == subject)
}

/// `replicas` web pods, one per Node (grace period 1 s), available.
async fn web_on_every_node(env: &Env, replicas: i32) {
    let client = &env.client;
    workloads::create(
        client,
        &workloads::one_per_node(workloads::deployment(NS, "web", replicas, 1)),
    )
    .await
    .unwrap();
    env.or_describe(workloads::wait_deployment_available(client, NS, "web", LONG).await)
        .await;
}

async fn deleting_machine(env: &Env) -> Machine {
    env.eventually("a machine being deleted", LONG, async || {
        env.machines(NS)
            .await
            .into_iter()
            .find(|m| m.metadata.deletion_timestamp.is_some())
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_respects_disruption_budgets_then_moves_pods_before_the_instance_goes() {
    let env = start(3).await;
    let client = env.client.clone();
    // The drain timeout changes in place, as in Cluster API: no rollout,
    // the same machines get it.
    let before: Vec<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    Api::<MachineDeployment>::namespaced(client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "template": { "spec": {
                "deletion": { "nodeDrainTimeoutSeconds": 8 } } } } })),
        )
        .await
        .unwrap();
    env.eventually(
        "the drain timeout reaches every machine",
        LONG,
        async || {
            let machines = env.machines(NS).await;
            machines
                .iter()
                .all(|m| {
                    m.spec
                        .deletion
                        .as_ref()
                        .and_then(|d| d.node_drain_timeout_seconds)
                        == Some(8)
                })
                .then_some(())
        },
    )
    .await;
    let mut after: Vec<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after, "no machine replaced");
    let sets = Api::<capstan_api::MachineSet>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(sets.items.len(), 1, "no new MachineSet");
    // One web pod per machine Node, all protected by a budget that allows
    // no disruption; an agent DaemonSet pod on every Node.
    workloads::create(
        &client,
        &workloads::one_per_node(workloads::deployment(NS, "web", 3, 1)),
    )
    .await
    .unwrap();
    workloads::create(&client, &workloads::daemonset(NS, "agent", 1))
        .await
        .unwrap();
    env.or_describe(workloads::wait_deployment_available(&client, NS, "web", LONG).await)
        .await;
    workloads::create_pdb(&client, NS, "web-budget", "web", json!(3))
        .await
        .unwrap();
    workloads::wait_pdb_allows(&client, NS, "web-budget", 0, LONG)
        .await
        .unwrap();

    // Scale down: the drain is refused by the budget, and the Machine says
    // which pod and which budget, until nodeDrainTimeoutSeconds (8 s).
    scale(&env, 2).await;
    let victim = deleting_machine(&env).await;
    let name = victim.name_any();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    let (reason, message) = env
        .eventually("the drain reports the budget", LONG, async || {
            let m = machines.get_opt(&name).await.ok()??;
            deleting(&m).filter(|(_, msg)| msg.contains("cannot evict"))
        })
        .await;
    assert_eq!(reason, "DrainingNode");
    assert!(
        message.contains("disruption budget") && message.contains("web-budget"),
        "{message}"
    );
    let node: Node = Api::all(client.clone())
        .get(&node_of(&victim))
        .await
        .unwrap();
    assert_eq!(
        node.spec.unwrap().unschedulable,
        Some(true),
        "the Node is cordoned"
    );
    let blocked_since = Instant::now();
    env.eventually(
        "the drain times out and the machine goes",
        LONG,
        async || machines.get_opt(&name).await.ok()?.is_none().then_some(()),
    )
    .await;
    assert!(
        blocked_since.elapsed() >= Duration::from_secs(4),
        "held for most of the 8 s timeout, went after {:?}",
        blocked_since.elapsed()
    );
    let timeline = env.timeline().await;
    assert!(
        timeline
            .iter()
            .all(|m| m.event != "pod-removed" || m.node.as_deref() != Some(&node_of(&victim))),
        "no pod was evicted past the budget: {timeline:?}"
    );
    let reasons = env.event_reasons(NS);
    assert!(reasons.contains("DrainSkipped"), "{reasons}");

    // With room in the budget and a free Node to move to, the pod is
    // evicted and rescheduled before the instance is deleted; the DaemonSet
    // pod stays where it is.
    let pdbs = workloads::pdbs(&client, NS);
    pdbs.delete("web-budget", &DeleteParams::default())
        .await
        .unwrap();
    workloads::create_pdb(&client, NS, "web-budget", "web", json!(2))
        .await
        .unwrap();
    env.add_nodes(2).await.unwrap();
    env.or_describe(workloads::wait_deployment_available(&client, NS, "web", LONG).await)
        .await;
    workloads::wait_pdb_allows(&client, NS, "web-budget", 1, LONG)
        .await
        .unwrap();
    // What runs on each machine's Node before the scale-down: the drain
    // may evict the victim's web pod before this test could list it.
    let mut before_drain = BTreeMap::new();
    for m in env.machines(NS).await {
        let node = node_of(&m);
        let pods: Vec<Pod> = workloads::pods_on_node(&client, &node).await.unwrap();
        before_drain.insert(node, pods);
    }
    scale(&env, 1).await;
    let victim = deleting_machine(&env).await;
    let (node, instance) = (node_of(&victim), instance_of(&victim));
    let on_node: &Vec<Pod> = before_drain
        .get(&node)
        .expect("the victim's Node was listed");
    let web_pod = on_node
        .iter()
        .find(|p| p.labels().get("app").map(String::as_str) == Some("web"))
        .expect("a web pod on the drained Node")
        .name_any();
    let agent_pod = on_node
        .iter()
        .find(|p| p.labels().get("app").map(String::as_str) == Some("agent"))
        .expect("an agent pod on the drained Node")
        .name_any();
    let victim_name = victim.name_any();
    env.eventually("the drained machine goes", LONG, async || {
        machines
            .get_opt(&victim_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let timeline = env.timeline().await;
    let removed = moment(&timeline, "pod-removed", &format!("{NS}/{web_pod}"))
        .unwrap_or_else(|| panic!("web pod {web_pod} was not removed: {timeline:?}"));
    let deleted = moment(&timeline, "instance-delete-requested", &instance)
        .unwrap_or_else(|| panic!("instance {instance} not deleted: {timeline:?}"));
    assert!(
        removed.seq < deleted.seq,
        "pod removed before the instance was deleted: {timeline:?}"
    );
    assert!(
        moment(&timeline, "pod-removed", &format!("{NS}/{agent_pod}"))
            .is_none_or(|m| m.seq > deleted.seq),
        "the DaemonSet pod is not evicted: {timeline:?}"
    );
    // The evicted pod's replacement runs on another Node.
    env.or_describe(workloads::wait_deployment_available(&client, NS, "web", LONG).await)
        .await;
    for pod in workloads::pods_of(&client, NS, "web").await.unwrap() {
        let on = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
        assert_ne!(on, node, "{} still on the drained Node", pod.name_any());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hooks_hold_deletion_and_the_exclude_annotation_skips_the_drain() {
    let env = start(2).await;
    let client = env.client.clone();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    web_on_every_node(&env, 2).await;
    // A budget that forbids any eviction: only a skipped drain lets a
    // machine with a web pod go.
    workloads::create_pdb(&client, NS, "web-budget", "web", json!(2))
        .await
        .unwrap();
    let all = env.machines(NS).await;
    let (hooked, excluded) = (&all[0], &all[1]);
    let pre_drain = "pre-drain.delete.hook.machine.capstan.dev/backup";
    let pre_terminate = "pre-terminate.delete.hook.machine.capstan.dev/detach";
    let annotate = async |name: &str, annotations: serde_json::Value| {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": { "annotations": annotations } })),
            )
            .await
            .unwrap();
    };
    annotate(
        &hooked.name_any(),
        json!({ pre_drain: "", pre_terminate: "", "machine.capstan.dev/exclude-node-draining": "" }),
    )
    .await;
    annotate(
        &excluded.name_any(),
        json!({ "machine.capstan.dev/exclude-node-draining": "true" }),
    )
    .await;

    // The pre-drain hook holds the machine before anything happens.
    machines
        .delete(&hooked.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let name = hooked.name_any();
    let reason_of = async |name: &str| {
        machines
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|m| deleting(&m))
    };
    let (_, message) = env
        .eventually("held by the pre-drain hook", LONG, async || {
            reason_of(&name)
                .await
                .filter(|(r, _)| r == "WaitingForPreDrainHook")
        })
        .await;
    assert!(
        message.contains("backup") && message.contains(pre_drain),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        reason_of(&name).await.map(|r| r.0).as_deref(),
        Some("WaitingForPreDrainHook")
    );
    assert!(env.instance_exists(&instance_of(hooked)).await);

    // Removing it moves on to the pre-terminate hook; the instance stays.
    annotate(&name, json!({ pre_drain: null })).await;
    let (_, message) = env
        .eventually("held by the pre-terminate hook", LONG, async || {
            reason_of(&name)
                .await
                .filter(|(r, _)| r == "WaitingForPreTerminateHook")
        })
        .await;
    assert!(message.contains("detach"), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(env.instance_exists(&instance_of(hooked)).await);
    assert!(machines.get_opt(&name).await.unwrap().is_some());
    annotate(&name, json!({ pre_terminate: null })).await;
    env.eventually("the hooked machine goes", LONG, async || {
        machines.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!env.instance_exists(&instance_of(hooked)).await);

    // The excluded machine goes despite the budget: its Node is not drained.
    let name = excluded.name_any();
    machines
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("the excluded machine goes", LONG, async || {
        machines.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let timeline = env.timeline().await;
    let node = node_of(excluded);
    assert!(
        timeline
            .iter()
            .all(|m| m.event != "pod-removed" || m.node.as_deref() != Some(node.as_str())),
        "nothing was evicted from {node}: {timeline:?}"
    );
}

/// Cluster API's MachineDrainRules and pod label on a real API server: a
/// rule orders one workload after the others, a rule and the
/// `cluster.x-k8s.io/drain=skip` label leave two alone, and the machine
/// still goes.
#[tokio::test(flavor = "multi_thread")]
async fn drain_rules_and_the_pod_label_decide_what_is_evicted_and_when() {
    let env = start(1).await;
    let client = env.client.clone();
    let machine = env.machines(NS).await.remove(0);
    let node = node_of(&machine);
    for app in ["proxy", "db", "logger", "agent"] {
        let mut d = workloads::deployment(NS, app, 1, 1);
        if app == "agent" {
            let labels = d.spec.as_mut().unwrap().template.metadata.as_mut().unwrap();
            labels
                .labels
                .get_or_insert_default()
                .insert("cluster.x-k8s.io/drain".into(), "skip".into());
        }
        workloads::create(&client, &d).await.unwrap();
    }
    for app in ["proxy", "db", "logger", "agent"] {
        env.or_describe(workloads::wait_deployment_available(&client, NS, app, LONG).await)
            .await;
    }
    let rules: Api<MachineDrainRule> = Api::namespaced(client.clone(), NS);
    let rule = |name: &str, behavior: &str, order: Option<i32>, app: &str| -> MachineDrainRule {
        serde_json::from_value(json!({
            "apiVersion": "capstan.dev/v1alpha1",
            "kind": "MachineDrainRule",
            "metadata": { "name": name, "namespace": NS },
            "spec": {
                "drain": { "behavior": behavior, "order": order },
                "machines": [{ "selector": {} }],
                "pods": [{ "selector": { "matchLabels": { "app": app } } }],
            },
        }))
        .unwrap()
    };
    for r in [
        rule("db-last", "Drain", Some(10), "db"),
        rule("logger-stays", "Skip", None, "logger"),
    ] {
        rules.create(&Default::default(), &r).await.unwrap();
    }
    let pod_of = async |app: &str| {
        let pods = workloads::pods_of(&client, NS, app).await.unwrap();
        format!("{NS}/{}", pods[0].name_any())
    };
    let (proxy, db) = (pod_of("proxy").await, pod_of("db").await);
    let (logger, agent) = (pod_of("logger").await, pod_of("agent").await);

    scale(&env, 0).await;
    let name = machine.name_any();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    env.eventually("the machine goes", LONG, async || {
        machines.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let timeline = env.timeline().await;
    let instance = instance_of(&machine);
    let deleted = moment(&timeline, "instance-delete-requested", &instance)
        .expect("the instance was deleted")
        .seq;
    let removed = |pod: &str| moment(&timeline, "pod-removed", pod).map(|m| m.seq);
    let (proxy_gone, db_gone) = (
        removed(&proxy).expect("proxy drained"),
        removed(&db).expect("db drained"),
    );
    assert!(
        proxy_gone < db_gone && db_gone < deleted,
        "order 0 before order 10, both before the instance: {timeline:?}"
    );
    for left in [&logger, &agent] {
        assert!(
            removed(left).is_none_or(|seq| seq > deleted),
            "{left} on {node} was not evicted: {timeline:?}"
        );
    }
}

/// A volume still attached holds the instance (Cluster API's
/// `WaitingForVolumeDetach`) until it detaches, or until
/// `nodeVolumeDetachTimeoutSeconds` has passed.
#[tokio::test(flavor = "multi_thread")]
async fn an_attached_volume_holds_the_instance_until_it_detaches_or_the_timeout() {
    let env = start(2).await;
    let client = env.client.clone();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attach = async |name: &str, node: &str| {
        attach_volume(&attachments, name, node, &format!("pv-{name}")).await;
    };
    let all = env.machines(NS).await;
    let (first, second) = (&all[0], &all[1]);
    attach("first", &node_of(first)).await;
    attach("second", &node_of(second)).await;
    let reason_of = async |name: &str| {
        machines
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|m| deleting(&m))
    };

    // No timeout: held until the volume detaches.
    let name = first.name_any();
    machines
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let (_, message) = env
        .eventually("waiting for the volume", LONG, async || {
            reason_of(&name)
                .await
                .filter(|(r, _)| r == "WaitingForVolumeDetach")
        })
        .await;
    assert!(message.contains("pv-first"), "{message}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.instance_exists(&instance_of(first)).await);
    set_attached(&attachments, "first", false).await;
    env.eventually("the first machine goes", LONG, async || {
        machines.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!env.instance_exists(&instance_of(first)).await);

    // With nodeVolumeDetachTimeoutSeconds (carried from the template to
    // the machine in place): the wait is cut short, with an Event.
    Api::<MachineDeployment>::namespaced(client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "template": { "spec": {
                "deletion": { "nodeVolumeDetachTimeoutSeconds": 3 } } } } })),
        )
        .await
        .unwrap();
    let name = second.name_any();
    env.eventually("the timeout reaches the machine", LONG, async || {
        let m = machines.get_opt(&name).await.ok()??;
        (m.spec.deletion?.node_volume_detach_timeout_seconds == Some(3)).then_some(())
    })
    .await;
    let started = Instant::now();
    machines
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("the second machine goes", LONG, async || {
        machines.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    // Status times have whole seconds (as every Kubernetes time), so the
    // wait can end up to a second early.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gone after {:?}, before the timeout",
        started.elapsed()
    );
    assert!(!env.instance_exists(&instance_of(second)).await);
    let events = env.events_for(NS, &name).await;
    assert!(
        events
            .iter()
            .any(|(reason, message)| reason == "DrainSkipped"
                && message.contains("nodeVolumeDetachTimeoutSeconds (3s)")),
        "{events:?}"
    );
}

/// A VolumeAttachment of `pv` to `node`, reported attached (what a CSI
/// attacher would do).
async fn attach_volume(attachments: &Api<VolumeAttachment>, name: &str, node: &str, pv: &str) {
    let va: VolumeAttachment = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": { "name": name },
        "spec": {
            "attacher": "csi.example.com",
            "nodeName": node,
            "source": { "persistentVolumeName": pv },
        },
    }))
    .unwrap();
    attachments.create(&Default::default(), &va).await.unwrap();
    set_attached(attachments, name, true).await;
}

async fn set_attached(attachments: &Api<VolumeAttachment>, name: &str, attached: bool) {
    attachments
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": { "attached": attached } })),
        )
        .await
        .unwrap();
}

/// The volume of a pod the drain leaves on the Node (here by its
/// `cluster.x-k8s.io/drain=skip` label) will not detach before the instance
/// goes, so the deletion does not wait for it (Cluster API's rule).
#[tokio::test(flavor = "multi_thread")]
async fn the_volume_of_a_pod_the_drain_leaves_is_not_waited_for() {
    let env = start(1).await;
    let client = env.client.clone();
    let machine = env.machines(NS).await.remove(0);
    let node = node_of(&machine);
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": { "name": "pv-logs" },
        "spec": {
            "capacity": { "storage": "1Gi" },
            "accessModes": ["ReadWriteOnce"],
            "csi": { "driver": "csi.example.com", "volumeHandle": "logs-1" },
            "claimRef": { "namespace": NS, "name": "logs" },
        },
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .create(&Default::default(), &pv)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "logger", "namespace": NS, "labels": { "cluster.x-k8s.io/drain": "skip" } },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "app", "image": workloads::TEST_IMAGE }],
            "volumes": [{ "name": "logs", "persistentVolumeClaim": { "claimName": "logs" } }],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&Default::default(), &pod)
        .await
        .unwrap();
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    attach_volume(&attachments, "logs", &node, "pv-logs").await;

    // No nodeVolumeDetachTimeoutSeconds: were the volume waited for, the
    // machine would never go.
    let name = machine.name_any();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    machines
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    env.eventually(
        "the machine goes, its skipped pod's volume left",
        LONG,
        async || machines.get_opt(&name).await.ok()?.is_none().then_some(()),
    )
    .await;
    assert!(!env.instance_exists(&instance_of(&machine)).await);
}

/// Deletions at fleet speed: a drain a budget holds for several rounds
/// reads the Node's pods from the controller's cache each round and lists
/// them from the API server only to confirm the Node is empty, and the
/// wait for an attached volume reads VolumeAttachments from the cache (the
/// API server's audit log counts the lists), so a fleet of deleting
/// machines does not LIST pods or attachments once per machine per round.
/// The controller runs as the generated ServiceAccount, which tells its
/// requests from the test's (and proves its RBAC lets it watch both).
#[tokio::test(flavor = "multi_thread")]
async fn a_held_drain_and_volume_wait_read_the_cache_not_a_list_per_round() {
    logs();
    let env = capstan_e2e::install::audited_as_installed(Faults {
        boot_latency_ms: 200,
        ..Default::default()
    })
    .await;
    let md = capstan_e2e::env::sample_deployment(
        "pool",
        capstan_e2e::env::SIM_PLUGIN,
        &env.cloud.url(),
        2,
        "v1.30.0",
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&Default::default(), &md)
        .await
        .expect("create md/pool");
    env.wait_rolled_out(NS, "pool", LONG).await;
    let client = env.client.clone();
    web_on_every_node(&env, 2).await;
    workloads::create_pdb(&client, NS, "web-budget", "web", json!(2))
        .await
        .unwrap();
    workloads::wait_pdb_allows(&client, NS, "web-budget", 0, LONG)
        .await
        .unwrap();
    // A node agent whose DaemonSet exists (its pods stay), and one whose
    // DaemonSet was deleted leaving its pods behind (orphans, drained).
    for name in ["agent", "leftover"] {
        workloads::create(&client, &workloads::daemonset(NS, name, 1))
            .await
            .unwrap();
        env.or_describe(workloads::wait_daemonset_ready(&client, NS, name, LONG).await)
            .await;
    }
    let daemon_sets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(client.clone(), NS);
    daemon_sets
        .delete("leftover", &DeleteParams::orphan())
        .await
        .unwrap();
    // A volume attached to every Node: whichever machine goes waits for it.
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    for m in env.machines(NS).await {
        let node = node_of(&m);
        attach_volume(&attachments, &node, &node, &format!("pv-{node}")).await;
    }

    scale(&env, 1).await;
    let victim = deleting_machine(&env).await;
    let node = node_of(&victim);
    let controller = "system:serviceaccount:capstan-system:capstan-controller";
    let evictions = || {
        env.control_plane
            .audit_writes()
            .unwrap()
            .iter()
            .filter(|w| {
                w["user"]["username"] == controller
                    && w["objectRef"]["subresource"] == "eviction"
                    && w["objectRef"]["name"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("web-"))
            })
            .count()
    };
    env.eventually("three drain rounds held by the budget", LONG, async || {
        (evictions() >= 3).then_some(())
    })
    .await;
    workloads::delete_pdb(&client, NS, "web-budget")
        .await
        .unwrap();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    let attachment_lists = || {
        env.control_plane
            .audit_lists("volumeattachments")
            .unwrap()
            .iter()
            .filter(|l| l["user"]["username"] == controller)
            .count()
    };
    env.eventually(
        "the drained machine waits for its volume",
        LONG,
        async || {
            let m = machines.get_opt(&victim.name_any()).await.ok()??;
            deleting(&m).filter(|(reason, _)| reason == "WaitingForVolumeDetach")
        },
    )
    .await;
    let lists_when_waiting = attachment_lists();
    // The volume wait looks again every 2 s: two or three more looks.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lists_after_waiting = attachment_lists();
    set_attached(&attachments, &node, false).await;
    env.eventually(
        "the drain completes and the machine goes",
        LONG,
        async || {
            machines
                .get_opt(&victim.name_any())
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    let rounds = evictions();
    let evicted: Vec<String> = env
        .control_plane
        .audit_writes()
        .unwrap()
        .iter()
        .filter(|w| {
            w["user"]["username"] == controller && w["objectRef"]["subresource"] == "eviction"
        })
        .filter_map(|w| w["objectRef"]["name"].as_str().map(str::to_string))
        .collect();
    assert!(
        evicted.iter().any(|p| p.starts_with("leftover-")),
        "the orphaned DaemonSet pod is drained: {evicted:?}"
    );
    assert!(
        !evicted.iter().any(|p| p.starts_with("agent-")),
        "a live DaemonSet's pod is left alone: {evicted:?}"
    );
    let lists: Vec<String> = env
        .control_plane
        .audit_lists("pods")
        .unwrap()
        .iter()
        .filter(|l| l["user"]["username"] == controller)
        .filter_map(|l| l["requestURI"].as_str().map(str::to_string))
        .filter(|uri| uri.contains(&format!("spec.nodeName%3D{node}")))
        .collect();
    eprintln!(
        "drain of {node}: {rounds} evictions of the budgeted pod, {} lists of its pods",
        lists.len()
    );
    assert!(rounds >= 4, "held rounds and the last ones: {rounds}");
    // One list confirms the Node is empty (seeing it also shows the audit
    // log records the controller's lists); none per held round.
    assert!(
        (1..=2).contains(&lists.len()),
        "the Node's pods are listed only to confirm it is empty, not per round: {lists:#?}"
    );
    eprintln!(
        "volume wait on {node}: {lists_when_waiting} VolumeAttachment lists when it began, {lists_after_waiting} 5 s later"
    );
    // The watch's own first list (two if it had to list again), none per look.
    assert!(
        (1..=2).contains(&lists_after_waiting) && lists_after_waiting == lists_when_waiting,
        "VolumeAttachments come from the cache, not a list per look: {lists_when_waiting} then {lists_after_waiting}"
    );
}
