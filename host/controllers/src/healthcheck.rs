//! The MachineHealthCheck controller: judges the machines a check selects
//! (`capstan_planner::healthcheck`), writes each machine's
//! `HealthCheckSucceeded` condition, and hands unhealthy machines to their
//! owning MachineSet by setting `OwnerRemediated=False` — within the
//! short-circuit (`remediation.triggerIf`) and `remediation.maxInFlight`.
//! The MachineSet then deletes and replaces them (see `machineset`).
//!
//! The machine conditions are written with their own field manager
//! ([`FIELD_MANAGER`]) so the Machine controller's status writes, which
//! carry only its own condition types, never erase them.

use capstan_api::health_check_conditions::REMEDIATION_ALLOWED;
use capstan_api::machine_conditions::{HEALTH_CHECK_SUCCEEDED, OWNER_REMEDIATED};
use capstan_api::{
    ANNOTATION_REMEDIATE_MACHINE, ANNOTATION_SKIP_REMEDIATION, Condition,
    DEFAULT_NODE_STARTUP_TIMEOUT_SECONDS, IntOrString, Machine, MachineHealthCheck,
    selector_matches, set_condition, status as cond,
};
use capstan_kit::controller::Spec;
use capstan_kit::objects::machines_of_node;
use capstan_kit::owners::owner_reference_kind;
use capstan_kit::write::{apply_status, record_event};
use capstan_kit::{Conditions, Error, Kube, key_of, kube_err, now};
use capstan_planner::Bound;
use capstan_planner::healthcheck::{
    self as plan, Checks, ObservedCondition, Rule, Target, Trigger, Unhealthy, Verdict,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "machinehealthcheck";
/// Field manager of the conditions this controller writes on Machines.
pub const FIELD_MANAGER: &str = "capstan-healthcheck";

/// What the health-check controller works with: the shared [`Kube`], and
/// the workload clusters whose Nodes checks with `spec.clusterName` read.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) kube: Kube,
    pub(crate) clusters: capstan_kit::workload::WorkloadClusters,
}

impl Context {
    pub(crate) fn new(kube: &Kube, clusters: &capstan_kit::workload::WorkloadClusters) -> Self {
        Context {
            kube: kube.clone(),
            clusters: clusters.clone(),
        }
    }
}

