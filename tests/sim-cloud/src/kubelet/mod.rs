//! The simulated kubelet: one process-wide agent that acts as the kubelet of
//! every Node the simulated cloud registers, the way KWOK does for
//! Kubernetes' own scale tests.
//!
//! For each Node it
//! - registers it once its instance has booted (`spec.providerID`, labels,
//!   capacity, addresses, healthy conditions) and deletes it with the
//!   instance;
//! - heartbeats: renews the Node's `Lease` in `kube-node-lease` and corrects
//!   the Node's conditions when they differ from what it reports (after the
//!   node-lifecycle controller set `Ready=Unknown`, say), at
//!   [`KubeletConfig::heartbeat_interval_ms`] (0 turns heartbeats off, for
//!   scale runs), and re-posts status every
//!   [`KubeletConfig::status_report_interval_ms`] like a kubelet;
//! - runs the pods bound to it: `Running` with an IP, conditions and
//!   container statuses after [`KubeletConfig::pod_start_delay_ms`], and
//!   removes a pod under graceful deletion once its containers exited:
//!   [`KubeletConfig::pod_stop_delay_ms`] after the deletion, as processes
//!   do on SIGTERM, or when the grace period ends if that comes first, so
//!   evictions complete.
//!
//! A Node joins in one of two ways. An instance launched with user data
//! boots from it as a real one would ([`Kubelet::join`], see [`join`]):
//! kubeadm's token discovery, then TLS bootstrapping, and every write for
//! that Node (the Node, its Lease and status, its pods' status and
//! removal) is made with the Node's own client certificate. Without user
//! data an instance never joins, unless
//! [`KubeletConfig::shared_identity_without_join_data`] lets the kubelet
//! register it with its own (admin) credential, for runs that are not
//! about joining (and scale runs beyond what per-Node TLS connections
//! allow in one process). Reads (the watch of bound pods) are shared.
//!
//! Fault switches ([`Kubelet::set_heartbeats`], [`Kubelet::set_condition`],
//! [`Kubelet::set_pod_ready`]) stop one Node's kubelet, bend its conditions
//! for a time, or fail a pod's readiness; the cloud's admin API exposes them.
//!
//! What to say is decided by the pure [`node`] and [`pod`] modules; this
//! module holds the state and does the I/O (kube-rs, with watches of the
//! simulated Nodes and of bound pods).

pub mod join;
pub mod node;
pub mod pod;

pub use node::{ConditionOverride, NodeSpec};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use pod::PodStep;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Where and how to reach the Kubernetes API.
#[derive(Clone)]
pub struct KubeTarget {
    /// For example `https://127.0.0.1:6443`.
    pub url: String,
    /// Bearer token allowed to manage Nodes, Leases and pods' status.
    pub token: String,
    /// PEM of the CA that signed the API server's certificate (may be a chain).
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTarget")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// How the simulated kubelet behaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// How often each Node's Lease is renewed and its conditions checked
    /// against what the kubelet reports; 0 turns heartbeats off (no Lease;
    /// status only on registration and fault switches), for scale runs.
    /// A real kubelet renews every 10 s.
    pub heartbeat_interval_ms: u64,
    /// Status is re-posted at least this often even when unchanged (the
    /// kubelet's `nodeStatusReportFrequency`, 5 minutes).
    pub status_report_interval_ms: u64,
    /// Time from a pod being bound to the Node to it running.
    pub pod_start_delay_ms: u64,
    /// Time a pod's containers take to exit once told to stop (a graceful
    /// deletion); the grace period is the upper bound. `u64::MAX`: every
    /// pod holds its whole grace period.
    pub pod_stop_delay_ms: u64,
    /// An instance launched without user data is registered with the
    /// kubelet's own credential (a shared identity) instead of never
    /// joining, as a real one would not. For runs that are not about
    /// joining.
    pub shared_identity_without_join_data: bool,
    /// How long an instance tries to join (token discovery and TLS
    /// bootstrapping) before it gives up, as `kubeadm join`'s discovery
    /// timeout.
    pub join_timeout_ms: u64,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            heartbeat_interval_ms: 10_000,
            status_report_interval_ms: 300_000,
            pod_start_delay_ms: 500,
            pod_stop_delay_ms: 1_000,
            shared_identity_without_join_data: false,
            join_timeout_ms: 120_000,
        }
    }
}

