//! Who may make Capstan act, tried as an attacker would. The controllers
//! run under the ServiceAccount `capstan install` generates (plus a
//! ClusterRole for the kinds the addon Plugins are granted, as docs/addons.md
//! tells an admin to bind); the tenant `alice` has a Role in `team-a` only
//! and acts through impersonation, so only her own RBAC applies. Her
//! Addons are applied as the ServiceAccount `deployer` of `team-a`, which
//! Capstan may impersonate there (`capstan install --tenant-namespace
//! team-a`) and nowhere else. Each
//! refusal is a condition with its reason, and the objects it would have
//! touched keep their resourceVersions; plugin calls are counted.

use crate::logs;
use capstan_addons::engine::APPLIED;
use capstan_api::{Addon, AddonStatus, Machine, Plugin, PluginSpec, condition};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{CAPSTAN_NAMESPACE, Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::install::{
    client_as, controller_config, kubectl_apply, make_tenant, tenant_binding_docs,
};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const TENANT_NS: &str = "team-a";
const TENANT: &str = "alice";
/// The ServiceAccount of `team-a` the tenant's Addons are applied as.
const DEPLOYER: &str = "deployer";
const LONG: Duration = Duration::from_secs(90);

pub(crate) fn options() -> Options {
    Options {
        poll: Duration::from_millis(250),
        secrets_namespace: Some(CAPSTAN_NAMESPACE.into()),
        ..Options::default()
    }
}

pub(crate) fn plugin_spec(value: Value) -> PluginSpec {
    serde_json::from_value(value).expect("a PluginSpec")
}

/// node-exporter: a Namespace of its own, a DaemonSet with host access.
fn exporter(allowed: Option<&[&str]>) -> PluginSpec {
    let mut spec = json!({
        "source": format!("file://{}", capstan_e2e::plugin("node_exporter_addon").display()),
        "grants": {
            "objects": ["Namespace/monitoring", "ServiceAccount@monitoring", "Service@monitoring", "apps/DaemonSet@monitoring"],
            "podSecurity": "Privileged",
            "patches": [{"objects": "apps/DaemonSet@monitoring", "paths": ["/spec/template/spec/containers/*/resources"]}]
        }
    });
    if let Some(names) = allowed {
        spec["allowedNamespaces"] = json!({ "names": names });
    }
    plugin_spec(spec)
}

pub(crate) fn coredns() -> PluginSpec {
    plugin_spec(json!({
        "source": format!("file://{}", capstan_e2e::plugin("coredns_addon").display()),
        "grants": {"objects": [
            "ServiceAccount@kube-system", "ConfigMap@kube-system", "Service@kube-system",
            "apps/Deployment@kube-system",
            "rbac.authorization.k8s.io/ClusterRole/system:coredns",
            "rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns"]}
    }))
}

/// The verbs docs/addons.md names for the addon kinds (never `*`: on
/// ServiceAccounts that includes `impersonate`).
pub(crate) const ADDON_VERBS: [&str; 6] = ["get", "list", "watch", "create", "patch", "delete"];

/// What docs/addons.md asks an admin to bind for the granted addon kinds: a
/// role over `rules`, cluster-wide (`namespace` None) or in one namespace.
pub(crate) fn addon_rbac(namespace: Option<&str>, rules: Value) -> Vec<Value> {
    let (role, binding) = match namespace {
        None => ("ClusterRole", "ClusterRoleBinding"),
        Some(_) => ("Role", "RoleBinding"),
    };
    let mut metadata = json!({"name": "capstan-addon-kinds"});
    if let Some(ns) = namespace {
        metadata["namespace"] = ns.into();
    }
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role,
            "metadata": metadata, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding,
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": "capstan-addon-kinds"},
            "subjects": [{"kind": "ServiceAccount", "name": "capstan-controller", "namespace": CAPSTAN_NAMESPACE}]}),
    ]
}

