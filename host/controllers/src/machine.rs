//! The Machine controller: one instance per Machine, through its provider
//! plugin. An executor of [`capstan_planner::machine::next_step`]: each
//! reconcile observes the Machine ([`Pass::observe`]), runs the step the
//! planner names ([`Pass::run`]: the finalizer, `validate`, `create`, `get`,
//! the in-place update's next step, a drain round, `delete`, the Node
//! object, the finalizer again), records what it found, and asks again
//! until the planner ends the pass; then [`settle`] derives the status once
//! and it is written at most once ([`Pass::finish`]).
//!
//! Transient errors back off (honouring the plugin's retry-after); terminal
//! errors set `failureReason` / `failureMessage` and an Event, and the
//! machine waits for a spec change. Deletion: pre-drain hooks, the drain
//! (`crate::nodedrain`; its start and end are recorded in
//! `status.deletion`), pre-terminate hooks, `delete` until the provider says
//! done, the Node object, then the finalizer.

use crate::inplace::Advance;
use crate::provider::to_plugin_machine;
use crate::provider::{ProviderError, timed};
use crate::registry::Availability;
use crate::{
    Context, Error, apply_status, counted, drain, instrumented, key_of, kube_err, machines_of_node,
    now, record_event, retry_soon,
};
use capstan_api::machine_conditions::{
    CONFIG_VALID, DELETING, INSTANCE_PROVISIONED, OWNED_BY_MACHINE_CONTROLLER, PAUSED, READY,
    UPDATING,
};
use capstan_api::{
    ANNOTATION_EXCLUDE_NODE_DRAINING, ANNOTATION_IN_PLACE_FROM, ANNOTATION_PAUSED,
    MACHINE_FINALIZER, Machine, MachineAddress, MachinePhase, MachineStatus, NodeRef,
    PRE_DRAIN_HOOK_PREFIX, PRE_TERMINATE_HOOK_PREFIX, Plugin, set_condition, status as cond,
};
use capstan_planner::deletion::DeletionView;
use capstan_planner::machine::{
    Call, CallError, Drain, End, HookPrefixes, InPlace, Instance, InstanceState as PlannedState,
    MachineStep, MachineView, NodeSeen, Outcome, PluginState, Release, Requeue, next_step,
};
use capstan_runtime::types::{AddressKind, Deletion, InstanceState, MachineStatus as PluginStatus};
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

/// One pass over a Machine: observe it, run the planner's steps
/// ([`capstan_planner::machine::next_step`]) until the planner ends the
/// pass, then derive the status once and write it at most once.
async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let mut pass = Pass::observe(&machine, &ctx);
    let end = loop {
        match next_step(&pass.view) {
            MachineStep::End(end) => break end,
            step => pass.run(step).await?,
        }
    };
    pass.finish(end).await
}

/// A pass in progress: what the planner sees, and what the steps found that
/// the status will say.
struct Pass<'a> {
    machine: &'a Machine,
    ctx: &'a Context,
    /// The Plugin this pass acts through: the spec's while alive, the one
    /// that created the instance while deleting.
    plugin_name: &'a str,
    view: MachineView,
    /// The status as this pass found it; the in-place step and the drain
    /// record their progress here.
    draft: MachineStatus,
    /// The provider of the Plugin this pass needs, when it is ready.
    provider: Option<Arc<dyn crate::provider::MachineProvider>>,
    /// What `create` or `get` reported.
    observed: Option<PluginStatus>,
    /// The machine's Node: found by provider ID while alive, the one it
    /// recorded (same uid and instance) while deleting.
    node: Option<Arc<Node>>,
    /// A skipped drain was reported (once per machine: a recorded drain end
    /// was reported when it was recorded, and once per pass).
    skip_reported: bool,
    t: capstan_api::Time,
}

