//! The Addon controller: one host runs every addon's lifecycle; each addon
//! plugin only renders objects and judges health, inside the sandbox, and
//! never touches the API itself.
//!
//! A reconcile ([`reconcile`]): the Plugin must allow the Addon's namespace
//! (`PluginNotAllowed` otherwise, before any plugin call) → pick the target
//! cluster (this one, or a workload cluster from a kubeconfig Secret with
//! inline credentials only) → resolve the version through the plugin's
//! `versions()` → `render` → the pure steps of `capstan-addons` (parse,
//! label, patch within the patch grants, rewrite images, check the object
//! grants and the host's floor, order) → read every object and decide
//! whose it is (`capstan_addons::ownership`): nothing is written unless
//! every step passed and every existing object is this Addon's own → for
//! each object, server-side apply under the Addon's own field manager only
//! when the live one no longer carries what was applied (so an idle resync
//! writes nothing) → prune what the previous inventory had and the render
//! no longer does, by uid → `assess` what was rendered of the live objects
//! → status. Deleting an Addon deletes what it created (by uid, never what
//! it adopted) in reverse apply order, waits until it is gone, then drops
//! the finalizer.
//!
//! Drift: every applied object carries the Addon's labels; a watch per
//! (target cluster, kind, namespace) turns any change or deletion of a
//! labelled object into a reconcile of its Addon, which puts back what was
//! applied.

use crate::registry::RegisteredAddon;
use crate::{Context, Error, apply_status, counted, drain, instrumented, now, record_event};
use capstan_addons::ownership::{self, Ownership};
use capstan_addons::{AddonError, AddonGrants, Object};
use capstan_api::{
    ADDON_FINALIZER, Addon, AddonStatus, InventoryEntry, LABEL_ADDON_NAME, LABEL_ADDON_NAMESPACE,
    Plugin, set_condition, status,
};
use capstan_runtime::types::AddonSpec as WitSpec;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// A cluster objects are applied to.
#[derive(Clone)]
struct Target {
    client: Client,
    /// Identifies the cluster and credentials (watches and discovery are
    /// kept per key).
    key: String,
    /// For status: `in-cluster` or the Secret's name.
    shown: String,
}

/// A drift watch: (cluster, `apiVersion/Kind@namespace`).
type WatchKey = (String, String);

/// Watches on applied objects, workload-cluster clients and discovery
/// answers, shared by all reconciles.
pub(crate) struct AddonState {
    trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<Addon>>,
    receiver: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Addon>>>>,
    /// Drift watches by (cluster, kind@namespace): the target's version
    /// (kubeconfig Secret resourceVersion) and the task.
    #[allow(clippy::type_complexity)]
    watches: Mutex<HashMap<WatchKey, (String, tokio::task::JoinHandle<()>)>>,
    /// The watches each Addon (by uid) needs: a watch no Addon needs any
    /// more is stopped.
    watched_by: Mutex<HashMap<String, std::collections::HashSet<WatchKey>>>,
    clients: Mutex<HashMap<String, (String, Client)>>,
    /// Per applied object (Addon uid and object): the render it was applied
    /// from and what the server made of it, so a value the server
    /// normalises is not seen as drift on every resync.
    #[allow(clippy::type_complexity)]
    expected: Mutex<HashMap<(String, String), (serde_json::Value, serde_json::Value)>>,
    kinds: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
}

impl Default for AddonState {
    fn default() -> Self {
        let (trigger, receiver) = tokio::sync::mpsc::unbounded_channel();
        AddonState {
            trigger,
            receiver: Mutex::new(Some(receiver)),
            watches: Mutex::default(),
            watched_by: Mutex::default(),
            clients: Mutex::default(),
            expected: Mutex::default(),
            kinds: Mutex::default(),
        }
    }
}

impl Drop for AddonState {
    fn drop(&mut self) {
        for (_, (_, task)) in self.watches.lock().expect("watches lock").drain() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for AddonState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddonState").finish_non_exhaustive()
    }
}

