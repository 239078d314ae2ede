//! `capstan controller`: run the Plugin, Machine, MachineSet,
//! MachineDeployment and MachineHealthCheck controllers against a
//! Kubernetes API, with Prometheus metrics, `/healthz` and `/readyz`, and
//! optionally leader election, until SIGINT or SIGTERM. The flags map onto
//! [`capstan_controllers::serve`], which does the work.

use anyhow::Context as _;
use capstan_controllers::leader::ElectionConfig;
use capstan_controllers::{Concurrency, Options, Providers, serve};
use capstan_runtime::{Runtime, RuntimeConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Leader election flags (controller-runtime's names and defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct ElectionArgs {
    /// Run only while holding the `capstan-controller` Lease in --namespace
    /// (`capstan-controller-VALUE` with --watch-filter, one per shard), so
    /// several replicas can run and one reconciles.
    #[arg(long, env = "CAPSTAN_LEADER_ELECT")]
    pub leader_elect: bool,
    /// How long a Lease stays valid without renewal; a standby takes over
    /// after this when the leader vanishes without releasing it.
    #[arg(long, default_value = "15s", value_parser = crate::options::parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps writing after the last renewal that
    /// started and succeeded: past it every write is refused (fenced) and
    /// the replica stops. Must satisfy renew deadline + retry period <
    /// lease duration, so a write let out just before the fence has a
    /// retry period to land before any standby may take over.
    #[arg(long, default_value = "10s", value_parser = crate::options::parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and a standby retries.
    #[arg(long, default_value = "2s", value_parser = crate::options::parse_duration)]
    pub leader_elect_retry_period: Duration,
}

impl ElectionArgs {
    /// The election configuration, or why the timings do not work; each
    /// shard (`watch_filter`) has a Lease of its own.
    pub fn config(
        &self,
        namespace: &str,
        watch_filter: Option<&str>,
    ) -> anyhow::Result<Option<ElectionConfig>> {
        if !self.leader_elect {
            return Ok(None);
        }
        anyhow::ensure!(
            self.leader_elect_renew_deadline + self.leader_elect_retry_period
                < self.leader_elect_lease_duration,
            "--leader-elect-renew-deadline ({:?}) plus --leader-elect-retry-period ({:?}) must be shorter than --leader-elect-lease-duration ({:?}), so a leader's last write lands before another replica may take over",
            self.leader_elect_renew_deadline,
            self.leader_elect_retry_period,
            self.leader_elect_lease_duration
        );
        anyhow::ensure!(
            self.leader_elect_retry_period < self.leader_elect_renew_deadline,
            "--leader-elect-retry-period ({:?}) must be shorter than --leader-elect-renew-deadline ({:?})",
            self.leader_elect_retry_period,
            self.leader_elect_renew_deadline
        );
        Ok(Some(ElectionConfig {
            namespace: namespace.to_string(),
            name: watch_filter.map_or_else(|| LEASE_NAME.into(), |f| format!("{LEASE_NAME}-{f}")),
            identity: capstan_controllers::leader::default_identity(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }))
    }
}

/// The leader Lease's name.
pub const LEASE_NAME: &str = "capstan-controller";

/// Capstan's namespace when none is given.
pub const DEFAULT_NAMESPACE: &str = "capstan-system";

/// Capstan's own namespace: the flag, else the in-cluster service account's.
pub fn own_namespace(flag: Option<&str>) -> String {
    flag.map(str::to_string)
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| DEFAULT_NAMESPACE.into())
}

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
    /// Threads plugin calls run on, each with its own executor and outbound
    /// connection pool (default: one per core). A call's tasks then stay on
    /// one thread, and a busy plugin never holds up the controllers'
    /// executor (Lease renewals, watches); 0 runs calls on that executor.
    #[arg(long, env = "CAPSTAN_PLUGIN_CALL_THREADS", default_value_t = capstan_runtime::default_call_threads())]
    pub plugin_call_threads: usize,
    /// Plugin instances kept ready before their calls, over all plugin
    /// revisions: after a call, its revision's next instance is made on the
    /// same call thread, off the next caller's path. Each holds one call's
    /// room in the instance pool (on top of the call slots) and its
    /// plugin's resident memory. 0 instantiates every call when it comes.
    #[arg(long, env = "CAPSTAN_READY_INSTANCES", default_value_t = capstan_runtime::DEFAULT_READY_INSTANCES)]
    pub ready_instances: u32,
    /// How often a booting or deleting instance is polled, e.g. `1s`, `500ms`.
    #[arg(long, env = "CAPSTAN_POLL_INTERVAL", default_value = "1s", value_parser = crate::options::parse_duration)]
    pub poll_interval: Duration,
    /// How often a Running machine's instance is checked through its
    /// provider (jittered by a tenth), so one terminated out of band fails
    /// its Machine within this bound; no API write unless something changed.
    #[arg(long, env = "CAPSTAN_INSTANCE_CHECK_INTERVAL", default_value = "1m", value_parser = crate::options::parse_duration)]
    pub instance_check_interval: Duration,
    /// How often each provider Plugin lists its instances (`list-instances`)
    /// for the orphan report (`capstan machines orphans`); an instance is an
    /// orphan when two scans in a row find no Machine for it.
    #[arg(long, env = "CAPSTAN_ORPHAN_SCAN_INTERVAL", default_value = "10m", value_parser = crate::options::parse_duration)]
    pub orphan_scan_interval: Duration,
    /// Client-side limit on the controllers' Kubernetes API requests per
    /// second, as controller-runtime's `--kube-api-qps` (0: unlimited; the
    /// API server's priority and fairness still applies). Leader election's
    /// renewals are never limited.
    #[arg(long, env = "CAPSTAN_KUBE_API_QPS", default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Requests allowed at once above `--kube-api-qps` (the token bucket's
    /// size), as controller-runtime's `--kube-api-burst`.
    #[arg(long, env = "CAPSTAN_KUBE_API_BURST", default_value_t = 100)]
    pub kube_api_burst: u32,
    /// How often an idle object is re-checked (it makes no writes unless something changed).
    #[arg(long, env = "CAPSTAN_RESYNC", default_value = "10m", value_parser = crate::options::parse_duration)]
    pub resync: Duration,
    /// Directory for precompiled plugin code (default: ~/.cache/capstan/code).
    #[arg(long, env = "CAPSTAN_CODE_CACHE")]
    pub code_cache: Option<PathBuf>,
    /// Trust policy for plugin sources: allOf/anyOf rules over named public
    /// keys, per `oci://REGISTRY/PATH/` or `file:///DIR/` prefix. It is the
    /// floor: a source no rule covers is refused (NoTrustPolicy), and a
    /// Plugin's own spec.verification can only add keys to the covering rule.
    #[arg(long, env = "CAPSTAN_TRUST_POLICY", value_name = "FILE")]
    pub trust_policy: Option<PathBuf>,
    /// For development only: `file://` plugins in this directory load
    /// without signatures (repeatable, or comma-separated). Everything
    /// else must verify under --trust-policy.
    #[arg(
        long = "allow-unsigned-dir",
        env = "CAPSTAN_ALLOW_UNSIGNED_DIRS",
        value_delimiter = ',',
        value_name = "DIR"
    )]
    pub allow_unsigned_dirs: Vec<PathBuf>,
    #[command(flatten)]
    pub registry: crate::supply::RegistryArgs,
    /// Capstan's own namespace: the only one credential Secrets are read
    /// from, and where the leader Lease lives (default: $CAPSTAN_NAMESPACE,
    /// else the in-cluster service account's namespace, else capstan-system).
    #[arg(long, env = "CAPSTAN_NAMESPACE")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub election: ElectionArgs,
    /// Run as one shard of a fleet (Cluster API's flag): reconcile only the
    /// Machines, MachineSets, MachineDeployments, MachineHealthChecks and
    /// Addons labelled `cluster.x-k8s.io/watch-filter=VALUE` (label a
    /// deployment and its template; its sets and machines inherit it).
    /// Plugins are every shard's. Unset: every object.
    #[arg(long, env = "CAPSTAN_WATCH_FILTER", value_name = "VALUE")]
    pub watch_filter: Option<String>,
    /// Rewrite container images in the pod templates addons render, FROM=TO
    /// by prefix (repeatable; the first matching rule wins), e.g.
    /// `registry.k8s.io/=mirror.local/` for a disconnected site. Each Addon's
    /// status records what was rewritten.
    #[arg(
        long = "image-rewrite",
        env = "CAPSTAN_IMAGE_REWRITES",
        value_delimiter = ',',
        value_name = "FROM=TO"
    )]
    pub image_rewrites: Vec<capstan_addons::ImageRewrite>,
    /// The ServiceAccount an Addon outside Capstan's namespace is applied as
    /// when its spec.serviceAccountName is unset, in the Addon's own
    /// namespace (impersonated: its RBAC decides what the Addon may write).
    /// Unset: such an Addon is refused (ServiceAccountRequired).
    #[arg(long, env = "CAPSTAN_TENANT_SERVICE_ACCOUNT", value_name = "NAME")]
    pub tenant_service_account: Option<String>,
    /// How long a machine's bootstrap token lives
    /// (`kube-system/bootstrap-token-<id>`); it is renewed while the
    /// machine has not joined and deleted once its Node has.
    #[arg(long, env = "CAPSTAN_BOOTSTRAP_TOKEN_TTL", default_value = "15m", value_parser = crate::options::parse_duration)]
    pub bootstrap_token_ttl: std::time::Duration,
    /// How often each workload Cluster's API server is probed (and its
    /// kubeconfig Secret read again: a rotated one takes effect then).
    #[arg(long, env = "CAPSTAN_CLUSTER_PROBE_INTERVAL", default_value = "10s", value_parser = crate::options::parse_duration)]
    pub cluster_probe_interval: std::time::Duration,
    /// How long a probe (and a connection) may take.
    #[arg(long, env = "CAPSTAN_CLUSTER_PROBE_TIMEOUT", default_value = "5s", value_parser = crate::options::parse_duration)]
    pub cluster_probe_timeout: std::time::Duration,
    /// Failed probes in a row after which a workload cluster counts as
    /// unreachable (`RemoteConnectionProbe=False`; its Machines'
    /// `NodeHealthy=Unknown`; no health-check remediation in it).
    #[arg(long, env = "CAPSTAN_CLUSTER_PROBE_FAILURES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub cluster_probe_failures: u32,
    /// The groups bootstrap tokens authenticate into besides
    /// system:bootstrappers (repeatable). The default is one kubeadm does
    /// not approve: Capstan approves a machine's node certificate request
    /// only for that machine's own Node (`capstan install` lets the group
    /// request them). kubeadm's system:bootstrappers:kubeadm:default-node-token
    /// hands the requests to kubeadm's approver, which signs any Node name.
    #[arg(
        long = "bootstrap-token-group",
        env = "CAPSTAN_BOOTSTRAP_TOKEN_GROUPS",
        value_delimiter = ',',
        value_name = "GROUP",
        default_value = capstan_controllers::MACHINE_BOOTSTRAPPERS
    )]
    pub bootstrap_token_groups: Vec<String>,
}

