//! One test per floor rule: each refusal names the object and the rule,
//! and the same render passes where a grant lends what it needs.

use super::*;
use crate::RbacPower;
use capstan_api::PodSecurityLevel;
use serde_json::{Value, json};

fn object(value: Value) -> Object {
    Object::from_value(0, value).unwrap()
}

fn at(level: PodSecurityLevel) -> AddonGrants {
    AddonGrants {
        pod_security: level,
        ..Default::default()
    }
}

fn rules(objects: &[Object], grants: &AddonGrants) -> Vec<String> {
    violations(objects, grants, &Aggregators::built_in())
        .into_iter()
        .map(|v| v.to_string())
        .collect()
}

/// The rules broken by one object alone, at `level`.
fn broken(value: Value, level: PodSecurityLevel) -> Vec<String> {
    rules(&[object(value)], &at(level))
}

fn assert_names(found: &[String], expected: &[&str]) {
    let joined = found.join("\n");
    for e in expected {
        assert!(joined.contains(e), "{e:?} not in:\n{joined}");
    }
    assert_eq!(found.len(), expected.len(), "{joined}");
}

fn deployment(pod: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "kube-system"},
        "spec": {"template": {"metadata": pod.get("metadata").cloned().unwrap_or(json!({})),
                              "spec": pod["spec"].clone()}}
    })
}

fn service_account(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
}

// --- RBAC ------------------------------------------------------------------

#[test]
fn binding_cluster_admin_or_system_masters_is_refused() {
    let crb = object(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "Group", "name": "system:masters"}]
    }));
    let found = rules(&[crb], &at(PodSecurityLevel::Privileged));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("ClusterRoleBinding system:coredns: binds ClusterRole cluster-admin")
    );
    assert!(found[1].contains("group system:masters"));
}

#[test]
fn bindings_reference_only_what_the_render_creates_or_the_grant_names() {
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "r", "namespace": "kube-system"},
        "roleRef": {"kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"kind": "ServiceAccount", "name": "coredns"}]
    });
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"}, "rules": []});
    let sa = service_account("kube-system", "coredns");
    let whole = [object(binding.clone()), object(role), object(sa)];
    assert!(rules(&whole, &AddonGrants::default()).is_empty());

    // Alone, the binding borrows a role and a ServiceAccount it did not make.
    let alone = rules(&[object(binding.clone())], &AddonGrants::default());
    assert_names(
        &alone,
        &[
            "RoleBinding kube-system/r: binds ClusterRole system:coredns, which the render does not create and spec.grants.rbac.roleRefs does not name",
            "binds subject ServiceAccount kube-system/coredns, which the render does not create and spec.grants.rbac.subjects does not name",
        ],
    );
    let mut grants = AddonGrants::default();
    grants.rbac.role_refs = vec![named("ClusterRole", None, "system:coredns")];
    grants.rbac.subjects = vec![named("ServiceAccount", Some("kube-system"), "coredns")];
    assert!(rules(&[object(binding)], &grants).is_empty());

    // Everyone who logs in: refused unless named.
    let everyone = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "open"},
        "roleRef": {"kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "Group", "name": "system:authenticated"}]
    });
    assert_names(
        &rules(&[object(everyone)], &AddonGrants::default()),
        &[
            "binds ClusterRole admin",
            "binds subject Group system:authenticated",
        ],
    );
}

fn named(kind: &str, namespace: Option<&str>, name: &str) -> crate::NamedRef {
    crate::NamedRef {
        kind: kind.into(),
        namespace: namespace.map(Into::into),
        name: name.into(),
    }
}

fn cluster_role(rules_json: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": "r"}, "rules": rules_json})
}

#[test]
fn star_verbs_on_star_resources_is_refused() {
    let role = cluster_role(json!([
        {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["list", "watch"]},
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
    ]));
    let found = broken(role.clone(), PodSecurityLevel::Baseline);
    assert_names(&found, &["rules[1] grants every verb on every resource"]);
}