pub(crate) async fn controller(
    addons: ReflectHandle<Addon>,
    plugins: ReflectHandle<Plugin>,
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let drift = ctx
        .addon_state
        .receiver
        .lock()
        .expect("receiver lock")
        .take()
        .expect("the addon controller runs once per context");
    let drift = receiver_stream(drift);
    let store = ctx.stores.addons.clone();
    let trigger = counted(CONTROLLER, &ctx.metrics, addons, |a| Some(crate::key_of(a)));
    let stream = Controller::for_shared_stream(trigger, ctx.stores.addons.clone())
        .with_config(Config::default().concurrency(ctx.options.concurrency.deployments))
        // An Addon waiting for its plugin goes on as soon as it is loaded.
        .watches_shared_stream(plugins, move |plugin: Arc<Plugin>| {
            let name = plugin.name_any();
            store
                .state()
                .into_iter()
                .filter(|a| a.spec.plugin == name)
                .map(|a| ObjectRef::from_obj(a.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(drift)
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx| instrumented(CONTROLLER, obj, ctx, reconcile),
            |_, _, _| Action::requeue(Duration::from_secs(2)),
            ctx.clone(),
        );
    drain(CONTROLLER, stream).await;
}

fn receiver_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
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

fn addon_failure(e: AddonError) -> Failure {
    let reason = match &e {
        AddonError::NoVersion { .. } | AddonError::UnknownVersion { .. } => "UnknownVersion",
        AddonError::UnknownChannel { .. } => "UnknownChannel",
        AddonError::InvalidObject { .. } | AddonError::Duplicate(_) => "InvalidRender",
        AddonError::PatchTargetMissing { .. } => "PatchTargetMissing",
        AddonError::InvalidPatch { .. } => "InvalidPatch",
        AddonError::PatchNotGranted { .. } => "PatchNotGranted",
        AddonError::Refused(_) => "ObjectsNotGranted",
        AddonError::Floor(_) => "BelowHostFloor",
    };
    let condition = match &e {
        AddonError::NoVersion { .. }
        | AddonError::UnknownVersion { .. }
        | AddonError::UnknownChannel { .. } => UP_TO_DATE,
        _ => APPLIED,
    };
    fail(condition, reason, e.to_string())
}

async fn reconcile(addon: Arc<Addon>, ctx: Arc<Context>) -> Result<Action, Error> {
    if addon.meta().deletion_timestamp.is_some() {
        return finalize(&addon, &ctx).await;
    }
    if !addon.finalizers().iter().any(|f| f == ADDON_FINALIZER) {
        let mut finalizers = addon.finalizers().to_vec();
        finalizers.push(ADDON_FINALIZER.into());
        crate::set_finalizers(&ctx, CONTROLLER, addon.as_ref(), finalizers).await?;
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
            (ctx.options.resync, None)
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
            (if healthy { ctx.options.resync } else { RECHECK }, event)
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
            (RECHECK, Some((EventType::Warning, f.reason, f.message)))
        }
    };
    let changed = apply_status(&ctx, CONTROLLER, addon.as_ref(), current.as_ref(), &status).await?;
    if let Some((type_, reason, note)) = event.filter(|_| changed) {
        record_event(
            &ctx,
            CONTROLLER,
            &addon.object_ref(&()),
            type_,
            reason,
            note,
        )
        .await;
    }
    Ok(Action::requeue(requeue))
}

/// Everything up to the status: `Ok(None)` when paused, `Ok(Some(healthy))`
/// when applied.
async fn converge(
    addon: &Addon,
    ctx: &Context,
    status: &mut AddonStatus,
) -> Result<Option<bool>, Failure> {
    let generation = addon.metadata.generation.unwrap_or(0);
    let t = now();
    let registered = plugin_of(addon, ctx)?;
    let tenant = is_tenant(ctx, addon);
    let rendered = render(
        &registered.plugin,
        addon,
        &registered.grants,
        tenant,
        &ctx.options.image_rewrites,
        Some(&ctx.metrics),
    )
    .await
    .map_err(|e| match e {
        RenderError::Plugin {
            call: "render",
            error,
        } => fail(APPLIED, "RenderFailed", plugin_text(&error)),
        RenderError::Plugin { error, .. } => fail(UP_TO_DATE, "PluginFailed", plugin_text(&error)),
        RenderError::Addon(e) => addon_failure(e),
    })?;
    let Rendered {
        resolved,
        spec,
        objects,
        rewrites,
    } = rendered;
    if addon.spec.paused {
        return Ok(None);
    }
    let target = target(addon, ctx).await?;
    status.target = Some(target.shown.clone());

    // Discovery for every object before anything is written, so a kind the
    // cluster does not serve (or a namespaced object without a namespace)
    // stops the whole render.
    let mut kinds = Vec::with_capacity(objects.len());
    for object in &objects {
        let (resource, namespaced) = kind_of(ctx, &target, &object.api_version, &object.kind)
            .await
            .map_err(|m| fail(APPLIED, "UnknownKind", m))?;
        if namespaced != object.namespace.is_some() {
            return Err(fail(
                APPLIED,
                "InvalidRender",
                format!(
                    "{} is {} but rendered {} a namespace; the plugin must set metadata.namespace exactly on namespaced objects",
                    object.entry(),
                    if namespaced {
                        "namespaced"
                    } else {
                        "cluster-scoped"
                    },
                    if namespaced { "without" } else { "with" }
                ),
            ));
        }
        kinds.push(resource);
    }

    // Whose is each object? Read them all and refuse before the first
    // write: an object this Addon did not create is never applied over.
    let me = (addon.namespace().unwrap_or_default(), addon.name_any());
    let mut decisions = Vec::with_capacity(objects.len());
    let mut refused = Vec::new();
    for (object, resource) in objects.iter().zip(&kinds) {
        let live = read_live(&target, resource, object).await?;
        let decision = ownership::decide(
            object,
            live.as_ref(),
            &status.inventory,
            (&me.0, &me.1),
            &registered.grants.adopt,
        );
        if let Ownership::Refuse(message) = &decision {
            refused.push(message.clone());
        }
        decisions.push((live, decision));
    }
    if !refused.is_empty() {
        return Err(fail(
            APPLIED,
            "ObjectExists",
            format!(
                "refused the whole render, nothing was applied: {}",
                refused.join("; ")
            ),
        ));
    }

    let manager = field_manager(addon);
    let mut watching = std::collections::HashSet::new();
    let mut applied: Vec<InventoryEntry> = Vec::with_capacity(objects.len());
    let mut observed = Vec::with_capacity(objects.len());
    for ((object, resource), (live, decision)) in objects.iter().zip(&kinds).zip(decisions) {
        let (uid, adopted) = match &decision {
            Ownership::Owned { uid, adopted } => (Some(uid.clone()), *adopted),
            Ownership::Adopt { uid } => (Some(uid.clone()), true),
            Ownership::Create | Ownership::Refuse(_) => (None, false),
        };
        let key = (
            addon.metadata.uid.clone().unwrap_or_default(),
            format!("{}@{}", object.entry(), target.key),
        );
        match apply_if_drifted(ctx, &target, resource, object, live, &manager, key).await {
            Ok(live) => {
                let uid = uid.or_else(|| {
                    live.pointer("/metadata/uid")
                        .and_then(serde_json::Value::as_str)
                        .map(String::from)
                });
                applied.push(InventoryEntry {
                    uid,
                    adopted,
                    ..object.entry()
                });
                observed.push(capstan_addons::assess_view(&object.value, &live).to_string());
            }
            Err(f) => {
                // What this attempt did apply stays in the inventory, so
                // a later render that drops it still prunes it.
                for done in applied {
                    status
                        .inventory
                        .retain(|e| !capstan_addons::same_object(e, &done));
                    status.inventory.push(done);
                }
                return Err(f);
            }
        }
        watching.insert(watch_kind(
            ctx,
            addon,
            &target,
            resource,
            object.namespace.as_deref(),
        ));
    }

    let previous = std::mem::take(&mut status.inventory);
    for entry in capstan_addons::pruned(&previous, &objects) {
        if let Err(message) = delete_entry(ctx, &target, &entry, addon).await {
            status.inventory = previous;
            return Err(fail(APPLIED, "PruneFailed", message));
        }
    }
    status.inventory = applied;
    need_watches(ctx, addon, watching);
    status.image_rewrites = rewrites;
    status.version = Some(resolved.version.clone());
    status.plugin_digest = Some(registered.plugin.plugin().digest().to_string());
    set_condition(
        &mut status.conditions,
        APPLIED,
        status::TRUE,
        "Applied",
        format!("{} objects applied to {}", objects.len(), target.shown),
        Some(generation),
        &t,
    );
    set_condition(
        &mut status.conditions,
        UP_TO_DATE,
        status::TRUE,
        "Current",
        match &resolved.channel {
            Some(c) => format!("version {} (channel {c}) is applied", resolved.version),
            None => format!("version {} is applied", resolved.version),
        },
        Some(generation),
        &t,
    );

    let health = counted_call(
        Some(&ctx.metrics),
        addon,
        "assess",
        registered.plugin.assess(&spec, &observed),
    )
    .await
    .map_err(|e| fail(HEALTHY, "AssessFailed", plugin_text(&e)))?;
    status.healthy = Some(health.healthy);
    // Plugin text reaches a status tenants read: bounded, as a whole.
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
    set_condition(
        &mut status.conditions,
        HEALTHY,
        if health.healthy {
            status::TRUE
        } else {
            status::FALSE
        },
        if health.healthy {
            "Healthy"
        } else {
            "Unhealthy"
        },
        capstan_api::bounded(
            &health.message.unwrap_or_default(),
            capstan_api::MAX_PLUGIN_TEXT,
        ),
        Some(generation),
        &t,
    );
    Ok(Some(health.healthy))
}

/// A plugin call's error as a status may show it: bounded.
fn plugin_text(error: &capstan_runtime::Error) -> String {
    capstan_api::bounded(&error.to_string(), capstan_api::MAX_PLUGIN_TEXT)
}

/// Whether an Addon is a tenant's: outside Capstan's own namespace.
fn is_tenant(ctx: &Context, addon: &Addon) -> bool {
    ctx.options
        .secrets_namespace
        .as_ref()
        .is_some_and(|own| addon.namespace().as_ref() != Some(own))
}

/// The field manager an Addon applies under: its own, so that no two
/// Addons share the ownership of a field.
fn field_manager(addon: &Addon) -> String {
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
    let object = ctx.stores.plugins.get(&key);
    let namespace = addon.namespace().unwrap_or_default();
    if let Some(p) = &object
        && !crate::registry::allowed_in(ctx, p, &namespace)
    {
        return Err(fail(
            APPLIED,
            "PluginNotAllowed",
            p.not_allowed_message(&namespace, ctx.options.secrets_namespace.as_deref()),
        ));
    }
    // A deleted Plugin's component stays registered; it serves no Addon.
    if let Some(r) = ctx.addons.get(name).filter(|_| object.is_some()) {
        return Ok(r);
    }
    let (message, waiting) = match object {
        None => (
            format!(
                "plugin {name:?} does not exist; create an addon Plugin named {name:?} (kubectl get plugins lists the installed ones)"
            ),
            false,
        ),
        Some(p) => match p.status.as_ref().and_then(|s| s.world.clone()) {
            Some(world) if world != "addon-plugin" => (
                format!("plugin {name:?} is a {world}, not an addon plugin"),
                false,
            ),
            _ => (
                format!("plugin {name:?} is not loaded yet (kubectl describe plugin {name})"),
                true,
            ),
        },
    };
    Err(Failure {
        waiting,
        ..fail(APPLIED, "PluginUnavailable", message)
    })
}

/// What an Addon renders to, ready to apply.
#[derive(Debug)]
pub struct Rendered {
    /// The version and how it was chosen.
    pub resolved: capstan_addons::Resolved,
    /// What the plugin was asked (also what `assess` is given).
    pub spec: WitSpec,
    /// The objects: labelled, patched, rewritten, granted, in apply order.
    pub objects: Vec<Object>,
    /// The image rewrites made.
    pub rewrites: Vec<capstan_api::ImageRewriteRecord>,
}

/// Why an Addon could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A plugin call failed.
    #[error("{error}")]
    Plugin {
        /// `versions` or `render`.
        call: &'static str,
        /// What happened.
        error: capstan_runtime::Error,
    },
    /// The Addon asks for something the render cannot give.
    #[error(transparent)]
    Addon(#[from] AddonError),
}

/// Resolve the version with the plugin, render, and run the pure steps
/// (label, patch within the patch grants — only those granted to tenants
/// when `tenant` —, rewrite images, check the objects against the kinds the
/// plugin's manifest declares, the grants and the host's floor, order). The controller
/// applies what this returns; `capstan addon render` prints it.
pub async fn render(
    plugin: &capstan_runtime::AddonPlugin,
    addon: &Addon,
    grants: &AddonGrants,
    tenant: bool,
    rewrites: &[capstan_addons::ImageRewrite],
    metrics: Option<&crate::Metrics>,
) -> Result<Rendered, RenderError> {
    let known: Vec<(String, Vec<String>)> =
        counted_call(metrics, addon, "versions", plugin.versions())
            .await
            .map_err(|error| RenderError::Plugin {
                call: "versions",
                error,
            })?
            .into_iter()
            .map(|v| (v.version, v.channels))
            .collect();
    let resolved = capstan_addons::resolve_version(
        addon.spec.version.as_deref(),
        addon.spec.channel.as_deref(),
        &known,
    )?;
    let spec = WitSpec {
        name: addon.name_any(),
        namespace: addon.namespace().unwrap_or_default(),
        version: Some(resolved.version.clone()),
        channel: addon.spec.channel.clone(),
        config: addon
            .spec
            .config
            .as_ref()
            .map_or_else(|| "{}".to_string(), ToString::to_string),
    };
    let texts = counted_call(metrics, addon, "render", plugin.render(&spec))
        .await
        .map_err(|error| RenderError::Plugin {
            call: "render",
            error,
        })?;
    let mut objects = capstan_addons::parse_render(&texts)?;
    capstan_addons::label(&mut objects, &spec.namespace, &spec.name);
    capstan_addons::apply_patches(
        &mut objects,
        &addon.spec.patches,
        &grants.patch_rules(tenant),
        tenant,
    )?;
    let rewrites = capstan_addons::rewrite_images(&mut objects, rewrites);
    let declared = &plugin.plugin().manifest().capabilities.objects;
    // On the objects as they will be applied: patched and rewritten.
    capstan_addons::check_grants(&objects, declared, &grants.objects, grants.pod_security)?;
    capstan_addons::apply_order(&mut objects);
    Ok(Rendered {
        resolved,
        spec,
        objects,
        rewrites,
    })
}

/// Run one call of an Addon's plugin, counting it in `metrics` (when
/// given) under the Plugin's name, as provider calls are.
async fn counted_call<T>(
    metrics: Option<&crate::Metrics>,
    addon: &Addon,
    function: &'static str,
    call: impl Future<Output = Result<T, capstan_runtime::Error>>,
) -> Result<T, capstan_runtime::Error> {
    let started = std::time::Instant::now();
    let result = call.await;
    if let Some(metrics) = metrics {
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics.plugin_call(&addon.spec.plugin, function, outcome, started.elapsed());
    }
    result
}

/// This cluster, or the workload cluster of the Addon's kubeconfig Secret.
async fn target(addon: &Addon, ctx: &Context) -> Result<Target, Failure> {
    let Some(t) = &addon.spec.target else {
        return Ok(Target {
            client: ctx.client.clone(),
            key: "in-cluster".into(),
            shown: "in-cluster".into(),
        });
    };
    let ns = addon.namespace().unwrap_or_default();
    let secret_ref = &t.kubeconfig_secret_ref;
    let key_name = secret_ref.key.as_deref().unwrap_or("value");
    let unavailable = |m: String| fail(APPLIED, "TargetUnavailable", m);
    if let Some(own) = &ctx.options.secrets_namespace
        && *own != ns
    {
        return Err(unavailable(format!(
            "spec.target: Capstan reads Secrets only from its own namespace {own:?}; create this Addon and its kubeconfig Secret there"
        )));
    }
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&secret_ref.name)
        .await
        .map_err(|e| unavailable(format!("cannot read Secret {ns}/{}: {e}", secret_ref.name)))?
        .ok_or_else(|| {
            unavailable(format!(
                "spec.target.kubeconfigSecretRef: Secret {ns}/{} does not exist",
                secret_ref.name
            ))
        })?;
    let version = secret.metadata.resource_version.clone().unwrap_or_default();
    let key = format!("{ns}/{}", secret_ref.name);
    let shown = format!("kubeconfig Secret {}", secret_ref.name);
    if let Some((v, client)) = ctx
        .addon_state
        .clients
        .lock()
        .expect("clients lock")
        .get(&key)
        && *v == version
    {
        return Ok(Target {
            client: client.clone(),
            key: format!("{key}@{version}"),
            shown,
        });
    }
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key_name))
        .ok_or_else(|| {
            unavailable(format!(
                "spec.target.kubeconfigSecretRef: Secret {ns}/{} has no key {key_name:?}",
                secret_ref.name
            ))
        })?;
    let text = String::from_utf8_lossy(&bytes.0);
    let bad = |e: String| {
        unavailable(format!(
            "Secret {ns}/{} key {key_name:?} is not a usable kubeconfig: {e}",
            secret_ref.name
        ))
    };
    // Before the loader sees it: no command runs, no file is read.
    capstan_addons::target::check_kubeconfig(&text).map_err(bad)?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| bad(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    let client = Client::try_from(config).map_err(|e| bad(e.to_string()))?;
    ctx.addon_state
        .clients
        .lock()
        .expect("clients lock")
        .insert(key.clone(), (version.clone(), client.clone()));
    Ok(Target {
        client,
        key: format!("{key}@{version}"),
        shown,
    })
}