impl std::ops::Deref for Context {
    type Target = Kube;
    fn deref(&self) -> &Kube {
        &self.kube
    }
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

pub(crate) async fn controller(
    checks: ReflectHandle<MachineHealthCheck>,
    machines: ReflectHandle<Machine>,
    nodes: ReflectHandle<Node>,
    deleted: impl futures::Stream<Item = crate::Deleted> + Send + 'static,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let store = ctx.stores.health_checks.clone();
    let (by_machine, by_node, checks_of_deleted) = (store.clone(), store.clone(), store.clone());
    let machine_store = ctx.stores.machines.clone();
    let machines_of_deleted = machine_store.clone();
    let ids = ctx.stores.machine_ids.clone();
    let ids_of_deleted = ids.clone();
    // Deletions reach the checks at once: a machine whose Node is gone,
    // or one fewer machine to count.
    let deletions = deleted.flat_map(move |gone| {
        let refs = match gone {
            crate::Deleted::Node(node) => {
                machines_of_node(&machines_of_deleted, &ids_of_deleted, &node)
                    .iter()
                    .flat_map(|m| checks_selecting(&checks_of_deleted, m))
                    .collect::<Vec<_>>()
            }
            crate::Deleted::Machine(machine) => checks_selecting(&checks_of_deleted, &machine),
        };
        futures::stream::iter(refs)
    });
    let (checks_of_cluster, machines_of_cluster) = (store.clone(), ctx.stores.machines.clone());
    let cluster_ids = ctx.stores.machine_ids.clone();
    let workload = ctx.clusters.events().flat_map(move |event| {
        let refs: Vec<_> =
            crate::machine::machines_of_event(&machines_of_cluster, &cluster_ids, &event)
                .iter()
                .filter_map(|r| machines_of_cluster.get(r))
                .flat_map(|m| checks_selecting(&checks_of_cluster, &m))
                .collect();
        futures::stream::iter(refs)
    });
    let deletions = futures::stream::select(deletions, workload);
    let watches = move |controller: Controller<MachineHealthCheck>| {
        controller
            .watches_shared_stream(machines, move |machine: Arc<Machine>| {
                checks_selecting(&by_machine, &machine)
            })
            .watches_shared_stream(nodes, move |node: Arc<Node>| {
                machines_of_node(&machine_store, &ids, &node)
                    .iter()
                    .flat_map(|m| checks_selecting(&by_node, m))
                    .collect::<Vec<_>>()
            })
            .reconcile_on(deletions)
    };
    let spec = Spec::new(CONTROLLER, checks, store, 2);
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

fn checks_selecting(
    checks: &Store<MachineHealthCheck>,
    machine: &Machine,
) -> Vec<ObjectRef<MachineHealthCheck>> {
    checks
        .state()
        .iter()
        .filter(|c| selects(c, machine))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

fn selects(check: &MachineHealthCheck, machine: &Machine) -> bool {
    check.namespace() == machine.namespace()
        && selector_matches(&check.spec.selector, machine.labels())
        // A check judges the machines of one cluster: the Nodes it reads
        // are that cluster's.
        && check.spec.cluster_name == machine.spec.cluster_name
}

/// The spec resolved for the planner, or which field is wrong.
fn resolve(check: &MachineHealthCheck) -> Result<(Checks, Trigger, Option<Bound>), String> {
    let spec = &check.spec;
    let rules = |rules: &[capstan_api::UnhealthyCondition], field: &str| {
        rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if !matches!(r.status.as_str(), "True" | "False" | "Unknown") {
                    return Err(format!(
                        "spec.checks.{field}[{i}].status: {:?} is not True, False or Unknown",
                        r.status
                    ));
                }
                Ok(Rule {
                    type_: r.type_.clone(),
                    status: r.status.clone(),
                    timeout: i64::from(r.timeout_seconds.max(0)),
                })
            })
            .collect::<Result<Vec<_>, String>>()
    };
    let checks = Checks {
        node_startup_timeout: i64::from(
            spec.checks
                .node_startup_timeout_seconds
                .unwrap_or(DEFAULT_NODE_STARTUP_TIMEOUT_SECONDS)
                .max(0),
        ),
        node_rules: rules(
            &spec.checks.unhealthy_node_conditions,
            "unhealthyNodeConditions",
        )?,
        machine_rules: rules(
            &spec.checks.unhealthy_machine_conditions,
            "unhealthyMachineConditions",
        )?,
    };
    let bound = |value: &IntOrString, field: &str| {
        crate::template::int_or_percent(value).map_err(|e| format!("{field}: {e}"))
    };
    let trigger_if = spec.remediation.trigger_if.as_ref();
    let trigger = Trigger {
        max_unhealthy: trigger_if
            .and_then(|t| t.unhealthy_less_than_or_equal_to.as_ref())
            .map(|v| bound(v, "spec.remediation.triggerIf.unhealthyLessThanOrEqualTo"))
            .transpose()?,
        range: trigger_if
            .and_then(|t| t.unhealthy_in_range.as_deref())
            .map(|r| {
                plan::parse_range(r)
                    .map_err(|e| format!("spec.remediation.triggerIf.unhealthyInRange: {e}"))
            })
            .transpose()?,
    };
    let max_in_flight = spec
        .remediation
        .max_in_flight
        .as_ref()
        .map(|v| bound(v, "spec.remediation.maxInFlight"))
        .transpose()?;
    Ok((checks, trigger, max_in_flight))
}

fn observed(conditions: &[Condition]) -> Vec<ObservedCondition> {
    conditions
        .iter()
        .map(|c| ObservedCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            since: c.last_transition_time.0.as_second(),
        })
        .collect()
}

fn node_conditions(node: &Node) -> Vec<ObservedCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| ObservedCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            since: c
                .last_transition_time
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
        })
        .collect()
}

/// Whether the MachineSet controller can remediate this machine.
fn has_owner(machine: &Machine) -> bool {
    owner_reference_kind(machine) == Some("MachineSet")
}

/// The cluster whose Nodes the check reads: the one Capstan runs in, or
/// its `clusterName`'s. None is judged, and no machine remediated, while
/// that cluster cannot be reached (Cluster API's checks hold the same
/// way): `Err` is the condition's reason and message then.
fn nodes_of(check: &MachineHealthCheck, ctx: &Context) -> Result<Kube, (String, String)> {
    let Some(name) = check.spec.cluster_name.as_deref() else {
        return Ok(ctx.kube.clone());
    };
    let namespace = check.namespace().unwrap_or_default();
    let placement = crate::machine::placement_named(&ctx.kube, &ctx.clusters, &namespace, name);
    match placement.reach.kube(&ctx.kube) {
        Some(nodes) => Ok(nodes.clone()),
        None => Err(placement.reach.down().unwrap_or_default()),
    }
}

