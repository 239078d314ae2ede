//! The host's floor: what an addon render may not contain unless a grant
//! names it, and what no grant allows at all.
//!
//! Object grants say which kinds (and, for the kinds that hand out rights,
//! which named objects) a plugin may apply. The floor looks inside those
//! objects, at the rights they lend, and refuses the whole render, naming
//! the object and the rule, before anything is applied:
//!
//! - [`pods`]: every pod-bearing object meets the Pod Security Standards
//!   level the Plugin's grant names (`Baseline` unless the admin says
//!   `Restricted` or `Privileged`), control by control as the upstream
//!   `pod-security-admission` checks them, and runs only as a
//!   ServiceAccount the render creates, its namespace's `default`, or one
//!   the grant names; a ServiceAccount token Secret likewise;
//! - [`rbac`]: bindings reference only roles and subjects the render
//!   creates (or the grant names), never `cluster-admin` or
//!   `system:masters`; roles carry no aggregation and no escalation route
//!   (`escalate`, `bind`, `impersonate`, `nodes/proxy`, exec, token
//!   requests, reading every Secret) unless the grant names it;
//! - [`routing`]: objects that send the API server's traffic somewhere
//!   (admission webhooks, CRD conversion webhooks, APIServices) send it only
//!   to Services of the render; no Service sets `externalIPs`; a rendered
//!   Namespace's Pod Security labels are no weaker than the grant.
//!
//! Start at [`violations`].

mod aggregation;
mod pods;
mod rbac;
mod routing;
#[cfg(test)]
mod tests;

pub use aggregation::{Aggregator, Aggregators};

use crate::{AddonGrants, Object};
use std::fmt;

/// One object that breaks the floor, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The object (`ClusterRoleBinding evil`).
    pub object: String,
    /// The rule, in words.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.rule)
    }
}

/// Every floor violation in a render (empty: the render may be applied),
/// for a cluster whose aggregating ClusterRoles are `aggregators`.
pub fn violations(
    objects: &[Object],
    grants: &AddonGrants,
    aggregators: &Aggregators,
) -> Vec<Violation> {
    let render = Render(objects);
    let mut found = Vec::new();
    for object in objects {
        let mut refuse = |rule: String| {
            found.push(Violation {
                object: object.entry().to_string(),
                rule,
            })
        };
        rbac::check(object, &render, grants, aggregators, &mut refuse);
        routing::check(object, &render, grants, &mut refuse);
        pods::check(object, &render, grants, &mut refuse);
    }
    found
}

/// Whether a render has a ClusterRole carrying an escalation route: only
/// then does it matter which ClusterRoles aggregate it.
pub fn aggregation_matters(objects: &[Object]) -> bool {
    objects.iter().any(rbac::cluster_role_with_a_route)
}

/// The render being checked: what it creates itself may be referenced
/// without a grant.
pub(crate) struct Render<'a>(&'a [Object]);

impl Render<'_> {
    /// Whether the render creates this object.
    fn has(&self, group: &str, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        self.0.iter().any(|o| {
            o.group() == group
                && o.kind == kind
                && o.namespace.as_deref() == namespace
                && o.name == name
        })
    }

    /// Whether the render creates ServiceAccount `namespace/name`.
    fn has_service_account(&self, namespace: &str, name: &str) -> bool {
        self.has("", "ServiceAccount", Some(namespace), name)
    }
}

/// Whether a pod (or a token) in `namespace` may use ServiceAccount `name`:
/// the render creates it, it is the namespace's `default` (which every pod
/// of the namespace gets anyway), or the grant names it.
fn service_account_lent(
    render: &Render<'_>,
    grants: &AddonGrants,
    namespace: &str,
    name: &str,
) -> bool {
    name == "default"
        || render.has_service_account(namespace, name)
        || grants
            .service_accounts
            .iter()
            .any(|(ns, n)| n == name && ns.as_deref().is_none_or(|ns| ns == namespace))
}
