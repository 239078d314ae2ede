//! The Machine controller: one instance per Machine, through its provider
//! plugin.
//!
//! Per reconcile: make sure the finalizer is on; `validate` the config (once
//! per generation); `create` (idempotent by the machine's uid) until a
//! provider ID is known, which is persisted at once; then `get` until the
//! instance runs; link the Node whose `spec.providerID` matches and mirror
//! its Ready condition. On deletion: wait for pre-drain hooks, drain the
//! Node (`crate::nodedrain`), wait for pre-terminate hooks, `delete` until the
//! provider says done, delete the Node object, then drop the finalizer. Transient errors back off (honouring the
//! plugin's retry-after); terminal errors set `failureReason` /
//! `failureMessage` and an Event, and the machine waits for a spec change.

use crate::inplace::Advance;
use crate::plugin::Availability;
use crate::provider::{ProviderError, timed};
use crate::{
    Context, Error, apply_status, counted, drain, instrumented, key_of, kube_err, machines_of_node,
    now, record_event, retry_soon,
};
use capstan_api::machine_conditions::{
    CONFIG_VALID, DELETING, INSTANCE_PROVISIONED, OWNED_BY_MACHINE_CONTROLLER, READY, UPDATING,
};
use capstan_api::{
    ANNOTATION_EXCLUDE_NODE_DRAINING, ANNOTATION_IN_PLACE_FROM, MACHINE_FINALIZER, Machine,
    MachineAddress, MachinePhase, MachineStatus, NodeRef, PRE_DRAIN_HOOK_PREFIX,
    PRE_TERMINATE_HOOK_PREFIX, Plugin, set_condition, status as cond,
};
use capstan_planner::deletion::{DeletionStep, DeletionView, next_step};
use capstan_runtime::types::{AddressKind, Deletion, InstanceState, Machine as PluginMachine};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "machine";

