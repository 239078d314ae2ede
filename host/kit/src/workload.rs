//! Workload clusters: the management cluster reaches each `Cluster`'s API
//! server through its kubeconfig Secret, as Cluster API's ClusterCache
//! does. Start at [`WorkloadClusters`].
//!
//! One [`Handle`] per Cluster holds
//! - its clients: one for requests, with short timeouts (a stopped API
//!   server holds no worker for long), one without retries for evictions,
//!   one for watches; all behind the leader's write fence;
//! - a [`Kube`] view of the workload cluster: its client, and Namespace
//!   (for MachineDrainRules' namespace selectors), Node, pod, DaemonSet
//!   and VolumeAttachment caches of *that* cluster beside
//!   Capstan's own caches of the management cluster, so the Node-side code
//!   (claims, labels and taints, drains, volume waits, Node deletion,
//!   bootstrap tokens, CSR answers) runs unchanged against it;
//! - its health: a probe every [`ProbeOptions::interval`]; after
//!   [`ProbeOptions::failure_threshold`] failures in a row the cluster is
//!   unreachable ([`Handle::reachable`]) and no Node-side work is tried
//!   until a probe succeeds again.
//!
//! The Cluster controller makes, replaces (when the kubeconfig Secret
//! changed) and drops handles ([`WorkloadClusters::ensure`],
//! [`WorkloadClusters::forget`]); the other controllers only look them up
//! ([`WorkloadClusters::get`]). A handle's watches start when the first
//! object asks for them ([`Handle::watching`]) and stop with the handle
//! (the Cluster controller drops a handle whose cluster has no object
//! left, and makes a fresh one that only probes).
//! Node changes and reachability changes of every workload cluster reach
//! controllers through [`WorkloadClusters::events`].

use crate::watch::{Listed, Shared};
use crate::{Error, Kube, Stores};
use capstan_api::Cluster;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A Cluster by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterKey {
    /// The Cluster's namespace (its objects' namespace).
    pub namespace: String,
    /// The Cluster's name (their `spec.clusterName`).
    pub name: String,
}

impl ClusterKey {
    /// The key of `cluster_name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ClusterKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a Cluster object.
    pub fn of(cluster: &Cluster) -> Self {
        ClusterKey::new(cluster.namespace().unwrap_or_default(), cluster.name_any())
    }
}

impl std::fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How workload clusters are probed and how long their requests may take
/// (Cluster API's defaults: a probe every 10 s with a 5 s timeout, five
/// failures in a row disconnect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Time between probes.
    pub interval: Duration,
    /// A probe's (and a connection's) timeout.
    pub timeout: Duration,
    /// Failed probes in a row after which the cluster is unreachable.
    pub failure_threshold: u32,
    /// A request's read timeout (watches excepted).
    pub request_timeout: Duration,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            failure_threshold: 5,
            request_timeout: Duration::from_secs(15),
        }
    }
}

/// What changed in a workload cluster.
#[derive(Debug, Clone)]
pub enum ClusterEvent {
    /// A Node of the cluster was applied or deleted.
    Node(ClusterKey, Arc<Node>),
    /// The cluster became reachable or unreachable.
    Reach(ClusterKey),
}

/// Why a Cluster cannot be reached through its kubeconfig Secret (a
/// condition's reason and message; never the Secret's content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// `KubeconfigSecretNotFound`, `KubeconfigSecretForbidden`, `KubeconfigRefused`, …
    pub reason: &'static str,
    /// For humans: which Secret, what is wrong, what to do.
    pub message: String,
}

/// The health of one workload cluster's connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// When a probe last succeeded.
    pub last_success: Option<Instant>,
    /// Probes failed in a row since.
    pub failures: u32,
    /// The last failure, for conditions.
    pub last_error: Option<String>,
}

