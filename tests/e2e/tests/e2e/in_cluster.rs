//! Running Capstan as a cluster runs it: `capstan install` accepted by the
//! API server and undone by `capstan uninstall`; the controller under a
//! ServiceAccount bound only to the generated roles (they suffice, and two
//! rules removed one at a time each break something visibly); two replicas
//! with leader election, a SIGKILLed leader replaced mid-rollout without a
//! machine launched twice, and a SIGTERM handover; two shards splitting a
//! fleet by `--watch-filter`.

use crate::logs;
use capstan_api::{Machine, MachineDeployment, MachineHealthCheck, Plugin, condition};
use capstan_e2e::cli;
use capstan_e2e::env::{
    CAPSTAN_NAMESPACE, ControllerProcess, Env, SIM_PLUGIN, capstan_bin, eventually,
    sample_deployment, sim_plugin_spec,
};
use capstan_e2e::install::{kubectl_apply, rbac_docs, service_account_kubeconfig};
use capstan_e2e::sim_cloud::Faults;
use capstan_e2e::workloads;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

fn plugin_ready(p: &Plugin) -> Option<(String, String, String)> {
    let c = condition(&p.status.as_ref()?.conditions, "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn create_sim_plugin(env: &Env, name: &str, secret_namespace: &str) {
    let mut spec = sim_plugin_spec(&format!(
        "file://{}",
        capstan_e2e::plugin("sim_provider").display()
    ));
    spec.grants.credentials[0].secret_ref.namespace = secret_namespace.into();
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new(name, spec))
        .await
        .expect("create plugin");
}

async fn plugin_condition(env: &Env, name: &str, reason: &str) -> String {
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    env.eventually(&format!("Plugin {name} {reason}"), LONG, async || {
        let (status, r, message) = plugin_ready(&plugins.get(name).await.ok()?)?;
        (status == "False" && r == reason).then_some(message)
    })
    .await
}

async fn patch_pool(env: &Env, spec: Value) {
    patch_named(env, "pool", spec).await;
}