pub(crate) async fn controller(
    machines: ReflectHandle<Machine>,
    plugins: ReflectHandle<Plugin>,
    nodes: ReflectHandle<Node>,
    deleted_nodes: impl futures::Stream<Item = Arc<Node>> + Send + 'static,
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let trigger = counted(CONTROLLER, &ctx.metrics, machines, |m| Some(key_of(m)));
    let by_plugin = ctx.stores.machines.clone();
    let by_node = ctx.stores.machines.clone();
    let by_deleted_node = ctx.stores.machines.clone();
    // A deleted Node reaches its machine at once: its instance may be gone.
    let node_deletions = deleted_nodes.flat_map(move |node| {
        futures::stream::iter(
            machines_of_node(&by_deleted_node, &node)
                .iter()
                .map(|m| ObjectRef::from_obj(m.as_ref()))
                .collect::<Vec<_>>(),
        )
    });
    let stream = Controller::for_shared_stream(trigger, ctx.stores.machines.clone())
        .watches_shared_stream(plugins, move |plugin: Arc<Plugin>| {
            let name = plugin.name_any();
            machines_where(&by_plugin, |m| {
                m.spec.provider.plugin == name || m.instance_plugin() == name
            })
        })
        .watches_shared_stream(nodes, move |node: Arc<Node>| {
            machines_of_node(&by_node, &node)
                .iter()
                .map(|m| ObjectRef::from_obj(m.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(node_deletions)
        .with_config(Config::default().concurrency(ctx.options.concurrency.machines))
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx| instrumented(CONTROLLER, obj, ctx, reconcile),
            retry_soon,
            ctx.clone(),
        );
    drain(CONTROLLER, stream).await;
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

/// The machine as the plugin contract describes it.
pub fn to_plugin_machine(machine: &Machine) -> PluginMachine {
    PluginMachine {
        name: machine.name_any(),
        namespace: machine.namespace().unwrap_or_default(),
        uid: machine.uid().unwrap_or_default(),
        cluster_name: machine.spec.cluster_name.clone(),
        labels: machine
            .labels()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        version: machine.spec.version.clone(),
        failure_domain: machine.spec.failure_domain.clone(),
        provider_config: machine.spec.provider.config.to_string(),
        infrastructure_config: None,
        provider_id: machine.status.as_ref().and_then(|s| s.provider_id.clone()),
    }
}

/// Hold a Machine its plugin cannot serve (not allowed in its namespace,
/// or not ready): `InstanceProvisioned=False` with `reason` and `message`,
/// and nothing else happens until `requeue`.
async fn hold_for_plugin(
    ctx: &Context,
    machine: &Machine,
    current: Option<&MachineStatus>,
    mut status: MachineStatus,
    (reason, message, generation, requeue): (&str, String, i64, Duration),
) -> Result<Action, Error> {
    set_condition(
        &mut status.conditions,
        INSTANCE_PROVISIONED,
        cond::FALSE,
        reason,
        message,
        Some(generation),
        &now(),
    );
    status.phase.get_or_insert(MachinePhase::Pending);
    apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
    Ok(Action::requeue(requeue))
}

async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let generation = machine.metadata.generation.unwrap_or(0);
    let current = machine.status.clone();
    let mut status = current.clone().unwrap_or_default();
    let has_finalizer = machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER);

    if machine.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        return delete(&machine, &ctx, status, current.as_ref()).await;
    }
    let plugin_name = machine.spec.provider.plugin.clone();
    let namespace = machine.namespace().unwrap_or_default();
    // Refused before the first write: a Machine in a namespace its plugin
    // does not allow gets no finalizer, no plugin call and no cloud call.
    if let Availability::NotAllowed(message) =
        crate::plugin::availability(&ctx, &plugin_name, &namespace)
    {
        let hold = ("PluginNotAllowed", message, generation, ctx.options.resync);
        return hold_for_plugin(&ctx, &machine, current.as_ref(), status, hold).await;
    }
    if !has_finalizer {
        crate::set_finalizers(&ctx, CONTROLLER, machine.as_ref(), with_finalizer(&machine)).await?;
    }

    // A terminal failure waits for the spec to change.
    if status.failure_reason.is_some() {
        if status.observed_generation == Some(generation) {
            return Ok(Action::requeue(ctx.options.resync));
        }
        status.failure_reason = None;
        status.failure_message = None;
    }
    status.observed_generation = Some(generation);
    let t = now();
    // Machines that got their instance before the creating Plugin was
    // recorded: the spec's is the one (it could not change unnoticed since).
    if status.provider_id.is_some() && status.provider_plugin.is_none() {
        status.provider_plugin = Some(plugin_name.clone());
    }
    if let Some(message) = machine.provider_changed() {
        // Not applied: the instance stays with the Plugin that created it.
        set_condition(
            &mut status.conditions,
            CONFIG_VALID,
            cond::FALSE,
            "ProviderChanged",
            message,
            Some(generation),
            &t,
        );
        apply_machine_status(
            &ctx,
            CONTROLLER,
            machine.as_ref(),
            current.as_ref(),
            &status,
        )
        .await?;
        return Ok(Action::requeue(ctx.options.resync));
    }

    let registered = match crate::plugin::availability(&ctx, &plugin_name, &namespace) {
        Availability::Ready => ctx.providers.get(&plugin_name),
        Availability::Loading => return Ok(Action::requeue(Duration::from_millis(500))),
        Availability::NotAllowed(message) => {
            let hold = ("PluginNotAllowed", message, generation, ctx.options.resync);
            return hold_for_plugin(&ctx, &machine, current.as_ref(), status, hold).await;
        }
        Availability::Unavailable(message) => {
            let hold = (
                "PluginNotReady",
                message,
                generation,
                Duration::from_secs(15),
            );
            return hold_for_plugin(&ctx, &machine, current.as_ref(), status, hold).await;
        }
    };
    let Some(registered) = registered else {
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    let provider = registered.provider;
    let plugin_machine = to_plugin_machine(&machine);

    // Validate once per generation.
    let validated = capstan_api::condition(&status.conditions, CONFIG_VALID)
        .is_some_and(|c| c.status == cond::TRUE && c.observed_generation == Some(generation));
    if !validated {
        match timed(
            &ctx.metrics,
            &plugin_name,
            "validate",
            provider.validate(&plugin_machine.provider_config),
        )
        .await
        {
            Ok(()) => set_condition(
                &mut status.conditions,
                CONFIG_VALID,
                cond::TRUE,
                "Valid",
                "",
                Some(generation),
                &t,
            ),
            Err(ProviderError::InvalidConfig(message)) => {
                set_condition(
                    &mut status.conditions,
                    CONFIG_VALID,
                    cond::FALSE,
                    "InvalidConfig",
                    message.clone(),
                    Some(generation),
                    &t,
                );
                return fail(
                    &machine,
                    &ctx,
                    status,
                    current.as_ref(),
                    "InvalidConfiguration",
                    format!("spec.provider.config: {message}"),
                )
                .await;
            }
            Err(error) => return retry(&machine, &ctx, status, current.as_ref(), error).await,
        }
    }

    let observed = if status.provider_id.is_none() {
        status.phase = Some(MachinePhase::Provisioning);
        match timed(
            &ctx.metrics,
            &plugin_name,
            "create",
            provider.create(&plugin_machine),
        )
        .await
        {
            Ok(observed) => {
                // Recorded now so the status write at the end of this
                // reconcile (the next API call) persists it.
                status.provider_id = Some(observed.provider_id.clone());
                status.provider_plugin = Some(plugin_name.clone());
                observed
            }
            Err(ProviderError::InvalidConfig(message)) => {
                return fail(
                    &machine,
                    &ctx,
                    status,
                    current.as_ref(),
                    "InvalidConfiguration",
                    message,
                )
                .await;
            }
            Err(ProviderError::Terminal(message)) => {
                return fail(
                    &machine,
                    &ctx,
                    status,
                    current.as_ref(),
                    "CreateError",
                    message,
                )
                .await;
            }
            Err(error) => return retry(&machine, &ctx, status, current.as_ref(), error).await,
        }
    } else {
        match timed(
            &ctx.metrics,
            &plugin_name,
            "get",
            provider.get(&plugin_machine),
        )
        .await
        {
            Ok(observed) => observed,
            Err(ProviderError::NotFound(message)) => {
                let message = format!(
                    "the instance behind {} is gone: {message}",
                    status.provider_id.clone().unwrap_or_default()
                );
                return fail(
                    &machine,
                    &ctx,
                    status,
                    current.as_ref(),
                    "InstanceNotFound",
                    message,
                )
                .await;
            }
            Err(ProviderError::Terminal(message)) => {
                return fail(
                    &machine,
                    &ctx,
                    status,
                    current.as_ref(),
                    "InstanceError",
                    message,
                )
                .await;
            }
            Err(error) => return retry(&machine, &ctx, status, current.as_ref(), error).await,
        }
    };
    status.plugin_digest = Some(provider.digest().to_string());
    // An instance terminated or stopped outside Capstan will not come back
    // by waiting: the Machine fails, so a health check replaces it. (An
    // in-place update may stop its instance on purpose.)
    let gone = match observed.state {
        InstanceState::Terminated => Some("InstanceTerminated"),
        InstanceState::Stopped if !crate::inplace::updating_in_place(&machine) => {
            Some("InstanceStopped")
        }
        _ => None,
    };
    if let Some(reason) = gone {
        let state = if reason == "InstanceTerminated" {
            "terminated"
        } else {
            "stopped"
        };
        let detail = observed
            .message
            .as_deref()
            .map(|m| {
                format!(
                    ": {}",
                    capstan_api::bounded(m, capstan_api::MAX_PLUGIN_TEXT)
                )
            })
            .unwrap_or_default();
        let message = format!(
            "the instance {} was {state} outside Capstan{detail}; the Machine will not recover by itself (a MachineHealthCheck replaces it)",
            observed.provider_id
        );
        return fail(&machine, &ctx, status, current.as_ref(), reason, message).await;
    }
    status.addresses = observed
        .addresses
        .iter()
        .map(|a| MachineAddress {
            type_: address_type(&a.kind).to_string(),
            address: a.address.clone(),
        })
        .collect();
    if observed.version.is_some() {
        status.version = observed.version.clone();
    }
    let running = observed.state == InstanceState::Running;
    if running {
        set_condition(
            &mut status.conditions,
            INSTANCE_PROVISIONED,
            cond::TRUE,
            "Running",
            "",
            Some(generation),
            &t,
        );
    } else {
        let message = observed.message.clone().unwrap_or_default();
        set_condition(
            &mut status.conditions,
            INSTANCE_PROVISIONED,
            cond::FALSE,
            state_reason(&observed.state),
            message,
            Some(generation),
            &t,
        );
    }

    let node = find_node(&ctx.stores.nodes, &observed.provider_id);
    // A Node once linked stays referenced when it is deleted, so the
    // health check sees "NodeDeleted" rather than a machine still booting.
    let lost_node = match &node {
        Some(n) => {
            status.node_ref = Some(NodeRef {
                name: n.name_any(),
                uid: n.uid(),
            });
            None
        }
        None => status.node_ref.as_ref().map(|n| n.name.clone()),
    };
    let node_ready = node.as_ref().is_some_and(|n| node_is_ready(n));
    let (reason, message) = match (&node, node_ready, running) {
        (_, _, false) => (
            "InstanceNotRunning",
            "waiting for the instance to run".to_string(),
        ),
        (None, _, true) if lost_node.is_some() => (
            "NodeDeleted",
            format!(
                "Node {} was deleted; waiting for a Node with spec.providerID {}",
                lost_node.clone().unwrap_or_default(),
                observed.provider_id
            ),
        ),
        (None, _, true) => (
            "WaitingForNode",
            format!("no Node with spec.providerID {} yet", observed.provider_id),
        ),
        (Some(n), false, true) => (
            "NodeNotReady",
            format!("Node {} is not Ready", n.name_any()),
        ),
        (Some(_), true, true) => ("NodeReady", String::new()),
    };
    let ready_status = if node_ready && running {
        cond::TRUE
    } else {
        cond::FALSE
    };
    set_condition(
        &mut status.conditions,
        READY,
        ready_status,
        reason,
        message,
        Some(generation),
        &t,
    );
    status.phase = Some(if node_ready && running {
        MachinePhase::Running
    } else if running {
        MachinePhase::Provisioned
    } else {
        MachinePhase::Provisioning
    });
    // Handed over for an in-place update: plan it, or take its next step.
    let in_place = if crate::inplace::updating_in_place(&machine) {
        let advance = crate::inplace::advance(&ctx, &machine, &mut status, &t).await;
        match advance {
            Advance::Wait(_) => status.phase = Some(MachinePhase::Updating),
            Advance::Failed => status.phase = Some(MachinePhase::UpdateFailed),
            Advance::Done => {}
        }
        Some(advance)
    } else {
        None
    };
    let changed = apply_machine_status(
        &ctx,
        CONTROLLER,
        machine.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    match in_place {
        Some(Advance::Wait(wait)) => return Ok(Action::requeue(wait)),
        Some(Advance::Failed) => {
            if changed && crate::inplace::update_failed(&machine).is_none() {
                let message = capstan_api::condition(&status.conditions, UPDATING)
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                record_event(
                    &ctx,
                    CONTROLLER,
                    &machine.object_ref(&()),
                    EventType::Warning,
                    "UpdateFailed",
                    message,
                )
                .await;
            }
            return Ok(Action::requeue(ctx.options.resync));
        }
        Some(Advance::Done) => {
            // The status (UpToDate, provenance) is written; now the machine
            // is an ordinary member of its set.
            finish_in_place(&machine, &ctx).await?;
            return Ok(Action::requeue(Duration::from_millis(10)));
        }
        None => {}
    }
    Ok(if !running {
        Action::requeue(ctx.options.poll)
    } else if !node_ready {
        Action::requeue(Duration::from_secs(10))
    } else {
        // A running instance is looked at again on its own cadence, so one
        // that vanished is seen within that bound even without a Node event.
        Action::requeue(jittered(ctx.options.instance_check).min(ctx.options.resync))
    })
}

/// `interval` plus or minus up to a tenth, so a fleet created together
/// does not call its provider in lockstep.
fn jittered(interval: Duration) -> Duration {
    use std::hash::{BuildHasher as _, RandomState};
    let spread = interval.as_millis() as u64 / 5;
    if spread == 0 {
        return interval;
    }
    let offset = RandomState::new().hash_one(std::time::Instant::now()) % spread;
    interval - Duration::from_millis(spread / 2) + Duration::from_millis(offset)
}

/// Deletion, one step per reconcile pass (`capstan_planner::deletion`):
/// pre-drain hooks, drain, pre-terminate hooks, the instance, the Node
/// object, the finalizer. The `Deleting` condition says which step holds
/// the machine and why.
async fn delete(
    machine: &Machine,
    ctx: &Context,
    mut status: MachineStatus,
    current: Option<&MachineStatus>,
) -> Result<Action, Error> {
    status.phase = Some(MachinePhase::Deleting);
    let t = now();
    let generation = machine.metadata.generation;
    let node = own_node(&ctx.stores.nodes, &status);
    let mut view = DeletionView {
        pre_drain_hooks: hooks(machine, PRE_DRAIN_HOOK_PREFIX),
        pre_terminate_hooks: hooks(machine, PRE_TERMINATE_HOOK_PREFIX),
        node: node.as_ref().map(|n| n.name_any()),
        exclude_draining: machine
            .annotations()
            .contains_key(ANNOTATION_EXCLUDE_NODE_DRAINING),
        drained_for: status
            .deletion
            .as_ref()
            .and_then(|d| d.node_drain_start_time.as_ref())
            .map(|start| t.0.as_second() - start.0.as_second()),
        drain_timeout: machine
            .spec
            .deletion
            .as_ref()
            .and_then(|d| d.node_drain_timeout_seconds)
            .map_or(0, |s| i64::from(s.max(0))),
        // A pass that went past the drain says so in the Deleting
        // condition; later passes (the instance takes a while to go)
        // resume from there instead of listing the Node's pods again.
        drain_complete: current
            .and_then(|c| capstan_api::condition(&c.conditions, DELETING))
            .is_some_and(|c| {
                c.reason == "WaitingForPreTerminateHook"
                    || c.reason == "WaitingForInfrastructureDeletion"
            }),
    };
    let mut step = next_step(&view);
    if let (DeletionStep::DrainNode(_), Some(node)) = (&step, &node) {
        status
            .deletion
            .get_or_insert_with(Default::default)
            .node_drain_start_time
            .get_or_insert_with(|| t.clone());
        match crate::nodedrain::drain_round(ctx, node).await? {
            crate::nodedrain::Round::Complete => {
                view.drain_complete = true;
                step = next_step(&view);
                record_event(
                    ctx,
                    CONTROLLER,
                    &machine.object_ref(&()),
                    EventType::Normal,
                    "NodeDrained",
                    format!("drained Node {}", node.name_any()),
                )
                .await;
            }
            crate::nodedrain::Round::Pending { message, blocked } => {
                set_deleting(&mut status, "DrainingNode", message, generation, &t);
                apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
                // A refused eviction (a PodDisruptionBudget) is retried with
                // backoff; pods already evicted are checked again soon.
                return Ok(Action::requeue(if blocked {
                    Duration::from_secs(5)
                } else {
                    Duration::from_secs(1)
                }));
            }
        }
    }
    let skipped = match &step {
        DeletionStep::WaitForPreTerminateHooks { drain_skipped, .. }
        | DeletionStep::DeleteInstance { drain_skipped } => drain_skipped.clone(),
        _ => None,
    };
    if let Some(why) = &skipped {
        record_event(
            ctx,
            CONTROLLER,
            &machine.object_ref(&()),
            EventType::Warning,
            "DrainSkipped",
            why.clone(),
        )
        .await;
    }
    let drain_skipped = match step {
        DeletionStep::WaitForPreDrainHooks(names) => {
            let message = hook_message("pre-drain", PRE_DRAIN_HOOK_PREFIX, &names);
            set_deleting(
                &mut status,
                "WaitingForPreDrainHook",
                message,
                generation,
                &t,
            );
            apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
            return Ok(Action::requeue(ctx.options.resync));
        }
        DeletionStep::WaitForPreTerminateHooks { hooks, .. } => {
            let mut message = hook_message("pre-terminate", PRE_TERMINATE_HOOK_PREFIX, &hooks);
            if let Some(why) = skipped {
                message = format!("{message}; {why}");
            }
            set_deleting(
                &mut status,
                "WaitingForPreTerminateHook",
                message,
                generation,
                &t,
            );
            apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
            return Ok(Action::requeue(ctx.options.resync));
        }
        DeletionStep::DrainNode(_) => {
            // The Node vanished between the step and the drain: look again.
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        DeletionStep::DeleteInstance { drain_skipped } => drain_skipped,
    };
    delete_instance(
        machine,
        ctx,
        status,
        current,
        node.as_deref(),
        drain_skipped,
    )
    .await
}

/// The names of the hooks with this annotation prefix, sorted.
fn hooks(machine: &Machine, prefix: &str) -> Vec<String> {
    machine
        .annotations()
        .keys()
        .filter_map(|k| k.strip_prefix(prefix))
        .map(str::to_string)
        .collect()
}

fn hook_message(kind: &str, prefix: &str, names: &[String]) -> String {
    format!(
        "waiting for {kind} hooks: {} (remove the annotations {} to continue)",
        names.join(", "),
        names
            .iter()
            .map(|n| format!("{prefix}{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn set_deleting(
    status: &mut MachineStatus,
    reason: &str,
    message: String,
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    set_condition(
        &mut status.conditions,
        DELETING,
        cond::TRUE,
        reason,
        message,
        generation,
        t,
    );
}

/// The last steps: the instance through the provider, then the Node
/// object, then the finalizer.
async fn delete_instance(
    machine: &Machine,
    ctx: &Context,
    mut status: MachineStatus,
    current: Option<&MachineStatus>,
    node: Option<&Node>,
    drain_skipped: Option<String>,
) -> Result<Action, Error> {
    // Released through the Plugin that created it, whatever the spec says now.
    let plugin_name = machine.instance_plugin();
    let t = now();
    let generation = machine.metadata.generation;
    let waiting = match &drain_skipped {
        Some(why) => format!("deleting the instance ({why})"),
        None => "deleting the instance".to_string(),
    };
    set_deleting(
        &mut status,
        "WaitingForInfrastructureDeletion",
        waiting,
        generation,
        &t,
    );
    let namespace = machine.namespace().unwrap_or_default();
    let provider = match crate::plugin::availability(ctx, plugin_name, &namespace) {
        Availability::Ready => ctx.providers.get(plugin_name),
        Availability::Loading => return Ok(Action::requeue(Duration::from_millis(500))),
        Availability::NotAllowed(reason) | Availability::Unavailable(reason) => {
            set_condition(
                &mut status.conditions,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                "PluginNotReady",
                format!("cannot release the instance: {reason}"),
                generation,
                &t,
            );
            apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
            return Ok(Action::requeue(Duration::from_secs(15)));
        }
    };
    let Some(provider) = provider.map(|r| r.provider) else {
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    let plugin_machine = to_plugin_machine(machine);
    let outcome = timed(
        &ctx.metrics,
        plugin_name,
        "delete",
        provider.delete(&plugin_machine),
    )
    .await;
    match outcome {
        Ok(Deletion::Done) | Err(ProviderError::NotFound(_)) => {
            if let Some(node) = node {
                delete_node(ctx, node).await?;
            }
            let remaining: Vec<String> = machine
                .finalizers()
                .iter()
                .filter(|f| *f != MACHINE_FINALIZER)
                .cloned()
                .collect();
            crate::set_finalizers(ctx, CONTROLLER, machine, remaining).await?;
            Ok(Action::await_change())
        }
        Ok(Deletion::InProgress(ms)) => {
            set_condition(
                &mut status.conditions,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                "Deleting",
                "the provider is deleting the instance",
                generation,
                &t,
            );
            apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
            Ok(Action::requeue(Duration::from_millis(ms.max(100))))
        }
        Err(ProviderError::Transient {
            message,
            retry_after,
        }) => {
            tracing::debug!(machine = %key_of(machine), %message, "delete will be retried");
            apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
            Ok(Action::requeue(retry_after))
        }
        Err(error) => {
            // The instance must still be released: keep trying, slowly.
            set_condition(
                &mut status.conditions,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                "DeleteFailed",
                error.to_string(),
                generation,
                &t,
            );
            apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
    }
}

/// Delete the machine's Node object once its instance is gone (a cloud's
/// node controller may have done it already).
async fn delete_node(ctx: &Context, node: &Node) -> Result<(), Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let params = kube::api::DeleteParams {
        preconditions: node.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&node.name_any(), &params).await {
        Ok(_) => {
            ctx.metrics.wrote(CONTROLLER, "delete_node");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("cannot delete Node {}", node.name_any()))(
            e,
        )),
    }
}

/// Apply the machine's status, carrying only the condition types the
/// Machine controller owns: the others (a health check's) belong to other
/// field managers and must not be overwritten from a stale cache.
async fn apply_machine_status(
    ctx: &Context,
    controller: &'static str,
    machine: &Machine,
    current: Option<&MachineStatus>,
    status: &MachineStatus,
) -> Result<bool, Error> {
    let own = |s: &MachineStatus| {
        let mut s = s.clone();
        s.conditions
            .retain(|c| OWNED_BY_MACHINE_CONTROLLER.contains(&c.type_.as_str()));
        s
    };
    let current = current.map(own);
    apply_status(ctx, controller, machine, current.as_ref(), &own(status)).await
}

/// Remove the in-place annotation once every updater is done.
async fn finish_in_place(machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": machine.resource_version(),
            "annotations": { ANNOTATION_IN_PLACE_FROM: null },
        }
    });
    let api: Api<Machine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    match api
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            ctx.metrics.wrote(CONTROLLER, "patch");
            let updaters: Vec<String> = machine
                .status
                .as_ref()
                .and_then(|s| s.in_place_update.as_ref())
                .map(|u| u.steps.iter().map(|s| s.updater.clone()).collect())
                .unwrap_or_default();
            tracing::info!(machine = %key_of(machine), ?updaters, "updated in place");
            record_event(
                ctx,
                CONTROLLER,
                &machine.object_ref(&()),
                EventType::Normal,
                "UpdatedInPlace",
                format!("updated in place by {}", updaters.join(", then ")),
            )
            .await;
            Ok(())
        }
        // Changed meanwhile: the next pass sees the new version.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!(
            "cannot finish the in-place update of machine {}",
            key_of(machine)
        ))(e)),
    }
}

