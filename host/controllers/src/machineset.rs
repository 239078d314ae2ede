//! The MachineSet controller: keep `replicas` machines made from the
//! template, adopting matching orphans, deleting per `deletePolicy` (failed
//! and not-ready machines first), and reporting counts.
//!
//! Creates and deletes are remembered in [`crate::Expectations`] until the
//! cache shows them, so a reconcile never acts on a cache that has not
//! caught up (which would create duplicate machines).

use crate::{
    Context, Error, Seen, apply_status, counted, drain, instrumented, key_of, kube_err, now,
    record_event, retry_soon, set_valid_spec,
};
use capstan_api::set_conditions::AVAILABLE;
use capstan_api::{
    ANNOTATION_IN_PLACE_FROM, ANNOTATION_IN_PLACE_TO, ANNOTATION_REPLACE_DELETED, DeletePolicy,
    LABEL_SET_NAME, Machine, MachineSet, machine_conditions, selector_matches, selector_mismatch,
    selector_string, set_condition, status as cond,
};
use capstan_planner::Health;
use capstan_planner::machineset::{self as plan, MachineView};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "machineset";

pub(crate) async fn controller(
    sets: ReflectHandle<MachineSet>,
    machines: ReflectHandle<Machine>,
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let trigger = counted(CONTROLLER, &ctx.metrics, sets, |s| Some(key_of(s)));
    let set_store = ctx.stores.machine_sets.clone();
    let metrics = ctx.metrics.clone();
    let stream = Controller::for_shared_stream(trigger, ctx.stores.machine_sets.clone())
        .watches_shared_stream(machines, move |machine: Arc<Machine>| {
            let owners = owning_sets(&set_store, &machine);
            for o in &owners {
                metrics.enqueued(
                    CONTROLLER,
                    format!("{}/{}", o.namespace.as_deref().unwrap_or(""), o.name),
                );
            }
            owners
        })
        .with_config(Config::default().concurrency(ctx.options.concurrency.machine_sets))
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx| instrumented(CONTROLLER, obj, ctx, reconcile),
            retry_soon,
            ctx.clone(),
        );
    drain(CONTROLLER, stream).await;
}

/// The set that controls a machine, or (for an orphan) the sets that could
/// adopt it.
fn owning_sets(sets: &Store<MachineSet>, machine: &Machine) -> Vec<ObjectRef<MachineSet>> {
    let namespace = machine.namespace().unwrap_or_default();
    if let Some(owner) = machine
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    {
        if owner.kind == "MachineSet" {
            return vec![ObjectRef::new(&owner.name).within(&namespace)];
        }
        return vec![];
    }
    sets.state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| selector_matches(&s.spec.selector, machine.labels()))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// How healthy a machine is, and (when Ready but not yet available) how
/// long until it counts as available.
pub fn health(machine: &Machine, min_ready_seconds: i32, now: i64) -> (Health, Option<Duration>) {
    let Some(status) = machine.status.as_ref() else {
        return (Health::NotReady, None);
    };
    // In-place updates are potentially disruptive: an updating machine is
    // not available (as in Cluster API).
    if crate::inplace::updating_in_place(machine) {
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

/// The kind of the object that controls `obj`, if any.
pub(crate) fn owner_reference_kind(obj: &impl Resource) -> Option<&str> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.as_str())
}

/// Whether this machine goes first when the set shrinks: annotated
/// `cluster.x-k8s.io/delete-machine`, or found unhealthy by a health check
/// (as in Cluster API's deletion priority).
fn delete_first(machine: &Machine) -> bool {
    let unhealthy = machine.status.as_ref().is_some_and(|s| {
        capstan_api::condition(&s.conditions, machine_conditions::HEALTH_CHECK_SUCCEEDED)
            .is_some_and(|c| c.status == capstan_api::status::FALSE)
    });
    machine
        .annotations()
        .contains_key(capstan_api::ANNOTATION_DELETE_MACHINE)
        || unhealthy
        || remediation_requested(machine)
}

/// Whether a MachineHealthCheck handed this machine to its owner for
/// remediation (`OwnerRemediated=False`).
fn remediation_requested(machine: &Machine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, machine_conditions::OWNER_REMEDIATED))
        .is_some_and(|c| c.status == cond::FALSE)
}

