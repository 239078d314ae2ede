//! The machine's Node as the Machine controller handles it: finding it
//! (by providerID while alive, if the claim holds; by its recorded uid
//! while deleting), keeping
//! the granted managed labels and its taints on it, and deleting it after
//! the instance.

use super::CONTROLLER;
use capstan_api::{
    ANNOTATION_LABELS_FROM_MACHINE, ANNOTATION_TAINTS_FROM_MACHINE, ANNOTATION_TAINTS_INITIALIZED,
    AdoptedBy, Machine, MachineStatus,
};
use capstan_kit::unseen::UnseenWrites;
use capstan_kit::{Error, Kube, key_of, kube_err};
use capstan_planner::metadata::carry_to_node;
use capstan_planner::node_claim;
use capstan_planner::taints::{self, Taint, Wanted};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;

/// Keep the machine's Cluster API managed labels (`node-role.kubernetes.io/…`,
/// `node.cluster.x-k8s.io/…`, `node-restriction.kubernetes.io/…`) on its
/// Node, recording which ones in `cluster.x-k8s.io/labels-from-machine` so
/// one removed from the machine leaves the Node and others' labels stay.
/// Put Cluster API's annotations that point from the Node to its Machine on
/// the Node, when it lacks them (one patch, once). Returns the Node as
/// written, `None` when nothing was.
pub(super) async fn annotate_node(
    kube: &Kube,
    machine: &Machine,
    node: &Node,
) -> Result<Option<Node>, Error> {
    let Some(missing) = wanted_annotations(machine, node) else {
        return Ok(None);
    };
    let patch = serde_json::json!({ "metadata": { "annotations": missing } });
    let failing = format!("cannot annotate, for machine {},", key_of(machine));
    crate::nodedrain::patch_node(kube, node, &patch, "node_annotations", &failing).await
}

/// Cluster API's annotations pointing from `node` to `machine` that the
/// Node lacks, if any.
fn wanted_annotations(
    machine: &Machine,
    node: &Node,
) -> Option<std::collections::BTreeMap<String, String>> {
    let owner = machine
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.as_str(), o.name.as_str()));
    capstan_planner::metadata::node_annotations(
        &machine.name_any(),
        &machine.namespace().unwrap_or_default(),
        machine.spec.cluster_name.as_deref(),
        owner,
        node.annotations(),
    )
}

pub(super) async fn carry_labels_to_node(
    kube: &Kube,
    machine: &Machine,
    node: &Node,
) -> Result<Option<Node>, Error> {
    let recorded = node.annotations().get(ANNOTATION_LABELS_FROM_MACHINE);
    // What the admin granted the Plugin that runs the machine.
    let granted = kube
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
        return Ok(None);
    };
    let patch = serde_json::json!({
        "metadata": {
            "labels": change.labels,
            "annotations": { ANNOTATION_LABELS_FROM_MACHINE: change.carried.labels.join(",") },
        }
    });
    let failing = format!("cannot carry the labels of machine {} to", key_of(machine));
    crate::nodedrain::patch_node(kube, node, &patch, "node_labels", &failing).await
}

/// Keep the machine's taints on its Node (`Always` ones for as long as it
/// has them, `OnInitialization` ones once, when the Node has joined),
/// recording the ones it owns in `cluster.x-k8s.io/taints-from-machine`
/// and the initialization in `capstan.dev/taints-initialized`. The Node's
/// taints are one list others write too (the node lifecycle controller,
/// at join time above all): the patch carries the Node's resourceVersion,
/// and a conflict is retried on a fresh read.
pub(super) async fn carry_taints_to_node(
    kube: &Kube,
    machine: &Machine,
    node: &Node,
) -> Result<Option<Node>, Error> {
    let wanted = crate::template::wanted_taints(&machine.spec);
    if let Err(why) = taints::check(&wanted) {
        // A MachineDeployment refuses these; a Machine made by hand says
        // it in the log and carries none.
        tracing::warn!(machine = %key_of(machine), "spec.{why}");
        return Ok(None);
    }
    let api: Api<Node> = Api::all(kube.client.clone());
    let mut node = node.clone();
    for attempt in 1..=3 {
        let Some(patch) = taints_patch(&node, &wanted) else {
            return Ok(None);
        };
        let name = node.name_any();
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                kube.metrics.wrote(CONTROLLER, "node_taints");
                return Ok(Some(written));
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 3 => {
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => node = fresh,
                    Ok(None) => return Ok(None),
                    Err(e) => {
                        return Err(kube_err(format!("cannot read Node {name}"))(e));
                    }
                }
            }
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot carry the taints of machine {} to Node {name}",
                    key_of(machine)
                ))(e));
            }
        }
    }
    Ok(None)
}

