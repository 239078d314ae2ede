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
//! 1. [`resolve_version`]: `spec.version` wins, else the channel's version;
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
//! live object the plugin's `assess` may see. [`target::check_kubeconfig`]
//! keeps a workload cluster's kubeconfig to inline credentials.

#![forbid(unsafe_code)]

pub mod engine;
pub mod floor;
pub mod ownership;
pub mod target;

pub use capstan_api::PodSecurityLevel;

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

/// What a Plugin's `spec.grants` lets its Addons do, parsed and checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddonGrants {
    /// Objects the plugin may apply (`spec.grants.objects`).
    pub objects: Vec<ObjectPattern>,
    /// The highest Pod Security level of rendered pods.
    pub pod_security: capstan_api::PodSecurityLevel,
    /// Patch rules, each with whether Addons outside Capstan's namespace
    /// may use it.
    pub patches: Vec<(PatchRule, bool)>,
    /// Existing objects Addons may take over.
    pub adopt: Vec<ObjectPattern>,
    /// ServiceAccounts rendered pods may run as without the render creating
    /// them: (namespace, or any namespace of the pod; name).
    pub service_accounts: Vec<(Option<String>, String)>,
    /// What RBAC the render may hand out beyond its own objects.
    pub rbac: RbacLent,
    /// Objects a tenant's Addon may render outside its own namespace.
    pub tenant_objects: Vec<ObjectPattern>,
    /// Where the pod spec is in custom workload kinds.
    pub pod_spec_paths: Vec<PodSpecPath>,
}

/// The parsed `spec.grants.rbac`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RbacLent {
    /// Roles outside the render bindings may reference.
    pub role_refs: Vec<NamedRef>,
    /// Subjects outside the render bindings may name.
    pub subjects: Vec<NamedRef>,
    /// Escalation routes roles may carry.
    pub powers: Vec<RbacPower>,
}

/// A role or subject by kind, namespace (for namespaced kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedRef {
    /// `ClusterRole`, `Role`, `ServiceAccount`, `User` or `Group`.
    pub kind: String,
    /// For `Role` and `ServiceAccount`.
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl NamedRef {
    /// Parse `KIND/NAME` or, for namespaced kinds, `KIND/NAMESPACE/NAME`.
    fn parse(field: &str, text: &str, kinds: &[(&str, bool)]) -> Result<NamedRef, String> {
        let (kind, rest) = text.split_once('/').unwrap_or((text, ""));
        let Some((_, namespaced)) = kinds.iter().find(|(k, _)| *k == kind) else {
            let known: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "{field}: {text:?} starts with {kind:?}; write one of {} followed by /NAME",
                known.join(", ")
            ));
        };
        let (namespace, name) = match (namespaced, rest.split_once('/')) {
            (true, Some((ns, name))) if !ns.is_empty() => (Some(ns.to_string()), name),
            (true, _) => {
                return Err(format!(
                    "{field}: {text:?}: a {kind} is namespaced; write {kind}/NAMESPACE/NAME"
                ));
            }
            // Group and user names may contain `/`.
            (false, _) => (None, rest),
        };
        if name.is_empty() || (*namespaced && name.contains('/')) {
            return Err(format!(
                "{field}: {text:?} names no {kind}; write {kind}/NAME"
            ));
        }
        Ok(NamedRef {
            kind: kind.to_string(),
            namespace,
            name: name.to_string(),
        })
    }
}

/// An RBAC escalation route a role can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RbacPower {
    /// The `escalate` verb on roles: write rules one does not hold.
    Escalate,
    /// The `bind` verb on roles: bind roles one does not hold.
    Bind,
    /// The `impersonate` verb: act as another user, group or ServiceAccount.
    Impersonate,
    /// `nodes/proxy`: the kubelet API, which runs commands in any pod of a Node.
    NodesProxy,
    /// `pods/exec` or `pods/attach`: run commands in pods.
    Exec,
    /// `serviceaccounts/token`: mint tokens for ServiceAccounts.
    ServiceAccountTokens,
    /// Reading every Secret (`get`, `list` or `watch` on `secrets` without
    /// `resourceNames`).
    Secrets,
}

