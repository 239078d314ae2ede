//! The Cluster controller: keeps each workload `Cluster`'s connection (a
//! handle in [`WorkloadClusters`], made from its kubeconfig Secret, read
//! again every probe interval so a rotated or deleted Secret takes effect
//! without a restart; its watches and CSR approver run only while some
//! object names the cluster), answers its Machines' node CSRs there, labels the
//! objects that name it, reports its status and runs its deletion:
//! deployments, sets and Machines go (their Nodes drained in the workload
//! cluster) before the finalizer does. What to say and do next is
//! `capstan_planner::cluster`'s; this module does the I/O.
//!
//! A paused Cluster (`spec.paused`) keeps its connection and status, and
//! its Machines, sets and deployments hold still (they read the pause
//! from the cache).

use crate::csr;
use capstan_api::{
    CLUSTER_FINALIZER, Cluster, ClusterStatus, LABEL_CLUSTER_NAME, Machine, MachineDeployment,
    MachineSet, WorkersStatus,
};
use capstan_kit::controller::Spec;
use capstan_kit::workload::{ClusterEvent, ClusterKey, Handle, WorkloadClusters};
use capstan_kit::write::{add_finalizer, apply_status, remove_finalizer};
use capstan_kit::{Conditions, Error, Kind, Kube, key_of, kube_err, now};
use capstan_planner::cluster::{self as plan, ClusterView, Connection, DeletionStep, Descendants};
use futures::StreamExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use kube::{Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

const CONTROLLER: &str = "cluster";

/// A workload cluster's CSR approver task and the handle it answers through.
type Approver = (Weak<Handle>, tokio::task::JoinHandle<()>);

/// What the Cluster controller works with.
pub(crate) struct Context {
    pub(crate) kube: Kube,
    pub(crate) clusters: WorkloadClusters,
    /// Each workload cluster's CSR approver, with the handle it answers
    /// through (replaced when the handle is).
    approvers: Mutex<HashMap<ClusterKey, Approver>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let approvers = self.approvers.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, (_, task)) in approvers.drain() {
            task.abort();
        }
    }
}

impl Context {
    pub(crate) fn new(kube: Kube, clusters: WorkloadClusters) -> Self {
        Context {
            kube,
            clusters,
            approvers: Mutex::default(),
        }
    }

    /// Answer CSRs in `handle`'s cluster (once per handle).
    fn answer_csrs(&self, handle: &Arc<Handle>) {
        let mut approvers = self.approvers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((current, _)) = approvers.get(&handle.key)
            && current.upgrade().is_some_and(|h| Arc::ptr_eq(&h, handle))
        {
            return;
        }
        handle.watching();
        let at = csr::Answering {
            management: self.kube.clone(),
            workload: Some((handle.key.clone(), handle.kube.clone())),
        };
        let task = tokio::spawn(csr::approver(at, std::future::pending()));
        if let Some((_, old)) = approvers.insert(handle.key.clone(), (Arc::downgrade(handle), task))
        {
            old.abort();
        }
    }

    /// Stop answering CSRs in a cluster and drop its connection.
    fn forget(&self, key: &ClusterKey) {
        if let Some((_, task)) = self
            .approvers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
        {
            task.abort();
        }
        self.clusters.forget(key);
    }
}

