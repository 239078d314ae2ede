//! The Machine controller: one instance per Machine, through its provider
//! plugin.
//!
//! Per reconcile: make sure the finalizer is on; `validate` the config (once
//! per generation); `create` (idempotent by the machine's uid) until a
//! provider ID is known, which is persisted at once; then `get` until the
//! instance runs; link the Node whose `spec.providerID` matches and mirror
//! its Ready condition. On deletion, `delete` until the provider says done,
//! then drop the finalizer. Transient errors back off (honouring the
//! plugin's retry-after); terminal errors set `failureReason` /
//! `failureMessage` and an Event, and the machine waits for a spec change.

use crate::plugin::Availability;
use crate::provider::{ProviderError, timed};
use crate::{
    Context, Error, apply_status, counted, drain, instrumented, key_of, kube_err, now,
    record_event, retry_soon,
};
use capstan_api::machine_conditions::{CONFIG_VALID, INSTANCE_PROVISIONED, READY};
use capstan_api::{
    MACHINE_FINALIZER, Machine, MachineAddress, MachinePhase, MachineStatus, NodeRef, Plugin,
    set_condition, status as cond,
};
use capstan_runtime::types::{AddressKind, Deletion, InstanceState, Machine as PluginMachine};
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
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let trigger = counted(CONTROLLER, &ctx.metrics, machines, |m| Some(key_of(m)));
    let by_plugin = ctx.stores.machines.clone();
    let by_node = ctx.stores.machines.clone();
    let stream = Controller::for_shared_stream(trigger, ctx.stores.machines.clone())
        .watches_shared_stream(plugins, move |plugin: Arc<Plugin>| {
            let name = plugin.name_any();
            machines_where(&by_plugin, |m| m.spec.provider.plugin == name)
        })
        .watches_shared_stream(nodes, move |node: Arc<Node>| {
            let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
            match provider_id {
                Some(id) => machines_where(&by_node, |m| {
                    m.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(id.as_str())
                }),
                None => vec![],
            }
        })
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
    if !has_finalizer {
        set_finalizers(&machine, &ctx, with_finalizer(&machine)).await?;
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
    let plugin_name = machine.spec.provider.plugin.clone();

    let registered = match crate::plugin::availability(&ctx, &plugin_name) {
        Availability::Ready => ctx.providers.get(&plugin_name),
        Availability::Loading => return Ok(Action::requeue(Duration::from_millis(500))),
        Availability::Unavailable(reason) => {
            set_condition(
                &mut status.conditions,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                "PluginNotReady",
                reason,
                Some(generation),
                &t,
            );
            status.phase.get_or_insert(MachinePhase::Pending);
            apply_status(
                &ctx,
                CONTROLLER,
                machine.as_ref(),
                current.as_ref(),
                &status,
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(15)));
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
    status.node_ref = node.as_ref().map(|n| NodeRef {
        name: n.name_any(),
        uid: n.uid(),
    });
    let node_ready = node.as_ref().is_some_and(|n| node_is_ready(n));
    let (reason, message) = match (&node, node_ready, running) {
        (_, _, false) => (
            "InstanceNotRunning",
            "waiting for the instance to run".to_string(),
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
    apply_status(
        &ctx,
        CONTROLLER,
        machine.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    Ok(if !running {
        Action::requeue(ctx.options.poll)
    } else if !node_ready {
        Action::requeue(Duration::from_secs(10))
    } else {
        Action::requeue(ctx.options.resync)
    })
}

async fn delete(
    machine: &Machine,
    ctx: &Context,
    mut status: MachineStatus,
    current: Option<&MachineStatus>,
) -> Result<Action, Error> {
    let plugin_name = &machine.spec.provider.plugin;
    status.phase = Some(MachinePhase::Deleting);
    let t = now();
    let generation = machine.metadata.generation;
    let provider = match crate::plugin::availability(ctx, plugin_name) {
        Availability::Ready => ctx.providers.get(plugin_name),
        Availability::Loading => return Ok(Action::requeue(Duration::from_millis(500))),
        Availability::Unavailable(reason) => {
            set_condition(
                &mut status.conditions,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                "PluginNotReady",
                format!("cannot release the instance: {reason}"),
                generation,
                &t,
            );
            apply_status(ctx, CONTROLLER, machine, current, &status).await?;
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
            let remaining: Vec<String> = machine
                .finalizers()
                .iter()
                .filter(|f| *f != MACHINE_FINALIZER)
                .cloned()
                .collect();
            set_finalizers(machine, ctx, remaining).await?;
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
            apply_status(ctx, CONTROLLER, machine, current, &status).await?;
            Ok(Action::requeue(Duration::from_millis(ms.max(100))))
        }
        Err(ProviderError::Transient {
            message,
            retry_after,
        }) => {
            tracing::debug!(machine = %key_of(machine), %message, "delete will be retried");
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
            apply_status(ctx, CONTROLLER, machine, current, &status).await?;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
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
    if apply_status(ctx, CONTROLLER, machine, current, &status).await? {
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
    apply_status(ctx, CONTROLLER, machine, current, &status).await?;
    Ok(Action::requeue(delay))
}

fn with_finalizer(machine: &Machine) -> Vec<String> {
    let mut finalizers = machine.finalizers().to_vec();
    finalizers.push(MACHINE_FINALIZER.to_string());
    finalizers
}

/// Replace the finalizer list, guarded by the resourceVersion we read so a
/// concurrent change by someone else is not overwritten.
async fn set_finalizers(
    machine: &Machine,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<Machine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": machine.resource_version(),
        }
    });
    match api
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            return Err(kube_err(format!(
                "cannot update the finalizers of machine {}",
                key_of(machine)
            ))(e));
        }
    }
    ctx.metrics.wrote(CONTROLLER, "patch_finalizers");
    Ok(())
}

fn find_node(nodes: &Store<Node>, provider_id: &str) -> Option<Arc<Node>> {
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