impl RbacPower {
    /// Every route, in the order refusals list them.
    pub const ALL: [RbacPower; 7] = [
        RbacPower::Escalate,
        RbacPower::Bind,
        RbacPower::Impersonate,
        RbacPower::NodesProxy,
        RbacPower::Exec,
        RbacPower::ServiceAccountTokens,
        RbacPower::Secrets,
    ];

    /// How `spec.grants.rbac.powers` names it.
    pub fn name(self) -> &'static str {
        match self {
            RbacPower::Escalate => "escalate",
            RbacPower::Bind => "bind",
            RbacPower::Impersonate => "impersonate",
            RbacPower::NodesProxy => "nodes/proxy",
            RbacPower::Exec => "exec",
            RbacPower::ServiceAccountTokens => "serviceaccounts/token",
            RbacPower::Secrets => "secrets",
        }
    }

    /// What it lends, in words.
    pub fn meaning(self) -> &'static str {
        match self {
            RbacPower::Escalate => "write role rules its holder does not have",
            RbacPower::Bind => "bind roles its holder does not have",
            RbacPower::Impersonate => "act as other users, groups or ServiceAccounts",
            RbacPower::NodesProxy => "the kubelet API, commands in any pod of a Node",
            RbacPower::Exec => "commands in running pods",
            RbacPower::ServiceAccountTokens => "tokens of ServiceAccounts",
            RbacPower::Secrets => "every Secret it can list",
        }
    }
}

/// Where the pod spec is in a custom workload kind (`spec.grants.podSpecPaths`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpecPath {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// JSON pointer to the pod spec.
    pub pointer: String,
}

impl std::str::FromStr for PodSpecPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let wrong = || {
            format!(
                "{s:?}: write GROUP/KIND=/json/pointer, for example example.com/Agent=/spec/template/spec"
            )
        };
        let (kind, pointer) = s.split_once('=').ok_or_else(wrong)?;
        let (group, kind) = kind.rsplit_once('/').ok_or_else(wrong)?;
        if group.is_empty() || kind.is_empty() || !pointer.starts_with('/') {
            return Err(wrong());
        }
        Ok(PodSpecPath {
            group: group.to_string(),
            kind: kind.to_string(),
            pointer: pointer.to_string(),
        })
    }
}

/// Whether a patch grant's path is too broad to grant: the whole object,
/// any top-level field, or metadata beyond labels and annotations (a patch
/// there could rewrite owner references, finalizers, the name).
fn too_broad(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        [] | [""] => true,
        [first, ..] if *first == "*" || *first == "apiVersion" || *first == "kind" => true,
        ["metadata"] => true,
        ["metadata", second, ..] => *second != "labels" && *second != "annotations",
        _ => false,
    }
}