/// The control plane with the tenant, these Plugins, and the controllers
/// running as the installed ServiceAccount, allowed the addon kinds
/// cluster-wide.
pub(crate) async fn installed(plugins: Vec<(&str, PluginSpec)>) -> Env {
    let cluster_wide = addon_rbac(
        None,
        json!([
            {"apiGroups": [""], "resources": ["namespaces", "serviceaccounts", "services", "configmaps"], "verbs": ADDON_VERBS},
            {"apiGroups": ["apps"], "resources": ["daemonsets", "deployments"], "verbs": ADDON_VERBS}]),
    );
    installed_with(plugins, &cluster_wide, &[]).await
}

/// The same with these RBAC objects for the addon kinds, and `namespaces`
/// created first.
pub(crate) async fn installed_with(
    plugins: Vec<(&str, PluginSpec)>,
    rbac: &[Value],
    namespaces: &[&str],
) -> Env {
    logs();
    let mut env = Env::start(Faults::default())
        .await
        .expect("environment starts");
    let created: Vec<Value> = namespaces
        .iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
        .collect();
    kubectl_apply(&env, &created);
    kubectl_apply(&env, rbac);
    make_tenant(&env, TENANT_NS, TENANT);
    kubectl_apply(&env, &tenant_binding_docs(TENANT_NS));
    kubectl_apply(
        &env,
        &[json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEPLOYER, "namespace": TENANT_NS}})],
    );
    for (name, spec) in plugins {
        Api::<Plugin>::all(env.client.clone())
            .create(&PostParams::default(), &Plugin::new(name, spec))
            .await
            .expect("create a Plugin");
    }
    let config = controller_config(&env).await;
    env.start_controllers_as(config, Providers::default(), options())
        .await;
    env
}

pub(crate) fn addon(namespace: &str, name: &str, spec: Value) -> Addon {
    let mut a = Addon::new(name, serde_json::from_value(spec).expect("an AddonSpec"));
    a.metadata.namespace = Some(namespace.into());
    a
}

pub(crate) async fn create_addon(client: &Client, a: &Addon) {
    Api::<Addon>::namespaced(client.clone(), &a.namespace().unwrap())
        .create(&PostParams::default(), a)
        .await
        .expect("create the Addon");
}

/// Delete an Addon as `client` and wait until it is gone (its finalizer
/// done).
async fn delete_addon(env: &Env, client: &Client, namespace: &str, name: &str) {
    Api::<Addon>::namespaced(client.clone(), namespace)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let api: Api<Addon> = Api::namespaced(env.client.clone(), namespace);
    env.eventually(
        &format!("Addon {namespace}/{name} gone"),
        LONG,
        async || api.get_opt(name).await.ok()?.is_none().then_some(()),
    )
    .await;
}

/// Wait for the Addon's `Applied` condition to have `reason`; its message.
pub(crate) async fn applied_reason(env: &Env, namespace: &str, name: &str, reason: &str) -> String {
    let api: Api<Addon> = Api::namespaced(env.client.clone(), namespace);
    let seen = std::sync::Mutex::new(String::new());
    env.eventually(
        &format!("Addon {namespace}/{name} {reason}"),
        LONG,
        async || {
            let status: AddonStatus = api.get(name).await.ok()?.status?;
            let c = condition(&status.conditions, APPLIED)?;
            // What it shows instead, once per change, for a failure's log.
            let now = format!("{}: {}", c.reason, c.message);
            if *seen.lock().unwrap() != now {
                eprintln!("Addon {namespace}/{name} Applied: {now}");
                *seen.lock().unwrap() = now;
            }
            (c.reason == reason).then(|| c.message.clone())
        },
    )
    .await
}

