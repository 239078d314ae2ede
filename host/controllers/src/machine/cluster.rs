//! Which cluster a Machine's Node lives in, and whether it can be reached
//! now: the cluster Capstan runs in (no `spec.clusterName`), or a workload
//! `Cluster` of the Machine's namespace through its handle
//! ([`capstan_kit::workload`]). Every Node-side action of a pass (the
//! claim, labels and taints, bootstrap tokens, drains, volume waits, Node
//! deletion) goes through [`Reach::kube`]; none is tried while the cluster
//! cannot be reached.

use super::Context;
use capstan_api::Machine;
use capstan_kit::Kube;
use capstan_kit::workload::{ClusterKey, Handle, WorkloadClusters};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;

/// Where a Machine's Node is, as a pass found it.
#[derive(Debug)]
pub(crate) enum Reach {
    /// The cluster Capstan runs in.
    Here,
    /// A workload cluster that answers.
    Workload(Arc<Handle>),
    /// A workload cluster that cannot be used: (reason, message).
    Unusable(&'static str, String),
    /// A workload cluster that does not answer (why).
    Unreachable(String),
}

impl Reach {
    /// The Kubernetes view its Node-side actions use, when there is one.
    pub(crate) fn kube<'a>(&'a self, here: &'a Kube) -> Option<&'a Kube> {
        match self {
            Reach::Here => Some(here),
            Reach::Workload(handle) => Some(&handle.kube),
            Reach::Unusable(..) | Reach::Unreachable(_) => None,
        }
    }

    /// The Eviction API of its cluster, when it is a workload cluster's.
    pub(crate) fn evictions(&self) -> Option<crate::nodedrain::Evictions> {
        match self {
            Reach::Workload(handle) => {
                Some(crate::nodedrain::Evictions::new(handle.evictions.clone()))
            }
            _ => None,
        }
    }

    /// Why its Node cannot be reached now, if it cannot.
    pub(crate) fn down(&self) -> Option<(String, String)> {
        match self {
            Reach::Here | Reach::Workload(_) => None,
            Reach::Unusable(reason, message) => Some(((*reason).to_string(), message.clone())),
            Reach::Unreachable(message) => Some(("ConnectionDown".into(), message.clone())),
        }
    }
}

/// The Cluster a Machine names, as a pass found it.
#[derive(Debug)]
pub(crate) struct Placement {
    /// Where its Node is and whether it can be reached.
    pub(crate) reach: Reach,
    /// The Cluster's `spec.paused`: the Machine holds still.
    pub(crate) paused: bool,
    /// The Cluster is gone, or is being deleted and cannot be reached: a
    /// deleting Machine does not drain, wait for volumes or delete its
    /// Node, as Cluster API does for a cluster being deleted.
    pub(crate) cluster_gone: bool,
}

impl Placement {
    fn here() -> Self {
        Placement {
            reach: Reach::Here,
            paused: false,
            cluster_gone: false,
        }
    }
}

/// The cluster `machine` names, as the caches and the cluster handles say
/// now.
pub(crate) fn placement(ctx: &Context, machine: &Machine) -> Placement {
    let Some(name) = machine.spec.cluster_name.as_deref() else {
        return Placement::here();
    };
    placement_named(
        &ctx.kube,
        &ctx.clusters,
        &machine.namespace().unwrap_or_default(),
        name,
    )
}

/// The cluster `name` of `namespace`: the same question for any object
/// that names one (a health check).
pub(crate) fn placement_named(
    kube: &Kube,
    clusters: &WorkloadClusters,
    namespace: &str,
    name: &str,
) -> Placement {
    let key = ClusterKey::new(namespace, name);
    let Some(cluster) = kube
        .stores
        .clusters
        .get(&ObjectRef::new(name).within(namespace))
    else {
        return Placement {
            reach: Reach::Unusable(
                "ClusterNotFound",
                format!(
                    "spec.clusterName: Cluster {key} does not exist; create it (with its kubeconfig in Secret {name}-kubeconfig) or name another"
                ),
            ),
            paused: false,
            cluster_gone: true,
        };
    };
    let paused = cluster.spec.paused;
    let deleting = cluster.metadata.deletion_timestamp.is_some();
    // A Cluster being deleted whose API server cannot be reached holds no
    // Machine's deletion: its Nodes are not drained or deleted. One that
    // answers has its Nodes drained (Capstan does not delete the workload
    // cluster's control plane, so the workloads live on).
    let placed = |reach: Reach| Placement {
        cluster_gone: deleting && reach.down().is_some(),
        reach,
        paused,
    };
    let Some(handle) = clusters.get(&key) else {
        let why = cluster
            .status
            .as_ref()
            .and_then(|s| {
                capstan_api::condition(
                    &s.conditions,
                    capstan_api::cluster_conditions::REMOTE_CONNECTION_PROBE,
                )
            })
            .filter(|c| c.status == capstan_api::status::FALSE)
            .map(|c| format!("{} ({})", c.message, c.reason))
            .unwrap_or_else(|| "its connection is not made yet".into());
        return placed(Reach::Unusable(
            "ClusterUnavailable",
            format!("Cluster {key} cannot be reached: {why}"),
        ));
    };
    handle.watching();
    if let Err(why) = handle.reachable() {
        return placed(Reach::Unreachable(why));
    }
    if !handle.synced() {
        return placed(Reach::Unusable(
            "ClusterCacheSyncing",
            format!("Cluster {key}'s Nodes are being listed"),
        ));
    }
    placed(Reach::Workload(handle))
}
