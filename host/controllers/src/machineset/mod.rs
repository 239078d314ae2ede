//! The MachineSet controller: keep `replicas` machines made from the
//! template, adopting matching orphans, deleting per `deletePolicy` (failed
//! and not-ready machines first), and reporting counts.
//!
//! Creates and deletes are remembered in [`capstan_kit::Expectations`] until the
//! cache shows them, so a reconcile never acts on a cache that has not
//! caught up (which would create duplicate machines).

mod overdue;
mod remediation;

use overdue::settle_overdue;
use remediation::{remediate, unhealthy};

use capstan_api::set_conditions::AVAILABLE;
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, ANNOTATION_IN_PLACE_TO, ANNOTATION_REPLACE_DELETED,
    ANNOTATION_TEMPLATE_METADATA, DeletePolicy, LABEL_SET_NAME, MACHINE_FINALIZER,
    MACHINESET_FINALIZER, Machine, MachineSet, MachineSetStatus, machine_conditions,
    selector_matches, selector_mismatch, selector_string, status as cond,
};
use capstan_kit::cascade::start_pass;
use capstan_kit::controller::Spec;
use capstan_kit::owners::{claim, controlled_by, controller_of, owner_reference};
use capstan_kit::write::apply_status;
use capstan_kit::{Check, Conditions, Error, Expectations, Kube, Seen, key_of, kube_err, now};
use capstan_planner::Health;
use capstan_planner::machineset::{self as plan, MachineView};
use capstan_planner::metadata::{Carried, carry};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "machineset";

/// What the MachineSet controller works with.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) kube: Kube,
    /// Machines a set created or deleted that its cache has not shown yet.
    pub(crate) expectations: Expectations,
    /// The `remediatedReplicas` each set (by uid) was last counted at here:
    /// the next pass may start before the cache shows that status write,
    /// and a count taken from the cache alone would lose remediations.
    pub(crate) remediated: std::sync::Mutex<std::collections::HashMap<String, i32>>,
    /// The scale-from-zero capacity its Plugin says, for a set no
    /// deployment owns (the autoscaler scales those on their own).
    pub(crate) capacities: crate::capacity::Capacities,
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

pub(crate) async fn controller(
    sets: ReflectHandle<MachineSet>,
    machines: ReflectHandle<Machine>,
    deleted_machines: impl futures::Stream<Item = Arc<Machine>> + Send + 'static,
    ctx: Arc<Context>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let store = ctx.kube.stores.machine_sets.clone();
    let set_store = store.clone();
    let metrics = ctx.kube.metrics.clone();
    // A machine that is gone wakes its set at once (shared streams pass on
    // only changes): a scale-down or a deleting set is waiting for it.
    let gone = deleted_machines.filter_map(|machine| {
        futures::future::ready(controller_of::<MachineSet>(machine.as_ref()))
    });
    let watches = move |controller: Controller<MachineSet>| {
        controller
            .watches_shared_stream(machines, move |machine: Arc<Machine>| {
                capstan_kit::controller::enqueue(
                    &metrics,
                    CONTROLLER,
                    owning_sets(&set_store, &machine),
                )
            })
            .reconcile_on(gone)
    };
    let spec = Spec::new(CONTROLLER, sets, store, concurrency);
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// The set that controls a machine, or (for an orphan) the sets that could
/// adopt it.
fn owning_sets(sets: &Store<MachineSet>, machine: &Machine) -> Vec<ObjectRef<MachineSet>> {
    let namespace = machine.namespace().unwrap_or_default();
    if machine
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true))
    {
        return controller_of(machine).into_iter().collect();
    }
    sets.state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| selector_matches(&s.spec.selector, machine.labels()))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// How healthy a machine is, and (when Ready but not yet available) how
