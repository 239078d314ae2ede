//! Remediation by a MachineSet, as Cluster API's does it: the machines a
//! MachineHealthCheck handed over (`OwnerRemediated=False`) are deleted —
//! only by the deployment's current set, newest first, at most the
//! deployment's `spec.remediation.maxInFlight` at once — and replaced by
//! the set's ordinary scaling.

use super::{CONTROLLER, Context};
use capstan_api::{Machine, MachineSet, machine_conditions, status as cond};
use capstan_kit::write::record_event;
use capstan_kit::{Error, key_of, kube_err, now};
use capstan_planner::machineset as plan;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

/// Whether a health check found this machine unhealthy or handed it over
/// for remediation (it goes early when the set shrinks, as in Cluster
/// API's deletion priority).
pub(super) fn unhealthy(machine: &Machine) -> bool {
    let failed_check = machine.status.as_ref().is_some_and(|s| {
        capstan_api::condition(&s.conditions, machine_conditions::HEALTH_CHECK_SUCCEEDED)
            .is_some_and(|c| c.status == capstan_api::status::FALSE)
    });
    failed_check || remediation_requested(machine)
}

/// Whether a MachineHealthCheck handed this machine to its owner for
/// remediation (`OwnerRemediated=False`).
fn remediation_requested(machine: &Machine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, machine_conditions::OWNER_REMEDIATED))
        .is_some_and(|c| c.status == cond::FALSE)
}

/// Remediation: a machine a health check handed over is deleted now (its
/// Node drained first by the Machine controller) and, being gone from the
/// set's count, replaced. Returns the names deleted.
pub(super) async fn remediate(
    ctx: &Context,
    machines_api: &Api<Machine>,
    set: &MachineSet,
    mine: &[Arc<Machine>],
) -> Result<Vec<String>, Error> {
    let requested: Vec<plan::Unhealthy> = mine
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none() && remediation_requested(m))
        .map(|m| plan::Unhealthy {
            name: m.name_any(),
            created: m.creation_timestamp().map_or(0, |c| c.0.as_second()),
        })
        .collect();
    if requested.is_empty() {
        return Ok(vec![]);
    }
    let in_flight = mine
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_some() && remediation_requested(m))
        .count();
    let (current_revision, max_in_flight) = remediation_policy(ctx, set);
    let chosen = plan::to_remediate(&requested, in_flight, max_in_flight, current_revision);
    let mut deleted = vec![];
    for m in mine.iter().filter(|m| chosen.contains(&m.name_any())) {
        let name = m.name_any();
        match machines_api
            .delete(&name, &DeleteParams::background())
            .await
        {
            Ok(_) => {
                ctx.kube.metrics.wrote(CONTROLLER, "delete");
                deleted.push(name.clone());
                let why = m
                    .status
                    .as_ref()
                    .and_then(|s| {
                        capstan_api::condition(
                            &s.conditions,
                            machine_conditions::HEALTH_CHECK_SUCCEEDED,
                        )
                    })
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                tracing::info!(set = %key_of(set), machine = %name, %why, "remediating");
                record_event(
                    &ctx.kube,
                    CONTROLLER,
                    &set.object_ref(&()),
                    EventType::Normal,
                    "MachineRemediated",
                    format!("deleting unhealthy machine {name} ({why}); a replacement is created"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot delete unhealthy machine {}/{name}",
                    set.namespace().unwrap_or_default()
                ))(e));
            }
        }
    }
    Ok(deleted)
}

/// Whether the set may remediate (it is not an older revision of its
/// deployment) and its deployment's `spec.remediation.maxInFlight`,
/// resolved on the deployment's replicas, rounded up.
fn remediation_policy(ctx: &Context, set: &MachineSet) -> (bool, Option<usize>) {
    let Some(owner) = set
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "MachineDeployment")
    else {
        return (true, None);
    };
    let key = ObjectRef::new(&owner.name).within(&set.namespace().unwrap_or_default());
    let Some(md) = ctx.kube.stores.deployments.get(&key) else {
        return (true, None);
    };
    let current = crate::template::set_is_current(&md, set, now().0.as_second());
    let max_in_flight = md
        .spec
        .remediation
        .as_ref()
        .and_then(|r| r.max_in_flight.as_ref())
        .and_then(|v| crate::template::int_or_percent(v).ok())
        .map(|bound| usize::try_from(bound.resolve(md.spec.replicas, true)).unwrap_or(0));
    (current, max_in_flight)
}
