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
    violations(objects, grants)
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

#[test]
fn every_escalation_route_is_refused_unless_granted_by_name() {
    for (powers, rule) in [
        (
            &["escalate"][..],
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
            &["nodes/proxy"],
            json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}),
        ),
        (
            &["exec"],
            json!({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}),
        ),
        (
            &["exec"],
            json!({"apiGroups": [""], "resources": ["*/exec"], "verbs": ["create"]}),
        ),
        (
            &["serviceaccounts/token"],
            json!({"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}),
        ),
        (
            &["secrets"],
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}),
        ),
        // Reading everything: GET on nodes/proxy and pods/exec runs
        // commands (over a websocket), and every Secret is read.
        (
            &["nodes/proxy", "exec", "secrets"],
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}),
        ),
    ] {
        let found = broken(cluster_role(json!([rule])), PodSecurityLevel::Baseline);
        let expected: Vec<String> = powers
            .iter()
            .map(|p| format!("ClusterRole r: rules[0] carries the escalation route `{p}`"))
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
    }
    // Named Secrets, and reading pods, are no route.
    let fine = cluster_role(json!([
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}
    ]));
    assert!(broken(fine, PodSecurityLevel::Baseline).is_empty());
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
    assert!(violations(std::slice::from_ref(&agent), &AddonGrants::default()).is_empty());
    let grants = AddonGrants {
        pod_spec_paths: vec!["example.com/Agent=/spec/template/spec".parse().unwrap()],
        ..Default::default()
    };
    assert_names(
        &rules(&[agent], &grants),
        &["Agent n/a: sets hostPID: true"],
    );
}
