use super::*;
use capstan_api::{AddonPatch, PatchTarget, PatchType, PodSecurityLevel};
use capstan_manifest::ObjectPattern;
use proptest::prelude::*;
use serde_json::json;

/// `check_grants` under the built-in ClusterRole aggregations.
fn check_built_in(
    objects: &[Object],
    declared: &[ObjectPattern],
    grants: &AddonGrants,
    tenant: Option<&str>,
) -> Result<(), AddonError> {
    check_grants(
        objects,
        declared,
        grants,
        tenant,
        &crate::floor::Aggregators::built_in(),
    )
}

fn known() -> Vec<(String, Vec<String>)> {
    vec![
        ("1.10.1".into(), vec!["stable".into()]),
        ("1.11.3".into(), vec!["rapid".into()]),
        ("1.9.4".into(), vec!["stable".into()]),
    ]
}

fn objects(values: Vec<Value>) -> Vec<Object> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| Object::from_value(i, v).unwrap())
        .collect()
}

fn deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "coredns", "namespace": "kube-system"},
           "spec": {"replicas": 2, "template": {"spec": {
               "containers": [{"name": "coredns", "image": "registry.k8s.io/coredns/coredns:v1.10.1",
                               "args": ["-conf", "/etc/coredns/Corefile"]}],
               "initContainers": [{"name": "init", "image": "docker.io/busybox:1"}]}}}})
}

fn config_map() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "coredns", "namespace": "kube-system"},
           "data": {"Corefile": ".:53 {}"}})
}

/// Patch rules that allow any change of any object (the pure merge tests).
fn any_patch() -> Vec<PatchRule> {
    ["apps/Deployment@*", "ConfigMap@*"]
        .iter()
        .map(|p| PatchRule {
            objects: p.parse().unwrap(),
            paths: vec!["/".into()],
        })
        .collect()
}

/// A patch of the rendered `coredns` Deployment.
fn coredns_patch(kind: PatchType, body: serde_json::Value) -> AddonPatch {
    patch("Deployment", "coredns", kind, body)
}

fn patch(kind: &str, name: &str, type_: PatchType, patch: Value) -> AddonPatch {
    AddonPatch {
        target: PatchTarget {
            kind: kind.into(),
            name: name.into(),
            namespace: None,
        },
        type_,
        patch,
    }
}

#[test]
fn a_version_wins_over_a_channel_and_a_channel_takes_its_highest_version() {
    let k = known();
    let r = resolve_version(Some("1.11.3"), Some("stable"), &k).unwrap();
    assert_eq!((r.version.as_str(), r.channel), ("1.11.3", None));
    let r = resolve_version(None, Some("stable"), &k).unwrap();
    assert_eq!(r.version, "1.10.1", "1.10.1 > 1.9.4 numerically");
    assert_eq!(r.channel.as_deref(), Some("stable"));
}

#[test]
fn unknown_versions_and_channels_name_what_is_known() {
    let k = known();
    let e = resolve_version(Some("2.0.0"), None, &k).unwrap_err();
    assert!(e.to_string().contains("\"2.0.0\""), "{e}");
    assert!(e.to_string().contains("1.10.1, 1.11.3, 1.9.4"), "{e}");
    let e = resolve_version(None, Some("beta"), &k).unwrap_err();
    assert!(
        e.to_string().contains("known channels: rapid, stable"),
        "{e}"
    );
    let e = resolve_version(None, None, &k).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("set spec.version or spec.channel"),
        "{e}"
    );
}

