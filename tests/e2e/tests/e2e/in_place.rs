//! In-place rollouts on a real kube-apiserver with the simulated cloud and
//! three Wasm updaters, the controllers running as the ServiceAccount
//! `capstan install` generates (`sim-updater`: `version`; `sim-tagger`:
//! `provider.config.tags.*`; `sim-team-tagger`: `provider.config.tags.team`):
//! a version and tag change applied entirely in place within the bounds,
//! unclaimed changes held until the fallback allows replacement, a
//! controller killed mid-update, a failing update, overlapping updaters,
//! a hung update remediated by a health check after its updater's
//! progress deadline, and a hostile updater faking progress.

use capstan_api::machine_conditions::{READY, UP_TO_DATE, UPDATING};
use capstan_api::set_conditions::IN_PLACE_UPDATABLE;
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, InPlaceFallback, InPlaceStrategy, IntOrString, Machine,
    MachineDeployment, MachinePhase, Plugin, RollingUpdate, is_true,
};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, eventually, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use capstan_e2e::workloads;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeSet;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(120);

fn options() -> Options {
    crate::logs();
    Options {
        poll: Duration::from_millis(250),
        ..Options::default()
    }
}

/// An environment with the controllers running and these updater Plugins
/// (name, component file stem) Ready.
async fn env_with(faults: Faults, updaters: &[(&str, &str)]) -> Env {
    let mut env = Env::start(faults).await.expect("environment starts");
    for (name, stem) in updaters {
        env.create_plugin(name, &capstan_e2e::plugin(stem))
            .await
            .expect("create updater plugin");
    }
    start_as_installed(&mut env).await;
    for (name, _) in updaters {
        wait_plugin(&env, name, true).await;
    }
    env
}

/// An environment with one updater Plugin (name, component file stem)
/// whose admin set `spec.progressDeadlineSeconds`, Ready, and the
/// controllers running as the generated ServiceAccount.
async fn env_with_deadline(faults: Faults, (name, stem): (&str, &str), deadline: u32) -> Env {
    let mut env = Env::start(faults).await.expect("environment starts");
    env.create_plugin(name, &capstan_e2e::plugin(stem))
        .await
        .expect("create updater plugin");
    Api::<Plugin>::all(env.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"progressDeadlineSeconds": deadline}})),
        )
        .await
        .expect("set the updater's progress deadline");
    start_as_installed(&mut env).await;
    wait_plugin(&env, name, true).await;
    env
}

/// Start the controllers as the ServiceAccount `capstan install`
/// generates: in-place updates patch Machines and Nodes, evict pods and
/// call updaters with credentials, all within those rights.
async fn start_as_installed(env: &mut Env) {
    let config = capstan_e2e::install::controller_config(env).await;
    env.start_controllers_as(config, Providers::default(), options())
        .await;
}

async fn wait_plugin(env: &Env, name: &str, ready: bool) -> Plugin {
    let api: Api<Plugin> = Api::all(env.client.clone());
    eventually(&format!("plugin {name} ready={ready}"), LONG, async || {
        let p = api.get(name).await.ok()?;
        let status = p.status.as_ref()?;
        let c = capstan_api::condition(&status.conditions, READY)?;
        (c.status == if ready { "True" } else { "False" }).then_some(p.clone())
    })
    .await
}

/// `replicas` sim machines tagged `team: a`, rolling with `maxSurge` /
/// `maxUnavailable`, updated in place with `fallback`.
fn deployment(
    env: &Env,
    name: &str,
    replicas: i32,
    surge: i32,
    unavailable: i32,
    fallback: InPlaceFallback,
) -> MachineDeployment {
    let mut md = sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), replicas, "v1.30.0");
    md.spec.template.spec.provider.config["tags"] = serde_json::json!({"team": "a"});
    md.spec.rollout_strategy_mut().rolling_update = Some(RollingUpdate {
        max_surge: Some(IntOrString::Int(surge)),
        max_unavailable: Some(IntOrString::Int(unavailable)),
    });
    md.spec.rollout_strategy_mut().in_place = Some(InPlaceStrategy {
        updaters: None,
        fallback,
    });
    md
}