impl<'a> Pass<'a> {
    fn observe(machine: &'a Machine, ctx: &'a Context) -> Pass<'a> {
        let generation = machine.metadata.generation.unwrap_or(0);
        let status = machine.status.clone().unwrap_or_default();
        let deleting = machine.metadata.deletion_timestamp.is_some();
        let namespace = machine.namespace().unwrap_or_default();
        // Released through the Plugin that created it, whatever the spec
        // says now.
        let plugin_name = if deleting {
            machine.instance_plugin()
        } else {
            machine.spec.provider.plugin.as_str()
        };
        let (plugin, provider) = match crate::registry::availability(ctx, plugin_name, &namespace) {
            Availability::Ready => match ctx.providers.get(plugin_name) {
                Some(registered) => (PluginState::Ready, Some(registered.provider)),
                None => (PluginState::Loading, None),
            },
            Availability::Loading => (PluginState::Loading, None),
            Availability::NotAllowed(message) => (PluginState::NotAllowed(message), None),
            Availability::Unavailable(message) => (PluginState::Unavailable(message), None),
        };
        let t = now();
        let node = if deleting {
            own_node(&ctx.stores.nodes, &status)
        } else {
            None
        };
        let deletion = if deleting {
            DeletionView {
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
                // A pass that went past the drain recorded so; later passes
                // (the instance takes a while to go) resume from there
                // instead of listing the Node's pods again.
                drain_complete: status
                    .deletion
                    .as_ref()
                    .is_some_and(|d| d.node_drain_end_time.is_some()),
            }
        } else {
            DeletionView::default()
        };
        let view = MachineView {
            paused: machine.annotations().contains_key(ANNOTATION_PAUSED),
            deleting,
            has_finalizer: machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER),
            plugin,
            provider_changed: machine.provider_changed(),
            failed: status.failure_reason.is_some()
                && status.observed_generation == Some(generation),
            validated: capstan_api::condition(&status.conditions, CONFIG_VALID).is_some_and(|c| {
                c.status == cond::TRUE && c.observed_generation == Some(generation)
            }),
            provider_id: status.provider_id.clone(),
            updating_in_place: crate::inplace::updating_in_place(machine),
            deletion,
            hook_prefixes: HookPrefixes {
                pre_drain: PRE_DRAIN_HOOK_PREFIX,
                pre_terminate: PRE_TERMINATE_HOOK_PREFIX,
            },
            ..Default::default()
        };
        Pass {
            machine,
            ctx,
            plugin_name,
            skip_reported: view.deletion.drain_complete,
            view,
            draft: status,
            provider,
            observed: None,
            node,
            t,
        }
    }

    /// Say once that the drain was skipped or cut short, and why.
    async fn report_skipped_drain(&mut self, why: Option<&String>) {
        let Some(why) = why else { return };
        if std::mem::replace(&mut self.skip_reported, true) {
            return;
        }
        record_event(
            self.ctx,
            CONTROLLER,
            &self.machine.object_ref(&()),
            EventType::Warning,
            "DrainSkipped",
            why.clone(),
        )
        .await;
    }

    /// The provider for a call. The planner asks for calls only when the
    /// plugin is ready, which is when this pass found its provider; were it
    /// missing, the plugin counts as still loading.
    fn provider(&mut self) -> Option<Arc<dyn crate::provider::MachineProvider>> {
        if self.provider.is_none() {
            self.view.plugin = PluginState::Loading;
        }
        self.provider.clone()
    }

    /// Run one step and record what it found in the view.
    async fn run(&mut self, step: MachineStep) -> Result<(), Error> {
        let (ctx, machine) = (self.ctx, self.machine);
        let plugin_name = self.plugin_name;
        match step {
            MachineStep::AddFinalizer => {
                crate::set_finalizers(ctx, CONTROLLER, machine, with_finalizer(machine)).await?;
                self.view.has_finalizer = true;
            }
            MachineStep::Validate => {
                let Some(provider) = self.provider() else {
                    return Ok(());
                };
                let config = machine.spec.provider.config.to_string();
                match timed(
                    &ctx.metrics,
                    plugin_name,
                    "validate",
                    provider.validate(&config),
                )
                .await
                {
                    Ok(()) => self.view.validated = true,
                    Err(e) => self.view.call_error = Some((Call::Validate, call_error(e))),
                }
            }
            MachineStep::Create => self.instance(Call::Create, plugin_name).await,
            MachineStep::Get => self.instance(Call::Get, plugin_name).await,
            MachineStep::AdvanceInPlace => {
                let advance = crate::inplace::advance(ctx, machine, &mut self.draft, &self.t).await;
                self.view.in_place = Some(match advance {
                    Advance::Wait(wait) => InPlace::Wait(wait.as_millis() as u64),
                    Advance::Failed => InPlace::Failed,
                    Advance::Done => InPlace::Done,
                });
            }
            MachineStep::DrainNode(_) => self.drain().await?,
            MachineStep::ReleaseInstance { drain_skipped } => {
                self.report_skipped_drain(drain_skipped.as_ref()).await;
                self.release(plugin_name).await;
            }
            MachineStep::DeleteNode => {
                if let Some(node) = &self.node {
                    delete_node(ctx, node).await?;
                }
                self.view.node_deleted = true;
            }
            MachineStep::RemoveFinalizer => {
                let remaining: Vec<String> = machine
                    .finalizers()
                    .iter()
                    .filter(|f| *f != MACHINE_FINALIZER)
                    .cloned()
                    .collect();
                crate::set_finalizers(ctx, CONTROLLER, machine, remaining).await?;
                self.view.has_finalizer = false;
            }
            MachineStep::End(_) => {}
        }
        Ok(())
    }

    /// `create` or `get`: the instance as the provider reports it.
    async fn instance(&mut self, call: Call, plugin_name: &str) {
        let (ctx, machine) = (self.ctx, self.machine);
        let Some(provider) = self.provider() else {
            return;
        };
        let plugin_machine = to_plugin_machine(machine);
        let result = match call {
            Call::Create => {
                let creating = provider.create(&plugin_machine);
                timed(&ctx.metrics, plugin_name, "create", creating).await
            }
            _ => {
                timed(
                    &ctx.metrics,
                    plugin_name,
                    "get",
                    provider.get(&plugin_machine),
                )
                .await
            }
        };
        match result {
            Ok(observed) => {
                if call == Call::Create {
                    // Recorded now so this pass's status write (the
                    // next API call) persists it.
                    self.draft.provider_id = Some(observed.provider_id.clone());
                    self.draft.provider_plugin = Some(plugin_name.to_string());
                }
                self.draft.plugin_digest = Some(provider.digest().to_string());
                self.node = find_node(&ctx.stores.nodes, &observed.provider_id);
                self.view.provider_id = Some(observed.provider_id.clone());
                self.view.instance = Some(Instance {
                    provider_id: observed.provider_id.clone(),
                    state: instance_state(&observed.state),
                    message: observed
                        .message
                        .as_deref()
                        .map(|m| capstan_api::bounded(m, capstan_api::MAX_PLUGIN_TEXT)),
                    node: self.node_seen(),
                });
                self.observed = Some(observed);
            }
            Err(e) => self.view.call_error = Some((call, call_error(e))),
        }
    }

    /// One drain round on the machine's Node (cordon, evict, look).
    async fn drain(&mut self) -> Result<(), Error> {
        let (ctx, machine) = (self.ctx, self.machine);
        let Some(node) = self.node.clone() else {
            // The planner drains only the Node this pass found.
            self.view.deletion.node = None;
            return Ok(());
        };
        self.draft
            .deletion
            .get_or_insert_with(Default::default)
            .node_drain_start_time
            .get_or_insert_with(|| self.t.clone());
        self.view.drain = Some(match crate::nodedrain::drain_round(ctx, &node).await? {
            crate::nodedrain::Round::Complete => {
                record_event(
                    ctx,
                    CONTROLLER,
                    &machine.object_ref(&()),
                    EventType::Normal,
                    "NodeDrained",
                    format!("drained Node {}", node.name_any()),
                )
                .await;
                Drain::Complete
            }
            crate::nodedrain::Round::Pending { message, blocked } => {
                Drain::Pending { message, blocked }
            }
        });
        Ok(())
    }

    /// The provider's `delete`.
    async fn release(&mut self, plugin_name: &str) {
        let (ctx, machine) = (self.ctx, self.machine);
        let Some(provider) = self.provider() else {
            return;
        };
        let plugin_machine = to_plugin_machine(machine);
        let outcome = timed(
            &ctx.metrics,
            plugin_name,
            "delete",
            provider.delete(&plugin_machine),
        )
        .await;
        self.view.release = Some(match outcome {
            Ok(Deletion::Done) | Err(ProviderError::NotFound(_)) => Release::Done,
            Ok(Deletion::InProgress(ms)) => Release::InProgress(ms),
            Err(ProviderError::Transient {
                message,
                retry_after,
            }) => {
                tracing::debug!(machine = %key_of(machine), %message, "delete will be retried");
                Release::Retry(retry_after.as_millis() as u64)
            }
            Err(error) => Release::Failed(error.to_string()),
        });
    }

    /// The Node as the planner sees it. A Node once linked stays referenced
    /// when it is deleted, so a health check sees "NodeDeleted" rather than
    /// a machine still booting.
    fn node_seen(&self) -> NodeSeen {
        match &self.node {
            Some(n) if node_is_ready(n) => NodeSeen::Ready(n.name_any()),
            Some(n) => NodeSeen::NotReady(n.name_any()),
            None => match &self.draft.node_ref {
                Some(recorded) => NodeSeen::Deleted(recorded.name.clone()),
                None => NodeSeen::Missing,
            },
        }
    }

    /// Write the status the pass ends with (once, if it changed), say what
    /// needs saying, and requeue.
    async fn finish(mut self, end: End) -> Result<Action, Error> {
        let (ctx, machine) = (self.ctx, self.machine);
        if let Outcome::Deleting { drain_skipped, .. } = &end.outcome {
            self.report_skipped_drain(drain_skipped.as_ref()).await;
        }
        let status = settle(
            machine,
            self.draft,
            &self.view,
            self.observed.as_ref(),
            self.node.as_deref(),
            &end.outcome,
            &self.t,
        );
        let changed = match &status {
            Some(status) => {
                apply_machine_status(ctx, CONTROLLER, machine, machine.status.as_ref(), status)
                    .await?
            }
            None => false,
        };
        match &end.outcome {
            Outcome::Failed { reason, message } if changed => {
                record_event(
                    ctx,
                    CONTROLLER,
                    &machine.object_ref(&()),
                    EventType::Warning,
                    reason,
                    message.clone(),
                )
                .await;
            }
            Outcome::Observed => match self.view.in_place {
                Some(InPlace::Failed)
                    if changed && crate::inplace::update_failed(machine).is_none() =>
                {
                    let message = status
                        .as_ref()
                        .and_then(|s| capstan_api::condition(&s.conditions, UPDATING))
                        .map(|c| c.message.clone())
                        .unwrap_or_default();
                    record_event(
                        ctx,
                        CONTROLLER,
                        &machine.object_ref(&()),
                        EventType::Warning,
                        "UpdateFailed",
                        message,
                    )
                    .await;
                }
                // The status (UpToDate, provenance) is written; now the
                // machine is an ordinary member of its set.
                Some(InPlace::Done) => finish_in_place(machine, ctx).await?,
                _ => {}
            },
            _ => {}
        }
        let options = &ctx.options;
        Ok(match end.requeue {
            Requeue::AwaitChange => Action::await_change(),
            Requeue::Resync => Action::requeue(options.resync),
            Requeue::Poll => Action::requeue(options.poll),
            // A running instance is looked at again on its own cadence, so
            // one that vanished is seen within that bound even without a
            // Node event.
            Requeue::InstanceCheck => {
                Action::requeue(jittered(options.instance_check).min(options.resync))
            }
            Requeue::After(ms) => Action::requeue(Duration::from_millis(ms)),
        })
    }
}

