use super::*;
use capstan_kit::now;
use capstan_runtime::types::{InstanceState as Wit, MachineAddress as WitAddress};

fn machine(generation: i64) -> Machine {
    let mut m = Machine::new("m1", Default::default());
    m.spec.provider.plugin = "sim".into();
    m.metadata.generation = Some(generation);
    m
}

fn running(node: NodeSeen) -> (PluginStatus, Instance) {
    let observed = PluginStatus {
        provider_id: "sim://i-1".into(),
        state: Wit::Running,
        addresses: vec![WitAddress {
            kind: AddressKind::InternalIp,
            address: "10.0.0.1".into(),
        }],
        failure_domain: None,
        version: Some("v1.30.0".into()),
        message: None,
    };
    let instance = Instance {
        provider_id: "sim://i-1".into(),
        state: PlannedState::Running,
        message: None,
        node,
    };
    (observed, instance)
}

fn condition<'s>(s: &'s MachineStatus, kind: &str) -> (&'s str, &'s str) {
    let c = capstan_api::condition(&s.conditions, kind).expect(kind);
    (c.status.as_str(), c.reason.as_str())
}

/// A validated machine's running instance, its Node seen as `node`.
fn validated_and_running(node: NodeSeen) -> (PluginStatus, MachineView) {
    let (observed, instance) = running(node);
    let view = MachineView {
        validated: true,
        instance: Some(instance),
        ..Default::default()
    };
    (observed, view)
}

/// A Ready-Node machine's status after one observed pass from `before`.
fn observed_pass(
    m: &Machine,
    before: MachineStatus,
    owners: &Owners,
    t: &capstan_api::Time,
) -> MachineStatus {
    let (observed, view) = validated_and_running(NodeSeen::Ready("n1".into()));
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "n1" },
        "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
    }))
    .unwrap();
    settle(
        m,
        before,
        &view,
        Some(&observed),
        Some(&node),
        &Outcome::Observed,
        owners,
        t,
    )
    .unwrap()
}

/// One observed pass from `before`, with nothing from the machine's owners.
fn observed_alone(
    generation: i64,
    before: MachineStatus,
    view: &MachineView,
    observed: &PluginStatus,
    node: Option<&Node>,
    t: &capstan_api::Time,
) -> MachineStatus {
    let owners = Owners::default();
    settle(
        &machine(generation),
        before,
        view,
        Some(observed),
        node,
        &Outcome::Observed,
        &owners,
        t,
    )
    .unwrap()
}

/// A pass that observed no instance and no Node, ending in `outcome`.
fn unobserved(
    m: &Machine,
    before: MachineStatus,
    view: &MachineView,
    outcome: &Outcome,
) -> MachineStatus {
    settle(
        m,
        before,
        view,
        None,
        None,
        outcome,
        &Owners::default(),
        &now(),
    )
    .unwrap()
}

fn with_condition(
    mut s: MachineStatus,
    kind: &str,
    value: &str,
    t: &capstan_api::Time,
) -> MachineStatus {
    set_condition(
        &mut s.conditions,
        kind,
        value,
        "Reported",
        "by another controller",
        None,
        t,
    );
    s
}

