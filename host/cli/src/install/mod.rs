//! `capstan install` and `capstan uninstall`: everything Capstan needs to run
//! inside the cluster it manages, least privilege first.
//!
//! [`manifests`] builds the objects: the CRDs, the namespace, a
//! ServiceAccount, a ClusterRole and a Role generated from
//! [`capstan_controllers::rbac::RULES`] (the one list of what the
//! controllers do), their bindings, and a Deployment of leader-elected
//! replicas. `install` prints them as YAML or, with `--apply`, applies them
//! server-side; `uninstall` deletes them, refusing while Machines still
//! hold finalizers (their instances would leak).
//!
//! By concern: [`roles`] (the rules and where they are bound),
//! [`deployment`] (the controller's Deployment), [`uninstall`]; the
//! manifests, their YAML and `install` itself are here.

mod deployment;
mod roles;
#[cfg(test)]
mod tests;
mod uninstall;
mod workload;

use deployment::{TRUST_POLICY_CONFIG_MAP, controller_deployment};
use roles::{machine_namespaces, policy_rules};
pub use uninstall::{UninstallArgs, uninstall};

use anyhow::Context as _;
use capstan_addons::engine::TENANT_BINDING;
use capstan_api::Machine;
use capstan_controllers::MACHINE_NAMESPACE_ROLE;
use capstan_controllers::rbac::{self, Scope};
use capstan_registry::policy::TrustPolicy;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, Namespace, ObjectFieldSelector, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// Name of the ServiceAccount, roles, bindings and Deployment.
pub const NAME: &str = "capstan-controller";
/// Field manager of `install --apply`.
const FIELD_MANAGER: &str = "capstan-install";
const METRICS_PORT: i32 = 9090;
const HEALTH_PORT: i32 = 9091;
const CACHE_DIR: &str = "/var/cache/capstan";
/// The image this version publishes (`scripts/build-image.sh --push`).
pub const PUBLISHED_IMAGE: &str =
    concat!("ghcr.io/capstan-dev/capstan:", env!("CARGO_PKG_VERSION"));
/// The image's non-root user (`scripts/oci-image.py`).
const IMAGE_UID: i64 = 65532;

/// The controller image after `--image-mirror`, checked: a digest, if
/// given, must be a whole sha256 digest. Also says whether it is pinned.
pub fn controller_image(args: &InstallArgs) -> anyhow::Result<(String, bool)> {
    let image = args.image.trim();
    anyhow::ensure!(
        !image.is_empty() && !image.contains(char::is_whitespace) && !image.contains("://"),
        "--image {image:?} is not an image reference; expected REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex digits>"
    );
    let pinned = match image.split_once('@') {
        Some((name, digest)) => {
            let hex = digest.strip_prefix("sha256:").unwrap_or_default();
            anyhow::ensure!(
                !name.is_empty()
                    && hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "--image {image}: the digest after '@' must be sha256: and 64 lowercase hex digits"
            );
            true
        }
        None => false,
    };
    let mirrored = args
        .image_mirrors
        .iter()
        .find_map(|rule| {
            let rest = image.strip_prefix(rule.from.as_str())?;
            // A prefix ends at a path boundary: `reg/capstan` must not
            // match `reg/capstan-fork`.
            let whole = rule.from.ends_with('/') || rest.starts_with(['/', ':', '@']);
            whole.then(|| format!("{}{rest}", rule.to))
        })
        .unwrap_or_else(|| image.to_string());
    Ok((mirrored, pinned))
}

