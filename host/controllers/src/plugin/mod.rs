//! The Plugin controller: fetch each plugin (a local file, or an OCI
//! artifact resolved, verified and pulled through `capstan-registry`), check
//! that its grants cover every capability it declares (HTTP destinations,
//! credential slots, object kinds), load it into the sandbox, and register
//! it as a provider, an in-place updater or an addon plugin.
//!
//! Order matters and never changes: resolve the manifest → check grants
//! against the declared capabilities (read from the manifest, before any
//! download) → verify signatures (cached by digest) → download the
//! component (digest-checked, cached) → compile (cached) → swap. A revision
//! that fails any step is not activated; the previous one keeps serving and
//! `UpToDate=False` says exactly why — after a restart too: with nothing
//! serving, the last activated OCI revision (`status.resolvedSource`) is
//! fetched, verified and loaded again (from the caches when the registry is
//! down) instead of leaving the Plugin's objects without a provider.
//!
//! Revocation is immediate: credential Secrets are watched, and a serving
//! revision whose grants were narrowed, or whose credential Secret was
//! deleted, is either registered again with what is still granted or
//! stops serving (`Ready=False`) in the same reconcile — never left serving
//! with what it was granted before.

use capstan_addons::engine::{Addons, RegisteredAddon};
use capstan_api::{Plugin, PluginStatus, status};
use capstan_kit::controller::Spec;
use capstan_kit::provider::{Providers, Registered, WasmProvider};
use capstan_kit::registry::{RegisteredUpdater, Updaters};
use capstan_kit::write::{apply_status, record_event};
use capstan_kit::{Conditions, Error, Kube, now};
use capstan_registry::policy::TrustPolicy;
use capstan_registry::verify::Puller;
use capstan_runtime::{Grants, Limits, World};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

mod canary;
mod fetch;
mod load;
use load::*;
mod grants;
mod orphans;

use fetch::{Found, fetch_verified, find};
use grants::{
    check_field_ownership, granted_update_fields, grants, grants_fingerprint, revoke,
    serving_fingerprint,
};

const CONTROLLER: &str = "plugin";
/// The condition type on a Plugin: a revision is serving.
pub const READY: &str = "Ready";
/// The condition type on a Plugin: the serving revision is the one the spec names.
pub const UP_TO_DATE: &str = "UpToDate";

/// How `oci://` sources are fetched and whom they must be signed by.
#[derive(Debug)]
pub struct Supply {
    /// Registry client, blob and verification cache, mirrors.
    pub puller: Puller,
    /// The host's trust policy (`--trust-policy`): every source needs a
    /// rule in it (a Plugin's `spec.verification` only adds to that rule).
    pub policy: Option<TrustPolicy>,
}

/// What identifies a loaded revision: the OCI manifest digest for `oci://`
/// sources, the component digest for files.
pub(crate) type Revision = String;