/// Record a terminal failure: status, an Event, and no retry until the spec
/// changes.
async fn fail(
    machine: &Machine,
    ctx: &Context,
    mut status: MachineStatus,
    current: Option<&MachineStatus>,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let t = now();
    let generation = machine.metadata.generation;
    status.failure_reason = Some(reason.to_string());
    status.failure_message = Some(message.clone());
    status.phase = Some(MachinePhase::Failed);
    set_condition(
        &mut status.conditions,
        READY,
        cond::FALSE,
        reason,
        message.clone(),
        generation,
        &t,
    );
    if apply_machine_status(ctx, CONTROLLER, machine, current, &status).await? {
        let object = machine.object_ref(&());
        record_event(
            ctx,
            CONTROLLER,
            &object,
            EventType::Warning,
            reason,
            message,
        )
        .await;
    }
    Ok(Action::requeue(ctx.options.resync))
}

/// Record a retryable failure and back off.
async fn retry(
    machine: &Machine,
    ctx: &Context,
    mut status: MachineStatus,
    current: Option<&MachineStatus>,
    error: ProviderError,
) -> Result<Action, Error> {
    let t = now();
    let (reason, delay) = match &error {
        ProviderError::Transient { retry_after, .. } => ("ProviderRetrying", *retry_after),
        ProviderError::Unauthorized(_) => ("Unauthorized", Duration::from_secs(30)),
        ProviderError::Fault(_) => ("PluginFault", Duration::from_secs(30)),
        _ => ("ProviderError", Duration::from_secs(30)),
    };
    set_condition(
        &mut status.conditions,
        INSTANCE_PROVISIONED,
        cond::FALSE,
        reason,
        error.to_string(),
        machine.metadata.generation,
        &t,
    );
    status.phase.get_or_insert(MachinePhase::Pending);
    apply_machine_status(ctx, CONTROLLER, machine, current, &status).await?;
    Ok(Action::requeue(delay))
}