/// The status a pass ends with, derived once from what it observed and how
/// the planner ended it (`None`: nothing to write). Pure.
fn settle(
    machine: &Machine,
    mut status: MachineStatus,
    view: &MachineView,
    observed: Option<&PluginStatus>,
    node: Option<&Node>,
    outcome: &Outcome,
    t: &capstan_api::Time,
) -> Option<MachineStatus> {
    if *outcome == Outcome::Unchanged {
        return None;
    }
    let generation = machine.metadata.generation;
    let set = condition_setter(generation, t);
    if *outcome == Outcome::Paused {
        let message = format!("the {ANNOTATION_PAUSED} annotation holds the machine");
        set(&mut status, PAUSED, cond::TRUE, "Paused", message);
        return Some(status);
    }
    if capstan_api::condition(&status.conditions, PAUSED).is_some() {
        set(&mut status, PAUSED, cond::FALSE, "NotPaused", String::new());
    }
    if let Outcome::Deleting {
        reason,
        message,
        instance,
        drain_ended,
        ..
    } = outcome
    {
        status.phase = Some(MachinePhase::Deleting);
        set(&mut status, DELETING, cond::TRUE, reason, message.clone());
        if let Some((reason, message)) = instance {
            set(
                &mut status,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                reason,
                message.clone(),
            );
        }
        if *drain_ended {
            status
                .deletion
                .get_or_insert_with(Default::default)
                .node_drain_end_time
                .get_or_insert_with(|| t.clone());
        }
        return Some(status);
    }

    // Alive: the status describes this generation from now on.
    status.observed_generation = Some(generation.unwrap_or(0));
    status.failure_reason = None;
    status.failure_message = None;
    // Machines that got their instance before the creating Plugin was
    // recorded: the spec's is the one (it could not change unnoticed since).
    if status.provider_id.is_some() && status.provider_plugin.is_none() {
        status.provider_plugin = Some(machine.spec.provider.plugin.clone());
    }
    match &view.call_error {
        Some((Call::Validate, CallError::InvalidConfig(message))) => set(
            &mut status,
            CONFIG_VALID,
            cond::FALSE,
            "InvalidConfig",
            message.clone(),
        ),
        _ if view.validated => set(
            &mut status,
            CONFIG_VALID,
            cond::TRUE,
            "Valid",
            String::new(),
        ),
        _ => {}
    }
    match outcome {
        Outcome::Unchanged | Outcome::Deleting { .. } | Outcome::Paused => {}
        Outcome::Held { reason, message } => {
            set(
                &mut status,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                reason,
                message.clone(),
            );
            status.phase.get_or_insert(MachinePhase::Pending);
        }
        Outcome::ProviderChanged(message) => set(
            &mut status,
            CONFIG_VALID,
            cond::FALSE,
            "ProviderChanged",
            message.clone(),
        ),
        Outcome::Failed { reason, message } => {
            status.failure_reason = Some(reason.clone());
            status.failure_message = Some(message.clone());
            status.phase = Some(MachinePhase::Failed);
            set(&mut status, READY, cond::FALSE, reason, message.clone());
        }
        Outcome::Retrying { reason, message } => {
            set(
                &mut status,
                INSTANCE_PROVISIONED,
                cond::FALSE,
                reason,
                message.clone(),
            );
            if matches!(view.call_error, Some((Call::Create, _))) {
                status.phase = Some(MachinePhase::Provisioning);
            } else {
                status.phase.get_or_insert(MachinePhase::Pending);
            }
        }
        Outcome::Observed => {
            if let (Some(observed), Some(instance)) = (observed, &view.instance) {
                settle_observed(&mut status, view, observed, instance, node, generation, t);
            }
        }
    }
    Some(status)
}

