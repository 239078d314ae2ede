//! Ownership between objects: who controls an object, the owner reference
//! a controller puts on what it creates, and adopting an orphan (only as
//! the cache saw it, so a concurrent change is never overwritten).

use crate::{Error, Kind, Kube, key_of, kube_err};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

/// The controller-owner key (`namespace/name`) of an object, if it has one
/// of the given kind.
pub fn owner_key<K: Resource>(obj: &K, owner_kind: &str) -> Option<String> {
    let owner = obj
        .meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == owner_kind)?;
    Some(format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        owner.name
    ))
}

/// The kind of the object that controls `obj`, if any.
pub fn owner_reference_kind(obj: &impl Resource) -> Option<&str> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.as_str())
}

/// Whether an object is controlled by the object with this uid.
pub fn controlled_by(machine: &impl Resource, uid: &str) -> bool {
    machine
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The object that controls `obj`, if it is of kind `O`: the one to wake
/// when `obj` changes or goes.
pub fn controller_of<O: Resource<DynamicType = ()>>(obj: &impl Resource) -> Option<ObjectRef<O>> {
    let owner = obj
        .meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    if owner.kind != O::kind(&()) {
        return None;
    }
    let reference = ObjectRef::new(&owner.name);
    Some(match obj.meta().namespace.as_deref() {
        Some(namespace) => reference.within(namespace),
        None => reference,
    })
}

/// The controller owner reference for objects `owner` creates or adopts.
pub fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Make `owner` the controller of `orphan` (an object no controller owns
/// whose labels the owner's selector matches), only as the cache saw it:
/// `false` when it changed or went meanwhile (the next pass looks again).
pub async fn adopt<K, O>(
    api: &Api<K>,
    kube: &Kube,
    controller: &'static str,
    owner: &O,
    orphan: &K,
) -> Result<bool, Error>
where
    K: Kind,
    O: Resource<DynamicType = ()>,
{
    let mut owners = orphan.owner_references().to_vec();
    owners.push(owner_reference(owner));
    let patch = serde_json::json!({
        "metadata": {
            "ownerReferences": owners,
            "resourceVersion": orphan.resource_version(),
        }
    });
    let kind = K::kind(&());
    match api
        .patch(
            &orphan.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            kube.metrics.wrote(controller, "adopt");
            tracing::info!(owner = %key_of(owner), %kind, orphan = %orphan.name_any(), "adopted an orphan");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(false),
        Err(e) => Err(kube_err(format!("cannot adopt {kind} {}", key_of(orphan)))(
            e,
        )),
    }
}

/// The objects among `candidates` (in `owner`'s namespace) that `owner`
/// controls, with the orphans its `selector` matches adopted — as
/// controller-runtime's and Cluster API's owners claim theirs. `None` when
/// an orphan changed while it was adopted: plan again with a fresh view
/// rather than count without it and create a duplicate.
pub async fn claim<K, O>(
    api: &Api<K>,
    kube: &Kube,
    controller: &'static str,
    owner: &O,
    selector: &capstan_api::LabelSelector,
    candidates: impl IntoIterator<Item = std::sync::Arc<K>>,
) -> Result<Option<Vec<std::sync::Arc<K>>>, Error>
where
    K: Kind,
    O: Resource<DynamicType = ()>,
{
    let namespace = owner.meta().namespace.clone();
    let uid = owner.meta().uid.clone().unwrap_or_default();
    let mut claimed = Vec::new();
    for candidate in candidates
        .into_iter()
        .filter(|c| c.meta().namespace == namespace)
    {
        if controlled_by(candidate.as_ref(), &uid) {
            claimed.push(candidate);
        } else if candidate
            .owner_references()
            .iter()
            .all(|o| o.controller != Some(true))
            && candidate.meta().deletion_timestamp.is_none()
            && capstan_api::selector_matches(selector, candidate.labels())
        {
            if !adopt(api, kube, controller, owner, candidate.as_ref()).await? {
                return Ok(None);
            }
            claimed.push(candidate);
        }
    }
    Ok(Some(claimed))
}
