//! A plugin canary's decisions: whether a window of calls passes
//! ([`judge`]), what the canary does next ([`advance`]), and which Machines
//! it serves ([`assign`]).
//!
//! Start with [`judge`]: it compares the canary's calls in a window with the
//! stable revision's in the same window, so a cloud-wide fault (both as
//! bad) is inconclusive instead of a rollback. [`advance`] walks the steps:
//! a rollback is absorbing, a pass moves one step, too many inconclusive
//! windows pause for a human, and a step held past the progress deadline
//! ([`past_deadline`]) rolls back. [`assign`] keeps every Machine the canary
//! ever served and adds the lowest-ranked others up to ⌈weight × n / 100⌉,
//! so at most that many Machines ever meet the canary at a step.

/// Calls one revision made in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Calls made.
    pub calls: u64,
    /// Calls that failed (the host's quota aside).
    pub errors: u64,
    /// `create` calls that failed.
    pub failed_creates: u64,
    /// Objects (Machines, Addons) it served at the window's end.
    pub objects: u64,
    /// Objects it served that were unhealthy in the window (a Machine
    /// failing its health check, an Addon not healthy).
    pub unhealthy: u64,
}

impl Tally {
    fn error_percent(&self) -> f64 {
        percent(self.errors, self.calls)
    }

    fn failed_create_percent(&self) -> f64 {
        percent(self.failed_creates, self.calls)
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// How windows are judged (`Plugin.spec.rollout.analysis`, defaults filled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Analysis {
    /// Fewer canary calls than this is inconclusive.
    pub min_samples: u64,
    /// The canary's error percent a window may reach.
    pub max_error_percent: u32,
    /// Points the canary's error percent may exceed the stable one's.
    pub max_error_percent_over_stable: u32,
    /// Failed creates a window may hold.
    pub max_failed_creates: u64,
    /// Objects served by the canary that may be unhealthy in a window.
    pub max_unhealthy: u64,
    /// Failed windows tolerated before a rollback.
    pub failure_limit: u32,
    /// Inconclusive windows in a row tolerated before a pause.
    pub inconclusive_limit: u32,
    /// Seconds a canary may hold one step before it is rolled back
    /// (`None`: no deadline).
    pub progress_deadline: Option<u64>,
}

impl Default for Analysis {
    fn default() -> Self {
        Analysis {
            min_samples: 5,
            max_error_percent: 10,
            max_error_percent_over_stable: 5,
            max_failed_creates: 3,
            max_unhealthy: 0,
            failure_limit: 0,
            inconclusive_limit: 3,
            progress_deadline: None,
        }
    }
}

/// A window's verdict and why (the reason names the numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The canary did as well as allowed.
    Pass(String),
    /// The canary did worse than allowed.
    Fail(String),
    /// Nothing can be said: too few calls, or the stable revision was as
    /// bad (the cloud, not the canary).
    Inconclusive(String),
}

impl Verdict {
    /// `Pass`, `Fail` or `Inconclusive`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Pass(_) => "Pass",
            Verdict::Fail(_) => "Fail",
            Verdict::Inconclusive(_) => "Inconclusive",
        }
    }

    /// Why.
    pub fn reason(&self) -> &str {
        match self {
            Verdict::Pass(r) | Verdict::Fail(r) | Verdict::Inconclusive(r) => r,
        }
    }
}

