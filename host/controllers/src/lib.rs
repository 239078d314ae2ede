//! Capstan's controllers: the generic Cluster API machine lifecycle, run by
//! one host for every provider plugin.
//!
//! Start with [`run`], which starts six kube-rs controllers over shared
//! reflector caches (`capstan_kit::watch`), each with a small context of
//! its own around the shared [`capstan_kit::Kube`]:
//!
//! - [`plugin`]: loads each `Plugin`'s component into the sandbox and
//!   registers it as a provider;
//! - [`machine`]: creates, follows and deletes each `Machine`'s instance
//!   through its provider plugin;
//! - [`machineset`]: keeps a set's number of machines;
//! - [`deployment`]: rolls templates out across MachineSets;
//! - [`healthcheck`]: marks unhealthy machines for their MachineSet to
//!   replace (the Machine controller drains their Nodes first);
//! - the Addon controller, in `capstan_addons::engine` (the addon lifecycle
//!   is one crate): installs each `Addon` with its addon plugin, keeps it in
//!   shape and removes it.
//!
//! What to do next is decided by the pure functions of `capstan-planner`;
//! this crate observes, calls them, and writes only what changed (an idle
//! resync writes nothing: every status is compared before it is applied).

#![forbid(unsafe_code)]

mod capacity;
mod cluster;
mod csr;
pub mod deployment;
pub mod healthcheck;
pub mod history;
pub mod inplace;
pub mod machine;
pub mod machineset;
mod nodedrain;
pub mod plugin;
pub mod rbac;
pub mod serve;
mod set_conditions;
mod template;
mod x509;

// The shared plumbing lives in `capstan-kit` (the addon engine in
// `capstan-addons`); these names stay reachable here for the binaries and
// tests that start the controllers.
pub use capstan_kit::watch::{LABEL_WATCH_FILTER, invalid_watch_filter};
pub use capstan_kit::{
    Error, FIELD_MANAGER, MachineProvider, Metrics, ProviderError, Providers, Registered, ScopeApi,
    Stores, WasmProvider, leader, metrics, provider, ratelimit, registry,
};

use capstan_kit::Kube;
use capstan_kit::watch::Watches;
use futures::StreamExt;
use kube::runtime::events::{Recorder, Reporter};
use std::sync::Arc;
use std::time::Duration;

/// Tuning of the controllers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Concurrent reconciles per controller.
    pub concurrency: Concurrency,
    /// How often an idle object is reconciled anyway (a resync).
    pub resync: Duration,
    /// How often a machine whose instance is still booting (or deleting) is
    /// polled through its provider.
    pub poll: Duration,
    /// How often a Running machine's instance is looked at through its
    /// provider's `get` (jittered by a tenth), so an instance that vanished
    /// out of band is noticed within this bound without a Node event.
    pub instance_check: Duration,
    /// How often each provider Plugin lists its instances for the orphan
    /// report (`list-instances`; a failed scan waits as long).
    pub orphan_scan: Duration,
    /// Registry access and trust for `oci://` plugin sources (`None`: such
    /// sources are refused with a condition saying so).
    pub supply: Option<Arc<plugin::Supply>>,
    /// Capstan's own namespace: credential Secrets are read only from it, so
    /// the right to create a Plugin is not read access to every Secret, and
    /// Plugins without `allowedNamespaces` serve only objects in it
    /// (`None`: any namespace, for embedding and tests).
    pub secrets_namespace: Option<String>,
    /// Image rewrite rules applied to the pod templates addons render
    /// (`--image-rewrite registry.k8s.io/=mirror.local/`).
    pub image_rewrites: Vec<capstan_addons::ImageRewrite>,
    /// The ServiceAccount a tenant's Addon (outside `secrets_namespace`)
    /// that names none in `spec.serviceAccountName` is applied as, in its
    /// own namespace (`--tenant-service-account`; `None`: refused).
    pub tenant_service_account: Option<String>,
    /// `file://` directories whose plugins load unsigned
    /// (`--allow-unsigned-dir`, for development). Every other source is
    /// verified under the host's trust policy.
    pub unsigned_plugin_dirs: Vec<capstan_registry::Scope>,
    /// Leader election's write fence: every write of the controllers
    /// passes through it (`None`: no election, writes always leave).
    pub write_fence: Option<Arc<leader::Fence>>,
    /// Client-side limit on the controllers' API requests: `(qps, burst)`
    /// (`--kube-api-qps`, `--kube-api-burst`; `None`: unlimited, the
    /// server's priority and fairness alone).
    pub kube_api_rate: Option<(f64, u32)>,
    /// This shard's `cluster.x-k8s.io/watch-filter` label value
    /// (`--watch-filter`; `None`: every object).
    pub watch_filter: Option<String>,
    /// How machines' bootstrap tokens are minted.
    pub bootstrap_token: BootstrapTokenOptions,
    /// How workload clusters (`Cluster` objects) are probed and how long
    /// a request to one may take (Cluster API's defaults).
    pub cluster_probe: capstan_kit::workload::ProbeOptions,
}

