//! MachineSet scaling: how many machines to create, which ones to delete.
//!
//! Start with [`plan_scale`]. Machines already being deleted count as gone
//! for the set's replicas (they are on their way out), so a set replaces a
//! machine as soon as its deletion starts, as Cluster API does.
//!
//! In-place rollouts add three things. A machine updating in place goes
//! first when the set shrinks, as in Cluster API (no point finishing an
//! update on a machine that is not wanted), but is never handed over again.
//! An old set the deployment
//! told to hand its machines over (`hand_over`) moves the machines it sheds
//! to the new set instead of deleting them. And the new set, whose replicas
//! the deployment raises in the same step, creates nothing for machines
//! still on their way to it (`incoming`).

use crate::Health;

/// The delete policy of a MachineSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeletePolicy {
    /// A stable pseudo-random order (the same machines every reconcile).
    #[default]
    Random,
    /// Most recently created first.
    Newest,
    /// Oldest first.
    Oldest,
}

/// What the set knows about one of its machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    /// Object name (unique within the set).
    pub name: String,
    /// Creation time, unix seconds.
    pub created: i64,
    /// Health.
    pub health: Health,
    /// Deletion has started (the object has a deletion timestamp).
    pub deleting: bool,
    /// An in-place update is under way (or failed).
    pub updating: bool,
    /// The `cluster.x-k8s.io/delete-machine` annotation: it goes first.
    pub delete_first: bool,
    /// A health check found it unhealthy or handed it over for
    /// remediation.
    pub unhealthy: bool,
}

/// What a MachineSet should do now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScalePlan {
    /// Machines to create.
    pub create: usize,
    /// Machines to delete, by name, in order.
    pub delete: Vec<String>,
    /// Machines to hand over to the deployment's new set (in-place rollouts).
    pub hand_over: Vec<String>,
}

/// Plan how a set with `replicas` wanted gets there from `machines`. With
/// `hand_over`, the machines the set sheds move to the new set instead of
/// being deleted; `incoming` machines are being handed over to this set.
pub fn plan_scale(
    replicas: usize,
    machines: &[MachineView],
    policy: DeletePolicy,
    hand_over: bool,
    incoming: usize,
) -> ScalePlan {
    let active: Vec<&MachineView> = machines.iter().filter(|m| !m.deleting).collect();
    if active.len() + incoming < replicas {
        return ScalePlan {
            create: replicas - active.len() - incoming,
            ..ScalePlan::default()
        };
    }
    let excess = active.len().saturating_sub(replicas);
    // A machine updating in place is not handed over a second time (unless
    // marked to go); deleted, it may be.
    let movable: Vec<&MachineView> = active
        .iter()
        .copied()
        .filter(|m| !hand_over || !m.updating || m.delete_first)
        .collect();
    let shed: Vec<String> = delete_order(&movable, policy)
        .into_iter()
        .take(excess)
        .map(|m| m.name.clone())
        .collect();
    if hand_over {
        ScalePlan {
            hand_over: shed,
            ..ScalePlan::default()
        }
    } else {
        ScalePlan {
            delete: shed,
            ..ScalePlan::default()
        }
    }
}

/// The order in which machines go when a set shrinks, Cluster API's
/// priorities: annotated `delete-machine`, then updating in place, then
/// unhealthy by a health check, then failed, not ready, ready but not yet
/// available, then by `policy`; ties broken by name so the order is total
/// and stable.
pub fn delete_order<'a>(
    machines: &[&'a MachineView],
    policy: DeletePolicy,
) -> Vec<&'a MachineView> {
    let mut ordered: Vec<&MachineView> = machines.to_vec();
    ordered.sort_by(|a, b| {
        b.delete_first
            .cmp(&a.delete_first)
            .then_with(|| b.updating.cmp(&a.updating))
            .then_with(|| b.unhealthy.cmp(&a.unhealthy))
            .then_with(|| a.health.cmp(&b.health))
            .then_with(|| match policy {
                DeletePolicy::Newest => b.created.cmp(&a.created),
                DeletePolicy::Oldest => a.created.cmp(&b.created),
                DeletePolicy::Random => stable_hash(&a.name).cmp(&stable_hash(&b.name)),
            })
            .then_with(|| a.name.cmp(&b.name))
    });
    ordered
}

/// A machine a health check handed over for remediation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    /// Object name.
    pub name: String,
    /// Creation time, unix seconds.
    pub created: i64,
}

