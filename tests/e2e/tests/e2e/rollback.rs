//! Automatic rollback (`MachineDeployment.spec.rollback`) on a real control
//! plane, with the controllers running as the ServiceAccount `capstan
//! install` generates (the rollback writes a deployment's spec: its rights
//! must allow that and no more): a rollout whose new machines keep failing
//! rolls back by itself, once, and a template put back by hand is not
//! rolled back again.

use crate::logs;
use capstan_api::set_conditions::{PROGRESSING, ROLLED_BACK};
use capstan_api::{
    ANNOTATION_AUTOMATIC_ROLLBACK, AutomaticRollbackRecord, MachineDeployment, MachineHealthCheck,
    MachineSet, condition,
};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::install::controller_config;
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

pub(crate) fn faults() -> Faults {
    Faults {
        boot_latency_ms: 200,
        ..Default::default()
    }
}

/// A rolled-out pool of `replicas` v1.30.0 machines with this
/// `spec.rollback`, the controllers running as the generated
/// ServiceAccount.
pub(crate) async fn start(replicas: i32, rollback: Option<Value>) -> Env {
    logs();
    let mut env = Env::start(faults()).await.expect("environment starts");
    let config = controller_config(&env).await;
    env.start_controllers_as(config, Providers::default(), Options::default())
        .await;
    let mut md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), replicas, "v1.30.0");
    md.spec.rollback = rollback.map(|r| serde_json::from_value(r).expect("a valid spec.rollback"));
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .expect("create md/pool");
    env.wait_rolled_out(NS, "pool", LONG).await;
    env
}

pub(crate) async fn set_version(env: &Env, version: &str) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "template": { "spec": { "version": version } } } })),
        )
        .await
        .expect("patch md/pool");
}

fn version(md: &MachineDeployment) -> &str {
    md.spec.template.spec.version.as_deref().unwrap_or_default()
}

fn record(md: &MachineDeployment) -> Option<AutomaticRollbackRecord> {
    let value = md.annotations().get(ANNOTATION_AUTOMATIC_ROLLBACK)?;
    Some(serde_json::from_str(value).expect("the record parses"))
}

fn md_condition(md: &MachineDeployment, type_: &str) -> Option<(String, String, String)> {
    let c = condition(&md.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The machine versions, sorted.
async fn versions(env: &Env) -> Vec<String> {
    let mut v: Vec<String> = env
        .machines(NS)
        .await
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| m.spec.version.clone().unwrap_or_default())
        .collect();
    v.sort();
    v
}

/// The MachineSet of `version`'s template: its `remediatedReplicas`.
async fn remediated(env: &Env, version: &str) -> i32 {
    Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s.spec.template.spec.version.as_deref() == Some(version))
        .filter_map(|s| s.status.as_ref())
        .map(|s| s.remediated_replicas)
        .sum()
}

/// New machines whose Nodes never join are remediated by a health check;
/// after two, the deployment returns to v1.30.0 by itself, with an Event
/// and `RolledBack`, and its old machines were never touched. A user who
/// puts v1.31.0 back gets no second automatic rollback: the deployment
/// says why in `Progressing`.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_whose_new_machines_keep_failing_health_checks_rolls_back_once() {
    let env = start(2, Some(json!({ "remediatedMachines": 2 }))).await;
    let before: Vec<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": { "name": "pool", "namespace": NS },
        "spec": {
            "selector": { "matchLabels": { "capstan.dev/pool": "pool" } },
            "checks": { "nodeStartupTimeoutSeconds": 3 },
        },
    }))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .expect("create mhc");
    env.cloud.set_faults(Faults {
        register_nodes: false,
        ..faults()
    });
    set_version(&env, "v1.31.0").await;

    let md = env
        .eventually("the deployment back on v1.30.0", LONG, async || {
            let md = env.deployment(NS, "pool").await;
            (version(&md) == "v1.30.0").then_some(md)
        })
        .await;
    let record = record(&md).expect("the rollback is recorded on the deployment");
    assert_eq!(record.reason, "MachinesRemediated");
    assert!(
        remediated(&env, "v1.31.0").await >= 2,
        "two new machines remediated first"
    );
    env.eventually("RolledBack=True", LONG, async || {
        let md = env.deployment(NS, "pool").await;
        let (status, reason, message) = md_condition(&md, ROLLED_BACK)?;
        (status == "True" && reason == "MachinesRemediated")
            .then_some(())
            .filter(|_| message.contains("rolled back automatically from revision"))
    })
    .await;
    assert!(
        env.event_reasons(NS).contains("RolledBack"),
        "an Event says so"
    );
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let history = capstan_e2e::cli::ok(&[
        "rollout",
        "history",
        "md/pool",
        "--kubeconfig",
        kubeconfig.as_str(),
    ]);
    let failed = history
        .lines()
        .find(|l| l.contains("v1.31.0"))
        .unwrap_or_default();
    assert!(failed.ends_with("(rolled back automatically)"), "{history}");
    env.wait_rolled_out(NS, "pool", LONG).await;
    let after: Vec<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    assert_eq!(after, before, "the old machines were never replaced");

    // A user puts the failed template back: remediations go on, the
    // deployment stays where the user put it.
    let counted = remediated(&env, "v1.31.0").await;
    set_version(&env, "v1.31.0").await;
    env.eventually("the put-back template fails again", LONG, async || {
        (remediated(&env, "v1.31.0").await >= counted + 2).then_some(())
    })
    .await;
    let md = env
        .eventually("Progressing says why it is held", LONG, async || {
            let md = env.deployment(NS, "pool").await;
            let (status, reason, message) = md_condition(&md, PROGRESSING)?;
            (status == "False" && reason == "MachinesRemediated")
                .then_some(md)
                .filter(|_| message.contains("not rolled back again"))
        })
        .await;
    assert_eq!(version(&md), "v1.31.0", "no second automatic rollback");
    assert_eq!(
        self::record(&md).map(|r| r.from_revision),
        Some(record.from_revision),
        "the record is the first rollback's"
    );
    assert_eq!(md_condition(&md, ROLLED_BACK), None);
}

