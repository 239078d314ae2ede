//! Automatic rollback of a MachineDeployment (`spec.rollback`): whether a
//! rollout that is going wrong returns to the previous revision now.
//! Start at [`decide`].
//!
//! Templates are named by their hash. The rule that keeps it from
//! oscillating: a rollback is recorded (from, to) in the same write that
//! restores the template, and no automatic rollback happens from or to a
//! recorded template, nor back to the template last rolled back from. So
//! between two template changes by a user there is at most one automatic
//! rollback (the property test at the end checks it over arbitrary
//! histories).

/// `spec.rollback`, resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Seconds without progress after which the rollout is rolled back.
    pub progress_deadline_seconds: Option<i64>,
    /// Remediated machines of the new revision after which it is.
    pub remediated_machines: Option<i32>,
}

/// The last automatic rollback, as recorded on the deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Template rolled back from.
    pub from: &'a str,
    /// Template rolled back to.
    pub to: &'a str,
}

/// What the deployment's pass observed of its rollout.
#[derive(Debug, Clone, Default)]
pub struct View<'a> {
    pub policy: Policy,
    /// The template now.
    pub current: &'a str,
    /// The templates of the earlier revisions the deployment keeps, newest
    /// first (the current template left out).
    pub earlier: Vec<&'a str>,
    /// The last automatic rollback.
    pub record: Option<Record<'a>>,
    /// The rollout of the current template completed at some point.
    pub completed: bool,
    /// The deployment is paused (nothing is expected to progress).
    pub paused: bool,
    /// Seconds since the rollout last made progress (started, resumed, or a
    /// new machine became available).
    pub seconds_without_progress: i64,
    /// Machines of the current template remediated during this rollout.
    pub remediated: i32,
    /// Earlier templates the deployment may no longer run (their Plugin
    /// is not allowed in its namespace now): never restored by itself.
    pub refused: Vec<&'a str>,
}

/// What set a rollback off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// No progress for this many seconds (the deadline).
    ProgressDeadlineExceeded { deadline_seconds: i64 },
    /// This many new machines were remediated (the limit).
    MachinesRemediated { remediated: i32, limit: i32 },
}

impl Trigger {
    /// The condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Trigger::ProgressDeadlineExceeded { .. } => "ProgressDeadlineExceeded",
            Trigger::MachinesRemediated { .. } => "MachinesRemediated",
        }
    }

    /// What happened, in words.
    pub fn message(&self) -> String {
        match self {
            Trigger::ProgressDeadlineExceeded { deadline_seconds } => format!(
                "no machine of the new revision became available for {deadline_seconds}s (spec.rollback.progressDeadlineSeconds)"
            ),
            Trigger::MachinesRemediated { remediated, limit } => format!(
                "{remediated} machines of the new revision were remediated (spec.rollback.remediatedMachines: {limit})"
            ),
        }
    }
}

/// Why a triggered rollback does not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// This template was rolled back from automatically once; a user put
    /// it back, and it is theirs to fix.
    RolledBackFromBefore,
    /// This template is the one an automatic rollback returned to.
    RestoredByRollback,
    /// No earlier revision that did not itself fail is kept.
    NoEarlierRevision,
    /// The revision a rollback would return to may no longer be run (its
    /// Plugin is not allowed in the namespace now).
    EarlierRevisionRefused,
}

impl Held {
    /// Why, in words, with what to do.
    pub fn message(self) -> &'static str {
        match self {
            Held::RolledBackFromBefore => {
                "this template was rolled back automatically once and is not rolled back again; fix it, or roll back by hand (capstan rollout undo)"
            }
            Held::RestoredByRollback => {
                "this template is the one an automatic rollback returned to; it is not rolled back again"
            }
            Held::NoEarlierRevision => {
                "no earlier revision to roll back to (see revisionHistoryLimit and capstan rollout history)"
            }
            Held::EarlierRevisionRefused => {
                "the revision to roll back to may no longer be run here; fix the template, or ask an admin to allow its Plugin"
            }
        }
    }
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do: no policy, no trigger, no rollout under way.
    Continue,
    /// Return to this template now.
    RollBack { to: String, trigger: Trigger },
    /// A trigger fired but the rollback is held.
    Held { trigger: Trigger, held: Held },
}

