//! The Machine's in-place update step: record the plan in its status
//! before the first `update` call, call each updater until it reports done
//! (honouring `retry-after`), resume from the recorded steps after a
//! restart. A failure stops there with `Updating=False` / `UpdateFailed`;
//! nothing is rolled back. Start with [`advance`]; the end-to-end flow is
//! in `crate::inplace`.

use crate::inplace::{eligible, machines, plan_machine};
use capstan_api::machine_conditions::{UP_TO_DATE, UPDATING};
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, InPlaceStep, InPlaceStrategy, InPlaceUpdateStatus, Machine,
    MachineSpec, MachineStatus, Time, UpdateRecord, set_condition, status as cond,
};
use capstan_kit::Kube;
use capstan_kit::provider::{ProviderError, timed};
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
        let namespace = machine.namespace().unwrap_or_default();
        let updaters = eligible(kube, updaters, &owner_policy(kube, machine), &namespace);
        let plan = match plan_machine(kube, machine, &previous, &machine.spec, &updaters).await {
            Ok(plan) => plan,
            Err(message) => {
                set_progress(status, generation, t, format!("planning: {message}"));
                return Advance::Wait(Duration::from_secs(5));
            }
        };
        status.in_place_update = Some(InPlaceUpdateStatus {
            generation,
            start_time: Some(t.clone()),
            steps: plan
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let disruption = crate::inplace::disruption_of(&updaters, &s.updater);
                    InPlaceStep {
                        updater: s.updater.clone(),
                        fields: s.fields.clone(),
                        state: "Pending".into(),
                        progress_deadline_seconds: updaters
                            .iter()
                            .find(|(u, _)| u.name == s.updater)
                            .map(|(_, r)| deadline_seconds(r.progress_deadline)),
                        drain: disruption.drain,
                        affects_availability: Some(disruption.affects_availability),
                        // The first step is current from the start.
                        start_time: (i == 0).then(|| t.clone()),
                        last_progress_time: (i == 0).then(|| t.clone()),
                        ..Default::default()
                    }
                })
                .collect(),
            unclaimed: plan.unclaimed.clone(),
            ..Default::default()
        });
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
        return Advance::Wait(Duration::from_millis(1));
    }
    if update_failed_in(status) {
        return Advance::Failed;
    }
    let (before, after) = machines(machine, &previous, &machine.spec);
    let total = status.in_place_update.as_ref().map_or(0, |u| u.steps.len());
    loop {
        let update = status.in_place_update.as_mut().expect("planned above");
        let Some(index) = update.steps.iter().position(|s| s.state != "Done") else {
            if let Some(node) = update.uncordon_node.clone() {
                if let Err(e) = drain.uncordon(&node).await {
                    set_progress(status, generation, t, format!("every step is done; {e}"));
                    return Advance::Wait(Duration::from_secs(5));
                }
                update.uncordon_node = None;
            }
            set_condition(
                &mut status.conditions,
                UPDATING,
                cond::FALSE,
                "InPlaceUpdated",
                "",
                Some(generation),
                t,
            );
            set_condition(
                &mut status.conditions,
                UP_TO_DATE,
                cond::TRUE,
                "UpToDate",
                "",
                Some(generation),
                t,
            );
            return Advance::Done;
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
        let result = timed(&kube.metrics, &step.updater, "update", async {
            Ok(registered
                .plugin
                .update(&before, &after, &step.fields)
                .await?)
        })
        .await;
        let step_mut = &mut update.steps[index];
        step_mut.digest = Some(registered.digest().to_string());
        let label = format!(
            "step {} of {total}, {} ({})",
            index + 1,
            step.updater,
            step.fields.join(", ")
        );
        // The updater's words go into conditions and events: bounded.
        let bound = |m: &str| capstan_api::bounded(m, capstan_api::MAX_PLUGIN_TEXT);
        let result = result.map(|progress| match progress {
            UpdateProgress::InProgress(mut p) => {
                p.message = p.message.as_deref().map(bound);
                UpdateProgress::InProgress(p)
            }
            UpdateProgress::Failed(message) => UpdateProgress::Failed(bound(&message)),
            done => done,
        });
        match result {
            Ok(UpdateProgress::Done) => {
                step_mut.state = "Done".into();
                step_mut.percent = Some(100);
                step_mut.message = None;
                // The next step is current from now: its deadline counts
                // from here, not from the plan.
                if let Some(next) = update.steps.get_mut(index + 1) {
                    next.start_time = Some(t.clone());
                    next.last_progress_time = Some(t.clone());
                }
                status.updated_by.push(UpdateRecord {
                    updater: step.updater.clone(),
                    digest: registered.digest().to_string(),
                    fields: step.fields.clone(),
                    generation,
                    time: Some(t.clone()),
                });
                let excess = status.updated_by.len().saturating_sub(MAX_UPDATE_RECORDS);
                status.updated_by.drain(..excess);
            }
            Ok(UpdateProgress::InProgress(progress)) => {
                step_mut.state = "Updating".into();
                let percent = progress.percent.map(|p| p.min(100));
                // Only a rising percent is progress: an updater that keeps
                // answering "in progress" (or varies its message) while
                // nothing moves is what the deadline is for.
                if percent > step_mut.percent || step_mut.last_progress_time.is_none() {
                    step_mut.last_progress_time = Some(t.clone());
                }
                step_mut.percent = percent;
                step_mut.message = progress.message.clone();
                let percent = progress
                    .percent
                    .map(|p| format!("{}% ", p.min(100)))
                    .unwrap_or_default();
                let detail = progress.message.unwrap_or_default();
                set_progress(status, generation, t, format!("{label}: {percent}{detail}"));
                let wait = Duration::from_millis(progress.retry_after_ms.clamp(100, 60_000));
                return Advance::Wait(wait);
            }
            Ok(UpdateProgress::Failed(message)) => {
                step_mut.state = "Failed".into();
                step_mut.message = Some(message.clone());
                return fail(status, generation, t, format!("{label}: {message}"));
            }
            Err(ProviderError::Transient {
                message,
                retry_after,
            }) => {
                step_mut.message = Some(message.clone());
                set_progress(
                    status,
                    generation,
                    t,
                    format!("{label}: {message} (retrying)"),
                );
                return Advance::Wait(
                    retry_after.clamp(Duration::from_millis(100), Duration::from_secs(60)),
                );
            }
            Err(ProviderError::Unauthorized(message)) => {
                // An admin can fix credentials without touching the machine.
                step_mut.message = Some(format!("unauthorized: {message}"));
                set_progress(
                    status,
                    generation,
                    t,
                    format!("{label}: unauthorized: {message}; fix the Plugin's credential grant"),
                );
                return Advance::Wait(Duration::from_secs(30));
            }
            Err(error) => {
                step_mut.state = "Failed".into();
                step_mut.message = Some(error.to_string());
                return fail(status, generation, t, format!("{label}: {error}"));
            }
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