#[test]
fn readiness_gates_and_a_failed_health_check_hold_ready_as_in_cluster_api() {
    use capstan_api::{ConditionPolarity, MachineReadinessGate};
    let t = now();
    let owners = Owners::default();
    let mut m = machine(1);
    m.spec.readiness_gates = vec![
        MachineReadinessGate {
            condition_type: "example.com/DriversInstalled".into(),
            polarity: None,
        },
        MachineReadinessGate {
            condition_type: "example.com/Degraded".into(),
            polarity: Some(ConditionPolarity::Negative),
        },
    ];
    // Not reported yet: Unknown, and the message names the gate.
    let s = observed_pass(&m, MachineStatus::default(), &owners, &t);
    assert_eq!(condition(&s, READY), ("Unknown", "ReadinessGateUnknown"));
    let ready = capstan_api::condition(&s.conditions, READY).unwrap();
    assert!(
        ready.message.contains("example.com/DriversInstalled"),
        "{}",
        ready.message
    );
    assert_eq!(condition(&s, AVAILABLE), ("False", "NotReady"));
    assert_eq!(s.phase, Some(MachinePhase::Running));
    // The positive gate holds; the negative one is True: False.
    let s = with_condition(s, "example.com/DriversInstalled", "True", &t);
    let s = with_condition(s, "example.com/Degraded", "True", &t);
    let s = observed_pass(&m, s, &owners, &t);
    assert_eq!(condition(&s, READY), ("False", "ReadinessGateNotMet"));
    // Both hold: Ready, and the other controllers' conditions are kept.
    let s = with_condition(s, "example.com/Degraded", "False", &t);
    let s = observed_pass(&m, s, &owners, &t);
    assert_eq!(condition(&s, READY), ("True", "NodeReady"));
    assert_eq!(condition(&s, AVAILABLE), ("True", "Available"));
    assert_eq!(condition(&s, "example.com/Degraded"), ("False", "Reported"));
    // A health check that found the machine unhealthy: not Ready.
    let s = with_condition(s, HEALTH_CHECK_SUCCEEDED, "False", &t);
    let s = observed_pass(&m, s, &owners, &t);
    assert_eq!(condition(&s, READY), ("False", "HealthCheckFailed"));
    let s = with_condition(s, HEALTH_CHECK_SUCCEEDED, "True", &t);
    let s = observed_pass(&m, s, &owners, &t);
    assert_eq!(condition(&s, READY), ("True", "NodeReady"));
    // Without gates the other conditions do not matter.
    let s = observed_pass(
        &machine(1),
        with_condition(s, "example.com/Degraded", "True", &t),
        &owners,
        &t,
    );
    assert_eq!(condition(&s, READY), ("True", "NodeReady"));
}

#[test]
fn the_machines_own_min_ready_seconds_wins_over_its_sets() {
    let t = now();
    let set_says = Owners {
        min_ready_seconds: 600,
        up_to_date: None,
    };
    let mut m = machine(1);
    m.spec.min_ready_seconds = Some(5);
    let s = observed_pass(&m, MachineStatus::default(), &set_says, &t);
    assert_eq!(
        condition(&s, AVAILABLE),
        ("False", "WaitingForMinReadySeconds")
    );
    assert_eq!(min_ready_seconds(&m, &set_says), 5);
    let later = capstan_api::Time(t.0 + k8s_openapi::jiff::SignedDuration::from_secs(6));
    let s = observed_pass(&m, s, &set_says, &later);
    assert_eq!(condition(&s, AVAILABLE), ("True", "Available"));
    // 0 on the machine: available at once, whatever the set says.
    m.spec.min_ready_seconds = Some(0);
    let s = observed_pass(&m, MachineStatus::default(), &set_says, &t);
    assert_eq!(condition(&s, AVAILABLE), ("True", "Available"));
    // Unset: the set's.
    assert_eq!(min_ready_seconds(&machine(1), &set_says), 600);
}