#[test]
fn renders_must_be_objects_with_identity_and_no_duplicates() {
    let e = Object::parse(3, "[1]").unwrap_err();
    assert_eq!(e.to_string(), "rendered object 3: not a JSON object");
    let e =
        Object::parse(0, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#).unwrap_err();
    assert!(e.to_string().contains("metadata.name"), "{e}");
    let e = Object::parse(
        0,
        r#"{"apiVersion":"v1","kind":"List","metadata":{"name":"x"}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is a list"), "{e}");
    let text = config_map().to_string();
    let e = parse_render(&[text.clone(), text]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the render contains ConfigMap kube-system/coredns twice"
    );
}

#[test]
fn labels_name_the_addon() {
    let mut o = objects(vec![config_map()]);
    label(&mut o, "default", "dns");
    assert_eq!(o[0].value["metadata"]["labels"][LABEL_ADDON_NAME], "dns");
    assert_eq!(
        o[0].value["metadata"]["labels"][LABEL_ADDON_NAMESPACE],
        "default"
    );
}

#[test]
fn merge_patches_replace_lists_and_strategic_patches_merge_them_by_name() {
    let mut o = objects(vec![deployment()]);
    apply_patches(
        &mut o,
        &[coredns_patch(
            PatchType::Strategic,
            json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "coredns", "resources": {"limits": {"memory": "170Mi"}}},
                {"name": "sidecar", "image": "x"}]}}}}),
        )],
        &any_patch(),
        false,
    )
    .unwrap();
    let c = &o[0].value["spec"]["template"]["spec"]["containers"];
    assert_eq!(o[0].value["spec"]["replicas"], 3);
    assert_eq!(c.as_array().unwrap().len(), 2);
    assert_eq!(c[0]["image"], "registry.k8s.io/coredns/coredns:v1.10.1");
    assert_eq!(c[0]["resources"]["limits"]["memory"], "170Mi");

    let mut o = objects(vec![deployment()]);
    apply_patches(
        &mut o,
        &[coredns_patch(
PatchType::Merge,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "only"}], "initContainers": null}}}}),
        )],
        &any_patch(),
        false,
    )
    .unwrap();
    let spec = &o[0].value["spec"]["template"]["spec"];
    assert_eq!(spec["containers"], json!([{"name": "only"}]));
    assert!(spec.get("initContainers").is_none());
}

#[test]
fn a_patch_without_its_target_is_an_error_naming_what_was_rendered() {
    let mut o = objects(vec![deployment(), config_map()]);
    let e = apply_patches(
        &mut o,
        &[patch(
            "Deployment",
            "kube-dns",
            PatchType::Merge,
            json!({"spec": {}}),
        )],
        &any_patch(),
        false,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.patches[0]: its target Deployment kube-dns is not among the rendered objects \
         (Deployment kube-system/coredns, ConfigMap kube-system/coredns); fix or remove the patch"
    );
    let e = apply_patches(
        &mut o,
        &[patch(
            "ConfigMap",
            "coredns",
            PatchType::Merge,
            json!({"metadata": {"name": "other"}}),
        )],
        &any_patch(),
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("may not change"), "{e}");
}

#[test]
fn images_are_rewritten_in_every_container_list_and_recorded_once() {
    let mut o = objects(vec![deployment(), deployment_named("second"), config_map()]);
    let rules = vec![
        "registry.k8s.io/=mirror.local/"
            .parse::<ImageRewrite>()
            .unwrap(),
        "docker.io/=mirror.local/hub/".parse().unwrap(),
    ];
    let records = rewrite_images(&mut o, &rules);
    assert_eq!(
        records,
        vec![
            ImageRewriteRecord {
                from: "registry.k8s.io/coredns/coredns:v1.10.1".into(),
                to: "mirror.local/coredns/coredns:v1.10.1".into()
            },
            ImageRewriteRecord {
                from: "docker.io/busybox:1".into(),
                to: "mirror.local/hub/busybox:1".into()
            },
        ]
    );
    let spec = &o[1].value["spec"]["template"]["spec"];
    assert_eq!(
        spec["initContainers"][0]["image"],
        "mirror.local/hub/busybox:1"
    );
    assert!("nothing".parse::<ImageRewrite>().is_err());
}

fn deployment_named(name: &str) -> Value {
    let mut d = deployment();
    d["metadata"]["name"] = name.into();
    d
}