/// Counters, part of the cloud's `GET /admin/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletStats {
    pub nodes_registered: u64,
    pub nodes_deleted: u64,
    pub lease_renewals: u64,
    pub node_status_posts: u64,
    pub pods_started: u64,
    pub pods_removed: u64,
    pub pod_readiness_changes: u64,
    /// Nodes that joined with their own identity (token discovery and TLS
    /// bootstrapping).
    pub nodes_joined: u64,
    /// Instances that tried to join and gave up.
    pub join_failures: u64,
    /// Failed Kubernetes calls (details in the log).
    pub errors: u64,
}

/// How an instance's join went, for the cloud's admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinReport {
    /// The instance's provider ID.
    pub provider_id: String,
    /// `joining`, `joined`, `failed` or `no-join-data`.
    pub state: String,
    /// The Node name it registers under, once known.
    pub node: Option<String>,
    /// Why it failed or did not try.
    pub message: Option<String>,
}

/// What the admin API shows of one Node's kubelet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    pub provider_id: String,
    pub heartbeats: bool,
    pub overrides: Vec<ConditionOverride>,
}

/// Why a fault switch was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchError {
    /// No Node of that name is registered by this kubelet.
    UnknownNode(String),
    /// The request itself is wrong (which field, why).
    Invalid(String),
    /// The API server refused the resulting status.
    Kubernetes(String),
}

impl std::fmt::Display for SwitchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SwitchError::UnknownNode(n) => write!(
                f,
                "no simulated Node named {n:?} is registered (GET /admin/nodes lists them)"
            ),
            SwitchError::Invalid(why) => f.write_str(why),
            SwitchError::Kubernetes(why) => write!(f, "the API server refused: {why}"),
        }
    }
}

/// An HTTPS client that trusts every certificate in `pem` (which may be a
/// chain, as a self-signed API server's certificate file is) and returns
/// error statuses as responses.
pub fn agent_trusting(pem: &[u8]) -> Result<ureq::Agent, String> {
    let certs = certificates(pem);
    if certs.is_empty() {
        return Err("the CA file holds no PEM certificate".into());
    }
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .build()
        .into())
}

fn certificates(pem: &[u8]) -> Vec<ureq::tls::Certificate<'static>> {
    ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect()
}

/// A kube-rs client for `target`.
pub fn client_for(target: &KubeTarget) -> Result<Client, String> {
    let roots: Vec<Vec<u8>> = certificates(&target.ca_pem)
        .iter()
        .map(|c| c.der().to_vec())
        .collect();
    if roots.is_empty() {
        return Err("the Kubernetes CA holds no PEM certificate".into());
    }
    let url = target
        .url
        .parse()
        .map_err(|e| format!("bad Kubernetes URL {:?}: {e}", target.url))?;
    let mut config = kube::Config::new(url);
    config.root_cert = Some(roots);
    config.auth_info.token = Some(target.token.clone().into());
    Client::try_from(config).map_err(|e| format!("cannot build a Kubernetes client: {e}"))
}

/// The Node name for an instance id (`i-000001` → `sim-i-000001`).
pub fn node_name(instance_id: &str) -> String {
    format!("sim-{instance_id}")
}

/// The kubelet's view of one of its Nodes.
struct NodeState {
    spec: NodeSpec,
    /// The Node's own identity (joined by TLS bootstrapping); `None`: the
    /// kubelet's shared credential.
    client: Option<Client>,
    uid: Option<String>,
    /// False while this Node's kubelet is stopped (fault switch).
    heartbeats: bool,
    overrides: Vec<(ConditionOverride, Option<Instant>)>,
    /// Conditions changed by a switch or an expiry: post at the next tick.
    dirty: bool,
    last_status_post: Instant,
}

