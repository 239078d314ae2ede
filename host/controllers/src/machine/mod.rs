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
//! `status.deletion`), the wait for the Node's volumes to detach (recorded
//! the same way), pre-terminate hooks, `delete` until the provider says
//! done, the Node object (given up after `nodeDeletionTimeoutSeconds`;
//! these steps are in `deletion`, the Node handling in `node`),
//! then the finalizer.
//!
//! The Node side of a pass (the claim, labels and taints, bootstrap
//! tokens and join data, drains, volume waits, Node deletion) acts in the
//! cluster the Machine's `spec.clusterName` names, through that Cluster's
//! connection (`cluster`: where the Node is and whether it answers;
//! `steps`: the steps that act there); `triggers` says what wakes a pass.

mod adoption;
mod bootstrap;
mod cluster;
mod deletion;
mod node;
mod observe;
mod status;
mod steps;
mod triggers;
pub(crate) mod update;

pub(crate) use bootstrap::token_id;
pub(crate) use cluster::placement_named;
use node::node_is_ready;
pub(crate) use node::own_node;
use observe::{call_error, deletion_view, instance_state, plugin_state};
use status::settle;
pub(crate) use triggers::{controller, machines_of_event};

use capstan_api::machine_conditions::{CONFIG_VALID, OWNED_BY_MACHINE_CONTROLLER, UPDATING};
use capstan_api::{
    ANNOTATION_EXCLUDE_NODE_DRAINING, ANNOTATION_EXCLUDE_NODE_DRAINING_CAPI,
    ANNOTATION_EXCLUDE_WAIT_FOR_VOLUME_DETACH, ANNOTATION_IN_PLACE_FROM, ANNOTATION_PAUSED,
    MACHINE_FINALIZER, Machine, MachineStatus, PRE_DRAIN_HOOK_PREFIX, PRE_TERMINATE_HOOK_PREFIX,
    status as cond,
};
use capstan_kit::provider::{
    MachineProvider, ProviderError, Providers, timed_as, to_plugin_machine,
};
use capstan_kit::registry::Availability;
use capstan_kit::write::{add_finalizer, apply_status, record_event};
use capstan_kit::{Error, Kube, key_of, kube_err, now};
use capstan_planner::deletion::DeletionView;
use capstan_planner::machine::{
    Adoption, Bootstrap, Call, CallError, End, HookPrefixes, InPlace, Instance,
    InstanceState as PlannedState, MachineStep, MachineView, NodeSeen, Outcome, PluginState,
    Requeue, next_step,
};
use capstan_runtime::types::{InstanceState, MachineStatus as PluginStatus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "machine";

/// What the Machine controller works with.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) kube: Kube,
    /// Providers by Plugin name (the Plugin controller fills it).
    pub(crate) providers: Providers,
    /// Updaters by Plugin name, for machines updated in place.
    pub(crate) updaters: capstan_kit::registry::Updaters,
    /// Bootstrap plugins by Plugin name, for machines' join data.
    pub(crate) bootstraps: capstan_kit::registry::Bootstraps,
    /// How bootstrap tokens are minted.
    pub(crate) bootstrap_token: crate::BootstrapTokenOptions,
    /// The Eviction API, for drains.
    pub(crate) evictions: crate::nodedrain::Evictions,
    /// How often a machine whose instance is still booting (or deleting) is
    /// polled through its provider.
    pub(crate) poll: Duration,
    /// How often a Running machine's instance is looked at through its
    /// provider's `get` (jittered by a tenth).
    pub(crate) instance_check: Duration,
    /// Machines whose status a pass wrote and the cache has not shown yet.
    pub(crate) unseen_writes: capstan_kit::unseen::UnseenWrites,
    /// Nodes a Machine's pass wrote (its claim, annotations, labels,
    /// taints) and the cache has not shown yet, per Machine.
    pub(crate) node_writes: capstan_kit::unseen::UnseenWrites,
    /// What this process learned of each Machine's instance (by uid) that
    /// its status may not show yet. In memory only: after a restart, each
    /// Machine looks once more.
    pub(crate) instances_here: std::sync::Mutex<std::collections::HashMap<String, InstanceHere>>,
    /// The workload clusters Machines with `spec.clusterName` live in.
    pub(crate) clusters: capstan_kit::workload::WorkloadClusters,
}