fn as_args(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[track_caller]
fn says_all(output: &str, lines: &[&str]) {
    for line in lines {
        assert!(output.contains(line), "{line} not in:\n{output}");
    }
}

/// An environment whose simulated instances boot in `boot_latency_ms`.
async fn start(boot_latency_ms: u64) -> Env {
    logs();
    let faults = Faults {
        boot_latency_ms,
        ..Default::default()
    };
    Env::start(faults).await.expect("environment")
}

fn deleting(m: &Machine) -> Option<String> {
    let c = condition(&m.status.as_ref()?.conditions, "Deleting")?;
    Some(format!("{}: {}", c.reason, c.message))
}

#[tokio::test(flavor = "multi_thread")]
async fn install_is_accepted_and_uninstall_removes_it() {
    let env = start(0).await;
    let yaml = cli::ok(&["install", "--namespace", "capstan-install"]);
    // A server-side dry run does not create the namespace the other objects
    // go in; create it first (it is the first object of the stream).
    env.control_plane
        .kubectl(&["create", "namespace", "capstan-install"], None)
        .expect("create namespace");
    let out = env
        .control_plane
        .kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&yaml))
        .expect("the API server accepts every object");
    says_all(
        &out,
        &[
            "serviceaccount/capstan-controller",
            "clusterrole.rbac.authorization.k8s.io/capstan-controller",
            "role.rbac.authorization.k8s.io/capstan-controller",
            "deployment.apps/capstan-controller",
        ],
    );

    // Applied for real, then uninstalled: refused while a Machine holds
    // its finalizer, done with --force.
    let kubeconfig = env.control_plane.kubeconfig();
    let kc = kubeconfig.to_str().unwrap();
    let applied = cli::ok(&[
        "install",
        "--apply",
        "--kubeconfig",
        kc,
        "--namespace",
        "capstan-install",
    ]);
    assert!(
        applied.contains("deployment/capstan-controller applied"),
        "{applied}"
    );
    let mut machine: Machine = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "held", "namespace": NS, "finalizers": ["capstan.dev/machine"] },
        "spec": { "provider": { "plugin": SIM_PLUGIN, "config": {} } },
    }))
    .unwrap();
    machine.metadata.namespace = Some(NS.into());
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    // A deployment and a set holding the controllers' finalizers, with no
    // controller left to remove them: uninstall releases them so the CRDs
    // can go.
    let mut md = sample_deployment("held", SIM_PLUGIN, &env.cloud.url(), 0, "v1.30.0");
    md.metadata.finalizers = Some(vec![capstan_api::MACHINEDEPLOYMENT_FINALIZER.into()]);
    let set: capstan_api::MachineSet = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineSet",
        "metadata": {
            "name": "held", "namespace": NS,
            "finalizers": [capstan_api::MACHINESET_FINALIZER],
        },
        "spec": {
            "replicas": 0,
            "selector": md.spec.selector,
            "template": md.spec.template,
        },
    }))
    .unwrap();
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    Api::<capstan_api::MachineSet>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    let uninstall = |extra: &[&'static str]| -> Vec<String> {
        [
            "uninstall",
            "--kubeconfig",
            kc,
            "--namespace",
            "capstan-install",
        ]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect()
    };
    let refused = cli::fails(&as_args(&uninstall(&[])));
    assert!(
        refused.contains("1 Machine(s) still hold finalizers (default/held)")
            && refused.contains("--force"),
        "{refused}"
    );
    let done = cli::ok(&as_args(&uninstall(&["--force"])));
    says_all(
        &done,
        &[
            "deployment/capstan-controller deleted",
            "clusterrole/capstan-controller deleted",
            "clusterrole/capstan-controller-machines deleted",
            "rolebinding/capstan-controller-machines deleted",
            "customresourcedefinition/machines.capstan.dev deleted",
            "namespace/capstan-install deleted",
            "machineset/held (default): finalizer capstan.dev/machineset removed",
            "machinedeployment/held (default): finalizer capstan.dev/machinedeployment removed",
        ],
    );
    eventually("every Capstan CRD gone", LONG, async || {
        let crds = env
            .control_plane
            .kubectl(&["get", "crds", "-o", "name"], None)
            .ok()?;
        (!crds.contains("capstan.dev")).then_some(())
    })
    .await;
    let roles = env
        .control_plane
        .kubectl(&["get", "clusterroles", "-o", "name"], None)
        .unwrap();
    assert!(!roles.contains("capstan-controller"), "{roles}");
    // Idempotent: a second run finds nothing and succeeds.
    let again = cli::ok(&as_args(&uninstall(&[])));
    assert!(
        again.contains("clusterrole/capstan-controller not found"),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_generated_roles_are_sufficient_and_not_wider() {
    let env = start(200).await;
    kubectl_apply(&env, &rbac_docs(None));
    let kubeconfig = service_account_kubeconfig(&env).await;
    let mut controller = ControllerProcess::start_program(
        &capstan_bin().unwrap(),
        &["controller"],
        &kubeconfig,
        // As the installed Deployment runs it: the Lease needs its rules too.
        &["--poll-interval=250ms", "--leader-elect"],
        &[],
    )
    .unwrap();
    wait_leads(&mut controller, LONG);
    controller.wait_ready(LONG).unwrap();

    // The lifecycle: a pool comes up, is health-checked, carries a
    // workload, rolls to a new version (drains, Node deletion), scales.
    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "pool", LONG).await;
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": { "name": "pool", "namespace": NS },
        "spec": {
            "selector": { "matchLabels": { "capstan.dev/pool": "pool" } },
            "checks": { "unhealthyNodeConditions": [
                { "type": "Ready", "status": "Unknown", "timeoutSeconds": 60 }
            ] },
        },
    }))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .unwrap();
    let web = workloads::one_per_node(workloads::deployment(NS, "web", 2, 1));
    workloads::create(&env.client, &web).await.unwrap();
    env.or_describe(workloads::wait_deployment_available(&env.client, NS, "web", LONG).await)
        .await;
    patch_pool(
        &env,
        json!({ "template": { "spec": { "version": "v1.31.0" } } }),
    )
    .await;
    env.wait_rolled_out(NS, "pool", LONG).await;
    env.or_describe(workloads::wait_deployment_available(&env.client, NS, "web", LONG).await)
        .await;
    let machines = env.machines(NS).await;
    assert_eq!(machines.len(), 2);
    assert!(
        machines
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.31.0"))
    );
    let mhcs: Api<MachineHealthCheck> = Api::namespaced(env.client.clone(), NS);
    env.eventually("the health check counts the pool", LONG, async || {
        let s = mhcs.get("pool").await.ok()?.status?;
        (s.expected_machines == 2 && s.current_healthy == 2).then_some(())
    })
    .await;
    let events = env.event_reasons(NS);
    assert!(events.contains("NodeDrained"), "{events}");
    assert_eq!(env.cloud.stats().live_instances, 2);

    // A credential outside Capstan's namespace is refused, by the host
    // before RBAC would be asked.
    create_sim_plugin(&env, "outside", NS).await;
    let message = plugin_condition(&env, "outside", "CredentialOutOfNamespace").await;
    assert!(
        message.contains("Secret default/sim-cloud is outside Capstan's namespace"),
        "{message}"
    );

    // Without pods/eviction, a drain cannot evict: the machine says so.
    kubectl_apply(&env, &rbac_docs(Some("pods/eviction")));
    patch_pool(&env, json!({ "replicas": 1 })).await;
    let blocked = env
        .eventually("the drain is refused", LONG, async || {
            env.machines(NS)
                .await
                .iter()
                .filter_map(deleting)
                .find(|d| d.contains("forbidden"))
        })
        .await;
    assert!(blocked.contains("pods/eviction"), "{blocked}");
    kubectl_apply(&env, &rbac_docs(None));
    env.wait_rolled_out(NS, "pool", LONG).await;
    assert_eq!(env.machines(NS).await.len(), 1);

    // Without Secrets in its own namespace, a Plugin's credential cannot
    // be read: the Plugin says so.
    kubectl_apply(&env, &rbac_docs(Some("secrets")));
    create_sim_plugin(&env, "unreadable", CAPSTAN_NAMESPACE).await;
    let message = plugin_condition(&env, "unreadable", "CredentialUnavailable").await;
    assert!(message.contains("forbidden"), "{message}");
    kubectl_apply(&env, &rbac_docs(None));

    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .delete("pool", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("every instance released", LONG, async || {
        (env.cloud.stats().live_instances == 0 && env.machines(NS).await.is_empty()).then_some(())
    })
    .await;
    controller.stop();
}

