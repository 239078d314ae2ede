//! A provider Plugin's canary (`spec.rollout.strategy: Canary`): a new
//! revision serves a growing share of the Machines, each step's window is
//! judged against the stable revision's calls in the same window, and it is
//! promoted or rolled back by itself.
//!
//! Start with [`reconcile`]: it keeps the stable revision serving (the one
//! the status records, loaded again after a restart), loads the spec's
//! revision beside it as a [`Canary`], judges a window when one ends
//! (`capstan_planner::canary`), and picks the Machines the canary serves.
//! Its state lives in `status.canary`, so a restarted host resumes the same
//! step and window; `spec.source` is never rewritten.

use super::{Context, Failure, Loaded, Note, find, last_activated, load, prepare, shown_signers};
use capstan_addons::engine::{AddonCanary, RegisteredAddon};
use capstan_api::{
    ANNOTATION_CANARY_ACTION, CallTally, CanaryPhase, CanaryStatus, CanaryWindow, Plugin,
    PluginRollout, PluginStatus,
};
use capstan_kit::canary::{CallCounts, Canary};
use capstan_kit::provider::{MachineProvider, WasmProvider};
use capstan_kit::registry::{
    BootstrapCanary, RegisteredBootstrap, RegisteredUpdater, UpdaterCanary,
};
use capstan_kit::write::record_event;
use capstan_manifest::World;
use capstan_planner::canary::{self as plan, Action, Analysis, Phase, Progress, Tally, Verdict};
use capstan_runtime::Grants;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// How often the Machines a canary serves are picked again while it runs
/// (new Machines wait for it before they are created) and their health
/// looked at, at most.
const REASSIGN_EVERY: Duration = Duration::from_secs(2);
/// Judged windows kept in `status.canary.windows`.
const WINDOWS_KEPT: usize = 10;
/// Rolled-back revisions kept in `status.rejected`.
const REJECTED_KEPT: usize = 10;

/// A canary this host has loaded, by Plugin name.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// The revision and the grants' fingerprint it was loaded with.
    key: String,
    canary: Trialed,
    digest: String,
    resolved_source: Option<String>,
    signers: Vec<String>,
    version: String,
    /// How many objects each revision served at the last pass.
    window: Arc<std::sync::Mutex<WindowObjects>>,
}

/// The canary revision, by world.
#[derive(Debug, Clone)]
enum Trialed {
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
    fn counts(&self) -> &CallCounts {
        each!(self, c => &c.counts)
    }

    fn serves(&self, uid: &str) -> bool {
        each!(self, c => c.serves(uid))
    }

    fn assign(&self, serves: Vec<String>, considered: Vec<String>) {
        each!(self, c => c.assign(serves, considered))
    }

    fn set_shadow(&self, shadow: bool) {
        each!(self, c => c.set_shadow(shadow))
    }

    fn note_unhealthy(&self, uid: &str, canary: bool) {
        each!(self, c => c.note_unhealthy(uid, canary))
    }

    fn take_unhealthy(&self) -> (u64, u64) {
        each!(self, c => c.take_unhealthy())
    }

