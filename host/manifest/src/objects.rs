//! Object patterns: which Kubernetes objects an addon plugin may render.
//!
//! An addon plugin's manifest declares the kinds it renders
//! (`capabilities.objects`), and the admin grants kinds on the Plugin
//! (`spec.grants.objects`) in the same text form:
//!
//! - `ConfigMap@kube-system`: core-group ConfigMaps in namespace `kube-system`;
//! - `apps/Deployment@*`: Deployments in any namespace;
//! - `rbac.authorization.k8s.io/ClusterRole`: a cluster-scoped kind (no `@`).
//!
//! - `rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns`: one
//!   object, by name.
//!
//! The group comes before the kind (none for the core group), the kind is
//! written as in `kind:`, an object name may follow it after a `/`, and the
//! scope comes after `@`. Versions are not part of a pattern: a grant is
//! about what an object is, not how it is spelled.
//!
//! Kinds that hand out rights over the cluster (RBAC, admission webhooks,
//! CRDs, API services, Namespaces) can only be granted by name
//! ([`ObjectPattern::needs_name`]): granting "any ClusterRoleBinding" would
//! let any later revision bind `cluster-admin`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where objects of a pattern live.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectScope {
    /// A cluster-scoped kind (the object has no namespace).
    Cluster,
    /// One namespace.
    Namespace(String),
    /// Any namespace (`@*`).
    AnyNamespace,
}

/// A group, kind and scope, such as `apps/Deployment@kube-system`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectPattern {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind, as in an object's `kind`.
    pub kind: String,
    /// Where.
    pub scope: ObjectScope,
    /// One object's name; `None` for every object of the kind.
    pub name: Option<String>,
}

/// Kinds that can only be granted by name, as (group, kind).
pub const NAMED_ONLY: &[(&str, &str)] = &[
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io", "Role"),
    ("rbac.authorization.k8s.io", "RoleBinding"),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
    ),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ("apiregistration.k8s.io", "APIService"),
    ("", "Namespace"),
];

/// The identity of one rendered object, as far as grants are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKey<'a> {
    /// API group (empty for core).
    pub group: &'a str,
    /// Kind.
    pub kind: &'a str,
    /// Namespace; `None` for a cluster-scoped object.
    pub namespace: Option<&'a str>,
    /// Name.
    pub name: &'a str,
}

impl ObjectPattern {
    /// Whether an object is within this pattern.
    pub fn matches(&self, object: &ObjectKey<'_>) -> bool {
        self.group == object.group
            && self.kind == object.kind
            && self.name.as_deref().is_none_or(|n| n == object.name)
            && match (&self.scope, object.namespace) {
                (ObjectScope::Cluster, None) => true,
                (ObjectScope::AnyNamespace, Some(_)) => true,
                (ObjectScope::Namespace(ns), Some(n)) => ns == n,
                _ => false,
            }
    }

    /// Whether this pattern names the same group and kind as `other`.
    pub fn same_kind(&self, other: &ObjectPattern) -> bool {
        self.group == other.group && self.kind == other.kind
    }

    /// Whether grants of this kind must name the object.
    pub fn needs_name(&self) -> bool {
        NAMED_ONLY
            .iter()
            .any(|(g, k)| *g == self.group && *k == self.kind)
    }

    /// The pattern text an object would need to be granted (for messages):
    /// named for the kinds that are only granted by name.
    pub fn for_object(object: &ObjectKey<'_>) -> ObjectPattern {
        let mut pattern = ObjectPattern {
            group: object.group.to_string(),
            kind: object.kind.to_string(),
            scope: match object.namespace {
                None => ObjectScope::Cluster,
                Some(ns) => ObjectScope::Namespace(ns.to_string()),
            },
            name: None,
        };
        if pattern.needs_name() {
            pattern.name = Some(object.name.to_string());
        }
        pattern
    }
}

impl fmt::Display for ObjectPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.group.is_empty() {
            write!(f, "{}/", self.group)?;
        }
        f.write_str(&self.kind)?;
        if let Some(name) = &self.name {
            write!(f, "/{name}")?;
        }
        match &self.scope {
            ObjectScope::Cluster => Ok(()),
            ObjectScope::Namespace(ns) => write!(f, "@{ns}"),
            ObjectScope::AnyNamespace => f.write_str("@*"),
        }
    }
}

