//! The simulated cloud's kubelet against a real kube-apiserver: a machine
//! created through the sandboxed sim-provider becomes a Node whose
//! `spec.providerID` matches, with a Ready condition that can be flipped, and
//! the Node goes away with the instance.

use capstan_e2e::control_plane::ControlPlane;
use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::{Faults, SimCloud, SimCloudConfig, node_name};
use capstan_runtime::types::{Deletion, Machine};
use capstan_runtime::{Credential, Grants, Limits, Runtime, RuntimeConfig};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn node(cp: &Arc<ControlPlane>, name: &str) -> (u16, Value) {
    let (cp, path) = (cp.clone(), format!("/api/v1/nodes/{name}"));
    tokio::task::spawn_blocking(move || cp.get(&path))
        .await
        .unwrap()
        .unwrap()
}

fn ready(node: &Value) -> Option<&str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not reached in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_become_nodes_with_matching_provider_id() {
    let cp = Arc::new(
        tokio::task::spawn_blocking(ControlPlane::start)
            .await
            .unwrap()
            .expect("control plane starts"),
    );
    let cloud = SimCloud::start(SimCloudConfig {
        token: Some("n0des".into()),
        faults: Faults {
            boot_latency_ms: 200,
            delete_latency_ms: 200,
            ..Default::default()
        },
        kube: Some(cp.kube_target()),
        kubelet: capstan_e2e::env::test_kubelet(),
        ..Default::default()
    })
    .await
    .unwrap();

    let rt = Runtime::new(RuntimeConfig {
        max_concurrent_calls: 4,
        ..Default::default()
    })
    .unwrap();
    let mut grants = Grants {
        http: vec![cloud.url().parse().unwrap()],
        ..Default::default()
    };
    grants
        .credentials
        .insert("sim-cloud".into(), Credential::Bearer("n0des".into()));
    let provider = rt
        .load_file(&plugin("sim_provider"), Limits::default(), grants)
        .unwrap()
        .provider()
        .unwrap();
    let mut machine = Machine {
        name: "worker-0".into(),
        namespace: "default".into(),
        uid: "uid-worker-0".into(),
        cluster_name: Some("c1".into()),
        labels: vec![],
        version: Some("v1.20.2".into()),
        failure_domain: Some("zone-b".into()),
        provider_config: serde_json::json!({ "endpoint": cloud.url() }).to_string(),
        infrastructure_config: None,
        provider_id: None,
    };
    let status = provider.create(&machine, None).await.unwrap();
    machine.provider_id = Some(status.provider_id.clone());
    let id = status
        .provider_id
        .strip_prefix("sim://")
        .unwrap()
        .to_string();
    let name = node_name(&id);

    eventually("the Node is registered and Ready", async || {
        let (code, n) = node(&cp, &name).await;
        code == 200 && ready(&n) == Some("True")
    })
    .await;
    let (_, n) = node(&cp, &name).await;
    assert_eq!(n["spec"]["providerID"], status.provider_id.as_str());
    assert_eq!(
        n["metadata"]["labels"]["topology.kubernetes.io/zone"],
        "zone-b"
    );
    let addresses = n["status"]["addresses"].as_array().unwrap();
    assert!(
        addresses.iter().any(|a| a["type"] == "InternalIP"),
        "{addresses:?}"
    );

    // Flip Ready on request, as a test of unhealthy nodes would.
    let url = format!("{}/admin/instances/{id}/ready", cloud.url());
    let code = tokio::task::spawn_blocking(move || {
        ureq::put(&url)
            .header("content-type", "application/json")
            .send(r#"{"ready":false}"#)
            .map(|r| r.status().as_u16())
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(code, 204);
    let (_, n) = node(&cp, &name).await;
    assert_eq!(ready(&n), Some("False"));

    // Deleting the machine removes the Node.
    while provider.delete(&machine).await.unwrap() != Deletion::Done {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually("the Node is deleted", async || {
        node(&cp, &name).await.0 == 404
    })
    .await;
    // The kubelet counts the deletion once the API server answered it,
    // which can be a moment after a reader sees the Node gone.
    eventually("the deletion counted", async || {
        let stats = cloud.stats();
        (
            stats.nodes_registered,
            stats.nodes_deleted,
            stats.node_errors,
        ) == (1, 1, 0)
    })
    .await;
}
