//! Draining a Node before its machine's instance goes: cordon it, then
//! evict its pods through the Eviction API so PodDisruptionBudgets are
//! respected, and wait for the evicted pods to be gone; then wait for the
//! Node's volumes to detach. Which pods to evict, in which order, and which
//! to wait for is decided by `capstan_planner::deletion` from the pods, the
//! `cluster.x-k8s.io/drain` pod label and the machine's MachineDrainRules.
//!
//! Evictions go through [`Evictions`], a client of their own that
//! does not retry 429s: kube-rs's default client retries a refused
//! eviction for minutes, which would stall the whole reconcile; here a
//! refusal is reported on the Machine and retried on the next round.

use capstan_api::{DrainBehavior, LABEL_POD_DRAIN, Machine, MachineDrainRule};
use capstan_kit::{Error, Kube, kube_err};
use capstan_planner::deletion::{
    AttachedVolume, PodView, RuleSays, plan_drain, volumes_to_wait_for,
};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, BTreeSet};

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
    machine: &Machine,
    node: &Node,
) -> Result<Round, Error> {
    let name = node.name_any();
    cordon(kube, node).await?;
    // Rounds read the cache; a drain is declared complete only after a
    // list from the API server agrees, so a cache a few events behind can
    // delay a drain by a round but never end it early.
    let mut plan = None;
    for pods in [Pods::Cached, Pods::Listed] {
        let views = match pod_views(kube, machine, node, pods).await? {
            Ok((_, views)) => views,
            // A rule that cannot be used holds the drain, saying what to
            // fix: evicting a pod the rule meant to keep cannot be undone.
            Err(why) => {
                return Ok(Round::Pending {
                    message: format!("draining Node {name}: {why}"),
                    blocked: true,
                });
            }
        };
        let this = plan_drain(&views, unreachable(node));
        let complete = this.complete();
        plan = Some(this);
        if !complete {
            break;
        }
    }
    let plan = plan.expect("planned at least once");
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
    if !plan.wait_completed.is_empty() {
        parts.push(format!(
            "waiting for {} pod(s) to complete ({})",
            plan.wait_completed.len(),
            names(&plan.wait_completed)
        ));
    }
    if !plan.later.is_empty() {
        parts.push(format!(
            "{} pod(s) of later drain orders ({})",
            plan.later.len(),
            names(&plan.later)
        ));
    }
    if waiting > 0 {
        parts.push(format!(
            "waiting for {waiting} evicted pod(s) to terminate{}",
            if plan.wait_for.is_empty() {
                String::new()
            } else {
                format!(" ({})", names(&plan.wait_for))
            }
        ));
    }
    Ok(Round::Pending {
        message: format!("draining Node {name}: {}", parts.join("; ")),
        blocked: !refused.is_empty(),
    })
}

/// Where a drain reads a Node's pods from.
#[derive(Debug, Clone, Copy)]
enum Pods {
    /// The shared cache of scheduled pods: no request.
    Cached,
    /// A list from the API server: a consistent read, newer than any
    /// eviction or deletion it acknowledged.
    Listed,
}

/// The pods on `node`, from `from`.
async fn pods_on(kube: &Kube, node: &str, from: Pods) -> Result<Vec<Pod>, Error> {
    match from {
        Pods::Cached => Ok(kube
            .stores
            .pods
            .state()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|p| Pod::clone(p))
            .collect()),
        Pods::Listed => {
            let pods: Api<Pod> = Api::all(kube.client.clone());
            let list = pods
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await
                .map_err(kube_err(format!("cannot list the pods on Node {node}")))?;
            Ok(list.items)
        }
    }
}