/// An RFC 1123 label, as Kubernetes requires of namespace names and of
/// each dot-separated part of most object names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Names as Kubernetes allows them for the kinds grants name (RBAC names
/// may hold `:`, as in `system:coredns`).
fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b':')
        })
}

impl FromStr for ObjectPattern {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let example = "write it as [group/]Kind[/name][@namespace|@*], for example `apps/Deployment@kube-system`, `ConfigMap@*` or `rbac.authorization.k8s.io/ClusterRole/system:coredns`";
        let (kinded, scope) = match text.split_once('@') {
            None => (text, ObjectScope::Cluster),
            Some((k, "*")) => (k, ObjectScope::AnyNamespace),
            Some((k, ns)) if is_dns_label(ns) => (k, ObjectScope::Namespace(ns.to_string())),
            Some((_, ns)) => {
                return Err(format!(
                    "`{text}`: namespace `{ns}` is not a DNS label or `*`; {example}"
                ));
            }
        };
        // The kind is the last part that starts with an upper-case letter:
        // names (which may follow it) never do.
        let parts: Vec<&str> = kinded.split('/').collect();
        let at = parts
            .iter()
            .rposition(|p| p.starts_with(|c: char| c.is_ascii_uppercase()))
            .unwrap_or(parts.len() - 1);
        let group = parts[..at].join("/");
        let group = group.as_str();
        let kind = parts.get(at).copied().unwrap_or("");
        let name = match &parts[(at + 1).min(parts.len())..] {
            [] => None,
            [n] if is_object_name(n) => Some(n.to_string()),
            rest => {
                return Err(format!(
                    "`{text}`: `{}` is not an object name (names are lower-case, with `-`, `.` or `:`); {example}",
                    rest.join("/")
                ));
            }
        };
        let group_ok = group.is_empty() || group.split('.').all(is_dns_label);
        if !group_ok {
            return Err(format!(
                "`{text}`: group `{group}` is not an API group (core kinds have no group; others look like `apps` or `rbac.authorization.k8s.io`); {example}"
            ));
        }
        let kind_ok = kind.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && kind.chars().all(|c| c.is_ascii_alphanumeric());
        if !kind_ok {
            return Err(format!(
                "`{text}`: kind `{kind}` must be written as in `kind:` (for example `Deployment`); {example}"
            ));
        }
        Ok(ObjectPattern {
            group: group.to_string(),
            kind: kind.to_string(),
            scope,
            name,
        })
    }
}

impl Serialize for ObjectPattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ObjectPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The declared kinds that no grant names at all: what an admin must grant
/// before a revision is activated. A grant may narrow a declared kind's
/// scope (declared `ConfigMap@*`, granted `ConfigMap@kube-system`); rendered
/// objects are then checked against both.
pub fn ungranted_kinds(declared: &[ObjectPattern], granted: &[ObjectPattern]) -> Vec<String> {
    let mut missing: Vec<String> = declared
        .iter()
        .filter(|d| !granted.iter().any(|g| g.same_kind(d)))
        .map(|d| format!("objects {d}"))
        .collect();
    missing.dedup();
    missing
}