/// The API resource of a kind in a target cluster and whether it is
/// namespaced (discovery, remembered per cluster).
async fn kind_of(
    ctx: &Context,
    target: &Target,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, bool), String> {
    let cache_key = (target.key.clone(), format!("{api_version}/{kind}"));
    if let Some(found) = ctx
        .addon_state
        .kinds
        .lock()
        .expect("kinds lock")
        .get(&cache_key)
    {
        return Ok(found.clone());
    }
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(&target.client, &gvk)
        .await
        .map_err(|e| {
            format!(
                "{target} does not serve {kind} {api_version}: {e}",
                target = target.shown
            )
        })?;
    let found = (resource, caps.scope == kube::discovery::Scope::Namespaced);
    ctx.addon_state
        .kinds
        .lock()
        .expect("kinds lock")
        .insert(cache_key, found.clone());
    Ok(found)
}

fn api_for(target: &Target, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(target.client.clone(), ns, resource),
        None => Api::all_with(target.client.clone(), resource),
    }
}

fn apply_failed(target: &Target, object: &Object, what: &str, e: kube::Error) -> Failure {
    fail(
        APPLIED,
        "ApplyFailed",
        format!("cannot {what} {} ({}): {e}", object.entry(), target.shown),
    )
}

/// The live object a rendered one would be applied over, if it exists.
async fn read_live(
    target: &Target,
    resource: &ApiResource,
    object: &Object,
) -> Result<Option<serde_json::Value>, Failure> {
    Ok(api_for(target, resource, object.namespace.as_deref())
        .get_opt(&object.name)
        .await
        .map_err(|e| apply_failed(target, object, "read", e))?
        .map(|o| serde_json::to_value(o).unwrap_or_default()))
}

