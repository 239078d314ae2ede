//! Deleting a machine, step by step: pre-drain hooks, draining its Node,
//! waiting for its volumes to detach, pre-terminate hooks, then the
//! instance. [`next_step`] says which step a deleting machine is at;
//! [`plan_drain`] says which pods to evict next and which to wait for. The
//! Machine controller executes the step and asks again, so a restart
//! resumes where the API says the machine is.

/// What the deletion steps depend on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeletionView {
    /// Pre-drain hook names still present (annotation suffixes).
    pub pre_drain_hooks: Vec<String>,
    /// Pre-terminate hook names still present.
    pub pre_terminate_hooks: Vec<String>,
    /// The Node to drain, if the machine has one that still exists.
    pub node: Option<String>,
    /// An exclude-node-draining annotation is set.
    pub exclude_draining: bool,
    /// Seconds the drain has run so far (`None`: not started).
    pub drained_for: Option<i64>,
    /// `deletion.nodeDrainTimeoutSeconds` (0: no limit).
    pub drain_timeout: i64,
    /// The drain is behind the machine: it found nothing left to evict or
    /// wait for, or an earlier pass already went past it.
    pub drain_complete: bool,
    /// `machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach` is set.
    pub exclude_volume_wait: bool,
    /// Seconds spent waiting for volumes so far (`None`: not started).
    pub volumes_waited_for: Option<i64>,
    /// `deletion.nodeVolumeDetachTimeoutSeconds` (0: no limit).
    pub volume_detach_timeout: i64,
    /// The wait for volumes is behind the machine: none were attached, or
    /// an earlier pass already went past it.
    pub volumes_detached: bool,
}

/// The step a deleting machine is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionStep {
    /// Held until these pre-drain hook annotations are removed.
    WaitForPreDrainHooks(Vec<String>),
    /// Cordon and drain this Node.
    DrainNode(String),
    /// Wait until no volume is attached to this Node.
    WaitForVolumeDetach(String),
    /// Held until these pre-terminate hook annotations are removed.
    WaitForPreTerminateHooks {
        /// The hooks still present.
        hooks: Vec<String>,
        /// Why the drain or the wait for volumes was skipped or cut short.
        drain_skipped: Option<String>,
    },
    /// Delete the instance (then the Node object, then the finalizer).
    DeleteInstance {
        /// Why the drain or the wait for volumes was skipped or cut short.
        drain_skipped: Option<String>,
    },
}

/// The step a deleting machine is at now.
pub fn next_step(view: &DeletionView) -> DeletionStep {
    if !view.pre_drain_hooks.is_empty() {
        return DeletionStep::WaitForPreDrainHooks(view.pre_drain_hooks.clone());
    }
    let mut skipped = vec![];
    match &view.node {
        None => {}
        Some(_) if view.drain_complete => {}
        Some(_) if view.exclude_draining => {
            skipped.push("the machine has the exclude-node-draining annotation".to_string());
        }
        Some(node) => {
            let timed_out =
                view.drain_timeout > 0 && view.drained_for.is_some_and(|d| d >= view.drain_timeout);
            if !timed_out {
                return DeletionStep::DrainNode(node.clone());
            }
            skipped.push(format!(
                "draining Node {node} did not finish within nodeDrainTimeoutSeconds ({}s)",
                view.drain_timeout
            ));
        }
    }
    match &view.node {
        None => {}
        Some(_) if view.volumes_detached => {}
        Some(_) if view.exclude_volume_wait => skipped
            .push("the machine has the exclude-wait-for-node-volume-detach annotation".to_string()),
        Some(node) => {
            let timeout = view.volume_detach_timeout;
            let timed_out = timeout > 0 && view.volumes_waited_for.is_some_and(|d| d >= timeout);
            if !timed_out {
                return DeletionStep::WaitForVolumeDetach(node.clone());
            }
            skipped.push(format!(
                "the volumes of Node {node} were not detached within nodeVolumeDetachTimeoutSeconds ({timeout}s)"
            ));
        }
    }
    let drain_skipped = (!skipped.is_empty()).then(|| skipped.join("; "));
    if !view.pre_terminate_hooks.is_empty() {
        return DeletionStep::WaitForPreTerminateHooks {
            hooks: view.pre_terminate_hooks.clone(),
            drain_skipped,
        };
    }
    DeletionStep::DeleteInstance { drain_skipped }
}

