//! The Machine's in-place update step: record the plan in its status
//! before the first `update` call, call each updater until it reports done
//! (honouring `retry-after`), resume from the recorded steps after a
//! restart. A failure stops there with `Updating=False` / `UpdateFailed`;
//! nothing is rolled back. Start with [`advance`] (the I/O: plan, drain,
//! call); what a plan and an updater's answer do to the status is pure,
//! in [`planned_status`] and [`record_answer`], tested here. The end-to-end
//! flow is in `crate::inplace`.

use crate::inplace::{eligible, machines, plan_machine};
use capstan_api::machine_conditions::{UP_TO_DATE, UPDATING};
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, InPlaceStep, InPlaceStrategy, InPlaceUpdateStatus, Machine,
    MachineSpec, MachineStatus, Time, UpdateRecord, set_condition, status as cond,
};
use capstan_kit::Kube;
use capstan_kit::provider::{ProviderError, timed_as};
use capstan_kit::registry::Updaters;
use capstan_kit::write::record_event;
use capstan_runtime::types::UpdateProgress;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// Provenance entries kept per machine.
const MAX_UPDATE_RECORDS: usize = 20;

/// What [`advance`] left the machine at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Advance {
    /// Call again after this long.
    Wait(Duration),
    /// Every step is done: the annotation may go.
    Done,
    /// The update failed; nothing more happens until the machine is deleted.
    Failed,
}

/// One pass of a machine's in-place update: plan it (recorded before any
/// `update` call), or run the first step not done yet.
pub(crate) async fn advance(
    kube: &Kube,
    updaters: &Updaters,
    drain: &Drainer<'_>,
    machine: &Machine,
    status: &mut MachineStatus,
    t: &Time,
) -> Advance {
    let generation = machine.metadata.generation.unwrap_or(0);
    let previous: MachineSpec = match machine
        .annotations()
        .get(ANNOTATION_IN_PLACE_FROM)
        .map(|text| serde_json::from_str(text))
    {
        Some(Ok(spec)) => spec,
        Some(Err(e)) => {
            return fail(
                status,
                generation,
                t,
                format!("annotation {ANNOTATION_IN_PLACE_FROM} is not a machine spec: {e}"),
            );
        }
        None => return Advance::Done,
    };
    let planned = status
        .in_place_update
        .as_ref()
        .is_some_and(|u| u.generation == generation);
    if !planned {
        return plan(kube, updaters, machine, &previous, status, t).await;
    }
    if update_failed_in(status) {
        return Advance::Failed;
    }
    let (before, after) = machines(machine, &previous, &machine.spec);
    loop {
        let update = status.in_place_update.as_mut().expect("planned above");
        let total = update.steps.len();
        let Some(index) = update.steps.iter().position(|s| s.state != "Done") else {
            return finish(drain, status, generation, t).await;
        };
        let step = update.steps[index].clone();
        // Checked again at every step: the namespace may have been taken
        // off the Plugin since the plan was made.
        let namespace = machine.namespace().unwrap_or_default();
        if let Some(message) = capstan_kit::registry::not_allowed(kube, &step.updater, &namespace) {
            set_progress(status, generation, t, message);
            return Advance::Wait(Duration::from_secs(15));
        }
        let Some(registered) = updaters.get(&step.updater) else {
            let message = format!("waiting for updater {} to be active", step.updater);
            set_progress(status, generation, t, message);
            return Advance::Wait(Duration::from_secs(5));
        };
        if step.drain && update.node_drained_time.is_none() {
            let label = format!("step {} of {total}, {}", index + 1, step.updater);
            match drain.before_step(machine, update, t).await {
                DrainProgress::Drained => {}
                DrainProgress::Wait(message, wait) => {
                    set_progress(status, generation, t, format!("{label}: {message}"));
                    return Advance::Wait(wait);
                }
            }
        }
        // A canary updates the Machines it serves, and finishes the
        // updates it began.
        let uid = machine.uid().unwrap_or_default();
        let registered = registered.for_machine(&uid, step.digest.as_deref());
        let labels = (step.updater.as_str(), registered.revision);
        let answer = timed_as(&kube.metrics, labels, "update", async {
            Ok(registered
                .plugin
                .update(&before, &after, &step.fields)
                .await?)
        })
        .await;
        // An error, or a step the updater reports failed, counts against
        // its revision (the host's quota holding it back does not).
        let errored = answer.is_err();
        let held_back = matches!(answer, Err(ProviderError::Quota { .. }));
        let outcome = record_answer(status, index, registered.digest(), answer, generation, t);
        if !held_back {
            let failed = errored || matches!(outcome, StepOutcome::Failed(_));
            registered.counts.record_outcome("update", failed);
        }
        match outcome {
            StepOutcome::Done => {}
            StepOutcome::Wait(wait, message) => {
                set_progress(status, generation, t, message);
                return Advance::Wait(wait);
            }
            StepOutcome::Failed(message) => return fail(status, generation, t, message),
        }
    }
}

