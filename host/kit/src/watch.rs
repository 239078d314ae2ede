//! The shared watches every controller reads from: one reflected watch per
//! kind ([`Shared`]), all of them together in [`Watches`], which checks the
//! CRDs are there, hands out [`Stores`] and subscriptions, and marks the
//! controllers ready once every watch has listed. With a watch filter
//! (Cluster API's `--watch-filter`), the watches of the kinds a shard owns
//! see only objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
//! Pods are watched once they are scheduled (`spec.nodeName` set), every
//! shard's, so a drain reads a Node's pods from the cache.

use crate::{Error, Kind, Metrics, Stores};
use capstan_api::{
    Addon, Cluster, Machine, MachineDeployment, MachineHealthCheck, MachineSet, Plugin,
};
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use std::sync::Arc;

/// The label a shard's objects carry (Cluster API's key): a controller
/// started with `--watch-filter=VALUE` sees only objects labelled
/// `cluster.x-k8s.io/watch-filter=VALUE`.
pub const LABEL_WATCH_FILTER: &str = "cluster.x-k8s.io/watch-filter";

/// Why `value` cannot be a watch filter (a label value: at most 63
/// characters, alphanumerics, `-`, `_` and `.`, alphanumeric at both ends),
/// if it cannot.
pub fn invalid_watch_filter(value: &str) -> Option<String> {
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && ends_ok(value.chars().next())
        && ends_ok(value.chars().last());
    (!ok).then(|| {
        format!(
            "--watch-filter {value:?} is not a label value: use at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
        )
    })
}

/// A shared, reflected watch of one kind: the store and a way to subscribe.
pub struct Shared<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    writer: Option<reflector::store::Writer<K>>,
    api: Api<K>,
    /// Label selector of the objects this watch sees (`None`: all).
    selector: Option<String>,
    /// Field selector of the objects this watch sees (`None`: all).
    fields: Option<&'static str>,
    /// Objects that left the cache. kube-runtime's shared streams pass
    /// applied objects on but not deleted ones, and a relist drops vanished
    /// objects silently; both reach subscribers of [`Shared::deletions`].
    deleted: tokio::sync::broadcast::Sender<Arc<K>>,
    /// Sees every event after the cache applied it (an index kept beside
    /// the cache).
    observer: Option<Observer<K>>,
}

type Observer<K> = Arc<dyn Fn(&watcher::Event<K>) + Send + Sync>;

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::fmt::Debug for Shared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

