//! `capstan controller`: run the Plugin, Machine, MachineSet and
//! MachineDeployment controllers against a Kubernetes API, with Prometheus
//! metrics, `/healthz` and `/readyz`, until SIGINT or SIGTERM.

use anyhow::Context as _;
use capstan_controllers::{Concurrency, Metrics, Options, Providers};
use capstan_runtime::{Runtime, RuntimeConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `capstan controller`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address for `/metrics` (Prometheus text format).
    #[arg(long, env = "CAPSTAN_METRICS_ADDR", default_value = "127.0.0.1:9090")]
    pub metrics_addr: SocketAddr,
    /// Address for `/healthz` and `/readyz` (may equal --metrics-addr).
    #[arg(long, env = "CAPSTAN_HEALTH_ADDR", default_value = "127.0.0.1:9091")]
    pub health_addr: SocketAddr,
    /// Concurrent reconciles of the Machine controller (each may call a plugin).
    #[arg(long, env = "CAPSTAN_MACHINE_CONCURRENCY", default_value_t = 32)]
    pub machine_concurrency: u16,
    /// Concurrent reconciles of the MachineSet controller.
    #[arg(long, env = "CAPSTAN_MACHINESET_CONCURRENCY", default_value_t = 8)]
    pub machineset_concurrency: u16,
    /// Concurrent reconciles of the MachineDeployment controller.
    #[arg(
        long,
        env = "CAPSTAN_MACHINEDEPLOYMENT_CONCURRENCY",
        default_value_t = 4
    )]
    pub machinedeployment_concurrency: u16,
    /// Concurrent plugin loads (each compiles a component on a cache miss).
    #[arg(long, env = "CAPSTAN_PLUGIN_CONCURRENCY", default_value_t = 2)]
    pub plugin_concurrency: u16,
    /// How often a booting or deleting instance is polled, e.g. `1s`, `500ms`.
    #[arg(long, env = "CAPSTAN_POLL_INTERVAL", default_value = "1s", value_parser = crate::options::parse_duration)]
    pub poll_interval: Duration,
    /// How often an idle object is re-checked (it makes no writes unless something changed).
    #[arg(long, env = "CAPSTAN_RESYNC", default_value = "10m", value_parser = crate::options::parse_duration)]
    pub resync: Duration,
    /// Directory for precompiled plugin code (default: ~/.cache/capstan/code).
    #[arg(long, env = "CAPSTAN_CODE_CACHE")]
    pub code_cache: Option<PathBuf>,
    /// Trust policy for `oci://` plugin sources: per-prefix allOf/anyOf
    /// rules over named public keys. A Plugin's own spec.verification applies
    /// too; an `oci://` source needs at least one of them.
    #[arg(long, env = "CAPSTAN_TRUST_POLICY", value_name = "FILE")]
    pub trust_policy: Option<PathBuf>,
    #[command(flatten)]
    pub registry: crate::supply::RegistryArgs,
    /// Benchmarks only: also serve machines whose `provider.plugin` is NAME
    /// with the sim-provider logic compiled natively (no sandbox), for
    /// Wasm-versus-native comparisons. Its bearer token comes from
    /// $CAPSTAN_NATIVE_SIM_TOKEN.
    #[arg(long, value_name = "NAME")]
    pub native_sim_provider: Option<String>,
}

impl Args {
    /// The controllers' options from the flags (reads the trust policy,
    /// mirror configuration and registry credentials now, so a bad file
    /// fails at startup).
    pub fn options(&self) -> anyhow::Result<Options> {
        let policy = match &self.trust_policy {
            Some(path) => Some(capstan_registry::policy::TrustPolicy::load(path)?),
            None => None,
        };
        let supply = capstan_controllers::plugin::Supply {
            puller: self.registry.puller()?,
            policy,
        };
        Ok(Options {
            concurrency: Concurrency {
                plugins: self.plugin_concurrency.max(1),
                machines: self.machine_concurrency.max(1),
                machine_sets: self.machineset_concurrency.max(1),
                deployments: self.machinedeployment_concurrency.max(1),
            },
            resync: self.resync,
            poll: self.poll_interval,
            supply: Some(std::sync::Arc::new(supply)),
        })
    }
}

/// A client from an explicit kubeconfig, or the usual inference.
pub async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config(kubeconfig).await?).context("cannot build a Kubernetes client")
}

/// How to reach the API server: an explicit kubeconfig, or the usual inference.
pub async fn config(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {} is not usable", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration found: pass --kubeconfig or set KUBECONFIG")?,
    })
}

/// The default code cache directory.
pub fn default_code_cache() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("capstan").join("code")
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down: finishing in-flight reconciles");
}

/// Run until a signal.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = config(args.kubeconfig.as_ref()).await?;
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(args.code_cache.clone().unwrap_or_else(default_code_cache)),
        ..RuntimeConfig::default()
    })
    .context("cannot start the plugin runtime")?;
    let metrics = Metrics::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {}", args.metrics_addr))?;
    let servers = tokio::spawn(capstan_controllers::metrics::serve(
        metrics_listener,
        metrics.clone(),
        stopped(),
    ));
    let health = if args.health_addr != args.metrics_addr {
        let listener = tokio::net::TcpListener::bind(args.health_addr)
            .await
            .with_context(|| format!("cannot listen on --health-addr {}", args.health_addr))?;
        Some(tokio::spawn(capstan_controllers::metrics::serve(
            listener,
            metrics.clone(),
            stopped(),
        )))
    } else {
        None
    };
    eprintln!(
        "capstan controller: metrics on http://{}/metrics, health on http://{}/healthz",
        args.metrics_addr, args.health_addr
    );
    let signal = async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    let providers = Providers::default();
    if let Some(name) = &args.native_sim_provider {
        let token = std::env::var("CAPSTAN_NATIVE_SIM_TOKEN").ok();
        providers.insert(
            name,
            capstan_controllers::Registered {
                provider: std::sync::Arc::new(crate::native::NativeSimProvider::new(token)),
                generation: None,
            },
        );
    }
    let result = capstan_controllers::run(
        config,
        Some(runtime),
        providers,
        metrics,
        args.options()?,
        signal,
    )
    .await;
    servers.abort();
    if let Some(h) = health {
        h.abort();
    }
    result?;
    Ok(ExitCode::SUCCESS)
}
