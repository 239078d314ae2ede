//! The controller's Deployment: leader-elected replicas of `capstan
//! controller`, non-root with a read-only root filesystem, their flags
//! (a `--controller-arg` replaces the default of the same flag), probes,
//! caches and the trust policy mounted from its ConfigMap.

use super::*;

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

/// The controller's flags: the image's entrypoint is `capstan controller`.
/// The leader-election timings are spelled out so they can be read and
/// tuned here; a `--controller-arg` for the same flag replaces the default
/// (the controller would refuse a flag given twice).
fn controller_args(args: &InstallArgs, with_policy: bool) -> Vec<String> {
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
    defaults
        .into_iter()
        .filter(|d| !overridden.contains(&flag_name(d)))
        .chain(args.controller_args.iter().cloned())
        .collect()
}

/// The controller container: non-root, no privilege, a read-only root
/// filesystem with its caches and `/tmp` on emptyDirs, the trust policy
/// mounted read-only when there is one, and its probes.
fn controller_container(image: &str, container_args: Vec<String>, with_policy: bool) -> Container {
    Container {
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
    }
}

pub(super) fn controller_deployment(
    args: &InstallArgs,
    image: &str,
    with_policy: bool,
) -> Deployment {
    let container = controller_container(image, controller_args(args, with_policy), with_policy);
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
pub(super) const TRUST_POLICY_CONFIG_MAP: &str = "capstan-trust-policy";
