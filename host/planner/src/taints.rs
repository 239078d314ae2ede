//! A Machine's taints carried to its Node, as Cluster API does
//! (`spec.taints`, propagation `Always` or `OnInitialization`).
//!
//! A Node's `spec.taints` is one atomic list that others (the node
//! lifecycle controller, admins, device plugins) also write, so the host
//! records the `Always` taints it put there in the Node's annotation
//! `cluster.x-k8s.io/taints-from-machine` and only ever adds, changes or
//! removes those; every other taint on the Node is kept as it is. Start
//! with [`carry`]; [`check`] refuses keys Kubernetes or Cluster API manage.

use std::collections::BTreeSet;

/// A taint as the Node holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (empty when none).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    /// The identity of a taint on a Node: key and effect.
    pub fn id(&self) -> String {
        format!("{}:{}", self.key, self.effect)
    }
}

/// A taint the Machine asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The taint.
    pub taint: Taint,
    /// `true`: kept on the Node for as long as the Machine has it
    /// (`Always`); `false`: set once, when the Node first joins
    /// (`OnInitialization`), then left to whoever removes it.
    pub always: bool,
}

/// What to write to the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The Node's whole new taint list.
    pub taints: Vec<Taint>,
    /// The record of the `Always` taints the host now owns there
    /// (`key:effect`, sorted, comma-separated).
    pub owned: String,
}

/// Key prefixes no Machine may set: Kubernetes' own (`node.kubernetes.io/…`
/// such as `unschedulable`, `not-ready`), the cloud node controller's, and
/// those Cluster API reserves for itself.
pub const RESERVED: &[&str] = &[
    "node.kubernetes.io/",
    "node.cloudprovider.kubernetes.io/",
    "node.cluster.x-k8s.io/uninitialized",
    "node.cluster.x-k8s.io/outdated-revision",
];

/// Why a Machine's taints cannot be carried, naming the first bad one
/// (`taints[i]`) and what to do.
pub fn check(wanted: &[Wanted]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for (i, w) in wanted.iter().enumerate() {
        let key = &w.taint.key;
        if key.is_empty() {
            return Err(format!("taints[{i}]: the key is empty"));
        }
        if let Some(prefix) = RESERVED.iter().find(|p| key.starts_with(*p)) {
            return Err(format!(
                "taints[{i}]: key {key} is managed by Kubernetes or Cluster API ({prefix}…); use a key of your own"
            ));
        }
        if !seen.insert(w.taint.id()) {
            return Err(format!(
                "taints[{i}]: {} appears twice (a key and effect may be set once)",
                w.taint.id()
            ));
        }
    }
    Ok(())
}