/// One workload cluster: its clients, caches and health.
pub struct Handle {
    /// Which Cluster.
    pub key: ClusterKey,
    /// The workload cluster as the Node-side code uses it.
    pub kube: Kube,
    /// For evictions: no retries of 429 (a PodDisruptionBudget's refusal
    /// comes back at once).
    pub evictions: Client,
    /// The kubeconfig Secret's resourceVersion this handle was made from.
    secret_version: String,
    health: Mutex<Health>,
    options: ProbeOptions,
    watches: Mutex<Option<NodeSide>>,
    synced: Arc<AtomicBool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    events: tokio::sync::broadcast::Sender<ClusterEvent>,
    watch_client: Client,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("key", &self.key)
            .field("health", &self.health())
            .finish_non_exhaustive()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

/// The watches of a workload cluster's Node side, until started.
struct NodeSide {
    namespaces: Shared<Namespace>,
    nodes: Shared<Node>,
    pods: Shared<Pod>,
    daemon_sets: Shared<DaemonSet>,
    volume_attachments: Shared<VolumeAttachment>,
}

impl Handle {
    /// The connection's health now.
    pub fn health(&self) -> Health {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `Ok` while the cluster answers; why not, once
    /// [`ProbeOptions::failure_threshold`] probes failed in a row (or none
    /// has succeeded yet and the threshold has passed).
    pub fn reachable(&self) -> Result<(), String> {
        let health = self.health();
        if health.failures < self.options.failure_threshold {
            return Ok(());
        }
        let since = health
            .last_success
            .map(|t| format!(", last answered {} s ago", t.elapsed().as_secs()))
            .unwrap_or_default();
        Err(format!(
            "the API server of Cluster {} did not answer {} probes in a row{since}: {}",
            self.key,
            health.failures,
            health.last_error.unwrap_or_default()
        ))
    }

    /// Whether the cluster's caches have listed (their contents can be
    /// trusted to say a Node or pod is not there).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Whether the Node-side watches were started.
    pub fn watches_started(&self) -> bool {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Start the Node-side watches, if not started yet (the first object
    /// that needs them asks); their events reach [`WorkloadClusters::events`].
    pub fn watching(&self) {
        let Some(mut side) = self
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let listed = Listed::raising(5, self.synced.clone());
        let key = self.key.clone();
        let events = self.events.clone();
        let nodes = side.nodes.subscribe();
        let deleted = side.nodes.deletions();
        let (key2, events2) = (key.clone(), events.clone());
        let forward = nodes
            .map(move |node| {
                let _ = events.send(ClusterEvent::Node(key.clone(), node));
            })
            .boxed();
        let forward_deleted = deleted
            .map(move |node| {
                let _ = events2.send(ClusterEvent::Node(key2.clone(), node));
            })
            .boxed();
        let reflectors = futures::stream::select_all([
            side.namespaces.start("namespaces", listed.clone()).boxed(),
            side.nodes.start("nodes", listed.clone()).boxed(),
            side.pods.start("pods", listed.clone()).boxed(),
            side.daemon_sets.start("daemonsets", listed.clone()).boxed(),
            side.volume_attachments
                .start("volumeattachments", listed)
                .boxed(),
            forward,
            forward_deleted,
        ]);
        let task = tokio::spawn(reflectors.for_each(|_| async {}));
        // Objects that waited for the caches are told when they are full.
        let (synced, key, events) = (self.synced.clone(), self.key.clone(), self.events.clone());
        let told = tokio::spawn(async move {
            while !synced.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = events.send(ClusterEvent::Reach(key));
        });
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.push(task);
        tasks.push(told);
    }

    /// One probe: the API server's version within the probe timeout.
    async fn probe(&self) {
        let answered =
            tokio::time::timeout(self.options.timeout, self.watch_client.apiserver_version()).await;
        let result = match answered {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer within {} s",
                self.options.timeout.as_secs_f32()
            )),
        };
        let changed = {
            let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let was = health.failures >= self.options.failure_threshold;
            match result {
                Ok(()) => {
                    health.last_success = Some(Instant::now());
                    health.failures = 0;
                    health.last_error = None;
                }
                Err(e) => {
                    health.failures = health.failures.saturating_add(1);
                    health.last_error = Some(e);
                }
            }
            was != (health.failures >= self.options.failure_threshold)
        };
        if changed {
            let _ = self.events.send(ClusterEvent::Reach(self.key.clone()));
        }
    }
}

/// Every workload cluster's handle.
#[derive(Clone)]
pub struct WorkloadClusters {
    management: Kube,
    options: ProbeOptions,
    handles: Arc<Mutex<HashMap<ClusterKey, Arc<Handle>>>>,
    events: tokio::sync::broadcast::Sender<ClusterEvent>,
}

impl std::fmt::Debug for WorkloadClusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadClusters")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl WorkloadClusters {
    /// No workload cluster yet; `management` is the cluster Capstan runs in.
    pub fn new(management: Kube, options: ProbeOptions) -> Self {
        let (events, _) = tokio::sync::broadcast::channel(4096);
        WorkloadClusters {
            management,
            options,
            handles: Arc::default(),
            events,
        }
    }