/// How often `c` compiled a plugin (`ok`) or loaded its code from the
/// cache (`cached`).
fn compiles(c: &ControllerProcess, result: &str) -> f64 {
    let (_, body) = c.get("/metrics").unwrap();
    body.lines()
        .filter(|l| {
            l.starts_with("capstan_plugin_artifact_steps_total{")
                && l.contains("step=\"compile\"")
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// Short enough for a quick takeover, long enough that a leader on a
// loaded 2-core machine (the whole suite runs beside it) does not miss its
// renewals: with a 4 s renew deadline a first leader once lost its Lease
// before the test had started the standby.
const LEASE_SECONDS: u64 = 8;
const ELECTION: &[&str] = &[
    "--leader-elect",
    "--leader-elect-lease-duration=8s",
    "--leader-elect-renew-deadline=6s",
    "--leader-elect-retry-period=1s",
    "--poll-interval=250ms",
];

fn leads(c: &ControllerProcess) -> bool {
    c.metric_sum("capstan_leader").ok() == Some(1.0)
}

/// Wait until `c` leads; the time it took.
fn wait_leads(c: &mut ControllerProcess, within: Duration) -> Duration {
    let started = Instant::now();
    while !leads(c) {
        assert!(c.exited().is_none(), "{} exited", c.log.display());
        assert!(
            started.elapsed() < within,
            "not leading after {within:?}; log {}",
            c.log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_replica_leads_and_a_standby_takes_over() {
    let env = start(1500).await;
    // The replicas share a code cache, as containers of one pod share its
    // emptyDir across restarts.
    let cache = env
        .control_plane
        .kubeconfig()
        .with_file_name("shared-code-cache");
    let cache_flag = format!("--code-cache={}", cache.display());
    let flags = [ELECTION, &[cache_flag.as_str()]].concat();
    let mut first = ControllerProcess::start(&env, &flags, &[]).unwrap();
    wait_leads(&mut first, LONG);
    let mut second = ControllerProcess::start(&env, &flags, &[]).unwrap();
    second.wait_ready(LONG).unwrap();
    let (code, body) = second.get("/readyz").unwrap();
    assert_eq!((code, body.contains("standby")), (200, true), "{body}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(leads(&first) && !leads(&second), "exactly one leads");

    // Mid-rollout, the leader dies without a word.
    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 4, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.eventually("instances launching", LONG, async || {
        (env.cloud.stats().instances_launched >= 1).then_some(())
    })
    .await;
    assert_eq!(
        compiles(&first, "ok"),
        1.0,
        "the first leader compiled the plugin"
    );
    let ready = env.deployment(NS, "pool").await.status.unwrap_or_default();
    assert!(ready.ready_replicas < 4, "killed mid-rollout");
    first.kill();
    let takeover = wait_leads(&mut second, LONG);
    eprintln!("takeover after SIGKILL: {takeover:?} (lease duration {LEASE_SECONDS} s)");
    // Within the lease duration, give or take a retry period (1 s) and
    // the API round trips of a loaded machine.
    assert!(
        takeover < Duration::from_secs(LEASE_SECONDS + 3),
        "took {takeover:?}, lease duration {LEASE_SECONDS} s"
    );
    env.wait_rolled_out(NS, "pool", LONG).await;
    assert_eq!(
        (compiles(&second, "ok"), compiles(&second, "cached")),
        (0.0, 1.0),
        "the new leader loaded the compiled code from the shared cache"
    );
    let stats = env.cloud.stats();
    assert_eq!(stats.live_instances, 4);
    assert_eq!(stats.instances_launched, 4, "no instance launched twice");
    assert_eq!(env.machines(NS).await.len(), 4);

    // A restarted replica stands by; SIGTERM on the leader hands over at once.
    let mut third = ControllerProcess::start(&env, &flags, &[]).unwrap();
    third.wait_ready(LONG).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(!leads(&third));
    second.terminate();
    let handover = wait_leads(&mut third, LONG);
    eprintln!("handover after SIGTERM: {handover:?}");
    assert!(handover < Duration::from_secs(2), "took {handover:?}");
    let terminated = Instant::now();
    let status = loop {
        if let Some(s) = second.exited() {
            break s;
        }
        assert!(
            terminated.elapsed() < Duration::from_secs(10),
            "the old leader did not exit; its log ends:\n{}",
            second.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("old leader exited {:?} after SIGTERM", terminated.elapsed());
    assert!(status.success(), "{status}");
    // The new leader reconciles: a scale-up is served.
    patch_pool(&env, json!({ "replicas": 5 })).await;
    env.wait_rolled_out(NS, "pool", LONG).await;
    assert_eq!(env.cloud.stats().instances_launched, 5);
    third.stop();
}

/// An addon Plugin and an Addon in Capstan's namespace whose objects go to
/// this cluster as a workload cluster, through a kubeconfig Secret of
/// [`capstan_e2e::control_plane::WORKLOAD_USER`]; waits until applied.
/// Returns what makes it drift (a hand edit of its DaemonSet).
async fn workload_addon(env: &Env) -> impl AsyncFn() + use<> {
    let plugin: capstan_api::PluginSpec = serde_json::from_value(json!({
        "source": format!("file://{}", capstan_e2e::plugin("node_exporter_addon").display()),
        "grants": {
            "objects": ["Namespace/monitoring", "ServiceAccount@monitoring", "Service@monitoring", "apps/DaemonSet@monitoring"],
            "podSecurity": "Privileged"
        }
    }))
    .unwrap();
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new("exporter", plugin))
        .await
        .unwrap();
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "workload-kubeconfig", "namespace": CAPSTAN_NAMESPACE},
        "stringData": {"value": env.control_plane.workload_kubeconfig_inline()}});
    let addon = json!({"apiVersion": "capstan.dev/v1alpha1", "kind": "Addon",
        "metadata": {"name": "exporter", "namespace": CAPSTAN_NAMESPACE},
        "spec": {"plugin": "exporter", "channel": "stable",
                 "target": {"kubeconfigSecretRef": {"name": "workload-kubeconfig"}}}});
    kubectl_apply(env, &[secret, addon]);
    let addons: Api<capstan_api::Addon> = Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    env.eventually("the workload Addon applied", LONG, async || {
        let status = addons.get("exporter").await.ok()?.status?;
        (condition(&status.conditions, "Applied")?.status == "True").then_some(())
    })
    .await;
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(env.client.clone(), "monitoring");
    async move || {
        let edit = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "node-exporter", "image": "example.com/edited:1"}]}}}});
        daemonsets
            .patch(
                "node-exporter",
                &PatchParams::default(),
                &Patch::Strategic(edit),
            )
            .await
            .unwrap();
    }
}