/// Cluster API's default `nodeDeletionTimeoutSeconds`.
pub const DEFAULT_NODE_DELETION_TIMEOUT_SECONDS: i64 = 10;

/// Whether a failed delete of the Node object is given up on, so the
/// machine lets go without it: `nodeDeletionTimeoutSeconds` (unset: 10, 0:
/// never) counted from the machine's deletion request.
pub fn give_up_node_deletion(deleting_for: i64, timeout: Option<i64>) -> bool {
    let timeout = timeout.unwrap_or(DEFAULT_NODE_DELETION_TIMEOUT_SECONDS);
    timeout > 0 && deleting_for >= timeout
}

/// What a MachineDrainRule (the first, by name, that applies to the
/// machine and the pod) says about a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSays {
    /// Evict it, in this order group.
    Drain(i32),
    /// Leave it.
    Skip,
    /// Never evict it; wait until it completes.
    WaitCompleted,
}

/// A pod on the Node being drained.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Controlled by a DaemonSet that still exists (its controller would
    /// put it right back). An orphan is drained.
    pub daemon_set: bool,
    /// A static pod's mirror (the API cannot remove it).
    pub mirror: bool,
    /// Seconds since its deletion started (`None`: not being deleted).
    pub deleting_for: Option<i64>,
    /// Its phase is `Succeeded` or `Failed`.
    pub finished: bool,
    /// The value of its `cluster.x-k8s.io/drain` label, if any.
    pub drain_label: Option<String>,
    /// The first applying MachineDrainRule's say, if any rule applies.
    pub rule: Option<RuleSays>,
}

type PodKey = (String, String);

/// What draining does next.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainPlan {
    /// Pods to evict now (`namespace/name`): the lowest order group.
    pub evict: Vec<PodKey>,
    /// Pods already evicted, whose removal is awaited.
    pub wait_for: Vec<PodKey>,
    /// Pods never evicted whose completion is awaited (`WaitCompleted`).
    pub wait_completed: Vec<PodKey>,
    /// Pods of higher order groups, evicted once the lower ones are gone.
    pub later: Vec<PodKey>,
    /// Pods left alone, and why.
    pub skipped: Vec<(String, String, &'static str)>,
}

impl DrainPlan {
    /// Nothing left to evict or wait for.
    pub fn complete(&self) -> bool {
        self.evict.is_empty()
            && self.wait_for.is_empty()
            && self.wait_completed.is_empty()
            && self.later.is_empty()
    }
}

/// A volume attached to the Node being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedVolume {
    /// How it is named where it was found (a `volumesAttached` name, or
    /// the PersistentVolume of a VolumeAttachment).
    pub name: String,
    /// The claim (`namespace/name`) of its PersistentVolume, if known.
    pub claim: Option<String>,
}