/// Server-side apply the rendered object (under this Addon's own field
/// manager) only when the live one is missing or no longer carries it.
/// Returns the live object.
async fn apply_if_drifted(
    ctx: &Context,
    target: &Target,
    resource: &ApiResource,
    object: &Object,
    live: Option<serde_json::Value>,
    manager: &str,
    key: (String, String),
) -> Result<serde_json::Value, Failure> {
    let api = api_for(target, resource, object.namespace.as_deref());
    if let Some(live) = &live {
        let expected = ctx
            .addon_state
            .expected
            .lock()
            .expect("expected lock")
            .get(&key)
            .cloned();
        let desired = match &expected {
            Some((rendered, applied)) if *rendered == object.value => applied,
            _ => &object.value,
        };
        if capstan_addons::conforms(desired, live) {
            return Ok(live.clone());
        }
    }
    // Forced only over fields of an object this Addon owns (the ownership
    // check ran first): hand edits of what it renders are put back.
    let applied = api
        .patch(
            &object.name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&object.value),
        )
        .await
        .map_err(|e| apply_failed(target, object, "apply", e))?;
    let applied = serde_json::to_value(applied).unwrap_or_default();
    ctx.addon_state
        .expected
        .lock()
        .expect("expected lock")
        .insert(
            key,
            (
                object.value.clone(),
                capstan_addons::project(&object.value, &applied),
            ),
        );
    ctx.metrics.wrote(CONTROLLER, "apply");
    tracing::info!(object = %object.entry(), target = %target.shown, created = live.is_none(), "applied addon object");
    Ok(applied)
}

