//! The Machine's status, derived once per pass from what the pass
//! observed and how the planner ended it ([`settle`]): phase, conditions,
//! addresses, the Node reference, failures and deletion progress. Pure, and
//! tested here without a cluster.

use capstan_api::machine_conditions::{
    AVAILABLE, CONFIG_VALID, DELETING, HEALTH_CHECK_SUCCEEDED, INFRASTRUCTURE_READY,
    INSTANCE_PROVISIONED, NODE_HEALTHY, NODE_READY, PAUSED, READY, UP_TO_DATE,
};
use capstan_api::{
    ANNOTATION_PAUSED, Machine, MachineAddress, MachinePhase, MachineReadinessGate, MachineStatus,
    NodeRef, set_condition, status as cond,
};
use capstan_planner::machine::{
    Call, CallError, InPlace, Instance, InstanceState as PlannedState, MachineView, NodeSeen,
    Outcome,
};
use capstan_runtime::types::{AddressKind, InstanceState, MachineStatus as PluginStatus};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

/// What the machine's owners say about it.
#[derive(Debug, Clone, Default)]
pub(super) struct Owners {
    /// The owning set's `minReadySeconds`.
    pub(super) min_ready_seconds: i32,
    /// Whether its set is its deployment's current one (`Err`: why not);
    /// `None` without an owning deployment.
    pub(super) up_to_date: Option<Result<(), String>>,
}

/// The status a pass ends with, derived once from what it observed and how
/// the planner ended it (`None`: nothing to write). Pure.
#[allow(clippy::too_many_arguments)]
pub(super) fn settle(
    machine: &Machine,
    mut status: MachineStatus,
    view: &MachineView,
    observed: Option<&PluginStatus>,
    node: Option<&Node>,
    outcome: &Outcome,
    owners: &Owners,
    t: &capstan_api::Time,
) -> Option<MachineStatus> {
    if *outcome == Outcome::Unchanged {
        return None;
    }
    let generation = machine.metadata.generation;
    let set = condition_setter(generation, t);
    if *outcome == Outcome::Paused {
        let message = if machine.annotations().contains_key(ANNOTATION_PAUSED) {
            format!("the {ANNOTATION_PAUSED} annotation holds the machine")
        } else {
            format!(
                "Cluster {} is paused (spec.paused): every object of it holds still",
                machine.spec.cluster_name.as_deref().unwrap_or_default()
            )
        };
        set(&mut status, PAUSED, cond::TRUE, "Paused", message);
        return Some(status);
    }
    if capstan_api::condition(&status.conditions, PAUSED).is_some() {
        set(&mut status, PAUSED, cond::FALSE, "NotPaused", String::new());
    }
    if let Outcome::Deleting { .. } = outcome {
        settle_deleting(&mut status, outcome, generation, t);
        return Some(status);
    }

    // Alive: the status describes this generation from now on.
    status.observed_generation = Some(generation.unwrap_or(0));
    status.failure_reason = None;
    status.failure_message = None;
    // Machines that got their instance before the creating Plugin was
    // recorded: the spec's is the one (it could not change unnoticed since).
    if status.provider_id.is_some() && status.provider_plugin.is_none() {
        status.provider_plugin = Some(machine.spec.provider.plugin.clone());
    }
    settle_alive(&mut status, machine, view, observed, node, outcome, t);
    let min_ready_seconds = min_ready_seconds(machine, owners);
    cluster_api_conditions(&mut status, min_ready_seconds, generation, t);
    // An in-place update says for itself how up to date the machine is.
    if !view.updating_in_place {
        up_to_date(&mut status, owners, generation, t);
    }
    Some(status)
}