    /// `Machines` or `Addons`: what it serves.
    fn unit(&self) -> &'static str {
        match self {
            Trialed::Provider(_) | Trialed::Updater(_) | Trialed::Bootstrap(_) => "Machines",
            Trialed::Addon(_) => "Addons",
        }
    }

    /// Serve beside the stable revision (once), and that revision's
    /// counts; `None` when the stable revision stopped serving.
    fn install(&self, ctx: &Context, name: &str) -> Option<Arc<CallCounts>> {
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
struct WindowObjects {
    canary: u64,
    stable: u64,
}

/// What the canary step decided.
pub(super) enum Trial {
    /// No canary: the strategy is `Immediate`, nothing served yet (the
    /// first revision serves at once), or the spec names the serving
    /// revision. The Immediate path applies.
    NotNeeded,
    /// A canary serves part of the Machines (or Addons): `UpToDate=False`
    /// with this reason and message, and when to look again.
    Serving {
        reason: &'static str,
        message: String,
        requeue: Duration,
    },
    /// Promoted: the spec's revision now serves every object.
    Promoted(Box<Loaded>),
}

/// One pass of a Plugin's canary (see the module docs). `Err` is what the
/// conditions show, the stable revision still serving.
pub(super) async fn reconcile(
    plugin: &Plugin,
    ctx: &Context,
    (name, generation): (&str, i64),
    grants: Grants,
    fingerprint: String,
    status: &mut PluginStatus,
) -> Result<Trial, Failure> {
    let rollout = plugin.spec.rollout.clone().unwrap_or_default();
    if let Some(problem) = rollout.problem() {
        return Err(("InvalidSpec", problem));
    }
    if !rollout.is_canary() || status.digest.is_none() {
        drop_canary(ctx, name);
        // The strategy changed mid-trial: the spec's revision serves every
        // object at once, and the trial says it ended.
        settle(status, "spec.rollout.strategy is no longer Canary");
        return Ok(Trial::NotNeeded);
    }
    // The stable revision: the one the status records as serving, loaded
    // again when this host has not (a restart) or the grants changed.
    match last_activated(plugin) {
        Some(pinned) => {
            load(&pinned, ctx, name, generation, grants.clone(), fingerprint.clone())
                .await
                .map_err(|(reason, message)| {
                    (
                        reason,
                        format!(
                            "the serving revision {} could not be loaded again, so no canary is served: {message}",
                            pinned.spec.source
                        ),
                    )
                })?;
        }
        // A `file://` stable is not recorded by reference: after a restart
        // the spec's revision serves at once (file sources are for
        // development).
        None if super::serving_fingerprint(ctx, name).is_none() => return Ok(Trial::NotNeeded),
        None => {}
    }
    let found = find(plugin, ctx).await?;
    let stable_revision = ctx
        .loaded
        .lock()
        .expect("loaded lock")
        .get(name)
        .and_then(|(_, key)| key.split_once('|').map(|(r, _)| r.to_string()));
    if stable_revision.as_deref() == Some(found.revision.as_str()) {
        drop_canary(ctx, name);
        settle(status, "spec.source names the serving revision again");
        return Ok(Trial::NotNeeded);
    }
    if status.rejected.contains(&found.revision) {
        drop_canary(ctx, name);
        let why = status
            .canary
            .as_ref()
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        return Err((
            "CanaryRolledBack",
            format!(
                "revision {} was rolled back as a canary and is not tried again ({why}); push a fixed revision, or pin spec.source to the serving one",
                found.revision
            ),
        ));
    }
    match found.manifest.world {
        World::Provider => {}
        World::Addon | World::Updater | World::Bootstrap => {
            if let Some(i) = rollout.steps.iter().position(|s| s.shadow) {
                return Err((
                    "InvalidSpec",
                    format!(
                        "spec.rollout.steps[{i}].shadow: shadow steps mirror provider calls; an {} plugin's canary starts with a weighted step",
                        found.manifest.world
                    ),
                ));
            }
        }
    }
    let held = hold(plugin, ctx, name, found, grants.clone(), &fingerprint).await?;
    let Some(stable_counts) = held.canary.install(ctx, name) else {
        return Err((
            "LoadFailed",
            "the stable revision stopped serving while its canary was loaded".into(),
        ));
    };
    let unit = held.canary.unit();

    let weights: Vec<u32> = rollout.steps.iter().map(|s| s.weight).collect();
    let analysis = analysis_of(&rollout);
    let t = capstan_kit::now();
    let object = plugin.object_ref(&());
    let mut events: Vec<Note> = vec![];
    if status
        .canary
        .as_ref()
        .is_none_or(|c| c.digest != held.digest)
    {
        // A new trial: windows start empty.
        held.canary.counts().take();
        stable_counts.take();
        *held.window.lock().expect("window lock") = WindowObjects::default();
        held.canary.take_unhealthy();
        let source = held
            .resolved_source
            .clone()
            .unwrap_or_else(|| format!("{} ({})", plugin.spec.source, held.digest));
        let first = if rollout.steps[0].shadow {
            "shadows the serving revision (mirrored get and validate calls, compared)".to_string()
        } else {
            format!("serves up to {}% of the {unit}", weights[0])
        };
        events.push((
            EventType::Normal,
            "CanaryStarted",
            format!(
                "canary {source} (version {}{}) {first} for {}s; the serving revision serves the rest",
                held.version,
                shown_signers(&held.signers),
                rollout.steps[0].duration_seconds
            ),
        ));
        status.canary = Some(CanaryStatus {
            source,
            digest: held.digest.clone(),
            version: Some(held.version.clone()),
            signers: held.signers.clone(),
            phase: CanaryPhase::Progressing,
            step: 0,
            weight: weights[0],
            objects: 0,
            window_start: Some(t.clone()),
            failures: 0,
            inconclusive: 0,
            windows: vec![],
            message: None,
        });
    }
    let c = status.canary.as_mut().expect("set above");
    let mut progress = progress_of(c);
    let mut requeue = REASSIGN_EVERY;
    if let Some(action) = asked(plugin, &c.digest) {
        let before = progress;
        progress = plan::act(progress, action);
        if progress != before {
            c.message = Some(match action {
                Action::Promote => "promoted by hand (capstan plugin promote)".into(),
                Action::Abort => "aborted by hand (capstan plugin abort)".into(),
            });
        }
    }
    if !progress.is_final() {
        let step = &rollout.steps[progress.step.min(rollout.steps.len() - 1)];
        let started = c.window_start.clone().unwrap_or_else(|| t.clone());
        let ends = started.0.as_second() + i64::from(step.duration_seconds);
        let left = ends - t.0.as_second();
        if left <= 0 {
            let mut canary = held.canary.counts().take();
            let mut stable = stable_counts.take();
            {
                let seen = held.window.lock().expect("window lock");
                (canary.objects, stable.objects) = (seen.canary, seen.stable);
            }
            (canary.unhealthy, stable.unhealthy) = held.canary.take_unhealthy();
            let verdict = plan::judge(tally(canary), tally(stable), &analysis);
            let weight = progress.weight(&weights);
            let at_step = progress.step;
            progress = plan::advance(progress, &verdict, weights.len(), &analysis);
            c.windows.push(CanaryWindow {
                step: at_step as u32,
                weight,
                canary,
                stable,
                verdict: verdict.name().into(),
                reason: verdict.reason().into(),
            });
            let excess = c.windows.len().saturating_sub(WINDOWS_KEPT);
            c.windows.drain(..excess);
            c.window_start = Some(t.clone());
            c.message = Some(format!(
                "step {} of {} (weight {weight}%): {}: {}",
                at_step + 1,
                weights.len(),
                verdict.name(),
                verdict.reason()
            ));
            events.push(window_event(&verdict, at_step, weights.len(), weight));
            if progress.phase == Phase::Paused && !matches!(verdict, Verdict::Pass(_)) {
                events.push((
                    EventType::Warning,
                    "CanaryPaused",
                    format!(
                        "{} inconclusive windows in a row (inconclusiveLimit {}): the canary keeps its {weight}% until capstan plugin promote or abort",
                        progress.inconclusive, analysis.inconclusive_limit
                    ),
                ));
            }
        } else {
            requeue = requeue.min(Duration::from_secs(left as u64));
        }
    }
    c.phase = phase_of(progress.phase);
    c.step = progress.step as u32;
    c.weight = progress.weight(&weights);
    c.failures = progress.failures;
    c.inconclusive = progress.inconclusive;
    let shown = c.source.clone();
    let why = c.message.clone().unwrap_or_default();
    let outcome = match progress.phase {
        Phase::RolledBack => {
            drop_canary(ctx, name);
            c.objects = 0;
            let revision = held.key.split_once('|').map(|(r, _)| r.to_string());
            if let Some(revision) = revision {
                status.rejected.retain(|r| *r != revision);
                status.rejected.insert(0, revision);
                status.rejected.truncate(REJECTED_KEPT);
            }
            let message = format!(
                "canary {shown} rolled back ({why}); the stable revision serves every one of its {unit} again"
            );
            events.push((EventType::Warning, "CanaryRolledBack", message.clone()));
            Err(("CanaryRolledBack", message))
        }
        Phase::Promoted => {
            let loaded = load(plugin, ctx, name, generation, grants, fingerprint).await?;
            ctx.canaries.lock().expect("canaries lock").remove(name);
            c.objects = 0;
            events.push((
                EventType::Normal,
                "CanaryPromoted",
                format!("canary {shown} promoted: it now serves all its {unit} ({why})"),
            ));
            match loaded {
                Some(loaded) => Ok(Trial::Promoted(Box::new(loaded))),
                None => Ok(Trial::NotNeeded),
            }
        }
        Phase::Progressing | Phase::Paused => {
            let shadowing = rollout.steps[progress.step.min(rollout.steps.len() - 1)].shadow;
            held.canary.set_shadow(shadowing);
            let units = match held.canary {
                Trialed::Provider(_) => machine_units(plugin, ctx, &rollout, &held.digest),
                Trialed::Addon(_) => addon_units(plugin, ctx, &rollout, &held.digest),
                Trialed::Updater(_) => updated_units(plugin, ctx, &rollout, &held.digest),
                Trialed::Bootstrap(_) => bootstrapped_units(plugin, ctx, &rollout),
            };
            let (serves, of) = assign(&held, c.weight, units);
            c.objects = serves as u32;
            let paused = progress.phase == Phase::Paused;
            if shadowing && !paused {
                c.phase = CanaryPhase::Shadow;
            }
            let doing = if shadowing {
                format!(
                    "shadows the revision serving all {of} {unit} (their get and validate calls are mirrored to it and compared)"
                )
            } else {
                format!("serves {serves} of {of} {unit}")
            };
            Ok(Trial::Serving {
                reason: if paused {
                    "CanaryPaused"
                } else {
                    "CanaryProgressing"
                },
                message: format!(
                    "canary {shown} {doing} (step {} of {}, weight {}%){}; the revision before it serves the rest",
                    progress.step + 1,
                    weights.len(),
                    c.weight,
                    if paused {
                        ": paused, waiting for capstan plugin promote or abort"
                    } else {
                        ""
                    }
                ),
                requeue,
            })
        }
    };
    for (type_, reason, note) in events {
        record_event(&ctx.kube, super::CONTROLLER, &object, type_, reason, note).await;
    }
    outcome
}

/// The canary for the spec's revision: the one this host holds when the
/// revision and grants are unchanged, else verified, fetched and loaded
/// (from the caches when it was before).
async fn hold(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    found: super::Found,
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
                progress_deadline: super::progress_deadline(plugin, &manifest)?,
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

/// One object a canary may serve, as [`assign`] weighs it.
struct Unit {
    uid: String,
    /// Its status records the canary's digest as what last served it.
    served_before: bool,
    /// The selector takes it, and it is not being deleted.
    eligible: bool,
    /// A Machine failing its health check, an Addon not healthy.
    unhealthy: bool,
}

/// Pick the objects the canary serves (every one it served, then the
/// lowest-ranked others the selector allows, up to its share), mark every
/// other one as the stable revision's, and note which of them are
/// unhealthy; how many it serves, of how many it could.
fn assign(held: &Held, weight: u32, units: Vec<Unit>) -> (usize, usize) {
    let candidates: Vec<(String, bool)> = units
        .iter()
        .filter_map(|u| {
            let sticky = u.served_before || held.canary.serves(&u.uid);
            (sticky || u.eligible).then(|| (u.uid.clone(), sticky))
        })
        .collect();
    let chosen = plan::assign(&held.digest, &candidates, weight);
    {
        let mut seen = held.window.lock().expect("window lock");
        seen.canary = chosen.len() as u64;
        seen.stable = (units.len() - chosen.len()) as u64;
    }
    // The Machine controller and the addon engine note them as they see
    // them; this catches the ones they have not looked at since (after a
    // restart, say).
    for u in units.iter().filter(|u| u.unhealthy) {
        held.canary
            .note_unhealthy(&u.uid, u.served_before || chosen.contains(&u.uid));
    }
    let serves = chosen.len();
    let considered = units.into_iter().map(|u| u.uid).collect();
    held.canary.assign(chosen, considered);
    (serves, candidates.len())
}

/// The Plugin's Machines (those it creates, and those it releases while
/// they are deleted).
fn machine_units(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    digest: &str,
) -> Vec<Unit> {
    let name = plugin.name_any();
    ctx.kube
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| {
            let plugin = if m.metadata.deletion_timestamp.is_some() {
                m.instance_plugin()
            } else {
                m.spec.provider.plugin.as_str()
            };
            plugin == name
        })
        .filter_map(|m| {
            Some(Unit {
                uid: m.uid()?,
                served_before: m.status.as_ref().and_then(|s| s.plugin_digest.as_deref())
                    == Some(digest),
                eligible: m.metadata.deletion_timestamp.is_none() && selected(rollout, m.labels()),
                unhealthy: m.failed_health_check(),
            })
        })
        .collect()
}

/// The Machines an updater may update: those in the namespaces its Plugin
/// allows.
fn updated_units(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    digest: &str,
) -> Vec<Unit> {
    ctx.kube
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| {
            let namespace = m.namespace().unwrap_or_default();
            capstan_kit::registry::allowed_in(&ctx.kube, plugin, &namespace)
        })
        .filter_map(|m| {
            let updated_by_it = m
                .status
                .as_ref()
                .and_then(|s| s.in_place_update.as_ref())
                .is_some_and(|u| u.steps.iter().any(|s| s.digest.as_deref() == Some(digest)));
            Some(Unit {
                uid: m.uid()?,
                served_before: updated_by_it,
                eligible: m.metadata.deletion_timestamp.is_none() && selected(rollout, m.labels()),
                unhealthy: m.failed_health_check(),
            })
        })
        .collect()
}

