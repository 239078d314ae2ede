//! The Kubernetes permissions the controllers need, as one list.
//!
//! `capstan install` turns [`RULES`] into a ClusterRole (rules with
//! [`Scope::Cluster`]), a Role in Capstan's own namespace (rules with
//! [`Scope::OwnNamespace`]), a ClusterRole bound only in the tenant
//! namespaces an admin names (rules with [`Scope::TenantNamespaces`]), a
//! ClusterRole bound only in the namespaces whose Machines may bootstrap
//! (rules with [`Scope::MachineNamespaces`]) and a Role in each fixed namespace a rule names (rules with
//! [`Scope::Namespace`]: bootstrap tokens in `kube-system`, the cluster's
//! join information in `kube-public`). Each rule names the controller that needs it,
//! so a new controller adds its rules here next to the others; the
//! in-cluster e2e test runs the controllers under exactly these roles, so a
//! missing rule fails a scenario.

/// Where a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (a ClusterRole).
    Cluster,
    /// Only Capstan's own namespace (a Role there).
    OwnNamespace,
    /// Only the tenant namespaces an admin opts in: a ClusterRole
    /// (`capstan-controller-tenants`) that RoleBindings in those namespaces
    /// bind, never a ClusterRoleBinding (`capstan install
    /// --tenant-namespace NS`).
    TenantNamespaces,
    /// Only the namespaces whose Machines may have bootstrap data: a
    /// ClusterRole (`capstan-controller-machines`) that RoleBindings bind in
    /// Capstan's namespace, each tenant namespace and each `capstan install
    /// --machine-namespace NS`, never a ClusterRoleBinding.
    MachineNamespaces,
    /// One fixed namespace of the cluster's own (`kube-system`,
    /// `kube-public`): a Role there.
    Namespace(&'static str),
}

/// One RBAC rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Which controller needs it and why (a comment in the generated role).
    pub why: &'static str,
    /// API group (`""` for core).
    pub group: &'static str,
    /// Resources (and subresources, `pods/eviction`).
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Only these objects (empty: all of the resource).
    pub resource_names: &'static [&'static str],
    /// Cluster-wide or own namespace.
    pub scope: Scope,
}

const READ: &[&str] = &["get", "list", "watch"];