impl<K> Shared<K>
where
    K: Kind,
{
    pub(crate) fn new(api: Api<K>, selector: Option<String>) -> Self {
        Self::with_fields(api, selector, None)
    }

    pub(crate) fn with_fields(
        api: Api<K>,
        selector: Option<String>,
        fields: Option<&'static str>,
    ) -> Self {
        let (store, writer) = reflector::store_shared(1024);
        let (deleted, _) = tokio::sync::broadcast::channel(1024);
        Shared {
            store,
            writer: Some(writer),
            api,
            selector,
            fields,
            deleted,
            observer: None,
        }
    }

    fn observed_by(mut self, observer: Observer<K>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every object deleted from now on (by a watch event, or found gone
    /// when the watch relisted). A subscriber that falls more than 1,024
    /// deletions behind skips the oldest; the periodic resync covers those.
    pub fn deletions(&self) -> impl Stream<Item = Arc<K>> + Send + use<K> {
        futures::stream::unfold(self.deleted.subscribe(), |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(object) => return Some((object, rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(skipped)) => {
                        tracing::warn!(skipped, "deletion subscriber fell behind");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// Every change from now on (until the watches start).
    pub fn subscribe(&self) -> ReflectHandle<K> {
        self.writer
            .as_ref()
            .and_then(|w| w.subscribe())
            .expect("a shared store can be subscribed to until it starts")
    }

    /// The reflector task's stream; must be polled for subscribers to see
    /// events. `listed` counts watches that completed their first list.
    pub(crate) fn start(
        &mut self,
        name: &'static str,
        listed: Arc<Listed>,
    ) -> impl Stream<Item = ()> + Send + use<K> {
        let writer = self.writer.take().expect("started once");
        let mut first = true;
        let deleted = self.deleted.clone();
        let store = self.store.clone();
        let observer = self.observer.clone();
        // What the cache held when a relist began: whatever of it the
        // relist does not bring back was deleted while the watch was down.
        let mut before_relist: Vec<Arc<K>> = Vec::new();
        let mut config = watcher::Config::default().any_semantic();
        if let Some(selector) = &self.selector {
            config = config.labels(selector);
        }
        if let Some(fields) = self.fields {
            config = config.fields(fields);
        }
        watcher(self.api.clone(), config)
            .default_backoff()
            // No controller reads managedFields, and they are a large part
            // of every cached object (controller-runtime strips them too):
            // at 5000 machines, tens of MiB.
            .modify(|object| object.meta_mut().managed_fields = None)
            .reflect_shared(writer)
            .filter_map(move |event| {
                if let (Some(observe), Ok(event)) = (&observer, &event) {
                    observe(event);
                }
                match event {
                    Err(error) => tracing::warn!(watch = name, %error, "watch error; retrying"),
                    Ok(watcher::Event::Delete(object)) => {
                        let _ = deleted.send(Arc::new(object));
                    }
                    Ok(watcher::Event::Init) if !first => before_relist = store.state(),
                    Ok(watcher::Event::InitDone) if first => {
                        first = false;
                        tracing::debug!(watch = name, "listed");
                        listed.one_more();
                    }
                    Ok(watcher::Event::InitDone) => {
                        for object in std::mem::take(&mut before_relist) {
                            let gone = store
                                .get(&ObjectRef::from_obj(object.as_ref()))
                                .is_none_or(|now| now.meta().uid != object.meta().uid);
                            if gone {
                                let _ = deleted.send(object);
                            }
                        }
                    }
                    Ok(_) => {}
                }
                futures::future::ready(None)
            })
    }

    /// Fail early and clearly when the kind's CRD is missing or not
    /// readable.
    async fn check(&self, crd: &str) -> Result<(), Error> {
        match self.api.list_metadata(&Default::default()).await {
            Ok(_) => Ok(()),
            Err(error) => {
                tracing::error!(%error, "cannot list {crd}");
                Err(Error::Watch(crd.to_string()))
            }
        }
    }
}

/// Counts watches that completed their first list and, when all have,
/// marks the controllers ready (`metrics`) or raises `synced` (a workload
/// cluster's watches).
pub(crate) struct Listed {
    remaining: std::sync::atomic::AtomicUsize,
    metrics: Option<Metrics>,
    synced: Arc<std::sync::atomic::AtomicBool>,
}

impl Listed {
    /// For `count` watches that raise `synced` once all have listed.
    pub(crate) fn raising(count: usize, synced: Arc<std::sync::atomic::AtomicBool>) -> Arc<Listed> {
        Arc::new(Listed {
            remaining: std::sync::atomic::AtomicUsize::new(count),
            metrics: None,
            synced,
        })
    }

    fn one_more(&self) {
        if self
            .remaining
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.synced
                .store(true, std::sync::atomic::Ordering::Release);
            if let Some(metrics) = &self.metrics {
                metrics.set_ready(true);
                tracing::info!("caches synced; controllers ready");
            }
        }
    }
}

/// Every watch the controllers share. Subscribe first, then [`start`].
///
/// [`start`]: Watches::start
#[derive(Debug)]
pub struct Watches {
    /// Plugins.
    pub plugins: Shared<Plugin>,
    /// Machines.
    pub machines: Shared<Machine>,
    /// Machines by provider ID, kept from the Machine watch.
    pub machine_ids: Arc<crate::claims::ProviderIds>,
    /// MachineSets.
    pub machine_sets: Shared<MachineSet>,
    /// MachineDeployments.
    pub deployments: Shared<MachineDeployment>,
    /// Nodes.
    pub nodes: Shared<Node>,
    /// MachineHealthChecks.
    pub health_checks: Shared<MachineHealthCheck>,
    /// Addons.
    pub addons: Shared<Addon>,
    /// Clusters (workload clusters).
    pub clusters: Shared<Cluster>,
    /// Namespaces.
    pub namespaces: Shared<Namespace>,
    /// Pods scheduled to a Node.
    pub pods: Shared<Pod>,
    /// DaemonSets (a drain leaves their pods alone while they exist).
    pub daemon_sets: Shared<DaemonSet>,
    /// VolumeAttachments (a deleting machine waits for its Node's to go).
    pub volume_attachments: Shared<VolumeAttachment>,
}

impl Watches {
    /// The watches, after checking that Capstan's CRDs can be listed (an
    /// error names the first that cannot). With `watch_filter`, the
    /// Machines, MachineSets, MachineDeployments, MachineHealthChecks,
    /// Addons and Clusters seen are those of this shard; Plugins, Nodes and Namespaces
    /// are every shard's.
    pub async fn new(client: &Client, watch_filter: Option<&str>) -> Result<Self, Error> {
        let owned = || watch_filter.map(|value| format!("{LABEL_WATCH_FILTER}={value}"));
        let machine_ids = Arc::new(crate::claims::ProviderIds::default());
        let index = machine_ids.clone();
        let watches = Watches {
            plugins: Shared::new(Api::all(client.clone()), None),
            machines: Shared::new(Api::all(client.clone()), owned())
                .observed_by(Arc::new(move |event| index.observe(event))),
            machine_ids,
            machine_sets: Shared::new(Api::all(client.clone()), owned()),
            deployments: Shared::new(Api::all(client.clone()), owned()),
            nodes: Shared::new(Api::all(client.clone()), None),
            health_checks: Shared::new(Api::all(client.clone()), owned()),
            addons: Shared::new(Api::all(client.clone()), owned()),
            clusters: Shared::new(Api::all(client.clone()), owned()),
            namespaces: Shared::new(Api::all(client.clone()), None),
            // Pods not yet scheduled are no drain's business (the
            // scheduler's own filter for assigned pods).
            pods: Shared::with_fields(Api::all(client.clone()), None, Some("spec.nodeName!=")),
            daemon_sets: Shared::new(Api::all(client.clone()), None),
            volume_attachments: Shared::new(Api::all(client.clone()), None),
        };
        watches.plugins.check("plugins.capstan.dev").await?;
        watches.machines.check("machines.capstan.dev").await?;
        watches
            .machine_sets
            .check("machinesets.capstan.dev")
            .await?;
        watches
            .deployments
            .check("machinedeployments.capstan.dev")
            .await?;
        watches
            .health_checks
            .check("machinehealthchecks.capstan.dev")
            .await?;
        watches.addons.check("addons.capstan.dev").await?;
        watches.clusters.check("clusters.capstan.dev").await?;
        Ok(watches)
    }

    /// The caches.
    pub fn stores(&self) -> Stores {
        Stores {
            plugins: self.plugins.store(),
            machines: self.machines.store(),
            machine_ids: self.machine_ids.clone(),
            machine_sets: self.machine_sets.store(),
            deployments: self.deployments.store(),
            nodes: self.nodes.store(),
            health_checks: self.health_checks.store(),
            addons: self.addons.store(),
            clusters: self.clusters.store(),
            namespaces: self.namespaces.store(),
            pods: self.pods.store(),
            daemon_sets: self.daemon_sets.store(),
            volume_attachments: self.volume_attachments.store(),
        }
    }

    /// Start every watch on a task; `metrics` is marked ready once all have
    /// listed. Abort the task to stop them.
    pub fn start(&mut self, metrics: &Metrics) -> tokio::task::JoinHandle<()> {
        let listed = Arc::new(Listed {
            remaining: std::sync::atomic::AtomicUsize::new(0),
            metrics: Some(metrics.clone()),
            synced: Arc::default(),
        });
        let reflectors = [
            self.plugins.start("plugins", listed.clone()).boxed(),
            self.machines.start("machines", listed.clone()).boxed(),
            self.machine_sets
                .start("machinesets", listed.clone())
                .boxed(),
            self.deployments
                .start("machinedeployments", listed.clone())
                .boxed(),
            self.nodes.start("nodes", listed.clone()).boxed(),
            self.health_checks
                .start("machinehealthchecks", listed.clone())
                .boxed(),
            self.addons.start("addons", listed.clone()).boxed(),
            self.clusters.start("clusters", listed.clone()).boxed(),
            self.namespaces.start("namespaces", listed.clone()).boxed(),
            self.pods.start("pods", listed.clone()).boxed(),
            self.daemon_sets.start("daemonsets", listed.clone()).boxed(),
            self.volume_attachments
                .start("volumeattachments", listed.clone())
                .boxed(),
        ];
        // The streams are lazy: nothing has listed before this count is set.
        listed
            .remaining
            .store(reflectors.len(), std::sync::atomic::Ordering::Release);
        let reflectors = futures::stream::select_all(reflectors);
        tokio::spawn(reflectors.for_each(|_| async {}))
    }
}