#[test]
fn objects_outside_the_declared_or_granted_kinds_refuse_the_whole_render() {
    let crb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": {"name": "greedy"}});
    let o = objects(vec![config_map(), deployment(), crb]);
    let declared: Vec<ObjectPattern> = vec![
        "ConfigMap@*".parse().unwrap(),
        "apps/Deployment@*".parse().unwrap(),
    ];
    let granted: Vec<ObjectPattern> = vec![
        "ConfigMap@kube-system".parse().unwrap(),
        "apps/Deployment@default".parse().unwrap(),
        "rbac.authorization.k8s.io/ClusterRoleBinding"
            .parse()
            .unwrap(),
    ];
    let granted = AddonGrants {
        objects: granted,
        ..Default::default()
    };
    let e = check_built_in(&o, &declared, &granted, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "refused the whole render, nothing was applied: \
         Deployment kube-system/coredns is outside spec.grants.objects (it needs a grant covering apps/Deployment@kube-system); \
         ClusterRoleBinding greedy is outside what the plugin declares (capabilities.objects has no rbac.authorization.k8s.io/ClusterRoleBinding), so it cannot be granted"
    );
    assert!(check_built_in(&o[..1], &declared, &granted, None).is_ok());
}

#[test]
fn a_tenants_render_stays_in_its_namespace_unless_tenant_objects_cover_it() {
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": "system:coredns"}, "rules": []});
    let o = objects(vec![config_map(), role]);
    let all: Vec<ObjectPattern> = vec![
        "ConfigMap@*".parse().unwrap(),
        "rbac.authorization.k8s.io/ClusterRole".parse().unwrap(),
    ];
    let mut grants = AddonGrants {
        objects: all.clone(),
        ..Default::default()
    };
    // The admin's Addon (not a tenant): as granted.
    assert!(check_built_in(&o, &all, &grants, None).is_ok());
    // In its own namespace, a tenant gets the same.
    assert!(check_built_in(&o[..1], &all, &grants, Some("kube-system")).is_ok());
    let e = check_built_in(&o, &all, &grants, Some("team-a")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "refused the whole render, nothing was applied: \
         ConfigMap kube-system/coredns is outside namespace team-a: an Addon outside Capstan's namespace renders only into its own namespace unless the Plugin's spec.grants.tenantObjects covers the object (ConfigMap@kube-system); \
         ClusterRole system:coredns is outside namespace team-a: an Addon outside Capstan's namespace renders only into its own namespace unless the Plugin's spec.grants.tenantObjects covers the object (rbac.authorization.k8s.io/ClusterRole/system:coredns)"
    );
    grants.tenant_objects = vec![
        "rbac.authorization.k8s.io/ClusterRole/system:coredns"
            .parse()
            .unwrap(),
    ];
    let e = check_built_in(&o, &all, &grants, Some("team-a")).unwrap_err();
    assert!(!e.to_string().contains("ClusterRole"), "{e}");
}

