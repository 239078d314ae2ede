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
    /// Apply the objects to the cluster (server-side apply) instead of
    /// printing them.
    #[arg(long)]
    pub apply: bool,
    /// Kubeconfig for --apply (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Flags of `capstan uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Namespace Capstan was installed in.
    #[arg(long, default_value = crate::controller::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Remove only the shard installed with this `--watch-filter` (its
    /// Deployment; its Machines must be gone first). The shared objects go
    /// with the last controller Deployment in the namespace.
    #[arg(long, value_name = "VALUE", value_parser = parse_watch_filter)]
    pub watch_filter: Option<String>,
    /// Remove the Machines' finalizers and go on although Machines remain:
    /// their cloud instances are left behind.
    #[arg(long)]
    pub force: bool,
    /// Kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
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
pub fn policy_rules(scope: Scope) -> Vec<PolicyRule> {
    rbac::rules(scope)
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_string()]),
            resources: Some(r.resources.iter().map(|s| s.to_string()).collect()),
            resource_names: (!r.resource_names.is_empty())
                .then(|| r.resource_names.iter().map(|s| s.to_string()).collect()),
            verbs: r.verbs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .collect()
}

fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_value(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("health".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        ..Default::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

fn deployment(args: &InstallArgs, image: &str, with_policy: bool) -> Deployment {
    // Flags only: the image's entrypoint is `capstan controller`. The
    // leader-election timings are spelled out so they can be read and tuned
    // here; a `--controller-arg` for the same flag replaces the default
    // (the controller would refuse a flag given twice).
    let mut defaults: Vec<String> = vec![
        "--leader-elect".into(),
        "--leader-elect-lease-duration=15s".into(),
        "--leader-elect-renew-deadline=10s".into(),
        "--leader-elect-retry-period=2s".into(),
        format!("--metrics-addr=0.0.0.0:{METRICS_PORT}"),
        format!("--health-addr=0.0.0.0:{HEALTH_PORT}"),
        format!("--code-cache={CACHE_DIR}/code"),
        format!("--oci-cache={CACHE_DIR}/oci"),
    ];
    if let Some(value) = &args.watch_filter {
        defaults.push(format!("--watch-filter={value}"));
    }
    if with_policy {
        defaults.push(format!(
            "--trust-policy={TRUST_POLICY_DIR}/{TRUST_POLICY_FILE}"
        ));
    }
    let flag_name = |arg: &str| arg.split('=').next().unwrap_or(arg).to_string();
    let overridden: Vec<String> = args.controller_args.iter().map(|a| flag_name(a)).collect();
    let container_args: Vec<String> = defaults
        .into_iter()
        .filter(|d| !overridden.contains(&flag_name(d)))
        .chain(args.controller_args.iter().cloned())
        .collect();
    let container = Container {
        name: "controller".into(),
        image: Some(image.to_string()),
        args: Some(container_args),
        env: Some(vec![
            // Capstan's namespace and the replica's name (its leader identity).
            env_from_field("CAPSTAN_NAMESPACE", "metadata.namespace"),
            env_from_field("POD_NAME", "metadata.name"),
            // The runtime refuses a granted name that resolves to it.
            env_from_field("POD_IP", "status.podIP"),
            env_value("HOME", "/tmp"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("metrics".into()),
                container_port: METRICS_PORT,
                ..Default::default()
            },
            ContainerPort {
                name: Some("health".into()),
                container_port: HEALTH_PORT,
                ..Default::default()
            },
        ]),
        liveness_probe: Some(probe("/healthz", 10)),
        // A standby answers 200 too (its body says so): only the leader
        // reconciles, but both must count as available for a rollout.
        readiness_probe: Some(probe("/readyz", 5)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "100m"), ("memory", "128Mi")])),
            limits: Some(quantities(&[("memory", "1Gi")])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(
            vec![
                VolumeMount {
                    name: "cache".into(),
                    mount_path: CACHE_DIR.into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "tmp".into(),
                    mount_path: "/tmp".into(),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(with_policy.then(|| VolumeMount {
                name: "trust-policy".into(),
                mount_path: TRUST_POLICY_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            }))
            .collect(),
        ),
        ..Default::default()
    };
    let empty_dir = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let name = deployment_name(args.watch_filter.as_deref());
    Deployment {
        metadata: ObjectMeta {
            labels: Some(labels_named(&name)),
            ..meta(&name, Some(&args.namespace))
        },
        spec: Some(DeploymentSpec {
            replicas: Some(args.replicas),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    name.clone(),
                )])),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels_named(&name)),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.into()),
                    termination_grace_period_seconds: Some(30),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(IMAGE_UID),
                        run_as_group: Some(IMAGE_UID),
                        fs_group: Some(IMAGE_UID),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    containers: vec![container],
                    volumes: Some(
                        [empty_dir("cache"), empty_dir("tmp")]
                            .into_iter()
                            .chain(with_policy.then(|| Volume {
                                name: "trust-policy".into(),
                                config_map: Some(ConfigMapVolumeSource {
                                    name: TRUST_POLICY_CONFIG_MAP.into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }))
                            .collect(),
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The ConfigMap holding the host's trust policy.
const TRUST_POLICY_CONFIG_MAP: &str = "capstan-trust-policy";

/// The objects `install` creates; `image` is the controller image (after
/// [`controller_image`]), `policy` the host's trust policy (its keys
/// inline), if any.
/// The namespaces whose Machines may have bootstrap data: Capstan's own,
/// the tenant namespaces and each `--machine-namespace`, each once.
fn machine_namespaces(args: &InstallArgs) -> Vec<&str> {
    let mut out: Vec<&str> = vec![args.namespace.as_str()];
    for namespace in args
        .tenant_namespaces
        .iter()
        .chain(&args.machine_namespaces)
    {
        if !out.contains(&namespace.as_str()) {
            out.push(namespace);
        }
    }
    out
}

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
        machine_bootstrappers: ClusterRoleBinding {
            metadata: meta(MACHINE_BOOTSTRAPPERS_BINDING, None),
            role_ref: RoleRef {
                name: "system:node-bootstrapper".into(),
                ..role_ref("ClusterRole")
            },
            subjects: Some(vec![Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Group".into(),
                name: capstan_controllers::MACHINE_BOOTSTRAPPERS.into(),
                namespace: None,
            }]),
        },
        deployment: deployment(args, image, policy.is_some()),
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

async fn delete<K>(api: Api<K>, name: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let kind = K::kind(&()).to_lowercase();
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => println!("{kind}/{name} deleted"),
        Err(kube::Error::Api(e)) if e.code == 404 => println!("{kind}/{name} not found"),
        Err(e) => return Err(e).with_context(|| format!("cannot delete {kind}/{name}")),
    }
    Ok(())
}

/// Remove `finalizer` (the controller's own, and only it) from every object
/// of `api` that carries it. A missing CRD means there is nothing to release.
async fn release_finalizers<K>(api: Api<K>, finalizer: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let kind = K::kind(&()).to_lowercase();
    let items = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {kind}s")),
    };
    for obj in items {
        // Tested first, so a list someone else changed meanwhile is not
        // overwritten (the next uninstall tries again).
        let change = capstan_kit::write::FinalizerChange::Remove;
        let Some(patch) = capstan_kit::write::finalizer_patch(obj.finalizers(), finalizer, change)
        else {
            continue;
        };
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        Api::<K>::namespaced(api.clone().into_client(), &ns)
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .with_context(|| {
                format!("cannot remove the finalizer {finalizer} of {kind} {ns}/{name}")
            })?;
        println!("{kind}/{name} ({ns}): finalizer {finalizer} removed");
    }
    Ok(())
}

