//! In-place updates: the updater registry, per-machine plans and the
//! Machine controller's update steps.
//!
//! How a machine is updated in place, end to end:
//!
//! 1. The MachineDeployment controller asks the eligible updaters (in
//!    `updateOrder`, then name, order) what they would claim of each old
//!    machine's changed fields ([`plan_machine`], cached per machine
//!    generation, target template and updater set) and decides: in place,
//!    replace (the `Replace` fallback) or blocked. The decision is written
//!    to its status (`capstan rollout plan` prints it).
//! 2. Within `maxSurge` / `maxUnavailable`
//!    ([`capstan_planner::rollout::plan_in_place`]) it lowers an old set's
//!    replicas and annotates it `capstan.dev/in-place-to: <new set>`.
//! 3. That MachineSet hands the machines it sheds to the new set: one patch
//!    per machine moves the owner reference, labels and spec and records the
//!    previous spec in `capstan.dev/in-place-from`. The instance (and its
//!    provider ID) stays.
//! 4. The Machine controller ([`advance`]) records the plan in the Machine's
//!    status before the first `update` call, calls each updater until it
//!    reports done (honouring `retry-after`), resumes from the recorded steps
//!    after a restart, and finally removes the annotation. A failure stops
//!    there with `Updating=False` / `UpdateFailed`; nothing is rolled back.

use crate::Context;
use crate::provider::to_plugin_machine;
use crate::provider::{ProviderError, timed};
use crate::registry::RegisteredUpdater;
use capstan_api::machine_conditions::{UP_TO_DATE, UPDATING};
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, InPlaceStep, InPlaceStrategy, InPlaceUpdateStatus, Machine,
    MachineSpec, MachineStatus, Plugin, Time, UpdateRecord, set_condition, status as cond,
};
use capstan_planner::inplace::{self, MachinePlan, Planner, Updater};
use capstan_runtime::types::UpdateProgress;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Provenance entries kept per machine.
const MAX_UPDATE_RECORDS: usize = 20;
/// Plans cached for the deployment controller's previews.
const MAX_CACHED_PLANS: usize = 20_000;

/// Plans the deployment controller computed, so a reconcile every few
/// seconds does not ask every updater about every machine again.
#[derive(Debug, Default)]
pub struct PlanCache {
    plans: Mutex<HashMap<String, MachinePlan>>,
}

/// The updaters a policy allows that are active now, in the order they
/// are asked: registered, with a Plugin object that exists and allows
/// `namespace`.
pub(crate) fn eligible(
    ctx: &Context,
    policy: &InPlaceStrategy,
    namespace: &str,
) -> Vec<(Updater, Arc<RegisteredUpdater>)> {
    let mut found: Vec<(Updater, Arc<RegisteredUpdater>)> = ctx
        .updaters
        .all()
        .into_iter()
        .filter(|(name, _)| {
            policy
                .updaters
                .as_ref()
                .is_none_or(|allowed| allowed.contains(name))
        })
        .filter(|(name, _)| {
            ctx.stores
                .plugins
                .get(&ObjectRef::<Plugin>::new(name))
                .is_some_and(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && crate::registry::allowed_in(ctx, &p, namespace)
                })
        })
        .map(|(name, registered)| {
            (
                Updater {
                    name,
                    order: registered.order,
                    fields: registered.fields.clone(),
                },
                registered,
            )
        })
        .collect();
    found.sort_by(|a, b| {
        (a.0.order.unwrap_or(i32::MAX), &a.0.name).cmp(&(b.0.order.unwrap_or(i32::MAX), &b.0.name))
    });
    found
}

/// The changed fields between two machine specs.
pub fn changed_fields(current: &MachineSpec, desired: &MachineSpec) -> Vec<String> {
    let a = serde_json::to_value(current).unwrap_or_default();
    let b = serde_json::to_value(desired).unwrap_or_default();
    inplace::changed_fields(&a, &b)
}