/// Group one of the well-known API groups is served under (`apps/v1` →
/// `apps`, `v1` → core).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ObjectPattern {
        s.parse().unwrap()
    }

    fn key<'a>(group: &'a str, kind: &'a str, namespace: Option<&'a str>) -> ObjectKey<'a> {
        ObjectKey {
            group,
            kind,
            namespace,
            name: "x",
        }
    }

    #[test]
    fn patterns_can_name_one_object() {
        let named = p("rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns");
        assert_eq!(named.name.as_deref(), Some("system:coredns"));
        assert_eq!(named.kind, "ClusterRoleBinding");
        assert_eq!(
            named.to_string(),
            "rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns"
        );
        let mut crb = key("rbac.authorization.k8s.io", "ClusterRoleBinding", None);
        crb.name = "system:coredns";
        assert!(named.matches(&crb));
        crb.name = "cluster-admin-for-me";
        assert!(!named.matches(&crb));
        let cm = p("ConfigMap/coredns@kube-system");
        assert_eq!(
            (cm.group.as_str(), cm.name.as_deref()),
            ("", Some("coredns"))
        );
        assert_eq!(cm.to_string(), "ConfigMap/coredns@kube-system");
        let e = "ConfigMap/Bad_Name@x".parse::<ObjectPattern>().unwrap_err();
        assert!(e.starts_with("`ConfigMap/Bad_Name@x`: "), "{e}");
        let e = "ConfigMap/a/b".parse::<ObjectPattern>().unwrap_err();
        assert!(e.contains("`a/b` is not an object name"), "{e}");
    }

    #[test]
    fn rights_handing_kinds_need_names() {
        for kind in [
            "rbac.authorization.k8s.io/ClusterRoleBinding",
            "rbac.authorization.k8s.io/RoleBinding@*",
            "admissionregistration.k8s.io/MutatingWebhookConfiguration",
            "apiextensions.k8s.io/CustomResourceDefinition",
            "Namespace",
        ] {
            assert!(p(kind).needs_name(), "{kind}");
        }
        assert!(!p("apps/Deployment@*").needs_name());
        let mut ns = key("", "Namespace", None);
        ns.name = "monitoring";
        assert_eq!(
            ObjectPattern::for_object(&ns).to_string(),
            "Namespace/monitoring"
        );
    }

    #[test]
    fn patterns_parse_and_print_back() {
        for text in [
            "ConfigMap@kube-system",
            "apps/Deployment@*",
            "rbac.authorization.k8s.io/ClusterRole",
            "apiextensions.k8s.io/CustomResourceDefinition",
            "Namespace",
        ] {
            assert_eq!(p(text).to_string(), text);
        }
        assert_eq!(p("apps/Deployment@*").scope, ObjectScope::AnyNamespace);
        assert_eq!(p("Namespace").scope, ObjectScope::Cluster);
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        let e = "deployment@kube-system"
            .parse::<ObjectPattern>()
            .unwrap_err();
        assert!(e.contains("kind `deployment`"), "{e}");
        let e = "ConfigMap@Kube_System"
            .parse::<ObjectPattern>()
            .unwrap_err();
        assert!(e.contains("namespace `Kube_System`"), "{e}");
        let e = "Apps/Deployment".parse::<ObjectPattern>().unwrap_err();
        assert!(e.contains("group `Apps`"), "{e}");
        assert!("".parse::<ObjectPattern>().is_err());
    }

    #[test]
    fn matching_respects_group_kind_and_scope() {
        let dep = key("apps", "Deployment", Some("kube-system"));
        assert!(p("apps/Deployment@kube-system").matches(&dep));
        assert!(p("apps/Deployment@*").matches(&dep));
        assert!(!p("apps/Deployment@default").matches(&dep));
        assert!(!p("apps/Deployment").matches(&dep), "cluster scope");
        assert!(!p("Deployment@*").matches(&dep), "core group");
        assert!(!p("apps/DaemonSet@*").matches(&dep));
        let crb = key("rbac.authorization.k8s.io", "ClusterRoleBinding", None);
        assert!(p("rbac.authorization.k8s.io/ClusterRoleBinding").matches(&crb));
        assert!(!p("rbac.authorization.k8s.io/ClusterRoleBinding@*").matches(&crb));
    }

    #[test]
    fn a_declared_kind_needs_a_grant_of_that_kind_in_some_scope() {
        let declared = vec![
            p("ConfigMap@*"),
            p("apps/Deployment@*"),
            p("rbac.authorization.k8s.io/ClusterRoleBinding"),
        ];
        let granted = vec![p("ConfigMap@kube-system"), p("apps/Deployment@*")];
        assert_eq!(
            ungranted_kinds(&declared, &granted),
            vec!["objects rbac.authorization.k8s.io/ClusterRoleBinding"]
        );
        assert!(ungranted_kinds(&declared[..2], &granted).is_empty());
    }

    #[test]
    fn groups_come_from_api_versions() {
        assert_eq!(group_of("v1"), "");
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(
            group_of("rbac.authorization.k8s.io/v1"),
            "rbac.authorization.k8s.io"
        );
    }
}