#[test]
fn cluster_api_conditions_follow_the_node_and_min_ready_seconds() {
    let (observed, view) = validated_and_running(NodeSeen::Ready("n1".into()));
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "n1" },
        "status": { "conditions": [
            { "type": "Ready", "status": "True" },
            { "type": "DiskPressure", "status": "True" },
        ] },
    }))
    .unwrap();
    let owners = Owners {
        min_ready_seconds: 30,
        up_to_date: None,
    };
    let pass = |m: &Machine, before: MachineStatus, t: &capstan_api::Time| {
        let outcome = Outcome::Observed;
        settle(
            m,
            before,
            &view,
            Some(&observed),
            Some(&node),
            &outcome,
            &owners,
            t,
        )
        .unwrap()
    };
    let t = now();
    let s = pass(&machine(1), MachineStatus::default(), &t);
    assert_eq!(condition(&s, INFRASTRUCTURE_READY), ("True", "Running"));
    assert_eq!(condition(&s, NODE_READY), ("True", "NodeReady"));
    assert_eq!(
        condition(&s, NODE_HEALTHY),
        ("False", "NodeConditionsFailed")
    );
    assert_eq!(
        condition(&s, AVAILABLE),
        ("False", "WaitingForMinReadySeconds")
    );
    assert_eq!(
        until_available(&s, 30, &t),
        Some(std::time::Duration::from_secs(30))
    );
    let later = capstan_api::Time(t.0 + k8s_openapi::jiff::SignedDuration::from_secs(31));
    let s = pass(&machine(1), s, &later);
    assert_eq!(condition(&s, AVAILABLE), ("True", "Available"));
    // No Node yet: the node conditions are Unknown.
    let (observed, instance) = running(NodeSeen::Missing);
    let view = MachineView {
        instance: Some(instance),
        ..view
    };
    let s = observed_alone(1, Default::default(), &view, &observed, None, &t);
    assert_eq!(condition(&s, NODE_READY), ("Unknown", "NodeDoesNotExist"));
    assert_eq!(condition(&s, AVAILABLE), ("False", "NotReady"));
}

#[test]
fn up_to_date_follows_the_owning_set_unless_an_in_place_update_speaks() {
    let (observed, view) = validated_and_running(NodeSeen::Ready("n1".into()));
    let stale = Owners {
        min_ready_seconds: 0,
        up_to_date: Some(Err("MachineSet web-1 is not the current template".into())),
    };
    let pass = |view: &MachineView, owners: &Owners| {
        settle(
            &machine(1),
            MachineStatus::default(),
            view,
            Some(&observed),
            None,
            &Outcome::Observed,
            owners,
            &now(),
        )
        .unwrap()
    };
    let s = pass(&view, &stale);
    assert_eq!(condition(&s, UP_TO_DATE), ("False", "NotUpToDate"));
    let current = Owners {
        up_to_date: Some(Ok(())),
        ..stale.clone()
    };
    assert_eq!(
        condition(&pass(&view, &current), UP_TO_DATE),
        ("True", "UpToDate")
    );
    // Without an owning deployment, or during an in-place update (which
    // writes the condition itself), nothing is said here.
    assert!(
        capstan_api::condition(&pass(&view, &Owners::default()).conditions, UP_TO_DATE).is_none()
    );
    let updating = MachineView {
        updating_in_place: true,
        ..view.clone()
    };
    assert!(capstan_api::condition(&pass(&updating, &stale).conditions, UP_TO_DATE).is_none());
}

#[test]
fn an_observed_running_instance_with_a_ready_node_is_running_and_ready() {
    let (observed, view) = validated_and_running(NodeSeen::Ready("n1".into()));
    let t = now();
    let s = observed_alone(3, Default::default(), &view, &observed, None, &t);
    assert_eq!(s.phase, Some(MachinePhase::Running));
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(condition(&s, READY), ("True", "NodeReady"));
    assert_eq!(condition(&s, INSTANCE_PROVISIONED), ("True", "Running"));
    assert_eq!(condition(&s, CONFIG_VALID), ("True", "Valid"));
    assert_eq!(s.addresses[0].type_, "InternalIP");
    assert_eq!(s.version.as_deref(), Some("v1.30.0"));
    // The same pass again changes nothing: no second write.
    let again = observed_alone(3, s.clone(), &view, &observed, None, &t);
    assert_eq!(again, s);
}

#[test]
fn a_deleted_node_stays_referenced_and_an_update_shows_in_the_phase() {
    let (observed, mut view) = validated_and_running(NodeSeen::Deleted("n1".into()));
    let s = observed_alone(1, Default::default(), &view, &observed, None, &now());
    assert_eq!(condition(&s, READY), ("False", "NodeDeleted"));
    assert_eq!(s.phase, Some(MachinePhase::Provisioned));
    view.in_place = Some(InPlace::Wait(1000));
    let s = observed_alone(1, s, &view, &observed, None, &now());
    assert_eq!(s.phase, Some(MachinePhase::Updating));
}

