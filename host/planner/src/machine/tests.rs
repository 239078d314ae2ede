use super::*;
use proptest::prelude::*;

fn alive() -> MachineView {
    MachineView {
        has_finalizer: true,
        ..Default::default()
    }
}

fn instance(state: InstanceState, node: NodeSeen) -> Instance {
    Instance {
        provider_id: "sim://i-1".into(),
        state,
        message: None,
        node,
    }
}

fn requeue(step: MachineStep) -> Requeue {
    match step {
        MachineStep::End(e) => e.requeue,
        other => panic!("not an end: {other:?}"),
    }
}

fn outcome(step: MachineStep) -> Outcome {
    match step {
        MachineStep::End(e) => e.outcome,
        other => panic!("not an end: {other:?}"),
    }
}

/// Run the steps a fresh machine takes, answering each call as `answer`
/// says, until the pass ends; returns the steps taken and the end.
fn pass(
    mut view: MachineView,
    answer: impl Fn(&MachineStep, &mut MachineView),
) -> (Vec<MachineStep>, End) {
    let mut taken = Vec::new();
    for _ in 0..20 {
        let step = next_step(&view);
        if let MachineStep::End(e) = step {
            return (taken, e);
        }
        answer(&step, &mut view);
        taken.push(step);
    }
    panic!("no end after 20 steps: {taken:?}");
}

fn healthy(step: &MachineStep, view: &mut MachineView) {
    match step {
        MachineStep::AddFinalizer => view.has_finalizer = true,
        MachineStep::Validate => view.validated = true,
        MachineStep::PrepareBootstrap => view.bootstrap = Bootstrap::Ready,
        MachineStep::FindInstance => view.adoption = Adoption::NothingFound,
        MachineStep::Create | MachineStep::Get => {
            view.provider_id = Some("sim://i-1".into());
            view.instance = Some(instance(
                InstanceState::Running,
                NodeSeen::Ready("n1".into()),
            ));
        }
        MachineStep::AdvanceInPlace => view.in_place = Some(InPlace::Done),
        MachineStep::DrainNode(_) => view.drain = Some(Drain::Complete),
        MachineStep::CheckVolumes(_) => view.volumes = Some(Volumes::Detached),
        MachineStep::ReleaseInstance { .. } => view.release = Some(Release::Done),
        MachineStep::DeleteNode => view.node_deleted = true,
        MachineStep::RemoveFinalizer => view.has_finalizer = false,
        MachineStep::End(_) => unreachable!(),
    }
}

#[test]
fn a_new_machine_gets_its_finalizer_is_validated_created_and_checked_on_its_cadence() {
    let (steps, end) = pass(MachineView::default(), healthy);
    assert_eq!(
        steps,
        [
            MachineStep::AddFinalizer,
            MachineStep::Validate,
            MachineStep::FindInstance,
            MachineStep::Create
        ]
    );
    assert_eq!(end.outcome, Outcome::Observed);
    assert_eq!(end.requeue, Requeue::InstanceCheck);
    // Next pass: validated this generation, the instance is known.
    let view = MachineView {
        validated: true,
        provider_id: Some("sim://i-1".into()),
        ..alive()
    };
    let (steps, _) = pass(view, healthy);
    assert_eq!(steps, [MachineStep::Get]);
}

#[test]
fn an_observation_the_quota_held_back_writes_nothing_unless_just_adopted() {
    let held = CallError::Retry {
        reason: "PluginQuotaExceeded".into(),
        message: "held".into(),
        after_ms: 180,
    };
    let view = MachineView {
        validated: true,
        provider_id: Some("sim://i-1".into()),
        call_error: Some((Call::Get, held.clone())),
        ..alive()
    };
    let MachineStep::End(end) = next_step(&view) else {
        panic!("ends")
    };
    assert_eq!(
        (end.outcome, end.requeue),
        (Outcome::Unchanged, Requeue::After(180))
    );
    // Adopted in this pass: its provider ID must still be written.
    let adopted = MachineView {
        adoption: Adoption::Adopted,
        ..view
    };
    let MachineStep::End(end) = next_step(&adopted) else {
        panic!("ends")
    };
    assert!(matches!(end.outcome, Outcome::Retrying { .. }), "{end:?}");
    // A creation held back says so (nothing else would).
    let creating = MachineView {
        validated: true,
        adoption: Adoption::NothingFound,
        call_error: Some((Call::Create, held)),
        ..alive()
    };
    let MachineStep::End(end) = next_step(&creating) else {
        panic!("ends")
    };
    assert!(matches!(end.outcome, Outcome::Retrying { .. }), "{end:?}");
}

