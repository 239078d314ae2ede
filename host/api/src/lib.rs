//! Capstan's Kubernetes API, group `capstan.dev`, version `v1alpha1`.
//!
//! Field names follow Cluster API where it has them. Start with
//! [`MachineDeployment`], which owns [`MachineSet`]s, which own
//! [`Machine`]s; every machine names a [`Plugin`] (cluster-scoped) that
//! provides its instances. A [`MachineHealthCheck`] marks unhealthy
//! machines for their MachineSet to replace. A [`Cluster`] is a workload
//! cluster that objects name with `spec.clusterName`: their Nodes live
//! there. [`crds`] returns the CustomResourceDefinitions
//! (what `capstan crds` prints).
//!
//! The OpenAPI schema validates what it can express (Kubernetes 1.20 has no
//! CEL rules); the controllers validate the rest and report it as a
//! condition.

#![forbid(unsafe_code)]
// kube-derive's `printcolumn(type_ = …)` repeats keys across columns by design.
#![allow(clippy::duplicated_attributes)]

mod addon;
mod cluster;
mod drainrule;
mod healthcheck;
mod machine;
mod plugin;
mod rollout;
mod sets;

pub use addon::*;
pub use cluster::*;
pub use drainrule::*;
pub use healthcheck::*;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
pub use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
pub use machine::*;
pub use plugin::*;
pub use rollout::*;
pub use sets::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group.
pub const GROUP: &str = "capstan.dev";

/// Label on Machines and MachineSets naming the MachineDeployment they belong to.
pub const LABEL_DEPLOYMENT_NAME: &str = "capstan.dev/deployment-name";
/// Longest name a label value may hold (and so a MachineSet's name, which
/// its Machines carry in [`LABEL_SET_NAME`]).
pub const MAX_SET_NAME: usize = 63;
/// Longest MachineDeployment name: its MachineSets are named
/// `NAME-<10-character template hash>` and must fit [`MAX_SET_NAME`].
pub const MAX_DEPLOYMENT_NAME: usize = MAX_SET_NAME - 11;

/// Why `name` cannot be used for a `kind` whose names may be at most `max`
/// characters (`because` says what the name becomes), or `None`.
pub fn name_too_long(kind: &str, name: &str, max: usize, because: &str) -> Option<String> {
    (name.len() > max).then(|| {
        format!(
            "metadata.name {name:?} is {} characters; a {kind}'s name may have at most {max} ({because}); create it under a shorter name",
            name.len()
        )
    })
}

