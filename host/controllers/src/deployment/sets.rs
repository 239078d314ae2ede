//! Writing the rollout to the deployment's sets: each set's replicas,
//! `minReadySeconds`, deletion settings, taints and annotations patched only where
//! they differ (guarded by the replicas they were computed from), the new
//! set created, and history pruned.

use super::{CONTROLLER, Context, DEFAULT_REVISION_HISTORY_LIMIT, Decision, Kind, Observed};
use capstan_api::{
    ANNOTATION_CHANGE_CAUSE, ANNOTATION_IN_PLACE_TO, ANNOTATION_REPLACE_DELETED,
    ANNOTATION_REVISION, InPlaceStrategy, LABEL_DEPLOYMENT_NAME, LABEL_TEMPLATE_HASH,
    LabelSelector, MACHINESET_FINALIZER, MachineDeployment, MachineSet, MachineSetSpec,
};
use capstan_kit::owners::{controlled_by, owner_reference};
use capstan_kit::{Error, key_of, kube_err};
use capstan_planner::rollout::{self, SetView, Strategy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;

/// What writing the sets found.
#[derive(Debug, Default)]
pub(super) struct SetsWritten {
    /// A set changed since the cache saw it: plan again soon.
    pub(super) stale: bool,
    /// A set of the new set's name exists and is not ours (for Progressing).
    pub(super) conflict: Option<String>,
}

/// Write the plan to the sets: old sets first (a set told to hand machines
/// over must be seen doing so before the new set, raised for them in this
/// same step, looks), then the new set, created if it does not exist.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_sets(
    ctx: &Context,
    sets_api: &Api<MachineSet>,
    md: &MachineDeployment,
    strategy: Strategy,
    decision: Option<&Decision>,
    plan: &rollout::Plan,
    observed: &Observed,
    hash: &str,
    revision: i64,
) -> Result<SetsWritten, Error> {
    let in_place_fields = crate::template::carried_in_place(&md.spec.template.spec);
    let new_name = observed
        .new_set
        .as_ref()
        .map_or_else(|| format!("{}-{hash}", md.name_any()), |s| s.name_any());
    // Under OnDelete, old sets keep the slot of a machine a user deletes.
    let keep_slots = (strategy == Strategy::OnDelete && !md.spec.paused).then_some("false");
    let keep_handing =
        decision.is_some_and(|d| matches!(d.kind, Kind::InPlace | Kind::Blocked { .. }));
    let blocked = decision.is_some_and(|d| matches!(d.kind, Kind::Blocked { .. }));
    let mut written = SetsWritten::default();
    let mut new_replicas = plan.new_replicas;
    for set in &observed.old_sets {
        let name = set.name_any();
        let change = plan.old_replicas.iter().find(|(n, _)| *n == name);
        let replicas = change.map_or(set.spec.replicas, |(_, r)| *r);
        let current = set
            .annotations()
            .get(ANNOTATION_IN_PLACE_TO)
            .map(String::as_str);
        let hand_over_to = if plan.hand_over.contains(&name) {
            Some(new_name.as_str())
        } else if change.is_none() && keep_handing {
            current
        } else {
            None
        };
        let annotations = [
            (ANNOTATION_REPLACE_DELETED, keep_slots),
            (ANNOTATION_IN_PLACE_TO, hand_over_to),
        ];
        let min_ready = set.spec.min_ready_seconds;
        let result = sync_set(
            sets_api,
            ctx,
            set,
            replicas,
            min_ready,
            &in_place_fields,
            None,
            md.spec.deletion.clone(),
            None,
            &annotations,
        )
        .await?;
        if result == Written::Stale {
            // Decided on an old view: this set hands nothing over now, so
            // the new set does not wait for it; plan again soon.
            written.stale = true;
            if plan.hand_over.contains(&name) {
                new_replicas -= set.spec.replicas - replicas;
            }
        }
    }
    match &observed.new_set {
        None if !md.spec.paused && !blocked => {
            match create_set(sets_api, ctx, md, hash, new_replicas, revision).await {
                Ok(()) => {}
                Err(Error::Conflict(message)) => written.conflict = Some(message),
                Err(e) => return Err(e),
            }
        }
        None => {}
        Some(set) => {
            let revision = revision.to_string();
            let annotations = [
                (ANNOTATION_REVISION, Some(revision.as_str())),
                (ANNOTATION_REPLACE_DELETED, None),
                (ANNOTATION_IN_PLACE_TO, None),
            ];
            let in_place = Some(md.spec.rollout_strategy().in_place.as_ref());
            let min_ready = md.spec.min_ready_seconds;
            let metadata = template_metadata(md, set);
            let result = sync_set(
                sets_api,
                ctx,
                set,
                new_replicas,
                min_ready,
                &in_place_fields,
                in_place,
                md.spec.deletion.clone(),
                Some(&metadata),
                &annotations,
            )
            .await?;
            written.stale |= result == Written::Stale;
        }
    }
    Ok(written)
}

