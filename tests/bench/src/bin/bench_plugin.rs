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
//! - `ratio_*`: the ratios of the medians above;
//! - with `--breakdown`, `breakdown_{validate,create}_wasm_<phase>_us`:
//!   where a Wasm call's time goes, the mean per call of each phase of
//!   [`capstan_runtime::profile`] (slot, store, instantiate, run, outbound,
//!   finish, total), the same for the on-caller path, next to
//!   `breakdown_create_native_us` (the native call, outbound round trip
//!   included).

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
}

const TOKEN: &str = "bench-token";

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

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    run(Args::parse()).await
}

/// Run the benchmark.
async fn run(args: Args) -> anyhow::Result<ExitCode> {
    ensure!(
        args.calls >= 10 && args.instantiations >= 10 && args.compiles >= 1,
        "use at least 10 calls and instantiations and 1 compile"
    );
    let path = match args.plugin {
        Some(p) => p,
        None => default_plugin("sim_provider")?,
    };
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    println!(
        "# capstan-bench-plugin: {} ({} bytes), {} calls per path, {} call threads",
        path.display(),
        bytes.len(),
        args.calls,
        args.call_threads
    );

    // The cloud gets a thread and executor of its own: a real cloud shares
    // no executor with its caller, and its tasks would otherwise wake on
    // the same workers as the paths measured.
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
        max_concurrent_calls: 64,
        call_threads: args.call_threads,
        ..Default::default()
    })?;
    let on_caller = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache_dir.clone()),
        max_concurrent_calls: 64,
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
        .load("bench", &bytes, Limits::default(), grants)?
        .provider()?;
    let mut inst = Vec::with_capacity(args.instantiations);
    for _ in 0..args.instantiations {
        let t = Instant::now();
        provider.instantiate_only().await?;
        inst.push(t.elapsed());
    }
    let inst = Samples(inst);
    line("instantiate_us_p50", inst.us(50));
    line("instantiate_us_p99", inst.us(99));

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
    for round in 0..rounds {
        for (op, kind) in ["validate", "create"].iter().enumerate() {
            // Distinct machine uids per path: every create launches an instance.
            let batch = |path: &str| -> Vec<Machine> {
                (0..per_round)
                    .map(|i| machine(&format!("{kind}-{path}-r{round}"), i, &endpoint))
                    .collect()
            };
            let before = rt.call_profile();
            results[op][0].extend(wasm_calls(&provider, kind, &batch("wasm")).await?);
            profiles[op][0] = profiles[op][0] + rt.call_profile().since(&before);
            results[op][1].extend(native_calls(&native, kind, &batch("native")).await?);
            if *kind == "create" {
                hyper_create.extend(native_hyper_creates(&native_hyper, &batch("hyper")).await?);
            }
            results[op][2].extend(webhook_calls(&agent, &url, kind, &batch("webhook")).await?);
            let before = on_caller.call_profile();
            let machines = batch("wasm-on-caller");
            results[op][3].extend(wasm_calls(&provider_on_caller, kind, &machines).await?);
            profiles[op][1] = profiles[op][1] + on_caller.call_profile().since(&before);
        }
    }
    let hyper_create = Samples(hyper_create);
    line("create_native_hyper_us_p50", hyper_create.us(50));
    line("create_native_hyper_us_p99", hyper_create.us(99));
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
        for (path, s) in paths {
            line(&format!("{kind}_{path}_us_p50"), s.us(50));
            line(&format!("{kind}_{path}_us_p99"), s.us(99));
        }
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
        }
    }
    if args.breakdown {
        for (op, kind) in ["validate", "create"].iter().enumerate() {
            for (variant, path) in ["wasm", "wasm_on_caller"].iter().enumerate() {
                let p = &profiles[op][variant];
                for (phase, us) in p.mean_us() {
                    line(&format!("breakdown_{kind}_{path}_{phase}_us"), us);
                }
                line(
                    &format!("breakdown_{kind}_{path}_requests_per_call"),
                    p.requests as f64 / p.calls.max(1) as f64,
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
    Ok(ExitCode::SUCCESS)
}

async fn wasm_calls(
    provider: &ProviderPlugin,
    kind: &str,
    machines: &[Machine],
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(machines.len());
    for m in machines {
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
