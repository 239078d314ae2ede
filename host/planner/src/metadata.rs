//! Template metadata carried to existing objects in place: a template's
//! labels and annotations reach the machines made from it without a
//! rollout (Cluster API propagates them the same way), and a key removed
//! from the template is removed from them — but only a key the template
//! put there, never one a user or another controller added.
//!
//! [`carry`] says what to change on one object. What the template put
//! there is recorded on the object itself ([`Carried`]), so the decision
//! needs nothing but the two objects.

use std::collections::BTreeMap;

type Map = BTreeMap<String, String>;

/// The keys a template put on an object, as recorded on it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Carried {
    /// Label keys.
    pub labels: Vec<String>,
    /// Annotation keys.
    pub annotations: Vec<String>,
}

impl Carried {
    /// The record as stored (one annotation value): `labels` and
    /// `annotations` as sorted key lists.
    pub fn to_json(&self) -> String {
        serde_json::json!({ "labels": self.labels, "annotations": self.annotations }).to_string()
    }

    /// Read a stored record; `None` when absent or unreadable (then only
    /// the template's current keys count as carried).
    pub fn from_json(value: Option<&str>) -> Option<Carried> {
        let v: serde_json::Value = serde_json::from_str(value?).ok()?;
        let keys = |field: &str| -> Option<Vec<String>> {
            v.get(field)?
                .as_array()?
                .iter()
                .map(|k| k.as_str().map(str::to_string))
                .collect()
        };
        Some(Carried {
            labels: keys("labels")?,
            annotations: keys("annotations")?,
        })
    }

    /// What a template carries.
    pub fn of(labels: &Map, annotations: &Map) -> Carried {
        Carried {
            labels: labels.keys().cloned().collect(),
            annotations: annotations.keys().cloned().collect(),
        }
    }
}

/// Changes to one object's metadata: `Some(value)` sets a key, `None`
/// removes it (a JSON merge patch's `null`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataChange {
    /// Label changes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes.
    pub annotations: BTreeMap<String, Option<String>>,
    /// The new record of what the template carries (to store with them).
    pub carried: Carried,
}

/// What makes an object's labels and annotations carry the template's:
/// every template key set to the template's value, every key the template
/// carried before (`recorded`) but no longer has removed. `None`: nothing
/// to change (the record included).
pub fn carry(
    template_labels: &Map,
    template_annotations: &Map,
    labels: &Map,
    annotations: &Map,
    recorded: Option<&Carried>,
) -> Option<MetadataChange> {
    let carried = Carried::of(template_labels, template_annotations);
    let diff = |template: &Map, current: &Map, before: Option<&Vec<String>>| {
        let mut changes = BTreeMap::new();
        for (k, v) in template {
            if current.get(k) != Some(v) {
                changes.insert(k.clone(), Some(v.clone()));
            }
        }
        for k in before.into_iter().flatten() {
            if !template.contains_key(k) && current.contains_key(k) {
                changes.insert(k.clone(), None);
            }
        }
        changes
    };
    let change = MetadataChange {
        labels: diff(template_labels, labels, recorded.map(|r| &r.labels)),
        annotations: diff(
            template_annotations,
            annotations,
            recorded.map(|r| &r.annotations),
        ),
        carried,
    };
    let unchanged = change.labels.is_empty()
        && change.annotations.is_empty()
        && recorded == Some(&change.carried);
    (!unchanged).then_some(change)
}

