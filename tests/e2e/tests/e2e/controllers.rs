//! The controllers on a real kube-apiserver (+ controller-manager for
//! garbage collection) with the simulated cloud and the Wasm sim-provider:
//! scaling, rolling updates within their bounds, rollback, OnDelete, pause,
//! restarts mid-rollout, cloud faults, bad configs and unknown plugins, and
//! an idle resync that writes nothing.

use capstan_api::machine_conditions::{INSTANCE_PROVISIONED, READY};

use capstan_api::{Machine, MachineDeployment, MachineSet, StrategyType, is_true};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, eventually, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeSet;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(120);

fn faults(boot_ms: u64) -> Faults {
    Faults {
        boot_latency_ms: boot_ms,
        delete_latency_ms: 300,
        ..Default::default()
    }
}

fn fast_options() -> Options {
    crate::logs();
    Options {
        poll: Duration::from_millis(250),
        ..Options::default()
    }
}

async fn apply(env: &Env, md: &MachineDeployment) {
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

/// A template change was carried in place: still one MachineSet, and no
/// instance launched beyond the `launched` the pool started with.
async fn assert_changed_in_place(env: &Env, launched: u64) {
    let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(sets.items.len(), 1, "no new MachineSet");
    assert_eq!(
        env.cloud.stats().instances_launched,
        launched,
        "no new instance"
    );
}

fn provider_ids(machines: &[Machine]) -> BTreeSet<String> {
    machines
        .iter()
        .filter_map(|m| m.status.as_ref()?.provider_id.clone())
        .collect()
}

/// Every machine has an instance, every instance has a machine, and no
/// machine has two.
async fn assert_cloud_matches(env: &Env) {
    let machines = env.machines(NS).await;
    let ids = provider_ids(&machines);
    let instances: BTreeSet<String> = env
        .cloud
        .instances()
        .iter()
        .map(|i| format!("sim://{}", i.id))
        .collect();
    assert_eq!(
        ids.len(),
        machines.len(),
        "every machine has its own provider ID"
    );
    assert_eq!(ids, instances, "cloud instances equal machines");
}

/// Ready and not being deleted: what the rolling-update bounds count.
fn ready(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_none()
        && m.status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, READY))
}

fn versions(machines: &[Machine]) -> BTreeSet<String> {
    machines
        .iter()
        .filter_map(|m| m.spec.version.clone())
        .collect()
}

