//! MachineDeployment rollouts: replica targets for the new and old
//! MachineSets, per-machine dispositions, history pruning and the phase.
//!
//! Start with [`plan`]. A rollout moves machines from old sets (made from
//! earlier templates) to the new set (the current template), by replacing
//! them (a new machine in the new set, the old one deleted) or, with
//! [`plan_in_place`], by handing them over to the new set where updater
//! plugins change them in place (`crate::inplace` says which). Both are
//! paced by `maxSurge` / `maxUnavailable` exactly as Kubernetes Deployments
//! pace ReplicaSets:
//!
//! - the new set grows while all machines (counting those still being
//!   deleted) stay within `replicas + maxSurge`;
//! - old sets shrink, oldest first, while available machines stay at or
//!   above `replicas - maxUnavailable`; unavailable old machines may go
//!   first since removing them costs no availability.
//!
//! A machine updating in place is unavailable, so handing one over spends
//! the same availability as deleting it; it never adds an instance, so the
//! surge bound is only spent on fresh machines (with `maxUnavailable: 0`
//! one surge machine comes first, as in Cluster API).

use crate::Bounds;

/// How a deployment replaces machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Replace within the surge / unavailability bounds.
    RollingUpdate(Bounds),
    /// Replace a machine only after a user deleted it.
    OnDelete,
}

/// What the deployment knows about one of its MachineSets (the default is
/// a set that does not exist yet).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetView {
    /// Set name.
    pub name: String,
    /// Its rollout revision (higher is newer).
    pub revision: i64,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Machine objects it has, including those being deleted (they still
    /// hold a cloud instance).
    pub machines: i32,
    /// Of those, machines being deleted.
    pub deleting: i32,
    /// Machines that are available.
    pub available: i32,
    /// Machines updating in place (unavailable, and never removed until
    /// their update ends).
    pub updating: i32,
    /// An old set told to hand the machines it sheds to the new set.
    pub handing_over: bool,
}

/// Replica targets for the deployment's sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Target for the new set (created with this count if it does not exist).
    pub new_replicas: i32,
    /// Targets for old sets, by name; sets whose target is unchanged are
    /// left out so the controller writes only what changes.
    pub old_replicas: Vec<(String, i32)>,
    /// Old sets (of those in `old_replicas`) that shrink by handing their
    /// machines over to the new set rather than deleting them.
    pub hand_over: Vec<String>,
}

/// Plan the next step of a deployment with `replicas` wanted. `new` is the
/// set made from the current template (`None` before it exists); `olds` are
/// the rest. A paused deployment only scales.
pub fn plan(
    replicas: i32,
    strategy: Strategy,
    paused: bool,
    new: Option<&SetView>,
    olds: &[SetView],
) -> Plan {
    let empty = SetView::default();
    let new = new.unwrap_or(&empty);
    let mut olds: Vec<&SetView> = olds.iter().collect();
    olds.sort_by_key(|s| (s.revision, s.name.clone()));
    if paused {
        return scale_only(replicas, new, &olds);
    }
    match strategy {
        Strategy::RollingUpdate(bounds) => rolling(replicas, bounds, new, &olds),
        Strategy::OnDelete => on_delete(replicas, &olds),
    }
}