impl Context {
    /// The Machine controller's context: the plugins it calls (providers,
    /// updaters, bootstrap plugins), the Eviction API and its settings.
    pub(crate) fn new(
        kube: Kube,
        (providers, updaters, bootstraps): (
            Providers,
            capstan_kit::registry::Updaters,
            capstan_kit::registry::Bootstraps,
        ),
        evictions: crate::nodedrain::Evictions,
        clusters: capstan_kit::workload::WorkloadClusters,
        options: &crate::Options,
    ) -> Self {
        Context {
            kube,
            providers,
            updaters,
            bootstraps,
            bootstrap_token: options.bootstrap_token.clone(),
            evictions,
            poll: options.poll,
            instance_check: options.instance_check,
            unseen_writes: Default::default(),
            node_writes: Default::default(),
            instances_here: Default::default(),
            clusters,
        }
    }
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

/// One pass over a Machine: observe it, run the planner's steps
/// ([`capstan_planner::machine::next_step`]) until the planner ends the
/// pass, then derive the status once and write it at most once.
async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A pass on a status older than the last one written would repeat its
    // steps; the write's own watch event brings the next pass.
    if let Some(wait) = ctx.unseen_writes.wait(&*machine) {
        return Ok(Action::requeue(wait));
    }
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
    provider: Option<Arc<dyn MachineProvider>>,
    /// What `create` or `get` reported.
    observed: Option<PluginStatus>,
    /// The data `create` passes to the instance (it holds the machine's
    /// bootstrap token: never logged).
    bootstrap_data: Option<capstan_runtime::types::BootstrapData>,
    /// The machine's Node: found by provider ID while alive (if the claim
    /// holds), the one it recorded (same uid and instance) while deleting.
    node: Option<Arc<Node>>,
    /// The Node that carries the machine's provider ID but that it may not
    /// take, and why.
    refused: Option<(String, String)>,
    /// A skipped drain or volume wait was reported (once per machine: both
    /// ends recorded means it was reported when they were, and once per
    /// pass).
    skip_reported: bool,
    /// The cluster its Node lives in, and whether it can be reached.
    placement: cluster::Placement,
    /// The Eviction API of a workload cluster (the management cluster's
    /// is the context's).
    workload_evictions: Option<crate::nodedrain::Evictions>,
    /// The resourceVersions this pass's own writes left the Machine at
    /// (its finalizer, `spec.providerID`), oldest first.
    own_versions: Vec<String>,
    t: capstan_api::Time,
}