/// Flags of `capstan install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Namespace Capstan runs in; credential Secrets and the leader Lease
    /// live here.
    #[arg(long, default_value = crate::controller::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The controller image, pinned by digest:
    /// `REGISTRY/REPOSITORY[:TAG]@sha256:…` (`scripts/build-image.sh`
    /// prints it). Its entrypoint must be `capstan controller`: the
    /// Deployment passes flags only. Default: the image this version
    /// publishes (by tag; a warning says so).
    #[arg(long, default_value = PUBLISHED_IMAGE)]
    pub image: String,
    /// Pull the image from a mirror: `FROM=TO` replaces the image's prefix
    /// `FROM` (a registry, or registry and path) by `TO`, digest kept, e.g.
    /// `ghcr.io/capstan-dev/=mirror.local:5000/capstan/` (repeatable; the
    /// first match wins).
    #[arg(long = "image-mirror", value_name = "FROM=TO")]
    pub image_mirrors: Vec<capstan_addons::ImageRewrite>,
    /// Install a shard: a controller Deployment of its own,
    /// `capstan-controller-VALUE`, running `capstan controller
    /// --watch-filter=VALUE` (it owns only objects labelled
    /// `cluster.x-k8s.io/watch-filter=VALUE`, with a leader Lease of its
    /// own). Shards share the namespace, its ServiceAccount, RBAC, trust
    /// policy, credential Secrets and the CRDs; install one per value.
    #[arg(long, value_name = "VALUE", value_parser = parse_watch_filter)]
    pub watch_filter: Option<String>,
    /// Controller replicas (one leads, the others stand by).
    #[arg(long, default_value_t = 2)]
    pub replicas: i32,
    /// Extra flag for `capstan controller` (repeatable), e.g.
    /// `--controller-arg=--resync=5m`.
    #[arg(
        long = "controller-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    pub controller_args: Vec<String>,
    /// The host's trust policy: every plugin source must be signed as it
    /// says (without one no Plugin loads). Stored, keys inline, in the
    /// ConfigMap `capstan-trust-policy` and passed as `--trust-policy`.
    #[arg(long, value_name = "FILE")]
    pub trust_policy: Option<PathBuf>,
    /// Let Capstan apply the Addons of this namespace as the ServiceAccount
    /// each names (spec.serviceAccountName): a RoleBinding there of the
    /// ClusterRole capstan-controller-tenants (`impersonate` on
    /// ServiceAccounts). Repeatable; the namespace must exist. Without it,
    /// Addons there fail with ImpersonationForbidden; a namespace admin may
    /// create the same RoleBinding instead.
    #[arg(long = "tenant-namespace", value_name = "NAMESPACE")]
    pub tenant_namespaces: Vec<String>,
    /// Let Machines of this namespace have bootstrap data (spec.bootstrap):
    /// a RoleBinding there of the ClusterRole capstan-controller-machines
    /// (`get` and `create` on Secrets, by name). Capstan's namespace and
    /// each --tenant-namespace get it too. Repeatable; the namespace must
    /// exist. Elsewhere such Machines wait with BootstrapSecretsForbidden:
    /// Capstan reads no Secret in a namespace nobody bound.
    #[arg(long = "machine-namespace", value_name = "NAMESPACE")]
    pub machine_namespaces: Vec<String>,
    /// Instead of Capstan, the objects a workload cluster needs so Capstan
    /// can run Machines for it (see docs/workload-clusters.md): the
    /// ClusterRole and Roles its kubeconfig's user needs there (Nodes,
    /// drains, volumes, bootstrap tokens, cluster-info, node CSRs), bound
    /// to --workload-user or to the ServiceAccount
    /// kube-system/capstan-workload, and the binding that lets machines'
    /// bootstrap tokens ask for node certificates. Use it with the
    /// workload cluster's kubeconfig.
    #[arg(long)]
    pub workload_cluster: bool,
    /// With --workload-cluster: bind the rules to this user (the one the
    /// Cluster's kubeconfig Secret authenticates as) instead of creating
    /// the ServiceAccount kube-system/capstan-workload.
    #[arg(long, value_name = "USER", requires = "workload_cluster")]
    pub workload_user: Option<String>,
    /// Apply the objects to the cluster (server-side apply) instead of
    /// printing them.
    #[arg(long)]
    pub apply: bool,
    /// Kubeconfig for --apply (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Everything `install` creates, in the order it is applied.