impl AddonGrants {
    /// Parse a Plugin's grants; errors name the field. Kinds that hand out
    /// rights must be granted by name, and adopt grants always name.
    pub fn from_spec(grants: &capstan_api::PluginGrants) -> Result<AddonGrants, String> {
        let pattern = |field: String, text: &str| -> Result<ObjectPattern, String> {
            text.parse::<ObjectPattern>()
                .map_err(|e| format!("{field}: {e}"))
        };
        let mut objects = Vec::new();
        for (i, text) in grants.objects.iter().enumerate() {
            let p = pattern(format!("spec.grants.objects[{i}]"), text)?;
            if p.needs_name() && p.name.is_none() {
                return Err(format!(
                    "spec.grants.objects[{i}]: `{text}` grants every {} — a kind that hands out rights over the cluster is only granted by name, for example `{}/NAME`",
                    p.kind,
                    text.split('@').next().unwrap_or(text)
                ));
            }
            objects.push(p);
        }
        let mut patches = Vec::new();
        for (i, g) in grants.patches.iter().enumerate() {
            let objects = pattern(format!("spec.grants.patches[{i}].objects"), &g.objects)?;
            if let Some(bad) = g.paths.iter().find(|p| !p.starts_with('/')) {
                return Err(format!(
                    "spec.grants.patches[{i}].paths: {bad:?} is not a JSON pointer; write it like /spec/replicas"
                ));
            }
            if let Some(bad) = g.paths.iter().find(|p| too_broad(p)) {
                return Err(format!(
                    "spec.grants.patches[{i}].paths: {bad:?} would let a patch rewrite the whole object or its identity (owner references, finalizers, name); name the fields, for example /spec/replicas or /metadata/labels"
                ));
            }
            patches.push((
                PatchRule {
                    objects,
                    paths: g.paths.clone(),
                },
                g.tenants,
            ));
        }
        let mut adopt = Vec::new();
        for (i, text) in grants.adopt.iter().enumerate() {
            let p = pattern(format!("spec.grants.adopt[{i}]"), text)?;
            if p.name.is_none() {
                return Err(format!(
                    "spec.grants.adopt[{i}]: `{text}` names no object; adopt grants name each object, for example `Namespace/monitoring`"
                ));
            }
            adopt.push(p);
        }
        let mut service_accounts = Vec::new();
        for (i, text) in grants.service_accounts.iter().enumerate() {
            let account = match text.split_once('/') {
                None => (None, text.as_str()),
                Some((ns, name)) => (Some(ns.to_string()), name),
            };
            if account.1.is_empty() || account.1.contains('/') || account.0.as_deref() == Some("") {
                return Err(format!(
                    "spec.grants.serviceAccounts[{i}]: {text:?}: write NAME or NAMESPACE/NAME"
                ));
            }
            service_accounts.push((account.0, account.1.to_string()));
        }
        let rbac = match &grants.rbac {
            None => RbacLent::default(),
            Some(r) => rbac_lent(r)?,
        };
        let tenant_objects = grants
            .tenant_objects
            .iter()
            .enumerate()
            .map(|(i, t)| pattern(format!("spec.grants.tenantObjects[{i}]"), t))
            .collect::<Result<_, _>>()?;
        let pod_spec_paths = grants
            .pod_spec_paths
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.parse()
                    .map_err(|e| format!("spec.grants.podSpecPaths[{i}]: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(AddonGrants {
            objects,
            pod_security: grants.pod_security.unwrap_or_default(),
            patches,
            adopt,
            service_accounts,
            rbac,
            tenant_objects,
            pod_spec_paths,
        })
    }

    /// The patch rules an Addon may use: all of them in Capstan's own
    /// namespace, only those granted to tenants elsewhere.
    pub fn patch_rules(&self, tenant: bool) -> Vec<PatchRule> {
        self.patches
            .iter()
            .filter(|(_, for_tenants)| !tenant || *for_tenants)
            .map(|(rule, _)| rule.clone())
            .collect()
    }
}

fn rbac_lent(rbac: &capstan_api::RbacGrant) -> Result<RbacLent, String> {
    let mut lent = RbacLent::default();
    for (i, text) in rbac.role_refs.iter().enumerate() {
        let r = NamedRef::parse(
            &format!("spec.grants.rbac.roleRefs[{i}]"),
            text,
            &[("ClusterRole", false), ("Role", true)],
        )?;
        if r.kind == "ClusterRole" && r.name == "cluster-admin" {
            return Err(format!(
                "spec.grants.rbac.roleRefs[{i}]: ClusterRole/cluster-admin is never granted to an addon"
            ));
        }
        lent.role_refs.push(r);
    }
    for (i, text) in rbac.subjects.iter().enumerate() {
        let s = NamedRef::parse(
            &format!("spec.grants.rbac.subjects[{i}]"),
            text,
            &[("ServiceAccount", true), ("User", false), ("Group", false)],
        )?;
        if s.kind == "Group" && s.name == "system:masters" {
            return Err(format!(
                "spec.grants.rbac.subjects[{i}]: Group/system:masters is never granted to an addon"
            ));
        }
        lent.subjects.push(s);
    }
    for (i, text) in rbac.powers.iter().enumerate() {
        let power = RbacPower::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = RbacPower::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "spec.grants.rbac.powers[{i}]: {text:?} is not an escalation route; known: {}",
                    known.join(", ")
                )
            })?;
        lent.powers.push(power);
    }
    Ok(lent)
}

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

/// One rendered object outside what the plugin may apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The object.
    pub object: String,
    /// The pattern that would cover it.
    pub needs: String,
    /// Why it is refused.
    pub reason: RefusalReason,
}

