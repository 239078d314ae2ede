//! Capstan installed as `capstan install` installs it, for tests about
//! rights: the generated RBAC objects, a client or config for the
//! `capstan-controller` ServiceAccount, and clients that act as a tenant
//! (a user with namespace RBAC only, impersonated by the admin).

use crate::cli;
use crate::env::{CAPSTAN_NAMESPACE, Env, EnvOptions};
use crate::sim_cloud::Faults;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};
use std::time::Duration;

/// `capstan install`'s objects, as JSON values.
/// Machines in `default` may have bootstrap data (`--machine-namespace`).
pub fn install_docs() -> Vec<Value> {
    let text = cli::ok(&[
        "install",
        "--namespace",
        CAPSTAN_NAMESPACE,
        "--machine-namespace",
        "default",
    ]);
    text.split("\n---\n")
        .filter_map(|doc| serde_yaml::from_str::<Value>(doc).ok())
        .filter(|v| v.get("kind").is_some())
        .collect()
}

/// The ClusterRoleBinding `capstan install` makes so that machines'
/// bootstrap tokens may request node client certificates (which Capstan,
/// not kubeadm, approves): what a cluster needs for machines to join.
pub fn machine_bootstrappers_docs() -> Vec<Value> {
    let docs: Vec<Value> = install_docs()
        .into_iter()
        .filter(|d| {
            d["kind"] == "ClusterRoleBinding"
                && d["subjects"][0]["name"] == capstan_controllers::MACHINE_BOOTSTRAPPERS
        })
        .collect();
    assert_eq!(
        docs.len(),
        1,
        "capstan install binds the machine bootstrappers"
    );
    docs
}

/// The RoleBinding `capstan install --tenant-namespace NAMESPACE` makes:
/// Capstan may act as ServiceAccounts of `namespace` (and of no other).
pub fn tenant_binding_docs(namespace: &str) -> Vec<Value> {
    let text = cli::ok(&[
        "install",
        "--namespace",
        CAPSTAN_NAMESPACE,
        "--tenant-namespace",
        namespace,
    ]);
    let docs: Vec<Value> = text
        .split("\n---\n")
        .filter_map(|doc| serde_yaml::from_str::<Value>(doc).ok())
        .filter(|d| {
            d["kind"] == "RoleBinding"
                && d["metadata"]["namespace"] == namespace
                && d["roleRef"]["name"] == capstan_addons::engine::TENANT_ROLE
        })
        .collect();
    assert_eq!(docs.len(), 1, "one RoleBinding in {namespace}");
    docs
}

/// `kubectl apply` these objects as the admin (none: nothing to do).
pub fn kubectl_apply(env: &Env, docs: &[Value]) {
    if docs.is_empty() {
        return;
    }
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": docs });
    env.control_plane
        .kubectl(&["apply", "-f", "-"], Some(&list.to_string()))
        .expect("kubectl apply");
}

/// The generated RBAC objects (ServiceAccount, roles, bindings), with the
/// rules on `without` (if any) taken out.
pub fn rbac_docs(without: Option<&str>) -> Vec<Value> {
    let mut docs: Vec<Value> = install_docs()
        .into_iter()
        .filter(|d| {
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
            ]
            .contains(&d["kind"].as_str().unwrap_or(""))
        })
        .collect();
    if let Some(resource) = without {
        let mut removed = 0;
        for doc in &mut docs {
            if let Some(rules) = doc.get_mut("rules").and_then(Value::as_array_mut) {
                let before = rules.len();
                rules.retain(|r| r["resources"] != json!([resource]));
                removed += before - rules.len();
            }
        }
        // Secrets have three rules (own namespace; bootstrap data by name;
        // tokens in kube-system): all go, so nothing can read a credential.
        let expected = if resource == "secrets" { 3 } else { 1 };
        assert_eq!(removed, expected, "the rules on {resource}");
    }
    docs
}

/// A kubeconfig for the `capstan-controller` ServiceAccount's token.
pub async fn service_account_kubeconfig(env: &Env) -> std::path::PathBuf {
    let token = service_account_token(env).await;
    let admin = env.control_plane.kubeconfig();
    let text = std::fs::read_to_string(&admin).expect("the admin kubeconfig");
    let replaced = text.replace(&env.control_plane.token, &token);
    assert_ne!(replaced, text, "the admin token is in the kubeconfig");
    let path = admin.with_file_name("capstan-controller.kubeconfig");
    std::fs::write(&path, replaced).expect("write the kubeconfig");
    path
}

