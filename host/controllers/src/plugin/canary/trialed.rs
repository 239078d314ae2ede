//! The canary revision as each world serves it ([`Trialed`]), put beside
//! the serving revision where the code that calls it looks ([`Trialed::install`]),
//! and loaded once per revision and grants ([`hold`]).

use super::super::{Context, Failure, prepare};
use capstan_addons::engine::{AddonCanary, RegisteredAddon};
use capstan_api::Plugin;
use capstan_kit::canary::{CallCounts, Canary};
use capstan_kit::provider::{MachineProvider, WasmProvider};
use capstan_kit::registry::{
    BootstrapCanary, RegisteredBootstrap, RegisteredUpdater, UpdaterCanary,
};
use capstan_manifest::World;
use capstan_runtime::Grants;
use std::sync::Arc;

/// A canary this host has loaded, by Plugin name.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// The revision and the grants' fingerprint it was loaded with.
    pub(super) key: String,
    pub(super) canary: Trialed,
    pub(super) digest: String,
    pub(super) resolved_source: Option<String>,
    pub(super) signers: Vec<String>,
    pub(super) version: String,
    /// How many objects each revision served at the last pass.
    pub(super) window: Arc<std::sync::Mutex<WindowObjects>>,
}

/// The canary revision, by world.
#[derive(Debug, Clone)]
pub(super) enum Trialed {
    /// A provider: its unit is the Machine.
    Provider(Arc<Canary<Arc<dyn MachineProvider>>>),
    /// An addon plugin: its unit is the Addon.
    Addon(Arc<AddonCanary>),
    /// An in-place updater: its unit is the Machine.
    Updater(Arc<UpdaterCanary>),
    /// A bootstrap plugin: its unit is the Machine (its data, rendered once
    /// before the instance is created).
    Bootstrap(Arc<BootstrapCanary>),
}

/// The same for every kind of canary.
macro_rules! each {
    ($trialed:expr, $c:ident => $body:expr) => {
        match $trialed {
            Trialed::Provider($c) => $body,
            Trialed::Addon($c) => $body,
            Trialed::Updater($c) => $body,
            Trialed::Bootstrap($c) => $body,
        }
    };
}

impl Trialed {
    pub(super) fn counts(&self) -> &CallCounts {
        each!(self, c => &c.counts)
    }

    pub(super) fn serves(&self, uid: &str) -> bool {
        each!(self, c => c.serves(uid))
    }

    pub(super) fn assign(&self, serves: Vec<String>, considered: Vec<String>) {
        each!(self, c => c.assign(serves, considered))
    }

    pub(super) fn set_shadow(&self, shadow: bool) {
        each!(self, c => c.set_shadow(shadow))
    }

    pub(super) fn note_unhealthy(&self, uid: &str, canary: bool) {
        each!(self, c => c.note_unhealthy(uid, canary))
    }

    pub(super) fn take_unhealthy(&self) -> (u64, u64) {
        each!(self, c => c.take_unhealthy())
    }

    /// `Machines` or `Addons`: what it serves.
    pub(super) fn unit(&self) -> &'static str {
        match self {
            Trialed::Provider(_) | Trialed::Updater(_) | Trialed::Bootstrap(_) => "Machines",
            Trialed::Addon(_) => "Addons",
        }
    }

    /// The calls a shadow step mirrors to it (side-effect free ones).
    pub(super) fn mirrored_calls(&self) -> &'static str {
        match self {
            Trialed::Provider(_) => "get and validate calls",
            Trialed::Addon(_) => "versions, render and assess calls",
            Trialed::Updater(_) => "can-update calls",
            Trialed::Bootstrap(_) => "render calls",
        }
    }

    /// Serve beside the stable revision (once), and that revision's
    /// counts; `None` when the stable revision stopped serving.
    pub(super) fn install(&self, ctx: &Context, name: &str) -> Option<Arc<CallCounts>> {
        match self {
            Trialed::Provider(c) => {
                let registered = ctx.providers.get(name)?;
                if !registered
                    .canary
                    .as_ref()
                    .is_some_and(|r| Arc::ptr_eq(r, c))
                {
                    ctx.providers.set_canary(name, Some(c.clone()));
                }
                Some(registered.counts)
            }
            Trialed::Addon(c) => {
                let registered = ctx.addons.get(name)?;
                put(&registered.canary, c);
                Some(registered.counts.clone())
            }
            Trialed::Bootstrap(c) => {
                let registered = ctx.bootstraps.get(name)?;
                put(&registered.canary, c);
                Some(registered.counts.clone())
            }
            Trialed::Updater(c) => {
                let registered = ctx.updaters.get(name)?;
                put(&registered.canary, c);
                Some(registered.counts.clone())
            }
        }
    }
}

/// Put a canary in a serving revision's slot, unless it is there already.
fn put<T>(slot: &std::sync::RwLock<Option<Arc<T>>>, canary: &Arc<T>) {
    let mut slot = slot.write().expect("canary lock");
    if !slot.as_ref().is_some_and(|r| Arc::ptr_eq(r, canary)) {
        *slot = Some(canary.clone());
    }
}

