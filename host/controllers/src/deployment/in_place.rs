//! The deployment's in-place decision: what the eligible updaters would
//! claim of each old machine ([`crate::inplace::plan_machine`], remembered
//! in a [`PlanCache`] per machine generation, target template and updater
//! set, so a reconcile every few seconds does not ask every updater about
//! every machine again), and from that whether the rollout goes in place,
//! falls back to replacing, or is blocked ([`decide`]).

use super::Context;
use crate::inplace::plan_machine;
use capstan_api::{
    InPlaceFallback, InPlaceStrategy, Machine, MachineDeployment, MachinePlanView, MachineSet,
    MachineSpec, PlannedStep, RolloutPlan,
};
use capstan_kit::Kube;
use capstan_kit::owners::controlled_by;
use capstan_kit::registry::RegisteredUpdater;
use capstan_planner::inplace::{MachinePlan, Updater};
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Plans cached for the deployment controller's previews.
const MAX_CACHED_PLANS: usize = 20_000;

/// Plans the deployment controller computed.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    plans: Mutex<HashMap<String, MachinePlan>>,
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
    kube: &Kube,
    plans: &PlanCache,
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
    if let Some(plan) = plans.plans.lock().expect("plans lock").get(&key) {
        return Ok(plan.clone());
    }
    let plan = plan_machine(kube, machine, &machine.spec, desired, updaters).await?;
    let mut plans = plans.plans.lock().expect("plans lock");
    if plans.len() >= MAX_CACHED_PLANS {
        plans.clear();
    }
    plans.insert(key, plan.clone());
    Ok(plan)
}