/// Label on Machines naming the MachineSet they belong to.
pub const LABEL_SET_NAME: &str = "capstan.dev/set-name";
/// Label on MachineSets and their Machines: hash of the machine template the
/// set was created from.
pub const LABEL_TEMPLATE_HASH: &str = "capstan.dev/template-hash";
/// Annotation on MachineSets (and copied to their deployment): the rollout
/// revision number of the template.
pub const ANNOTATION_REVISION: &str = "capstan.dev/revision";
/// Annotation recording why a revision was made (`kubectl annotate … capstan.dev/change-cause=…`).
pub const ANNOTATION_CHANGE_CAUSE: &str = "capstan.dev/change-cause";
/// On a MachineDeployment: its last automatic rollback (`spec.rollback`),
/// as JSON ([`AutomaticRollbackRecord`]). Written in the same request as
/// the template it restores, so a rollback is never half-recorded; it
/// keeps the controller from rolling back from or to those templates
/// again until the template changes to a third one.
pub const ANNOTATION_AUTOMATIC_ROLLBACK: &str = "capstan.dev/automatic-rollback";
/// Annotation the MachineDeployment controller puts on old MachineSets under
/// the `OnDelete` strategy: `"false"` means a machine a user deletes is not
/// replaced in this set (the deployment replaces it from the new template).
pub const ANNOTATION_REPLACE_DELETED: &str = "capstan.dev/replace-deleted";
/// Annotation on a Machine (any value): when its set shrinks, it goes
/// first, even while updating in place (Cluster API's key, so runbooks and
/// tools that use it work unchanged).
pub const ANNOTATION_DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
/// The same under Capstan's API group: what the cluster-autoscaler's
/// clusterapi provider writes when it runs with `CAPI_GROUP=capstan.dev`
/// (it names every key after the group).
pub const ANNOTATION_DELETE_MACHINE_CAPSTAN: &str = "capstan.dev/delete-machine";
/// Annotation on a Machine, MachineSet, MachineDeployment or
/// MachineHealthCheck (any value): its controller leaves it alone until the
/// annotation goes (a paused Machine is neither provisioned, checked nor
/// deleted, and is no health check's target). Cluster API's key.
pub const ANNOTATION_PAUSED: &str = "cluster.x-k8s.io/paused";
/// Annotation on a Machine (any value): no MachineHealthCheck considers it,
/// so it is neither judged, counted nor remediated. Cluster API's key.
pub const ANNOTATION_SKIP_REMEDIATION: &str = "cluster.x-k8s.io/skip-remediation";
/// Annotation on a Machine (any value): a MachineHealthCheck selecting it
/// marks it unhealthy at once (reason `HasRemediateAnnotation`), so its
/// owner replaces it, within the short-circuit. Cluster API's key.
pub const ANNOTATION_REMEDIATE_MACHINE: &str = "cluster.x-k8s.io/remediate-machine";
/// On a Machine: which label and annotation keys its set's template put
/// there (JSON), so a key removed from the template is removed from the
/// machine and a key anyone else added is not.
pub const ANNOTATION_TEMPLATE_METADATA: &str = "capstan.dev/template-metadata";
/// On a Node: which of its labels come from its Machine (comma-separated
/// keys). Cluster API's key and format.
pub const ANNOTATION_LABELS_FROM_MACHINE: &str = "cluster.x-k8s.io/labels-from-machine";
/// On a Node: the `key:effect` of the `Always` taints the host put there
/// from its Machine's `spec.taints` (the only taints it ever changes).
pub const ANNOTATION_TAINTS_FROM_MACHINE: &str = "cluster.x-k8s.io/taints-from-machine";
/// On a Node: its Machine's `OnInitialization` taints were set (once, when
/// it had joined); they are never set again.
pub const ANNOTATION_TAINTS_INITIALIZED: &str = "capstan.dev/taints-initialized";
/// On an old MachineSet: the deployment's new set, to which the machines
/// it sheds are handed over for an in-place update instead of deleted.
pub const ANNOTATION_IN_PLACE_TO: &str = "capstan.dev/in-place-to";
/// On a Machine handed over for an in-place update: its spec before (JSON).
/// The Machine controller updates it in place while this is present and
/// removes it when the update is done.
pub const ANNOTATION_IN_PLACE_FROM: &str = "capstan.dev/in-place-from";
/// Finalizer the Machine controller puts on every Machine so the cloud
/// instance is released before the object goes.
pub const MACHINE_FINALIZER: &str = "capstan.dev/machine";
/// The Cluster controller's finalizer: the Cluster's deployments, sets and
/// Machines are deleted before it goes.
pub const CLUSTER_FINALIZER: &str = "capstan.dev/cluster";
/// Finalizer the MachineSet controller puts on every MachineSet: a deleted
/// set deletes its Machines itself and goes when the last one is gone (as
/// Cluster API's `cluster.x-k8s.io/machineset`).
pub const MACHINESET_FINALIZER: &str = "capstan.dev/machineset";
/// Finalizer the MachineDeployment controller puts on every
/// MachineDeployment: a deleted deployment deletes its MachineSets itself
/// and goes when the last one is gone (as Cluster API's
/// `cluster.x-k8s.io/machinedeployment`).
pub const MACHINEDEPLOYMENT_FINALIZER: &str = "capstan.dev/machinedeployment";
/// Annotation on a Machine: present (any value) means its Node is not
/// drained before the machine is deleted.
pub const ANNOTATION_EXCLUDE_NODE_DRAINING: &str = "machine.capstan.dev/exclude-node-draining";
/// Annotation on a Machine: present (any value) means its deletion does not
/// wait for the Node's volumes to detach. Cluster API's key.
pub const ANNOTATION_EXCLUDE_WAIT_FOR_VOLUME_DETACH: &str =
    "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach";
/// Cluster API's key for [`ANNOTATION_EXCLUDE_NODE_DRAINING`], honoured too.
pub const ANNOTATION_EXCLUDE_NODE_DRAINING_CAPI: &str =
    "machine.cluster.x-k8s.io/exclude-node-draining";