#[test]
fn patches_change_only_granted_paths_and_the_grant_check_sees_the_patched_object() {
    let replicas_only = vec![PatchRule {
        objects: "apps/Deployment@kube-system".parse().unwrap(),
        paths: vec![
            "/spec/replicas".into(),
            "/spec/template/spec/containers/*/resources".into(),
        ],
    }];
    let mut o = objects(vec![deployment()]);
    apply_patches(
        &mut o,
        &[coredns_patch(
            PatchType::Strategic,
            json!({"spec": {"replicas": 5, "template": {"spec": {"containers": [
                {"name": "coredns", "resources": {"limits": {"memory": "1Gi"}}}]}}}}),
        )],
        &replicas_only,
        false,
    )
    .unwrap();
    assert_eq!(o[0].value["spec"]["replicas"], 5);

    // The attack from the review: a tenant's patch turning CoreDNS into a
    // host-root pod with another image.
    let hostile = coredns_patch(
        PatchType::Strategic,
        json!({"spec": {"template": {"spec": {
            "hostPID": true,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "coredns", "image": "evil.example/root:1"}]}}}}),
    );
    let before = o.clone();
    let e =
        apply_patches(&mut o, std::slice::from_ref(&hostile), &replicas_only, true).unwrap_err();
    assert_eq!(o, before, "a refused patch changes nothing");
    let text = e.to_string();
    for path in [
        "/spec/template/spec/containers/0/image",
        "/spec/template/spec/hostPID",
        "/spec/template/spec/volumes",
    ] {
        assert!(text.contains(path), "{path} in {text}");
    }
    assert!(
        text.contains("for Addons outside Capstan's namespace"),
        "{text}"
    );
    assert!(matches!(e, AddonError::PatchNotGranted { index: 0, .. }));
    // No rule at all: nothing may be patched.
    assert!(apply_patches(&mut o, std::slice::from_ref(&hostile), &[], false).is_err());

    // An admin who allowed everything still cannot get past the floor: the
    // grant check runs on the patched objects.
    let mut o = objects(vec![deployment()]);
    apply_patches(&mut o, &[hostile], &any_patch(), false).unwrap();
    let declared: Vec<ObjectPattern> = vec!["apps/Deployment@*".parse().unwrap()];
    let mut grants = AddonGrants {
        objects: declared.clone(),
        ..Default::default()
    };
    let e = check_built_in(&o, &declared, &grants, None).unwrap_err();
    assert!(matches!(e, AddonError::Floor(_)), "{e}");
    assert!(e.to_string().contains("hostPID: true"), "{e}");
    grants.pod_security = PodSecurityLevel::Privileged;
    assert!(check_built_in(&o, &declared, &grants, None).is_ok());
}

#[test]
fn changed_paths_escape_keys_and_stop_at_lists_that_changed_length() {
    let before = json!({"metadata": {"labels": {"a/b": "1"}}, "spec": {"list": [1, 2]}});
    let after = json!({"metadata": {"labels": {"a/b": "2", "c": "3"}}, "spec": {"list": [1]}});
    assert_eq!(
        changed_paths(&before, &after),
        ["/metadata/labels/a~1b", "/metadata/labels/c", "/spec/list"]
    );
    assert!(changed_paths(&before, &before).is_empty());
}

#[test]
fn crds_and_namespaces_go_first_and_prunes_go_in_reverse() {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "dns"}});
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "metadata": {"name": "x.example.com"}});
    let mut o = objects(vec![config_map(), ns, deployment(), crd]);
    apply_order(&mut o);
    let kinds: Vec<&str> = o.iter().map(|o| o.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "CustomResourceDefinition",
            "Namespace",
            "ConfigMap",
            "Deployment"
        ]
    );

    let previous: Vec<InventoryEntry> = o.iter().map(Object::entry).collect();
    let mut old_version = previous.clone();
    old_version[3].api_version = "apps/v1beta2".into();
    let current = vec![o[0].clone(), o[3].clone()];
    let gone: Vec<String> = pruned(&old_version, &current)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(gone, ["ConfigMap kube-system/coredns", "Namespace dns"]);
}

#[test]
fn server_additions_are_not_drift_but_changed_or_missing_fields_are() {
    let desired = deployment();
    let mut live = desired.clone();
    live["metadata"]["uid"] = "u".into();
    live["status"] = json!({"replicas": 2});
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/x".into();
    assert!(conforms(&desired, &live));
    let mut edited = live.clone();
    edited["spec"]["replicas"] = 5.into();
    assert!(!conforms(&desired, &edited));
    let mut extra = live.clone();
    extra["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "x"}));
    assert!(!conforms(&desired, &extra));
    let mut cm = config_map();
    let live_cm = cm.clone();
    cm["data"]["Corefile"] = "edited".into();
    assert!(!conforms(&cm, &live_cm));
    let mut empty = config_map();
    empty["metadata"]["annotations"] = json!({});
    assert!(conforms(&empty, &config_map()));
}

#[test]
fn assess_sees_what_was_rendered_and_status_never_other_data() {
    let rendered = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "kube-system"}, "data": {"mine": "YQ=="}});
    let live = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "kube-system", "uid": "u", "generation": 1,
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
        "data": {"mine": "Yg==", "token": "c2VjcmV0"}});
    let view = assess_view(&rendered, &live);
    assert_eq!(view["data"], json!({"mine": "Yg=="}));
    assert!(view["metadata"].get("annotations").is_none());
    assert_eq!(view["metadata"]["generation"], 1);

    let d = deployment();
    let mut live = d.clone();
    live["spec"]["replicas"] = 7.into();
    live["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "PASSWORD", "value": "x"}]);
    live["status"] = json!({"availableReplicas": 7});
    let view = assess_view(&d, &live);
    assert_eq!(view["spec"]["replicas"], 7);
    assert_eq!(view["status"]["availableReplicas"], 7);
    assert!(
        view["spec"]["template"]["spec"]["containers"][0]
            .get("env")
            .is_none()
    );
    let mut unrendered_replicas = d.clone();
    unrendered_replicas["spec"]
        .as_object_mut()
        .unwrap()
        .remove("replicas");
    assert_eq!(
        assess_view(&unrendered_replicas, &live)["spec"]["replicas"],
        7
    );
}