    /// How clusters are probed.
    pub fn options(&self) -> ProbeOptions {
        self.options
    }

    /// The handle of a Cluster, if the Cluster controller made one.
    pub fn get(&self, key: &ClusterKey) -> Option<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Drop a Cluster's handle (its watches and probe stop).
    pub fn forget(&self, key: &ClusterKey) {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Node and reachability changes of every workload cluster, from now on.
    pub fn events(&self) -> impl Stream<Item = ClusterEvent> + Send + 'static {
        futures::stream::unfold(self.events.subscribe(), |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(event) => return Some((event, rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(skipped)) => {
                        tracing::warn!(skipped, "workload cluster event subscriber fell behind");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// The handle of `cluster`, made from its kubeconfig Secret (read now,
    /// as Capstan: the Secret must be in the Cluster's namespace), or
    /// remade when the Secret changed since; why it cannot be reached
    /// otherwise (a missing or refused Secret drops the old handle: a
    /// revoked kubeconfig is used no longer).
    pub async fn ensure(&self, cluster: &Cluster) -> Result<Arc<Handle>, Unusable> {
        let key = ClusterKey::of(cluster);
        match self.secret(cluster).await {
            Ok((version, text)) => {
                if let Some(handle) = self.get(&key)
                    && handle.secret_version == version
                {
                    return Ok(handle);
                }
                let handle = match self.connect(&key, &text, version).await {
                    Ok(handle) => handle,
                    Err(e) => {
                        self.forget(&key);
                        return Err(e);
                    }
                };
                self.handles
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), handle.clone());
                let _ = self.events.send(ClusterEvent::Reach(key));
                Ok(handle)
            }
            Err(unusable) => {
                if self.get(&key).is_some() {
                    self.forget(&key);
                    let _ = self.events.send(ClusterEvent::Reach(key));
                }
                Err(unusable)
            }
        }
    }

    /// The kubeconfig Secret's resourceVersion and text.
    async fn secret(&self, cluster: &Cluster) -> Result<(String, String), Unusable> {
        let namespace = cluster.namespace().unwrap_or_default();
        let name = cluster.kubeconfig_secret();
        let shown = format!("Secret {namespace}/{name}");
        let secret = match Api::<Secret>::namespaced(self.management.client.clone(), &namespace)
            .get_opt(&name)
            .await
        {
            Ok(Some(secret)) => secret,
            Ok(None) => {
                return Err(Unusable {
                    reason: "KubeconfigSecretNotFound",
                    message: format!(
                        "{shown} does not exist: create it with the workload cluster's kubeconfig under key `{}` (or name another Secret of the namespace in spec.kubeconfigSecretRef)",
                        capstan_api::KUBECONFIG_KEY
                    ),
                });
            }
            Err(kube::Error::Api(e)) if e.code == 403 => {
                return Err(Unusable {
                    reason: "KubeconfigSecretForbidden",
                    message: format!(
                        "Capstan may not read {shown}: bind it `get` on Secrets in namespace {namespace} (capstan install --machine-namespace {namespace})"
                    ),
                });
            }
            Err(e) => {
                return Err(Unusable {
                    reason: "KubeconfigSecretUnreadable",
                    message: format!("cannot read {shown}: {e}"),
                });
            }
        };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(capstan_api::KUBECONFIG_KEY))
            .ok_or_else(|| Unusable {
                reason: "KubeconfigRefused",
                message: format!("{shown} has no key `{}`", capstan_api::KUBECONFIG_KEY),
            })?;
        let text = String::from_utf8(bytes.0.clone()).map_err(|_| Unusable {
            reason: "KubeconfigRefused",
            message: format!(
                "{shown} key `{}` is not UTF-8 text",
                capstan_api::KUBECONFIG_KEY
            ),
        })?;
        Ok((version, text))
    }

    /// A new handle from a kubeconfig, checked before anything loads it
    /// (no command runs, no file is read, https only, no metadata address),
    /// and its probe started.
    async fn connect(
        &self,
        key: &ClusterKey,
        text: &str,
        secret_version: String,
    ) -> Result<Arc<Handle>, Unusable> {
        let refused = |e: String| Unusable {
            reason: "KubeconfigRefused",
            message: format!("the kubeconfig of Cluster {key} is not usable: {e}"),
        };
        crate::kubeconfig::check_kubeconfig(text).map_err(refused)?;
        let kubeconfig =
            kube::config::Kubeconfig::from_yaml(text).map_err(|e| refused(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| refused(e.to_string()))?;
        let fence = self.management.fence.as_ref();
        let client = |mut config: kube::Config, requests: bool, retries: bool| {
            config.connect_timeout = Some(self.options.timeout);
            if requests {
                config.read_timeout = Some(self.options.request_timeout);
                config.write_timeout = Some(self.options.request_timeout);
            }
            config.default_retry = retries;
            crate::leader::fenced_client(config, fence, None)
                .map_err(|e: Error| refused(e.to_string()))
        };
        let requests = client(config.clone(), true, true)?;
        let evictions = client(config.clone(), true, false)?;
        let watch_client = client(config, false, true)?;
        let side = NodeSide {
            namespaces: Shared::new(Api::all(watch_client.clone()), None),
            nodes: Shared::new(Api::all(watch_client.clone()), None),
            pods: Shared::with_fields(
                Api::all(watch_client.clone()),
                None,
                Some("spec.nodeName!="),
            ),
            daemon_sets: Shared::new(Api::all(watch_client.clone()), None),
            volume_attachments: Shared::new(Api::all(watch_client.clone()), None),
        };
        let stores = Stores {
            namespaces: side.namespaces.store(),
            nodes: side.nodes.store(),
            pods: side.pods.store(),
            daemon_sets: side.daemon_sets.store(),
            volume_attachments: side.volume_attachments.store(),
            ..self.management.stores.clone()
        };
        // Capstan's own objects stay the management cluster's (`home`).
        let kube = Kube {
            client: requests,
            stores,
            ..self.management.clone()
        };
        let handle = Arc::new(Handle {
            key: key.clone(),
            kube,
            evictions,
            secret_version,
            health: Mutex::default(),
            options: self.options,
            watches: Mutex::new(Some(side)),
            synced: Arc::default(),
            tasks: Mutex::default(),
            events: self.events.clone(),
            watch_client,
        });
        let weak = Arc::downgrade(&handle);
        let interval = self.options.interval;
        let probe = tokio::spawn(async move {
            loop {
                let Some(handle) = weak.upgrade() else {
                    return;
                };
                handle.probe().await;
                drop(handle);
                tokio::time::sleep(interval).await;
            }
        });
        handle
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(probe);
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_show_as_namespace_slash_name() {
        assert_eq!(ClusterKey::new("team-a", "prod").to_string(), "team-a/prod");
    }
}