/// Calls of a plugin, from the controllers' metrics.
fn calls(env: &Env, plugin: &str) -> f64 {
    let needle = format!("plugin=\"{plugin}\"");
    env.metrics
        .encode()
        .lines()
        .filter(|l| {
            l.starts_with("capstan_plugin_call_duration_seconds_count{") && l.contains(&needle)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn resource_version<K>(api: &Api<K>, name: &str) -> String
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get(name)
        .await
        .expect("the object")
        .meta()
        .resource_version
        .clone()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_gets_only_what_its_namespace_is_allowed() {
    let env = installed(vec![
        ("coredns", coredns()),
        ("exporter", exporter(Some(&[TENANT_NS]))),
    ])
    .await;
    let tenant = client_as(&env, TENANT).await;
    // Namespace RBAC only: no Plugin of her own.
    let own_plugin = Api::<Plugin>::all(tenant.clone())
        .create(&PostParams::default(), &Plugin::new("mine", coredns()))
        .await;
    assert!(
        matches!(own_plugin, Err(kube::Error::Api(ref e)) if e.code == 403),
        "{own_plugin:?}"
    );
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "monitoring"}})).unwrap(),
        )
        .await
        .unwrap();
    let monitoring_version = resource_version(&namespaces, "monitoring").await;

    // A Plugin not allowed in team-a: never called.
    create_addon(
        &tenant,
        &addon(
            TENANT_NS,
            "dns",
            json!({"plugin": "coredns", "channel": "stable"}),
        ),
    )
    .await;
    let message = applied_reason(&env, TENANT_NS, "dns", "PluginNotAllowed").await;
    assert!(
        message.starts_with(
            "plugin \"coredns\" is not allowed in namespace \"team-a\": its spec.allowedNamespaces (unset: only Capstan's namespace \"capstan-system\") does not include it"
        ),
        "{message}"
    );

    // Patches: a tenant's Addon may patch nothing the grant keeps for the admin.
    create_addon(
        &tenant,
        &addon(
            TENANT_NS,
            "patched",
            json!({"plugin": "exporter", "channel": "stable", "serviceAccountName": DEPLOYER, "patches": [{
                "target": {"kind": "DaemonSet", "name": "node-exporter"}, "type": "Strategic",
                "patch": {"spec": {"template": {"spec": {"containers": [{"name": "node-exporter", "image": "evil.example/root:1"}]}}}}}]}),
        ),
    )
    .await;
    let message = applied_reason(&env, TENANT_NS, "patched", "PatchNotGranted").await;
    assert!(
        message.contains("/spec/template/spec/containers/0/image")
            && message.contains("for Addons outside Capstan's namespace"),
        "{message}"
    );

    // A tenant's render stays in its namespace: the exporter's objects in
    // `monitoring` are refused although the Plugin's object grants cover
    // them, until the admin marks them for tenants.
    create_addon(
        &tenant,
        &addon(
            TENANT_NS,
            "exporter",
            json!({"plugin": "exporter", "channel": "stable", "serviceAccountName": DEPLOYER}),
        ),
    )
    .await;
    let message = applied_reason(&env, TENANT_NS, "exporter", "ObjectsNotGranted").await;
    assert!(
        message.contains("Namespace monitoring is outside namespace team-a")
            && message.contains("apps/DaemonSet@monitoring"),
        "{message}"
    );
    assert_eq!(
        resource_version(&namespaces, "monitoring").await,
        monitoring_version
    );
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "exporter",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"tenantObjects": [
                "Namespace/monitoring", "ServiceAccount@monitoring", "Service@monitoring",
                "apps/DaemonSet@monitoring"]}}})),
        )
        .await
        .unwrap();

    // Granted by the Plugin, but applied as the tenant's ServiceAccount:
    // the API server refuses what its RBAC does not allow (Capstan's own
    // rights would), and the refusal tells nothing about the Namespace.
    // Deleting the Addon deletes nothing it did not create.
    let message = applied_reason(&env, TENANT_NS, "exporter", "Forbidden").await;
    assert!(
        message.starts_with("ServiceAccount team-a/deployer may not read Namespace monitoring")
            && message.contains("cannot get resource \"namespaces\"")
            && !message.contains("managed by"),
        "{message}"
    );
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), "monitoring");
    assert!(daemonsets.get_opt("node-exporter").await.unwrap().is_none());
    delete_addon(&env, &tenant, TENANT_NS, "exporter").await;
    let ns = namespaces.get("monitoring").await.unwrap();
    assert!(ns.metadata.deletion_timestamp.is_none(), "not Terminating");
    assert_eq!(
        ns.resource_version().unwrap_or_default(),
        monitoring_version,
        "the Namespace was never written"
    );

    // A Machine naming a provider Plugin not allowed in team-a: nothing
    // launched, no finalizer, no plugin call.
    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    let mut machine = Machine::new("intruder", md.spec.template.spec.clone());
    machine.metadata.namespace = Some(TENANT_NS.into());
    Api::<Machine>::namespaced(tenant.clone(), TENANT_NS)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), TENANT_NS);
    let m = env
        .eventually("the Machine refused", LONG, async || {
            let m = machines.get("intruder").await.ok()?;
            let c = condition(&m.status.as_ref()?.conditions, "InstanceProvisioned")?;
            (c.reason == "PluginNotAllowed").then_some(m)
        })
        .await;
    assert!(m.finalizers().is_empty(), "{:?}", m.finalizers());

    // Settle, then count: the refused plugins were never called, nothing
    // launched, nothing in kube-system.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        calls(&env, "exporter") > 0.0,
        "the allowed plugin was called (the count works)"
    );
    assert_eq!(calls(&env, "coredns"), 0.0);
    assert_eq!(calls(&env, SIM_PLUGIN), 0.0);
    assert_eq!(env.cloud.stats().instances_launched, 0);
    let kube_system: Api<Deployment> = Api::namespaced(env.client.clone(), "kube-system");
    assert!(kube_system.get_opt("coredns").await.unwrap().is_none());
    assert_eq!(
        resource_version(&namespaces, "monitoring").await,
        monitoring_version
    );
}

