//! An Addon's break-glass patches ([`apply_patches`]): each finds its
//! target and changes only fields a [`PatchRule`] of the Plugin's grants
//! allows.

use crate::{AddonError, Object};
use capstan_api::AddonPatch;
use capstan_api::PatchType;
use capstan_manifest::ObjectPattern;
use serde_json::{Map, Value};

/// Fields of some objects that an Addon's patches may change (one
/// `spec.grants.patches` entry, parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchRule {
    /// Which objects.
    pub objects: ObjectPattern,
    /// JSON pointer prefixes; a `*` segment stands for any one key or item.
    pub paths: Vec<String>,
}

impl PatchRule {
    /// Whether the rule lets a patch change `path` (a JSON pointer) of `object`.
    pub fn allows(&self, object: &Object, path: &str) -> bool {
        self.objects.matches(&object.key())
            && self.paths.iter().any(|prefix| pointer_within(path, prefix))
    }
}

/// Whether JSON pointer `path` is `prefix` or below it (`*` in the prefix
/// matches one segment).
fn pointer_within(path: &str, prefix: &str) -> bool {
    let path: Vec<&str> = path.split('/').skip(1).collect();
    let prefix: Vec<&str> = prefix
        .split('/')
        .skip(1)
        .filter(|s| !s.is_empty())
        .collect();
    prefix.len() <= path.len() && prefix.iter().zip(&path).all(|(p, s)| *p == "*" || p == s)
}

/// The JSON pointers at which two values differ, as deep as both are
/// objects (a list that changed is one path).
pub fn changed_paths(before: &Value, after: &Value) -> Vec<String> {
    fn walk(before: &Value, after: &Value, at: &str, out: &mut Vec<String>) {
        match (before, after) {
            (Value::Object(a), Value::Object(b)) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let escaped = k.replace('~', "~0").replace('/', "~1");
                    let here = format!("{at}/{escaped}");
                    match (a.get(k), b.get(k)) {
                        (Some(x), Some(y)) => walk(x, y, &here, out),
                        (x, y) if x != y => out.push(here),
                        _ => {}
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    walk(x, y, &format!("{at}/{i}"), out);
                }
            }
            (a, b) if a != b => out.push(at.to_string()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(before, after, "", &mut out);
    out
}

/// Apply `spec.patches` in order. Each patch must find exactly one target,
/// may not change what the object is (apiVersion, kind, name, namespace),
/// and may change only fields some rule of `granted` allows (a tenant's
/// Addon is given only the rules granted to tenants; `tenant` is for the
/// message).
pub fn apply_patches(
    objects: &mut [Object],
    patches: &[AddonPatch],
    granted: &[PatchRule],
    tenant: bool,
) -> Result<(), AddonError> {
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
        let changed = changed_paths(&objects[i].value, &patched.value);
        let refused: Vec<String> = changed
            .iter()
            .filter(|path| !granted.iter().any(|rule| rule.allows(&objects[i], path)))
            .cloned()
            .collect();
        if !refused.is_empty() {
            return Err(AddonError::PatchNotGranted {
                index,
                object: objects[i].entry().to_string(),
                paths: refused,
                tenant,
            });
        }
        let mut patched = patched;
        own_fields(&mut patched.value, &changed);
        objects[i] = patched;
    }
    Ok(())
}

/// Record `paths` in the object's [`crate::ANNOTATION_OWNED_FIELDS`]: what
/// an admin's break-glass patch sets is applied even over a field another
/// manager has taken over.
fn own_fields(object: &mut Value, paths: &[String]) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(annotations) = annotations.as_object_mut() else {
        return;
    };
    let mut owned: Vec<String> = annotations
        .get(crate::ANNOTATION_OWNED_FIELDS)
        .and_then(Value::as_str)
        .map(|list| list.split(',').map(|p| p.trim().to_string()).collect())
        .unwrap_or_default();
    for path in paths {
        if !owned.contains(path) {
            owned.push(path.clone());
        }
    }
    annotations.insert(
        crate::ANNOTATION_OWNED_FIELDS.into(),
        owned.join(",").into(),
    );
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
