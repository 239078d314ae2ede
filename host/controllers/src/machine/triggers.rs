//! What wakes the Machine controller: its Machines, their Plugins, the
//! Nodes of the cluster Capstan runs in (and their deletions), the
//! deployments' spec changes, and each workload cluster's Node and
//! reachability changes; and the fair queue's flow of a Machine.

use super::{CONTROLLER, Context, reconcile};
use capstan_api::{LABEL_DEPLOYMENT_NAME, Machine, MachineDeployment, Plugin};
use capstan_kit::controller::Spec;
use capstan_kit::objects::machines_of_node;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use std::sync::Arc;

#[allow(clippy::too_many_arguments)]
pub(crate) async fn controller(
    machines: ReflectHandle<Machine>,
    plugins: ReflectHandle<Plugin>,
    nodes: ReflectHandle<Node>,
    deleted_nodes: impl futures::Stream<Item = Arc<Node>> + Send + 'static,
    deployments: ReflectHandle<MachineDeployment>,
    ctx: Arc<Context>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let store = ctx.kube.stores.machines.clone();
    let (by_plugin, by_node, by_deleted_node) = (store.clone(), store.clone(), store.clone());
    let by_deployment = store.clone();
    let ids = ctx.kube.stores.machine_ids.clone();
    let ids_of_deleted = ids.clone();
    // A deployment's spec change (a new generation) reaches its machines'
    // `UpToDate` at once; its status changes do not wake them.
    let generations = std::sync::Mutex::new(std::collections::HashMap::<String, i64>::new());
    // A deleted Node reaches its machine at once: its instance may be gone.
    let node_deletions = deleted_nodes.flat_map(move |node| {
        futures::stream::iter(
            machines_of_node(&by_deleted_node, &ids_of_deleted, &node)
                .iter()
                .map(|m| ObjectRef::from_obj(m.as_ref()))
                .collect::<Vec<_>>(),
        )
    });
    // A workload cluster's Node changes reach its machines, and its
    // reachability changes reach every machine of it.
    let by_cluster = (store.clone(), ctx.kube.stores.machine_ids.clone());
    let workload = ctx.clusters.events().flat_map(move |event| {
        let (machines, ids) = &by_cluster;
        futures::stream::iter(machines_of_event(machines, ids, &event))
    });
    let node_deletions = futures::stream::select(node_deletions, workload);
    let watches = move |controller: Controller<Machine>| {
        controller
            .watches_shared_stream(plugins, move |plugin: Arc<Plugin>| {
                let name = plugin.name_any();
                machines_where(&by_plugin, |m| {
                    m.spec.provider.plugin == name || m.instance_plugin() == name
                })
            })
            .watches_shared_stream(nodes, move |node: Arc<Node>| {
                machines_of_node(&by_node, &ids, &node)
                    .iter()
                    .map(|m| ObjectRef::from_obj(m.as_ref()))
                    .collect::<Vec<_>>()
            })
            .watches_shared_stream(deployments, move |md: Arc<MachineDeployment>| {
                let generation = md.metadata.generation.unwrap_or(0);
                let uid = md.uid().unwrap_or_default();
                let mut seen = generations.lock().unwrap_or_else(|p| p.into_inner());
                if seen.insert(uid, generation) == Some(generation) {
                    return vec![];
                }
                let (namespace, name) = (md.namespace(), md.name_any());
                machines_where(&by_deployment, |m| {
                    m.namespace() == namespace
                        && m.labels().get(LABEL_DEPLOYMENT_NAME) == Some(&name)
                })
            })
            .reconcile_on(node_deletions)
    };
    // Queued per namespace (and workload cluster) and per provider Plugin:
    // a hanging provider or a stopped workload API server holds at most
    // its share of the workers.
    let spec = Spec::new(CONTROLLER, machines, store, concurrency).with_flow(|m| {
        capstan_kit::fair::Flow::of(
            m.metadata.namespace.as_deref().unwrap_or_default(),
            m.spec.cluster_name.as_deref(),
            Some(&m.spec.provider.plugin),
        )
    });
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// The machines a workload cluster's event concerns.
pub(crate) fn machines_of_event(
    machines: &Store<Machine>,
    ids: &capstan_kit::claims::ProviderIds,
    event: &capstan_kit::workload::ClusterEvent,
) -> Vec<ObjectRef<Machine>> {
    use capstan_kit::workload::ClusterEvent;
    let in_cluster = |key: &capstan_kit::workload::ClusterKey, m: &Machine| {
        m.spec.cluster_name.as_deref() == Some(key.name.as_str())
            && m.namespace().as_deref() == Some(key.namespace.as_str())
    };
    match event {
        ClusterEvent::Node(key, node) => machines_of_node(machines, ids, node)
            .iter()
            .filter(|m| in_cluster(key, m))
            .map(|m| ObjectRef::from_obj(m.as_ref()))
            .collect(),
        ClusterEvent::Reach(key) => machines_where(machines, |m| in_cluster(key, m)),
    }
}

fn machines_where(
    store: &Store<Machine>,
    keep: impl Fn(&Machine) -> bool,
) -> Vec<ObjectRef<Machine>> {
    store
        .state()
        .iter()
        .filter(|m| keep(m))
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}
