//! `Plugin.spec.rollout` and `Plugin.status.canary`: how a new revision of a
//! provider plugin reaches the fleet (at once, or as a health-gated canary
//! over a growing share of Machines) and where that canary stands.
//!
//! The decisions (which window passes, what comes next, which Machines the
//! canary serves) are pure functions in `capstan-planner`'s `canary`
//! module; these are only the shapes users write and read.

use crate::{LabelSelector, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a new revision of the plugin replaces the serving one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginRollout {
    /// `Immediate` (the default): a verified new revision serves every
    /// object at once. `Canary`: it first serves a share of the Machines,
    /// step by step, and is promoted when every step's window passed its
    /// analysis, or rolled back when one failed (provider plugins).
    #[serde(default)]
    pub strategy: RolloutStrategy,
    /// `Canary`: the weights (percent of the Machines that may get the
    /// canary) and how long each is held and judged, in order. Weights
    /// never decrease; after the last step passes, the canary is promoted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<CanaryStep>,
    /// `Canary`: only Machines whose labels match may get the canary (a
    /// MachineDeployment's Machines carry `capstan.dev/deployment-name`
    /// and its template's labels). Unset: every Machine of the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// `Canary`: how each window is judged.
    #[serde(default)]
    pub analysis: CanaryAnalysis,
    /// How many verified revisions are kept in the caches and listed in
    /// `status.history` (default 3), so pinning back to one of them
    /// switches without a download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 20))]
    pub revision_history_limit: Option<u32>,
}

/// How a new revision replaces the serving one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutStrategy {
    /// Every object at once (what a Plugin without `rollout` does).
    #[default]
    Immediate,
    /// A share of the Machines first, health-gated, step by step.
    Canary,
}

/// One step of a canary.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStep {
    /// Percent (1–100) of the plugin's Machines the canary serves in this
    /// step: at most ⌈weight × Machines / 100⌉ of them, chosen by a hash
    /// of the canary's digest and each Machine's uid, and kept once chosen.
    /// Unset (0) on a shadow step.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub weight: u32,
    /// A shadow step serves no object: the stable revision's
    /// side-effect-free calls (a provider's `get` and `validate`, an addon
    /// plugin's `versions`, `render` and `assess`, an updater's
    /// `can-update`, a bootstrap plugin's `render`) are mirrored to the
    /// canary and compared; a different answer or a failure counts as its
    /// error, and its answers are never used. Shadow steps come first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// How long the step is held before its window is judged.
    #[schemars(range(min = 1, max = 86400))]
    pub duration_seconds: u32,
}

/// How a window of a canary step is judged. A call is one provider call
/// (`create`, `get`, `delete`, `validate`) the canary made; an error is one
/// that failed for any reason but the host's quota.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryAnalysis {
    /// Fewer canary calls than this in a window is inconclusive (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_samples: Option<u32>,
    /// The canary's error ratio a window may reach, in percent (default
    /// 10). Over it the window fails, unless the stable revision's ratio in
    /// the same window is as bad (a cloud-wide fault: inconclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_error_percent: Option<u32>,
    /// How many percentage points the canary's error ratio may exceed the
    /// stable revision's before the window fails (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_error_percent_over_stable: Option<u32>,
    /// Failed `create` calls of the canary a window may hold (default 3):
    /// one more fails the window whatever the sample size, unless the
    /// stable revision failed creates as often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed_creates: Option<u32>,
    /// Objects served by the canary that may be unhealthy in a window
    /// (default 0): Machines failing a MachineHealthCheck
    /// (`HealthCheckSucceeded=False`, such as a Node that never joined),
    /// Addons whose plugin judges them not healthy. One more fails the
    /// window whatever the sample size, unless the stable revision's
    /// objects were unhealthy as often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<u32>,
    /// Failed windows tolerated before the canary is rolled back (default
    /// 0: the first failed window rolls it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_limit: Option<u32>,
    /// Inconclusive windows in a row tolerated before the canary pauses
    /// for a human (`capstan plugin promote` or `abort`; default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconclusive_limit: Option<u32>,
    /// How long the canary may hold one step (inconclusive, or paused)
    /// before it is rolled back, in seconds, checked as each window ends
    /// (unset: no deadline; a paused canary waits for a human).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: Option<u32>,
}