/// Why a rendered object is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    /// The plugin's manifest does not declare its kind.
    Undeclared,
    /// No `spec.grants.objects` entry covers it.
    Ungranted,
    /// A tenant's Addon rendered it outside the tenant's namespace (named)
    /// and no `spec.grants.tenantObjects` entry covers it.
    OutsideTenantNamespace(String),
}

impl Refusal {
    fn new(object: &Object, reason: RefusalReason) -> Refusal {
        let mut needs = ObjectPattern::for_object(&object.key());
        if reason == RefusalReason::Undeclared {
            // Manifests declare kinds; a name would mislead here.
            needs.name = None;
        }
        Refusal {
            object: object.entry().to_string(),
            needs: needs.to_string(),
            reason,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (object, needs) = (&self.object, &self.needs);
        match &self.reason {
            RefusalReason::Ungranted => write!(
                f,
                "{object} is outside spec.grants.objects (it needs a grant covering {needs})"
            ),
            RefusalReason::Undeclared => write!(
                f,
                "{object} is outside what the plugin declares (capabilities.objects has no {needs}), so it cannot be granted"
            ),
            RefusalReason::OutsideTenantNamespace(ns) => write!(
                f,
                "{object} is outside namespace {ns}: an Addon outside Capstan's namespace renders only into its own namespace unless the Plugin's spec.grants.tenantObjects covers the object ({needs})"
            ),
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
        let refused: Vec<String> = changed_paths(&objects[i].value, &patched.value)
            .into_iter()
            .filter(|path| !granted.iter().any(|rule| rule.allows(&objects[i], path)))
            .collect();
        if !refused.is_empty() {
            return Err(AddonError::PatchNotGranted {
                index,
                object: objects[i].entry().to_string(),
                paths: refused,
                tenant,
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

/// Refuse the render unless every object is within a declared kind and a
/// granted pattern, a tenant's (`tenant`: its namespace) within its
/// namespace or `tenantObjects`, and nothing breaks the host's
/// [`floor`] as far as the grants lend. All offending objects are named at
/// once.
pub fn check_grants(
    objects: &[Object],
    declared: &[ObjectPattern],
    grants: &AddonGrants,
    tenant: Option<&str>,
) -> Result<(), AddonError> {
    let refusals: Vec<Refusal> = objects
        .iter()
        .filter_map(|o| {
            let key = o.key();
            let reason = if !declared.iter().any(|p| p.matches(&key)) {
                RefusalReason::Undeclared
            } else if !grants.objects.iter().any(|p| p.matches(&key)) {
                RefusalReason::Ungranted
            } else if let Some(ns) = tenant
                && o.namespace.as_deref() != Some(ns)
                && !grants.tenant_objects.iter().any(|p| p.matches(&key))
            {
                RefusalReason::OutsideTenantNamespace(ns.to_string())
            } else {
                return None;
            };
            Some(Refusal::new(o, reason))
        })
        .collect();
    if !refusals.is_empty() {
        return Err(AddonError::Refused(refusals));
    }
    let below = floor::violations(objects, grants);
    if below.is_empty() {
        Ok(())
    } else {
        Err(AddonError::Floor(below))
    }
}

/// Whether an inventory entry is still within the grants: prune and delete
/// act only on objects the Addon could render now (a grant narrowed since
/// leaves the object alone), a tenant's (`tenant`: its namespace) only in
/// its namespace or `tenantObjects`.
pub fn still_granted(entry: &InventoryEntry, grants: &AddonGrants, tenant: Option<&str>) -> bool {
    let key = ObjectKey {
        group: group_of(&entry.api_version),
        kind: &entry.kind,
        namespace: entry.namespace.as_deref(),
        name: &entry.name,
    };
    grants.objects.iter().any(|p| p.matches(&key))
        && tenant.is_none_or(|ns| {
            entry.namespace.as_deref() == Some(ns)
                || grants.tenant_objects.iter().any(|p| p.matches(&key))
        })
}

/// The rendered objects whose kind the plugin's manifest does not declare
/// (what the conformance kit checks: the declaration, not the grants).
pub fn undeclared(objects: &[Object], declared: &[ObjectPattern]) -> Vec<Refusal> {
    objects
        .iter()
        .filter(|o| !declared.iter().any(|p| p.matches(&o.key())))
        .map(|o| Refusal::new(o, RefusalReason::Undeclared))
        .collect()
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