/// The pods on the Node (read from `from`) and how the drain sees each, or
/// why a MachineDrainRule that applies cannot be used.
async fn pod_views(
    kube: &Kube,
    machine: &Machine,
    node: &Node,
    from: Pods,
) -> Result<Result<(Vec<Pod>, Vec<PodView>), String>, Error> {
    let list = pods_on(kube, &node.name_any(), from).await?;
    let rules = if list.is_empty() {
        vec![]
    } else {
        drain_rules(kube, machine).await?
    };
    if let Some(why) = rules.iter().find_map(MachineDrainRule::invalid) {
        return Ok(Err(why));
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let mut views = Vec::with_capacity(list.len());
    for p in &list {
        views.push(PodView {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            daemon_set: daemon_set_alive(kube, p),
            mirror: p.annotations().contains_key("kubernetes.io/config.mirror"),
            deleting_for: p
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| now - t.0.as_second()),
            finished: p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| phase == "Succeeded" || phase == "Failed"),
            drain_label: p.labels().get(LABEL_POD_DRAIN).cloned(),
            rule: rule_for(kube, &rules, p),
        });
    }
    Ok(Ok((list, views)))
}

/// Up to five `namespace/name`s, for a message.
fn names(pods: &[(String, String)]) -> String {
    let mut shown: Vec<String> = pods
        .iter()
        .take(5)
        .map(|(ns, n)| format!("{ns}/{n}"))
        .collect();
    if pods.len() > 5 {
        shown.push("…".into());
    }
    shown.join(", ")
}

/// The MachineDrainRules of the machine's namespace that apply to it,
/// sorted by name (the first applying one decides for a pod).
async fn drain_rules(kube: &Kube, machine: &Machine) -> Result<Vec<MachineDrainRule>, Error> {
    let namespace = machine.namespace().unwrap_or_default();
    // The rules are Capstan's objects: in the management cluster, also
    // when the Node is a workload cluster's.
    let api: Api<MachineDrainRule> = Api::namespaced(kube.home.clone(), &namespace);
    let mut rules: Vec<MachineDrainRule> = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err(format!(
            "cannot list the MachineDrainRules in namespace {namespace}"
        )))?
        .items
        .into_iter()
        .filter(|r| r.applies_to_machine(machine.labels()))
        .collect();
    rules.sort_by_key(ResourceExt::name_any);
    Ok(rules)
}

/// What the first applying rule says about a pod.
fn rule_for(kube: &Kube, rules: &[MachineDrainRule], pod: &Pod) -> Option<RuleSays> {
    let namespace_labels = || {
        kube.stores
            .namespaces
            .get(&kube::runtime::reflector::ObjectRef::new(
                &pod.namespace().unwrap_or_default(),
            ))
            .map(|ns| ns.labels().clone())
            .unwrap_or_default()
    };
    let empty = BTreeMap::new();
    let rule = rules.iter().find(|r| {
        if r.selects_namespaces() {
            r.applies_to_pod(pod.labels(), &namespace_labels())
        } else {
            r.applies_to_pod(pod.labels(), &empty)
        }
    })?;
    Some(match rule.spec.drain.behavior {
        DrainBehavior::Drain => RuleSays::Drain(rule.spec.drain.order.unwrap_or(0)),
        DrainBehavior::Skip => RuleSays::Skip,
        DrainBehavior::WaitCompleted => RuleSays::WaitCompleted,
    })
}

/// Whether the pod is controlled by a DaemonSet that still exists, from
/// the shared cache (no request per pod per round). The uid must match:
/// a pod whose DaemonSet was deleted and another made under its name is an
/// orphan, never replaced, so it is drained like any pod.
fn daemon_set_alive(kube: &Kube, pod: &Pod) -> bool {
    let Some(owner) = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    else {
        return false;
    };
    let namespace = pod.namespace().unwrap_or_default();
    kube.stores
        .daemon_sets
        .get(&ObjectRef::new(&owner.name).within(&namespace))
        .is_some_and(|ds| ds.uid().as_deref() == Some(owner.uid.as_str()))
}

