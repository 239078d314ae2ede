//! Capstan's controllers: the generic Cluster API machine lifecycle, run by
//! one host for every provider plugin.
//!
//! Start with [`run`], which starts six kube-rs controllers over shared
//! reflector caches:
//!
//! - [`plugin`]: loads each `Plugin`'s component into the sandbox and
//!   registers it as a provider;
//! - [`machine`]: creates, follows and deletes each `Machine`'s instance
//!   through its provider plugin;
//! - [`machineset`]: keeps a set's number of machines;
//! - [`deployment`]: rolls templates out across MachineSets;
//! - [`healthcheck`]: marks unhealthy machines for their MachineSet to
//!   replace (the Machine controller drains their Nodes first);
//! - [`addon`]: installs each `Addon` with its addon plugin, keeps it in
//!   shape and removes it.
//!
//! What to do next is decided by the pure functions of `capstan-planner`;
//! this crate observes, calls them, and writes only what changed (an idle
//! resync writes nothing: every status is compared before it is applied).

#![forbid(unsafe_code)]

pub mod addon;
pub mod deployment;
pub mod healthcheck;
pub mod history;
pub mod inplace;
pub mod leader;
pub mod machine;
pub mod machineset;
pub mod metrics;
mod nodedrain;
pub mod plugin;
pub mod provider;
pub mod ratelimit;
pub mod rbac;
pub mod registry;
pub mod serve;

pub use metrics::Metrics;
pub use provider::{MachineProvider, ProviderError, Providers, Registered, WasmProvider};

use capstan_api::{Addon, Machine, MachineDeployment, MachineHealthCheck, MachineSet, Plugin};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Field manager of every write.
pub const FIELD_MANAGER: &str = "capstan";
/// The controller name on the Events Capstan records.
const REPORTING_CONTROLLER: &str = "capstan";

/// Errors of the controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An object the caller named does not exist (the text says which).
    #[error("{0}")]
    NotFound(String),
    /// An object Capstan would create already exists and is not its own
    /// (the text says whose it is and what to do).
    #[error("{0}")]
    Conflict(String),
    /// The metrics or health server could not start (the text says which).
    #[error("{0}")]
    Serve(String),
    /// This replica lost the leader Lease and stopped reconciling.
    #[error("lost the leader Lease: {0}")]
    LeadershipLost(String),
    /// A watch failed at startup.
    #[error(
        "cannot watch {0}: check the CRDs are installed (`capstan crds | kubectl apply -f -`) and RBAC allows list/watch"
    )]
    Watch(String),
}

/// Shorthand for wrapping kube errors with context.
pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: Concurrency::default(),
            resync: Duration::from_secs(600),
            poll: Duration::from_secs(1),
            instance_check: Duration::from_secs(60),
            supply: None,
            secrets_namespace: None,
            image_rewrites: Vec::new(),
            unsigned_plugin_dirs: Vec::new(),
            write_fence: None,
            kube_api_rate: None,
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

/// Read-only caches every controller can look into.
#[derive(Clone)]
pub struct Stores {
    /// Plugins.
    pub plugins: Store<Plugin>,
    /// Machines.
    pub machines: Store<Machine>,
    /// MachineSets.
    pub machine_sets: Store<MachineSet>,
    /// MachineDeployments.
    pub deployments: Store<MachineDeployment>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// MachineHealthChecks.
    pub health_checks: Store<MachineHealthCheck>,
    /// Addons.
    pub addons: Store<Addon>,
    /// Namespaces (their labels decide Plugins' `allowedNamespaces`).
    pub namespaces: Store<Namespace>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("machines", &self.machines.len())
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// What every reconcile gets.
pub struct Context {
    /// API client.
    pub client: Client,
    /// The same API without kube-rs's retries of 429, for evictions: a
    /// PodDisruptionBudget's refusal must come back at once.
    pub eviction_client: Client,
    /// The Eviction API version the server takes, once known.
    pub(crate) eviction_version: std::sync::OnceLock<&'static str>,
    /// The sandbox plugins load into (`None` runs only built-in providers).
    pub runtime: Option<capstan_runtime::Runtime>,
    /// Providers by plugin name.
    pub providers: Providers,
    /// In-place updaters by plugin name.
    pub updaters: registry::Updaters,
    /// Activating an updater checks its fields against the others and
    /// registers it as one step.
    pub(crate) updater_activation: tokio::sync::Mutex<()>,
    /// Per-machine in-place plans the deployment controller computed.
    pub(crate) plans: inplace::PlanCache,
    /// Addon plugins by plugin name.
    pub addons: registry::Addons,
    /// Drift watches, workload-cluster clients and discovery of the addon
    /// controller.
    pub(crate) addon_state: addon::AddonState,
    /// Metrics.
    pub metrics: Metrics,
    /// Caches.
    pub stores: Stores,
    /// Event recorder.
    pub recorder: Recorder,
    /// Tuning.
    pub options: Options,
    /// Machines a set created or deleted that its cache has not shown yet.
    pub expectations: Expectations,
    /// Plugins loaded so far: name → (generation, revision), so an idle
    /// reconcile does not reload.
    pub(crate) loaded: Mutex<HashMap<String, (i64, plugin::Revision)>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}

/// Creations and deletions a MachineSet issued that the cache has not
/// caught up with. Without them a reconcile right after a create would
/// see too few machines and create duplicates.
#[derive(Debug, Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
}