fn rolling(replicas: i32, bounds: Bounds, new: &SetView, olds: &[&SetView]) -> Plan {
    let mut plan = Plan {
        new_replicas: new.replicas,
        ..Plan::default()
    };
    // Everything that holds (or will hold) an instance.
    let footprint = |s: &SetView, target: i32| target.max(s.machines);
    let old_footprint: i32 = olds.iter().map(|s| footprint(s, s.replicas)).sum();

    // Grow the new set within the surge bound, or shrink it to `replicas`.
    if new.replicas > replicas {
        plan.new_replicas = replicas;
    } else if new.replicas < replicas {
        // Saturating: a `maxSurge` as large as an i32 allows must not wrap.
        let max_total = replicas.saturating_add(bounds.max_surge);
        let headroom = max_total
            .saturating_sub(old_footprint)
            .saturating_sub(footprint(new, new.replicas));
        if headroom > 0 {
            plan.new_replicas = new.replicas.saturating_add(headroom).min(replicas);
        }
    }

    // Shrink old sets, never taking availability below the floor.
    let min_available = replicas - bounds.max_unavailable;
    let new_unavailable = (plan.new_replicas - new.available).max(0);
    let all_targets: i32 = olds.iter().map(|s| s.replicas).sum::<i32>() + plan.new_replicas;
    let mut unhealthy_budget = all_targets - min_available - new_unavailable;
    let mut targets: Vec<i32> = olds.iter().map(|s| s.replicas).collect();
    for (target, set) in targets.iter_mut().zip(olds) {
        if unhealthy_budget <= 0 {
            break;
        }
        let unhealthy = (*target - set.available - set.updating)
            .max(0)
            .min(unhealthy_budget);
        *target -= unhealthy;
        unhealthy_budget -= unhealthy;
    }
    let available: i32 = olds.iter().map(|s| s.available).sum::<i32>() + new.available;
    let mut removable = available - min_available;
    for (target, set) in targets.iter_mut().zip(olds) {
        if removable <= 0 {
            break;
        }
        // Only available machines remain in this set's target now.
        let take = (*target).min(removable).min(set.available);
        *target -= take;
        removable -= take;
    }
    // A rollout that is done leaves nothing behind, even machines the
    // availability floor could not account for (for example when
    // `replicas` dropped to zero).
    if plan.new_replicas == replicas && new.available >= replicas {
        targets.iter_mut().for_each(|t| *t = 0);
    }
    plan.old_replicas = changed(olds, &targets);
    plan
}

fn on_delete(replicas: i32, olds: &[&SetView]) -> Plan {
    // Old sets keep the machines they still have (a machine a user deleted
    // is not recreated there); the new set makes up the difference. When
    // scaling down, old machines go first.
    let mut targets: Vec<i32> = olds
        .iter()
        .map(|s| s.replicas.min(s.machines - s.deleting))
        .collect();
    let mut excess = targets.iter().sum::<i32>() - replicas;
    for target in targets.iter_mut() {
        if excess <= 0 {
            break;
        }
        let take = (*target).min(excess);
        *target -= take;
        excess -= take;
    }
    let new_replicas = (replicas - targets.iter().sum::<i32>()).max(0);
    Plan {
        new_replicas,
        old_replicas: changed(olds, &targets),
        hand_over: vec![],
    }
}

fn scale_only(replicas: i32, new: &SetView, olds: &[&SetView]) -> Plan {
    // Paused: no template moves, but `replicas` still applies. Growth goes
    // to the newest set; shrinking takes from the oldest.
    let mut targets: Vec<i32> = olds.iter().map(|s| s.replicas).collect();
    let mut new_replicas = new.replicas;
    let total = targets.iter().sum::<i32>() + new_replicas;
    if total < replicas {
        if new.name.is_empty() && !olds.is_empty() {
            *targets.last_mut().expect("not empty") += replicas - total;
        } else {
            new_replicas += replicas - total;
        }
    } else {
        let mut excess = total - replicas;
        for target in targets.iter_mut().chain(std::iter::once(&mut new_replicas)) {
            let take = (*target).min(excess);
            *target -= take;
            excess -= take;
        }
    }
    Plan {
        new_replicas,
        old_replicas: changed(olds, &targets),
        hand_over: vec![],
    }
}

