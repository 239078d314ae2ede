use super::*;
use proptest::prelude::*;

fn ready(status: &str, since: i64) -> ObservedCondition {
    ObservedCondition {
        type_: "Ready".into(),
        status: status.into(),
        since,
    }
}

fn checks() -> Checks {
    Checks {
        node_startup_timeout: 600,
        node_rules: vec![
            Rule {
                type_: "Ready".into(),
                status: "Unknown".into(),
                timeout: 300,
            },
            Rule {
                type_: "Ready".into(),
                status: "False".into(),
                timeout: 60,
            },
        ],
        machine_rules: vec![],
    }
}

fn target(node: Option<Vec<ObservedCondition>>) -> Target {
    Target {
        name: "m".into(),
        created: 1000,
        infrastructure_ready_at: None,
        node_ref: node.as_ref().map(|_| "n".into()),
        node,
        machine_conditions: vec![],
        failure: None,
        remediation_requested: false,
        update: None,
    }
}

#[test]
fn the_node_startup_timeout_counts_from_when_the_instance_was_provisioned() {
    let mut slow_cloud = target(None);
    // 600 s after creation, but the instance came up 100 s ago.
    slow_cloud.infrastructure_ready_at = Some(1500);
    let verdict = judge(&slow_cloud, &checks(), 1600);
    assert!(
        matches!(
            verdict,
            Verdict::Healthy {
                recheck_in: Some(500)
            }
        ),
        "{verdict:?}"
    );
    assert!(matches!(
        judge(&slow_cloud, &checks(), 2100),
        Verdict::Unhealthy {
            reason: "NodeStartupTimeout",
            ..
        }
    ));
    // Without a provisioned instance it counts from creation.
    assert!(matches!(
        judge(&target(None), &checks(), 1600),
        Verdict::Unhealthy { .. }
    ));
}

#[test]
fn the_short_circuit_counts_what_is_not_healthy_as_cluster_api_does() {
    // 10 machines, unhealthyLessThanOrEqualTo 40%: 3 being remediated
    // (deleting), 2 newly unhealthy, 5 healthy.
    let healthy = Verdict::Healthy { recheck_in: None };
    let sick = Verdict::Unhealthy {
        reason: "UnhealthyNode",
        message: String::new(),
    };
    let mut targets = vec![(healthy.clone(), true, true); 3];
    targets.extend(vec![(sick.clone(), true, false); 2]);
    targets.extend(vec![(healthy.clone(), true, false); 5]);
    let expected = targets.len() as i32;
    let ok = targets
        .iter()
        .filter(|(v, node, deleting)| counts_healthy(v, *node, *deleting))
        .count() as i32;
    assert_eq!((expected, ok), (10, 5));
    let trigger = Trigger {
        max_unhealthy: Some(crate::Bound::parse("40%").unwrap()),
        range: None,
    };
    let err = remediations_allowed(expected, expected - ok, &trigger).unwrap_err();
    assert!(err.contains("5 of 10 machines are unhealthy"), "{err}");
    // Booting (a timer running) or without a Node: not healthy either.
    let booting = Verdict::Healthy {
        recheck_in: Some(30),
    };
    assert!(!counts_healthy(&booting, false, false));
    assert!(!counts_healthy(&healthy, false, false));
    assert!(counts_healthy(&healthy, true, false));
}

#[test]
fn a_failed_machine_is_unhealthy_at_once() {
    let mut t = target(Some(vec![]));
    t.failure = Some("InstanceTerminated".into());
    let verdict = judge(&t, &checks(), 1001);
    assert_eq!(
        verdict,
        Verdict::Unhealthy {
            reason: "MachineFailed",
            message: "the Machine failed (InstanceTerminated)".into()
        }
    );
}

#[test]
fn a_condition_is_unhealthy_only_after_its_timeout() {
    let t = target(Some(vec![ready("Unknown", 2000)]));
    assert_eq!(
        judge(&t, &checks(), 2100),
        Verdict::Healthy {
            recheck_in: Some(200)
        }
    );
    let v = judge(&t, &checks(), 2300);
    assert!(v.is_unhealthy());
    let Verdict::Unhealthy { reason, message } = v else {
        unreachable!()
    };
    assert_eq!(reason, "UnhealthyNode");
    assert_eq!(
        message,
        "Node n: condition Ready=Unknown for 300s (timeout 300s)"
    );
    assert_eq!(
        judge(&target(Some(vec![ready("True", 0)])), &checks(), 9999),
        Verdict::Healthy { recheck_in: None }
    );
}