#[derive(Debug, Default, Clone)]
struct Pending {
    created: Vec<String>,
    deleted: Vec<String>,
    since: Option<Instant>,
}

/// How long an unobserved create or delete is waited for before the cache
/// is trusted again (a watch that lost an event recovers by relisting).
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

impl Expectations {
    /// Remember machines `owner` just created / deleted.
    pub fn expect(&self, owner: &str, created: Vec<String>, deleted: Vec<String>) {
        let mut pending = self.pending.lock().expect("expectations lock");
        let entry = pending.entry(owner.to_string()).or_default();
        entry.created.extend(created);
        entry.deleted.extend(deleted);
        entry.since = Some(Instant::now());
    }

    /// Whether the cache shows everything `owner` did: created machines
    /// present, deleted ones gone or marked for deletion.
    pub fn satisfied(&self, owner: &str, seen: impl Fn(&str) -> Seen) -> bool {
        let mut pending = self.pending.lock().expect("expectations lock");
        let Some(entry) = pending.get_mut(owner) else {
            return true;
        };
        entry.created.retain(|n| seen(n) == Seen::Absent);
        entry.deleted.retain(|n| seen(n) == Seen::Present);
        let done = entry.created.is_empty() && entry.deleted.is_empty();
        let expired = entry
            .since
            .is_some_and(|s| s.elapsed() > EXPECTATION_TIMEOUT);
        if done || expired {
            pending.remove(owner);
            return true;
        }
        false
    }
}

/// How the cache shows a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not in the cache.
    Absent,
    /// In the cache, not being deleted.
    Present,
    /// In the cache with a deletion timestamp.
    Deleting,
}

/// Record a Kubernetes Event about `object` (shown by `kubectl describe`).
/// Events are best effort: a failure to record one is logged, never fatal.
/// Callers record only when they also changed the status, so a condition
/// that stays the same does not repeat its Event every retry.
pub(crate) async fn record_event(
    ctx: &Context,
    controller: &'static str,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    type_: kube::runtime::events::EventType,
    reason: &str,
    note: String,
) {
    use kube::runtime::events::{Event, EventType};
    let result = if object.namespace.is_some() {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        ctx.recorder.publish(&event, object).await
    } else {
        // A cluster-scoped object (a Plugin). Kubernetes 1.20 (the version
        // tested here) refuses events.k8s.io Events about those
        // ("involvedObject.namespace does not match event.namespace"), so
        // write a core/v1 Event in "default", which the API accepts from
        // legacy clients and `kubectl describe` finds by the involved object.
        use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = object.name.clone().unwrap_or_default();
        let event = CoreEvent {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: object.clone(),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            reason: Some(reason.to_string()),
            message: Some(note),
            action: Some("Reconcile".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(REPORTING_CONTROLLER.into()),
                host: std::env::var("HOSTNAME").ok(),
            }),
            reporting_component: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: std::env::var("HOSTNAME").ok(),
            ..Default::default()
        };
        Api::<CoreEvent>::namespaced(ctx.client.clone(), "default")
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
    };
    match result {
        Ok(()) => ctx.metrics.wrote(controller, "event"),
        Err(error) => tracing::warn!(%error, controller, reason, "cannot record an Event"),
    }
}