#[test]
fn values_the_server_normalises_are_not_drift_once_applied() {
    let rendered = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "n"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "0.1"}}}]}}}});
    let mut live = rendered.clone();
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
        "100m".into();
    live["spec"]["replicas"] = 1.into();
    live["status"] = json!({"replicas": 1});
    assert!(!conforms(&rendered, &live), "as rendered, it looks drifted");
    let expected = project(&rendered, &live);
    assert!(
        conforms(&expected, &live),
        "against what the server made of it, it is not"
    );
    let mut edited = live.clone();
    edited["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
        "2".into();
    assert!(!conforms(&expected, &edited), "a real edit still is");
}

proptest! {
    /// A merge patch applied twice is the same as once (patches are
    /// re-applied on every reconcile and must not accumulate).
    #[test]
    fn patches_are_idempotent(replicas in 0i64..10, memory in "[0-9]{1,3}Mi", strategic: bool) {
        let type_ = if strategic { PatchType::Strategic } else { PatchType::Merge };
        let p = patch("Deployment", "coredns", type_, json!({"spec": {"replicas": replicas,
            "template": {"spec": {"containers": [{"name": "coredns", "resources": {"limits": {"memory": memory}}}]}}}}));
        let mut once = objects(vec![deployment()]);
        apply_patches(&mut once, std::slice::from_ref(&p), &any_patch(), false).unwrap();
        let mut twice = once.clone();
        apply_patches(&mut twice, &[p], &any_patch(), false).unwrap();
        prop_assert_eq!(&once, &twice);
        // And what was applied conforms to itself after any server additions.
        let mut live = once[0].value.clone();
        live["status"] = json!({"observedGeneration": 1});
        prop_assert!(conforms(&once[0].value, &live));
    }
}

#[test]
fn grants_of_rights_handing_kinds_and_adoptions_must_name_objects() {
    let mut grants = capstan_api::PluginGrants {
        objects: vec!["rbac.authorization.k8s.io/ClusterRoleBinding".into()],
        ..Default::default()
    };
    let e = AddonGrants::from_spec(&grants).unwrap_err();
    assert!(e.starts_with("spec.grants.objects[0]: `rbac.authorization.k8s.io/ClusterRoleBinding` grants every ClusterRoleBinding"), "{e}");
    grants.objects = vec!["rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns".into()];
    grants.adopt = vec!["Namespace".into()];
    let e = AddonGrants::from_spec(&grants).unwrap_err();
    assert!(e.starts_with("spec.grants.adopt[0]"), "{e}");
    grants.adopt = vec!["Namespace/monitoring".into()];
    grants.patches = vec![capstan_api::PatchGrant {
        objects: "apps/Deployment@kube-system".into(),
        paths: vec!["/spec/replicas".into()],
        tenants: false,
    }];
    let parsed = AddonGrants::from_spec(&grants).unwrap();
    assert_eq!(parsed.pod_security, PodSecurityLevel::Baseline);
    assert_eq!(parsed.patch_rules(false).len(), 1);
    assert!(
        parsed.patch_rules(true).is_empty(),
        "tenants get no admin-only rule"
    );
}