/// The Node's taints after carrying the Machine's, or `None` when nothing
/// changes. `recorded` is the Node's `taints-from-machine` annotation;
/// `joining` says the Node has just joined and its `OnInitialization`
/// taints are set now (the caller makes that happen once).
pub fn carry(
    node: &[Taint],
    wanted: &[Wanted],
    recorded: Option<&str>,
    joining: bool,
) -> Option<Change> {
    let owned_before: BTreeSet<&str> = recorded
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    let wanted_ids: BTreeSet<String> = wanted.iter().map(|w| w.taint.id()).collect();
    let mut taints: Vec<Taint> = node
        .iter()
        // A taint the host put there and the Machine no longer has goes;
        // one turned `OnInitialization` stays, no longer owned.
        .filter(|t| {
            let id = t.id();
            !owned_before.contains(id.as_str()) || wanted_ids.contains(&id)
        })
        .cloned()
        .collect();
    for w in wanted.iter().filter(|w| w.always || joining) {
        match taints.iter_mut().find(|t| t.id() == w.taint.id()) {
            // An `Always` taint's value is the Machine's; one set on
            // initialization is not overwritten later.
            Some(existing) if w.always => existing.value.clone_from(&w.taint.value),
            Some(_) => {}
            None => taints.push(w.taint.clone()),
        }
    }
    let owned: BTreeSet<String> = wanted
        .iter()
        .filter(|w| w.always)
        .map(|w| w.taint.id())
        .collect();
    let owned = owned.into_iter().collect::<Vec<_>>().join(",");
    let unchanged = taints == node && recorded.unwrap_or_default() == owned;
    (!unchanged).then_some(Change { taints, owned })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        }
    }

    fn always(key: &str, value: &str) -> Wanted {
        Wanted {
            taint: taint(key, value, "NoSchedule"),
            always: true,
        }
    }

    fn on_init(key: &str) -> Wanted {
        Wanted {
            taint: taint(key, "", "NoSchedule"),
            always: false,
        }
    }

    #[test]
    fn always_taints_are_added_kept_and_removed_others_stay() {
        let others = taint("node.kubernetes.io/not-ready", "", "NoExecute");
        let change = carry(
            std::slice::from_ref(&others),
            &[always("gpu", "true")],
            None,
            false,
        )
        .unwrap();
        assert_eq!(
            change.taints,
            [others.clone(), taint("gpu", "true", "NoSchedule")]
        );
        assert_eq!(change.owned, "gpu:NoSchedule");
        // In place: nothing to do.
        assert_eq!(
            carry(
                &change.taints,
                &[always("gpu", "true")],
                Some(&change.owned),
                false
            ),
            None
        );
        // Someone removed it: it comes back.
        let back = carry(
            std::slice::from_ref(&others),
            &[always("gpu", "true")],
            Some("gpu:NoSchedule"),
            false,
        );
        assert_eq!(back.unwrap().taints.len(), 2);
        // A new value replaces the old one.
        let changed = carry(
            &change.taints,
            &[always("gpu", "a100")],
            Some(&change.owned),
            false,
        );
        assert_eq!(changed.unwrap().taints[1].value, "a100");
        // Removed from the Machine: it leaves the Node, the others stay.
        let removed = carry(&change.taints, &[], Some(&change.owned), false).unwrap();
        assert_eq!(removed.taints, [others]);
        assert_eq!(removed.owned, "");
    }

    #[test]
    fn a_taint_the_host_did_not_put_there_is_never_removed() {
        let admins = taint("maintenance", "", "NoSchedule");
        assert_eq!(carry(std::slice::from_ref(&admins), &[], None, false), None);
        // The same key and effect as an admin's: the Machine's value wins
        // and the host owns it from then on, as Cluster API does.
        let change = carry(&[admins], &[always("maintenance", "x")], None, false).unwrap();
        assert_eq!(change.taints, [taint("maintenance", "x", "NoSchedule")]);
    }

    #[test]
    fn on_initialization_taints_are_set_once() {
        let change = carry(&[], &[on_init("driver")], None, true).unwrap();
        assert_eq!(change.taints, [taint("driver", "", "NoSchedule")]);
        assert_eq!(change.owned, "");
        // Removed by whoever installed the driver: not added again.
        assert_eq!(carry(&[], &[on_init("driver")], Some(""), false), None);
        // Turned from Always to OnInitialization: it stays, unowned.
        let on_node = [taint("gpu", "true", "NoSchedule")];
        let change = carry(&on_node, &[on_init("gpu")], Some("gpu:NoSchedule"), false).unwrap();
        assert_eq!(change.taints, on_node);
        assert_eq!(change.owned, "");
    }

    #[test]
    fn reserved_and_repeated_keys_are_refused() {
        let err = check(&[always("node.kubernetes.io/unschedulable", "")]).unwrap_err();
        assert!(
            err.contains("taints[0]") && err.contains("managed by Kubernetes"),
            "{err}"
        );
        let err = check(&[always("a", "1"), always("a", "2")]).unwrap_err();
        assert!(err.contains("taints[1]") && err.contains("twice"), "{err}");
        assert!(check(&[always("a", "1"), on_init("b")]).is_ok());
    }

    fn taints() -> impl Strategy<Value = Vec<Taint>> {
        proptest::collection::vec(
            (0..4usize, 0..2usize, 0..2usize).prop_map(|(k, v, e)| {
                taint(
                    &format!("k{k}"),
                    &format!("v{v}"),
                    ["NoSchedule", "NoExecute"][e],
                )
            }),
            0..5,
        )
        .prop_map(|mut ts| {
            let mut seen = BTreeSet::new();
            ts.retain(|t| seen.insert(t.id()));
            ts
        })
    }

    proptest! {
        #[test]
        fn carrying_twice_changes_nothing_more_and_never_touches_others(
            node in taints(),
            wanted in taints(),
            always_mask in any::<u8>(),
            recorded in proptest::collection::btree_set(0..4usize, 0..3),
            joining in any::<bool>(),
        ) {
            let wanted: Vec<Wanted> = wanted
                .into_iter()
                .enumerate()
                .map(|(i, taint)| Wanted { taint, always: always_mask & (1 << i) != 0 })
                .collect();
            let recorded = recorded
                .iter()
                .map(|k| format!("k{k}:NoSchedule"))
                .collect::<Vec<_>>()
                .join(",");
            let after = carry(&node, &wanted, Some(&recorded), joining)
                .map_or((node.clone(), recorded.clone()), |c| (c.taints, c.owned));
            // Idempotent.
            prop_assert_eq!(carry(&after.0, &wanted, Some(&after.1), false), None);
            // Every Always taint is there with its value.
            for w in wanted.iter().filter(|w| w.always) {
                prop_assert!(after.0.contains(&w.taint));
            }
            // A taint neither recorded nor wanted is kept as it was.
            let wanted_ids: BTreeSet<String> = wanted.iter().map(|w| w.taint.id()).collect();
            for t in &node {
                if !recorded.split(',').any(|r| r == t.id()) && !wanted_ids.contains(&t.id()) {
                    prop_assert!(after.0.contains(t));
                }
            }
        }
    }
}