/// Ask the eligible updaters which of the changed fields each claims and
/// record the plan in the status; the first `update` call waits for the
/// plan to be written.
async fn plan(
    kube: &Kube,
    updaters: &Updaters,
    machine: &Machine,
    previous: &MachineSpec,
    status: &mut MachineStatus,
    t: &Time,
) -> Advance {
    let generation = machine.metadata.generation.unwrap_or(0);
    let namespace = machine.namespace().unwrap_or_default();
    let updaters = eligible(kube, updaters, &owner_policy(kube, machine), &namespace);
    let plan = match plan_machine(kube, machine, previous, &machine.spec, &updaters).await {
        Ok(plan) => plan,
        Err(message) => {
            set_progress(status, generation, t, format!("planning: {message}"));
            return Advance::Wait(Duration::from_secs(5));
        }
    };
    let steps = plan
        .steps
        .iter()
        .map(|s| {
            let registered = updaters.iter().find(|(u, _)| u.name == s.updater);
            PlannedStep {
                updater: &s.updater,
                fields: &s.fields,
                deadline: registered.map(|(_, r)| r.progress_deadline),
                disruption: registered.map(|(_, r)| r.disruption).unwrap_or_default(),
            }
        })
        .collect::<Vec<_>>();
    status.in_place_update = Some(planned_status(&steps, &plan.unclaimed, generation, t));
    if !plan.unclaimed.is_empty() {
        return fail(
            status,
            generation,
            t,
            format!(
                "no active updater claims {}; delete the machine to replace it",
                plan.unclaimed.join(", ")
            ),
        );
    }
    let summary: Vec<String> = plan
        .steps
        .iter()
        .map(|s| format!("{} ({})", s.updater, s.fields.join(", ")))
        .collect();
    set_progress(
        status,
        generation,
        t,
        format!("planned: {}", summary.join(", then ")),
    );
    // The plan is written before any updater runs.
    Advance::Wait(Duration::from_millis(1))
}

/// Every step is done: uncordon the Node if a step drained it, and say so.
async fn finish(
    drain: &Drainer<'_>,
    status: &mut MachineStatus,
    generation: i64,
    t: &Time,
) -> Advance {
    let update = status.in_place_update.as_mut().expect("planned");
    if let Some(node) = update.uncordon_node.clone() {
        if let Err(e) = drain.uncordon(&node).await {
            set_progress(status, generation, t, format!("every step is done; {e}"));
            return Advance::Wait(Duration::from_secs(5));
        }
        update.uncordon_node = None;
    }
    for (kind, value, reason) in [
        (UPDATING, cond::FALSE, "InPlaceUpdated"),
        (UP_TO_DATE, cond::TRUE, "UpToDate"),
    ] {
        set_condition(
            &mut status.conditions,
            kind,
            value,
            reason,
            "",
            Some(generation),
            t,
        );
    }
    Advance::Done
}

/// One step of a plan, as the eligible updaters describe it.
struct PlannedStep<'a> {
    updater: &'a str,
    fields: &'a [String],
    /// The updater's progress deadline (`None`: not active now).
    deadline: Option<Duration>,
    disruption: capstan_manifest::Disruption,
}