/// An object a health check may have been watching, gone.
pub(crate) enum Deleted {
    /// A Node (its machine lost its Node).
    Node(Arc<Node>),
    /// A Machine (the count of expected machines changed).
    Machine(Arc<Machine>),
}

/// The machines whose instance backs `node` (same provider ID).
pub(crate) fn machines_of_node(machines: &Store<Machine>, node: &Node) -> Vec<Arc<Machine>> {
    let Some(id) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) else {
        return vec![];
    };
    machines
        .state()
        .into_iter()
        .filter(|m| m.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(id))
        .collect()
}

/// Set the `ValidSpec` condition: `problem` is `Some((reason, message))`
/// when the spec cannot be acted on, `None` when it is valid.
pub(crate) fn set_valid_spec(
    conditions: &mut Vec<capstan_api::Condition>,
    problem: Option<(&str, &str)>,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    use capstan_api::{set_conditions::VALID_SPEC, status as cond};
    let (status, reason, message) = match problem {
        Some((reason, message)) => (cond::FALSE, reason, message),
        None => (cond::TRUE, "Valid", ""),
    };
    capstan_api::set_condition(
        conditions, VALID_SPEC, status, reason, message, generation, now,
    );
}

/// Apply `status` to an object's status subresource with server-side apply,
/// unless it equals `current` (so idle reconciles write nothing).
pub(crate) async fn apply_status<K, S>(
    ctx: &Context,
    controller: &'static str,
    obj: &K,
    current: Option<&S>,
    status: &S,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::Scope: ScopeApi,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(false);
    }
    let api: Api<K> = K::Scope::api(ctx.client.clone(), obj.namespace().as_deref());
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err(format!(
        "cannot update the status of {} {}",
        K::kind(&()),
        obj.name_any()
    )))?;
    ctx.metrics.wrote(controller, "apply_status");
    Ok(true)
}

/// Replace an object's finalizer list, guarded by the resourceVersion read,
/// so a concurrent change by someone else is not overwritten (a conflict
/// is an error and the reconcile is retried). An object already gone is fine.
pub(crate) async fn set_finalizers<K>(
    ctx: &Context,
    controller: &'static str,
    obj: &K,
    finalizers: Vec<String>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::Scope: ScopeApi,
{
    let api: Api<K> = K::Scope::api(ctx.client.clone(), obj.namespace().as_deref());
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": obj.resource_version(),
        }
    });
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            return Err(kube_err(format!(
                "cannot update the finalizers of {} {}",
                K::kind(&()),
                key_of(obj)
            ))(e));
        }
    }
    ctx.metrics.wrote(controller, "patch_finalizers");
    Ok(())
}

/// Build an `Api` for namespaced or cluster-scoped kinds alike.
pub trait ScopeApi {
    /// The API handle for an object of this scope.
    fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = Self>;
}

impl ScopeApi for k8s_openapi::NamespaceResourceScope {
    fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = Self>,
    {
        Api::namespaced(client, namespace.unwrap_or("default"))
    }
}

impl ScopeApi for k8s_openapi::ClusterResourceScope {
    fn api<K>(client: Client, _namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = Self>,
    {
        Api::all(client)
    }
}

/// `now` as a Kubernetes timestamp.
pub(crate) fn now() -> capstan_api::Time {
    capstan_api::Time(k8s_openapi::jiff::Timestamp::now())
}

/// A shared, reflected watch of one kind: the store and a way to subscribe.
struct Shared<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    writer: Option<reflector::store::Writer<K>>,
    api: Api<K>,
    /// Objects that left the cache. kube-runtime's shared streams pass
    /// applied objects on but not deleted ones, and a relist drops vanished
    /// objects silently; both reach subscribers of [`Shared::deletions`].
    deleted: tokio::sync::broadcast::Sender<Arc<K>>,
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    fn new(api: Api<K>) -> Self {
        let (store, writer) = reflector::store_shared(1024);
        let (deleted, _) = tokio::sync::broadcast::channel(1024);
        Shared {
            store,
            writer: Some(writer),
            api,
            deleted,
        }
    }