#[test]
fn a_missing_node_times_out_and_a_deleted_one_is_unhealthy_at_once() {
    let t = target(None);
    assert_eq!(
        judge(&t, &checks(), 1500),
        Verdict::Healthy {
            recheck_in: Some(100)
        }
    );
    assert!(matches!(
        judge(&t, &checks(), 1600),
        Verdict::Unhealthy {
            reason: "NodeStartupTimeout",
            ..
        }
    ));
    let off = Checks {
        node_startup_timeout: 0,
        ..checks()
    };
    assert_eq!(
        judge(&t, &off, 999_999),
        Verdict::Healthy { recheck_in: None }
    );
    // Asked for by annotation: unhealthy whatever the conditions say.
    let asked = Target {
        remediation_requested: true,
        ..target(None)
    };
    assert!(matches!(
        judge(&asked, &checks(), 0),
        Verdict::Unhealthy {
            reason: "HasRemediateAnnotation",
            ..
        }
    ));
    let deleted = Target {
        node_ref: Some("gone".into()),
        ..target(None)
    };
    assert!(matches!(
        judge(&deleted, &checks(), 1001),
        Verdict::Unhealthy {
            reason: "NodeDeleted",
            ..
        }
    ));
}

#[test]
fn machine_conditions_count_too() {
    let mut t = target(Some(vec![ready("True", 0)]));
    t.machine_conditions = vec![ObservedCondition {
        type_: "Updating".into(),
        status: "False".into(),
        since: 100,
    }];
    let c = Checks {
        machine_rules: vec![Rule {
            type_: "Updating".into(),
            status: "False".into(),
            timeout: 0,
        }],
        ..checks()
    };
    assert!(matches!(
        judge(&t, &c, 100),
        Verdict::Unhealthy {
            reason: "UnhealthyMachine",
            ..
        }
    ));
}

#[test]
fn the_short_circuit_follows_cluster_api() {
    let none = Trigger::default();
    assert_eq!(remediations_allowed(4, 3, &none), Ok(1));
    let one = Trigger {
        max_unhealthy: Some(Bound::Count(1)),
        range: None,
    };
    assert_eq!(remediations_allowed(4, 1, &one), Ok(0));
    assert!(
        remediations_allowed(4, 3, &one)
            .unwrap_err()
            .contains("3 of 4 machines are unhealthy")
    );
    let forty = Trigger {
        max_unhealthy: Some(Bound::Percent(40)),
        range: None,
    };
    // 40 % of 4 rounds down to 1.
    assert!(remediations_allowed(4, 2, &forty).is_err());
    let range = Trigger {
        max_unhealthy: None,
        range: Some(parse_range("[2-3]").unwrap()),
    };
    assert!(remediations_allowed(5, 1, &range).is_err());
    assert_eq!(remediations_allowed(5, 2, &range), Ok(1));
    assert!(parse_range("[3-1]").is_err());
    assert!(parse_range("1-3").is_err());
    assert!(parse_range("[a-3]").unwrap_err().contains("\"a\""));
}

fn updating(progress_since: i64, deadline: i64) -> InPlaceUpdate {
    InPlaceUpdate {
        step: "step 1 of 1 (sim-updater)".into(),
        failed: None,
        started: progress_since,
        progress_since,
        deadline,
    }
}

#[test]
fn inching_progress_buys_at_most_ten_deadlines() {
    let mut t = target(Some(vec![ready("True", 0)]));
    // Began at 0, 1 % more every 50 s against a 60 s deadline.
    t.update = Some(InPlaceUpdate {
        started: 0,
        ..updating(550, 60)
    });
    assert_eq!(
        judge(&t, &checks(), 580),
        Verdict::Healthy {
            recheck_in: Some(20)
        }
    );
    t.update = Some(InPlaceUpdate {
        started: 0,
        ..updating(590, 60)
    });
    let Verdict::Unhealthy { reason, message } = judge(&t, &checks(), 600) else {
        panic!("ten deadlines are up");
    };
    assert_eq!(reason, "InPlaceUpdateStalled");
    assert!(message.contains("has run for 600s"), "{message}");
}

#[test]
fn an_update_is_judged_by_its_deadline_not_the_node() {
    // The Node restarts for the update: NotReady far past its 60 s.
    let mut t = target(Some(vec![ready("False", 1000)]));
    t.update = Some(updating(1000, 300));
    assert_eq!(
        judge(&t, &checks(), 1200),
        Verdict::Healthy {
            recheck_in: Some(100)
        }
    );
    // Not healthy for the short-circuit: it is out of service.
    assert!(!counts_healthy(&judge(&t, &checks(), 1200), true, false));
    let Verdict::Unhealthy { reason, message } = judge(&t, &checks(), 1300) else {
        panic!("stalled past its deadline");
    };
    assert_eq!(reason, "InPlaceUpdateStalled");
    assert!(
        message.contains("no progress for 300s") && message.contains("sim-updater"),
        "{message}"
    );
    // Progress moves the deadline.
    t.update = Some(updating(1250, 300));
    assert!(!judge(&t, &checks(), 1300).is_unhealthy());
    // Done: the Node's conditions count again.
    t.update = None;
    assert!(judge(&t, &checks(), 1300).is_unhealthy());
}