/// The update's status as planned: every step `Pending`, the first current
/// from now (its deadline counts from here). Pure.
fn planned_status(
    steps: &[PlannedStep<'_>],
    unclaimed: &[String],
    generation: i64,
    t: &Time,
) -> InPlaceUpdateStatus {
    InPlaceUpdateStatus {
        generation,
        start_time: Some(t.clone()),
        steps: steps
            .iter()
            .enumerate()
            .map(|(i, s)| InPlaceStep {
                updater: s.updater.to_string(),
                fields: s.fields.to_vec(),
                state: "Pending".into(),
                progress_deadline_seconds: s.deadline.map(deadline_seconds),
                drain: s.disruption.drain,
                affects_availability: Some(s.disruption.affects_availability),
                start_time: (i == 0).then(|| t.clone()),
                last_progress_time: (i == 0).then(|| t.clone()),
                ..Default::default()
            })
            .collect(),
        unclaimed: unclaimed.to_vec(),
        ..Default::default()
    }
}

/// What an updater's answer means for the pass.
#[derive(Debug, PartialEq, Eq)]
enum StepOutcome {
    /// The step is done; go on to the next.
    Done,
    /// Ask again after this long; the message says where the step is.
    Wait(Duration, String),
    /// The step failed, for this reason; the update stops.
    Failed(String),
}

/// Record an updater's answer to `update` for step `index` in the status
/// (state, percent, message, progress time, provenance) and say what the
/// pass does next. Pure.
fn record_answer(
    status: &mut MachineStatus,
    index: usize,
    digest: &str,
    answer: Result<UpdateProgress, ProviderError>,
    generation: i64,
    t: &Time,
) -> StepOutcome {
    let update = status.in_place_update.as_mut().expect("planned");
    let total = update.steps.len();
    let step = &mut update.steps[index];
    step.digest = Some(digest.to_string());
    let label = format!(
        "step {} of {total}, {} ({})",
        index + 1,
        step.updater,
        step.fields.join(", ")
    );
    // The updater's words go into conditions and events: bounded.
    let bound = |m: &str| capstan_api::bounded(m, capstan_api::MAX_PLUGIN_TEXT);
    match answer {
        Ok(UpdateProgress::Done) => {
            step.state = "Done".into();
            step.percent = Some(100);
            step.message = None;
            let record = UpdateRecord {
                updater: step.updater.clone(),
                digest: digest.to_string(),
                fields: step.fields.clone(),
                generation,
                time: Some(t.clone()),
            };
            // The next step is current from now: its deadline counts from
            // here, not from the plan.
            if let Some(next) = update.steps.get_mut(index + 1) {
                next.start_time = Some(t.clone());
                next.last_progress_time = Some(t.clone());
            }
            status.updated_by.push(record);
            let excess = status.updated_by.len().saturating_sub(MAX_UPDATE_RECORDS);
            status.updated_by.drain(..excess);
            StepOutcome::Done
        }
        Ok(UpdateProgress::InProgress(progress)) => {
            step.state = "Updating".into();
            let percent = progress.percent.map(|p| p.min(100));
            // Only a rising percent is progress: an updater that keeps
            // answering "in progress" (or varies its message) while
            // nothing moves is what the deadline is for.
            if percent > step.percent || step.last_progress_time.is_none() {
                step.last_progress_time = Some(t.clone());
            }
            step.percent = percent;
            step.message = progress.message.as_deref().map(bound);
            let shown = percent.map(|p| format!("{p}% ")).unwrap_or_default();
            let detail = step.message.clone().unwrap_or_default();
            let wait = Duration::from_millis(progress.retry_after_ms.clamp(100, 60_000));
            StepOutcome::Wait(wait, format!("{label}: {shown}{detail}"))
        }
        Ok(UpdateProgress::Failed(message)) => {
            let message = bound(&message);
            step.state = "Failed".into();
            step.message = Some(message.clone());
            StepOutcome::Failed(format!("{label}: {message}"))
        }
        Err(ref error) if let Some((message, retry_after)) = error.retry() => {
            step.message = Some(message.to_string());
            let wait = retry_after.clamp(Duration::from_millis(100), Duration::from_secs(60));
            StepOutcome::Wait(wait, format!("{label}: {message} (retrying)"))
        }
        Err(ProviderError::Unauthorized(message)) => {
            // An admin can fix credentials without touching the machine.
            step.message = Some(format!("unauthorized: {message}"));
            StepOutcome::Wait(
                Duration::from_secs(30),
                format!("{label}: unauthorized: {message}; fix the Plugin's credential grant"),
            )
        }
        Err(error) => {
            step.state = "Failed".into();
            step.message = Some(error.to_string());
            StepOutcome::Failed(format!("{label}: {error}"))
        }
    }
}

/// Draining a machine's Node for the update steps whose updaters declare
/// it (`disruption.drain` in their signed manifests): the same cordon and
/// evictions as a deletion's drain (PodDisruptionBudgets, the drain label
/// and MachineDrainRules hold), and an uncordon once every step is done.
pub(crate) struct Drainer<'a> {
    pub(crate) kube: &'a Kube,
    pub(crate) evictions: &'a crate::nodedrain::Evictions,
    /// The machine's Node, if it has one.
    pub(crate) node: Option<std::sync::Arc<Node>>,
}

