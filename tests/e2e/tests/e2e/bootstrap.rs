//! Machines that really join: the kubeadm bootstrap plugin renders their
//! cloud-config, Capstan mints a bootstrap token per machine and writes the
//! data Secret, the simulated instance boots from its user data (kubeadm's
//! token discovery, then TLS bootstrapping against the real control
//! plane's CSR approver and signer) and registers its Node with its own
//! certificate. The controllers run as the ServiceAccount `capstan install`
//! generates, and the API server's audit log says who wrote what.

use capstan_api::{Machine, MachineBootstrap, MachineDeployment, Plugin};
use capstan_e2e::env::{
    CAPSTAN_NAMESPACE, Env, EnvOptions, SIM_PLUGIN, sample_deployment, sim_plugin_spec,
};
use capstan_e2e::install::controller_config;
use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

pub(crate) const KUBEADM: &str = "kubeadm";
/// Allowed only in Capstan's own namespace (no `allowedNamespaces`).
const KUBEADM_PRIVATE: &str = "kubeadm-private";
/// A namespace `capstan install` was not told Machines live in.
const UNBOUND: &str = "unbound";

/// An audited environment whose instances join only with join data, the
/// kubeadm bootstrap Plugins, and the controllers as installed.
async fn joining_env() -> Env {
    joining_env_with(Faults {
        boot_latency_ms: 200,
        delete_latency_ms: 200,
        ..Default::default()
    })
    .await
}

pub(crate) async fn joining_env_with(faults: Faults) -> Env {
    joining_env_tuned(faults, |_| {}).await
}

/// [`joining_env_with`], the controllers' options tuned by `tune`.
pub(crate) async fn joining_env_tuned(
    faults: Faults,
    tune: impl FnOnce(&mut capstan_controllers::Options),
) -> Env {
    let mut options = EnvOptions::new(faults);
    options.control_plane.audit = true;
    options.kubelet.shared_identity_without_join_data = false;
    // Long enough for the bootstrap signer to sign a new token, short
    // enough that wrong join data is given up on quickly.
    options.kubelet.join_timeout_ms = 20_000;
    let mut env = Env::start_with(options).await.expect("environment");
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    let source = format!("file://{}", plugin("kubeadm_bootstrap").display());
    for (name, allowed) in [(KUBEADM, true), (KUBEADM_PRIVATE, false)] {
        let mut spec = sim_plugin_spec(&source);
        // A bootstrap plugin asks for nothing and is granted nothing.
        spec.grants = Default::default();
        if !allowed {
            spec.allowed_namespaces = None;
        }
        plugins
            .create(&PostParams::default(), &Plugin::new(name, spec))
            .await
            .expect("create the bootstrap Plugin");
    }
    let config = controller_config(&env).await;
    let mut options = capstan_controllers::Options {
        // As installed: Plugins without allowedNamespaces serve only
        // Capstan's namespace.
        secrets_namespace: Some(CAPSTAN_NAMESPACE.into()),
        ..Default::default()
    };
    tune(&mut options);
    env.start_controllers_as(config, capstan_controllers::Providers::default(), options)
        .await;
    env
}

pub(crate) fn with_bootstrap(
    mut md: MachineDeployment,
    plugin: &str,
    config: Value,
) -> MachineDeployment {
    md.spec.template.spec.bootstrap = Some(MachineBootstrap {
        plugin: Some(plugin.into()),
        config: Some(config),
        data_secret_name: None,
    });
    md
}

