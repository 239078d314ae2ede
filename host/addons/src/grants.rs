//! What a Plugin's `spec.grants` lets its Addons do ([`AddonGrants`],
//! parsed with every mistake naming its field), and the grant check of a
//! render ([`check_grants`]): every object within a declared kind and a
//! granted pattern, a tenant's within its namespace, nothing below the
//! [`floor`](crate::floor).

use crate::{AddonError, Object, PatchRule, floor};
use capstan_api::InventoryEntry;
use capstan_manifest::{ObjectKey, ObjectPattern, group_of};
use std::fmt;

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
    /// Escalation routes a ClusterRole that aggregates into another may
    /// carry, by aggregating role.
    pub aggregate_to: Vec<AggregationLent>,
}

impl RbacLent {
    /// Whether a ClusterRole aggregating into `cluster_role` may carry `power`.
    pub fn lends_through(&self, cluster_role: &str, power: RbacPower) -> bool {
        self.aggregate_to
            .iter()
            .any(|a| a.cluster_role == cluster_role && a.powers.contains(&power))
    }
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

/// An RBAC escalation route a role can carry: each privilege-escalation
/// risk the Kubernetes documentation lists in "Role Based Access Control
/// Good Practices", one rule each. Which requests make each route is in
/// the floor ([`crate::floor`]); a role carries a route when one of its
/// rules allows one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RbacPower {
    /// Listing secrets: `get`, `list` or `watch` on `secrets` without
    /// `resourceNames`.
    Secrets,
    /// Workload creation: `create`, `update` or `patch` on pods or any
    /// controller that makes pods, which run as any ServiceAccount of
    /// their namespace and mount any of its Secrets.
    Workloads,
    /// Persistent volume creation: a `hostPath` PersistentVolume opens the
    /// Node's filesystem to whoever claims it.
    PersistentVolumes,
    /// Access to the proxy subresource of Nodes: the kubelet API, which
    /// runs commands in any pod of a Node.
    NodesProxy,
    /// The `escalate` verb on roles: write rules one does not hold.
    Escalate,
    /// The `bind` verb on roles: bind roles one does not hold.
    Bind,
    /// The `impersonate` verb: act as another user, group or ServiceAccount.
    Impersonate,
    /// CSRs and certificate issuing: approving (`certificatesigningrequests/approval`,
    /// `approve` on `signers`) or issuing (`certificatesigningrequests/status`,
    /// `sign` on `signers`) client certificates, for any user or group.
    Certificates,
    /// Token request: `create` on `serviceaccounts/token`.
    ServiceAccountTokens,
    /// Control admission webhooks: write or delete admission webhook
    /// configurations and admission policies, which see or change every
    /// object written.
    Admission,
    /// Namespace modification: `update` or `patch` on Namespaces, whose
    /// labels lift Pod Security and select network policies.
    Namespaces,
    /// Ephemeral containers: `update` or `patch` on
    /// `pods/ephemeralcontainers` runs any image inside a running pod.
    EphemeralContainers,
    /// `pods/exec` or `pods/attach`: run commands in pods.
    Exec,
    /// `pods/portforward`: reach any port of a pod, past its network policies.
    PortForward,
}

impl RbacPower {
    /// Every route, in the order refusals list them.
    pub const ALL: [RbacPower; 14] = [
        RbacPower::Secrets,
        RbacPower::Workloads,
        RbacPower::PersistentVolumes,
        RbacPower::NodesProxy,
        RbacPower::Escalate,
        RbacPower::Bind,
        RbacPower::Impersonate,
        RbacPower::Certificates,
        RbacPower::ServiceAccountTokens,
        RbacPower::Admission,
        RbacPower::Namespaces,
        RbacPower::EphemeralContainers,
        RbacPower::Exec,
        RbacPower::PortForward,
    ];