/// The attached volumes the deletion waits for: all but those whose claim
/// belongs to a pod the drain left on the Node (`skipped_claims`), which
/// will not detach before the instance goes (Cluster API's rule). Sorted
/// and without repeats.
pub fn volumes_to_wait_for(
    attached: &[AttachedVolume],
    skipped_claims: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut names: Vec<String> = attached
        .iter()
        .filter(|v| v.claim.as_ref().is_none_or(|c| !skipped_claims.contains(c)))
        .map(|v| v.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Seconds after which a terminating pod on an unreachable Node is no
/// longer waited for: no kubelet will ever remove it (Cluster API's rule).
pub const UNREACHABLE_POD_GRACE: i64 = 1;

/// How one pod is drained, in Cluster API's precedence: what kubectl drain
/// leaves (pods long terminating on an unreachable Node, DaemonSet pods,
/// mirror pods), then the pod's `cluster.x-k8s.io/drain` label, then the
/// first applying MachineDrainRule, else evicted in group 0.
fn judge(pod: &PodView, node_unreachable: bool) -> Result<RuleSays, &'static str> {
    if let Some(for_s) = pod.deleting_for
        && node_unreachable
        && for_s > UNREACHABLE_POD_GRACE
    {
        return Err("terminating on an unreachable Node");
    }
    if pod.daemon_set && !pod.finished {
        return Err("DaemonSet pod");
    }
    if pod.mirror {
        return Err("mirror pod");
    }
    match pod.drain_label.as_deref().map(str::to_ascii_lowercase) {
        Some(v) if v == "skip" => return Err("cluster.x-k8s.io/drain=skip"),
        Some(v) if v.replacen('-', "", 1) == "waitcompleted" => {
            return Ok(RuleSays::WaitCompleted);
        }
        _ => {}
    }
    match pod.rule {
        Some(RuleSays::Skip) => Err("a MachineDrainRule says Skip"),
        Some(says) => Ok(says),
        None => Ok(RuleSays::Drain(0)),
    }
}

/// Plan the next round of a drain. Pods are drained group by group in
/// increasing order (a `WaitCompleted` pod belongs to group 0): the lowest
/// group with a pod left is evicted and awaited before the next one starts.
/// A `WaitCompleted` pod is never evicted and is done once it has finished
/// (Succeeded or Failed). Lists are sorted, so the order is stable.
pub fn plan_drain(pods: &[PodView], node_unreachable: bool) -> DrainPlan {
    let mut plan = DrainPlan::default();
    let judged: Vec<(&PodView, Result<RuleSays, &'static str>)> = pods
        .iter()
        .map(|p| (p, judge(p, node_unreachable)))
        .collect();
    let order = |says: &RuleSays| match says {
        RuleSays::Drain(order) => Some(*order),
        RuleSays::WaitCompleted => Some(0),
        RuleSays::Skip => None,
    };
    let active = |pod: &PodView, says: &RuleSays| {
        !(matches!(says, RuleSays::WaitCompleted) && pod.finished && pod.deleting_for.is_none())
    };
    let lowest = judged
        .iter()
        .filter_map(|(p, says)| says.as_ref().ok().filter(|s| active(p, s)))
        .filter_map(order)
        .min();
    for (pod, says) in judged {
        let key = (pod.namespace.clone(), pod.name.clone());
        let says = match says {
            Ok(says) => says,
            Err(why) => {
                plan.skipped.push((key.0, key.1, why));
                continue;
            }
        };
        if !active(pod, &says) {
            plan.skipped.push((key.0, key.1, "completed"));
        } else if order(&says) != lowest {
            plan.later.push(key);
        } else if pod.deleting_for.is_some() {
            plan.wait_for.push(key);
        } else if says == RuleSays::WaitCompleted {
            plan.wait_completed.push(key);
        } else {
            plan.evict.push(key);
        }
    }
    plan.evict.sort();
    plan.wait_for.sort();
    plan.wait_completed.sort();
    plan.later.sort();
    plan.skipped.sort();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pod(name: &str) -> PodView {
        PodView {
            namespace: "default".into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn hooks_hold_their_steps_and_the_drain_comes_between() {
        let mut v = DeletionView {
            pre_drain_hooks: vec!["backup".into()],
            pre_terminate_hooks: vec!["detach".into()],
            node: Some("n1".into()),
            ..Default::default()
        };
        assert_eq!(
            next_step(&v),
            DeletionStep::WaitForPreDrainHooks(vec!["backup".into()])
        );
        v.pre_drain_hooks.clear();
        assert_eq!(next_step(&v), DeletionStep::DrainNode("n1".into()));
        v.drain_complete = true;
        assert_eq!(
            next_step(&v),
            DeletionStep::WaitForVolumeDetach("n1".into())
        );
        v.volumes_detached = true;
        assert_eq!(
            next_step(&v),
            DeletionStep::WaitForPreTerminateHooks {
                hooks: vec!["detach".into()],
                drain_skipped: None
            }
        );
        v.pre_terminate_hooks.clear();
        assert_eq!(
            next_step(&v),
            DeletionStep::DeleteInstance {
                drain_skipped: None
            }
        );
    }

    #[test]
    fn the_drain_timeout_and_the_exclude_annotation_skip_the_drain() {
        let mut v = DeletionView {
            node: Some("n1".into()),
            drain_timeout: 30,
            drained_for: Some(29),
            volumes_detached: true,
            ..Default::default()
        };
        assert_eq!(next_step(&v), DeletionStep::DrainNode("n1".into()));
        v.drained_for = Some(30);
        let DeletionStep::DeleteInstance {
            drain_skipped: Some(why),
        } = next_step(&v)
        else {
            panic!("expected the instance to go")
        };
        assert!(why.contains("nodeDrainTimeoutSeconds (30s)"), "{why}");
        let forever = DeletionView {
            drain_timeout: 0,
            drained_for: Some(1_000_000),
            ..v.clone()
        };
        assert_eq!(next_step(&forever), DeletionStep::DrainNode("n1".into()));
        let excluded = DeletionView {
            exclude_draining: true,
            drained_for: None,
            ..v
        };
        assert!(matches!(
            next_step(&excluded),
            DeletionStep::DeleteInstance {
                drain_skipped: Some(_)
            }
        ));
        let no_node = DeletionView::default();
        assert_eq!(
            next_step(&no_node),
            DeletionStep::DeleteInstance {
                drain_skipped: None
            }
        );
    }

    #[test]
    fn daemonset_and_mirror_pods_stay_and_terminating_pods_are_awaited() {
        let pods = vec![
            PodView {
                daemon_set: true,
                ..pod("ds")
            },
            PodView {
                mirror: true,
                ..pod("static")
            },
            PodView {
                deleting_for: Some(5),
                ..pod("going")
            },
            pod("web-b"),
            pod("web-a"),
        ];
        let plan = plan_drain(&pods, false);
        assert_eq!(
            plan.evict,
            vec![
                ("default".to_string(), "web-a".to_string()),
                ("default".to_string(), "web-b".to_string())
            ]
        );
        assert_eq!(plan.wait_for, vec![("default".into(), "going".into())]);
        assert_eq!(plan.skipped.len(), 2);
        let unreachable = plan_drain(&pods, true);
        assert!(unreachable.wait_for.is_empty());
        assert_eq!(unreachable.skipped.len(), 3);
        assert!(!unreachable.complete());
        assert!(plan_drain(&pods[..2], false).complete());
    }

    #[test]
    fn groups_drain_in_increasing_order_and_each_waits_for_the_one_before() {
        let mut pods = vec![
            PodView {
                rule: Some(RuleSays::Drain(10)),
                ..pod("db")
            },
            PodView {
                rule: Some(RuleSays::Drain(-5)),
                ..pod("proxy")
            },
            pod("web"),
        ];
        let plan = plan_drain(&pods, false);
        assert_eq!(plan.evict, vec![("default".into(), "proxy".into())]);
        assert_eq!(plan.later.len(), 2);
        // Evicted but still terminating: the next group still waits.
        pods[1].deleting_for = Some(3);
        let plan = plan_drain(&pods, false);
        assert!(plan.evict.is_empty());
        assert_eq!(plan.wait_for, vec![("default".into(), "proxy".into())]);
        pods.remove(1);
        let plan = plan_drain(&pods, false);
        assert_eq!(plan.evict, vec![("default".into(), "web".into())]);
        assert_eq!(plan.later, vec![("default".into(), "db".into())]);
        pods.remove(1);
        assert_eq!(
            plan_drain(&pods, false).evict,
            vec![("default".into(), "db".into())]
        );
    }

    #[test]
    fn the_pod_label_overrides_rules_and_wait_completed_pods_are_awaited_not_evicted() {
        let mut job = PodView {
            drain_label: Some("wait-completed".into()),
            rule: Some(RuleSays::Drain(0)),
            ..pod("job")
        };
        let skipped = PodView {
            drain_label: Some("Skip".into()),
            rule: Some(RuleSays::Drain(0)),
            ..pod("agent")
        };
        let by_rule = PodView {
            rule: Some(RuleSays::Skip),
            ..pod("logger")
        };
        let later = PodView {
            rule: Some(RuleSays::Drain(1)),
            ..pod("db")
        };
        let pods = vec![job.clone(), skipped.clone(), by_rule.clone(), later.clone()];
        let plan = plan_drain(&pods, false);
        assert!(plan.evict.is_empty());
        assert_eq!(plan.wait_completed, vec![("default".into(), "job".into())]);
        assert_eq!(plan.later, vec![("default".into(), "db".into())]);
        assert_eq!(plan.skipped.len(), 2, "{plan:?}");
        // Finished: the drain goes on to the next group.
        job.finished = true;
        let plan = plan_drain(&[job, skipped, by_rule, later], false);
        assert_eq!(plan.evict, vec![("default".into(), "db".into())]);
        // An orphaned DaemonSet pod (its DaemonSet gone) is drained; a
        // finished one too.
        let orphan = plan_drain(&[pod("ds-orphan")], false);
        assert_eq!(orphan.evict.len(), 1);
        let finished = PodView {
            daemon_set: true,
            finished: true,
            ..pod("ds-done")
        };
        assert_eq!(plan_drain(&[finished], false).evict.len(), 1);
    }

    #[test]
    fn volumes_are_awaited_after_the_drain_until_detached_excluded_or_timed_out() {
        let mut v = DeletionView {
            node: Some("n1".into()),
            drain_complete: true,
            pre_terminate_hooks: vec!["h".into()],
            volume_detach_timeout: 20,
            volumes_waited_for: Some(19),
            ..Default::default()
        };
        assert_eq!(
            next_step(&v),
            DeletionStep::WaitForVolumeDetach("n1".into())
        );
        v.volumes_waited_for = Some(20);
        let DeletionStep::WaitForPreTerminateHooks {
            drain_skipped: Some(why),
            ..
        } = next_step(&v)
        else {
            panic!("expected the pre-terminate hooks next")
        };
        assert!(
            why.contains("nodeVolumeDetachTimeoutSeconds (20s)"),
            "{why}"
        );
        v.volumes_waited_for = Some(1);
        v.exclude_volume_wait = true;
        assert!(matches!(
            next_step(&v),
            DeletionStep::WaitForPreTerminateHooks {
                drain_skipped: Some(_),
                ..
            }
        ));
        v.exclude_volume_wait = false;
        v.volumes_detached = true;
        assert!(matches!(
            next_step(&v),
            DeletionStep::WaitForPreTerminateHooks {
                drain_skipped: None,
                ..
            }
        ));
    }

    #[test]
    fn volumes_of_pods_the_drain_left_are_not_waited_for() {
        let attached = [
            AttachedVolume {
                name: "pv-logs".into(),
                claim: Some("ops/logs".into()),
            },
            AttachedVolume {
                name: "pv-db".into(),
                claim: Some("app/db".into()),
            },
            AttachedVolume {
                name: "kubernetes.io/csi/x^unknown".into(),
                claim: None,
            },
            AttachedVolume {
                name: "pv-db".into(),
                claim: Some("app/db".into()),
            },
        ];
        let skipped = std::collections::BTreeSet::from(["ops/logs".to_string()]);
        assert_eq!(
            volumes_to_wait_for(&attached, &skipped),
            ["kubernetes.io/csi/x^unknown", "pv-db"]
        );
    }

    #[test]
    fn a_failing_node_delete_is_given_up_after_its_timeout_default_ten_seconds() {
        assert!(!give_up_node_deletion(9, None));
        assert!(give_up_node_deletion(10, None));
        assert!(!give_up_node_deletion(1_000_000, Some(0)));
        assert!(give_up_node_deletion(3, Some(3)));
    }

    proptest! {
        #[test]
        fn every_pod_is_in_exactly_one_list_and_daemons_are_never_evicted(
            flags in proptest::collection::vec((
                any::<bool>(), any::<bool>(), proptest::option::of(0i64..5), any::<bool>(),
                proptest::option::of(0usize..3), proptest::option::of(0u8..6),
            ), 0..30),
            unreachable in any::<bool>(),
        ) {
            let pods: Vec<PodView> = flags.iter().enumerate().map(|(i, (ds, mirror, deleting, finished, label, rule))| PodView {
                namespace: "ns".into(),
                name: format!("p{i}"),
                daemon_set: *ds,
                mirror: *mirror,
                deleting_for: *deleting,
                finished: *finished,
                drain_label: label.map(|l| ["skip", "wait-completed", "bogus"][l].to_string()),
                rule: rule.map(|r| match r { 0 => RuleSays::Skip, 1 => RuleSays::WaitCompleted, o => RuleSays::Drain(o as i32 - 3) }),
            }).collect();
            let plan = plan_drain(&pods, unreachable);
            prop_assert_eq!(
                plan.evict.len() + plan.wait_for.len() + plan.wait_completed.len() + plan.later.len() + plan.skipped.len(),
                pods.len()
            );
            let find = |name: &str| pods.iter().find(|p| p.name == name).unwrap();
            for (_, name) in &plan.evict {
                let p = find(name);
                prop_assert!((p.finished || !p.daemon_set) && !p.mirror && p.deleting_for.is_none());
                prop_assert!(p.drain_label.as_deref() != Some("skip") && p.drain_label.as_deref() != Some("wait-completed"));
                prop_assert!(p.drain_label.is_some() || !matches!(p.rule, Some(RuleSays::Skip | RuleSays::WaitCompleted)));
            }
            // Nothing of a higher group is evicted while a lower one has a pod left.
            let group = |name: &str| match (find(name).drain_label.as_deref(), find(name).rule) {
                (Some("wait-completed"), _) | (_, Some(RuleSays::WaitCompleted)) => 0,
                (_, Some(RuleSays::Drain(o))) => o,
                _ => 0,
            };
            for (_, evicted) in &plan.evict {
                for (_, waiting) in plan.wait_for.iter().chain(&plan.wait_completed).chain(&plan.evict) {
                    prop_assert_eq!(group(evicted), group(waiting));
                }
                for (_, later) in &plan.later {
                    prop_assert!(group(later) > group(evicted));
                }
            }
        }

        #[test]
        fn the_instance_never_goes_while_a_hook_or_an_unfinished_drain_holds(
            pre_drain in any::<bool>(), pre_terminate in any::<bool>(), node in any::<bool>(),
            exclude in any::<bool>(), complete in any::<bool>(), drained in proptest::option::of(0i64..100), timeout in 0i64..100,
        ) {
            let v = DeletionView {
                pre_drain_hooks: if pre_drain { vec!["a".into()] } else { vec![] },
                pre_terminate_hooks: if pre_terminate { vec!["b".into()] } else { vec![] },
                node: node.then(|| "n".into()),
                exclude_draining: exclude,
                drained_for: drained,
                drain_timeout: timeout,
                drain_complete: complete,
                volumes_detached: true,
                ..Default::default()
            };
            if let DeletionStep::DeleteInstance { .. } = next_step(&v) {
                prop_assert!(!pre_drain && !pre_terminate);
                let drain_over = !node || exclude || complete
                    || (timeout > 0 && drained.is_some_and(|d| d >= timeout));
                prop_assert!(drain_over);
            }
        }
    }
}