/// Whether the rollout rolls back now.
pub fn decide(view: &View<'_>) -> Decision {
    if view.completed || view.paused {
        return Decision::Continue;
    }
    let Some(trigger) = trigger(view) else {
        return Decision::Continue;
    };
    let held = match &view.record {
        Some(r) if r.from == view.current => Some(Held::RolledBackFromBefore),
        Some(r) if r.to == view.current => Some(Held::RestoredByRollback),
        _ => None,
    };
    if let Some(held) = held {
        return Decision::Held { trigger, held };
    }
    match candidate(view) {
        // Refused before acting: a template the deployment may no longer
        // run is not written back (nor is an older one chosen instead).
        Some(to) if view.refused.contains(&to) => Decision::Held {
            trigger,
            held: Held::EarlierRevisionRefused,
        },
        Some(to) => Decision::RollBack {
            to: to.to_string(),
            trigger,
        },
        None => Decision::Held {
            trigger,
            held: Held::NoEarlierRevision,
        },
    }
}

/// The template a rollback would return to: the newest earlier one that
/// was not rolled back from before.
pub fn candidate<'a>(view: &View<'a>) -> Option<&'a str> {
    let failed_before = |t: &str| view.record.as_ref().is_some_and(|r| r.from == t);
    view.earlier
        .iter()
        .copied()
        .find(|t| *t != view.current && !failed_before(t))
}

/// The first trigger that fired, if any.
fn trigger(view: &View<'_>) -> Option<Trigger> {
    let policy = view.policy;
    if let Some(limit) = policy.remediated_machines
        && view.remediated >= limit
    {
        return Some(Trigger::MachinesRemediated {
            remediated: view.remediated,
            limit,
        });
    }
    policy
        .progress_deadline_seconds
        .filter(|deadline| view.seconds_without_progress >= *deadline)
        .map(|deadline_seconds| Trigger::ProgressDeadlineExceeded { deadline_seconds })
}