#[test]
fn a_failed_update_is_unhealthy_at_once() {
    let mut t = target(Some(vec![ready("True", 0)]));
    t.update = Some(InPlaceUpdate {
        failed: Some("UpdateRefused".into()),
        ..updating(1000, 600)
    });
    assert!(matches!(
        judge(&t, &checks(), 1000),
        Verdict::Unhealthy {
            reason: "InPlaceUpdateFailed",
            ..
        }
    ));
}

#[test]
fn a_missing_node_during_an_update_waits_for_the_updater() {
    // An updater that re-images may take the Node away for a while.
    let mut t = target(None);
    t.node_ref = Some("n".into());
    t.update = Some(updating(1000, 600));
    assert!(!judge(&t, &checks(), 1100).is_unhealthy());
    t.update = None;
    assert!(matches!(
        judge(&t, &checks(), 1100),
        Verdict::Unhealthy {
            reason: "NodeDeleted",
            ..
        }
    ));
}

proptest! {
    #[test]
    fn an_update_is_unhealthy_exactly_when_failed_or_past_its_deadline(
        since in 0i64..1000,
        deadline in 1i64..1000,
        now in 0i64..3000,
        failed in any::<bool>(),
        node_ready in any::<bool>(),
    ) {
        let status = if node_ready { "True" } else { "False" };
        let mut t = target(Some(vec![ready(status, 0)]));
        t.update = Some(InPlaceUpdate {
            failed: failed.then(|| "broken".to_string()),
            ..updating(since, deadline)
        });
        let verdict = judge(&t, &checks(), now);
        prop_assert_eq!(verdict.is_unhealthy(), failed || now - since >= deadline);
        if let Verdict::Healthy { recheck_in } = verdict {
            // Looked at again no later than the deadline.
            prop_assert_eq!(recheck_in, Some(deadline - (now - since).max(0)));
        }
    }

    #[test]
    fn a_step_is_never_healthy_past_ten_deadlines(
        started in 0i64..1000,
        progress_after in 0i64..20_000,
        deadline in 1i64..1000,
        now in 0i64..30_000,
    ) {
        let mut t = target(Some(vec![ready("True", 0)]));
        t.update = Some(InPlaceUpdate {
            started,
            ..updating(started + progress_after, deadline)
        });
        let verdict = judge(&t, &checks(), now);
        if now - started >= MAX_DEADLINES_PER_STEP * deadline {
            prop_assert!(verdict.is_unhealthy());
        }
        if let Verdict::Healthy { recheck_in: Some(wait) } = verdict {
            prop_assert!(now + wait <= started + MAX_DEADLINES_PER_STEP * deadline);
        }
    }

    #[test]
    fn remediation_never_exceeds_max_in_flight(
        names in proptest::collection::vec((0i64..100, any::<bool>()), 0..20),
        in_flight in 0usize..5,
        max in proptest::option::of(0usize..5),
        allowed in any::<bool>(),
    ) {
        let unhealthy: Vec<Unhealthy> = names
            .iter()
            .enumerate()
            .map(|(i, (since, requested))| Unhealthy {
                name: format!("m{i}"),
                since: *since,
                requested: *requested,
            })
            .collect();
        let chosen = to_remediate(&unhealthy, in_flight, max, allowed);
        if !allowed {
            prop_assert!(chosen.is_empty());
        }
        if let Some(max) = max {
            prop_assert!(in_flight + chosen.len() <= max.max(in_flight));
        }
        for name in &chosen {
            let u = unhealthy.iter().find(|u| &u.name == name).unwrap();
            prop_assert!(!u.requested);
        }
        // The longest unhealthy go first.
        let waiting = unhealthy.iter().filter(|u| !u.requested).count();
        if chosen.len() < waiting {
            let last = chosen.iter().map(|n| unhealthy.iter().find(|u| &u.name == n).unwrap().since).max();
            let skipped_min = unhealthy
                .iter()
                .filter(|u| !u.requested && !chosen.contains(&u.name))
                .map(|u| u.since)
                .min();
            if let (Some(last), Some(skipped)) = (last, skipped_min) {
                prop_assert!(last <= skipped);
            }
        }
    }

    #[test]
    fn allowed_remediations_are_never_negative(expected in 0i32..50, unhealthy in 0i32..50, max in 0i32..50, percent in any::<bool>()) {
        let bound = if percent { Bound::Percent(max * 2) } else { Bound::Count(max) };
        let trigger = Trigger { max_unhealthy: Some(bound), range: None };
        if let Ok(n) = remediations_allowed(expected, unhealthy.min(expected), &trigger) {
            prop_assert!(n >= 0);
        }
    }
}