/// `capstan uninstall`.
pub async fn uninstall(args: UninstallArgs) -> anyhow::Result<ExitCode> {
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    let ns = args.namespace.as_str();
    let ours = deployment_name(args.watch_filter.as_deref());
    // Other controller Deployments (shards) in the namespace keep the
    // shared objects, and their Machines are theirs to hold.
    let others: Vec<String> = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=capstan"))
        .await
        .with_context(|| format!("cannot list the controller Deployments in namespace {ns}"))?
        .items
        .into_iter()
        .map(|d| d.name_any())
        .filter(|name| *name != ours)
        .collect();
    let filter = args.watch_filter.as_deref();
    let ours_to_hold = |m: &Machine| {
        let label = m.labels().get(capstan_controllers::LABEL_WATCH_FILTER);
        match filter {
            Some(value) => label.map(String::as_str) == Some(value),
            None => others.is_empty() || label.is_none(),
        }
    };
    let machines: Api<Machine> = Api::all(client.clone());
    let held: Vec<Machine> = match machines.list(&Default::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|m| !m.finalizers().is_empty() && ours_to_hold(m))
            .collect(),
        // No Machine CRD: nothing can be held.
        Err(kube::Error::Api(e)) if e.code == 404 => vec![],
        Err(e) => return Err(e).context("cannot list Machines"),
    };
    if !held.is_empty() {
        let names: Vec<String> = held
            .iter()
            .take(10)
            .map(|m| format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any()))
            .collect();
        if !args.force {
            anyhow::bail!(
                "{} Machine(s) still hold finalizers ({}{}): their instances would leak. \
                 Delete their MachineDeployments and MachineSets and wait until the Machines are gone, \
                 or pass --force to drop the finalizers and leave the instances behind",
                held.len(),
                names.join(", "),
                if held.len() > names.len() {
                    ", …"
                } else {
                    ""
                }
            );
        }
        for m in &held {
            let api: Api<Machine> =
                Api::namespaced(client.clone(), &m.namespace().unwrap_or_default());
            api.patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } })),
            )
            .await
            .with_context(|| format!("cannot remove the finalizers of Machine {}", m.name_any()))?;
            eprintln!(
                "warning: removed the finalizers of Machine {}/{}; its instance is left behind",
                m.namespace().unwrap_or_default(),
                m.name_any()
            );
        }
    }
    delete(Api::<Deployment>::namespaced(client.clone(), ns), &ours).await?;
    if !others.is_empty() {
        println!(
            "kept the namespace {ns}, its ServiceAccount and RBAC, and the CRDs: \
             other controller Deployments use them ({}); uninstall those to remove everything",
            others.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    delete(Api::<RoleBinding>::namespaced(client.clone(), ns), NAME).await?;
    delete(Api::<Role>::namespaced(client.clone(), ns), NAME).await?;
    delete(Api::<ClusterRoleBinding>::all(client.clone()), NAME).await?;
    delete(Api::<ClusterRole>::all(client.clone()), NAME).await?;
    for fixed in rbac::fixed_namespaces() {
        delete(Api::<RoleBinding>::namespaced(client.clone(), fixed), NAME).await?;
        delete(Api::<Role>::namespaced(client.clone(), fixed), NAME).await?;
    }
    delete(
        Api::<ClusterRoleBinding>::all(client.clone()),
        MACHINE_BOOTSTRAPPERS_BINDING,
    )
    .await?;
    // The tenant and machine namespaces' bindings, wherever they were made.
    for (binding, role) in [
        (TENANT_BINDING, capstan_addons::engine::TENANT_ROLE),
        (MACHINE_NAMESPACE_ROLE, MACHINE_NAMESPACE_ROLE),
    ] {
        let bindings = Api::<RoleBinding>::all(client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={binding}")))
            .await
            .with_context(|| format!("cannot list the RoleBindings {binding}"))?;
        for found in bindings.items {
            let namespace = found.namespace().unwrap_or_default();
            delete(
                Api::<RoleBinding>::namespaced(client.clone(), &namespace),
                binding,
            )
            .await?;
        }
        delete(Api::<ClusterRole>::all(client.clone()), role).await?;
    }
    delete(Api::<ServiceAccount>::namespaced(client.clone(), ns), NAME).await?;
    // No Machine is held any more (checked above), so the sets' and
    // deployments' finalizers guard nothing; with the controller and its
    // rights gone, nobody would remove them and the CRDs would never go.
    let finalizer = capstan_api::MACHINESET_FINALIZER;
    let sets = Api::<capstan_api::MachineSet>::all(client.clone());
    release_finalizers(sets, finalizer).await?;
    let finalizer = capstan_api::MACHINEDEPLOYMENT_FINALIZER;
    let deployments = Api::<capstan_api::MachineDeployment>::all(client.clone());
    release_finalizers(deployments, finalizer).await?;
    for crd in capstan_api::crds() {
        delete(
            Api::<CustomResourceDefinition>::all(client.clone()),
            &crd.name_any(),
        )
        .await?;
    }
    delete(Api::<Namespace>::all(client), ns).await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: InstallArgs,
    }

    fn args(extra: &[&str]) -> InstallArgs {
        Cli::parse_from([&["install"], extra].concat()).args
    }

    fn built(args: &InstallArgs, policy: Option<&TrustPolicy>) -> Manifests {
        manifests(args, &controller_image(args).unwrap().0, policy)
    }

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_image_is_pinned_by_a_whole_digest_and_mirrored_at_a_path_boundary() {
        let pinned = format!("ghcr.io/capstan-dev/capstan:0.1.0@{DIGEST}");
        assert_eq!(
            controller_image(&args(&["--image", &pinned])).unwrap(),
            (pinned.clone(), true)
        );
        // The default is the published tag: usable, but not pinned.
        let (default, is_pinned) = controller_image(&args(&[])).unwrap();
        assert_eq!((default.as_str(), is_pinned), (PUBLISHED_IMAGE, false));
        for bad in [
            "ghcr.io/capstan-dev/capstan@sha256:0123",
            "ghcr.io/capstan-dev/capstan@md5:0123456789abcdef0123456789abcdef",
            "oci://ghcr.io/capstan-dev/capstan:1",
            "ghcr.io/capstan dev/capstan:1",
            "",
        ] {
            let err = controller_image(&args(&["--image", bad])).unwrap_err();
            assert!(err.to_string().contains("--image"), "{bad}: {err}");
        }
        let mirrored = |rule: &str, image: &str| {
            controller_image(&args(&["--image", image, "--image-mirror", rule]))
                .unwrap()
                .0
        };
        assert_eq!(
            mirrored("ghcr.io/capstan-dev/=mirror.local:5000/capstan/", &pinned),
            format!("mirror.local:5000/capstan/capstan:0.1.0@{DIGEST}")
        );
        assert_eq!(
            mirrored("ghcr.io/capstan-dev/capstan=mirror.local/c", &pinned),
            format!("mirror.local/c:0.1.0@{DIGEST}")
        );
        // `…/capstan` is not a prefix of `…/capstan-fork`.
        let fork = format!("ghcr.io/capstan-dev/capstan-fork@{DIGEST}");
        assert_eq!(
            mirrored("ghcr.io/capstan-dev/capstan=mirror.local/c", &fork),
            fork
        );
    }

    #[test]
    fn roles_come_from_the_one_list_and_secrets_stay_in_the_namespace() {
        let m = built(&args(&["--namespace", "ops"]), None);
        let cluster = m.cluster_role.rules.unwrap();
        assert_eq!(cluster.len(), rbac::rules(Scope::Cluster).count());
        // No Secret is readable cluster-wide.
        for rule in &cluster {
            assert!(
                !rule.resources.as_ref().unwrap().contains(&"secrets".into()),
                "{rule:?}"
            );
        }
        // Bootstrap tokens: a Role in kube-system; cluster-info: kube-public.
        let fixed: Vec<(String, Vec<String>)> = m
            .system_roles
            .iter()
            .map(|(role, binding)| {
                assert_eq!(role.metadata.namespace, binding.metadata.namespace);
                (
                    role.metadata.namespace.clone().unwrap(),
                    role.rules.as_ref().unwrap()[0].resources.clone().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            fixed,
            [
                ("kube-system".to_string(), vec!["secrets".to_string()]),
                ("kube-public".to_string(), vec!["configmaps".to_string()])
            ]
        );
        let own = m.role.rules.unwrap();
        assert!(
            own.iter()
                .any(|r| r.resources.as_ref().unwrap() == &["secrets"])
        );
        assert_eq!(m.role.metadata.namespace.as_deref(), Some("ops"));
        let subject = &m.cluster_role_binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (NAME, Some("ops"))
        );
    }

    #[test]
    fn bootstrap_data_secrets_are_bound_only_where_machines_may_bootstrap() {
        let bound = |m: &Manifests| -> Vec<String> {
            m.machine_bindings
                .iter()
                .map(|b| {
                    assert_eq!(b.role_ref.name, MACHINE_NAMESPACE_ROLE);
                    assert_eq!(b.role_ref.kind, "ClusterRole");
                    b.metadata.namespace.clone().unwrap()
                })
                .collect()
        };
        let m = built(&args(&["--namespace", "ops"]), None);
        assert_eq!(bound(&m), ["ops"]);
        let rules = m.machine_role.rules.clone().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["secrets".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["get", "create"]);
        let m = built(
            &args(&[
                "--namespace",
                "ops",
                "--tenant-namespace",
                "team-a",
                "--machine-namespace",
                "clusters",
                "--machine-namespace",
                "team-a",
            ]),
            None,
        );
        assert_eq!(bound(&m), ["ops", "team-a", "clusters"]);
    }

    #[test]
    fn impersonation_is_bound_only_in_the_tenant_namespaces_named() {
        let m = built(&args(&["--namespace", "ops"]), None);
        assert!(m.tenant_bindings.is_empty());
        assert!(
            m.cluster_role
                .rules
                .unwrap()
                .iter()
                .all(|r| !r.verbs.contains(&"impersonate".into())),
            "no cluster-wide impersonation"
        );
        let tenants = [
            "--namespace",
            "ops",
            "--tenant-namespace",
            "team-a",
            "--tenant-namespace",
            "team-b",
        ];
        let m = built(&args(&tenants), None);
        let rules = m.tenant_role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["serviceaccounts".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["impersonate"]);
        let bound: Vec<_> = m
            .tenant_bindings
            .iter()
            .map(|b| {
                let subject = &b.subjects.as_ref().unwrap()[0];
                (
                    b.metadata.namespace.as_deref().unwrap(),
                    b.role_ref.kind.as_str(),
                    b.role_ref.name.as_str(),
                    subject.namespace.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            bound,
            [
                (
                    "team-a",
                    "ClusterRole",
                    capstan_addons::engine::TENANT_ROLE,
                    "ops"
                ),
                (
                    "team-b",
                    "ClusterRole",
                    capstan_addons::engine::TENANT_ROLE,
                    "ops"
                ),
            ]
        );
    }

    #[test]
    fn a_shard_is_a_deployment_of_its_own_sharing_the_rest() {
        let plain = built(&args(&[]), None);
        let shard = built(&args(&["--watch-filter", "zone-a"]), None);
        let d = &shard.deployment;
        assert_eq!(
            d.metadata.name.as_deref(),
            Some("capstan-controller-zone-a")
        );
        let spec = d.spec.as_ref().unwrap();
        let selected = spec.selector.match_labels.as_ref().unwrap();
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        // Each Deployment selects its own pods only: the default selector
        // does not match a shard's pods, nor the reverse.
        let plain_selector = plain
            .deployment
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .clone();
        assert!(selected.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        assert!(
            plain_selector
                .unwrap()
                .iter()
                .any(|(k, v)| pod_labels.get(k) != Some(v)),
            "the default Deployment would adopt the shard's pods"
        );
        let args_of = |d: &Deployment| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .args
                .clone()
                .unwrap()
        };
        assert!(args_of(d).contains(&"--watch-filter=zone-a".to_string()));
        assert!(
            !args_of(&plain.deployment)
                .iter()
                .any(|a| a.starts_with("--watch-filter"))
        );
        // Shared: the same ServiceAccount, roles and bindings as the default.
        assert_eq!(
            spec.template
                .spec
                .as_ref()
                .unwrap()
                .service_account_name
                .as_deref(),
            Some(NAME)
        );
        assert_eq!(shard.cluster_role_binding, plain.cluster_role_binding);
        assert_eq!(shard.role_binding, plain.role_binding);
        // A value the controller would refuse is refused here.
        let bad = Cli::try_parse_from(["install", "--watch-filter=zone."]);
        assert!(bad.is_err());
    }

    #[test]
    fn the_deployment_runs_leader_elected_non_root_replicas() {
        let m = built(
            &args(&[
                "--image",
                "registry.example/capstan:1",
                "--controller-arg=--resync=5m",
                "--controller-arg=--leader-elect-lease-duration=30s",
            ]),
            None,
        );
        let spec = m.deployment.spec.unwrap();
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.unwrap();
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.example/capstan:1"));
        let a = c.args.clone().unwrap();
        assert!(a.contains(&"--leader-elect".into()) && a.contains(&"--resync=5m".into()));
        // Flags only: the image's entrypoint is `capstan controller`.
        assert!(a.iter().all(|arg| arg.starts_with("--")), "{a:?}");
        // A --controller-arg replaces the default of the same flag.
        let lease: Vec<&String> = a
            .iter()
            .filter(|f| f.starts_with("--leader-elect-lease-duration"))
            .collect();
        assert_eq!(lease, ["--leader-elect-lease-duration=30s"]);
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            (
                sc.run_as_non_root,
                sc.read_only_root_filesystem,
                sc.allow_privilege_escalation
            ),
            (Some(true), Some(true), Some(false))
        );
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let pod_sc = pod.security_context.as_ref().unwrap();
        assert_eq!(pod_sc.run_as_user, Some(IMAGE_UID));
        assert_eq!(
            pod_sc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        assert!(c.liveness_probe.is_some());
        assert!(c.resources.as_ref().unwrap().limits.is_some());
        assert_eq!(
            c.readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/readyz")
        );
        assert!(c.resources.as_ref().unwrap().requests.is_some());
    }

    #[test]
    fn the_yaml_stream_names_every_object() {
        let text = render(&built(&args(&[]), None)).unwrap();
        for kind in [
            "kind: Namespace",
            "kind: CustomResourceDefinition",
            "kind: ServiceAccount",
            "kind: ClusterRole\n",
            "kind: ClusterRoleBinding",
            "kind: Role\n",
            "kind: RoleBinding",
            "kind: Deployment",
        ] {
            assert!(text.contains(kind), "{kind} missing");
        }
    }

    #[test]
    fn a_trust_policy_travels_in_a_config_map_mounted_read_only() {
        let key = capstan_registry::keys::PrivateKey::generate().public();
        let pem = key.to_pem().replace('\n', "\n      ");
        let policy = TrustPolicy::parse(
            "p.yaml",
            &format!("apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    publicKey: |\n      {pem}\nsources:\n  - prefix: oci://registry.example.com/capstan/\n    allOf: [publisher]\n"),
            None,
        )
        .unwrap();
        let m = built(&args(&["--namespace", "ops"]), Some(&policy));
        let cm = m.trust_policy.unwrap();
        assert_eq!(cm.metadata.namespace.as_deref(), Some("ops"));
        let text = &cm.data.unwrap()[TRUST_POLICY_FILE];
        let back = TrustPolicy::parse("back", text, None).unwrap();
        let source =
            capstan_registry::Source::parse("oci://registry.example.com/capstan/sim:v1").unwrap();
        assert!(back.rule_for(&source).is_some(), "the keys travel inline");
        let pod = m.deployment.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert!(
            c.args
                .as_ref()
                .unwrap()
                .contains(&"--trust-policy=/etc/capstan/trust-policy.yaml".into())
        );
        let mount = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "trust-policy")
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (TRUST_POLICY_DIR, Some(true))
        );
        // Without one, nothing of it.
        let m = built(&args(&[]), None);
        assert!(m.trust_policy.is_none());
        let pod = m.deployment.spec.unwrap().template.spec.unwrap();
        assert!(
            !pod.containers[0]
                .args
                .as_ref()
                .unwrap()
                .iter()
                .any(|a| a.starts_with("--trust-policy"))
        );
    }
}