/// Prefix of pre-drain hook annotations
/// (`pre-drain.delete.hook.machine.capstan.dev/<name>`): each one holds a
/// deleting machine before its Node is drained, until it is removed.
pub const PRE_DRAIN_HOOK_PREFIX: &str = "pre-drain.delete.hook.machine.capstan.dev/";
/// Prefix of pre-terminate hook annotations
/// (`pre-terminate.delete.hook.machine.capstan.dev/<name>`): each one holds
/// a deleting machine after the drain, before its instance is deleted.
pub const PRE_TERMINATE_HOOK_PREFIX: &str = "pre-terminate.delete.hook.machine.capstan.dev/";

/// Condition status values.
pub mod status {
    /// The condition holds.
    pub const TRUE: &str = "True";
    /// The condition does not hold.
    pub const FALSE: &str = "False";
    /// Not known yet.
    pub const UNKNOWN: &str = "Unknown";
}

/// All CustomResourceDefinitions, in apply order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Plugin::crd(),
        Machine::crd(),
        MachineSet::crd(),
        MachineDeployment::crd(),
        MachineHealthCheck::crd(),
        MachineDrainRule::crd(),
        Addon::crd(),
        Cluster::crd(),
    ]
}

/// The CRDs as one multi-document YAML stream for `kubectl apply -f -`.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("a CRD always serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Find a condition by type.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a condition of this type is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == status::TRUE)
}

/// Set (or add) a condition, keeping `lastTransitionTime` unless the status
/// changed, so that re-setting the same condition changes nothing and an
/// idle reconcile writes nothing.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: &Time,
) {
    let message = message.into();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status {
            existing.last_transition_time = now.clone();
        }
        existing.status = status.to_string();
        existing.reason = reason.to_string();
        existing.message = message;
        existing.observed_generation = observed_generation;
    } else {
        conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation,
            last_transition_time: now.clone(),
        });
    }
}

/// The most bytes of plugin-supplied text a status field or Event carries.
pub const MAX_PLUGIN_TEXT: usize = 1024;

/// `text` cut to at most `max` bytes (on a character boundary), saying so
/// when it was cut: plugin text reaches objects tenants read and must not
/// grow them without bound.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    const MARK: &str = " … (truncated)";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// Whether `labels` satisfy a label selector (`matchLabels` and
/// `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`). An
/// empty selector matches nothing, as for MachineSets in Cluster API.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let match_labels = selector.match_labels.as_ref();
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    if match_labels.is_none_or(|m| m.is_empty()) && expressions.is_empty() {
        return false;
    }
    let labels_ok = match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && expressions
            .iter()
            .all(|e| requirement_holds(e, labels).unwrap_or(false))
}

/// Whether `labels` satisfy one of a selector's `matchExpressions`; `None`
/// for an operator other than `In`, `NotIn`, `Exists` and `DoesNotExist`
/// (the caller decides what an unknown operator means).
pub fn requirement_holds(
    e: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<bool> {
    let value = labels.get(&e.key);
    let values = e.values.as_deref().unwrap_or_default();
    Some(match e.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => return None,
    })
}

/// Why a set's or deployment's selector is unusable with its template, if
/// it is: machines made from the template must match the selector. `owner`
/// names the kind for the message ("set", "deployment").
pub fn selector_mismatch(
    selector: &LabelSelector,
    template: &MachineTemplateSpec,
    owner: &str,
) -> Option<String> {
    (!selector_matches(selector, &template.metadata.labels)).then(|| {
        format!(
            "spec.selector does not match spec.template.metadata.labels: machines made from the template would not belong to the {owner}; make every selector label a template label"
        )
    })
}

/// A selector as `kubectl` writes it (`a=b,c in (d,e)`), for the scale
/// subresource's `status.selector`.
pub fn selector_string(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// Schema for a free-form JSON object (a provider's `config`).
fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema for a label map.
fn string_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": { "type": "string" },
    })
}

