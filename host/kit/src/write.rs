//! Every write a controller makes to its own objects: the status (one path,
//! server-side apply, nothing when nothing changed), finalizers (added and
//! removed as kube-runtime's `finalizer()` helper does: JSON patches that
//! test the list they change, see [`finalizer_patch`]) and Events. Each write is counted in
//! `capstan_api_writes_total{controller,verb}`.

use crate::{Error, FIELD_MANAGER, Kind, Kube, REPORTING_CONTROLLER, ScopeApi, key_of, kube_err};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::Value;

/// Apply `status` to an object's status subresource with server-side apply,
/// unless it equals `current` (so idle reconciles write nothing). Returns
/// whether it wrote.
///
/// When the new status drops a list or an object that `current` has (a
/// set's `versions` at zero replicas, a deployment's `rollout` once done),
/// the write is a JSON merge patch instead, deleting what went: Kubernetes
/// 1.20's server-side apply leaves such a field `null`, which the schema
/// refuses (422), so the status would never be written.
pub async fn apply_status<K, S>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    current: Option<&S>,
    status: &S,
) -> Result<bool, Error>
where
    K: Kind,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(false);
    }
    let api: Api<K> = K::Scope::api(kube.client.clone(), obj.namespace().as_deref());
    let new = serde_json::to_value(status).unwrap_or_default();
    let old = current.and_then(|c| serde_json::to_value(c).ok());
    let verb = write_status(&api, &obj.name_any(), old.as_ref(), &new)
        .await
        .map_err(kube_err(format!(
            "cannot update the status of {} {}",
            K::kind(&()),
            obj.name_any()
        )))?;
    kube.metrics.wrote(controller, verb);
    Ok(true)
}

/// Write status `new` of object `name` (whose status is `old`) as
/// [`apply_status`] does; returns the verb it used (`apply_status` or
/// `merge_status`).
pub async fn write_status<K>(
    api: &Api<K>,
    name: &str,
    old: Option<&Value>,
    new: &Value,
) -> Result<&'static str, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match old.and_then(|old| status_merge_patch(old, new)) {
        None => {
            let patch = serde_json::json!({
                "apiVersion": K::api_version(&()),
                "kind": K::kind(&()),
                "status": new,
            });
            api.patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
            Ok("apply_status")
        }
        Some(merge) => {
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            api.patch_status(
                name,
                &params,
                &Patch::Merge(serde_json::json!({ "status": merge })),
            )
            .await?;
            Ok("merge_status")
        }
    }
}

/// The JSON merge patch that turns status `old` into `new` (`new` with every
/// key it dropped set to `null`, at any depth of nested objects), when
/// `new` drops a list or an object that server-side apply would leave
/// `null`; `None` when server-side apply of `new` is safe.
pub fn status_merge_patch(old: &Value, new: &Value) -> Option<Value> {
    /// `new` with `null` for each key of `old` it lacks; whether one of
    /// those held a list or an object.
    fn overlay(old: &Value, new: &Value) -> (Value, bool) {
        let (Value::Object(old), Value::Object(new)) = (old, new) else {
            return (new.clone(), false);
        };
        let mut merged = new.clone();
        let mut container_dropped = false;
        for (key, was) in old {
            match new.get(key) {
                None => {
                    container_dropped |= was.is_array() || was.is_object();
                    merged.insert(key.clone(), Value::Null);
                }
                Some(now) => {
                    let (inner, dropped) = overlay(was, now);
                    container_dropped |= dropped;
                    merged.insert(key.clone(), inner);
                }
            }
        }
        (Value::Object(merged), container_dropped)
    }
    let (patch, container_dropped) = overlay(old, new);
    container_dropped.then_some(patch)
}

/// Add `finalizer` to `obj` unless it has it. Returns the object as
/// written, `None` when nothing was.
pub async fn add_finalizer<K: Kind>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    finalizer: &str,
) -> Result<Option<K>, Error> {
    change_finalizer(kube, controller, obj, finalizer, FinalizerChange::Add).await
}

/// Remove `finalizer` from `obj`, keeping everyone else's. Returns the
/// object as written, `None` when nothing was (or it is gone).
pub async fn remove_finalizer<K: Kind>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    finalizer: &str,
) -> Result<Option<K>, Error> {
    change_finalizer(kube, controller, obj, finalizer, FinalizerChange::Remove).await
}