#[test]
fn broad_patch_grants_are_refused_and_named_fields_pass() {
    let grant = |path: &str| capstan_api::PluginGrants {
        patches: vec![capstan_api::PatchGrant {
            objects: "apps/Deployment@kube-system".into(),
            paths: vec![path.into()],
            tenants: false,
        }],
        ..Default::default()
    };
    for broad in [
        "/",
        "/*",
        "/metadata",
        "/metadata/ownerReferences",
        "/metadata/*",
        "/kind",
    ] {
        let e = AddonGrants::from_spec(&grant(broad)).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "spec.grants.patches[0].paths: {broad:?} would let a patch rewrite"
            )),
            "{e}"
        );
    }
    let e = AddonGrants::from_spec(&grant("")).unwrap_err();
    assert!(e.contains("is not a JSON pointer"), "{e}");
    for named in [
        "/spec/replicas",
        "/metadata/labels",
        "/metadata/annotations/x",
        "/data",
    ] {
        assert!(AddonGrants::from_spec(&grant(named)).is_ok(), "{named}");
    }
}

#[test]
fn what_grants_lend_is_parsed_and_mistakes_name_the_field() {
    let grants = capstan_api::PluginGrants {
        service_accounts: vec!["coredns".into(), "monitoring/prometheus".into()],
        rbac: Some(capstan_api::RbacGrant {
            role_refs: vec!["ClusterRole/view".into(), "Role/kube-system/reader".into()],
            subjects: vec![
                "Group/oidc:ops".into(),
                "ServiceAccount/monitoring/prometheus".into(),
            ],
            powers: vec!["nodes/proxy".into()],
            aggregate_to: vec![capstan_api::AggregationGrant {
                cluster_role: "view".into(),
                powers: vec!["exec".into(), "workloads".into()],
            }],
        }),
        tenant_objects: vec!["rbac.authorization.k8s.io/ClusterRole/system:coredns".into()],
        pod_spec_paths: vec!["example.com/Agent=/spec/template/spec".into()],
        ..Default::default()
    };
    let parsed = AddonGrants::from_spec(&grants).unwrap();
    assert_eq!(
        parsed.service_accounts,
        vec![
            (None, "coredns".to_string()),
            (Some("monitoring".to_string()), "prometheus".to_string())
        ]
    );
    assert_eq!(
        parsed.rbac.role_refs[1].namespace.as_deref(),
        Some("kube-system")
    );
    assert_eq!(parsed.rbac.subjects[0].name, "oidc:ops");
    assert_eq!(parsed.rbac.powers, vec![crate::RbacPower::NodesProxy]);
    assert!(
        parsed
            .rbac
            .lends_through("view", crate::RbacPower::Workloads)
    );
    assert!(
        !parsed
            .rbac
            .lends_through("edit", crate::RbacPower::Workloads)
    );
    assert_eq!(parsed.pod_spec_paths[0].kind, "Agent");

    let wrong = |edit: &dyn Fn(&mut capstan_api::PluginGrants)| {
        let mut g = grants.clone();
        edit(&mut g);
        AddonGrants::from_spec(&g).unwrap_err()
    };
    let e =
        wrong(&|g| g.rbac.as_mut().unwrap().role_refs = vec!["ClusterRole/cluster-admin".into()]);
    assert!(
        e.contains("roleRefs[0]: ClusterRole/cluster-admin is never granted"),
        "{e}"
    );
    let e = wrong(&|g| g.rbac.as_mut().unwrap().role_refs = vec!["Role/reader".into()]);
    assert!(e.contains("write Role/NAMESPACE/NAME"), "{e}");
    let e = wrong(&|g| g.rbac.as_mut().unwrap().subjects = vec!["Group/system:masters".into()]);
    assert!(
        e.contains("subjects[0]: Group/system:masters is never granted"),
        "{e}"
    );
    let e = wrong(&|g| g.rbac.as_mut().unwrap().subjects = vec!["Robot/r2".into()]);
    assert!(
        e.contains("write one of ServiceAccount, User, Group"),
        "{e}"
    );
    let e = wrong(&|g| g.rbac.as_mut().unwrap().powers = vec!["root".into()]);
    assert!(
        e.contains("powers[0]: \"root\" is not an escalation route; known: secrets, workloads"),
        "{e}"
    );
    let e = wrong(&|g| g.rbac.as_mut().unwrap().aggregate_to[0].powers = vec!["all".into()]);
    assert!(
        e.contains("spec.grants.rbac.aggregateTo[0].powers[0]: \"all\" is not an escalation route"),
        "{e}"
    );
    let e = wrong(&|g| g.rbac.as_mut().unwrap().aggregate_to[0].powers = vec![]);
    assert!(e.contains("aggregateTo[0].powers: name the routes"), "{e}");
    let e =
        wrong(&|g| g.rbac.as_mut().unwrap().aggregate_to[0].cluster_role = "cluster-admin".into());
    assert!(
        e.contains("aggregateTo[0].clusterRole: nothing is aggregated into cluster-admin"),
        "{e}"
    );
    let e = wrong(&|g| g.service_accounts = vec!["a/b/c".into()]);
    assert!(e.starts_with("spec.grants.serviceAccounts[0]"), "{e}");
    let e = wrong(&|g| g.pod_spec_paths = vec!["Agent=spec".into()]);
    assert!(e.starts_with("spec.grants.podSpecPaths[0]"), "{e}");
}