/// The group Capstan's bootstrap tokens authenticate into by default: one
/// kubeadm's approver does not answer, so Capstan's own approver decides
/// which Node certificate a machine's token may get (its own only).
/// `capstan install` lets this group create node client CSRs.
pub const MACHINE_BOOTSTRAPPERS: &str = "system:bootstrappers:capstan:machines";

/// The ClusterRole `capstan install` makes for bootstrap data Secrets
/// (`get`, `create`); a RoleBinding of the same name in a namespace lets
/// Capstan read and write them there only (Capstan's namespace, tenant
/// namespaces and each `--machine-namespace`).
pub const MACHINE_NAMESPACE_ROLE: &str = "capstan-controller-machines";

/// How a machine's bootstrap token is minted (`kube-system/bootstrap-token-<id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapTokenOptions {
    /// How long a token lives; renewed while its machine has not joined
    /// (`--bootstrap-token-ttl`, default 15 minutes as in Cluster API).
    pub ttl: Duration,
    /// The groups the token authenticates into besides
    /// `system:bootstrappers` (`--bootstrap-token-group`, default
    /// [`MACHINE_BOOTSTRAPPERS`], whose node client CSRs Capstan answers;
    /// kubeadm's `system:bootstrappers:kubeadm:default-node-token` hands
    /// them to kubeadm's approver, which signs any Node name).
    pub extra_groups: Vec<String>,
}

impl Default for BootstrapTokenOptions {
    fn default() -> Self {
        BootstrapTokenOptions {
            ttl: Duration::from_secs(15 * 60),
            extra_groups: vec![MACHINE_BOOTSTRAPPERS.into()],
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: Concurrency::default(),
            resync: Duration::from_secs(600),
            poll: Duration::from_secs(1),
            instance_check: Duration::from_secs(60),
            orphan_scan: Duration::from_secs(600),
            supply: None,
            secrets_namespace: None,
            image_rewrites: Vec::new(),
            tenant_service_account: None,
            unsigned_plugin_dirs: Vec::new(),
            write_fence: None,
            kube_api_rate: None,
            watch_filter: None,
            bootstrap_token: BootstrapTokenOptions::default(),
            cluster_probe: Default::default(),
        }
    }
}

/// Concurrent reconciles per controller.
#[derive(Debug, Clone, Copy)]
pub struct Concurrency {
    /// Plugin controller (loads compile plugins; keep low).
    pub plugins: u16,
    /// Machine controller (plugin calls).
    pub machines: u16,
    /// MachineSet controller.
    pub machine_sets: u16,
    /// MachineDeployment controller.
    pub deployments: u16,
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency {
            plugins: 2,
            machines: 32,
            machine_sets: 8,
            deployments: 4,
        }
    }
}

/// An object a health check may have been watching, gone.
pub(crate) enum Deleted {
    /// A Node (its machine lost its Node).
    Node(Arc<k8s_openapi::api::core::v1::Node>),
    /// A Machine (the count of expected machines changed).
    Machine(Arc<capstan_api::Machine>),
}

/// The Addon controller, woken by its Addons, their Plugins and the Nodes
/// (for addons that fit Nodes).
fn addon_controller<S>(
    watches: &Watches,
    kube: Kube,
    addons: capstan_addons::engine::Addons,
    options: &Options,
    shutdown: S,
) -> impl Future<Output = ()> + use<S>
where
    S: Future<Output = ()> + Send + Sync + 'static,
{
    capstan_addons::engine::controller(
        watches.addons.subscribe(),
        watches.plugins.subscribe(),
        watches.addons.subscribe(),
        watches.addons.deletions(),
        watches.nodes.subscribe(),
        watches.nodes.deletions(),
        Arc::new(
            capstan_addons::engine::Context::new(kube, addons, options.image_rewrites.clone())
                .with_tenant_service_account(options.tenant_service_account.clone()),
        ),
        options.concurrency.deployments,
        shutdown,
    )
}

/// The controllers' client and the one evictions use (no retries: a
/// PodDisruptionBudget's 429 comes back at once), both behind the leader's
/// write fence and one client-side rate limit (the process's).
fn clients(config: kube::Config, options: &Options) -> Result<(kube::Client, kube::Client), Error> {
    let mut no_retries = config.clone();
    no_retries.default_retry = false;
    let rate = options
        .kube_api_rate
        .map(|(qps, burst)| ratelimit::RateLimit::new(qps, burst));
    let eviction_client =
        leader::fenced_client(no_retries, options.write_fence.as_ref(), rate.as_ref())?;
    let client = leader::fenced_client(config, options.write_fence.as_ref(), rate.as_ref())?;
    Ok((client, eviction_client))
}