    /// How `spec.grants.rbac.powers` names it.
    pub fn name(self) -> &'static str {
        match self {
            RbacPower::Secrets => "secrets",
            RbacPower::Workloads => "workloads",
            RbacPower::PersistentVolumes => "persistentvolumes",
            RbacPower::NodesProxy => "nodes/proxy",
            RbacPower::Escalate => "escalate",
            RbacPower::Bind => "bind",
            RbacPower::Impersonate => "impersonate",
            RbacPower::Certificates => "certificates",
            RbacPower::ServiceAccountTokens => "serviceaccounts/token",
            RbacPower::Admission => "admission",
            RbacPower::Namespaces => "namespaces",
            RbacPower::EphemeralContainers => "pods/ephemeralcontainers",
            RbacPower::Exec => "exec",
            RbacPower::PortForward => "pods/portforward",
        }
    }

    /// What it lends, in words.
    pub fn meaning(self) -> &'static str {
        match self {
            RbacPower::Secrets => "every Secret it can list",
            RbacPower::Workloads => {
                "pods that run as any ServiceAccount of their namespace and mount its Secrets"
            }
            RbacPower::PersistentVolumes => "hostPath volumes onto a Node's filesystem",
            RbacPower::NodesProxy => "the kubelet API, commands in any pod of a Node",
            RbacPower::Escalate => "write role rules its holder does not have",
            RbacPower::Bind => "bind roles its holder does not have",
            RbacPower::Impersonate => "act as other users, groups or ServiceAccounts",
            RbacPower::Certificates => "client certificates for any user or group",
            RbacPower::ServiceAccountTokens => "tokens of ServiceAccounts",
            RbacPower::Admission => "see, change or stop checking every object written",
            RbacPower::Namespaces => {
                "relabel a namespace: lift its Pod Security level, leave its network policies"
            }
            RbacPower::EphemeralContainers => "any image inside running pods",
            RbacPower::Exec => "commands in running pods",
            RbacPower::PortForward => "any port of a pod, past its network policies",
        }
    }

    /// The heading of the Kubernetes documentation's "privilege
    /// escalation risks" (or of the access it names) for this route.
    pub fn documented_as(self) -> &'static str {
        match self {
            RbacPower::Secrets => "Listing secrets",
            RbacPower::Workloads => "Workload creation",
            RbacPower::PersistentVolumes => "Persistent volume creation",
            RbacPower::NodesProxy => "Access to proxy subresource of Nodes",
            RbacPower::Escalate => "Escalate verb",
            RbacPower::Bind => "Bind verb",
            RbacPower::Impersonate => "Impersonate verb",
            RbacPower::Certificates => "CSRs and certificate issuing",
            RbacPower::ServiceAccountTokens => "Token request",
            RbacPower::Admission => "Control admission webhooks",
            RbacPower::Namespaces => "Namespace modification",
            RbacPower::EphemeralContainers => "Ephemeral containers",
            RbacPower::Exec => "pods/exec and pods/attach",
            RbacPower::PortForward => "pods/portforward",
        }
    }

    /// The route `spec.grants` names `text`, or why it names none.
    pub fn parse(field: &str, text: &str) -> Result<RbacPower, String> {
        RbacPower::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = RbacPower::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "{field}: {text:?} is not an escalation route; known: {}",
                    known.join(", ")
                )
            })
    }
}

/// Routes a rendered ClusterRole that aggregates into `cluster_role` may
/// carry (`spec.grants.rbac.aggregateTo`): every holder of that role gains
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregationLent {
    /// The aggregating ClusterRole (`view`, `edit`, `admin`, or one of the
    /// cluster's own).
    pub cluster_role: String,
    /// The routes.
    pub powers: Vec<RbacPower>,
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
        lent.powers.push(RbacPower::parse(
            &format!("spec.grants.rbac.powers[{i}]"),
            text,
        )?);
    }
    for (i, a) in rbac.aggregate_to.iter().enumerate() {
        let field = format!("spec.grants.rbac.aggregateTo[{i}]");
        if a.cluster_role.is_empty() || a.cluster_role.contains('/') {
            return Err(format!(
                "{field}.clusterRole: {:?} is not a ClusterRole name; write the aggregating role's name, such as view",
                a.cluster_role
            ));
        }
        if a.cluster_role == "cluster-admin" {
            return Err(format!(
                "{field}.clusterRole: nothing is aggregated into cluster-admin through an addon grant"
            ));
        }
        let powers = a
            .powers
            .iter()
            .enumerate()
            .map(|(j, text)| RbacPower::parse(&format!("{field}.powers[{j}]"), text))
            .collect::<Result<Vec<_>, _>>()?;
        if powers.is_empty() {
            return Err(format!(
                "{field}.powers: name the routes roles aggregated into {} may carry (an entry without routes lends nothing)",
                a.cluster_role
            ));
        }
        lent.aggregate_to.push(AggregationLent {
            cluster_role: a.cluster_role.clone(),
            powers,
        });
    }
    Ok(lent)
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

/// Refuse the render unless every object is within a declared kind and a
/// granted pattern, a tenant's (`tenant`: its namespace) within its
/// namespace or `tenantObjects`, and nothing breaks the host's
/// [`floor`] as far as the grants lend (in a cluster whose aggregating
/// ClusterRoles are `aggregators`). All offending objects are named at
/// once.
pub fn check_grants(
    objects: &[Object],
    declared: &[ObjectPattern],
    grants: &AddonGrants,
    tenant: Option<&str>,
    aggregators: &floor::Aggregators,
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
    let below = floor::violations(objects, grants, aggregators);
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