/// long until it counts as available: Ready for its own
/// `spec.minReadySeconds`, else for `min_ready_seconds` (its set's).
pub fn health(machine: &Machine, min_ready_seconds: i32, now: i64) -> (Health, Option<Duration>) {
    let min_ready_seconds = machine.spec.min_ready_seconds_or(min_ready_seconds);
    let Some(status) = machine.status.as_ref() else {
        return (Health::NotReady, None);
    };
    // In-place updates are potentially disruptive: an updating machine is
    // not available (as in Cluster API), unless its updaters declare that
    // their steps leave it available.
    if crate::inplace::updating_in_place(machine) && !crate::inplace::keeps_availability(machine) {
        return (Health::NotReady, None);
    }
    if status.failure_reason.is_some() {
        return (Health::Failed, None);
    }
    match capstan_api::condition(&status.conditions, machine_conditions::READY) {
        Some(c) if c.status == cond::TRUE => {
            let ready_for = now - c.last_transition_time.0.as_second();
            let min = i64::from(min_ready_seconds);
            if ready_for >= min {
                (Health::Available, None)
            } else {
                (
                    Health::Ready,
                    Some(Duration::from_secs((min - ready_for) as u64)),
                )
            }
        }
        _ => (Health::NotReady, None),
    }
}

/// One pass over a MachineSet: validate, claim its machines, carry the
/// deletion settings to them, wait for the cache to show what the last
/// pass did, delete machines handed over for remediation, scale (hand
/// over, create, delete), then derive the status and write it once.
async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(action) = begin(&set, &ctx).await? {
        return Ok(action);
    }
    let uid = set.uid().unwrap_or_default();
    let current = set.status.clone();
    let mut status = current.clone().unwrap_or_default();
    status.observed_generation = set.metadata.generation;
    status.selector = Some(selector_string(&set.spec.selector));
    let t = now();
    if let Some(action) = check_spec(&set, &ctx, &mut status, current.as_ref(), &t).await? {
        return Ok(action);
    }
    let owned_by_deployment = set
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "MachineDeployment");
    let capacity_pending = !owned_by_deployment
        && ctx
            .capacities
            .annotate(&ctx.kube, CONTROLLER, set.as_ref(), &set.spec.template.spec)
            .await?;

    // Observe: adopt the set's orphans, carry the template's in-place
    // fields, and wait for the machines the last passes made or deleted.
    let machines_api: Api<Machine> = Api::namespaced(
        ctx.kube.client.clone(),
        &set.namespace().unwrap_or_default(),
    );
    let all = ctx.kube.stores.machines.state();
    let claimed = claim(
        &machines_api,
        &ctx.kube,
        CONTROLLER,
        set.as_ref(),
        &set.spec.selector,
        all.clone(),
    );
    let Some(mine) = claimed.await? else {
        return Ok(Action::requeue(Duration::from_millis(500)));
    };
    carry_template(&ctx, &machines_api, &set, &mine).await?;
    let seen = |name: &str| {
        Seen::of(
            mine.iter()
                .find(|m| m.name_any() == name)
                .map(|m| &m.metadata),
        )
    };
    match ctx.expectations.check(&uid, seen) {
        Check::Satisfied => {}
        Check::Waiting => return Ok(Action::requeue(Duration::from_millis(500))),
        Check::Overdue => {
            if let Some(wait) = settle_overdue(&ctx, &machines_api, &set, &uid, seen).await? {
                return Ok(Action::requeue(wait));
            }
        }
    }

    // Act: remediate, then scale.
    let mut deleted = remediate(&ctx, &machines_api, &set, &mine).await?;
    status.remediated_replicas =
        count_remediated(&ctx, &uid, status.remediated_replicas, deleted.len());
    let (views, next_available) = machine_views(&set, &mine, &deleted, t.0.as_second());
    let scaled = scale(&ctx, &machines_api, &set, &mine, &all, &views).await?;
    deleted.extend(scaled.deleted);
    let next_available = match (next_available, scaled.retry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let created = scaled.created;
    if !created.is_empty() || !deleted.is_empty() {
        tracing::info!(set = %key_of(set.as_ref()), created = created.len(), deleted = deleted.len(), "scaled");
        ctx.expectations.expect(&uid, created, deleted.clone());
    }

    // Status: written before a scaling error is returned, so the
    // remediations this pass made are counted.
    let mut tally = crate::set_conditions::Tally::default();
    for m in &mine {
        let deleting = m.metadata.deletion_timestamp.is_some() || deleted.contains(&m.name_any());
        tally.add(m, deleting);
    }
    derive_status(&mut status, &set, &views, tally, &t);
    apply_status(
        &ctx.kube,
        CONTROLLER,
        set.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    if let Some(error) = scaled.error {
        return Err(error);
    }
    let next = match next_available {
        Some(wait) => wait + Duration::from_millis(200),
        None => ctx.kube.resync,
    };
    Ok(Action::requeue(if capacity_pending {
        next.min(crate::capacity::RETRY_NOT_LOADED)
    } else {
        next
    }))
}

/// The pass's first writes: conditions held back from the last pass, and
/// the finalizer (or the deletion, which ends the pass, and with it the
/// set's remediation count).
async fn begin(set: &Arc<MachineSet>, ctx: &Context) -> Result<Option<Action>, Error> {
    if set.metadata.deletion_timestamp.is_some() {
        let uid = set.uid().unwrap_or_default();
        let mut counted = ctx.remediated.lock().unwrap_or_else(|p| p.into_inner());
        counted.remove(&uid);
    }
    // A paused Cluster holds its objects; its unpausing is seen within
    // this wait.
    let namespace = set.namespace().unwrap_or_default();
    if capstan_kit::objects::cluster_paused(
        &ctx.kube.stores,
        &namespace,
        set.spec.cluster_name.as_deref(),
    ) {
        return Ok(Some(Action::requeue(std::time::Duration::from_secs(5))));
    }
    crate::set_conditions::write_held(
        &ctx.kube,
        CONTROLLER,
        set.as_ref(),
        set.status.as_ref(),
        |s: &mut capstan_api::MachineSetStatus| &mut s.conditions,
    )
    .await?;
    start_pass(
        &ctx.kube,
        CONTROLLER,
        set.as_ref(),
        MACHINESET_FINALIZER,
        &ctx.expectations,
        || ctx.kube.stores.machines.state(),
    )
    .await
}

/// `ValidSpec`, with a warning Event for each v1beta1 name still used. A
/// spec that fails the checks ends the pass with its status written,
/// before the first write of anything else: no machine is created for a
/// plugin this namespace may not use.
async fn check_spec(
    set: &Arc<MachineSet>,
    ctx: &Context,
    status: &mut capstan_api::MachineSetStatus,
    current: Option<&capstan_api::MachineSetStatus>,
    t: &capstan_api::Time,
) -> Result<Option<Action>, Error> {
    let generation = set.metadata.generation;
    if let Some((reason, message)) = validate(set, &ctx.kube) {
        Conditions::new(&mut status.conditions, generation, t)
            .valid_spec(Some((reason, message.as_str())));
        apply_status(&ctx.kube, CONTROLLER, set.as_ref(), current, status).await?;
        return Ok(Some(Action::await_change()));
    }
    let renamed = set.spec.renamed_fields().unwrap_or_default();
    Conditions::new(&mut status.conditions, generation, t).valid_spec_renamed(&renamed);
    let before = current.map(|s| s.conditions.as_slice());
    crate::set_conditions::warn_renamed(
        &ctx.kube,
        CONTROLLER,
        set.as_ref(),
        before.unwrap_or_default(),
        &status.conditions,
    )
    .await;
    Ok(None)
}

/// The set's `remediatedReplicas` after this pass deleted `deleted`
/// machines for their health checks: counted in memory too, for the
/// deployment's `spec.rollback`, so a status write that has not landed yet
/// loses no count.
fn count_remediated(ctx: &Context, uid: &str, recorded: i32, deleted: usize) -> i32 {
    let mut counted = ctx.remediated.lock().unwrap_or_else(|p| p.into_inner());
    let before = counted.get(uid).copied().unwrap_or(0);
    let now = recorded.max(before) + i32::try_from(deleted).unwrap_or(i32::MAX);
    counted.insert(uid.to_string(), now);
    now
}

/// Why the set's spec cannot be acted on (reason, message), if it cannot.
fn validate(set: &MachineSet, kube: &Kube) -> Option<(&'static str, String)> {
    let namespace = set.namespace().unwrap_or_default();
    capstan_api::name_too_long(
        "MachineSet",
        &set.name_any(),
        capstan_api::MAX_SET_NAME,
        "its Machines carry it as a label value",
    )
    .map(|m| ("NameTooLong", m))
    .or_else(|| {
        selector_mismatch(&set.spec.selector, &set.spec.template, "set")
            .map(|m| ("SelectorMismatch", m))
    })
    .or_else(|| {
        crate::template::template_provider_id(&set.spec.template.spec).map(|m| ("InvalidSpec", m))
    })
    .or_else(|| {
        crate::template::cluster_of(set.spec.cluster_name.as_deref(), &set.spec.template.spec)
            .err()
            .map(|m| ("InvalidSpec", m))
    })
    .or_else(|| set.spec.renamed_fields().err().map(|m| ("InvalidSpec", m)))
    .or_else(|| {
        let plugin = &set.spec.template.spec.provider.plugin;
        capstan_kit::registry::not_allowed(kube, plugin, &namespace)
            .map(|m| ("PluginNotAllowed", m))
    })
}

/// Carry what changes in place from the set's template to its machines:
/// the [`carried_in_place`] fields, and the template's labels and annotations (a key
/// removed from the template goes from the machines too, if the template
/// put it there). One merge patch per machine that differs.
async fn carry_template(
    ctx: &Context,
    machines_api: &Api<Machine>,
    set: &MachineSet,
    mine: &[Arc<Machine>],
) -> Result<(), Error> {
    let template = &set.spec.template;
    let wanted = crate::template::carried_in_place(&template.spec);
    for m in mine
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
    {
        let recorded = Carried::from_json(
            m.annotations()
                .get(ANNOTATION_TEMPLATE_METADATA)
                .map(String::as_str),
        );
        let metadata = carry(
            &template.metadata.labels,
            &template.metadata.annotations,
            m.labels(),
            m.annotations(),
            recorded.as_ref(),
        );
        let mut spec = serde_json::Map::new();
        for ((field, have), (_, want)) in crate::template::carried_in_place(&m.spec)
            .into_iter()
            .zip(&wanted)
        {
            if have != *want {
                // null removes the field (a merge patch).
                spec.insert(field.into(), want.clone().unwrap_or_default());
            }
        }
        if metadata.is_none() && spec.is_empty() {
            continue;
        }
        let mut patch = serde_json::json!({ "spec": spec });
        if let Some(change) = metadata {
            let mut annotations = serde_json::json!(change.annotations);
            annotations[ANNOTATION_TEMPLATE_METADATA] = change.carried.to_json().into();
            patch["metadata"] = serde_json::json!({
                "labels": change.labels,
                "annotations": annotations,
            });
        }
        let params = PatchParams::default();
        match machines_api
            .patch(&m.name_any(), &params, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => ctx.kube.metrics.wrote(CONTROLLER, "patch"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot carry the template of {} to machine {}",
                    key_of(set),
                    key_of(m.as_ref())
                ))(e));
            }
        }
    }
    Ok(())
}