/// One pass over a MachineHealthCheck: resolve its spec, judge the machines
/// it targets, decide which to hand to their owners (within the
/// short-circuit and `maxInFlight`), mark them, then write its status once.
async fn reconcile(check: Arc<MachineHealthCheck>, ctx: Arc<Context>) -> Result<Action, Error> {
    if check.metadata.deletion_timestamp.is_some() || capstan_kit::paused(check.as_ref()) {
        return Ok(Action::await_change());
    }
    // A paused Cluster holds its checks too; its unpausing is seen soon.
    let namespace = check.namespace().unwrap_or_default();
    let cluster = check.spec.cluster_name.as_deref();
    if capstan_kit::objects::cluster_paused(&ctx.stores, &namespace, cluster) {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let generation = check.metadata.generation;
    let current = check.status.clone();
    let mut status = current.clone().unwrap_or_default();
    status.observed_generation = generation;
    let t = now();
    let (checks, trigger, max_in_flight) = match resolve(&check) {
        Ok(resolved) => resolved,
        Err(message) => {
            let problem = Some(("InvalidSpec", message.as_str()));
            Conditions::new(&mut status.conditions, generation, &t).valid_spec(problem);
            apply_status(&ctx, CONTROLLER, check.as_ref(), current.as_ref(), &status).await?;
            return Ok(Action::await_change());
        }
    };
    Conditions::new(&mut status.conditions, generation, &t).valid_spec(None);

    let nodes = match nodes_of(&check, &ctx) {
        Ok(nodes) => nodes,
        Err((reason, message)) => {
            let mut conditions = Conditions::new(&mut status.conditions, generation, &t);
            conditions.set(REMEDIATION_ALLOWED, cond::FALSE, &reason, message);
            apply_status(&ctx, CONTROLLER, check.as_ref(), current.as_ref(), &status).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    };
    let now_s = t.0.as_second();
    let machines = targets(&check, &ctx);
    let live: Vec<&Arc<Machine>> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    let judged = judge_all(&nodes, &live, &checks, now_s);
    // As in Cluster API: every selected machine is expected, deleting ones
    // included, and whatever is not healthy (being remediated, booting, a
    // timeout still running) counts against the short-circuit.
    let expected = i32::try_from(machines.len()).unwrap_or(i32::MAX);
    let healthy = i32::try_from(judged.healthy).unwrap_or(i32::MAX);
    let allowed = plan::remediations_allowed(expected, expected - healthy, &trigger);
    let unhealthy: Vec<Unhealthy> = live
        .iter()
        .zip(&judged.verdicts)
        .filter(|(m, v)| v.is_unhealthy() && has_owner(m))
        .map(|(m, _)| Unhealthy {
            name: m.name_any(),
            since: unhealthy_since(m, now_s),
            requested: remediation_requested(m),
        })
        .collect();
    let in_flight = machines
        .iter()
        .filter(|m| has_owner(m) && remediation_requested(m))
        .count();
    let max_in_flight =
        max_in_flight.map(|b| usize::try_from(b.resolve(expected, true)).unwrap_or(0));
    let report_only = check.spec.remediation.mode == Some(capstan_api::RemediationMode::Report);
    let chosen = if report_only {
        vec![]
    } else {
        plan::to_remediate(&unhealthy, in_flight, max_in_flight, allowed.is_ok())
    };

    for (m, verdict) in live.iter().zip(&judged.verdicts) {
        let remediate = chosen.contains(&m.name_any());
        mark(&ctx, m, verdict, remediate, &t).await?;
    }

    status.expected_machines = expected;
    status.current_healthy = healthy;
    status.remediations_allowed = *allowed.as_ref().unwrap_or(&0);
    status.targets = machines.iter().map(|m| m.name_any()).collect();
    let mut conditions = Conditions::new(&mut status.conditions, generation, &t);
    match &allowed {
        Ok(_) => conditions.set(REMEDIATION_ALLOWED, cond::TRUE, "RemediationAllowed", ""),
        Err(message) => conditions.set(
            REMEDIATION_ALLOWED,
            cond::FALSE,
            "TooManyUnhealthy",
            message.clone(),
        ),
    };
    let changed = apply_status(&ctx, CONTROLLER, check.as_ref(), current.as_ref(), &status).await?;
    let was_blocked = current
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, REMEDIATION_ALLOWED))
        .is_some_and(|c| c.status == cond::FALSE);
    if let (true, false, Err(message)) = (changed, was_blocked, &allowed) {
        let object = check.object_ref(&());
        let (warning, reason) = (EventType::Warning, "RemediationRestricted");
        record_event(&ctx, CONTROLLER, &object, warning, reason, message.clone()).await;
    }
    // Unhealthy machines left waiting are looked at again soon: the
    // removal of a machine in remediation frees a maxInFlight slot, and a
    // removal is not an event the shared caches pass on.
    let waiting = !report_only
        && unhealthy
            .iter()
            .any(|u| !u.requested && !chosen.contains(&u.name));
    let mut next = judged.recheck.map_or(ctx.resync, |wait| {
        Duration::from_secs(wait.max(0) as u64 + 1)
    });
    if waiting {
        next = next.min(if allowed.is_ok() {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(10)
        });
    }
    Ok(Action::requeue(next))
}

