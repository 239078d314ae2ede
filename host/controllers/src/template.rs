//! What a Machine template asks for, read one way by the machine, set and
//! deployment controllers (so none of them reaches into another): the
//! template's hash and whether a set is the deployment's current one, the
//! fields carried in place, the taints it wants, the bounds it writes as
//! counts or percentages, and the one field a template may not set.

use capstan_api::{
    IntOrString, MachineDeployment, MachineSet, MachineSpec, MachineTemplateSpec, TaintPropagation,
};
use capstan_planner::Bound;
use capstan_planner::taints::{Taint, Wanted};
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// A stable hash of a machine template (keys sorted, so the same template
/// always hashes the same whatever order its JSON arrived in). The
/// template's labels and annotations and the spec's
/// [`CARRIED_IN_PLACE`](capstan_planner::inplace::CARRIED_IN_PLACE) fields
/// are left out: as in Cluster API, they change in place on the existing
/// sets and machines, without a rollout.
pub fn template_hash(template: &MachineTemplateSpec) -> String {
    let mut template = template.clone();
    template.spec.deletion = None;
    template.spec.taints = vec![];
    template.spec.min_ready_seconds = None;
    template.spec.readiness_gates = vec![];
    template.metadata = Default::default();
    fn canonical(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let sorted: BTreeMap<String, serde_json::Value> =
                    map.into_iter().map(|(k, v)| (k, canonical(v))).collect();
                serde_json::Value::Object(sorted.into_iter().collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(canonical).collect())
            }
            other => other,
        }
    }
    let value = canonical(serde_json::to_value(&template).expect("a template serializes"));
    let digest = Sha256::digest(value.to_string().as_bytes());
    hex::encode(&digest[..5])
}

/// Whether `set` is the set of `md`'s template now (its machines are up to
/// date): the same template and, once `rollout.after` has passed, made
/// after it.
pub(crate) fn set_is_current(md: &MachineDeployment, set: &MachineSet, now_s: i64) -> bool {
    let after_reached = rollout_after(md).filter(|a| *a <= now_s);
    is_current(set, &template_hash(&md.spec.template), after_reached)
}

/// Whether `set` holds the template hashed `hash` and, once `rollout.after`
/// has passed (`after_reached`), was made at or after it.
pub(crate) fn is_current(set: &MachineSet, hash: &str, after_reached: Option<i64>) -> bool {
    template_hash(&set.spec.template) == hash && after_reached.is_none_or(|a| created(set) >= a)
}

/// `spec.rollout.after`, unix seconds.
pub(crate) fn rollout_after(md: &MachineDeployment) -> Option<i64> {
    md.spec
        .rollout
        .as_ref()
        .and_then(|r| r.after.as_ref())
        .map(|a| a.0.as_second())
}

/// When `set` was made, unix seconds.
pub(crate) fn created(set: &MachineSet) -> i64 {
    set.creation_timestamp().map_or(0, |c| c.0.as_second())
}

/// A set hash of its own for the sets made after `rollout.after` (their
/// template is the same as the older sets', their name and selector must
/// not be).
pub(crate) fn salted_hash(hash: &str, after: i64) -> String {
    let digest = Sha256::digest(format!("{hash}/rollout.after={after}").as_bytes());
    hex::encode(&digest[..5])
}

/// A count or a percentage (`25%`), as Kubernetes writes bounds.
pub(crate) fn int_or_percent(value: &IntOrString) -> Result<Bound, String> {
    match value {
        IntOrString::Int(n) if *n >= 0 => Ok(Bound::Count(*n)),
        IntOrString::Int(n) => Err(format!("{n} is negative; use a count of 0 or more")),
        IntOrString::String(s) => Bound::parse(s),
    }
}

/// Why a MachineSet's or MachineDeployment's template may not set
/// `spec.providerID` (every Machine would name the same instance).
pub(crate) fn template_provider_id(spec: &MachineSpec) -> Option<String> {
    spec.provider_id.as_ref().map(|id| {
        format!(
            "spec.template.spec.providerID: {id} would make every Machine of the template adopt the same instance; set providerID on a single Machine instead"
        )
    })
}

/// The machine's `spec.taints` as the planner takes them.
pub(crate) fn wanted_taints(spec: &MachineSpec) -> Vec<Wanted> {
    spec.taints
        .iter()
        .map(|t| Wanted {
            taint: Taint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.as_str().to_string(),
            },
            always: t.propagation == TaintPropagation::Always,
        })
        .collect()
}

/// [`carried_in_place`]'s answer.
pub(crate) type CarriedInPlace = [(&'static str, Option<serde_json::Value>); 4];

/// A machine spec's [`CARRIED_IN_PLACE`](capstan_planner::inplace::CARRIED_IN_PLACE)
/// fields by JSON name, in that order, each `None` when nothing is set (so
/// an empty `deletion: {}` and no `deletion` compare equal).
pub(crate) fn carried_in_place(spec: &capstan_api::MachineSpec) -> CarriedInPlace {
    use serde_json::json;
    [
        ("deletion", in_place_deletion(spec).map(|d| json!(d))),
        (
            "taints",
            (!spec.taints.is_empty()).then(|| json!(spec.taints)),
        ),
        ("minReadySeconds", spec.min_ready_seconds.map(|s| json!(s))),
        (
            "readinessGates",
            (!spec.readiness_gates.is_empty()).then(|| json!(spec.readiness_gates)),
        ),
    ]
}

/// The deletion settings of a machine spec, with "nothing set" as `None`,
/// so an empty `deletion: {}` and no `deletion` compare equal.
pub(crate) fn in_place_deletion(
    spec: &capstan_api::MachineSpec,
) -> Option<&capstan_api::MachineDeletionSpec> {
    spec.deletion
        .as_ref()
        .filter(|d| **d != capstan_api::MachineDeletionSpec::default())
}

/// The workload Cluster the machines of a set or deployment belong to
/// (`spec.clusterName`, else the template's), or why the two disagree.
pub(crate) fn cluster_of<'a>(
    cluster_name: Option<&'a str>,
    template: &'a MachineSpec,
) -> Result<Option<&'a str>, String> {
    match (cluster_name, template.cluster_name.as_deref()) {
        (Some(outer), Some(inner)) if outer != inner => Err(format!(
            "spec.template.spec.clusterName {inner:?} differs from spec.clusterName {outer:?}: a set's machines belong to its cluster; make them equal or leave the template's unset"
        )),
        (outer, inner) => Ok(outer.or(inner)),
    }
}

#[cfg(test)]
mod cluster_tests {
    use super::*;

    #[test]
    fn a_sets_cluster_is_its_own_or_its_templates_never_two() {
        let mut template = MachineSpec::default();
        assert_eq!(cluster_of(None, &template), Ok(None));
        assert_eq!(cluster_of(Some("a"), &template), Ok(Some("a")));
        template.cluster_name = Some("a".into());
        assert_eq!(cluster_of(None, &template), Ok(Some("a")));
        assert_eq!(cluster_of(Some("a"), &template), Ok(Some("a")));
        let why = cluster_of(Some("b"), &template).unwrap_err();
        assert!(
            why.contains("spec.template.spec.clusterName") && why.contains("\"b\""),
            "{why}"
        );
    }
}