/// node-exporter rendered into the tenant's own namespace (no Namespace of
/// its own), granted there.
fn exporter_in_team_a() -> PluginSpec {
    let mut spec = exporter(Some(&[TENANT_NS, "team-b"]));
    spec.grants.objects.extend(
        ["ServiceAccount", "Service", "apps/DaemonSet"]
            .iter()
            .flat_map(|k| [format!("{k}@{TENANT_NS}"), format!("{k}@team-b")]),
    );
    spec
}

/// The Role the admin gives `deployer` in team-a: `resources` of the core
/// group and `apps`, every verb Capstan uses.
fn deployer_role(resources: &[&str]) -> Vec<Value> {
    let (core, apps): (Vec<&str>, Vec<&str>) = resources.iter().partition(|r| *r != &"daemonsets");
    let verbs = ["get", "list", "watch", "create", "patch", "delete"];
    let mut rules = vec![json!({"apiGroups": [""], "resources": core, "verbs": verbs})];
    if !apps.is_empty() {
        rules.push(json!({"apiGroups": ["apps"], "resources": apps, "verbs": verbs}));
    }
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "deployer", "namespace": TENANT_NS}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "deployer", "namespace": TENANT_NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
            "subjects": [{"kind": "ServiceAccount", "name": DEPLOYER, "namespace": TENANT_NS}]}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_addon_is_applied_with_its_own_service_accounts_rights() {
    // Capstan is bound no rights for addon kinds at all: whatever is read,
    // written, watched or deleted below is the tenant ServiceAccount's doing.
    let env = installed_with(vec![("exporter", exporter_in_team_a())], &[], &[]).await;
    let tenant = client_as(&env, TENANT).await;
    let config = json!({"namespace": TENANT_NS, "createNamespace": false});
    let spec = json!({"plugin": "exporter", "channel": "stable", "config": config});

    // No ServiceAccount named and no default: refused before any plugin call.
    create_addon(&tenant, &addon(TENANT_NS, "own", spec.clone())).await;
    let message = applied_reason(&env, TENANT_NS, "own", "ServiceAccountRequired").await;
    assert!(
        message.starts_with(
            "spec.serviceAccountName is required for an Addon outside Capstan's namespace"
        ),
        "{message}"
    );
    assert_eq!(calls(&env, "exporter"), 0.0);

    // Named, but its Role lacks DaemonSets: the API server says no, shown
    // in the condition, and nothing of the render was written.
    kubectl_apply(&env, &deployer_role(&["serviceaccounts", "services"]));
    let addons: Api<Addon> = Api::namespaced(tenant.clone(), TENANT_NS);
    addons
        .patch(
            "own",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"serviceAccountName": DEPLOYER}})),
        )
        .await
        .unwrap();
    let message = applied_reason(&env, TENANT_NS, "own", "Forbidden").await;
    assert!(
        message.starts_with(
            "ServiceAccount team-a/deployer may not read DaemonSet team-a/node-exporter"
        ) && message.contains("cannot get resource \"daemonsets\""),
        "{message}"
    );
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(env.client.clone(), TENANT_NS);
    assert!(
        accounts.get_opt("node-exporter").await.unwrap().is_none(),
        "nothing applied before every object could be read"
    );

    // Allowed DaemonSets: applied, under the Addon's own field manager.
    kubectl_apply(
        &env,
        &deployer_role(&["serviceaccounts", "services", "daemonsets"]),
    );
    applied_reason(&env, TENANT_NS, "own", "Applied").await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), TENANT_NS);
    let ds = daemonsets.get("node-exporter").await.unwrap();
    assert!(
        ds.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|f| f.manager.as_deref() == Some("capstan-addon/team-a/own")),
        "{:?}",
        ds.metadata.managed_fields
    );

    // Its drift watches run as deployer too: idle, nothing is forbidden.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = env.control_plane.forbidden_requests().unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        env.control_plane.forbidden_requests().unwrap(),
        before,
        "a watch or read needed rights deployer lacks, or Capstan's own"
    );

    // A dependency on an Addon of another namespace, which deployer may not
    // read: refused, naming both, and its readiness is not told.
    let mut peek = spec.clone();
    peek["serviceAccountName"] = DEPLOYER.into();
    peek["dependsOn"] = json!([{"name": "dns", "namespace": "capstan-system"}]);
    create_addon(&tenant, &addon(TENANT_NS, "peeker", peek)).await;
    let refused = env
        .eventually("the dependency refused", LONG, async || {
            let a = addons.get("peeker").await.ok()?;
            let c = condition(
                &a.status?.conditions,
                capstan_addons::engine::DEPENDENCIES_READY,
            )?
            .clone();
            (c.reason == "DependencyNotReadable").then_some(c.message)
        })
        .await;
    assert!(
        refused.starts_with(
            "ServiceAccount team-a/deployer (whose rights apply this Addon) may not read Addon capstan-system/dns: forbidden"
        ),
        "{refused}"
    );
    delete_addon(&env, &tenant, TENANT_NS, "peeker").await;

    // A namespace whose admin never let Capstan act as its ServiceAccounts
    // (no `--tenant-namespace team-b`): refused, saying what to bind.
    make_tenant(&env, "team-b", "bob");
    let bob = client_as(&env, "bob").await;
    let mut in_b = spec.clone();
    in_b["serviceAccountName"] = DEPLOYER.into();
    in_b["config"]["namespace"] = "team-b".into();
    create_addon(&bob, &addon("team-b", "own", in_b)).await;
    let message = applied_reason(&env, "team-b", "own", "ImpersonationForbidden").await;
    assert!(
        message.starts_with("Capstan may not act as ServiceAccount team-b/deployer")
            && message.contains("capstan install --tenant-namespace team-b")
            && message.contains(
                "kubectl -n team-b create rolebinding capstan-controller-tenant --clusterrole=capstan-controller-tenants --serviceaccount=capstan-system:capstan-controller"
            ),
        "{message}"
    );
    let in_b: Api<DaemonSet> = Api::namespaced(env.client.clone(), "team-b");
    assert!(in_b.get_opt("node-exporter").await.unwrap().is_none());

    // Deleting the tenant's Addon deletes what it applied, as deployer.
    delete_addon(&env, &tenant, TENANT_NS, "own").await;
    assert!(daemonsets.get_opt("node-exporter").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_addon_rendering_the_same_object_is_refused_without_a_fight() {
    let env = installed(vec![("exporter", exporter(None))]).await;
    let admin = env.client.clone();
    // Both in one `kubectl apply`: both find the objects missing, and a
    // create request lets only one of them make each.
    let both: Vec<Value> = ["first", "second"]
        .iter()
        .map(|name| {
            serde_json::to_value(addon(
                CAPSTAN_NAMESPACE,
                name,
                json!({"plugin": "exporter", "channel": "stable"}),
            ))
            .unwrap()
        })
        .collect();
    kubectl_apply(&env, &both);
    let addons: Api<Addon> = Api::namespaced(admin.clone(), CAPSTAN_NAMESPACE);
    let (winner, loser) = env
        .eventually("one Addon applied, the other refused", LONG, async || {
            let reason = async |name: &str| {
                let status = addons.get(name).await.ok()?.status?;
                Some(condition(&status.conditions, APPLIED)?.reason.clone())
            };
            match (
                reason("first").await?.as_str(),
                reason("second").await?.as_str(),
            ) {
                ("Applied", "ObjectExists") => Some(("first", "second")),
                ("ObjectExists", "Applied") => Some(("second", "first")),
                _ => None,
            }
        })
        .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), "monitoring");
    let before = daemonsets.get("node-exporter").await.unwrap();
    let recorded = |status: Option<AddonStatus>| {
        status
            .map(|s| {
                s.inventory
                    .iter()
                    .filter_map(|e| e.uid.clone())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    assert!(
        recorded(addons.get(winner).await.unwrap().status)
            .contains(before.metadata.uid.as_ref().unwrap())
    );
    assert!(
        recorded(addons.get(loser).await.unwrap().status).is_empty(),
        "exactly one Addon recorded the objects"
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = daemonsets.get("node-exporter").await.unwrap();
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "no fight"
    );
    // Whoever may write addons/status forges the loser's inventory with the
    // winner's DaemonSet; deleting the loser still deletes nothing of it.
    let forged = json!({"status": {"inventory": [{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "namespace": "monitoring",
        "name": "node-exporter", "uid": before.metadata.uid}]}});
    addons
        .patch_status(loser, &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap();
    delete_addon(&env, &admin, CAPSTAN_NAMESPACE, loser).await;
    let still = daemonsets.get("node-exporter").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_none());
    assert_eq!(still.metadata.uid, before.metadata.uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_a_grant_or_a_credential_takes_effect_at_once() {
    let env = installed(vec![("exporter", exporter(None))]).await;
    // The sim Plugin Env created serves `default`; scope it to Capstan's namespace for this test.
    Api::<Plugin>::all(env.client.clone())
        .patch(
            SIM_PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedNamespaces": {"names": [CAPSTAN_NAMESPACE]}}})),
        )
        .await
        .unwrap();
    let admin = env.client.clone();
    create_addon(
        &admin,
        &addon(
            CAPSTAN_NAMESPACE,
            "exporter",
            json!({"plugin": "exporter", "channel": "stable"}),
        ),
    )
    .await;
    applied_reason(&env, CAPSTAN_NAMESPACE, "exporter", "Applied").await;

    // The DaemonSet grant removed: within 5 s the Addon's render is refused.
    Api::<Plugin>::all(admin.clone())
        .patch(
            "exporter",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"objects": [
                "Namespace/monitoring", "ServiceAccount@monitoring", "Service@monitoring"]}}})),
        )
        .await
        .unwrap();
    let revoked = Instant::now();
    let message = applied_reason(&env, CAPSTAN_NAMESPACE, "exporter", "PluginUnavailable").await;
    let took = revoked.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}: {message}");
    let plugin = Api::<Plugin>::all(admin.clone())
        .get("exporter")
        .await
        .unwrap();
    let ready = condition(&plugin.status.unwrap().conditions, "Ready")
        .cloned()
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "GrantsMissing")
    );
    eprintln!("grant revoked: the Addon refused after {took:?}");
    // Its condition names the revocation, not a plugin still loading.
    let addons: Api<Addon> = Api::namespaced(admin.clone(), CAPSTAN_NAMESPACE);
    env.eventually("the Addon names the revocation", LONG, async || {
        let status = addons.get("exporter").await.ok()?.status?;
        let c = condition(&status.conditions, APPLIED)?;
        c.message
            .starts_with("plugin \"exporter\" is not ready: GrantsMissing:")
            .then_some(())
    })
    .await;

    // The credential Secret deleted: within 5 s the provider stops, and a
    // new Machine makes no request with the old token.
    let mut md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    md.metadata.namespace = Some(CAPSTAN_NAMESPACE.into());
    let deployments: Api<capstan_api::MachineDeployment> =
        Api::namespaced(admin.clone(), CAPSTAN_NAMESPACE);
    deployments
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(CAPSTAN_NAMESPACE, "pool", LONG).await;
    Api::<Secret>::namespaced(admin.clone(), CAPSTAN_NAMESPACE)
        .delete("sim-cloud", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    let plugins: Api<Plugin> = Api::all(admin.clone());
    env.eventually("the sim Plugin stopped", LONG, async || {
        let p = plugins.get(SIM_PLUGIN).await.ok()?;
        let c = condition(&p.status?.conditions, "Ready")?.clone();
        (c.status == "False" && c.reason == "CredentialMissing").then_some(())
    })
    .await;
    let took = deleted.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    eprintln!("credential Secret deleted: the plugin stopped after {took:?}");
    let requests = env.cloud.stats().requests;
    deployments
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let machines: Api<Machine> = Api::namespaced(admin.clone(), CAPSTAN_NAMESPACE);
    env.eventually("the new Machine waits for its plugin", LONG, async || {
        let list = machines.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|m| {
                m.status.as_ref().is_some_and(|s| {
                    condition(&s.conditions, "InstanceProvisioned").is_some_and(|c| {
                        c.reason == "PluginNotReady" && c.message.contains("CredentialMissing")
                    })
                })
            })
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.cloud.stats().requests,
        requests,
        "no request reached the cloud with the revoked token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeconfig_that_runs_a_command_or_reads_a_file_is_refused() {
    let env = installed(vec![("exporter", exporter(None))]).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    // A FIFO: whoever opens it to read would let a writer's open succeed.
    let fifo = dir.path().join("token");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let server = env.control_plane.kubeconfig_inline();
    let with_exec = server.replace(
        &format!("    token: {}\n", env.control_plane.token),
        &format!(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: /bin/sh\n      args: [-c, 'touch {}']\n",
            marker.display()
        ),
    );
    let with_file = server.replace(
        &format!("    token: {}\n", env.control_plane.token),
        &format!("    tokenFile: {}\n", fifo.display()),
    );
    assert_ne!(with_exec, server);
    assert_ne!(with_file, server);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    for (name, text) in [("exec", &with_exec), ("file", &with_file)] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-kubeconfig")},
            "stringData": {"value": text}
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        create_addon(
            &env.client,
            &addon(
                CAPSTAN_NAMESPACE,
                name,
                json!({"plugin": "exporter", "channel": "stable",
                       "target": {"kubeconfigSecretRef": {"name": format!("{name}-kubeconfig")}}}),
            ),
        )
        .await;
    }
    let message = applied_reason(&env, CAPSTAN_NAMESPACE, "exec", "TargetUnavailable").await;
    assert!(
        message.contains("users[0].user.exec is not allowed"),
        "{message}"
    );
    let message = applied_reason(&env, CAPSTAN_NAMESPACE, "file", "TargetUnavailable").await;
    assert!(
        message.contains("users[0].user.tokenFile is not allowed"),
        "{message}"
    );
    // Over a few seconds of retries: no command ran, nobody opened the file.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        use std::os::unix::fs::OpenOptionsExt;
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(0o4000) // O_NONBLOCK: fails with ENXIO while no reader has it open
            .open(&fifo);
        assert!(opened.is_err(), "the controller opened the tokenFile");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!marker.exists(), "the exec command ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renders_below_the_floor_are_refused_naming_the_rule() {
    let mut baseline = exporter(None);
    baseline.grants.pod_security = None;
    let env = installed(vec![("exporter", baseline), ("coredns", coredns())]).await;
    create_addon(
        &env.client,
        &addon(
            CAPSTAN_NAMESPACE,
            "exporter",
            json!({"plugin": "exporter", "channel": "stable"}),
        ),
    )
    .await;
    let message = applied_reason(&env, CAPSTAN_NAMESPACE, "exporter", "BelowHostFloor").await;
    for rule in [
        "DaemonSet monitoring/node-exporter: sets hostPID: true, above Pod Security level Baseline",
        "mounts hostPath volume root",
    ] {
        assert!(message.contains(rule), "{rule} in {message}");
    }
    // An admin's patch (all paths granted) binding cluster-admin: still refused.
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"patches": [
                {"objects": "rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns", "paths": ["/roleRef"]}]}}})),
        )
        .await
        .unwrap();
    create_addon(
        &env.client,
        &addon(
            CAPSTAN_NAMESPACE,
            "dns",
            json!({"plugin": "coredns", "channel": "stable", "patches": [{
                "target": {"kind": "ClusterRoleBinding", "name": "system:coredns"},
                "patch": {"roleRef": {"name": "cluster-admin"}}}]}),
        ),
    )
    .await;
    let message = applied_reason(&env, CAPSTAN_NAMESPACE, "dns", "BelowHostFloor").await;
    assert!(
        message.contains("ClusterRoleBinding system:coredns: binds ClusterRole cluster-admin"),
        "{message}"
    );
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> =
        Api::all(env.client.clone());
    assert!(bindings.get_opt("system:coredns").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drift_watches_under_a_namespaced_role_make_no_forbidden_requests() {
    // The admin made `monitoring` and lets Capstan manage the addon's kinds
    // there only, plus that one Namespace; the Plugin may adopt it.
    let mut rbac = addon_rbac(
        Some("monitoring"),
        json!([
            {"apiGroups": [""], "resources": ["serviceaccounts", "services"], "verbs": ADDON_VERBS},
            {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ADDON_VERBS}]),
    );
    rbac.extend(addon_rbac(
        None,
        json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["monitoring"],
                "verbs": ["get", "patch", "update"]}]),
    ));
    let mut plugin = exporter(None);
    plugin.grants.adopt = vec!["Namespace/monitoring".into()];
    let env = installed_with(vec![("exporter", plugin)], &rbac, &["monitoring"]).await;
    create_addon(
        &env.client,
        &addon(
            CAPSTAN_NAMESPACE,
            "exporter",
            json!({"plugin": "exporter", "channel": "stable"}),
        ),
    )
    .await;
    applied_reason(&env, CAPSTAN_NAMESPACE, "exporter", "Applied").await;
    let status = Api::<Addon>::namespaced(env.client.clone(), CAPSTAN_NAMESPACE)
        .get("exporter")
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(
        status
            .inventory
            .iter()
            .any(|e| e.kind == "Namespace" && e.adopted && e.uid.is_some()),
        "{:?}",
        status.inventory
    );
    // Let the watches start, then count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = env.control_plane.forbidden_requests().unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = env.control_plane.forbidden_requests().unwrap();
    eprintln!("forbidden requests over 30 s: {}", after - before);
    assert_eq!(
        after, before,
        "the drift watches asked for more than the Role allows"
    );

    // Deleting the Addon deletes what it created, never the adopted Namespace.
    delete_addon(&env, &env.client, CAPSTAN_NAMESPACE, "exporter").await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), "monitoring");
    env.eventually("the DaemonSet deleted", LONG, async || {
        daemonsets
            .get_opt("node-exporter")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let ns = Api::<Namespace>::all(env.client.clone())
        .get("monitoring")
        .await
        .unwrap();
    assert!(
        ns.metadata.deletion_timestamp.is_none(),
        "the adopted Namespace stays"
    );
}