/// Which handed-over machines a set deletes now, as Cluster API's
/// MachineSet does: none unless the set is its deployment's current
/// revision (older sets' machines go with the rollout), at most
/// `max_in_flight` remediations at once counting those still deleting
/// (`in_flight`), newest first (a machine that never came up is the least
/// likely to host anything).
pub fn to_remediate(
    unhealthy: &[Unhealthy],
    in_flight: usize,
    max_in_flight: Option<usize>,
    current_revision: bool,
) -> Vec<String> {
    if !current_revision {
        return vec![];
    }
    let mut newest_first: Vec<&Unhealthy> = unhealthy.iter().collect();
    newest_first.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.name.cmp(&b.name)));
    let room = max_in_flight.map_or(usize::MAX, |m| m.saturating_sub(in_flight));
    newest_first
        .into_iter()
        .take(room)
        .map(|m| m.name.clone())
        .collect()
}

/// FNV-1a: a fixed, dependency-free hash so "random" is the same on every
/// host and every reconcile.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Counts a set reports in its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Machines not being deleted.
    pub replicas: i32,
    /// Ready (or available) machines.
    pub ready: i32,
    /// Available machines.
    pub available: i32,
    /// Failed machines.
    pub failed: i32,
    /// Machines not being updated in place.
    pub up_to_date: i32,
}

