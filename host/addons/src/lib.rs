//! The addon lifecycle, in one crate: the engine that runs it ([`engine`]:
//! the Addon controller, rendering, targets, apply and prune, drift,
//! finalize) and the decisions it takes, which do no I/O: given what an
//! addon plugin rendered and what the `Addon` asks for, what exactly is
//! applied, in which order, what is pruned, and whether a live object
//! drifted.
//!
//! The engine runs these steps on every reconcile, in this order, and
//! applies nothing unless all succeed:
//!
//! 1. [`updates::decide`]: `spec.version` wins, else the channel's version
//!    ([`resolve_version`]), or under `updatePolicy: Notify|Manual` the one
//!    applied; a version that does not [`fit::fit`] the target cluster's
//!    Kubernetes versions is never newly applied; [`dependencies::gate`] holds a transition back while a
//!    dependency (`spec.dependsOn`) is not ready, rendering what is applied
//!    instead, so drift is still corrected;
//! 2. [`Object::parse`] each rendered text (valid objects, no duplicates);
//! 3. [`label`] them with the Addon they belong to (drift watches select on it);
//! 4. [`apply_patches`]: the Addon's break-glass patches, each of which must
//!    find its target and change only fields the Plugin's patch grants allow;
//! 5. [`rewrite_images`]: the host's mirror rules, recorded for status;
//! 6. [`check_grants`]: every object (as it will be applied, patches
//!    included) within what the plugin declared *and* the admin granted,
//!    and above the host's [`floor`];
//! 7. [`apply_order`]: CRDs, then Namespaces, then the rest as rendered.
//!
//! Before the first write, [`ownership::decide`] says for each object
//! whether this Addon may create it, owns it, may adopt it, or must leave
//! it alone. Afterwards [`conforms`] says whether a live object still
//! carries what was applied (drift), [`pruned`] which objects of the
//! previous inventory are no longer rendered, and [`assess_view`] what of a
//! live object the plugin's `assess` may see. [`identity::actor`] says
//! whose rights apply a tenant's objects. [`target::check_kubeconfig`]
//! keeps a workload cluster's kubeconfig to inline credentials.

#![forbid(unsafe_code)]

pub mod dependencies;
pub mod engine;
pub mod fit;
pub mod floor;
mod grants;
pub mod identity;
pub mod ownership;
mod patches;
/// Workload-cluster kubeconfigs (inline credentials only); shared with the
/// Machine controller's workload clusters, so it lives in the kit.
pub use capstan_kit::kubeconfig as target;
pub mod updates;

pub use grants::{
    AddonGrants, AggregationLent, NamedRef, PodSpecPath, RbacLent, RbacPower, Refusal,
    RefusalReason, check_grants, still_granted, undeclared,
};
pub use patches::{PatchRule, apply_patches, changed_paths};

pub use capstan_api::PodSecurityLevel;

use capstan_api::{ImageRewriteRecord, InventoryEntry, LABEL_ADDON_NAME, LABEL_ADDON_NAMESPACE};
use capstan_manifest::{ObjectKey, group_of};
use serde_json::{Map, Value};

