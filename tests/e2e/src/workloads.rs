//! Workloads on the test cluster: small Deployments and DaemonSets that the
//! real scheduler places on the simulated Nodes and the simulated kubelet
//! runs, PodDisruptionBudgets, evictions through the Eviction API, and waits
//! for them to settle. Kubernetes 1.20 serves PodDisruptionBudget and
//! Eviction only as `policy/v1beta1`, which k8s-openapi no longer has, so
//! those two are written as JSON.

use crate::env::poll_until;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// The image of test workloads; never pulled (the kubelet is simulated).
pub const TEST_IMAGE: &str = "registry.k8s.io/pause:3.2";

fn pod_template(labels: &BTreeMap<String, String>, grace_seconds: i64) -> Value {
    json!({
        "metadata": { "labels": labels },
        "spec": {
            "terminationGracePeriodSeconds": grace_seconds,
            "containers": [{
                "name": "app",
                "image": TEST_IMAGE,
                "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
            }],
        },
    })
}

/// A Deployment of `replicas` pods labelled `app: NAME`, whose pods take
/// `grace_seconds` to terminate.
pub fn deployment(namespace: &str, name: &str, replicas: i32, grace_seconds: i64) -> Deployment {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": labels },
            "template": pod_template(&labels, grace_seconds),
        },
    }))
    .expect("a valid Deployment")
}

/// The same Deployment with at most one of its pods per Node (required
/// pod anti-affinity on the hostname), so a test knows which Node holds
/// which pod.
pub fn one_per_node(mut deployment: Deployment) -> Deployment {
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let affinity: k8s_openapi::api::core::v1::Affinity = serde_json::from_value(json!({
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": { "matchLabels": { "app": name } },
                "topologyKey": "kubernetes.io/hostname",
            }],
        },
    }))
    .expect("a valid affinity");
    if let Some(spec) = deployment
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        spec.affinity = Some(affinity);
    }
    deployment
}

/// A DaemonSet labelled `app: NAME` (one pod per schedulable Node).
pub fn daemonset(namespace: &str, name: &str, grace_seconds: i64) -> DaemonSet {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "selector": { "matchLabels": labels },
            "template": pod_template(&labels, grace_seconds),
        },
    }))
    .expect("a valid DaemonSet")
}

/// Create a Deployment or DaemonSet (or any namespaced object).
pub async fn create<K>(client: &Client, object: &K) -> Result<K, String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), object)
        .await
        .map_err(|e| format!("cannot create {:?}: {e}", object.meta().name))
}

/// Whether a Deployment's controller has seen its spec and every replica
/// is updated and available.
pub fn deployment_available(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(s) = &d.status else { return false };
    s.observed_generation >= d.metadata.generation
        && s.updated_replicas.unwrap_or(0) == want
        && s.available_replicas.unwrap_or(0) == want
        && s.replicas.unwrap_or(0) == want
}

/// Whether a DaemonSet has one updated, ready pod on every Node it should run on.
pub fn daemonset_ready(d: &DaemonSet) -> bool {
    let Some(s) = &d.status else { return false };
    s.observed_generation >= d.metadata.generation
        && s.desired_number_scheduled > 0
        && s.number_ready == s.desired_number_scheduled
        && s.updated_number_scheduled.unwrap_or(0) == s.desired_number_scheduled
}

/// Poll an object until `settled` holds; the error shows its last status.
async fn wait_for<K>(
    api: Api<K>,
    name: &str,
    within: Duration,
    what: &str,
    settled: impl Fn(&K) -> bool,
) -> Result<K, String>
where
    K: Clone + std::fmt::Debug + k8s_openapi::serde::de::DeserializeOwned,
{
    let mut last = None;
    poll_until(within, async || {
        let object = api.get(name).await.ok()?;
        let done = settled(&object);
        last = Some(object.clone());
        done.then_some(object)
    })
    .await
    .ok_or_else(|| format!("{name} not {what} in {within:?}; last seen: {last:?}"))
}

/// Wait until a Deployment is available ([`deployment_available`]).
pub async fn wait_deployment_available(
    client: &Client,
    namespace: &str,
    name: &str,
    within: Duration,
) -> Result<Deployment, String> {
    let api = Api::namespaced(client.clone(), namespace);
    wait_for(api, name, within, "available", deployment_available).await
}

