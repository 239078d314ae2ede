//! A cluster that runs workloads: the real kube-scheduler places pods on the
//! simulated Nodes, the simulated kubelet runs them, the real Deployment,
//! ReplicaSet, DaemonSet and disruption controllers give them their
//! semantics, the API server enforces PodDisruptionBudgets on evictions, and
//! the real node-lifecycle controller judges Nodes by their heartbeats.

use crate::logs;
use capstan_api::MachineDeployment;
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, EnvOptions, SIM_PLUGIN, node_of, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use capstan_e2e::workloads;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

fn condition<'a>(
    node: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn status_of(node: &Node, type_: &str) -> Option<String> {
    condition(node, type_).map(|c| c.status.clone())
}

fn taint_keys(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread")]
async fn deployments_and_daemonsets_run_on_machines_nodes() {
    logs();
    let mut env = Env::start(Faults {
        boot_latency_ms: 200,
        ..Default::default()
    })
    .await
    .expect("environment starts");
    env.start_controllers(Providers::default(), Options::default())
        .await;
    // Three Nodes from Capstan machines: the sandboxed provider creates the
    // instances, the simulated kubelet registers and runs them.
    let md: MachineDeployment =
        sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 3, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .expect("create md");
    env.wait_rolled_out(NS, "pool", LONG).await;
    let nodes: Vec<String> = env.machines(NS).await.iter().map(node_of).collect();
    assert_eq!(nodes.len(), 3);

    let client = env.client.clone();
    workloads::create(&client, &workloads::deployment(NS, "web", 3, 1))
        .await
        .unwrap();
    workloads::create(&client, &workloads::daemonset(NS, "agent", 1))
        .await
        .unwrap();
    let web = env
        .or_describe(workloads::wait_deployment_available(&client, NS, "web", LONG).await)
        .await;
    assert_eq!(web.status.unwrap().available_replicas, Some(3));
    let agent = workloads::wait_daemonset_ready(&client, NS, "agent", LONG)
        .await
        .unwrap();
    let status = agent.status.unwrap();
    assert_eq!(
        (status.desired_number_scheduled, status.number_ready),
        (3, 3)
    );

    // Every pod was bound by the scheduler and started by the kubelet: one
    // DaemonSet pod per Node, and each pod Running with an IP on its Node.
    for node in &nodes {
        let pods = workloads::pods_on_node(&client, node).await.unwrap();
        let agents = pods
            .iter()
            .filter(|p| p.labels().get("app").map(String::as_str) == Some("agent"))
            .count();
        assert_eq!(agents, 1, "one agent pod on {node}");
        for pod in &pods {
            let s = pod.status.as_ref().unwrap();
            assert_eq!(s.phase.as_deref(), Some("Running"), "{}", pod.name_any());
            assert!(s.pod_ip.is_some() && s.host_ip.is_some(), "{s:?}");
            assert!(pod_ready(pod), "{}", pod.name_any());
        }
    }

    // Readiness is the kubelet's to report: failing one pod's makes the
    // Deployment one short of available, and passing it again restores it.
    let victim = workloads::pods_of(&client, NS, "web").await.unwrap()[0].name_any();
    let path = format!("/admin/pods/{NS}/{victim}/readiness");
    let (code, _) = env
        .cloud_call("PUT", &path, Some(json!({"ready": false})))
        .await
        .unwrap();
    assert_eq!(code, 204);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    env.eventually("web has 2 available replicas", LONG, async || {
        let d = deployments.get("web").await.ok()?;
        (d.status?.available_replicas == Some(2)).then_some(())
    })
    .await;
    let (code, _) = env
        .cloud_call("PUT", &path, Some(json!({"ready": true})))
        .await
        .unwrap();
    assert_eq!(code, 204);
    workloads::wait_deployment_available(&client, NS, "web", LONG)
        .await
        .unwrap();
    let stats = env.cloud.stats();
    assert!(stats.pods_started >= 6, "{stats:?}");
    assert_eq!(stats.node_errors, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn evictions_respect_disruption_budgets_and_grace_periods() {
    logs();
    // Containers that ignore SIGTERM: each pod holds its whole grace
    // period, the upper bound (by default they exit after a second).
    let mut options = EnvOptions::new(Faults::default());
    options.kubelet.pod_stop_delay_ms = u64::MAX;
    let env = Env::start_with(options).await.expect("environment starts");
    env.add_nodes(2).await.expect("nodes");
    let client = env.client.clone();
    // Pods take 5 s to terminate, so a graceful deletion is observable.
    workloads::create(&client, &workloads::deployment(NS, "web", 3, 5))
        .await
        .unwrap();
    workloads::wait_deployment_available(&client, NS, "web", LONG)
        .await
        .unwrap();
    workloads::create_pdb(&client, NS, "web", "web", json!(3))
        .await
        .unwrap();
    workloads::wait_pdb_allows(&client, NS, "web", 0, LONG)
        .await
        .unwrap();

    let pods = workloads::pods_of(&client, NS, "web").await.unwrap();
    let refused = workloads::evict(&client, NS, &pods[0].name_any(), None)
        .await
        .expect_err("the budget forbids any disruption");
    assert_eq!(refused.code, 429, "{refused:?}");
    assert!(refused.message.contains("disruption budget"), "{refused:?}");

    // One more replica makes room for exactly one disruption.
    Api::<Deployment>::namespaced(client.clone(), NS)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    workloads::wait_deployment_available(&client, NS, "web", LONG)
        .await
        .unwrap();
    workloads::wait_pdb_allows(&client, NS, "web", 1, LONG)
        .await
        .unwrap();
    let victim = pods[0].clone();
    let evicted_at = Instant::now();
    workloads::evict(&client, NS, &victim.name_any(), None)
        .await
        .expect("the budget allows one disruption now");
    // The eviction is a graceful deletion: the pod stays, terminating, for
    // its grace period, then the kubelet removes it.
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let terminating = api.get(&victim.name_any()).await.expect("still there");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(5));
    env.eventually("the evicted pod is gone", LONG, async || {
        match api.get(&victim.name_any()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => Some(()),
            _ => None,
        }
    })
    .await;
    let gone_after = evicted_at.elapsed();
    // A lower bound only (the deletion time has whole seconds): the kubelet
    // waited out the grace period.
    assert!(gone_after >= Duration::from_millis(3500), "{gone_after:?}");
    // The ReplicaSet replaces the pod.
    workloads::wait_deployment_available(&client, NS, "web", LONG)
        .await
        .unwrap();
    let pods = workloads::pods_of(&client, NS, "web").await.unwrap();
    assert_eq!(pods.len(), 4);
    assert!(pods.iter().all(|p| p.uid() != victim.uid()));
    let stats = env.cloud.stats();
    assert_eq!(stats.pods_removed, 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_nodes_go_unknown_and_come_back() {
    logs();
    let env = Env::start(Faults::default())
        .await
        .expect("environment starts");
    let names = env.add_nodes(2).await.expect("nodes");
    let (quiet, chatty) = (names[0].clone(), names[1].clone());
    let nodes: Api<Node> = Api::all(env.client.clone());
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "kube-node-lease");

    // Heartbeats are Lease renewals.
    let renewed = async |name: &str| {
        leases
            .get(name)
            .await
            .ok()
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
    };
    let first = renewed(&quiet).await.expect("the kubelet created a Lease");
    env.eventually("the Lease is renewed", LONG, async || {
        (renewed(&quiet).await? > first).then_some(())
    })
    .await;

    let grace = env.control_plane.options.node_monitor_grace_period;
    let (code, _) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{quiet}/heartbeats"),
            Some(json!({"enabled": false})),
        )
        .await
        .unwrap();
    assert_eq!(code, 204);
    let stopped = Instant::now();
    let last = renewed(&quiet).await.unwrap();
    // Nothing marks it before the grace period runs out: its last heartbeat
    // is at most one interval old.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = nodes.get(&quiet).await.unwrap();
    assert_eq!(status_of(&node, "Ready").as_deref(), Some("True"));

    let unknown = env
        .eventually(
            "the node-lifecycle controller marks it Unknown",
            grace * 3,
            async || {
                let node = nodes.get(&quiet).await.ok()?;
                (status_of(&node, "Ready").as_deref() == Some("Unknown")).then_some(node)
            },
        )
        .await;
    let took = stopped.elapsed();
    println!("Ready=Unknown {took:?} after heartbeats stopped (grace period {grace:?})");
    assert_eq!(
        condition(&unknown, "Ready").unwrap().reason.as_deref(),
        Some("NodeStatusUnknown"),
        "set by the real node-lifecycle controller"
    );
    env.eventually("it is tainted unreachable", LONG, async || {
        let node = nodes.get(&quiet).await.ok()?;
        taint_keys(&node)
            .contains("node.kubernetes.io/unreachable:NoSchedule")
            .then_some(())
    })
    .await;
    assert_eq!(
        renewed(&quiet).await,
        Some(last),
        "no renewals while stopped"
    );
    let other = nodes.get(&chatty).await.unwrap();
    assert_eq!(status_of(&other, "Ready").as_deref(), Some("True"));

    // Back: the kubelet corrects the status and the taint is lifted.
    env.cloud_call(
        "PUT",
        &format!("/admin/nodes/{quiet}/heartbeats"),
        Some(json!({"enabled": true})),
    )
    .await
    .unwrap();
    env.eventually("it is Ready and untainted again", LONG, async || {
        let node = nodes.get(&quiet).await.ok()?;
        (status_of(&node, "Ready").as_deref() == Some("True") && taint_keys(&node).is_empty())
            .then_some(())
    })
    .await;

    // A condition for a time: the lifecycle controller taints by it, and it
    // goes away by itself.
    let (code, _) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{chatty}/conditions"),
            Some(json!({"type": "NetworkUnavailable", "status": "True", "reason": "NoRoute", "seconds": 4})),
        )
        .await
        .unwrap();
    assert_eq!(code, 204);
    let node = nodes.get(&chatty).await.unwrap();
    assert_eq!(
        status_of(&node, "NetworkUnavailable").as_deref(),
        Some("True")
    );
    assert_eq!(
        condition(&node, "NetworkUnavailable")
            .unwrap()
            .reason
            .as_deref(),
        Some("NoRoute")
    );
    env.eventually("the network-unavailable taint", LONG, async || {
        let node = nodes.get(&chatty).await.ok()?;
        taint_keys(&node)
            .contains("node.kubernetes.io/network-unavailable:NoSchedule")
            .then_some(())
    })
    .await;
    env.eventually(
        "the condition expires and the taint goes",
        LONG,
        async || {
            let node = nodes.get(&chatty).await.ok()?;
            (status_of(&node, "NetworkUnavailable").is_none() && taint_keys(&node).is_empty())
                .then_some(())
        },
    )
    .await;

    // Bad switches say what is wrong.
    let (code, body) = env
        .cloud_call(
            "PUT",
            "/admin/nodes/sim-nope/heartbeats",
            Some(json!({"enabled": false})),
        )
        .await
        .unwrap();
    assert_eq!((code, body["code"].as_str()), (404, Some("NodeNotFound")));
    let (code, body) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{chatty}/conditions"),
            Some(json!({"type": "Ready", "status": "Maybe"})),
        )
        .await
        .unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("status"),
        "{body}"
    );
    let (_, listed) = env.cloud_call("GET", "/admin/nodes", None).await.unwrap();
    assert_eq!(listed["nodes"].as_array().unwrap().len(), 2, "{listed}");
}
