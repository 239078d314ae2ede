//! RBAC: what a render's roles and bindings may hand out.
//!
//! A binding may reference only a role the render creates (or one the
//! grant's `rbac.roleRefs` names) and only subjects the render creates (or
//! the grant's `rbac.subjects` names); `cluster-admin` and `system:masters`
//! never. A role may not aggregate others (its rules would be whatever
//! matching roles say, now or later), may not grant every verb on every
//! resource, and carries an escalation route (each risk the Kubernetes
//! documentation's RBAC good practices list, [`RbacPower`]) only where
//! `rbac.powers` names it. A ClusterRole aggregated into another
//! ([`super::aggregation`]) is a binding to that role's every holder: it
//! carries a route only where `rbac.aggregateTo` names that role and the
//! route.

use super::Render;
use super::aggregation::Aggregators;
use crate::{AddonGrants, Object, RbacPower};
use serde_json::Value;
use std::collections::BTreeMap;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Check one object if it is a role or a binding.
pub(super) fn check(
    object: &Object,
    render: &Render<'_>,
    grants: &AddonGrants,
    aggregators: &Aggregators,
    refuse: &mut impl FnMut(String),
) {
    if object.group() != RBAC_GROUP {
        return;
    }
    match object.kind.as_str() {
        "ClusterRoleBinding" | "RoleBinding" => binding(object, render, grants, refuse),
        "ClusterRole" | "Role" => role(object, grants, aggregators, refuse),
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

/// Whether `object` is a ClusterRole whose rules carry an escalation route.
pub(super) fn cluster_role_with_a_route(object: &Object) -> bool {
    object.group() == RBAC_GROUP
        && object.kind == "ClusterRole"
        && object.value["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| RbacPower::ALL.into_iter().any(|p| Rule(rule).carries(p)))
}

fn role(
    object: &Object,
    grants: &AddonGrants,
    aggregators: &Aggregators,
    refuse: &mut impl FnMut(String),
) {
    let role = &object.value;
    if role.get("aggregationRule").is_some_and(|a| !a.is_null()) {
        refuse(
            "has an aggregationRule: its rules would be those of every role its selector matches, now or later, which no addon grant allows"
                .into(),
        );
    }
    // Only ClusterRoles are aggregated; a Role's rules stay its own.
    let into = if object.kind == "ClusterRole" {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(role["metadata"]["labels"].clone()).unwrap_or_default();
        aggregators.aggregated_into(&labels)
    } else {
        Ok(Vec::new())
    };
    for (i, rule) in role["rules"].as_array().into_iter().flatten().enumerate() {
        let rule = Rule(rule);
        if rule.lists("verbs", "*") && rule.lists("resources", "*") {
            refuse(format!(
                "rules[{i}] grants every verb on every resource (`*` on `*`), which no addon grant allows"
            ));
            continue;
        }
        for power in RbacPower::ALL.into_iter().filter(|p| rule.carries(*p)) {
            let route = format!(
                "rules[{i}] carries the escalation route `{}` ({}: {})",
                power.name(),
                power.documented_as(),
                power.meaning()
            );
            match &into {
                Ok(into) if into.is_empty() => {
                    if !grants.rbac.powers.contains(&power) {
                        refuse(format!(
                            "{route}, which spec.grants.rbac.powers does not name"
                        ));
                    }
                }
                Ok(into) => {
                    for aggregated in into
                        .iter()
                        .filter(|a| !grants.rbac.lends_through(&a.role, power))
                    {
                        let holders = match aggregated.through.as_slice() {
                            [] => aggregated.role.clone(),
                            through => format!(
                                "{} (and, through it, of {})",
                                aggregated.role,
                                through.join(", ")
                            ),
                        };
                        refuse(format!(
                            "{route} and aggregates into ClusterRole {}, so every holder of {holders} would gain it; spec.grants.rbac.aggregateTo does not name ClusterRole {} with `{}`",
                            aggregated.role,
                            aggregated.role,
                            power.name()
                        ));
                    }
                }
                Err(why) => {
                    if grants.rbac.powers.contains(&power) {
                        refuse(format!(
                            "{route}, and whether the role aggregates into another ClusterRole (lending the route to all its holders) cannot be known: {why}"
                        ));
                    } else {
                        refuse(format!(
                            "{route}, which spec.grants.rbac.powers does not name"
                        ));
                    }
                }
            }
        }
    }
}

/// A request a route is made of: one of `verbs` on one of `resources` in
/// API group `group`.
struct Request {
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
}

const WRITE: &[&str] = &["create", "update", "patch"];
/// The verbs a proxied request maps to (GET, POST, PUT, PATCH, DELETE).
const PROXY: &[&str] = &["get", "create", "update", "patch", "delete"];
/// The verbs of a streaming subresource (a websocket GET, or a POST).
const STREAM: &[&str] = &["get", "create"];

/// The requests that make each route: a rule allowing any one of them
/// carries the route. Several-step routes (a certificate needs a request,
/// its approval and its signature) are refused at the step only a route
/// needs, so no two allowed rules add up to one.
fn requests(power: RbacPower) -> &'static [Request] {
    match power {
        RbacPower::Secrets => &[Request {
            group: "",
            resources: &["secrets"],
            verbs: &["get", "list", "watch"],
        }],
        RbacPower::Workloads => &[
            Request {
                group: "",
                resources: &["pods", "replicationcontrollers"],
                verbs: WRITE,
            },
            Request {
                group: "apps",
                resources: &["deployments", "daemonsets", "statefulsets", "replicasets"],
                verbs: WRITE,
            },
            Request {
                group: "extensions",
                resources: &["deployments", "daemonsets", "replicasets"],
                verbs: WRITE,
            },
            Request {
                group: "batch",
                resources: &["jobs", "cronjobs"],
                verbs: WRITE,
            },
        ],
        RbacPower::PersistentVolumes => &[Request {
            group: "",
            resources: &["persistentvolumes"],
            verbs: WRITE,
        }],
        RbacPower::NodesProxy => &[Request {
            group: "",
            resources: &["nodes/proxy"],
            verbs: PROXY,
        }],
        RbacPower::Escalate => &[Request {
            group: RBAC_GROUP,
            resources: &["roles", "clusterroles"],
            verbs: &["escalate"],
        }],
        RbacPower::Bind => &[Request {
            group: RBAC_GROUP,
            resources: &["roles", "clusterroles"],
            verbs: &["bind"],
        }],
        // Impersonation resources are many (`userextras/<key>` is
        // open-ended): any rule naming the verb carries it (see `carries`).
        RbacPower::Impersonate => &[
            Request {
                group: "",
                resources: &["users", "groups", "serviceaccounts"],
                verbs: &["impersonate"],
            },
            Request {
                group: "authentication.k8s.io",
                resources: &["uids", "userextras/scopes"],
                verbs: &["impersonate"],
            },
        ],
        RbacPower::Certificates => &[
            Request {
                group: "certificates.k8s.io",
                resources: &[
                    "certificatesigningrequests/approval",
                    "certificatesigningrequests/status",
                ],
                verbs: &["update", "patch"],
            },
            Request {
                group: "certificates.k8s.io",
                resources: &["signers"],
                verbs: &["approve", "sign"],
            },
        ],
        RbacPower::ServiceAccountTokens => &[Request {
            group: "",
            resources: &["serviceaccounts/token"],
            verbs: &["create"],
        }],
        RbacPower::Admission => &[Request {
            group: "admissionregistration.k8s.io",
            resources: &[
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
                "validatingadmissionpolicies",
                "validatingadmissionpolicybindings",
                "mutatingadmissionpolicies",
                "mutatingadmissionpolicybindings",
            ],
            verbs: &["create", "update", "patch", "delete", "deletecollection"],
        }],
        RbacPower::Namespaces => &[Request {
            group: "",
            resources: &["namespaces"],
            verbs: &["update", "patch"],
        }],
        RbacPower::EphemeralContainers => &[Request {
            group: "",
            resources: &["pods/ephemeralcontainers"],
            verbs: &["update", "patch"],
        }],
        RbacPower::Exec => &[Request {
            group: "",
            resources: &["pods/exec", "pods/attach"],
            verbs: STREAM,
        }],
        RbacPower::PortForward => &[Request {
            group: "",
            resources: &["pods/portforward"],
            verbs: STREAM,
        }],
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

    /// Whether the rule carries `power`. Naming objects (`resourceNames`)
    /// narrows no route but reading Secrets: an update of one named
    /// Deployment still runs any pod as its ServiceAccount.
    fn carries(&self, power: RbacPower) -> bool {
        if power == RbacPower::Secrets && !self.unnamed() {
            return false;
        }
        if power == RbacPower::Impersonate && self.lists("verbs", "impersonate") {
            return true;
        }
        requests(power).iter().any(|r| {
            r.resources
                .iter()
                .any(|resource| self.allows(r.group, resource, r.verbs))
        })
    }
}
