//! Addons and the target cluster's Kubernetes version, on a real control
//! plane (API server v1.20.2) whose Nodes are sim machines of a
//! MachineDeployment: a version outside the range its plugin declares is
//! refused with nothing applied; when the MachineDeployment rolls its
//! kubelets out of the applied version's range, the Addon says so
//! (`Compatible=False`) and names the newest version that fits, which is
//! also the only one offered as available; the plugin is told the API
//! server's version.

use crate::addon_order::{exporter_grants, exporter_variant};
use crate::addons::{NS, addon, condition_of, create, options, patch_spec, wait_status};
use capstan_addons::engine::{COMPATIBLE, UPDATE_AVAILABLE};
use capstan_api::{MachineDeployment, Plugin, PluginGrants, PluginSpec, PodSecurityLevel};
use capstan_controllers::Providers;
use capstan_e2e::env::{Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

/// The exporter, rebuilt with three versions on `stable`, each with its
/// own Kubernetes range: 1.7.0 before 1.30, 1.8.2 from 1.20, 1.9.1 from
/// 1.31 (which the v1.20.2 API server never fits).
fn ranged_exporter(dir: &std::path::Path) -> std::path::PathBuf {
    exporter_variant(
        dir,
        &[
            (
                r#"VERSIONS = [("1.7.0", "stable"), ("1.8.2", "rapid")]"#,
                r#"VERSIONS = [("1.7.0", "stable"), ("1.8.2", "stable"), ("1.9.1", "stable")]"#,
            ),
            (
                r#"KUBERNETES = {"1.7.0": ">=1.16.0", "1.8.2": ">=1.20.0"}"#,
                r#"KUBERNETES = {"1.7.0": "<1.30.0", "1.8.2": ">=1.20.0", "1.9.1": ">=1.31.0"}"#,
            ),
        ],
    )
}

fn image_of(d: &DaemonSet) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .image
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_outside_the_clusters_kubernetes_is_refused_and_a_rolled_cluster_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let component = tokio::task::block_in_place(|| ranged_exporter(dir.path()));
    let mut env = Env::start(Faults::default())
        .await
        .expect("environment starts");
    env.plugin_inputs = Some(Default::default());
    let grants = exporter_grants(&["fit-n", "fit-new"]);
    Api::<Plugin>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Plugin::new(
                "ne-fit",
                PluginSpec {
                    source: format!("file://{}", component.display()),
                    grants: PluginGrants {
                        objects: grants,
                        // A node agent: host PID, host network, the host's root.
                        pod_security: Some(PodSecurityLevel::Privileged),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
        )
        .await
        .unwrap();
    env.start_controllers(
        Providers::default(),
        capstan_controllers::Options {
            unsigned_plugin_dirs: vec![
                capstan_registry::Scope::parse(&format!("file://{}/", dir.path().display()))
                    .unwrap(),
            ],
            ..options()
        },
    )
    .await;
    // One machine whose kubelet runs the API server's version.
    let deployments = Api::<MachineDeployment>::namespaced(env.client.clone(), "default");
    deployments
        .create(
            &PostParams::default(),
            &sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2"),
        )
        .await
        .unwrap();
    env.wait_rolled_out("default", "pool", Duration::from_secs(90))
        .await;

    create(
        &env,
        &addon(
            "new",
            json!({"plugin": "ne-fit", "version": "1.9.1",
                   "config": {"namespace": "fit-new", "port": 9141}}),
        ),
    )
    .await;
    create(
        &env,
        &addon(
            "n",
            json!({"plugin": "ne-fit", "version": "1.7.0", "channel": "stable",
                   "updatePolicy": "Notify", "config": {"namespace": "fit-n", "port": 9142}}),
        ),
    )
    .await;

    // Outside its range: refused before anything is applied.
    let refused = wait_status(&env, "new", "refused as incompatible", |s| {
        condition_of(s, COMPATIBLE).1 == "Incompatible"
    })
    .await;
    let (status, _, message) = condition_of(&refused, COMPATIBLE);
    assert_eq!(status, "False");
    assert!(
        message.starts_with("version 1.9.1 does not fit the target cluster: it supports Kubernetes \">=1.31.0\", and the cluster runs v1.20.2 (API server), v1.20.2 (kubelets)"),
        "{message}"
    );
    assert_eq!(refused.phase.as_deref(), Some("Failed"));
    assert!(refused.inventory.is_empty());
    assert!(
        Api::<Namespace>::all(env.client.clone())
            .get_opt("fit-new")
            .await
            .unwrap()
            .is_none(),
        "nothing of 1.9.1 was applied"
    );

    let n = wait_status(&env, "n", "healthy at 1.7.0", |s| {
        s.healthy == Some(true) && s.version.as_deref() == Some("1.7.0")
    })
    .await;
    let (status, reason, message) = condition_of(&n, COMPATIBLE);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Compatible"));
    assert!(
        message.contains("supports Kubernetes \"<1.30.0\""),
        "{message}"
    );
    // The newest that fits, not the channel's newest (1.9.1).
    assert_eq!(n.available_version.as_deref(), Some("1.8.2"));
    // The plugin was told the API server's version.
    let told = env
        .plugin_inputs
        .as_ref()
        .unwrap()
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.call == "render")
        .map(|c| c.inputs[0].clone())
        .collect::<Vec<_>>();
    assert!(
        told.iter()
            .any(|spec| spec.contains(r#"kubernetes-version: Some("v1.20.2")"#)),
        "render was given the cluster's Kubernetes version: {told:?}"
    );

    // The MachineDeployment rolls its kubelets to v1.30.0: outside 1.7.0's
    // range, which stays applied and is reported.
    deployments
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"version": "v1.30.0"}}}})),
        )
        .await
        .unwrap();
    let n = wait_status(&env, "n", "reported incompatible", |s| {
        condition_of(s, COMPATIBLE).0 == "False"
    })
    .await;
    let (_, reason, message) = condition_of(&n, COMPATIBLE);
    assert_eq!(reason, "Incompatible");
    assert!(
        message.starts_with("version 1.7.0 stays applied, but it supports Kubernetes \"<1.30.0\"")
            && message.contains("v1.30.0 (kubelet) outside it")
            && message.ends_with("version 1.8.2 is the newest of the channel that fits: set spec.version to 1.8.2 to apply it"),
        "{message}"
    );
    assert_eq!(n.version.as_deref(), Some("1.7.0"));
    assert_eq!(n.available_version.as_deref(), Some("1.8.2"));
    assert_eq!(condition_of(&n, UPDATE_AVAILABLE).0, "True");
    let daemonsets = Api::<DaemonSet>::namespaced(env.client.clone(), "fit-n");
    assert_eq!(
        image_of(&daemonsets.get("node-exporter").await.unwrap()).as_deref(),
        Some("quay.io/prometheus/node-exporter:v1.7.0"),
        "what is applied stays"
    );
    assert!(env.event_reasons(NS).contains("Incompatible"));

    // Taking the offered version brings it back into range.
    patch_spec(&env, "n", json!({"version": "1.8.2"})).await;
    let n = wait_status(&env, "n", "compatible at 1.8.2", |s| {
        s.version.as_deref() == Some("1.8.2") && condition_of(s, COMPATIBLE).0 == "True"
    })
    .await;
    assert!(condition_of(&n, COMPATIBLE).2.contains("v1.30.0"), "{n:?}");
    assert_eq!(
        image_of(&daemonsets.get("node-exporter").await.unwrap()).as_deref(),
        Some("quay.io/prometheus/node-exporter:v1.8.2")
    );
    env.wait_rolled_out("default", "pool", Duration::from_secs(90))
        .await;
}
