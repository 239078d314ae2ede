//! Between `status.canary` and the planner's types, and what the status
//! and Events say.

use super::super::Note;
use capstan_api::{
    ANNOTATION_CANARY_ACTION, CallTally, CanaryPhase, CanaryStatus, Plugin, PluginRollout,
    PluginStatus,
};
use capstan_planner::canary::{Action, Analysis, Phase, Progress, Tally, Verdict};
use kube::ResourceExt;
use kube::runtime::events::EventType;

/// What `capstan.dev/canary-action` asks of the canary with this digest.
pub(super) fn asked(plugin: &Plugin, digest: &str) -> Option<Action> {
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

pub(super) fn window_event(verdict: &Verdict, step: usize, steps: usize, weight: u32) -> Note {
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
pub(super) fn settle(status: &mut PluginStatus, why: &str) {
    if let Some(c) = status.canary.as_mut().filter(|c| !is_final(c.phase)) {
        c.phase = CanaryPhase::RolledBack;
        c.weight = 0;
        c.objects = 0;
        c.message = Some(format!("{why}; the trial ended"));
    }
}

pub(super) fn is_final(phase: CanaryPhase) -> bool {
    matches!(phase, CanaryPhase::Promoted | CanaryPhase::RolledBack)
}

pub(super) fn progress_of(c: &CanaryStatus) -> Progress {
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

pub(super) fn phase_of(phase: Phase) -> CanaryPhase {
    match phase {
        Phase::Progressing => CanaryPhase::Progressing,
        Phase::Paused => CanaryPhase::Paused,
        Phase::Promoted => CanaryPhase::Promoted,
        Phase::RolledBack => CanaryPhase::RolledBack,
    }
}

pub(super) fn tally(t: CallTally) -> Tally {
    Tally {
        calls: t.calls,
        errors: t.errors,
        failed_creates: t.failed_creates,
        objects: t.objects,
        unhealthy: t.unhealthy,
    }
}

/// `spec.rollout.analysis` with the defaults filled in.
pub(super) fn analysis_of(rollout: &PluginRollout) -> Analysis {
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
        progress_deadline: a.progress_deadline_seconds.map(u64::from),
    }
}