/// Seconds until the progress deadline passes, if one is running: the
/// deployment looks again then.
pub fn until_deadline(view: &View<'_>) -> Option<i64> {
    if view.completed || view.paused {
        return None;
    }
    view.policy
        .progress_deadline_seconds
        .map(|d| (d - view.seconds_without_progress).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Three machines remediated, the policy's limit.
    const THREE_REMEDIATED: Trigger = Trigger::MachinesRemediated {
        remediated: 3,
        limit: 3,
    };

    fn view<'a>(current: &'a str, earlier: Vec<&'a str>) -> View<'a> {
        View {
            policy: Policy {
                progress_deadline_seconds: Some(60),
                remediated_machines: Some(3),
            },
            current,
            earlier,
            ..Default::default()
        }
    }

    #[test]
    fn a_revision_that_may_no_longer_run_is_not_restored() {
        let mut v = view("c", vec!["b", "a"]);
        v.remediated = 3;
        v.refused = vec!["b"];
        assert_eq!(
            decide(&v),
            Decision::Held {
                trigger: THREE_REMEDIATED,
                held: Held::EarlierRevisionRefused,
            }
        );
        // An older refused revision does not stop a rollback to the previous.
        v.refused = vec!["a"];
        assert!(matches!(decide(&v), Decision::RollBack { to, .. } if to == "b"));
    }

    #[test]
    fn nothing_happens_without_a_trigger_or_a_policy() {
        let mut v = view("b", vec!["a"]);
        v.seconds_without_progress = 59;
        v.remediated = 2;
        assert_eq!(decide(&v), Decision::Continue);
        v.policy = Policy::default();
        v.seconds_without_progress = 10_000;
        v.remediated = 100;
        assert_eq!(decide(&v), Decision::Continue);
    }

    #[test]
    fn either_trigger_rolls_back_to_the_newest_earlier_template() {
        let mut v = view("c", vec!["b", "a"]);
        v.seconds_without_progress = 60;
        assert_eq!(
            decide(&v),
            Decision::RollBack {
                to: "b".into(),
                trigger: Trigger::ProgressDeadlineExceeded {
                    deadline_seconds: 60
                }
            }
        );
        v.seconds_without_progress = 0;
        v.remediated = 3;
        let Decision::RollBack { trigger, .. } = decide(&v) else {
            panic!("remediations roll back")
        };
        assert_eq!(trigger.reason(), "MachinesRemediated");
        assert!(trigger.message().contains("3 machines"), "{trigger:?}");
    }

    #[test]
    fn a_completed_or_paused_rollout_is_left_alone() {
        let mut v = view("b", vec!["a"]);
        v.remediated = 10;
        v.completed = true;
        assert_eq!(decide(&v), Decision::Continue);
        v.completed = false;
        v.paused = true;
        assert_eq!(decide(&v), Decision::Continue);
        assert_eq!(until_deadline(&v), None);
    }

    #[test]
    fn recorded_templates_are_held_and_a_failed_one_is_never_a_target() {
        let record = Some(Record { from: "b", to: "a" });
        let mut v = view("a", vec!["b"]);
        v.record = record.clone();
        v.remediated = 3;
        assert_eq!(
            decide(&v),
            Decision::Held {
                trigger: THREE_REMEDIATED,
                held: Held::RestoredByRollback
            },
            "no way back to the failed template"
        );
        let mut v = view("b", vec!["a"]);
        v.record = record.clone();
        v.remediated = 3;
        let Decision::Held { held, .. } = decide(&v) else {
            panic!("held")
        };
        assert_eq!(held, Held::RolledBackFromBefore);
        // A third template fails: back to the newest that did not fail.
        let mut v = view("c", vec!["b", "a"]);
        v.record = record;
        v.remediated = 3;
        assert_eq!(
            decide(&v),
            Decision::RollBack {
                to: "a".into(),
                trigger: THREE_REMEDIATED
            }
        );
        let mut v = view("c", vec![]);
        v.remediated = 3;
        let Decision::Held { held, .. } = decide(&v) else {
            panic!("held")
        };
        assert_eq!(held, Held::NoEarlierRevision);
    }

    #[test]
    fn the_deadline_is_counted_down() {
        let mut v = view("b", vec!["a"]);
        v.seconds_without_progress = 45;
        assert_eq!(until_deadline(&v), Some(15));
        v.seconds_without_progress = 90;
        assert_eq!(until_deadline(&v), Some(0));
    }

    /// What happens to a deployment, one pass at a time.
    #[derive(Debug, Clone)]
    enum Event {
        /// A user sets the template to one of a few.
        Apply(u8),
        /// A pass in which the rollout fails (every trigger fires).
        FailingPass,
        /// A pass in which it goes fine.
        QuietPass,
        /// An admin allows or disallows one template's Plugin in the
        /// namespace.
        ToggleRefused(u8),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u8..4).prop_map(Event::Apply),
            Just(Event::FailingPass),
            Just(Event::QuietPass),
            (0u8..4).prop_map(Event::ToggleRefused),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever users do and however often rollouts fail: at most one
        /// automatic rollback between two template changes by a user,
        /// never to the template it leaves or to the last one rolled back
        /// from, only to a template the deployment had before and may
        /// still run.
        #[test]
        fn automatic_rollback_never_oscillates(events in proptest::collection::vec(event(), 1..60)) {
            let names = ["t0", "t1", "t2", "t3"];
            let mut current = "t0".to_string();
            // Revisions, oldest first, current last (as the sets are kept).
            let mut history: Vec<String> = vec![current.clone()];
            let mut record: Option<(String, String)> = None;
            let mut since_user_change = 0;
            let mut refused: Vec<&str> = vec![];
            for e in events {
                match e {
                    Event::ToggleRefused(i) => {
                        let name = names[i as usize];
                        if refused.contains(&name) {
                            refused.retain(|t| *t != name);
                        } else {
                            refused.push(name);
                        }
                    }
                    Event::Apply(i) => {
                        current = names[i as usize].to_string();
                        history.retain(|t| *t != current);
                        history.push(current.clone());
                        since_user_change = 0;
                    }
                    Event::FailingPass | Event::QuietPass => {
                        let failing = matches!(e, Event::FailingPass);
                        let earlier: Vec<&str> = history
                            .iter()
                            .rev()
                            .filter(|t| **t != current)
                            .map(String::as_str)
                            .collect();
                        let v = View {
                            policy: Policy { progress_deadline_seconds: Some(1), remediated_machines: Some(1) },
                            current: &current,
                            earlier,
                            record: record.as_ref().map(|(f, t)| Record { from: f, to: t }),
                            completed: false,
                            paused: false,
                            seconds_without_progress: if failing { 5 } else { 0 },
                            remediated: i32::from(failing),
                            refused: refused.clone(),
                        };
                        if let Decision::RollBack { to, .. } = decide(&v) {
                            prop_assert!(failing, "only a failing rollout rolls back");
                            prop_assert_ne!(&to, &current);
                            prop_assert!(
                                record.as_ref().is_none_or(|(from, _)| *from != to),
                                "{to} was the last template rolled back from"
                            );
                            prop_assert!(history.contains(&to), "{to} is an earlier revision");
                            prop_assert!(!refused.contains(&to.as_str()), "{to} may no longer run");
                            since_user_change += 1;
                            prop_assert!(since_user_change <= 1, "a second rollback without a user change");
                            record = Some((current.clone(), to.clone()));
                            history.retain(|t| *t != to);
                            history.push(to.clone());
                            current = to;
                        }
                    }
                }
            }
        }
    }
}