/// The set's machines as the scale planner sees them (`deleted`: names
/// this pass already deleted), and how soon one becomes available.
fn machine_views(
    set: &MachineSet,
    mine: &[Arc<Machine>],
    deleted: &[String],
    now_s: i64,
) -> (Vec<MachineView>, Option<Duration>) {
    let mut next_available: Option<Duration> = None;
    let views = mine
        .iter()
        .map(|m| {
            let (health, wait) = health(m, set.spec.min_ready_seconds, now_s);
            if let Some(w) = wait {
                next_available = Some(next_available.map_or(w, |n| n.min(w)));
            }
            MachineView {
                name: m.name_any(),
                created: m.creation_timestamp().map_or(0, |c| c.0.as_second()),
                health,
                deleting: m.metadata.deletion_timestamp.is_some()
                    || deleted.contains(&m.name_any()),
                updating: crate::inplace::updating_in_place(m),
                delete_first: [
                    capstan_api::ANNOTATION_DELETE_MACHINE,
                    capstan_api::ANNOTATION_DELETE_MACHINE_CAPSTAN,
                ]
                .iter()
                .any(|key| m.annotations().contains_key(*key)),
                unhealthy: unhealthy(m),
            }
        })
        .collect();
    (views, next_available)
}

/// What scaling did.
#[derive(Debug, Default)]
struct Scaled {
    /// Machines created (even when some creations failed).
    created: Vec<String>,
    /// Machines deleted or handed over.
    deleted: Vec<String>,
    /// Look again this soon (a hand-over waits for the new set).
    retry: Option<Duration>,
    /// The first failure, returned after the expectations are recorded.
    error: Option<Error>,
}

