//! Every status a MachineSet or a MachineDeployment can reach is one the
//! API server accepts: written in turn with server-side apply as the
//! controllers write them (a full status, then zero replicas and no
//! versions, paused, deleting, and back), and a deployment scaled 3 → 0 →
//! 2 and deleted by the controllers with no status write refused in the
//! API server's audit log.
//!
//! Kubernetes 1.20's server-side apply turns a list or an object the
//! manager stops sending into `null` rather than removing it (fixed in
//! later structured-merge-diff releases), which a schema without
//! `nullable` refuses with 422: these tests keep that from coming back.

use capstan_api::{
    Condition, DeploymentPhase, MachineDeployment, MachineDeploymentStatus, MachinePlanView,
    MachineSet, MachineSetStatus, RolloutPlan, RolloutProgress, StatusVersion, Time,
};
use capstan_controllers::{Options, Providers};
use capstan_e2e::control_plane::ControlPlaneOptions;
use capstan_e2e::env::{Env, EnvOptions, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

fn condition(type_: &str, status: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "Test".into(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Write `status` over `before` as the controllers do
/// (`capstan_kit::write::write_status`) and say whether the API server
/// took it.
async fn apply<K, S>(api: &Api<K>, name: &str, before: Option<&S>, status: &S) -> Result<(), String>
where
    K: Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: k8s_openapi::serde::Serialize,
{
    let old = before.map(|b| serde_json::to_value(b).unwrap());
    let new = serde_json::to_value(status).unwrap();
    capstan_kit::write::write_status(api, name, old.as_ref(), &new)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_shape_of_a_set_and_a_deployment_is_accepted_by_the_api_server() {
    let env = Env::start(Faults::default()).await.unwrap();
    let md = sample_deployment("shapes", SIM_PLUGIN, &env.cloud.url(), 0, "v1.30.0");
    let deployments: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    deployments
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    let set = MachineSet::new(
        "shapes",
        serde_json::from_value(json!({
            "replicas": 0,
            "selector": {"matchLabels": {"capstan.dev/pool": "shapes"}},
            "template": md.spec.template,
        }))
        .unwrap(),
    );
    let sets: Api<MachineSet> = Api::namespaced(env.client.clone(), NS);
    sets.create(&PostParams::default(), &set).await.unwrap();

    let versions = |v: &str, n: i32| {
        vec![StatusVersion {
            version: v.into(),
            replicas: n,
        }]
    };
    let full_set = MachineSetStatus {
        replicas: 3,
        ready_replicas: 3,
        available_replicas: 3,
        up_to_date_replicas: 3,
        remediated_replicas: 1,
        versions: versions("v1.30.0", 3),
        selector: Some("capstan.dev/pool=shapes".into()),
        observed_generation: Some(1),
        conditions: vec![condition("Ready", "True"), condition("Paused", "False")],
        ..Default::default()
    };
    let zero_set = MachineSetStatus {
        observed_generation: Some(2),
        selector: full_set.selector.clone(),
        conditions: vec![condition("Ready", "True")],
        ..Default::default()
    };
    let set_shapes: Vec<(&str, MachineSetStatus)> = vec![
        ("full", full_set.clone()),
        ("zero replicas, no versions", zero_set.clone()),
        (
            "paused",
            MachineSetStatus {
                conditions: vec![condition("Paused", "True")],
                ..zero_set.clone()
            },
        ),
        ("full again", full_set.clone()),
        (
            "deleting, nothing but a condition",
            MachineSetStatus {
                conditions: vec![condition("Deleting", "True")],
                ..Default::default()
            },
        ),
        ("full once more", full_set),
        ("empty", MachineSetStatus::default()),
    ];
    let mut before = None;
    for (shape, status) in &set_shapes {
        apply(&sets, "shapes", before, status)
            .await
            .unwrap_or_else(|e| panic!("MachineSet status {shape:?} refused: {e}"));
        let read = sets
            .get_status("shapes")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        assert_eq!(read.versions, status.versions, "{shape}");
        assert_eq!(read.replicas, status.replicas, "{shape}");
        assert_eq!(read.selector, status.selector, "{shape}");
        before = Some(status);
    }

    let full_deployment = MachineDeploymentStatus {
        replicas: 3,
        updated_replicas: 2,
        up_to_date_replicas: 2,
        ready_replicas: 3,
        available_replicas: 3,
        unavailable_replicas: 0,
        versions: vec![
            StatusVersion {
                version: "v1.30.0".into(),
                replicas: 1,
            },
            StatusVersion {
                version: "v1.31.0".into(),
                replicas: 2,
            },
        ],
        revision: Some(2),
        selector: Some("capstan.dev/pool=shapes".into()),
        phase: Some(DeploymentPhase::Running),
        observed_generation: Some(3),
        in_place_plan: Some(RolloutPlan {
            revision: 2,
            decision: "InPlace".into(),
            machines: vec![MachinePlanView {
                machine: "shapes-a".into(),
                action: "InPlace".into(),
                ..Default::default()
            }],
        }),
        rollout: Some(RolloutProgress {
            template: "abc".into(),
            start_time: Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap()),
            remediated_before: 0,
            complete: false,
        }),
        conditions: vec![
            condition("Available", "True"),
            condition("RollingOut", "True"),
        ],
    };
    let done = MachineDeploymentStatus {
        versions: versions("v1.31.0", 3),
        in_place_plan: None,
        rollout: None,
        conditions: vec![condition("Available", "True")],
        ..full_deployment.clone()
    };
    let zero = MachineDeploymentStatus {
        revision: Some(2),
        selector: done.selector.clone(),
        observed_generation: Some(4),
        conditions: vec![condition("Available", "True")],
        ..Default::default()
    };
    let deployment_shapes: Vec<(&str, MachineDeploymentStatus)> = vec![
        ("rolling out", full_deployment.clone()),
        ("rolled out: no plan, no rollout", done.clone()),
        ("zero replicas, no versions", zero.clone()),
        (
            "paused",
            MachineDeploymentStatus {
                conditions: vec![condition("Paused", "True")],
                phase: Some(DeploymentPhase::Running),
                ..zero.clone()
            },
        ),
        ("rolling out again", full_deployment),
        (
            "deleting, nothing but a condition",
            MachineDeploymentStatus {
                conditions: vec![condition("Deleting", "True")],
                ..Default::default()
            },
        ),
        ("rolled out again", done),
        ("empty", MachineDeploymentStatus::default()),
    ];
    let mut before = None;
    for (shape, status) in &deployment_shapes {
        apply(&deployments, "shapes", before, status)
            .await
            .unwrap_or_else(|e| panic!("MachineDeployment status {shape:?} refused: {e}"));
        let read = deployments
            .get_status("shapes")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        assert_eq!(read.versions, status.versions, "{shape}");
        assert_eq!(read.rollout, status.rollout, "{shape}");
        assert_eq!(read.in_place_plan, status.in_place_plan, "{shape}");
        before = Some(status);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scaling_to_zero_and_back_and_deleting_writes_no_refused_status() {
    crate::logs();
    let mut options = EnvOptions::new(Faults::default());
    options.control_plane = ControlPlaneOptions {
        audit: true,
        ..Default::default()
    };
    let mut env = Env::start_with(options).await.unwrap();
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let md = sample_deployment("zero", SIM_PLUGIN, &env.cloud.url(), 3, "v1.30.0");
    let deployments: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    deployments
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "zero", LONG).await;
    for replicas in [0, 2] {
        deployments
            .patch(
                "zero",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .unwrap();
        env.wait_rolled_out(NS, "zero", LONG).await;
        let expected: Vec<StatusVersion> = if replicas == 0 {
            vec![]
        } else {
            vec![StatusVersion {
                version: "v1.30.0".into(),
                replicas,
            }]
        };
        // Machines being deleted still count (as in Cluster API) until
        // they are gone.
        env.eventually(&format!("status.versions {expected:?}"), LONG, async || {
            let status = deployments.get_status("zero").await.ok()?.status?;
            (status.replicas == replicas && status.versions == expected).then_some(())
        })
        .await;
    }
    deployments
        .delete("zero", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("the deployment is gone", LONG, async || {
        deployments
            .get_opt("zero")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let refused: Vec<String> = env
        .control_plane
        .audit_writes()
        .unwrap()
        .into_iter()
        .filter(|w| {
            w["objectRef"]["subresource"] == "status"
                && w["objectRef"]["apiGroup"] == "capstan.dev"
                && w["responseStatus"]["code"].as_i64().unwrap_or(0) >= 400
        })
        .map(|w| {
            format!(
                "{} {} {}: {}",
                w["verb"], w["objectRef"]["resource"], w["objectRef"]["name"], w["responseStatus"]
            )
        })
        .collect();
    let written = env
        .control_plane
        .audit_writes()
        .unwrap()
        .into_iter()
        .filter(|w| {
            w["objectRef"]["subresource"] == "status" && w["objectRef"]["resource"] == "machinesets"
        })
        .count();
    assert!(written > 0, "the audit log holds the sets' status writes");
    assert!(refused.is_empty(), "status writes refused: {refused:#?}");
    assert!(
        env.machines(NS).await.is_empty(),
        "every Machine went with the deployment"
    );
}