/// Where draining before a step stands.
enum DrainProgress {
    /// Drained (or nothing to drain): the step may run.
    Drained,
    /// Not yet: say this, look again after that long.
    Wait(String, Duration),
}

impl Drainer<'_> {
    /// One round of draining before a step. The Node to uncordon later is
    /// recorded (and written) before it is cordoned.
    async fn before_step(
        &self,
        machine: &Machine,
        update: &mut InPlaceUpdateStatus,
        t: &Time,
    ) -> DrainProgress {
        let Some(node) = &self.node else {
            // No Node, no pods on it.
            update.node_drained_time = Some(t.clone());
            return DrainProgress::Drained;
        };
        let schedulable = node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true);
        if schedulable && update.uncordon_node.is_none() {
            update.uncordon_node = Some(node.name_any());
            return DrainProgress::Wait("cordoning the Node".into(), Duration::from_millis(1));
        }
        match crate::nodedrain::drain_round(self.kube, self.evictions, machine, node).await {
            Ok(crate::nodedrain::Round::Complete) => {
                record_event(
                    self.kube,
                    "machine",
                    &machine.object_ref(&()),
                    EventType::Normal,
                    "NodeDrained",
                    format!("drained Node {} for an in-place update", node.name_any()),
                )
                .await;
                update.node_drained_time = Some(t.clone());
                DrainProgress::Drained
            }
            Ok(crate::nodedrain::Round::Pending { message, blocked }) => {
                DrainProgress::Wait(message, Duration::from_secs(if blocked { 5 } else { 1 }))
            }
            Err(e) => DrainProgress::Wait(format!("draining: {e}"), Duration::from_secs(5)),
        }
    }

    /// Make the Node this update cordoned schedulable again.
    async fn uncordon(&self, name: &str) -> Result<(), String> {
        let Some(node) = self.node.as_ref().filter(|n| n.name_any() == name) else {
            // The Node is gone or was replaced: nothing of ours to undo.
            return Ok(());
        };
        let patch = serde_json::json!({ "spec": { "unschedulable": null } });
        crate::nodedrain::patch_node(self.kube, node, &patch, "uncordon", "cannot uncordon")
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// The machine's in-place update as a health check judges it, while one is
/// under way (the `in-place-from` annotation is there) or has failed.
pub(crate) fn as_judged(machine: &Machine) -> Option<capstan_planner::healthcheck::InPlaceUpdate> {
    if !machine.annotations().contains_key(ANNOTATION_IN_PLACE_FROM) {
        return None;
    }
    let generation = machine.metadata.generation.unwrap_or(0);
    let status = machine.status.as_ref();
    let updating = status.and_then(|s| capstan_api::condition(&s.conditions, UPDATING));
    let seconds = |time: &Time| time.0.as_second();
    let default_deadline = i64::from(capstan_manifest::DEFAULT_PROGRESS_DEADLINE_SECONDS);
    // Not planned yet (or planned for an older spec): the update began
    // when the machine was last marked updating.
    let unplanned = || {
        let since = updating
            .map(|c| seconds(&c.last_transition_time))
            .or_else(|| machine.creation_timestamp().map(|t| t.0.as_second()))
            .unwrap_or(0);
        capstan_planner::healthcheck::InPlaceUpdate {
            step: "planning".into(),
            failed: None,
            started: since,
            progress_since: since,
            deadline: default_deadline,
        }
    };
    if let Some(why) = crate::inplace::update_failed(machine) {
        return Some(capstan_planner::healthcheck::InPlaceUpdate {
            failed: Some(why),
            ..unplanned()
        });
    }
    let Some(update) = status
        .and_then(|s| s.in_place_update.as_ref())
        .filter(|u| u.generation == generation)
    else {
        return Some(unplanned());
    };
    let total = update.steps.len();
    let Some((index, step)) = update
        .steps
        .iter()
        .enumerate()
        .find(|(_, s)| s.state != "Done")
    else {
        // Every step is done; the annotation is about to go.
        return None;
    };
    let began = step
        .start_time
        .as_ref()
        .or(update.start_time.as_ref())
        .map_or_else(|| unplanned().progress_since, seconds);
    Some(capstan_planner::healthcheck::InPlaceUpdate {
        step: format!("step {} of {total} ({})", index + 1, step.updater),
        failed: None,
        started: began,
        progress_since: step.last_progress_time.as_ref().map_or(began, seconds),
        deadline: step
            .progress_deadline_seconds
            .map_or(default_deadline, i64::from),
    })
}

fn deadline_seconds(deadline: Duration) -> u32 {
    u32::try_from(deadline.as_secs()).unwrap_or(u32::MAX)
}

fn update_failed_in(status: &MachineStatus) -> bool {
    status
        .in_place_update
        .as_ref()
        .is_some_and(|u| !u.unclaimed.is_empty() || u.steps.iter().any(|s| s.state == "Failed"))
}

/// The in-place policy of the set that owns the machine (every active
/// updater when it has none).
fn owner_policy(kube: &Kube, machine: &Machine) -> InPlaceStrategy {
    let namespace = machine.namespace().unwrap_or_default();
    machine
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "MachineSet")
        .and_then(|o| {
            kube.stores
                .machine_sets
                .get(&ObjectRef::new(&o.name).within(&namespace))
        })
        .and_then(|set| set.spec.in_place.clone())
        .unwrap_or_default()
}