/// Scale the set to its replicas: hand machines over to the deployment's
/// new set (in-place rollouts), create, and delete per `deletePolicy`.
async fn scale(
    ctx: &Context,
    machines_api: &Api<Machine>,
    set: &MachineSet,
    mine: &[Arc<Machine>],
    all: &[Arc<Machine>],
    views: &[MachineView],
) -> Result<Scaled, Error> {
    let namespace = set.namespace().unwrap_or_default();
    let replicas = usize::try_from(set.spec.replicas).unwrap_or(0);
    let policy = match set.spec.deletion_order() {
        DeletePolicy::Random => plan::DeletePolicy::Random,
        DeletePolicy::Newest => plan::DeletePolicy::Newest,
        DeletePolicy::Oldest => plan::DeletePolicy::Oldest,
    };
    // In-place rollouts: machines this set sheds go to the deployment's new
    // set (once it exists), and machines on their way to this set are not
    // created again.
    let hand_over_to = set.annotations().get(ANNOTATION_IN_PLACE_TO).map(|target| {
        ctx.kube
            .stores
            .machine_sets
            .get(&ObjectRef::new(target).within(&namespace))
    });
    let incoming = incoming_machines(ctx, set, all);
    let mut scale = plan::plan_scale(replicas, views, policy, hand_over_to.is_some(), incoming);
    // Under an OnDelete rollout, old sets do not replace machines users
    // delete: a machine being deleted keeps its slot for scale-up until the
    // deployment lowers the set's replicas.
    if set
        .annotations()
        .get(ANNOTATION_REPLACE_DELETED)
        .map(String::as_str)
        == Some("false")
    {
        let deleting = views.iter().filter(|v| v.deleting).count();
        scale.create = scale.create.saturating_sub(deleting);
    }
    let mut scaled = Scaled::default();
    match hand_over_to {
        Some(Some(target)) => {
            // Hand over only what the new set's replicas already count:
            // a machine arriving before that could make the new set shed
            // another. The deployment raises them in the same step; until
            // the cache shows it, wait.
            let target_uid = target.uid().unwrap_or_default();
            let target_live = all
                .iter()
                .filter(|m| {
                    controlled_by(m.as_ref(), &target_uid)
                        && m.metadata.deletion_timestamp.is_none()
                })
                .count();
            let others = incoming_machines(ctx, &target, all).saturating_sub(scale.hand_over.len());
            let room = usize::try_from(target.spec.replicas)
                .unwrap_or(0)
                .saturating_sub(target_live + others);
            if room < scale.hand_over.len() {
                scaled.retry = Some(Duration::from_millis(200));
            }
            for name in scale.hand_over.iter().take(room) {
                let Some(m) = mine.iter().find(|m| m.name_any() == *name) else {
                    continue;
                };
                if hand_over(machines_api, ctx, set, &target, m).await? {
                    scaled.deleted.push(name.clone());
                    // A machine handed over belongs to the new set now: its
                    // events no longer reach this one, so look again to
                    // write a status without it.
                    scaled.retry = Some(scaled.retry.map_or(Duration::from_millis(500), |r| {
                        r.min(Duration::from_millis(500))
                    }));
                }
            }
        }
        // The new set is not in the cache yet: hand over on a later pass.
        Some(None) if !scale.hand_over.is_empty() => {
            scaled.retry = Some(Duration::from_millis(500));
        }
        _ => {}
    }
    let created = create_machines(machines_api, ctx, set, scale.create).await;
    for name in &scale.delete {
        match machines_api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                ctx.kube.metrics.wrote(CONTROLLER, "delete");
                scaled.deleted.push(name.clone());
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                scaled.error = Some(kube_err(format!(
                    "cannot delete machine {namespace}/{name}"
                ))(e));
                break;
            }
        }
    }
    match created {
        Ok(names) => scaled.created = names,
        Err(error) => scaled.error = scaled.error.or(Some(error)),
    }
    Ok(scaled)
}