fn with_finalizer(machine: &Machine) -> Vec<String> {
    let mut finalizers = machine.finalizers().to_vec();
    finalizers.push(MACHINE_FINALIZER.to_string());
    finalizers
}

/// The Node this machine recorded, if it is still that Node: same name,
/// same uid (`status.nodeRef.uid`) and this machine's providerID. A Node
/// re-registered under a reused name (EC2 names follow reused IPs) belongs
/// to another instance and is never drained or deleted for this machine.
fn own_node(nodes: &Store<Node>, status: &MachineStatus) -> Option<Arc<Node>> {
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

fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn address_type(kind: &AddressKind) -> &'static str {
    match kind {
        AddressKind::InternalIp => "InternalIP",
        AddressKind::ExternalIp => "ExternalIP",
        AddressKind::InternalDns => "InternalDNS",
        AddressKind::ExternalDns => "ExternalDNS",
        AddressKind::Hostname => "Hostname",
    }
}

fn state_reason(state: &InstanceState) -> &'static str {
    match state {
        InstanceState::Pending => "InstancePending",
        InstanceState::Running => "Running",
        InstanceState::Updating => "InstanceUpdating",
        InstanceState::Stopping => "InstanceStopping",
        InstanceState::Stopped => "InstanceStopped",
        InstanceState::Terminated => "InstanceTerminated",
        InstanceState::Unknown => "InstanceStateUnknown",
    }
}
