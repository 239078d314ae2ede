//! Deleting a machine, step by step: pre-drain hooks, draining its Node,
//! pre-terminate hooks, then the instance. [`next_step`] says which step a
//! deleting machine is at; [`plan_drain`] says which pods to evict next and
//! which to wait for. The Machine controller executes the step and asks
//! again, so a restart resumes where the API says the machine is.

/// What the deletion steps depend on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeletionView {
    /// Pre-drain hook names still present (annotation suffixes).
    pub pre_drain_hooks: Vec<String>,
    /// Pre-terminate hook names still present.
    pub pre_terminate_hooks: Vec<String>,
    /// The Node to drain, if the machine has one that still exists.
    pub node: Option<String>,
    /// `machine.capstan.dev/exclude-node-draining` is set.
    pub exclude_draining: bool,
    /// Seconds the drain has run so far (`None`: not started).
    pub drained_for: Option<i64>,
    /// `deletion.nodeDrainTimeoutSeconds` (0: no limit).
    pub drain_timeout: i64,
    /// The drain is behind the machine: it found nothing left to evict or
    /// wait for, or an earlier pass already went past it.
    pub drain_complete: bool,
}

/// The step a deleting machine is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionStep {
    /// Held until these pre-drain hook annotations are removed.
    WaitForPreDrainHooks(Vec<String>),
    /// Cordon and drain this Node.
    DrainNode(String),
    /// Held until these pre-terminate hook annotations are removed.
    WaitForPreTerminateHooks {
        /// The hooks still present.
        hooks: Vec<String>,
        /// Why the drain was skipped or cut short, if it was.
        drain_skipped: Option<String>,
    },
    /// Delete the instance (then the Node object, then the finalizer).
    DeleteInstance {
        /// Why the drain was skipped or cut short, if it was.
        drain_skipped: Option<String>,
    },
}

/// The step a deleting machine is at now.
pub fn next_step(view: &DeletionView) -> DeletionStep {
    if !view.pre_drain_hooks.is_empty() {
        return DeletionStep::WaitForPreDrainHooks(view.pre_drain_hooks.clone());
    }
    let mut drain_skipped = None;
    match &view.node {
        None => {}
        Some(_) if view.drain_complete => {}
        Some(_) if view.exclude_draining => {
            drain_skipped = Some("the machine has the exclude-node-draining annotation".into());
        }
        Some(node) => {
            let timed_out =
                view.drain_timeout > 0 && view.drained_for.is_some_and(|d| d >= view.drain_timeout);
            if !timed_out {
                return DeletionStep::DrainNode(node.clone());
            }
            drain_skipped = Some(format!(
                "draining Node {node} did not finish within nodeDrainTimeoutSeconds ({}s)",
                view.drain_timeout
            ));
        }
    }
    if !view.pre_terminate_hooks.is_empty() {
        return DeletionStep::WaitForPreTerminateHooks {
            hooks: view.pre_terminate_hooks.clone(),
            drain_skipped,
        };
    }
    DeletionStep::DeleteInstance { drain_skipped }
}

/// A pod on the Node being drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Controlled by a DaemonSet (its controller would put it right back).
    pub daemon_set: bool,
    /// A static pod's mirror (the API cannot remove it).
    pub mirror: bool,
    /// Seconds since its deletion started (`None`: not being deleted).
    pub deleting_for: Option<i64>,
}

/// What draining does next.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainPlan {
    /// Pods to evict now (`namespace/name`).
    pub evict: Vec<(String, String)>,
    /// Pods already evicted, whose removal is awaited.
    pub wait_for: Vec<(String, String)>,
    /// Pods left alone, and why.
    pub skipped: Vec<(String, String, &'static str)>,
}

impl DrainPlan {
    /// Nothing left to evict or wait for.
    pub fn complete(&self) -> bool {
        self.evict.is_empty() && self.wait_for.is_empty()
    }
}

/// Seconds after which a terminating pod on an unreachable Node is no
/// longer waited for: no kubelet will ever remove it (Cluster API's rule).
pub const UNREACHABLE_POD_GRACE: i64 = 1;

/// Plan the next round of a drain: evict every pod that is not a DaemonSet
/// pod or a mirror pod; wait for pods being deleted, except on an
/// unreachable Node, where pods deleted more than
/// [`UNREACHABLE_POD_GRACE`] seconds ago are skipped. Sorted, so the order
/// is stable.
pub fn plan_drain(pods: &[PodView], node_unreachable: bool) -> DrainPlan {
    let mut plan = DrainPlan::default();
    for pod in pods {
        let key = (pod.namespace.clone(), pod.name.clone());
        if pod.daemon_set {
            plan.skipped.push((key.0, key.1, "DaemonSet pod"));
        } else if pod.mirror {
            plan.skipped.push((key.0, key.1, "mirror pod"));
        } else if let Some(for_s) = pod.deleting_for {
            if node_unreachable && for_s > UNREACHABLE_POD_GRACE {
                plan.skipped
                    .push((key.0, key.1, "terminating on an unreachable Node"));
            } else {
                plan.wait_for.push(key);
            }
        } else {
            plan.evict.push(key);
        }
    }
    plan.evict.sort();
    plan.wait_for.sort();
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
            daemon_set: false,
            mirror: false,
            deleting_for: None,
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

    proptest! {
        #[test]
        fn every_pod_is_in_exactly_one_list_and_daemons_are_never_evicted(
            flags in proptest::collection::vec((any::<bool>(), any::<bool>(), proptest::option::of(0i64..5)), 0..30),
            unreachable in any::<bool>(),
        ) {
            let pods: Vec<PodView> = flags.iter().enumerate().map(|(i, (ds, mirror, deleting))| PodView {
                namespace: "ns".into(),
                name: format!("p{i}"),
                daemon_set: *ds,
                mirror: *mirror,
                deleting_for: *deleting,
            }).collect();
            let plan = plan_drain(&pods, unreachable);
            prop_assert_eq!(plan.evict.len() + plan.wait_for.len() + plan.skipped.len(), pods.len());
            for (_, name) in &plan.evict {
                let p = pods.iter().find(|p| &p.name == name).unwrap();
                prop_assert!(!p.daemon_set && !p.mirror && p.deleting_for.is_none());
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
