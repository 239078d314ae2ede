//! `capstan-bench-plugin`: what the plugin runtime costs, measured side by
//! side in one run and printed as `name value` lines (`#` lines are comments).
//! A benchmark, not part of the product (the `capstan` binary carries none).
//!
//! - `compile_ms`: load a component with an empty code cache (compile);
//! - `load_precompiled_ms`: load it again from the code cache;
//! - `instantiate_us_*`: a fresh store and instance, no call;
//! - `validate_*_us_*`: a pure call (no I/O): Wasm, native in-process, HTTPS webhook;
//! - `create_*_us_*`: `create` against the simulated cloud on loopback, the
//!   same three ways; every path keeps its connections alive (the runtime
//!   pools the plugins' outbound connections, as native clients do); the
//!   cloud runs on a thread and executor of its own, as a remote cloud
//!   shares nothing with its caller;
//! - `create_native_hyper_*`: the native logic again, its request sent
//!   through the sandbox's HTTP stack alone (hyper-util's pooled client on
//!   a current-thread executor, as on a call thread, on a thread of its
//!   own): what of the Wasm path's `outbound` is that stack and its
//!   wake-ups rather than the sandbox;
//! - `*_wasm_on_caller_*`: the Wasm path again with no call threads
//!   (`RuntimeConfig::call_threads` 0: calls run on the caller's
//!   multi-thread executor, as before call threads), to show what they save;
//! - `{validate,create}_<path>_cpu_us`: CPU per call of each path, the
//!   whole process's CPU clock over the path's calls less the simulated
//!   cloud's thread (a remote cloud's CPU is not the caller's): the
//!   caller, call threads, the webhook's server, every wake-up between;
//! - `ratio_*`: the ratios of the medians above, and `ratio_*_cpu_*` of
//!   the CPU per call;
//! - the whole run again pinned to one CPU (`taskset -c 0`, its lines
//!   prefixed `pinned_`), unless `--unpinned-only`: on one CPU a wake-up
//!   is a context switch, not another CPU leaving its halt, so the pinned
//!   figures are what the calls themselves cost;
//! - with `--breakdown`, `breakdown_{validate,create}_wasm_<phase>_us`:
//!   where a Wasm call's time goes, the mean per call of each phase of
//!   [`capstan_runtime::profile`] (slot, store, instantiate, run, outbound,
//!   finish, total), the same for the on-caller path, next to
//!   `breakdown_create_native_us` (the native call, outbound round trip
//!   included).
//! - with `--languages` (instead of the above): the same plugins written in
//!   Rust, Python and JavaScript side by side (`capstan_bench::languages`):
//!   `lang_{rust,python}_*` for the sim providers, `lang_{rust,js}_addon_*`
//!   for the node-exporter addons, and `lang_ratio_*_vs_*_*`.