/// The Machines whose data the bootstrap plugin renders.
fn bootstrapped_units(plugin: &Plugin, ctx: &Context, rollout: &PluginRollout) -> Vec<Unit> {
    let name = plugin.name_any();
    ctx.kube
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| {
            m.spec.bootstrap.as_ref().and_then(|b| b.plugin.as_deref()) == Some(name.as_str())
        })
        .filter_map(|m| {
            Some(Unit {
                uid: m.uid()?,
                // Nothing records which revision rendered a Machine's data;
                // the canary keeps the Machines it served while it lives.
                served_before: false,
                eligible: m.metadata.deletion_timestamp.is_none() && selected(rollout, m.labels()),
                unhealthy: m.failed_health_check(),
            })
        })
        .collect()
}

/// The Plugin's Addons.
fn addon_units(plugin: &Plugin, ctx: &Context, rollout: &PluginRollout, digest: &str) -> Vec<Unit> {
    let name = plugin.name_any();
    ctx.kube
        .stores
        .addons
        .state()
        .into_iter()
        .filter(|a| a.spec.plugin == name)
        .filter_map(|a| {
            let status = a.status.as_ref();
            Some(Unit {
                uid: a.uid()?,
                served_before: status.and_then(|s| s.plugin_digest.as_deref()) == Some(digest),
                eligible: a.metadata.deletion_timestamp.is_none() && selected(rollout, a.labels()),
                unhealthy: status.and_then(|s| s.healthy) == Some(false),
            })
        })
        .collect()
}