/// One rule per route of the Kubernetes documentation's list, each
/// refused alone, naming the route and the documentation's heading, and
/// let through where `spec.grants.rbac.powers` names it.
fn route_cases() -> Vec<(&'static [&'static str], Value)> {
    vec![
        (
            &["secrets"][..],
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}),
        ),
        (
            &["secrets"],
            json!({"apiGroups": [""], "resources": ["*"], "verbs": ["watch"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": ["apps"], "resources": ["deployments", "daemonsets"], "verbs": ["create"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["patch"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["create"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["update"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": [""], "resources": ["replicationcontrollers"], "verbs": ["create"]}),
        ),
        (
            &["workloads"],
            json!({"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["*"]}),
        ),
        (
            &["persistentvolumes"],
            json!({"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["create"]}),
        ),
        (
            &["nodes/proxy"],
            json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}),
        ),
        (
            &["escalate"],
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]}),
        ),
        (
            &["bind"],
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"]}),
        ),
        (
            &["impersonate"],
            json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}),
        ),
        (
            &["impersonate"],
            json!({"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/team"], "verbs": ["impersonate"]}),
        ),
        (
            &["certificates"],
            json!({"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["update"]}),
        ),
        (
            &["certificates"],
            json!({"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["kubernetes.io/kube-apiserver-client"], "verbs": ["approve"]}),
        ),
        (
            &["certificates"],
            json!({"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/status"], "verbs": ["patch"]}),
        ),
        (
            &["serviceaccounts/token"],
            json!({"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}),
        ),
        (
            &["admission"],
            json!({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"], "verbs": ["create"]}),
        ),
        (
            &["admission"],
            json!({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"], "verbs": ["delete"]}),
        ),
        (
            &["namespaces"],
            json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["patch"]}),
        ),
        (
            &["pods/ephemeralcontainers"],
            json!({"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["update"]}),
        ),
        (
            &["exec"],
            json!({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}),
        ),
        (
            &["exec"],
            json!({"apiGroups": [""], "resources": ["pods/attach"], "verbs": ["get"]}),
        ),
        (
            &["exec"],
            json!({"apiGroups": [""], "resources": ["*/exec"], "verbs": ["create"]}),
        ),
        (
            &["pods/portforward"],
            json!({"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create"]}),
        ),
        // Reading everything: GET on nodes/proxy, pods/exec and
        // pods/portforward reaches into pods (over a websocket), and every
        // Secret is read.
        (
            &["secrets", "nodes/proxy", "exec", "pods/portforward"],
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}),
        ),
    ]
}

#[test]
fn every_escalation_route_is_refused_unless_granted_by_name() {
    let mut seen = std::collections::BTreeSet::new();
    for (powers, rule) in route_cases() {
        let found = broken(cluster_role(json!([rule])), PodSecurityLevel::Baseline);
        let expected: Vec<String> = powers
            .iter()
            .map(|p| {
                let power = RbacPower::ALL.into_iter().find(|r| r.name() == *p).unwrap();
                seen.insert(power);
                format!(
                    "ClusterRole r: rules[0] carries the escalation route `{p}` ({}: {}), which spec.grants.rbac.powers does not name",
                    power.documented_as(),
                    power.meaning()
                )
            })
            .collect();
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        assert_names(&found, &expected);
        let mut grants = AddonGrants::default();
        grants.rbac.powers = RbacPower::ALL
            .into_iter()
            .filter(|p| powers.contains(&p.name()))
            .collect();
        assert!(
            rules(&[object(cluster_role(json!([rule])))], &grants).is_empty(),
            "{powers:?} granted"
        );
        // A namespaced Role carries the same routes (in its namespace).
        let mut role = cluster_role(json!([rule]));
        role["kind"] = "Role".into();
        role["metadata"]["namespace"] = "kube-system".into();
        assert_eq!(
            broken(role, PodSecurityLevel::Baseline).len(),
            powers.len(),
            "{rule}"
        );
    }
    assert_eq!(
        seen.len(),
        RbacPower::ALL.len(),
        "every route has a case of its own"
    );
    // Named Secrets, reading pods and their logs, scaling, a kubelet's own
    // certificate request and deleting pods are no route.
    let fine = cluster_role(json!([
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "delete"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["namespaces", "nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}
    ]));
    assert_eq!(
        broken(fine, PodSecurityLevel::Baseline),
        Vec::<String>::new()
    );
}

fn aggregated(label: &str, rule: Value) -> Value {
    let mut role = cluster_role(json!([rule]));
    role["metadata"]["labels"] = json!({label: "true"});
    role
}

#[test]
fn a_role_aggregated_into_a_built_in_role_is_a_binding_to_its_holders() {
    let view = "rbac.authorization.k8s.io/aggregate-to-view";
    let pods = json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]});
    // `powers` lends a route to the render's own bindings, never to every
    // holder of view.
    let mut grants = AddonGrants::default();
    grants.rbac.powers = vec![RbacPower::Workloads];
    let found = rules(&[object(aggregated(view, pods.clone()))], &grants);
    assert_names(
        &found,
        &[
            "ClusterRole r: rules[0] carries the escalation route `workloads` (Workload creation: pods that run as any ServiceAccount of their namespace and mount its Secrets) and aggregates into ClusterRole view, so every holder of view (and, through it, of admin, edit) would gain it; spec.grants.rbac.aggregateTo does not name ClusterRole view with `workloads`",
        ],
    );
    // Named for another role, or another route: still refused.
    grants.rbac.aggregate_to = vec![crate::AggregationLent {
        cluster_role: "edit".into(),
        powers: vec![RbacPower::Workloads],
    }];
    assert_eq!(
        rules(&[object(aggregated(view, pods.clone()))], &grants).len(),
        1
    );
    grants.rbac.aggregate_to = vec![crate::AggregationLent {
        cluster_role: "view".into(),
        powers: vec![RbacPower::Exec],
    }];
    assert_eq!(
        rules(&[object(aggregated(view, pods.clone()))], &grants).len(),
        1
    );
    // The exact role and route: let through, without `powers`.
    let grants = AddonGrants {
        rbac: crate::RbacLent {
            aggregate_to: vec![crate::AggregationLent {
                cluster_role: "view".into(),
                powers: vec![RbacPower::Workloads],
            }],
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(rules(&[object(aggregated(view, pods.clone()))], &grants).is_empty());
    // Aggregated rules that carry no route need no grant.
    let reading = json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]});
    assert!(broken(aggregated(view, reading), PodSecurityLevel::Baseline).is_empty());
    // A Role is never aggregated: its label lends nothing.
    let mut role = aggregated(view, pods);
    role["kind"] = "Role".into();
    role["metadata"]["namespace"] = "kube-system".into();
    let mut grants = AddonGrants::default();
    grants.rbac.powers = vec![RbacPower::Workloads];
    assert!(rules(&[object(role)], &grants).is_empty());
}

#[test]
fn each_route_aggregated_into_edit_or_admin_is_refused_naming_the_role() {
    for label in [
        "rbac.authorization.k8s.io/aggregate-to-edit",
        "rbac.authorization.k8s.io/aggregate-to-admin",
    ] {
        let role_name = label.rsplit('-').next().unwrap();
        for (powers, rule) in route_cases() {
            let mut grants = AddonGrants::default();
            grants.rbac.powers = RbacPower::ALL.to_vec();
            let found = rules(&[object(aggregated(label, rule.clone()))], &grants);
            let expected: Vec<String> = powers
                .iter()
                .map(|p| format!("carries the escalation route `{p}` ("))
                .collect();
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            assert_names(&found, &expected);
            assert!(
                found
                    .iter()
                    .all(|f| f.contains(&format!("aggregates into ClusterRole {role_name},"))),
                "{found:?}"
            );
        }
    }
}

#[test]
fn the_clusters_own_aggregating_roles_are_bindings_too_and_unknown_ones_refuse_routes() {
    let custom = Aggregators::Known(vec![Aggregator {
        name: "monitoring-all".into(),
        selectors: vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(
                    [(
                        "example.com/aggregate-to-monitoring".to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                ),
                match_expressions: None,
            },
        ],
        labels: Default::default(),
    }]);
    let exec = json!({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]});
    let role = object(aggregated(
        "example.com/aggregate-to-monitoring",
        exec.clone(),
    ));
    let mut grants = AddonGrants::default();
    grants.rbac.powers = vec![RbacPower::Exec];
    let found: Vec<String> = violations(std::slice::from_ref(&role), &grants, &custom)
        .into_iter()
        .map(|v| v.to_string())
        .collect();
    assert_names(
        &found,
        &[
            "aggregates into ClusterRole monitoring-all, so every holder of monitoring-all would gain it",
        ],
    );
    // With the built-in roles alone the same label aggregates nowhere.
    assert!(
        violations(
            std::slice::from_ref(&role),
            &grants,
            &Aggregators::built_in()
        )
        .is_empty()
    );
    // Unknown aggregators: a granted route in a ClusterRole is refused,
    // saying why; a render without routes is not held back.
    let unknown =
        Aggregators::Unknown("Capstan may not list the ClusterRoles of in-cluster".into());
    let plain = object(cluster_role(json!([exec])));
    let found: Vec<String> = violations(std::slice::from_ref(&plain), &grants, &unknown)
        .into_iter()
        .map(|v| v.to_string())
        .collect();
    assert_names(
        &found,
        &[
            "whether the role aggregates into another ClusterRole (lending the route to all its holders) cannot be known: Capstan may not list the ClusterRoles of in-cluster",
        ],
    );
    let reading = object(cluster_role(
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
    ));
    assert!(violations(std::slice::from_ref(&reading), &grants, &unknown).is_empty());
}

