//! One management cluster, two workload clusters, each a real control
//! plane: Machines of a `Cluster` join *its* API server (bootstrap token
//! minted there, its CSR approved there), and everything Node-side (the
//! claim, labels, drain, Node deletion) happens there, through the
//! Cluster's kubeconfig Secret as a user holding only the rules
//! `capstan_controllers::rbac::workload_rules` lists. The controllers run
//! as `capstan install`'s ServiceAccount in the management cluster; the
//! audit logs of all three say who wrote what where.
//!
//! Faults: workload cluster B's API server is SIGSTOPped mid-rollout (B
//! reports `RemoteConnectionProbe=False`, its Machines `NodeHealthy=Unknown`,
//! nothing is remediated in B, A's rollout goes on), its kubeconfig Secret
//! deleted and restored (taking effect without a restart). Tenancy: a
//! Cluster whose kubeconfig runs a command, names a link-local server or
//! lives in another namespace is refused before anything is contacted.

use crate::bootstrap::{KUBEADM, joining_env_tuned, with_bootstrap};
use capstan_api::{Cluster, Machine, MachineDeployment, MachineHealthCheck};
use capstan_e2e::control_plane::{ControlPlane, ControlPlaneOptions, MINIMAL_USER};
use capstan_e2e::env::{Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NS: &str = "default";

/// A workload cluster as its admin sets it up for Capstan, with the real
/// binary: `capstan install --workload-cluster` binds the rules a workload
/// kubeconfig's user needs to [`MINIMAL_USER`] (nothing else is bound to
/// it) and lets machines' bootstrap tokens ask for node certificates.
fn prepare_workload(plane: &ControlPlane) {
    let capstan = capstan_e2e::env::capstan_bin().expect("the capstan binary");
    let printed = std::process::Command::new(&capstan)
        .args([
            "install",
            "--workload-cluster",
            "--workload-user",
            MINIMAL_USER,
        ])
        .output()
        .expect("capstan install --workload-cluster");
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let yaml = String::from_utf8(printed.stdout).unwrap();
    assert!(
        yaml.contains("kind: ClusterRole") && yaml.contains("capstan-workload"),
        "{yaml}"
    );
    assert!(
        !yaml.contains("machinedeployments"),
        "no management rule in a workload cluster: {yaml}"
    );
    capstan_e2e::install::install_workload_cluster(plane)
        .expect("capstan install --workload-cluster --apply");
}

async fn put_kubeconfig(env: &Env, namespace: &str, name: &str, kubeconfig: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {"value": kubeconfig}}))
    .unwrap();
    let api: Api<Secret> = Api::namespaced(env.client.clone(), namespace);
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&secret),
    )
    .await
    .expect("kubeconfig Secret");
}

async fn create_cluster(env: &Env, namespace: &str, name: &str, spec: Value) {
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec}))
    .unwrap();
    Api::<Cluster>::namespaced(env.client.clone(), namespace)
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create the Cluster");
}

/// The Cluster's condition `type_` as (status, reason, message), once it
/// has one.
async fn condition(
    env: &Env,
    namespace: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let cluster = Api::<Cluster>::namespaced(env.client.clone(), namespace)
        .get(name)
        .await
        .ok()?;
    let c = capstan_api::condition(&cluster.status?.conditions, type_)?.clone();
    Some((c.status, c.reason, c.message))
}

async fn wait_condition(
    env: &Env,
    name: &str,
    type_: &str,
    status: &str,
    within: Duration,
) -> (String, String) {
    env.eventually(
        &format!("Cluster {name} {type_}={status}"),
        within,
        async || {
            let (s, reason, message) = condition(env, NS, name, type_).await?;
            (s == status).then_some((reason, message))
        },
    )
    .await
}

fn deployment_of(env: &Env, name: &str, cluster: &str, replicas: i32) -> MachineDeployment {
    let mut md = with_bootstrap(
        sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), replicas, "v1.20.2"),
        KUBEADM,
        json!({}),
    );
    md.spec.cluster_name = Some(cluster.into());
    md
}