/// A live machine's status after the planner ended the pass with
/// `outcome`: `ConfigValid`, then what the outcome says (held, failed,
/// retrying, or what the provider and the Node observed).
fn settle_alive(
    status: &mut MachineStatus,
    machine: &Machine,
    view: &MachineView,
    observed: Option<&PluginStatus>,
    node: Option<&Node>,
    outcome: &Outcome,
    t: &capstan_api::Time,
) {
    let generation = machine.metadata.generation;
    let set = condition_setter(generation, t);
    match &view.call_error {
        Some((Call::Validate, CallError::InvalidConfig(message))) => set(
            status,
            CONFIG_VALID,
            cond::FALSE,
            "InvalidConfig",
            message.clone(),
        ),
        _ if view.validated => set(status, CONFIG_VALID, cond::TRUE, "Valid", String::new()),
        _ => {}
    }
    match outcome {
        Outcome::Unchanged | Outcome::Deleting { .. } | Outcome::Paused => {}
        Outcome::Held { reason, message } => {
            not_provisioned(&set, status, reason, message);
            status.phase.get_or_insert(MachinePhase::Pending);
        }
        Outcome::ProviderChanged(message) => set(
            status,
            CONFIG_VALID,
            cond::FALSE,
            "ProviderChanged",
            message.clone(),
        ),
        Outcome::Failed { reason, message } => {
            status.failure_reason = Some(reason.clone());
            status.failure_message = Some(message.clone());
            // As Cluster API v1beta2: no terminal `Failed` phase. The phase
            // says how far the machine got; `Ready=False` (which a health
            // check acts on) and `failureReason` say what failed.
            status.phase = Some(if status.provider_id.is_some() || view.instance.is_some() {
                MachinePhase::Provisioned
            } else {
                MachinePhase::Pending
            });
            set(status, READY, cond::FALSE, reason, message.clone());
            // A failure of the instance itself: it is no longer provisioned
            // (a config refused before any instance says so in ConfigValid).
            if INSTANCE_FAILURES.contains(&reason.as_str()) {
                not_provisioned(&set, status, reason, message);
            }
        }
        Outcome::Retrying { reason, message } => {
            not_provisioned(&set, status, reason, message);
            if matches!(view.call_error, Some((Call::Create, _))) {
                status.phase = Some(MachinePhase::Provisioning);
            } else {
                status.phase.get_or_insert(MachinePhase::Pending);
            }
        }
        Outcome::Observed => {
            if let (Some(observed), Some(instance)) = (observed, &view.instance) {
                // The Node's conditions first: a readiness gate may name them.
                match &instance.node {
                    // Its cluster does not answer: nothing is known of the
                    // Node (Cluster API's `ConnectionDown`).
                    NodeSeen::Unreachable(why) => {
                        let set = condition_setter(generation, t);
                        for type_ in [NODE_READY, NODE_HEALTHY] {
                            set(status, type_, cond::UNKNOWN, "ConnectionDown", why.clone());
                        }
                    }
                    _ => node_conditions(status, node, generation, t),
                }
                let gates = &machine.spec.readiness_gates;
                settle_observed(status, view, observed, instance, node, gates, generation, t);
            }
        }
    }
}

/// A deleting machine's status: `Deleting` with the step's reason, what
/// releasing the instance says, and where the drain and the wait for
/// volumes ended.
fn settle_deleting(
    status: &mut MachineStatus,
    outcome: &Outcome,
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    let Outcome::Deleting {
        reason,
        message,
        instance,
        drain_ended,
        volumes_ended,
        ..
    } = outcome
    else {
        return;
    };
    let set = condition_setter(generation, t);
    status.phase = Some(MachinePhase::Deleting);
    set(status, DELETING, cond::TRUE, reason, message.clone());
    if let Some((reason, message)) = instance {
        not_provisioned(&set, status, reason, message);
    }
    if *drain_ended {
        status
            .deletion
            .get_or_insert_with(Default::default)
            .node_drain_end_time
            .get_or_insert_with(|| t.clone());
    }
    if *volumes_ended {
        status
            .deletion
            .get_or_insert_with(Default::default)
            .node_volume_detach_end_time
            .get_or_insert_with(|| t.clone());
    }
}

