//! A bootstrapped Machine owns only the Node its join identity made, tried
//! as an attacker would (the controllers as installed, the audit log
//! telling their writes apart):
//!
//! - a provider that answers a victim's provider ID before the victim's
//!   instance exists does not keep the victim from its Node, and the victim
//!   is not replaced;
//! - a kubelet with a valid certificate of its own registering a Node that
//!   carries a victim's provider ID gets nothing: the victim links only the
//!   Node of its own name, and the impostor Node is never written to;
//! - a Machine of another shard (another `--watch-filter`) cannot take a
//!   Node this shard's Machine holds: the claim is asked of the API server.

use crate::bootstrap::{KUBEADM, joining_env_with, with_bootstrap};
use capstan_api::machine_conditions::READY;
use capstan_api::{Machine, MachineDeployment, condition};
use capstan_e2e::env::{ControllerProcess, Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);
const CONTROLLER: &str = "system:serviceaccount:capstan-system:capstan-controller";
const HOSTILE_TAINT: &str = "hostile.example.com/mine";

/// A Machine of the hostile plugin that reports `provider_id` as its
/// instance's, with a taint it would carry to its Node.
fn claimer(name: &str, provider_id: &str) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "provider": {"plugin": "hostile", "config": {"attack": "claim-node", "target": provider_id}},
            "taints": [{"key": HOSTILE_TAINT, "value": "yes", "effect": "NoSchedule", "propagation": "Always"}]
        }
    }))
    .unwrap()
}

/// The controllers' writes to Node `name` (patches, deletions).
fn controller_writes_to(env: &Env, name: &str) -> Vec<String> {
    env.control_plane
        .audit_writes()
        .unwrap()
        .iter()
        .filter(|w| w["user"]["username"] == CONTROLLER)
        .filter(|w| w["objectRef"]["resource"] == "nodes" && w["objectRef"]["name"] == name)
        .map(|w| format!("{} {}", w["verb"], w["objectRef"]))
        .collect()
}

async fn ready_reason(env: &Env, name: &str) -> Option<(String, String)> {
    let m = Api::<Machine>::namespaced(env.client.clone(), NS)
        .get(name)
        .await
        .ok()?;
    let c = condition(&m.status?.conditions, READY)?.clone();
    Some((c.reason, c.message))
}

