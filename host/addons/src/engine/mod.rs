//! The addon engine (the Addon controller): one host runs every addon's
//! lifecycle with the pure steps of this crate; each addon
//! plugin only renders objects and judges health, inside the sandbox, and
//! never touches the API itself.
//!
//! A reconcile ([`reconcile`]): the Plugin must allow the Addon's namespace
//! (`PluginNotAllowed` otherwise, before any plugin call) → pick the target
//! cluster (this one, or a workload cluster from a kubeconfig Secret with
//! inline credentials only) → what holds it back (`spec.dependsOn`, in
//! `order`) → resolve the version through the plugin's `versions()` under
//! the update policy (`available` reports what the channel offers) →
//! `render` ([`render`], shared with `capstan addon render`; while a
//! dependency is not ready, what is applied is rendered again instead)
//! → the pure steps of this crate (parse,
//! label, patch within the patch grants, rewrite images, check the object
//! grants and the host's floor, order) → read every object and decide
//! whose it is ([`crate::ownership`]): nothing is written unless
//! every step passed and every existing object is this Addon's own → for
//! each object, server-side apply under the Addon's own field manager only
//! when the live one no longer carries what was applied (so an idle resync
//! writes nothing) → prune what the previous inventory had and the render
//! no longer does, by uid → `assess` what was rendered of the live objects
//! → status. Deleting an Addon (`finalize`: after its dependents are gone)
//! deletes what it created (by uid, never what
//! it adopted) in reverse apply order, waits until it is gone, then drops
//! the finalizer.
//!
//! Drift: every applied object carries the Addon's labels; a watch per
//! (target cluster, kind, namespace) turns any change or deletion of a
//! labelled object into a reconcile of its Addon, which puts back what was
//! applied.

use crate::ownership::{self, Ownership};
use crate::{AddonError, AddonGrants, ImageRewrite, Object};
use capstan_api::{
    ADDON_FINALIZER, Addon, AddonStatus, InventoryEntry, Plugin, set_condition, status,
};
use capstan_kit::canary::{CallCounts, Canary};
use capstan_kit::controller::Spec;
use capstan_kit::metrics::Metrics;
use capstan_kit::registry::ByPlugin;
use capstan_kit::write::{add_finalizer, apply_status, record_event};
use capstan_kit::{Conditions, Error, Kube, now};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

mod apply;
mod available;
mod cluster;
mod drift;
mod finalize;
mod kubernetes;
mod order;
mod render;
mod shadow;
use apply::{apply_all, discover, ownership_of};

pub use available::UPDATE_AVAILABLE;
pub use kubernetes::COMPATIBLE;
pub use order::{DEPENDENCIES_READY, VALID_SPEC};

pub use cluster::{TENANT_BINDING, TENANT_ROLE};
pub use render::{Aggregation, Meter, RenderError, Rendered, TargetCluster, render};

use cluster::{Target, apply_if_drifted, delete_entry, kind_of, read_live, target};
use drift::{AddonState, WatchKey, need_watches, receiver_stream, watch_kind};
use render::counted_call;

const CONTROLLER: &str = "addon";
/// Prefix of the field manager each Addon applies under
/// (`capstan-addon/NAMESPACE/NAME`): two Addons never share ownership.
pub const ADDON_FIELD_MANAGER: &str = "capstan-addon";
/// Condition: the rendered objects are applied.
pub const APPLIED: &str = "Applied";
/// Condition: the plugin judges the applied objects healthy.
pub const HEALTHY: &str = "Healthy";
/// Condition: what is applied is the version and config the spec asks for.
pub const UP_TO_DATE: &str = "UpToDate";
/// How soon an addon that is not healthy yet (or failed) is looked at again,
/// besides the watches on what it applied.
const RECHECK: Duration = Duration::from_secs(5);

/// An addon plugin and what it may render.
#[derive(Debug)]
pub struct RegisteredAddon {
    /// The sandboxed plugin.
    pub plugin: capstan_runtime::AddonPlugin,
    /// What the Plugin's `spec.grants` allows its Addons.
    pub grants: AddonGrants,
    /// Who signed the revision, joined (`None`: unsigned).
    pub signer: Option<String>,
    /// `stable`, or `canary` for a Plugin's canary (the call metrics'
    /// `revision` label).
    pub revision: &'static str,
    /// Its calls since its canary's window began.
    pub counts: Arc<CallCounts>,
    /// The serving revision's canary, if one is on trial
    /// (`Plugin.spec.rollout`); the Plugin controller sets it.
    pub canary: std::sync::RwLock<Option<Arc<AddonCanary>>>,
}