/// GET on the cloud's admin API.
async fn cloud_get(env: &Env, path: &str) -> Value {
    let (status, body) = env.cloud_call("GET", path, None).await.expect("cloud call");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

pub(crate) fn decode(b64: &str) -> String {
    use base64::Engine;
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap()
}

/// The bootstrap token (`<id>.<secret>`) in rendered cloud-config, read as
/// the instance reads it.
pub(crate) fn token_in(data: &str) -> String {
    capstan_e2e::sim_cloud::kubelet::join::join_configuration("cloud-config", data.as_bytes())
        .expect("a JoinConfiguration")
        .token
}

async fn bootstrap_tokens(env: &Env) -> Vec<Secret> {
    Api::<Secret>::namespaced(env.client.clone(), "kube-system")
        .list(&ListParams::default().labels("capstan.dev/machine-uid"))
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_join_with_their_own_identity_by_tls_bootstrap() {
    crate::logs();
    let env = joining_env().await;
    let md = with_bootstrap(
        sample_deployment("joined", SIM_PLUGIN, &env.cloud.url(), 3, "v1.20.2"),
        KUBEADM,
        json!({"kubeletExtraArgs": {"max-pods": "58"}, "preKubeadmCommands": ["swapoff -a"]}),
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out("default", "joined", Duration::from_secs(120))
        .await;

    let machines = env.machines("default").await;
    assert_eq!(machines.len(), 3);
    let joins = cloud_get(&env, "/admin/joins").await;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "default");
    let csrs: Api<CertificateSigningRequest> = Api::all(env.client.clone());
    let csr_list = csrs.list(&Default::default()).await.unwrap().items;
    for m in &machines {
        let name = m.name_any();
        let status = m.status.clone().unwrap();
        // The data Secret: the Machine's, in its namespace, the type Cluster
        // API uses; the instance got exactly that as its user data.
        let data_name = status
            .bootstrap_data_secret_name
            .clone()
            .expect("data Secret recorded");
        assert_eq!(
            status
                .initialization
                .as_ref()
                .and_then(|i| i.bootstrap_data_secret_created),
            Some(true)
        );
        let data = secrets.get(&data_name).await.unwrap();
        assert_eq!(data.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
        assert_eq!(data.owner_references()[0].uid, m.uid().unwrap());
        let value = String::from_utf8(data.data.unwrap()["value"].0.clone()).unwrap();
        assert!(value.starts_with("#cloud-config"), "{value}");
        assert!(
            !value.contains("@@CAPSTAN_BOOTSTRAP_TOKEN@@"),
            "the placeholder is replaced"
        );
        let id = status
            .provider_id
            .clone()
            .unwrap()
            .trim_start_matches("sim://")
            .to_string();
        let user_data = cloud_get(&env, &format!("/admin/instances/{id}/user-data")).await;
        assert_eq!(user_data["format"], "cloud-config");
        assert_eq!(decode(user_data["value"].as_str().unwrap()), value);
        // The Node is named after the Machine and joined as itself.
        let node = capstan_e2e::env::node_of(m);
        assert_eq!(node, name);
        // It points back to its Machine as Cluster API's Nodes do, and the
        // Machine reports what the kubelet says.
        let annotations = env
            .eventually("Node annotated", Duration::from_secs(30), async || {
                let n = Api::<Node>::all(env.client.clone()).get(&node).await.ok()?;
                let a = n.annotations().clone();
                a.contains_key("cluster.x-k8s.io/owner-name").then_some(a)
            })
            .await;
        assert_eq!(annotations["cluster.x-k8s.io/machine"], name);
        assert_eq!(annotations["cluster.x-k8s.io/cluster-namespace"], "default");
        assert_eq!(annotations["cluster.x-k8s.io/owner-kind"], "MachineSet");
        let info = status.node_info.clone().expect("status.nodeInfo");
        assert_eq!(info.kubelet_version, "v1.20.2");
        let join = joins["joins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["providerId"] == format!("sim://{id}"))
            .unwrap_or_else(|| panic!("no join report for {id}: {joins}"));
        assert_eq!(join["state"], "joined", "{join}");
        // Its CSR: requested with this machine's token, approved, signed.
        let token = token_in(&value);
        let token_id = token.split('.').next().unwrap();
        let csr = csr_list
            .iter()
            .find(|c| c.spec.username.as_deref() == Some(&format!("system:bootstrap:{token_id}")))
            .unwrap_or_else(|| {
                let by: Vec<_> = csr_list.iter().map(|c| c.spec.username.clone()).collect();
                panic!("no CSR by the token {token_id} of {name}; CSRs by {by:?}")
            });
        let csr_status = csr.status.clone().unwrap();
        assert!(csr_status.certificate.is_some_and(|c| !c.0.is_empty()));
        assert!(
            csr_status
                .conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == "Approved"),
            "approved"
        );
        assert_eq!(
            csr.spec.signer_name,
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
    }
    // Who wrote the Nodes and their Leases: each Node itself, never a shared
    // credential.
    let writes = env.control_plane.audit_writes().unwrap();
    for m in &machines {
        let name = m.name_any();
        let own = format!("system:node:{name}");
        let about_it: Vec<&Value> = writes
            .iter()
            .filter(|w| {
                ["nodes", "leases"].contains(&w["objectRef"]["resource"].as_str().unwrap_or(""))
                    && w["objectRef"]["name"] == name.as_str()
                    && w["verb"] != "delete"
            })
            .collect();
        assert!(
            about_it
                .iter()
                .any(|w| w["verb"] == "create" && w["objectRef"]["resource"] == "nodes"),
            "{name}: Node created"
        );
        let created = about_it
            .iter()
            .find(|w| w["verb"] == "create" && w["objectRef"]["resource"] == "nodes")
            .unwrap();
        assert_eq!(created["user"]["username"], own.as_str(), "{created}");
        // Every other write is the Node's own (creation, status, Lease),
        // Capstan's (as its ServiceAccount: labels, taints) or the
        // controller-manager's node lifecycle: none with a shared kubelet
        // credential.
        for w in &about_it {
            let user = w["user"]["username"].as_str().unwrap_or("");
            let agent = w["userAgent"].as_str().unwrap_or("");
            assert!(
                user == own
                    || user.starts_with("system:serviceaccount:")
                    || agent.starts_with("kube-controller-manager/"),
                "{name}: written by {user} ({agent}): {w}"
            );
        }
    }
    // The tokens did their work: deleted once their Nodes joined.
    env.eventually(
        "bootstrap tokens deleted after the join",
        Duration::from_secs(60),
        async || bootstrap_tokens(&env).await.is_empty().then_some(()),
    )
    .await;
    let stats = cloud_get(&env, "/admin/stats").await;
    assert_eq!(stats["nodesJoined"], 3, "{stats}");

    // One Node's identity cannot change another Node: the control plane's
    // Node authorizer and NodeRestriction, exercised with a real node
    // certificate obtained the way the kubelet obtains one.
    let intruder = intruder_client(&env, "intruder").await;
    let victim = machines[0].name_any();
    let err = Api::<Node>::all(intruder)
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"owned": "yes"}}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "another Node's identity was not refused: {err}"
    );

    // Gone with the machines: no token, no data Secret.
    delete_and_expect_nothing_left(&env, "joined").await;
}

/// The names of the bootstrap data Secrets in `default`.
async fn data_secrets(env: &Env) -> Vec<String> {
    Api::<Secret>::namespaced(env.client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some("cluster.x-k8s.io/secret"))
        .map(|s| s.name_any())
        .collect()
}

/// Delete MachineDeployment `name`; once its machines are gone, so are
/// their tokens and data Secrets.
async fn delete_and_expect_nothing_left(env: &Env, name: &str) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("machines gone", Duration::from_secs(90), async || {
        env.machines("default").await.is_empty().then_some(())
    })
    .await;
    env.eventually(
        "tokens and data gone",
        Duration::from_secs(60),
        async || {
            (bootstrap_tokens(env).await.is_empty() && data_secrets(env).await.is_empty())
                .then_some(())
        },
    )
    .await;
}