    /// Every object deleted from now on (by a watch event, or found gone
    /// when the watch relisted). A subscriber that falls more than 1,024
    /// deletions behind skips the oldest; the periodic resync covers those.
    fn deletions(&self) -> impl Stream<Item = Arc<K>> + Send + use<K> {
        futures::stream::unfold(self.deleted.subscribe(), |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(object) => return Some((object, rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(skipped)) => {
                        tracing::warn!(skipped, "deletion subscriber fell behind");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    fn subscribe(&self) -> ReflectHandle<K> {
        self.writer
            .as_ref()
            .and_then(|w| w.subscribe())
            .expect("a shared store can be subscribed to until it starts")
    }

    /// The reflector task's stream; must be polled for subscribers to see
    /// events. `listed` counts watches that completed their first list.
    fn start(
        &mut self,
        name: &'static str,
        listed: Arc<Listed>,
    ) -> impl Stream<Item = ()> + Send + use<K> {
        let writer = self.writer.take().expect("started once");
        let mut first = true;
        let deleted = self.deleted.clone();
        let store = self.store.clone();
        // What the cache held when a relist began: whatever of it the
        // relist does not bring back was deleted while the watch was down.
        let mut before_relist: Vec<Arc<K>> = Vec::new();
        watcher(self.api.clone(), watcher::Config::default().any_semantic())
            .default_backoff()
            .reflect_shared(writer)
            .filter_map(move |event| {
                match event {
                    Err(error) => tracing::warn!(watch = name, %error, "watch error; retrying"),
                    Ok(watcher::Event::Delete(object)) => {
                        let _ = deleted.send(Arc::new(object));
                    }
                    Ok(watcher::Event::Init) if !first => before_relist = store.state(),
                    Ok(watcher::Event::InitDone) if first => {
                        first = false;
                        tracing::debug!(watch = name, "listed");
                        listed.one_more();
                    }
                    Ok(watcher::Event::InitDone) => {
                        for object in std::mem::take(&mut before_relist) {
                            let gone = store
                                .get(&ObjectRef::from_obj(object.as_ref()))
                                .is_none_or(|now| now.meta().uid != object.meta().uid);
                            if gone {
                                let _ = deleted.send(object);
                            }
                        }
                    }
                    Ok(_) => {}
                }
                futures::future::ready(None)
            })
    }
}

/// Counts watches that completed their first list and marks the
/// controllers ready when all have.
struct Listed {
    remaining: std::sync::atomic::AtomicUsize,
    metrics: Metrics,
}

impl Listed {
    fn one_more(&self) {
        if self
            .remaining
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.metrics.set_ready(true);
            tracing::info!("caches synced; controllers ready");
        }
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
    let mut no_retries = config.clone();
    no_retries.default_retry = false;
    // One bucket for both clients: the limit is the process's.
    let rate = options
        .kube_api_rate
        .map(|(qps, burst)| ratelimit::RateLimit::new(qps, burst));
    let eviction_client = fenced_client(no_retries, options.write_fence.as_ref(), rate.as_ref())?;
    let client = fenced_client(config, options.write_fence.as_ref(), rate.as_ref())?;
    let mut plugins = Shared::new(Api::<Plugin>::all(client.clone()));
    let mut machines = Shared::new(Api::<Machine>::all(client.clone()));
    let mut sets = Shared::new(Api::<MachineSet>::all(client.clone()));
    let mut deployments = Shared::new(Api::<MachineDeployment>::all(client.clone()));
    let mut nodes = Shared::new(Api::<Node>::all(client.clone()));
    let mut health_checks = Shared::new(Api::<MachineHealthCheck>::all(client.clone()));
    let mut addons = Shared::new(Api::<Addon>::all(client.clone()));
    let mut namespaces = Shared::new(Api::<Namespace>::all(client.clone()));

    // Fail early and clearly when the CRDs are missing.
    for (kind, result) in [
        (
            "plugins.capstan.dev",
            plugins.api.list_metadata(&Default::default()).await.err(),
        ),
        (
            "machines.capstan.dev",
            machines.api.list_metadata(&Default::default()).await.err(),
        ),
        (
            "machinesets.capstan.dev",
            sets.api.list_metadata(&Default::default()).await.err(),
        ),
        (
            "machinedeployments.capstan.dev",
            deployments
                .api
                .list_metadata(&Default::default())
                .await
                .err(),
        ),
        (
            "machinehealthchecks.capstan.dev",
            health_checks
                .api
                .list_metadata(&Default::default())
                .await
                .err(),
        ),
        (
            "addons.capstan.dev",
            addons.api.list_metadata(&Default::default()).await.err(),
        ),
    ] {
        if let Some(error) = result {
            tracing::error!(%error, "cannot list {kind}");
            return Err(Error::Watch(kind.to_string()));
        }
    }

    let stores = Stores {
        plugins: plugins.store.clone(),
        machines: machines.store.clone(),
        machine_sets: sets.store.clone(),
        deployments: deployments.store.clone(),
        nodes: nodes.store.clone(),
        health_checks: health_checks.store.clone(),
        addons: addons.store.clone(),
        namespaces: namespaces.store.clone(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTING_CONTROLLER.into(),
                instance: std::env::var("HOSTNAME").ok(),
            },
        ),
        client,
        eviction_client,
        eviction_version: std::sync::OnceLock::new(),
        runtime,
        providers,
        updaters: registry::Updaters::default(),
        updater_activation: tokio::sync::Mutex::default(),
        plans: inplace::PlanCache::default(),
        addons: registry::Addons::default(),
        addon_state: addon::AddonState::default(),
        metrics: metrics.clone(),
        stores: stores.clone(),
        options: options.clone(),
        expectations: Expectations::default(),
        loaded: Mutex::default(),
    });

    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let plugin_controller = plugin::controller(plugins.subscribe(), &ctx, shutdown.clone());
    let machine_controller = machine::controller(
        machines.subscribe(),
        plugins.subscribe(),
        nodes.subscribe(),
        nodes.deletions(),
        &ctx,
        shutdown.clone(),
    );
    let set_controller = machineset::controller(
        sets.subscribe(),
        machines.subscribe(),
        &ctx,
        shutdown.clone(),
    );
    let deployment_controller = deployment::controller(
        deployments.subscribe(),
        sets.subscribe(),
        &ctx,
        shutdown.clone(),
    );
    let health_check_controller = healthcheck::controller(
        health_checks.subscribe(),
        machines.subscribe(),
        nodes.subscribe(),
        futures::stream::select(
            nodes.deletions().map(Deleted::Node),
            machines.deletions().map(Deleted::Machine),
        ),
        &ctx,
        shutdown.clone(),
    );

    let addon_controller = addon::controller(
        addons.subscribe(),
        plugins.subscribe(),
        &ctx,
        shutdown.clone(),
    );

    let listed = Arc::new(Listed {
        remaining: std::sync::atomic::AtomicUsize::new(8),
        metrics: metrics.clone(),
    });
    let reflectors = futures::stream::select_all([
        plugins.start("plugins", listed.clone()).boxed(),
        machines.start("machines", listed.clone()).boxed(),
        sets.start("machinesets", listed.clone()).boxed(),
        deployments
            .start("machinedeployments", listed.clone())
            .boxed(),
        nodes.start("nodes", listed.clone()).boxed(),
        health_checks
            .start("machinehealthchecks", listed.clone())
            .boxed(),
        addons.start("addons", listed.clone()).boxed(),
        namespaces.start("namespaces", listed).boxed(),
    ]);
    let reflectors = tokio::spawn(reflectors.for_each(|_| async {}));

    futures::future::join(
        futures::future::join5(
            plugin_controller,
            machine_controller,
            set_controller,
            deployment_controller,
            health_check_controller,
        ),
        addon_controller,
    )
    .await;
    reflectors.abort();
    metrics.set_ready(false);
    Ok(())
}

/// A client for `config`, its writes behind `fence` when there is one and
/// every request paced by `rate` when there is one (inside the fence, so
/// time spent waiting for a token counts against the leadership left).
fn fenced_client(
    config: kube::Config,
    fence: Option<&Arc<leader::Fence>>,
    rate: Option<&Arc<ratelimit::RateLimit>>,
) -> Result<Client, Error> {
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|source| Error::Kube {
        what: "cannot build a Kubernetes client".into(),
        source,
    })?;
    let fence = fence.map(|f| leader::FenceLayer(f.clone()));
    let rate = rate.map(|r| ratelimit::RateLimitLayer(r.clone()));
    Ok(match (fence, rate) {
        (Some(fence), Some(rate)) => builder.with_layer(&rate).with_layer(&fence).build(),
        (Some(fence), None) => builder.with_layer(&fence).build(),
        (None, Some(rate)) => builder.with_layer(&rate).build(),
        (None, None) => builder.build(),
    })
}

/// Drive a controller's result stream, logging failures, until it ends.
pub(crate) async fn drain<K, E1, E2>(
    name: &'static str,
    stream: impl Stream<
        Item = Result<
            (ObjectRef<K>, kube::runtime::controller::Action),
            kube::runtime::controller::Error<E1, E2>,
        >,
    >,
) where
    K: Resource,
    E1: std::error::Error + 'static,
    E2: std::error::Error + 'static,
{
    stream
        .for_each(|result| async move {
            if let Err(error) = result {
                match &error {
                    kube::runtime::controller::Error::ObjectNotFound(_) => {}
                    _ => tracing::debug!(controller = name, %error, "reconcile failed"),
                }
            }
        })
        .await;
}

/// Key of an object in logs and queue bookkeeping.
/// The JSON merge patch (RFC 7386) that turns `from` into `to`: changed
/// values, and `null` for keys `to` no longer has.
pub(crate) fn merge_patch(from: &serde_json::Value, to: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = serde_json::Map::new();
            for key in a.keys().filter(|k| !b.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            for (key, value) in b {
                match a.get(key) {
                    Some(old) if old == value => {}
                    Some(old) => {
                        patch.insert(key.clone(), merge_patch(old, value));
                    }
                    None => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// Whether `obj` carries Cluster API's `cluster.x-k8s.io/paused`
/// annotation: its controller leaves it alone until the annotation goes.
pub(crate) fn paused<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(capstan_api::ANNOTATION_PAUSED))
}

pub(crate) fn key_of<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

/// Wrap a reconcile with timing, queue bookkeeping and error metrics.
pub(crate) async fn instrumented<K, F>(
    controller: &'static str,
    obj: Arc<K>,
    ctx: Arc<Context>,
    reconcile: impl FnOnce(Arc<K>, Arc<Context>) -> F,
) -> Result<kube::runtime::controller::Action, Error>
where
    K: Resource,
    F: Future<Output = Result<kube::runtime::controller::Action, Error>>,
{
    let key = key_of(obj.as_ref());
    // Deciding from a partly listed cache would, for example, make a
    // MachineSet whose machines are not listed yet create them again.
    if !ctx.metrics.is_ready() {
        return Ok(kube::runtime::controller::Action::requeue(
            Duration::from_millis(250),
        ));
    }
    ctx.metrics.dequeued(controller, &key);
    let started = Instant::now();
    let metrics = ctx.metrics.clone();
    let result = reconcile(obj, ctx).await;
    metrics.reconciled(controller, started.elapsed(), result.is_err());
    if let Err(error) = &result {
        tracing::warn!(controller, object = %key, %error, "reconcile failed; retrying");
    }
    result
}

/// Count triggers into the queue-depth metric as they pass.
pub(crate) fn counted<K>(
    controller: &'static str,
    metrics: &Metrics,
    stream: impl Stream<Item = Arc<K>> + Send + 'static,
    key: impl Fn(&K) -> Option<String> + Send + 'static,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
{
    let metrics = metrics.clone();
    stream.inspect(move |obj| {
        if let Some(k) = key(obj) {
            metrics.enqueued(controller, k);
        }
    })
}

/// The controller-owner key (`namespace/name`) of an object, if it has one
/// of the given kind.
pub(crate) fn owner_key<K: Resource>(obj: &K, owner_kind: &str) -> Option<String> {
    let owner = obj
        .meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == owner_kind)?;
    Some(format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        owner.name
    ))
}

/// Standard error policy: retry after a short delay.
pub(crate) fn retry_soon<K>(
    _obj: Arc<K>,
    _error: &Error,
    _ctx: Arc<Context>,
) -> kube::runtime::controller::Action {
    kube::runtime::controller::Action::requeue(Duration::from_secs(2))
}