/// What an in-place rollout does now.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    /// Every machine's changes are claimed: hand machines over.
    InPlace,
    /// Some are not, and the fallback is `Replace`: roll by replacement.
    Replace,
    /// Nothing moves: unclaimed changes without a fallback, a failed
    /// update, or a plan that cannot be made now.
    Blocked {
        reason: &'static str,
        message: String,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Decision {
    /// In place, replace, or blocked.
    pub(super) kind: Kind,
    /// For `InPlaceUpdatable`'s message.
    pub(super) summary: String,
    /// Per machine, for `capstan rollout plan`.
    pub(super) plan: RolloutPlan,
}

/// Decide how the deployment's old machines reach the current template,
/// from each one's plan (asked before any of them moves, and cached), and
/// describe it for `capstan rollout plan`.
pub(super) async fn decide(
    ctx: &Context,
    md: &MachineDeployment,
    policy: &InPlaceStrategy,
    hash: &str,
    revision: i64,
    sets: &[&Arc<MachineSet>],
    new_set: Option<&MachineSet>,
) -> Decision {
    let new_uid = new_set.and_then(|s| s.uid());
    let all = ctx.kube.stores.machines.state();
    // Asked once per reconcile, not per machine.
    let updaters = crate::inplace::eligible(
        &ctx.kube,
        &ctx.updaters,
        policy,
        &md.namespace().unwrap_or_default(),
    );
    let fingerprint = fingerprint(&updaters);
    let mut gathered = Gathered::default();
    for set in sets {
        let uid = set.uid().unwrap_or_default();
        let is_new = new_uid.as_deref() == Some(uid.as_str());
        for m in all
            .iter()
            .filter(|m| controlled_by(m.as_ref(), &uid) && m.metadata.deletion_timestamp.is_none())
        {
            if crate::inplace::updating_in_place(m) {
                gathered.updating(m);
                continue;
            }
            if is_new {
                continue;
            }
            let plan = cached_plan(
                &ctx.kube,
                &ctx.plans,
                m,
                &md.spec.template.spec,
                hash,
                &updaters,
                &fingerprint,
            )
            .await;
            gathered.planned(m.name_any(), plan, policy, &updaters);
        }
    }
    gathered.decision(policy, revision)
}

/// What the plans of a deployment's machines add up to.
#[derive(Default)]
struct Gathered {
    views: Vec<MachinePlanView>,
    /// Machines whose in-place update failed: "name: why".
    failed: Vec<String>,
    /// Machines that could not be planned: "name: why".
    unknown: Vec<String>,
    /// Changed fields no updater claims, and the machines with any.
    unclaimed: Vec<String>,
    unclaimed_machines: Vec<String>,
    /// Machines waiting for an update.
    pending: usize,
}

impl Gathered {
    /// A machine being updated in place: its recorded steps.
    fn updating(&mut self, m: &Machine) {
        let name = m.name_any();
        let steps = m
            .status
            .as_ref()
            .and_then(|s| s.in_place_update.as_ref())
            .map(|u| {
                u.steps
                    .iter()
                    .map(|s| PlannedStep {
                        updater: s.updater.clone(),
                        fields: s.fields.clone(),
                        drain: s.drain,
                        affects_availability: s.affects_availability,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let action = match crate::inplace::update_failed(m) {
            Some(message) => {
                self.failed.push(format!("{name}: {message}"));
                "UpdateFailed"
            }
            None => "Updating",
        };
        self.views.push(MachinePlanView {
            machine: name,
            action: action.into(),
            steps,
            unclaimed: vec![],
        });
    }

    /// A machine of an old set and its plan (or why it has none).
    fn planned(
        &mut self,
        name: String,
        plan: Result<MachinePlan, String>,
        policy: &InPlaceStrategy,
        updaters: &[(Updater, Arc<RegisteredUpdater>)],
    ) {
        self.pending += 1;
        let plan = match plan {
            Ok(plan) => plan,
            Err(message) => {
                self.unknown.push(format!("{name}: {message}"));
                self.views.push(MachinePlanView {
                    machine: name,
                    action: "Blocked".into(),
                    ..Default::default()
                });
                return;
            }
        };
        let action = if plan.in_place() {
            "InPlace"
        } else if policy.fallback == InPlaceFallback::Replace {
            "Replace"
        } else {
            "Blocked"
        };
        if !plan.in_place() {
            self.unclaimed_machines.push(name.clone());
            for f in &plan.unclaimed {
                if !self.unclaimed.contains(f) {
                    self.unclaimed.push(f.clone());
                }
            }
        }
        let steps = plan
            .steps
            .iter()
            .map(|s| {
                let disruption = crate::inplace::disruption_of(updaters, &s.updater);
                PlannedStep {
                    updater: s.updater.clone(),
                    fields: s.fields.clone(),
                    drain: disruption.drain,
                    affects_availability: Some(disruption.affects_availability),
                }
            })
            .collect();
        self.views.push(MachinePlanView {
            machine: name,
            action: action.into(),
            steps,
            unclaimed: plan.unclaimed,
        });
    }

    /// The rollout's decision: blocked by a failed update or a machine
    /// that cannot be planned, in place, or (changes no updater claims)
    /// replaced or blocked as `policy.fallback` says.
    fn decision(mut self, policy: &InPlaceStrategy, revision: i64) -> Decision {
        self.views.sort_by(|a, b| a.machine.cmp(&b.machine));
        self.unclaimed.sort();
        let few = |items: &[String]| {
            let mut text = items.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
            if items.len() > 3 {
                text.push_str(&format!("; and {} more", items.len() - 3));
            }
            text
        };
        let kind = if !self.failed.is_empty() {
            Kind::Blocked {
                reason: "UpdateFailed",
                message: format!(
                    "the in-place update failed on {}; the rollout stops (nothing is rolled back): delete the machine to replace it on the new template",
                    few(&self.failed)
                ),
            }
        } else if !self.unknown.is_empty() {
            Kind::Blocked {
                reason: "PlanUnavailable",
                message: format!("cannot plan in-place updates: {}", few(&self.unknown)),
            }
        } else if self.unclaimed.is_empty() {
            Kind::InPlace
        } else if policy.fallback == InPlaceFallback::Replace {
            Kind::Replace
        } else {
            Kind::Blocked {
                reason: "UnclaimedChanges",
                message: format!(
                    "no active updater claims {} (machines {}); nothing changes: change the spec, activate an updater that claims them, or set spec.rollout.strategy.inPlace.fallback: Replace",
                    self.unclaimed.join(", "),
                    few(&self.unclaimed_machines)
                ),
            }
        };
        let pending = self.pending;
        let summary = match &kind {
            Kind::InPlace if pending == 0 => "no machine waits for an update".to_string(),
            Kind::InPlace => format!("{pending} machines are updated in place"),
            Kind::Replace => format!(
                "no active updater claims {}; those machines are replaced (fallback Replace)",
                self.unclaimed.join(", ")
            ),
            Kind::Blocked { message, .. } => message.clone(),
        };
        let decision = match &kind {
            Kind::InPlace => "InPlace",
            Kind::Replace => "Replace",
            Kind::Blocked { .. } => "Blocked",
        };
        Decision {
            kind,
            summary,
            plan: RolloutPlan {
                revision,
                decision: decision.into(),
                machines: self.views,
            },
        }
    }
}