#[test]
fn an_instance_found_for_the_machine_is_adopted_before_any_bootstrap_or_create() {
    let wanted = MachineView {
        bootstrap: Bootstrap::Wanted,
        ..alive()
    };
    // Found and adopted: the controller records its provider ID.
    let (steps, end) = pass(wanted.clone(), |step, view| match step {
        MachineStep::FindInstance => view.provider_id = Some("sim://i-7".into()),
        other => healthy(other, view),
    });
    assert_eq!(
        steps,
        [
            MachineStep::Validate,
            MachineStep::FindInstance,
            MachineStep::Get
        ]
    );
    assert_eq!(end.outcome, Outcome::Observed);
    // Refused: the Machine fails; no token, no data, no instance.
    let (steps, end) = pass(wanted, |step, view| match step {
        MachineStep::FindInstance => {
            view.adoption = Adoption::Refused {
                reason: "AdoptionRefused".into(),
                message: "tagged for team-b/x".into(),
            }
        }
        other => healthy(other, view),
    });
    assert_eq!(steps, [MachineStep::Validate, MachineStep::FindInstance]);
    assert!(
        matches!(&end.outcome, Outcome::Failed { reason, .. } if reason == "AdoptionRefused"),
        "{end:?}"
    );
}

#[test]
fn no_instance_is_created_before_its_bootstrap_data() {
    let wanted = MachineView {
        bootstrap: Bootstrap::Wanted,
        ..Default::default()
    };
    let (steps, _) = pass(wanted.clone(), healthy);
    assert_eq!(
        steps,
        [
            MachineStep::AddFinalizer,
            MachineStep::Validate,
            MachineStep::FindInstance,
            MachineStep::PrepareBootstrap,
            MachineStep::Create
        ]
    );
    let waiting = |step: &MachineStep, view: &mut MachineView| match step {
        MachineStep::PrepareBootstrap => {
            view.bootstrap = Bootstrap::Retry {
                reason: "WaitingForBootstrapData".into(),
                message: "no Secret".into(),
                after_ms: 5_000,
            }
        }
        other => healthy(other, view),
    };
    let (steps, end) = pass(wanted.clone(), waiting);
    assert!(!steps.contains(&MachineStep::Create), "{steps:?}");
    assert_eq!(end.requeue, Requeue::After(5_000));
    assert!(
        matches!(end.outcome, Outcome::Retrying { ref reason, .. } if reason == "WaitingForBootstrapData")
    );
    let failing = |step: &MachineStep, view: &mut MachineView| match step {
        MachineStep::PrepareBootstrap => {
            view.bootstrap = Bootstrap::Failed {
                reason: "BootstrapDataTooLarge".into(),
                message: "70000 bytes".into(),
            }
        }
        other => healthy(other, view),
    };
    let (steps, end) = pass(wanted, failing);
    assert!(!steps.contains(&MachineStep::Create), "{steps:?}");
    assert!(
        matches!(end.outcome, Outcome::Failed { ref reason, .. } if reason == "BootstrapDataTooLarge")
    );
    // An instance already created needs no bootstrap data again.
    let created = MachineView {
        bootstrap: Bootstrap::Wanted,
        validated: true,
        provider_id: Some("sim://i-1".into()),
        ..alive()
    };
    let (steps, _) = pass(created, healthy);
    assert_eq!(steps, [MachineStep::Get]);
}