#[test]
fn fields_someone_scaled_are_yielded_unless_owned() {
    let mut o = objects(vec![json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system"},
        "spec": {"replicas": 1, "strategy": {"type": "RollingUpdate"}}})]);
    note_replicas(&mut o);
    let rendered = o[0].value.clone();
    assert_eq!(
        rendered["metadata"]["annotations"][ANNOTATION_RENDERED_REPLICAS],
        "1"
    );
    let mine = "capstan-addon/kube-system/dns";
    let live = |replicas: i64, noted: &str, managed: Value| {
        json!({"metadata": {"name": "coredns", "managedFields": managed,
                            "annotations": {ANNOTATION_RENDERED_REPLICAS: noted}},
               "spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate"}}})
    };
    // Applied with 1, scaled to 2 (1.20 records no manager for it).
    let scaled = live(2, "1", json!([]));
    assert_eq!(taken_over(&rendered, &scaled, mine), vec!["/spec/replicas"]);
    let calm = without(&rendered, &["/spec/replicas".to_string()]);
    assert!(calm["spec"].get("replicas").is_none());
    assert_eq!(calm["spec"]["strategy"]["type"], "RollingUpdate");
    // The render now asks for another count: applied.
    assert!(taken_over(&rendered, &live(2, "3", json!([])), mine).is_empty());
    // Not scaled: nothing to yield.
    assert!(taken_over(&rendered, &live(1, "1", json!([])), mine).is_empty());
    // Owned outright (a plugin's annotation, or a break-glass patch).
    let mut owning = rendered.clone();
    owning["metadata"]["annotations"][ANNOTATION_OWNED_FIELDS] = json!("/spec/replicas");
    assert!(taken_over(&owning, &scaled, mine).is_empty());
    // From 1.22 a scale writer is named: any field it holds is its own.
    let by_scale = live(
        1,
        "1",
        json!([
            {"manager": mine, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "scale",
             "fieldsV1": {"f:spec": {"f:strategy": {"f:type": {}}}}}
        ]),
    );
    assert_eq!(
        taken_over(&rendered, &by_scale, mine),
        vec!["/spec/strategy/type"]
    );
    // A hand edit of the resource itself is drift, not a take-over.
    let edited = live(
        1,
        "1",
        json!([
            {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {"f:spec": {"f:strategy": {"f:type": {}}}}}
        ]),
    );
    assert!(taken_over(&rendered, &edited, mine).is_empty());
}