/// Wait until a DaemonSet is ready on every Node ([`daemonset_ready`]).
pub async fn wait_daemonset_ready(
    client: &Client,
    namespace: &str,
    name: &str,
    within: Duration,
) -> Result<DaemonSet, String> {
    let api = Api::namespaced(client.clone(), namespace);
    wait_for(api, name, within, "ready on every Node", daemonset_ready).await
}

/// The pods bound to a Node (any namespace).
pub async fn pods_on_node(client: &Client, node: &str) -> Result<Vec<Pod>, String> {
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("cannot list the pods on {node}: {e}"))
}

/// The pods of a namespace whose labels include `app: APP`.
pub async fn pods_of(client: &Client, namespace: &str, app: &str) -> Result<Vec<Pod>, String> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("cannot list the pods of {app}: {e}"))
}

fn pdb_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"),
        "poddisruptionbudgets",
    )
}

/// The PodDisruptionBudget API (`policy/v1beta1`, as 1.20 serves it).
pub fn pdbs(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &pdb_resource())
}

/// Create a PodDisruptionBudget over the pods labelled `app: APP` with
/// `minAvailable` (a number or a percentage such as `"50%"`).
pub async fn create_pdb(
    client: &Client,
    namespace: &str,
    name: &str,
    app: &str,
    min_available: Value,
) -> Result<DynamicObject, String> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy/v1beta1",
        "kind": "PodDisruptionBudget",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "minAvailable": min_available,
            "selector": { "matchLabels": { "app": app } },
        },
    }))
    .map_err(|e| e.to_string())?;
    pdbs(client, namespace)
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("cannot create PodDisruptionBudget {namespace}/{name}: {e}"))
}

/// Delete a PodDisruptionBudget.
pub async fn delete_pdb(client: &Client, namespace: &str, name: &str) -> Result<(), String> {
    pdbs(client, namespace)
        .delete(name, &Default::default())
        .await
        .map(|_| ())
        .map_err(|e| format!("cannot delete PodDisruptionBudget {namespace}/{name}: {e}"))
}

/// Wait until the disruption controller says a PDB allows `allowed`
/// disruptions (it has seen the current pods).
pub async fn wait_pdb_allows(
    client: &Client,
    namespace: &str,
    name: &str,
    allowed: i64,
    within: Duration,
) -> Result<(), String> {
    let api = pdbs(client, namespace);
    let mut last = Value::Null;
    poll_until(within, async || {
        let pdb = api.get(name).await.ok()?;
        last = pdb.data["status"].clone();
        let generation = pdb.metadata.generation.unwrap_or(0);
        (last["observedGeneration"].as_i64() == Some(generation)
            && last["disruptionsAllowed"].as_i64() == Some(allowed))
        .then_some(())
    })
    .await
    .ok_or_else(|| {
        format!("PodDisruptionBudget {namespace}/{name} does not allow {allowed} disruptions in {within:?}; status {last}")
    })
}

/// Why an eviction was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRefused {
    /// HTTP status: 429 when a disruption budget forbids it.
    pub code: u16,
    pub message: String,
}

/// Evict a pod through the Eviction API (`policy/v1beta1`), optionally
/// overriding its grace period, as `kubectl drain` does. `client` must not
/// retry 429s ([`crate::env::Env::client`] does not; kube-rs's default
/// client retries a refused eviction for about five minutes).
pub async fn evict(
    client: &Client,
    namespace: &str,
    pod: &str,
    grace_seconds: Option<i64>,
) -> Result<(), EvictionRefused> {
    let mut body = json!({
        "apiVersion": "policy/v1beta1",
        "kind": "Eviction",
        "metadata": { "name": pod, "namespace": namespace },
    });
    if let Some(g) = grace_seconds {
        body["deleteOptions"] = json!({ "gracePeriodSeconds": g });
    }
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(body.to_string().into_bytes())
    .map_err(|e| EvictionRefused {
        code: 0,
        message: e.to_string(),
    })?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(EvictionRefused {
            code: status.code,
            message: status.message,
        }),
        Err(e) => Err(EvictionRefused {
            code: 0,
            message: e.to_string(),
        }),
    }
}