/// Whether a machine is controlled by the object with this uid.
pub fn controlled_by(machine: &impl Resource, uid: &str) -> bool {
    machine
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The controller owner reference for objects `owner` creates or adopts.
pub(crate) fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if set.metadata.deletion_timestamp.is_some() || crate::paused(set.as_ref()) {
        // Owner references hand the machines to the garbage collector; a
        // paused set is left as it is until the annotation goes.
        return Ok(Action::await_change());
    }
    let namespace = set.namespace().unwrap_or_default();
    let uid = set.uid().unwrap_or_default();
    let generation = set.metadata.generation;
    let current = set.status.clone();
    let mut status = current.clone().unwrap_or_default();
    status.observed_generation = generation;
    status.selector = Some(selector_string(&set.spec.selector));
    let t = now();

    // Refused before the first write: no machine is created for a plugin
    // this namespace may not use.
    let problem = capstan_api::name_too_long(
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
        let plugin = &set.spec.template.spec.provider.plugin;
        crate::registry::not_allowed(&ctx, plugin, &namespace).map(|m| ("PluginNotAllowed", m))
    });
    if let Some((reason, message)) = problem {
        let problem = Some((reason, message.as_str()));
        set_valid_spec(&mut status.conditions, problem, generation, &t);
        apply_status(&ctx, CONTROLLER, set.as_ref(), current.as_ref(), &status).await?;
        return Ok(Action::await_change());
    }
    set_valid_spec(&mut status.conditions, None, generation, &t);

    let machines_api: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    let all = ctx.stores.machines.state();
    let mut mine: Vec<Arc<Machine>> = vec![];
    for m in all
        .iter()
        .filter(|m| m.namespace().as_deref() == Some(namespace.as_str()))
    {
        if controlled_by(m.as_ref(), &uid) {
            mine.push(m.clone());
        } else if m
            .owner_references()
            .iter()
            .all(|o| o.controller != Some(true))
            && m.metadata.deletion_timestamp.is_none()
            && selector_matches(&set.spec.selector, m.labels())
        {
            // Not adopted (it changed meanwhile): plan again with a fresh
            // view rather than count without it and create a duplicate.
            if !adopt(&machines_api, &ctx, CONTROLLER, set.as_ref(), m.as_ref()).await? {
                return Ok(Action::requeue(Duration::from_millis(500)));
            }
            mine.push(m.clone());
        }
    }

    // Deletion settings change in place (they are not part of the template
    // hash): carry them to the machines.
    let deletion = in_place_deletion(&set.spec.template.spec);
    for m in mine.iter().filter(|m| {
        m.metadata.deletion_timestamp.is_none() && in_place_deletion(&m.spec) != deletion
    }) {
        let patch = serde_json::json!({ "spec": { "deletion": deletion } });
        match machines_api
            .patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => ctx.metrics.wrote(CONTROLLER, "patch"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot update the deletion settings of machine {}",
                    key_of(m.as_ref())
                ))(e));
            }
        }
    }

    let seen = |name: &str| match mine.iter().find(|m| m.name_any() == name) {
        None => Seen::Absent,
        Some(m) if m.metadata.deletion_timestamp.is_some() => Seen::Deleting,
        Some(_) => Seen::Present,
    };
    if !ctx.expectations.satisfied(&uid, seen) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }

    // Remediation: a machine a health check handed over is deleted now (its
    // Node drained first by the Machine controller) and, being gone from
    // the set's count, replaced below.
    let mut deleted = vec![];
    for m in mine
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none() && remediation_requested(m))
    {
        let name = m.name_any();
        match machines_api
            .delete(&name, &DeleteParams::background())
            .await
        {
            Ok(_) => {
                ctx.metrics.wrote(CONTROLLER, "delete");
                deleted.push(name.clone());
                let why = m
                    .status
                    .as_ref()
                    .and_then(|s| {
                        capstan_api::condition(
                            &s.conditions,
                            machine_conditions::HEALTH_CHECK_SUCCEEDED,
                        )
                    })
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                tracing::info!(set = %key_of(set.as_ref()), machine = %name, %why, "remediating");
                record_event(
                    &ctx,
                    CONTROLLER,
                    &set.object_ref(&()),
                    EventType::Normal,
                    "MachineRemediated",
                    format!("deleting unhealthy machine {name} ({why}); a replacement is created"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot delete unhealthy machine {namespace}/{name}"
                ))(e));
            }
        }
    }

    let now_s = t.0.as_second();
    let mut next_available: Option<Duration> = None;
    let views: Vec<MachineView> = mine
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
                delete_first: delete_first(m),
            }
        })
        .collect();
    let replicas = usize::try_from(set.spec.replicas).unwrap_or(0);
    let policy = match set.spec.delete_policy {
        DeletePolicy::Random => plan::DeletePolicy::Random,
        DeletePolicy::Newest => plan::DeletePolicy::Newest,
        DeletePolicy::Oldest => plan::DeletePolicy::Oldest,
    };
    // In-place rollouts: machines this set sheds go to the deployment's new
    // set (once it exists), and machines on their way to this set are not
    // created again.
    let hand_over_to = set.annotations().get(ANNOTATION_IN_PLACE_TO).map(|target| {
        ctx.stores
            .machine_sets
            .get(&ObjectRef::new(target).within(&namespace))
    });
    let incoming = incoming_machines(&ctx, set.as_ref(), &all);
    let mut scale = plan::plan_scale(replicas, &views, policy, hand_over_to.is_some(), incoming);
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
            let others =
                incoming_machines(&ctx, &target, &all).saturating_sub(scale.hand_over.len());
            let room = usize::try_from(target.spec.replicas)
                .unwrap_or(0)
                .saturating_sub(target_live + others);
            if room < scale.hand_over.len() {
                next_available = Some(Duration::from_millis(200));
            }
            for name in scale.hand_over.iter().take(room) {
                let Some(m) = mine.iter().find(|m| m.name_any() == *name) else {
                    continue;
                };
                if hand_over(&machines_api, &ctx, set.as_ref(), &target, m).await? {
                    deleted.push(name.clone());
                }
            }
        }
        // The new set is not in the cache yet: hand over on a later pass.
        Some(None) if !scale.hand_over.is_empty() => {
            next_available = Some(Duration::from_millis(500));
        }
        _ => {}
    }
    let created = create_machines(&machines_api, &ctx, set.as_ref(), scale.create).await;
    for name in &scale.delete {
        match machines_api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                ctx.metrics.wrote(CONTROLLER, "delete");
                deleted.push(name.clone());
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot delete machine {namespace}/{name}"
                ))(e));
            }
        }
    }
    let created = created?;
    if !created.is_empty() || !deleted.is_empty() {
        tracing::info!(set = %key_of(set.as_ref()), created = created.len(), deleted = deleted.len(), "scaled");
        ctx.expectations.expect(&uid, created, deleted);
    }

    let counts = plan::counts(&views);
    status.replicas = counts.replicas;
    status.ready_replicas = counts.ready;
    status.available_replicas = counts.available;
    status.failed_replicas = counts.failed;
    if counts.available >= set.spec.replicas {
        set_condition(
            &mut status.conditions,
            AVAILABLE,
            cond::TRUE,
            "AllAvailable",
            "",
            generation,
            &t,
        );
    } else {
        set_condition(
            &mut status.conditions,
            AVAILABLE,
            cond::FALSE,
            "WaitingForMachines",
            format!(
                "{} of {} machines available",
                counts.available, set.spec.replicas
            ),
            generation,
            &t,
        );
    }
    apply_status(&ctx, CONTROLLER, set.as_ref(), current.as_ref(), &status).await?;
    Ok(match next_available {
        Some(wait) => Action::requeue(wait + Duration::from_millis(200)),
        None => Action::requeue(ctx.options.resync),
    })
}

