//! In-place updates: which fields of a machine change, which updater claims
//! which of them, and what is left for nobody.
//!
//! Start with [`changed_fields`] (the dotted paths that differ between the
//! machine's spec and the new template's) and [`Planner`], which the
//! controller feeds with each eligible updater's `can-update` answer, in
//! [`order`], and which keeps every updater to the fields it declared and
//! to fields nobody before it claimed. The result is a [`MachinePlan`]:
//! steps (updater and fields, run in order) and the unclaimed remainder. A
//! machine is updated in place only when nothing remains unclaimed.

use capstan_manifest::{FieldPattern, path_segment};

/// Fields no updater may ever claim: a Machine changes its provider or
/// its cluster only by being replaced.
pub const NEVER_IN_PLACE: &[&str] = &["provider.plugin", "clusterName"];
use serde_json::Value;

/// The Machine spec fields (JSON names) that, as in Cluster API, change on
/// existing sets and machines as they are, with no rollout and no updater:
/// they tell the host how to treat the machine, not what the machine is.
pub const CARRIED_IN_PLACE: &[&str] = &["deletion", "taints", "minReadySeconds", "readinessGates"];

/// The dotted paths at which two Machine specs (as JSON objects) differ:
/// leaves of objects are compared one by one (`provider.config.tags.team`),
/// anything else (strings, numbers, arrays) as a whole. The
/// [`CARRIED_IN_PLACE`] fields are left out.
pub fn changed_fields(current: &Value, desired: &Value) -> Vec<String> {
    let mut out = vec![];
    diff("", current, desired, &mut out);
    out.retain(|p| {
        !CARRIED_IN_PLACE
            .iter()
            .any(|f| p == f || p.starts_with(&format!("{f}.")))
    });
    out.sort();
    out
}

fn diff(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    // Keys holding dots (label-like keys) are escaped, so a path splits
    // back into exactly its keys.
    let join = |key: &str| {
        if prefix.is_empty() {
            path_segment(key)
        } else {
            format!("{prefix}.{}", path_segment(key))
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let null = Value::Null;
                let (va, vb) = (x.get(key).unwrap_or(&null), y.get(key).unwrap_or(&null));
                diff(&join(key), va, vb, out);
            }
        }
        // A field that appears or disappears as a whole object: each of
        // its leaves changed.
        (Value::Object(x), Value::Null) | (Value::Null, Value::Object(x)) if !x.is_empty() => {
            for (key, v) in x {
                let (va, vb) = if matches!(a, Value::Null) {
                    (&Value::Null, v)
                } else {
                    (v, &Value::Null)
                };
                diff(&join(key), va, vb, out);
            }
        }
        _ if a == b => {}
        _ => out.push(prefix.to_string()),
    }
}

/// An updater as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Updater {
    /// Plugin name.
    pub name: String,
    /// `spec.updateOrder` of its Plugin, if set.
    pub order: Option<i32>,
    /// The fields its manifest declares.
    pub fields: Vec<FieldPattern>,
}

/// The order updaters are asked in: by `updateOrder` (unset last), then by
/// name, so every host and every reconcile asks in the same order.
pub fn order(updaters: &mut [Updater]) {
    updaters.sort_by(|a, b| {
        (a.order.unwrap_or(i32::MAX), &a.name).cmp(&(b.order.unwrap_or(i32::MAX), &b.name))
    });
}

/// One step of a plan: an updater and the fields it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Plugin name.
    pub updater: String,
    /// Fields it claimed.
    pub fields: Vec<String>,
}

/// The plan for one machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MachinePlan {
    /// Updaters in the order they run, with the fields each claimed.
    pub steps: Vec<Step>,
    /// Changed fields no updater claimed.
    pub unclaimed: Vec<String>,
}

impl MachinePlan {
    /// Whether the whole change can be made in place (a change of
    /// labels or annotations only has no fields and needs no updater).
    pub fn in_place(&self) -> bool {
        self.unclaimed.is_empty()
    }
}

/// Builds a [`MachinePlan`] from `can-update` answers, one updater at a time.
#[derive(Debug, Clone)]
pub struct Planner {
    plan: MachinePlan,
}

/// What [`Planner::claim`] did with one updater's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claimed {
    /// Fields it now owns in the plan.
    pub accepted: Vec<String>,
    /// Fields it answered but may not have: outside its declaration, not
    /// changed, or already claimed by an earlier updater (to be logged).
    pub ignored: Vec<String>,
}

impl Planner {
    /// Start with the changed fields, all unclaimed.
    pub fn new(changed: Vec<String>) -> Self {
        Planner {
            plan: MachinePlan {
                steps: vec![],
                unclaimed: changed,
            },
        }
    }

    /// The fields nobody has claimed yet: what the next updater is offered.
    pub fn remaining(&self) -> &[String] {
        &self.plan.unclaimed
    }

    /// Record `updater`'s answer, keeping only fields it declared (as far as
    /// granted) that are still unclaimed, and never [`NEVER_IN_PLACE`].
    pub fn claim(&mut self, updater: &Updater, answer: &[String]) -> Claimed {
        let mut claimed = Claimed::default();
        for field in answer {
            let declared = updater.fields.iter().any(|p| p.matches(field))
                && !NEVER_IN_PLACE.contains(&field.as_str());
            if declared && self.plan.unclaimed.contains(field) && !claimed.accepted.contains(field)
            {
                claimed.accepted.push(field.clone());
            } else if !claimed.ignored.contains(field) && !claimed.accepted.contains(field) {
                claimed.ignored.push(field.clone());
            }
        }
        if !claimed.accepted.is_empty() {
            claimed.accepted.sort();
            self.plan
                .unclaimed
                .retain(|f| !claimed.accepted.contains(f));
            self.plan.steps.push(Step {
                updater: updater.name.clone(),
                fields: claimed.accepted.clone(),
            });
        }
        claimed
    }