#[test]
fn aggregated_roles_are_refused() {
    let mut role = cluster_role(json!([]));
    role["aggregationRule"] = json!({"clusterRoleSelectors": [
        {"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}]});
    assert_names(
        &broken(role, PodSecurityLevel::Privileged),
        &["ClusterRole r: has an aggregationRule"],
    );
}

// --- Routing ---------------------------------------------------------------

#[test]
fn webhooks_call_only_services_of_the_render() {
    let webhook = |client: Value| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": "w"},
               "webhooks": [{"name": "w.example.com", "clientConfig": client}]})
    };
    assert_names(
        &broken(
            webhook(json!({"url": "https://collector.example.com/"})),
            PodSecurityLevel::Baseline,
        ),
        &[
            "MutatingWebhookConfiguration w: webhooks[0] sends requests to url \"https://collector.example.com/\"",
        ],
    );
    let to_service = webhook(json!({"service": {"namespace": "kube-system", "name": "hook"}}));
    assert_names(
        &broken(to_service.clone(), PodSecurityLevel::Baseline),
        &[
            "webhooks[0] sends requests to Service kube-system/hook, which the render does not create",
        ],
    );
    let service = json!({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "hook", "namespace": "kube-system"}, "spec": {}});
    assert!(
        rules(
            &[object(to_service), object(service)],
            &AddonGrants::default()
        )
        .is_empty()
    );
}

