//! Real nodes: the simulated cloud boots each instance as a real node
//! (`capstan_sim_cloud::realnode`): real cloud-init reads the kubeadm
//! bootstrap plugin's cloud-config from a NoCloud seed, real `kubeadm
//! join` discovers the cluster with the Machine's token, and a real
//! kubelet (v1.20.2, built from the control plane's source) joins by TLS
//! bootstrap and runs pods in Debian's containerd. The controllers run as
//! the ServiceAccount `capstan install` generates; the audit log says who
//! created each Node and CSR.

use capstan_api::{MachineBootstrap, MachineDeployment, MachineHealthCheck, Plugin};
use capstan_e2e::env::{
    Env, EnvOptions, REAL_NODE_IGNORED_PREFLIGHT, REAL_NODE_VERSION, SIM_PLUGIN, sample_deployment,
    sim_plugin_spec,
};
use capstan_e2e::install::{controller_config, kubeadm_join_bindings, kubectl_apply};
use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

const KUBEADM: &str = "kubeadm";
const NS: &str = "default";
const CONTROLLER: &str = "system:serviceaccount:capstan-system:capstan-controller";
// Generous: cloud-init, `kubeadm join` and a kubelet start share 2 cores
// with two other tests.
const LONG: Duration = Duration::from_secs(300);

/// An audited environment whose instances are real nodes, the kubeadm
/// bootstrap Plugin, the token group bound to kubeadm's join roles, and
/// the controllers as installed.
pub(crate) async fn real_env() -> Env {
    crate::logs();
    let mut options = EnvOptions::new(Faults {
        delete_latency_ms: 200,
        ..Default::default()
    });
    options.control_plane.audit = true;
    options.real_nodes = true;
    let mut env = Env::start_with(options).await.expect("environment");
    kubectl_apply(&env, &kubeadm_join_bindings());
    let mut spec = sim_plugin_spec(&format!("file://{}", plugin("kubeadm_bootstrap").display()));
    spec.grants = Default::default();
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new(KUBEADM, spec))
        .await
        .expect("create the bootstrap Plugin");
    let config = controller_config(&env).await;
    let options = capstan_controllers::Options {
        secrets_namespace: Some(capstan_e2e::env::CAPSTAN_NAMESPACE.into()),
        ..Default::default()
    };
    env.start_controllers_as(config, capstan_controllers::Providers::default(), options)
        .await;
    env
}

/// A deployment of `replicas` real machines joined by kubeadm.
pub(crate) fn real_deployment(
    env: &Env,
    name: &str,
    replicas: i32,
    extra: Value,
) -> MachineDeployment {
    let mut md = sample_deployment(
        name,
        SIM_PLUGIN,
        &env.cloud.url(),
        replicas,
        REAL_NODE_VERSION,
    );
    let mut config = json!({"ignorePreflightErrors": REAL_NODE_IGNORED_PREFLIGHT});
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    md.spec.template.spec.bootstrap = Some(MachineBootstrap {
        plugin: Some(KUBEADM.into()),
        config: Some(config),
        data_secret_name: None,
    });
    md
}

/// The logs of every real instance, for a failure's output.
pub(crate) fn instance_logs(env: &Env) -> String {
    let Some(real) = env.cloud.real_nodes() else {
        return String::new();
    };
    real.ids().iter().map(|id| real.log_tail(id)).collect()
}

/// Wait until md `name` is rolled out, showing the instances' logs if not.
async fn rolled_out(env: &Env, name: &str) {
    let md = Api::<MachineDeployment>::namespaced(env.client.clone(), NS);
    let done = capstan_e2e::env::poll_until(LONG, async || {
        let d = md.get(name).await.ok()?;
        let machines = env.machines(NS).await;
        let mine = machines
            .iter()
            .filter(|m| {
                m.labels()
                    .get(capstan_api::LABEL_DEPLOYMENT_NAME)
                    .map(String::as_str)
                    == Some(name)
            })
            .count();
        (capstan_controllers::deployment::rolled_out(&d) && mine as i32 == d.spec.replicas)
            .then_some(())
    })
    .await;
    if done.is_none() {
        panic!(
            "md/{name} not rolled out in {LONG:?}\n{}\n{}",
            env.describe(NS).await,
            instance_logs(env)
        );
    }
}

/// The audit log's writes as (verb, resource, subresource, name, user).
fn audited(env: &Env) -> Vec<(String, String, String, String, String)> {
    env.control_plane
        .audit_writes()
        .unwrap()
        .iter()
        .filter(|w| {
            w["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
        })
        .map(|w| {
            let o = &w["objectRef"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                text(&w["verb"]),
                text(&o["resource"]),
                text(&o["subresource"]),
                text(&o["name"]),
                text(&w["user"]["username"]),
            )
        })
        .collect()
}

/// A Deployment of one busybox pod (the local image) that says hello.
fn hello() -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hello", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "hello"}},
            "template": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "hello",
                        "image": capstan_e2e::sim_cloud::realnode::BUSYBOX,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "echo hello from $(hostname); exec sleep 3600"]
                    }]
                }
            }
        }
    }))
    .unwrap()
}

