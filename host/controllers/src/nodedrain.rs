//! Draining a Node before its machine's instance goes: cordon it, then
//! evict its pods through the Eviction API so PodDisruptionBudgets are
//! respected, and wait for the evicted pods to be gone. Which pods to evict
//! and which to wait for is decided by `capstan_planner::deletion`.
//!
//! Evictions go through [`Evictions`], a client of their own that
//! does not retry 429s: kube-rs's default client retries a refused
//! eviction for minutes, which would stall the whole reconcile; here a
//! refusal is reported on the Machine and retried on the next round.

use capstan_kit::{Error, Kube, kube_err};
use capstan_planner::deletion::{PodView, plan_drain};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};

/// The Eviction API as the drain uses it: a client without kube-rs's
/// retries of 429 (a PodDisruptionBudget's refusal must come back at once)
/// and the Eviction version the server takes, once known.
pub(crate) struct Evictions {
    client: kube::Client,
    version: std::sync::OnceLock<&'static str>,
}

impl std::fmt::Debug for Evictions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evictions")
            .field("version", &self.version.get())
            .finish_non_exhaustive()
    }
}

impl Evictions {
    /// Evictions through `client` (one that does not retry 429s).
    pub(crate) fn new(client: kube::Client) -> Self {
        Evictions {
            client,
            version: std::sync::OnceLock::new(),
        }
    }
}

/// The outcome of one drain round.
#[derive(Debug)]
pub(crate) enum Round {
    /// No pod left to evict or wait for.
    Complete,
    /// Still draining: what is evicted, awaited or refused, for the
    /// Machine's `Deleting` condition; `blocked` when an eviction was refused.
    Pending {
        /// For humans.
        message: String,
        /// An eviction was refused (back off longer).
        blocked: bool,
    },
}

/// One round: cordon, list the Node's pods, evict what the plan says.
pub(crate) async fn drain_round(
    kube: &Kube,
    evictions: &Evictions,
    node: &Node,
) -> Result<Round, Error> {
    let name = node.name_any();
    cordon(kube, node).await?;
    let pods: Api<Pod> = Api::all(kube.client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
        .await
        .map_err(kube_err(format!("cannot list the pods on Node {name}")))?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let views: Vec<PodView> = list
        .items
        .iter()
        .map(|p| PodView {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            daemon_set: p
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.kind == "DaemonSet"),
            mirror: p.annotations().contains_key("kubernetes.io/config.mirror"),
            deleting_for: p
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| now - t.0.as_second()),
        })
        .collect();
    let plan = plan_drain(&views, unreachable(node));
    if plan.complete() {
        return Ok(Round::Complete);
    }
    let mut refused = vec![];
    let mut evicted = 0;
    for (namespace, pod) in &plan.evict {
        match evict(kube, evictions, namespace, pod).await {
            Ok(()) => {
                evicted += 1;
                kube.metrics.wrote("machine", "evict");
            }
            Err(why) => refused.push(format!("{namespace}/{pod}: {why}")),
        }
    }
    let mut parts = vec![];
    if !refused.is_empty() {
        parts.push(format!(
            "cannot evict {} pod(s): {}",
            refused.len(),
            refused.join("; ")
        ));
    }
    let waiting = plan.wait_for.len() + evicted;
    if waiting > 0 {
        let mut names: Vec<String> = plan
            .wait_for
            .iter()
            .map(|(ns, n)| format!("{ns}/{n}"))
            .collect();
        names.truncate(5);
        parts.push(format!(
            "waiting for {waiting} evicted pod(s) to terminate{}",
            if names.is_empty() {
                String::new()
            } else {
                format!(" ({})", names.join(", "))
            }
        ));
    }
    Ok(Round::Pending {
        message: format!("draining Node {name}: {}", parts.join("; ")),
        blocked: !refused.is_empty(),
    })
}

/// Whether the node-lifecycle controller lost contact with the Node.
fn unreachable(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "Unknown")
}

async fn cordon(kube: &Kube, node: &Node) -> Result<(), Error> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Ok(());
    }
    let api: Api<Node> = Api::all(kube.client.clone());
    let patch = serde_json::json!({ "spec": { "unschedulable": true } });
    match api
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            kube.metrics.wrote("machine", "cordon");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("cannot cordon Node {}", node.name_any()))(
            e,
        )),
    }
}

/// Evict one pod; the error is the API server's reason, with the causes it
/// gives (for a PodDisruptionBudget: which budget, how many pods it needs).
async fn evict(
    kube: &Kube,
    evictions: &Evictions,
    namespace: &str,
    pod: &str,
) -> Result<(), String> {
    let version = eviction_version(kube, evictions).await;
    let body = serde_json::json!({
        "apiVersion": version,
        "kind": "Eviction",
        "metadata": { "name": pod, "namespace": namespace },
    });
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(body.to_string().into_bytes())
    .map_err(|e| e.to_string())?;
    let response = evictions
        .client
        .send(request.map(kube::client::Body::from))
        .await
        .map_err(|e| e.to_string())?;
    let code = response.status();
    if code.is_success() || code == http::StatusCode::NOT_FOUND {
        return Ok(());
    }
    let bytes = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let status: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let mut why = status["message"]
        .as_str()
        .map_or_else(|| format!("HTTP {code}"), str::to_string);
    let causes: Vec<&str> = status["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["message"].as_str())
        .collect();
    if !causes.is_empty() {
        why = format!("{why} {}", causes.join("; "));
    }
    Err(why)
}

/// The Eviction version the API server takes, from the `pods/eviction`
/// subresource it lists (`policy/v1` since Kubernetes 1.22,
/// `policy/v1beta1` before); asked once.
async fn eviction_version(kube: &Kube, evictions: &Evictions) -> &'static str {
    if let Some(v) = evictions.version.get() {
        return v;
    }
    let v1 = kube
        .client
        .list_core_api_resources("v1")
        .await
        .is_ok_and(|list| {
            list.resources
                .iter()
                .any(|r| r.name == "pods/eviction" && r.version.as_deref() == Some("v1"))
        });
    let version = if v1 { "policy/v1" } else { "policy/v1beta1" };
    let _ = evictions.version.set(version);
    version
}
