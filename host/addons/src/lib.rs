//! The addon lifecycle's decisions, with no I/O: given what an addon plugin
//! rendered and what the `Addon` asks for, what exactly is applied, in
//! which order, what is pruned, and whether a live object drifted.
//!
//! The addon controller (`capstan-controllers::addon`) runs these steps on
//! every reconcile, in this order, and applies nothing unless all succeed:
//!
//! 1. [`resolve_version`]: `spec.version` wins, else the channel's version;
//! 2. [`Object::parse`] each rendered text (valid objects, no duplicates);
//! 3. [`label`] them with the Addon they belong to (drift watches select on it);
//! 4. [`apply_patches`]: the Addon's break-glass patches, each of which must
//!    find its target;
//! 5. [`rewrite_images`]: the host's mirror rules, recorded for status;
//! 6. [`check_grants`]: every object within the kinds the plugin declared
//!    *and* the admin granted;
//! 7. [`apply_order`]: CRDs, then Namespaces, then the rest as rendered.
//!
//! Afterwards [`conforms`] says whether a live object still carries what
//! was applied (drift), and [`pruned`] which objects of the previous
//! inventory are no longer rendered.

#![forbid(unsafe_code)]

use capstan_api::{
    AddonPatch, ImageRewriteRecord, InventoryEntry, LABEL_ADDON_NAME, LABEL_ADDON_NAMESPACE,
    PatchType,
};
use capstan_manifest::{ObjectKey, ObjectPattern, group_of};
use serde_json::{Map, Value};
use std::fmt;

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
    /// Objects outside the plugin's declared or granted kinds.
    #[error("refused the whole render, nothing was applied: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused(Vec<Refusal>),
}

/// One rendered object outside what the plugin may apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The object.
    pub object: String,
    /// The pattern that would cover it.
    pub needs: String,
    /// Whether the plugin's manifest declares its kind at all.
    pub declared: bool,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.declared {
            write!(
                f,
                "{} is outside spec.grants.objects (it needs a grant covering {})",
                self.object, self.needs
            )
        } else {
            write!(
                f,
                "{} is outside what the plugin declares (capabilities.objects has no {}), so it cannot be granted",
                self.object, self.needs
            )
        }
    }
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
        }
    }

    /// Its inventory entry.
    pub fn entry(&self) -> InventoryEntry {
        InventoryEntry {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
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

/// Apply `spec.patches` in order. Each patch must find exactly one target
/// and may not change what the object is (apiVersion, kind, name,
/// namespace).
pub fn apply_patches(objects: &mut [Object], patches: &[AddonPatch]) -> Result<(), AddonError> {
    for (index, patch) in patches.iter().enumerate() {
        let t = &patch.target;
        let target_text = match &t.namespace {
            Some(ns) => format!("{} {ns}/{}", t.kind, t.name),
            None => format!("{} {}", t.kind, t.name),
        };
        if !patch.patch.is_object() {
            return Err(AddonError::InvalidPatch {
                index,
                reason: "patch must be a JSON object".into(),
            });
        }
        let matching: Vec<usize> = objects
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.kind == t.kind
                    && o.name == t.name
                    && (t.namespace.is_none() || o.namespace == t.namespace)
            })
            .map(|(i, _)| i)
            .collect();
        let i = match matching.as_slice() {
            [one] => *one,
            [] => {
                return Err(AddonError::PatchTargetMissing {
                    index,
                    target: target_text,
                    rendered: objects
                        .iter()
                        .map(|o| o.entry().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            _ => {
                return Err(AddonError::InvalidPatch {
                    index,
                    reason: format!(
                        "target {target_text} matches {} objects; set target.namespace",
                        matching.len()
                    ),
                });
            }
        };
        let mut value = objects[i].value.clone();
        merge(
            &mut value,
            &patch.patch,
            patch.type_ == PatchType::Strategic,
        );
        let patched = Object::from_value(i, value).map_err(|e| AddonError::InvalidPatch {
            index,
            reason: format!("the patched object is invalid: {e}"),
        })?;
        if !patched.is(&objects[i].entry()) || patched.api_version != objects[i].api_version {
            return Err(AddonError::InvalidPatch {
                index,
                reason:
                    "a patch may not change apiVersion, kind, metadata.name or metadata.namespace"
                        .into(),
            });
        }
        objects[i] = patched;
    }
    Ok(())
}

/// RFC 7386 merge of `patch` into `target`; with `by_name`, lists whose
/// items are all objects with a string `name` are merged item by item.
fn merge(target: &mut Value, patch: &Value, by_name: bool) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (key, value) in p {
                if value.is_null() {
                    t.remove(key);
                } else {
                    merge(t.entry(key.clone()).or_insert(Value::Null), value, by_name);
                }
            }
        }
        (Value::Array(t), Value::Array(p)) if by_name && named(t) && named(p) => {
            for item in p {
                let name = &item["name"];
                match t.iter_mut().find(|x| &x["name"] == name) {
                    Some(existing) => merge(existing, item, by_name),
                    None => t.push(item.clone()),
                }
            }
        }
        (target, patch) => {
            // A merge patch replaces anything that is not an object with
            // the patch's value, dropping nulls inside it (RFC 7386).
            if patch.is_object() {
                *target = Value::Object(Map::new());
                merge(target, patch, by_name);
            } else {
                *target = patch.clone();
            }
        }
    }
}

fn named(items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|i| i["name"].is_string())
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

/// Where the pod spec is in workload kinds.
fn pod_spec_path(kind: &str) -> Option<&'static [&'static str]> {
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

/// Refuse the render unless every object is within a declared kind and a
/// granted pattern. All offending objects are named at once.
pub fn check_grants(
    objects: &[Object],
    declared: &[ObjectPattern],
    granted: &[ObjectPattern],
) -> Result<(), AddonError> {
    let refusals: Vec<Refusal> = objects
        .iter()
        .filter_map(|o| {
            let key = o.key();
            let in_declared = declared.iter().any(|p| p.matches(&key));
            let in_granted = granted.iter().any(|p| p.matches(&key));
            (!in_declared || !in_granted).then(|| Refusal {
                object: o.entry().to_string(),
                needs: ObjectPattern::for_object(&key).to_string(),
                declared: in_declared,
            })
        })
        .collect();
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(AddonError::Refused(refusals))
    }
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