#[test]
fn a_paused_machine_takes_no_step_alive_or_deleting() {
    for deleting in [false, true] {
        let view = MachineView {
            paused: true,
            deleting,
            ..Default::default()
        };
        assert_eq!(
            next_step(&view),
            end_of(Outcome::Paused, Requeue::AwaitChange)
        );
    }
}

#[test]
fn a_plugin_that_does_not_allow_the_namespace_holds_before_the_finalizer() {
    let view = MachineView {
        plugin: PluginState::NotAllowed("not in allowedNamespaces".into()),
        ..Default::default()
    };
    let (steps, end) = pass(view, healthy);
    assert!(steps.is_empty(), "no finalizer, no call: {steps:?}");
    assert_eq!(
        end.outcome,
        Outcome::Held {
            reason: "PluginNotAllowed",
            message: "not in allowedNamespaces".into()
        }
    );
    // Loading writes nothing and looks again soon; unavailable holds.
    let loading = MachineView {
        plugin: PluginState::Loading,
        ..alive()
    };
    assert_eq!(
        next_step(&loading),
        end_of(Outcome::Unchanged, Requeue::After(500))
    );
    let broken = MachineView {
        plugin: PluginState::Unavailable("failed to load".into()),
        ..alive()
    };
    assert!(matches!(
        outcome(next_step(&broken)),
        Outcome::Held {
            reason: "PluginNotReady",
            ..
        }
    ));
}

fn end_of(outcome: Outcome, requeue: Requeue) -> MachineStep {
    end(outcome, requeue)
}

#[test]
fn a_failure_waits_for_a_new_generation_and_a_changed_provider_is_not_applied() {
    let failed = MachineView {
        failed: true,
        ..alive()
    };
    assert_eq!(
        next_step(&failed),
        end_of(Outcome::Unchanged, Requeue::Resync)
    );
    let moved = MachineView {
        provider_changed: Some("spec.provider.plugin changed".into()),
        ..alive()
    };
    assert!(matches!(
        outcome(next_step(&moved)),
        Outcome::ProviderChanged(_)
    ));
}