#[test]
fn crd_conversion_webhooks_and_api_services_call_only_the_render() {
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "agents.example.com"},
        "spec": {"conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {"url": "https://x.example/"}}}}});
    assert_names(
        &broken(crd, PodSecurityLevel::Baseline),
        &["its conversion webhook sends requests to url"],
    );
    let api_service = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.metrics.k8s.io"},
        "spec": {"service": {"namespace": "evil", "name": "proxy"}}});
    assert_names(
        &broken(api_service, PodSecurityLevel::Baseline),
        &["APIService v1.metrics.k8s.io: it sends requests to Service evil/proxy"],
    );
}

#[test]
fn services_claim_no_external_ips() {
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"externalIPs": ["10.96.0.1"]}});
    assert_names(
        &broken(service, PodSecurityLevel::Privileged),
        &["Service default/s: sets spec.externalIPs"],
    );
}

#[test]
fn rendered_namespaces_cannot_lower_pod_security() {
    let ns = |level: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "n", "labels": {"pod-security.kubernetes.io/enforce": level}}})
    };
    assert_names(
        &broken(ns("privileged"), PodSecurityLevel::Baseline),
        &[
            "Namespace n: labels pod-security.kubernetes.io/enforce=privileged, weaker than Pod Security level Baseline",
        ],
    );
    assert_eq!(broken(ns("sideways"), PodSecurityLevel::Baseline).len(), 1);
    assert!(broken(ns("baseline"), PodSecurityLevel::Baseline).is_empty());
    assert!(broken(ns("restricted"), PodSecurityLevel::Baseline).is_empty());
    assert_eq!(
        broken(ns("baseline"), PodSecurityLevel::Restricted).len(),
        1
    );
    assert!(broken(ns("privileged"), PodSecurityLevel::Privileged).is_empty());
}

// --- ServiceAccounts -------------------------------------------------------