async fn scale(env: &Env, name: &str, replicas: i32) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale");
}

async fn machines_of(env: &Env, cluster: &str) -> Vec<Machine> {
    env.machines(NS)
        .await
        .into_iter()
        .filter(|m| m.spec.cluster_name.as_deref() == Some(cluster))
        .collect()
}

fn node_names(nodes: &[Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes.iter().map(|n| n.name_any()).collect();
    names.sort();
    names
}

async fn nodes_in(plane: &ControlPlane) -> Vec<Node> {
    let client = plane.client().await.expect("a client");
    Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .expect("list Nodes")
        .items
}

fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// Writes the workload kubeconfig's user made in a workload cluster, as
/// (resource, name, verb).
fn writes_by_capstan(plane: &ControlPlane) -> Vec<(String, String, String)> {
    plane
        .audit_writes()
        .expect("audit log")
        .into_iter()
        .filter(|w| w["user"]["username"] == MINIMAL_USER)
        .map(|w| {
            let resource = w["objectRef"]["resource"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let sub = w["objectRef"]["subresource"].as_str().unwrap_or("");
            let resource = if sub.is_empty() {
                resource
            } else {
                format!("{resource}/{sub}")
            };
            (
                resource,
                w["objectRef"]["name"].as_str().unwrap_or("").to_string(),
                w["verb"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_join_their_own_workload_cluster_and_one_stopped_cluster_holds_no_other_back() {
    crate::logs();
    let options = ControlPlaneOptions {
        audit: true,
        ..Default::default()
    };
    let (a, b) = (options.clone(), options.clone());
    let planes = tokio::spawn(async move {
        let a = tokio::task::spawn_blocking(move || ControlPlane::start_with(a));
        let b = tokio::task::spawn_blocking(move || ControlPlane::start_with(b));
        (a.await.unwrap(), b.await.unwrap())
    });
    let env = joining_env_tuned(
        Faults {
            boot_latency_ms: 200,
            delete_latency_ms: 200,
            ..Default::default()
        },
        |options| {
            options.cluster_probe = capstan_kit::workload::ProbeOptions {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
                failure_threshold: 3,
                request_timeout: Duration::from_secs(5),
            };
        },
    )
    .await;
    let (plane_a, plane_b) = planes.await.unwrap();
    let (plane_a, plane_b) = (plane_a.expect("cluster A"), plane_b.expect("cluster B"));
    for plane in [&plane_a, &plane_b] {
        prepare_workload(plane);
    }

    // Tenancy first: nothing is contacted for a refused kubeconfig.
    let exec = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: /bin/sh, args: ['-c', 'touch /tmp/capstan-exec-ran']}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n";
    let link_local = plane_a
        .kubeconfig_inline()
        .replace(&plane_a_url(&plane_a), "https://169.254.169.254:443");
    put_kubeconfig(&env, NS, "exec-kubeconfig", exec).await;
    put_kubeconfig(&env, NS, "metadata-kubeconfig", &link_local).await;
    create_cluster(
        &env,
        NS,
        "exec",
        json!({"kubeconfigSecretRef": {"name": "exec-kubeconfig"}}),
    )
    .await;
    create_cluster(
        &env,
        NS,
        "metadata",
        json!({"kubeconfigSecretRef": {"name": "metadata-kubeconfig"}}),
    )
    .await;
    // A tenant's Cluster cannot reach a Secret of another namespace: the
    // reference names one of its own namespace only.
    capstan_e2e::install::make_tenant(&env, "team-t", "tenant-t");
    put_kubeconfig(
        &env,
        NS,
        "shared-kubeconfig",
        &plane_a.minimal_kubeconfig_inline(),
    )
    .await;
    let tenant = capstan_e2e::install::client_as(&env, "tenant-t").await;
    let tenant_cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "borrowed", "namespace": "team-t"},
        "spec": {"kubeconfigSecretRef": {"name": "shared-kubeconfig"}}}))
    .unwrap();
    Api::<Cluster>::namespaced(tenant, "team-t")
        .create(&PostParams::default(), &tenant_cluster)
        .await
        .expect("the tenant creates its Cluster");

    // The two workload clusters, through their minimal users.
    put_kubeconfig(
        &env,
        NS,
        "wa-kubeconfig",
        &plane_a.minimal_kubeconfig_inline(),
    )
    .await;
    put_kubeconfig(
        &env,
        NS,
        "wb-kubeconfig",
        &plane_b.minimal_kubeconfig_inline(),
    )
    .await;
    create_cluster(&env, NS, "wa", json!({})).await;
    create_cluster(&env, NS, "wb", json!({})).await;
    for name in ["wa", "wb"] {
        wait_condition(
            &env,
            name,
            "RemoteConnectionProbe",
            "True",
            Duration::from_secs(60),
        )
        .await;
        wait_condition(&env, name, "Available", "True", Duration::from_secs(10)).await;
    }
    for (name, reason) in [
        ("exec", "KubeconfigRefused"),
        ("metadata", "KubeconfigRefused"),
    ] {
        let (got, message) = wait_condition(
            &env,
            name,
            "RemoteConnectionProbe",
            "False",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(got, reason, "{name}: {message}");
    }
    let (reason, message) = env
        .eventually(
            "the tenant's Cluster refused",
            Duration::from_secs(30),
            async || {
                let (s, reason, message) =
                    condition(&env, "team-t", "borrowed", "RemoteConnectionProbe").await?;
                (s == "False").then_some((reason, message))
            },
        )
        .await;
    // Looked for in the tenant's namespace only (which Capstan is not bound
    // to read in this install), never in the namespace that has it.
    assert!(
        ["KubeconfigSecretNotFound", "KubeconfigSecretForbidden"].contains(&reason.as_str()),
        "{reason}: {message}"
    );
    assert!(message.contains("team-t/shared-kubeconfig"), "{message}");
    assert!(
        !std::path::Path::new("/tmp/capstan-exec-ran").exists(),
        "an exec kubeconfig ran a command"
    );

    // A deployment per workload cluster; each Machine's Node joins its own.
    let deployments: Api<MachineDeployment> = Api::namespaced(env.client.clone(), NS);
    let started = Instant::now();
    for (name, cluster) in [("pool-a", "wa"), ("pool-b", "wb")] {
        deployments
            .create(
                &PostParams::default(),
                &deployment_of(&env, name, cluster, 2),
            )
            .await
            .expect("create the deployment");
    }
    for name in ["pool-a", "pool-b"] {
        env.wait_rolled_out(NS, name, Duration::from_secs(120))
            .await;
    }
    println!(
        "two workload clusters × 2 machines joined in {:?}",
        started.elapsed()
    );
    let (machines_a, machines_b) = (machines_of(&env, "wa").await, machines_of(&env, "wb").await);
    let names = |ms: &[Machine]| {
        let mut n: Vec<String> = ms.iter().map(|m| m.name_any()).collect();
        n.sort();
        n
    };
    assert_eq!(
        node_names(&nodes_in(&plane_a).await),
        names(&machines_a),
        "A's Nodes are A's Machines"
    );
    assert_eq!(
        node_names(&nodes_in(&plane_b).await),
        names(&machines_b),
        "B's Nodes are B's Machines"
    );
    assert!(
        nodes_in(&env.control_plane).await.is_empty(),
        "no Node joined the management cluster"
    );
    for m in machines_a.iter().chain(&machines_b) {
        let cluster = m.spec.cluster_name.clone().unwrap();
        assert_eq!(
            m.labels().get(capstan_api::LABEL_CLUSTER_NAME),
            Some(&cluster),
            "{}",
            m.name_any()
        );
    }
    let md_a = env.deployment(NS, "pool-a").await;
    env.eventually(
        "deployments labelled with their cluster",
        Duration::from_secs(20),
        async || {
            let md = env.deployment(NS, "pool-a").await;
            (md.labels()
                .get(capstan_api::LABEL_CLUSTER_NAME)
                .map(String::as_str)
                == Some("wa"))
            .then_some(())
        },
    )
    .await;
    drop(md_a);
    env.eventually(
        "Cluster wa counts its workers",
        Duration::from_secs(30),
        async || {
            let c = Api::<Cluster>::namespaced(env.client.clone(), NS)
                .get("wa")
                .await
                .ok()?;
            let w = c.status?.workers?;
            (w.desired_replicas == 2 && w.replicas == 2 && w.ready_replicas == 2).then_some(())
        },
    )
    .await;
    // Bootstrap tokens were minted in each workload cluster, never in the
    // management cluster, and the CSRs approved there.
    for (plane, machines) in [(&plane_a, &machines_a), (&plane_b, &machines_b)] {
        let writes = writes_by_capstan(plane);
        for m in machines {
            let name = m.name_any();
            assert!(
                writes.iter().any(|(r, n, _)| r == "nodes" && n == &name),
                "Capstan annotated Node {name} in its cluster: {writes:?}"
            );
        }
        assert!(
            writes
                .iter()
                .any(|(r, _, v)| r == "secrets" && v == "create"),
            "{writes:?}"
        );
        assert!(
            writes
                .iter()
                .any(|(r, _, _)| r == "certificatesigningrequests/approval"),
            "{writes:?}"
        );
        // Nothing of the other cluster's Machines was written here.
        let others = if std::ptr::eq(plane, &plane_a) {
            &machines_b
        } else {
            &machines_a
        };
        for m in others {
            assert!(
                !writes.iter().any(|(_, n, _)| n == &m.name_any()),
                "{} written in the wrong cluster",
                m.name_any()
            );
        }
    }
    let management_tokens = Api::<Secret>::namespaced(env.client.clone(), "kube-system")
        .list(&ListParams::default().labels("capstan.dev/machine-uid"))
        .await
        .unwrap()
        .items;
    assert!(
        management_tokens.is_empty(),
        "no token in the management cluster"
    );

    // A health check of B's machines that would remediate a silent Node.
    let mhc: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": "pool-b", "namespace": NS},
        "spec": {"clusterName": "wb",
            "selector": {"matchLabels": {"capstan.dev/pool": "pool-b"}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 1},
                {"type": "Ready", "status": "False", "timeoutSeconds": 1}]}}}))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &mhc)
        .await
        .expect("the health check");

    // A's scale-up with B healthy, then with B's API server stopped.
    let started = Instant::now();
    scale(&env, "pool-a", 3).await;
    env.wait_rolled_out(NS, "pool-a", Duration::from_secs(90))
        .await;
    let healthy = started.elapsed();
    let apiserver_b = plane_b.pid("kube-apiserver").expect("B's API server");
    signal(apiserver_b, "STOP");
    let started = Instant::now();
    scale(&env, "pool-a", 4).await;
    scale(&env, "pool-b", 3).await;
    env.wait_rolled_out(NS, "pool-a", Duration::from_secs(90))
        .await;
    let with_b_stopped = started.elapsed();
    let (reason, message) = wait_condition(
        &env,
        "wb",
        "RemoteConnectionProbe",
        "False",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(reason, "ProbeFailed", "{message}");
    env.eventually(
        "B's Machines NodeHealthy=Unknown",
        Duration::from_secs(30),
        async || {
            let ms = machines_of(&env, "wb").await;
            ms.iter()
                .filter(|m| {
                    m.status
                        .as_ref()
                        .and_then(|s| s.node_ref.as_ref())
                        .is_some()
                })
                .all(|m| {
                    m.status
                        .as_ref()
                        .and_then(|s| capstan_api::condition(&s.conditions, "NodeHealthy"))
                        .is_some_and(|c| c.status == "Unknown" && c.reason == "ConnectionDown")
                })
                .then_some(())
        },
    )
    .await;
    println!(
        "cluster A's scale-up by one machine: {healthy:?} with B healthy, {with_b_stopped:?} with B's API server stopped ({:.2}×)",
        with_b_stopped.as_secs_f64() / healthy.as_secs_f64()
    );
    assert_eq!(
        wait_condition(&env, "wa", "Available", "True", Duration::from_secs(5))
            .await
            .0,
        "Available"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let remediated: Vec<String> = machines_of(&env, "wb")
        .await
        .iter()
        .filter(|m| {
            m.status
                .as_ref()
                .and_then(|s| capstan_api::condition(&s.conditions, "OwnerRemediated"))
                .is_some_and(|c| c.status == "False")
                || m.metadata.deletion_timestamp.is_some()
        })
        .map(|m| m.name_any())
        .collect();
    assert!(
        remediated.is_empty(),
        "nothing is remediated in an unreachable cluster: {remediated:?}"
    );
    // Its Nodes' heartbeats were lost while it was stopped: whatever B's
    // node lifecycle says after it resumes is not this test's matter.
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .delete("pool-b", &DeleteParams::default())
        .await
        .unwrap();
    signal(apiserver_b, "CONT");
    wait_condition(
        &env,
        "wb",
        "RemoteConnectionProbe",
        "True",
        Duration::from_secs(60),
    )
    .await;
    env.wait_rolled_out(NS, "pool-b", Duration::from_secs(120))
        .await;
    let nodes_b = node_names(&nodes_in(&plane_b).await);
    assert_eq!(
        nodes_b,
        names(&machines_of(&env, "wb").await),
        "B's third Node joined B after SIGCONT"
    );

    // `capstan describe cluster/wb`: the Cluster, its deployment, set and
    // Machines, as clusterctl prints them.
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let described = std::process::Command::new(capstan_e2e::env::capstan_bin().unwrap())
        .args([
            "describe",
            "cluster/wb",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            NS,
            "--grouping=false",
        ])
        .output()
        .expect("capstan describe");
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.status.success(),
        "{}",
        String::from_utf8_lossy(&described.stderr)
    );
    assert!(
        text.contains("Cluster/wb") && text.contains("MachineDeployment/pool-b"),
        "{text}"
    );
    for m in machines_of(&env, "wb").await {
        assert!(
            text.contains(&m.name_any()),
            "{} missing from\n{text}",
            m.name_any()
        );
    }
    assert!(
        !text.contains("pool-a"),
        "another cluster's objects are not in its tree:\n{text}"
    );

    // The kubeconfig Secret deleted, then restored: no restart needed.
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .delete("wb-kubeconfig", &DeleteParams::default())
        .await
        .unwrap();
    let (reason, message) = wait_condition(
        &env,
        "wb",
        "RemoteConnectionProbe",
        "False",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(reason, "KubeconfigSecretNotFound", "{message}");
    put_kubeconfig(
        &env,
        NS,
        "wb-kubeconfig",
        &plane_b.minimal_kubeconfig_inline(),
    )
    .await;
    wait_condition(
        &env,
        "wb",
        "RemoteConnectionProbe",
        "True",
        Duration::from_secs(30),
    )
    .await;

    // A paused Cluster holds every object of it: B's deployment does not
    // scale, its Machines say why; unpaused, it goes on.
    let pause = |paused: bool| {
        let clusters: Api<Cluster> = Api::namespaced(env.client.clone(), NS);
        async move {
            clusters
                .patch(
                    "wb",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"paused": paused}})),
                )
                .await
                .expect("pause");
        }
    };
    pause(true).await;
    wait_condition(&env, "wb", "Paused", "True", Duration::from_secs(20)).await;
    scale(&env, "pool-b", 4).await;
    env.eventually(
        "B's Machines paused by their Cluster",
        Duration::from_secs(30),
        async || {
            let ms = machines_of(&env, "wb").await;
            ms.iter()
                .all(|m| {
                    m.status
                        .as_ref()
                        .and_then(|s| capstan_api::condition(&s.conditions, "Paused"))
                        .is_some_and(|c| {
                            c.status == "True" && c.message.contains("Cluster wb is paused")
                        })
                })
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        machines_of(&env, "wb").await.len(),
        3,
        "a paused cluster's deployment does not scale"
    );
    pause(false).await;
    env.wait_rolled_out(NS, "pool-b", Duration::from_secs(60))
        .await;
    assert_eq!(machines_of(&env, "wb").await.len(), 4);

    // Remediation happens in the right cluster: one of A's Nodes goes
    // silent; A's health check replaces its Machine, whose Node is
    // deleted from A, and the replacement joins A.
    let check_a: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": "pool-a", "namespace": NS},
        "spec": {"clusterName": "wa",
            "selector": {"matchLabels": {"capstan.dev/pool": "pool-a"}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 1}]}}}))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check_a)
        .await
        .expect("A's health check");
    let silent = node_names(&nodes_in(&plane_a).await)[0].clone();
    let (code, body) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{silent}/heartbeats"),
            Some(json!({"enabled": false})),
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
    env.eventually(
        "A's silent Machine replaced, its Node gone from A",
        Duration::from_secs(90),
        async || {
            let machines = names(&machines_of(&env, "wa").await);
            let nodes = node_names(&nodes_in(&plane_a).await);
            (!machines.contains(&silent) && machines.len() == 4 && nodes == machines).then_some(())
        },
    )
    .await;
    assert!(
        writes_by_capstan(&plane_a)
            .iter()
            .any(|(r, n, v)| r == "nodes" && n == &silent && v == "delete"),
        "the remediated Machine's Node was deleted in A by Capstan"
    );
    assert!(
        !writes_by_capstan(&plane_b)
            .iter()
            .any(|(_, n, _)| n == &silent),
        "nothing of A's remediation reached B"
    );

    // Deleting Cluster A drains its Nodes in A (a pod there is evicted)
    // and deletes its deployment, sets, Machines and Nodes before it goes;
    // B is untouched.
    let client_a = plane_a.client().await.unwrap();
    let node = node_names(&nodes_in(&plane_a).await)[0].clone();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.2"}]}}))
    .unwrap();
    Api::<Pod>::namespaced(client_a.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("a pod in A");
    Api::<Cluster>::namespaced(env.client.clone(), NS)
        .delete("wa", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually(
        "Cluster wa gone with its Machines",
        Duration::from_secs(120),
        async || {
            let gone = Api::<Cluster>::namespaced(env.client.clone(), NS)
                .get_opt("wa")
                .await
                .ok()?
                .is_none();
            (gone && machines_of(&env, "wa").await.is_empty()).then_some(())
        },
    )
    .await;
    assert!(
        nodes_in(&plane_a).await.is_empty(),
        "A's Nodes deleted with their Machines"
    );
    let writes_a = writes_by_capstan(&plane_a);
    assert!(
        writes_a
            .iter()
            .any(|(r, n, _)| r == "pods/eviction" && n == "web"),
        "the drain evicted A's pod in A: {writes_a:?}"
    );
    assert!(deployments.get_opt("pool-a").await.unwrap().is_none());
    assert_eq!(machines_of(&env, "wb").await.len(), 4, "B's Machines stay");
    wait_condition(&env, "wb", "Available", "True", Duration::from_secs(10)).await;
    let _ = std::fs::remove_file("/tmp/capstan-exec-ran");
}

fn plane_a_url(plane: &ControlPlane) -> String {
    plane
        .kubeconfig_inline()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
        .expect("a server")
}