#[derive(Debug, Clone)]
pub struct Manifests {
    /// Capstan's namespace.
    pub namespace: Namespace,
    /// The CRDs.
    pub crds: Vec<CustomResourceDefinition>,
    /// The controllers' identity.
    pub service_account: ServiceAccount,
    /// Cluster-wide rules.
    pub cluster_role: ClusterRole,
    /// Binds them to the ServiceAccount.
    pub cluster_role_binding: ClusterRoleBinding,
    /// Rules in Capstan's namespace only (Secrets, the Lease).
    pub role: Role,
    /// Binds them to the ServiceAccount.
    pub role_binding: RoleBinding,
    /// Rules for tenant namespaces (impersonating their ServiceAccounts),
    /// bound only by `tenant_bindings`.
    pub tenant_role: ClusterRole,
    /// One RoleBinding of `tenant_role` per `--tenant-namespace`.
    pub tenant_bindings: Vec<RoleBinding>,
    /// Rules for Machines' namespaces (bootstrap data Secrets), bound only
    /// by `machine_bindings`.
    pub machine_role: ClusterRole,
    /// One RoleBinding of `machine_role` in Capstan's namespace, each
    /// tenant namespace and each `--machine-namespace`.
    pub machine_bindings: Vec<RoleBinding>,
    /// A Role and its RoleBinding in each fixed namespace of the cluster's
    /// own that rules name (bootstrap tokens in kube-system, cluster-info in
    /// kube-public).
    pub system_roles: Vec<(Role, RoleBinding)>,
    /// Lets Capstan's machine bootstrap tokens (their group,
    /// `system:bootstrappers:capstan:machines`) request node client
    /// certificates: Kubernetes' `system:node-bootstrapper` role. Capstan,
    /// not kubeadm, approves them.
    pub machine_bootstrappers: ClusterRoleBinding,
    /// The controller replicas.
    pub deployment: Deployment,
    /// The trust policy, when one was given.
    pub trust_policy: Option<ConfigMap>,
}

/// The ClusterRoleBinding that lets machines' bootstrap tokens request node
/// client certificates.
pub const MACHINE_BOOTSTRAPPERS_BINDING: &str = "capstan-machine-bootstrappers";

/// That binding: Kubernetes' `system:node-bootstrapper` for Capstan's
/// token group (made in the cluster Capstan runs in, and in each workload
/// cluster by `--workload-cluster`).
fn machine_bootstrappers() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(MACHINE_BOOTSTRAPPERS_BINDING, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "system:node-bootstrapper".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Group".into(),
            name: capstan_controllers::MACHINE_BOOTSTRAPPERS.into(),
            namespace: None,
        }]),
    }
}

/// Where the trust policy is mounted in the controller's container.
const TRUST_POLICY_DIR: &str = "/etc/capstan";
const TRUST_POLICY_FILE: &str = "trust-policy.yaml";

/// A `--watch-filter` value, checked as the controller checks it.
fn parse_watch_filter(value: &str) -> Result<String, String> {
    match capstan_controllers::invalid_watch_filter(value) {
        Some(why) => Err(why),
        None => Ok(value.to_string()),
    }
}

/// The controller Deployment's name: `capstan-controller`, or
/// `capstan-controller-VALUE` for the shard of a watch filter. Its pods
/// are labelled `app.kubernetes.io/name` with the same name, so no two
/// Deployments' selectors overlap.
pub fn deployment_name(watch_filter: Option<&str>) -> String {
    watch_filter.map_or_else(|| NAME.to_string(), |v| format!("{NAME}-{v}"))
}

fn labels() -> BTreeMap<String, String> {
    labels_named(NAME)
}

fn labels_named(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), name.to_string()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "capstan".to_string(),
        ),
    ])
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels()),
        ..Default::default()
    }
}