/// Delete old sets beyond `revisionHistoryLimit`.
pub(super) async fn prune(
    ctx: &Context,
    sets_api: &Api<MachineSet>,
    md: &MachineDeployment,
    old_views: &[SetView],
) -> Result<(), Error> {
    let limit = md
        .spec
        .revision_history_limit
        .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
        .max(0) as usize;
    for name in rollout::sets_to_prune(old_views, limit) {
        match sets_api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => ctx.kube.metrics.wrote(CONTROLLER, "delete"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                let namespace = md.namespace().unwrap_or_default();
                return Err(kube_err(format!(
                    "cannot prune old MachineSet {namespace}/{name}"
                ))(e));
            }
        }
    }
    Ok(())
}

/// The new set's template labels and annotations: the deployment's, with
/// the labels that tie the set to it (its own template hash, which its
/// selector and machines carry, and the deployment's name).
fn template_metadata(md: &MachineDeployment, set: &MachineSet) -> capstan_api::TemplateMeta {
    let mut metadata = md.spec.template.metadata.clone();
    for key in [LABEL_TEMPLATE_HASH, LABEL_DEPLOYMENT_NAME] {
        if let Some(value) = set.spec.template.metadata.labels.get(key) {
            metadata.labels.insert(key.into(), value.clone());
        }
    }
    metadata
}

/// Patch a set's replicas, `minReadySeconds`, template metadata and
/// annotations (`None` removes one) to these values, writing only what
/// differs.
#[allow(clippy::too_many_arguments)]
pub(super) async fn sync_set(
    api: &Api<MachineSet>,
    ctx: &Context,
    set: &MachineSet,
    replicas: i32,
    min_ready_seconds: i32,
    fields: &crate::template::CarriedInPlace,
    in_place: Option<Option<&InPlaceStrategy>>,
    deletion: Option<capstan_api::DeletionOrder>,
    template_metadata: Option<&capstan_api::TemplateMeta>,
    annotations: &[(&str, Option<&str>)],
) -> Result<Written, Error> {
    use serde_json::json;
    // A JSON patch whose first operation tests the replicas these targets
    // were computed from: a cache that has not caught up with this
    // controller's previous write must not take a set's replicas back (the
    // set would shed a machine it was just handed, and create another
    // later). Unlike a resourceVersion precondition, status writes do not
    // make it fail.
    let mut ops = vec![json!({"op": "test", "path": "/spec/replicas", "value": set.spec.replicas})];
    let put = |ops: &mut Vec<serde_json::Value>,
               path: &str,
               present: bool,
               value: Option<serde_json::Value>| {
        match (value, present) {
            (Some(v), _) => ops.push(json!({"op": "add", "path": path, "value": v})),
            (None, true) => ops.push(json!({"op": "remove", "path": path})),
            (None, false) => {}
        }
    };
    if let Some(policy) = in_place
        && set.spec.in_place.as_ref() != policy
    {
        put(
            &mut ops,
            "/spec/inPlace",
            set.spec.in_place.is_some(),
            policy.map(|p| json!(p)),
        );
    }
    let have = crate::template::carried_in_place(&set.spec.template.spec);
    for ((field, have), (_, want)) in have.iter().zip(fields) {
        // `have` is `None` only for an absent or empty field: nothing to
        // remove then.
        if have != want {
            let path = format!("/spec/template/spec/{field}");
            put(&mut ops, &path, have.is_some(), want.clone());
        }
    }
    if let Some(metadata) = template_metadata
        && set.spec.template.metadata != *metadata
    {
        // `add` replaces the whole object (the path exists or not).
        ops.push(json!({"op": "add", "path": "/spec/template/metadata", "value": metadata}));
    }
    if set.spec.replicas != replicas {
        ops.push(json!({"op": "replace", "path": "/spec/replicas", "value": replicas}));
    }
    // The deployment's deletion order is every set's, at its v1beta2 place
    // (a set made before it moved loses v1beta1's `deletePolicy`).
    if set.spec.deletion != deletion {
        let want = deletion.map(|d| json!(d));
        put(
            &mut ops,
            "/spec/deletion",
            set.spec.deletion.is_some(),
            want,
        );
    }
    if set.spec.delete_policy.is_some() {
        ops.push(json!({"op": "remove", "path": "/spec/deletePolicy"}));
    }
    if set.spec.min_ready_seconds != min_ready_seconds {
        ops.push(json!({"op": "add", "path": "/spec/minReadySeconds", "value": min_ready_seconds}));
    }
    let current = set.annotations();
    let changed: Vec<&(&str, Option<&str>)> = annotations
        .iter()
        .filter(|(k, v)| current.get(*k).map(String::as_str) != *v)
        .collect();
    if !changed.is_empty() && set.metadata.annotations.is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    for (key, value) in changed {
        let path = format!(
            "/metadata/annotations/{}",
            key.replace('~', "~0").replace('/', "~1")
        );
        put(
            &mut ops,
            &path,
            current.contains_key(*key),
            value.map(|v| json!(v)),
        );
    }
    if ops.len() == 1 {
        return Ok(Written::Current);
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).expect("well-formed JSON patch");
    let name = set.name_any();
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => {
            ctx.kube.metrics.wrote(CONTROLLER, "patch");
            Ok(Written::Current)
        }
        // The test failed: the set's replicas changed since the cache saw them.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
            tracing::debug!(set = %name, reason = %e.message, "stale view of a MachineSet; planning again");
            Ok(Written::Stale)
        }
        Err(e) => Err(kube_err(format!("cannot update MachineSet {name}"))(e)),
    }
}