/// Schema for a list of conditions (Kubernetes API conventions). A map
/// keyed by type, so that controllers writing different condition types of
/// one object (the Machine controller and the health check) each own only
/// their entries under server-side apply.
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime"],
            "properties": {
                "type": { "type": "string" },
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "reason": { "type": "string", "nullable": true },
                "message": { "type": "string", "nullable": true },
                "observedGeneration": { "type": "integer", "format": "int64" },
                "lastTransitionTime": { "type": "string", "format": "date-time" },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_text_is_bounded_on_a_character_boundary() {
        assert_eq!(bounded("short", 10), "short");
        let long = "é".repeat(1000);
        let cut = bounded(&long, MAX_PLUGIN_TEXT);
        assert!(cut.len() <= MAX_PLUGIN_TEXT, "{}", cut.len());
        assert!(cut.ends_with("(truncated)"));
    }

    #[test]
    fn crds_have_the_subresources_and_columns_kubectl_users_rely_on() {
        let yaml = crds_yaml();
        for kind in ["Plugin", "Machine", "MachineSet", "MachineDeployment"] {
            assert!(yaml.contains(&format!("kind: {kind}\n")), "{kind} missing");
        }
        let md = MachineDeployment::crd();
        let version = &md.spec.versions[0];
        let sub = version.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        let scale = sub.scale.as_ref().unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let columns: Vec<_> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        // Cluster API v1beta2's columns, in its order.
        let cluster_api = [
            "Cluster",
            "Available",
            "Desired",
            "Current",
            "Ready",
            "Available",
            "Up-to-date",
            "Paused",
            "Phase",
            "Age",
            "Version",
        ];
        assert_eq!(columns, cluster_api);
        assert_eq!(md.spec.names.short_names, Some(vec!["md".to_string()]));
        assert_eq!(
            MachineSet::crd().spec.names.short_names,
            Some(vec!["ms".to_string()])
        );
        assert_eq!(
            Machine::crd().spec.names.short_names,
            Some(vec!["ma".to_string()])
        );
    }

    /// Every default in every CRD's schema within its own bounds: the API
    /// server refuses a CRD whose default breaks its `minimum`, `maximum`
    /// or `enum`, and then nothing installs.
    #[test]
    fn every_schema_default_is_one_the_schema_accepts() {
        fn walk(path: &str, node: &serde_json::Value, bad: &mut Vec<String>) {
            match node {
                serde_json::Value::Object(map) => {
                    if let Some(default) = map.get("default") {
                        let n = default.as_f64();
                        let below = map.get("minimum").and_then(|m| m.as_f64());
                        let above = map.get("maximum").and_then(|m| m.as_f64());
                        let listed = map.get("enum").and_then(|e| e.as_array());
                        if n.zip(below).is_some_and(|(n, min)| n < min)
                            || n.zip(above).is_some_and(|(n, max)| n > max)
                            || listed.is_some_and(|e| !e.contains(default))
                        {
                            bad.push(format!("{path}: default {default}"));
                        }
                    }
                    for (key, value) in map {
                        walk(&format!("{path}.{key}"), value, bad);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, value) in items.iter().enumerate() {
                        walk(&format!("{path}[{i}]"), value, bad);
                    }
                }
                _ => {}
            }
        }
        let mut bad = Vec::new();
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            walk(&name, &serde_json::to_value(&crd).unwrap(), &mut bad);
        }
        assert!(bad.is_empty(), "{bad:#?}");
    }

    #[test]
    fn schema_rejects_what_it_can_express() {
        let json = serde_json::to_value(MachineDeployment::crd()).unwrap();
        let spec = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(
            spec["properties"]["replicas"]["minimum"].as_f64(),
            Some(0.0)
        );
        let old = &spec["properties"]["strategy"]["properties"];
        let strategy = &spec["properties"]["rollout"]["properties"]["strategy"]["properties"];
        assert_eq!(old, strategy, "the deprecated name takes the same shape");
        assert_eq!(
            strategy["type"]["enum"],
            serde_json::json!(["RollingUpdate", "OnDelete"])
        );
        let order = &spec["properties"]["deletion"]["properties"]["order"];
        assert_eq!(
            order["enum"],
            serde_json::json!(["Random", "Newest", "Oldest"])
        );
        let surge = &strategy["rollingUpdate"]["properties"]["maxSurge"];
        assert_eq!(surge["x-kubernetes-int-or-string"], true);
        let config = &spec["properties"]["template"]["properties"]["spec"]["properties"]["provider"]
            ["properties"]["config"];
        assert_eq!(config["x-kubernetes-preserve-unknown-fields"], true);
    }

    #[test]
    fn v1beta1_names_are_read_reported_and_refused_when_they_disagree() {
        let parse = |spec: serde_json::Value| -> MachineDeploymentSpec {
            let mut spec = spec;
            spec["selector"] = serde_json::json!({});
            spec["template"] = serde_json::json!({"spec": {"provider": {"plugin": "p"}}});
            serde_json::from_value(spec).unwrap()
        };
        let new = parse(serde_json::json!({"rollout": {"strategy": {"type": "OnDelete"}}}));
        assert_eq!(new.rollout_strategy().type_, StrategyType::OnDelete);
        assert_eq!(new.renamed_fields(), Ok(vec![]));
        let old = parse(serde_json::json!({"strategy": {"type": "OnDelete"}}));
        assert_eq!(old.rollout_strategy().type_, StrategyType::OnDelete);
        let renamed = old.renamed_fields().unwrap();
        assert_eq!(renamed[0].new, "spec.rollout.strategy");
        assert!(Renamed::message(&renamed).contains("spec.strategy is deprecated"));
        let same = parse(serde_json::json!({"strategy": {"type": "OnDelete"},
            "rollout": {"strategy": {"type": "OnDelete"}}}));
        assert_eq!(same.renamed_fields().unwrap().len(), 1);
        let differ = parse(serde_json::json!({"strategy": {"type": "OnDelete"},
            "rollout": {"after": "2026-01-01T00:00:00Z", "strategy": {"type": "RollingUpdate"}}}));
        let error = differ.renamed_fields().unwrap_err();
        assert!(
            error.contains("spec.strategy and spec.rollout.strategy"),
            "{error}"
        );
        let neither = parse(serde_json::json!({}));
        assert_eq!(
            neither.rollout_strategy().type_,
            StrategyType::RollingUpdate
        );
        // Editing moves the old value to the new place.
        let mut moved = old.clone();
        moved.rollout_strategy_mut().rolling_update = None;
        assert_eq!(moved.strategy, None);
        assert_eq!(moved.rollout_strategy().type_, StrategyType::OnDelete);
        assert_eq!(moved.renamed_fields(), Ok(vec![]));

        let set = |v: serde_json::Value| -> MachineSetSpec {
            let mut v = v;
            v["selector"] = serde_json::json!({});
            v["template"] = serde_json::json!({"spec": {"provider": {"plugin": "p"}}});
            serde_json::from_value(v).unwrap()
        };
        assert_eq!(
            set(serde_json::json!({"deletePolicy": "Oldest"})).deletion_order(),
            DeletePolicy::Oldest
        );
        assert_eq!(
            set(serde_json::json!({"deletion": {"order": "Newest"}})).deletion_order(),
            DeletePolicy::Newest
        );
        let both =
            set(serde_json::json!({"deletePolicy": "Oldest", "deletion": {"order": "Newest"}}));
        assert!(
            both.renamed_fields()
                .unwrap_err()
                .contains("spec.deletion.order")
        );
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let labels: std::collections::BTreeMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "a".to_string()),
        ]
        .into();
        let mut selector = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: None,
        };
        assert!(selector_matches(&selector, &labels));
        selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: "NotIn".into(),
            values: Some(vec!["a".into()]),
        }]);
        assert!(!selector_matches(&selector, &labels));
        assert_eq!(selector_string(&selector), "app=web,tier notin (a)");
        assert!(!selector_matches(&LabelSelector::default(), &labels));
    }

    #[test]
    fn setting_the_same_condition_twice_changes_nothing() {
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap());
        let t2 = Time(k8s_openapi::jiff::Timestamp::from_second(2).unwrap());
        let mut conditions = vec![];
        let mut ready = |status: &str, reason: &str, t: &Time| {
            set_condition(&mut conditions, "Ready", status, reason, "", Some(1), t);
            conditions.clone()
        };
        let before = ready("False", "Booting", &t1);
        assert_eq!(ready("False", "Booting", &t2), before);
        ready("True", "Running", &t2);
        assert_eq!(conditions[0].last_transition_time, t2);
        assert!(is_true(&conditions, "Ready"));
    }
}