async fn create(env: &Env, md: &MachineDeployment) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), md)
        .await
        .expect("create machinedeployment");
}

async fn patch_md(env: &Env, name: &str, patch: serde_json::Value) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch machinedeployment");
}

fn provider_ids(machines: &[Machine]) -> BTreeSet<String> {
    machines
        .iter()
        .filter_map(|m| m.status.as_ref()?.provider_id.clone())
        .collect()
}

fn available(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_none()
        && !m.annotations().contains_key(ANNOTATION_IN_PLACE_FROM)
        && m.status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, READY))
}

/// `capstan rollout plan md/NAME` with `extra` arguments, its output.
fn rollout_plan(env: &Env, md: &str, extra: &[&str]) -> String {
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let target = format!("md/{md}");
    let mut args = vec![
        "rollout",
        "plan",
        target.as_str(),
        "--kubeconfig",
        kubeconfig.as_str(),
    ];
    args.extend(extra);
    capstan_e2e::cli::ok(&args)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_and_tag_change_is_applied_in_place_by_two_updaters() {
    let env = env_with(
        Faults {
            boot_latency_ms: 200,
            update_latency_ms: 600,
            ..Default::default()
        },
        &[("sim-updater", "sim_updater"), ("sim-tagger", "sim_tagger")],
    )
    .await;
    create(
        &env,
        &deployment(&env, "web", 4, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "web", LONG).await;
    let before = provider_ids(&env.machines(NS).await);
    let launched = env.cloud.stats().instances_launched;
    assert_eq!(before.len(), 4);

    // The plan can be read before anything happens: pause, change, plan.
    patch_md(&env, "web", serde_json::json!({"spec": {"paused": true}})).await;
    patch_md(
        &env,
        "web",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0", "provider": {"config": {"tags": {"team": "b"}}}}}}}),
    )
    .await;
    let text = eventually("the plan covers 4 machines", LONG, async || {
        let text = rollout_plan(&env, "web", &[]);
        (text.matches("InPlace").count() >= 5).then_some(text)
    })
    .await;
    assert!(
        text.contains("1. sim-tagger") && text.contains("provider.config.tags.team"),
        "{text}"
    );
    assert!(
        text.contains("2. sim-updater") && text.contains("version"),
        "{text}"
    );
    let plan: serde_json::Value =
        serde_json::from_str(&rollout_plan(&env, "web", &["--output", "json"])).expect("plan JSON");
    assert_eq!(plan["decision"], "InPlace", "{plan}");
    assert_eq!(plan["machines"].as_array().unwrap().len(), 4, "{plan}");
    assert_eq!(
        plan["machines"][0]["steps"][1]["fields"][0], "version",
        "{plan}"
    );
    // Paused: nothing moved.
    assert!(
        env.machines(NS)
            .await
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.30.0"))
    );

    let (seen, watch) = capstan_e2e::rollout_watch::watch(env.client.clone(), NS, available);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_md(&env, "web", serde_json::json!({"spec": {"paused": false}})).await;
    env.wait_rolled_out(NS, "web", LONG).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch.abort();
    {
        let o = seen.lock().unwrap();
        assert!(
            o.states > 8,
            "the watch saw the rollout ({} states)",
            o.states
        );
        assert!(
            o.max_total <= 4,
            "maxSurge 0: at most 4 machines, saw {}",
            o.max_total
        );
        assert!(
            o.min_good >= 3,
            "maxUnavailable 1: at least 3 available, saw {}",
            o.min_good
        );
    }
    let machines = env.machines(NS).await;
    assert_eq!(provider_ids(&machines), before, "the same instances");
    assert_eq!(
        env.cloud.stats().instances_launched,
        launched,
        "no instance launched"
    );
    for i in env.cloud.instances() {
        assert_eq!(i.version.as_deref(), Some("v1.31.0"), "{i:?}");
        assert_eq!(i.tags.get("team").map(String::as_str), Some("b"), "{i:?}");
    }
    for m in &machines {
        let status = m.status.as_ref().unwrap();
        assert!(!m.annotations().contains_key(ANNOTATION_IN_PLACE_FROM));
        assert!(
            is_true(&status.conditions, UP_TO_DATE),
            "{:?}",
            status.conditions
        );
        assert_eq!(m.spec.version.as_deref(), Some("v1.31.0"));
        let by: Vec<&str> = status
            .updated_by
            .iter()
            .map(|r| r.updater.as_str())
            .collect();
        assert_eq!(
            by,
            ["sim-tagger", "sim-updater"],
            "provenance of {}",
            m.name_any()
        );
        assert!(
            status
                .updated_by
                .iter()
                .all(|r| r.digest.starts_with("sha256:"))
        );
        // Each step carries its updater's progress deadline: sim-updater's
        // manifest declares 300 s, sim-tagger's none (the default, 600 s).
        let deadlines: Vec<Option<u32>> = status
            .in_place_update
            .as_ref()
            .unwrap()
            .steps
            .iter()
            .map(|s| s.progress_deadline_seconds)
            .collect();
        assert_eq!(deadlines, [Some(600), Some(300)], "{}", m.name_any());
        let owner = m
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .unwrap();
        assert!(owner.name.starts_with("web-"), "{owner:?}");
        assert_eq!(m.labels().get("capstan.dev/set-name"), Some(&owner.name));
    }
    // Each machine's version update started once.
    assert_eq!(env.cloud.stats().updates_started, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn unclaimed_changes_wait_until_the_fallback_replaces() {
    let env = env_with(
        Faults {
            boot_latency_ms: 200,
            delete_latency_ms: 200,
            ..Default::default()
        },
        &[("sim-updater", "sim_updater")],
    )
    .await;
    create(
        &env,
        &deployment(&env, "db", 2, 1, 0, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "db", LONG).await;
    let before = provider_ids(&env.machines(NS).await);
    patch_md(
        &env,
        "db",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0", "provider": {"config": {"instanceType": "large"}}}}}}),
    )
    .await;
    let message = eventually(
        "the deployment names the unclaimed field",
        LONG,
        async || {
            let md = env.deployment(NS, "db").await;
            let status = md.status?;
            let c = capstan_api::condition(&status.conditions, IN_PLACE_UPDATABLE)?;
            (c.status == "False" && c.reason == "UnclaimedChanges").then(|| c.message.clone())
        },
    )
    .await;
    assert!(
        message.contains("provider.config.instanceType"),
        "{message}"
    );
    assert!(
        !message.contains("version"),
        "version is claimed: {message}"
    );
    let table = env
        .control_plane
        .kubectl(&["get", "md", "db"], None)
        .unwrap();
    assert!(table.contains("Blocked"), "{table}");
    // Nothing changes while it waits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let machines = env.machines(NS).await;
    assert_eq!(provider_ids(&machines), before);
    assert!(
        machines
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.30.0"))
    );
    assert_eq!(env.cloud.instances().len(), 2);

    // The fallback: replacement.
    patch_md(
        &env,
        "db",
        serde_json::json!({"spec": {"rollout": {"strategy": {"inPlace": {"fallback": "Replace"}}}}}),
    )
    .await;
    env.wait_rolled_out(NS, "db", LONG).await;
    eventually("old instances released", LONG, async || {
        (env.cloud.instances().len() == 2).then_some(())
    })
    .await;
    let after = provider_ids(&env.machines(NS).await);
    assert!(
        after.is_disjoint(&before),
        "replaced: {before:?} -> {after:?}"
    );
    assert!(
        env.cloud
            .instances()
            .iter()
            .all(|i| i.instance_type == "large")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_controller_resumes_the_update_without_a_second_plan() {
    let mut env = env_with(
        Faults {
            boot_latency_ms: 200,
            update_latency_ms: 4_000,
            ..Default::default()
        },
        &[("sim-updater", "sim_updater")],
    )
    .await;
    create(
        &env,
        &deployment(&env, "api", 2, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "api", LONG).await;
    let launched = env.cloud.stats().instances_launched;
    patch_md(
        &env,
        "api",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    // Kill the controllers while a machine's update is under way.
    let (name, started) = eventually("a machine is updating", LONG, async || {
        env.machines(NS).await.into_iter().find_map(|m| {
            let status = m.status.as_ref()?;
            let update = status.in_place_update.as_ref()?;
            (update.steps.first()?.state == "Updating")
                .then(|| (m.name_any(), update.start_time.clone()))
        })
    })
    .await;
    env.kill_controllers().await;
    assert_eq!(env.cloud.stats().updates_started, 1);
    start_as_installed(&mut env).await;
    env.wait_rolled_out(NS, "api", LONG).await;

    let machines = env.machines(NS).await;
    let resumed = machines.iter().find(|m| m.name_any() == name).unwrap();
    let status = resumed.status.as_ref().unwrap();
    assert_eq!(
        status.in_place_update.as_ref().unwrap().start_time,
        started,
        "the plan recorded before the restart was kept"
    );
    assert_eq!(status.updated_by.len(), 1, "{:?}", status.updated_by);
    // One update per machine: the restart did not start another.
    assert_eq!(env.cloud.stats().updates_started, 2);
    assert_eq!(env.cloud.stats().instances_launched, launched);
    assert!(
        env.cloud
            .instances()
            .iter()
            .all(|i| i.version.as_deref() == Some("v1.31.0"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_update_stops_the_rollout_until_the_machine_is_replaced() {
    let env = env_with(
        Faults {
            boot_latency_ms: 200,
            delete_latency_ms: 200,
            update_latency_ms: 300,
            refuse_updates: true,
            ..Default::default()
        },
        &[("sim-updater", "sim_updater")],
    )
    .await;
    create(
        &env,
        &deployment(&env, "jobs", 2, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "jobs", LONG).await;
    patch_md(
        &env,
        "jobs",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    let failed = eventually("a machine's update failed", LONG, async || {
        env.machines(NS).await.into_iter().find(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(MachinePhase::UpdateFailed))
        })
    })
    .await;
    let condition = capstan_api::condition(&failed.status.as_ref().unwrap().conditions, UPDATING)
        .unwrap()
        .clone();
    assert_eq!(condition.reason, "UpdateFailed");
    assert!(
        condition.message.contains("UpdateRefused"),
        "{}",
        condition.message
    );
    let table = env.control_plane.kubectl(&["get", "ma"], None).unwrap();
    assert!(table.contains("UpdateFailed"), "{table}");
    let described = env
        .control_plane
        .kubectl(&["describe", "ma", &failed.name_any()], None)
        .unwrap();
    assert!(
        described.contains("UpdateFailed") && described.contains("UpdateRefused"),
        "{described}"
    );
    let md = eventually("the rollout stops", LONG, async || {
        let md = env.deployment(NS, "jobs").await;
        let c = capstan_api::condition(&md.status.as_ref()?.conditions, IN_PLACE_UPDATABLE)?;
        (c.reason == "UpdateFailed").then_some(md)
    })
    .await;
    assert_eq!(
        md.status.unwrap().phase,
        Some(capstan_api::DeploymentPhase::Blocked)
    );
    // Nothing else moves, nothing is rolled back or replaced.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let machines = env.machines(NS).await;
    assert_eq!(machines.len(), 2);
    let other = machines
        .iter()
        .find(|m| m.name_any() != failed.name_any())
        .unwrap();
    assert!(!other.annotations().contains_key(ANNOTATION_IN_PLACE_FROM));
    assert_eq!(other.spec.version.as_deref(), Some("v1.30.0"));
    assert_eq!(env.cloud.instances().len(), 2);

    // Deleting the failed machine replaces it on the new template; the
    // rollout goes on.
    env.cloud.set_faults(Faults {
        boot_latency_ms: 200,
        delete_latency_ms: 200,
        update_latency_ms: 300,
        ..Default::default()
    });
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .delete(&failed.name_any(), &DeleteParams::default())
        .await
        .expect("delete the failed machine");
    env.wait_rolled_out(NS, "jobs", LONG).await;
    let machines = env.machines(NS).await;
    assert!(
        machines
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.31.0"))
    );
    assert!(machines.iter().all(|m| m.name_any() != failed.name_any()));
}

#[tokio::test(flavor = "multi_thread")]
async fn overlapping_updaters_are_refused_and_compose_with_an_order() {
    let env = env_with(
        Faults {
            boot_latency_ms: 200,
            ..Default::default()
        },
        &[("sim-tagger", "sim_tagger")],
    )
    .await;
    env.create_plugin("sim-team-tagger", &capstan_e2e::plugin("sim_team_tagger"))
        .await
        .unwrap();
    let refused = wait_plugin(&env, "sim-team-tagger", false).await;
    let c = capstan_api::condition(&refused.status.unwrap().conditions, READY)
        .unwrap()
        .clone();
    assert_eq!(c.reason, "FieldsOverlap", "{c:?}");
    assert!(
        c.message.contains("sim-tagger") && c.message.contains("provider.config.tags.team"),
        "{}",
        c.message
    );
    assert!(c.message.contains("spec.updateOrder"), "{}", c.message);

    create(
        &env,
        &deployment(&env, "cache", 2, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "cache", LONG).await;
    // With an order, both are active and the earlier one gets `team`.
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    for (name, order) in [("sim-team-tagger", 1), ("sim-tagger", 2)] {
        plugins
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"updateOrder": order}})),
            )
            .await
            .unwrap();
    }
    wait_plugin(&env, "sim-team-tagger", true).await;
    patch_md(
        &env,
        "cache",
        serde_json::json!({"spec": {"template": {"spec": {"provider": {"config": {"tags": {"team": "c", "env": "prod"}}}}}}}),
    )
    .await;
    env.wait_rolled_out(NS, "cache", LONG).await;
    for m in env.machines(NS).await {
        let Some(update) = m.status.as_ref().unwrap().in_place_update.clone() else {
            panic!("{} was not updated in place: {m:?}", m.name_any());
        };
        let steps: Vec<(String, Vec<String>)> = update
            .steps
            .iter()
            .map(|s| (s.updater.clone(), s.fields.clone()))
            .collect();
        assert_eq!(
            steps,
            [
                (
                    "sim-team-tagger".to_string(),
                    vec!["provider.config.tags.team".to_string()]
                ),
                (
                    "sim-tagger".to_string(),
                    vec!["provider.config.tags.env".to_string()]
                ),
            ]
        );
    }
    for i in env.cloud.instances() {
        assert_eq!(i.tags.get("team").map(String::as_str), Some("c"));
        assert_eq!(i.tags.get("env").map(String::as_str), Some("prod"));
    }
}

/// A health check over the `pool` machines: a Node `Ready=Unknown` or
/// `False` for 2 s is unhealthy.
async fn create_check(env: &Env, pool: &str) {
    let check: capstan_api::MachineHealthCheck = serde_json::from_value(serde_json::json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": { "name": pool, "namespace": NS },
        "spec": {
            "selector": { "matchLabels": { "capstan.dev/pool": pool } },
            "checks": {
                "unhealthyNodeConditions": [
                    { "type": "Ready", "status": "Unknown", "timeoutSeconds": 2 },
                    { "type": "Ready", "status": "False", "timeoutSeconds": 2 },
                ],
            },
        },
    }))
    .expect("a valid MachineHealthCheck");
    Api::<capstan_api::MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .expect("create mhc");
}

/// The machine's first in-place step (the tests here have one updater).
fn first_step(m: &Machine) -> &capstan_api::InPlaceStep {
    &m.status
        .as_ref()
        .unwrap()
        .in_place_update
        .as_ref()
        .unwrap()
        .steps[0]
}

/// The machine and its `HealthCheckSucceeded` condition, once that is False.
async fn judged_unhealthy(
    machines: &Api<Machine>,
    name: &str,
) -> Option<(Machine, capstan_api::Condition)> {
    let m = machines.get_opt(name).await.ok()??;
    let c = capstan_api::condition(
        &m.status.as_ref()?.conditions,
        capstan_api::machine_conditions::HEALTH_CHECK_SUCCEEDED,
    )?
    .clone();
    (c.status == "False").then_some((m, c))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_update_is_remediated_after_its_updaters_deadline_not_the_nodes() {
    // Updates take an hour: the updater's percent never moves.
    let hung = Faults {
        boot_latency_ms: 200,
        delete_latency_ms: 200,
        update_latency_ms: 3_600_000,
        ..Default::default()
    };
    // The admin's deadline for this updater: 20 s without progress. The
    // Node (going silent below) would be judged unhealthy after about
    // 12 s (10 s grace, then 2 s); an update-aware check waits for the
    // updater's deadline instead.
    let deadline = 20;
    let env = env_with_deadline(hung.clone(), ("sim-updater", "sim_updater"), deadline).await;
    create(
        &env,
        &deployment(&env, "hung", 2, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "hung", LONG).await;
    create_check(&env, "hung").await;
    let launched = env.cloud.stats().instances_launched;

    patch_md(
        &env,
        "hung",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    let updating = eventually("a machine updating in place", LONG, async || {
        env.machines(NS).await.into_iter().find(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.in_place_update.as_ref())
                .is_some_and(|u| u.steps.iter().any(|s| s.state == "Updating"))
        })
    })
    .await;
    let name = updating.name_any();
    assert_eq!(
        first_step(&updating).progress_deadline_seconds,
        Some(deadline)
    );
    // The update takes the Node down (its kubelet goes silent).
    let node = capstan_e2e::env::node_of(&updating);
    let (code, body) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{node}/heartbeats"),
            Some(serde_json::json!({ "enabled": false })),
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");

    let machines_api: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    let mut node_went_unready = false;
    let judged = eventually("the hung update judged unhealthy", LONG, async || {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        if let Ok(n) = nodes.get(&node).await {
            node_went_unready |= n
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status != "True");
        }
        judged_unhealthy(&machines_api, &name).await
    })
    .await;
    let (m, c) = judged;
    assert_eq!(c.reason, "InPlaceUpdateStalled", "{}", c.message);
    assert!(
        c.message.contains("sim-updater") && c.message.contains("progressDeadlineSeconds is 20"),
        "{}",
        c.message
    );
    assert!(
        node_went_unready,
        "the Node went unready well before the deadline, and that alone did not remediate it"
    );
    // Judged against the updater's deadline, counted from its last progress.
    let progress = first_step(&m)
        .last_progress_time
        .clone()
        .expect("progress time recorded");
    let waited = c.last_transition_time.0.as_second() - progress.0.as_second();
    assert!(
        waited >= i64::from(deadline) - 1,
        "judged after {waited}s, before the {deadline}s deadline"
    );

    // Remediated through the owner: deleted and replaced on the new
    // template; with updates healthy again, the other machine is updated
    // in place and the rollout finishes.
    env.cloud.set_faults(Faults {
        update_latency_ms: 300,
        ..hung
    });
    eventually("the hung machine deleted", LONG, async || {
        machines_api
            .get_opt(&name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    env.wait_rolled_out(NS, "hung", LONG).await;
    let machines = env.machines(NS).await;
    assert_eq!(machines.len(), 2);
    assert!(
        machines
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.31.0"))
    );
    assert_eq!(
        env.cloud.stats().instances_launched,
        launched + 1,
        "only the hung machine was replaced"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn only_an_updater_that_declares_a_drain_moves_pods() {
    // sim-updater's signed manifest says its version update needs a drain;
    // sim-tagger's says a tag change keeps the machine available.
    let env = env_with(
        Faults {
            boot_latency_ms: 200,
            update_latency_ms: 600,
            ..Default::default()
        },
        &[("sim-updater", "sim_updater"), ("sim-tagger", "sim_tagger")],
    )
    .await;
    let client = env.client.clone();
    create(
        &env,
        &deployment(&env, "pool", 3, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "pool", LONG).await;
    // Two web pods on two of the three Nodes, a budget that lets one go.
    workloads::create(
        &client,
        &workloads::one_per_node(workloads::deployment(NS, "web", 2, 1)),
    )
    .await
    .unwrap();
    env.or_describe(workloads::wait_deployment_available(&client, NS, "web", LONG).await)
        .await;
    workloads::create_pdb(&client, NS, "web-budget", "web", serde_json::json!(1))
        .await
        .unwrap();
    workloads::wait_pdb_allows(&client, NS, "web-budget", 1, LONG)
        .await
        .unwrap();
    let pods_before: BTreeSet<String> = workloads::pods_of(&client, NS, "web")
        .await
        .unwrap()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let instances = provider_ids(&env.machines(NS).await);

    // A tag change: no cordon, no eviction, the same pods.
    patch_md(
        &env,
        "pool",
        serde_json::json!({"spec": {"template": {"spec": {"provider": {"config": {"tags": {"team": "b"}}}}}}}),
    )
    .await;
    env.wait_rolled_out(NS, "pool", LONG).await;
    let moved = |timeline: &[capstan_e2e::sim_cloud::Moment]| {
        timeline
            .iter()
            .filter(|m| m.event == "pod-removed" && m.subject.starts_with(&format!("{NS}/web-")))
            .count()
    };
    assert_eq!(moved(&env.timeline().await), 0, "a tag change moved pods");
    let pods_after: BTreeSet<String> = workloads::pods_of(&client, NS, "web")
        .await
        .unwrap()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(pods_before, pods_after);
    for m in env.machines(NS).await {
        let steps = &m
            .status
            .as_ref()
            .unwrap()
            .in_place_update
            .as_ref()
            .unwrap()
            .steps;
        assert_eq!(steps.len(), 1);
        assert!(!steps[0].drain && steps[0].affects_availability == Some(false));
    }

    // A version change (and a tag): the plan says which step drains.
    patch_md(&env, "pool", serde_json::json!({"spec": {"paused": true}})).await;
    patch_md(
        &env,
        "pool",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0", "provider": {"config": {"tags": {"team": "c"}}}}}}}),
    )
    .await;
    let text = eventually("the plan covers 3 machines", LONG, async || {
        let text = rollout_plan(&env, "pool", &[]);
        (text.matches("drains the Node first").count() == 3).then_some(text)
    })
    .await;
    let tagger_line = text.lines().find(|l| l.contains("1. sim-tagger")).unwrap();
    assert!(tagger_line.contains("machine stays available"), "{text}");
    let updater_line = text.lines().find(|l| l.contains("2. sim-updater")).unwrap();
    assert!(updater_line.contains("drains the Node first"), "{text}");
    patch_md(&env, "pool", serde_json::json!({"spec": {"paused": false}})).await;
    env.wait_rolled_out(NS, "pool", LONG).await;

    // The same instances, each drained before its version update began;
    // every Node schedulable again; the web pods moved within their budget.
    let machines = env.machines(NS).await;
    assert_eq!(provider_ids(&machines), instances, "updated in place");
    let timeline = env.timeline().await;
    let updates: Vec<&capstan_e2e::sim_cloud::Moment> = timeline
        .iter()
        .filter(|m| m.event == "instance-update-started")
        .collect();
    assert_eq!(updates.len(), 3, "{timeline:?}");
    for update in &updates {
        let node = update.node.as_deref().unwrap();
        let web_removed_later = timeline.iter().any(|m| {
            m.event == "pod-removed"
                && m.node.as_deref() == Some(node)
                && m.subject.starts_with(&format!("{NS}/web-"))
                && m.seq > update.seq
        });
        assert!(
            !web_removed_later,
            "a web pod was still on {node} when its update began: {timeline:?}"
        );
    }
    assert!(moved(&timeline) >= 2, "both web pods moved: {timeline:?}");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for m in &machines {
        let node = nodes.get(&capstan_e2e::env::node_of(m)).await.unwrap();
        assert_ne!(
            node.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{} left cordoned",
            node.metadata.name.unwrap_or_default()
        );
        let update = m.status.as_ref().unwrap().in_place_update.as_ref().unwrap();
        assert!(update.node_drained_time.is_some() && update.uncordon_node.is_none());
    }
    env.or_describe(workloads::wait_deployment_available(&client, NS, "web", LONG).await)
        .await;
    let reasons = env.event_reasons(NS);
    assert!(reasons.contains("NodeDrained"), "{reasons}");
}

/// A hostile updater (`plugins/broken-updater`) that claims a field nobody
/// changed and reports progress running backwards cannot hold a machine:
/// its claim outside its declaration is ignored, and since only a rising
/// percent counts as progress, the machine is judged stalled after the
/// updater's deadline and remediated, although the updater answers "in
/// progress" ten times a second. The controllers run as the ServiceAccount
/// `capstan install` generates.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_updater_faking_progress_is_judged_stalled_and_remediated() {
    // The cloud's update takes two minutes; the updater reports 100 minus
    // its percent, so its figure only falls.
    let slow = Faults {
        boot_latency_ms: 200,
        delete_latency_ms: 200,
        update_latency_ms: 120_000,
        ..Default::default()
    };
    let deadline = 4;
    let env = env_with_deadline(slow, ("broken-updater", "broken_updater"), deadline).await;
    create(
        &env,
        &deployment(&env, "fake", 1, 0, 1, InPlaceFallback::None),
    )
    .await;
    env.wait_rolled_out(NS, "fake", LONG).await;
    create_check(&env, "fake").await;
    let name = env.machines(NS).await[0].name_any();
    patch_md(
        &env,
        "fake",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;

    let machines_api: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    let (m, c) = eventually("the faked update judged stalled", LONG, async || {
        judged_unhealthy(&machines_api, &name).await
    })
    .await;
    assert_eq!(c.reason, "InPlaceUpdateStalled", "{}", c.message);
    let step = first_step(&m).clone();
    assert_eq!(
        step.fields,
        ["version"],
        "failureDomain, claimed but neither declared nor changed, is ignored"
    );
    assert_eq!(
        step.state, "Updating",
        "the updater still says it is working"
    );
    let progress = step.last_progress_time.expect("progress time recorded");
    let waited = c.last_transition_time.0.as_second() - progress.0.as_second();
    assert!(
        waited >= i64::from(deadline) - 1,
        "judged {waited}s after the last rising percent; the deadline is {deadline}s"
    );
    assert!(
        step.percent.is_some_and(|p| p < 100),
        "the percent fell after its peak: {:?}",
        step.percent
    );
    eventually("the stalled machine remediated", LONG, async || {
        machines_api
            .get_opt(&name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}
