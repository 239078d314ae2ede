//! In-place updates: asking the updaters. Both sides of an update use
//! this: the MachineDeployment controller to plan (its decision and plan
//! cache are in `deployment::plans`), the Machine controller to update
//! (its step is `machine::update`); the updaters themselves are in
//! `capstan_kit::registry`, the claim logic in `capstan_planner::inplace`.
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
//! 4. The Machine controller (`machine::update::advance`) records the plan in the Machine's
//!    status before the first `update` call, calls each updater until it
//!    reports done (honouring `retry-after`), resumes from the recorded steps
//!    after a restart, and finally removes the annotation. A failure stops
//!    there with `Updating=False` / `UpdateFailed`; nothing is rolled back.

use capstan_api::machine_conditions::UPDATING;
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, InPlaceStrategy, Machine, MachineSpec, Plugin, status as cond,
};
use capstan_kit::Kube;
use capstan_kit::provider::{ProviderError, timed_as, to_plugin_machine};
use capstan_kit::registry::{RegisteredUpdater, Updaters};
use capstan_planner::inplace::{self, MachinePlan, Planner, Updater};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;

/// The updaters a policy allows that are active now, in the order they
/// are asked: registered, with a Plugin object that exists and allows
/// `namespace`.
pub(crate) fn eligible(
    kube: &Kube,
    updaters: &Updaters,
    policy: &InPlaceStrategy,
    namespace: &str,
) -> Vec<(Updater, Arc<RegisteredUpdater>)> {
    let mut found: Vec<(Updater, Arc<RegisteredUpdater>)> = updaters
        .all()
        .into_iter()
        .filter(|(name, _)| {
            policy
                .updaters
                .as_ref()
                .is_none_or(|allowed| allowed.contains(name))
        })
        .filter(|(name, _)| {
            kube.stores
                .plugins
                .get(&ObjectRef::<Plugin>::new(name))
                .is_some_and(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && capstan_kit::registry::allowed_in(kube, &p, namespace)
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

/// The changed fields between two machine specs. `providerID` is the
/// Machine's own (written by its controller, never in a template), so it
/// is no change.
pub fn changed_fields(current: &MachineSpec, desired: &MachineSpec) -> Vec<String> {
    let value = |spec: &MachineSpec| {
        let mut spec = spec.clone();
        spec.provider_id = None;
        serde_json::to_value(spec).unwrap_or_default()
    };
    inplace::changed_fields(&value(current), &value(desired))
}

/// `template` as `machine`'s spec: the template's fields, with the
/// Machine's own `providerID` kept.
pub fn spec_from_template(machine: &MachineSpec, template: &MachineSpec) -> MachineSpec {
    MachineSpec {
        provider_id: machine.provider_id.clone(),
        ..template.clone()
    }
}

/// Ask the eligible updaters, in order, which of the changed fields they
/// claim for `machine` going from `current` to `desired`. An updater that
/// cannot answer (an error or a trap) makes the plan unknown: the error
/// says which one and why. `updaters` is [`eligible`]'s answer.
pub(crate) async fn plan_machine(
    kube: &Kube,
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
        // A canary answers for the Machines it serves.
        let registered = registered.for_machine(&machine.uid().unwrap_or_default(), None);
        let labels = (updater.name.as_str(), registered.revision);
        let answer = timed_as(&kube.metrics, labels, "can-update", async {
            Ok(registered
                .plugin
                .can_update(&before, &after, &remaining)
                .await?)
        });
        // A shadowing canary is asked the same at once; its answer is
        // compared (the fields it claims, in any order) and never used.
        let shadow = capstan_kit::canary::shadowing(&registered.canary);
        let mirrored = async {
            let shadow = shadow.as_ref()?;
            let labels = (updater.name.as_str(), shadow.serving.revision);
            Some(
                timed_as(&kube.metrics, labels, "can-update", async {
                    Ok(shadow
                        .serving
                        .plugin
                        .can_update(&before, &after, &remaining)
                        .await?)
                })
                .await,
            )
        };
        let (answer, mirrored) = futures::join!(answer, mirrored);
        if let (Some(shadow), Some(mirrored)) = (&shadow, &mirrored) {
            shadow.compare(&answer, mirrored, |a: &Vec<String>, b| {
                let sorted = |v: &Vec<String>| std::collections::BTreeSet::from_iter(v.clone());
                sorted(a) == sorted(b)
            });
        }
        registered.counts.record("can-update", &answer);
        let answer = answer
            .map_err(|e: ProviderError| format!("updater {}: can-update: {e}", updater.name))?;
        let claimed = planner.claim(updater, &answer);
        if !claimed.ignored.is_empty() {
            tracing::warn!(
                updater = %updater.name,
                machine = %capstan_kit::key_of(machine),
                ignored = ?claimed.ignored,
                "the updater claimed fields outside its declaration, unchanged, or already claimed; ignored"
            );
        }
    }
    Ok(planner.finish())
}

/// The machine as updaters see it before and after.
pub(crate) fn machines(
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

/// What the eligible updater `name`'s steps do to the machine's workloads
/// (the default, disruptive without a drain, for one no longer there).
pub(crate) fn disruption_of(
    updaters: &[(Updater, Arc<RegisteredUpdater>)],
    name: &str,
) -> capstan_manifest::Disruption {
    updaters
        .iter()
        .find(|(u, _)| u.name == name)
        .map(|(_, r)| r.disruption)
        .unwrap_or_default()
}

/// Whether a machine is being updated in place (or its update failed):
/// its set never sheds it, and it counts as unavailable unless every step
/// of its recorded plan keeps it available ([`keeps_availability`]).
pub fn updating_in_place(machine: &Machine) -> bool {
    machine.annotations().contains_key(ANNOTATION_IN_PLACE_FROM)
}

/// Whether a machine being updated in place stays available throughout:
/// its plan for the current spec is recorded, has not failed, and every
/// step's updater declares that it does not affect availability. Before
/// the plan is recorded it does not (the safe assumption).
pub fn keeps_availability(machine: &Machine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| s.in_place_update.as_ref())
        .is_some_and(|u| {
            Some(u.generation) == machine.metadata.generation
                && u.keeps_availability()
                && update_failed(machine).is_none()
        })
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
    fn only_a_recorded_plan_whose_every_step_keeps_availability_keeps_it() {
        use capstan_api::{InPlaceStep, InPlaceUpdateStatus, MachineStatus};
        let step = |keeps: Option<bool>| InPlaceStep {
            updater: "u".into(),
            state: "Updating".into(),
            affects_availability: keeps.map(|k| !k),
            ..Default::default()
        };
        let machine = |steps: Option<Vec<InPlaceStep>>, generation: i64| {
            let mut m = Machine::new("m", spec("v1", serde_json::json!({})));
            m.metadata.generation = Some(2);
            m.metadata.annotations = Some(
                [(ANNOTATION_IN_PLACE_FROM.to_string(), "{}".to_string())]
                    .into_iter()
                    .collect(),
            );
            m.status = Some(MachineStatus {
                in_place_update: steps.map(|steps| InPlaceUpdateStatus {
                    generation,
                    steps,
                    ..Default::default()
                }),
                ..Default::default()
            });
            m
        };
        assert!(keeps_availability(&machine(
            Some(vec![step(Some(true))]),
            2
        )));
        // Not planned yet, planned for an older spec, one step that
        // affects it, or one recorded before steps said (unset): it does not.
        assert!(!keeps_availability(&machine(None, 2)));
        assert!(!keeps_availability(&machine(
            Some(vec![step(Some(true))]),
            1
        )));
        assert!(!keeps_availability(&machine(
            Some(vec![step(Some(true)), step(Some(false))]),
            2
        )));
        assert!(!keeps_availability(&machine(Some(vec![step(None)]), 2)));
        assert!(!keeps_availability(&machine(Some(vec![]), 2)));
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
            ..Default::default()
        });
        assert_eq!(
            changed_fields(&a, &b),
            ["failureDomain", "provider.config.tags.team", "version"]
        );
        // The Machine's own providerID is no change, and a template made
        // into its spec keeps it.
        let mut machine = a.clone();
        machine.provider_id = Some("sim://i-1".into());
        assert!(changed_fields(&machine, &a).is_empty());
        let desired = spec_from_template(&machine, &b);
        assert_eq!(desired.provider_id.as_deref(), Some("sim://i-1"));
        assert_eq!(desired.version, b.version);
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
        let patch = capstan_kit::merge_patch(&from, &to);
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