/// Taints the node lifecycle controller keeps on a Node that has not
/// joined (or has gone away).
const NOT_JOINED: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The merge patch that carries `wanted` to `node` (guarded by its
/// resourceVersion), or `None` when the Node already has them.
fn taints_patch(node: &Node, wanted: &[Wanted]) -> Option<serde_json::Value> {
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let on_node: Vec<Taint> = existing
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        })
        .collect();
    let recorded = node.annotations().get(ANNOTATION_TAINTS_FROM_MACHINE);
    // `OnInitialization` taints go on once the Node has joined: Ready, and
    // the node lifecycle controller done with its `not-ready` taint (an
    // older one rewrites the whole list from what it read, which would
    // drop a taint set just before). The marker is written with them, so
    // they are set exactly once.
    let initializing = !node
        .annotations()
        .contains_key(ANNOTATION_TAINTS_INITIALIZED)
        && wanted.iter().any(|w| !w.always)
        && node_is_ready(node)
        && !existing
            .iter()
            .any(|t| NOT_JOINED.contains(&t.key.as_str()));
    let change = match taints::carry(&on_node, wanted, recorded.map(String::as_str), initializing) {
        Some(change) => change,
        None if initializing => taints::Change {
            taints: on_node,
            owned: recorded.cloned().unwrap_or_default(),
        },
        None => return None,
    };
    let taints: Vec<serde_json::Value> = change
        .taints
        .iter()
        .map(|t| {
            let mut v = serde_json::json!({ "key": t.key, "effect": t.effect });
            if !t.value.is_empty() {
                v["value"] = t.value.clone().into();
            }
            // Kept for taints already there: NoExecute tolerations count
            // from it.
            if let Some(added) = existing
                .iter()
                .find(|e| e.key == t.key && e.effect == t.effect)
                .and_then(|e| e.time_added.as_ref())
            {
                v["timeAdded"] = serde_json::json!(added);
            }
            v
        })
        .collect();
    let mut annotations = serde_json::json!({ ANNOTATION_TAINTS_FROM_MACHINE: change.owned });
    if initializing {
        annotations[ANNOTATION_TAINTS_INITIALIZED] = "true".into();
    }
    Some(serde_json::json!({
        "metadata": {
            "resourceVersion": node.resource_version(),
            "annotations": annotations,
        },
        "spec": { "taints": taints },
    }))
}