fn set_progress(status: &mut MachineStatus, generation: i64, t: &Time, message: String) {
    set_condition(
        &mut status.conditions,
        UPDATING,
        cond::TRUE,
        "InPlaceUpdating",
        message,
        Some(generation),
        t,
    );
    set_condition(
        &mut status.conditions,
        UP_TO_DATE,
        cond::FALSE,
        "InPlaceUpdating",
        "",
        Some(generation),
        t,
    );
}

fn fail(status: &mut MachineStatus, generation: i64, t: &Time, message: String) -> Advance {
    set_condition(
        &mut status.conditions,
        UPDATING,
        cond::FALSE,
        "UpdateFailed",
        message.clone(),
        Some(generation),
        t,
    );
    set_condition(
        &mut status.conditions,
        UP_TO_DATE,
        cond::FALSE,
        "UpdateFailed",
        message,
        Some(generation),
        t,
    );
    Advance::Failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_runtime::types::UpdateInProgress;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap())
    }

    /// A machine status with a two-step plan made at time 0.
    fn planned() -> MachineStatus {
        let (version, tags) = (
            vec!["version".to_string()],
            vec!["provider.config.tags".to_string()],
        );
        let steps = [
            PlannedStep {
                updater: "sim-updater",
                fields: &version,
                deadline: Some(Duration::from_secs(300)),
                disruption: capstan_manifest::Disruption {
                    drain: true,
                    affects_availability: true,
                },
            },
            PlannedStep {
                updater: "sim-tagger",
                fields: &tags,
                deadline: None,
                disruption: capstan_manifest::Disruption {
                    drain: false,
                    affects_availability: false,
                },
            },
        ];
        MachineStatus {
            in_place_update: Some(planned_status(&steps, &[], 3, &at(0))),
            ..Default::default()
        }
    }

    fn in_progress(percent: Option<u8>, message: &str) -> Result<UpdateProgress, ProviderError> {
        Ok(UpdateProgress::InProgress(UpdateInProgress {
            percent,
            message: Some(message.into()),
            retry_after_ms: 2_000,
        }))
    }

    #[test]
    fn a_plan_makes_only_its_first_step_current_and_keeps_what_updaters_declare() {
        let update = planned().in_place_update.unwrap();
        assert_eq!(update.generation, 3);
        let [first, second] = &update.steps[..] else {
            panic!("two steps")
        };
        assert_eq!(
            (first.state.as_str(), second.state.as_str()),
            ("Pending", "Pending")
        );
        assert_eq!(first.start_time, Some(at(0)));
        assert_eq!(
            second.start_time, None,
            "the second step's deadline has not started"
        );
        assert_eq!(first.progress_deadline_seconds, Some(300));
        assert_eq!(second.progress_deadline_seconds, None);
        assert!(first.drain && !second.drain);
        assert_eq!(second.affects_availability, Some(false));
    }

    #[test]
    fn only_a_rising_percent_counts_as_progress() {
        let mut status = planned();
        let outcome = record_answer(
            &mut status,
            0,
            "sha256:u",
            in_progress(Some(10), "kubelet"),
            3,
            &at(5),
        );
        assert_eq!(
            outcome,
            StepOutcome::Wait(
                Duration::from_secs(2),
                "step 1 of 2, sim-updater (version): 10% kubelet".into()
            )
        );
        let step = |s: &MachineStatus| s.in_place_update.as_ref().unwrap().steps[0].clone();
        assert_eq!(step(&status).last_progress_time, Some(at(5)));
        assert_eq!(step(&status).state, "Updating");
        // The same percent with another message: not progress.
        record_answer(
            &mut status,
            0,
            "sha256:u",
            in_progress(Some(10), "still"),
            3,
            &at(50),
        );
        assert_eq!(step(&status).last_progress_time, Some(at(5)));
        assert_eq!(step(&status).message.as_deref(), Some("still"));
        // Higher: progress; above 100 is 100.
        record_answer(
            &mut status,
            0,
            "sha256:u",
            in_progress(Some(250), "x"),
            3,
            &at(60),
        );
        assert_eq!(step(&status).last_progress_time, Some(at(60)));
        assert_eq!(step(&status).percent, Some(100));
    }

    #[test]
    fn a_done_step_records_provenance_and_starts_the_next_steps_clock() {
        let mut status = planned();
        let outcome = record_answer(
            &mut status,
            0,
            "sha256:u",
            Ok(UpdateProgress::Done),
            3,
            &at(40),
        );
        assert_eq!(outcome, StepOutcome::Done);
        let update = status.in_place_update.as_ref().unwrap();
        assert_eq!(update.steps[0].state, "Done");
        assert_eq!(update.steps[0].digest.as_deref(), Some("sha256:u"));
        assert_eq!(update.steps[1].start_time, Some(at(40)));
        assert_eq!(update.steps[1].last_progress_time, Some(at(40)));
        assert_eq!(status.updated_by.len(), 1);
        assert_eq!(status.updated_by[0].updater, "sim-updater");
        assert_eq!(status.updated_by[0].generation, 3);
        // Provenance is bounded.
        for i in 0..(MAX_UPDATE_RECORDS + 5) {
            record_answer(
                &mut status,
                1,
                &format!("sha256:{i}"),
                Ok(UpdateProgress::Done),
                3,
                &at(41),
            );
        }
        assert_eq!(status.updated_by.len(), MAX_UPDATE_RECORDS);
        assert_eq!(
            status.updated_by.last().unwrap().digest,
            format!("sha256:{}", MAX_UPDATE_RECORDS + 4)
        );
    }

    #[test]
    fn failures_stop_the_update_and_transient_errors_wait_bounded() {
        let mut status = planned();
        let long = "x".repeat(capstan_api::MAX_PLUGIN_TEXT * 2);
        let outcome = record_answer(
            &mut status,
            0,
            "d",
            Ok(UpdateProgress::Failed(long)),
            3,
            &at(1),
        );
        let StepOutcome::Failed(message) = outcome else {
            panic!("failed")
        };
        assert!(
            message.len() < capstan_api::MAX_PLUGIN_TEXT + 100,
            "the updater's words are bounded"
        );
        assert!(update_failed_in(&status));

        let mut status = planned();
        let busy = Err(ProviderError::Transient {
            message: "busy".into(),
            retry_after: Duration::from_secs(600),
        });
        let outcome = record_answer(&mut status, 0, "d", busy, 3, &at(1));
        assert_eq!(
            outcome,
            StepOutcome::Wait(
                Duration::from_secs(60),
                "step 1 of 2, sim-updater (version): busy (retrying)".into()
            )
        );
        assert!(!update_failed_in(&status));
        let outcome = record_answer(
            &mut status,
            0,
            "d",
            Err(ProviderError::Unauthorized("expired".into())),
            3,
            &at(2),
        );
        assert!(
            matches!(outcome, StepOutcome::Wait(d, ref m) if d == Duration::from_secs(30) && m.contains("credential grant"))
        );
        let outcome = record_answer(
            &mut status,
            0,
            "d",
            Err(ProviderError::Terminal("no".into())),
            3,
            &at(3),
        );
        assert!(matches!(outcome, StepOutcome::Failed(_)));
        assert_eq!(
            status.in_place_update.as_ref().unwrap().steps[0].state,
            "Failed"
        );
    }
}