/// Ask the eligible updaters, in order, which of the changed fields they
/// claim for `machine` going from `current` to `desired`. An updater that
/// cannot answer (an error or a trap) makes the plan unknown: the error
/// says which one and why. `updaters` is [`eligible`]'s answer.
pub(crate) async fn plan_machine(
    ctx: &Context,
    machine: &Machine,
    current: &MachineSpec,
    desired: &MachineSpec,
    updaters: &[(Updater, Arc<RegisteredUpdater>)],
) -> Result<MachinePlan, String> {
    let changed = changed_fields(current, desired);
    let mut planner = Planner::new(changed);
    let (before, after) = machines(machine, current, desired);
    for (updater, registered) in updaters {
        if planner.remaining().is_empty() {
            break;
        }
        let remaining = planner.remaining().to_vec();
        let answer = timed(&ctx.metrics, &updater.name, "can-update", async {
            Ok(registered
                .plugin
                .can_update(&before, &after, &remaining)
                .await?)
        })
        .await
        .map_err(|e: ProviderError| format!("updater {}: can-update: {e}", updater.name))?;
        let claimed = planner.claim(updater, &answer);
        if !claimed.ignored.is_empty() {
            tracing::warn!(
                updater = %updater.name,
                machine = %crate::key_of(machine),
                ignored = ?claimed.ignored,
                "the updater claimed fields outside its declaration, unchanged, or already claimed; ignored"
            );
        }
    }
    Ok(planner.finish())
}

/// The identity of an updater set (names, digests, orders), for
/// [`cached_plan`]'s key.
pub(crate) fn fingerprint(updaters: &[(Updater, Arc<RegisteredUpdater>)]) -> String {
    updaters
        .iter()
        .map(|(u, r)| format!("{}@{}#{:?}", u.name, r.digest(), u.order))
        .collect::<Vec<_>>()
        .join(",")
}

/// [`plan_machine`], remembered per machine generation, target and
/// updater set ([`fingerprint`]) so an unchanged question is not asked
/// twice.
pub(crate) async fn cached_plan(
    ctx: &Context,
    machine: &Machine,
    desired: &MachineSpec,
    target_hash: &str,
    updaters: &[(Updater, Arc<RegisteredUpdater>)],
    fingerprint: &str,
) -> Result<MachinePlan, String> {
    let key = format!(
        "{}/{}/{target_hash}/{fingerprint}",
        machine.uid().unwrap_or_default(),
        machine.metadata.generation.unwrap_or(0),
    );
    if let Some(plan) = ctx.plans.plans.lock().expect("plans lock").get(&key) {
        return Ok(plan.clone());
    }
    let plan = plan_machine(ctx, machine, &machine.spec, desired, updaters).await?;
    let mut plans = ctx.plans.plans.lock().expect("plans lock");
    if plans.len() >= MAX_CACHED_PLANS {
        plans.clear();
    }
    plans.insert(key, plan.clone());
    Ok(plan)
}

/// The machine as updaters see it before and after.
fn machines(
    machine: &Machine,
    current: &MachineSpec,
    desired: &MachineSpec,
) -> (
    capstan_runtime::types::Machine,
    capstan_runtime::types::Machine,
) {
    let mut before = machine.clone();
    before.spec = current.clone();
    let mut after = machine.clone();
    after.spec = desired.clone();
    (to_plugin_machine(&before), to_plugin_machine(&after))
}

/// Whether a machine is being updated in place (or its update failed):
/// it counts as unavailable and its set never sheds it.
pub fn updating_in_place(machine: &Machine) -> bool {
    machine.annotations().contains_key(ANNOTATION_IN_PLACE_FROM)
}