/// The machines a check targets, by name: those it selects, except (as in
/// Cluster API) a paused machine or one that asks to be skipped — not
/// judged, not counted, not remediated.
fn targets(check: &MachineHealthCheck, kube: &Kube) -> Vec<Arc<Machine>> {
    let mut machines: Vec<Arc<Machine>> = kube
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| selects(check, m))
        .filter(|m| {
            !capstan_kit::paused(m.as_ref())
                && !m.annotations().contains_key(ANNOTATION_SKIP_REMEDIATION)
        })
        .collect();
    machines.sort_by_key(|m| m.name_any());
    machines
}

/// Whether the check already handed this machine to its owner
/// (`OwnerRemediated=False`).
fn remediation_requested(m: &Machine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, OWNER_REMEDIATED))
        .is_some_and(|c| c.status == cond::FALSE)
}

/// The verdicts on the live targets.
#[derive(Debug, Default)]
struct Judged {
    /// One per live target, in order.
    verdicts: Vec<Verdict>,
    /// How many count as healthy.
    healthy: usize,
    /// The soonest a healthy machine's timeout may run out (seconds).
    recheck: Option<i64>,
}

/// Judge each live target against the checks.
fn judge_all(kube: &Kube, live: &[&Arc<Machine>], checks: &Checks, now_s: i64) -> Judged {
    let mut judged = Judged::default();
    for m in live {
        let machine_status = m.status.clone().unwrap_or_default();
        // The Node the Machine controller took as this machine's (its
        // claim checked), never merely one that names the provider ID.
        let node = crate::machine::own_node(&kube.stores.nodes, &machine_status);
        let target = Target {
            name: m.name_any(),
            created: m.creation_timestamp().map_or(now_s, |c| c.0.as_second()),
            infrastructure_ready_at: capstan_api::condition(
                &machine_status.conditions,
                capstan_api::machine_conditions::INSTANCE_PROVISIONED,
            )
            .filter(|c| c.status == cond::TRUE)
            .map(|c| c.last_transition_time.0.as_second()),
            node_ref: machine_status.node_ref.as_ref().map(|n| n.name.clone()),
            node: node.as_deref().map(node_conditions),
            machine_conditions: observed(&machine_status.conditions),
            failure: machine_status.failure_reason.clone(),
            remediation_requested: m.annotations().contains_key(ANNOTATION_REMEDIATE_MACHINE),
            update: crate::machine::update::as_judged(m),
        };
        let verdict = plan::judge(&target, checks, now_s);
        if plan::counts_healthy(&verdict, target.node.is_some(), false) {
            judged.healthy += 1;
        }
        if let Verdict::Healthy {
            recheck_in: Some(wait),
        } = verdict
        {
            judged.recheck = Some(judged.recheck.map_or(wait, |r| r.min(wait)));
        }
        judged.verdicts.push(verdict);
    }
    judged
}

/// Since when a machine has been unhealthy: its `HealthCheckSucceeded=False`
/// transition if recorded, else now.
fn unhealthy_since(machine: &Machine, now_s: i64) -> i64 {
    machine
        .status
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, HEALTH_CHECK_SUCCEEDED))
        .filter(|c| c.status == cond::FALSE)
        .map_or(now_s, |c| c.last_transition_time.0.as_second())
}

