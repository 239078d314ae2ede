//! The RBAC floor on a real control plane whose kube-controller-manager
//! runs the clusterrole-aggregation controller, so aggregation really
//! happens. The admin grants the coredns addon Plugin its ClusterRole by
//! name and lets Addons patch that role's labels and rules (a break-glass
//! grant an attacker writing the Addon then uses); the controllers run as
//! the ServiceAccount `capstan install` generates. Every escalation route
//! of the Kubernetes documentation's list is refused naming the route,
//! whether the role is plain or aggregated into `view`, `edit` or an
//! aggregating role of the cluster's own; `view` and `edit` never gain a
//! route; and the same render with a grant naming the role and the routes
//! is applied, and `view` then gains them (the control that shows the test
//! can pass).

use crate::tenancy::{
    ADDON_VERBS, addon, addon_rbac, applied_reason, create_addon, installed_with, plugin_spec,
};
use capstan_addons::engine::APPLIED;
use capstan_api::{Addon, Plugin, condition};
use capstan_e2e::env::{CAPSTAN_NAMESPACE, Env};
use capstan_e2e::install::kubectl_apply;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::time::Duration;

const ROLE: &str = "system:coredns";
const LONG: Duration = Duration::from_secs(90);

/// One rule per route of the documentation's list, named as
/// `spec.grants.rbac.powers` names it.
fn routes() -> Vec<(&'static str, Value)> {
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| json!({"apiGroups": groups, "resources": resources, "verbs": verbs});
    vec![
        ("secrets", rule(&[""], &["secrets"], &["list"])),
        (
            "workloads",
            rule(&["apps"], &["deployments", "daemonsets"], &["create"]),
        ),
        (
            "persistentvolumes",
            rule(&[""], &["persistentvolumes"], &["create"]),
        ),
        ("nodes/proxy", rule(&[""], &["nodes/proxy"], &["get"])),
        (
            "escalate",
            rule(
                &["rbac.authorization.k8s.io"],
                &["clusterroles"],
                &["escalate"],
            ),
        ),
        (
            "bind",
            rule(&["rbac.authorization.k8s.io"], &["clusterroles"], &["bind"]),
        ),
        (
            "impersonate",
            rule(&[""], &["users", "groups"], &["impersonate"]),
        ),
        (
            "certificates",
            rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/approval"],
                &["update"],
            ),
        ),
        (
            "serviceaccounts/token",
            rule(&[""], &["serviceaccounts/token"], &["create"]),
        ),
        (
            "admission",
            rule(
                &["admissionregistration.k8s.io"],
                &["mutatingwebhookconfigurations"],
                &["create"],
            ),
        ),
        ("namespaces", rule(&[""], &["namespaces"], &["patch"])),
        (
            "pods/ephemeralcontainers",
            rule(&[""], &["pods/ephemeralcontainers"], &["update", "patch"]),
        ),
        ("exec", rule(&[""], &["pods/exec"], &["create"])),
        (
            "pods/portforward",
            rule(&[""], &["pods/portforward"], &["create"]),
        ),
    ]
}

/// The Addon: coredns with its ClusterRole patched to carry `labels` and
/// `rules`.
fn dns(labels: Value, rules: Vec<Value>) -> Value {
    json!({"plugin": "coredns", "channel": "stable", "patches": [{
        "target": {"kind": "ClusterRole", "name": ROLE},
        "patch": {"metadata": {"labels": labels}, "rules": rules}}]})
}