use anyhow::{Context, ensure};
use capstan_bench::webhook::{Webhook, WebhookRequest, call_webhook};
use capstan_bench::{HyperHttp, NativeHttp, native_create, native_validate};
use capstan_runtime::types::Machine;
use capstan_runtime::{
    CallProfile, Credential, Grants, Limits, ProviderPlugin, Runtime, RuntimeConfig,
};
use capstan_sim_cloud::{SimCloud, SimCloudConfig};
use clap::Parser;
use sim_provider::SimProvider;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What the plugin runtime costs, side by side with the same logic called
/// natively and as an HTTPS webhook.
#[derive(Debug, Parser)]
#[command(name = "capstan-bench-plugin")]
pub struct Args {
    /// The sim-provider component (default: the one built by scripts/build-plugins.sh).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Calls measured per path (Wasm, native, webhook), for validate and create.
    #[arg(long, default_value_t = 900)]
    pub calls: usize,
    /// Instantiations measured.
    #[arg(long, default_value_t = 2000)]
    pub instantiations: usize,
    /// Compilations measured (each in a fresh engine).
    #[arg(long, default_value_t = 3)]
    pub compiles: usize,
    /// Also print where a Wasm call's time goes, phase by phase (means).
    #[arg(long)]
    pub breakdown: bool,
    /// Call threads of the measured runtime (default: one per core).
    #[arg(long, default_value_t = capstan_runtime::default_call_threads())]
    pub call_threads: usize,
    /// Calls the measured runtimes run at once (`capstan controller
    /// --max-concurrent-calls`); the instance pool is sized from it.
    #[arg(long, default_value_t = 64)]
    pub max_concurrent_calls: u32,
    /// Busy time before each measured call, in µs, on every path alike:
    /// the caller spins (its CPU counted apart), as a controller does other
    /// work between plugin calls; meanwhile the runtime makes the next
    /// instance ready on a call thread. 0 measures calls back to back.
    #[arg(long, default_value_t = 300)]
    pub gap_us: u64,
    /// Skip the second run pinned to one CPU.
    #[arg(long)]
    pub unpinned_only: bool,
    /// Instead: compare the same plugins written in Rust, Python and
    /// JavaScript (built by scripts/build-plugins.sh and
    /// scripts/build-polyglot-plugins.sh), `--calls` calls each.
    #[arg(long)]
    pub languages: bool,
    /// Internal (what `--breakdown` runs under `strace -c`): only warm up,
    /// then make `--probe-calls` calls of this kind (`validate` or
    /// `create`) and print the minor faults and memory grows they caused.
    #[arg(long, hide = true)]
    pub probe: Option<String>,
    /// Internal: the calls `--probe` makes after its warm-up.
    #[arg(long, hide = true, default_value_t = 0)]
    pub probe_calls: usize,
}

const TOKEN: &str = "bench-token";