impl std::fmt::Debug for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeState")
            .field("spec", &self.spec)
            .field("own_identity", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl NodeState {
    fn report(&self) -> NodeReport {
        NodeReport {
            name: self.spec.name.clone(),
            provider_id: self.spec.provider_id.clone(),
            heartbeats: self.heartbeats,
            overrides: self.overrides.iter().map(|(o, _)| o.clone()).collect(),
        }
    }
}

struct Inner {
    client: Client,
    config: KubeletConfig,
    /// Where pod removals are recorded for tests that assert an order.
    timeline: crate::Timeline,
    nodes: Mutex<BTreeMap<String, NodeState>>,
    /// Pods (namespace, name) told to fail readiness.
    unready_pods: Mutex<BTreeSet<(String, String)>>,
    /// Pods with a container image containing one of these fail readiness.
    unready_images: Mutex<BTreeSet<String>>,
    /// Pods (uid) with a step under way, so a step is never run twice at once.
    busy: Mutex<HashSet<String>>,
    /// Pods (uid) this kubelet started: a stale cache never starts one twice.
    started: Mutex<HashSet<String>>,
    /// What its watches see; replaced when it restarts.
    caches: RwLock<Caches>,
    stats: Mutex<KubeletStats>,
    next_pod_ip: AtomicU32,
    /// Joins by provider ID.
    joins: Mutex<BTreeMap<String, JoinReport>>,
}

/// The kubelet's watch caches.
#[derive(Clone)]
struct Caches {
    nodes: Store<Node>,
    pods: Store<Pod>,
}

impl Inner {
    fn node_cache(&self) -> Store<Node> {
        self.caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .nodes
            .clone()
    }

    fn pod_cache(&self) -> Store<Pod> {
        self.caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pods
            .clone()
    }
}

/// Aborts the kubelet's background tasks when the last handle goes.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A running simulated kubelet; clones share it, and dropping the last one
/// stops its watches and heartbeats.
#[derive(Clone)]
pub struct Kubelet {
    inner: Arc<Inner>,
    /// The Node and pod watches ([`Kubelet::restart`] replaces them).
    watches: Arc<Mutex<Tasks>>,
    _heartbeats: Arc<Tasks>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every mutation under these locks is one step: a poisoned lock still
    // holds consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// 404 and 409 mean "already gone" / "already there" for the kubelet.
fn is_code(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

impl Kubelet {
    /// Connect to `target` and start watching simulated Nodes and bound pods,
    /// and heartbeating (on the current tokio runtime).
    pub async fn start(
        target: KubeTarget,
        config: KubeletConfig,
        timeline: crate::Timeline,
    ) -> Result<Kubelet, String> {
        let client = client_for(&target)?;
        let (nodes, _) = reflector::store();
        let (pods, _) = reflector::store();
        let inner = Arc::new(Inner {
            client,
            config,
            timeline,
            nodes: Mutex::new(BTreeMap::new()),
            unready_pods: Mutex::new(BTreeSet::new()),
            unready_images: Mutex::new(BTreeSet::new()),
            busy: Mutex::new(HashSet::new()),
            started: Mutex::new(HashSet::new()),
            caches: RwLock::new(Caches { nodes, pods }),
            stats: Mutex::new(KubeletStats::default()),
            next_pod_ip: AtomicU32::new(1),
            joins: Mutex::new(BTreeMap::new()),
        });
        let watches = Tasks(watch(&inner));
        let heartbeats = Tasks(vec![tokio::spawn(heartbeat_loop(inner.clone()))]);
        Ok(Kubelet {
            inner,
            watches: Arc::new(Mutex::new(watches)),
            _heartbeats: Arc::new(heartbeats),
        })
    }

    /// Restart the kubelet on every instance, as `systemctl restart
    /// kubelet` would after the control plane was restored from a backup:
    /// new watches (a fresh API server's resource versions start over, so
    /// the old watches would wait for versions that never come), and each
    /// Node registers again with the credentials it holds. A Node lost
    /// with the API server's data is created anew; one that exists gets
    /// fresh status. Fault switches are cleared. Returns how many Nodes
    /// registered.
    pub async fn restart(&self) -> Result<usize, String> {
        let new = Tasks(watch(&self.inner));
        // The old watches are aborted when their handles are dropped.
        drop(std::mem::replace(&mut *lock(&self.watches), new));
        let nodes: Vec<(NodeSpec, Option<Client>)> = lock(&self.inner.nodes)
            .values()
            .map(|s| (s.spec.clone(), s.client.clone()))
            .collect();
        let count = nodes.len();
        for (spec, client) in nodes {
            self.register_as(spec, client).await?;
        }
        Ok(count)
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &KubeletConfig {
        &self.inner.config
    }

    /// Boot an instance from its user data as a real one would: read the
    /// kubeadm `JoinConfiguration`, discover the cluster with the token,
    /// TLS-bootstrap the Node's own certificate and register with it. The
    /// outcome is kept for [`Kubelet::joins`]; a failed join registers
    /// nothing.
    pub async fn join(&self, mut spec: NodeSpec, format: &str, data: &[u8]) -> Result<(), String> {
        let provider_id = spec.provider_id.clone();
        let report = |state: &str, node: Option<String>, message: Option<String>| JoinReport {
            provider_id: provider_id.clone(),
            state: state.into(),
            node,
            message,
        };
        lock(&self.inner.joins).insert(provider_id.clone(), report("joining", None, None));
        let result = async {
            let config = join::join_configuration(format, data)?;
            spec.name = config.node_name.clone();
            spec.hostname = config.node_name.clone();
            spec.labels = config.node_labels.clone();
            spec.taints = config.taints.clone();
            let timeout = Duration::from_millis(self.inner.config.join_timeout_ms);
            let client = join::bootstrap(&config, timeout).await?;
            self.register_as(spec.clone(), Some(client)).await
        }
        .await;
        let done = match &result {
            Ok(()) => {
                lock(&self.inner.stats).nodes_joined += 1;
                report("joined", Some(spec.name.clone()), None)
            }
            Err(e) => {
                lock(&self.inner.stats).join_failures += 1;
                tracing::warn!(instance = %provider_id, error = %e, "simulated instance did not join");
                report(
                    "failed",
                    Some(spec.name.clone()).filter(|n| !n.is_empty()),
                    Some(e.clone()),
                )
            }
        };
        lock(&self.inner.joins).insert(provider_id, done);
        result
    }

    /// Record that an instance booted without join data and will never
    /// register (what a real instance does).
    pub fn no_join_data(&self, provider_id: &str) {
        lock(&self.inner.joins).insert(
            provider_id.to_string(),
            JoinReport {
                provider_id: provider_id.to_string(),
                state: "no-join-data".into(),
                node: None,
                message: Some(
                    "the instance was launched without user data, so nothing makes it join: give its Machine spec.bootstrap".into(),
                ),
            },
        );
    }

    /// How each instance's join went (by provider ID).
    pub fn joins(&self) -> Vec<JoinReport> {
        lock(&self.inner.joins).values().cloned().collect()
    }

    /// The Node an instance registered as, if it did.
    pub fn node_of(&self, provider_id: &str) -> Option<String> {
        lock(&self.inner.nodes)
            .values()
            .find(|s| s.spec.provider_id == provider_id)
            .map(|s| s.spec.name.clone())
    }

    /// Create the Node (or take over the existing one) with healthy status,
    /// and its Lease when heartbeats are on, with the kubelet's own (shared)
    /// credential.
    pub async fn register(&self, spec: NodeSpec) -> Result<(), String> {
        self.register_as(spec, None).await
    }

    async fn register_as(&self, spec: NodeSpec, client: Option<Client>) -> Result<(), String> {
        let inner = &self.inner;
        let name = spec.name.clone();
        let conditions = node::desired_conditions(&[], None, Timestamp::now(), Instant::now());
        let object: Node = serde_json::from_value(node::node_object(&spec, &conditions))
            .map_err(|e| format!("node object: {e}"))?;
        let api: Api<Node> = Api::all(client.clone().unwrap_or_else(|| inner.client.clone()));
        lock(&inner.nodes).insert(
            name.clone(),
            NodeState {
                spec,
                client,
                uid: None,
                heartbeats: true,
                overrides: Vec::new(),
                dirty: false,
                last_status_post: Instant::now(),
            },
        );
        let uid = match api.create(&PostParams::default(), &object).await {
            Ok(n) => n.metadata.uid,
            Err(e) if is_code(&e, &[409]) => {
                // Registered before (a restarted cloud): report fresh status.
                inner.post_status(&name).await?;
                api.get(&name).await.ok().and_then(|n| n.metadata.uid)
            }
            Err(e) => {
                // Not registered: nothing to heartbeat or to run pods on.
                lock(&inner.nodes).remove(&name);
                return Err(inner.failed(format!("register Node {name}: {e}")));
            }
        };
        if let Some(state) = lock(&inner.nodes).get_mut(&name) {
            state.uid = uid;
        }
        lock(&inner.stats).nodes_registered += 1;
        if inner.config.heartbeat_interval_ms > 0 {
            inner.renew_lease(&name).await?;
        }
        Ok(())
    }

    /// Delete the Node (its Lease goes with it, by owner reference); a
    /// missing Node is fine.
    pub async fn unregister(&self, name: &str) -> Result<(), String> {
        lock(&self.inner.nodes).remove(name);
        let api: Api<Node> = Api::all(self.inner.client.clone());
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_code(&e, &[404]) => {}
            Err(e) => return Err(self.inner.failed(format!("delete Node {name}: {e}"))),
        }
        lock(&self.inner.stats).nodes_deleted += 1;
        Ok(())
    }

    /// Stop (`false`) or restart (`true`) one Node's kubelet: while stopped
    /// it renews no Lease, posts no status and does nothing to pods, so the
    /// node-lifecycle controller marks the Node `Ready=Unknown`.
    pub fn set_heartbeats(&self, node: &str, on: bool) -> Result<(), SwitchError> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let state = nodes
                .get_mut(node)
                .ok_or_else(|| SwitchError::UnknownNode(node.to_string()))?;
            state.heartbeats = on;
            // Back up: correct what the lifecycle controller wrote meanwhile.
            state.dirty |= on;
        }
        if on {
            self.inner.resync_pods();
        }
        Ok(())
    }

    /// Force a condition on a Node (for `seconds`, or until cleared) and
    /// post the Node's status at once.
    pub async fn set_condition(
        &self,
        node: &str,
        condition: ConditionOverride,
    ) -> Result<(), SwitchError> {
        condition.validate().map_err(SwitchError::Invalid)?;
        {
            let mut nodes = lock(&self.inner.nodes);
            let state = nodes
                .get_mut(node)
                .ok_or_else(|| SwitchError::UnknownNode(node.to_string()))?;
            let until = condition
                .seconds
                .map(|s| Instant::now() + Duration::from_secs(s));
            state.overrides.retain(|(o, _)| o.type_ != condition.type_);
            state.overrides.push((condition, until));
        }
        self.inner
            .post_status(node)
            .await
            .map_err(SwitchError::Kubernetes)
    }

    /// Drop a forced condition (the kubelet reports its own again).
    pub async fn clear_condition(&self, node: &str, type_: &str) -> Result<(), SwitchError> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let state = nodes
                .get_mut(node)
                .ok_or_else(|| SwitchError::UnknownNode(node.to_string()))?;
            state.overrides.retain(|(o, _)| o.type_ != type_);
        }
        self.inner
            .post_status(node)
            .await
            .map_err(SwitchError::Kubernetes)
    }

    /// Make a pod fail (`false`) or pass (`true`) its readiness; applies to
    /// a pod that starts later too. `*` names every pod of the namespace.
    pub fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) {
        let key = (namespace.to_string(), name.to_string());
        {
            let mut unready = lock(&self.inner.unready_pods);
            if ready {
                unready.remove(&key);
            } else {
                unready.insert(key);
            }
        }
        for pod in self.inner.pod_cache().state() {
            if pod.namespace().as_deref() == Some(namespace)
                && (name == "*" || pod.name_any() == name)
            {
                self.inner.consider(&pod);
            }
        }
    }

    /// Make every pod with a container image containing `image` fail
    /// (`false`) or pass (`true`) its readiness (a broken release of an
    /// image, say).
    pub fn set_image_ready(&self, image: &str, ready: bool) {
        {
            let mut unready = lock(&self.inner.unready_images);
            if ready {
                unready.remove(image);
            } else {
                unready.insert(image.to_string());
            }
        }
        for pod in self.inner.pod_cache().state() {
            self.inner.consider(&pod);
        }
    }

    /// The Nodes this kubelet runs and their fault switches.
    pub fn nodes(&self) -> Vec<NodeReport> {
        lock(&self.inner.nodes)
            .values()
            .map(NodeState::report)
            .collect()
    }

    /// Current counters.
    pub fn stats(&self) -> KubeletStats {
        lock(&self.inner.stats).clone()
    }
}