async fn change_finalizer<K: Kind>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    finalizer: &str,
    change: FinalizerChange,
) -> Result<Option<K>, Error> {
    match finalizer_patch(obj.finalizers(), finalizer, change) {
        Some(patch) => patch_finalizers(kube, controller, obj, patch).await,
        None => Ok(None),
    }
}

/// Which way a finalizer changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerChange {
    Add,
    Remove,
}

/// The JSON Patch that makes `change` to a finalizer list read as
/// `current`, or `None` when there is nothing to do. As kube-runtime's
/// `finalizer()` helper does, each patch first tests the part of the list it
/// relies on (the whole list before an add, the entry before its removal),
/// so a concurrent change to the finalizers by someone else makes it fail
/// instead of being overwritten, while a status write in between (which
/// bumps the resourceVersion) does not: a guard on the resourceVersion
/// failed most finalizer removals of a deletion wave with 409 Conflict.
pub fn finalizer_patch(
    current: &[String],
    finalizer: &str,
    change: FinalizerChange,
) -> Option<json_patch::Patch> {
    let position = current.iter().position(|f| f == finalizer);
    let ops = match (change, position) {
        (FinalizerChange::Add, Some(_)) | (FinalizerChange::Remove, None) => return None,
        (FinalizerChange::Add, None) if current.is_empty() => serde_json::json!([
            // An object without finalizers has no list to append to.
            { "op": "test", "path": "/metadata/finalizers", "value": null },
            { "op": "add", "path": "/metadata/finalizers", "value": [finalizer] },
        ]),
        (FinalizerChange::Add, None) => serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": current },
            { "op": "add", "path": "/metadata/finalizers/-", "value": finalizer },
        ]),
        (FinalizerChange::Remove, Some(i)) => serde_json::json!([
            { "op": "test", "path": format!("/metadata/finalizers/{i}"), "value": finalizer },
            { "op": "remove", "path": format!("/metadata/finalizers/{i}") },
        ]),
    };
    serde_json::from_value(ops).ok()
}

/// Apply a finalizer patch. A failed test (someone else changed the list)
/// is an error and the reconcile is retried; an object already gone is fine.
async fn patch_finalizers<K>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    patch: json_patch::Patch,
) -> Result<Option<K>, Error>
where
    K: Kind,
{
    let api: Api<K> = K::Scope::api(kube.client.clone(), obj.namespace().as_deref());
    let written = match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(written) => written,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
        Err(e) => {
            return Err(kube_err(format!(
                "cannot update the finalizers of {} {}",
                K::kind(&()),
                key_of(obj)
            ))(e));
        }
    };
    kube.metrics.wrote(controller, "patch_finalizers");
    Ok(Some(written))
}

/// The longest Event note the API server accepts (events.k8s.io: 1 kB).
pub const MAX_EVENT_NOTE: usize = 1024;