/// Why an addon cannot be applied as asked. Every variant names what to
/// change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddonError {
    /// Neither `spec.version` nor `spec.channel` is set.
    #[error("set spec.version or spec.channel (known versions: {})", .known.join(", "))]
    NoVersion {
        /// The versions the plugin knows.
        known: Vec<String>,
    },
    /// `spec.version` is not one the plugin knows.
    #[error("spec.version {version:?} is not a version plugin knows; known versions: {}", .known.join(", "))]
    UnknownVersion {
        /// What was asked.
        version: String,
        /// What the plugin knows.
        known: Vec<String>,
    },
    /// The version an update policy keeps is no longer offered.
    #[error("version {version} is applied and kept by spec.updatePolicy, but the plugin no longer offers it; what is applied stays (nothing is pruned); set spec.version to one it offers: {}", .known.join(", "))]
    NoLongerOffered {
        /// What is applied.
        version: String,
        /// What the plugin offers now.
        known: Vec<String>,
    },
    /// The version does not fit the target cluster's Kubernetes version.
    #[error(
        "version {version} does not fit the target cluster: {why}; nothing of it was applied; set spec.version to a version that fits, or move the cluster into its range"
    )]
    Incompatible {
        /// The version refused.
        version: String,
        /// Its range against the cluster's versions ([`fit::Fit::misfit`]).
        why: String,
    },
    /// `spec.channel` is not one the plugin knows.
    #[error("spec.channel {channel:?} is not a channel the plugin knows; known channels: {}", .known.join(", "))]
    UnknownChannel {
        /// What was asked.
        channel: String,
        /// What the plugin knows.
        known: Vec<String>,
    },
    /// The plugin rendered something that is not a Kubernetes object.
    #[error("rendered object {index}: {reason}")]
    InvalidObject {
        /// Position in the render.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The plugin rendered the same object twice.
    #[error("the render contains {0} twice")]
    Duplicate(String),
    /// A patch names an object the render does not contain.
    #[error(
        "spec.patches[{index}]: its target {target} is not among the rendered objects ({rendered}); fix or remove the patch"
    )]
    PatchTargetMissing {
        /// Position in `spec.patches`.
        index: usize,
        /// The target as written.
        target: String,
        /// What was rendered (so the right name can be picked).
        rendered: String,
    },
    /// A patch is not applicable.
    #[error("spec.patches[{index}]: {reason}")]
    InvalidPatch {
        /// Position in `spec.patches`.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A patch changes fields no `spec.grants.patches` entry allows.
    #[error(
        "spec.patches[{index}]: changes {} of {object}, which the Plugin's spec.grants.patches does not allow{}; patches are a cluster admin's break-glass",
        .paths.join(", "),
        if *.tenant { " for Addons outside Capstan's namespace" } else { "" }
    )]
    PatchNotGranted {
        /// Position in `spec.patches`.
        index: usize,
        /// The patched object.
        object: String,
        /// The changed fields (JSON pointers) no grant covers.
        paths: Vec<String>,
        /// Whether the Addon is a tenant's (outside Capstan's namespace).
        tenant: bool,
    },
    /// Objects outside the plugin's declared or granted kinds.
    #[error("refused the whole render, nothing was applied: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused(Vec<Refusal>),
    /// Objects below the host's floor, whatever the grants say.
    #[error("refused the whole render, nothing was applied: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Floor(Vec<floor::Violation>),
}

/// The version to install and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The version.
    pub version: String,
    /// The channel it came from, when `spec.version` was not set.
    pub channel: Option<String>,
}

/// `spec.version` if set (and known), else the channel's version: the
/// highest version that lists the channel.
pub fn resolve_version(
    version: Option<&str>,
    channel: Option<&str>,
    known: &[(String, Vec<String>)],
) -> Result<Resolved, AddonError> {
    let versions = || known.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>();
    if let Some(v) = version {
        return if known.iter().any(|(k, _)| k == v) {
            Ok(Resolved {
                version: v.to_string(),
                channel: None,
            })
        } else {
            Err(AddonError::UnknownVersion {
                version: v.to_string(),
                known: versions(),
            })
        };
    }
    let Some(channel) = channel else {
        return Err(AddonError::NoVersion { known: versions() });
    };
    known
        .iter()
        .filter(|(_, channels)| channels.iter().any(|c| c == channel))
        .max_by(|a, b| version_order(&a.0, &b.0))
        .map(|(v, _)| Resolved {
            version: v.clone(),
            channel: Some(channel.to_string()),
        })
        .ok_or_else(|| {
            let mut channels: Vec<String> = known.iter().flat_map(|(_, c)| c.clone()).collect();
            channels.sort();
            channels.dedup();
            AddonError::UnknownChannel {
                channel: channel.to_string(),
                known: channels,
            }
        })
}

/// Compare versions such as `1.11.3` or `v1.10.1` numerically, part by part.
pub fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<u64> {
        v.trim_start_matches('v')
            .split(['.', '-', '+'])
            .map(|p| p.parse().unwrap_or(0))
            .collect()
    };
    parts(a).cmp(&parts(b)).then_with(|| a.cmp(b))
}

