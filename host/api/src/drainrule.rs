//! `MachineDrainRule`: how the pods on a deleting machine's Node are
//! drained — evicted in order, skipped, or waited for until they complete.
//! Cluster API v1beta2's kind, fields and rules: a rule applies to the
//! machines of its namespace its `machines` selectors pick and to the pods
//! its `pods` selectors pick; the first applying rule by name decides, and
//! the pod label `cluster.x-k8s.io/drain` overrides every rule.

use crate::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Pod label that overrides every MachineDrainRule for that pod: `skip`
/// (never evicted, not waited for) or `wait-completed` (never evicted,
/// waited for until it completes). Cluster API's key and values.
pub const LABEL_POD_DRAIN: &str = "cluster.x-k8s.io/drain";

/// How the pods a rule applies to are drained.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "MachineDrainRule",
    namespaced,
    shortname = "mdr",
    derive = "PartialEq",
    derive = "Default",
    doc = "How the pods on a deleting machine's Node are drained: in order, skipped, or waited for.",
    printcolumn(
        name = "Behavior",
        type_ = "string",
        json_path = ".spec.drain.behavior"
    ),
    printcolumn(name = "Order", type_ = "integer", json_path = ".spec.drain.order"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDrainRuleSpec {
    /// What happens to the pods the rule applies to.
    pub drain: DrainRuleDrain,
    /// The machines (of the rule's namespace) it applies to; any selector
    /// matching is enough. Unset: every machine in the namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<DrainRuleMachines>,
    /// The pods it applies to; any selector matching is enough. Unset:
    /// every pod on the Node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<DrainRulePods>,
}

/// What happens to the pods a rule applies to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainRuleDrain {
    /// `Drain` (evicted, in `order`), `Skip` (left alone) or
    /// `WaitCompleted` (never evicted; the drain waits until it completes).
    pub behavior: DrainBehavior,
    /// With `Drain`: pods are evicted group by group in increasing order,
    /// each group once the previous one is gone. Unset: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i32>,
}

/// How a pod is drained.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DrainBehavior {
    /// Evicted.
    #[default]
    Drain,
    /// Left alone.
    Skip,
    /// Never evicted; the drain waits until it completes.
    WaitCompleted,
}

/// Machines a rule applies to: both selectors must match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainRuleMachines {
    /// The machines' labels. Unset or empty: every machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Pods a rule applies to: both selectors must match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainRulePods {
    /// The pods' labels. Unset or empty: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The labels of the pods' namespaces. Unset or empty: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

type Labels = BTreeMap<String, String>;

/// An unset or empty selector matches everything here (Cluster API's rule
/// for drain rules; a MachineSet's empty selector matches nothing).
fn matches_or_unset(selector: Option<&LabelSelector>, labels: &Labels) -> bool {
    selector.is_none_or(|s| {
        let empty = s.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && s.match_expressions.as_ref().is_none_or(|e| e.is_empty());
        empty || crate::selector_matches(s, labels)
    })
}

impl MachineDrainRule {
    /// Whether the rule applies to a machine with these labels.
    pub fn applies_to_machine(&self, machine_labels: &Labels) -> bool {
        self.spec.machines.is_empty()
            || self
                .spec
                .machines
                .iter()
                .any(|m| matches_or_unset(m.selector.as_ref(), machine_labels))
    }

    /// Whether the rule applies to a pod with these labels, in a namespace
    /// with these labels.
    pub fn applies_to_pod(&self, pod_labels: &Labels, namespace_labels: &Labels) -> bool {
        self.spec.pods.is_empty()
            || self.spec.pods.iter().any(|p| {
                matches_or_unset(p.selector.as_ref(), pod_labels)
                    && matches_or_unset(p.namespace_selector.as_ref(), namespace_labels)
            })
    }

    /// Whether any pod selector looks at namespace labels (only then are
    /// the Namespaces read).
    pub fn selects_namespaces(&self) -> bool {
        self.spec
            .pods
            .iter()
            .any(|p| p.namespace_selector.is_some())
    }

    /// Why the rule cannot be used, if it cannot: Cluster API refuses an
    /// `order` with any behavior but `Drain`.
    pub fn invalid(&self) -> Option<String> {
        (self.spec.drain.behavior != DrainBehavior::Drain && self.spec.drain.order.is_some())
            .then(|| {
                format!(
                    "MachineDrainRule {}: spec.drain.order is only allowed with behavior Drain, not {:?}; remove the order",
                    kube::ResourceExt::name_any(self),
                    self.spec.drain.behavior
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        })
    }

    #[test]
    fn unset_selectors_apply_to_everything_and_set_ones_are_ored_across_and_anded_within() {
        let mut rule = MachineDrainRule::new("r", MachineDrainRuleSpec::default());
        assert!(rule.applies_to_machine(&labels(&[])));
        assert!(rule.applies_to_pod(&labels(&[]), &labels(&[])));
        rule.spec.machines = vec![
            DrainRuleMachines {
                selector: selector(&[("pool", "a")]),
            },
            DrainRuleMachines {
                selector: selector(&[("pool", "b")]),
            },
        ];
        assert!(rule.applies_to_machine(&labels(&[("pool", "b")])));
        assert!(!rule.applies_to_machine(&labels(&[("pool", "c")])));
        rule.spec.pods = vec![DrainRulePods {
            selector: selector(&[("app", "db")]),
            namespace_selector: selector(&[("tier", "data")]),
        }];
        assert!(rule.applies_to_pod(&labels(&[("app", "db")]), &labels(&[("tier", "data")])));
        assert!(!rule.applies_to_pod(&labels(&[("app", "db")]), &labels(&[("tier", "web")])));
        assert!(rule.selects_namespaces());
        // An empty selector (no labels, no expressions) matches everything.
        rule.spec.pods[0].selector = Some(LabelSelector::default());
        assert!(rule.applies_to_pod(&labels(&[]), &labels(&[("tier", "data")])));
    }

    #[test]
    fn an_order_with_a_behavior_other_than_drain_is_refused() {
        let mut rule = MachineDrainRule::new("r", MachineDrainRuleSpec::default());
        rule.spec.drain.order = Some(5);
        assert!(rule.invalid().is_none());
        rule.spec.drain.behavior = DrainBehavior::Skip;
        assert!(rule.invalid().unwrap().contains("spec.drain.order"));
    }
}