async fn patch_addon(env: &Env, spec: Value) {
    Api::<Addon>::namespaced(env.client.clone(), CAPSTAN_NAMESPACE)
        .patch(
            "dns",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// The Addon's `Applied` message once it names `needle` (a later pass's
/// refusal, after the spec changed).
async fn refusal_naming(env: &Env, needle: &str) -> String {
    let api: Api<Addon> = Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    env.eventually(&format!("a refusal naming {needle:?}"), LONG, async || {
        let c = condition(&api.get("dns").await.ok()?.status?.conditions, APPLIED)?.clone();
        (c.reason == "BelowHostFloor" && c.message.contains(needle)).then_some(c.message)
    })
    .await
}

/// The rules of a built-in aggregating role, as the aggregation controller
/// last wrote them.
async fn rules_of(env: &Env, name: &str) -> Vec<Value> {
    let role = Api::<ClusterRole>::all(env.client.clone())
        .get(name)
        .await
        .unwrap();
    serde_json::to_value(role.rules.unwrap_or_default())
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Whether `role`'s rules include any of `routes`' rules (the aggregation
/// controller copies rules verbatim).
async fn holds_a_route(env: &Env, role: &str) -> Vec<Value> {
    let held = rules_of(env, role).await;
    routes()
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| held.contains(r))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_is_refused_plain_or_aggregated_and_view_and_edit_never_gain_one() {
    let coredns = plugin_spec(json!({
        "source": format!("file://{}", capstan_e2e::plugin("coredns_addon").display()),
        "grants": {
            "objects": [
                "ServiceAccount@kube-system", "ConfigMap@kube-system", "Service@kube-system",
                "apps/Deployment@kube-system",
                format!("rbac.authorization.k8s.io/ClusterRole/{ROLE}"),
                format!("rbac.authorization.k8s.io/ClusterRoleBinding/{ROLE}")],
            "patches": [{"objects": format!("rbac.authorization.k8s.io/ClusterRole/{ROLE}"),
                         "paths": ["/metadata/labels", "/rules"]}]
        }
    }));
    // What docs/addons.md asks an admin to bind for these kinds, and the
    // RBAC rights to write role rules Capstan does not hold (`escalate`:
    // the API server checks it before the name of a created role is known)
    // and to bind this one role.
    let rbac = addon_rbac(
        None,
        json!([
            {"apiGroups": [""], "resources": ["serviceaccounts", "services", "configmaps"], "verbs": ADDON_VERBS},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ADDON_VERBS},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles", "clusterrolebindings"], "verbs": ADDON_VERBS},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": [ROLE], "verbs": ["bind"]}]),
    );
    let env = installed_with(vec![("coredns", coredns)], &rbac, &[]).await;
    // An aggregating role of the cluster's own.
    kubectl_apply(
        &env,
        &[
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "monitoring-all"},
            "aggregationRule": {"clusterRoleSelectors": [
                {"matchLabels": {"example.com/aggregate-to-monitoring": "true"}}]},
            "rules": []}),
        ],
    );
    let all: Vec<Value> = routes().into_iter().map(|(_, r)| r).collect();

    // A plain ClusterRole with every route, no route granted.
    create_addon(
        &env.client,
        &addon(CAPSTAN_NAMESPACE, "dns", dns(json!({}), all.clone())),
    )
    .await;
    let message = applied_reason(&env, CAPSTAN_NAMESPACE, "dns", "BelowHostFloor").await;
    for (name, _) in routes() {
        assert!(
            message.contains(&format!("carries the escalation route `{name}` ("))
                && message.contains("which spec.grants.rbac.powers does not name"),
            "{name} in {message}"
        );
    }

    // Aggregated into view: every route refused naming view (and edit,
    // admin through it), though `powers` now names every route.
    // The render changes first: granting the routes while the plain role
    // is still asked for would let it be applied in between.
    patch_addon(
        &env,
        dns(
            json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
            all.clone(),
        ),
    )
    .await;
    let every_route: Vec<&str> = routes().into_iter().map(|(n, _)| n).collect();
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"rbac": {"powers": every_route}}}})),
        )
        .await
        .unwrap();
    let api: Api<Addon> = Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    let message = env
        .eventually("a refusal naming view alone", LONG, async || {
            let c = condition(&api.get("dns").await.ok()?.status?.conditions, APPLIED)?.clone();
            (c.reason == "BelowHostFloor"
                && c.message.contains("aggregates into ClusterRole view")
                && !c.message.contains("spec.grants.rbac.powers does not name"))
            .then_some(c.message)
        })
        .await;
    for (name, _) in routes() {
        assert!(
            message.contains(&format!("carries the escalation route `{name}` (")),
            "{name} in {message}"
        );
    }
    assert!(
        message.contains("so every holder of view (and, through it, of admin, edit) would gain it; spec.grants.rbac.aggregateTo does not name ClusterRole view with `workloads`"),
        "{message}"
    );

    // Aggregated into edit: an ephemeral container in any pod.
    patch_addon(
        &env,
        dns(
            json!({"rbac.authorization.k8s.io/aggregate-to-edit": "true"}),
            vec![
                routes()
                    .into_iter()
                    .find(|(n, _)| *n == "pods/ephemeralcontainers")
                    .unwrap()
                    .1,
            ],
        ),
    )
    .await;
    refusal_naming(
        &env,
        "carries the escalation route `pods/ephemeralcontainers` (Ephemeral containers: any image inside running pods) and aggregates into ClusterRole edit",
    )
    .await;

    // Aggregated into the cluster's own aggregating role, read from the
    // cluster.
    patch_addon(
        &env,
        dns(
            json!({"example.com/aggregate-to-monitoring": "true"}),
            vec![routes().into_iter().find(|(n, _)| *n == "exec").unwrap().1],
        ),
    )
    .await;
    refusal_naming(
        &env,
        "aggregates into ClusterRole monitoring-all, so every holder of monitoring-all would gain it",
    )
    .await;
    assert!(
        Api::<ClusterRole>::all(env.client.clone())
            .get_opt(ROLE)
            .await
            .unwrap()
            .is_none(),
        "no refused render reached the cluster"
    );
    for role in ["view", "edit", "admin", "monitoring-all"] {
        assert_eq!(
            holds_a_route(&env, role).await,
            Vec::<Value>::new(),
            "{role} gained a route"
        );
    }

    // The control: the grant names view and every route. The render is
    // applied, and the aggregation controller gives view (and edit, admin)
    // the routes, as the floor said it would.
    Api::<Plugin>::all(env.client.clone())
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"rbac": {
                "powers": null,
                "aggregateTo": [{"clusterRole": "view", "powers": every_route}]}}}})),
        )
        .await
        .unwrap();
    patch_addon(
        &env,
        dns(
            json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
            all.clone(),
        ),
    )
    .await;
    applied_reason(&env, CAPSTAN_NAMESPACE, "dns", "Applied").await;
    env.eventually("view aggregates the granted routes", LONG, async || {
        (holds_a_route(&env, "view").await.len() == all.len()).then_some(())
    })
    .await;
    env.eventually("edit aggregates them through view", LONG, async || {
        (holds_a_route(&env, "edit").await.len() == all.len()).then_some(())
    })
    .await;
}