/// `--gap-us`, set once at start.
static GAP: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
/// CPU spent in gaps so far, in ns: not the calls', so [`CpuMeter`]
/// leaves it out.
static GAP_CPU_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Be busy elsewhere for the gap before a measured call: spin, as a
/// controller's thread does its other work between calls (a sleep would
/// also measure this host's wake-up from an idle vCPU, which every path
/// pays alike). Its CPU is counted apart.
fn pause_blocking() {
    let gap = GAP.get().copied().unwrap_or_default();
    if gap.is_zero() {
        return;
    }
    let (cpu, started) = (thread_cpu(), Instant::now());
    while started.elapsed() < gap {
        std::hint::spin_loop();
    }
    let spent = thread_cpu().saturating_sub(cpu);
    GAP_CPU_NS.fetch_add(
        spent.as_nanos() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// [`pause_blocking`] on an executor thread: first one turn for what the
/// executor has queued (the last call's release and the next instance,
/// which run after a call's result, as they do while a controller's task
/// awaits), then the same busy wait.
async fn pause() {
    if GAP.get().is_none_or(|g| g.is_zero()) {
        return;
    }
    tokio::task::yield_now().await;
    pause_blocking();
}

struct Samples(Vec<Duration>);

impl Samples {
    fn percentile(&self, p: usize) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[(v.len() * p / 100).min(v.len() - 1)]
    }
    fn us(&self, p: usize) -> f64 {
        self.percentile(p).as_secs_f64() * 1e6
    }
    fn mean_us(&self) -> f64 {
        self.0.iter().sum::<Duration>().as_secs_f64() * 1e6 / self.0.len().max(1) as f64
    }
}

fn line(name: &str, value: f64) {
    println!("{name} {value:.3}");
}

fn machine(prefix: &str, i: usize, endpoint: &str) -> Machine {
    Machine {
        name: format!("{prefix}-{i}"),
        namespace: "bench".into(),
        uid: format!("{prefix}-uid-{i}"),
        cluster_name: None,
        labels: vec![],
        version: Some("v1.30.0".into()),
        failure_domain: None,
        provider_config: serde_json::json!({ "endpoint": endpoint }).to_string(),
        infrastructure_config: None,
        provider_id: None,
    }
}

fn sdk_machine(m: &Machine) -> capstan_sdk::Machine {
    capstan_sdk::Machine {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        cluster_name: None,
        labels: vec![],
        version: m.version.clone(),
        failure_domain: None,
        provider_config: m.provider_config.clone(),
        infrastructure_config: None,
        provider_id: None,
    }
}

fn webhook_request(m: &Machine) -> WebhookRequest {
    WebhookRequest {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        version: m.version.clone(),
        provider_config: m.provider_config.clone(),
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    // As `capstan controller` starts.
    capstan_runtime::keep_allocator_headroom();
    let _ = GAP.set(Duration::from_micros(args.gap_us));
    let unpinned_only = args.unpinned_only;
    // One worker: the caller's executor turn between calls (`pause`) then
    // wakes no idle worker, whose wake-up on this kind of host would be
    // counted as the calls' CPU. Calls still run on the call threads, the
    // webhook's client on a blocking thread. The measuring task runs on
    // that worker, as `capstan controller` runs its controllers: from the
    // thread blocking on the runtime, every task a call spawns (its
    // instance's release, the next ready instance) would wake the worker.
    let code = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(async { tokio::spawn(run(args)).await })??;
    if unpinned_only {
        return Ok(code);
    }
    run_pinned()
}

/// Run this benchmark again pinned to CPU 0 (every thread: the affinity is
/// set before the process starts any), printing its lines prefixed
/// `pinned_`.
fn run_pinned() -> anyhow::Result<ExitCode> {
    use std::io::BufRead as _;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new("taskset")
        .args(["-c", "0"])
        .arg(&exe)
        .args(std::env::args_os().skip(1))
        .arg("--unpinned-only")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run taskset (util-linux) to pin the second run to one CPU")?;
    let out = child.stdout.take().context("the pinned run's output")?;
    for l in std::io::BufReader::new(out).lines() {
        let l = l?;
        match l.strip_prefix("# ") {
            Some(comment) => println!("# pinned to CPU 0: {comment}"),
            None => println!("pinned_{l}"),
        }
    }
    let status = child.wait()?;
    ensure!(status.success(), "the pinned run failed: {status}");
    Ok(ExitCode::SUCCESS)
}

/// CPU time spent so far by this whole process (every thread, exited ones
/// included) less the simulated cloud's worker thread.
struct CpuMeter {
    cloud: tokio::runtime::Handle,
}

impl CpuMeter {
    async fn now(&self) -> anyhow::Result<Duration> {
        let clock = |id| {
            let t = rustix::time::clock_gettime(id);
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        };
        // Read on the cloud's one worker thread: its own CPU clock.
        let cloud = self
            .cloud
            .spawn(async move { clock(rustix::time::ClockId::ThreadCPUTime) })
            .await?;
        let gaps = Duration::from_nanos(GAP_CPU_NS.load(std::sync::atomic::Ordering::Relaxed));
        Ok(clock(rustix::time::ClockId::ProcessCPUTime)
            .saturating_sub(cloud)
            .saturating_sub(gaps))
    }

    /// Run `calls`; what they returned and the CPU they took.
    async fn measure<T>(
        &self,
        calls: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(T, Duration)> {
        let before = self.now().await?;
        let out = calls.await?;
        Ok((out, self.now().await?.saturating_sub(before)))
    }
}

/// Run the benchmark.
async fn run(args: Args) -> anyhow::Result<ExitCode> {
    ensure!(
        args.calls >= 10 && args.instantiations >= 10 && args.compiles >= 1,
        "use at least 10 calls and instantiations and 1 compile"
    );
    if args.languages {
        return languages(args.calls).await;
    }
    let path = match args.plugin.clone() {
        Some(p) => p,
        None => default_plugin("sim_provider")?,
    };
    if let Some(kind) = &args.probe {
        return probe(&args, &path, kind).await;
    }
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    println!(
        "# capstan-bench-plugin: {} ({} bytes), {} calls per path, {} call threads",
        path.display(),
        bytes.len(),
        args.calls,
        args.call_threads
    );
    println!(
        "# host: {} cores; virtualization on the kernel command line: {}",
        capstan_runtime::default_call_threads(),
        capstan_bench::syscalls::virtualization_flags()
    );

    let (cloud_executor, cloud, grants) = start_cloud().await?;

    // Compile vs cached load.
    let mut compiles = Vec::new();
    for _ in 0..args.compiles {
        let rt = Runtime::new(RuntimeConfig {
            max_concurrent_calls: 8,
            ..Default::default()
        })?;
        let t = Instant::now();
        rt.load("bench", &bytes, Limits::default(), Grants::default())?;
        compiles.push(t.elapsed());
    }
    let cache_dir =
        std::env::temp_dir().join(format!("capstan-bench-cache-{}", std::process::id()));
    let rt = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache_dir.clone()),
        max_concurrent_calls: args.max_concurrent_calls,
        call_threads: args.call_threads,
        ..Default::default()
    })?;
    let on_caller = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache_dir.clone()),
        max_concurrent_calls: args.max_concurrent_calls,
        call_threads: 0,
        ..Default::default()
    })?;
    rt.load("bench", &bytes, Limits::default(), grants.clone())?;
    let mut loads = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        rt.load("bench", &bytes, Limits::default(), grants.clone())?;
        loads.push(t.elapsed());
    }
    let compile = Samples(compiles);
    let load = Samples(loads);
    line("compile_ms", compile.us(50) / 1e3);
    line("load_precompiled_ms", load.us(50) / 1e3);
    line(
        "ratio_compile_vs_precompiled_load",
        compile.us(50) / load.us(50),
    );

    let plugin = rt.load("bench", &bytes, Limits::default(), grants.clone())?;
    let provider = plugin.provider()?;
    let provider_on_caller = on_caller
        .load("bench", &bytes, Limits::default(), grants.clone())?
        .provider()?;
    // Instantiation as a call's caller sees it: taking the instance made
    // ready after the previous call; beside it, a runtime that keeps none
    // ready, and what a fresh instance costs on its own (the phase's mean).
    let fresh_rt = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache_dir.clone()),
        max_concurrent_calls: args.max_concurrent_calls,
        call_threads: args.call_threads,
        ready_instances: 0,
        ..Default::default()
    })?;
    let fresh = fresh_rt
        .load("bench", &bytes, Limits::default(), grants.clone())?
        .provider()?;
    let (mut inst, mut inst_fresh) = (Vec::new(), Vec::new());
    let fresh_before = fresh_rt.call_profile();
    for _ in 0..args.instantiations {
        for (handle, times) in [(&provider, &mut inst), (&fresh, &mut inst_fresh)] {
            pause().await;
            let t = Instant::now();
            handle.instantiate_only().await?;
            times.push(t.elapsed());
        }
    }
    let fresh_profile = fresh_rt.call_profile().since(&fresh_before);
    let (inst, inst_fresh) = (Samples(inst), Samples(inst_fresh));
    line("instantiate_us_p50", inst.us(50));
    line("instantiate_us_p99", inst.us(99));
    line("instantiate_fresh_us_p50", inst_fresh.us(50));
    line("instantiate_fresh_us_p99", inst_fresh.us(99));
    line(
        "instantiate_fresh_own_us",
        fresh_profile.instantiate.as_secs_f64() * 1e6 / fresh_profile.calls.max(1) as f64,
    );
    drop((fresh, fresh_rt));

    let webhook = Webhook::start(Some(TOKEN.into())).await?;
    let agent = webhook.client()?;
    let url = webhook.url();
    let native = SimProvider::with_client(NativeHttp::new(Some(TOKEN.into())));
    let native_hyper = std::sync::Arc::new(SimProvider::with_client(HyperHttp::new(Some(
        TOKEN.into(),
    ))?));
    let mut hyper_create = Vec::new();
    let endpoint = cloud.url();

    // Three interleaved rounds, so drift on a shared machine hits all paths alike.
    let rounds = 3;
    let per_round = args.calls.div_ceil(rounds);
    // Per operation: Wasm, native, webhook, Wasm on the caller's executor.
    let mut results: [[Vec<Duration>; 4]; 2] = Default::default();
    let mut profiles = [[CallProfile::default(); 2]; 2];
    // CPU per operation and path, as `results`; `hyper_cpu` for native_hyper.
    let meter = CpuMeter {
        cloud: cloud_executor.handle().clone(),
    };
    let mut cpu = [[Duration::ZERO; 4]; 2];
    let mut hyper_cpu = Duration::ZERO;
    for round in 0..rounds {
        for (op, kind) in ["validate", "create"].iter().enumerate() {
            // Distinct machine uids per path: every create launches an instance.
            let batch = |path: &str| -> Vec<Machine> {
                (0..per_round)
                    .map(|i| machine(&format!("{kind}-{path}-r{round}"), i, &endpoint))
                    .collect()
            };
            let before = rt.call_profile();
            let (times, used) = meter
                .measure(async {
                    let times = wasm_calls(&provider, kind, &batch("wasm")).await?;
                    // On call threads each call's release runs after its
                    // result; let the last one finish.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Ok(times)
                })
                .await?;
            results[op][0].extend(times);
            cpu[op][0] += used;
            profiles[op][0] = profiles[op][0] + rt.call_profile().since(&before);
            let (times, used) = meter
                .measure(native_calls(&native, kind, &batch("native")))
                .await?;
            results[op][1].extend(times);
            cpu[op][1] += used;
            if *kind == "create" {
                let (times, used) = meter
                    .measure(native_hyper_creates(&native_hyper, &batch("hyper")))
                    .await?;
                hyper_create.extend(times);
                hyper_cpu += used;
            }
            let (times, used) = meter
                .measure(webhook_calls(&agent, &url, kind, &batch("webhook")))
                .await?;
            results[op][2].extend(times);
            cpu[op][2] += used;
            let before = on_caller.call_profile();
            let machines = batch("wasm-on-caller");
            let (times, used) = meter
                .measure(wasm_calls(&provider_on_caller, kind, &machines))
                .await?;
            results[op][3].extend(times);
            cpu[op][3] += used;
            profiles[op][1] = profiles[op][1] + on_caller.call_profile().since(&before);
        }
    }
    let calls_per_path = (per_round * rounds) as f64;
    let cpu_us = |d: Duration| d.as_secs_f64() * 1e6 / calls_per_path;
    let hyper_create_cpu_us = cpu_us(hyper_cpu);
    let hyper_create = Samples(hyper_create);
    line("create_native_hyper_us_p50", hyper_create.us(50));
    line("create_native_hyper_us_p99", hyper_create.us(99));
    line("create_native_hyper_cpu_us", hyper_create_cpu_us);
    let native_create = &results[1][1];
    let native_create_mean_us = native_create.iter().sum::<Duration>().as_secs_f64() * 1e6
        / native_create.len().max(1) as f64;
    for (op, kind) in ["validate", "create"].iter().enumerate() {
        let [wasm, native, hook, caller] = std::mem::take(&mut results[op]).map(Samples);
        let paths = [
            ("wasm", &wasm),
            ("native", &native),
            ("webhook", &hook),
            ("wasm_on_caller", &caller),
        ];
        for (i, (path, s)) in paths.into_iter().enumerate() {
            line(&format!("{kind}_{path}_us_p50"), s.us(50));
            line(&format!("{kind}_{path}_us_p99"), s.us(99));
            // Beside the breakdown's means (`breakdown_*_total_us`).
            line(&format!("{kind}_{path}_us_mean"), s.mean_us());
            line(&format!("{kind}_{path}_cpu_us"), cpu_us(cpu[op][i]));
        }
        let [wasm_cpu, _, hook_cpu, _] = cpu[op].map(cpu_us);
        line(
            &format!("ratio_{kind}_cpu_wasm_vs_webhook"),
            wasm_cpu / hook_cpu,
        );
        line(
            &format!("ratio_{kind}_wasm_vs_native_p50"),
            wasm.us(50) / native.us(50),
        );
        line(
            &format!("ratio_{kind}_webhook_vs_wasm_p50"),
            hook.us(50) / wasm.us(50),
        );
        line(
            &format!("ratio_{kind}_wasm_on_caller_vs_wasm_p50"),
            caller.us(50) / wasm.us(50),
        );
        if *kind == "create" {
            line(
                "ratio_create_wasm_vs_native_hyper_p50",
                wasm.us(50) / hyper_create.us(50),
            );
            line(
                "ratio_create_cpu_wasm_vs_native_hyper",
                wasm_cpu / hyper_create_cpu_us,
            );
            // What the sandbox adds to one create over the same hyper
            // client natively: latency at p50 and CPU per call, in µs.
            line(
                "create_sandbox_overhead_us_p50",
                wasm.us(50) - hyper_create.us(50),
            );
            line(
                "create_sandbox_overhead_cpu_us",
                wasm_cpu - hyper_create_cpu_us,
            );
        }
    }
    if args.breakdown {
        for (op, kind) in ["validate", "create"].iter().enumerate() {
            for (variant, path) in ["wasm", "wasm_on_caller"].iter().enumerate() {
                let p = &profiles[op][variant];
                for (phase, us) in p.mean_us() {
                    line(&format!("breakdown_{kind}_{path}_{phase}_us"), us);
                }
                let per_call = |n: u64| n as f64 / p.calls.max(1) as f64;
                line(
                    &format!("breakdown_{kind}_{path}_requests_per_call"),
                    per_call(p.requests),
                );
                line(
                    &format!("breakdown_{kind}_{path}_memory_grows_per_call"),
                    per_call(p.memory_grows),
                );
                line(
                    &format!("breakdown_{kind}_{path}_prepared_per_call"),
                    per_call(p.prepared),
                );
                line(
                    &format!("breakdown_{kind}_{path}_inline_per_call"),
                    per_call(p.inline),
                );
            }
        }
        line("breakdown_create_native_us", native_create_mean_us);
    }
    let stats = cloud.stats();
    println!(
        "# simulated cloud: {} requests, {} instances launched",
        stats.requests, stats.instances_launched
    );
    drop(webhook);
    cloud_executor.spawn(cloud.shutdown()).await?;
    cloud_executor.shutdown_background();
    let _ = std::fs::remove_dir_all(&cache_dir);
    if args.breakdown {
        page_table_work(&args, &path)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--probe`: warm up, then make `--probe-calls` calls of `kind` and print
/// the minor faults and memory grows they caused (`probe_* value` lines).
async fn probe(args: &Args, path: &std::path::Path, kind: &str) -> anyhow::Result<ExitCode> {
    ensure!(
        kind == "validate" || kind == "create",
        "--probe takes validate or create, not {kind:?}"
    );
    let (cloud_executor, cloud, grants) = start_cloud().await?;
    let rt = Runtime::new(RuntimeConfig {
        max_concurrent_calls: args.max_concurrent_calls,
        call_threads: args.call_threads,
        ..Default::default()
    })?;
    let provider = rt.load_file(path, Limits::default(), grants)?.provider()?;
    let endpoint = cloud.url();
    let batch = |label: &str, n: usize| -> Vec<Machine> {
        (0..n).map(|i| machine(label, i, &endpoint)).collect()
    };
    wasm_calls(&provider, kind, &batch("warm", 200)).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let faults = capstan_bench::syscalls::minor_faults;
    let (faults_before, before) = (faults(), rt.call_profile());
    wasm_calls(&provider, kind, &batch("probe", args.probe_calls)).await?;
    // Each call's release runs after its result; let the last one finish.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let profile = rt.call_profile().since(&before);
    if let (Some(a), Some(b)) = (faults_before, faults()) {
        line("probe_minor_faults", b.saturating_sub(a) as f64);
    }
    line("probe_memory_grows", profile.memory_grows as f64);
    cloud_executor.spawn(cloud.shutdown()).await?;
    cloud_executor.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

/// `per_call_<kind>_<what>` lines: page-table system calls (`strace -f
/// -c`, the difference of a probe with `--calls` calls and one with none),
/// minor faults and memory grows per Wasm call, for `validate` and
/// `create`.
fn page_table_work(args: &Args, path: &std::path::Path) -> anyhow::Result<()> {
    use capstan_bench::syscalls::{PAGE_TABLE_SYSCALLS, parse_strace_summary};
    let exe = std::env::current_exe()?;
    let strace = std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !strace {
        println!(
            "# strace not found (apt-get install strace): page-table system calls per call not counted"
        );
    }
    let figures = |out: &[u8]| -> std::collections::HashMap<String, f64> {
        String::from_utf8_lossy(out)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect()
    };
    let calls = args.calls;
    for kind in ["validate", "create"] {
        let probe = |n: usize| -> anyhow::Result<(
            std::collections::HashMap<String, u64>,
            std::collections::HashMap<String, f64>,
        )> {
            let summary = tempfile::NamedTempFile::new()?;
            let mut cmd = if strace {
                let mut c = std::process::Command::new("strace");
                c.args(["-f", "-c", "-o"])
                    .arg(summary.path())
                    .arg("-e")
                    .arg(format!("trace={}", PAGE_TABLE_SYSCALLS.join(",")))
                    .arg(&exe);
                c
            } else {
                std::process::Command::new(&exe)
            };
            cmd.arg("--plugin")
                .arg(path)
                .args(["--unpinned-only", "--probe", kind])
                .arg(format!("--probe-calls={n}"))
                .arg(format!("--call-threads={}", args.call_threads))
                .arg(format!(
                    "--max-concurrent-calls={}",
                    args.max_concurrent_calls
                ));
            let out = cmd.output().context("cannot run the page-table probe")?;
            ensure!(
                out.status.success(),
                "the page-table probe failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let counts = parse_strace_summary(&std::fs::read_to_string(summary.path())?);
            Ok((counts, figures(&out.stdout)))
        };
        let (base, _) = probe(0)?;
        let (measured, probed) = probe(calls)?;
        if strace {
            for name in PAGE_TABLE_SYSCALLS {
                let get =
                    |c: &std::collections::HashMap<String, u64>| c.get(*name).copied().unwrap_or(0);
                let extra = get(&measured).saturating_sub(get(&base));
                line(
                    &format!("per_call_{kind}_{name}"),
                    extra as f64 / calls as f64,
                );
            }
        }
        for what in ["minor_faults", "memory_grows"] {
            if let Some(n) = probed.get(&format!("probe_{what}")) {
                line(&format!("per_call_{kind}_{what}"), n / calls as f64);
            }
        }
    }
    Ok(())
}

/// The simulated cloud on a thread and executor of its own (a real cloud
/// shares no executor with its caller, and its tasks would otherwise wake
/// on the same workers as the paths measured), and grants to reach it.
async fn start_cloud() -> anyhow::Result<(tokio::runtime::Runtime, SimCloud, Grants)> {
    let cloud_executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sim-cloud")
        .enable_all()
        .build()?;
    let cloud = cloud_executor
        .spawn(SimCloud::start(SimCloudConfig {
            token: Some(TOKEN.into()),
            ..Default::default()
        }))
        .await??;
    let mut grants = Grants {
        http: vec![cloud.url().parse()?],
        ..Default::default()
    };
    grants
        .credentials
        .insert("sim-cloud".into(), Credential::Bearer(TOKEN.into()));
    Ok((cloud_executor, cloud, grants))
}

/// `--languages`: every figure of `capstan_bench::languages` for the Rust,
/// Python and JavaScript plugins, then their ratios to Rust.
async fn languages(calls: usize) -> anyhow::Result<ExitCode> {
    use capstan_bench::languages::{Job, measure, ratios};
    let (cloud_executor, cloud, grants) = start_cloud().await?;
    println!("# capstan-bench-plugin --languages: {calls} calls per figure, medians");
    let mut figures = Vec::new();
    for (label, stem, job) in [
        ("rust", "sim_provider", Job::Provider),
        ("python", "sim_provider_py", Job::Provider),
        ("rust_addon", "node_exporter_addon", Job::Addon),
        ("js_addon", "node_exporter_js", Job::Addon),
    ] {
        let path = default_plugin(stem)?;
        for (name, value) in measure(label, &path, job, &grants, &cloud.url(), calls).await? {
            line(&name, value);
            figures.push((name, value));
        }
    }
    for (name, value) in ratios("python", "rust", &figures).into_iter().chain(ratios(
        "js_addon",
        "rust_addon",
        &figures,
    )) {
        line(&name, value);
    }
    cloud_executor.spawn(cloud.shutdown()).await?;
    cloud_executor.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

async fn wasm_calls(
    provider: &ProviderPlugin,
    kind: &str,
    machines: &[Machine],
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(machines.len());
    for m in machines {
        pause().await;
        let t = Instant::now();
        match kind {
            "validate" => provider.validate(&m.provider_config).await?,
            _ => {
                provider.create(m, None).await?;
            }
        }
        out.push(t.elapsed());
    }
    Ok(out)
}

async fn native_calls(
    native: &SimProvider<NativeHttp>,
    kind: &str,
    machines: &[Machine],
) -> anyhow::Result<Vec<Duration>> {
    let native = native.clone();
    let kind = kind.to_string();
    let machines: Vec<capstan_sdk::Machine> = machines.iter().map(sdk_machine).collect();
    // One blocking thread for the whole loop, so no per-call thread hop.
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(machines.len());
        for m in &machines {
            pause_blocking();
            let t = Instant::now();
            match kind.as_str() {
                "validate" => native_validate(&native, &m.provider_config),
                _ => native_create(&native, m).map(|_| ()),
            }
            .map_err(anyhow::Error::msg)?;
            out.push(t.elapsed());
        }
        Ok(out)
    })
    .await?
}

/// `create` natively over [`HyperHttp`], on a thread outside any tokio
/// context (the client drives its own current-thread executor).
async fn native_hyper_creates(
    provider: &std::sync::Arc<SimProvider<HyperHttp>>,
    machines: &[Machine],
) -> anyhow::Result<Vec<Duration>> {
    let provider = provider.clone();
    let machines: Vec<capstan_sdk::Machine> = machines.iter().map(sdk_machine).collect();
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let timed = machines
            .iter()
            .map(|m| {
                pause_blocking();
                let t = Instant::now();
                native_create(&provider, m).map_err(anyhow::Error::msg)?;
                Ok(t.elapsed())
            })
            .collect::<anyhow::Result<Vec<_>>>();
        let _ = done.send(timed);
    });
    result.await.context("the native hyper thread stopped")?
}