#[test]
fn pods_run_only_as_service_accounts_the_render_creates_or_the_grant_names() {
    let pod = |account: &str| {
        deployment(
            json!({"spec": {"serviceAccountName": account, "containers": [{"name": "c", "image": "x"}]}}),
        )
    };
    let borrowed = broken(
        pod("clusterrole-aggregation-controller"),
        PodSecurityLevel::Privileged,
    );
    assert_names(
        &borrowed,
        &[
            "Deployment kube-system/d: runs as ServiceAccount kube-system/clusterrole-aggregation-controller, which the render does not create and spec.grants.serviceAccounts does not name",
        ],
    );
    // The deprecated alias is read too.
    let alias = deployment(
        json!({"spec": {"serviceAccount": "generic-garbage-collector", "containers": []}}),
    );
    assert_eq!(broken(alias, PodSecurityLevel::Privileged).len(), 1);
    // Its own ServiceAccount, or the namespace's default: fine.
    let own = [
        object(pod("coredns")),
        object(service_account("kube-system", "coredns")),
    ];
    assert!(rules(&own, &AddonGrants::default()).is_empty());
    let unset = deployment(json!({"spec": {"containers": [{"name": "c", "image": "x"}]}}));
    assert!(broken(unset, PodSecurityLevel::Baseline).is_empty());
    // Named by the grant, in the pod's namespace or in any.
    for named in [
        (Some("kube-system".to_string()), "coredns".to_string()),
        (None, "coredns".to_string()),
    ] {
        let grants = AddonGrants {
            service_accounts: vec![named],
            ..Default::default()
        };
        assert!(rules(&[object(pod("coredns"))], &grants).is_empty());
    }
    let elsewhere = AddonGrants {
        service_accounts: vec![(Some("monitoring".into()), "coredns".into())],
        ..Default::default()
    };
    assert_eq!(rules(&[object(pod("coredns"))], &elsewhere).len(), 1);
}

#[test]
fn token_secrets_only_for_service_accounts_of_the_render() {
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "t", "namespace": "kube-system",
                     "annotations": {"kubernetes.io/service-account.name": "clusterrole-aggregation-controller"}}});
    assert_names(
        &broken(secret.clone(), PodSecurityLevel::Privileged),
        &[
            "Secret kube-system/t: asks for a token of ServiceAccount kube-system/clusterrole-aggregation-controller",
        ],
    );
    let mut own = secret;
    own["metadata"]["annotations"]["kubernetes.io/service-account.name"] = json!("coredns");
    assert!(
        rules(
            &[
                object(own),
                object(service_account("kube-system", "coredns"))
            ],
            &AddonGrants::default()
        )
        .is_empty()
    );
}

// --- Pod Security ----------------------------------------------------------

#[test]
fn baseline_refuses_every_control_privileged_allows_them() {
    let ds = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "monitoring"},
        "spec": {"template": {
            "metadata": {"annotations": {
                "container.apparmor.security.beta.kubernetes.io/agent": "unconfined",
                "seccomp.security.alpha.kubernetes.io/pod": "unconfined"}},
            "spec": {
                "hostPID": true, "hostIPC": true, "hostNetwork": true,
                "securityContext": {
                    "windowsOptions": {"hostProcess": true},
                    "seLinuxOptions": {"type": "spc_t"},
                    "seccompProfile": {"type": "Unconfined"},
                    "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"},
                                {"name": "kernel.core_pattern", "value": "|/evil"}]},
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "containers": [{
                    "name": "agent", "image": "x",
                    "securityContext": {
                        "privileged": true,
                        "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]},
                        "procMount": "Unmasked",
                        "appArmorProfile": {"type": "Unconfined"},
                        "seLinuxOptions": {"user": "system_u", "role": "system_r"}},
                    "ports": [{"containerPort": 9100, "hostPort": 9100}]
                }],
                "initContainers": [{"name": "init", "image": "x",
                    "securityContext": {"windowsOptions": {"hostProcess": true}}}]
            }}}
    });
    let found = broken(ds.clone(), PodSecurityLevel::Baseline);
    assert_names(
        &found,
        &[
            "sets hostPID: true",
            "sets hostIPC: true",
            "sets hostNetwork: true",
            "sets securityContext.windowsOptions.hostProcess: true",
            "mounts hostPath volume root",
            "the pod sets seLinuxOptions.type: spc_t",
            "the pod sets seccompProfile.type: Unconfined",
            "sets sysctl \"kernel.core_pattern\"",
            "annotation container.apparmor.security.beta.kubernetes.io/agent: \"unconfined\" overrides AppArmor",
            "annotation seccomp.security.alpha.kubernetes.io/pod: unconfined disables seccomp",
            "container agent is privileged",
            "container agent adds capability SYS_ADMIN",
            "container agent uses hostPort 9100",
            "container agent sets procMount: Unmasked",
            "container agent sets appArmorProfile.type: Unconfined",
            "container agent sets seLinuxOptions.user: system_u",
            "container agent sets seLinuxOptions.role: system_r",
            "container init is a Windows HostProcess container",
        ],
    );
    assert!(
        found[0]
            .contains("above Pod Security level Baseline (the Plugin's spec.grants.podSecurity)")
    );
    assert!(!found.join("\n").contains("NET_BIND_SERVICE"));
    assert!(broken(ds, PodSecurityLevel::Privileged).is_empty());
}