pub(crate) async fn controller(
    clusters: ReflectHandle<Cluster>,
    machines: ReflectHandle<Machine>,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let store = ctx.kube.stores.clusters.clone();
    // Reachability changes reach the Cluster's status at once.
    let reach = ctx.clusters.events().filter_map(|event| async move {
        match event {
            ClusterEvent::Reach(key) => Some(ObjectRef::new(&key.name).within(&key.namespace)),
            ClusterEvent::Node(..) => None,
        }
    });
    let watches = move |controller: Controller<Cluster>| {
        controller
            .watches_shared_stream(machines, |machine: Arc<Machine>| {
                let namespace = machine.namespace().unwrap_or_default();
                machine
                    .spec
                    .cluster_name
                    .as_deref()
                    .map(|name| ObjectRef::new(name).within(&namespace))
            })
            .reconcile_on(reach)
    };
    let spec = Spec::new(CONTROLLER, clusters, store, 4);
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// One pass over a Cluster.
async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ClusterKey::of(&cluster);
    let deleting = cluster.metadata.deletion_timestamp.is_some();
    if deleting && !cluster.finalizers().iter().any(|f| f == CLUSTER_FINALIZER) {
        ctx.forget(&key);
        return Ok(Action::await_change());
    }
    if !deleting && !cluster.spec.paused {
        add_finalizer(&ctx.kube, CONTROLLER, cluster.as_ref(), CLUSTER_FINALIZER).await?;
    }
    // The Secret is read again each pass: a rotated kubeconfig makes a new
    // connection, a deleted or refused one drops the old.
    let family = Family::of(&ctx.kube, &key);
    let mut ensured = ctx.clusters.ensure(&cluster).await;
    // Watches and the CSR approver run while some object of the cluster
    // needs them: a cluster with none left keeps only its probe.
    if let Ok(handle) = &ensured
        && family.is_empty()
        && handle.watches_started()
    {
        ctx.forget(&key);
        ensured = ctx.clusters.ensure(&cluster).await;
    }
    let connection = match ensured {
        Ok(handle) => {
            if !family.is_empty() {
                ctx.answer_csrs(&handle);
            }
            connection_of(&handle)
        }
        Err(unusable) => Connection::Unusable(unusable.reason.to_string(), unusable.message),
    };
    let view = ClusterView {
        deleting,
        paused: cluster.spec.paused,
        connection,
        descendants: family.descendants(),
    };
    if !cluster.spec.paused {
        if deleting {
            match plan::deletion_step(&view.descendants, family.all_requested()) {
                DeletionStep::DeleteDescendants => family.delete(&ctx.kube).await?,
                DeletionStep::Wait => {}
                DeletionStep::RemoveFinalizer => {
                    ctx.forget(&key);
                    remove_finalizer(&ctx.kube, CONTROLLER, cluster.as_ref(), CLUSTER_FINALIZER)
                        .await?;
                    return Ok(Action::await_change());
                }
            }
        } else {
            family.label(&ctx.kube, &key.name).await?;
        }
    }
    write_status(&ctx.kube, &cluster, &view, &family).await?;
    let interval = ctx.clusters.options().interval;
    Ok(Action::requeue(if deleting {
        interval.min(Duration::from_secs(2))
    } else {
        interval
    }))
}

/// The connection as the handle's probes report it.
fn connection_of(handle: &Handle) -> Connection {
    if let Err(why) = handle.reachable() {
        return Connection::Down(why);
    }
    if handle.health().last_success.is_none() {
        return Connection::Connecting;
    }
    Connection::Up
}

/// The objects naming a Cluster, from the caches.
struct Family {
    deployments: Vec<Arc<MachineDeployment>>,
    sets: Vec<Arc<MachineSet>>,
    machines: Vec<Arc<Machine>>,
}