/// The RBAC rules of one scope, from the controllers' single list.
/// The objects `install` creates; `image` is the controller image (after
/// [`controller_image`]), `policy` the host's trust policy (its keys
/// inline), if any.
pub fn manifests(args: &InstallArgs, image: &str, policy: Option<&TrustPolicy>) -> Manifests {
    let ns = args.namespace.as_str();
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(ns.into()),
        ..Default::default()
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: NAME.into(),
    };
    Manifests {
        namespace: Namespace {
            metadata: meta(ns, None),
            ..Default::default()
        },
        crds: capstan_api::crds(),
        service_account: ServiceAccount {
            metadata: meta(NAME, Some(ns)),
            ..Default::default()
        },
        cluster_role: ClusterRole {
            metadata: meta(NAME, None),
            rules: Some(policy_rules(Scope::Cluster)),
            ..Default::default()
        },
        cluster_role_binding: ClusterRoleBinding {
            metadata: meta(NAME, None),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(vec![subject.clone()]),
        },
        role: Role {
            metadata: meta(NAME, Some(ns)),
            rules: Some(policy_rules(Scope::OwnNamespace)),
        },
        role_binding: RoleBinding {
            metadata: meta(NAME, Some(ns)),
            role_ref: role_ref("Role"),
            subjects: Some(vec![subject.clone()]),
        },
        tenant_role: ClusterRole {
            metadata: meta(capstan_addons::engine::TENANT_ROLE, None),
            rules: Some(policy_rules(Scope::TenantNamespaces)),
            ..Default::default()
        },
        tenant_bindings: args
            .tenant_namespaces
            .iter()
            .map(|tenant| RoleBinding {
                metadata: meta(TENANT_BINDING, Some(tenant)),
                role_ref: RoleRef {
                    name: capstan_addons::engine::TENANT_ROLE.into(),
                    ..role_ref("ClusterRole")
                },
                subjects: Some(vec![subject.clone()]),
            })
            .collect(),
        machine_role: ClusterRole {
            metadata: meta(MACHINE_NAMESPACE_ROLE, None),
            rules: Some(policy_rules(Scope::MachineNamespaces)),
            ..Default::default()
        },
        machine_bindings: machine_namespaces(args)
            .into_iter()
            .map(|namespace| RoleBinding {
                metadata: meta(MACHINE_NAMESPACE_ROLE, Some(namespace)),
                role_ref: RoleRef {
                    name: MACHINE_NAMESPACE_ROLE.into(),
                    ..role_ref("ClusterRole")
                },
                subjects: Some(vec![subject.clone()]),
            })
            .collect(),
        system_roles: rbac::fixed_namespaces()
            .into_iter()
            .map(|fixed| {
                (
                    Role {
                        metadata: meta(NAME, Some(fixed)),
                        rules: Some(policy_rules(Scope::Namespace(fixed))),
                    },
                    RoleBinding {
                        metadata: meta(NAME, Some(fixed)),
                        role_ref: role_ref("Role"),
                        subjects: Some(vec![subject.clone()]),
                    },
                )
            })
            .collect(),
        machine_bootstrappers: machine_bootstrappers(),
        deployment: controller_deployment(args, image, policy.is_some()),
        trust_policy: policy.map(|p| ConfigMap {
            metadata: meta(TRUST_POLICY_CONFIG_MAP, Some(ns)),
            data: Some(BTreeMap::from([(
                TRUST_POLICY_FILE.to_string(),
                p.to_yaml(),
            )])),
            ..Default::default()
        }),
    }
}

fn yaml<T: serde::Serialize>(out: &mut String, obj: &T) -> anyhow::Result<()> {
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(obj)?);
    Ok(())
}

/// The manifests as one multi-document YAML stream, with the reason for
/// every RBAC rule as comments.
pub fn render(m: &Manifests) -> anyhow::Result<String> {
    let mut out = String::from(
        "# Capstan, installed by `capstan install`. Permissions (from the controllers' one list):\n",
    );
    for rule in rbac::RULES {
        let scope = match rule.scope {
            Scope::Cluster => "cluster",
            Scope::OwnNamespace => "own namespace",
            Scope::TenantNamespaces => "tenant namespaces, by --tenant-namespace",
            Scope::MachineNamespaces => {
                "own, tenant and --machine-namespace namespaces, by RoleBindings"
            }
            Scope::Namespace(ns) => ns,
        };
        let names = if rule.resource_names.is_empty() {
            String::new()
        } else {
            format!(" {}", rule.resource_names.join(","))
        };
        out.push_str(&format!(
            "#   {}/{}{names} [{}] ({scope}): {}\n",
            if rule.group.is_empty() {
                "core"
            } else {
                rule.group
            },
            rule.resources.join(","),
            rule.verbs.join(","),
            rule.why
        ));
    }
    yaml(&mut out, &m.namespace)?;
    for crd in &m.crds {
        yaml(&mut out, crd)?;
    }
    yaml(&mut out, &m.service_account)?;
    yaml(&mut out, &m.cluster_role)?;
    yaml(&mut out, &m.cluster_role_binding)?;
    yaml(&mut out, &m.role)?;
    yaml(&mut out, &m.role_binding)?;
    yaml(&mut out, &m.tenant_role)?;
    for binding in &m.tenant_bindings {
        yaml(&mut out, binding)?;
    }
    yaml(&mut out, &m.machine_role)?;
    for binding in &m.machine_bindings {
        yaml(&mut out, binding)?;
    }
    for (role, binding) in &m.system_roles {
        yaml(&mut out, role)?;
        yaml(&mut out, binding)?;
    }
    yaml(&mut out, &m.machine_bootstrappers)?;
    if let Some(policy) = &m.trust_policy {
        yaml(&mut out, policy)?;
    }
    yaml(&mut out, &m.deployment)?;
    Ok(out)
}