impl<'a> Pass<'a> {
    fn observe(machine: &'a Machine, ctx: &'a Context) -> Pass<'a> {
        let generation = machine.metadata.generation.unwrap_or(0);
        let (status, nothing_found) = with_instance_here(ctx, machine);
        let deleting = machine.metadata.deletion_timestamp.is_some();
        // Released through the Plugin that created it, whatever the spec
        // says now.
        let plugin_name = if deleting {
            machine.instance_plugin()
        } else {
            machine.spec.provider.plugin.as_str()
        };
        let (plugin, provider) = plugin_state(ctx, machine, plugin_name, &status);
        let t = now();
        let placement = cluster::placement(ctx, machine);
        let nodes = placement.reach.kube(&ctx.kube);
        let node = match nodes {
            Some(nodes) if deleting && !placement.cluster_gone => {
                own_node(&nodes.stores.nodes, &status)
            }
            _ => None,
        };
        let deletion = if deleting {
            let mut deletion = deletion_view(machine, &status, node.as_deref(), &t);
            // A Node in a cluster that does not answer is not known to be
            // gone: its drain waits (until nodeDrainTimeoutSeconds) rather
            // than being skipped.
            if nodes.is_none() && !placement.cluster_gone {
                deletion.node = status.node_ref.as_ref().map(|r| r.name.clone());
            }
            deletion
        } else {
            DeletionView::default()
        };
        let view = MachineView {
            paused: machine.annotations().contains_key(ANNOTATION_PAUSED) || placement.paused,
            cluster_held: placement.reach.down(),
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
            bootstrap: if machine.spec.bootstrap.is_some() {
                Bootstrap::Wanted
            } else {
                Bootstrap::Ready
            },
            adoption: if nothing_found {
                Adoption::NothingFound
            } else {
                Adoption::NotAsked
            },
            ..Default::default()
        };
        Pass {
            machine,
            ctx,
            plugin_name,
            skip_reported: view.deletion.drain_complete && view.deletion.volumes_detached,
            view,
            draft: status,
            provider,
            observed: None,
            bootstrap_data: None,
            node,
            refused: None,
            workload_evictions: placement.reach.evictions(),
            placement,
            own_versions: Vec::new(),
            t,
        }
    }

    /// The provider for a call. The planner asks for calls only when the
    /// plugin is ready, which is when this pass found its provider; were it
    /// missing, the plugin counts as still loading.
    fn provider(&mut self) -> Option<Arc<dyn MachineProvider>> {
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
                if let Some(written) =
                    add_finalizer(&ctx.kube, CONTROLLER, machine, MACHINE_FINALIZER).await?
                {
                    self.own_versions.extend(written.resource_version());
                }
                self.view.has_finalizer = true;
            }
            MachineStep::Validate => {
                let Some(provider) = self.provider() else {
                    return Ok(());
                };
                let config = machine.spec.provider.config.to_string();
                match timed_as(
                    &ctx.kube.metrics,
                    (plugin_name, provider.revision()),
                    "validate",
                    provider.validate(&config),
                )
                .await
                {
                    Ok(()) => self.view.validated = true,
                    Err(e) => self.view.call_error = Some((Call::Validate, call_error(e))),
                }
            }
            MachineStep::PrepareBootstrap => self.prepare_bootstrap().await,
            MachineStep::FindInstance => self.find_instance(plugin_name).await,
            MachineStep::Create => self.instance(Call::Create, plugin_name).await,
            MachineStep::Get => self.instance(Call::Get, plugin_name).await,
            MachineStep::AdvanceInPlace => self.advance_in_place().await,
            MachineStep::DrainNode(_) => self.drain().await?,
            MachineStep::CheckVolumes(_) => self.check_volumes().await?,
            MachineStep::ReleaseInstance { drain_skipped } => {
                self.report_skipped_drain(drain_skipped.as_ref()).await;
                self.release(plugin_name).await;
            }
            MachineStep::DeleteNode => {
                if let Some(node) = &self.node {
                    self.delete_node(node.clone()).await?;
                }
                self.view.node_deleted = true;
            }
            MachineStep::RemoveFinalizer => self.remove_finalizer().await?,
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
        let mut plugin_machine = to_plugin_machine(machine);
        // Adopted in this pass: recorded in the draft, not yet in status.
        if plugin_machine.provider_id.is_none() {
            plugin_machine.provider_id = self.draft.provider_id.clone();
        }
        let result = match call {
            Call::Create => {
                let creating = provider.create(&plugin_machine, self.bootstrap_data.as_ref());
                let labels = (plugin_name, provider.revision());
                timed_as(&ctx.kube.metrics, labels, "create", creating).await
            }
            _ => {
                timed_as(
                    &ctx.kube.metrics,
                    (plugin_name, provider.revision()),
                    "get",
                    provider.get(&plugin_machine),
                )
                .await
            }
        };
        match result {
            Ok(observed) => {
                if call == Call::Create {
                    let created = InstanceHere::Created {
                        provider_id: observed.provider_id.clone(),
                        plugin: plugin_name.to_string(),
                    };
                    ctx.instance_here(machine, Some(created));
                    // Recorded now so this pass's status write (the
                    // next API call) persists it.
                    self.draft.provider_id = Some(observed.provider_id.clone());
                    self.draft.provider_plugin = Some(plugin_name.to_string());
                }
                self.draft.plugin_digest = Some(provider.digest().to_string());
                self.draft.plugin_signer = provider.signer().map(str::to_string);
                let prefix = provider.provider_id_prefix();
                if let Some(nodes) = self.nodes() {
                    self.tend_node(&nodes, prefix, &observed.provider_id).await;
                }
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
                let joined = self.node.is_some();
                if let Some(nodes) = self.nodes() {
                    bootstrap::tend_token(ctx, &nodes, machine, joined, &mut self.draft).await;
                }
            }
            Err(e) => self.view.call_error = Some((call, call_error(e))),
        }
    }

    /// The Node as the planner sees it. A Node once linked stays referenced
    /// when it is deleted, so a health check sees "NodeDeleted" rather than
    /// a machine still booting.
    fn node_seen(&self) -> NodeSeen {
        if let Some((_, why)) = self.placement.reach.down() {
            return NodeSeen::Unreachable(why);
        }
        if let Some((node, why)) = &self.refused {
            return NodeSeen::Refused {
                node: node.clone(),
                why: why.clone(),
            };
        }
        match &self.node {
            Some(n) if node_is_ready(n) => NodeSeen::Ready(n.name_any()),
            Some(n) => NodeSeen::NotReady(n.name_any()),
            None => match &self.draft.node_ref {
                Some(recorded) => NodeSeen::Deleted(recorded.name.clone()),
                None => NodeSeen::Missing,
            },
        }
    }

    /// What the machine's owners say: its set's `minReadySeconds` (after
    /// which a Ready machine counts as `Available`), and whether the set is
    /// its deployment's current one (`UpToDate`), from the caches (a
    /// deployment's spec change wakes its machines).
    fn owners(&self) -> status::Owners {
        let namespace = self.machine.namespace().unwrap_or_default();
        let controller =
            |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
             kind: &str| {
                refs.iter()
                    .find(|o| o.controller == Some(true) && o.kind == kind)
                    .map(|o| o.name.clone())
            };
        let stores = &self.ctx.kube.stores;
        let Some(set) =
            controller(self.machine.owner_references(), "MachineSet").and_then(|name| {
                stores
                    .machine_sets
                    .get(&ObjectRef::new(&name).within(&namespace))
            })
        else {
            return status::Owners::default();
        };
        let deployment = controller(set.owner_references(), "MachineDeployment").and_then(|name| {
            stores
                .deployments
                .get(&ObjectRef::new(&name).within(&namespace))
        });
        status::Owners {
            min_ready_seconds: set.spec.min_ready_seconds,
            up_to_date: deployment.map(|md| {
                if crate::template::set_is_current(&md, &set, self.t.0.as_second()) {
                    Ok(())
                } else {
                    Err(format!(
                        "MachineSet {} is not the current template of MachineDeployment {}; a rollout replaces the machine",
                        set.name_any(),
                        md.name_any()
                    ))
                }
            }),
        }
    }

    /// Write the status the pass ends with (once, if it changed), say what
    /// needs saying, and requeue.
    async fn finish(mut self, end: End) -> Result<Action, Error> {
        let (ctx, machine) = (self.ctx, self.machine);
        if let Outcome::Deleting { drain_skipped, .. } = &end.outcome {
            self.report_skipped_drain(drain_skipped.as_ref()).await;
        }
        let owners = self.owners();
        // Cluster API's `spec.providerID`, written before the status that
        // records the instance, so that status observes the new generation.
        let recorded = self.draft.provider_id.as_deref();
        let patched = match recorded {
            Some(id)
                if machine.metadata.deletion_timestamp.is_none()
                    && end.outcome != Outcome::Paused =>
            {
                let latest = self.own_versions.last().map(String::as_str);
                adoption::write_provider_id(ctx, machine, latest, id).await?
            }
            _ => None,
        };
        if let Some(patched) = &patched {
            self.own_versions.extend(patched.resource_version());
        }
        let read = machine;
        let machine = patched.as_ref().unwrap_or(machine);
        let status = settle(
            machine,
            self.draft,
            &self.view,
            self.observed.as_ref(),
            self.node.as_deref(),
            &end.outcome,
            &owners,
            &self.t,
        );
        let changed = match &status {
            Some(status) => {
                apply_machine_status(ctx, CONTROLLER, machine, machine.status.as_ref(), status)
                    .await?
            }
            None => false,
        };
        if changed {
            ctx.unseen_writes.wrote_through(read, &self.own_versions);
        }
        match &end.outcome {
            Outcome::Failed { reason, message } if changed => {
                record_event(
                    &ctx.kube,
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
                        &ctx.kube,
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
        let after = match end.requeue {
            Requeue::AwaitChange => None,
            Requeue::Resync => Some(ctx.kube.resync),
            Requeue::Poll => Some(ctx.poll),
            // A running instance is looked at again on its own cadence, so
            // one that vanished is seen within that bound even without a
            // Node event.
            Requeue::InstanceCheck => Some(jittered(ctx.instance_check).min(ctx.kube.resync)),
            Requeue::After(ms) => Some(Duration::from_millis(ms)),
        };
        // A Ready machine becomes Available after minReadySeconds: look
        // again then, if nothing comes sooner.
        let available_in = status
            .as_ref()
            .or(machine.status.as_ref())
            .and_then(|s| {
                let min_ready_seconds = status::min_ready_seconds(machine, &owners);
                status::until_available(s, min_ready_seconds, &self.t)
            })
            .map(|d| d + Duration::from_millis(200));
        Ok(match (after, available_in) {
            (Some(a), Some(b)) => Action::requeue(a.min(b)),
            (Some(a), None) | (None, Some(a)) => Action::requeue(a),
            (None, None) => Action::await_change(),
        })
    }
}

/// What the Machine controller learned of a Machine's instance that the
/// Machine's status may not show yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InstanceHere {
    /// Its provider found no instance to adopt: the next passes go
    /// straight to `create` (idempotent by the uid), so a create the quota
    /// held back does not need the lookup again.
    NothingToAdopt,
    /// This process created it. A pass on an older status (its write
    /// failed, or its watch event came after the unseen-write wait) knows
    /// the instance from here rather than asking `find-instance` and
    /// "adopting" the one it made (measured: 0.55 `InstanceAdopted` per new
    /// machine in one run of 1,000).
    Created { provider_id: String, plugin: String },
}

impl Context {
    /// Record (or, with `None`, forget) what was learned of `machine`'s
    /// instance.
    pub(crate) fn instance_here(&self, machine: &Machine, learned: Option<InstanceHere>) {
        let uid = machine.uid().unwrap_or_default();
        let mut here = self.instances_here.lock().expect("instances lock");
        match learned {
            Some(learned) => here.insert(uid, learned),
            None => here.remove(&uid),
        };
    }
}

/// The machine's status as the cache has it, with the instance this
/// process created for it when the cache does not show that yet (an entry
/// the cache has caught up with is dropped); and whether its provider
/// found nothing to adopt.
fn with_instance_here(ctx: &Context, machine: &Machine) -> (MachineStatus, bool) {
    let mut status = machine.status.clone().unwrap_or_default();
    let uid = machine.uid().unwrap_or_default();
    let mut here = ctx.instances_here.lock().expect("instances lock");
    match here.get(&uid) {
        Some(InstanceHere::NothingToAdopt) => return (status, true),
        Some(InstanceHere::Created { .. }) if status.provider_id.is_some() => {
            here.remove(&uid);
        }
        Some(InstanceHere::Created {
            provider_id,
            plugin,
        }) => {
            status.provider_id = Some(provider_id.clone());
            status.provider_plugin = Some(plugin.clone());
        }
        None => {}
    }
    (status, false)
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
    apply_status(
        &ctx.kube,
        controller,
        machine,
        current.as_ref(),
        &own(status),
    )
    .await
}

/// Remove the in-place annotation once every updater is done.
async fn finish_in_place(machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": machine.resource_version(),
            "annotations": { ANNOTATION_IN_PLACE_FROM: null },
        }
    });
    let api: Api<Machine> = Api::namespaced(
        ctx.kube.client.clone(),
        &machine.namespace().unwrap_or_default(),
    );
    match api
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            ctx.kube.metrics.wrote(CONTROLLER, "patch");
            let updaters: Vec<String> = machine
                .status
                .as_ref()
                .and_then(|s| s.in_place_update.as_ref())
                .map(|u| u.steps.iter().map(|s| s.updater.clone()).collect())
                .unwrap_or_default();
            tracing::info!(machine = %key_of(machine), ?updaters, "updated in place");
            record_event(
                &ctx.kube,
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