/// Judge a window: the canary's calls against the limits and against the
/// stable revision's calls in the same window. In order: failed creates
/// over their maximum fail whatever the sample size (unless the stable
/// revision failed creates as often, with enough calls to say so: then the
/// window is at best inconclusive); too few
/// canary calls are inconclusive; an error percent over the maximum fails
/// unless the stable one is within the allowed excess of it (a cloud-wide
/// fault: inconclusive); an excess over the stable percent beyond the
/// allowed one fails.
pub fn judge(canary: Tally, stable: Tally, analysis: &Analysis) -> Verdict {
    let stable_known = stable.calls >= analysis.min_samples.max(1);
    let (cp, sp) = (canary.error_percent(), stable.error_percent());
    let over = f64::from(analysis.max_error_percent_over_stable);
    let shown = |t: &Tally| {
        format!(
            "{} of {} calls failed ({:.1}%)",
            t.errors,
            t.calls,
            t.error_percent()
        )
    };
    let stable_shown = if stable_known {
        format!("stable: {}", shown(&stable))
    } else {
        format!(
            "stable: {} calls, too few to compare ({} needed)",
            stable.calls, analysis.min_samples
        )
    };
    let creates_over = canary.failed_creates > analysis.max_failed_creates;
    // Excused when the stable revision failed creates as often: the other
    // checks still judge the window, and a pass becomes inconclusive.
    let creates_excused = creates_over
        && stable_known
        && stable.failed_create_percent() >= canary.failed_create_percent();
    let unhealthy_over = canary.unhealthy > analysis.max_unhealthy;
    // Excused when the stable revision's Machines failed as often.
    let unhealthy_excused = unhealthy_over
        && stable.objects > 0
        && u128::from(stable.unhealthy) * u128::from(canary.objects)
            >= u128::from(canary.unhealthy) * u128::from(stable.objects);
    if unhealthy_over && !unhealthy_excused {
        return Verdict::Fail(format!(
            "{} objects it served were unhealthy, over the maximum {} (it serves {} now; stable: {} unhealthy, {} served)",
            canary.unhealthy,
            analysis.max_unhealthy,
            canary.objects,
            stable.unhealthy,
            stable.objects
        ));
    }
    if creates_over && !creates_excused {
        return Verdict::Fail(format!(
            "{} failed creates, over the maximum {} ({stable_shown})",
            canary.failed_creates, analysis.max_failed_creates
        ));
    }
    if canary.calls < analysis.min_samples {
        return Verdict::Inconclusive(format!(
            "{} canary calls, fewer than minSamples {}",
            canary.calls, analysis.min_samples
        ));
    }
    if cp > f64::from(analysis.max_error_percent) {
        if stable_known && sp + over >= cp {
            return Verdict::Inconclusive(format!(
                "canary: {}, over the maximum {}%, but {stable_shown}: a cloud-wide fault, not the canary",
                shown(&canary),
                analysis.max_error_percent
            ));
        }
        return Verdict::Fail(format!(
            "canary: {}, over the maximum {}% ({stable_shown})",
            shown(&canary),
            analysis.max_error_percent
        ));
    }
    if stable_known && cp > sp + over {
        return Verdict::Fail(format!(
            "canary: {}, more than {} points over the {stable_shown}",
            shown(&canary),
            analysis.max_error_percent_over_stable
        ));
    }
    if unhealthy_excused {
        return Verdict::Inconclusive(format!(
            "{} objects it served were unhealthy (it serves {}), but {} of the stable revision's {} were as well: the cloud, not the canary",
            canary.unhealthy, canary.objects, stable.unhealthy, stable.objects
        ));
    }
    if creates_excused {
        return Verdict::Inconclusive(format!(
            "{} failed creates, over the maximum {}, but the stable revision failed {} creates in {} calls, as often: the cloud, not the canary",
            canary.failed_creates, analysis.max_failed_creates, stable.failed_creates, stable.calls
        ));
    }
    Verdict::Pass(format!("canary: {}; {stable_shown}", shown(&canary)))
}

/// Where a canary stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serving its step's share; windows are judged.
    Progressing,
    /// Waiting for a human; a failed window still rolls it back.
    Paused,
    /// Serving everything.
    Promoted,
    /// Serving nothing, for good.
    RolledBack,
}

/// A canary's progress through its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Where it stands.
    pub phase: Phase,
    /// The step being held (0-based).
    pub step: usize,
    /// Failed windows so far.
    pub failures: u32,
    /// Inconclusive windows in a row.
    pub inconclusive: u32,
}

impl Progress {
    /// A canary at its first step.
    pub fn start() -> Progress {
        Progress {
            phase: Phase::Progressing,
            step: 0,
            failures: 0,
            inconclusive: 0,
        }
    }

    /// Whether nothing can change it any more.
    pub fn is_final(&self) -> bool {
        matches!(self.phase, Phase::Promoted | Phase::RolledBack)
    }