/// The API writes `controller` counted as `verb`, from the metrics text.
fn writes_of(metrics: &str, controller: &str, verb: &str) -> u64 {
    let sample =
        format!("capstan_api_writes_total{{controller=\"{controller}\",verb=\"{verb}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&sample)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_roll_back_and_delete_a_deployment() {
    let mut env = Env::start(faults(300)).await.expect("environment starts");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    let md = sample_deployment("web", SIM_PLUGIN, &env.cloud.url(), 3, "v1.30.0");
    apply(&env, &md).await;
    env.wait_rolled_out(NS, "web", LONG).await;
    assert_cloud_matches(&env).await;
    // On the way to Ready each machine wrote its Node once (the claim,
    // with Cluster API's annotations) and its spec.providerID once, and
    // did not adopt the instance it had just created (a pass on a cache
    // that had not shown its own writes once did all three).
    let metrics = env.metrics.encode();
    for verb in ["node_annotations", "patch"] {
        assert_eq!(
            writes_of(&metrics, "machine", verb),
            3,
            "machine {verb} writes for 3 machines:\n{metrics}"
        );
    }
    let reasons = env.event_reasons(NS);
    assert!(!reasons.contains("InstanceAdopted"), "{reasons}");
    // Each Ready machine is linked to the Node with its provider ID.
    for m in env.machines(NS).await {
        let status = m.status.unwrap();
        let node = status.node_ref.expect("nodeRef set");
        assert_eq!(
            node.name,
            capstan_e2e::sim_cloud::node_name(
                status.provider_id.unwrap().trim_start_matches("sim://")
            )
        );
        assert!(status.plugin_digest.unwrap().starts_with("sha256:"));
    }

    // kubectl scale goes through the scale subresource.
    env.control_plane
        .kubectl(&["scale", "md/web", "--replicas=5"], None)
        .expect("kubectl scale");
    env.wait_rolled_out(NS, "web", LONG).await;
    assert_eq!(env.machines(NS).await.len(), 5);
    assert_cloud_matches(&env).await;
    let table = env
        .control_plane
        .kubectl(&["get", "md,ms,ma"], None)
        .unwrap();
    assert!(
        table.contains("DESIRED") && table.contains("UP-TO-DATE") && table.contains("PHASE"),
        "{table}"
    );
    assert!(table.contains("Running"), "{table}");

    env.control_plane
        .kubectl(&["scale", "md/web", "--replicas=2"], None)
        .expect("kubectl scale down");
    env.wait_rolled_out(NS, "web", LONG).await;
    eventually("cloud shrinks to 2", LONG, async || {
        (env.cloud.instances().len() == 2).then_some(())
    })
    .await;
    assert_cloud_matches(&env).await;

    // Rolling update: observe every machine change and check the bounds
    // (maxSurge 1, maxUnavailable 0 with 2 replicas).
    let (observed, watch) = capstan_e2e::rollout_watch::watch(env.client.clone(), NS, ready);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_md(
        &env,
        "web",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    env.wait_rolled_out(NS, "web", LONG).await;
    eventually("old instances released", LONG, async || {
        (env.cloud.instances().len() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch.abort();
    {
        let o = observed.lock().unwrap();
        assert!(
            o.states > 10,
            "the watch saw the rollout ({} states)",
            o.states
        );
        assert!(
            o.max_total <= 3,
            "never more than replicas + maxSurge machines: saw {}",
            o.max_total
        );
        assert!(
            o.min_good >= 2,
            "never fewer than replicas - maxUnavailable Ready: saw {}",
            o.min_good
        );
    }
    let machines = env.machines(NS).await;
    assert_eq!(versions(&machines), BTreeSet::from(["v1.31.0".to_string()]));
    assert!(
        env.cloud
            .instances()
            .iter()
            .all(|i| i.version.as_deref() == Some("v1.31.0"))
    );
    assert_cloud_matches(&env).await;

    // History and rollback.
    let history = capstan_controllers::history::history(&env.client, NS, "web")
        .await
        .unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history[1].current && history[1].version.as_deref() == Some("v1.31.0"));
    let back = capstan_controllers::history::undo(&env.client, NS, "web", None)
        .await
        .unwrap();
    assert_eq!(back, Some(1));
    env.wait_rolled_out(NS, "web", LONG).await;
    assert_eq!(
        versions(&env.machines(NS).await),
        BTreeSet::from(["v1.30.0".to_string()])
    );
    let history = capstan_controllers::history::history(&env.client, NS, "web")
        .await
        .unwrap();
    assert_eq!(
        history.iter().find(|r| r.current).unwrap().revision,
        3,
        "{history:?}"
    );
    eventually("rolled-back cloud", LONG, async || {
        (env.cloud.instances().len() == 2).then_some(())
    })
    .await;

    // An idle resync writes nothing, and neither do the checks of
    // running instances (every 500 ms here).
    env.stop_controllers().await;
    env.start_controllers(
        Providers::default(),
        Options {
            resync: Duration::from_secs(1),
            instance_check: Duration::from_millis(500),
            ..fast_options()
        },
    )
    .await;
    eventually("controllers ready", LONG, async || {
        env.metrics.is_ready().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let gets = |metrics: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("capstan_plugin_call_duration_seconds_count{")
                    && l.contains("function=\"get\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = env.metrics.writes();
    let gets_before = gets(&env.metrics.encode());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = env.metrics.writes();
    let checks = gets(&env.metrics.encode()) - gets_before;
    assert!(
        checks >= 10,
        "2 running instances checked every 500 ms: {checks} gets in 5 s"
    );
    assert_eq!(
        after - before,
        0,
        "an idle resync made API writes:\n{}",
        env.metrics.encode()
    );
    let metrics = env.metrics.encode();
    assert!(metrics.contains("capstan_reconcile_duration_seconds_count{controller=\"machine\"}"));
    assert!(
        metrics.contains("function=\"get\",result=\"ok\""),
        "{metrics}"
    );

    // Deleting the deployment releases every instance.
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("every machine gone", LONG, async || {
        env.machines(NS).await.is_empty().then_some(())
    })
    .await;
    eventually("every instance released", LONG, async || {
        env.cloud.instances().is_empty().then_some(())
    })
    .await;
    let sets: Api<MachineSet> = Api::namespaced(env.client.clone(), NS);
    eventually("every set gone", LONG, async || {
        sets.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    env.stop_controllers().await;
}

fn ready_machines(machines: &[Machine]) -> usize {
    machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, READY))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn on_delete_and_pause_only_move_when_told() {
    let mut env = Env::start(faults(200)).await.expect("environment starts");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    let mut md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    md.spec.rollout_strategy_mut().type_ = StrategyType::OnDelete;
    apply(&env, &md).await;
    env.wait_rolled_out(NS, "pool", LONG).await;
    let before: BTreeSet<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();

    // OnDelete: a template change replaces nothing by itself...
    patch_md(
        &env,
        "pool",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let machines = env.machines(NS).await;
    let names: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
    assert_eq!(
        names, before,
        "OnDelete must not replace machines on its own"
    );
    assert_eq!(versions(&machines), BTreeSet::from(["v1.30.0".to_string()]));
    // Each says it is not up to date (Cluster API's UpToDate), so a
    // dashboard shows what is left to replace.
    env.eventually("the old machines say NotUpToDate", LONG, async || {
        let machines = env.machines(NS).await;
        machines
            .iter()
            .all(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| capstan_api::condition(&s.conditions, "UpToDate"))
                    .is_some_and(|c| c.status == "False" && c.reason == "NotUpToDate")
            })
            .then_some(())
    })
    .await;

    // ...but a machine a user deletes comes back with the new template.
    let victim = before.iter().next().unwrap().clone();
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    env.eventually(
        "the deleted machine is replaced by a new-version one",
        LONG,
        async || {
            let machines = env.machines(NS).await;
            (machines.len() == 2
                && ready_machines(&machines) == 2
                && versions(&machines)
                    == BTreeSet::from(["v1.30.0".to_string(), "v1.31.0".to_string()]))
            .then_some(())
        },
    )
    .await;
    eventually("the cloud follows", LONG, async || {
        (env.cloud.instances().len() == 2).then_some(())
    })
    .await;
    assert_cloud_matches(&env).await;

    // Paused: switch to RollingUpdate and change the version; nothing rolls.
    patch_md(
        &env,
        "pool",
        serde_json::json!({"spec": {"paused": true, "rollout": {"strategy": {"type": "RollingUpdate"}},
            "template": {"spec": {"version": "v1.32.0"}}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let machines = env.machines(NS).await;
    assert!(
        !versions(&machines).contains("v1.32.0"),
        "a paused deployment rolled out"
    );
    let md = env.deployment(NS, "pool").await;
    let status = md.status.unwrap();
    assert_eq!(status.phase, Some(capstan_api::DeploymentPhase::Paused));
    let progressing = capstan_api::condition(&status.conditions, "Progressing").unwrap();
    assert_eq!(progressing.reason, "DeploymentPaused");

    // Scaling still applies while paused.
    patch_md(&env, "pool", serde_json::json!({"spec": {"replicas": 3}})).await;
    eventually("scaled to 3 while paused", LONG, async || {
        let machines = env.machines(NS).await;
        (machines.len() == 3 && ready_machines(&machines) == 3).then_some(())
    })
    .await;
    assert!(!versions(&env.machines(NS).await).contains("v1.32.0"));

    // Resume: everything moves to the newest template.
    patch_md(&env, "pool", serde_json::json!({"spec": {"paused": false}})).await;
    env.wait_rolled_out(NS, "pool", LONG).await;
    assert_eq!(
        versions(&env.machines(NS).await),
        BTreeSet::from(["v1.32.0".to_string()])
    );
    eventually("the cloud follows", LONG, async || {
        (env.cloud.instances().len() == 3).then_some(())
    })
    .await;
    assert_cloud_matches(&env).await;
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restarts_and_cloud_faults_lose_nothing_and_duplicate_nothing() {
    let mut env = Env::start(Faults {
        boot_latency_ms: 500,
        delete_latency_ms: 300,
        error_rate: 0.2,
        throttle_rps: Some(10),
        ..Default::default()
    })
    .await
    .expect("environment starts");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    let md = sample_deployment("batch", SIM_PLUGIN, &env.cloud.url(), 4, "v1.30.0");
    apply(&env, &md).await;
    env.wait_rolled_out(NS, "batch", LONG).await;
    eventually("4 instances", LONG, async || {
        (env.cloud.instances().len() == 4).then_some(())
    })
    .await;
    assert_cloud_matches(&env).await;

    // Kill the controllers as soon as the rollout has started creating.
    patch_md(
        &env,
        "batch",
        serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    eventually("the rollout started", LONG, async || {
        versions(&env.machines(NS).await)
            .contains("v1.31.0")
            .then_some(())
    })
    .await;
    env.kill_controllers().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.start_controllers(Providers::default(), fast_options())
        .await;
    env.wait_rolled_out(NS, "batch", LONG).await;
    eventually("old instances released", LONG, async || {
        (env.cloud.instances().len() == 4).then_some(())
    })
    .await;
    assert_cloud_matches(&env).await;
    assert_eq!(
        versions(&env.machines(NS).await),
        BTreeSet::from(["v1.31.0".to_string()])
    );

    let stats = env.cloud.stats();
    assert!(
        stats.injected_errors > 0 && stats.throttled > 0,
        "the faults were exercised: {stats:?}"
    );
    // 4 original machines + 4 replacements, each exactly one instance.
    assert_eq!(stats.instances_launched, 8, "{stats:?}");
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_configs_and_unknown_plugins_surface_as_conditions() {
    let mut env = Env::start(faults(200)).await.expect("environment starts");
    env.start_controllers(Providers::default(), fast_options())
        .await;

    // A config the plugin rejects: terminal, one Event, no retry loop.
    let mut bad = sample_deployment("bad", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    bad.spec.template.spec.provider.config["instanceType"] = "huge".into();
    apply(&env, &bad).await;
    let failed = eventually(
        "the machine fails with InvalidConfiguration",
        LONG,
        async || {
            env.machines(NS).await.into_iter().find(|m| {
                m.status.as_ref().and_then(|s| s.failure_reason.as_deref())
                    == Some("InvalidConfiguration")
            })
        },
    )
    .await;
    let status = failed.status.unwrap();
    assert!(
        status.failure_message.as_deref().unwrap().contains("huge"),
        "{status:?}"
    );
    let config_valid = capstan_api::condition(&status.conditions, "ConfigValid").unwrap();
    assert_eq!(config_valid.status, "False");
    eventually("the deployment reports Failed", LONG, async || {
        let md = env.deployment(NS, "bad").await;
        (md.status.and_then(|s| s.phase) == Some(capstan_api::DeploymentPhase::Failed))
            .then_some(())
    })
    .await;
    let events = env
        .control_plane
        .kubectl(&["get", "events", "-n", NS, "-o", "json"], None)
        .unwrap();
    assert!(
        events.contains("InvalidConfiguration"),
        "an Event was recorded"
    );
    let calls = |m: &capstan_controllers::Metrics| {
        m.encode()
            .lines()
            .find(|l| {
                l.starts_with("capstan_plugin_call_duration_seconds_count")
                    && l.contains("result=\"invalid_config\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    let first = calls(&env.metrics);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        calls(&env.metrics),
        first,
        "a terminal failure is not retried until the spec changes"
    );
    // Fixing the spec recovers.
    patch_md(&env, "bad", serde_json::json!({"spec": {"template": {"spec": {"provider": {"config": {"instanceType": "small"}}}}}})).await;
    env.wait_rolled_out(NS, "bad", LONG).await;

    // A plugin nobody installed: a clear condition, then recovery once it exists.
    let ghost = sample_deployment("ghost", "nope", &env.cloud.url(), 1, "v1.30.0");
    apply(&env, &ghost).await;
    let waiting = eventually("the machine says the plugin is missing", LONG, async || {
        env.machines(NS).await.into_iter().find(|m| {
            m.spec.provider.plugin == "nope"
                && m.status.as_ref().is_some_and(|s| {
                    capstan_api::condition(&s.conditions, INSTANCE_PROVISIONED)
                        .is_some_and(|c| c.reason == "PluginNotReady")
                })
        })
    })
    .await;
    let condition = capstan_api::condition(
        &waiting.status.as_ref().unwrap().conditions,
        INSTANCE_PROVISIONED,
    )
    .unwrap()
    .clone();
    assert!(
        condition.message.contains("plugin \"nope\" does not exist"),
        "{condition:?}"
    );

    // A plugin whose source cannot be read says so in its own status (in
    // the directory the test host trusts unsigned; elsewhere it would be
    // refused before it is read).
    let missing = capstan_e2e::plugin_dir().join("nonexistent-plugin.wasm");
    env.create_plugin("broken", &missing).await.unwrap();
    let plugins: Api<capstan_api::Plugin> = Api::all(env.client.clone());
    let broken = eventually("the broken plugin reports why", LONG, async || {
        let p = plugins.get("broken").await.ok()?;
        let c = capstan_api::condition(&p.status?.conditions, "Ready")?.clone();
        (c.status == "False").then_some(c)
    })
    .await;
    assert_eq!(broken.reason, "SourceUnreadable");
    assert!(
        broken.message.contains("nonexistent-plugin.wasm"),
        "{broken:?}"
    );

    env.create_plugin("nope", &capstan_e2e::plugin("sim_provider"))
        .await
        .unwrap();
    env.wait_rolled_out(NS, "ghost", LONG).await;

    // A MachineSet adopts a matching orphan instead of creating another.
    let template = sample_deployment("solo", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0").spec;
    let orphan = Machine {
        metadata: kube::api::ObjectMeta {
            name: Some("orphan".into()),
            namespace: Some(NS.into()),
            labels: Some(template.template.metadata.labels.clone()),
            ..Default::default()
        },
        spec: template.template.spec.clone(),
        status: None,
    };
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let set = MachineSet::new(
        "solo",
        capstan_api::MachineSetSpec {
            replicas: 2,
            selector: template.selector.clone(),
            template: template.template.clone(),
            deletion: Some(capstan_api::DeletionOrder {
                order: capstan_api::DeletePolicy::Oldest,
            }),
            delete_policy: None,
            min_ready_seconds: 0,
            in_place: None,
            cluster_name: None,
        },
    );
    Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    env.eventually(
        "the set adopts the orphan and adds one machine",
        LONG,
        async || {
            let solo: Vec<Machine> = env
                .machines(NS)
                .await
                .into_iter()
                .filter(|m| m.labels().get("capstan.dev/pool").map(String::as_str) == Some("solo"))
                .collect();
            let adopted = solo.iter().any(|m| {
                m.name_any() == "orphan"
                    && m.owner_references()
                        .iter()
                        .any(|o| o.kind == "MachineSet" && o.name == "solo")
            });
            (adopted && solo.len() == 2 && ready_machines(&solo) == 2).then_some(())
        },
    )
    .await;
    env.stop_controllers().await;
}

/// Editing a provisioned Machine's provider does not leak its instance:
/// the change is held with a condition (no call through the new Plugin),
/// and deleting the Machine releases the instance through the Plugin that
/// created it.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_keeps_its_instance_when_its_provider_is_edited() {
    let mut env = Env::start(faults(200)).await.expect("environment starts");
    // A Plugin that never serves: the old code would have waited on it for
    // ever, both to read the instance and to release it.
    env.create_plugin("other-sim", std::path::Path::new("/nonexistent/other.wasm"))
        .await
        .unwrap();
    env.start_controllers(Providers::default(), fast_options())
        .await;
    let md = sample_deployment("one", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    let mut machine = Machine::new("keeper", md.spec.template.spec.clone());
    machine.metadata.namespace = Some(NS.into());
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let provisioned = eventually("the instance created", LONG, async || {
        let m = machines.get("keeper").await.ok()?;
        let s = m.status.clone()?;
        (s.provider_id.is_some() && s.provider_plugin.as_deref() == Some(SIM_PLUGIN)).then_some(m)
    })
    .await;
    let provider_id = provisioned.status.unwrap().provider_id.unwrap();

    machines
        .patch(
            "keeper",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"provider": {"plugin": "other-sim"}}})),
        )
        .await
        .unwrap();
    let message = eventually("the change held", LONG, async || {
        let s = machines.get("keeper").await.ok()?.status?;
        let c = capstan_api::condition(&s.conditions, "ConfigValid")?.clone();
        (c.reason == "ProviderChanged").then_some(c.message)
    })
    .await;
    assert!(
        message.starts_with(&format!(
            "spec.provider.plugin changed from \"{SIM_PLUGIN}\" to \"other-sim\" after instance {provider_id} was created"
        )),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        env.cloud.stats().instances_launched,
        1,
        "no second instance"
    );

    machines
        .delete("keeper", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Machine gone", LONG, async || {
        machines
            .get_opt("keeper")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // Released through the Plugin that created it.
    eventually("the instance released", LONG, async || {
        (env.cloud.stats().live_instances == 0).then_some(())
    })
    .await;
}

fn md_condition(md: &MachineDeployment, type_: &str) -> Option<(String, String, String)> {
    let c = capstan_api::condition(&md.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn long_names_are_refused_orphaned_sets_adopted_and_a_name_clash_reported() {
    let mut env = Env::start(faults(100)).await.expect("env");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    let sets: Api<MachineSet> = Api::namespaced(env.client.clone(), NS);

    // A name its MachineSets' label values could not hold.
    let long = "a".repeat(capstan_api::MAX_DEPLOYMENT_NAME + 1);
    apply(
        &env,
        &sample_deployment(&long, SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0"),
    )
    .await;
    let (_, _, message) = eventually("the long name refused", LONG, async || {
        let c = md_condition(&mds.get(&long).await.ok()?, "ValidSpec")?;
        (c.0 == "False" && c.1 == "NameTooLong").then_some(c)
    })
    .await;
    assert!(
        message.contains("is 53 characters") && message.contains("at most 52"),
        "{message}"
    );

    // Orphaned sets are adopted: the deployment deleted with its sets left
    // behind, then made again, takes them back, machines and all.
    apply(
        &env,
        &sample_deployment("keep", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0"),
    )
    .await;
    env.wait_rolled_out(NS, "keep", LONG).await;
    let machines_before: BTreeSet<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let set_before = sets.list(&Default::default()).await.unwrap().items;
    let set_before = set_before
        .iter()
        .find(|s| s.name_any().starts_with("keep-"))
        .unwrap();
    mds.delete(
        "keep",
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Orphaning is kube-controller-manager's garbage collector's work; it
    // sees a CRD's objects only after its periodic discovery resync, which
    // stretches when many control planes start at once on shared cores.
    eventually("the set orphaned", LONG * 2, async || {
        let set = sets.get(&set_before.name_any()).await.ok()?;
        (mds.get_opt("keep").await.ok()?.is_none() && set.owner_references().is_empty())
            .then_some(())
    })
    .await;
    apply(
        &env,
        &sample_deployment("keep", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0"),
    )
    .await;
    let new_uid = mds.get("keep").await.unwrap().uid().unwrap();
    eventually("the orphan adopted", LONG, async || {
        let set = sets.get(&set_before.name_any()).await.ok()?;
        set.owner_references()
            .iter()
            .any(|o| o.uid == new_uid && o.controller == Some(true))
            .then_some(())
    })
    .await;
    env.wait_rolled_out(NS, "keep", LONG).await;
    let sets_now = sets.list(&Default::default()).await.unwrap().items;
    assert_eq!(
        sets_now
            .iter()
            .filter(|s| s.name_any().starts_with("keep-"))
            .count(),
        1,
        "no second set"
    );
    let machines_after: BTreeSet<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    assert_eq!(machines_before, machines_after, "the same machines");

    // A set of the name the deployment would create, not made from its
    // template: reported, not taken for the deployment's own.
    let mut clash = sample_deployment("clash", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    clash.spec.paused = true;
    apply(&env, &clash).await;
    let stored = mds.get("clash").await.unwrap();
    let hash = capstan_controllers::deployment::template_hash(&stored.spec.template);
    let squatter: MachineSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineSet",
        "metadata": { "name": format!("clash-{hash}"), "namespace": NS },
        "spec": {
            "replicas": 0,
            "selector": { "matchLabels": { "team": "other" } },
            "template": {
                "metadata": { "labels": { "team": "other" } },
                "spec": stored.spec.template.spec,
            },
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &squatter)
        .await
        .unwrap();
    mds.patch(
        "clash",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": { "paused": false } })),
    )
    .await
    .unwrap();
    let (_, _, message) = eventually("the clash reported", LONG, async || {
        let c = md_condition(&mds.get("clash").await.ok()?, "Progressing")?;
        (c.0 == "False" && c.1 == "MachineSetConflict").then_some(c)
    })
    .await;
    assert!(
        message.contains(&format!("cannot create MachineSet clash-{hash}"))
            && message.contains("already exists and was made from another template"),
        "{message}"
    );
}

/// An environment with the hostile test plugin as Plugin `hostile`, its
/// controllers running.
async fn hostile_env() -> Env {
    let mut env = Env::start(faults(100)).await.expect("env");
    env.create_plugin("hostile", &capstan_e2e::plugin("hostile_plugin"))
        .await
        .unwrap();
    env.start_controllers(Providers::default(), fast_options())
        .await;
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_text_in_conditions_status_and_events_is_bounded() {
    let env = hostile_env().await;
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    for (name, attack) in [("chatty", "long-message"), ("loud", "long-error")] {
        let machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "capstan.dev/v1alpha1",
            "kind": "Machine",
            "metadata": { "name": name, "namespace": NS },
            "spec": { "provider": { "plugin": "hostile", "config": { "attack": attack } } },
        }))
        .unwrap();
        machines
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
    }
    // 200 KiB of plugin text each; 1 KiB reaches the object, saying so.
    let limit = capstan_api::MAX_PLUGIN_TEXT;
    let shown = eventually("the long status message bounded", LONG, async || {
        let m = machines.get("chatty").await.ok()?;
        let c = capstan_api::condition(&m.status?.conditions, INSTANCE_PROVISIONED)?.clone();
        c.message.starts_with("mmm").then_some(c.message)
    })
    .await;
    assert!(
        shown.len() <= limit && shown.ends_with("(truncated)"),
        "{} bytes",
        shown.len()
    );
    let failure = eventually("the long error bounded", LONG, async || {
        machines.get("loud").await.ok()?.status?.failure_message
    })
    .await;
    assert!(
        failure.len() <= limit && failure.ends_with("(truncated)"),
        "{} bytes",
        failure.len()
    );
    let events = env
        .control_plane
        .kubectl(&["get", "events", "-n", NS, "-o", "json"], None)
        .unwrap();
    let events: serde_json::Value = serde_json::from_str(&events).unwrap();
    let longest = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["message"]
                .as_str()
                .or(e["note"].as_str())
                .unwrap_or("")
                .len()
        })
        .max()
        .unwrap_or(0);
    assert!(
        longest > 0 && longest <= 2 * limit,
        "an Event of {longest} bytes"
    );
}

/// A plugin's capacity is a claim: the host writes the autoscaler's
/// annotations from a modest answer, and nothing of an absurd one (4
/// million cores, a GPU type carrying a line break).
#[tokio::test(flavor = "multi_thread")]
async fn an_absurd_capacity_never_reaches_the_autoscalers_annotations() {
    let env = hostile_env().await;
    let sets: Api<MachineSet> = Api::namespaced(env.client.clone(), NS);
    for (name, attack) in [("modest", "none"), ("absurd", "absurd-capacity")] {
        let set: MachineSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "capstan.dev/v1alpha1",
            "kind": "MachineSet",
            "metadata": { "name": name, "namespace": NS },
            "spec": {
                "replicas": 0,
                "selector": { "matchLabels": { "set": name } },
                "template": {
                    "metadata": { "labels": { "set": name } },
                    "spec": { "provider": { "plugin": "hostile", "config": { "attack": attack } } },
                },
            },
        }))
        .unwrap();
        sets.create(&PostParams::default(), &set).await.unwrap();
    }
    let key = |k: &str| format!("capacity.cluster-autoscaler.kubernetes.io/{k}");
    let modest = eventually("the modest capacity written", LONG, async || {
        let a = sets.get("modest").await.ok()?.metadata.annotations?;
        Some((a.get(&key("cpu"))?.clone(), a.get(&key("memory"))?.clone()))
    })
    .await;
    assert_eq!(modest, ("1".to_string(), "512Mi".to_string()));
    // The plugin is loaded now: a pass of the absurd set from here on
    // (its generation 2 observed) has asked it too.
    let bump = serde_json::json!({"spec": {"minReadySeconds": 1}});
    sets.patch("absurd", &PatchParams::default(), &Patch::Merge(&bump))
        .await
        .unwrap();
    let absurd = eventually("the absurd set's next pass", LONG, async || {
        let set = sets.get("absurd").await.ok()?;
        (set.status.as_ref()?.observed_generation == Some(2)).then_some(set)
    })
    .await;
    let written: Vec<&String> = absurd
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("capacity.") || k.starts_with("capstan.dev/capacity"))
        .collect();
    assert!(written.is_empty(), "{written:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_down_takes_the_machine_annotated_delete_machine_first() {
    let mut env = Env::start(faults(100)).await.expect("env");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    apply(
        &env,
        &sample_deployment("pick", SIM_PLUGIN, &env.cloud.url(), 3, "v1.30.0"),
    )
    .await;
    env.wait_rolled_out(NS, "pick", LONG).await;
    let machines = env.machines(NS).await;
    // The machine the delete policy would keep longest goes, annotated.
    let views: Vec<capstan_planner::machineset::MachineView> = machines
        .iter()
        .map(|m| capstan_planner::machineset::MachineView {
            name: m.name_any(),
            created: m.creation_timestamp().map_or(0, |c| c.0.as_second()),
            health: capstan_planner::Health::Available,
            deleting: false,
            updating: false,
            delete_first: false,
            unhealthy: false,
        })
        .collect();
    let refs: Vec<&capstan_planner::machineset::MachineView> = views.iter().collect();
    let order = capstan_planner::machineset::delete_order(
        &refs,
        capstan_planner::machineset::DeletePolicy::Random,
    );
    let chosen = order.last().unwrap().name.clone();
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .patch(
            &chosen,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                capstan_api::ANNOTATION_DELETE_MACHINE: "yes"}}})),
        )
        .await
        .unwrap();
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "pick",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    eventually("scaled to 2", LONG, async || {
        let left = env.machines(NS).await;
        (left.len() == 2).then_some(())
    })
    .await;
    let left: BTreeSet<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    assert!(
        !left.contains(&chosen),
        "{chosen} should have gone first: {left:?}"
    );
}

/// Cluster API's in-place metadata propagation: a label and an annotation
/// added to a deployment's template reach its machines without a new
/// MachineSet or a new instance; a managed label (`node.cluster.x-k8s.io/…`)
/// reaches their Nodes too; removing them from the template removes them
/// again, and labels others put on the machines stay.
#[tokio::test(flavor = "multi_thread")]
async fn template_labels_reach_machines_and_nodes_in_place() {
    let mut env = Env::start(faults(100)).await.expect("env");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    apply(
        &env,
        &sample_deployment("meta", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0"),
    )
    .await;
    env.wait_rolled_out(NS, "meta", LONG).await;
    let before = env.machines(NS).await;
    let names = |ms: &[Machine]| ms.iter().map(|m| m.name_any()).collect::<BTreeSet<_>>();
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    // Someone else's label on a machine: never the template's to remove.
    machines
        .patch(
            &before[0].name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"owner": "ops"}}})),
        )
        .await
        .unwrap();
    let pool = "node.cluster.x-k8s.io/pool";
    let role = "node-role.kubernetes.io/control-plane";
    // The admin lets this provider's machines carry `pool` to their Nodes,
    // and nothing else.
    Api::<capstan_api::Plugin>::all(env.client.clone())
        .patch(
            SIM_PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"grants": {"nodeLabels": [pool]}}})),
        )
        .await
        .unwrap();
    patch_md(
        &env,
        "meta",
        serde_json::json!({"spec": {"template": {"metadata": {
            "labels": { "team": "blue", pool: "gpu", role: "true" },
            "annotations": { "example.com/note": "hello" },
        }}}}),
    )
    .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let node_label_of = async |m: &Machine, key: &str| {
        let node = capstan_e2e::env::node_of(m);
        nodes
            .get(&node)
            .await
            .ok()
            .and_then(|n| n.labels().get(key).cloned())
    };
    let node_label = async |m: &Machine| node_label_of(m, pool).await;
    eventually("the labels reach machines and Nodes", LONG, async || {
        let ms = env.machines(NS).await;
        for m in &ms {
            let labelled = m.labels().get("team").map(String::as_str) == Some("blue")
                && m.annotations().get("example.com/note").map(String::as_str) == Some("hello");
            if !labelled || node_label(m).await.as_deref() != Some("gpu") {
                return None;
            }
        }
        Some(())
    })
    .await;
    let after = env.machines(NS).await;
    assert_eq!(names(&after), names(&before), "the same machines");
    for m in &after {
        assert_eq!(
            node_label_of(m, role).await,
            None,
            "a label not granted never reaches the Node"
        );
    }
    assert_changed_in_place(&env, 2).await;

    // Removed from the template: removed from machines and Nodes; the
    // label someone else put there stays.
    patch_md(
        &env,
        "meta",
        serde_json::json!({"spec": {"template": {"metadata": {
            "labels": { "team": null, pool: null, role: null },
            "annotations": { "example.com/note": null },
        }}}}),
    )
    .await;
    eventually("the labels leave machines and Nodes", LONG, async || {
        let ms = env.machines(NS).await;
        for m in &ms {
            let gone = !m.labels().contains_key("team")
                && !m.annotations().contains_key("example.com/note");
            if !gone || node_label(m).await.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    let kept = machines.get(&before[0].name_any()).await.unwrap();
    assert_eq!(
        kept.labels().get("owner").map(String::as_str),
        Some("ops"),
        "a label the template never had stays"
    );
    assert_eq!(env.cloud.stats().instances_launched, 2);
}

/// Cluster API's `spec.rollout.after`: once it passes, every machine made
/// before it is replaced though the template did not change; setting the
/// same time again changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn rollout_after_replaces_machines_made_before_it() {
    let mut env = Env::start(faults(100)).await.expect("env");
    env.start_controllers(Providers::default(), fast_options())
        .await;
    apply(
        &env,
        &sample_deployment("recycle", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0"),
    )
    .await;
    env.wait_rolled_out(NS, "recycle", LONG).await;
    let before = env.machines(NS).await;
    let names = |ms: &[Machine]| ms.iter().map(|m| m.name_any()).collect::<BTreeSet<_>>();
    // Two seconds ahead: the rollout waits for it, then starts by itself.
    let after =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(2);
    let after = after.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    patch_md(
        &env,
        "recycle",
        serde_json::json!({"spec": {"rollout": {"after": after}}}),
    )
    .await;
    eventually("a new MachineSet after rollout.after", LONG, async || {
        let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS)
            .list(&Default::default())
            .await
            .ok()?;
        (sets.items.len() == 2).then_some(())
    })
    .await;
    eventually("every machine replaced", LONG, async || {
        let now = env.machines(NS).await;
        let ready = now.iter().filter(|m| {
            m.status
                .as_ref()
                .and_then(|s| capstan_api::condition(&s.conditions, READY))
                .is_some_and(|c| c.status == "True")
        });
        (now.len() == 2 && ready.count() == 2 && names(&now).is_disjoint(&names(&before)))
            .then_some(())
    })
    .await;
    env.wait_rolled_out(NS, "recycle", LONG).await;
    assert_eq!(env.cloud.stats().instances_launched, 4);
    // The same time again (it has passed; every machine is newer): nothing.
    let settled = names(&env.machines(NS).await);
    patch_md(
        &env,
        "recycle",
        serde_json::json!({"spec": {"rollout": {"after": after}, "minReadySeconds": 0}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(names(&env.machines(NS).await), settled);
    assert_eq!(env.cloud.stats().instances_launched, 4);
}

/// Cluster API's `spec.taints`: `Always` taints reach the machines and
/// their Nodes in place (no new MachineSet, no new instance) and leave
/// when removed; `OnInitialization` taints are set once; others' taints on
/// the Node are never touched; a reserved key is refused.
#[tokio::test(flavor = "multi_thread")]
async fn template_taints_reach_nodes_in_place_and_leave_others_alone() {
    let mut env = Env::start(faults(100)).await.expect("env");
    // Node taints are written within the generated ServiceAccount's rights.
    let config = capstan_e2e::install::controller_config(&env).await;
    env.start_controllers_as(config, Providers::default(), fast_options())
        .await;
    let mut md = sample_deployment("tainted", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    md.spec.template.spec.taints =
        vec![serde_json::from_value(serde_json::json!({
        "key": "example.com/driver", "effect": "NoSchedule", "propagation": "OnInitialization",
    }))
    .unwrap()];
    apply(&env, &md).await;
    env.wait_rolled_out(NS, "tainted", LONG).await;
    let before = env.machines(NS).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let taints_of = async |m: &Machine| -> Vec<(String, String)> {
        let node = nodes.get(&capstan_e2e::env::node_of(m)).await.unwrap();
        node.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
            .map(|t| (t.key, t.value.unwrap_or_default()))
            .collect()
    };
    let driver = ("example.com/driver".to_string(), String::new());
    let set_node_taints = async |m: &Machine, taints: serde_json::Value| {
        nodes
            .patch(
                &capstan_e2e::env::node_of(m),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"taints": taints}})),
            )
            .await
            .unwrap();
    };
    eventually("the initial taint on every Node", LONG, async || {
        for m in &env.machines(NS).await {
            if !taints_of(m).await.contains(&driver) {
                return None;
            }
        }
        Some(())
    })
    .await;
    // The driver is installed on the first Node: its taint removed there,
    // and an admin's own taint added instead.
    set_node_taints(
        &before[0],
        serde_json::json!([{"key": "maintenance", "effect": "NoSchedule"}]),
    )
    .await;

    patch_md(
        &env,
        "tainted",
        serde_json::json!({"spec": {"template": {"spec": {"taints": [
            {"key": "example.com/driver", "effect": "NoSchedule", "propagation": "OnInitialization"},
            {"key": "example.com/gpu", "value": "a100", "effect": "NoSchedule", "propagation": "Always"},
        ]}}}}),
    )
    .await;
    let gpu = ("example.com/gpu".to_string(), "a100".to_string());
    eventually("the Always taint reaches every Node", LONG, async || {
        for m in &env.machines(NS).await {
            if m.spec.taints.len() != 2 || !taints_of(m).await.contains(&gpu) {
                return None;
            }
        }
        Some(())
    })
    .await;
    let first = taints_of(&before[0]).await;
    assert!(
        first.contains(&("maintenance".into(), String::new())),
        "{first:?}"
    );
    assert!(
        !first.contains(&driver),
        "an OnInitialization taint is not set again: {first:?}"
    );
    assert!(taints_of(&before[1]).await.contains(&driver));
    let names = |ms: &[Machine]| ms.iter().map(|m| m.name_any()).collect::<BTreeSet<_>>();
    assert_eq!(
        names(&env.machines(NS).await),
        names(&before),
        "the same machines"
    );
    assert_changed_in_place(&env, 2).await;

    // Someone removes the Always taint from a Node: it comes back. A new
    // value replaces the old; then it leaves the template: it leaves the
    // Nodes; the others stay.
    set_node_taints(
        &before[0],
        serde_json::json!([{"key": "maintenance", "effect": "NoSchedule"}]),
    )
    .await;
    eventually("the Always taint back on the Node", LONG, async || {
        taints_of(&before[0]).await.contains(&gpu).then_some(())
    })
    .await;
    patch_md(
        &env,
        "tainted",
        serde_json::json!({"spec": {"template": {"spec": {"taints": [
            {"key": "example.com/gpu", "value": "h100", "effect": "NoSchedule", "propagation": "Always"},
        ]}}}}),
    )
    .await;
    let h100 = ("example.com/gpu".to_string(), "h100".to_string());
    eventually("the taint back with its new value", LONG, async || {
        taints_of(&before[0]).await.contains(&h100).then_some(())
    })
    .await;
    patch_md(
        &env,
        "tainted",
        serde_json::json!({"spec": {"template": {"spec": {"taints": null}}}}),
    )
    .await;
    eventually("the Always taint leaves the Nodes", LONG, async || {
        for m in &env.machines(NS).await {
            if taints_of(m).await.iter().any(|t| t.0 == "example.com/gpu") {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(
        taints_of(&before[0]).await,
        [("maintenance".to_string(), String::new())]
    );
    assert_eq!(
        taints_of(&before[1]).await,
        [driver],
        "the OnInitialization taint is no longer the host's to remove"
    );

    // A key Kubernetes manages is refused, saying which.
    patch_md(
        &env,
        "tainted",
        serde_json::json!({"spec": {"template": {"spec": {"taints": [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "propagation": "Always"},
        ]}}}}),
    )
    .await;
    let message = eventually("the deployment refuses the taint", LONG, async || {
        let md = env.deployment(NS, "tainted").await;
        let c = capstan_api::condition(&md.status.as_ref()?.conditions, "ValidSpec")?;
        (c.status == "False").then(|| c.message.clone())
    })
    .await;
    assert!(
        message.contains("spec.template.spec.taints[0]") && message.contains("node.kubernetes.io/"),
        "{message}"
    );
}

/// Cluster API's `spec.readinessGates` and machine-level
/// `spec.minReadySeconds`, changed on a running deployment: they reach its
/// machines in place (no new set, no new instance); a machine is Ready only
/// once another controller reports the gate's condition, which Capstan's own
/// status writes keep; `Available` follows the machine's own
/// `minReadySeconds`; the deployment counts accordingly. The controller
/// runs as the ServiceAccount `capstan install` generates.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_gates_and_min_ready_seconds_reach_machines_in_place() {
    use capstan_api::machine_conditions::AVAILABLE;
    let mut env = Env::start(faults(100)).await.expect("env");
    let config = capstan_e2e::install::controller_config(&env).await;
    env.start_controllers_as(config, Providers::default(), fast_options())
        .await;
    apply(
        &env,
        &sample_deployment("gated", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0"),
    )
    .await;
    env.wait_rolled_out(NS, "gated", LONG).await;
    let before = env.machines(NS).await;
    let gate = "example.com/DriversInstalled";
    patch_md(
        &env,
        "gated",
        serde_json::json!({"spec": {"template": {"spec": {
            "readinessGates": [{"conditionType": gate}],
            "minReadySeconds": 3,
        }}}}),
    )
    .await;
    let condition_of = |m: &Machine, kind: &str| {
        m.status
            .as_ref()
            .and_then(|s| capstan_api::condition(&s.conditions, kind))
            .cloned()
    };
    eventually("the gate holds every machine's Ready", LONG, async || {
        let ms = env.machines(NS).await;
        ms.iter()
            .all(|m| {
                m.spec.min_ready_seconds == Some(3)
                    && condition_of(m, READY)
                        .is_some_and(|c| c.status == "Unknown" && c.message.contains(gate))
            })
            .then_some(())
    })
    .await;
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    eventually("the deployment counts no Ready machine", LONG, async || {
        let md = mds.get("gated").await.ok()?;
        (md.status?.ready_replicas == 0).then_some(())
    })
    .await;
    assert_changed_in_place(&env, 2).await;

    // A driver installer reports on the first machine, as its own field
    // manager on the status subresource.
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    let installed = serde_json::json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": before[0].name_any()},
        "status": {"conditions": [{
            "type": gate, "status": "True", "reason": "Installed", "message": "drivers 1.2",
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }]},
    });
    machines
        .patch_status(
            &before[0].name_any(),
            &PatchParams::apply("driver-installer").force(),
            &Patch::Apply(&installed),
        )
        .await
        .expect("the installer reports its condition");
    let first = eventually("the first machine Available", LONG, async || {
        let m = machines.get(&before[0].name_any()).await.ok()?;
        condition_of(&m, AVAILABLE)
            .is_some_and(|c| c.status == "True")
            .then_some(m)
    })
    .await;
    let ready = condition_of(&first, READY).unwrap();
    let available = condition_of(&first, AVAILABLE).unwrap();
    let waited =
        available.last_transition_time.0.as_second() - ready.last_transition_time.0.as_second();
    assert!(
        waited >= 3,
        "Available {waited} s after Ready; the machine's minReadySeconds is 3"
    );
    assert_eq!(
        condition_of(&first, gate).map(|c| c.reason),
        Some("Installed".into()),
        "Capstan's status writes keep the other controller's condition"
    );
    let second = machines.get(&before[1].name_any()).await.unwrap();
    assert_eq!(
        condition_of(&second, READY).map(|c| c.status),
        Some("Unknown".into())
    );
    eventually(
        "the deployment counts one available machine",
        LONG,
        async || {
            let status = mds.get("gated").await.ok()?.status?;
            (status.ready_replicas == 1 && status.available_replicas == 1).then_some(())
        },
    )
    .await;

    // The gate leaves the template: the second machine is Ready too.
    patch_md(
        &env,
        "gated",
        serde_json::json!({"spec": {"template": {"spec": {"readinessGates": null}}}}),
    )
    .await;
    eventually("every machine Ready without the gate", LONG, async || {
        let ms = env.machines(NS).await;
        ms.iter()
            .all(|m| {
                m.spec.readiness_gates.is_empty()
                    && condition_of(m, READY).is_some_and(|c| c.status == "True")
            })
            .then_some(())
    })
    .await;
    assert_eq!(env.cloud.stats().instances_launched, 2, "no new instance");
}

/// As Cluster API's controllers do, a deleted MachineDeployment deletes its
/// MachineSets and a deleted set its Machines, each keeping its finalizer
/// (and so its status) until what it controls is gone; the garbage
/// collector deletes none of them. Deleted the way `kubectl delete` does by
/// default (background), with the controller running as the generated
/// ServiceAccount, whose requests the audit log tells apart.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_deployment_deletes_its_sets_and_machines_itself_and_goes_last() {
    let mut options = capstan_e2e::env::EnvOptions::new(Faults {
        boot_latency_ms: 100,
        // Instances take a while to go, so the order can be seen.
        delete_latency_ms: 1500,
        ..Default::default()
    });
    options.control_plane.audit = true;
    let mut env = Env::start_with(options).await.expect("env");
    let config = capstan_e2e::install::controller_config(&env).await;
    env.start_controllers_as(config, Providers::default(), fast_options())
        .await;
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    let sets: Api<MachineSet> = Api::namespaced(env.client.clone(), NS);
    apply(
        &env,
        &sample_deployment("fleet", SIM_PLUGIN, &env.cloud.url(), 3, "v1.30.0"),
    )
    .await;
    env.wait_rolled_out(NS, "fleet", LONG).await;
    let md = mds.get("fleet").await.unwrap();
    assert!(
        md.finalizers()
            .contains(&capstan_api::MACHINEDEPLOYMENT_FINALIZER.to_string()),
        "{:?}",
        md.finalizers()
    );
    let set = sets.list(&Default::default()).await.unwrap().items;
    assert_eq!(set.len(), 1);
    assert_eq!(
        set[0].finalizers(),
        [capstan_api::MACHINESET_FINALIZER],
        "a set is born with its finalizer"
    );

    mds.delete("fleet", &DeleteParams::background())
        .await
        .unwrap();
    // While the instances are being released, the deployment and its set
    // are still there, marked deleting, and every machine is deleting.
    eventually(
        "machines deleting under their set and deployment",
        LONG,
        async || {
            let md = mds.get_opt("fleet").await.ok()??;
            let set = sets.get_opt(&set[0].name_any()).await.ok()??;
            let machines = env.machines(NS).await;
            (md.metadata.deletion_timestamp.is_some()
                && set.metadata.deletion_timestamp.is_some()
                && machines.len() == 3
                && machines
                    .iter()
                    .all(|m| m.metadata.deletion_timestamp.is_some()))
            .then_some(())
        },
    )
    .await;
    eventually("everything gone", LONG, async || {
        (env.machines(NS).await.is_empty()
            && env.cloud.instances().is_empty()
            && sets.list(&Default::default()).await.ok()?.items.is_empty()
            && mds.get_opt("fleet").await.ok()?.is_none())
        .then_some(())
    })
    .await;

    let controller = "system:serviceaccount:capstan-system:capstan-controller";
    let deletes = |resource: &str| -> Vec<String> {
        env.control_plane
            .audit_writes()
            .unwrap()
            .iter()
            .filter(|w| w["verb"] == "delete" && w["objectRef"]["resource"] == resource)
            .map(|w| w["user"]["username"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let machine_deletes = deletes("machines");
    assert_eq!(
        machine_deletes,
        vec![controller; 3],
        "each machine deleted once, by the set's controller"
    );
    assert_eq!(
        deletes("machinesets"),
        vec![controller],
        "the set deleted by the deployment's controller"
    );
    env.stop_controllers().await;
}

/// `Plugin.spec.quota.requestsPerMinute: 300` through the controllers: a
/// 50-machine deployment's machines share their provider's allowance, so
/// what reaches the cloud stays within burst + rate × time however many
/// machines ask (at most 300 + burst in the first minute); machines held
/// back say `PluginQuotaExceeded` and wait (no fault, no failure), and the
/// deployment still rolls out.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugins_request_quota_bounds_what_reaches_the_cloud() {
    let mut env = Env::start(faults(200)).await.expect("environment starts");
    let per_minute = 300.0;
    // Ten seconds' worth (`capstan_runtime::TokenBucket`).
    let burst = 50.0;
    let replicas = 50;
    Api::<capstan_api::Plugin>::all(env.client.clone())
        .patch(
            SIM_PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"quota": {"requestsPerMinute": 300}}})),
        )
        .await
        .unwrap();
    env.start_controllers(Providers::default(), fast_options())
        .await;
    let started = std::time::Instant::now();
    let before = env.cloud.stats().requests;
    apply(
        &env,
        &sample_deployment("metered", SIM_PLUGIN, &env.cloud.url(), replicas, "v1.30.0"),
    )
    .await;
    let mut held_back = false;
    let mut peak_over = f64::MIN;
    let mut first_minute = 0.0;
    let rolled = capstan_e2e::env::poll_until(LONG, async || {
        let sent = (env.cloud.stats().requests - before) as f64;
        let elapsed = started.elapsed().as_secs_f64();
        let allowed = burst + per_minute * elapsed / 60.0;
        peak_over = peak_over.max(sent - allowed);
        if elapsed <= 60.0 {
            first_minute = sent;
        }
        held_back |= env.machines(NS).await.iter().any(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == "PluginQuotaExceeded")
            })
        });
        let md = env.deployment(NS, "metered").await;
        (md.status.map(|s| s.ready_replicas) == Some(replicas)).then_some(())
    })
    .await;
    if rolled.is_none() {
        panic!(
            "the metered deployment did not roll out in {LONG:?}\n{}",
            env.describe(NS).await
        );
    }
    eprintln!(
        "requestsPerMinute {per_minute}: {replicas} machines ready in {:.1} s; the cloud got \
         {first_minute} requests in the first minute (at most {}), {} in all",
        started.elapsed().as_secs_f64(),
        per_minute + burst,
        env.cloud.stats().requests - before
    );
    // One request may be counted by the cloud a moment before this clock.
    assert!(
        peak_over <= 1.0,
        "the cloud got {peak_over:.1} requests more than burst + rate × time"
    );
    assert!(first_minute <= per_minute + burst + 1.0);
    assert!(held_back, "some machine waited, saying PluginQuotaExceeded");
    let metrics = env.metrics.encode();
    let count = |result: &str| {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("capstan_plugin_call_duration_seconds_count")
                    && l.contains(&format!("result=\"{result}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    assert!(count("quota") > 0.0, "quota hits are counted as such");
    assert_eq!(count("fault"), 0.0, "and never as the plugin's fault");
    // Every request that left is counted per plugin, and so is every one
    // the quota held back.
    let outbound = |result: &str| {
        metric(
            &metrics,
            &format!(
                "capstan_plugin_outbound_requests_total{{plugin=\"{SIM_PLUGIN}\",result=\"{result}\"}}"
            ),
        )
    };
    let sent = (env.cloud.stats().requests - before) as f64;
    assert!(outbound("quota") > 0.0, "held-back requests are counted");
    assert!(
        outbound("ok") > 0.0 && outbound("ok") <= sent,
        "{} requests counted as sent, {sent} reached the cloud",
        outbound("ok")
    );
    assert_cloud_matches(&env).await;
}

/// One sample of the encoded metrics (0 when absent).
fn metric(encoded: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    encoded
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0.0)
}

/// One gauge of the controllers' metrics, for `controller`.
fn gauge(env: &Env, name: &str, controller: &str) -> f64 {
    metric(
        &env.metrics.encode(),
        &format!("{name}{{controller=\"{controller}\"}}"),
    )
}

/// Fair queues: 100 Machines of one namespace on a provider whose calls
/// hang until their deadline hold at most their share of the Machine
/// controller's workers, and a 20-replica deployment in another namespace
/// rolls out beside them without waiting for any of those deadlines.
#[tokio::test(flavor = "multi_thread")]
async fn machines_hanging_in_one_namespace_do_not_hold_back_another() {
    let mut env = Env::start(faults(100)).await.expect("env");
    env.create_plugin("hanging", &capstan_e2e::plugin("hostile_plugin"))
        .await
        .unwrap();
    let deadline = Duration::from_secs(10);
    Api::<capstan_api::Plugin>::all(env.client.clone())
        .patch(
            "hanging",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "limits": {"callTimeoutMs": deadline.as_millis() as u64},
                "allowedNamespaces": {"names": ["hog"]},
            }})),
        )
        .await
        .unwrap();
    let options = fast_options();
    let workers = f64::from(options.concurrency.machines);
    env.start_controllers(Providers::default(), options).await;

    let roll_out = async |name: &str| {
        let started = std::time::Instant::now();
        apply(
            &env,
            &sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), 20, "v1.30.0"),
        )
        .await;
        env.wait_rolled_out(NS, name, LONG).await;
        started.elapsed()
    };
    // The deployment with the controllers to itself.
    let alone = roll_out("alone").await;

    let hog = "hog";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": hog}})).unwrap(),
        )
        .await
        .unwrap();
    let hanging: Api<Machine> = Api::namespaced(env.client.clone(), hog);
    for i in 0..100 {
        let machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "capstan.dev/v1alpha1",
            "kind": "Machine",
            "metadata": { "name": format!("hang-{i}"), "namespace": hog },
            "spec": { "provider": { "plugin": "hanging", "config": { "attack": "hang" } } },
        }))
        .unwrap();
        hanging
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
    }
    // The hog's reconciles hang in their calls, holding workers, and the
    // rest wait in the fair queue; for a while, the most they hold.
    let mut held = 0.0_f64;
    eventually("the hanging calls hold workers", LONG, async || {
        held = held.max(gauge(&env, "capstan_reconciles_running", "machine"));
        let waiting = gauge(&env, "capstan_reconciles_waiting", "machine");
        (held >= f64::from(capstan_api::PluginQuota::DEFAULT_CONCURRENT_CALLS) && waiting > 0.0)
            .then_some(())
    })
    .await;
    let mut calls: f64 = 0.0;
    for _ in 0..20 {
        held = held.max(gauge(&env, "capstan_reconciles_running", "machine"));
        let metrics = env.metrics.encode();
        calls = calls.max(metric(
            &metrics,
            "capstan_plugin_calls_in_flight{plugin=\"hanging\"}",
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The plugin's default concurrentCalls bounds its calls; the reconciles
    // past it wait for a call slot and are refused by the quota.
    assert_eq!(
        calls,
        f64::from(capstan_api::PluginQuota::DEFAULT_CONCURRENT_CALLS),
        "calls of the hanging plugin in flight"
    );

    let beside = roll_out("beside").await;
    println!(
        "fair queues: a 20-replica deployment rolled out in {:.1} s alone and in {:.1} s beside \
         100 machines hanging for {} s ({:.2}×; goal ≤ 1.2×); alone, the hanging namespace \
         held at most {held} of the Machine controller's {workers} workers",
        alone.as_secs_f64(),
        beside.as_secs_f64(),
        deadline.as_secs(),
        beside.as_secs_f64() / alone.as_secs_f64(),
    );
    // Without fair queues every worker would hang in the hog's calls and
    // the deployment could not start before the first deadline.
    assert!(
        beside < deadline,
        "the deployment waited for a hanging call's deadline: {beside:?}"
    );
    assert!(
        held < workers,
        "the hanging namespace took every worker ({held} of {workers}), leaving none for others"
    );
    let rejected = metric(
        &env.metrics.encode(),
        "capstan_plugin_quota_rejections_total{plugin=\"hanging\",quota=\"concurrentCalls\"}",
    );
    assert!(
        rejected > 0.0,
        "calls past concurrentCalls are refused, and counted"
    );
    assert!(
        hanging
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|m| m
                .status
                .as_ref()
                .and_then(|s| s.provider_id.as_ref())
                .is_none()),
        "the hog's calls really hang"
    );
}
