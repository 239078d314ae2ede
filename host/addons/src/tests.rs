use super::*;
use capstan_api::PatchTarget;
use proptest::prelude::*;
use serde_json::json;

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
        &[patch(
            "Deployment",
            "coredns",
            PatchType::Strategic,
            json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "coredns", "resources": {"limits": {"memory": "170Mi"}}},
                {"name": "sidecar", "image": "x"}]}}}}),
        )],
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
        &[patch(
            "Deployment",
            "coredns",
            PatchType::Merge,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "only"}], "initContainers": null}}}}),
        )],
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
    let e = check_grants(&o, &declared, &granted).unwrap_err();
    assert_eq!(
        e.to_string(),
        "refused the whole render, nothing was applied: \
         Deployment kube-system/coredns is outside spec.grants.objects (it needs a grant covering apps/Deployment@kube-system); \
         ClusterRoleBinding greedy is outside what the plugin declares (capabilities.objects has no rbac.authorization.k8s.io/ClusterRoleBinding), so it cannot be granted"
    );
    assert!(check_grants(&o[..1], &declared, &granted).is_ok());
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

proptest! {
    /// A merge patch applied twice is the same as once (patches are
    /// re-applied on every reconcile and must not accumulate).
    #[test]
    fn patches_are_idempotent(replicas in 0i64..10, memory in "[0-9]{1,3}Mi", strategic: bool) {
        let type_ = if strategic { PatchType::Strategic } else { PatchType::Merge };
        let p = patch("Deployment", "coredns", type_, json!({"spec": {"replicas": replicas,
            "template": {"spec": {"containers": [{"name": "coredns", "resources": {"limits": {"memory": memory}}}]}}}}));
        let mut once = objects(vec![deployment()]);
        apply_patches(&mut once, std::slice::from_ref(&p)).unwrap();
        let mut twice = once.clone();
        apply_patches(&mut twice, &[p]).unwrap();
        prop_assert_eq!(&once, &twice);
        // And what was applied conforms to itself after any server additions.
        let mut live = once[0].value.clone();
        live["status"] = json!({"observedGeneration": 1});
        prop_assert!(conforms(&once[0].value, &live));
    }
}