#[test]
fn an_instance_failed_outside_capstan_is_no_longer_provisioned() {
    let (observed, view) = validated_and_running(NodeSeen::Ready("n1".into()));
    let owners = Owners::default();
    let settled = |s, outcome: &Outcome| {
        settle(
            &machine(1),
            s,
            &view,
            Some(&observed),
            None,
            outcome,
            &owners,
            &now(),
        )
        .unwrap()
    };
    let s = settled(MachineStatus::default(), &Outcome::Observed);
    assert_eq!(condition(&s, INSTANCE_PROVISIONED), ("True", "Running"));
    let failed = Outcome::Failed {
        reason: "InstanceTerminated".into(),
        message: "the instance sim://i-1 was terminated outside Capstan".into(),
    };
    let s = settled(s, &failed);
    assert_eq!(s.phase, Some(MachinePhase::Provisioned));
    assert_eq!(
        condition(&s, INSTANCE_PROVISIONED),
        ("False", "InstanceTerminated")
    );
    assert_eq!(condition(&s, READY), ("False", "InstanceTerminated"));
}

#[test]
fn failures_are_recorded_and_cleared_by_the_next_generation() {
    let view = MachineView {
        call_error: Some((Call::Validate, CallError::InvalidConfig("size".into()))),
        ..Default::default()
    };
    let failed = Outcome::Failed {
        reason: "InvalidConfiguration".into(),
        message: "spec.provider.config: size".into(),
    };
    let s = unobserved(&machine(1), MachineStatus::default(), &view, &failed);
    assert_eq!(s.failure_reason.as_deref(), Some("InvalidConfiguration"));
    assert_eq!(s.phase, Some(MachinePhase::Pending));
    assert_eq!(condition(&s, CONFIG_VALID), ("False", "InvalidConfig"));
    // Generation 2 validates: the failure is gone.
    let view = MachineView {
        validated: true,
        ..Default::default()
    };
    let retrying = Outcome::Retrying {
        reason: "ProviderRetrying".into(),
        message: "busy".into(),
    };
    let s = unobserved(&machine(2), s, &view, &retrying);
    assert_eq!(
        (s.failure_reason.as_deref(), s.observed_generation),
        (None, Some(2))
    );
    assert_eq!(condition(&s, CONFIG_VALID), ("True", "Valid"));
    assert_eq!(
        condition(&s, INSTANCE_PROVISIONED),
        ("False", "ProviderRetrying")
    );
}

#[test]
fn deletion_records_where_the_drain_is_and_nothing_is_written_for_an_unchanged_pass() {
    let holding = Outcome::Deleting {
        reason: "DrainingNode",
        message: "evicting 1 pod".into(),
        instance: None,
        drain_ended: false,
        volumes_ended: false,
        drain_skipped: None,
    };
    let view = MachineView {
        deleting: true,
        ..Default::default()
    };
    let s = unobserved(&machine(1), MachineStatus::default(), &view, &holding);
    assert_eq!(s.phase, Some(MachinePhase::Deleting));
    assert_eq!(condition(&s, DELETING), ("True", "DrainingNode"));
    assert!(s.deletion.is_none_or(|d| d.node_drain_end_time.is_none()));
    let past = Outcome::Deleting {
        reason: "WaitingForInfrastructureDeletion",
        message: "deleting the instance".into(),
        instance: Some(("Deleting", "the provider is deleting the instance".into())),
        drain_ended: true,
        volumes_ended: true,
        drain_skipped: None,
    };
    let s = unobserved(&machine(1), MachineStatus::default(), &view, &past);
    let recorded = s.deletion.unwrap();
    assert!(recorded.node_drain_end_time.is_some());
    assert!(recorded.node_volume_detach_end_time.is_some());
    assert_eq!(condition_of_none(&view), None);
}

fn condition_of_none(view: &MachineView) -> Option<MachineStatus> {
    settle(
        &machine(1),
        MachineStatus::default(),
        view,
        None,
        None,
        &Outcome::Unchanged,
        &Owners::default(),
        &now(),
    )
}