/// Plan the next step of a rolling update whose old machines are updated in
/// place. Old sets shrink as in [`plan`], but while the new set still needs
/// machines the ones they shed are handed over to it ([`Plan::hand_over`])
/// instead of deleted, and the new set's target grows by as many in the
/// same step (its MachineSet creates nothing for machines on their way in);
/// the rest (for example once surge machines filled the new set) are
/// deleted. An old set still shedding (more machines than replicas) is left
/// alone until it has; what it is handing over counts for the new set.
pub fn plan_in_place(
    replicas: i32,
    bounds: Bounds,
    new: Option<&SetView>,
    olds: &[SetView],
) -> Plan {
    let empty = SetView::default();
    let live = |s: &SetView| s.machines - s.deleting;
    let on_the_way: i32 = olds
        .iter()
        .filter(|s| s.handing_over)
        .map(|s| (live(s) - s.replicas).max(0))
        .sum();
    // Machines that arrived or are on their way belong in the new set's
    // target, even when a write that said so did not go through.
    let mut new = new.unwrap_or(&empty).clone();
    new.replicas = new.replicas.max((live(&new) + on_the_way).min(replicas));
    let mut olds: Vec<&SetView> = olds.iter().collect();
    olds.sort_by_key(|s| (s.revision, s.name.clone()));
    let mut plan = rolling(replicas, bounds, &new, &olds);
    plan.new_replicas = plan.new_replicas.max(new.replicas.min(replicas));
    let in_flight = |s: &SetView| live(s) > s.replicas;
    let mut need = replicas - plan.new_replicas;
    let mut changes = vec![];
    for (name, target) in std::mem::take(&mut plan.old_replicas) {
        let set = olds
            .iter()
            .find(|s| s.name == name)
            .expect("planned sets are olds");
        if in_flight(set) {
            continue;
        }
        let shrink = set.replicas - target;
        if shrink > 0 && need > 0 {
            // Hand over only what the new set needs; the rest of this
            // set's shrink waits for a later step (shrinking less is
            // always within the bounds).
            let take = shrink.min(need);
            need -= take;
            plan.new_replicas += take;
            changes.push((name.clone(), set.replicas - take));
            plan.hand_over.push(name);
        } else {
            changes.push((name, target));
        }
    }
    plan.old_replicas = changes;
    plan
}

fn changed(olds: &[&SetView], targets: &[i32]) -> Vec<(String, i32)> {
    olds.iter()
        .zip(targets)
        .filter(|(s, t)| s.replicas != **t)
        .map(|(s, t)| (s.name.clone(), *t))
        .collect()
}

/// Old sets to delete so at most `limit` empty old sets remain for
/// rollback: the oldest empty ones go first.
pub fn sets_to_prune(olds: &[SetView], limit: usize) -> Vec<String> {
    let mut empty: Vec<&SetView> = olds
        .iter()
        .filter(|s| s.replicas == 0 && s.machines == 0)
        .collect();
    empty.sort_by_key(|s| (s.revision, s.name.clone()));
    let excess = empty.len().saturating_sub(limit);
    empty
        .into_iter()
        .take(excess)
        .map(|s| s.name.clone())
        .collect()
}

/// The revision the current template gets: its set's own revision if it is
/// already the newest, else one more than any revision seen (a rollback to
/// an old template makes that template the newest revision, as in
/// Kubernetes).
pub fn next_revision(new: Option<&SetView>, olds: &[SetView]) -> i64 {
    let newest_old = olds.iter().map(|s| s.revision).max().unwrap_or(0);
    match new {
        Some(set) if set.revision > newest_old => set.revision,
        _ => newest_old.max(new.map_or(0, |s| s.revision)) + 1,
    }
}

