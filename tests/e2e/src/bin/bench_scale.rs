//! `capstan-bench-scale`: scale a MachineDeployment from 0 to N machines
//! until all are Ready, once through the Wasm sim-provider and once through
//! the same provider logic compiled natively, each with its own controller
//! process (`capstan controller`, and `capstan-bench-controller` from
//! `tests/bench` for the native variant), side by side in one run against one local
//! control plane and simulated cloud. Prints `name value` lines (not a timed
//! test): time to all Ready, controller CPU seconds, provider calls per
//! machine and controller CPU per call (a CPU gap splits into "more calls"
//! and "dearer calls"), controller peak RSS (per shard too), the most
//! instances the cloud held (more than N: a set created twice), API
//! writes per machine (and by controller and verb, as comments), the API
//! server's CPU seconds, the time to delete them all (every instance
//! released, the deployment gone; deleted as `kubectl delete` does,
//! background propagation, unless `--delete-propagation foreground`) with
//! the writes per machine and the API server's CPU seconds that took, the Wasm/native ratio of each, and the
//! writes and the API server's and etcd's CPU during an idle period after
//! convergence. `--bootstrap` adds the Wasm run with every machine joining
//! for real (the kubeadm bootstrap plugin, a bootstrap token per machine,
//! token discovery and TLS bootstrapping, each Node writing with its own
//! certificate), printed beside the plain Wasm run (whose instances
//! register with the simulated kubelet's shared identity). `--shards K`
//! adds the Wasm run split over
//! K watch-filtered controllers, `--kube-api-qps Q/B` the Wasm run under a
//! client-side rate limit; `--svg` draws the figures against N.
//! `--clusters K` instead runs N machines in one workload cluster and then
//! over K workload clusters (`capstan_e2e::bench_clusters`).
//!
//! The simulated kubelet's heartbeats are off by default (Nodes stay as
//! registered; the node-lifecycle grace period is an hour);
//! `--heartbeat-interval-ms 10000` renews every Node's Lease every 10 s as a
//! real kubelet does, with Kubernetes' default 40 s grace period, to show
//! what heartbeats of N Nodes cost the API server.