/// Write the machine's health conditions (only when they change), and an
/// Event when it is handed to its owner or found without one.
async fn mark(
    ctx: &Context,
    machine: &Machine,
    verdict: &Verdict,
    remediate: bool,
    t: &capstan_api::Time,
) -> Result<(), Error> {
    let existing = machine
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut mine: Vec<Condition> = existing
        .iter()
        .filter(|c| c.type_ == HEALTH_CHECK_SUCCEEDED || c.type_ == OWNER_REMEDIATED)
        .cloned()
        .collect();
    let before = mine.clone();
    let generation = machine.metadata.generation;
    match verdict {
        Verdict::Healthy { .. } => {
            set_condition(
                &mut mine,
                HEALTH_CHECK_SUCCEEDED,
                cond::TRUE,
                "HealthCheckSucceeded",
                "",
                generation,
                t,
            );
            // Recovered before its owner replaced it: no longer handed
            // over (Cluster API clears the condition the same way).
            mine.retain(|c| c.type_ != OWNER_REMEDIATED);
        }
        Verdict::Unhealthy { reason, message } => set_condition(
            &mut mine,
            HEALTH_CHECK_SUCCEEDED,
            cond::FALSE,
            reason,
            message.clone(),
            generation,
            t,
        ),
    }
    if remediate {
        set_condition(
            &mut mine,
            OWNER_REMEDIATED,
            cond::FALSE,
            "WaitingForRemediation",
            "the owning MachineSet will delete and replace this machine",
            generation,
            t,
        );
    }
    if mine == before {
        return Ok(());
    }
    let api: Api<Machine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "Machine",
        "status": { "conditions": mine },
    });
    match api
        .patch_status(
            &machine.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => ctx.metrics.wrote(CONTROLLER, "apply_machine_conditions"),
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => {
            return Err(kube_err(format!(
                "cannot mark the health of machine {}",
                key_of(machine)
            ))(e));
        }
    }
    let newly_unhealthy = verdict.is_unhealthy()
        && capstan_api::condition(&before, HEALTH_CHECK_SUCCEEDED)
            .is_none_or(|c| c.status != cond::FALSE);
    if let Verdict::Unhealthy { message, .. } = verdict {
        let object = machine.object_ref(&());
        if remediate {
            record_event(
                ctx,
                CONTROLLER,
                &object,
                EventType::Warning,
                "MachineMarkedUnhealthy",
                format!("{message}; handed to its MachineSet for remediation"),
            )
            .await;
        } else if newly_unhealthy {
            let why = if has_owner(machine) {
                "remediation waits for the short-circuit or maxInFlight (see the MachineHealthCheck)"
            } else {
                "the machine has no owning MachineSet to remediate it"
            };
            record_event(
                ctx,
                CONTROLLER,
                &object,
                EventType::Warning,
                "MachineUnhealthy",
                format!("{message}; {why}"),
            )
            .await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: serde_json::Value) -> MachineHealthCheck {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "capstan.dev/v1alpha1",
            "kind": "MachineHealthCheck",
            "metadata": { "name": "c", "namespace": "default" },
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn defaults_follow_cluster_api() {
        let (checks, trigger, max) =
            resolve(&check(serde_json::json!({ "selector": {} }))).unwrap();
        assert_eq!(checks.node_startup_timeout, 600);
        assert_eq!(trigger, Trigger::default());
        assert_eq!(max, None);
    }

    #[test]
    fn a_bad_field_is_named() {
        let bad_range = check(serde_json::json!({
            "selector": {},
            "remediation": { "triggerIf": { "unhealthyInRange": "[5-1]" } },
        }));
        let e = resolve(&bad_range).unwrap_err();
        assert!(
            e.starts_with("spec.remediation.triggerIf.unhealthyInRange"),
            "{e}"
        );
        let bad_percent = check(serde_json::json!({
            "selector": {},
            "remediation": { "maxInFlight": "lots" },
        }));
        let e = resolve(&bad_percent).unwrap_err();
        assert!(e.starts_with("spec.remediation.maxInFlight"), "{e}");
        let bad_status = check(serde_json::json!({
            "selector": {},
            "checks": { "unhealthyNodeConditions": [{ "type": "Ready", "status": "Maybe", "timeoutSeconds": 1 }] },
        }));
        let e = resolve(&bad_status).unwrap_err();
        assert!(e.contains("unhealthyNodeConditions[0].status"), "{e}");
        let ok = check(serde_json::json!({
            "selector": {},
            "remediation": { "triggerIf": { "unhealthyLessThanOrEqualTo": "40%" }, "maxInFlight": 2 },
        }));
        let (_, trigger, max) = resolve(&ok).unwrap();
        assert_eq!(trigger.max_unhealthy, Some(Bound::Percent(40)));
        assert_eq!(max, Some(Bound::Count(2)));
    }
}