/// Delete one inventory object if it is still there and still ours.
async fn delete_entry(
    ctx: &Context,
    target: &Target,
    entry: &InventoryEntry,
    addon: &Addon,
) -> Result<Deleted, String> {
    let (resource, _) = match kind_of(ctx, target, &entry.api_version, &entry.kind).await {
        Ok(k) => k,
        // The kind itself is gone (its CRD was removed): so is the object.
        Err(_) => return Ok(Deleted::Gone),
    };
    let api = api_for(target, &resource, entry.namespace.as_deref());
    let live = api
        .get_opt(&entry.name)
        .await
        .map_err(|e| format!("cannot read {entry}: {e}"))?;
    let Some(live) = live else {
        return Ok(Deleted::Gone);
    };
    let ns = addon.namespace().unwrap_or_default();
    let value = serde_json::to_value(&live).unwrap_or_default();
    if !ownership::may_delete(entry, &value, (&ns, &addon.name_any())) {
        tracing::info!(object = %entry, adopted = entry.adopted, "leaving an inventory object this Addon did not create (or that was replaced)");
        return Ok(Deleted::Gone);
    }
    if live.metadata.deletion_timestamp.is_some() {
        return Ok(Deleted::Going);
    }
    // Only the very object recorded: a uid precondition, so an object
    // recreated under the same name in between is left alone.
    let mut params = DeleteParams::background();
    if let Some(uid) = &entry.uid {
        params = params.preconditions(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        });
    }
    match api.delete(&entry.name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(Deleted::Gone),
        Err(e) => return Err(format!("cannot delete {entry}: {e}")),
    }
    ctx.metrics.wrote(CONTROLLER, "delete");
    tracing::info!(object = %entry, target = %target.shown, "deleted addon object");
    Ok(Deleted::Going)
}