/// Record a Kubernetes Event about `object` (shown by `kubectl describe`).
/// Events are best effort: a failure to record one is logged, never fatal.
/// Callers record only when they also changed the status, so a condition
/// that stays the same does not repeat its Event every retry. A note over
/// [`MAX_EVENT_NOTE`] is cut there.
pub async fn record_event(
    kube: &Kube,
    controller: &'static str,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    type_: kube::runtime::events::EventType,
    reason: &str,
    note: String,
) {
    use kube::runtime::events::{Event, EventType};
    // The API refuses an Event note over 1 kB: the Event would be lost.
    let note = capstan_api::bounded(&note, MAX_EVENT_NOTE);
    let result = if object.namespace.is_some() {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        kube.recorder.publish(&event, object).await
    } else {
        // A cluster-scoped object (a Plugin). Kubernetes 1.20 (the version
        // tested here) refuses events.k8s.io Events about those
        // ("involvedObject.namespace does not match event.namespace"), so
        // write a core/v1 Event in "default", which the API accepts from
        // legacy clients and `kubectl describe` finds by the involved object.
        use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = object.name.clone().unwrap_or_default();
        let event = CoreEvent {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: object.clone(),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            reason: Some(reason.to_string()),
            message: Some(note),
            action: Some("Reconcile".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(REPORTING_CONTROLLER.into()),
                host: std::env::var("HOSTNAME").ok(),
            }),
            reporting_component: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: std::env::var("HOSTNAME").ok(),
            ..Default::default()
        };
        Api::<CoreEvent>::namespaced(kube.client.clone(), "default")
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
    };
    match result {
        Ok(()) => kube.metrics.wrote(controller, "event"),
        Err(error) => tracing::warn!(%error, controller, reason, "cannot record an Event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_status_dropping_a_list_or_object_is_a_merge_patch_deleting_what_went() {
        let old = json!({
            "replicas": 3, "selector": "a=b", "versions": [{"version": "v1", "replicas": 3}],
            "rollout": {"template": "t", "startTime": "now"},
            "plan": {"decision": "InPlace", "machines": [{"name": "m"}]},
            "conditions": [{"type": "Ready"}]
        });
        // Scalars and lists that stay: server-side apply is safe.
        let same_shape = json!({
            "replicas": 0, "versions": [{"version": "v2", "replicas": 1}],
            "rollout": {"template": "u", "startTime": "now"},
            "plan": {"decision": "Replace", "machines": []}, "conditions": []
        });
        assert_eq!(status_merge_patch(&old, &same_shape), None);
        // A dropped list, object or nested list: every dropped key is
        // deleted (scalars too, which a merge patch would otherwise keep).
        let dropped = json!({
            "replicas": 0, "plan": {"decision": "Replace"}, "conditions": [{"type": "Ready"}]
        });
        assert_eq!(
            status_merge_patch(&old, &dropped),
            Some(json!({
                "replicas": 0, "selector": null, "versions": null, "rollout": null,
                "plan": {"decision": "Replace", "machines": null},
                "conditions": [{"type": "Ready"}]
            }))
        );
        // Applying the patch as a merge patch gives the new status exactly.
        let mut live = old.clone();
        json_patch::merge(&mut live, &status_merge_patch(&old, &dropped).unwrap());
        assert_eq!(live, dropped);
    }

    /// An object as the API server patches it. Without finalizers the
    /// member is missing, which the server's JSON Patch `test` treats as
    /// null (kube-runtime relies on this too); this crate wants it spelled.
    fn object(finalizers: Option<&[&str]>) -> serde_json::Value {
        serde_json::json!({"metadata": {"name": "m", "finalizers": finalizers}})
    }

    fn apply(doc: &mut serde_json::Value, patch: &json_patch::Patch) -> Result<(), String> {
        json_patch::patch(doc, patch).map_err(|e| e.to_string())
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn adds_and_removes_only_its_own_finalizer() {
        let ours = "capstan.dev/machine";
        // No list yet: the add creates it.
        let mut doc = object(None);
        let add = finalizer_patch(&[], ours, FinalizerChange::Add).unwrap();
        apply(&mut doc, &add).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], serde_json::json!([ours]));
        // Someone else's finalizer stays, in place, both ways.
        let current = names(&["other.io/keep"]);
        let mut doc = object(Some(&["other.io/keep"]));
        apply(
            &mut doc,
            &finalizer_patch(&current, ours, FinalizerChange::Add).unwrap(),
        )
        .unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            serde_json::json!(["other.io/keep", ours])
        );
        let current = names(&["other.io/keep", ours]);
        apply(
            &mut doc,
            &finalizer_patch(&current, ours, FinalizerChange::Remove).unwrap(),
        )
        .unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            serde_json::json!(["other.io/keep"])
        );
        // Nothing to do, nothing written.
        assert!(finalizer_patch(&current, ours, FinalizerChange::Add).is_none());
        assert!(finalizer_patch(&names(&["x"]), ours, FinalizerChange::Remove).is_none());
    }

    #[test]
    fn a_list_changed_by_someone_else_fails_the_patch_instead_of_being_overwritten() {
        let ours = "capstan.dev/machine";
        // Read as [ours, b]; meanwhile someone removed b and added c first.
        let read = names(&[ours, "b.io/x"]);
        let remove = finalizer_patch(&read, ours, FinalizerChange::Remove).unwrap();
        let mut moved = object(Some(&["c.io/y", ours]));
        assert!(
            apply(&mut moved, &remove).is_err(),
            "index 0 is no longer ours"
        );
        // An add tests the whole list it read.
        let add = finalizer_patch(&names(&["b.io/x"]), ours, FinalizerChange::Add).unwrap();
        let mut changed = object(Some(&["c.io/y"]));
        assert!(apply(&mut changed, &add).is_err());
        // An add to a list that appeared meanwhile fails too.
        let add = finalizer_patch(&[], ours, FinalizerChange::Add).unwrap();
        let mut appeared = object(Some(&["c.io/y"]));
        assert!(apply(&mut appeared, &add).is_err());
    }
}
