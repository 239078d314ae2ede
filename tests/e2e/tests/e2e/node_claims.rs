//! A Machine's Node is proven, not claimed: a provider plugin that reports
//! another Machine's provider ID, a control-plane Node's, or an old Node's
//! gets none of them. The controllers run as the ServiceAccount `capstan
//! install` generates, so the API server's audit log tells their requests
//! apart: no patch (taint, label, cordon), eviction or deletion reaches
//! those Nodes, while the Machines are alive or after they are deleted.

use crate::logs;
use capstan_api::machine_conditions::READY;
use capstan_api::{Machine, MachineDeployment, condition};
use capstan_e2e::env::{Env, SIM_PLUGIN, node_of, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);
const CONTROLLER: &str = "system:serviceaccount:capstan-system:capstan-controller";

/// A Machine of the hostile plugin that reports `provider_id` as its
/// instance's, with a taint it would carry to its Node.
fn claimer(name: &str, provider_id: &str) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "provider": {"plugin": "hostile", "config": {"attack": "claim-node", "target": provider_id}},
            "taints": [{"key": "hostile.example.com/mine", "value": "yes", "effect": "NoSchedule", "propagation": "Always"}]
        }
    }))
    .unwrap()
}

/// Writes by the controller to these Nodes or to pods on them (evictions).
fn writes_to(env: &Env, nodes: &[&str]) -> Vec<String> {
    env.control_plane
        .audit_writes()
        .unwrap()
        .iter()
        .filter(|w| w["user"]["username"] == CONTROLLER)
        .filter(|w| {
            let o = &w["objectRef"];
            (o["resource"] == "nodes" && nodes.iter().any(|n| o["name"] == *n))
                || o["subresource"] == "eviction"
        })
        .map(|w| format!("{} {}", w["verb"], w["objectRef"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_naming_nodes_not_its_own_touches_none_of_them() {
    logs();
    let env = capstan_e2e::install::audited_as_installed(Faults {
        boot_latency_ms: 200,
        ..Default::default()
    })
    .await;
    env.create_plugin("hostile", &capstan_e2e::plugin("hostile_plugin"))
        .await
        .unwrap();
    // The victim: a machine of the sim provider, its Node joined.
    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&Default::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "pool", LONG).await;
    let victim = env.machines(NS).await.remove(0);
    let victim_node = node_of(&victim);
    let victim_id = victim.status.as_ref().unwrap().provider_id.clone().unwrap();
    // Two Nodes that were there before any hostile Machine: a control-plane
    // Node within the hostile plugin's prefix, and a plain old one.
    let nodes: Api<Node> = Api::all(env.client.clone());
    for (name, labels) in [
        ("cp-1", json!({"node-role.kubernetes.io/control-plane": ""})),
        ("old-1", json!({})),
    ] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"providerID": format!("hostile://{name}")}
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    // Creation times are in whole seconds: the Machines come a second later.
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    // What the victim's own machine wrote to its Node before the attack.
    let victim_writes = || {
        writes_to(&env, &[victim_node.as_str()])
            .iter()
            .filter(|w| !w.contains("eviction"))
            .count()
    };
    let victim_writes_before = victim_writes();

    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    let cases = [
        (
            "thief",
            victim_id.as_str(),
            victim_node.as_str(),
            "reports the same provider ID; a Node is taken only by the one Machine that reports it, or by the one that took it first, so this Machine leaves it alone",
        ),
        (
            "crown",
            "hostile://cp-1",
            "cp-1",
            "it is a control-plane Node and the Plugin's spec.grants.controlPlaneNodes is not set",
        ),
        (
            "ancient",
            "hostile://old-1",
            "old-1",
            "before the Machine was created",
        ),
    ];
    for (name, id, _, _) in cases {
        machines
            .create(&PostParams::default(), &claimer(name, id))
            .await
            .unwrap();
    }
    for (name, _, node, rule) in cases {
        let message = env
            .eventually(&format!("{name}'s claim refused"), LONG, async || {
                let m = machines.get(name).await.ok()?;
                let c = condition(&m.status?.conditions, READY)?.clone();
                (c.reason == "NodeClaimRefused").then_some(c.message)
            })
            .await;
        assert!(
            message.starts_with(&format!("Node {node} carries spec.providerID"))
                && message.contains(rule),
            "{name}: {message}"
        );
        let m = machines.get(name).await.unwrap();
        assert!(
            m.status.unwrap().node_ref.is_none(),
            "{name} linked no Node"
        );
    }
    // The victim keeps its Node.
    let victim_now = machines.get(&victim.name_any()).await.unwrap();
    let ready = condition(&victim_now.status.as_ref().unwrap().conditions, READY).unwrap();
    assert_eq!(ready.status, "True", "{ready:?}");

    // Deleting the claimers releases their "instances" and nothing else.
    for (name, ..) in cases {
        machines.delete(name, &Default::default()).await.unwrap();
    }
    for (name, ..) in cases {
        env.eventually(&format!("{name} deleted"), LONG, async || {
            machines.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let touched = writes_to(&env, &["cp-1", "old-1"]);
    assert!(
        touched.is_empty(),
        "the controller wrote to Nodes it does not own, or evicted pods: {touched:?}"
    );
    assert_eq!(
        victim_writes(),
        victim_writes_before,
        "nothing of the claimers reached the victim's Node"
    );
    for name in ["cp-1", "old-1", victim_node.as_str()] {
        let node = nodes.get(name).await.expect("the Node is still there");
        let spec = node.spec.unwrap_or_default();
        assert_ne!(spec.unschedulable, Some(true), "{name} was cordoned");
        let taints = spec.taints.unwrap_or_default();
        assert!(
            !taints.iter().any(|t| t.key == "hostile.example.com/mine"),
            "{name}: {taints:?}"
        );
    }
}
