//! The plugin registry: what the Plugin controller loaded, by Plugin name
//! (providers live in [`crate::provider::Providers`], updaters and
//! bootstrap plugins here, addon
//! plugins in `capstan-addons` as a [`ByPlugin`] of their own), and whether
//! objects in a namespace may use a Plugin right now. The Plugin controller
//! fills it; the Machine, in-place and Addon code read it. It imports none
//! of them, so none of them import each other through it.

use crate::canary::{CallCounts, Canary};
use crate::{Kube, Providers};
use capstan_api::machine_conditions::READY;
use capstan_api::{Plugin, status};
use capstan_manifest::FieldPattern;
use capstan_runtime::{BootstrapPlugin, UpdaterPlugin};
use kube::runtime::reflector::ObjectRef;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// One active updater.
#[derive(Debug, Clone)]
pub struct RegisteredUpdater {
    /// The loaded plugin.
    pub plugin: UpdaterPlugin,
    /// The fields its manifest declares.
    pub fields: Vec<FieldPattern>,
    /// Its Plugin's `spec.updateOrder`.
    pub order: Option<i32>,
    /// How long one of its steps may go without progress before a health
    /// check judges the update hung (Plugin, else manifest, else default).
    pub progress_deadline: std::time::Duration,
    /// What its steps do to the machine's workloads (its manifest's).
    pub disruption: capstan_manifest::Disruption,
    /// `stable`, or `canary` for a Plugin's canary (the call metrics'
    /// `revision` label).
    pub revision: &'static str,
    /// Its calls since its canary's window began.
    pub counts: Arc<CallCounts>,
    /// The serving revision's canary, if one is on trial
    /// (`Plugin.spec.rollout`); the Plugin controller sets it.
    pub canary: Arc<RwLock<Option<Arc<UpdaterCanary>>>>,
}

/// A canary revision of an updater and the Machines it serves.
pub type UpdaterCanary = Canary<Arc<RegisteredUpdater>>;

impl RegisteredUpdater {
    /// `sha256:…` of the component.
    pub fn digest(&self) -> &str {
        self.plugin.plugin().digest()
    }

    /// The revision that updates a Machine: the canary for the Machines it
    /// serves (or whose update it began: `served_by` is the digest the
    /// Machine's in-place step records), this one for the rest.
    pub fn for_machine(self: &Arc<Self>, uid: &str, served_by: Option<&str>) -> Arc<Self> {
        let canary = self.canary.read().expect("canary lock").clone();
        match canary {
            Some(c) if c.serves(uid) || served_by == Some(c.serving.digest()) => c.serving.clone(),
            _ => self.clone(),
        }
    }
}

/// Updaters by Plugin name. The Plugin controller fills it; the
/// deployment, set and machine controllers read it.
pub type Updaters = ByPlugin<RegisteredUpdater>;

/// Bootstrap plugins by Plugin name. The Plugin controller fills it; the
/// Machine controller reads it.
pub type Bootstraps = ByPlugin<RegisteredBootstrap>;

/// One active bootstrap plugin.
#[derive(Debug)]
pub struct RegisteredBootstrap {
    /// The loaded plugin.
    pub plugin: BootstrapPlugin,
    /// `stable`, or `canary` for a Plugin's canary (the call metrics'
    /// `revision` label).
    pub revision: &'static str,
    /// Its calls since its canary's window began.
    pub counts: Arc<CallCounts>,
    /// The serving revision's canary, if one is on trial
    /// (`Plugin.spec.rollout`); the Plugin controller sets it.
    pub canary: RwLock<Option<Arc<BootstrapCanary>>>,
}

/// A canary revision of a bootstrap plugin and the Machines it serves.
pub type BootstrapCanary = Canary<Arc<RegisteredBootstrap>>;

impl RegisteredBootstrap {
    /// A serving revision with no canary.
    pub fn new(plugin: BootstrapPlugin) -> Self {
        RegisteredBootstrap {
            plugin,
            revision: "stable",
            counts: Arc::default(),
            canary: RwLock::default(),
        }
    }

    /// The revision that renders a Machine's bootstrap data: the canary
    /// for the Machines it serves, this one for the rest; `None` while a
    /// canary runs and the Plugin controller has not yet given the Machine
    /// to either (it waits a second or two, so the canary's share counts
    /// it).
    pub fn for_machine(self: &Arc<Self>, uid: &str) -> Option<Arc<Self>> {
        let canary = self.canary.read().expect("canary lock").clone();
        match canary {
            Some(c) if c.serves(uid) => Some(c.serving.clone()),
            Some(c) if !c.is_shadow() && !c.decided(uid) => None,
            _ => Some(self.clone()),
        }
    }