/// Sets one of the Machine controller's conditions, at this generation and
/// time.
fn condition_setter(
    generation: Option<i64>,
    t: &capstan_api::Time,
) -> impl Fn(&mut MachineStatus, &str, &str, &str, String) + '_ {
    move |status, kind, value, reason, message| {
        set_condition(
            &mut status.conditions,
            kind,
            value,
            reason,
            message,
            generation.or(Some(0)),
            t,
        )
    }
}

/// The status of a pass that observed its instance: addresses, version,
/// Node, `InstanceProvisioned`, `Ready` and the phase (an in-place update's
/// when one is under way).
fn settle_observed(
    status: &mut MachineStatus,
    view: &MachineView,
    observed: &PluginStatus,
    instance: &Instance,
    node: Option<&Node>,
    generation: Option<i64>,
    t: &capstan_api::Time,
) {
    let set = condition_setter(generation, t);
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
    if let Some(n) = node {
        status.node_ref = Some(NodeRef {
            name: n.name_any(),
            uid: n.uid(),
        });
    }
    let running = instance.state == PlannedState::Running;
    if running {
        set(
            status,
            INSTANCE_PROVISIONED,
            cond::TRUE,
            "Running",
            String::new(),
        );
    } else {
        set(
            status,
            INSTANCE_PROVISIONED,
            cond::FALSE,
            state_reason(&observed.state),
            observed.message.clone().unwrap_or_default(),
        );
    }
    let node_ready = matches!(instance.node, NodeSeen::Ready(_));
    let (reason, message) = match (&instance.node, running) {
        (_, false) => (
            "InstanceNotRunning",
            "waiting for the instance to run".to_string(),
        ),
        (NodeSeen::Deleted(name), true) => (
            "NodeDeleted",
            format!(
                "Node {name} was deleted; waiting for a Node with spec.providerID {}",
                instance.provider_id
            ),
        ),
        (NodeSeen::Missing, true) => (
            "WaitingForNode",
            format!("no Node with spec.providerID {} yet", instance.provider_id),
        ),
        (NodeSeen::NotReady(name), true) => ("NodeNotReady", format!("Node {name} is not Ready")),
        (NodeSeen::Ready(_), true) => ("NodeReady", String::new()),
    };
    let ready = if node_ready && running {
        cond::TRUE
    } else {
        cond::FALSE
    };
    set(status, READY, ready, reason, message);
    status.phase = Some(match view.in_place {
        Some(InPlace::Wait(_)) => MachinePhase::Updating,
        Some(InPlace::Failed) => MachinePhase::UpdateFailed,
        _ if node_ready && running => MachinePhase::Running,
        _ if running => MachinePhase::Provisioned,
        _ => MachinePhase::Provisioning,
    });
}

