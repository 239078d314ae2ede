//! A Plugin's canary (`spec.rollout.strategy: Canary`): a new revision
//! serves a growing share of the Machines (providers, bootstrap plugins,
//! updaters) or Addons (addon plugins), each step's window is
//! judged against the stable revision's calls in the same window, and it is
//! promoted or rolled back by itself.
//!
//! Start with [`reconcile`]: it keeps the stable revision serving (the one
//! the status records, loaded again after a restart), loads the spec's
//! revision beside it ([`trialed`]), judges a window when one ends
//! (`capstan_planner::canary`), and picks the objects the canary serves
//! ([`units`]).
//! Its state lives in `status.canary`, so a restarted host resumes the same
//! step and window; `spec.source` is never rewritten.

mod status;
mod trialed;
mod units;

pub(super) use trialed::{Held, drop_canary};

use super::{Context, Failure, Loaded, Note, find, last_activated, load, shown_signers};
use capstan_api::{CanaryPhase, CanaryStatus, CanaryWindow, Plugin, PluginStatus};
use capstan_kit::write::record_event;
use capstan_planner::canary::{self as plan, Action, Phase, Verdict};
use capstan_runtime::Grants;
use kube::Resource;
use kube::runtime::events::EventType;
use status::{analysis_of, asked, phase_of, progress_of, settle, tally, window_event};
use std::time::Duration;
use trialed::{Trialed, WindowObjects, hold};
use units::{addon_units, assign, bootstrapped_units, machine_units, updated_units};

/// How often the Machines a canary serves are picked again while it runs
/// (new Machines wait for it before they are created) and their health
/// looked at, at most.
const REASSIGN_EVERY: Duration = Duration::from_secs(2);
/// Judged windows kept in `status.canary.windows`.
const WINDOWS_KEPT: usize = 10;
/// Rolled-back revisions kept in `status.rejected`.
const REJECTED_KEPT: usize = 10;

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
    let Some((held, stable_counts)) = trial_of(
        plugin,
        ctx,
        (name, generation),
        (&grants, &fingerprint),
        status,
    )
    .await?
    else {
        return Ok(Trial::NotNeeded);
    };
    let unit = held.canary.unit();

    let weights: Vec<u32> = rollout.steps.iter().map(|s| s.weight).collect();
    let t = capstan_kit::now();
    let object = plugin.object_ref(&());
    let mut events: Vec<Note> = vec![];
    if status
        .canary
        .as_ref()
        .is_none_or(|c| c.digest != held.digest)
    {
        events.push(begin(plugin, status, (&held, &stable_counts), &rollout, &t));
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
        let window = (&held, stable_counts.as_ref());
        let (judged, wait) = judge_due(c, progress, window, &rollout, &t, &mut events);
        progress = judged;
        requeue = requeue.min(wait);
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
        Phase::Progressing | Phase::Paused => Ok(serve(plugin, ctx, &held, c, (progress, requeue))),
    };
    for (type_, reason, note) in events {
        record_event(&ctx.kube, super::CONTROLLER, &object, type_, reason, note).await;
    }
    outcome
}