/// Delete the machine's Node object once its instance is gone (a cloud's
/// node controller may have done it already).
pub(super) async fn delete_node(kube: &Kube, node: &Node) -> Result<(), Error> {
    let api: Api<Node> = Api::all(kube.client.clone());
    let params = kube::api::DeleteParams {
        preconditions: node.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&node.name_any(), &params).await {
        Ok(_) => {
            kube.metrics.wrote(CONTROLLER, "delete_node");
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
pub(crate) fn own_node(nodes: &Store<Node>, status: &MachineStatus) -> Option<Arc<Node>> {
    let recorded = status.node_ref.as_ref()?;
    let node = nodes.get(&ObjectRef::new(&recorded.name))?;
    let same_uid = recorded.uid.is_none() || node.uid() == recorded.uid;
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    let same_instance =
        status.provider_id.is_none() || provider_id == status.provider_id.as_deref();
    (same_uid && same_instance).then_some(node)
}

/// The Node name a Machine's join identity allows: its own name, when
/// Capstan renders its bootstrap data (`spec.bootstrap.plugin`: the host
/// decides the Node name, mints the token, and approves a certificate for
/// `system:node:<that name>` alone).
pub(crate) fn join_identity(machine: &Machine) -> Option<String> {
    machine
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.plugin.as_ref())
        .map(|_| machine.name_any())
}

/// The Node that is `machine`'s, if it may take it as its own
/// ([`capstan_planner::node_claim`]): a bootstrapped Machine's is the Node
/// its join identity made (its name); any other's the Node carrying
/// `provider_id`. `Err((node, why))` when such a Node is there and the
/// claim is refused. `prefix` is what the Plugin's manifest declares.
///
/// A Machine Capstan did not bootstrap takes a Node the first time only
/// after asking the API server, across shards, that no other Machine holds
/// it or is the join identity behind it, and then claims it atomically
/// ([`take`]).
pub(super) async fn claimed_node(
    kube: &Kube,
    machine: &Machine,
    prefix: Option<&str>,
    provider_id: &str,
    written: &UnseenWrites,
) -> Result<Option<Arc<Node>>, (String, String)> {
    let identity = join_identity(machine);
    let nodes = &kube.stores.nodes;
    let node = match &identity {
        Some(name) => nodes
            .get(&ObjectRef::new(name))
            .or_else(|| find_node(nodes, provider_id)),
        None => find_node(nodes, provider_id),
    };
    let Some(node) = node else {
        return Ok(None);
    };
    let refused = |why: String| (node.name_any(), why);
    let linked = machine
        .status
        .as_ref()
        .and_then(|s| s.node_ref.as_ref())
        .is_some_and(|r| r.name == node.name_any() && r.uid.is_some() && r.uid == node.uid());
    let control_plane_granted = kube
        .stores
        .plugins
        .get(&ObjectRef::new(machine.instance_plugin()))
        .is_some_and(|p| p.spec.grants.control_plane_nodes);
    let seconds = |t: Option<capstan_api::Time>| t.map_or(0, |t| t.0.as_second());
    let node_name = node.name_any();
    let claim = node_claim::Claim {
        provider_id,
        node_name: &node_name,
        node_provider_id: node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        join_identity: identity.as_deref(),
        // The Machine that took the Node first keeps it: a second one
        // naming the same ID cannot take it away (nor, by a health check,
        // have the first one remediated).
        shared_with: (!linked)
            .then(|| {
                kube.stores
                    .machine_ids
                    .another_claimant(provider_id, machine)
            })
            .flatten()
            .map(|(namespace, name)| format!("{namespace}/{name}")),
        declared_prefix: prefix,
        control_plane_node: node_claim::CONTROL_PLANE_LABELS
            .iter()
            .any(|l| node.labels().contains_key(*l)),
        control_plane_granted,
        node_created: seconds(node.creation_timestamp()),
        machine_created: seconds(machine.creation_timestamp()),
        adopted_node: adopted_node(machine, &node),
    };
    node_claim::check(&claim).map_err(|r| refused(r.to_string()))?;
    // A cache that has not shown this Machine's own last write to the Node
    // (its claim, above all) shows it unclaimed: taking it again would
    // fail the claim's test.
    let unseen = written.wait_for(machine, node.as_ref()).is_some();
    if identity.is_none() && !linked && !unseen {
        held_elsewhere(kube, machine, &node)
            .await
            .map_err(refused)?;
        // The Node as the claim left it, for the steps after this one.
        if let Some(taken) = take(kube, machine, &node).await.map_err(refused)? {
            written.wrote_for(machine, node.as_ref());
            return Ok(Some(Arc::new(taken)));
        }
    }
    Ok(Some(node))
}

/// Why another Machine holds `node` (its Cluster API annotations name a
/// Machine that exists), or is the join identity behind it (a bootstrapped
/// Machine of the Node's name), if one does. Asked of the API server when
/// this shard's cache cannot see every Machine.
async fn held_elsewhere(kube: &Kube, machine: &Machine, node: &Node) -> Result<(), String> {
    let me = (machine.namespace().unwrap_or_default(), machine.name_any());
    let annotations = node.annotations();
    if let (Some(name), Some(namespace)) = (
        annotations.get("cluster.x-k8s.io/machine"),
        annotations.get("cluster.x-k8s.io/cluster-namespace"),
    ) && (namespace, name) != (&me.0, &me.1)
        && machine_exists(kube, namespace, name).await?
    {
        return Err(format!(
            "Machine {namespace}/{name} holds it (the Node's Cluster API annotations name it, and it exists)"
        ));
    }
    let node_name = node.name_any();
    let namesakes: Vec<Machine> = if kube.sharded {
        Api::<Machine>::all(kube.home.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={node_name}")))
            .await
            .map_err(|e| format!("cannot ask which Machines are named {node_name}: {e}"))?
            .items
    } else {
        kube.stores
            .machines
            .state()
            .iter()
            .filter(|m| m.name_any() == node_name)
            .map(|m| m.as_ref().clone())
            .collect()
    };
    if let Some(owner) = namesakes.iter().find(|m| {
        join_identity(m).is_some() && (m.namespace().unwrap_or_default(), m.name_any()) != me
    }) {
        return Err(format!(
            "it is the join identity of Machine {}/{}: only that Machine's certificate could create Node {node_name}",
            owner.namespace().unwrap_or_default(),
            owner.name_any()
        ));
    }
    Ok(())
}

/// Whether Machine `namespace/name` exists: this shard's cache, then (when
/// sharded and not there) the API server.
async fn machine_exists(kube: &Kube, namespace: &str, name: &str) -> Result<bool, String> {
    if kube
        .stores
        .machines
        .get(&ObjectRef::new(name).within(namespace))
        .is_some()
    {
        return Ok(true);
    }
    if !kube.sharded {
        return Ok(false);
    }
    Api::<Machine>::namespaced(kube.home.clone(), namespace)
        .get_metadata_opt(name)
        .await
        .map(|m| m.is_some())
        .map_err(|e| format!("cannot read Machine {namespace}/{name}: {e}"))
}

/// Claim `node` for `machine` in one atomic write: its Cluster API
/// annotations (all of those [`annotate_node`] keeps), added only if no
/// Machine's are there (a JSON patch that tests the claim's keys are
/// absent, or still name the stale holder that was checked), so two
/// Machines of different shards cannot both take it. Already this
/// Machine's: nothing to write. Returns the Node as written, `None` when
/// nothing was.
async fn take(kube: &Kube, machine: &Machine, node: &Node) -> Result<Option<Node>, String> {
    let annotations = node.annotations();
    let name = machine.name_any();
    let namespace = machine.namespace().unwrap_or_default();
    if annotations.get("cluster.x-k8s.io/machine") == Some(&name)
        && annotations.get("cluster.x-k8s.io/cluster-namespace") == Some(&namespace)
    {
        return Ok(None);
    }
    let Some(missing) = wanted_annotations(machine, node) else {
        return Ok(None);
    };
    let pointer = |key: &str| format!("/metadata/annotations/{}", key.replace('/', "~1"));
    let mut ops = Vec::new();
    if node.metadata.annotations.is_none() {
        ops.push(serde_json::json!({"op": "test", "path": "/metadata/annotations", "value": null}));
        ops.push(serde_json::json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    } else {
        for key in [
            "cluster.x-k8s.io/machine",
            "cluster.x-k8s.io/cluster-namespace",
        ] {
            let seen = annotations
                .get(key)
                .map_or(serde_json::Value::Null, |v| v.as_str().into());
            ops.push(serde_json::json!({"op": "test", "path": pointer(key), "value": seen}));
        }
    }
    for (key, value) in &missing {
        ops.push(serde_json::json!({"op": "add", "path": pointer(key), "value": value}));
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).map_err(|e| e.to_string())?;
    match Api::<Node>::all(kube.client.clone())
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(taken) => {
            kube.metrics.wrote(CONTROLLER, "node_annotations");
            Ok(Some(taken))
        }
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => Err(
            "another Machine claimed it first (its annotations changed while this Machine took it); the next pass looks again"
                .into(),
        ),
        Err(e) => Err(format!("cannot claim it: {e}")),
    }
}

/// Whether the Machine adopted the instance behind `node` and the Node
/// may predate it: adopted by `spec.providerID` (under the admin's
/// grant), or by its tags with the Node's Cluster API annotations naming
/// this Machine already (its Node before a restore or re-apply).
fn adopted_node(machine: &Machine, node: &Node) -> bool {
    match machine.status.as_ref().and_then(|s| s.adopted) {
        Some(AdoptedBy::ProviderID) => true,
        Some(AdoptedBy::Tags) => {
            let annotations = node.annotations();
            annotations.get("cluster.x-k8s.io/machine") == Some(&machine.name_any())
                && annotations.get("cluster.x-k8s.io/cluster-namespace")
                    == machine.namespace().as_ref()
        }
        None => false,
    }
}

/// The Node whose `spec.providerID` is `provider_id` (a scan of the Node
/// cache; whether a Machine may take it is [`claimed_node`]'s question).
fn find_node(nodes: &Store<Node>, provider_id: &str) -> Option<Arc<Node>> {
    nodes.find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id))
}

pub(super) fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