    /// Note a Machine that failed its health check for the canary's
    /// window, if a canary runs.
    pub fn note_unhealthy(&self, uid: &str) {
        if let Some(c) = self.canary.read().expect("canary lock").as_ref() {
            c.note_unhealthy(uid, c.serves(uid));
        }
    }
}

/// What the Plugin controller loaded of one kind, by Plugin name.
#[derive(Debug)]
pub struct ByPlugin<T> {
    inner: Arc<RwLock<HashMap<String, Arc<T>>>>,
}

impl<T> Default for ByPlugin<T> {
    fn default() -> Self {
        ByPlugin {
            inner: Arc::default(),
        }
    }
}

impl<T> Clone for ByPlugin<T> {
    fn clone(&self) -> Self {
        ByPlugin {
            inner: self.inner.clone(),
        }
    }
}

impl<T> ByPlugin<T> {
    /// Register (or replace) what a Plugin serves.
    pub fn insert(&self, name: &str, loaded: T) {
        self.inner
            .write()
            .expect("registry lock")
            .insert(name.to_string(), Arc::new(loaded));
    }

    /// Stop serving a Plugin (its grants were revoked).
    pub fn remove(&self, name: &str) {
        self.inner.write().expect("registry lock").remove(name);
    }

    /// What a Plugin serves.
    pub fn get(&self, name: &str) -> Option<Arc<T>> {
        self.inner.read().expect("registry lock").get(name).cloned()
    }

    /// Everything registered.
    pub fn all(&self) -> Vec<(String, Arc<T>)> {
        self.inner
            .read()
            .expect("registry lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Whether objects in `namespace` may use `plugin`: its
/// `spec.allowedNamespaces` against the namespace's labels (unset: only
/// Capstan's own namespace).
pub fn allowed_in(kube: &Kube, plugin: &Plugin, namespace: &str) -> bool {
    // A namespace the cache does not show yet is allowed by name only.
    let labels = kube
        .stores
        .namespaces
        .get(&ObjectRef::new(namespace))
        .map(|n| n.metadata.labels.clone().unwrap_or_default());
    plugin.allows_namespace(
        namespace,
        labels.as_ref(),
        kube.secrets_namespace.as_deref(),
    )
}

/// Why objects in `namespace` may not use the Plugin named `name`, if they
/// may not (a Plugin that does not exist is another matter, reported where
/// it is used).
pub fn not_allowed(kube: &Kube, name: &str, namespace: &str) -> Option<String> {
    let plugin = kube.stores.plugins.get(&ObjectRef::new(name))?;
    (!allowed_in(kube, &plugin, namespace))
        .then(|| plugin.not_allowed_message(namespace, kube.secrets_namespace.as_deref()))
}

/// Whether machines can use a plugin right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Registered and usable.
    Ready,
    /// The plugin exists but objects in this namespace may not use it: what
    /// to tell the user (reason `PluginNotAllowed`).
    NotAllowed(String),
    /// This host has not loaded it yet (for example right after a restart);
    /// machines wait quietly instead of reporting a problem.
    Loading,
    /// Missing or failed to load: what to tell the user.
    Unavailable(String),
}

/// Whether machines in `namespace` naming `name` can use it.
pub fn availability(
    kube: &Kube,
    providers: &Providers,
    name: &str,
    namespace: &str,
) -> Availability {
    let registered = providers.get(name);
    let key = ObjectRef::<Plugin>::new(name);
    let Some(plugin) = kube.stores.plugins.get(&key) else {
        return match registered {
            // Built-in providers (the benchmark's native one) have no object.
            Some(r) if r.generation.is_none() => Availability::Ready,
            _ => Availability::Unavailable(format!(
                "plugin {name:?} does not exist; create a Plugin named {name:?} (kubectl get plugins lists the installed ones)"
            )),
        };
    };
    if !allowed_in(kube, &plugin, namespace) {
        return Availability::NotAllowed(
            plugin.not_allowed_message(namespace, kube.secrets_namespace.as_deref()),
        );
    }
    if registered.is_some() {
        return Availability::Ready;
    }
    let condition = plugin
        .status
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, READY).cloned());
    match condition {
        Some(c) if c.status == status::FALSE => Availability::Unavailable(format!(
            "plugin {name:?} is not ready: {}: {}",
            c.reason, c.message
        )),
        _ => Availability::Loading,
    }
}