/// Whether a set's patch went in, or the cache was behind the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// Written, or nothing to write.
    Current,
    /// The set changed since the cache saw it: nothing written.
    Stale,
}

pub(super) async fn create_set(
    api: &Api<MachineSet>,
    ctx: &Context,
    md: &MachineDeployment,
    hash: &str,
    replicas: i32,
    revision: i64,
) -> Result<(), Error> {
    let name = format!("{}-{hash}", md.name_any());
    let mut template = md.spec.template.clone();
    template
        .metadata
        .labels
        .insert(LABEL_TEMPLATE_HASH.into(), hash.into());
    template
        .metadata
        .labels
        .insert(LABEL_DEPLOYMENT_NAME.into(), md.name_any());
    let mut selector: LabelSelector = md.spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_TEMPLATE_HASH.into(), hash.into());
    let mut annotations = BTreeMap::from([(ANNOTATION_REVISION.to_string(), revision.to_string())]);
    if let Some(cause) = md.annotations().get(ANNOTATION_CHANGE_CAUSE) {
        annotations.insert(ANNOTATION_CHANGE_CAUSE.into(), cause.clone());
    }
    let mut labels = template.metadata.labels.clone();
    labels.retain(|k, _| k != capstan_api::LABEL_SET_NAME);
    let cluster_name = crate::template::cluster_of(md.spec.cluster_name.as_deref(), &template.spec)
        .ok()
        .flatten()
        .map(str::to_string);
    if let Some(cluster) = &cluster_name {
        labels.insert(capstan_api::LABEL_CLUSTER_NAME.to_string(), cluster.clone());
    }
    let set = MachineSet {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: md.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(md)]),
            // Born with the set controller's finalizer, as machines are
            // born with theirs: no second write to add it.
            finalizers: Some(vec![MACHINESET_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: MachineSetSpec {
            cluster_name,
            replicas,
            selector,
            template,
            deletion: md.spec.deletion.clone(),
            delete_policy: None,
            min_ready_seconds: md.spec.min_ready_seconds,
            in_place: md.spec.rollout_strategy().in_place.clone(),
        },
        status: None,
    };
    match api.create(&PostParams::default(), &set).await {
        Ok(_) => {
            ctx.kube.metrics.wrote(CONTROLLER, "create");
            tracing::info!(deployment = %key_of(md), set = %name, revision, "created MachineSet");
            Ok(())
        }
        // Already there: read it back rather than assume it is ours.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let existing = api
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("cannot read MachineSet {name} back")))?;
            let uid = md.uid().unwrap_or_default();
            match existing {
                // Ours (the cache was behind), or gone again: plan anew.
                None => Ok(()),
                Some(set) if controlled_by(&set, &uid) => Ok(()),
                // An orphan from this template: adopted on the next pass.
                Some(set)
                    if set
                        .owner_references()
                        .iter()
                        .all(|o| o.controller != Some(true))
                        && set.labels().get(LABEL_TEMPLATE_HASH).map(String::as_str)
                            == Some(hash) =>
                {
                    Ok(())
                }
                Some(set) => Err(Error::Conflict(format!(
                    "cannot create MachineSet {name} for MachineDeployment {}: a MachineSet of that name already exists and {}; delete or rename it",
                    key_of(md),
                    match set
                        .owner_references()
                        .iter()
                        .find(|o| o.controller == Some(true))
                    {
                        Some(o) => format!("belongs to {} {}", o.kind, o.name),
                        None => "was made from another template".to_string(),
                    }
                ))),
            }
        }
        Err(e) => Err(kube_err(format!("cannot create MachineSet {name}"))(e)),
    }
}