/// `UpToDate` as the owning deployment says: `False` (`NotUpToDate`) while
/// the machine's set is not its current template.
fn up_to_date(
    status: &mut MachineStatus,
    owners: &Owners,
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    let set = condition_setter(generation, t);
    match &owners.up_to_date {
        Some(Ok(())) => set(status, UP_TO_DATE, cond::TRUE, "UpToDate", String::new()),
        Some(Err(why)) => set(status, UP_TO_DATE, cond::FALSE, "NotUpToDate", why.clone()),
        None => {}
    }
}

/// How long the machine stays Ready before it is Available: its own
/// `spec.minReadySeconds`, else its set's.
pub(super) fn min_ready_seconds(machine: &Machine, owners: &Owners) -> i64 {
    i64::from(machine.spec.min_ready_seconds_or(owners.min_ready_seconds))
}

/// How long until the machine counts as available, if it is Ready but not
/// yet for `min_ready_seconds` (the pass looks again then).
pub(super) fn until_available(
    status: &MachineStatus,
    min_ready_seconds: i64,
    t: &capstan_api::Time,
) -> Option<std::time::Duration> {
    let ready = capstan_api::condition(&status.conditions, READY)?;
    let waited = t.0.as_second() - ready.last_transition_time.0.as_second();
    (ready.status == cond::TRUE && waited < min_ready_seconds)
        .then(|| std::time::Duration::from_secs((min_ready_seconds - waited) as u64))
}

/// The conditions Cluster API's dashboards and tools read, from Capstan's:
/// `InfrastructureReady` mirrors `InstanceProvisioned`, and `Available` is
/// `Ready` held for `min_ready_seconds`.
fn cluster_api_conditions(
    status: &mut MachineStatus,
    min_ready_seconds: i64,
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    let set = condition_setter(generation, t);
    if let Some(c) = capstan_api::condition(&status.conditions, INSTANCE_PROVISIONED).cloned() {
        set(
            status,
            INFRASTRUCTURE_READY,
            &c.status,
            &c.reason,
            c.message,
        );
    }
    let Some(ready) = capstan_api::condition(&status.conditions, READY).cloned() else {
        return;
    };
    if ready.status != cond::TRUE {
        let message = format!("not Ready: {}", ready.message);
        set(status, AVAILABLE, cond::FALSE, "NotReady", message);
    } else if until_available(status, min_ready_seconds, t).is_some() {
        let message = format!("Ready for less than minReadySeconds ({min_ready_seconds}s)");
        set(
            status,
            AVAILABLE,
            cond::FALSE,
            "WaitingForMinReadySeconds",
            message,
        );
    } else {
        set(status, AVAILABLE, cond::TRUE, "Available", String::new());
    }
}

/// `NodeReady` (the Node's `Ready`, mirrored) and `NodeHealthy` (Ready and
/// no memory, disk or PID pressure), as Cluster API reports them.
fn node_conditions(
    status: &mut MachineStatus,
    node: Option<&Node>,
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    let set = condition_setter(generation, t);
    let Some(node) = node else {
        let message = "no Node has joined for this machine yet".to_string();
        set(
            status,
            NODE_READY,
            cond::UNKNOWN,
            "NodeDoesNotExist",
            message.clone(),
        );
        set(
            status,
            NODE_HEALTHY,
            cond::UNKNOWN,
            "NodeDoesNotExist",
            message,
        );
        return;
    };
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    let (value, reason) = match ready.map(|c| c.status.as_str()) {
        Some("True") => (cond::TRUE, "NodeReady"),
        Some("False") => (cond::FALSE, "NodeNotReady"),
        _ => (cond::UNKNOWN, "NodeReadyUnknown"),
    };
    let message = ready
        .and_then(|c| c.message.clone())
        .filter(|_| value != cond::TRUE)
        .unwrap_or_default();
    set(status, NODE_READY, value, reason, message);
    let pressures: Vec<&str> = conditions
        .iter()
        .filter(|c| {
            c.status == "True"
                && ["MemoryPressure", "DiskPressure", "PIDPressure"].contains(&c.type_.as_str())
        })
        .map(|c| c.type_.as_str())
        .collect();
    if value != cond::TRUE {
        let message = format!("Node {} is not Ready", node.name_any());
        set(status, NODE_HEALTHY, value, "NodeNotReady", message);
    } else if !pressures.is_empty() {
        let message = format!("Node {}: {}", node.name_any(), pressures.join(", "));
        set(
            status,
            NODE_HEALTHY,
            cond::FALSE,
            "NodeConditionsFailed",
            message,
        );
    } else {
        set(
            status,
            NODE_HEALTHY,
            cond::TRUE,
            "NodeHealthy",
            String::new(),
        );
    }
}