impl Inner {
    /// The client a Node's writes go through: its own identity when it
    /// joined, else the kubelet's shared one.
    fn node_client(&self, node: &str) -> Client {
        lock(&self.nodes)
            .get(node)
            .and_then(|s| s.client.clone())
            .unwrap_or_else(|| self.client.clone())
    }

    fn failed(&self, message: String) -> String {
        lock(&self.stats).errors += 1;
        tracing::warn!(error = %message, "simulated kubelet call failed");
        message
    }

    /// Post the conditions the kubelet reports now.
    async fn post_status(&self, name: &str) -> Result<(), String> {
        let conditions = {
            let nodes = lock(&self.nodes);
            let Some(state) = nodes.get(name) else {
                return Ok(());
            };
            let observed = self.node_cache().get(&ObjectRef::new(name));
            node::desired_conditions(
                &state.overrides,
                observed.as_deref(),
                Timestamp::now(),
                Instant::now(),
            )
        };
        let api: Api<Node> = Api::all(self.node_client(name));
        let patch = json!({ "status": { "conditions": conditions } });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_code(&e, &[404]) => return Ok(()),
            Err(e) => return Err(self.failed(format!("post status of Node {name}: {e}"))),
        }
        if let Some(state) = lock(&self.nodes).get_mut(name) {
            state.last_status_post = Instant::now();
            state.dirty = false;
        }
        lock(&self.stats).node_status_posts += 1;
        Ok(())
    }

    /// Renew the Node's Lease, creating it when missing.
    async fn renew_lease(&self, name: &str) -> Result<(), String> {
        let api: Api<Lease> = Api::namespaced(self.node_client(name), "kube-node-lease");
        let now = Timestamp::now();
        let patch = json!({ "spec": { "holderIdentity": name, "renewTime": MicroTime(now) } });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_code(&e, &[404]) => {
                let Some(uid) = lock(&self.nodes).get(name).and_then(|s| s.uid.clone()) else {
                    return Ok(());
                };
                let heartbeat = Duration::from_millis(self.config.heartbeat_interval_ms);
                let lease: Lease =
                    serde_json::from_value(node::lease_object(name, &uid, heartbeat, now))
                        .map_err(|e| format!("lease object: {e}"))?;
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => {}
                    Err(e) if is_code(&e, &[409]) => {}
                    Err(e) => return Err(self.failed(format!("create Lease {name}: {e}"))),
                }
            }
            Err(e) => return Err(self.failed(format!("renew Lease {name}: {e}"))),
        }
        lock(&self.stats).lease_renewals += 1;
        Ok(())
    }

    /// Run the next step for a pod bound to one of this kubelet's Nodes.
    fn consider(self: &Arc<Self>, pod: &Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let Some((up, host_ip)) = lock(&self.nodes)
            .get(&node)
            .map(|s| (s.heartbeats, s.spec.internal_ip.clone()))
        else {
            return;
        };
        let unready = self.is_unready(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let stop = Duration::from_millis(self.config.pod_stop_delay_ms);
        let step = match pod::next_step(pod, up, unready, stop, Timestamp::now()) {
            PodStep::Wait => return,
            PodStep::Start if lock(&self.started).contains(&uid) => return,
            step => step,
        };
        if !lock(&self.busy).insert(uid.clone()) {
            return;
        }
        let inner = self.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Err(e) = inner.run_step(&pod, step, &host_ip).await {
                inner.failed(e);
            }
            lock(&inner.busy).remove(&uid);
        });
    }

    /// Whether a pod fails its readiness: by name, every pod of its
    /// namespace (`*`), or by a container image.
    fn is_unready(&self, pod: &Pod) -> bool {
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let by_name = {
            let unready = lock(&self.unready_pods);
            [name.as_str(), "*"]
                .iter()
                .any(|n| unready.contains(&(namespace.clone(), n.to_string())))
        };
        let images = lock(&self.unready_images);
        by_name
            || pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
                c.image
                    .as_deref()
                    .is_some_and(|image| images.iter().any(|bad| image.contains(bad.as_str())))
            })
    }

    async fn run_step(&self, pod: &Pod, step: PodStep, host_ip: &str) -> Result<(), String> {
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.node_client(&node), &namespace);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let unready = || self.is_unready(pod);
        let result = match step {
            PodStep::Wait => return Ok(()),
            PodStep::Start => {
                tokio::time::sleep(Duration::from_millis(self.config.pod_start_delay_ms)).await;
                let n = self.next_pod_ip.fetch_add(1, Ordering::Relaxed);
                let ip = format!("10.244.{}.{}", (n >> 8) & 255, n & 255);
                let patch = pod::start_patch(pod, host_ip, &ip, !unready(), Timestamp::now());
                let r = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await;
                if r.is_ok() {
                    lock(&self.started).insert(uid);
                    lock(&self.stats).pods_started += 1;
                }
                r.map(|_| ())
            }
            PodStep::SetReady(ready) => {
                let patch = pod::readiness_patch(pod, ready, Timestamp::now());
                let r = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await;
                if r.is_ok() {
                    lock(&self.stats).pod_readiness_changes += 1;
                }
                r.map(|_| ())
            }
            PodStep::Remove { after } => {
                tokio::time::sleep(after).await;
                self.timeline.record(
                    "pod-removed",
                    &format!("{namespace}/{name}"),
                    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                );
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let r = api.delete(&name, &params).await;
                if r.is_ok() {
                    lock(&self.stats).pods_removed += 1;
                }
                r.map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(()),
            // Gone meanwhile, or replaced by another pod of the same name.
            Err(e) if is_code(&e, &[404, 409]) => Ok(()),
            Err(e) => Err(format!("pod {namespace}/{name}: {e}")),
        }
    }

    fn forget(&self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            lock(&self.started).remove(uid);
        }
    }

    /// Look at every bound pod again (after a kubelet comes back, and now
    /// and then to retry failed steps).
    fn resync_pods(self: &Arc<Self>) {
        for pod in self.pod_cache().state() {
            self.consider(&pod);
        }
    }
}

