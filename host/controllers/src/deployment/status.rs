//! The deployment's status, derived once per pass from what it observed
//! and did: counts, phase, `Available`, `InPlaceUpdatable` and
//! `Progressing`.

use super::{Decision, Kind, Observed};
use capstan_api::set_conditions::{AVAILABLE, IN_PLACE_UPDATABLE, PROGRESSING};
use capstan_api::{DeploymentPhase, MachineDeployment, MachineDeploymentStatus, status as cond};
use capstan_kit::Conditions;
use capstan_planner::rollout::Strategy;

/// Where the rollout stands after this pass, for its status.
#[derive(Debug)]
pub(super) struct RolloutState<'a> {
    pub(super) strategy: Strategy,
    pub(super) observed: &'a Observed,
    pub(super) decision: Option<&'a Decision>,
    pub(super) conflict: Option<&'a str>,
    pub(super) revision: i64,
    pub(super) complete: bool,
    /// An automatic rollback that fired and is held (reason, message).
    pub(super) rollback_held: Option<(&'static str, String)>,
}

/// The deployment's status from what this pass observed and did: counts,
/// phase, `Available`, `InPlaceUpdatable` and `Progressing`.
pub(super) fn derive_status(
    status: &mut MachineDeploymentStatus,
    md: &MachineDeployment,
    rollout: &RolloutState<'_>,
    t: &capstan_api::Time,
) {
    let RolloutState {
        strategy,
        observed,
        decision,
        conflict,
        revision,
        complete,
        ref rollback_held,
    } = *rollout;
    let totals = &observed.totals;
    let replicas = md.spec.replicas;
    let paused = md.spec.paused;
    let blocked = decision.is_some_and(|d| matches!(d.kind, Kind::Blocked { .. }));
    let max_unavailable = match strategy {
        Strategy::RollingUpdate(b) => b.max_unavailable,
        Strategy::OnDelete => 0,
    };
    status.replicas = totals.replicas;
    status.updated_replicas = totals.updated;
    status.up_to_date_replicas = totals.machines.up_to_date();
    status.versions = totals.machines.versions();
    status.ready_replicas = totals.ready;
    status.available_replicas = totals.available;
    status.unavailable_replicas = (replicas - totals.available).max(0);
    status.revision = Some(revision);
    let old_machines: i32 = observed.old_views.iter().map(|v| v.machines).sum();
    let updating: i32 = observed
        .new_view
        .iter()
        .chain(&observed.old_views)
        .map(|v| v.updating)
        .sum();
    status.phase = Some(if totals.failed > 0 {
        DeploymentPhase::Failed
    } else if blocked && !paused && !complete {
        DeploymentPhase::Blocked
    } else if paused && !complete {
        DeploymentPhase::Paused
    } else if (old_machines > 0 || updating > 0) && strategy != Strategy::OnDelete {
        DeploymentPhase::RollingOut
    } else if totals.replicas < replicas {
        DeploymentPhase::ScalingUp
    } else if totals.replicas > replicas {
        DeploymentPhase::ScalingDown
    } else if totals.available >= replicas {
        DeploymentPhase::Running
    } else {
        DeploymentPhase::ScalingUp
    });
    status.in_place_plan = decision
        .map(|d| d.plan.clone())
        .filter(|p| !p.machines.is_empty());
    if decision.is_none() {
        status.conditions.retain(|c| c.type_ != IN_PLACE_UPDATABLE);
    }
    let mut conditions = Conditions::new(&mut status.conditions, md.metadata.generation, t);
    // Cluster API v1beta2's reasons.
    if totals.available >= replicas - max_unavailable {
        conditions.set(AVAILABLE, cond::TRUE, "Available", "");
    } else {
        let message = format!(
            "{} of at least {} machines available",
            totals.available,
            replicas - max_unavailable
        );
        conditions.set(AVAILABLE, cond::FALSE, "NotAvailable", message);
    }
    totals.machines.apply(&mut conditions, replicas, true);
    if let Some(d) = decision {
        let (state, reason, message) = match &d.kind {
            Kind::InPlace => (cond::TRUE, "InPlace", d.summary.clone()),
            Kind::Replace => (cond::FALSE, "FallbackReplace", d.summary.clone()),
            Kind::Blocked { reason, message } => (cond::FALSE, *reason, message.clone()),
        };
        conditions.set(IN_PLACE_UPDATABLE, state, reason, message);
    }
    let (state, reason, message) = match (conflict, decision.map(|d| &d.kind)) {
        (Some(message), _) => (cond::FALSE, "MachineSetConflict", message.to_string()),
        _ if rollback_held.is_some() && !paused => {
            let (reason, message) = rollback_held.clone().unwrap_or_default();
            (cond::FALSE, reason, message)
        }
        (None, Some(Kind::Blocked { reason, message })) if !(paused || complete) => {
            (cond::FALSE, *reason, message.clone())
        }
        _ if paused => (
            cond::UNKNOWN,
            "DeploymentPaused",
            "the rollout is paused; set spec.paused=false to resume".to_string(),
        ),
        _ if complete => (
            cond::TRUE,
            "NewMachineSetAvailable",
            format!("revision {revision} is rolled out"),
        ),
        _ => (
            cond::TRUE,
            "MachineSetUpdated",
            format!(
                "rolling out revision {revision}: {} of {replicas} machines updated",
                totals.updated
            ),
        ),
    };
    conditions.set(PROGRESSING, state, reason, message);
}
