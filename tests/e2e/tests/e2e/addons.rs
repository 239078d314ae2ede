//! The addon lifecycle on a real control plane whose Nodes run pods (the
//! simulated kubelet): CoreDNS installed from its channel, upgraded with
//! pruning, kept in shape against hand edits, patched, removed; a greedy
//! plugin's render refused whole; a workload cluster (a second API server)
//! as the target; and the air gap: the addon plugin from a signed bundle on
//! a mirror registry, its images rewritten to a mirror.

use capstan_addons::engine::{APPLIED, HEALTHY};
use capstan_api::{Addon, AddonSpec, AddonStatus, Plugin, PluginGrants, PluginSpec, condition};
use capstan_controllers::{Options, Providers};
use capstan_e2e::control_plane::{ControlPlane, ControlPlaneOptions};
use capstan_e2e::env::{Env, eventually};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;

pub(crate) const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

/// What the CoreDNS plugin needs; `without` leaves one grant out.
fn coredns_grants(without: Option<&str>) -> Vec<String> {
    [
        "ServiceAccount@kube-system",
        "ConfigMap@kube-system",
        "Service@kube-system",
        "apps/Deployment@kube-system",
        "rbac.authorization.k8s.io/ClusterRole/system:coredns",
        "rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns",
    ]
    .into_iter()
    .filter(|g| Some(*g) != without)
    .map(String::from)
    .collect()
}