/// A provider error as the planner weighs it.
fn call_error(error: ProviderError) -> CallError {
    let retry = |reason: &str, after: Duration, error: &ProviderError| CallError::Retry {
        reason: reason.into(),
        message: error.to_string(),
        after_ms: after.as_millis() as u64,
    };
    match &error {
        ProviderError::InvalidConfig(m) => CallError::InvalidConfig(m.clone()),
        ProviderError::Terminal(m) => CallError::Terminal(m.clone()),
        ProviderError::NotFound(m) => CallError::NotFound(m.clone()),
        ProviderError::Transient { retry_after, .. } => {
            retry("ProviderRetrying", *retry_after, &error)
        }
        ProviderError::Unauthorized(_) => retry("Unauthorized", Duration::from_secs(30), &error),
        ProviderError::Fault(_) => retry("PluginFault", Duration::from_secs(30), &error),
    }
}

fn instance_state(state: &InstanceState) -> PlannedState {
    match state {
        InstanceState::Pending => PlannedState::Pending,
        InstanceState::Running => PlannedState::Running,
        InstanceState::Updating => PlannedState::Updating,
        InstanceState::Stopping => PlannedState::Stopping,
        InstanceState::Stopped => PlannedState::Stopped,
        InstanceState::Terminated => PlannedState::Terminated,
        InstanceState::Unknown => PlannedState::Unknown,
    }
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

/// The names of the hooks with this annotation prefix, sorted.
fn hooks(machine: &Machine, prefix: &str) -> Vec<String> {
    machine
        .annotations()
        .keys()
        .filter_map(|k| k.strip_prefix(prefix))
        .map(str::to_string)
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_runtime::types::{InstanceState as Wit, MachineAddress as WitAddress};

    fn machine(generation: i64) -> Machine {
        let mut m = Machine::new("m1", Default::default());
        m.spec.provider.plugin = "sim".into();
        m.metadata.generation = Some(generation);
        m
    }

    fn running(node: NodeSeen) -> (PluginStatus, Instance) {
        let observed = PluginStatus {
            provider_id: "sim://i-1".into(),
            state: Wit::Running,
            addresses: vec![WitAddress {
                kind: AddressKind::InternalIp,
                address: "10.0.0.1".into(),
            }],
            failure_domain: None,
            version: Some("v1.30.0".into()),
            message: None,
        };
        let instance = Instance {
            provider_id: "sim://i-1".into(),
            state: PlannedState::Running,
            message: None,
            node,
        };
        (observed, instance)
    }

    fn condition<'s>(s: &'s MachineStatus, kind: &str) -> (&'s str, &'s str) {
        let c = capstan_api::condition(&s.conditions, kind).expect(kind);
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn an_observed_running_instance_with_a_ready_node_is_running_and_ready() {
        let (observed, instance) = running(NodeSeen::Ready("n1".into()));
        let view = MachineView {
            validated: true,
            instance: Some(instance),
            ..Default::default()
        };
        let t = now();
        let s = settle(
            &machine(3),
            MachineStatus::default(),
            &view,
            Some(&observed),
            None,
            &Outcome::Observed,
            &t,
        )
        .unwrap();
        assert_eq!(s.phase, Some(MachinePhase::Running));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(condition(&s, READY), ("True", "NodeReady"));
        assert_eq!(condition(&s, INSTANCE_PROVISIONED), ("True", "Running"));
        assert_eq!(condition(&s, CONFIG_VALID), ("True", "Valid"));
        assert_eq!(s.addresses[0].type_, "InternalIP");
        assert_eq!(s.version.as_deref(), Some("v1.30.0"));
        // The same pass again changes nothing: no second write.
        let again = settle(
            &machine(3),
            s.clone(),
            &view,
            Some(&observed),
            None,
            &Outcome::Observed,
            &t,
        )
        .unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn a_deleted_node_stays_referenced_and_an_update_shows_in_the_phase() {
        let (observed, instance) = running(NodeSeen::Deleted("n1".into()));
        let mut view = MachineView {
            validated: true,
            instance: Some(instance),
            ..Default::default()
        };
        let s = settle(
            &machine(1),
            MachineStatus::default(),
            &view,
            Some(&observed),
            None,
            &Outcome::Observed,
            &now(),
        )
        .unwrap();
        assert_eq!(condition(&s, READY), ("False", "NodeDeleted"));
        assert_eq!(s.phase, Some(MachinePhase::Provisioned));
        view.in_place = Some(InPlace::Wait(1000));
        let s = settle(
            &machine(1),
            s,
            &view,
            Some(&observed),
            None,
            &Outcome::Observed,
            &now(),
        )
        .unwrap();
        assert_eq!(s.phase, Some(MachinePhase::Updating));
    }

    #[test]
    fn failures_are_recorded_and_cleared_by_the_next_generation() {
        let view = MachineView {
            call_error: Some((Call::Validate, CallError::InvalidConfig("size".into()))),
            ..Default::default()
        };
        let failed = Outcome::Failed {
            reason: "InvalidConfiguration".into(),
            message: "spec.provider.config: size".into(),
        };
        let s = settle(
            &machine(1),
            MachineStatus::default(),
            &view,
            None,
            None,
            &failed,
            &now(),
        )
        .unwrap();
        assert_eq!(s.failure_reason.as_deref(), Some("InvalidConfiguration"));
        assert_eq!(s.phase, Some(MachinePhase::Failed));
        assert_eq!(condition(&s, CONFIG_VALID), ("False", "InvalidConfig"));
        // Generation 2 validates: the failure is gone.
        let view = MachineView {
            validated: true,
            ..Default::default()
        };
        let retrying = Outcome::Retrying {
            reason: "ProviderRetrying".into(),
            message: "busy".into(),
        };
        let s = settle(&machine(2), s, &view, None, None, &retrying, &now()).unwrap();
        assert_eq!(
            (s.failure_reason.as_deref(), s.observed_generation),
            (None, Some(2))
        );
        assert_eq!(condition(&s, CONFIG_VALID), ("True", "Valid"));
        assert_eq!(
            condition(&s, INSTANCE_PROVISIONED),
            ("False", "ProviderRetrying")
        );
    }

    #[test]
    fn deletion_records_where_the_drain_is_and_nothing_is_written_for_an_unchanged_pass() {
        let holding = Outcome::Deleting {
            reason: "DrainingNode",
            message: "evicting 1 pod".into(),
            instance: None,
            drain_ended: false,
            drain_skipped: None,
        };
        let view = MachineView {
            deleting: true,
            ..Default::default()
        };
        let s = settle(
            &machine(1),
            MachineStatus::default(),
            &view,
            None,
            None,
            &holding,
            &now(),
        )
        .unwrap();
        assert_eq!(s.phase, Some(MachinePhase::Deleting));
        assert_eq!(condition(&s, DELETING), ("True", "DrainingNode"));
        assert!(s.deletion.is_none_or(|d| d.node_drain_end_time.is_none()));
        let past = Outcome::Deleting {
            reason: "WaitingForInfrastructureDeletion",
            message: "deleting the instance".into(),
            instance: Some(("Deleting", "the provider is deleting the instance".into())),
            drain_ended: true,
            drain_skipped: None,
        };
        let s = settle(
            &machine(1),
            MachineStatus::default(),
            &view,
            None,
            None,
            &past,
            &now(),
        )
        .unwrap();
        assert!(s.deletion.unwrap().node_drain_end_time.is_some());
        assert_eq!(condition_of_none(&view), None);
    }

    fn condition_of_none(view: &MachineView) -> Option<MachineStatus> {
        settle(
            &machine(1),
            MachineStatus::default(),
            view,
            None,
            None,
            &Outcome::Unchanged,
            &now(),
        )
    }
}
