//! Every write a controller makes to its own objects: the status (one path,
//! server-side apply, nothing when nothing changed), finalizers (added and
//! removed as kube-runtime's `finalizer()` helper does, guarded by the
//! resourceVersion read) and Events. Each write is counted in
//! `capstan_api_writes_total{controller,verb}`.

use crate::{Error, FIELD_MANAGER, Kind, Kube, REPORTING_CONTROLLER, ScopeApi, key_of, kube_err};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;

/// Apply `status` to an object's status subresource with server-side apply,
/// unless it equals `current` (so idle reconciles write nothing). Returns
/// whether it wrote.
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
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err(format!(
        "cannot update the status of {} {}",
        K::kind(&()),
        obj.name_any()
    )))?;
    kube.metrics.wrote(controller, "apply_status");
    Ok(true)
}

/// Add `finalizer` to `obj` unless it has it. Returns whether it wrote.
pub async fn add_finalizer<K>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    finalizer: &str,
) -> Result<bool, Error>
where
    K: Kind,
{
    if obj.finalizers().iter().any(|f| f == finalizer) {
        return Ok(false);
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(finalizer.to_string());
    set_finalizers(kube, controller, obj, finalizers).await?;
    Ok(true)
}

/// Remove `finalizer` from `obj`, keeping everyone else's. Returns whether
/// it wrote.
pub async fn remove_finalizer<K>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    finalizer: &str,
) -> Result<bool, Error>
where
    K: Kind,
{
    if !obj.finalizers().iter().any(|f| f == finalizer) {
        return Ok(false);
    }
    let remaining = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    set_finalizers(kube, controller, obj, remaining).await?;
    Ok(true)
}

/// Replace an object's finalizer list, guarded by the resourceVersion read,
/// so a concurrent change by someone else is not overwritten (a conflict
/// is an error and the reconcile is retried). An object already gone is fine.
async fn set_finalizers<K>(
    kube: &Kube,
    controller: &'static str,
    obj: &K,
    finalizers: Vec<String>,
) -> Result<(), Error>
where
    K: Kind,
{
    let api: Api<K> = K::Scope::api(kube.client.clone(), obj.namespace().as_deref());
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": obj.resource_version(),
        }
    });
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            return Err(kube_err(format!(
                "cannot update the finalizers of {} {}",
                K::kind(&()),
                key_of(obj)
            ))(e));
        }
    }
    kube.metrics.wrote(controller, "patch_finalizers");
    Ok(())
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