    /// The percent of Machines it serves, given the steps' weights.
    pub fn weight(&self, weights: &[u32]) -> u32 {
        match self.phase {
            Phase::RolledBack => 0,
            Phase::Promoted => 100,
            _ => weights
                .get(self.step)
                .or(weights.last())
                .copied()
                .unwrap_or(0),
        }
    }
}

/// What a human asked for (`capstan plugin promote|abort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Serve everything now.
    Promote,
    /// Serve nothing, for good.
    Abort,
}

/// The progress after a judged window, given how many steps there are.
/// Final phases never change; a failure past `failure_limit` rolls back;
/// inconclusive windows past `inconclusive_limit` in a row pause; a pass
/// moves one step (promoting after the last) unless paused, which only a
/// human ends.
pub fn advance(progress: Progress, verdict: &Verdict, steps: usize, a: &Analysis) -> Progress {
    if progress.is_final() {
        return progress;
    }
    let mut next = progress;
    match verdict {
        Verdict::Fail(_) => {
            next.failures += 1;
            next.inconclusive = 0;
            if next.failures > a.failure_limit {
                next.phase = Phase::RolledBack;
            }
        }
        Verdict::Inconclusive(_) => {
            next.inconclusive += 1;
            if next.inconclusive > a.inconclusive_limit {
                next.phase = Phase::Paused;
            }
        }
        Verdict::Pass(_) if progress.phase == Phase::Paused => {}
        Verdict::Pass(_) => {
            next.inconclusive = 0;
            if next.step + 1 >= steps {
                next.phase = Phase::Promoted;
            } else {
                next.step += 1;
            }
        }
    }
    next
}

/// The progress of a canary that has held its step for `held` seconds,
/// with why, when that is past the progress deadline (`None`: it is not,
/// or there is none): rolled back, whether it was progressing or paused.
/// A deadline never promotes and never moves a step.
pub fn past_deadline(progress: Progress, held: u64, a: &Analysis) -> Option<(Progress, String)> {
    let deadline = a.progress_deadline?;
    if progress.is_final() || held < deadline {
        return None;
    }
    let paused = if progress.phase == Phase::Paused {
        ", paused"
    } else {
        ""
    };
    let why = format!(
        "step {} made no progress for {held}s, past progressDeadlineSeconds {deadline} ({} inconclusive windows in a row{paused})",
        progress.step + 1,
        progress.inconclusive
    );
    Some((
        Progress {
            phase: Phase::RolledBack,
            ..progress
        },
        why,
    ))
}

/// The progress after a human's action (none on a final phase).
pub fn act(progress: Progress, action: Action) -> Progress {
    if progress.is_final() {
        return progress;
    }
    Progress {
        phase: match action {
            Action::Promote => Phase::Promoted,
            Action::Abort => Phase::RolledBack,
        },
        ..progress
    }
}