/// A canary revision whose calls are counted where its caller counts
/// them (the revision's own counts).
fn counted<T>(registered: T, counts: &Arc<CallCounts>) -> Arc<Canary<Arc<T>>> {
    Arc::new(Canary::counted(Arc::new(registered), counts.clone()))
}

/// How many objects each revision served at the last pass.
#[derive(Debug, Default)]
pub(super) struct WindowObjects {
    pub(super) canary: u64,
    pub(super) stable: u64,
}

/// The canary for the spec's revision: the one this host holds when the
/// revision and grants are unchanged, else verified, fetched and loaded
/// (from the caches when it was before).
pub(super) async fn hold(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    found: super::super::Found,
    grants: Grants,
    fingerprint: &str,
) -> Result<Held, Failure> {
    let key = format!("{}|{fingerprint}", found.revision);
    let held = ctx
        .canaries
        .lock()
        .expect("canaries lock")
        .get(name)
        .filter(|h| h.key == key)
        .cloned();
    if let Some(held) = held {
        return Ok(held);
    }
    let prepared = prepare(plugin, ctx, name, found, grants).await?;
    let signers = prepared.fetched.signers.clone();
    let canary = match prepared.loaded.manifest().world {
        World::Addon => {
            let addon = prepared
                .loaded
                .addon()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            let signer = (!signers.is_empty()).then(|| signers.join(", "));
            let registered = RegisteredAddon {
                revision: "canary",
                ..RegisteredAddon::new(addon, prepared.addon_grants.clone(), signer)
            };
            let counts = registered.counts.clone();
            Trialed::Addon(counted(registered, &counts))
        }
        World::Bootstrap => {
            let bootstrap = prepared
                .loaded
                .bootstrap()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            let registered = RegisteredBootstrap {
                revision: "canary",
                ..RegisteredBootstrap::new(bootstrap)
            };
            let counts = registered.counts.clone();
            Trialed::Bootstrap(counted(registered, &counts))
        }
        World::Updater => {
            let updater = prepared
                .loaded
                .updater()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            // Routed per Machine only when it changes what the serving
            // revision changes: another set of fields would move field
            // ownership between updaters for a share of the fleet.
            let fields = |f: &[capstan_manifest::FieldPattern]| {
                let mut shown: Vec<String> = f.iter().map(ToString::to_string).collect();
                shown.sort();
                shown
            };
            let stable = ctx.updaters.get(name).map(|r| fields(&r.fields));
            let trial = fields(&prepared.update_fields);
            if let Some(stable) = stable.filter(|s| *s != trial) {
                return Err((
                    "CanaryRefused",
                    format!(
                        "an updater canary must change the fields the serving revision changes: it would update [{}], the serving revision updates [{}]; use Immediate (the fields are checked against the other updaters then)",
                        trial.join(", "),
                        stable.join(", ")
                    ),
                ));
            }
            let manifest = prepared.loaded.manifest().clone();
            let registered = RegisteredUpdater {
                plugin: updater,
                fields: prepared.update_fields.clone(),
                order: plugin.spec.update_order,
                progress_deadline: super::super::progress_deadline(plugin, &manifest)?,
                disruption: manifest.disruption.unwrap_or_default(),
                revision: "canary",
                counts: Arc::default(),
                canary: Arc::default(),
            };
            let counts = registered.counts.clone();
            Trialed::Updater(counted(registered, &counts))
        }
        _ => {
            let provider = prepared
                .loaded
                .provider()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            let provider = WasmProvider::new(provider)
                .signed_by(&signers)
                .with_settings(plugin.spec.settings.as_ref())
                .map_err(|m| ("InvalidSettings", m))?;
            Trialed::Provider(Arc::new(Canary::new(Arc::new(provider))))
        }
    };
    let held = Held {
        key,
        canary,
        digest: prepared.loaded.digest().to_string(),
        resolved_source: prepared.fetched.resolved_source.clone(),
        signers,
        version: prepared.loaded.manifest().version.clone(),
        window: Arc::default(),
    };
    tracing::info!(plugin = %name, digest = %held.digest, "canary loaded ({})", prepared.message);
    ctx.canaries
        .lock()
        .expect("canaries lock")
        .insert(name.to_string(), held.clone());
    Ok(held)
}

/// Stop serving a Plugin's canary, if it has one.
pub(crate) fn drop_canary(ctx: &Context, name: &str) {
    ctx.providers.set_canary(name, None);
    if let Some(addon) = ctx.addons.get(name) {
        *addon.canary.write().expect("canary lock") = None;
    }
    if let Some(updater) = ctx.updaters.get(name) {
        *updater.canary.write().expect("canary lock") = None;
    }
    if let Some(bootstrap) = ctx.bootstraps.get(name) {
        *bootstrap.canary.write().expect("canary lock") = None;
    }
    ctx.canaries.lock().expect("canaries lock").remove(name);
}