/// Whether a machine's in-place update failed (it waits for a human).
pub fn update_failed(machine: &Machine) -> Option<String> {
    let status = machine.status.as_ref()?;
    let update = status.in_place_update.as_ref()?;
    if !updating_in_place(machine) || update.generation != machine.metadata.generation? {
        return None;
    }
    let condition = capstan_api::condition(&status.conditions, UPDATING)?;
    (condition.status == cond::FALSE && condition.reason == "UpdateFailed")
        .then(|| condition.message.clone())
}

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
    ctx: &Context,
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
        let updaters = eligible(ctx, &owner_policy(ctx, machine), &namespace);
        let plan = match plan_machine(ctx, machine, &previous, &machine.spec, &updaters).await {
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
                .map(|s| InPlaceStep {
                    updater: s.updater.clone(),
                    fields: s.fields.clone(),
                    state: "Pending".into(),
                    ..Default::default()
                })
                .collect(),
            unclaimed: plan.unclaimed.clone(),
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
        if let Some(message) = crate::registry::not_allowed(ctx, &step.updater, &namespace) {
            set_progress(status, generation, t, message);
            return Advance::Wait(Duration::from_secs(15));
        }
        let Some(registered) = ctx.updaters.get(&step.updater) else {
            let message = format!("waiting for updater {} to be active", step.updater);
            set_progress(status, generation, t, message);
            return Advance::Wait(Duration::from_secs(5));
        };
        let result = timed(&ctx.metrics, &step.updater, "update", async {
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
                step_mut.percent = progress.percent.map(|p| p.min(100));
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

fn update_failed_in(status: &MachineStatus) -> bool {
    status
        .in_place_update
        .as_ref()
        .is_some_and(|u| !u.unclaimed.is_empty() || u.steps.iter().any(|s| s.state == "Failed"))
}

/// The in-place policy of the set that owns the machine (every active
/// updater when it has none).
fn owner_policy(ctx: &Context, machine: &Machine) -> InPlaceStrategy {
    let namespace = machine.namespace().unwrap_or_default();
    machine
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "MachineSet")
        .and_then(|o| {
            ctx.stores
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
    use capstan_api::ProviderRef;

    fn spec(version: &str, config: serde_json::Value) -> MachineSpec {
        MachineSpec {
            version: Some(version.into()),
            provider: ProviderRef {
                plugin: "sim".into(),
                config,
            },
            ..Default::default()
        }
    }

    #[test]
    fn changed_fields_use_the_api_field_names() {
        let a = spec(
            "v1.30.0",
            serde_json::json!({"endpoint": "e", "tags": {"team": "a"}}),
        );
        let mut b = spec(
            "v1.31.0",
            serde_json::json!({"endpoint": "e", "tags": {"team": "b"}}),
        );
        b.failure_domain = Some("zone-b".into());
        b.deletion = Some(capstan_api::MachineDeletionSpec {
            node_drain_timeout_seconds: Some(5),
        });
        assert_eq!(
            changed_fields(&a, &b),
            ["failureDomain", "provider.config.tags.team", "version"]
        );
    }

    #[test]
    fn the_hand_over_patch_removes_what_the_new_spec_drops() {
        let mut a = spec(
            "v1.30.0",
            serde_json::json!({"endpoint": "e", "instanceType": "small"}),
        );
        a.failure_domain = Some("zone-a".into());
        let b = spec("v1.31.0", serde_json::json!({"endpoint": "e"}));
        let from = serde_json::to_value(&a).unwrap();
        let to = serde_json::to_value(&b).unwrap();
        let patch = crate::merge_patch(&from, &to);
        assert_eq!(
            patch,
            serde_json::json!({
                "failureDomain": null,
                "version": "v1.31.0",
                "provider": {"config": {"instanceType": null}},
            })
        );
        // Applying it (RFC 7386) gives exactly the new spec.
        fn apply(target: &mut serde_json::Value, patch: &serde_json::Value) {
            match (target, patch) {
                (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                    for (k, v) in p {
                        if v.is_null() {
                            t.remove(k);
                        } else {
                            apply(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                        }
                    }
                }
                (t, p) => *t = p.clone(),
            }
        }
        let mut applied = from.clone();
        apply(&mut applied, &patch);
        assert_eq!(applied, to);
    }
}