/// Where an inventory object is after [`delete_entry`].
#[derive(Debug, PartialEq, Eq)]
enum Deleted {
    Gone,
    Going,
}

/// Start (once per cluster, kind and namespace) a watch that reconciles
/// the Addon of any labelled object that changes or goes. Watches are
/// scoped to the namespace the object lives in (no cluster-wide LIST for a
/// namespaced object), back off on errors, and a changed target (a new
/// kubeconfig) replaces its watches instead of adding to them.
fn watch_kind(
    ctx: &Context,
    addon: &Addon,
    target: &Target,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> WatchKey {
    let (cluster, version) = target
        .key
        .split_once('@')
        .unwrap_or((target.key.as_str(), ""));
    let key = (
        cluster.to_string(),
        format!(
            "{}/{}@{}",
            resource.api_version,
            resource.kind,
            namespace.unwrap_or("")
        ),
    );
    // Claimed for this Addon before it exists, so another Addon's
    // clean-up cannot stop it in between.
    let mut by = ctx.addon_state.watched_by.lock().expect("watched_by lock");
    by.entry(addon.metadata.uid.clone().unwrap_or_default())
        .or_default()
        .insert(key.clone());
    let mut watches = ctx.addon_state.watches.lock().expect("watches lock");
    match watches.get(&key) {
        Some((v, _)) if v == version => return key,
        Some((_, old)) => old.abort(),
        None => {}
    }
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(target.client.clone(), ns, resource),
        None => Api::all_with(target.client.clone(), resource),
    };
    let trigger = ctx.addon_state.trigger.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(LABEL_ADDON_NAME);
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            let object = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => o,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "addon drift watch error; it retries");
                    continue;
                }
            };
            let labels = object.labels();
            if let (Some(name), Some(ns)) = (
                labels.get(LABEL_ADDON_NAME),
                labels.get(LABEL_ADDON_NAMESPACE),
            ) && trigger.send(ObjectRef::new(name).within(ns)).is_err()
            {
                return;
            }
        }
    });
    watches.insert(key.clone(), (version.to_string(), task));
    key
}