/// The set's status counts and `Available` from its machines.
fn derive_status(
    status: &mut MachineSetStatus,
    set: &MachineSet,
    views: &[MachineView],
    tally: crate::set_conditions::Tally,
    t: &capstan_api::Time,
) {
    let counts = plan::counts(views);
    status.replicas = counts.replicas;
    status.ready_replicas = counts.ready;
    status.available_replicas = counts.available;
    status.failed_replicas = counts.failed;
    status.up_to_date_replicas = counts.up_to_date;
    status.versions = tally.versions();
    let mut conditions = Conditions::new(&mut status.conditions, set.metadata.generation, t);
    // Cluster API v1beta2's reasons.
    if counts.available >= set.spec.replicas {
        conditions.set(AVAILABLE, cond::TRUE, "Available", "");
    } else {
        let message = format!(
            "{} of {} machines available",
            counts.available, set.spec.replicas
        );
        conditions.set(AVAILABLE, cond::FALSE, "NotAvailable", message);
    }
    tally.apply(&mut conditions, set.spec.replicas, false);
}

/// Machines that sibling sets are handing over to `set` and have not yet.
fn incoming_machines(ctx: &Context, set: &MachineSet, all: &[Arc<Machine>]) -> usize {
    let name = set.name_any();
    let namespace = set.namespace();
    ctx.kube
        .stores
        .machine_sets
        .state()
        .iter()
        .filter(|s| s.namespace() == namespace)
        .filter(|s| s.annotations().get(ANNOTATION_IN_PLACE_TO) == Some(&name))
        .map(|s| {
            let uid = s.uid().unwrap_or_default();
            let live = all
                .iter()
                .filter(|m| {
                    controlled_by(m.as_ref(), &uid) && m.metadata.deletion_timestamp.is_none()
                })
                .count();
            live.saturating_sub(usize::try_from(s.spec.replicas).unwrap_or(0))
        })
        .sum()
}