/// A Machine's rank for a canary: a stable hash (FNV-1a, 64 bits) of the
/// canary's digest and the Machine's uid. The lowest ranks get the canary
/// first; another digest ranks the fleet anew.
pub fn rank(digest: &str, uid: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in digest.bytes().chain([0]).chain(uid.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// How many of `machines` a weight lets the canary serve: ⌈weight × n / 100⌉.
pub fn share(weight: u32, machines: usize) -> usize {
    (u64::from(weight.min(100)) * machines as u64).div_ceil(100) as usize
}

/// The Machines (uids) the canary serves: every one it already serves
/// (`sticky`, whatever the weight: a Machine keeps its revision while the
/// canary lives), then the lowest-ranked other candidates up to
/// [`share`]`(weight, candidates)`.
pub fn assign(digest: &str, candidates: &[(String, bool)], weight: u32) -> Vec<String> {
    let mut chosen: Vec<String> = candidates
        .iter()
        .filter(|(_, sticky)| *sticky)
        .map(|(uid, _)| uid.clone())
        .collect();
    let room = share(weight, candidates.len()).saturating_sub(chosen.len());
    let mut others: Vec<&String> = candidates
        .iter()
        .filter(|(_, sticky)| !*sticky)
        .map(|(uid, _)| uid)
        .collect();
    others.sort_by_key(|uid| (rank(digest, uid), *uid));
    chosen.extend(others.into_iter().take(room).cloned());
    chosen.sort();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tally(calls: u64, errors: u64) -> Tally {
        Tally {
            calls,
            errors,
            ..Tally::default()
        }
    }

    #[test]
    fn a_failing_canary_fails_with_its_numbers() {
        let a = Analysis::default();
        let verdict = judge(tally(20, 8), tally(40, 0), &a);
        assert_eq!(
            verdict,
            Verdict::Fail(
                "canary: 8 of 20 calls failed (40.0%), over the maximum 10% (stable: 0 of 40 calls failed (0.0%))".into()
            )
        );
        // Excess over stable alone fails too.
        assert_eq!(judge(tally(100, 8), tally(100, 1), &a).name(), "Fail");
        assert_eq!(judge(tally(100, 8), tally(100, 4), &a).name(), "Pass");
    }

    #[test]
    fn too_few_calls_and_a_cloud_wide_fault_are_inconclusive() {
        let a = Analysis::default();
        assert!(
            judge(tally(3, 3), tally(40, 0), &a)
                .reason()
                .contains("3 canary calls, fewer than minSamples 5")
        );
        let outage = judge(tally(20, 20), tally(40, 40), &a);
        assert_eq!(outage.name(), "Inconclusive", "{outage:?}");
        assert!(outage.reason().contains("cloud-wide"));
        // With too few stable calls, nothing says it is the cloud.
        assert_eq!(judge(tally(20, 20), tally(2, 2), &a).name(), "Fail");
    }

    #[test]
    fn failed_creates_over_the_maximum_fail_whatever_the_sample_size() {
        let a = Analysis::default();
        let canary = Tally {
            calls: 4,
            errors: 4,
            failed_creates: 4,
            ..Tally::default()
        };
        let verdict = judge(canary, tally(0, 0), &a);
        assert_eq!(verdict.name(), "Fail");
        assert!(
            verdict
                .reason()
                .starts_with("4 failed creates, over the maximum 3")
        );
        let stable = Tally {
            calls: 10,
            errors: 10,
            failed_creates: 10,
            ..Tally::default()
        };
        assert_eq!(judge(canary, stable, &a).name(), "Inconclusive");
    }

    #[test]
    fn unhealthy_objects_under_the_canary_fail_the_window() {
        let a = Analysis::default();
        let canary = Tally {
            calls: 1,
            objects: 2,
            unhealthy: 2,
            ..Tally::default()
        };
        let verdict = judge(canary, Tally::default(), &a);
        assert_eq!(
            verdict,
            Verdict::Fail("2 objects it served were unhealthy, over the maximum 0 (it serves 2 now; stable: 0 unhealthy, 0 served)".into())
        );
        let sick_stable = Tally {
            calls: 10,
            objects: 4,
            unhealthy: 4,
            ..Tally::default()
        };
        assert_eq!(judge(canary, sick_stable, &a).name(), "Inconclusive");
    }

    #[test]
    fn steps_pass_one_by_one_and_a_failure_rolls_back() {
        let a = Analysis::default();
        let pass = Verdict::Pass(String::new());
        let fail = Verdict::Fail(String::new());
        let p = advance(Progress::start(), &pass, 3, &a);
        assert_eq!((p.phase, p.step), (Phase::Progressing, 1));
        assert_eq!(p.weight(&[10, 50, 80]), 50);
        let p = advance(p, &fail, 3, &a);
        assert_eq!((p.phase, p.weight(&[10, 50, 80])), (Phase::RolledBack, 0));
        let tolerant = Analysis {
            failure_limit: 1,
            ..a
        };
        let p = advance(Progress::start(), &fail, 1, &tolerant);
        assert_eq!(p.phase, Phase::Progressing);
        let p = advance(p, &pass, 1, &tolerant);
        assert_eq!(p.phase, Phase::Promoted);
    }

    #[test]
    fn inconclusive_windows_pause_until_a_human_acts() {
        let a = Analysis::default();
        let unsure = Verdict::Inconclusive(String::new());
        let mut p = Progress::start();
        for _ in 0..=a.inconclusive_limit {
            p = advance(p, &unsure, 2, &a);
        }
        assert_eq!(p.phase, Phase::Paused);
        let still = advance(p, &Verdict::Pass(String::new()), 2, &a);
        assert_eq!((still.phase, still.step), (Phase::Paused, 0));
        assert_eq!(act(still, Action::Promote).phase, Phase::Promoted);
        assert_eq!(act(still, Action::Abort).phase, Phase::RolledBack);
        let rolled = act(still, Action::Abort);
        assert_eq!(act(rolled, Action::Promote), rolled);
    }

    #[test]
    fn a_canary_stuck_past_its_deadline_is_rolled_back() {
        let a = Analysis {
            progress_deadline: Some(600),
            ..Analysis::default()
        };
        let unsure = Verdict::Inconclusive(String::new());
        let mut p = Progress::start();
        for _ in 0..=a.inconclusive_limit {
            p = advance(p, &unsure, 2, &a);
        }
        assert_eq!(p.phase, Phase::Paused);
        assert_eq!(past_deadline(p, 599, &a), None);
        let (rolled, why) = past_deadline(p, 600, &a).unwrap();
        assert_eq!((rolled.phase, rolled.step), (Phase::RolledBack, 0));
        assert_eq!(
            why,
            "step 1 made no progress for 600s, past progressDeadlineSeconds 600 (4 inconclusive windows in a row, paused)"
        );
        assert_eq!(past_deadline(p, 10_000, &Analysis::default()), None);
        let promoted = act(p, Action::Promote);
        assert_eq!(past_deadline(promoted, 10_000, &a), None);
    }

    #[test]
    fn the_share_is_rounded_up_and_never_more() {
        assert_eq!(share(10, 4), 1);
        assert_eq!(share(50, 4), 2);
        assert_eq!(share(50, 5), 3);
        assert_eq!(share(100, 7), 7);
        assert_eq!(share(1, 0), 0);
    }

    fn arb_tally() -> impl Strategy<Value = Tally> {
        (0u64..200, 0u64..20).prop_flat_map(|(calls, machines)| {
            (Just(calls), 0..=calls, Just(machines), 0..=machines).prop_flat_map(
                |(calls, errors, machines, unhealthy)| {
                    (0..=errors).prop_map(move |failed_creates| Tally {
                        calls,
                        errors,
                        failed_creates,
                        objects: machines,
                        unhealthy,
                    })
                },
            )
        })
    }

    fn arb_analysis() -> impl Strategy<Value = Analysis> {
        (
            1u64..20,
            0u32..60,
            0u32..30,
            0u64..6,
            0u64..3,
            0u32..3,
            0u32..4,
            proptest::option::of(1u64..100),
        )
            .prop_map(
                |(
                    min_samples,
                    max,
                    over,
                    creates,
                    unhealthy,
                    failure_limit,
                    inconclusive_limit,
                    progress_deadline,
                )| {
                    Analysis {
                        min_samples,
                        max_error_percent: max,
                        max_error_percent_over_stable: over,
                        max_failed_creates: creates,
                        max_unhealthy: unhealthy,
                        failure_limit,
                        inconclusive_limit,
                        progress_deadline,
                    }
                },
            )
    }

    fn arb_verdict() -> impl Strategy<Value = Verdict> {
        prop_oneof![
            Just(Verdict::Pass(String::new())),
            Just(Verdict::Fail(String::new())),
            Just(Verdict::Inconclusive(String::new())),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// More canary errors (and failed creates) in the same calls never
        /// turn a failed window into anything else.
        #[test]
        fn more_canary_errors_never_undo_a_failure(
            canary in arb_tally(), stable in arb_tally(), a in arb_analysis(),
            more in 0u64..50, more_creates in 0u64..50, more_sick in 0u64..5,
        ) {
            let errors = (canary.errors + more).min(canary.calls);
            let worse = Tally {
                errors,
                failed_creates: (canary.failed_creates + more_creates).min(errors),
                unhealthy: (canary.unhealthy + more_sick).min(canary.objects),
                ..canary
            };
            if judge(canary, stable, &a).name() == "Fail" {
                prop_assert_eq!(judge(worse, stable, &a).name(), "Fail");
            }
        }

        /// A stable revision doing as badly as the canary (with enough calls
        /// to tell) never rolls the canary back.
        #[test]
        fn equal_degradation_never_fails(canary in arb_tally(), a in arb_analysis(), scale in 1u64..4) {
            let stable = Tally {
                calls: canary.calls * scale,
                errors: canary.errors * scale,
                failed_creates: canary.failed_creates * scale,
                objects: canary.objects * scale,
                unhealthy: canary.unhealthy * scale,
            };
            prop_assume!(stable.calls >= a.min_samples);
            prop_assert_ne!(judge(canary, stable, &a).name(), "Fail");
        }

        /// Whatever the verdicts: a rollback is absorbing, weights never
        /// decrease before it, and a promotion took a pass in every step.
        #[test]
        fn progress_is_monotone_and_rollback_absorbing(
            verdicts in proptest::collection::vec((arb_verdict(), 0u64..60), 0..40),
            raw_weights in proptest::collection::vec(1u32..=100, 1..5),
            a in arb_analysis(),
        ) {
            let mut weights = raw_weights;
            weights.sort();
            let mut p = Progress::start();
            let mut passes_per_step = vec![0u32; weights.len()];
            let mut last_weight = p.weight(&weights);
            // Seconds the canary has held its step, each window adding some.
            let mut held = 0;
            for (v, window) in &verdicts {
                let before = p;
                p = advance(p, v, weights.len(), &a);
                held = if p.step == before.step { held + window } else { 0 };
                if let Some((late, _)) = past_deadline(p, held, &a) {
                    // A deadline only ever rolls back.
                    prop_assert_eq!(late.phase, Phase::RolledBack);
                    prop_assert_eq!(late.step, p.step);
                    p = late;
                }
                if before.phase == Phase::RolledBack {
                    prop_assert_eq!(p, before);
                }
                if matches!(v, Verdict::Pass(_)) && before.phase == Phase::Progressing {
                    passes_per_step[before.step] += 1;
                }
                if p.phase != Phase::RolledBack {
                    prop_assert!(p.weight(&weights) >= last_weight);
                    last_weight = p.weight(&weights);
                }
                if p.phase == Phase::Promoted && before.phase != Phase::Promoted {
                    prop_assert!(passes_per_step.iter().all(|&n| n >= 1), "{passes_per_step:?}");
                }
            }
        }

        /// The canary keeps every Machine it served, adds no more than the
        /// weight's share, and a higher weight serves a superset.
        #[test]
        fn assignment_is_sticky_bounded_and_monotone(
            uids in proptest::collection::btree_set("[a-f0-9]{8}", 0..40),
            sticky_mask in proptest::collection::vec(any::<bool>(), 40),
            w1 in 0u32..=100, w2 in 0u32..=100,
        ) {
            let candidates: Vec<(String, bool)> = uids
                .iter()
                .zip(&sticky_mask)
                .map(|(u, s)| (u.clone(), *s))
                .collect();
            let sticky: Vec<&String> = candidates.iter().filter(|c| c.1).map(|c| &c.0).collect();
            let (low, high) = (w1.min(w2), w1.max(w2));
            let a = assign("sha256:ab", &candidates, low);
            let b = assign("sha256:ab", &candidates, high);
            for uid in &sticky {
                prop_assert!(a.contains(uid));
            }
            prop_assert!(a.len() <= sticky.len().max(share(low, candidates.len())));
            for uid in &a {
                prop_assert!(b.contains(uid));
            }
            // Nobody sticky: exactly the share.
            let fresh: Vec<(String, bool)> = uids.iter().map(|u| (u.clone(), false)).collect();
            prop_assert_eq!(assign("sha256:ab", &fresh, high).len(), share(high, fresh.len()));
        }
    }
}