/// Whether `spec.rollout.selector` (unset: everything) takes these labels.
fn selected(rollout: &PluginRollout, labels: &std::collections::BTreeMap<String, String>) -> bool {
    rollout
        .selector
        .as_ref()
        .is_none_or(|s| capstan_api::selector_matches(s, labels))
}

/// Stop serving a Plugin's canary, if it has one.
pub(super) fn drop_canary(ctx: &Context, name: &str) {
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

/// What `capstan.dev/canary-action` asks of the canary with this digest.
fn asked(plugin: &Plugin, digest: &str) -> Option<Action> {
    let value = plugin.annotations().get(ANNOTATION_CANARY_ACTION)?;
    let (verb, target) = value.trim().split_once(' ')?;
    if target.trim() != digest {
        return None;
    }
    match verb {
        "promote" => Some(Action::Promote),
        "abort" => Some(Action::Abort),
        _ => None,
    }
}

fn window_event(verdict: &Verdict, step: usize, steps: usize, weight: u32) -> Note {
    let note = format!(
        "step {} of {steps} (weight {weight}%): {}",
        step + 1,
        verdict.reason()
    );
    match verdict {
        Verdict::Pass(_) => (EventType::Normal, "CanaryWindowPassed", note),
        Verdict::Fail(_) => (EventType::Warning, "CanaryWindowFailed", note),
        Verdict::Inconclusive(_) => (EventType::Normal, "CanaryWindowInconclusive", note),
    }
}

/// End a trial the spec no longer asks for (not a rollback: its digest
/// is not rejected).
fn settle(status: &mut PluginStatus, why: &str) {
    if let Some(c) = status.canary.as_mut().filter(|c| !is_final(c.phase)) {
        c.phase = CanaryPhase::RolledBack;
        c.weight = 0;
        c.objects = 0;
        c.message = Some(format!("{why}; the trial ended"));
    }
}

fn is_final(phase: CanaryPhase) -> bool {
    matches!(phase, CanaryPhase::Promoted | CanaryPhase::RolledBack)
}

fn progress_of(c: &CanaryStatus) -> Progress {
    Progress {
        phase: match c.phase {
            CanaryPhase::Progressing | CanaryPhase::Shadow => Phase::Progressing,
            CanaryPhase::Paused => Phase::Paused,
            CanaryPhase::Promoted => Phase::Promoted,
            CanaryPhase::RolledBack => Phase::RolledBack,
        },
        step: c.step as usize,
        failures: c.failures,
        inconclusive: c.inconclusive,
    }
}

fn phase_of(phase: Phase) -> CanaryPhase {
    match phase {
        Phase::Progressing => CanaryPhase::Progressing,
        Phase::Paused => CanaryPhase::Paused,
        Phase::Promoted => CanaryPhase::Promoted,
        Phase::RolledBack => CanaryPhase::RolledBack,
    }
}

fn tally(t: CallTally) -> Tally {
    Tally {
        calls: t.calls,
        errors: t.errors,
        failed_creates: t.failed_creates,
        objects: t.objects,
        unhealthy: t.unhealthy,
    }
}

/// `spec.rollout.analysis` with the defaults filled in.
fn analysis_of(rollout: &PluginRollout) -> Analysis {
    let a = &rollout.analysis;
    let d = Analysis::default();
    Analysis {
        min_samples: a.min_samples.map_or(d.min_samples, u64::from),
        max_error_percent: a.max_error_percent.unwrap_or(d.max_error_percent),
        max_error_percent_over_stable: a
            .max_error_percent_over_stable
            .unwrap_or(d.max_error_percent_over_stable),
        max_failed_creates: a.max_failed_creates.map_or(d.max_failed_creates, u64::from),
        max_unhealthy: a.max_unhealthy.map_or(d.max_unhealthy, u64::from),
        failure_limit: a.failure_limit.unwrap_or(d.failure_limit),
        inconclusive_limit: a.inconclusive_limit.unwrap_or(d.inconclusive_limit),
    }
}