/// Move a machine to `target` for an in-place update: one patch sets its
/// owner, labels and spec to the target set's and records its spec before
/// in `capstan.dev/in-place-from`, so the Machine controller can tell what
/// changed. The instance stays. `false` when the machine changed meanwhile
/// (the next pass looks again).
async fn hand_over(
    api: &Api<Machine>,
    ctx: &Context,
    set: &MachineSet,
    target: &MachineSet,
    machine: &Machine,
) -> Result<bool, Error> {
    let mut owners: Vec<OwnerReference> = machine
        .owner_references()
        .iter()
        .filter(|o| o.controller != Some(true))
        .cloned()
        .collect();
    owners.push(owner_reference(target));
    let mut labels = serde_json::Map::new();
    for key in set.spec.template.metadata.labels.keys() {
        labels.insert(key.clone(), serde_json::Value::Null);
    }
    for (key, value) in &target.spec.template.metadata.labels {
        labels.insert(key.clone(), value.clone().into());
    }
    labels.insert(LABEL_SET_NAME.into(), target.name_any().into());
    let mut annotations = serde_json::Map::new();
    for (key, value) in &target.spec.template.metadata.annotations {
        annotations.insert(key.clone(), value.clone().into());
    }
    let previous = serde_json::to_string(&machine.spec).expect("a machine spec serializes");
    annotations.insert(ANNOTATION_IN_PLACE_FROM.into(), previous.into());
    let spec_patch = capstan_kit::merge_patch(
        &serde_json::to_value(&machine.spec).expect("a machine spec serializes"),
        &serde_json::to_value(crate::inplace::spec_from_template(
            &machine.spec,
            &target.spec.template.spec,
        ))
        .expect("a machine spec serializes"),
    );
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": machine.resource_version(),
            "ownerReferences": owners,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec_patch,
    });
    let name = machine.name_any();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            ctx.kube.metrics.wrote(CONTROLLER, "hand-over");
            tracing::info!(set = %key_of(set), machine = %name, to = %target.name_any(), "handed over for an in-place update");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(false),
        Err(e) => Err(kube_err(format!(
            "cannot hand machine {} over to MachineSet {}",
            key_of(machine),
            target.name_any()
        ))(e)),
    }
}