/// The Machine labels Cluster API keeps on the machine's Node: keys under
/// `node-role.kubernetes.io`, and the domains `node-restriction.kubernetes.io`
/// and `node.cluster.x-k8s.io` (and their subdomains).
pub fn node_managed_labels(machine_labels: &Map) -> Map {
    let managed = |key: &str| {
        let domain = key.split('/').next().unwrap_or_default();
        let under = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
        domain == "node-role.kubernetes.io"
            || under("node-restriction.kubernetes.io")
            || under("node.cluster.x-k8s.io")
    };
    machine_labels
        .iter()
        .filter(|(k, _)| managed(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// What to change on a Node so it carries its machine's managed labels
/// ([`node_managed_labels`]) that an admin `granted` (keys, or prefixes
/// ending in `/`); `recorded` is the Node's
/// `cluster.x-k8s.io/labels-from-machine` annotation (comma-separated keys,
/// Cluster API's record), so a label removed from the machine is removed
/// from the Node and labels others put there stay. The change's record is
/// [`MetadataChange::carried`]`.labels`, joined with commas.
pub fn carry_to_node(
    machine_labels: &Map,
    node_labels: &Map,
    recorded: Option<&str>,
    granted: &[String],
) -> Option<MetadataChange> {
    let recorded = recorded.map(|r| Carried {
        labels: r
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect(),
        annotations: vec![],
    });
    let allowed = |key: &str| {
        granted.iter().any(|g| {
            if g.ends_with('/') {
                key.starts_with(g.as_str())
            } else {
                key == g
            }
        })
    };
    let mut carried = node_managed_labels(machine_labels);
    carried.retain(|k, _| allowed(k));
    // Nothing to carry and nothing carried before: not even a record.
    if carried.is_empty() && recorded.is_none() {
        return None;
    }
    carry(
        &carried,
        &Map::new(),
        node_labels,
        &Map::new(),
        recorded.as_ref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> Map {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn template_keys_are_set_and_only_keys_the_template_put_there_are_removed() {
        let before = Carried {
            labels: vec!["team".into(), "tier".into()],
            annotations: vec![],
        };
        let change = carry(
            &map(&[("team", "b"), ("zone", "z1")]),
            &map(&[("note", "hi")]),
            &map(&[("team", "a"), ("tier", "web"), ("owner", "ops")]),
            &map(&[]),
            Some(&before),
        )
        .unwrap();
        assert_eq!(
            change.labels,
            BTreeMap::from([
                ("team".to_string(), Some("b".to_string())),
                ("tier".to_string(), None),
                ("zone".to_string(), Some("z1".to_string())),
            ]),
            "owner was never the template's: it stays"
        );
        assert_eq!(
            change.annotations,
            BTreeMap::from([("note".to_string(), Some("hi".to_string()))])
        );
        assert_eq!(change.carried.labels, ["team", "zone"]);
    }

    #[test]
    fn an_object_that_carries_the_template_and_its_record_needs_nothing() {
        let labels = map(&[("team", "b")]);
        let carried = Carried::of(&labels, &Map::new());
        assert_eq!(
            carry(&labels, &Map::new(), &labels, &Map::new(), Some(&carried)),
            None
        );
        // Without a record, only the record is written.
        let change = carry(&labels, &Map::new(), &labels, &Map::new(), None).unwrap();
        assert!(change.labels.is_empty() && change.annotations.is_empty());
        assert_eq!(
            Carried::from_json(Some(&change.carried.to_json())),
            Some(change.carried)
        );
        assert_eq!(Carried::from_json(Some("not json")), None);
    }

    #[test]
    fn only_cluster_api_managed_labels_reach_the_node_and_removed_ones_leave_it() {
        let machine = map(&[
            ("node-role.kubernetes.io/worker", ""),
            ("node.cluster.x-k8s.io/pool", "a"),
            ("team.node.cluster.x-k8s.io/name", "x"),
            ("node-restriction.kubernetes.io/zone", "z"),
            ("app", "web"),
            ("notnode.cluster.x-k8s.io.evil/x", "no"),
        ]);
        assert_eq!(node_managed_labels(&machine).len(), 4);
        let node = map(&[
            ("kubernetes.io/hostname", "n1"),
            ("node.cluster.x-k8s.io/old", "1"),
        ]);
        let all = [
            "node-role.kubernetes.io/".to_string(),
            "node.cluster.x-k8s.io/".to_string(),
            "team.node.cluster.x-k8s.io/name".to_string(),
            "node-restriction.kubernetes.io/".to_string(),
        ];
        let change =
            carry_to_node(&machine, &node, Some("node.cluster.x-k8s.io/old"), &all).unwrap();
        assert_eq!(change.labels.len(), 5, "{change:?}");
        assert_eq!(change.labels["node.cluster.x-k8s.io/old"], None);
        assert!(!change.labels.contains_key("kubernetes.io/hostname"));
        assert!(!change.labels.contains_key("app"));
        assert_eq!(change.carried.labels.len(), 4);
        // Only what is granted: a tenant's machine cannot make its Node a
        // control-plane node, and an ungranted label is taken back off.
        let pools_only = ["node.cluster.x-k8s.io/pool".to_string()];
        let change = carry_to_node(
            &machine,
            &node,
            Some("node-role.kubernetes.io/worker"),
            &pools_only,
        )
        .unwrap();
        assert_eq!(change.carried.labels, ["node.cluster.x-k8s.io/pool"]);
        assert!(
            !change
                .labels
                .contains_key("node-restriction.kubernetes.io/zone")
        );
        assert_eq!(carry_to_node(&machine, &node, None, &[]), None, "no write");
    }

    proptest! {
        #[test]
        fn after_the_change_the_object_has_the_template_and_keeps_what_is_not_the_templates(
            template in proptest::collection::btree_map("[a-d]", "[xy]", 0..4),
            current in proptest::collection::btree_map("[a-f]", "[xyz]", 0..6),
            before in proptest::collection::vec("[a-f]", 0..6),
        ) {
            let recorded = Carried { labels: before.clone(), annotations: vec![] };
            let mut after = current.clone();
            if let Some(change) = carry(&template, &Map::new(), &current, &Map::new(), Some(&recorded)) {
                for (k, v) in change.labels {
                    match v {
                        Some(v) => { after.insert(k, v); }
                        None => { after.remove(&k); }
                    }
                }
            }
            for (k, v) in &template {
                prop_assert_eq!(after.get(k), Some(v));
            }
            for (k, v) in &current {
                if !template.contains_key(k) && !before.contains(k) {
                    prop_assert_eq!(after.get(k), Some(v), "not the template's: kept");
                }
            }
        }
    }
}

/// The annotations Cluster API keeps on a machine's Node so tools can go
/// from the Node to its Machine: `cluster.x-k8s.io/machine`,
/// `…/owner-kind` and `…/owner-name` (the Machine's controller, usually its
/// MachineSet), `…/cluster-namespace`, and `…/cluster-name` where the
/// machine has a cluster. `capstan.dev/machine`, `…/cluster-namespace` and
/// `…/cluster-name` too: the cluster-autoscaler's clusterapi provider,
/// pointed at Capstan (`CAPI_GROUP=capstan.dev`), reads the keys under that
/// group. Returns the ones the Node lacks or has otherwise, or `None` when
/// it carries them all.
pub fn node_annotations(
    machine: &str,
    namespace: &str,
    cluster: Option<&str>,
    owner: Option<(&str, &str)>,
    current: &Map,
) -> Option<Map> {
    let mut wanted = Map::new();
    for group in ["cluster.x-k8s.io", "capstan.dev"] {
        wanted.insert(format!("{group}/machine"), machine.to_string());
        wanted.insert(format!("{group}/cluster-namespace"), namespace.to_string());
        if let Some(cluster) = cluster {
            wanted.insert(format!("{group}/cluster-name"), cluster.into());
        }
    }
    if let Some((kind, name)) = owner {
        wanted.insert("cluster.x-k8s.io/owner-kind".into(), kind.into());
        wanted.insert("cluster.x-k8s.io/owner-name".into(), name.into());
    }
    let missing: Map = wanted
        .into_iter()
        .filter(|(k, v)| current.get(k) != Some(v))
        .collect();
    (!missing.is_empty()).then_some(missing)
}

#[cfg(test)]
mod node_annotation_tests {
    use super::*;

    #[test]
    fn nodes_point_back_to_their_machine_as_in_cluster_api() {
        let wanted = node_annotations(
            "pool-abc",
            "default",
            Some("prod"),
            Some(("MachineSet", "pool-5d8")),
            &Map::new(),
        )
        .unwrap();
        assert_eq!(wanted["cluster.x-k8s.io/machine"], "pool-abc");
        assert_eq!(wanted["cluster.x-k8s.io/cluster-namespace"], "default");
        assert_eq!(wanted["cluster.x-k8s.io/cluster-name"], "prod");
        assert_eq!(wanted["cluster.x-k8s.io/owner-kind"], "MachineSet");
        assert_eq!(wanted["cluster.x-k8s.io/owner-name"], "pool-5d8");
        // The autoscaler with CAPI_GROUP=capstan.dev reads these.
        assert_eq!(wanted["capstan.dev/machine"], "pool-abc");
        assert_eq!(wanted["capstan.dev/cluster-namespace"], "default");
        assert_eq!(wanted["capstan.dev/cluster-name"], "prod");
        // Already there: nothing to write.
        assert_eq!(
            node_annotations(
                "pool-abc",
                "default",
                Some("prod"),
                Some(("MachineSet", "pool-5d8")),
                &wanted
            ),
            None
        );
        // No cluster, no owner: only what applies.
        let bare = node_annotations("m", "ns", None, None, &Map::new()).unwrap();
        assert_eq!(bare.len(), 4);
    }
}
