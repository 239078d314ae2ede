//! RBAC: what a render's roles and bindings may hand out.
//!
//! A binding may reference only a role the render creates (or one the
//! grant's `rbac.roleRefs` names) and only subjects the render creates (or
//! the grant's `rbac.subjects` names); `cluster-admin` and `system:masters`
//! never. A role may not aggregate others (its rules would be whatever
//! matching roles say, now or later), may not grant every verb on every
//! resource, and carries an escalation route only where `rbac.powers`
//! names it.

use super::Render;
use crate::{AddonGrants, Object, RbacPower};
use serde_json::Value;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Check one object if it is a role or a binding.
pub(super) fn check(
    object: &Object,
    render: &Render<'_>,
    grants: &AddonGrants,
    refuse: &mut impl FnMut(String),
) {
    if object.group() != RBAC_GROUP {
        return;
    }
    match object.kind.as_str() {
        "ClusterRoleBinding" | "RoleBinding" => binding(object, render, grants, refuse),
        "ClusterRole" | "Role" => role(&object.value, grants, refuse),
        _ => {}
    }
}

fn binding(
    object: &Object,
    render: &Render<'_>,
    grants: &AddonGrants,
    refuse: &mut impl FnMut(String),
) {
    let binding = &object.value;
    let role = &binding["roleRef"];
    let role_kind = role["kind"].as_str().unwrap_or_default();
    let role_name = role["name"].as_str().unwrap_or_default();
    let namespace = object.namespace.as_deref();
    if role_kind == "ClusterRole" && role_name == "cluster-admin" {
        refuse("binds ClusterRole cluster-admin, which no addon grant allows".into());
    } else {
        let (role_namespace, shown) = match role_kind {
            "Role" => (
                namespace,
                format!("Role {}/{role_name}", namespace.unwrap_or_default()),
            ),
            _ => (None, format!("{role_kind} {role_name}")),
        };
        let in_render = render.has(RBAC_GROUP, role_kind, role_namespace, role_name);
        let granted = grants.rbac.role_refs.iter().any(|r| {
            r.kind == role_kind && r.name == role_name && r.namespace.as_deref() == role_namespace
        });
        if !in_render && !granted {
            refuse(format!(
                "binds {shown}, which the render does not create and spec.grants.rbac.roleRefs does not name"
            ));
        }
    }
    for subject in binding["subjects"].as_array().into_iter().flatten() {
        let kind = subject["kind"].as_str().unwrap_or_default();
        let name = subject["name"].as_str().unwrap_or_default();
        if kind == "Group" && name == "system:masters" {
            refuse("binds group system:masters, which no addon grant allows".into());
            continue;
        }
        let (subject_namespace, shown) = match kind {
            // A RoleBinding's ServiceAccount subject defaults to its namespace.
            "ServiceAccount" => {
                let ns = subject["namespace"]
                    .as_str()
                    .or(namespace)
                    .unwrap_or_default();
                (Some(ns), format!("ServiceAccount {ns}/{name}"))
            }
            _ => (None, format!("{kind} {name}")),
        };
        let in_render = kind == "ServiceAccount"
            && render.has_service_account(subject_namespace.unwrap_or_default(), name);
        let granted = grants.rbac.subjects.iter().any(|s| {
            s.kind == kind && s.name == name && s.namespace.as_deref() == subject_namespace
        });
        if !in_render && !granted {
            refuse(format!(
                "binds subject {shown}, which the render does not create and spec.grants.rbac.subjects does not name"
            ));
        }
    }
}

fn role(role: &Value, grants: &AddonGrants, refuse: &mut impl FnMut(String)) {
    if role.get("aggregationRule").is_some_and(|a| !a.is_null()) {
        refuse(
            "has an aggregationRule: its rules would be those of every role its selector matches, now or later, which no addon grant allows"
                .into(),
        );
    }
    for (i, rule) in role["rules"].as_array().into_iter().flatten().enumerate() {
        let rule = Rule(rule);
        if rule.lists("verbs", "*") && rule.lists("resources", "*") {
            refuse(format!(
                "rules[{i}] grants every verb on every resource (`*` on `*`), which no addon grant allows"
            ));
            continue;
        }
        for power in RbacPower::ALL {
            if rule.carries(power) && !grants.rbac.powers.contains(&power) {
                refuse(format!(
                    "rules[{i}] carries the escalation route `{}` ({}), which spec.grants.rbac.powers does not name",
                    power.name(),
                    power.meaning()
                ));
            }
        }
    }
}

/// One policy rule of a role.
struct Rule<'a>(&'a Value);

impl Rule<'_> {
    fn lists(&self, field: &str, item: &str) -> bool {
        self.0[field]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i == item))
    }

    /// Whether the rule allows one of `verbs` on `resource` (`pods/exec`
    /// for a subresource) in API group `group`, as RBAC matches them.
    fn allows(&self, group: &str, resource: &str, verbs: &[&str]) -> bool {
        let group_ok = self.lists("apiGroups", group) || self.lists("apiGroups", "*");
        let subresource = resource.split_once('/').map(|(_, s)| format!("*/{s}"));
        let resource_ok = self.lists("resources", resource)
            || self.lists("resources", "*")
            || subresource.is_some_and(|s| self.lists("resources", &s));
        let verb_ok = self.lists("verbs", "*") || verbs.iter().any(|v| self.lists("verbs", v));
        group_ok && resource_ok && verb_ok
    }

    fn unnamed(&self) -> bool {
        self.0["resourceNames"]
            .as_array()
            .is_none_or(|names| names.is_empty())
    }

    fn carries(&self, power: RbacPower) -> bool {
        const ANY: &[&str] = &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        let on_roles = |verb: &str| {
            ["roles", "clusterroles"]
                .iter()
                .any(|r| self.allows(RBAC_GROUP, r, &[verb]))
        };
        match power {
            RbacPower::Escalate => on_roles("escalate"),
            RbacPower::Bind => on_roles("bind"),
            // Any rule naming the verb: impersonation resources are many
            // (`userextras/<key>` is open-ended).
            RbacPower::Impersonate => {
                self.lists("verbs", "impersonate")
                    || ["users", "groups", "serviceaccounts"]
                        .iter()
                        .any(|r| self.allows("", r, &["impersonate"]))
                    || ["uids", "userextras/scopes"]
                        .iter()
                        .any(|r| self.allows("authentication.k8s.io", r, &["impersonate"]))
            }
            RbacPower::NodesProxy => self.allows("", "nodes/proxy", ANY),
            RbacPower::Exec => ["pods/exec", "pods/attach"]
                .iter()
                .any(|r| self.allows("", r, ANY)),
            RbacPower::ServiceAccountTokens => {
                self.allows("", "serviceaccounts/token", &["create"])
            }
            RbacPower::Secrets => {
                self.unnamed() && self.allows("", "secrets", &["get", "list", "watch"])
            }
        }
    }
}