#[test]
fn call_errors_fail_or_retry_as_their_kind_says() {
    let with = |call, error| MachineView {
        call_error: Some((call, error)),
        provider_id: Some("sim://i-1".into()),
        ..alive()
    };
    let reason = |step| match outcome(step) {
        Outcome::Failed { reason, .. } | Outcome::Retrying { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    let m = || "m".to_string();
    for (call, error, expected) in [
        (
            Call::Validate,
            CallError::InvalidConfig(m()),
            "InvalidConfiguration",
        ),
        (
            Call::Create,
            CallError::InvalidConfig(m()),
            "InvalidConfiguration",
        ),
        (Call::Create, CallError::Terminal(m()), "CreateError"),
        (Call::Get, CallError::NotFound(m()), "InstanceNotFound"),
        (Call::Get, CallError::Terminal(m()), "InstanceError"),
        (Call::Validate, CallError::NotFound(m()), "ProviderError"),
        (
            Call::Get,
            CallError::Retry {
                reason: "ProviderRetrying".into(),
                message: m(),
                after_ms: 1500,
            },
            "ProviderRetrying",
        ),
    ] {
        assert_eq!(reason(next_step(&with(call, error.clone()))), expected);
    }
    let retry = with(
        Call::Get,
        CallError::Retry {
            reason: "ProviderRetrying".into(),
            message: m(),
            after_ms: 1500,
        },
    );
    assert_eq!(requeue(next_step(&retry)), Requeue::After(1500));
    let Outcome::Failed { message, .. } =
        outcome(next_step(&with(Call::Get, CallError::NotFound(m()))))
    else {
        unreachable!()
    };
    assert!(message.contains("sim://i-1"), "{message}");
}

#[test]
fn an_instance_gone_outside_capstan_fails_unless_an_update_stopped_it() {
    let seen = |state, updating| MachineView {
        validated: true,
        provider_id: Some("sim://i-1".into()),
        instance: Some(instance(state, NodeSeen::Missing)),
        updating_in_place: updating,
        ..alive()
    };
    assert!(matches!(
        outcome(next_step(&seen(InstanceState::Terminated, true))),
        Outcome::Failed { reason, .. } if reason == "InstanceTerminated"
    ));
    assert!(matches!(
        outcome(next_step(&seen(InstanceState::Stopped, false))),
        Outcome::Failed { reason, .. } if reason == "InstanceStopped"
    ));
    assert_eq!(
        next_step(&seen(InstanceState::Stopped, true)),
        MachineStep::AdvanceInPlace
    );
    // Booting instances are polled; a running one without a Ready Node
    // is looked at every 10 s.
    assert_eq!(
        requeue(next_step(&seen(InstanceState::Pending, false))),
        Requeue::Poll
    );
    assert_eq!(
        requeue(next_step(&seen(InstanceState::Running, false))),
        Requeue::After(10_000)
    );
}

#[test]
fn in_place_steps_end_the_pass_where_the_update_is() {
    let mut view = MachineView {
        validated: true,
        provider_id: Some("sim://i-1".into()),
        instance: Some(instance(
            InstanceState::Updating,
            NodeSeen::Ready("n1".into()),
        )),
        updating_in_place: true,
        ..alive()
    };
    assert_eq!(next_step(&view), MachineStep::AdvanceInPlace);
    for (state, expected) in [
        (InPlace::Wait(2000), Requeue::After(2000)),
        (InPlace::Failed, Requeue::Resync),
        (InPlace::Done, Requeue::After(10)),
    ] {
        view.in_place = Some(state);
        assert_eq!(next_step(&view), end_of(Outcome::Observed, expected));
    }
}

fn deleting_view() -> MachineView {
    MachineView {
        deleting: true,
        has_finalizer: true,
        deletion: DeletionView {
            node: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn deletion_drains_releases_deletes_the_node_and_lets_go() {
    let (steps, end) = pass(deleting_view(), healthy);
    assert_eq!(
        steps,
        [
            MachineStep::DrainNode("n1".into()),
            MachineStep::CheckVolumes("n1".into()),
            MachineStep::ReleaseInstance {
                drain_skipped: None
            },
            MachineStep::DeleteNode,
            MachineStep::RemoveFinalizer,
        ]
    );
    assert_eq!(
        end,
        End {
            outcome: Outcome::Unchanged,
            requeue: Requeue::AwaitChange
        }
    );
    // Without the finalizer nothing more happens.
    let gone = MachineView {
        has_finalizer: false,
        ..deleting_view()
    };
    assert_eq!(requeue(next_step(&gone)), Requeue::AwaitChange);
}

#[test]
fn a_pending_drain_holds_and_the_drain_state_comes_from_status_not_a_reason() {
    let mut view = deleting_view();
    view.drain = Some(Drain::Pending {
        message: "evicting 2 pods".into(),
        blocked: true,
    });
    let step = next_step(&view);
    assert_eq!(requeue(step.clone()), Requeue::After(5_000));
    assert!(matches!(
        outcome(step),
        Outcome::Deleting {
            reason: "DrainingNode",
            drain_ended: false,
            ..
        }
    ));
    // A drain recorded as ended is not run again; attached volumes
    // hold the machine next.
    let mut view = deleting_view();
    view.deletion.drain_complete = true;
    assert_eq!(next_step(&view), MachineStep::CheckVolumes("n1".into()));
    view.volumes = Some(Volumes::Attached("1 volume attached".into()));
    let step = next_step(&view);
    assert_eq!(requeue(step.clone()), Requeue::After(2_000));
    assert!(matches!(
        outcome(step),
        Outcome::Deleting {
            reason: "WaitingForVolumeDetach",
            drain_ended: true,
            volumes_ended: false,
            ..
        }
    ));
    view.volumes = None;
    view.deletion.volumes_detached = true;
    assert_eq!(
        next_step(&view),
        MachineStep::ReleaseInstance {
            drain_skipped: None
        }
    );
}

#[test]
fn releasing_reports_what_the_provider_and_the_plugin_say() {
    let mut view = deleting_view();
    view.deletion.node = None;
    view.plugin = PluginState::Loading;
    assert_eq!(
        next_step(&view),
        end_of(Outcome::Unchanged, Requeue::After(500))
    );
    view.plugin = PluginState::Unavailable("gone".into());
    assert!(matches!(
        outcome(next_step(&view)),
        Outcome::Deleting {
            instance: Some(("PluginNotReady", _)),
            drain_ended: true,
            ..
        }
    ));
    view.plugin = PluginState::Ready;
    for (release, expected) in [
        (Release::InProgress(20), Requeue::After(100)),
        (Release::Retry(3000), Requeue::After(3000)),
        (Release::Failed("boom".into()), Requeue::After(30_000)),
    ] {
        view.release = Some(release);
        assert_eq!(requeue(next_step(&view)), expected);
    }
}

fn arbitrary_view() -> impl Strategy<Value = MachineView> {
    let plugin = prop_oneof![
        Just(PluginState::Ready),
        Just(PluginState::Loading),
        Just(PluginState::NotAllowed("no".into())),
        Just(PluginState::Unavailable("down".into())),
    ];
    let state = prop_oneof![
        Just(InstanceState::Pending),
        Just(InstanceState::Running),
        Just(InstanceState::Stopped),
        Just(InstanceState::Terminated),
        Just(InstanceState::Updating),
    ];
    (
        (any::<bool>(), any::<bool>(), plugin, any::<bool>()),
        (any::<bool>(), any::<bool>(), proptest::option::of(state)),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(
                (deleting, has_finalizer, plugin, failed),
                (validated, has_id, state),
                (updating, hooks, node, excluded),
            )| MachineView {
                deleting,
                has_finalizer,
                plugin,
                failed,
                validated,
                provider_id: has_id.then(|| "sim://i-1".into()),
                instance: state.map(|s| instance(s, NodeSeen::Missing)),
                updating_in_place: updating,
                deletion: DeletionView {
                    pre_drain_hooks: if hooks { vec!["h".into()] } else { vec![] },
                    node: node.then(|| "n1".into()),
                    exclude_draining: excluded,
                    ..Default::default()
                },
                ..Default::default()
            },
        )
}

proptest! {
    /// Whatever the view, the executor answering every step reaches an
    /// end within a bounded number of steps, never calls a provider for
    /// a machine whose plugin does not allow it (alive) and never adds
    /// a finalizer to a deleting machine.
    #[test]
    fn every_pass_ends_and_respects_the_plugin_and_the_finalizer(view in arbitrary_view()) {
        let not_allowed = matches!(view.plugin, PluginState::NotAllowed(_));
        let (steps, _) = pass(view.clone(), healthy);
        prop_assert!(steps.len() <= 6, "{steps:?}");
        for step in &steps {
            if view.deleting {
                prop_assert_ne!(step, &MachineStep::AddFinalizer);
                prop_assert!(!matches!(step, MachineStep::Create | MachineStep::Validate | MachineStep::Get));
            } else {
                let deletion_step = matches!(step, MachineStep::ReleaseInstance { .. } | MachineStep::RemoveFinalizer | MachineStep::DeleteNode | MachineStep::DrainNode(_) | MachineStep::CheckVolumes(_));
                prop_assert!(!deletion_step, "{:?}", step);
                if not_allowed {
                    prop_assert!(!matches!(step, MachineStep::Create | MachineStep::Validate | MachineStep::Get | MachineStep::AddFinalizer));
                }
            }
        }
        // A deleting machine lets go only after its instance is released
        // and its Node deleted.
        if let Some(i) = steps.iter().position(|s| *s == MachineStep::RemoveFinalizer) {
            let released = steps[..i].iter().any(|s| matches!(s, MachineStep::ReleaseInstance { .. }));
            prop_assert!(released, "{:?}", steps);
            prop_assert!(steps[..i].contains(&MachineStep::DeleteNode));
        }
    }
}
