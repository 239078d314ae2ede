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

#[test]
fn a_workload_cluster_gets_the_node_side_rules_bound_to_its_kubeconfigs_user() {
    let m = workload::manifests(Some("capstan"));
    assert!(m.service_account.is_none());
    let subjects = m.cluster_role_binding.subjects.clone().unwrap();
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("User", "capstan")
    );
    let rules = m.cluster_role.rules.clone().unwrap();
    let resources: Vec<String> = rules
        .iter()
        .flat_map(|r| r.resources.clone().unwrap())
        .collect();
    assert!(resources.contains(&"nodes".to_string()), "{resources:?}");
    assert!(
        !resources.iter().any(|r| r.starts_with("machine")),
        "{resources:?}"
    );
    assert!(
        rules
            .iter()
            .all(|r| r.api_groups.as_ref().unwrap()[0] != "capstan.dev")
    );
    let namespaces: Vec<String> = m
        .roles
        .iter()
        .map(|(r, _)| r.namespace().unwrap())
        .collect();
    assert_eq!(namespaces, ["kube-system", "kube-public"]);
    assert_eq!(
        m.machine_bootstrappers.subjects.clone().unwrap()[0].name,
        capstan_controllers::MACHINE_BOOTSTRAPPERS
    );
    // Without a user: a ServiceAccount of its own in kube-system.
    let m = workload::manifests(None);
    let sa = m.service_account.clone().unwrap();
    assert_eq!(sa.namespace().as_deref(), Some("kube-system"));
    let yaml = workload::render(&m).unwrap();
    assert!(
        yaml.contains("kind: ServiceAccount") && yaml.contains("name: capstan-workload"),
        "{yaml}"
    );
}