/// One rendered object.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// The whole object.
    pub value: Value,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.namespace`; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

impl Object {
    /// Parse rendered object `index` (JSON text): an object with
    /// `apiVersion`, `kind` and `metadata.name`.
    pub fn parse(index: usize, text: &str) -> Result<Object, AddonError> {
        let invalid = |reason: String| AddonError::InvalidObject { index, reason };
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        Object::from_value(index, value)
    }

    /// The same, from a parsed value.
    pub fn from_value(index: usize, value: Value) -> Result<Object, AddonError> {
        let invalid = |reason: String| AddonError::InvalidObject { index, reason };
        let text = |v: Option<&Value>, field: &str| -> Result<String, AddonError> {
            match v.and_then(Value::as_str) {
                Some(s) if !s.is_empty() => Ok(s.to_string()),
                _ => Err(invalid(format!("{field} is missing or not a string"))),
            }
        };
        if !value.is_object() {
            return Err(invalid("not a JSON object".into()));
        }
        let api_version = text(value.get("apiVersion"), "apiVersion")?;
        let kind = text(value.get("kind"), "kind")?;
        let metadata = value.get("metadata");
        let name = text(metadata.and_then(|m| m.get("name")), "metadata.name")?;
        let namespace = match metadata.and_then(|m| m.get("namespace")) {
            None | Some(Value::Null) => None,
            Some(v) => Some(text(Some(v), "metadata.namespace")?),
        };
        if kind.ends_with("List") {
            return Err(invalid(format!(
                "{kind} is a list; render its items as separate objects"
            )));
        }
        Ok(Object {
            value,
            api_version,
            kind,
            namespace,
            name,
        })
    }

    /// The API group.
    pub fn group(&self) -> &str {
        group_of(&self.api_version)
    }

    /// What grants see.
    pub fn key(&self) -> ObjectKey<'_> {
        ObjectKey {
            group: self.group(),
            kind: &self.kind,
            namespace: self.namespace.as_deref(),
            name: &self.name,
        }
    }

    /// Its inventory entry.
    pub fn entry(&self) -> InventoryEntry {
        InventoryEntry {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: None,
            adopted: false,
        }
    }

    /// Whether this is the object an inventory entry names (any version).
    pub fn is(&self, entry: &InventoryEntry) -> bool {
        same_object(&self.entry(), entry)
    }
}

/// Whether two inventory entries name the same object (versions aside).
pub fn same_object(a: &InventoryEntry, b: &InventoryEntry) -> bool {
    group_of(&a.api_version) == group_of(&b.api_version)
        && a.kind == b.kind
        && a.namespace == b.namespace
        && a.name == b.name
}

/// Parse a whole render and refuse duplicates.
pub fn parse_render(texts: &[String]) -> Result<Vec<Object>, AddonError> {
    let mut objects: Vec<Object> = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let object = Object::parse(i, text)?;
        if objects.iter().any(|o| o.is(&object.entry())) {
            return Err(AddonError::Duplicate(object.entry().to_string()));
        }
        objects.push(object);
    }
    Ok(objects)
}

/// Label every object with the Addon it belongs to.
pub fn label(objects: &mut [Object], addon_namespace: &str, addon_name: &str) {
    for object in objects {
        let metadata = object.value["metadata"]
            .as_object_mut()
            .expect("parsed objects have metadata");
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(Map::new());
        }
        let labels = labels.as_object_mut().expect("just made an object");
        labels.insert(LABEL_ADDON_NAME.into(), addon_name.into());
        labels.insert(LABEL_ADDON_NAMESPACE.into(), addon_namespace.into());
    }
}

/// A host-level image rewrite rule, `FROM=TO`: images starting with `FROM`
/// start with `TO` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRewrite {
    /// Prefix to replace, such as `registry.k8s.io/`.
    pub from: String,
    /// Replacement, such as `mirror.local/`.
    pub to: String,
}

impl std::str::FromStr for ImageRewrite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((from, to)) if !from.is_empty() && !to.is_empty() => Ok(ImageRewrite {
                from: from.to_string(),
                to: to.to_string(),
            }),
            _ => Err(format!(
                "image rewrite {s:?}: write it as FROM=TO, for example registry.k8s.io/=mirror.local/"
            )),
        }
    }
}

/// The JSON pointer to the pod spec of a pod-bearing object: the built-in
/// workload kinds by group and kind, custom ones where `custom` says.
pub(crate) fn pod_spec_pointer(object: &Object, custom: &[PodSpecPath]) -> Option<String> {
    let builtin = match (object.group(), object.kind.as_str()) {
        ("", "Pod") => Some("/spec"),
        ("", "PodTemplate") => Some("/template/spec"),
        ("", "ReplicationController")
        | ("apps", "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet")
        | ("batch", "Job") => Some("/spec/template/spec"),
        ("batch", "CronJob") => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    };
    builtin.map(str::to_string).or_else(|| {
        custom
            .iter()
            .find(|p| p.group == object.group() && p.kind == object.kind)
            .map(|p| p.pointer.clone())
    })
}

/// Where the pod spec is in workload kinds (for image rewrites).
pub(crate) fn pod_spec_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &["spec"],
        "Deployment"
        | "DaemonSet"
        | "StatefulSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => &["spec", "template", "spec"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        _ => return None,
    })
}

/// Rewrite container images (containers, init and ephemeral containers of
/// every pod template) by the first matching rule. Returns what changed,
/// each distinct rewrite once.
pub fn rewrite_images(objects: &mut [Object], rules: &[ImageRewrite]) -> Vec<ImageRewriteRecord> {
    let mut records: Vec<ImageRewriteRecord> = Vec::new();
    if rules.is_empty() {
        return records;
    }
    for object in objects {
        let Some(path) = pod_spec_path(&object.kind) else {
            continue;
        };
        let pointer = format!("/{}", path.join("/"));
        let Some(spec) = object.value.pointer_mut(&pointer) else {
            continue;
        };
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
                continue;
            };
            for container in containers {
                let Some(image) = container.get("image").and_then(Value::as_str) else {
                    continue;
                };
                let Some(rule) = rules.iter().find(|r| image.starts_with(&r.from)) else {
                    continue;
                };
                let rewritten = format!("{}{}", rule.to, &image[rule.from.len()..]);
                let record = ImageRewriteRecord {
                    from: image.to_string(),
                    to: rewritten.clone(),
                };
                container["image"] = Value::String(rewritten);
                if !records.contains(&record) {
                    records.push(record);
                }
            }
        }
    }
    records
}

fn rank(object: &Object) -> u8 {
    match (object.group(), object.kind.as_str()) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => 0,
        ("", "Namespace") => 1,
        _ => 2,
    }
}

/// Sort for applying: CRDs, then Namespaces, then the rest in render order.
/// Deletion goes in the reverse of this order.
pub fn apply_order(objects: &mut [Object]) {
    objects.sort_by_key(rank);
}

/// Entries of the previous inventory no longer rendered, in deletion order
/// (the reverse of the order they were applied in).
pub fn pruned(previous: &[InventoryEntry], current: &[Object]) -> Vec<InventoryEntry> {
    previous
        .iter()
        .rev()
        .filter(|e| !current.iter().any(|o| o.is(e)))
        .cloned()
        .collect()
}

/// Whether `live` still carries everything `desired` sets: every field of
/// `desired` is present with the same value, lists have the same length and
/// their items conform pairwise. Fields the server or other controllers add
/// (defaults, status, annotations) do not count as drift.
pub fn conforms(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, v)| match l.get(k) {
            Some(lv) => conforms(v, lv),
            // An empty value the server drops is not drift.
            None => is_empty(v),
        }),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(a, b)| conforms(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// Annotation on a rendered object: the fields (JSON pointers, separated by
/// commas) the Addon keeps applying even after another manager took them
/// over. A plugin sets it for fields it must own; a break-glass patch adds
/// the fields it changes.
pub const ANNOTATION_OWNED_FIELDS: &str = "capstan.dev/owned-fields";

/// Annotation on an applied object: the `spec.replicas` its render set
/// ([`note_replicas`]). While the render still says the same, a different
/// live count is someone's scaling (an HPA, `kubectl scale`), not drift.
pub const ANNOTATION_RENDERED_REPLICAS: &str = "capstan.dev/rendered-replicas";

/// Record each rendered object's `spec.replicas` in
/// [`ANNOTATION_RENDERED_REPLICAS`].
pub fn note_replicas(objects: &mut [Object]) {
    for object in objects {
        let Some(replicas) = object.value.pointer("/spec/replicas").cloned() else {
            continue;
        };
        let Some(metadata) = object.value["metadata"].as_object_mut() else {
            continue;
        };
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(
                ANNOTATION_RENDERED_REPLICAS.into(),
                replicas.to_string().into(),
            );
        }
    }
}

/// The rendered fields someone else scaled, which the Addon leaves to them:
/// `spec.replicas` when the render still sets what it set when last
/// applied ([`ANNOTATION_RENDERED_REPLICAS`]) and the live count differs,
/// and (API servers from 1.22 record it) any rendered field another
/// manager owns through the `scale` subresource. Fields listed in
/// [`ANNOTATION_OWNED_FIELDS`] are never yielded. Any other edit of a
/// rendered field is drift, undone. JSON pointers.
pub fn taken_over(rendered: &Value, live: &Value, manager: &str) -> Vec<String> {
    let owned: Vec<&str> = rendered
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION_OWNED_FIELDS))
        .and_then(Value::as_str)
        .map(|list| list.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let noted = |v: &Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(ANNOTATION_RENDERED_REPLICAS))
            .cloned()
    };
    let mut yielded = Vec::new();
    if let Some(replicas) = rendered.pointer("/spec/replicas")
        && noted(rendered).is_some()
        && noted(rendered) == noted(live)
        && live
            .pointer("/spec/replicas")
            .is_some_and(|l| l != replicas)
    {
        yielded.push("/spec/replicas".to_string());
    }
    let scalers: Vec<&Value> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e["manager"] != manager && e["subresource"] == "scale")
        .collect();
    let holds = |entry: &Value, path: &[String]| {
        let mut at = &entry["fieldsV1"];
        path.iter().all(|segment| {
            at = &at[format!("f:{segment}")];
            !at.is_null()
        })
    };
    let mine: Vec<&Value> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e["manager"] == manager)
        .collect();
    let mut leaves = Vec::new();
    map_leaves(rendered, &mut Vec::new(), &mut leaves);
    for path in leaves {
        if matches!(
            path.first().map(String::as_str),
            Some("metadata" | "apiVersion" | "kind")
        ) {
            continue;
        }
        if scalers.iter().any(|e| holds(e, &path)) && !mine.iter().any(|e| holds(e, &path)) {
            let pointer: String = path
                .iter()
                .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
                .collect();
            if !yielded.contains(&pointer) {
                yielded.push(pointer);
            }
        }
    }
    yielded.retain(|p| !owned.contains(&p.as_str()));
    yielded
}

/// The paths to the scalar values of `value` reached through objects only.
fn map_leaves(value: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                at.push(key.clone());
                map_leaves(item, at, out);
                at.pop();
            }
        }
        Value::Array(_) => {}
        _ => out.push(at.clone()),
    }
}

/// `rendered` without the fields at `pointers`.
pub fn without(rendered: &Value, pointers: &[String]) -> Value {
    let mut value = rendered.clone();
    for pointer in pointers {
        if let Some((parent, key)) = pointer.rsplit_once('/')
            && let Some(Value::Object(map)) = value.pointer_mut(parent)
        {
            map.remove(&key.replace("~1", "/").replace("~0", "~"));
        }
    }
    value
}

/// The live values at the fields `rendered` sets (the rendered object's
/// shape, filled from `live`). Projected right after an apply it is what
/// the server made of the render — `cpu: 0.1` stored as `100m` — so drift
/// is then checked against it ([`conforms`]) and a value the server
/// normalises is not drift.
pub fn project(rendered: &Value, live: &Value) -> Value {
    match (rendered, live) {
        (Value::Object(r), Value::Object(l)) => Value::Object(
            r.iter()
                .filter_map(|(k, rv)| l.get(k).map(|lv| (k.clone(), project(rv, lv))))
                .collect(),
        ),
        (Value::Array(r), Value::Array(l)) if r.len() == l.len() => {
            Value::Array(r.iter().zip(l).map(|(rv, lv)| project(rv, lv)).collect())
        }
        // Where the render has a scalar (or a list of another length), the
        // live value shows whether it holds.
        (_, l) => l.clone(),
    }
}

/// What of a live object the plugin's `assess` may see: the fields it
/// rendered (with their live values), `status`, and the few fields health
/// is judged by (`metadata.generation`, `spec.replicas`). Everything else —
/// data of Secrets and ConfigMaps it did not render, fields other
/// controllers wrote — stays with the host.
pub fn assess_view(rendered: &Value, live: &Value) -> Value {
    let mut view = project(rendered, live);
    for pointer in ["/status", "/metadata/generation", "/spec/replicas"] {
        if let Some(value) = live.pointer(pointer) {
            let (parent, key) = pointer.rsplit_once('/').expect("pointers have a parent");
            let mut at = &mut view;
            for part in parent.split('/').skip(1) {
                at = at
                    .as_object_mut()
                    .expect("the view is an object")
                    .entry(part)
                    .or_insert_with(|| Value::Object(Map::new()));
            }
            if let Some(map) = at.as_object_mut() {
                map.insert(key.to_string(), value.clone());
            }
        }
    }
    view
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