/// The review's split brain, reproduced: two replicas, the leader's workers
/// busy in CPU-bound plugin calls, the leader stopped (SIGSTOP) for longer
/// than the Lease mid-rollout, then resumed. The API server's audit log
/// (each replica with its own user) shows not one write from the old
/// leader after the standby acquired, the cloud (counted while only the
/// old leader runs) gets no request from it once resumed, and every
/// machine has one instance.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_leader_writes_nothing_once_a_standby_took_over() {
    logs();
    let mut options = capstan_e2e::env::EnvOptions::new(Faults {
        boot_latency_ms: 1500,
        ..Default::default()
    });
    options.control_plane.audit = true;
    let env = Env::start_with(options).await.expect("environment");
    // A hostile provider spinning until its deadline keeps workers busy.
    env.create_plugin("spinner", &capstan_e2e::plugin("hostile_plugin"))
        .await
        .unwrap();
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "spinner",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"limits": {"callTimeoutMs": 3000}}})),
        )
        .await
        .unwrap();
    let mut spin = sample_deployment("spin", "spinner", &env.cloud.url(), 6, "v1.30.0");
    spin.spec.template.spec.provider.config["attack"] = json!("infinite-loop");
    let deployments: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    deployments
        .create(&PostParams::default(), &spin)
        .await
        .unwrap();

    // The leader-to-be has a user of its own (the simulated kubelet writes
    // as the first admin).
    let old_user = capstan_e2e::control_plane::SECOND_ADMIN;
    let second = env.control_plane.second_admin_kubeconfig().unwrap();
    let mut old = ControllerProcess::start_program(
        &capstan_bin().unwrap(),
        &["controller"],
        &second,
        ELECTION,
        &[],
    )
    .unwrap();
    wait_leads(&mut old, LONG);
    let mut standby = ControllerProcess::start(&env, ELECTION, &[]).unwrap();
    standby.wait_ready(LONG).unwrap();

    // An Addon whose objects go to a workload cluster: this one, through a
    // kubeconfig of its own user, so the audit log tells those writes apart.
    let drifted = workload_addon(&env).await;

    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 4, "v1.30.0");
    deployments
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.eventually("instances launching", LONG, async || {
        (env.cloud.stats().instances_launched >= 1).then_some(())
    })
    .await;
    let stop = |signal: &str, pid: u32| {
        let ok = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .map(|s| s.success());
        assert_eq!(ok.ok(), Some(true), "kill {signal} {pid}");
    };
    stop("-STOP", old.pid());
    let takeover = wait_leads(&mut standby, LONG);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    let acquired = leases
        .get("capstan-controller")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.acquire_time)
        .expect("the Lease has an acquire time")
        .0;
    // Longer than the Lease, with CPU-bound calls pending in the old leader.
    std::thread::sleep(Duration::from_secs(3));
    // While the old leader wakes, the new one is paused too, so every
    // request reaching the cloud meanwhile would be the old leader's.
    stop("-STOP", standby.pid());
    // Requests the standby sent just before it stopped may still be on
    // their way (a loaded machine): count from when the cloud went quiet.
    let mut cloud_before = env.cloud.stats().requests;
    let mut quiet_since = Instant::now();
    let settle_deadline = Instant::now() + Duration::from_secs(10);
    while quiet_since.elapsed() < Duration::from_secs(1) && Instant::now() < settle_deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = env.cloud.stats().requests;
        if now != cloud_before {
            cloud_before = now;
            quiet_since = Instant::now();
        }
    }
    // Work for the old leader's workload-cluster client: drift to undo.
    drifted().await;
    let resumed = k8s_openapi::jiff::Timestamp::now();
    stop("-CONT", old.pid());
    // The resumed process first competes for the CPU with its own
    // CPU-bound plugin calls (and, in CI, the other tests): allow a minute.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = old.exited() {
            break s;
        }
        if Instant::now() >= deadline {
            stop("-CONT", standby.pid());
            panic!("the old leader did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let cloud_after = env.cloud.stats().requests;
    let standby_resumed = k8s_openapi::jiff::Timestamp::now();
    stop("-CONT", standby.pid());
    assert_eq!(
        cloud_after, cloud_before,
        "the resumed old leader sent requests to the cloud after losing the Lease"
    );
    assert!(
        !status.success(),
        "the old leader exits with an error: {status}"
    );
    env.wait_rolled_out(NS, "pool", LONG).await;

    let writes = env.control_plane.audit_writes().unwrap();
    let by_old: Vec<&Value> = writes
        .iter()
        .filter(|w| w["user"]["username"] == old_user)
        .collect();
    let late: Vec<String> = by_old
        .iter()
        .filter(|w| {
            w["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t > acquired)
        })
        .map(|w| {
            format!(
                "{} {} {}",
                w["verb"], w["requestURI"], w["requestReceivedTimestamp"]
            )
        })
        .collect();
    eprintln!(
        "SIGSTOP of the leader with CPU-bound plugin calls: takeover after {takeover:?}; the old leader made {} writes in all, {} after the standby acquired, {} cloud requests once resumed",
        by_old.len(),
        late.len(),
        cloud_after - cloud_before
    );
    assert!(
        !by_old.is_empty(),
        "the audit log has the old leader's writes"
    );
    assert!(late.is_empty(), "writes after the takeover: {late:#?}");
    // The workload cluster: nothing while only the old leader ran, and the
    // new leader undoes the drift once resumed (the count works).
    let workload_writes = |from: k8s_openapi::jiff::Timestamp,
                           to: Option<k8s_openapi::jiff::Timestamp>| {
        let writes = env.control_plane.audit_writes().unwrap();
        writes
            .iter()
            .filter(|w| w["user"]["username"] == capstan_e2e::control_plane::WORKLOAD_USER)
            .filter(|w| {
                w["requestReceivedTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .is_some_and(|t| t >= from && to.is_none_or(|to| t < to))
            })
            .count()
    };
    assert_eq!(
        workload_writes(resumed, Some(standby_resumed)),
        0,
        "the resumed old leader wrote to the workload cluster"
    );
    env.eventually("the new leader undoes the drift", LONG, async || {
        (workload_writes(standby_resumed, None) > 0).then_some(())
    })
    .await;
    assert_eq!(
        env.cloud.stats().instances_launched,
        4,
        "one instance per machine, none launched twice"
    );
    standby.stop();
}

/// `--kube-api-qps` / `--kube-api-burst` as controller-runtime has them:
/// under a low limit the controllers still do their work (the pacing
/// itself is tested on virtual time in `ratelimit.rs`), and a limit that
/// is not a rate is refused with the flag's name.
#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_controller_rolls_out_and_a_bad_limit_is_refused() {
    let env = start(200).await;
    let kubeconfig = env.control_plane.kubeconfig();
    let err = cli::fails(&[
        "controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--kube-api-qps=-1",
    ]);
    assert!(
        err.contains("--kube-api-qps -1 must be a number of requests per second"),
        "{err}"
    );
    let mut controller = ControllerProcess::start(
        &env,
        &[
            "--kube-api-qps=5",
            "--kube-api-burst=10",
            "--poll-interval=250ms",
        ],
        &[],
    )
    .unwrap();
    controller.wait_ready(LONG).unwrap();
    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "pool", LONG).await;
    assert!(controller.metric_sum("capstan_api_writes_total").unwrap() > 0.0);
}

/// Cluster API's `--watch-filter`: two controllers on one control plane,
/// each reconciling only the deployments (and their sets and machines)
/// labelled with its value; an unlabelled deployment is neither's. A bad
/// value is refused at startup.
#[tokio::test(flavor = "multi_thread")]
async fn shards_split_the_fleet_by_watch_filter() {
    let env = start(200).await;
    let kubeconfig = env.control_plane.kubeconfig();
    let err = cli::fails(&[
        "controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--watch-filter=-bad",
    ]);
    assert!(err.contains("is not a label value"), "{err}");
    let shard = |value: &str| {
        let flag = format!("--watch-filter={value}");
        let mut c =
            ControllerProcess::start(&env, &[flag.as_str(), "--poll-interval=250ms"], &[]).unwrap();
        c.wait_ready(LONG).unwrap();
        c
    };
    let mut a = shard("a");
    let mut b = shard("b");
    let deployments: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    let labelled = |name: &str, shard: Option<&str>, replicas: i32| {
        let mut md = sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), replicas, "v1.30.0");
        if let Some(value) = shard {
            let label = (
                capstan_controllers::LABEL_WATCH_FILTER.to_string(),
                value.to_string(),
            );
            md.metadata
                .labels
                .get_or_insert_default()
                .insert(label.0.clone(), label.1.clone());
            md.spec.template.metadata.labels.insert(label.0, label.1);
        }
        md
    };
    for md in [
        labelled("pool-a", Some("a"), 2),
        labelled("pool-b", Some("b"), 1),
        labelled("nobodys", None, 1),
    ] {
        deployments
            .create(&PostParams::default(), &md)
            .await
            .unwrap();
    }
    env.wait_rolled_out(NS, "pool-a", LONG).await;
    env.wait_rolled_out(NS, "pool-b", LONG).await;
    let of = async |name: &str| {
        env.machines(NS)
            .await
            .into_iter()
            .filter(|m| {
                m.labels()
                    .get(capstan_api::LABEL_DEPLOYMENT_NAME)
                    .map(String::as_str)
                    == Some(name)
            })
            .count()
    };
    assert_eq!((of("pool-a").await, of("pool-b").await), (2, 1));
    assert_eq!(
        of("nobodys").await,
        0,
        "no shard owns an unlabelled deployment"
    );
    let sets: Api<capstan_api::MachineSet> = Api::namespaced(env.client.clone(), NS);
    let all_sets = sets.list(&Default::default()).await.unwrap().items;
    assert!(
        all_sets.iter().all(|s| s
            .labels()
            .contains_key(capstan_controllers::LABEL_WATCH_FILTER)),
        "every set carries its shard's label"
    );

    // With shard b stopped, its deployment waits; shard a does not touch it.
    b.stop();
    patch_named(&env, "pool-b", json!({ "replicas": 2 })).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(of("pool-b").await, 1, "shard a left pool-b alone");
    let mut b = shard("b");
    env.wait_rolled_out(NS, "pool-b", LONG).await;
    assert_eq!(of("pool-b").await, 2);
    a.stop();
    b.stop();
}

async fn patch_named(env: &Env, name: &str, spec: Value) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .expect("patch machinedeployment");
}
