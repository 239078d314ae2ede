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
use capstan_kit::workload::{ClusterKey, Handle};
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

    /// Why its Node cannot be reached now, if it cannot.
    pub(crate) fn down(&self) -> Option<(String, String)> {
        match self {
            Reach::Here | Reach::Workload(_) => None,
            Reach::Unusable(reason, message) => Some(((*reason).to_string(), message.clone())),
            Reach::Unreachable(message) => Some(("ConnectionDown".into(), message.clone())),
        }
    }
}

/// The cluster `machine` names, as the caches and the cluster handles say
/// now; and whether that Cluster is paused.
pub(crate) fn reach(ctx: &Context, machine: &Machine) -> (Reach, bool) {
    let Some(name) = machine.spec.cluster_name.as_deref() else {
        return (Reach::Here, false);
    };
    reach_named(
        &ctx.kube,
        &ctx.clusters,
        &machine.namespace().unwrap_or_default(),
        name,
    )
}

/// The cluster `name` of `namespace`: the same question for any object
/// that names one (a health check, a CSR's Machine).
pub(crate) fn reach_named(
    kube: &Kube,
    clusters: &capstan_kit::workload::WorkloadClusters,
    namespace: &str,
    name: &str,
) -> (Reach, bool) {
    let key = ClusterKey::new(namespace, name);
    let Some(cluster) = kube
        .stores
        .clusters
        .get(&ObjectRef::new(name).within(namespace))
    else {
        return (
            Reach::Unusable(
                "ClusterNotFound",
                format!(
                    "spec.clusterName: Cluster {key} does not exist; create it (its kubeconfig in Secret {name}-kubeconfig) or name another"
                ),
            ),
            false,
        );
    };
    let paused = cluster.spec.paused;
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
        return (
            Reach::Unusable(
                "ClusterUnavailable",
                format!("Cluster {key} cannot be reached: {why}"),
            ),
            paused,
        );
    };
    handle.watching();
    if let Err(why) = handle.reachable() {
        return (Reach::Unreachable(why), paused);
    }
    if !handle.synced() {
        return (
            Reach::Unusable(
                "ClusterCacheSyncing",
                format!("Cluster {key}'s Nodes are being listed"),
            ),
            paused,
        );
    }
    (Reach::Workload(handle), paused)
}