use anyhow::{Context, bail};
use capstan_api::MachineDeployment;
use capstan_e2e::bench_clusters::{cpu_seconds, peak_rss_mib};
use capstan_e2e::control_plane::ControlPlaneOptions;
use capstan_e2e::env::{
    CLOUD_TOKEN, ControllerProcess, Env, EnvOptions, SIM_PLUGIN, capstan_bin, sample_deployment,
};
use capstan_e2e::plot::{Panel, svg};
use capstan_e2e::sim_cloud::{Faults, KubeletConfig};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: capstan-bench-scale [--machines N[,N...]] [--idle-seconds S] [--boot-latency-ms MS] [--heartbeat-interval-ms MS] [--shards K] [--python] [--no-native] [--sharded-only] [--kube-api-qps Q/B] [--delete-propagation background|foreground] [--svg PATH]
  --machines N[,N...]       machines to scale to (default 1000); several sizes run one after another
  --kube-api-qps Q/B        also run the Wasm variant with the controller limited to Q requests per second
                            and bursts of B (its --kube-api-qps and --kube-api-burst; default: not run)
  --bootstrap               also run the Wasm variant with the kubeadm bootstrap plugin: machines join by token
                            discovery and TLS bootstrapping, each Node with its own client certificate
  --shards K                also run the Wasm variant as K controllers with --watch-filter, each owning a labelled
                            deployment with its share of the machines (default 1: not run)
  --python                  also run the sim provider written in Python (sim_provider_py.wasm, built by
                            scripts/build-polyglot-plugins.sh) beside the Rust one
  --no-native               skip the native variant (for large sharded runs); its figures and ratios are not printed
  --sharded-only            run only the --shards K variant (K at least 2), without ratios to the other runs
  --delete-propagation P    how the deployments are deleted at the end: background (default, as kubectl
                            does) or foreground (the garbage collector deletes the sets and machines too)
  --svg PATH                also write time to Ready, controller CPU and writes per machine against N as an SVG chart
  --idle-seconds S          idle period after convergence in which writes and CPU are counted (default 60)
  --boot-latency-ms MS      simulated instance boot time (default 1000)
  --heartbeat-interval-ms MS  the simulated kubelet renews each Node's Lease this often (default 0: off)
  --clusters K              instead: N machines in one workload cluster, then spread over K workload clusters
                            (each a real API server on the management cluster's etcd; machines join their own),
                            printing controller CPU and RSS per cluster, connections and watches per cluster,
                            and time to Ready side by side";

/// The Plugin of `--python` runs: the sim provider in Python.
const PYTHON_PLUGIN: &str = "sim-py";

/// The kubeadm bootstrap Plugin of `--bootstrap` runs.
const BOOTSTRAP_PLUGIN: &str = "kubeadm-bootstrap";

struct Args {
    machines: Vec<i32>,
    svg: Option<std::path::PathBuf>,
    shards: i32,
    /// `--kube-api-qps` and `--kube-api-burst` of the rate-limited run.
    rate: Option<(f64, u32)>,
    idle: Duration,
    boot_latency_ms: u64,
    heartbeat_interval_ms: u64,
    foreground: bool,
    bootstrap: bool,
    native: bool,
    /// `--clusters K` (0: not that benchmark).
    clusters: usize,
    sharded_only: bool,
    python: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        machines: vec![1000],
        svg: None,
        shards: 1,
        rate: None,
        idle: Duration::from_secs(60),
        boot_latency_ms: 1000,
        heartbeat_interval_ms: 0,
        foreground: false,
        bootstrap: false,
        native: true,
        clusters: 0,
        sharded_only: false,
        python: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| -> anyhow::Result<u64> {
            let v = it
                .next()
                .with_context(|| format!("{flag} needs a number"))?;
            v.parse()
                .with_context(|| format!("{flag} {v:?} is not a number"))
        };
        match arg.as_str() {
            "--machines" => {
                let list = it.next().context("--machines needs a number or a list")?;
                args.machines = list
                    .split(',')
                    .map(|n| {
                        n.trim()
                            .parse::<i32>()
                            .ok()
                            .filter(|n| *n > 0)
                            .with_context(|| {
                                format!("--machines {list:?}: {n:?} is not a positive number")
                            })
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            "--shards" => {
                args.shards = i32::try_from(value("--shards")?)?;
                anyhow::ensure!(args.shards >= 1, "--shards must be 1 or more");
            }
            "--kube-api-qps" => {
                let v = it.next().context("--kube-api-qps needs Q/B, e.g. 50/100")?;
                let parsed = v.split_once('/').and_then(|(q, b)| {
                    let q: f64 = q.trim().parse().ok().filter(|q: &f64| *q > 0.0)?;
                    let b: u32 = b.trim().parse().ok().filter(|b| *b > 0)?;
                    Some((q, b))
                });
                args.rate = Some(parsed.with_context(|| {
                    format!("--kube-api-qps {v:?}: expected QPS/BURST, both positive, e.g. 50/100")
                })?);
            }
            "--delete-propagation" => {
                args.foreground = match it.next().as_deref() {
                    Some("background") => false,
                    Some("foreground") => true,
                    other => {
                        bail!("--delete-propagation {other:?}: expected background or foreground")
                    }
                }
            }
            "--bootstrap" => args.bootstrap = true,
            "--clusters" => args.clusters = usize::try_from(value("--clusters")?)?,
            "--no-native" => args.native = false,
            "--python" => args.python = true,
            "--sharded-only" => args.sharded_only = true,
            "--svg" => args.svg = Some(it.next().context("--svg needs a path")?.into()),
            "--idle-seconds" => args.idle = Duration::from_secs(value("--idle-seconds")?),
            "--boot-latency-ms" => args.boot_latency_ms = value("--boot-latency-ms")?,
            "--heartbeat-interval-ms" => {
                args.heartbeat_interval_ms = value("--heartbeat-interval-ms")?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    anyhow::ensure!(
        !args.sharded_only
            || (args.shards > 1 && !args.bootstrap && args.rate.is_none() && args.svg.is_none()),
        "--sharded-only needs --shards 2 or more and runs nothing else: leave out --bootstrap, --kube-api-qps and --svg"
    );
    anyhow::ensure!(
        args.native || args.svg.is_none(),
        "--svg draws Wasm against native: leave out --no-native"
    );
    Ok(args)
}

struct Figures {
    seconds_to_ready: f64,
    cpu_seconds: f64,
    peak_rss_mib: f64,
    /// Peak RSS of each controller process (one per shard).
    peak_rss_mib_each: Vec<f64>,
    /// Provider calls per machine while scaling up (every export: create,
    /// get, ...), and the controller's CPU per call: a CPU gap between the
    /// variants splits into "more calls" and "dearer calls".
    provider_calls_per_machine: f64,
    cpu_ms_per_provider_call: f64,
    /// The most instances the cloud held while scaling up: more than the
    /// fleet means a set created twice.
    most_instances: usize,
    writes_per_machine: f64,
    /// Writes per machine by `controller` and `verb`, largest first.
    writes_by_kind: Vec<(String, f64)>,
    apiserver_cpu_seconds: f64,
    seconds_to_all_deleted: f64,
    /// Controller writes per machine from the deletion request until every
    /// instance is released, and by `controller` and `verb`.
    deletion_writes_per_machine: f64,
    deletion_writes_by_kind: Vec<(String, f64)>,
    apiserver_cpu_seconds_deleting: f64,
    idle_writes: f64,
    idle_apiserver_cpu_percent: f64,
    idle_etcd_cpu_percent: f64,
    idle_kubelet_writes: u64,
}

impl Figures {
    /// The figures printed for every run and compared as ratios, named.
    fn compared(&self) -> [(&'static str, f64); 10] {
        [
            ("seconds_to_all_ready", self.seconds_to_ready),
            ("controller_cpu_seconds", self.cpu_seconds),
            (
                "provider_calls_per_machine",
                self.provider_calls_per_machine,
            ),
            (
                "controller_cpu_ms_per_provider_call",
                self.cpu_ms_per_provider_call,
            ),
            ("controller_peak_rss_mib", self.peak_rss_mib),
            ("api_writes_per_machine", self.writes_per_machine),
            ("apiserver_cpu_seconds", self.apiserver_cpu_seconds),
            ("seconds_to_all_deleted", self.seconds_to_all_deleted),
            (
                "api_writes_per_machine_deleting",
                self.deletion_writes_per_machine,
            ),
            (
                "apiserver_cpu_seconds_deleting",
                self.apiserver_cpu_seconds_deleting,
            ),
        ]
    }
}

/// CPU seconds of a control-plane process.
fn plane_cpu(env: &Env, name: &str) -> anyhow::Result<f64> {
    let pid = env
        .control_plane
        .pid(name)
        .with_context(|| format!("no {name} process"))?;
    cpu_seconds(pid)
}

/// Writes the simulated kubelet made so far (Lease renewals and status posts).
fn kubelet_writes(env: &Env) -> u64 {
    let s = env.cloud.stats();
    s.lease_renewals + s.node_status_posts
}

/// Events recorded so far, by `reason` (a repeated Event counts each time).
async fn event_reasons(env: &Env) -> anyhow::Result<std::collections::BTreeMap<String, i64>> {
    let events = Api::<k8s_openapi::api::core::v1::Event>::all(env.client.clone())
        .list(&Default::default())
        .await?;
    let mut by_reason = std::collections::BTreeMap::new();
    for e in events.items {
        let reason = e.reason.unwrap_or_default();
        *by_reason.entry(reason).or_insert(0) += i64::from(e.count.unwrap_or(1).max(1));
    }
    Ok(by_reason)
}

/// Start the controller of one variant; `watch_filter` makes it a shard.
fn start_controller(
    env: &Env,
    variant: &str,
    plugin: &str,
    watch_filter: Option<&str>,
    rate: Option<(f64, u32)>,
) -> anyhow::Result<ControllerProcess> {
    let mut controller = if variant == "native" {
        // The native comparison point is its own binary, so the product's
        // `capstan controller` has no benchmark flags.
        let program = capstan_bin()
            .map_err(anyhow::Error::msg)?
            .with_file_name("capstan-bench-controller");
        if !program.exists() {
            build_bench_controller(&program)?;
        }
        ControllerProcess::start_program(
            &program,
            &[],
            &env.control_plane.kubeconfig(),
            &[
                "--native-sim-provider",
                plugin,
                "--machine-concurrency=64",
                "--poll-interval-ms=1000",
                // Running instances are checked every 5 s, so the idle
                // window counts those checks (they must write nothing).
                "--instance-check-ms=5000",
            ],
            &[("CAPSTAN_NATIVE_SIM_TOKEN", CLOUD_TOKEN)],
        )
    } else {
        let mut flags: Vec<String> = [
            "--machine-concurrency=64",
            "--poll-interval=1s",
            "--instance-check-interval=5s",
        ]
        .map(String::from)
        .into();
        flags.extend(watch_filter.map(|v| format!("--watch-filter={v}")));
        if let Some((qps, burst)) = rate {
            flags.push(format!("--kube-api-qps={qps}"));
            flags.push(format!("--kube-api-burst={burst}"));
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        ControllerProcess::start(env, &flags, &[])
    }
    .map_err(anyhow::Error::msg)?;
    controller
        .wait_ready(Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    Ok(controller)
}

/// The controllers of one run, read together: CPU and writes summed, the
/// largest peak RSS.
struct Controllers(Vec<ControllerProcess>);

impl Controllers {
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        self.0.iter().map(|c| cpu_seconds(c.pid())).sum()
    }
    fn peak_rss_mib_each(&self) -> anyhow::Result<Vec<f64>> {
        self.0.iter().map(|c| peak_rss_mib(c.pid())).collect()
    }
    /// Provider calls so far, every export and result.
    fn provider_calls(&self) -> anyhow::Result<f64> {
        self.0
            .iter()
            .map(|c| {
                c.metric_sum("capstan_plugin_call_duration_seconds_count")
                    .map_err(anyhow::Error::msg)
            })
            .sum()
    }
    fn writes(&self) -> anyhow::Result<f64> {
        self.0
            .iter()
            .map(|c| {
                c.metric_sum("capstan_api_writes_total")
                    .map_err(anyhow::Error::msg)
            })
            .sum()
    }
    /// Writes by `controller` and `verb`, summed over the processes.
    fn writes_by_kind(&self) -> anyhow::Result<Vec<(String, f64)>> {
        let mut out: Vec<(String, f64)> = vec![];
        for c in &self.0 {
            for (labels, v) in c
                .metric_samples("capstan_api_writes_total")
                .map_err(anyhow::Error::msg)?
            {
                match out.iter_mut().find(|(l, _)| *l == labels) {
                    Some((_, sum)) => *sum += v,
                    None => out.push((labels, v)),
                }
            }
        }
        Ok(out)
    }
    /// Writes per machine by `controller` and `verb` since `before` (a
    /// [`Controllers::writes_by_kind`] reading), largest first.
    fn writes_by_kind_since(
        &self,
        before: &[(String, f64)],
        per_machine: f64,
    ) -> anyhow::Result<Vec<(String, f64)>> {
        let mut since: Vec<(String, f64)> = self
            .writes_by_kind()?
            .into_iter()
            .map(|(labels, after)| {
                let was = before
                    .iter()
                    .find(|(l, _)| *l == labels)
                    .map_or(0.0, |(_, v)| *v);
                (labels, (after - was) / per_machine)
            })
            .filter(|(_, v)| *v > 0.0)
            .collect();
        since.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(since)
    }
    fn logs(&self) -> String {
        let logs: Vec<String> = self.0.iter().map(|c| c.log.display().to_string()).collect();
        logs.join(", ")
    }
}

/// Scale `machines` up through `shards` controllers (one: no watch
/// filter; more: each owns a deployment labelled with its filter and its
/// share of the machines), each limited to `rate` (QPS, burst) when given;
/// measure, idle, delete.
async fn run_variant(
    env: &Env,
    args: &Args,
    machines: i32,
    (variant, plugin): (&str, &str),
    shards: i32,
    rate: Option<(f64, u32)>,
    bootstrap: bool,
) -> anyhow::Result<Figures> {
    let mut label = variant.to_string();
    if bootstrap {
        label += ", bootstrap";
    }
    if shards > 1 {
        label += &format!(", {shards} shards");
    }
    if let Some((qps, burst)) = rate {
        label += &format!(", {qps}/{burst} QPS");
    }
    let filter = |shard: i32| (shards > 1).then(|| format!("shard-{shard}"));
    let mut controllers = vec![];
    for shard in 0..shards {
        controllers.push(start_controller(
            env,
            variant,
            plugin,
            filter(shard).as_deref(),
            rate,
        )?);
    }
    let controllers = Controllers(controllers);
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), "default");
    // Each shard's deployment and its share (the first ones take the rest).
    let mut fleet = vec![];
    for shard in 0..shards {
        let name = format!(
            "bench-{variant}-{machines}-{}{}{shard}",
            if rate.is_some() { "limited-" } else { "" },
            if bootstrap { "boot-" } else { "" }
        );
        let replicas = machines / shards + i32::from(shard < machines % shards);
        let mut md = sample_deployment(&name, plugin, &env.cloud.url(), 0, "v1.30.0");
        if bootstrap {
            md.spec.template.spec.bootstrap = Some(capstan_api::MachineBootstrap {
                plugin: Some(BOOTSTRAP_PLUGIN.into()),
                ..Default::default()
            });
        }
        if let Some(value) = filter(shard) {
            let key = capstan_controllers::LABEL_WATCH_FILTER.to_string();
            md.metadata
                .labels
                .get_or_insert_default()
                .insert(key.clone(), value.clone());
            md.spec.template.metadata.labels.insert(key, value);
        }
        mds.create(&PostParams::default(), &md).await?;
        fleet.push((name, replicas));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu_before = controllers.cpu_seconds()?;
    let apiserver_before = plane_cpu(env, "kube-apiserver")?;
    let writes_before = controllers.writes()?;
    let kinds_before = controllers.writes_by_kind()?;
    let calls_before = controllers.provider_calls()?;
    let events_before = event_reasons(env).await?;
    let mut most_instances = 0;
    eprintln!("# {label}: scaling from 0 to {machines} machines");
    let started = Instant::now();
    for (name, replicas) in &fleet {
        mds.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    }
    let mut last_print = Instant::now();
    loop {
        let (mut replicas, mut ready, mut done) = (0, 0, true);
        for (name, wanted) in &fleet {
            let status = mds.get(name).await?.status.unwrap_or_default();
            replicas += status.replicas;
            ready += status.ready_replicas;
            done &= status.ready_replicas == *wanted && status.updated_replicas == *wanted;
        }
        let instances = env.cloud.instances().len();
        most_instances = most_instances.max(instances);
        if done {
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "# {label}: {:.0}s: {replicas} machines, {ready} ready, cloud {instances} instances",
                started.elapsed().as_secs_f64(),
            );
            last_print = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!(
                "{label}: not Ready after 30 minutes (controller logs {})",
                controllers.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds_to_ready = started.elapsed().as_secs_f64();
    let cpu = controllers.cpu_seconds()? - cpu_before;
    let apiserver_cpu_seconds = plane_cpu(env, "kube-apiserver")? - apiserver_before;
    let calls = controllers.provider_calls()? - calls_before;
    let rss_each = controllers.peak_rss_mib_each()?;
    // Let the last status writes land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = controllers.writes()? - writes_before;
    let per_machine = f64::from(machines.max(1));
    let writes_by_kind = controllers.writes_by_kind_since(&kinds_before, per_machine)?;
    let events: Vec<String> = event_reasons(env)
        .await?
        .into_iter()
        .filter_map(|(reason, n)| {
            let new = n - events_before.get(&reason).copied().unwrap_or(0);
            (new > 0).then(|| format!("{reason} {:.2}", new as f64 / per_machine))
        })
        .collect();
    eprintln!(
        "# {label}: Events per machine by reason: {}",
        events.join(", ")
    );
    eprintln!(
        "# {label}: all Ready after {seconds_to_ready:.1}s; idle for {}s",
        args.idle.as_secs()
    );
    let idle_before = controllers.writes()?;
    let (apiserver_idle, etcd_idle, kubelet_idle) = (
        plane_cpu(env, "kube-apiserver")?,
        plane_cpu(env, "etcd")?,
        kubelet_writes(env),
    );
    let idle_started = Instant::now();
    tokio::time::sleep(args.idle).await;
    let idle_writes = controllers.writes()? - idle_before;
    let idle_seconds = idle_started.elapsed().as_secs_f64();
    let idle_apiserver_cpu_percent =
        100.0 * (plane_cpu(env, "kube-apiserver")? - apiserver_idle) / idle_seconds;
    let idle_etcd_cpu_percent = 100.0 * (plane_cpu(env, "etcd")? - etcd_idle) / idle_seconds;
    let idle_kubelet_writes = kubelet_writes(env) - kubelet_idle;

    eprintln!("# {label}: deleting the fleet and waiting for every instance to be released");
    let (deletion_writes_before, deletion_kinds_before) =
        (controllers.writes()?, controllers.writes_by_kind()?);
    let apiserver_before_deleting = plane_cpu(env, "kube-apiserver")?;
    let deleting = Instant::now();
    for (name, _) in &fleet {
        let params = if args.foreground {
            DeleteParams::foreground()
        } else {
            DeleteParams::background()
        };
        mds.delete(name, &params).await?;
    }
    let mut last_print = Instant::now();
    let deadline = deleting + Duration::from_secs(900);
    // Deleted: every instance released and the deployments gone (each
    // deployment's finalizer keeps it until its sets and machines are gone).
    loop {
        let mut left = !env.cloud.instances().is_empty();
        for (name, _) in &fleet {
            left |= mds.get_opt(name).await?.is_some();
        }
        if !left {
            break;
        }
        if Instant::now() > deadline {
            bail!("{label}: instances not released after 15 minutes");
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "# {label}: deleting, {:.0}s: cloud {} instances",
                deleting.elapsed().as_secs_f64(),
                env.cloud.instances().len()
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds_to_all_deleted = deleting.elapsed().as_secs_f64();
    let apiserver_cpu_seconds_deleting =
        plane_cpu(env, "kube-apiserver")? - apiserver_before_deleting;
    let deletion_writes_per_machine =
        (controllers.writes()? - deletion_writes_before) / per_machine;
    let deletion_writes_by_kind =
        controllers.writes_by_kind_since(&deletion_kinds_before, per_machine)?;
    // A MachineSet that waited on a lagging cache says so (and did not
    // create twice): how often, as evidence of a loaded API server.
    let lagging: usize = controllers
        .0
        .iter()
        .map(|c| {
            std::fs::read_to_string(&c.log)
                .unwrap_or_default()
                .matches("the cache lags the API server")
                .count()
        })
        .sum();
    if lagging > 0 {
        eprintln!(
            "# {label}: a MachineSet waited {lagging} times for a cache lagging the API server by over a minute"
        );
    }
    for mut c in controllers.0 {
        c.stop();
    }
    Ok(Figures {
        seconds_to_ready,
        cpu_seconds: cpu,
        peak_rss_mib: rss_each.iter().copied().fold(0.0, f64::max),
        peak_rss_mib_each: rss_each,
        provider_calls_per_machine: calls / per_machine,
        cpu_ms_per_provider_call: if calls > 0.0 {
            1000.0 * cpu / calls
        } else {
            f64::NAN
        },
        most_instances,
        writes_per_machine: writes / per_machine,
        writes_by_kind,
        apiserver_cpu_seconds,
        seconds_to_all_deleted,
        deletion_writes_per_machine,
        deletion_writes_by_kind,
        apiserver_cpu_seconds_deleting,
        idle_writes,
        idle_apiserver_cpu_percent,
        idle_etcd_cpu_percent,
        idle_kubelet_writes,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    // One run, its own control planes: nothing to hand on.
    capstan_e2e::control_plane::reuse::disable();
    if args.clusters > 0 {
        for &machines in &args.machines {
            capstan_e2e::bench_clusters::bench(args.clusters, machines, args.boot_latency_ms)
                .await?;
        }
        return Ok(());
    }
    eprintln!("# starting the control plane and the simulated cloud");
    let heartbeat = Duration::from_millis(args.heartbeat_interval_ms);
    let control_plane = if heartbeat.is_zero() {
        ControlPlaneOptions::without_heartbeats()
    } else {
        // Kubernetes' own timings, stretched for slower heartbeats.
        ControlPlaneOptions {
            node_monitor_period: Duration::from_secs(5),
            node_monitor_grace_period: (heartbeat * 4).max(Duration::from_secs(40)),
            node_startup_grace_period: (heartbeat * 6).max(Duration::from_secs(60)),
            pod_toleration_seconds: 300,
            ..ControlPlaneOptions::default()
        }
    };
    let env = Env::start_with(EnvOptions {
        faults: Faults {
            boot_latency_ms: args.boot_latency_ms,
            delete_latency_ms: 200,
            ..Default::default()
        },
        kubelet: KubeletConfig {
            heartbeat_interval_ms: args.heartbeat_interval_ms,
            // Not about joining: instances register with the kubelet's identity.
            shared_identity_without_join_data: true,
            ..Default::default()
        },
        control_plane,
        real_nodes: false,
    })
    .await
    .map_err(anyhow::Error::msg)?;
    if args.bootstrap {
        let yaml = format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: Plugin\nmetadata: {{name: {BOOTSTRAP_PLUGIN}}}\nspec:\n  source: file://{}\n  allowedNamespaces: {{names: [default]}}\n",
            capstan_e2e::plugin("kubeadm_bootstrap").display()
        );
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&yaml))
            .map_err(anyhow::Error::msg)?;
        capstan_e2e::install::kubectl_apply(
            &env,
            &capstan_e2e::install::machine_bootstrappers_docs(),
        );
    }
    if args.python {
        env.create_plugin(PYTHON_PLUGIN, &capstan_e2e::plugin("sim_provider_py"))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    let mut points = vec![];
    for &machines in &args.machines {
        let wasm_plugin = ("wasm", SIM_PLUGIN);
        if args.sharded_only {
            let sharded =
                run_variant(&env, &args, machines, wasm_plugin, args.shards, None, false).await?;
            println!(
                "# capstan-bench-scale: 0 -> {machines} machines, {} shards only",
                args.shards
            );
            print_beside(&format!("wasm_{}_shards", args.shards), None, &sharded);
            continue;
        }
        let wasm = run_variant(&env, &args, machines, wasm_plugin, 1, None, false).await?;
        let native = if args.native {
            let variant = ("native", "sim-native");
            Some(run_variant(&env, &args, machines, variant, 1, None, false).await?)
        } else {
            None
        };
        print_figures(&args, machines, &wasm, native.as_ref());
        if args.python {
            let variant = ("python", PYTHON_PLUGIN);
            let python = run_variant(&env, &args, machines, variant, 1, None, false).await?;
            print_beside("python", Some(&wasm), &python);
        }
        if args.bootstrap {
            let joined = run_variant(&env, &args, machines, wasm_plugin, 1, None, true).await?;
            print_beside("wasm_bootstrap", Some(&wasm), &joined);
            for (kind, per) in &joined.writes_by_kind {
                println!("# writes per machine, wasm with bootstrap, {kind}: {per:.3}");
            }
        }
        if args.shards > 1 {
            let sharded =
                run_variant(&env, &args, machines, wasm_plugin, args.shards, None, false).await?;
            print_beside(
                &format!("wasm_{}_shards", args.shards),
                Some(&wasm),
                &sharded,
            );
        }
        if let Some((qps, burst)) = args.rate {
            let limited =
                run_variant(&env, &args, machines, wasm_plugin, 1, args.rate, false).await?;
            print_beside(
                &format!("wasm_qps_{qps}_burst_{burst}"),
                Some(&wasm),
                &limited,
            );
        }
        if let Some(native) = native {
            points.push((machines, wasm, native));
        }
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, chart(&args, &points))
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("# wrote {}", path.display());
    }
    Ok(())
}

/// Time to Ready, controller CPU and writes per machine against the fleet
/// size, Wasm and native.
fn chart(args: &Args, points: &[(i32, Figures, Figures)]) -> String {
    let panel = |title: &str, figure: fn(&Figures) -> f64| Panel {
        title: title.into(),
        series: ["wasm", "native"]
            .iter()
            .enumerate()
            .map(|(k, variant)| {
                let values = points
                    .iter()
                    .map(|(n, wasm, native)| {
                        (f64::from(*n), figure(if k == 0 { wasm } else { native }))
                    })
                    .collect();
                (variant.to_string(), values)
            })
            .collect(),
    };
    svg(
        &format!(
            "capstan-bench-scale: boot latency {} ms, 2 shared cores",
            args.boot_latency_ms
        ),
        &[
            panel("seconds to all Ready", |f| f.seconds_to_ready),
            panel("controller CPU seconds", |f| f.cpu_seconds),
            panel("API writes per machine", |f| f.writes_per_machine),
        ],
    )
}

/// The lines of a sharded or rate-limited Wasm run (`suffix` names it),
/// each with its ratio to the plain Wasm run's (`one`, when it ran).
fn print_beside(suffix: &str, one: Option<&Figures>, other: &Figures) {
    for (k, (name, s)) in other.compared().into_iter().enumerate() {
        println!("{name}_{suffix} {s:.3}");
        if let Some(one) = one {
            let o = one.compared()[k].1;
            println!(
                "ratio_{name}_{suffix}_vs_wasm {:.3}",
                if o > 0.0 { s / o } else { f64::NAN }
            );
        }
    }
    println!("idle_writes_{suffix} {}", other.idle_writes);
    println!("most_cloud_instances_{suffix} {}", other.most_instances);
    if other.peak_rss_mib_each.len() > 1 {
        for (shard, rss) in other.peak_rss_mib_each.iter().enumerate() {
            println!("controller_peak_rss_mib_{suffix}_shard_{shard} {rss:.1}");
        }
    }
}

/// The `name value` lines of one fleet size.
fn print_figures(args: &Args, machines: i32, wasm: &Figures, native: Option<&Figures>) {
    let heartbeat = Duration::from_millis(args.heartbeat_interval_ms);
    println!(
        "# capstan-bench-scale: 0 -> {} machines, boot latency {} ms, controller --machine-concurrency=64, kubelet heartbeats {}, deleted with {} propagation",
        machines,
        args.boot_latency_ms,
        if heartbeat.is_zero() {
            "off".to_string()
        } else {
            format!("every {heartbeat:?}")
        },
        if args.foreground {
            "foreground"
        } else {
            "background"
        }
    );
    for (k, (name, w)) in wasm.compared().into_iter().enumerate() {
        println!("{name}_wasm {w:.3}");
        if let Some(native) = native {
            let n = native.compared()[k].1;
            println!("{name}_native {n:.3}");
            println!(
                "ratio_{name}_wasm_vs_native {:.3}",
                if n > 0.0 { w / n } else { f64::NAN }
            );
        }
    }
    let variants: Vec<(&str, &Figures)> = std::iter::once(("wasm", wasm))
        .chain(native.map(|n| ("native", n)))
        .collect();
    let idle = args.idle.as_secs();
    for (variant, f) in &variants {
        println!("idle_{idle}s_writes_{variant} {}", f.idle_writes);
    }
    for (variant, f) in &variants {
        println!("most_cloud_instances_{variant} {}", f.most_instances);
        if f.most_instances > usize::try_from(machines).unwrap_or(0) {
            println!(
                "# {variant}: the cloud held {} instances for {machines} machines: a set created twice",
                f.most_instances
            );
        }
    }
    for (variant, f) in &variants {
        for (kind, per) in &f.writes_by_kind {
            println!("# writes per machine, {variant}, {kind}: {per:.3}");
        }
        for (kind, per) in &f.deletion_writes_by_kind {
            println!("# writes per machine deleting, {variant}, {kind}: {per:.3}");
        }
    }
    for (variant, f) in &variants {
        println!(
            "idle_{idle}s_apiserver_cpu_percent_{variant} {:.1}",
            f.idle_apiserver_cpu_percent
        );
        println!(
            "idle_{idle}s_etcd_cpu_percent_{variant} {:.1}",
            f.idle_etcd_cpu_percent
        );
        println!(
            "idle_{idle}s_kubelet_writes_{variant} {}",
            f.idle_kubelet_writes
        );
    }
}

/// Build `capstan-bench-controller` next to `capstan` (same profile) when it
/// is missing, so the benchmark runs from one command.
fn build_bench_controller(program: &std::path::Path) -> anyhow::Result<()> {
    let release = program
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|d| d == "release");
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(capstan_e2e::workspace_root()).args([
        "build",
        "-p",
        "capstan-bench",
        "--bin",
        "capstan-bench-controller",
    ]);
    if release {
        cmd.arg("--release");
    }
    if let Some(target_dir) = program.parent().and_then(|d| d.parent()) {
        cmd.arg("--target-dir").arg(target_dir);
    }
    eprintln!("# {} is missing: building it ({cmd:?})", program.display());
    let status = cmd.status()?;
    anyhow::ensure!(
        status.success() && program.exists(),
        "cannot build {}: run `cargo build{} -p capstan-bench --bins`",
        program.display(),
        if release { " --release" } else { "" }
    );
    Ok(())
}