impl Family {
    fn of(kube: &Kube, key: &ClusterKey) -> Family {
        let ns = Some(key.namespace.clone());
        let named = |name: Option<&String>| name.map(String::as_str) == Some(key.name.as_str());
        Family {
            deployments: kube
                .stores
                .deployments
                .state()
                .into_iter()
                .filter(|o| o.namespace() == ns && named(o.spec.cluster_name.as_ref()))
                .collect(),
            sets: kube
                .stores
                .machine_sets
                .state()
                .into_iter()
                .filter(|o| o.namespace() == ns && named(o.spec.cluster_name.as_ref()))
                .collect(),
            machines: kube
                .stores
                .machines
                .state()
                .into_iter()
                .filter(|o| o.namespace() == ns && named(o.spec.cluster_name.as_ref()))
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.deployments.is_empty() && self.sets.is_empty() && self.machines.is_empty()
    }

    fn descendants(&self) -> Descendants {
        Descendants {
            deployments: self.deployments.len(),
            sets: self.sets.iter().filter(|s| unowned(s.as_ref())).count(),
            machines: self.machines.iter().filter(|m| unowned(m.as_ref())).count(),
            all: self.sets.len() + self.machines.len(),
        }
    }

    /// Whether every top-level descendant is being deleted already.
    fn all_requested(&self) -> bool {
        let requested = |o: &kube::api::ObjectMeta| o.deletion_timestamp.is_some();
        self.deployments.iter().all(|o| requested(&o.metadata))
            && self
                .sets
                .iter()
                .filter(|s| unowned(s.as_ref()))
                .all(|o| requested(&o.metadata))
            && self
                .machines
                .iter()
                .filter(|m| unowned(m.as_ref()))
                .all(|o| requested(&o.metadata))
    }

    /// Delete the top-level descendants; their owners' garbage
    /// collection (foreground) takes the rest.
    async fn delete(&self, kube: &Kube) -> Result<(), Error> {
        for md in &self.deployments {
            delete(kube, md.as_ref()).await?;
        }
        for set in self.sets.iter().filter(|s| unowned(s.as_ref())) {
            delete(kube, set.as_ref()).await?;
        }
        for machine in self.machines.iter().filter(|m| unowned(m.as_ref())) {
            delete(kube, machine.as_ref()).await?;
        }
        Ok(())
    }

    /// Put `cluster.x-k8s.io/cluster-name` on every descendant that lacks
    /// it (the cluster-autoscaler's auto-discovery selects by it).
    async fn label(&self, kube: &Kube, name: &str) -> Result<(), Error> {
        for md in &self.deployments {
            label(kube, md.as_ref(), name).await?;
        }
        for set in &self.sets {
            label(kube, set.as_ref(), name).await?;
        }
        for machine in &self.machines {
            label(kube, machine.as_ref(), name).await?;
        }
        Ok(())
    }

    /// `status.workers`: the deployments' (and unowned sets') desired
    /// replicas and the Machines' counts.
    fn workers(&self) -> WorkersStatus {
        let desired = self
            .deployments
            .iter()
            .map(|d| d.spec.replicas)
            .sum::<i32>()
            + self
                .sets
                .iter()
                .filter(|s| unowned(s.as_ref()))
                .map(|s| s.spec.replicas)
                .sum::<i32>()
            + self.machines.iter().filter(|m| unowned(m.as_ref())).count() as i32;
        let count = |type_: &str| {
            self.machines
                .iter()
                .filter(|m| {
                    m.status
                        .as_ref()
                        .is_some_and(|s| capstan_api::is_true(&s.conditions, type_))
                })
                .count() as i32
        };
        let mut tally = crate::set_conditions::Tally::default();
        for m in &self.machines {
            tally.add(m, m.metadata.deletion_timestamp.is_some());
        }
        WorkersStatus {
            desired_replicas: desired,
            replicas: self.machines.len() as i32,
            ready_replicas: count(capstan_api::machine_conditions::READY),
            available_replicas: count(capstan_api::machine_conditions::AVAILABLE),
            up_to_date_replicas: count(capstan_api::machine_conditions::UP_TO_DATE),
            versions: tally.versions(),
        }
    }
}

fn unowned<K: Resource>(o: &K) -> bool {
    !o.meta()
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|r| r.controller == Some(true))
}

async fn delete<K: Kind<Scope = kube::core::NamespaceResourceScope>>(
    kube: &Kube,
    o: &K,
) -> Result<(), Error> {
    if o.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(kube.client.clone(), &o.namespace().unwrap_or_default());
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    match api.delete(&o.name_any(), &params).await {
        Ok(_) => {
            kube.metrics.wrote(CONTROLLER, "delete_descendant");
            tracing::info!(object = %key_of(o), kind = %K::kind(&()), "deleting for its Cluster");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("deleting {} {}", K::kind(&()), key_of(o)))(e)),
    }
}

async fn label<K: Kind<Scope = kube::core::NamespaceResourceScope>>(
    kube: &Kube,
    o: &K,
    cluster: &str,
) -> Result<(), Error> {
    if o.labels().get(LABEL_CLUSTER_NAME).map(String::as_str) == Some(cluster) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(kube.client.clone(), &o.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"labels": {LABEL_CLUSTER_NAME: cluster}}});
    match api
        .patch(
            &o.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            kube.metrics.wrote(CONTROLLER, "label");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!(
            "labelling {} {}",
            K::kind(&()),
            key_of(o)
        ))(e)),
    }
}

async fn write_status(
    kube: &Kube,
    cluster: &Cluster,
    view: &ClusterView,
    family: &Family,
) -> Result<(), Error> {
    let current = cluster.status.clone();
    let mut status: ClusterStatus = current.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let t = now();
    let mut conditions = Conditions::new(&mut status.conditions, generation, &t);
    for (type_, value, reason, message) in plan::conditions(view) {
        conditions.set(type_, value, &reason, message);
    }
    status.phase = Some(plan::phase(view).to_string());
    status.workers = Some(family.workers());
    status.observed_generation = generation;
    apply_status(kube, CONTROLLER, cluster, current.as_ref(), &status).await?;
    Ok(())
}