/// Record the watches an Addon needs now (none once it is gone) and stop
/// those no Addon needs any more.
fn need_watches(ctx: &Context, addon: &Addon, keys: std::collections::HashSet<WatchKey>) {
    let uid = addon.metadata.uid.clone().unwrap_or_default();
    let mut by = ctx.addon_state.watched_by.lock().expect("watched_by lock");
    if keys.is_empty() {
        by.remove(&uid);
    } else {
        by.insert(uid, keys);
    }
    let mut watches = ctx.addon_state.watches.lock().expect("watches lock");
    watches.retain(|key, (_, task)| {
        let needed = by.values().any(|keys| keys.contains(key));
        if !needed {
            task.abort();
        }
        needed
    });
}

/// Delete the inventory in reverse apply order; drop the finalizer once all
/// of it is gone.
async fn finalize(addon: &Addon, ctx: &Context) -> Result<Action, Error> {
    if !addon.finalizers().iter().any(|f| f == ADDON_FINALIZER) {
        return Ok(Action::await_change());
    }
    let current = addon.status.clone();
    let mut status = current.clone().unwrap_or_default();
    status.phase = Some("Deleting".into());
    let inventory = status.inventory.clone();
    let mut remaining = 0;
    let mut problem = None;
    match target(addon, ctx).await {
        Err(f) => {
            problem = Some(format!(
                "{}; the Addon keeps its finalizer until what it applied can be deleted (fix the target, or remove finalizer {ADDON_FINALIZER} to leave the objects behind)",
                f.message
            ))
        }
        Ok(target) => {
            for entry in inventory.iter().rev() {
                match delete_entry(ctx, &target, entry, addon).await {
                    Ok(Deleted::Gone) => {}
                    // A Namespace ends only when the namespace controller
                    // has emptied it, which can take long; its deletion
                    // is under way and nothing of the addon is left in it.
                    Ok(Deleted::Going) if entry.kind == "Namespace" => {}
                    Ok(Deleted::Going) => remaining += 1,
                    Err(m) => {
                        remaining += 1;
                        problem = Some(m);
                    }
                }
            }
        }
    }
    if let Some(message) = &problem {
        set_condition(
            &mut status.conditions,
            APPLIED,
            status::FALSE,
            "DeleteFailed",
            message.clone(),
            addon.metadata.generation,
            &now(),
        );
    }
    if remaining > 0 || problem.is_some() {
        apply_status(ctx, CONTROLLER, addon, current.as_ref(), &status).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let finalizers: Vec<String> = addon
        .finalizers()
        .iter()
        .filter(|f| *f != ADDON_FINALIZER)
        .cloned()
        .collect();
    crate::set_finalizers(ctx, CONTROLLER, addon, finalizers).await?;
    need_watches(ctx, addon, Default::default());
    let uid = addon.metadata.uid.clone().unwrap_or_default();
    ctx.addon_state
        .expected
        .lock()
        .expect("expected lock")
        .retain(|(of, _), _| *of != uid);
    tracing::info!(addon = %crate::key_of(addon), objects = inventory.len(), "addon removed with everything it applied");
    Ok(Action::await_change())
}