/// How often the loop wakes to expire faults and post dirty status.
const TICK: Duration = Duration::from_millis(250);
/// How often every bound pod is looked at again, to retry failed steps.
const POD_RESYNC: Duration = Duration::from_secs(5);
/// Kubernetes calls in flight at once from one heartbeat round.
const HEARTBEAT_CONCURRENCY: usize = 32;

/// Start watching simulated Nodes and bound pods into fresh caches.
fn watch(inner: &Arc<Inner>) -> Vec<tokio::task::JoinHandle<()>> {
    let (node_cache, node_writer) = reflector::store();
    let (pod_cache, pod_writer) = reflector::store();
    *inner.caches.write().unwrap_or_else(|p| p.into_inner()) = Caches {
        nodes: node_cache,
        pods: pod_cache,
    };
    let client = inner.client.clone();
    let nodes = watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().labels("capstan.dev/simulated=true"),
    )
    .default_backoff()
    .reflect(node_writer)
    .for_each(|event| {
        if let Err(e) = event {
            tracing::debug!(error = %e, "simulated kubelet: node watch error; retrying");
        }
        futures::future::ready(())
    });
    let pod_events = inner.clone();
    let pods = watcher(
        Api::<Pod>::all(client),
        watcher::Config::default().fields("spec.nodeName!="),
    )
    .default_backoff()
    .reflect(pod_writer)
    .for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => pod_events.consider(&p),
            Ok(watcher::Event::Delete(p)) => pod_events.forget(&p),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "simulated kubelet: pod watch error; retrying")
            }
        }
        futures::future::ready(())
    });
    vec![tokio::spawn(nodes), tokio::spawn(pods)]
}