/// `InstanceProvisioned=False` with `reason` and `message`.
fn not_provisioned(
    set: &impl Fn(&mut MachineStatus, &str, &str, &str, String),
    status: &mut MachineStatus,
    reason: &str,
    message: &str,
) {
    set(
        status,
        INSTANCE_PROVISIONED,
        cond::FALSE,
        reason,
        message.to_string(),
    );
}

/// Sets one of the Machine controller's conditions, at this generation and
/// time.
fn condition_setter(
    generation: Option<i64>,
    t: &capstan_api::Time,
) -> impl Fn(&mut MachineStatus, &str, &str, &str, String) + '_ {
    move |status, kind, value, reason, message| {
        set_condition(
            &mut status.conditions,
            kind,
            value,
            reason,
            message,
            generation.or(Some(0)),
            t,
        )
    }
}

/// The status of a pass that observed its instance: addresses, version,
/// Node, `InstanceProvisioned`, `Ready` and the phase (an in-place update's
/// when one is under way).
#[allow(clippy::too_many_arguments)]
fn settle_observed(
    status: &mut MachineStatus,
    view: &MachineView,
    observed: &PluginStatus,
    instance: &Instance,
    node: Option<&Node>,
    gates: &[MachineReadinessGate],
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    let set = condition_setter(generation, t);
    status.addresses = observed
        .addresses
        .iter()
        .map(|a| MachineAddress {
            type_: address_type(&a.kind).to_string(),
            address: a.address.clone(),
        })
        .collect();
    if observed.version.is_some() {
        status.version = observed.version.clone();
    }
    if let Some(n) = node {
        status.node_ref = Some(NodeRef {
            name: n.name_any(),
            uid: n.uid(),
        });
        // What the kubelet reports about the machine (Cluster API's
        // `status.nodeInfo`). A Node no kubelet has reported on yet shows
        // one of empty strings (the API's default), which Kubernetes 1.20's
        // server-side apply turns into nulls the schema refuses: none yet.
        if let Some(info) = n
            .status
            .as_ref()
            .and_then(|s| s.node_info.clone())
            .filter(|i| !i.kubelet_version.is_empty())
        {
            status.node_info = Some(info);
        }
    }
    let running = instance.state == PlannedState::Running;
    if running {
        set(
            status,
            INSTANCE_PROVISIONED,
            cond::TRUE,
            "Running",
            String::new(),
        );
    } else {
        set(
            status,
            INSTANCE_PROVISIONED,
            cond::FALSE,
            state_reason(&observed.state),
            observed.message.clone().unwrap_or_default(),
        );
    }
    let node_ready = matches!(instance.node, NodeSeen::Ready(_));
    let (reason, message) = match (&instance.node, running) {
        (_, false) => (
            "InstanceNotRunning",
            "waiting for the instance to run".to_string(),
        ),
        (NodeSeen::Deleted(name), true) => (
            "NodeDeleted",
            format!(
                "Node {name} was deleted; waiting for a Node with spec.providerID {}",
                instance.provider_id
            ),
        ),
        (NodeSeen::Missing, true) => (
            "WaitingForNode",
            format!("no Node with spec.providerID {} yet", instance.provider_id),
        ),
        (NodeSeen::NotReady(name), true) => ("NodeNotReady", format!("Node {name} is not Ready")),
        (NodeSeen::Refused { node, why }, true) => (
            "NodeClaimRefused",
            format!(
                "Node {node} carries spec.providerID {} but is not taken as this Machine's (nothing is done to it): {why}",
                instance.provider_id
            ),
        ),
        (NodeSeen::Ready(_), true) => ("NodeReady", String::new()),
        (NodeSeen::Unreachable(why), true) => ("ConnectionDown", why.clone()),
    };
    let (ready, reason, message) = if !(node_ready && running) {
        (cond::FALSE, reason, message)
    } else if let Some((value, reason, message)) = unmet_gate(&status.conditions, gates) {
        (value, reason, message)
    } else {
        (cond::TRUE, reason, message)
    };
    set(status, READY, ready, reason, message);
    status.phase = Some(match view.in_place {
        Some(InPlace::Wait(_)) => MachinePhase::Updating,
        Some(InPlace::Failed) => MachinePhase::UpdateFailed,
        _ if node_ready && running => MachinePhase::Running,
        _ if running => MachinePhase::Provisioned,
        _ => MachinePhase::Provisioning,
    });
}