fn addon_plugin(source: &str, objects: Vec<String>) -> PluginSpec {
    PluginSpec {
        source: source.into(),
        grants: PluginGrants {
            objects,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub(crate) fn options() -> Options {
    crate::logs();
    Options {
        poll: Duration::from_millis(250),
        ..Options::default()
    }
}

/// Control plane, two Nodes that run pods, these addon Plugins (name,
/// component stem, object grants), controllers running.
pub(crate) async fn env_with(plugins: Vec<(&str, &str, Vec<String>)>, options: Options) -> Env {
    let mut env = Env::start(Faults::default())
        .await
        .expect("environment starts");
    env.add_nodes(2).await.expect("two Nodes");
    for (name, stem, grants) in plugins {
        let source = format!("file://{}", capstan_e2e::plugin(stem).display());
        Api::<Plugin>::all(env.client.clone())
            .create(
                &PostParams::default(),
                &Plugin::new(name, addon_plugin(&source, grants)),
            )
            .await
            .expect("create the addon Plugin");
    }
    env.start_controllers(Providers::default(), options).await;
    env
}

pub(crate) fn addon(name: &str, spec: serde_json::Value) -> Addon {
    let mut a = Addon::new(
        name,
        serde_json::from_value::<AddonSpec>(spec).expect("an AddonSpec"),
    );
    a.metadata.namespace = Some(NS.into());
    a
}

pub(crate) async fn create(env: &Env, a: &Addon) {
    Api::<Addon>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), a)
        .await
        .expect("create the Addon");
}

pub(crate) async fn patch_spec(env: &Env, name: &str, spec: serde_json::Value) {
    Api::<Addon>::namespaced(env.client.clone(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch the Addon");
}

pub(crate) async fn status(env: &Env, name: &str) -> AddonStatus {
    Api::<Addon>::namespaced(env.client.clone(), NS)
        .get(name)
        .await
        .expect("the Addon")
        .status
        .unwrap_or_default()
}

/// Wait until the Addon's status for its current generation satisfies `check`.
pub(crate) async fn wait_status(
    env: &Env,
    name: &str,
    what: &str,
    check: impl Fn(&AddonStatus) -> bool,
) -> AddonStatus {
    let api: Api<Addon> = Api::namespaced(env.client.clone(), NS);
    let found = capstan_e2e::env::poll_until(LONG, async || {
        let a = api.get(name).await.ok()?;
        let s = a.status.clone()?;
        (s.observed_generation == a.metadata.generation && check(&s)).then_some(s)
    })
    .await;
    match found {
        Some(s) => s,
        None => {
            let plugins = Api::<Plugin>::all(env.client.clone())
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .map(|p| format!("{}: {:?}", p.name_any(), p.status.map(|s| s.conditions)))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            panic!(
                "Addon {name}: {what} not reached in {LONG:?}; last status: {:#?}\nplugins: {plugins:#?}",
                status(env, name).await
            )
        }
    }
}

pub(crate) fn condition_of(s: &AddonStatus, type_: &str) -> (String, String, String) {
    condition(&s.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

pub(crate) fn healthy_at(version: &'static str) -> impl Fn(&AddonStatus) -> bool {
    move |s| s.healthy == Some(true) && s.version.as_deref() == Some(version)
}

async fn running_pods(client: &Client, namespace: &str, app_label: &str) -> usize {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&kube::api::ListParams::default().labels(app_label))
        .await
        .expect("list pods");
    list.items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .count()
}

pub(crate) async fn exists<K>(client: &Client, namespace: Option<&str>, name: &str) -> bool
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::Scope: capstan_controllers::ScopeApi,
{
    use capstan_controllers::ScopeApi;
    let api: Api<K> = K::Scope::api(client.clone(), namespace);
    api.get_opt(name).await.expect("read").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coredns_installs_from_its_channel_upgrades_with_pruning_and_is_removed() {
    let env = env_with(
        vec![("coredns", "coredns_addon", coredns_grants(None))],
        options(),
    )
    .await;
    create(
        &env,
        &addon(
            "dns",
            json!({"plugin": "coredns", "channel": "stable", "config": {"replicas": 2}}),
        ),
    )
    .await;

    let s = wait_status(&env, "dns", "healthy at 1.10.1", healthy_at("1.10.1")).await;
    assert_eq!(s.phase.as_deref(), Some("Ready"));
    assert_eq!(s.inventory.len(), 7, "{:?}", s.inventory);
    assert_eq!(s.inventory[0].kind, "ServiceAccount");
    assert!(s.plugin_digest.as_deref().unwrap().starts_with("sha256:"));
    assert_eq!(condition_of(&s, APPLIED).0, "True");
    assert_eq!(
        condition_of(&s, "UpToDate").2,
        "version 1.10.1 (channel stable) is applied"
    );
    assert!(
        s.health_details
            .contains(&"availableReplicas=2/2".to_string()),
        "{:?}",
        s.health_details
    );
    assert_eq!(
        running_pods(&env.client, "kube-system", "k8s-app=kube-dns").await,
        2
    );
    let table = env
        .control_plane
        .kubectl(&["get", "addons", "-n", NS], None)
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PLUGIN",
            "VERSION",
            "AVAILABLE",
            "CHANNEL",
            "HEALTHY",
            "PHASE",
            "DEPS",
            "AGE"
        ],
        "{table}"
    );
    // No dependencies: DEPS is empty.
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..7],
        [
            "dns", "coredns", "1.10.1", "1.10.1", "stable", "true", "Ready"
        ],
        "{table}"
    );

    // An idle addon costs no writes: three reconciles triggered by hand
    // (annotating the Addon) leave every object and the status alone.
    let before = env.metrics.writes();
    for i in 0..3 {
        Api::<Addon>::namespaced(env.client.clone(), NS)
            .patch(
                "dns",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"poke": i.to_string()}}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert_eq!(
        env.metrics.writes(),
        before,
        "an idle addon wrote something"
    );

    // Upgrade by pinning a version: health goes false, then true, and the
    // metrics Service of 1.10 is pruned.
    let api: Api<Addon> = Api::namespaced(env.client.clone(), NS);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(
        Vec::<(Option<String>, Option<bool>)>::new(),
    ));
    let watcher = {
        let (api, seen) = (api.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(a) = api.get("dns").await {
                    let s = a.status.unwrap_or_default();
                    let state = (s.version, s.healthy);
                    let mut seen = seen.lock().unwrap();
                    if seen.last() != Some(&state) {
                        seen.push(state);
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    patch_spec(&env, "dns", json!({"version": "1.11.3"})).await;
    let s = wait_status(&env, "dns", "healthy at 1.11.3", healthy_at("1.11.3")).await;
    watcher.abort();
    // The watcher saw the new version unhealthy while it rolled out; the
    // wait above saw it healthy afterwards.
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&(Some("1.11.3".to_string()), Some(false))),
        "health during the upgrade: {seen:?}"
    );
    assert_eq!(s.inventory.len(), 6);
    assert!(
        !exists::<Service>(&env.client, Some("kube-system"), "coredns-metrics").await,
        "pruned"
    );
    let d: Deployment = Api::namespaced(env.client.clone(), "kube-system")
        .get("coredns")
        .await
        .unwrap();
    let image = d.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert_eq!(image, "registry.k8s.io/coredns/coredns:v1.11.3");
    let svc: Service = Api::namespaced(env.client.clone(), "kube-system")
        .get("kube-dns")
        .await
        .unwrap();
    assert_eq!(
        svc.spec.unwrap().ports.unwrap().len(),
        3,
        "metrics moved onto kube-dns"
    );

    // Deleting the Addon removes everything it applied, then the Addon.
    api.delete("dns", &DeleteParams::default()).await.unwrap();
    eventually("the Addon is gone", LONG, async || {
        api.get_opt("dns").await.ok()?.is_none().then_some(())
    })
    .await;
    for (kind, name) in [
        ("ServiceAccount", "coredns"),
        ("ConfigMap", "coredns"),
        ("Deployment", "coredns"),
        ("Service", "kube-dns"),
    ] {
        let gone = match kind {
            "ServiceAccount" => {
                !exists::<ServiceAccount>(&env.client, Some("kube-system"), name).await
            }
            "ConfigMap" => !exists::<ConfigMap>(&env.client, Some("kube-system"), name).await,
            "Deployment" => !exists::<Deployment>(&env.client, Some("kube-system"), name).await,
            _ => !exists::<Service>(&env.client, Some("kube-system"), name).await,
        };
        assert!(gone, "{kind} {name} left behind");
    }
    assert!(!exists::<ClusterRoleBinding>(&env.client, None, "system:coredns").await);
}

/// Edit the Corefile by hand and wait until drift correction puts the
/// render's back (a pass of the Addon ran after the edit).
async fn edit_corefile_and_see_it_restored(config_maps: &Api<ConfigMap>) {
    config_maps
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"Corefile": ".:53 { whoami }"}})),
        )
        .await
        .unwrap();
    eventually("the Corefile restored", LONG, async || {
        let cm = config_maps.get("coredns").await.ok()?;
        cm.data?
            .get("Corefile")?
            .contains("forward . 10.0.0.10")
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hand_edits_are_undone_and_patches_apply_or_fail_loudly() {
    let env = env_with(
        vec![("coredns", "coredns_addon", coredns_grants(None))],
        options(),
    )
    .await;
    create(&env, &addon("dns", json!({"plugin": "coredns", "version": "1.11.3", "config": {"replicas": 1, "upstreams": ["10.0.0.10"]}}))).await;
    wait_status(&env, "dns", "healthy", healthy_at("1.11.3")).await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "kube-system");
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), "kube-system");

    // Drift: the Deployment deleted, the Corefile edited by hand.
    deployments
        .delete("coredns", &DeleteParams::default())
        .await
        .unwrap();
    edit_corefile_and_see_it_restored(&config_maps).await;
    eventually("the Deployment back", LONG, async || {
        let d = deployments.get("coredns").await.ok()?;
        d.metadata.deletion_timestamp.is_none().then_some(())
    })
    .await;
    wait_status(&env, "dns", "healthy after the drift", healthy_at("1.11.3")).await;

    // A break-glass patch raising replicas is applied (the admin granted
    // patches of replicas); the addon gets healthy with three pods.
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"patches": [
                {"objects": "apps/Deployment@kube-system", "paths": ["/spec/replicas"]}]}}})),
        )
        .await
        .unwrap();
    patch_spec(&env, "dns", json!({"patches": [{"target": {"kind": "Deployment", "name": "coredns"}, "type": "Strategic",
        "patch": {"spec": {"replicas": 3}}}]})).await;
    eventually("3 coredns pods", LONG, async || {
        (running_pods(&env.client, "kube-system", "k8s-app=kube-dns").await == 3).then_some(())
    })
    .await;
    let s = wait_status(&env, "dns", "healthy with 3", |s| {
        s.healthy == Some(true) && s.health_details.contains(&"availableReplicas=3/3".into())
    })
    .await;
    assert_eq!(s.phase.as_deref(), Some("Ready"));

    // A patch whose target is not rendered: an error naming it, and
    // nothing else changes.
    patch_spec(&env, "dns", json!({"patches": [{"target": {"kind": "Deployment", "name": "kube-dns"}, "patch": {"spec": {"replicas": 5}}}]})).await;
    let s = wait_status(&env, "dns", "PatchTargetMissing", |s| {
        condition_of(s, APPLIED).1 == "PatchTargetMissing"
    })
    .await;
    let (status, _, message) = condition_of(&s, APPLIED);
    assert_eq!(status, "False");
    assert!(
        message.starts_with(
            "spec.patches[0]: its target Deployment kube-dns is not among the rendered objects"
        ),
        "{message}"
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert!(env.event_reasons(NS).contains("PatchTargetMissing"));
    let d = deployments.get("coredns").await.unwrap();
    assert_eq!(
        d.spec.unwrap().replicas,
        Some(3),
        "the failed render changed nothing"
    );

    // Without patches the render's replicas (1) apply again; then someone
    // scales by hand (as an HPA would): that field is theirs now, and a
    // drift pass (the Corefile edited again) leaves it alone.
    patch_spec(&env, "dns", json!({"patches": []})).await;
    let replicas = async || deployments.get("coredns").await.ok()?.spec?.replicas;
    eventually("replicas back to the render's", LONG, async || {
        (replicas().await? == 1).then_some(())
    })
    .await;
    env.control_plane
        .kubectl(
            &[
                "scale",
                "-n",
                "kube-system",
                "deployment/coredns",
                "--replicas=2",
            ],
            None,
        )
        .unwrap();
    edit_corefile_and_see_it_restored(&config_maps).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(replicas().await, Some(2), "the hand scale stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_render_with_an_ungranted_object_is_refused_and_nothing_is_applied() {
    let env = env_with(
        vec![
            ("greedy", "greedy_addon", vec!["ConfigMap@*".into()]),
            // Declares ClusterRoleBinding, which is not granted.
            (
                "coredns",
                "coredns_addon",
                coredns_grants(Some(
                    "rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns",
                )),
            ),
        ],
        options(),
    )
    .await;
    create(
        &env,
        &addon("greedy", json!({"plugin": "greedy", "channel": "stable"})),
    )
    .await;
    let s = wait_status(&env, "greedy", "refused", |s| {
        condition_of(s, APPLIED).1 == "ObjectsNotGranted"
    })
    .await;
    let message = condition_of(&s, APPLIED).2;
    assert!(
        message.contains("ClusterRoleBinding greedy-admin is outside what the plugin declares"),
        "{message}"
    );
    assert!(s.inventory.is_empty());
    assert!(
        !exists::<ConfigMap>(&env.client, Some(NS), "greedy").await,
        "nothing at all is applied"
    );
    assert!(!exists::<ClusterRoleBinding>(&env.client, None, "greedy-admin").await);

    // A plugin declaring a kind the admin did not grant is not activated,
    // and an Addon naming it says why it waits.
    let p: Plugin = eventually("coredns refused", LONG, async || {
        let p = Api::<Plugin>::all(env.client.clone())
            .get("coredns")
            .await
            .ok()?;
        let c = condition(&p.status.as_ref()?.conditions, "Ready")?.clone();
        (c.reason == "GrantsMissing").then_some(p)
    })
    .await;
    let ready = condition(&p.status.unwrap().conditions, "Ready")
        .unwrap()
        .message
        .clone();
    assert!(
        ready.contains("objects rbac.authorization.k8s.io/ClusterRoleBinding"),
        "{ready}"
    );
    create(
        &env,
        &addon("dns", json!({"plugin": "coredns", "channel": "stable"})),
    )
    .await;
    let s = wait_status(&env, "dns", "PluginUnavailable", |s| {
        condition_of(s, APPLIED).1 == "PluginUnavailable"
    })
    .await;
    // It names why the Plugin serves nothing.
    assert!(
        condition_of(&s, APPLIED)
            .2
            .starts_with("plugin \"coredns\" is not ready: GrantsMissing:"),
        "{s:?}"
    );
    assert!(!exists::<Deployment>(&env.client, Some("kube-system"), "coredns").await);

    // Unknown channels name the known ones.
    create(
        &env,
        &addon("nochan", json!({"plugin": "greedy", "channel": "beta"})),
    )
    .await;
    let s = wait_status(&env, "nochan", "UnknownChannel", |s| {
        condition_of(s, "UpToDate").1 == "UnknownChannel"
    })
    .await;
    assert!(
        condition_of(&s, "UpToDate")
            .2
            .contains("known channels: rapid, stable"),
        "{s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_cluster_gets_the_addon_and_the_management_cluster_does_not() {
    let env = env_with(
        vec![("coredns", "coredns_addon", coredns_grants(None))],
        options(),
    )
    .await;
    let workload = tokio::task::spawn_blocking(|| {
        ControlPlane::start_with(ControlPlaneOptions {
            api_only: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("a second API server");
    let workload_client = workload.client().await.unwrap();
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("workload-kubeconfig".into()),
                    ..Default::default()
                },
                string_data: Some([("value".to_string(), workload.kubeconfig_inline())].into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    create(
        &env,
        &addon(
            "dns",
            json!({"plugin": "coredns", "version": "1.10.1",
        "target": {"kubeconfigSecretRef": {"name": "workload-kubeconfig"}}}),
        ),
    )
    .await;
    let s = wait_status(&env, "dns", "applied to the workload cluster", |s| {
        condition_of(s, APPLIED).0 == "True"
    })
    .await;
    assert_eq!(
        s.target.as_deref(),
        Some("kubeconfig Secret workload-kubeconfig")
    );
    assert_eq!(s.inventory.len(), 7);
    // The workload cluster runs no controllers: the Deployment never rolls
    // out there, and the plugin says so.
    assert_eq!(s.healthy, Some(false));
    assert!(exists::<Deployment>(&workload_client, Some("kube-system"), "coredns").await);
    assert!(exists::<ClusterRoleBinding>(&workload_client, None, "system:coredns").await);
    assert!(!exists::<Deployment>(&env.client, Some("kube-system"), "coredns").await);
    assert!(!exists::<ClusterRoleBinding>(&env.client, None, "system:coredns").await);

    // Drift in the workload cluster is corrected too.
    Api::<ConfigMap>::namespaced(workload_client.clone(), "kube-system")
        .delete("coredns", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the ConfigMap back in the workload cluster",
        LONG,
        async || {
            exists::<ConfigMap>(&workload_client, Some("kube-system"), "coredns")
                .await
                .then_some(())
        },
    )
    .await;

    let api: Api<Addon> = Api::namespaced(env.client.clone(), NS);
    api.delete("dns", &DeleteParams::default()).await.unwrap();
    eventually("the Addon is gone", LONG, async || {
        api.get_opt("dns").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!exists::<Deployment>(&workload_client, Some("kube-system"), "coredns").await);
    assert!(!exists::<ClusterRoleBinding>(&workload_client, None, "system:coredns").await);

    // The same cluster named by a Cluster object: `target.clusterName`
    // reaches it through the Cluster's kubeconfig Secret.
    let cluster: capstan_api::Cluster = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "wl", "namespace": NS},
        "spec": {"kubeconfigSecretRef": {"name": "workload-kubeconfig"}}}))
    .unwrap();
    Api::<capstan_api::Cluster>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    create(
        &env,
        &addon(
            "dns-by-cluster",
            json!({"plugin": "coredns", "version": "1.10.1", "target": {"clusterName": "wl"}}),
        ),
    )
    .await;
    let s = wait_status(&env, "dns-by-cluster", "applied through the Cluster", |s| {
        condition_of(s, APPLIED).0 == "True"
    })
    .await;
    assert_eq!(
        s.target.as_deref(),
        Some("kubeconfig Secret workload-kubeconfig")
    );
    assert!(exists::<Deployment>(&workload_client, Some("kube-system"), "coredns").await);
    assert!(!exists::<Deployment>(&env.client, Some("kube-system"), "coredns").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn air_gap_an_addon_plugin_from_a_mirrored_bundle_deploys_rewritten_images() {
    use capstan_e2e::cli::{key_pair, ok};
    use capstan_e2e::registry::{Registry, RegistryOptions};
    let mut a = Registry::start(RegistryOptions::default()).expect("registry A");
    let b = Registry::start(RegistryOptions::default()).expect("registry B");
    let dir = a.scratch().to_path_buf();
    let (key, public) = key_pair(&dir, "publisher");
    let published = format!("oci://{}/addons/node-exporter:v1", a.host);
    let wasm = capstan_e2e::plugin("node_exporter_addon");
    let digest = ok(&["plugin", "push", wasm.to_str().unwrap(), &published])
        .trim()
        .to_string();
    ok(&["plugin", "sign", &published, "--key", key.to_str().unwrap()]);
    std::fs::write(
        dir.join("policy.yaml"),
        format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    path: publisher.pub\nsources:\n  - prefix: oci://{}/addons/\n    allOf: [publisher]\n",
            a.host
        ),
    )
    .unwrap();
    let spec = dir.join("bundle.yaml");
    std::fs::write(
        &spec,
        format!("apiVersion: capstan.dev/v1alpha1\nkind: Bundle\nplugins:\n  - {published}\npolicy: policy.yaml\n"),
    )
    .unwrap();
    let archive = dir.join("site.tar");
    ok(&[
        "bundle",
        "create",
        "-f",
        spec.to_str().unwrap(),
        "-o",
        archive.to_str().unwrap(),
    ]);
    a.stop();
    let site_policy = dir.join("policy.yaml");
    ok(&[
        "bundle",
        "push",
        archive.to_str().unwrap(),
        "--policy",
        site_policy.to_str().unwrap(),
        "--to",
        &format!("{}/mirror", b.host),
    ]);

    let mut env = Env::start(Faults::default())
        .await
        .expect("environment starts");
    env.add_nodes(2).await.expect("two Nodes");
    let mut plugin = addon_plugin(
        // The publisher's reference; the host's mirror configuration sends
        // it to B (the signature names the original repository).
        &published,
        vec![
            "Namespace/monitoring".into(),
            "ServiceAccount@monitoring".into(),
            "Service@monitoring".into(),
            "apps/DaemonSet@monitoring".into(),
        ],
    );
    // A node agent: host PID, host network and the host's root mounted.
    plugin.grants.pod_security = Some(capstan_api::PodSecurityLevel::Privileged);
    plugin.verification = Some(capstan_e2e::cli::publisher_verification(&public));
    Api::<Plugin>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Plugin::new("node-exporter", plugin),
        )
        .await
        .unwrap();
    let puller = capstan_registry::verify::Puller {
        client: capstan_registry::Client::new(capstan_registry::ClientOptions::default()).unwrap(),
        cache: Some(capstan_registry::Cache::open(&dir.join("host-cache")).unwrap()),
        mirrors: capstan_registry::Mirrors::parse(
            "mirrors",
            &format!(
                "mirrors:\n  - source: oci://{}/\n    mirror: oci://{}/mirror/\n",
                a.host, b.host
            ),
        )
        .unwrap(),
    };
    env.start_controllers(
        Providers::default(),
        Options {
            supply: Some(std::sync::Arc::new(capstan_controllers::plugin::Supply {
                puller,
                policy: Some(capstan_e2e::cli::publisher_policy(
                    &format!("oci://{}/", a.host),
                    &public,
                )),
            })),
            image_rewrites: vec!["quay.io/=mirror.local/quay/".parse().unwrap()],
            ..options()
        },
    )
    .await;
    create(
        &env,
        &addon(
            "metrics",
            json!({"plugin": "node-exporter", "channel": "rapid"}),
        ),
    )
    .await;
    let s = wait_status(&env, "metrics", "healthy at 1.8.2", healthy_at("1.8.2")).await;
    assert_eq!(
        s.inventory[0].kind, "Namespace",
        "Namespaces first: {:?}",
        s.inventory
    );
    assert_eq!(s.image_rewrites.len(), 1);
    assert_eq!(
        s.image_rewrites[0].from,
        "quay.io/prometheus/node-exporter:v1.8.2"
    );
    assert_eq!(
        s.image_rewrites[0].to,
        "mirror.local/quay/prometheus/node-exporter:v1.8.2"
    );
    assert!(
        s.health_details.contains(&"numberReady=2/2".to_string()),
        "{:?}",
        s.health_details
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client.clone(), "monitoring");
    let list = pods.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 2, "one pod per Node");
    for pod in &list.items {
        let image = pod.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap();
        assert_eq!(
            image,
            "mirror.local/quay/prometheus/node-exporter:v1.8.2",
            "{}",
            pod.name_any()
        );
    }
    let p = Api::<Plugin>::all(env.client.clone())
        .get("node-exporter")
        .await
        .unwrap();
    let ps = p.status.unwrap();
    assert!(ps.resolved_source.unwrap().ends_with(&digest));
    assert!(
        ps.fetched_from
            .unwrap()
            .contains("/mirror/addons/node-exporter@")
    );
    assert_eq!(ps.declared_objects.len(), 4);
    assert_eq!(condition_of(&s, HEALTHY).0, "True");
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_resyncs_write_nothing_and_fields_the_render_leaves_out_are_left_alone() {
    let env = env_with(
        vec![("coredns", "coredns_addon", coredns_grants(None))],
        Options {
            resync: Duration::from_secs(1),
            ..options()
        },
    )
    .await;
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"grants": {"patches": [{"objects": "apps/Deployment@kube-system",
                "paths": ["/spec/replicas", "/spec/template/spec/containers/*/resources"]}]}}}),
            ),
        )
        .await
        .unwrap();
    // The render leaves replicas to whoever scales the Deployment, and
    // asks for a CPU request the server stores as `100m`.
    create(
        &env,
        &addon(
            "dns",
            json!({"plugin": "coredns", "version": "1.11.3", "patches": [{
                "target": {"kind": "Deployment", "name": "coredns"}, "type": "Strategic",
                "patch": {"spec": {"replicas": null, "template": {"spec": {"containers": [
                    {"name": "coredns", "resources": {"requests": {"cpu": "0.1"}}}]}}}}}]}),
        ),
    )
    .await;
    wait_status(&env, "dns", "healthy", healthy_at("1.11.3")).await;
    env.control_plane
        .kubectl(
            &[
                "-n",
                "kube-system",
                "scale",
                "deployment/coredns",
                "--replicas=3",
            ],
            None,
        )
        .expect("kubectl scale");
    wait_status(&env, "dns", "healthy with 3", |s| {
        s.healthy == Some(true) && s.health_details.contains(&"availableReplicas=3/3".into())
    })
    .await;
    // Idle means nothing changes: the Deployment's own status may still
    // settle after the scale (its controller reports in steps), and the
    // Addon rightly reports that. Wait until the Addon's status has stayed
    // put over three resyncs, then count.
    let addons: Api<Addon> = Api::namespaced(env.client.clone(), NS);
    eventually(
        "the Addon's status settled",
        Duration::from_secs(60),
        async || {
            let before = addons.get("dns").await.ok()?.metadata.resource_version;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = addons.get("dns").await.ok()?.metadata.resource_version;
            (before == after).then_some(())
        },
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "kube-system");
    let before = deployments.get("coredns").await.unwrap();
    let writes = env.metrics.writes();
    let counted = || -> Vec<String> {
        env.metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("capstan_api_writes_total{"))
            .map(String::from)
            .collect()
    };
    let counted_before = counted();
    // Thirty resyncs, a second apart.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = deployments.get("coredns").await.unwrap();
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.replicas),
        Some(3),
        "kubectl scale holds"
    );
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the Deployment was not written"
    );
    assert_eq!(
        env.metrics.writes() - writes,
        0,
        "idle resyncs made writes: before {counted_before:#?}, after {:#?}",
        counted()
    );
}