/// A bootstrap token Secret made by hand, as an admin would (secret
/// `0123456789abcdef`), in `group` if given.
fn token_secret(id: &str, expiration: &str, group: Option<&str>) -> Secret {
    let mut data = json!({
        "token-id": id, "token-secret": "0123456789abcdef", "expiration": expiration,
        "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
    });
    if let Some(group) = group {
        data["auth-extra-groups"] = group.into();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": data,
    }))
    .unwrap()
}

/// A client with a real `system:node:<name>` certificate: a bootstrap token
/// minted here (as an admin would), then the kubelet's own discovery and
/// TLS bootstrapping.
async fn intruder_client(env: &Env, name: &str) -> kube::Client {
    let tokens: Api<Secret> = Api::namespaced(env.client.clone(), "kube-system");
    let expiration = k8s_openapi::jiff::Timestamp::from_second(
        k8s_openapi::jiff::Timestamp::now().as_second() + 600,
    )
    .unwrap()
    .to_string();
    let secret = token_secret(
        "zzzzzz",
        &expiration,
        // kubeadm's group: kubeadm's approver signs whatever Node name it asks.
        Some("system:bootstrappers:kubeadm:default-node-token"),
    );
    tokens
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pins = capstan_e2e::sim_cloud::kubelet::join::ca_pins(&env.control_plane.ca_pem);
    let join = capstan_e2e::sim_cloud::kubelet::join::JoinConfig {
        api_server_endpoint: env.control_plane.url.trim_start_matches("https://").into(),
        token: "zzzzzz.0123456789abcdef".into(),
        ca_cert_hashes: pins,
        node_name: name.into(),
        node_labels: Default::default(),
        taints: vec![],
    };
    let client = capstan_e2e::sim_cloud::kubelet::join::bootstrap(&join, Duration::from_secs(60))
        .await
        .expect("TLS bootstrap of the intruder");
    tokens
        .delete("bootstrap-token-zzzzzz", &DeleteParams::default())
        .await
        .unwrap();
    client
}