/// The stable revision serving (the one the status records, loaded again
/// after a restart or a grant change) and the spec's revision held beside
/// it as the canary, with the stable revision's call counts; `None` when
/// no canary is needed (the spec names the serving revision, or a
/// `file://` stable revision is not known after a restart).
async fn trial_of(
    plugin: &Plugin,
    ctx: &Context,
    (name, generation): (&str, i64),
    (grants, fingerprint): (&Grants, &str),
    status: &mut PluginStatus,
) -> Result<Option<(Held, std::sync::Arc<capstan_kit::canary::CallCounts>)>, Failure> {
    // The stable revision: the one the status records as serving, loaded
    // again when this host has not (a restart) or the grants changed.
    match last_activated(plugin) {
        Some(pinned) => {
            load(&pinned, ctx, name, generation, grants.clone(), fingerprint.to_string())
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
        None if super::serving_fingerprint(ctx, name).is_none() => return Ok(None),
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
        return Ok(None);
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
    let held = hold(plugin, ctx, name, found, grants.clone(), fingerprint).await?;
    let Some(stable_counts) = held.canary.install(ctx, name) else {
        return Err((
            "LoadFailed",
            "the stable revision stopped serving while its canary was loaded".into(),
        ));
    };
    Ok(Some((held, stable_counts)))
}

/// Judge the current window if it ended: take both revisions' counts,
/// record the verdict and the Events that tell it, start the next window.
/// The progress after it, and how long until the window ends.
fn judge_due(
    c: &mut CanaryStatus,
    mut progress: plan::Progress,
    (held, stable_counts): (&Held, &capstan_kit::canary::CallCounts),
    rollout: &capstan_api::PluginRollout,
    t: &capstan_api::Time,
    events: &mut Vec<Note>,
) -> (plan::Progress, Duration) {
    let weights: Vec<u32> = rollout.steps.iter().map(|s| s.weight).collect();
    let analysis = analysis_of(rollout);
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
        let step_start = c.step_start.clone().unwrap_or(started);
        if progress.step != at_step {
            c.step_start = Some(t.clone());
        } else if let Some((late, why)) = plan::past_deadline(
            progress,
            (t.0.as_second() - step_start.0.as_second()).max(0) as u64,
            &analysis,
        ) {
            progress = late;
            c.message = Some(why.clone());
            events.push((EventType::Warning, "CanaryProgressDeadlineExceeded", why));
        }
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
        return (progress, Duration::from_secs(left as u64));
    }

    (progress, REASSIGN_EVERY)
}

/// Start a trial of the held revision: empty windows, its status, and the
/// Event that says so.
fn begin(
    plugin: &Plugin,
    status: &mut PluginStatus,
    (held, stable_counts): (&Held, &capstan_kit::canary::CallCounts),
    rollout: &capstan_api::PluginRollout,
    t: &capstan_api::Time,
) -> Note {
    let weights: Vec<u32> = rollout.steps.iter().map(|s| s.weight).collect();
    let unit = held.canary.unit();
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
        format!(
            "shadows the serving revision (its {} are mirrored and compared)",
            held.canary.mirrored_calls()
        )
    } else {
        format!("serves up to {}% of the {unit}", weights[0])
    };
    let note = (
        EventType::Normal,
        "CanaryStarted",
        format!(
            "canary {source} (version {}{}) {first} for {}s; the serving revision serves the rest",
            held.version,
            shown_signers(&held.signers),
            rollout.steps[0].duration_seconds
        ),
    );
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
        step_start: Some(t.clone()),
        failures: 0,
        inconclusive: 0,
        windows: vec![],
        message: None,
    });
    note
}

/// Keep serving the held canary at the current step: shadowing or
/// serving its share (picked again), and what `UpToDate` says.
fn serve(
    plugin: &Plugin,
    ctx: &Context,
    held: &Held,
    c: &mut CanaryStatus,
    (progress, requeue): (plan::Progress, Duration),
) -> Trial {
    let rollout = plugin.spec.rollout.clone().unwrap_or_default();
    let weights: Vec<u32> = rollout.steps.iter().map(|s| s.weight).collect();
    let unit = held.canary.unit();
    let shown = c.source.clone();
    let shadowing = rollout.steps[progress.step.min(rollout.steps.len() - 1)].shadow;
    held.canary.set_shadow(shadowing);
    let units = match held.canary {
        Trialed::Provider(_) => machine_units(plugin, ctx, &rollout, &held.digest),
        Trialed::Addon(_) => addon_units(plugin, ctx, &rollout, &held.digest),
        Trialed::Updater(_) => updated_units(plugin, ctx, &rollout, &held.digest),
        Trialed::Bootstrap(_) => bootstrapped_units(plugin, ctx, &rollout),
    };
    let (serves, of) = assign(held, c.weight, units);
    c.objects = serves as u32;
    let paused = progress.phase == Phase::Paused;
    if shadowing && !paused {
        c.phase = CanaryPhase::Shadow;
    }
    let doing = if shadowing {
        format!(
            "shadows the revision serving all {of} {unit} (their {} are mirrored to it and compared)",
            held.canary.mirrored_calls()
        )
    } else {
        format!("serves {serves} of {of} {unit}")
    };
    Trial::Serving {
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
    }
}