async fn apply<K>(api: Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::Serialize,
    K: serde::de::DeserializeOwned,
{
    let name = obj.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("cannot apply {} {name}", K::kind(&())))?;
    println!("{}/{name} applied", K::kind(&()).to_lowercase());
    Ok(())
}

/// `capstan install`.
pub async fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.replicas >= 1,
        "--replicas {} must be at least 1",
        args.replicas
    );
    let policy = match &args.trust_policy {
        Some(path) => Some(TrustPolicy::load(path)?),
        None => None,
    };
    if args.workload_cluster {
        return workload::install(&args).await;
    }
    let (image, pinned) = controller_image(&args)?;
    if !pinned {
        eprintln!(
            "warning: the controller image {image} is not pinned by a digest, so nodes may run different builds under one tag; pass --image REGISTRY/REPOSITORY@sha256:… (scripts/build-image.sh prints it)"
        );
    }
    let m = manifests(&args, &image, policy.as_ref());
    if !args.apply {
        print!("{}", render(&m)?);
        return Ok(ExitCode::SUCCESS);
    }
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    let ns = args.namespace.as_str();
    apply(Api::all(client.clone()), &m.namespace).await?;
    for crd in &m.crds {
        apply(Api::all(client.clone()), crd).await?;
    }
    apply(Api::namespaced(client.clone(), ns), &m.service_account).await?;
    apply(Api::all(client.clone()), &m.cluster_role).await?;
    apply(Api::all(client.clone()), &m.cluster_role_binding).await?;
    apply(Api::namespaced(client.clone(), ns), &m.role).await?;
    apply(Api::namespaced(client.clone(), ns), &m.role_binding).await?;
    apply(Api::all(client.clone()), &m.tenant_role).await?;
    for binding in &m.tenant_bindings {
        let tenant = binding.namespace().unwrap_or_default();
        apply(Api::namespaced(client.clone(), &tenant), binding)
            .await
            .with_context(|| format!("--tenant-namespace {tenant}: does the namespace exist?"))?;
    }
    apply(Api::all(client.clone()), &m.machine_role).await?;
    for binding in &m.machine_bindings {
        let namespace = binding.namespace().unwrap_or_default();
        apply(Api::namespaced(client.clone(), &namespace), binding)
            .await
            .with_context(|| {
                format!("--machine-namespace {namespace}: does the namespace exist?")
            })?;
    }
    for (role, binding) in &m.system_roles {
        let fixed = role.namespace().unwrap_or_default();
        apply(Api::namespaced(client.clone(), &fixed), role).await?;
        apply(Api::namespaced(client.clone(), &fixed), binding).await?;
    }
    apply(Api::all(client.clone()), &m.machine_bootstrappers).await?;
    if let Some(policy) = &m.trust_policy {
        apply(Api::namespaced(client.clone(), ns), policy).await?;
    }
    apply(Api::namespaced(client.clone(), ns), &m.deployment).await?;
    eprintln!(
        "capstan installed in namespace {ns}: put credential Secrets there; `kubectl -n {ns} get deploy,pods` shows the controllers"
    );
    Ok(ExitCode::SUCCESS)
}