/// Join data that is wrong never makes a Node: a token the cluster does not
/// know, an expired token, a CA pin of another cluster. The instance's
/// kubelet gives up and the cloud says why; no token is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_join_data_never_registers_a_node() {
    crate::logs();
    let env = joining_env().await;
    let plane = &env.control_plane;
    let endpoint = plane.url.trim_start_matches("https://").to_string();
    let pin = capstan_e2e::sim_cloud::kubelet::join::ca_pins(&plane.ca_pem).remove(0);
    let tokens: Api<Secret> = Api::namespaced(env.client.clone(), "kube-system");
    // An expired token: known to the cluster, but past its expiration the
    // bootstrap signer no longer signs cluster-info with it.
    let expired = token_secret("expird", "2020-01-01T00:00:00Z", None);
    tokens
        .create(&PostParams::default(), &expired)
        .await
        .unwrap();
    // A valid token, with the pin of another cluster's CA.
    let valid = token_secret("pinned", "2099-01-01T00:00:00Z", None);
    tokens.create(&PostParams::default(), &valid).await.unwrap();
    let other_pin = format!("sha256:{}", "0".repeat(64));
    let cases = [
        (
            "unknown-token",
            "abcdef.0123456789abcdef",
            pin.as_str(),
            "not signed with token id",
        ),
        (
            "expired-token",
            "expird.0123456789abcdef",
            pin.as_str(),
            "not signed with token id",
        ),
        (
            "wrong-pin",
            "pinned.0123456789abcdef",
            other_pin.as_str(),
            "not signed with token id",
        ),
    ];
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "default");
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), "default");
    for (name, token, pin, _) in &cases {
        let cloud_config = format!(
            "#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  content: |\n    apiVersion: kubeadm.k8s.io/v1beta2\n    kind: JoinConfiguration\n    discovery:\n      bootstrapToken:\n        apiServerEndpoint: {endpoint}\n        token: {token}\n        caCertHashes: [{pin}]\n    nodeRegistration:\n      name: {name}\nruncmd: [kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml]\n"
        );
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{name}-data"), "namespace": "default"},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": cloud_config, "format": "cloud-config"},
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let mut md = sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2");
        md.spec.template.spec.bootstrap = Some(MachineBootstrap {
            data_secret_name: Some(format!("{name}-data")),
            ..Default::default()
        });
        let mut machine = Machine::new(name, md.spec.template.spec.clone());
        machine.metadata.namespace = Some("default".into());
        machines
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
    }
    let reports = env
        .eventually(
            "every instance gave up joining",
            Duration::from_secs(120),
            async || {
                let joins = cloud_get(&env, "/admin/joins").await;
                let failed: Vec<Value> = joins["joins"]
                    .as_array()?
                    .iter()
                    .filter(|j| j["state"] == "failed")
                    .cloned()
                    .collect();
                (failed.len() == cases.len()).then_some(failed)
            },
        )
        .await;
    for (name, _, _, _) in &cases {
        let report = reports.iter().find(|r| r["node"] == *name).unwrap();
        let message = report["message"].as_str().unwrap();
        let expected = match *name {
            "wrong-pin" => "matches none of the pinned caCertHashes",
            _ => "the token is unknown to the cluster or expired",
        };
        assert!(message.contains(expected), "{name}: {message}");
    }
    let nodes: Api<Node> = Api::all(env.client.clone());
    for (name, _, _, _) in &cases {
        assert!(
            nodes.get_opt(name).await.unwrap().is_none(),
            "{name} registered"
        );
    }
    // User data Machines mint no token of their own.
    assert!(bootstrap_tokens(&env).await.is_empty());
    let stats = cloud_get(&env, "/admin/stats").await;
    assert_eq!(stats["joinFailures"], 3, "{stats}");
}