/// The `capstan-controller` ServiceAccount's token, once the token
/// controller has issued it (what a pod of the Deployment mounts).
pub async fn service_account_token(env: &Env) -> String {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    env.eventually(
        "the ServiceAccount's token",
        Duration::from_secs(90),
        async || {
            let list = secrets.list(&Default::default()).await.ok()?;
            list.items.into_iter().find_map(|s| {
                let for_us = s.type_.as_deref() == Some("kubernetes.io/service-account-token")
                    && s.annotations().get("kubernetes.io/service-account.name")
                        == Some(&"capstan-controller".to_string());
                let token = s.data?.get("token")?.0.clone();
                for_us.then(|| String::from_utf8(token).expect("a text token"))
            })
        },
    )
    .await
}

/// Install the generated RBAC and return the connection config of the
/// `capstan-controller` ServiceAccount (what the installed controller runs
/// as), for in-process controllers.
pub async fn controller_config(env: &Env) -> kube::Config {
    kubectl_apply(env, &rbac_docs(None));
    let path = service_account_kubeconfig(env).await;
    let kc = kube::config::Kubeconfig::read_from(path).expect("the ServiceAccount's kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a config")
}

/// A client acting as `user` (the admin impersonates it, so only `user`'s
/// own RBAC applies).
pub async fn client_as(env: &Env, user: &str) -> kube::Client {
    let mut config = env.control_plane.config().await.expect("a config");
    config.auth_info.impersonate = Some(user.to_string());
    kube::Client::try_from(config).expect("a client")
}

/// Make `user` a tenant of `namespace`: the namespace, and a Role there
/// over Capstan's namespaced objects (the rights a namespace admin would
/// hand out), nothing cluster-wide.
pub fn make_tenant(env: &Env, namespace: &str, user: &str) {
    let docs = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "capstan-tenant", "namespace": namespace},
            "rules": [{"apiGroups": ["capstan.dev"],
                "resources": ["addons", "machines", "machinesets", "machinedeployments", "machinehealthchecks", "clusters"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "create", "delete"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "capstan-tenant", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "capstan-tenant"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    ];
    kubectl_apply(env, &docs);
}

/// An environment whose API server writes an audit log, with the
/// controllers running as the ServiceAccount `capstan install` generates:
/// the log tells their requests from the test's.
pub async fn audited_as_installed(faults: Faults) -> Env {
    let mut options = EnvOptions::new(faults);
    options.control_plane.audit = true;
    let mut env = Env::start_with(options).await.expect("environment");
    let config = controller_config(&env).await;
    env.start_controllers_as(
        config,
        capstan_controllers::Providers::default(),
        capstan_controllers::Options::default(),
    )
    .await;
    env
}

/// What an admin binds on a kubeadm cluster so that Capstan's bootstrap
/// tokens (group [`capstan_controllers::MACHINE_BOOTSTRAPPERS`]) may run
/// `kubeadm join`, as `kubeadm init` binds its own token group: read the
/// cluster's kubeadm and kubelet configuration and look up Nodes
/// (docs/machines.md). Kubernetes 1.20's role names.
pub fn kubeadm_join_bindings() -> Vec<Value> {
    let group = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
        "name": capstan_controllers::MACHINE_BOOTSTRAPPERS}]);
    let mut docs: Vec<Value> = ["kubeadm:nodes-kubeadm-config", "kubeadm:kubelet-config-1.20", "kube-proxy"]
        .iter()
        .map(|role| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": format!("capstan-machines:{role}"), "namespace": "kube-system"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": group})
        })
        .collect();
    docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "capstan-machines:kubeadm:get-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubeadm:get-nodes"},
        "subjects": group}));
    docs
}

/// What a workload cluster's admin runs so Capstan can run Machines for
/// it, with the real binary: `capstan install --workload-cluster
/// --workload-user capstan-minimal --apply` against `plane`, so the user
/// of [`ControlPlane::minimal_kubeconfig_inline`] holds exactly the rules
/// a workload kubeconfig needs.
///
/// [`ControlPlane::minimal_kubeconfig_inline`]: crate::control_plane::ControlPlane::minimal_kubeconfig_inline
pub fn install_workload_cluster(plane: &crate::control_plane::ControlPlane) -> Result<(), String> {
    let capstan = crate::env::capstan_bin()?;
    let kubeconfig = plane.kubeconfig().display().to_string();
    let user = crate::control_plane::MINIMAL_USER;
    let out = std::process::Command::new(&capstan)
        .args([
            "install",
            "--workload-cluster",
            "--workload-user",
            user,
            "--apply",
        ])
        .args(["--kubeconfig", &kubeconfig])
        .output()
        .map_err(|e| format!("{}: {e}", capstan.display()))?;
    if !out.status.success() {
        return Err(format!(
            "capstan install --workload-cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