/// Create `count` machines from the set's template, a few at a time.
/// Returns the names created (even when some failed, the error comes after
/// the expectations are recorded by the caller).
async fn create_machines(
    api: &Api<Machine>,
    ctx: &Context,
    set: &MachineSet,
    count: usize,
) -> Result<Vec<String>, Error> {
    let template = &set.spec.template;
    let mut labels = template.metadata.labels.clone();
    labels.insert(LABEL_SET_NAME.to_string(), set.name_any());
    let mut spec = template.spec.clone();
    if let Ok(Some(cluster)) = crate::template::cluster_of(set.spec.cluster_name.as_deref(), &spec)
    {
        labels.insert(
            capstan_api::LABEL_CLUSTER_NAME.to_string(),
            cluster.to_string(),
        );
        spec.cluster_name = Some(cluster.to_string());
    }
    let mut annotations = template.metadata.annotations.clone();
    let carried = Carried::of(&template.metadata.labels, &template.metadata.annotations);
    annotations.insert(ANNOTATION_TEMPLATE_METADATA.into(), carried.to_json());
    let machine = Machine {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", set.name_any())),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(set)]),
            // Born with the machine controller's finalizer, as Cluster
            // API's MachineSet does: one write per machine fewer, and no
            // moment in which the Machine could go without its cleanup.
            finalizers: Some(vec![MACHINE_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec,
        status: None,
    };
    let results: Vec<Result<String, kube::Error>> = futures::stream::iter(0..count)
        .map(|_| {
            let machine = machine.clone();
            async move {
                let created = api.create(&PostParams::default(), &machine).await?;
                Ok(created.name_any())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut names = vec![];
    let mut first_error = None;
    for result in results {
        match result {
            Ok(name) => {
                ctx.kube.metrics.wrote(CONTROLLER, "create");
                names.push(name);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        // Record what did get created before failing the reconcile.
        ctx.expectations
            .expect(&set.uid().unwrap_or_default(), names, vec![]);
        return Err(kube_err(format!(
            "cannot create machines for {}",
            key_of(set)
        ))(e));
    }
    Ok(names)
}