    /// The finished plan.
    pub fn finish(self) -> MachinePlan {
        self.plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};
    use serde_json::json;

    fn updater(name: &str, order: Option<i32>, fields: &[&str]) -> Updater {
        Updater {
            name: name.into(),
            order,
            fields: fields.iter().map(|f| f.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn provider_and_cluster_changes_are_never_claimed_and_dotted_keys_are_escaped() {
        let mut planner = Planner::new(vec![
            "clusterName".into(),
            "provider.plugin".into(),
            "version".into(),
        ]);
        let greedy = updater("greedy", None, &["provider.*", "clusterName", "version"]);
        let claimed = planner.claim(
            &greedy,
            &[
                "provider.plugin".into(),
                "clusterName".into(),
                "version".into(),
            ],
        );
        assert_eq!(claimed.accepted, ["version"]);
        assert_eq!(
            planner.finish().unclaimed,
            ["clusterName", "provider.plugin"]
        );

        let a = json!({"provider": {"config": {"tags": {"example.com/team": "a"}}}});
        let b = json!({"provider": {"config": {"tags": {"example.com/team": "b"}}}});
        assert_eq!(
            changed_fields(&a, &b),
            ["provider.config.tags.example\\.com/team"]
        );
    }

    #[test]
    fn changed_fields_are_leaf_paths() {
        let a = json!({"version": "v1.30.0", "provider": {"plugin": "sim", "config": {"endpoint": "e", "tags": {"team": "a", "old": "x"}}}, "deletion": {"nodeDrainTimeoutSeconds": 5}});
        let b = json!({"version": "v1.31.0", "provider": {"plugin": "sim", "config": {"endpoint": "e", "tags": {"team": "b", "env": "prod"}, "instanceType": "large"}}});
        assert_eq!(
            changed_fields(&a, &b),
            vec![
                "provider.config.instanceType",
                "provider.config.tags.env",
                "provider.config.tags.old",
                "provider.config.tags.team",
                "version"
            ]
        );
        assert!(changed_fields(&a, &a).is_empty());
        // A whole new object: each of its leaves.
        let c = json!({"version": "v1.30.0", "provider": {"plugin": "sim", "config": {"endpoint": "e", "tags": {"team": "a", "old": "x"}, "extra": {"a": 1, "b": [1]}}}});
        assert_eq!(
            changed_fields(&a, &c),
            vec!["provider.config.extra.a", "provider.config.extra.b"]
        );
    }

    #[test]
    fn updaters_claim_in_order_and_only_what_they_declared() {
        let mut updaters = vec![
            updater("tags", None, &["provider.config.tags.*"]),
            updater("version", Some(1), &["version"]),
            updater("greedy", Some(2), &["version", "provider.config.tags.*"]),
        ];
        order(&mut updaters);
        let names: Vec<&str> = updaters.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["version", "greedy", "tags"]);
        let changed = vec![
            "provider.config.instanceType".to_string(),
            "provider.config.tags.team".to_string(),
            "version".to_string(),
        ];
        let mut planner = Planner::new(changed);
        let c = planner.claim(
            &updaters[0],
            &["version".into(), "provider.config.instanceType".into()],
        );
        assert_eq!(c.accepted, ["version"]);
        assert_eq!(c.ignored, ["provider.config.instanceType"]);
        // `greedy` declared version too, but it is taken.
        let c = planner.claim(&updaters[1], &["version".into()]);
        assert!(c.accepted.is_empty());
        assert_eq!(c.ignored, ["version"]);
        planner.claim(&updaters[2], &["provider.config.tags.team".into()]);
        let plan = planner.finish();
        assert_eq!(plan.steps.len(), 2);
        assert_eq!(plan.steps[1].fields, ["provider.config.tags.team"]);
        assert_eq!(plan.unclaimed, ["provider.config.instanceType"]);
        assert!(!plan.in_place());
    }

    proptest! {
        /// Whatever updaters answer, every changed field ends up exactly
        /// once: in one step (of an updater that declared it) or unclaimed.
        #[test]
        fn every_changed_field_is_claimed_once_or_left(
            answers in proptest::collection::vec(proptest::collection::vec(0usize..6, 0..6), 1..4),
            changed_mask in proptest::collection::vec(proptest::bool::ANY, 6),
        ) {
            let universe = ["version", "failureDomain", "provider.config.tags.a", "provider.config.tags.b", "provider.config.size", "clusterName"];
            let declared: [&[&str]; 3] = [&["version", "provider.config.tags.*"], &["provider.config.*"], &["failureDomain", "version"]];
            let changed: Vec<String> = universe.iter().zip(&changed_mask).filter(|(_, c)| **c).map(|(f, _)| f.to_string()).collect();
            let mut planner = Planner::new(changed.clone());
            let updaters: Vec<Updater> = (0..answers.len()).map(|i| updater(&format!("u{i}"), Some(i as i32), declared[i % 3])).collect();
            for (u, answer) in updaters.iter().zip(&answers) {
                let answer: Vec<String> = answer.iter().map(|i| universe[*i].to_string()).collect();
                planner.claim(u, &answer);
            }
            let plan = planner.finish();
            let mut seen: Vec<String> = plan.unclaimed.clone();
            for step in &plan.steps {
                let u = updaters.iter().find(|u| u.name == step.updater).unwrap();
                for f in &step.fields {
                    prop_assert!(u.fields.iter().any(|p| p.matches(f)), "{} claimed undeclared {f}", u.name);
                    seen.push(f.clone());
                }
            }
            seen.sort();
            let mut want = changed;
            want.sort();
            prop_assert_eq!(seen, want);
        }
    }
}