/// A Machine naming a bootstrap Plugin that does not allow its namespace
/// is refused before anything happens: no token, no data, no instance. So
/// is one in a namespace where no admin let Capstan handle bootstrap data
/// (`capstan install --machine-namespace`): Capstan reads no Secret there.
#[tokio::test(flavor = "multi_thread")]
async fn a_bootstrap_plugin_not_allowed_in_the_namespace_gets_nothing() {
    crate::logs();
    let env = joining_env().await;
    env.control_plane
        .kubectl(&["create", "namespace", UNBOUND], None)
        .expect("create the namespace");
    // Both plugins serve it; only the RoleBinding is missing.
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    for name in [SIM_PLUGIN, KUBEADM] {
        let patch = json!({"spec": {"allowedNamespaces": {"names": ["default", UNBOUND]}}});
        plugins
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("allow the namespace");
    }
    let mut unbound = with_bootstrap(
        sample_deployment("unbound", SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2"),
        KUBEADM,
        json!({}),
    );
    unbound.metadata.namespace = Some(UNBOUND.into());
    Api::<MachineDeployment>::namespaced(env.client.clone(), UNBOUND)
        .create(&PostParams::default(), &unbound)
        .await
        .unwrap();
    let message = env
        .eventually(
            "BootstrapSecretsForbidden",
            Duration::from_secs(60),
            async || {
                let m = env.machines(UNBOUND).await.into_iter().next()?;
                let c =
                    capstan_api::condition(&m.status?.conditions, "InstanceProvisioned")?.clone();
                (c.reason == "BootstrapSecretsForbidden").then_some(c.message)
            },
        )
        .await;
    assert!(
        message.contains(&format!("capstan install --machine-namespace {UNBOUND}")),
        "{message}"
    );
    let md = with_bootstrap(
        sample_deployment("refused", SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2"),
        KUBEADM_PRIVATE,
        json!({}),
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    let message = env
        .eventually("PluginNotAllowed", Duration::from_secs(60), async || {
            let m = env.machines("default").await.into_iter().next()?;
            let c = capstan_api::condition(&m.status?.conditions, "InstanceProvisioned")?.clone();
            (c.reason == "PluginNotAllowed").then_some(c.message)
        })
        .await;
    assert!(message.contains(KUBEADM_PRIVATE), "{message}");
    // Held there: give it a few passes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = env.machines("default").await.remove(0);
    assert!(
        m.status
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .is_none()
    );
    assert!(bootstrap_tokens(&env).await.is_empty());
    let stats = cloud_get(&env, "/admin/stats").await;
    assert_eq!(stats["instancesLaunched"], 0, "{stats}");
    let m = env.machines(UNBOUND).await.remove(0);
    assert!(m.status.and_then(|s| s.provider_id).is_none());
    let secrets = Api::<Secret>::namespaced(env.client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        secrets
            .items
            .iter()
            .all(|s| s.type_.as_deref() != Some("cluster.x-k8s.io/secret"))
    );
}

/// A machine's bootstrap token gets a certificate for that machine's Node
/// and no other: Capstan answers its tokens' CSRs (kubeadm's approver does
/// not see their group), denying a request for another Node's name. A
/// machine whose Node never starts is replaced by its health check, and
/// no token or data outlives the machines.
#[tokio::test(flavor = "multi_thread")]
async fn a_machines_token_gets_only_its_own_nodes_certificate() {
    use capstan_e2e::sim_cloud::kubelet::join;
    crate::logs();
    // Instances never boot: the test holds the machine's token itself.
    let env = joining_env_with(Faults {
        register_nodes: false,
        ..Default::default()
    })
    .await;
    let md = with_bootstrap(
        sample_deployment("held", SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2"),
        KUBEADM,
        json!({}),
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    // A machine whose Node never starts is replaced by its health check.
    env.control_plane
        .kubectl(
            &["apply", "-f", "-"],
            Some(
                "apiVersion: capstan.dev/v1alpha1
kind: MachineHealthCheck
metadata: {name: held, namespace: default}
spec:
  selector: {matchLabels: {capstan.dev/pool: held}}
  checks: {nodeStartupTimeoutSeconds: 20}
",
            ),
        )
        .unwrap();
    let (machine, data) = env
        .eventually(
            "the machine's bootstrap data",
            Duration::from_secs(60),
            async || {
                let m = env.machines("default").await.into_iter().next()?;
                let name = m.status.as_ref()?.bootstrap_data_secret_name.clone()?;
                let secret = Api::<Secret>::namespaced(env.client.clone(), "default")
                    .get(&name)
                    .await
                    .ok()?;
                let value = String::from_utf8(secret.data?["value"].0.clone()).ok()?;
                Some((m.name_any(), value))
            },
        )
        .await;
    let mut config = join::join_configuration("cloud-config", data.as_bytes()).unwrap();
    assert_eq!(config.node_name, machine);
    // Another Node's name with this machine's token: denied, saying why.
    config.node_name = "victim".into();
    let err = join::bootstrap(&config, Duration::from_secs(30))
        .await
        .err()
        .expect("a certificate for another Node's name");
    assert!(err.contains("denied"), "{err}");
    let csrs = Api::<CertificateSigningRequest>::all(env.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let conditions = |c: &CertificateSigningRequest| {
        c.status
            .clone()
            .unwrap_or_default()
            .conditions
            .unwrap_or_default()
    };
    let denied = csrs
        .iter()
        .flat_map(conditions)
        .find(|c| c.type_ == "Denied")
        .expect("a denied CSR");
    assert_eq!(denied.reason.as_deref(), Some("NotTheMachinesNode"));
    assert!(
        denied
            .message
            .unwrap_or_default()
            .contains(&format!("may ask only for system:node:{machine}")),
    );
    // Its own Node's name: approved by Capstan, signed by the control plane.
    config.node_name = machine.clone();
    let own = join::bootstrap(&config, Duration::from_secs(30))
        .await
        .expect("the machine's own Node certificate");
    drop(own);
    let approved = Api::<CertificateSigningRequest>::all(env.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(conditions)
        .find(|c| c.type_ == "Approved")
        .expect("an approved CSR");
    assert_eq!(approved.reason.as_deref(), Some("MachineBootstrapToken"));

    // Its Node never came: the health check's nodeStartupTimeout replaces
    // the machine; the old one's token and data go with it, so tokens stay
    // bounded by the machines that are waiting to join.
    env.eventually(
        "the machine replaced",
        Duration::from_secs(120),
        async || {
            let names: Vec<String> = env
                .machines("default")
                .await
                .iter()
                .map(|m| m.name_any())
                .collect();
            (!names.contains(&machine) && !names.is_empty()).then_some(())
        },
    )
    .await;
    env.eventually(
        "the old machine's token and data gone",
        Duration::from_secs(60),
        async || {
            let live = env.machines("default").await.len();
            let tokens = bootstrap_tokens(&env).await.len();
            let data = data_secrets(&env).await;
            (tokens <= live && !data.contains(&format!("{machine}-bootstrap"))).then_some(())
        },
    )
    .await;
    // Deleted before joining: no token, no data left.
    delete_and_expect_nothing_left(&env, "held").await;
}