async fn heartbeat_loop(inner: Arc<Inner>) {
    let heartbeat = Duration::from_millis(inner.config.heartbeat_interval_ms);
    let report = Duration::from_millis(inner.config.status_report_interval_ms);
    let mut last_beat = Instant::now();
    let mut last_resync = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(HEARTBEAT_CONCURRENCY));
    let in_flight: Arc<std::sync::Mutex<HashSet<String>>> = Arc::default();
    loop {
        tokio::time::sleep(TICK).await;
        let now = Instant::now();
        let beat = !heartbeat.is_zero() && now >= last_beat + heartbeat;
        if beat {
            last_beat = now;
        }
        // (node, renew its lease, post its status)
        let work: Vec<(String, bool, bool)> = {
            let mut nodes = lock(&inner.nodes);
            nodes
                .values_mut()
                .filter(|s| s.heartbeats)
                .filter_map(|s| {
                    let before = s.overrides.len();
                    s.overrides
                        .retain(|(_, until)| until.is_none_or(|u| now < u));
                    s.dirty |= s.overrides.len() != before;
                    let post = s.dirty
                        || (beat && {
                            let observed = inner.node_cache().get(&ObjectRef::new(&s.spec.name));
                            let wanted = node::desired_conditions(
                                &s.overrides,
                                observed.as_deref(),
                                Timestamp::now(),
                                now,
                            );
                            node::conditions_differ(&wanted, observed.as_deref())
                                || now >= s.last_status_post + report
                        });
                    (beat || post).then(|| (s.spec.name.clone(), beat, post))
                })
                .collect()
        };
        // Each Node's kubelet is on its own, as on real machines: a beat
        // still in flight (its API server stopped answering, another
        // cluster's) holds no other Node's beat, and that Node gets no
        // second one meanwhile. At most HEARTBEAT_CONCURRENCY at once.
        for (name, renew, post) in work {
            if !lock(&in_flight).insert(name.clone()) {
                continue;
            }
            let (inner, permits, in_flight) = (inner.clone(), permits.clone(), in_flight.clone());
            tokio::spawn(async move {
                if let Ok(_permit) = permits.acquire_owned().await {
                    // Errors are counted and logged; the next beat retries.
                    if renew {
                        let _ = inner.renew_lease(&name).await;
                    }
                    if post {
                        let _ = inner.post_status(&name).await;
                    }
                }
                lock(&in_flight).remove(&name);
            });
        }
        if now >= last_resync + POD_RESYNC {
            last_resync = now;
            inner.resync_pods();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_names_are_dns_labels() {
        assert_eq!(super::node_name("i-000042"), "sim-i-000042");
    }

    #[test]
    fn switch_errors_say_what_to_do() {
        let e = super::SwitchError::UnknownNode("sim-x".into());
        assert!(e.to_string().contains("GET /admin/nodes"), "{e}");
    }
}
