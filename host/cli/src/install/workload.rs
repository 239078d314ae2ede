//! `capstan install --workload-cluster`: what a workload cluster needs so
//! the management cluster's Capstan can run Machines for it. The rules are
//! [`rbac::workload_rules`] (the Node side of Capstan's own rules), bound to
//! the user the Cluster's kubeconfig Secret authenticates as.

use super::*;
use roles::policy_rule;

/// The ClusterRole (and Role, in kube-system and kube-public) a workload
/// kubeconfig's user holds in the workload cluster.
pub const WORKLOAD_ROLE: &str = "capstan-workload";

/// What `install --workload-cluster` creates, in apply order.
#[derive(Debug, Clone)]
pub struct WorkloadManifests {
    /// The identity to bind, when no --workload-user is named.
    pub service_account: Option<ServiceAccount>,
    /// Cluster-wide rules.
    pub cluster_role: ClusterRole,
    /// Binds them.
    pub cluster_role_binding: ClusterRoleBinding,
    /// Bootstrap tokens in kube-system, cluster-info in kube-public.
    pub roles: Vec<(Role, RoleBinding)>,
    /// Lets machines' bootstrap tokens request node client certificates.
    pub machine_bootstrappers: ClusterRoleBinding,
}

/// The workload cluster's objects, bound to `user` (or to the
/// ServiceAccount kube-system/capstan-workload).
pub fn manifests(user: Option<&str>) -> WorkloadManifests {
    let subject = match user {
        Some(user) => Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.into(),
            namespace: None,
        },
        None => Subject {
            kind: "ServiceAccount".into(),
            name: WORKLOAD_ROLE.into(),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: WORKLOAD_ROLE.into(),
    };
    let rules = |scope: Scope| -> Vec<PolicyRule> {
        rbac::workload_rules()
            .filter(|r| r.scope == scope)
            .map(policy_rule)
            .collect()
    };
    WorkloadManifests {
        service_account: user.is_none().then(|| ServiceAccount {
            metadata: meta(WORKLOAD_ROLE, Some("kube-system")),
            ..Default::default()
        }),
        cluster_role: ClusterRole {
            metadata: meta(WORKLOAD_ROLE, None),
            rules: Some(rules(Scope::Cluster)),
            ..Default::default()
        },
        cluster_role_binding: ClusterRoleBinding {
            metadata: meta(WORKLOAD_ROLE, None),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(vec![subject.clone()]),
        },
        roles: rbac::fixed_namespaces()
            .into_iter()
            .map(|fixed| {
                (
                    Role {
                        metadata: meta(WORKLOAD_ROLE, Some(fixed)),
                        rules: Some(rules(Scope::Namespace(fixed))),
                    },
                    RoleBinding {
                        metadata: meta(WORKLOAD_ROLE, Some(fixed)),
                        role_ref: role_ref("Role"),
                        subjects: Some(vec![subject.clone()]),
                    },
                )
            })
            .collect(),
        machine_bootstrappers: machine_bootstrappers(),
    }
}

/// The objects as YAML documents.
pub fn render(m: &WorkloadManifests) -> anyhow::Result<String> {
    let mut out = String::new();
    if let Some(sa) = &m.service_account {
        yaml(&mut out, sa)?;
    }
    yaml(&mut out, &m.cluster_role)?;
    yaml(&mut out, &m.cluster_role_binding)?;
    for (role, binding) in &m.roles {
        yaml(&mut out, role)?;
        yaml(&mut out, binding)?;
    }
    yaml(&mut out, &m.machine_bootstrappers)?;
    Ok(out)
}

/// `capstan install --workload-cluster`: print, or apply to the cluster of
/// `--kubeconfig`.
pub async fn install(args: &InstallArgs) -> anyhow::Result<ExitCode> {
    let m = manifests(args.workload_user.as_deref());
    if !args.apply {
        print!("{}", render(&m)?);
        return Ok(ExitCode::SUCCESS);
    }
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    if let Some(sa) = &m.service_account {
        apply(Api::namespaced(client.clone(), "kube-system"), sa).await?;
    }
    apply(Api::all(client.clone()), &m.cluster_role).await?;
    apply(Api::all(client.clone()), &m.cluster_role_binding).await?;
    for (role, binding) in &m.roles {
        let fixed = role.namespace().unwrap_or_default();
        apply(Api::namespaced(client.clone(), &fixed), role).await?;
        apply(Api::namespaced(client.clone(), &fixed), binding).await?;
    }
    apply(Api::all(client.clone()), &m.machine_bootstrappers).await?;
    let who = match &args.workload_user {
        Some(user) => format!("user {user}"),
        None => "the ServiceAccount kube-system/capstan-workload".to_string(),
    };
    eprintln!(
        "workload cluster ready for Capstan as {who}: put a kubeconfig of that identity (inline credentials, https) in the management cluster's Secret <cluster>-kubeconfig, key `value`"
    );
    Ok(ExitCode::SUCCESS)
}