async fn webhook_calls(
    agent: &ureq::Agent,
    url: &str,
    kind: &str,
    machines: &[Machine],
) -> anyhow::Result<Vec<Duration>> {
    let agent = agent.clone();
    let url = url.to_string();
    let kind = kind.to_string();
    let requests: Vec<WebhookRequest> = machines.iter().map(webhook_request).collect();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(requests.len());
        for r in &requests {
            pause_blocking();
            let t = Instant::now();
            call_webhook(&agent, &url, &kind, r).map_err(anyhow::Error::msg)?;
            out.push(t.elapsed());
        }
        Ok(out)
    })
    .await?
}

/// Find a plugin built by `scripts/build-plugins.sh` (or `cargo test`):
/// `$CAPSTAN_PLUGIN_DIR`, then next to this binary's target folder, then
/// `./target/plugins/...`.
fn default_plugin(file_stem: &str) -> anyhow::Result<std::path::PathBuf> {
    let file = format!("{file_stem}.wasm");
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("CAPSTAN_PLUGIN_DIR") {
        candidates.push(std::path::PathBuf::from(dir).join(&file));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(target) = exe.parent().and_then(|p| p.parent())
    {
        candidates.push(target.join("plugins/wasm32-wasip2/release").join(&file));
    }
    candidates.push(std::path::PathBuf::from("target/plugins/wasm32-wasip2/release").join(&file));
    candidates.iter().find(|p| p.exists()).cloned().with_context(|| {
        format!(
            "cannot find {file} (looked in: {}); build the plugins with scripts/build-plugins.sh or pass --plugin PATH",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}