/// Machines that sibling sets are handing over to `set` and have not yet.
fn incoming_machines(ctx: &Context, set: &MachineSet, all: &[Arc<Machine>]) -> usize {
    let name = set.name_any();
    let namespace = set.namespace();
    ctx.stores
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
    let spec_patch = crate::merge_patch(
        &serde_json::to_value(&machine.spec).expect("a machine spec serializes"),
        &serde_json::to_value(&target.spec.template.spec).expect("a machine spec serializes"),
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
            ctx.metrics.wrote(CONTROLLER, "hand-over");
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

/// Make `owner` the controller of `orphan` (an object no controller owns
/// whose labels the owner's selector matches), only as the cache saw it:
/// `false` when it changed or went meanwhile (the next pass looks again).
pub(crate) async fn adopt<K, O>(
    api: &Api<K>,
    ctx: &Context,
    controller: &'static str,
    owner: &O,
    orphan: &K,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
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
            ctx.metrics.wrote(controller, "adopt");
            tracing::info!(owner = %key_of(owner), %kind, orphan = %orphan.name_any(), "adopted an orphan");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(false),
        Err(e) => Err(kube_err(format!("cannot adopt {kind} {}", key_of(orphan)))(
            e,
        )),
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
    let machine = Machine {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", set.name_any())),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: (!template.metadata.annotations.is_empty())
                .then(|| template.metadata.annotations.clone()),
            owner_references: Some(vec![owner_reference(set)]),
            ..Default::default()
        },
        spec: template.spec.clone(),
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
                ctx.metrics.wrote(CONTROLLER, "create");
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

/// The deletion settings of a machine spec, with "nothing set" as `None`,
/// so an empty `deletion: {}` and no `deletion` compare equal.
pub(crate) fn in_place_deletion(
    spec: &capstan_api::MachineSpec,
) -> Option<&capstan_api::MachineDeletionSpec> {
    spec.deletion
        .as_ref()
        .filter(|d| **d != capstan_api::MachineDeletionSpec::default())
}
