//! Drift: every applied object carries its Addon's labels, and a watch per
//! (target cluster, kind, namespace) turns any change or deletion of a
//! labelled object into a reconcile of its Addon. [`AddonState`] holds
//! those watches, the workload-cluster clients and discovery answers.

use super::Context;
use super::cluster::Target;
use capstan_api::{Addon, LABEL_ADDON_NAME, LABEL_ADDON_NAMESPACE};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::sync::Mutex;

/// A drift watch: (cluster, `apiVersion/Kind@namespace`).
pub(super) type WatchKey = (String, String);

/// Watches on applied objects, workload-cluster clients and discovery
/// answers, shared by all reconciles.
pub(super) struct AddonState {
    pub(super) trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<Addon>>,
    pub(super) receiver: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Addon>>>>,
    /// Drift watches by (cluster, kind@namespace): the target's version
    /// (kubeconfig Secret resourceVersion) and the task.
    #[allow(clippy::type_complexity)]
    pub(super) watches: Mutex<HashMap<WatchKey, (String, tokio::task::JoinHandle<()>)>>,
    /// The watches each Addon (by uid) needs: a watch no Addon needs any
    /// more is stopped.
    pub(super) watched_by: Mutex<HashMap<String, std::collections::HashSet<WatchKey>>>,
    pub(super) clients: Mutex<HashMap<String, (String, Client)>>,
    /// Per applied object (Addon uid and object): the render it was applied
    /// from and what the server made of it, so a value the server
    /// normalises is not seen as drift on every resync.
    #[allow(clippy::type_complexity)]
    pub(super) expected: Mutex<HashMap<(String, String), (serde_json::Value, serde_json::Value)>>,
    pub(super) kinds: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
}

impl Default for AddonState {
    fn default() -> Self {
        let (trigger, receiver) = tokio::sync::mpsc::unbounded_channel();
        AddonState {
            trigger,
            receiver: Mutex::new(Some(receiver)),
            watches: Mutex::default(),
            watched_by: Mutex::default(),
            clients: Mutex::default(),
            expected: Mutex::default(),
            kinds: Mutex::default(),
        }
    }
}

impl Drop for AddonState {
    fn drop(&mut self) {
        for (_, (_, task)) in self.watches.lock().expect("watches lock").drain() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for AddonState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddonState").finish_non_exhaustive()
    }
}

pub(super) fn receiver_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Start (once per cluster, kind and namespace) a watch that reconciles
/// the Addon of any labelled object that changes or goes. Watches are
/// scoped to the namespace the object lives in (no cluster-wide LIST for a
/// namespaced object), back off on errors, and a changed target (a new
/// kubeconfig) replaces its watches instead of adding to them. They run as
/// the Addon's objects are written ([`Target::writer`]), so one identity
/// never watches for another.
pub(super) fn watch_kind(
    ctx: &Context,
    addon: &Addon,
    target: &Target,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> WatchKey {
    let (cluster, version) = target
        .key
        .split_once('@')
        .unwrap_or((target.key.as_str(), ""));
    // A tenant's objects are watched with its ServiceAccount's rights, as
    // they are written: Capstan needs none of its own in that namespace.
    let cluster = match target.actor.user() {
        Some(user) => format!("{cluster} as {user}"),
        None => cluster.to_string(),
    };
    let key = (
        cluster,
        format!(
            "{}/{}@{}",
            resource.api_version,
            resource.kind,
            namespace.unwrap_or("")
        ),
    );
    // Claimed for this Addon before it exists, so another Addon's
    // clean-up cannot stop it in between.
    let mut by = ctx.state.watched_by.lock().expect("watched_by lock");
    by.entry(addon.metadata.uid.clone().unwrap_or_default())
        .or_default()
        .insert(key.clone());
    let mut watches = ctx.state.watches.lock().expect("watches lock");
    match watches.get(&key) {
        Some((v, _)) if v == version => return key,
        Some((_, old)) => old.abort(),
        None => {}
    }
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(target.writer.clone(), ns, resource),
        None => Api::all_with(target.writer.clone(), resource),
    };
    let trigger = ctx.state.trigger.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(LABEL_ADDON_NAME);
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            let object = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => o,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "addon drift watch error; it retries");
                    continue;
                }
            };
            let labels = object.labels();
            if let (Some(name), Some(ns)) = (
                labels.get(LABEL_ADDON_NAME),
                labels.get(LABEL_ADDON_NAMESPACE),
            ) && trigger.send(ObjectRef::new(name).within(ns)).is_err()
            {
                return;
            }
        }
    });
    watches.insert(key.clone(), (version.to_string(), task));
    key
}

/// Record the watches an Addon needs now (none once it is gone) and stop
/// those no Addon needs any more.
pub(super) fn need_watches(
    ctx: &Context,
    addon: &Addon,
    keys: std::collections::HashSet<WatchKey>,
) {
    let uid = addon.metadata.uid.clone().unwrap_or_default();
    let mut by = ctx.state.watched_by.lock().expect("watched_by lock");
    if keys.is_empty() {
        by.remove(&uid);
    } else {
        by.insert(uid, keys);
    }
    let mut watches = ctx.state.watches.lock().expect("watches lock");
    watches.retain(|key, (_, task)| {
        let needed = by.values().any(|keys| keys.contains(key));
        if !needed {
            task.abort();
        }
        needed
    });
}