impl Args {
    /// The controllers' options from the flags (reads the trust policy,
    /// mirror configuration and registry credentials now, so a bad file
    /// fails at startup); credential Secrets are read only from `namespace`.
    pub fn options(&self, namespace: &str) -> anyhow::Result<Options> {
        if let Some(why) = self
            .watch_filter
            .as_deref()
            .and_then(capstan_controllers::invalid_watch_filter)
        {
            anyhow::bail!(why);
        }
        anyhow::ensure!(
            self.kube_api_qps.is_finite() && self.kube_api_qps >= 0.0,
            "--kube-api-qps {} must be a number of requests per second, 0 or more (0: unlimited)",
            self.kube_api_qps
        );
        if let Some(name) = &self.tenant_service_account
            && let Err(why) = capstan_addons::identity::actor("", Some(name), true, None)
        {
            anyhow::bail!(
                "--tenant-service-account: {}",
                why.replace("spec.serviceAccountName ", "")
            );
        }
        anyhow::ensure!(
            self.bootstrap_token_ttl >= std::time::Duration::from_secs(60),
            "--bootstrap-token-ttl {:?} is too short: a machine must boot and join within it (at least 1m)",
            self.bootstrap_token_ttl
        );
        for group in &self.bootstrap_token_groups {
            let rest = group
                .strip_prefix("system:bootstrappers:")
                .unwrap_or_default();
            anyhow::ensure!(
                !rest.is_empty()
                    && !rest.ends_with(':')
                    && rest.bytes().all(|b| b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || b == b':'
                        || b == b'-'),
                "--bootstrap-token-group {group:?}: a bootstrap token's extra group must be system:bootstrappers: followed by lowercase letters, digits, ':' or '-' (as Kubernetes requires)"
            );
        }
        let policy = match &self.trust_policy {
            Some(path) => Some(capstan_registry::policy::TrustPolicy::load(path)?),
            None => None,
        };
        let mut unsigned_plugin_dirs = Vec::new();
        for dir in &self.allow_unsigned_dirs {
            let scope = capstan_registry::Scope::parse(&format!("file://{}/", dir.display()))
                .with_context(|| {
                    format!(
                        "--allow-unsigned-dir {}: give an absolute directory without '.' or '..'",
                        dir.display()
                    )
                })?;
            unsigned_plugin_dirs.push(scope);
        }
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
            instance_check: self.instance_check_interval,
            orphan_scan: self.orphan_scan_interval,
            supply: Some(std::sync::Arc::new(supply)),
            secrets_namespace: Some(namespace.to_string()),
            image_rewrites: self.image_rewrites.clone(),
            tenant_service_account: self.tenant_service_account.clone(),
            unsigned_plugin_dirs,
            // Set by `serve` when there is an election.
            write_fence: None,
            kube_api_rate: (self.kube_api_qps > 0.0)
                .then_some((self.kube_api_qps, self.kube_api_burst.max(1))),
            watch_filter: self.watch_filter.clone(),
            bootstrap_token: capstan_controllers::BootstrapTokenOptions {
                ttl: self.bootstrap_token_ttl,
                extra_groups: self.bootstrap_token_groups.clone(),
            },
            cluster_probe: capstan_kit::workload::ProbeOptions {
                interval: self.cluster_probe_interval,
                timeout: self.cluster_probe_timeout,
                failure_threshold: self.cluster_probe_failures,
                ..Default::default()
            },
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
}

/// Run until a signal (or, with leader election, until the Lease is lost:
/// then the process exits at once with status 1).
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let namespace = own_namespace(args.namespace.as_deref());
    capstan_runtime::keep_allocator_headroom();
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(
            args.code_cache
                .clone()
                .unwrap_or_else(crate::options::default_code_cache),
        ),
        call_threads: args.plugin_call_threads,
        ready_instances: args.ready_instances,
        ..RuntimeConfig::default()
    })
    .context("cannot start the plugin runtime")?;
    let process = serve::Process {
        config: config(args.kubeconfig.as_ref()).await?,
        runtime: Some(runtime),
        providers: Providers::default(),
        options: args.options(&namespace)?,
        metrics_addr: args.metrics_addr,
        health_addr: args.health_addr,
        election: args
            .election
            .config(&namespace, args.watch_filter.as_deref())?,
    };
    // On a worker thread of the runtime, not on the thread that blocks on
    // it: from there every task a reconcile spawns (an instance released
    // and the next one made ready, after each plugin call) and every I/O
    // event had to wake another thread (a futex and, on a VM, another vCPU
    // leaving its halt): a pure plugin call took 11.6 µs at p50 instead of
    // 2.4 (see docs/benchmarks.md).
    let served = match tokio::spawn(serve::serve(process, shutdown_signal())).await {
        Ok(served) => served,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => return Err(anyhow::anyhow!("the controller's task was cancelled: {e}")),
    };
    match served {
        Ok(()) => {
            tracing::info!("stopped: exiting");
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ capstan_controllers::Error::LeadershipLost(_)) => {
            // Plugin calls still running on blocking threads must not
            // finish their work: leave now, as controller-runtime does.
            eprintln!("error: {e}");
            std::process::exit(1)
        }
        Err(e) => Err(e.into()),
    }
}