/// Whether a rollout is complete: every wanted machine is new and
/// available, and no old machine remains.
pub fn complete(replicas: i32, new: Option<&SetView>, olds: &[SetView]) -> bool {
    let new_ok = new.map_or(replicas == 0, |n| {
        n.replicas == replicas && n.machines == replicas && n.available >= replicas
    });
    new_ok && olds.iter().all(|s| s.replicas == 0 && s.machines == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Health;
    use crate::machineset::{DeletePolicy, MachineView, plan_scale};
    use proptest::prelude::{ProptestConfig, prop_assert, prop_assert_eq, proptest};

    fn set(name: &str, revision: i64, replicas: i32, machines: i32, available: i32) -> SetView {
        SetView {
            name: name.into(),
            revision,
            replicas,
            machines,
            deleting: 0,
            available,
            updating: 0,
            handing_over: false,
        }
    }

    fn bounds(max_surge: i32, max_unavailable: i32) -> Strategy {
        Strategy::RollingUpdate(Bounds {
            max_surge,
            max_unavailable,
        })
    }

    #[test]
    fn the_largest_surge_an_i32_holds_does_not_overflow() {
        let old = set("old", 1, 3, 3, 3);
        let p = plan(
            3,
            bounds(i32::MAX, 0),
            false,
            None,
            std::slice::from_ref(&old),
        );
        assert_eq!(p.new_replicas, 3, "the whole new set at once: {p:?}");
    }

    #[test]
    fn first_step_of_a_rollout_surges_then_waits_for_availability() {
        let old = set("old", 1, 3, 3, 3);
        let p = plan(3, bounds(1, 0), false, None, std::slice::from_ref(&old));
        assert_eq!(p.new_replicas, 1);
        assert!(p.old_replicas.is_empty());
        // The new machine exists but is not available: nothing else moves.
        let new = set("new", 2, 1, 1, 0);
        let p = plan(
            3,
            bounds(1, 0),
            false,
            Some(&new),
            std::slice::from_ref(&old),
        );
        assert_eq!(
            p,
            Plan {
                new_replicas: 1,
                ..Plan::default()
            }
        );
        // Once it is available one old machine may go.
        let new = set("new", 2, 1, 1, 1);
        let p = plan(3, bounds(1, 0), false, Some(&new), &[old]);
        assert_eq!(p.old_replicas, vec![("old".to_string(), 2)]);
    }

    #[test]
    fn max_unavailable_lets_old_machines_go_before_new_ones_exist() {
        let old = set("old", 1, 4, 4, 4);
        let p = plan(4, bounds(0, 2), false, None, &[old]);
        assert_eq!(p.new_replicas, 0);
        assert_eq!(p.old_replicas, vec![("old".to_string(), 2)]);
    }

    #[test]
    fn machines_still_being_deleted_count_against_the_surge() {
        // The old set is down to 2 but 3 machines still hold instances.
        let old = set("old", 1, 2, 3, 2);
        let new = set("new", 2, 1, 1, 1);
        let p = plan(3, bounds(1, 0), false, Some(&new), &[old]);
        assert_eq!(p.new_replicas, 1);
    }

    #[test]
    fn on_delete_replaces_only_what_users_deleted() {
        let old = set("old", 1, 3, 3, 3);
        let p = plan(
            3,
            Strategy::OnDelete,
            false,
            None,
            std::slice::from_ref(&old),
        );
        assert_eq!(
            p,
            Plan {
                new_replicas: 0,
                ..Plan::default()
            }
        );
        let old = set("old", 1, 3, 2, 2);
        let p = plan(3, Strategy::OnDelete, false, None, &[old]);
        assert_eq!(p.new_replicas, 1);
        assert_eq!(p.old_replicas, vec![("old".to_string(), 2)]);
        // A machine still being deleted is already counted as gone.
        let mut old = set("old", 1, 3, 3, 2);
        old.deleting = 1;
        let p = plan(3, Strategy::OnDelete, false, None, &[old]);
        assert_eq!(p.new_replicas, 1);
    }

    #[test]
    fn paused_deployments_scale_but_do_not_roll() {
        let old = set("old", 1, 3, 3, 3);
        let new = set("new", 2, 1, 1, 1);
        let p = plan(
            5,
            bounds(1, 0),
            true,
            Some(&new),
            std::slice::from_ref(&old),
        );
        assert_eq!(
            p,
            Plan {
                new_replicas: 2,
                ..Plan::default()
            }
        );
        let p = plan(2, bounds(1, 0), true, Some(&new), &[old]);
        assert_eq!(p.new_replicas, 1);
        assert_eq!(p.old_replicas, vec![("old".to_string(), 1)]);
    }

    #[test]
    fn history_keeps_the_newest_empty_sets() {
        let olds = vec![
            set("r1", 1, 0, 0, 0),
            set("r2", 2, 0, 0, 0),
            set("r3", 3, 0, 1, 0),
            set("r4", 4, 0, 0, 0),
        ];
        assert_eq!(sets_to_prune(&olds, 1), vec!["r1", "r2"]);
        assert!(sets_to_prune(&olds, 10).is_empty());
    }

    #[test]
    fn revisions_only_grow() {
        let olds = vec![set("a", 1, 0, 0, 0), set("b", 3, 0, 0, 0)];
        assert_eq!(next_revision(None, &olds), 4);
        assert_eq!(next_revision(Some(&set("c", 4, 0, 0, 0)), &olds), 4);
        // Rolling back to revision 1's template makes it revision 4.
        assert_eq!(next_revision(Some(&set("a", 1, 0, 0, 0)), &olds[1..]), 4);
    }

    #[test]
    fn in_place_hands_over_only_what_the_new_set_needs() {
        let b = Bounds {
            max_surge: 0,
            max_unavailable: 1,
        };
        // First step: one machine moves, and the new set's target takes it
        // in at once; nothing is launched.
        let old = set("old", 1, 4, 4, 4);
        let p = plan_in_place(4, b, None, std::slice::from_ref(&old));
        assert_eq!(p.new_replicas, 1);
        assert_eq!(p.old_replicas, vec![("old".to_string(), 3)]);
        assert_eq!(p.hand_over, vec!["old".to_string()]);
        // Still handing over: the old set is left alone, and what it hands
        // over counts for the new set even if raising it did not go in.
        let mut handing = set("old", 1, 3, 4, 4);
        handing.handing_over = true;
        let p = plan_in_place(4, b, None, &[handing]);
        assert!(p.old_replicas.is_empty());
        assert_eq!(p.new_replicas, 1);
        // Arrived and updating: the unavailability budget is spent.
        let mut new = set("new", 2, 1, 1, 0);
        new.updating = 1;
        let p = plan_in_place(4, b, Some(&new), &[set("old", 1, 3, 3, 3)]);
        assert_eq!(p.new_replicas, 1);
        assert!(p.old_replicas.is_empty());
        // With surge, fresh machines fill the new set; what is left of the
        // old set once it is full is deleted, not handed over.
        let b = Bounds {
            max_surge: 1,
            max_unavailable: 0,
        };
        let new = set("new", 2, 2, 2, 2);
        let p = plan_in_place(2, b, Some(&new), &[set("old", 1, 1, 1, 1)]);
        assert_eq!(p.old_replicas, vec![("old".to_string(), 0)]);
        assert!(p.hand_over.is_empty());
    }

    /// A small simulated fleet: machines boot after a delay, deletions take
    /// a tick or two, the MachineSet logic applies the planner's targets.
    #[derive(Debug, Clone)]
    struct SimMachine {
        name: String,
        created: i64,
        ready_at: i64,
        gone_at: Option<i64>,
        /// Handed over and updating in place until `ready_at`.
        updating: bool,
    }

    #[derive(Debug, Clone)]
    struct SimSet {
        name: String,
        revision: i64,
        replicas: i32,
        machines: Vec<SimMachine>,
        /// Told to hand over what it sheds (the controller's annotation).
        handing: bool,
    }

    impl SimSet {
        fn view(&self, now: i64) -> SetView {
            SetView {
                name: self.name.clone(),
                revision: self.revision,
                replicas: self.replicas,
                machines: self.machines.len() as i32,
                deleting: self.machines.iter().filter(|m| m.gone_at.is_some()).count() as i32,
                available: self
                    .machines
                    .iter()
                    .filter(|m| m.gone_at.is_none() && m.ready_at <= now)
                    .count() as i32,
                updating: self
                    .machines
                    .iter()
                    .filter(|m| m.gone_at.is_none() && m.updating && m.ready_at > now)
                    .count() as i32,
                handing_over: self.handing,
            }
        }
    }

    struct Fleet {
        sets: Vec<SimSet>,
        next_id: usize,
        now: i64,
        /// `Some(ticks an in-place update takes)`: roll out in place.
        in_place: Option<i64>,
        /// Machines created since the start.
        launched: usize,
    }

    impl Fleet {
        fn step(&mut self, replicas: i32, strategy: Strategy, boot: &[i64], delete_delay: i64) {
            let current = self.sets.len() - 1;
            let new_view = self.sets[current].view(self.now);
            let olds: Vec<SetView> = self.sets[..current]
                .iter()
                .map(|s| s.view(self.now))
                .collect();
            let p = match (self.in_place, strategy) {
                (Some(_), Strategy::RollingUpdate(bounds)) => {
                    plan_in_place(replicas, bounds, Some(&new_view), &olds)
                }
                _ => plan(replicas, strategy, false, Some(&new_view), &olds),
            };
            self.sets[current].replicas = p.new_replicas;
            for (name, target) in p.old_replicas {
                let set = self.sets.iter_mut().find(|s| s.name == name).unwrap();
                set.replicas = target;
                set.handing = p.hand_over.contains(&name);
            }
            let handing: Vec<String> = self.sets[..current]
                .iter()
                .filter(|s| s.handing)
                .map(|s| s.name.clone())
                .collect();
            let now = self.now;
            let mut moved = vec![];
            // Old sets first, then the new one (which counts what is on
            // its way in), as the controllers' caches would see them.
            let mut order: Vec<usize> = (0..current).collect();
            order.push(current);
            for index in order {
                if index == current {
                    self.sets[current].machines.append(&mut moved);
                }
                let incoming: i32 = if index == current {
                    self.sets[..current]
                        .iter()
                        .filter(|s| handing.contains(&s.name))
                        .map(|s| {
                            let live =
                                s.machines.iter().filter(|m| m.gone_at.is_none()).count() as i32;
                            (live - s.replicas).max(0)
                        })
                        .sum()
                } else {
                    0
                };
                let set = &mut self.sets[index];
                let views: Vec<MachineView> = set
                    .machines
                    .iter()
                    .map(|m| MachineView {
                        name: m.name.clone(),
                        created: m.created,
                        health: if m.ready_at <= now {
                            Health::Available
                        } else {
                            Health::NotReady
                        },
                        deleting: m.gone_at.is_some(),
                        delete_first: false,
                        unhealthy: false,
                        updating: m.updating && m.ready_at > now,
                    })
                    .collect();
                let hand_over = index != current && handing.contains(&set.name);
                let sp = plan_scale(
                    set.replicas as usize,
                    &views,
                    DeletePolicy::Random,
                    hand_over,
                    incoming as usize,
                );
                for name in sp.delete {
                    let m = set.machines.iter_mut().find(|m| m.name == name).unwrap();
                    m.gone_at = Some(now + delete_delay);
                }
                for name in sp.hand_over {
                    let at = set.machines.iter().position(|m| m.name == name).unwrap();
                    let mut m = set.machines.remove(at);
                    m.updating = true;
                    m.ready_at = now + self.in_place.unwrap_or(1);
                    moved.push(m);
                }
                for _ in 0..sp.create {
                    let delay = boot[self.next_id % boot.len()];
                    set.machines.push(SimMachine {
                        name: format!("m{}", self.next_id),
                        created: now,
                        ready_at: now + delay,
                        gone_at: None,
                        updating: false,
                    });
                    self.next_id += 1;
                    self.launched += 1;
                }
            }
            self.now += 1;
            let now = self.now;
            for set in &mut self.sets {
                set.machines.retain(|m| m.gone_at.is_none_or(|g| g > now));
            }
        }

        fn total_machines(&self) -> i32 {
            self.sets.iter().map(|s| s.machines.len() as i32).sum()
        }

        fn available(&self) -> i32 {
            self.sets.iter().map(|s| s.view(self.now).available).sum()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// From a fully available deployment, a template change (and
        /// sometimes a second one mid-rollout), by replacement or in place
        /// (a machine updating counts as unavailable), never exceeds
        /// `replicas + maxSurge` machines (counting ones still being
        /// deleted), never drops below `replicas - maxUnavailable`
        /// available, and always finishes with every machine new. In place
        /// with `maxSurge: 0` it launches no instance at all.
        #[test]
        fn rollouts_stay_within_bounds_and_finish(
            replicas in 0i32..12,
            surge in 0i32..4,
            unavailable in 0i32..4,
            boot in proptest::collection::vec(1i64..6, 1..8),
            delete_delay in 0i64..3,
            second_change_at in proptest::option::of(1i64..15),
            in_place in proptest::option::of(1i64..5),
        ) {
            let bounds = Bounds::resolve(replicas, crate::Bound::Count(surge), crate::Bound::Count(unavailable));
            let strategy = Strategy::RollingUpdate(bounds);
            let machines = (0..replicas).map(|i| SimMachine { name: format!("o{i}"), created: 0, ready_at: 0, gone_at: None, updating: false }).collect();
            let mut fleet = Fleet {
                sets: vec![
                    SimSet { name: "rev1".into(), revision: 1, replicas, machines, handing: false },
                    SimSet { name: "rev2".into(), revision: 2, replicas: 0, machines: vec![], handing: false },
                ],
                next_id: 0,
                now: 1,
                in_place,
                launched: 0,
            };
            let floor = replicas - bounds.max_unavailable;
            let mut finished = false;
            for tick in 0..400 {
                if Some(tick) == second_change_at {
                    fleet.sets.push(SimSet { name: "rev3".into(), revision: 3, replicas: 0, machines: vec![], handing: false });
                }
                fleet.step(replicas, strategy, &boot, delete_delay);
                prop_assert!(fleet.total_machines() <= replicas + bounds.max_surge,
                    "tick {tick}: {} machines > {replicas} + {}", fleet.total_machines(), bounds.max_surge);
                prop_assert!(fleet.available() >= floor,
                    "tick {tick}: {} available < {floor}", fleet.available());
                let last = fleet.sets.len() - 1;
                let olds: Vec<SetView> = fleet.sets[..last].iter().map(|s| s.view(fleet.now)).collect();
                if complete(replicas, Some(&fleet.sets[last].view(fleet.now)), &olds) {
                    finished = true;
                    break;
                }
            }
            prop_assert!(finished, "the rollout did not finish in 400 ticks");
            if in_place.is_some() && bounds.max_surge == 0 {
                prop_assert_eq!(fleet.launched, 0);
            }
        }

        /// OnDelete never touches old machines by itself, and the fleet
        /// keeps `replicas` machines as users delete old ones.
        #[test]
        fn on_delete_keeps_the_count_and_never_deletes_by_itself(
            replicas in 1i32..10,
            deletions in 0i32..10,
        ) {
            let deletions = deletions.min(replicas);
            let old = set("old", 1, replicas, replicas - deletions, replicas - deletions);
            let p = plan(replicas, Strategy::OnDelete, false, None, &[old]);
            let old_target = p.old_replicas.first().map_or(replicas, |(_, t)| *t);
            prop_assert_eq!(old_target, replicas - deletions);
            prop_assert_eq!(p.new_replicas + old_target, replicas);
        }
    }
}
