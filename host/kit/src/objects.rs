//! Small facts about objects every controller asks: an object's key, its
//! controlling owner, whether it is paused, which machines back a Node,
//! and the merge patch between two versions of a value.

use capstan_api::Machine;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::reflector::Store;
use std::sync::Arc;

/// `now` as a Kubernetes timestamp.
pub fn now() -> capstan_api::Time {
    capstan_api::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Key of an object (`namespace/name`) in logs and queue bookkeeping.
pub fn key_of<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

/// Whether `obj` carries Cluster API's `cluster.x-k8s.io/paused`
/// annotation: its controller leaves it alone until the annotation goes.
pub fn paused<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(capstan_api::ANNOTATION_PAUSED))
}

/// Whether the workload `Cluster` an object names (`spec.clusterName`, in
/// its namespace) is paused (`spec.paused`): as in Cluster API, every
/// object of a paused cluster holds still.
pub fn cluster_paused(stores: &crate::Stores, namespace: &str, cluster_name: Option<&str>) -> bool {
    cluster_name.is_some_and(|name| {
        stores
            .clusters
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
            .is_some_and(|c| c.spec.paused)
    })
}

/// The machines that report `node`'s provider ID (looked up in the index,
/// read from the cache).
pub fn machines_of_node(
    machines: &Store<Machine>,
    ids: &crate::claims::ProviderIds,
    node: &Node,
) -> Vec<Arc<Machine>> {
    let Some(id) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) else {
        return vec![];
    };
    ids.machines(id)
        .into_iter()
        .filter_map(|(namespace, name)| {
            machines.get(&kube::runtime::reflector::ObjectRef::new(&name).within(&namespace))
        })
        .collect()
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`: changed
/// values, and `null` for keys `to` no longer has.
pub fn merge_patch(from: &serde_json::Value, to: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = serde_json::Map::new();
            for key in a.keys().filter(|k| !b.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            for (key, value) in b {
                match a.get(key) {
                    Some(old) if old == value => {}
                    Some(old) => {
                        patch.insert(key.clone(), merge_patch(old, value));
                    }
                    None => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}