/// What every controller shares: the client, the caches, the metrics, the
/// Event recorder and the settings they all read.
fn kube_view(client: kube::Client, stores: Stores, metrics: &Metrics, options: &Options) -> Kube {
    Kube {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: capstan_kit::REPORTING_CONTROLLER.into(),
                instance: std::env::var("HOSTNAME").ok(),
            },
        ),
        home: client.clone(),
        client,
        stores,
        metrics: metrics.clone(),
        resync: options.resync,
        secrets_namespace: options.secrets_namespace.clone(),
        fence: options.write_fence.clone(),
        sharded: options.watch_filter.is_some(),
    }
}

/// Run all controllers until `shutdown` resolves. Returns when every
/// controller has finished its in-flight reconciles. `config` is how to
/// reach the API server (two clients are made from it: one that retries
/// throttled requests, one for evictions that does not).
pub async fn run(
    config: kube::Config,
    runtime: Option<capstan_runtime::Runtime>,
    providers: Providers,
    metrics: Metrics,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    if let Some(runtime) = &runtime {
        // Per-plugin call and request metrics (a second run's are ignored).
        runtime.observe(std::sync::Arc::new(metrics.clone()));
    }
    let (client, eviction_client) = clients(config, &options)?;
    let mut watches = Watches::new(&client, options.watch_filter.as_deref()).await?;
    let kube = kube_view(client, watches.stores(), &metrics, &options);
    let clusters =
        capstan_kit::workload::WorkloadClusters::new(kube.clone(), options.cluster_probe);
    // What the Plugin controller loads and the others use.
    let updaters = capstan_kit::registry::Updaters::default();
    let bootstraps = capstan_kit::registry::Bootstraps::default();
    let addons = capstan_addons::engine::Addons::default();

    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let concurrency = options.concurrency;
    let plugin_controller = plugin::controller(
        watches.plugins.subscribe(),
        Arc::new(plugin::Context::new(
            kube.clone(),
            runtime,
            providers.clone(),
            updaters.clone(),
            bootstraps.clone(),
            addons.clone(),
            &options,
        )),
        concurrency.plugins,
        shutdown.clone(),
    );
    let machine_controller = machine::controller(
        watches.machines.subscribe(),
        watches.plugins.subscribe(),
        watches.nodes.subscribe(),
        watches.nodes.deletions(),
        watches.deployments.subscribe(),
        Arc::new(machine::Context::new(
            kube.clone(),
            (providers.clone(), updaters.clone(), bootstraps),
            nodedrain::Evictions::new(eviction_client),
            clusters.clone(),
            &options,
        )),
        concurrency.machines,
        shutdown.clone(),
    );
    let set_controller = machineset::controller(
        watches.machine_sets.subscribe(),
        watches.machines.subscribe(),
        watches.machines.deletions(),
        Arc::new(machineset::Context {
            kube: kube.clone(),
            expectations: capstan_kit::Expectations::default(),
            remediated: Default::default(),
            capacities: capacity::Capacities::new(providers.clone()),
        }),
        concurrency.machine_sets,
        shutdown.clone(),
    );
    let deployment_controller = deployment::controller(
        watches.deployments.subscribe(),
        watches.machine_sets.subscribe(),
        watches.machine_sets.deletions(),
        Arc::new(deployment::Context {
            kube: kube.clone(),
            updaters,
            plans: Default::default(),
            expectations: capstan_kit::Expectations::default(),
            capacities: capacity::Capacities::new(providers),
        }),
        concurrency.deployments,
        shutdown.clone(),
    );
    let health_check_controller = healthcheck::controller(
        watches.health_checks.subscribe(),
        watches.machines.subscribe(),
        watches.nodes.subscribe(),
        futures::stream::select(
            watches.nodes.deletions().map(Deleted::Node),
            watches.machines.deletions().map(Deleted::Machine),
        ),
        Arc::new(healthcheck::Context::new(&kube, &clusters)),
        shutdown.clone(),
    );
    let cluster_controller = cluster::controller(
        watches.clusters.subscribe(),
        watches.machines.subscribe(),
        Arc::new(cluster::Context::new(kube.clone(), clusters)),
        shutdown.clone(),
    );
    let node_csr_approver = csr::approver(csr::Answering::here(&kube), shutdown.clone());
    let addon_controller = addon_controller(&watches, kube, addons, &options, shutdown.clone());

    let reflectors = watches.start(&metrics);
    futures::future::join4(
        futures::future::join5(
            plugin_controller,
            machine_controller,
            set_controller,
            deployment_controller,
            health_check_controller,
        ),
        addon_controller,
        node_csr_approver,
        cluster_controller,
    )
    .await;
    reflectors.abort();
    metrics.set_ready(false);
    Ok(())
}