fn has_hostile_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == HOSTILE_TAINT))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_answering_a_victims_id_first_keeps_the_victim_from_nothing() {
    let env = joining_env_with(Faults {
        boot_latency_ms: 1_000,
        ..Default::default()
    })
    .await;
    env.create_plugin("hostile", &capstan_e2e::plugin("hostile_plugin"))
        .await
        .unwrap();
    // The cloud numbers its instances: the victim's will be i-000001. The
    // hostile Machine reports that ID before the victim exists.
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    machines
        .create(&PostParams::default(), &claimer("thief", "sim://i-000001"))
        .await
        .unwrap();
    env.eventually("the thief reports the ID", LONG, async || {
        let m = machines.get("thief").await.ok()?;
        (m.status?.provider_id.as_deref() == Some("sim://i-000001")).then_some(())
    })
    .await;
    let md = with_bootstrap(
        sample_deployment("victim", SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2"),
        KUBEADM,
        json!({}),
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "victim", LONG).await;
    let victim = env
        .machines(NS)
        .await
        .into_iter()
        .find(|m| m.name_any() != "thief")
        .unwrap();
    let status = victim.status.clone().unwrap();
    assert_eq!(status.provider_id.as_deref(), Some("sim://i-000001"));
    assert_eq!(
        status.node_ref.unwrap().name,
        victim.name_any(),
        "the victim links the Node its join identity made"
    );
    // Held for a while: the victim is not replaced, the thief never links.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now: Vec<String> = env
        .machines(NS)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    assert!(
        now.contains(&victim.name_any()),
        "the victim was not replaced: {now:?}"
    );
    assert_eq!(
        env.cloud.stats().instances_launched,
        1,
        "no second instance"
    );
    let (reason, message) = ready_reason(&env, "thief").await.unwrap();
    assert_eq!(reason, "NodeClaimRefused", "{message}");
    let victim_named = format!("Machine {NS}/{}", victim.name_any());
    assert!(
        message.contains(&format!("it is the join identity of {victim_named}"))
            || message.contains(&format!("{victim_named} reports the same provider ID")),
        "{message}"
    );
    let node = Api::<Node>::all(env.client.clone())
        .get(&victim.name_any())
        .await
        .unwrap();
    assert!(
        !has_hostile_taint(&node),
        "the thief's taint reached the Node"
    );
    assert_eq!(
        node.annotations().get("cluster.x-k8s.io/machine"),
        Some(&victim.name_any())
    );
}

/// A client acting as the kubelet of Node `name`, with a certificate of its
/// own: a CSR for `system:node:<name>` the admin approves and the control
/// plane signs (as for any kubelet whose owner has one).
async fn kubelet_of(env: &Env, name: &str) -> kube::Client {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{name}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let request = params.serialize_request(&key).unwrap().pem().unwrap();
    let csrs: Api<CertificateSigningRequest> = Api::all(env.client.clone());
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": format!("impostor-{name}")},
        "spec": {
            "request": k8s_openapi::ByteString(request.into_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "key encipherment", "client auth"]
        }
    }))
    .unwrap();
    csrs.create(&PostParams::default(), &csr).await.unwrap();
    csrs.patch_approval(
        &format!("impostor-{name}"),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "AdminApproved", "message": "its owner's kubelet"}]}})),
    )
    .await
    .unwrap();
    let certificate = env
        .eventually("the impostor's certificate is signed", LONG, async || {
            csrs.get(&format!("impostor-{name}"))
                .await
                .ok()?
                .status?
                .certificate
        })
        .await;
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        env.control_plane.url,
        b64(&env.control_plane.ca_pem),
        b64(&certificate.0),
        b64(key.serialize_pem().as_bytes()),
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubelet_registering_a_victims_provider_id_under_its_own_name_gets_nothing() {
    // The victim's instance never joins: only the impostor's Node carries
    // its provider ID, for as long as the test looks.
    let env = joining_env_with(Faults {
        boot_latency_ms: 200,
        register_nodes: false,
        ..Default::default()
    })
    .await;
    let impostor = kubelet_of(&env, "impostor").await;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "impostor"},
        "spec": {"providerID": "sim://i-000001"}
    }))
    .unwrap();
    Api::<Node>::all(impostor)
        .create(&PostParams::default(), &node)
        .await
        .expect("NodeRestriction lets a kubelet create its own Node");
    // Creation times are in whole seconds: the Machine comes later.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let md = with_bootstrap(
        sample_deployment("victim", SIM_PLUGIN, &env.cloud.url(), 1, "v1.20.2"),
        KUBEADM,
        json!({}),
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    let victim = env
        .eventually("the victim's Machine", LONG, async || {
            env.machines(NS).await.pop()
        })
        .await;
    let (_, message) = env
        .eventually("the impostor is refused", LONG, async || {
            ready_reason(&env, &victim.name_any())
                .await
                .filter(|(reason, _)| reason == "NodeClaimRefused")
        })
        .await;
    assert!(
        message.starts_with("Node impostor carries spec.providerID sim://i-000001")
            && message.contains(&format!(
                "its name is not \"{}\": Capstan approved a Node certificate for this Machine only as system:node:{}",
                victim.name_any(),
                victim.name_any()
            )),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let linked = Api::<Machine>::namespaced(env.client.clone(), NS)
        .get(&victim.name_any())
        .await
        .unwrap();
    assert!(
        linked.status.unwrap().node_ref.is_none(),
        "the impostor is not linked"
    );
    let impostor = Api::<Node>::all(env.client.clone())
        .get("impostor")
        .await
        .unwrap();
    assert!(
        !impostor
            .labels()
            .contains_key(capstan_api::LABEL_DEPLOYMENT_NAME)
            && !impostor
                .annotations()
                .contains_key("cluster.x-k8s.io/machine"),
        "nothing of the victim reached the impostor: {:?}",
        impostor.metadata
    );
    // Deleting the victim leaves the impostor's Node alone too.
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .delete("victim", &Default::default())
        .await
        .unwrap();
    env.eventually("the victim is gone", LONG, async || {
        env.machines(NS).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(
        controller_writes_to(&env, "impostor"),
        Vec::<String>::new(),
        "the controllers never wrote to the impostor's Node"
    );
    assert!(
        Api::<Node>::all(env.client.clone())
            .get_opt("impostor")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_of_another_shard_cannot_take_a_node_this_shard_holds() {
    crate::logs();
    let env = Env::start(Faults::default()).await.unwrap();
    env.create_plugin("hostile", &capstan_e2e::plugin("hostile_plugin"))
        .await
        .unwrap();
    // Two shards, each a `capstan controller` that sees only the Machines
    // labelled with its value.
    let shard = |value: &str| {
        let flag = format!("--watch-filter={value}");
        let mut c =
            ControllerProcess::start(&env, &[flag.as_str(), "--poll-interval=250ms"], &[]).unwrap();
        c.wait_ready(LONG).unwrap();
        c
    };
    let mut shard_a = shard("a");
    let mut shard_b = shard("b");
    let label = |value: &str| {
        (
            capstan_controllers::LABEL_WATCH_FILTER.to_string(),
            value.to_string(),
        )
    };
    // One Machine per shard names the same instance; its Node registers
    // after both exist, so each shard's own rules would let it take it.
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    for (name, value) in [("holder-a", "a"), ("holder-b", "b")] {
        let mut m = claimer(name, "hostile://contested");
        m.metadata.labels = Some([label(value)].into());
        machines.create(&PostParams::default(), &m).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "contested"},
        "spec": {"providerID": "hostile://contested"}
    }))
    .unwrap();
    Api::<Node>::all(env.client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    // Exactly one takes it; the other is refused, naming the holder.
    let decided = capstan_e2e::env::poll_until(LONG, async || {
        let a = machines.get("holder-a").await.ok()?;
        let b = machines.get("holder-b").await.ok()?;
        let linked = |m: &Machine| {
            m.status
                .as_ref()
                .and_then(|s| s.node_ref.as_ref())
                .is_some()
        };
        let (winner, loser) = match (linked(&a), linked(&b)) {
            (true, false) => ("holder-a", "holder-b"),
            (false, true) => ("holder-b", "holder-a"),
            _ => return None,
        };
        let (reason, message) = ready_reason(&env, loser).await?;
        (reason == "NodeClaimRefused").then_some((winner, loser, message))
    })
    .await;
    let Some((winner, loser, message)) = decided else {
        let tail = |c: &ControllerProcess| {
            let text = std::fs::read_to_string(&c.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        panic!(
            "no shard's Machine holds the Node\n{}\n--- shard a ---\n{}\n--- shard b ---\n{}",
            env.describe(NS).await,
            tail(&shard_a),
            tail(&shard_b)
        );
    };
    assert!(
        message.contains(&format!(
            "Machine {NS}/{winner} holds it (the Node's Cluster API annotations name it, and it exists)"
        )) || message.contains("another Machine claimed it first"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = Api::<Node>::all(env.client.clone())
        .get("contested")
        .await
        .unwrap();
    assert_eq!(
        node.annotations()
            .get("cluster.x-k8s.io/machine")
            .map(String::as_str),
        Some(winner)
    );
    let loser_now = machines.get(loser).await.unwrap();
    assert!(
        loser_now.status.unwrap().node_ref.is_none(),
        "{loser} never linked it"
    );
    shard_a.stop();
    shard_b.stop();
}