fn hardened_container(name: &str) -> Value {
    json!({"name": name, "image": "x", "securityContext": {
        "allowPrivilegeEscalation": false, "runAsNonRoot": true,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}})
}

#[test]
fn restricted_adds_its_controls_on_top_of_baseline() {
    let hardened = deployment(json!({"spec": {
        "volumes": [{"name": "cfg", "configMap": {"name": "c"}}],
        "containers": [hardened_container("c")]}}));
    assert!(broken(hardened.clone(), PodSecurityLevel::Restricted).is_empty());
    let plain = deployment(json!({"spec": {
        "securityContext": {"runAsUser": 0},
        "volumes": [{"name": "data", "nfs": {"server": "s", "path": "/"}}],
        "containers": [{"name": "c", "image": "x",
            "securityContext": {"capabilities": {"add": ["CHOWN"]}}}]}}));
    assert_names(
        &broken(plain.clone(), PodSecurityLevel::Restricted),
        &[
            "volume data is of type nfs, above Pod Security level Restricted",
            "the pod sets runAsUser: 0",
            "container c does not set allowPrivilegeEscalation: false",
            "container c does not set runAsNonRoot: true (nor does the pod)",
            "container c sets no seccompProfile.type RuntimeDefault or Localhost (nor does the pod)",
            "container c does not drop capability ALL",
            "container c adds capability CHOWN",
        ],
    );
    assert!(broken(plain, PodSecurityLevel::Baseline).is_empty());
    // Pod-level settings count for every container.
    let pod_level = deployment(json!({"spec": {
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
        "containers": [{"name": "c", "image": "x", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}));
    assert!(broken(pod_level, PodSecurityLevel::Restricted).is_empty());
}

#[test]
fn pods_of_every_workload_kind_are_checked() {
    for (api_version, kind, value) in [
        ("v1", "Pod", json!({"spec": {"hostIPC": true}})),
        (
            "v1",
            "PodTemplate",
            json!({"template": {"spec": {"hostIPC": true}}}),
        ),
        (
            "v1",
            "ReplicationController",
            json!({"spec": {"template": {"spec": {"hostIPC": true}}}}),
        ),
        (
            "apps/v1",
            "Deployment",
            json!({"spec": {"template": {"spec": {"hostIPC": true}}}}),
        ),
        (
            "apps/v1",
            "StatefulSet",
            json!({"spec": {"template": {"spec": {"hostIPC": true}}}}),
        ),
        (
            "batch/v1",
            "Job",
            json!({"spec": {"template": {"spec": {"hostIPC": true}}}}),
        ),
        (
            "batch/v1",
            "CronJob",
            json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"hostIPC": true}}}}}}),
        ),
    ] {
        let mut value = value;
        value["apiVersion"] = json!(api_version);
        value["kind"] = json!(kind);
        value["metadata"] = json!({"name": "p", "namespace": "n"});
        assert_eq!(broken(value, PodSecurityLevel::Baseline).len(), 1, "{kind}");
    }
}

#[test]
fn custom_workloads_are_checked_where_the_grant_says() {
    let agent = object(json!({"apiVersion": "example.com/v1", "kind": "Agent",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"template": {"spec": {"hostPID": true, "serviceAccountName": "default"}}}}));
    assert!(
        violations(
            std::slice::from_ref(&agent),
            &AddonGrants::default(),
            &Aggregators::built_in()
        )
        .is_empty()
    );
    let grants = AddonGrants {
        pod_spec_paths: vec!["example.com/Agent=/spec/template/spec".parse().unwrap()],
        ..Default::default()
    };
    assert_names(
        &rules(&[agent], &grants),
        &["Agent n/a: sets hostPID: true"],
    );
}

