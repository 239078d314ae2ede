//! [`Kube`]: what every controller's context holds — the API, the shared
//! caches, metrics and the Event recorder — and [`ScopeApi`], which builds
//! an `Api` for namespaced and cluster-scoped kinds alike. A controller's
//! own state (a plan cache, drift watches, loaded revisions) lives in that
//! controller's context, never here.

use crate::Metrics;
use capstan_api::{Addon, Machine, MachineDeployment, MachineHealthCheck, MachineSet, Plugin};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use std::time::Duration;

/// The Kubernetes side every controller shares.
#[derive(Clone)]
pub struct Kube {
    /// API client (writes behind the leader fence, when there is one).
    pub client: Client,
    /// The management cluster's client: Capstan's own objects (Machines,
    /// MachineDrainRules, …) are there. The same as `client`, except in a
    /// workload cluster's view ([`crate::workload`]).
    pub home: Client,
    /// Read-only caches of every kind the controllers watch.
    pub stores: Stores,
    /// Metrics.
    pub metrics: Metrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// How often an idle object is reconciled anyway (a resync).
    pub resync: Duration,
    /// Capstan's own namespace: Plugins without `allowedNamespaces` serve
    /// only objects in it, and credential Secrets are read only from it
    /// (`None`: any namespace, for embedding and tests).
    pub secrets_namespace: Option<String>,
    /// Leader election's write fence (`None`: no election): clients made
    /// for workload clusters are put behind it too.
    pub fence: Option<std::sync::Arc<crate::leader::Fence>>,
    /// The Machine caches hold this shard's Machines only (a watch
    /// filter): what must hold across shards is asked of the API server.
    pub sharded: bool,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}

/// A controller that needs nothing of its own uses [`Kube`] as its context.
impl AsRef<Kube> for Kube {
    fn as_ref(&self) -> &Kube {
        self
    }
}

/// Read-only caches every controller can look into.
#[derive(Clone)]
pub struct Stores {
    /// Plugins.
    pub plugins: Store<Plugin>,
    /// Machines.
    pub machines: Store<Machine>,
    /// Machines by the provider ID their status records.
    pub machine_ids: std::sync::Arc<crate::claims::ProviderIds>,
    /// MachineSets.
    pub machine_sets: Store<MachineSet>,
    /// MachineDeployments.
    pub deployments: Store<MachineDeployment>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// MachineHealthChecks.
    pub health_checks: Store<MachineHealthCheck>,
    /// Addons.
    pub addons: Store<Addon>,
    /// Clusters (workload clusters).
    pub clusters: Store<capstan_api::Cluster>,
    /// Namespaces (their labels decide Plugins' `allowedNamespaces`).
    pub namespaces: Store<Namespace>,
    /// Pods scheduled to a Node (the drain's view of a Node).
    pub pods: Store<Pod>,
    /// DaemonSets.
    pub daemon_sets: Store<DaemonSet>,
    /// VolumeAttachments (what a deleting machine's volume wait reads).
    pub volume_attachments: Store<VolumeAttachment>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("machines", &self.machines.len())
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// A kind Capstan reads and writes: a typed object of either scope.
pub trait Kind:
    Resource<DynamicType = (), Scope: ScopeApi>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Kind for K where
    K: Resource<DynamicType = (), Scope: ScopeApi>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Build an `Api` for namespaced or cluster-scoped kinds alike.
pub trait ScopeApi {
    /// The API handle for an object of this scope.
    fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = Self>;
}

impl ScopeApi for k8s_openapi::NamespaceResourceScope {
    fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = Self>,
    {
        Api::namespaced(client, namespace.unwrap_or("default"))
    }
}

impl ScopeApi for k8s_openapi::ClusterResourceScope {
    fn api<K>(client: Client, _namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = Self>,
    {
        Api::all(client)
    }
}