pub(crate) type Failure = (&'static str, String);

/// What the Plugin controller works with: the sandbox, the registries it
/// fills, and how it fetches and trusts plugins.
pub(crate) struct Context {
    kube: Kube,
    /// The sandbox plugins load into (`None` runs only built-in providers).
    runtime: Option<capstan_runtime::Runtime>,
    providers: Providers,
    updaters: Updaters,
    bootstraps: capstan_kit::registry::Bootstraps,
    addons: Addons,
    /// Activating an updater checks its fields against the others and
    /// registers it as one step.
    updater_activation: tokio::sync::Mutex<()>,
    /// Plugins loaded so far: name → (generation, revision), so an idle
    /// reconcile does not reload.
    loaded: std::sync::Mutex<std::collections::HashMap<String, (i64, Revision)>>,
    /// Canaries loaded so far, by Plugin name.
    canaries: std::sync::Mutex<std::collections::HashMap<String, canary::Held>>,
    /// Each Plugin's quota, kept while its spec is unchanged so every
    /// revision that serves at once (the old one until the new one is
    /// registered) counts against the same allowance.
    quotas: std::sync::Mutex<std::collections::HashMap<String, capstan_runtime::Quota>>,
    /// When each provider Plugin's last orphan scan ran and the instances
    /// it found unowned, by Plugin name ([`orphans`]).
    orphan_scans: std::sync::Mutex<
        std::collections::HashMap<String, (std::time::Instant, std::collections::BTreeSet<String>)>,
    >,
    /// How often a provider Plugin is scanned for orphans.
    orphan_scan: Duration,
    /// Registry access and trust for `oci://` sources.
    supply: Option<Arc<Supply>>,
    /// `file://` directories whose plugins load unsigned.
    unsigned_plugin_dirs: Vec<capstan_registry::Scope>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("plugin::Context").finish_non_exhaustive()
    }
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

impl Context {
    /// The Plugin controller's context: it registers what it loads in
    /// `providers`, `updaters`, `bootstraps` and `addons`.
    pub(crate) fn new(
        kube: Kube,
        runtime: Option<capstan_runtime::Runtime>,
        providers: Providers,
        updaters: Updaters,
        bootstraps: capstan_kit::registry::Bootstraps,
        addons: Addons,
        options: &crate::Options,
    ) -> Self {
        Context {
            kube,
            runtime,
            providers,
            updaters,
            bootstraps,
            addons,
            updater_activation: tokio::sync::Mutex::default(),
            loaded: std::sync::Mutex::default(),
            canaries: std::sync::Mutex::default(),
            quotas: std::sync::Mutex::default(),
            orphan_scans: std::sync::Mutex::default(),
            orphan_scan: options.orphan_scan,
            supply: options.supply.clone(),
            unsigned_plugin_dirs: options.unsigned_plugin_dirs.clone(),
        }
    }
}

pub(crate) async fn controller(
    plugins: ReflectHandle<Plugin>,
    ctx: Arc<Context>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let secrets: Api<Secret> = match &ctx.kube.secrets_namespace {
        Some(ns) => Api::namespaced(ctx.kube.client.clone(), ns),
        None => Api::all(ctx.kube.client.clone()),
    };
    let store = ctx.kube.stores.plugins.clone();
    let by_secret = store.clone();
    // A credential Secret changed or deleted: its Plugins at once.
    let watches = move |controller: Controller<Plugin>| {
        controller.watches(
            secrets,
            kube::runtime::watcher::Config::default(),
            move |secret: Secret| {
                let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
                by_secret
                    .state()
                    .into_iter()
                    .filter(|p| {
                        p.spec
                            .grants
                            .credentials
                            .iter()
                            .any(|c| c.secret_ref.namespace == ns && c.secret_ref.name == name)
                    })
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
    };
    let spec = Spec::new(CONTROLLER, plugins, store, concurrency);
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// One pass over a Plugin: its grants first (what an admin narrowed is
/// taken away now), then load the revision the spec names if it changed,
/// revoke what may no longer serve, and write the status once.
async fn reconcile(plugin: Arc<Plugin>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = plugin.name_any();
    let generation = plugin.metadata.generation.unwrap_or(0);
    let mut status = plugin.status.clone().unwrap_or_default();
    let current = plugin.status.clone();
    status.observed_generation = Some(generation);
    // Grants first, every time: what an admin narrowed or deleted is
    // taken away in this reconcile, whatever happens to the revision.
    let granted = grants(&plugin, &ctx).await;
    let fingerprint = match &granted {
        Ok((_, secret_versions)) => Some(grants_fingerprint(&plugin, secret_versions)),
        // A transient read error says nothing about what is granted.
        Err((reason, _)) if *reason == "CredentialUnavailable" => serving_fingerprint(&ctx, &name),
        Err(_) => None,
    };
    let (outcome, mut restored, trial) =
        activate(&plugin, &ctx, granted, fingerprint.clone(), &mut status).await;
    if outcome.is_err() && serving_fingerprint(&ctx, &name) != fingerprint {
        revoke(&ctx, &name);
    }
    let at = (Some(generation), now());
    // What `kubectl describe plugin` should tell, if this reconcile changes
    // the status: a revision activated, or one refused.
    let (settled, event) = match outcome {
        Ok(Some(loaded)) if restored.is_some() => {
            let (reason, message) = restored.take().expect("checked");
            activated(&mut status, &plugin, loaded, &at);
            // Said once, whatever the status write: it happens once per
            // start, and the conditions read the same as before it.
            let note = format!(
                "the spec's revision failed ({reason}: {message}); restored {}, the last activated revision, verified again under today's policy",
                status.resolved_source.clone().unwrap_or_default()
            );
            let object = plugin.object_ref(&());
            record_event(
                &ctx.kube,
                CONTROLLER,
                &object,
                EventType::Warning,
                "Restored",
                note,
            )
            .await;
            (
                false,
                Some(refused(&mut status, reason, message, true, &at)),
            )
        }
        Ok(Some(loaded)) => (true, Some(activated(&mut status, &plugin, loaded, &at))),
        // A canary serves part of the Machines: the spec's revision is not
        // yet the one serving them all.
        Ok(None) if trial.is_some() => {
            let (reason, message, _) = trial.clone().expect("checked");
            Conditions::new(&mut status.conditions, at.0, &at.1).set(
                UP_TO_DATE,
                status::FALSE,
                reason,
                message,
            );
            (false, None)
        }
        // Unchanged: the serving revision is still the spec's.
        Ok(None) => (true, None),
        Err((reason, message)) => {
            let serving = serving_fingerprint(&ctx, &name).is_some();
            tracing::warn!(plugin = %name, reason, %message, serving, "plugin revision not activated");
            let event = refused(&mut status, reason, message, serving, &at);
            (false, Some(event))
        }
    };
    if settled {
        Conditions::new(&mut status.conditions, at.0, &at.1).set(
            UP_TO_DATE,
            status::TRUE,
            "Active",
            "the revision the spec names is serving",
        );
    }
    orphans::scan(&plugin, &ctx, &mut status).await;
    let changed = apply_status(
        &ctx.kube,
        CONTROLLER,
        plugin.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    if let Some((type_, reason, note)) = event.filter(|_| changed) {
        let object = plugin.object_ref(&());
        record_event(&ctx.kube, CONTROLLER, &object, type_, reason, note).await;
    }
    Ok(Action::requeue(match trial {
        Some((_, _, requeue)) => requeue,
        None if settled => ctx.kube.resync,
        None => Duration::from_secs(30),
    }))
}

/// What this reconcile serves: the spec's revision loaded (or the last
/// activated one restored when it fails with nothing serving after a
/// restart: the second value is the spec's failure then), or a canary
/// serving part of the objects (`spec.rollout`: the third value, its
/// `UpToDate` reason and message and when to look again).
async fn activate(
    plugin: &Plugin,
    ctx: &Context,
    granted: Result<(Grants, String), Failure>,
    fingerprint: Option<String>,
    status: &mut capstan_api::PluginStatus,
) -> (
    Result<Option<Loaded>, Failure>,
    Option<Failure>,
    Option<(&'static str, String, Duration)>,
) {
    let name = plugin.name_any();
    let generation = plugin.metadata.generation.unwrap_or(0);
    let (g, _) = match granted {
        Ok(granted) => granted,
        Err(f) => {
            canary::drop_canary(ctx, &name);
            return (Err(f), None, None);
        }
    };
    let fingerprint = fingerprint.unwrap_or_default();
    let at = (name.as_str(), generation);
    match canary::reconcile(plugin, ctx, at, g.clone(), fingerprint.clone(), status).await {
        Ok(canary::Trial::NotNeeded) => {
            let (outcome, restored) =
                load_or_restore(plugin, ctx, &name, generation, g, fingerprint).await;
            (outcome, restored, None)
        }
        Ok(canary::Trial::Promoted(loaded)) => (Ok(Some(*loaded)), None, None),
        Ok(canary::Trial::Serving {
            reason,
            message,
            requeue,
        }) => (Ok(None), None, Some((reason, message, requeue))),
        Err(f) => (Err(f), None, None),
    }
}

/// [`load`] the spec's revision; when it fails and nothing serves (a
/// fresh process), load the last activated one ([`last_activated`])
/// instead. The second value is the spec's failure when that happened.
async fn load_or_restore(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    generation: i64,
    grants: Grants,
    fingerprint: String,
) -> (Result<Option<Loaded>, Failure>, Option<Failure>) {
    let failure = match load(
        plugin,
        ctx,
        name,
        generation,
        grants.clone(),
        fingerprint.clone(),
    )
    .await
    {
        Err(failure) if serving_fingerprint(ctx, name).is_none() => failure,
        outcome => return (outcome, None),
    };
    let Some(pinned) = last_activated(plugin) else {
        return (Err(failure), None);
    };
    match load(&pinned, ctx, name, generation, grants, fingerprint).await {
        Ok(loaded) => (Ok(loaded), Some(failure)),
        Err(_) => (Err(failure), None),
    }
}

/// The Plugin as it was when its status last recorded an activated OCI
/// revision, pinned to that revision's digest — what served before this
/// host (re)started — when it differs from what the spec names. It is
/// fetched, verified under today's policies and grants, and loaded like
/// any revision (offline, from the caches, when the registry is down).
fn last_activated(plugin: &Plugin) -> Option<Plugin> {
    let pinned = plugin.status.as_ref()?.resolved_source.clone()?;
    if pinned == plugin.spec.source {
        return None;
    }
    let mut restored = plugin.clone();
    restored.spec.source = pinned;
    Some(restored)
}

/// An Event to record if the status changed: type, reason, note.
type Note = (EventType, &'static str, String);

/// Record a newly activated revision in the status; the Event that says so.
fn activated(
    status: &mut PluginStatus,
    plugin: &Plugin,
    loaded: Loaded,
    (generation, t): &(Option<i64>, capstan_api::Time),
) -> Note {
    let serving = loaded
        .resolved_source
        .clone()
        .unwrap_or_else(|| format!("{} ({})", plugin.spec.source, loaded.digest));
    let note = format!(
        "now serving {serving} (version {}){}; {}",
        loaded.version,
        shown_signers(&loaded.signers),
        loaded.message
    );
    if status.resolved_source != loaded.resolved_source
        || status.digest.as_ref() != Some(&loaded.digest)
    {
        remember(status, plugin);
        status.previous_source = status
            .resolved_source
            .clone()
            .or_else(|| {
                status
                    .digest
                    .as_ref()
                    .map(|d| format!("{} ({d})", plugin.spec.source))
            })
            .filter(|_| status.digest.is_some());
    }
    status.digest = Some(loaded.digest);
    status.resolved_source = loaded.resolved_source;
    status.fetched_from = loaded.fetched_from;
    status.signers = loaded.signers;
    status.world = Some(loaded.world);
    status.version = Some(loaded.version);
    status.contract = Some(loaded.contract);
    status.declared_http = loaded.declared_http;
    status.update_fields = loaded.update_fields;
    status.declared_objects = loaded.declared_objects;
    Conditions::new(&mut status.conditions, *generation, t).set(
        READY,
        status::TRUE,
        "Loaded",
        loaded.message,
    );
    (EventType::Normal, "Activated", note)
}

/// `, signed by …` for a revision's verified signers (nothing when
/// unsigned).
fn shown_signers(signers: &[String]) -> String {
    if signers.is_empty() {
        String::new()
    } else {
        format!(", signed by {}", signers.join(", "))
    }
}

/// Put the serving revision at the front of `status.history` before
/// another replaces it (at most `spec.rollout.revisionHistoryLimit`,
/// default 3; the caches keep their bytes and code).
fn remember(status: &mut PluginStatus, plugin: &Plugin) {
    let Some(serving) = status.resolved_source.clone().or_else(|| {
        status
            .digest
            .as_ref()
            .map(|d| format!("{} ({d})", plugin.spec.source))
    }) else {
        return;
    };
    let limit = plugin
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.revision_history_limit)
        .unwrap_or(DEFAULT_REVISION_HISTORY) as usize;
    status.history.retain(|h| *h != serving);
    status.history.insert(0, serving);
    status.history.truncate(limit);
}

/// Revisions listed in `status.history` when `spec.rollout` does not say.
const DEFAULT_REVISION_HISTORY: u32 = 3;

/// Record a refused revision in the status (`UpToDate=False`, and
/// `Ready=False` too when nothing serves); the Event that says so.
fn refused(
    status: &mut PluginStatus,
    reason: &'static str,
    message: String,
    serving: bool,
    (generation, t): &(Option<i64>, capstan_api::Time),
) -> Note {
    let still = status
        .resolved_source
        .clone()
        .or(status.digest.clone())
        .unwrap_or_default();
    let mut conditions = Conditions::new(&mut status.conditions, *generation, t);
    let message = if serving {
        format!("{message}; still serving {still}")
    } else {
        // Nothing serves: the plugin itself is not ready.
        conditions.set(READY, status::FALSE, reason, message.clone());
        message
    };
    conditions.set(UP_TO_DATE, status::FALSE, reason, message.clone());
    (EventType::Warning, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bytes_must_hold_every_concurrent_call_at_its_most() {
        let limits = Limits::default();
        let per_call = limits.host_bytes_per_call();
        let quota = |calls, bytes| capstan_api::PluginQuota {
            concurrent_calls: calls,
            host_bytes: Some(bytes),
            ..Default::default()
        };
        assert!(host_bytes_fit(quota(Some(4), 4 * per_call), &limits).is_ok());
        let (reason, message) =
            host_bytes_fit(quota(Some(4), 4 * per_call - 1), &limits).expect_err("one byte short");
        assert_eq!(reason, "HostBytesTooSmall");
        assert!(
            message.contains("4 concurrent calls")
                && message.contains(&format!("{per_call} bytes each")),
            "{message}"
        );
        // Unset concurrentCalls counts as its default.
        let default = u64::from(capstan_api::PluginQuota::DEFAULT_CONCURRENT_CALLS);
        assert!(host_bytes_fit(quota(None, default * per_call - 1), &limits).is_err());
        assert!(host_bytes_fit(quota(None, default * per_call), &limits).is_ok());
        // A smaller memory limit makes a call cheaper.
        let small = Limits {
            memory_bytes: 16 * 1024 * 1024,
            ..Limits::default()
        };
        assert!(host_bytes_fit(quota(Some(4), 4 * per_call - 1), &small).is_ok());
        // Unset hostBytes: no bound.
        assert!(host_bytes_fit(capstan_api::PluginQuota::default(), &limits).is_ok());
    }
}