/// Where a canary stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CanaryPhase {
    /// A shadow step: it serves no Machine; the stable revision's
    /// side-effect-free calls are mirrored to it and compared.
    Shadow,
    /// Serving its step's share; windows are judged.
    #[default]
    Progressing,
    /// Too many inconclusive windows: it keeps its share (a failed window
    /// still rolls it back) until `capstan plugin promote` or `abort`.
    Paused,
    /// Every step passed (or a human promoted it): it serves everything.
    Promoted,
    /// A window failed (or a human aborted it): it serves nothing, and this
    /// digest is never tried again (`status.rejected`).
    RolledBack,
}

/// A canary revision and its progress.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// What the spec's source resolved to: the revision on trial.
    pub source: String,
    /// `sha256:…` of its component bytes.
    pub digest: String,
    /// Its version (from its manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The keys whose signatures were verified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signers: Vec<String>,
    /// Where it stands.
    pub phase: CanaryPhase,
    /// The step (0-based) being held.
    pub step: u32,
    /// The percent of Machines it may serve now (0 once rolled back).
    pub weight: u32,
    /// How many objects (Machines, or Addons) it serves now.
    #[serde(default)]
    pub objects: u32,
    /// When the current window began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start: Option<Time>,
    /// When the current step began (its progress deadline counts from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_start: Option<Time>,
    /// Failed windows so far.
    #[serde(default)]
    pub failures: u32,
    /// Inconclusive windows in a row.
    #[serde(default)]
    pub inconclusive: u32,
    /// The judged windows, oldest first (the last 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<CanaryWindow>,
    /// Why it stands where it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A judged window of a canary step.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryWindow {
    /// The step it belonged to.
    pub step: u32,
    /// The weight it was held at.
    pub weight: u32,
    /// The canary's calls and errors in it.
    pub canary: CallTally,
    /// The stable revision's calls and errors in it.
    pub stable: CallTally,
    /// `Pass`, `Fail` or `Inconclusive`.
    pub verdict: String,
    /// Why.
    pub reason: String,
}

/// Calls of one revision in a window.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallTally {
    /// Calls made.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// `create` calls that failed.
    pub failed_creates: u64,
    /// Objects (Machines, Addons) it served at the window's end.
    #[serde(default)]
    pub objects: u64,
    /// Objects it served that were unhealthy in the window: Machines
    /// failing their health check (`HealthCheckSucceeded=False`, or
    /// remediated), Addons not healthy.
    #[serde(default)]
    pub unhealthy: u64,
}

/// The annotation through which `capstan plugin promote|abort` (or anyone
/// who may patch the Plugin) acts on a canary: `promote sha256:…` or
/// `abort sha256:…`. It names the canary's digest, so it never acts on a
/// later canary; `spec.source` is never rewritten.
pub const ANNOTATION_CANARY_ACTION: &str = "capstan.dev/canary-action";

impl PluginRollout {
    /// Whether this is a canary rollout.
    pub fn is_canary(&self) -> bool {
        self.strategy == RolloutStrategy::Canary
    }