/// A canary revision of an addon plugin and the Addons it serves.
pub type AddonCanary = Canary<Arc<RegisteredAddon>>;

impl RegisteredAddon {
    /// A serving revision with no canary.
    pub fn new(
        plugin: capstan_runtime::AddonPlugin,
        grants: AddonGrants,
        signer: Option<String>,
    ) -> Self {
        RegisteredAddon {
            plugin,
            grants,
            signer,
            revision: "stable",
            counts: Arc::default(),
            canary: Default::default(),
        }
    }

    /// The revision that renders an Addon: the canary for the Addons it
    /// serves (or served: `served_by` is the digest the Addon's status
    /// records), this one for the rest.
    pub fn for_addon(self: &Arc<Self>, uid: &str, served_by: Option<&str>) -> Arc<RegisteredAddon> {
        let canary = self.canary.read().expect("canary lock").clone();
        match canary {
            Some(c)
                if !c.is_shadow()
                    && (c.serves(uid) || served_by == Some(c.serving.plugin.plugin().digest())) =>
            {
                c.serving.clone()
            }
            _ => self.clone(),
        }
    }

    /// Note an Addon that is not healthy for the canary's window, if a
    /// canary runs (as the canary's when it serves or served it).
    pub fn note_unhealthy(&self, uid: &str, served_by: Option<&str>) {
        if let Some(c) = self.canary.read().expect("canary lock").as_ref() {
            let its = c.serves(uid) || served_by == Some(c.serving.plugin.plugin().digest());
            c.note_unhealthy(uid, its);
        }
    }

    /// How an Addon's calls through it are measured.
    fn meter<'a>(&'a self, metrics: &'a Metrics) -> Meter<'a> {
        Meter {
            metrics,
            revision: self.revision,
            counts: Some(&self.counts),
        }
    }
}

/// Addon plugins by Plugin name; the Plugin controller fills it.
pub type Addons = ByPlugin<RegisteredAddon>;

/// What the addon engine works with.
#[derive(Debug)]
pub struct Context {
    kube: Kube,
    /// Addon plugins by Plugin name (the Plugin controller fills it).
    addons: Addons,
    /// Drift watches, workload-cluster clients and discovery.
    state: AddonState,
    /// The host's image rewrite rules (`--image-rewrite`).
    image_rewrites: Vec<ImageRewrite>,
    /// The ServiceAccount a tenant's Addon that names none is applied as
    /// (`--tenant-service-account`; `None`: such an Addon is refused).
    tenant_service_account: Option<String>,
    /// Which Addons depend on which (`spec.dependsOn`), to wake dependents.
    dependents: order::Dependents,
    /// Target clusters' Kubernetes versions, as last asked.
    asked: kubernetes::Asked,
    /// This cluster's kubelet versions, as last seen (wakes its Addons).
    kubelets: kubernetes::KubeletVersions,
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

impl Context {
    /// The engine's context: it renders through the plugins in `addons`
    /// and rewrites images by `image_rewrites`.
    pub fn new(kube: Kube, addons: Addons, image_rewrites: Vec<ImageRewrite>) -> Self {
        Context {
            kube,
            addons,
            state: AddonState::default(),
            image_rewrites,
            tenant_service_account: None,
            dependents: order::Dependents::default(),
            asked: kubernetes::Asked::default(),
            kubelets: kubernetes::KubeletVersions::default(),
        }
    }