/// A rollout whose one new machine never becomes available rolls back
/// when `progressDeadlineSeconds` passes without progress; the stuck
/// machine goes with its set, and the pool is whole on v1.30.0 again.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_without_progress_rolls_back_after_its_deadline() {
    let env = start(1, Some(json!({ "progressDeadlineSeconds": 6 }))).await;
    env.cloud.set_faults(Faults {
        register_nodes: false,
        ..faults()
    });
    set_version(&env, "v1.31.0").await;
    env.eventually("a v1.31.0 machine waiting for its Node", LONG, async || {
        versions(&env)
            .await
            .contains(&"v1.31.0".to_string())
            .then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    let md = env
        .eventually("the deployment back on v1.30.0", LONG, async || {
            let md = env.deployment(NS, "pool").await;
            (version(&md) == "v1.30.0").then_some(md)
        })
        .await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "not before the deadline: {:?}",
        started.elapsed()
    );
    let record = record(&md).expect("recorded");
    assert_eq!(record.reason, "ProgressDeadlineExceeded");
    env.wait_rolled_out(NS, "pool", LONG).await;
    env.eventually("only v1.30.0 left", LONG, async || {
        (versions(&env).await == ["v1.30.0"] && env.cloud.stats().live_instances == 1).then_some(())
    })
    .await;
}

/// Does it still hold now: a rollout to a template on another Plugin
/// stalls, but the namespace may no longer use the previous revision's
/// Plugin: the deployment does not write that template back (it says why
/// in `Progressing`); once an admin allows the Plugin again, the rollback
/// happens.
#[tokio::test(flavor = "multi_thread")]
async fn a_revision_whose_plugin_was_taken_off_the_namespace_is_not_restored() {
    use capstan_api::Plugin;
    let env = start(1, Some(json!({ "progressDeadlineSeconds": 4 }))).await;
    env.create_plugin("sim-b", &capstan_e2e::plugin("sim_provider"))
        .await
        .expect("a second provider Plugin");
    env.cloud.set_faults(Faults {
        register_nodes: false,
        ..faults()
    });
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "template": { "spec": {
                "version": "v1.31.0", "provider": { "plugin": "sim-b" },
            } } } })),
        )
        .await
        .expect("patch md/pool");
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    let allow = async |names: Value| {
        plugins
            .patch(
                SIM_PLUGIN,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": { "allowedNamespaces": { "names": names } } })),
            )
            .await
            .expect("patch the Plugin");
    };
    allow(json!([capstan_e2e::env::CAPSTAN_NAMESPACE])).await;

    let message = env
        .eventually(
            "Progressing says the rollback is refused",
            LONG,
            async || {
                let md = env.deployment(NS, "pool").await;
                let (status, reason, message) = md_condition(&md, PROGRESSING)?;
                (status == "False" && reason == "ProgressDeadlineExceeded")
                    .then_some(message)
                    .filter(|m| m.contains("may no longer be run here"))
            },
        )
        .await;
    assert!(
        message.contains(&format!(
            "plugin \"{SIM_PLUGIN}\" is not allowed in namespace \"{NS}\""
        )),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let md = env.deployment(NS, "pool").await;
    assert_eq!(
        version(&md),
        "v1.31.0",
        "the refused template is not written back"
    );
    assert_eq!(record(&md), None);

    allow(json!([capstan_e2e::env::CAPSTAN_NAMESPACE, NS])).await;
    let md = env
        .eventually("the deployment back on v1.30.0", LONG, async || {
            let md = env.deployment(NS, "pool").await;
            (version(&md) == "v1.30.0").then_some(md)
        })
        .await;
    assert_eq!(md.spec.template.spec.provider.plugin, SIM_PLUGIN);
    assert_eq!(
        record(&md).map(|r| r.reason),
        Some("ProgressDeadlineExceeded".into())
    );
}
