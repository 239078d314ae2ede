//! Aggregation is a binding: a ClusterRole that an `aggregationRule` of
//! the cluster selects lends its rules to every holder of the aggregating
//! role, so the floor judges it as if it were bound to all of them.
//!
//! Kubernetes' clusterrole-aggregation controller copies the rules of every
//! ClusterRole whose labels match one of an aggregating role's
//! `clusterRoleSelectors` into that role. The built-in `admin`, `edit` and
//! `view` aggregate the `rbac.authorization.k8s.io/aggregate-to-*` labels
//! (and `view` is itself aggregated into `edit`, `edit` into `admin`); a
//! cluster may have aggregating roles of its own, so the engine reads them
//! from the target cluster ([`Aggregators::from_cluster_roles`]). When it
//! cannot, the floor cannot tell whether a rendered ClusterRole is a
//! binding to everyone, and refuses any route in one
//! ([`Aggregators::Unknown`]).

use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

const AGGREGATE_TO: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// A ClusterRole whose rules are those of the ClusterRoles it selects.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregator {
    /// Its name.
    pub name: String,
    /// `aggregationRule.clusterRoleSelectors`: a ClusterRole matching any is aggregated.
    pub selectors: Vec<LabelSelector>,
    /// Its own labels (an aggregator may itself be aggregated into another).
    pub labels: BTreeMap<String, String>,
}

/// The aggregating ClusterRoles of the cluster a render goes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Aggregators {
    /// Read from the cluster (the built-in ones always included).
    Known(Vec<Aggregator>),
    /// They could not be read, and why.
    Unknown(String),
}

/// Where a rendered ClusterRole's rules would go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AggregatedInto {
    /// The aggregating role whose selector matches the rendered role.
    pub(super) role: String,
    /// The roles that gain its rules through `role` (aggregating it in
    /// turn), in name order.
    pub(super) through: Vec<String>,
}

impl Aggregators {
    /// Kubernetes' built-in aggregating roles alone (what `capstan addon
    /// render` knows without a cluster).
    pub fn built_in() -> Aggregators {
        Aggregators::Known(built_in())
    }

    /// The built-in aggregating roles and every ClusterRole of `roles` that
    /// has an `aggregationRule` (the cluster's own wins by name).
    pub fn from_cluster_roles<'a>(roles: impl IntoIterator<Item = &'a ClusterRole>) -> Aggregators {
        let mut found: BTreeMap<String, Aggregator> = built_in()
            .into_iter()
            .map(|a| (a.name.clone(), a))
            .collect();
        for role in roles {
            let Some(rule) = &role.aggregation_rule else {
                continue;
            };
            let name = role.metadata.name.clone().unwrap_or_default();
            found.insert(
                name.clone(),
                Aggregator {
                    name,
                    selectors: rule.cluster_role_selectors.clone().unwrap_or_default(),
                    labels: role.metadata.labels.clone().unwrap_or_default(),
                },
            );
        }
        Aggregators::Known(found.into_values().collect())
    }

    /// The aggregating roles a ClusterRole with `labels` is aggregated
    /// into, each with the roles that gain its rules through it; `Err`
    /// (why) when the cluster's aggregating roles are not known.
    pub(super) fn aggregated_into(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<AggregatedInto>, String> {
        let known = match self {
            Aggregators::Known(known) => known,
            Aggregators::Unknown(why) => return Err(why.clone()),
        };
        Ok(known
            .iter()
            .filter(|a| a.selects(labels))
            .map(|a| AggregatedInto {
                role: a.name.clone(),
                through: through(known, a),
            })
            .collect())
    }
}

impl Aggregator {
    /// Whether a ClusterRole with `labels` is aggregated into this one. As
    /// the API server reads a selector: an empty one selects every role,
    /// and an operator it does not know is taken to select (the floor
    /// fails closed).
    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selectors.iter().any(|s| selects(s, labels))
    }
}

fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|e| capstan_api::requirement_holds(e, labels).unwrap_or(true))
}

/// The aggregators that (directly or in turn) aggregate `start`.
fn through(known: &[Aggregator], start: &Aggregator) -> Vec<String> {
    let mut reached: Vec<String> = Vec::new();
    let mut frontier = vec![start];
    while let Some(current) = frontier.pop() {
        for next in known.iter().filter(|a| a.selects(&current.labels)) {
            if next.name != start.name && !reached.contains(&next.name) {
                reached.push(next.name.clone());
                frontier.push(next);
            }
        }
    }
    reached.sort();
    reached
}

/// `admin`, `edit` and `view` as Kubernetes bootstraps them.
fn built_in() -> Vec<Aggregator> {
    let aggregator = |name: &str, into: Option<&str>| Aggregator {
        name: name.to_string(),
        selectors: vec![LabelSelector {
            match_labels: Some(BTreeMap::from([(
                format!("{AGGREGATE_TO}{name}"),
                "true".to_string(),
            )])),
            match_expressions: None,
        }],
        labels: into
            .map(|i| BTreeMap::from([(format!("{AGGREGATE_TO}{i}"), "true".to_string())]))
            .unwrap_or_default(),
    };
    vec![
        aggregator("admin", None),
        aggregator("edit", Some("admin")),
        aggregator("view", Some("edit")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use kube::api::ObjectMeta;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn into(aggregators: &Aggregators, pairs: &[(&str, &str)]) -> Vec<(String, Vec<String>)> {
        aggregators
            .aggregated_into(&labels(pairs))
            .unwrap()
            .into_iter()
            .map(|a| (a.role, a.through))
            .collect()
    }

    #[test]
    fn the_built_in_labels_aggregate_into_view_edit_and_admin_in_turn() {
        let built_in = Aggregators::built_in();
        assert_eq!(
            into(&built_in, &[(&format!("{AGGREGATE_TO}view"), "true")]),
            [("view".into(), vec!["admin".to_string(), "edit".into()])]
        );
        assert_eq!(
            into(&built_in, &[(&format!("{AGGREGATE_TO}admin"), "true")]),
            [("admin".into(), vec![])]
        );
        assert!(into(&built_in, &[(&format!("{AGGREGATE_TO}view"), "false")]).is_empty());
        assert!(into(&built_in, &[("app", "coredns")]).is_empty());
    }

    #[test]
    fn the_clusters_own_aggregators_and_empty_selectors_count() {
        let role = |name: &str, selector: LabelSelector| ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            aggregation_rule: Some(AggregationRule {
                cluster_role_selectors: Some(vec![selector]),
            }),
            rules: None,
        };
        let monitoring = role(
            "monitoring",
            LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "example.com/monitoring".into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
                match_labels: None,
            },
        );
        let everything = role("everything", LabelSelector::default());
        let plain = ClusterRole {
            metadata: ObjectMeta {
                name: Some("plain".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let found = Aggregators::from_cluster_roles([&monitoring, &plain]);
        assert_eq!(
            into(&found, &[("example.com/monitoring", "x")]),
            [("monitoring".into(), vec![])]
        );
        let found = Aggregators::from_cluster_roles([&everything]);
        // An empty selector aggregates every ClusterRole (as the API
        // server reads it), whatever its labels.
        let names: Vec<String> = into(&found, &[]).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["everything"]);
        let unknown = Aggregators::Unknown("forbidden".into());
        assert_eq!(
            unknown.aggregated_into(&labels(&[])),
            Err("forbidden".to_string())
        );
    }
}
