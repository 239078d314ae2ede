//! Cluster API v1beta2 conditions on a MachineDeployment and its
//! MachineSet, on a real control plane, each waited for with `kubectl
//! wait` as a user's script would: steady (`Available`, `MachinesReady`,
//! `MachinesUpToDate`), a scale-up and a scale-down (`ScalingUp`,
//! `ScalingDown`), a remediation (`Remediating`), a paused set (`Paused`),
//! a rollout (`RollingOut`) and a deletion (`Deleting`). A paused set
//! (Cluster API's annotation) and a Machine's pre-drain hook hold the
//! moments that otherwise last a pass.

use capstan_api::{MachineDeployment, MachineHealthCheck, MachineSet};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const NS: &str = "default";
const MD: &str = "life";
const LONG: Duration = Duration::from_secs(90);

/// `kubectl wait --for=condition=CONDITION OBJECT` (`Type` or
/// `Type=False`), within 90 s.
async fn wait(env: &Env, object: &str, condition: &str) {
    let waited = env.control_plane.kubectl(
        &[
            "wait",
            "-n",
            NS,
            object,
            &format!("--for=condition={condition}"),
            "--timeout=90s",
        ],
        None,
    );
    match waited {
        Ok(out) => assert!(out.contains("condition met"), "{out}"),
        Err(e) => panic!(
            "kubectl wait {object} {condition}: {e}\n{}",
            env.describe(NS).await
        ),
    }
}

async fn patch_md(env: &Env, patch: serde_json::Value) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(MD, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// The deployment's current MachineSet (the one with replicas).
async fn current_set(env: &Env) -> String {
    let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    sets.items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .max_by_key(|s| s.spec.replicas)
        .unwrap()
        .name_any()
}

async fn pause_set(env: &Env, set: &str, paused: bool) {
    let value = paused.then_some("true");
    Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .patch(
            set,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": value}}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_reports_every_v1beta2_condition_through_its_lifecycle() {
    crate::logs();
    let mut env = Env::start(Faults {
        boot_latency_ms: 200,
        ..Faults::default()
    })
    .await
    .expect("env");
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let md = sample_deployment(MD, SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, MD, LONG).await;
    let md_ref = format!("machinedeployment/{MD}");
    for steady in [
        "Available",
        "MachinesReady",
        "MachinesUpToDate",
        "RollingOut=False",
        "ScalingUp=False",
        "ScalingDown=False",
        "Remediating=False",
        "Deleting=False",
        "Paused=False",
    ] {
        wait(&env, &md_ref, steady).await;
    }
    let set = current_set(&env).await;
    let set_ref = format!("machineset/{set}");
    wait(&env, &set_ref, "MachinesReady").await;

    // A paused set holds the scale: the deployment scales up, then down.
    pause_set(&env, &set, true).await;
    wait(&env, &set_ref, "Paused").await;
    patch_md(&env, json!({"spec": {"replicas": 3}})).await;
    wait(&env, &md_ref, "ScalingUp").await;
    patch_md(&env, json!({"spec": {"replicas": 1}})).await;
    wait(&env, &md_ref, "ScalingDown").await;
    wait(&env, &md_ref, "ScalingUp=False").await;
    patch_md(&env, json!({"spec": {"replicas": 2}})).await;
    wait(&env, &md_ref, "ScalingDown=False").await;

    pause_set(&env, &set, false).await;
    wait(&env, &set_ref, "Paused=False").await;

    // A health check marks a Machine whose Node went silent; its
    // pre-drain hook holds its deletion, so the deployment is Remediating.
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": {"name": MD, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"capstan.dev/deployment-name": MD}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
                {"type": "Ready", "status": "False", "timeoutSeconds": 2},
            ]},
        },
    }))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .unwrap();
    let silent = env.machines(NS).await[0].clone();
    let hook = "pre-drain.delete.hook.machine.capstan.dev/e2e";
    let machines = Api::<capstan_api::Machine>::namespaced(env.client.clone(), NS);
    let set_hook = async |name: &str, value: Option<&str>| {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {hook: value}}})),
            )
            .await
            .unwrap();
    };
    set_hook(&silent.name_any(), Some("test")).await;
    let node = capstan_e2e::env::node_of(&silent);
    let (code, body) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{node}/heartbeats"),
            Some(json!({"enabled": false})),
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
    wait(&env, &md_ref, "Remediating").await;
    wait(&env, &set_ref, "Remediating").await;
    set_hook(&silent.name_any(), None).await;
    wait(&env, &md_ref, "Remediating=False").await;
    env.wait_rolled_out(NS, MD, LONG).await;
    wait(&env, &md_ref, "MachinesReady").await;

    // A rollout held by spec.paused: RollingOut until it resumes.
    patch_md(
        &env,
        json!({"spec": {"paused": true, "template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    wait(&env, &md_ref, "RollingOut").await;
    wait(&env, &md_ref, "MachinesUpToDate=False").await;
    patch_md(&env, json!({"spec": {"paused": false}})).await;
    wait(&env, &md_ref, "RollingOut=False").await;
    wait(&env, &md_ref, "MachinesUpToDate").await;

    // Deleting, held by a Machine's pre-drain hook.
    let held = env
        .machines(NS)
        .await
        .into_iter()
        .find(|m| m.metadata.deletion_timestamp.is_none())
        .unwrap()
        .name_any();
    set_hook(&held, Some("test")).await;
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .delete(MD, &DeleteParams::default())
        .await
        .unwrap();
    wait(&env, &md_ref, "Deleting").await;
    set_hook(&held, None).await;
    env.eventually("the deployment gone", LONG, async || {
        Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
            .get_opt(MD)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    env.stop_controllers().await;
}