/// The volumes the deletion still waits for: those attached to the Node
/// (its `status.volumesAttached` and the VolumeAttachments attached to
/// it), except the volumes of pods the drain left on the Node, which will
/// not detach before the instance goes. An unreachable Node's volumes are
/// not waited for: no kubelet will unmount them (Cluster API's rules).
pub(crate) async fn attached_volumes(
    kube: &Kube,
    machine: &Machine,
    node: &Node,
) -> Result<Vec<String>, Error> {
    if unreachable(node) {
        return Ok(vec![]);
    }
    let name = node.name_any();
    let from_status: Vec<String> = node
        .status
        .as_ref()
        .and_then(|s| s.volumes_attached.as_ref())
        .into_iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    // From the controller's cache, not a list per deleting machine per
    // pass (at fleet scale, every attachment in the cluster read N times a
    // round). A cache a moment behind can only still show an attachment
    // that is going, so it errs on the side of waiting.
    let from_attachments: Vec<String> = kube
        .stores
        .volume_attachments
        .state()
        .iter()
        .filter(|va| va.spec.node_name == name && va.status.as_ref().is_some_and(|s| s.attached))
        .map(|va| {
            let pv = va.spec.source.persistent_volume_name.clone();
            pv.unwrap_or_else(|| va.name_any())
        })
        .collect();
    if from_status.is_empty() && from_attachments.is_empty() {
        return Ok(vec![]);
    }
    let skipped = skipped_claims(kube, machine, node).await?;
    let claims = if skipped.is_empty() {
        BTreeMap::new()
    } else {
        volume_claims(kube).await?
    };
    let attached: Vec<AttachedVolume> = from_status
        .into_iter()
        .chain(from_attachments)
        .map(|name| AttachedVolume {
            claim: claims.get(&name).cloned(),
            name,
        })
        .collect();
    Ok(volumes_to_wait_for(&attached, &skipped))
}

/// The claims (`namespace/name`) of the pods the drain leaves on the Node.
async fn skipped_claims(
    kube: &Kube,
    machine: &Machine,
    node: &Node,
) -> Result<BTreeSet<String>, Error> {
    let Ok((pods, views)) = pod_views(kube, machine, node, Pods::Cached).await? else {
        return Ok(BTreeSet::new());
    };
    let plan = plan_drain(&views, false);
    let left: BTreeSet<(&str, &str)> = plan
        .skipped
        .iter()
        .map(|(ns, name, _)| (ns.as_str(), name.as_str()))
        .collect();
    let mut claims = BTreeSet::new();
    for pod in &pods {
        let namespace = pod.namespace().unwrap_or_default();
        if !left.contains(&(namespace.as_str(), pod.name_any().as_str())) {
            continue;
        }
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for claim in volumes
            .into_iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
        {
            claims.insert(format!("{namespace}/{}", claim.claim_name));
        }
    }
    Ok(claims)
}

/// The claim of every bound PersistentVolume, under each name an attached
/// volume goes by: the PersistentVolume's own (VolumeAttachments), and
/// `kubernetes.io/csi/DRIVER^HANDLE` (a Node's `volumesAttached`).
async fn volume_claims(kube: &Kube) -> Result<BTreeMap<String, String>, Error> {
    let api: Api<PersistentVolume> = Api::all(kube.client.clone());
    let mut claims = BTreeMap::new();
    for pv in api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("cannot list PersistentVolumes"))?
        .items
    {
        let spec = pv.spec.clone().unwrap_or_default();
        let Some(claim) = spec.claim_ref.as_ref() else {
            continue;
        };
        let claim = format!(
            "{}/{}",
            claim.namespace.clone().unwrap_or_default(),
            claim.name.clone().unwrap_or_default()
        );
        if let Some(csi) = &spec.csi {
            let unique = format!("kubernetes.io/csi/{}^{}", csi.driver, csi.volume_handle);
            claims.insert(unique, claim.clone());
        }
        claims.insert(pv.name_any(), claim);
    }
    Ok(claims)
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
    let patch = serde_json::json!({ "spec": { "unschedulable": true } });
    patch_node(kube, node, &patch, "cordon", "cannot cordon").await?;
    Ok(())
}

/// Merge-patch a Node for the Machine controller (`what` names the write
/// in metrics; `failing` opens the error). A Node already gone is fine.
/// Returns the Node as written, `None` when it is gone.
pub(crate) async fn patch_node(
    kube: &Kube,
    node: &Node,
    patch: &serde_json::Value,
    what: &'static str,
    failing: &str,
) -> Result<Option<Node>, Error> {
    let api: Api<Node> = Api::all(kube.client.clone());
    let name = node.name_any();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(written) => {
            kube.metrics.wrote("machine", what);
            Ok(Some(written))
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(kube_err(format!("{failing} Node {name}"))(e)),
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