/// What is left of real instances on this machine: their processes (in
/// the cloud's cgroups), cgroups, mounts and directories.
fn leftovers(prefix: &str, dir_marker: &str) -> Vec<String> {
    let mut left = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for entry in std::fs::read_dir(hierarchy.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with(prefix) {
                left.push(format!("cgroup {}", entry.path().display()));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(dir_marker))
            .map(|l| format!("mount {l}")),
    );
    for proc in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cgroup) = std::fs::read_to_string(proc.path().join("cgroup"))
            && cgroup.contains(prefix)
        {
            left.push(format!("process {}", proc.file_name().to_string_lossy()));
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_machines_join_run_pods_roll_and_leave_nothing_behind() {
    let started = std::time::Instant::now();
    let env = real_env().await;
    let real = env.cloud.real_nodes().expect("a cloud of real nodes");
    let deployments = Api::<MachineDeployment>::namespaced(env.client.clone(), NS);
    deployments
        .create(
            &PostParams::default(),
            &real_deployment(&env, "real", 2, json!({})),
        )
        .await
        .unwrap();
    rolled_out(&env, "real").await;
    eprintln!(
        "2 real machines Ready {:.1} s after the environment started",
        started.elapsed().as_secs_f64()
    );

    // Each Node is the Machine's: its name, its instance, created by the
    // certificate Capstan approved for the Machine's token.
    let machines = env.machines(NS).await;
    let writes = audited(&env);
    let csrs = Api::<CertificateSigningRequest>::all(env.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    for m in &machines {
        let name = m.name_any();
        let status = m.status.clone().unwrap();
        let node_ref = status.node_ref.clone().expect("linked");
        assert_eq!(
            node_ref.name, name,
            "the Node is named by its join identity"
        );
        let node = Api::<Node>::all(env.client.clone())
            .get(&name)
            .await
            .unwrap();
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.clone()),
            status.provider_id,
            "{name}"
        );
        let info = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.clone())
            .unwrap();
        assert_eq!(info.kubelet_version, "v1.20.2", "a real kubelet");
        assert!(
            info.container_runtime_version.starts_with("containerd://"),
            "{info:?}"
        );
        let creator = format!("system:node:{name}");
        assert!(
            writes
                .iter()
                .any(|(verb, resource, sub, n, user)| verb == "create"
                    && resource == "nodes"
                    && sub.is_empty()
                    && *n == name
                    && *user == creator),
            "Node {name} created by {creator}"
        );
        let csr = csrs
            .iter()
            .find(|c| {
                c.spec
                    .username
                    .as_deref()
                    .is_some_and(|u| u.starts_with("system:bootstrap:"))
                    && c.status
                        .as_ref()
                        .and_then(|s| s.certificate.as_ref())
                        .is_some()
                    && c.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c.type_ == "Approved"
                                    && c.reason.as_deref() == Some("MachineBootstrapToken")
                                    && c.message.as_deref().is_some_and(|msg| msg.contains(&name))
                            })
                        })
            })
            .unwrap_or_else(|| panic!("a CSR for {name} approved by Capstan: {csrs:?}"));
        let requester = csr.spec.username.clone().unwrap();
        // The requester is this Machine's own token, as rendered into its
        // user data.
        let data = Api::<Secret>::namespaced(env.client.clone(), NS)
            .get(&status.bootstrap_data_secret_name.clone().unwrap())
            .await
            .unwrap();
        let value = data.data.unwrap()["value"].0.clone();
        let token = crate::bootstrap::token_in(&String::from_utf8(value).unwrap());
        let token_id = token.split('.').next().unwrap();
        assert_eq!(requester, format!("system:bootstrap:{token_id}"), "{name}");
        // (A created object's name is not in its audit entry: the CSR's
        // name is generated.)
        assert!(
            writes
                .iter()
                .any(|(verb, resource, _, _, user)| verb == "create"
                    && resource == "certificatesigningrequests"
                    && *user == requester),
            "a CSR created by {requester}"
        );
        assert!(
            writes.iter().any(
                |(verb, _, sub, n, user)| (verb == "update" || verb == "patch")
                    && sub == "approval"
                    && *n == csr.name_any()
                    && user == CONTROLLER
            ),
            "CSR {} approved by Capstan's ServiceAccount",
            csr.name_any()
        );
    }

    // A pod of the local image runs on a real node and answers.
    Api::<Deployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &hello())
        .await
        .unwrap();
    let running = capstan_e2e::env::poll_until(LONG, async || {
        let pods = Api::<Pod>::namespaced(env.client.clone(), NS)
            .list(&ListParams::default().labels("app=hello"))
            .await
            .ok()?;
        pods.items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let Some(pod) = running else {
        let described = env
            .control_plane
            .kubectl(&["describe", "pods", "-n", NS, "-l", "app=hello"], None)
            .unwrap_or_else(|e| e);
        panic!(
            "the hello pod does not run:\n{described}\n{}",
            instance_logs(&env)
        );
    };
    let pod_name = pod.name_any();
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    assert!(machines.iter().any(|m| m.name_any() == node_name));
    let logs = env
        .control_plane
        .kubectl(&["logs", "-n", NS, &pod_name], None)
        .unwrap_or_else(|e| panic!("kubectl logs: {e}\n{}", instance_logs(&env)));
    assert!(logs.contains("hello from hello-"), "{logs}");
    let exec = env
        .control_plane
        .kubectl(
            &["exec", "-n", NS, &pod_name, "--", "cat", "/etc/passwd"],
            None,
        )
        .unwrap_or_else(|e| panic!("kubectl exec: {e}\n{}", instance_logs(&env)));
    assert!(exec.contains("root:x:0:0"), "{exec}");

    // A new bootstrap configuration replaces both machines.
    let before: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    let mut md = deployments.get("real").await.unwrap();
    let config = md
        .spec
        .template
        .spec
        .bootstrap
        .as_mut()
        .unwrap()
        .config
        .as_mut()
        .unwrap();
    config["kubeletExtraArgs"] = json!({"max-pods": "50"});
    deployments
        .replace("real", &PostParams::default(), &md)
        .await
        .unwrap();
    env.eventually("both machines replaced", LONG, async || {
        let now = env.machines(NS).await;
        (now.len() == 2 && now.iter().all(|m| !before.contains(&m.name_any()))).then_some(())
    })
    .await;
    rolled_out(&env, "real").await;
    for m in env.machines(NS).await {
        let node = Api::<Node>::all(env.client.clone())
            .get(&m.name_any())
            .await
            .unwrap();
        let pods = node
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("pods").cloned());
        assert_eq!(
            pods.map(|q| q.0),
            Some("50".to_string()),
            "the new configuration's kubelet"
        );
    }
    for old in &before {
        assert!(
            Api::<Node>::all(env.client.clone())
                .get_opt(old)
                .await
                .unwrap()
                .is_none(),
            "Node {old} deleted with its machine"
        );
    }

    // Deleting the deployment drains and deletes every Node and leaves
    // nothing of any instance on this machine.
    Api::<Deployment>::namespaced(env.client.clone(), NS)
        .delete("hello", &Default::default())
        .await
        .unwrap();
    deployments
        .delete("real", &Default::default())
        .await
        .unwrap();
    env.eventually("the machines are gone", LONG, async || {
        env.machines(NS).await.is_empty().then_some(())
    })
    .await;
    env.eventually("the Nodes are gone", LONG, async || {
        Api::<Node>::all(env.client.clone())
            .list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let prefix = real.cgroup_prefix();
    env.eventually("no instance is left on this machine", LONG, async || {
        (real.ids().is_empty() && leftovers(&prefix, "capstan-realnodes-").is_empty()).then_some(())
    })
    .await;
    eprintln!(
        "real-node lifecycle: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_kubelet_goes_not_ready_is_remediated_and_replaced() {
    let env = real_env().await;
    let real = env.cloud.real_nodes().expect("a cloud of real nodes");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(
            &PostParams::default(),
            &real_deployment(&env, "healed", 1, json!({})),
        )
        .await
        .unwrap();
    rolled_out(&env, "healed").await;
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": "healed", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"capstan.dev/pool": "healed"}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
                {"type": "Ready", "status": "False", "timeoutSeconds": 2}]}
        }
    }))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .unwrap();
    let victim = env.machines(NS).await.remove(0);
    let id = victim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.strip_prefix("sim://"))
        .unwrap()
        .to_string();
    real.signal_kubelet(&id, "STOP").unwrap();
    // The real node-lifecycle controller sees the heartbeats stop.
    env.eventually("the Node goes NotReady", LONG, async || {
        let node = Api::<Node>::all(env.client.clone())
            .get(&victim.name_any())
            .await
            .ok()?;
        node.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "Unknown")
            .then_some(())
    })
    .await;
    env.eventually("the machine is remediated and replaced", LONG, async || {
        let now = env.machines(NS).await;
        now.iter()
            .all(|m| m.name_any() != victim.name_any())
            .then_some(())
    })
    .await;
    rolled_out(&env, "healed").await;
    let replacement = env.machines(NS).await.remove(0);
    assert_eq!(
        replacement.status.unwrap().node_ref.unwrap().name,
        replacement.metadata.name.unwrap(),
        "the replacement joined as its own Node"
    );
    assert!(
        !real.ids().contains(&id),
        "the stopped instance was terminated"
    );
}