/// Every permission `capstan controller` uses, and no more.
pub const RULES: &[Rule] = &[
    Rule {
        why: "all controllers: shared caches of Capstan's objects",
        group: "capstan.dev",
        resources: &[
            "plugins",
            "machines",
            "machinesets",
            "machinedeployments",
            "machinehealthchecks",
            "addons",
            "clusters",
        ],
        verbs: READ,
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "all controllers: status subresources (server-side apply)",
        group: "capstan.dev",
        resources: &[
            "plugins/status",
            "machines/status",
            "machinesets/status",
            "machinedeployments/status",
            "machinehealthchecks/status",
            "addons/status",
            "clusters/status",
        ],
        verbs: &["patch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "cluster: its finalizer",
        group: "capstan.dev",
        resources: &["clusters"],
        verbs: &["patch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "cluster: label the deployments of a Cluster with cluster.x-k8s.io/cluster-name, and delete them with it",
        group: "capstan.dev",
        resources: &["machinedeployments"],
        verbs: &["delete"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "addon: its finalizer",
        group: "capstan.dev",
        resources: &["addons"],
        verbs: &["patch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine: finalizers; machineset: create, adopt and delete machines (all of them when the set is deleted)",
        group: "capstan.dev",
        resources: &["machines"],
        verbs: &["create", "patch", "delete"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "deployment: its finalizer, and spec.rollback restores an earlier template of the deployment itself",
        group: "capstan.dev",
        resources: &["machinedeployments"],
        verbs: &["patch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "deployment: create, scale and delete MachineSets (all of them when it is deleted); machineset: its finalizer",
        group: "capstan.dev",
        resources: &["machinesets"],
        verbs: &["create", "patch", "delete"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine: match Nodes to machines, carry their labels and taints, cordon them, delete them after the instance",
        group: "",
        resources: &["nodes"],
        verbs: &["get", "list", "watch", "patch", "delete"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine (drain): the pods on a Node (a cache of scheduled pods, confirmed by a list before the drain completes)",
        group: "",
        resources: &["pods"],
        verbs: &["list", "watch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine (drain): the MachineDrainRules of a deleting machine's namespace",
        group: "capstan.dev",
        resources: &["machinedrainrules"],
        verbs: &["list"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine (drain): whether a DaemonSet pod's DaemonSet still exists (orphans are drained), from a shared cache",
        group: "apps",
        resources: &["daemonsets"],
        verbs: &["list", "watch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine (deletion): volumes still attached to a Node, from a shared cache",
        group: "storage.k8s.io",
        resources: &["volumeattachments"],
        verbs: &["list", "watch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine (deletion): which claim an attached volume belongs to (volumes of pods the drain left are not waited for)",
        group: "",
        resources: &["persistentvolumes"],
        verbs: &["list"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "machine (drain): evict pods, honouring PodDisruptionBudgets",
        group: "",
        resources: &["pods/eviction"],
        verbs: &["create"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "all controllers: Events about the objects they act on",
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "plugin: Events about Plugins (cluster-scoped, so core/v1 Events)",
        group: "",
        resources: &["events"],
        verbs: &["create"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "plugin: credential Secrets (watched, so a deleted or changed credential is revoked at once); addon: workload-cluster kubeconfigs; only in Capstan's namespace",
        group: "",
        resources: &["secrets"],
        verbs: READ,
        resource_names: &[],
        scope: Scope::OwnNamespace,
    },
    Rule {
        why: "machine: bootstrap data Secrets in the namespaces bound for Machines: written (owned by the Machine) for a bootstrap plugin, read by name (the one spec.bootstrap names or the one written); never listed or watched",
        group: "",
        resources: &["secrets"],
        verbs: &["get", "create"],
        resource_names: &[],
        scope: Scope::MachineNamespaces,
    },
    Rule {
        why: "machine: each Machine's bootstrap token (bootstrap-token-<id>, by name: minted, renewed until its Node joins, then deleted)",
        group: "",
        resources: &["secrets"],
        verbs: &["get", "create", "patch", "delete"],
        resource_names: &[],
        scope: Scope::Namespace("kube-system"),
    },
    Rule {
        why: "machine: the API server and cluster CA machines join with (cluster-info, as kubeadm publishes it)",
        group: "",
        resources: &["configmaps"],
        verbs: &["get"],
        resource_names: &[],
        scope: Scope::Namespace("kube-public"),
    },
    Rule {
        why: "csr: read node client certificate requests, to answer those made with Machines' bootstrap tokens",
        group: "certificates.k8s.io",
        resources: &["certificatesigningrequests"],
        verbs: READ,
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "csr: approve a Machine's token's request for its own Node's certificate, deny any other",
        group: "certificates.k8s.io",
        resources: &["certificatesigningrequests/approval"],
        verbs: &["update", "patch"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "csr: the approval is for kubelet client certificates only (no other signer: never a client certificate for any other user)",
        group: "certificates.k8s.io",
        resources: &["signers"],
        verbs: &["approve"],
        resource_names: &["kubernetes.io/kube-apiserver-client-kubelet"],
        scope: Scope::Cluster,
    },
    Rule {
        why: "addon: which ClusterRoles aggregate others (a rendered ClusterRole they select lends its rules to all their holders, and the floor judges it so)",
        group: "rbac.authorization.k8s.io",
        resources: &["clusterroles"],
        verbs: &["list"],
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "all controllers: namespace labels, for Plugins' spec.allowedNamespaces selectors",
        group: "",
        resources: &["namespaces"],
        verbs: READ,
        resource_names: &[],
        scope: Scope::Cluster,
    },
    Rule {
        why: "addon: apply a tenant's Addon as the ServiceAccount it names in its own namespace (impersonated, so that ServiceAccount's RBAC decides what it may write); bound per tenant namespace, so kube-system's ServiceAccounts stay out of reach",
        group: "",
        resources: &["serviceaccounts"],
        verbs: &["impersonate"],
        resource_names: &[],
        scope: Scope::TenantNamespaces,
    },
    Rule {
        why: "leader election: the Lease only one replica holds",
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "list", "watch", "create", "update"],
        resource_names: &[],
        scope: Scope::OwnNamespace,
    },
];

/// What the user of a workload cluster's kubeconfig needs there (the
/// Node side of the Machine controller, the health checks and the CSR
/// approver): the same rules as in the cluster Capstan runs in, for
/// these resources only. Events, Machines and everything else of
/// Capstan's stay in the management cluster.
pub fn workload_rules() -> impl Iterator<Item = &'static Rule> {
    const WORKLOAD_RESOURCES: &[&str] = &[
        "namespaces",
        "nodes",
        "pods",
        "daemonsets",
        "volumeattachments",
        "persistentvolumes",
        "pods/eviction",
        "certificatesigningrequests",
        "certificatesigningrequests/approval",
        "signers",
    ];
    RULES.iter().filter(|r| {
        r.resources
            .iter()
            .all(|res| WORKLOAD_RESOURCES.contains(res))
            || matches!(r.scope, Scope::Namespace(_))
    })
}

/// The rules of one scope.
pub fn rules(scope: Scope) -> impl Iterator<Item = &'static Rule> {
    RULES.iter().filter(move |r| r.scope == scope)
}

/// The fixed namespaces ([`Scope::Namespace`]) rules name, each once.
pub fn fixed_namespaces() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for rule in RULES {
        if let Scope::Namespace(ns) = rule.scope
            && !out.contains(&ns)
        {
            out.push(ns);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_cluster_gets_the_node_side_rules_and_nothing_of_capstans_own() {
        let rules: Vec<&Rule> = workload_rules().collect();
        let resources: Vec<&str> = rules
            .iter()
            .flat_map(|r| r.resources.iter().copied())
            .collect();
        for needed in [
            "nodes",
            "pods",
            "pods/eviction",
            "daemonsets",
            "volumeattachments",
        ] {
            assert!(
                resources.contains(&needed),
                "{needed} missing: {resources:?}"
            );
        }
        for rule in &rules {
            assert_ne!(rule.group, "capstan.dev", "{rule:?}");
            assert!(
                !matches!(
                    rule.scope,
                    Scope::OwnNamespace | Scope::MachineNamespaces | Scope::TenantNamespaces
                ),
                "{rule:?}"
            );
            assert!(!rule.verbs.contains(&"impersonate"), "{rule:?}");
        }
        // Bootstrap tokens and cluster-info, in their namespaces only.
        assert!(
            rules
                .iter()
                .any(|r| r.scope == Scope::Namespace("kube-system") && r.resources == ["secrets"])
        );
        assert!(
            rules.iter().any(
                |r| r.scope == Scope::Namespace("kube-public") && r.resources == ["configmaps"]
            )
        );
        assert!(
            !rules
                .iter()
                .any(|r| r.scope == Scope::Cluster && r.resources.contains(&"secrets"))
        );
    }

    #[test]
    fn no_rule_grants_wildcards_or_escalation() {
        for rule in RULES {
            for verb in rule.verbs {
                assert!(!["*", "escalate", "bind"].contains(verb), "{rule:?}");
                // Impersonation only where an admin binds it, namespace by
                // namespace, and only of ServiceAccounts.
                if *verb == "impersonate" {
                    assert_eq!(rule.scope, Scope::TenantNamespaces, "{rule:?}");
                    assert_eq!(rule.resources, ["serviceaccounts"], "{rule:?}");
                }
            }
            assert!(!rule.resources.contains(&"*"), "{rule:?}");
            // Approving is only ever for the kubelet client signer.
            if rule.verbs.contains(&"approve") {
                assert_eq!(rule.resources, ["signers"], "{rule:?}");
                assert_eq!(
                    rule.resource_names,
                    ["kubernetes.io/kube-apiserver-client-kubelet"],
                    "{rule:?}"
                );
            }
        }
    }

    #[test]
    fn secrets_are_listed_and_watched_only_in_the_own_namespace() {
        for rule in RULES.iter().filter(|r| r.resources.contains(&"secrets")) {
            if rule.verbs.iter().any(|v| ["list", "watch"].contains(v)) {
                assert_eq!(rule.scope, Scope::OwnNamespace, "{rule:?}");
                assert_eq!(rule.verbs, READ, "{rule:?}");
            }
            // No Secret is readable cluster-wide: elsewhere they are read by
            // name in namespaces an admin binds, and bootstrap tokens are
            // changed only in kube-system.
            assert_ne!(rule.scope, Scope::Cluster, "{rule:?}");
            if rule
                .verbs
                .iter()
                .any(|v| ["patch", "update", "delete"].contains(v))
            {
                assert_eq!(rule.scope, Scope::Namespace("kube-system"), "{rule:?}");
            }
        }
    }

    /// The fixed namespaces rules name, each once.
    #[test]
    fn fixed_namespaces_are_the_clusters_own() {
        for ns in fixed_namespaces() {
            assert!(["kube-system", "kube-public"].contains(&ns), "{ns}");
        }
    }
}