/// RBAC as the API server evaluates it, written apart from the floor: the
/// rules authorize `verb` on `resource` (with its subresource) in `group`,
/// for the object `name` (`None`: a request without a name, such as create
/// or list).
fn authorizes(
    rules: &[Value],
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let has = |rule: &Value, field: &str, item: &str| {
        rule[field]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i == item))
    };
    rules.iter().any(|rule| {
        let verb_ok = has(rule, "verbs", "*") || has(rule, "verbs", verb);
        let group_ok = has(rule, "apiGroups", "*") || has(rule, "apiGroups", group);
        let resource_ok = has(rule, "resources", "*")
            || has(rule, "resources", resource)
            || resource
                .split_once('/')
                .is_some_and(|(_, sub)| has(rule, "resources", &format!("*/{sub}")));
        let names = rule["resourceNames"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let name_ok = names.is_empty() || name.is_some_and(|n| names.iter().any(|i| i == n));
        verb_ok && group_ok && resource_ok && name_ok
    })
}

/// Whether `rules` together open any route of the documentation's list,
/// as an attacker would use it: objects named as the attacker chooses, and
/// several-step routes needing every step.
fn opens_a_route(rules: &[Value]) -> Option<&'static str> {
    let any = |requests: &[(&str, &str, &str, Option<&str>)]| {
        requests
            .iter()
            .any(|(g, r, v, n)| authorizes(rules, g, r, v, *n))
    };
    let victim = Some("victim");
    let workloads: Vec<(&str, &str, &str, Option<&str>)> = [
        ("", "pods"),
        ("", "replicationcontrollers"),
        ("apps", "deployments"),
        ("apps", "daemonsets"),
        ("apps", "statefulsets"),
        ("apps", "replicasets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
    ]
    .into_iter()
    .flat_map(|(g, r)| {
        [
            (g, r, "create", None),
            (g, r, "patch", victim),
            (g, r, "update", victim),
        ]
    })
    .collect();
    let routes: Vec<(&'static str, bool)> = vec![
        (
            "secrets",
            any(&[
                ("", "secrets", "list", None),
                ("", "secrets", "watch", None),
                ("", "secrets", "get", victim),
            ]),
        ),
        ("workloads", any(&workloads)),
        (
            "persistentvolumes",
            any(&[("", "persistentvolumes", "create", None)]),
        ),
        (
            "nodes/proxy",
            any(&[
                ("", "nodes/proxy", "get", Some("node-1")),
                ("", "nodes/proxy", "create", Some("node-1")),
            ]),
        ),
        (
            "escalate",
            any(&[
                (
                    "rbac.authorization.k8s.io",
                    "clusterroles",
                    "escalate",
                    victim,
                ),
                ("rbac.authorization.k8s.io", "roles", "escalate", victim),
            ]),
        ),
        (
            "bind",
            any(&[
                (
                    "rbac.authorization.k8s.io",
                    "clusterroles",
                    "bind",
                    Some("cluster-admin"),
                ),
                ("rbac.authorization.k8s.io", "roles", "bind", victim),
            ]),
        ),
        (
            "impersonate",
            any(&[
                ("", "users", "impersonate", Some("system:admin")),
                ("", "groups", "impersonate", Some("system:masters")),
                ("", "serviceaccounts", "impersonate", victim),
            ]),
        ),
        (
            "certificates",
            (any(&[
                (
                    "certificates.k8s.io",
                    "certificatesigningrequests/approval",
                    "update",
                    victim,
                ),
                (
                    "certificates.k8s.io",
                    "certificatesigningrequests/approval",
                    "patch",
                    victim,
                ),
            ]) && any(&[(
                "certificates.k8s.io",
                "signers",
                "approve",
                Some("kubernetes.io/kube-apiserver-client"),
            )])) || (any(&[
                (
                    "certificates.k8s.io",
                    "certificatesigningrequests/status",
                    "update",
                    victim,
                ),
                (
                    "certificates.k8s.io",
                    "certificatesigningrequests/status",
                    "patch",
                    victim,
                ),
            ]) && any(&[(
                "certificates.k8s.io",
                "signers",
                "sign",
                Some("kubernetes.io/kube-apiserver-client"),
            )])),
        ),
        (
            "serviceaccounts/token",
            any(&[("", "serviceaccounts/token", "create", victim)]),
        ),
        (
            "admission",
            any(&[
                (
                    "admissionregistration.k8s.io",
                    "mutatingwebhookconfigurations",
                    "create",
                    None,
                ),
                (
                    "admissionregistration.k8s.io",
                    "validatingwebhookconfigurations",
                    "delete",
                    victim,
                ),
                (
                    "admissionregistration.k8s.io",
                    "validatingadmissionpolicies",
                    "patch",
                    victim,
                ),
            ]),
        ),
        (
            "namespaces",
            any(&[
                ("", "namespaces", "patch", victim),
                ("", "namespaces", "update", victim),
            ]),
        ),
        (
            "pods/ephemeralcontainers",
            any(&[("", "pods/ephemeralcontainers", "patch", victim)]),
        ),
        (
            "exec",
            any(&[
                ("", "pods/exec", "create", victim),
                ("", "pods/exec", "get", victim),
                ("", "pods/attach", "create", victim),
            ]),
        ),
        (
            "pods/portforward",
            any(&[
                ("", "pods/portforward", "create", victim),
                ("", "pods/portforward", "get", victim),
            ]),
        ),
    ];
    routes
        .into_iter()
        .find(|(_, open)| *open)
        .map(|(name, _)| name)
}