    /// Apply tenants' Addons that name no ServiceAccount as `name` of their
    /// namespace (default: refuse them).
    pub fn with_tenant_service_account(mut self, name: Option<String>) -> Self {
        self.tenant_service_account = name;
        self
    }
}

/// Run the Addon controller until `shutdown` resolves (once per context).
/// `changes` and `deletions` are the Addons' own, again: a change or
/// deletion of one wakes the Addons that depend on it (and a dependency
/// waiting in deletion for its dependents). A Node that changes or goes
/// (`nodes`, `node_deletions`) wakes this cluster's Addons when the set of
/// kubelet versions changed (Kubernetes fit).
#[allow(clippy::too_many_arguments)]
pub async fn controller(
    addons: ReflectHandle<Addon>,
    plugins: ReflectHandle<Plugin>,
    changes: ReflectHandle<Addon>,
    deletions: impl futures::Stream<Item = Arc<Addon>> + Send + 'static,
    nodes: ReflectHandle<Node>,
    node_deletions: impl futures::Stream<Item = Arc<Node>> + Send + 'static,
    ctx: Arc<Context>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let drift = ctx
        .state
        .receiver
        .lock()
        .expect("receiver lock")
        .take()
        .expect("the addon controller runs once per context");
    let drift = receiver_stream(drift);
    let store = ctx.kube.stores.addons.clone();
    let by_plugin = store.clone();
    let (on_change, on_delete) = (ctx.clone(), ctx.clone());
    let (on_node, on_node_gone) = (ctx.clone(), ctx.clone());
    let nodes_gone = futures::StreamExt::flat_map(node_deletions, move |_: Arc<Node>| {
        futures::stream::iter(on_node_gone.kubelets.woken(&on_node_gone))
    });
    let woken = futures::StreamExt::flat_map(deletions, move |gone: Arc<Addon>| {
        on_delete
            .dependents
            .forget(&crate::dependencies::AddonKey::of(&gone));
        futures::stream::iter(on_delete.dependents.to_wake(&gone, &on_delete))
    });
    let watches = move |controller: Controller<Addon>| {
        controller
            // A dependency that changed (ready now, or gone) wakes its
            // dependents through the index, not a poll.
            .watches_shared_stream(changes, move |changed: Arc<Addon>| {
                on_change.dependents.to_wake(&changed, &on_change)
            })
            // An Addon waiting for its plugin goes on as soon as it is loaded.
            .watches_shared_stream(plugins, move |plugin: Arc<Plugin>| {
                let name = plugin.name_any();
                by_plugin
                    .state()
                    .into_iter()
                    .filter(|a| a.spec.plugin == name)
                    .map(|a| ObjectRef::from_obj(a.as_ref()))
                    .collect::<Vec<_>>()
            })
            // A kubelet version that comes or goes may move the cluster out
            // of (or back into) an applied version's Kubernetes range.
            .watches_shared_stream(nodes, move |_: Arc<Node>| on_node.kubelets.woken(&on_node))
            .reconcile_on(futures::stream::select(
                futures::stream::select(drift, woken),
                nodes_gone,
            ))
    };
    // Queued per namespace and per Plugin, as Machines are.
    let spec =
        Spec::new(CONTROLLER, addons, store, concurrency).with_flow(|a| capstan_kit::fair::Flow {
            namespace: a.metadata.namespace.clone().unwrap_or_default(),
            plugin: Some(a.spec.plugin.clone()),
        });
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// A failed step: the condition it sets, its reason and what to do.
struct Failure {
    condition: &'static str,
    reason: &'static str,
    message: String,
    /// Waiting for something else (its plugin to load), not failed: the
    /// phase says `Pending`.
    waiting: bool,
}

fn fail(condition: &'static str, reason: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        condition,
        reason,
        message: message.into(),
        waiting: false,
    }
}

/// A failed render as the condition it sets.
fn render_failure(e: RenderError) -> Failure {
    match e {
        // The host held the call back (the Plugin's quota): waiting, not
        // failed, and not the plugin's fault.
        RenderError::Plugin {
            error:
                error @ (capstan_runtime::Error::QuotaExceeded { .. }
                | capstan_runtime::Error::HostCapacity { .. }),
            ..
        } => Failure {
            waiting: true,
            ..fail(APPLIED, "PluginQuotaExceeded", plugin_text(&error))
        },
        RenderError::Plugin {
            call: "render",
            error,
        } => fail(APPLIED, "RenderFailed", plugin_text(&error)),
        RenderError::Plugin { error, .. } => fail(UP_TO_DATE, "PluginFailed", plugin_text(&error)),
        RenderError::Addon(e) => addon_failure(e),
    }
}

fn addon_failure(e: AddonError) -> Failure {
    let reason = match &e {
        AddonError::NoVersion { .. }
        | AddonError::UnknownVersion { .. }
        | AddonError::NoLongerOffered { .. } => "UnknownVersion",
        AddonError::UnknownChannel { .. } => "UnknownChannel",
        AddonError::InvalidObject { .. } | AddonError::Duplicate(_) => "InvalidRender",
        AddonError::PatchTargetMissing { .. } => "PatchTargetMissing",
        AddonError::InvalidPatch { .. } => "InvalidPatch",
        AddonError::PatchNotGranted { .. } => "PatchNotGranted",
        AddonError::Refused(_) => "ObjectsNotGranted",
        AddonError::Floor(_) => "BelowHostFloor",
        AddonError::Incompatible { .. } => "Incompatible",
    };
    let condition = match &e {
        AddonError::NoVersion { .. }
        | AddonError::UnknownVersion { .. }
        | AddonError::NoLongerOffered { .. }
        | AddonError::UnknownChannel { .. } => UP_TO_DATE,
        AddonError::Incompatible { .. } => COMPATIBLE,
        _ => APPLIED,
    };
    fail(condition, reason, e.to_string())
}

async fn reconcile(addon: Arc<Addon>, ctx: Arc<Context>) -> Result<Action, Error> {
    if addon.meta().deletion_timestamp.is_some() {
        return finalize::finalize(&addon, &ctx).await;
    }
    ctx.dependents.record(&addon);
    if add_finalizer(&ctx.kube, CONTROLLER, addon.as_ref(), ADDON_FINALIZER)
        .await?
        .is_some()
    {
        // The update comes back through the watch.
        return Ok(Action::await_change());
    }
    let current = addon.status.clone();
    let mut status = current.clone().unwrap_or_default();
    let generation = addon.metadata.generation.unwrap_or(0);
    status.observed_generation = Some(generation);
    let t = now();
    let outcome = converge(&addon, &ctx, &mut status).await;
    let (requeue, event) = match outcome {
        Ok(None) => {
            status.phase = Some("Paused".into());
            (ctx.kube.resync, None)
        }
        Ok(Some(healthy)) => {
            status.phase = Some(if healthy { "Ready" } else { "Unhealthy" }.into());
            let event =
                (current.as_ref().map(|s| &s.inventory) != Some(&status.inventory)).then(|| {
                    (
                        EventType::Normal,
                        "Applied",
                        format!(
                            "applied {} objects of version {}",
                            status.inventory.len(),
                            status.version.as_deref().unwrap_or("?")
                        ),
                    )
                });
            (if healthy { ctx.kube.resync } else { RECHECK }, event)
        }
        // An object refused as not ours may be one the previous pass
        // applied, with its inventory not yet in this cache: writing this
        // status would lose that inventory for good. Look again once the
        // cache has caught up.
        Err(f) if f.reason == "ObjectExists" && cache_behind(&addon, &ctx.kube).await => {
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        Err(f) => {
            status.phase = Some(if f.waiting { "Pending" } else { "Failed" }.into());
            set_condition(
                &mut status.conditions,
                f.condition,
                status::FALSE,
                f.reason,
                f.message.clone(),
                Some(generation),
                &t,
            );
            let type_ = if f.waiting {
                EventType::Normal
            } else {
                EventType::Warning
            };
            (RECHECK, Some((type_, f.reason, f.message)))
        }
    };
    let changed = apply_status(
        &ctx.kube,
        CONTROLLER,
        addon.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    if let Some((type_, reason, note)) = event.filter(|_| changed) {
        self::event(&ctx, &addon, type_, reason, note).await;
    }
    Ok(Action::requeue(requeue))
}

/// An Event about `addon`.
async fn event(ctx: &Context, addon: &Addon, type_: EventType, reason: &str, note: String) {
    record_event(
        &ctx.kube,
        CONTROLLER,
        &addon.object_ref(&()),
        type_,
        reason,
        note,
    )
    .await;
}

/// Whether the API has a newer Addon than the cache this pass read (or
/// cannot say): then the pass decided on stale status.
async fn cache_behind(addon: &Addon, kube: &Kube) -> bool {
    let api: Api<Addon> =
        Api::namespaced(kube.client.clone(), &addon.namespace().unwrap_or_default());
    match api.get_metadata_opt(&addon.name_any()).await {
        Ok(Some(fresh)) => fresh.resource_version() != addon.resource_version(),
        Ok(None) => true,
        Err(error) => {
            tracing::debug!(addon = %capstan_kit::key_of(addon), %error, "cannot read the Addon back");
            true
        }
    }
}

/// Everything up to the status: `Ok(None)` when paused, `Ok(Some(healthy))`
/// when applied.
/// One convergence of an Addon: render (within its grants), discover every
/// kind, decide whose each object is, apply what drifted, prune what is no
/// longer rendered, then ask the plugin whether it is healthy. Nothing is
/// written unless discovery and ownership pass for every object.
async fn converge(
    addon: &Addon,
    ctx: &Context,
    status: &mut AddonStatus,
) -> Result<Option<bool>, Failure> {
    let generation = addon.metadata.generation.unwrap_or(0);
    let t = now();
    let registered = plugin_of(addon, ctx)?;
    // Before any plugin call: whose rights will apply it.
    let actor = actor_of(addon, ctx)?;
    let blockers = {
        let mut conditions = Conditions::new(&mut status.conditions, Some(generation), &t);
        order::blockers(ctx, addon, &actor, &mut conditions).await?
    };
    let digest = registered.plugin.plugin().digest().to_string();
    // Before the render: the version must fit the cluster's Kubernetes.
    let target = target(addon, ctx, &actor).await?;
    let cluster = kubernetes::cluster_versions(ctx, &target).await?;
    let (rendered, held) = order::render_gated(
        ctx,
        addon,
        &registered,
        status,
        &blockers,
        (&cluster, &target),
        &t,
    )
    .await?;
    kubernetes::report_fit(ctx, addon, status, &rendered, &cluster, generation, &t).await;
    let Rendered {
        resolved,
        spec,
        objects,
        rewrites,
        ..
    } = rendered;
    if addon.spec.paused {
        return Ok(None);
    }
    status.target = Some(target.shown.clone());

    let kinds = discover(ctx, &target, &objects).await?;
    let decisions = ownership_of(addon, &registered, status, &target, &objects, &kinds).await?;
    let applied = apply_all(ctx, addon, status, &target, &objects, &kinds, decisions).await?;
    let previous = std::mem::take(&mut status.inventory);
    for entry in crate::pruned(&previous, &objects) {
        if let Err(message) =
            delete_entry(ctx, &target, &entry, addon, Some(&registered.grants)).await
        {
            status.inventory = previous;
            return Err(fail(APPLIED, "PruneFailed", message));
        }
    }
    status.inventory = applied.inventory;
    need_watches(ctx, addon, applied.watching);
    status.image_rewrites = rewrites;
    status.version = Some(resolved.version.clone());
    status.plugin_digest = Some(digest);
    status.plugin_signer = registered.signer.clone();
    let applied_message = format!("{} objects applied to {}", objects.len(), target.shown);
    let mut conditions = Conditions::new(&mut status.conditions, Some(generation), &t);
    conditions.set(APPLIED, status::TRUE, "Applied", applied_message);
    match held {
        Some(change) => {
            conditions.set(
                UP_TO_DATE,
                status::FALSE,
                "WaitingForDependencies",
                format!(
                    "version {} is applied and kept in shape; {change} waits: {}",
                    resolved.version,
                    crate::dependencies::blocked_message(&blockers)
                ),
            );
        }
        None => {
            let current_message = match &resolved.channel {
                Some(c) => format!("version {} (channel {c}) is applied", resolved.version),
                None => format!("version {} is applied", resolved.version),
            };
            conditions.set(UP_TO_DATE, status::TRUE, "Current", current_message);
            status.last_applied = Some(crate::dependencies::applied_spec(
                &addon.spec,
                generation,
                &resolved.version,
            ));
        }
    }

    let health = shadow::mirrored(
        &registered,
        counted_call(
            Some(registered.meter(&ctx.kube.metrics)),
            addon,
            "assess",
            registered.plugin.assess(&spec, &applied.observed),
        ),
        async |canary: &RegisteredAddon| {
            counted_call(
                Some(canary.mirror_meter(&ctx.kube.metrics)),
                addon,
                "assess",
                canary.plugin.assess(&spec, &applied.observed),
            )
            .await
        },
        shadow::same_health,
    )
    .await
    .map_err(|e| fail(HEALTHY, "AssessFailed", plugin_text(&e)))?;
    record_health(status, &health, generation, &t);
    Ok(Some(health.healthy))
}

/// Record the plugin's health verdict: `healthy`, its details (bounded as
/// a whole: plugin text reaches a status tenants read) and `Healthy`.
fn record_health(
    status: &mut AddonStatus,
    health: &capstan_runtime::types::Health,
    generation: i64,
    t: &capstan_api::Time,
) {
    status.healthy = Some(health.healthy);
    let mut budget = capstan_api::MAX_PLUGIN_TEXT;
    status.health_details = health
        .details
        .iter()
        .map(|(k, v)| capstan_api::bounded(&format!("{k}={v}"), 256))
        .take_while(|d| {
            let fits = d.len() <= budget;
            budget = budget.saturating_sub(d.len());
            fits
        })
        .collect();
    let (state, reason) = if health.healthy {
        (status::TRUE, "Healthy")
    } else {
        (status::FALSE, "Unhealthy")
    };
    let message = capstan_api::bounded(
        health.message.as_deref().unwrap_or_default(),
        capstan_api::MAX_PLUGIN_TEXT,
    );
    Conditions::new(&mut status.conditions, Some(generation), t)
        .set(HEALTHY, state, reason, message);
}

/// A plugin call's error as a status may show it: bounded.
fn plugin_text(error: &capstan_runtime::Error) -> String {
    capstan_api::bounded(&error.to_string(), capstan_api::MAX_PLUGIN_TEXT)
}

/// Whose rights apply the Addon's objects ([`crate::identity::actor`]).
fn actor_of(addon: &Addon, ctx: &Context) -> Result<crate::identity::Actor, Failure> {
    crate::identity::actor(
        &addon.namespace().unwrap_or_default(),
        addon.spec.service_account_name.as_deref(),
        is_tenant(ctx, addon),
        ctx.tenant_service_account.as_deref(),
    )
    .map_err(|m| fail(APPLIED, "ServiceAccountRequired", m))
}

/// Whether an Addon is a tenant's: outside Capstan's own namespace.
pub(super) fn is_tenant(ctx: &Context, addon: &Addon) -> bool {
    ctx.kube
        .secrets_namespace
        .as_ref()
        .is_some_and(|own| addon.namespace().as_ref() != Some(own))
}

/// The field manager an Addon applies under: its own, so that no two
/// Addons share the ownership of a field.
pub(super) fn field_manager(addon: &Addon) -> String {
    let named = format!(
        "{ADDON_FIELD_MANAGER}/{}/{}",
        addon.namespace().unwrap_or_default(),
        addon.name_any()
    );
    // Field managers are at most 128 characters; a uid always fits.
    if named.len() <= 128 {
        named
    } else {
        format!(
            "{ADDON_FIELD_MANAGER}/{}",
            addon.metadata.uid.as_deref().unwrap_or_default()
        )
    }
}

/// The registered addon plugin the Addon names, or why there is none.
fn plugin_of(addon: &Addon, ctx: &Context) -> Result<Arc<RegisteredAddon>, Failure> {
    let name = &addon.spec.plugin;
    let key = ObjectRef::<Plugin>::new(name);
    let object = ctx.kube.stores.plugins.get(&key);
    let namespace = addon.namespace().unwrap_or_default();
    if let Some(p) = &object
        && !capstan_kit::registry::allowed_in(&ctx.kube, p, &namespace)
    {
        return Err(fail(
            APPLIED,
            "PluginNotAllowed",
            p.not_allowed_message(&namespace, ctx.kube.secrets_namespace.as_deref()),
        ));
    }
    // A deleted Plugin's component stays registered; it serves no Addon.
    if let Some(r) = ctx.addons.get(name).filter(|_| object.is_some()) {
        let uid = addon.uid().unwrap_or_default();
        let served_by = addon
            .status
            .as_ref()
            .and_then(|s| s.plugin_digest.as_deref());
        if addon.status.as_ref().and_then(|s| s.healthy) == Some(false) {
            r.note_unhealthy(&uid, served_by);
        }
        return Ok(r.for_addon(&uid, served_by));
    }
    let (message, waiting) = match object {
        None => (
            format!(
                "plugin {name:?} does not exist; create an addon Plugin named {name:?} (kubectl get plugins lists the installed ones)"
            ),
            false,
        ),
        Some(p) => {
            let plugin_status = p.status.as_ref();
            // Stopped (its grants revoked, its credential gone, a load
            // failed): say why, as the Plugin does.
            let stopped = plugin_status
                .and_then(|s| capstan_api::condition(&s.conditions, "Ready"))
                .filter(|c| c.status == status::FALSE);
            match (plugin_status.and_then(|s| s.world.clone()), stopped) {
                (Some(world), _) if world != "addon-plugin" => (
                    format!("plugin {name:?} is a {world}, not an addon plugin"),
                    false,
                ),
                (_, Some(c)) => (
                    format!("plugin {name:?} is not ready: {}: {}", c.reason, c.message),
                    false,
                ),
                _ => (
                    format!("plugin {name:?} is not loaded yet (kubectl describe plugin {name})"),
                    true,
                ),
            }
        }
    };
    Err(Failure {
        waiting,
        ..fail(APPLIED, "PluginUnavailable", message)
    })
}