/// What keeps a machine whose instance runs and whose Node is Ready from
/// being Ready, as Cluster API decides it: a health check that found it
/// unhealthy (`False`), then the first readiness gate that does not hold
/// (`False` when its condition has the wrong status, `Unknown` when the
/// condition is `Unknown` or not reported yet). `None`: nothing does.
fn unmet_gate(
    conditions: &[capstan_api::Condition],
    gates: &[MachineReadinessGate],
) -> Option<(&'static str, &'static str, String)> {
    if let Some(c) = capstan_api::condition(conditions, HEALTH_CHECK_SUCCEEDED)
        && c.status == cond::FALSE
    {
        let message = format!(
            "{HEALTH_CHECK_SUCCEEDED} is False ({}): {}",
            c.reason, c.message
        );
        return Some((cond::FALSE, "HealthCheckFailed", message));
    }
    gates.iter().find_map(|gate| {
        let wanted = gate.wanted_status();
        let kind = &gate.condition_type;
        match capstan_api::condition(conditions, kind) {
            None => Some((
                cond::UNKNOWN,
                "ReadinessGateUnknown",
                format!("readiness gate {kind}: the condition is not reported yet"),
            )),
            Some(c) if c.status == wanted => None,
            Some(c) if c.status == cond::UNKNOWN => Some((
                cond::UNKNOWN,
                "ReadinessGateUnknown",
                format!(
                    "readiness gate {kind} is Unknown ({}): {}",
                    c.reason, c.message
                ),
            )),
            Some(c) => Some((
                cond::FALSE,
                "ReadinessGateNotMet",
                format!(
                    "readiness gate {kind} is {}, not {wanted} ({}): {}",
                    c.status, c.reason, c.message
                ),
            )),
        }
    })
}

fn address_type(kind: &AddressKind) -> &'static str {
    match kind {
        AddressKind::InternalIp => "InternalIP",
        AddressKind::ExternalIp => "ExternalIP",
        AddressKind::InternalDns => "InternalDNS",
        AddressKind::ExternalDns => "ExternalDNS",
        AddressKind::Hostname => "Hostname",
    }
}

/// Failure reasons that mean the instance is gone or never came up.
const INSTANCE_FAILURES: [&str; 5] = [
    "InstanceTerminated",
    "InstanceStopped",
    "InstanceNotFound",
    "InstanceError",
    "CreateError",
];

fn state_reason(state: &InstanceState) -> &'static str {
    match state {
        InstanceState::Pending => "InstancePending",
        InstanceState::Running => "Running",
        InstanceState::Updating => "InstanceUpdating",
        InstanceState::Stopping => "InstanceStopping",
        InstanceState::Stopped => "InstanceStopped",
        InstanceState::Terminated => "InstanceTerminated",
        InstanceState::Unknown => "InstanceStateUnknown",
    }
}

#[cfg(test)]
mod tests;