/// Count machines for a status. Machines being deleted are not counted.
pub fn counts(machines: &[MachineView]) -> Counts {
    let mut counts = Counts::default();
    for m in machines.iter().filter(|m| !m.deleting) {
        counts.replicas += 1;
        if !m.updating {
            counts.up_to_date += 1;
        }
        match m.health {
            Health::Failed => counts.failed += 1,
            Health::NotReady => {}
            Health::Ready => counts.ready += 1,
            Health::Available => {
                counts.ready += 1;
                counts.available += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn machine(name: &str, created: i64, health: Health) -> MachineView {
        MachineView {
            updating: false,
            delete_first: false,
            unhealthy: false,
            name: name.into(),
            created,
            health,
            deleting: false,
        }
    }

    #[test]
    fn cluster_api_priorities_marked_then_updating_then_unhealthy_then_health() {
        let mut marked = machine("marked", 5, Health::Available);
        marked.delete_first = true;
        let mut hung = machine("hung", 1, Health::Available);
        hung.updating = true;
        let mut unhealthy = machine("unhealthy", 6, Health::Available);
        unhealthy.unhealthy = true;
        let failed = machine("failed", 2, Health::Failed);
        let ok = machine("ok", 3, Health::Available);
        let machines = vec![
            ok.clone(),
            failed.clone(),
            unhealthy.clone(),
            hung.clone(),
            marked.clone(),
        ];
        for policy in [
            DeletePolicy::Oldest,
            DeletePolicy::Newest,
            DeletePolicy::Random,
        ] {
            let plan = plan_scale(1, &machines, policy, false, 0);
            assert_eq!(
                plan.delete,
                ["marked", "hung", "unhealthy", "failed"],
                "{policy:?}"
            );
        }
        // Handing over never moves a machine already updating (unless
        // marked): the set sheds others.
        let plan = plan_scale(3, &machines, DeletePolicy::Oldest, true, 0);
        assert_eq!(plan.hand_over, ["marked", "unhealthy"]);
        hung.delete_first = true;
        let plan = plan_scale(2, &[failed, hung, ok], DeletePolicy::Oldest, true, 0);
        assert_eq!(plan.hand_over, ["hung"], "a hung update can be moved away");
    }

    #[test]
    fn remediation_is_newest_first_within_max_in_flight_and_only_in_the_current_revision() {
        let unhealthy = [
            Unhealthy {
                name: "old".into(),
                created: 1,
            },
            Unhealthy {
                name: "new".into(),
                created: 9,
            },
            Unhealthy {
                name: "mid".into(),
                created: 5,
            },
        ];
        assert_eq!(
            to_remediate(&unhealthy, 0, None, true),
            ["new", "mid", "old"]
        );
        assert_eq!(to_remediate(&unhealthy, 1, Some(2), true), ["new"]);
        assert!(to_remediate(&unhealthy, 2, Some(2), true).is_empty());
        assert!(to_remediate(&unhealthy, 0, None, false).is_empty());
    }

    #[test]
    fn scales_up_by_the_missing_count_ignoring_machines_being_deleted() {
        let mut gone = machine("a", 1, Health::Available);
        gone.deleting = true;
        let machines = vec![gone, machine("b", 2, Health::Available)];
        let plan = plan_scale(3, &machines, DeletePolicy::Random, false, 0);
        assert_eq!(
            plan,
            ScalePlan {
                create: 2,
                ..ScalePlan::default()
            }
        );
    }

    #[test]
    fn unhealthy_machines_go_first_whatever_the_policy() {
        let machines = vec![
            machine("old-ok", 1, Health::Available),
            machine("new-ok", 5, Health::Available),
            machine("mid-booting", 3, Health::NotReady),
            machine("mid-failed", 4, Health::Failed),
            machine("warming", 2, Health::Ready),
        ];
        for policy in [
            DeletePolicy::Random,
            DeletePolicy::Newest,
            DeletePolicy::Oldest,
        ] {
            let plan = plan_scale(2, &machines, policy, false, 0);
            assert_eq!(
                plan.delete,
                vec!["mid-failed", "mid-booting", "warming"],
                "{policy:?}"
            );
        }
        assert_eq!(
            plan_scale(1, &machines, DeletePolicy::Newest, false, 0).delete[3],
            "new-ok"
        );
        assert_eq!(
            plan_scale(1, &machines, DeletePolicy::Oldest, false, 0).delete[3],
            "old-ok"
        );
    }

    #[test]
    fn counts_skip_deleting_machines() {
        let mut gone = machine("a", 1, Health::Available);
        gone.deleting = true;
        let mut updating = machine("c", 1, Health::Ready);
        updating.updating = true;
        let c = counts(&[
            gone,
            machine("b", 1, Health::Available),
            updating,
            machine("d", 1, Health::Failed),
        ]);
        assert_eq!(
            c,
            Counts {
                replicas: 3,
                ready: 2,
                available: 1,
                failed: 1,
                up_to_date: 2,
            }
        );
    }

    fn health() -> impl Strategy<Value = Health> {
        prop_oneof![
            Just(Health::Failed),
            Just(Health::NotReady),
            Just(Health::Ready),
            Just(Health::Available)
        ]
    }

    proptest! {
        /// After applying a plan the set has exactly `replicas` active
        /// machines; the plan never both creates and deletes, never deletes
        /// a machine twice or one already going, deletes every machine
        /// updating in place before one that is not, and never deletes a
        /// healthier machine while a less healthy one stays. Handing over
        /// sheds what deleting would, machines updating in place aside.
        #[test]
        fn a_plan_reaches_replicas_exactly(
            replicas in 0usize..12,
            raw in proptest::collection::vec((0i64..100, health(), any::<bool>(), proptest::bool::weighted(0.2)), 0..16),
            policy in prop_oneof![Just(DeletePolicy::Random), Just(DeletePolicy::Newest), Just(DeletePolicy::Oldest)],
        ) {
            let machines: Vec<MachineView> = raw.iter().enumerate().map(|(i, (created, health, deleting, updating))| MachineView {
                name: format!("m-{i}"), created: *created, health: *health, deleting: *deleting, updating: *updating, delete_first: false, unhealthy: false,
            }).collect();
            let plan = plan_scale(replicas, &machines, policy, false, 0);
            let active = machines.iter().filter(|m| !m.deleting).count();
            let incoming = (replicas % 3).min(replicas);
            prop_assert!(plan.create == 0 || plan.delete.is_empty());
            prop_assert!(plan.hand_over.is_empty());
            if plan.create > 0 {
                prop_assert_eq!(active + plan.create, replicas);
            } else {
                prop_assert_eq!(plan.delete.len(), active - replicas);
            }
            // Machines on their way in are not created again.
            let with_incoming = plan_scale(replicas, &machines, policy, false, incoming);
            prop_assert_eq!(with_incoming.create, replicas.saturating_sub(active + incoming));
            let mut seen = std::collections::HashSet::new();
            for name in &plan.delete {
                prop_assert!(seen.insert(name.clone()));
                let m = machines.iter().find(|m| &m.name == name).unwrap();
                prop_assert!(!m.deleting);
            }
            let kept_updating = machines.iter().any(|m| !m.deleting && m.updating && !plan.delete.contains(&m.name));
            let deleted_steady = plan.delete.iter().any(|n| !machines.iter().find(|m| &m.name == n).unwrap().updating);
            prop_assert!(!(kept_updating && deleted_steady), "updating machines go first");
            let worst_kept = machines.iter().filter(|m| !m.deleting && !m.updating && !plan.delete.contains(&m.name)).map(|m| m.health).min();
            let best_deleted = plan.delete.iter().map(|n| machines.iter().find(|m| &m.name == n).unwrap()).filter(|m| !m.updating).map(|m| m.health).max();
            if let (Some(kept), Some(deleted)) = (worst_kept, best_deleted) {
                prop_assert!(deleted <= kept);
            }
            let handed = plan_scale(replicas, &machines, policy, true, 0);
            let steady: Vec<MachineView> = machines.iter().filter(|m| !m.updating).cloned().collect();
            let without_updating = plan_scale(replicas.saturating_sub(active - steady.iter().filter(|m| !m.deleting).count()), &steady, policy, false, 0);
            prop_assert!(handed.delete.is_empty());
            prop_assert_eq!(handed.create, plan.create);
            if plan.create == 0 {
                prop_assert_eq!(&handed.hand_over, &without_updating.delete);
            }
            // Same input, same answer (the "random" policy is stable).
            prop_assert_eq!(plan, plan_scale(replicas, &machines, policy, false, 0));
        }
    }
}