    /// What is wrong with it, naming the field (`None`: usable).
    pub fn problem(&self) -> Option<String> {
        if !self.is_canary() {
            return (!self.steps.is_empty()).then(|| {
                "spec.rollout.steps: only a Canary strategy has steps; set strategy: Canary or remove them".to_string()
            });
        }
        if self.steps.is_empty() {
            return Some(
                "spec.rollout.steps: a Canary needs at least one step, e.g. [{weight: 10, durationSeconds: 300}]"
                    .to_string(),
            );
        }
        let mut last = 0;
        for (i, step) in self.steps.iter().enumerate() {
            if step.shadow {
                if step.weight != 0 {
                    return Some(format!(
                        "spec.rollout.steps[{i}].weight: a shadow step serves no Machine; remove its weight"
                    ));
                }
                if last > 0 {
                    return Some(format!(
                        "spec.rollout.steps[{i}].shadow: shadow steps come before the weighted ones"
                    ));
                }
                if step.duration_seconds == 0 {
                    return Some(format!(
                        "spec.rollout.steps[{i}].durationSeconds: must be at least 1"
                    ));
                }
                continue;
            }
            if !(1..=100).contains(&step.weight) {
                return Some(format!(
                    "spec.rollout.steps[{i}].weight: {} is not a percent from 1 to 100",
                    step.weight
                ));
            }
            if step.weight < last {
                return Some(format!(
                    "spec.rollout.steps[{i}].weight: {} is below the step before ({last}); weights never decrease",
                    step.weight
                ));
            }
            if step.duration_seconds == 0 {
                return Some(format!(
                    "spec.rollout.steps[{i}].durationSeconds: must be at least 1"
                ));
            }
            last = step.weight;
        }
        if self.analysis.progress_deadline_seconds == Some(0) {
            return Some(
                "spec.rollout.analysis.progressDeadlineSeconds: must be at least 1 (or unset: no deadline)"
                    .to_string(),
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(steps: &[(u32, u32)]) -> PluginRollout {
        PluginRollout {
            strategy: RolloutStrategy::Canary,
            steps: steps
                .iter()
                .map(|&(weight, duration_seconds)| CanaryStep {
                    weight,
                    duration_seconds,
                    shadow: false,
                })
                .collect(),
            ..PluginRollout::default()
        }
    }

    #[test]
    fn a_canary_needs_steps_whose_weights_never_decrease() {
        assert_eq!(rollout(&[(10, 60), (50, 60), (50, 1)]).problem(), None);
        assert!(
            rollout(&[])
                .problem()
                .unwrap()
                .contains("at least one step")
        );
        assert!(
            rollout(&[(50, 60), (10, 60)])
                .problem()
                .unwrap()
                .starts_with("spec.rollout.steps[1].weight: 10 is below the step before (50)")
        );
        assert!(
            rollout(&[(0, 60)])
                .problem()
                .unwrap()
                .contains("steps[0].weight")
        );
        assert!(
            rollout(&[(101, 60)])
                .problem()
                .unwrap()
                .contains("1 to 100")
        );
        assert!(
            rollout(&[(5, 0)])
                .problem()
                .unwrap()
                .contains("durationSeconds")
        );
        let immediate = PluginRollout {
            steps: rollout(&[(5, 5)]).steps,
            ..PluginRollout::default()
        };
        assert!(immediate.problem().unwrap().contains("only a Canary"));
        assert_eq!(PluginRollout::default().problem(), None);
        let shadow = |weight| CanaryStep {
            weight,
            duration_seconds: 30,
            shadow: true,
        };
        let mut first = rollout(&[(10, 60)]);
        first.steps.insert(0, shadow(0));
        assert_eq!(first.problem(), None);
        first.steps.push(shadow(0));
        assert!(
            first
                .problem()
                .unwrap()
                .contains("steps[2].shadow: shadow steps come before")
        );
        let weighted = PluginRollout {
            steps: vec![shadow(5)],
            ..rollout(&[])
        };
        assert!(
            weighted
                .problem()
                .unwrap()
                .contains("a shadow step serves no Machine")
        );
        let mut no_deadline = rollout(&[(10, 60)]);
        no_deadline.analysis.progress_deadline_seconds = Some(0);
        assert!(
            no_deadline
                .problem()
                .unwrap()
                .starts_with("spec.rollout.analysis.progressDeadlineSeconds: must be at least 1")
        );
    }

    #[test]
    fn the_yaml_a_user_writes_reads_back() {
        let rollout: PluginRollout = serde_json::from_value(serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 10, "durationSeconds": 300}, {"weight": 50, "durationSeconds": 600}],
            "selector": {"matchLabels": {"capstan.dev/deployment-name": "workers"}},
            "analysis": {"minSamples": 20, "maxErrorPercent": 5, "failureLimit": 1, "progressDeadlineSeconds": 1800},
            "revisionHistoryLimit": 5
        }))
        .unwrap();
        assert!(rollout.is_canary());
        assert_eq!(rollout.steps[1].weight, 50);
        assert_eq!(rollout.analysis.min_samples, Some(20));
        assert_eq!(rollout.analysis.progress_deadline_seconds, Some(1800));
        assert_eq!(rollout.revision_history_limit, Some(5));
        assert_eq!(rollout.problem(), None);
    }
}