mod combinations {
    use super::*;
    use proptest::prelude::*;

    fn rule() -> impl Strategy<Value = Value> {
        let groups = prop::sample::subsequence(
            vec![
                "",
                "apps",
                "batch",
                "extensions",
                "rbac.authorization.k8s.io",
                "certificates.k8s.io",
                "admissionregistration.k8s.io",
                "authentication.k8s.io",
                "example.com",
                "*",
            ],
            1..3,
        );
        let resources = prop::sample::subsequence(
            vec![
                "pods",
                "pods/exec",
                "pods/attach",
                "pods/portforward",
                "pods/ephemeralcontainers",
                "pods/log",
                "pods/eviction",
                "deployments",
                "deployments/scale",
                "daemonsets",
                "jobs",
                "cronjobs",
                "secrets",
                "configmaps",
                "persistentvolumes",
                "persistentvolumeclaims",
                "nodes",
                "nodes/proxy",
                "nodes/status",
                "roles",
                "clusterroles",
                "rolebindings",
                "users",
                "groups",
                "serviceaccounts",
                "serviceaccounts/token",
                "certificatesigningrequests",
                "certificatesigningrequests/approval",
                "certificatesigningrequests/status",
                "signers",
                "mutatingwebhookconfigurations",
                "validatingadmissionpolicies",
                "namespaces",
                "*",
                "*/exec",
                "*/proxy",
                "*/approval",
                "*/token",
                "*/status",
            ],
            1..4,
        );
        let verbs = prop::sample::subsequence(
            vec![
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection",
                "escalate",
                "bind",
                "impersonate",
                "approve",
                "sign",
                "*",
            ],
            1..4,
        );
        let names = prop::sample::select(vec![
            vec![],
            vec!["mine"],
            vec!["kubernetes.io/kube-apiserver-client-kubelet"],
        ]);
        (groups, resources, verbs, names).prop_map(|(g, r, v, n)| {
            let mut rule = json!({"apiGroups": g, "resources": r, "verbs": v});
            if !n.is_empty() {
                rule["resourceNames"] = json!(n);
            }
            rule
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Rules the floor lets through one by one (no powers granted)
        /// never open a route together, by RBAC's own evaluation.
        #[test]
        fn no_combination_of_allowed_rules_adds_up_to_a_route(candidates in prop::collection::vec(rule(), 1..8)) {
            let allowed: Vec<Value> = candidates
                .into_iter()
                .filter(|r| broken(cluster_role(json!([r])), PodSecurityLevel::Baseline).is_empty())
                .collect();
            prop_assert_eq!(opens_a_route(&allowed), None, "{:?}", allowed);
        }

        /// The other way round: a single rule that opens a route alone is
        /// refused (the oracle and the floor agree on every route).
        #[test]
        fn a_rule_that_opens_a_route_is_refused(candidate in rule()) {
            if opens_a_route(std::slice::from_ref(&candidate)).is_some() {
                prop_assert!(!broken(cluster_role(json!([candidate.clone()])), PodSecurityLevel::Baseline).is_empty(), "{}", candidate);
            }
        }
    }
}
