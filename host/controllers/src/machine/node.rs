//! The machine's Node as the Machine controller handles it: finding it
//! (by providerID while alive, by its recorded uid while deleting), keeping
//! the granted managed labels on it, and deleting it after the instance.

use super::{CONTROLLER, Context};
use capstan_api::{ANNOTATION_LABELS_FROM_MACHINE, Machine, MachineStatus};
use capstan_kit::{Error, key_of, kube_err};
use capstan_planner::metadata::carry_to_node;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;

/// Keep the machine's Cluster API managed labels (`node-role.kubernetes.io/…`,
/// `node.cluster.x-k8s.io/…`, `node-restriction.kubernetes.io/…`) on its
/// Node, recording which ones in `cluster.x-k8s.io/labels-from-machine` so
/// one removed from the machine leaves the Node and others' labels stay.
pub(super) async fn carry_labels_to_node(
    ctx: &Context,
    machine: &Machine,
    node: &Node,
) -> Result<(), Error> {
    let recorded = node.annotations().get(ANNOTATION_LABELS_FROM_MACHINE);
    // What the admin granted the Plugin that runs the machine.
    let granted = ctx
        .kube
        .stores
        .plugins
        .get(&ObjectRef::new(machine.instance_plugin()))
        .map(|p| p.spec.grants.node_labels.clone())
        .unwrap_or_default();
    let Some(change) = carry_to_node(
        machine.labels(),
        node.labels(),
        recorded.map(String::as_str),
        &granted,
    ) else {
        return Ok(());
    };
    let patch = serde_json::json!({
        "metadata": {
            "labels": change.labels,
            "annotations": { ANNOTATION_LABELS_FROM_MACHINE: change.carried.labels.join(",") },
        }
    });
    let failing = format!("cannot carry the labels of machine {} to", key_of(machine));
    crate::nodedrain::patch_node(&ctx.kube, node, &patch, "node_labels", &failing).await
}

/// Delete the machine's Node object once its instance is gone (a cloud's
/// node controller may have done it already).
pub(super) async fn delete_node(ctx: &Context, node: &Node) -> Result<(), Error> {
    let api: Api<Node> = Api::all(ctx.kube.client.clone());
    let params = kube::api::DeleteParams {
        preconditions: node.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&node.name_any(), &params).await {
        Ok(_) => {
            ctx.kube.metrics.wrote(CONTROLLER, "delete_node");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("cannot delete Node {}", node.name_any()))(
            e,
        )),
    }
}

/// The Node this machine recorded, if it is still that Node: same name,
/// same uid (`status.nodeRef.uid`) and this machine's providerID. A Node
/// re-registered under a reused name (EC2 names follow reused IPs) belongs
/// to another instance and is never drained or deleted for this machine.
pub(super) fn own_node(nodes: &Store<Node>, status: &MachineStatus) -> Option<Arc<Node>> {
    let recorded = status.node_ref.as_ref()?;
    let node = nodes.get(&ObjectRef::new(&recorded.name))?;
    let same_uid = recorded.uid.is_none() || node.uid() == recorded.uid;
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    let same_instance =
        status.provider_id.is_none() || provider_id == status.provider_id.as_deref();
    (same_uid && same_instance).then_some(node)
}

pub(crate) fn find_node(nodes: &Store<Node>, provider_id: &str) -> Option<Arc<Node>> {
    nodes.find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id))
}

pub(super) fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
