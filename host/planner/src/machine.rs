//! A Machine's life as steps. [`next_step`] says what a Machine does next
//! from what its controller has observed, and done, so far in this pass
//! ([`MachineView`]). The Machine controller is an executor: it observes,
//! asks, runs that one step, records the result in the view, and asks again
//! until the answer is [`MachineStep::End`]; then it derives the status
//! once from the view and the [`Outcome`], writes it at most once, and
//! requeues as [`Requeue`] says.
//!
//! Alive: the plugin must allow the machine's namespace (before anything
//! is written), the finalizer, a terminal failure waits for a new
//! generation, the plugin must be ready, `validate` once per generation,
//! the bootstrap data prepared, `create` until a provider ID is known, `get` otherwise, an instance
//! terminated or stopped outside Capstan fails the machine, then the
//! in-place update's next step. Deleting: the hook and drain steps of
//! [`crate::deletion`], then release the instance, delete the Node object,
//! remove the finalizer.

use crate::deletion::{self, DeletionStep, DeletionView};

/// Whether the Plugin a pass needs (the spec's while alive; the one that
/// created the instance while deleting) can serve this machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PluginState {
    /// Loaded, and allowed in the machine's namespace.
    #[default]
    Ready,
    /// Still loading: look again soon, write nothing.
    Loading,
    /// The Plugin does not allow the machine's namespace.
    NotAllowed(String),
    /// The Plugin cannot serve (missing, failed to load, not ready).
    Unavailable(String),
}

/// The provider calls a pass makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `validate` the provider config.
    Validate,
    /// `create` the instance (idempotent by the machine's uid).
    Create,
    /// `get` the instance.
    Get,
    /// `find-instance`: look for an instance to adopt.
    FindInstance,
}

/// How a provider call failed, as far as the steps care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The config is invalid: terminal until the spec changes.
    InvalidConfig(String),
    /// The provider says this will never succeed.
    Terminal(String),
    /// The provider knows no such instance.
    NotFound(String),
    /// Worth trying again: the condition reason, the message, and when.
    Retry {
        /// `InstanceProvisioned` reason, e.g. `ProviderRetrying`.
        reason: String,
        /// What the provider said.
        message: String,
        /// Milliseconds until the next try.
        after_ms: u64,
    },
}

/// An instance's state as its provider reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Being created.
    Pending,
    /// Running.
    Running,
    /// Being updated in place.
    Updating,
    /// Stopping.
    Stopping,
    /// Stopped.
    Stopped,
    /// Gone for good.
    Terminated,
    /// The provider cannot tell.
    Unknown,
}

/// The machine's Node, as the pass found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSeen {
    /// No Node carries the instance's provider ID yet.
    Missing,
    /// The Node once linked (this name) is gone.
    Deleted(String),
    /// The Node exists and is not Ready.
    NotReady(String),
    /// The Node exists and is Ready.
    Ready(String),
    /// A Node carries the provider ID but the Machine may not take it
    /// ([`crate::node_claim`]): its name, and why.
    Refused {
        /// The Node.
        node: String,
        /// The rule that refused it.
        why: String,
    },
}

/// A machine with no recorded instance asks its provider for one to adopt
/// before it creates one (a restore, a re-apply, a move, `spec.providerID`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Adoption {
    /// Not asked yet this pass.
    #[default]
    NotAsked,
    /// Nothing to adopt: the instance is created.
    NothingFound,
    /// The instance found was adopted in this pass (its provider ID is not
    /// in the status yet: the pass must write it).
    Adopted,
    /// What was found may not be adopted (or `spec.providerID` names none):
    /// the condition reason and why. Nothing is created.
    Refused {
        /// `AdoptionRefused` or `InstanceNotFound`.
        reason: String,
        /// Why.
        message: String,
    },
}

/// The machine's bootstrap data, before its instance is created.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Bootstrap {
    /// No `spec.bootstrap`, or the data is ready this pass.
    #[default]
    Ready,
    /// Wanted and not prepared yet this pass.
    Wanted,
    /// Not ready; look again: the `InstanceProvisioned` reason, why, and
    /// when (milliseconds).
    Retry {
        /// The condition reason, such as `WaitingForBootstrapData`.
        reason: String,
        /// Why.
        message: String,
        /// Milliseconds until the next look.
        after_ms: u64,
    },
    /// It cannot be made as the spec says: terminal until the spec changes.
    Failed {
        /// The failure reason, such as `BootstrapDataTooLarge`.
        reason: String,
        /// Why, naming the field or the size.
        message: String,
    },
}

/// The instance as this pass's `create` or `get` reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its provider ID.
    pub provider_id: String,
    /// Its state.
    pub state: InstanceState,
    /// The provider's message, already bounded.
    pub message: Option<String>,
    /// Its Node.
    pub node: NodeSeen,
}

/// Where this pass left an in-place update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlace {
    /// Look again after this many milliseconds.
    Wait(u64),
    /// Every updater is done: the hand-over annotation may go.
    Done,
    /// The update failed: nothing more happens until the machine is deleted.
    Failed,
}

/// This pass's drain round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// Pods are left: evictions sent or refused (`blocked`: by a budget).
    Pending {
        /// What holds the drain.
        message: String,
        /// A disruption budget refused an eviction.
        blocked: bool,
    },
    /// Nothing is left to evict or wait for.
    Complete,
}

/// What this pass found of the volumes attached to the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volumes {
    /// Still attached: what holds the machine.
    Attached(String),
    /// None attached (or the Node is unreachable, so none will detach).
    Detached,
}

/// What the provider's `delete` said this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The instance is gone (or was never there).
    Done,
    /// Deleting; ask again after this many milliseconds.
    InProgress(u64),
    /// Worth trying again after this many milliseconds.
    Retry(u64),
    /// Failed; the instance must still go, so this is retried slowly.
    Failed(String),
}

/// What a Machine's next step depends on: what its controller observed at
/// the start of the pass, and what the steps it ran so far found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MachineView {
    /// The `cluster.x-k8s.io/paused` annotation is on the machine.
    pub paused: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Capstan's finalizer is on the machine.
    pub has_finalizer: bool,
    /// The Plugin this pass needs.
    pub plugin: PluginState,
    /// `spec.provider` moved away from the Plugin that created the
    /// instance (the message says how); not applied.
    pub provider_changed: Option<String>,
    /// A terminal failure is recorded for the current generation.
    pub failed: bool,
    /// `ConfigValid` holds for the current generation (recorded, or
    /// validated in this pass).
    pub validated: bool,
    /// The instance's provider ID, once known (recorded, or created in
    /// this pass).
    pub provider_id: Option<String>,
    /// Whether it looked for an instance to adopt (no provider ID yet).
    pub adoption: Adoption,
    /// The bootstrap data `create` needs.
    pub bootstrap: Bootstrap,
    /// The provider call of this pass that failed, and how.
    pub call_error: Option<(Call, CallError)>,
    /// The instance as this pass's `create` or `get` reported it.
    pub instance: Option<Instance>,
    /// The machine is handed over for an in-place update.
    pub updating_in_place: bool,
    /// Where this pass left the in-place update.
    pub in_place: Option<InPlace>,
    /// The deletion steps' inputs.
    pub deletion: DeletionView,
    /// The hook annotations' prefixes, for messages that say what to remove.
    pub hook_prefixes: HookPrefixes,
    /// This pass's drain round.
    pub drain: Option<Drain>,
    /// This pass's look at the Node's attached volumes.
    pub volumes: Option<Volumes>,
    /// What the provider's `delete` said this pass.
    pub release: Option<Release>,
    /// The Node object is deleted (or there was none to delete).
    pub node_deleted: bool,
}

/// The annotation prefixes of the deletion hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HookPrefixes {
    /// Pre-drain hooks.
    pub pre_drain: &'static str,
    /// Pre-terminate hooks.
    pub pre_terminate: &'static str,
}

/// What the executor does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineStep {
    /// Put Capstan's finalizer on the machine.
    AddFinalizer,
    /// Call `validate`.
    Validate,
    /// Prepare the bootstrap data: the user's Secret, or the token and the
    /// bootstrap plugin's rendered data in the machine's data Secret.
    PrepareBootstrap,
    /// Call `find-instance`: an instance to adopt, before creating one.
    FindInstance,
    /// Call `create`.
    Create,
    /// Call `get`.
    Get,
    /// Plan the in-place update, or run its next updater step.
    AdvanceInPlace,
    /// Cordon this Node and run one drain round.
    DrainNode(String),
    /// Look at the volumes attached to this Node.
    CheckVolumes(String),
    /// Call the provider's `delete`.
    ReleaseInstance {
        /// Why the drain was skipped or cut short, if it was (an Event
        /// says so once).
        drain_skipped: Option<String>,
    },
    /// Delete the Node object (it belongs to the released instance).
    DeleteNode,
    /// Remove Capstan's finalizer: the machine may go.
    RemoveFinalizer,
    /// The pass is over: write the status once, then requeue.
    End(End),
}

/// How a pass ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// What the status says about the pass.
    pub outcome: Outcome,
    /// When to look again.
    pub requeue: Requeue,
}

/// When to look at the machine again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only when it changes.
    AwaitChange,
    /// After the idle resync period.
    Resync,
    /// After the instance poll interval (booting or deleting instances).
    Poll,
    /// After the (jittered) check interval of a running instance.
    InstanceCheck,
    /// After this many milliseconds.
    After(u64),
}

/// What the status says about a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to write.
    Unchanged,
    /// Held before anything happens: `InstanceProvisioned=False` with this
    /// reason (`PluginNotAllowed`, `PluginNotReady`).
    Held {
        /// The condition reason.
        reason: &'static str,
        /// Why.
        message: String,
    },
    /// `ConfigValid=False`, reason `ProviderChanged`.
    ProviderChanged(String),
    /// A terminal failure: `failureReason`, phase `Failed`, `Ready=False`,
    /// and a Warning Event when first recorded.
    Failed {
        /// Machine-readable reason.
        reason: String,
        /// What happened.
        message: String,
    },
    /// A provider call is retried: `InstanceProvisioned=False` with this
    /// reason.
    Retrying {
        /// The condition reason.
        reason: String,
        /// What the provider said.
        message: String,
    },
    /// The instance as observed: conditions and phase from
    /// [`MachineView::instance`] and [`MachineView::in_place`].
    Observed,
    /// Paused: `Paused=True`, nothing else changes.
    Paused,
    /// Deleting, held at a step: `Deleting=True` with this reason.
    Deleting {
        /// The condition reason, e.g. `DrainingNode`.
        reason: &'static str,
        /// What holds the machine.
        message: String,
        /// `InstanceProvisioned=False` with this reason and message, when
        /// releasing the instance says something about it.
        instance: Option<(&'static str, String)>,
        /// The drain is behind the machine (done, skipped or cut short).
        drain_ended: bool,
        /// The wait for volumes is behind the machine too.
        volumes_ended: bool,
        /// Why the drain was skipped or cut short, if it was.
        drain_skipped: Option<String>,
    },
}

fn end(outcome: Outcome, requeue: Requeue) -> MachineStep {
    MachineStep::End(End { outcome, requeue })
}

/// The step a Machine takes next.
pub fn next_step(view: &MachineView) -> MachineStep {
    // As in Cluster API, a pause holds everything, deletion included.
    if view.paused {
        return end(Outcome::Paused, Requeue::AwaitChange);
    }
    if view.deleting {
        if !view.has_finalizer {
            return end(Outcome::Unchanged, Requeue::AwaitChange);
        }
        return next_deletion_step(view);
    }
    // Refused before the first write: a Machine in a namespace its plugin
    // does not allow gets no finalizer, no plugin call and no cloud call.
    if let PluginState::NotAllowed(message) = &view.plugin {
        let held = Outcome::Held {
            reason: "PluginNotAllowed",
            message: message.clone(),
        };
        return end(held, Requeue::Resync);
    }
    if !view.has_finalizer {
        return MachineStep::AddFinalizer;
    }
    if view.failed {
        return end(Outcome::Unchanged, Requeue::Resync);
    }
    if let Some(message) = &view.provider_changed {
        return end(Outcome::ProviderChanged(message.clone()), Requeue::Resync);
    }
    match &view.plugin {
        PluginState::Ready => {}
        PluginState::Loading => return end(Outcome::Unchanged, Requeue::After(500)),
        PluginState::Unavailable(message) | PluginState::NotAllowed(message) => {
            let held = Outcome::Held {
                reason: "PluginNotReady",
                message: message.clone(),
            };
            return end(held, Requeue::After(15_000));
        }
    }
    if let Some((call, error)) = &view.call_error {
        let adopted_now = view.adoption == Adoption::Adopted;
        return call_failed(*call, error, view.provider_id.as_deref(), adopted_now);
    }
    if !view.validated {
        return MachineStep::Validate;
    }
    let Some(instance) = &view.instance else {
        return without_instance(view);
    };
    if let Some(failed) = gone_outside(instance, view.updating_in_place) {
        return end(failed, Requeue::Resync);
    }
    if view.updating_in_place {
        return match view.in_place {
            None => MachineStep::AdvanceInPlace,
            Some(InPlace::Wait(ms)) => end(Outcome::Observed, Requeue::After(ms)),
            Some(InPlace::Failed) => end(Outcome::Observed, Requeue::Resync),
            // The status (UpToDate, provenance) is written first; then the
            // executor drops the hand-over annotation and looks again soon.
            Some(InPlace::Done) => end(Outcome::Observed, Requeue::After(10)),
        };
    }
    let requeue = match (&instance.state, &instance.node) {
        (InstanceState::Running, NodeSeen::Ready(_)) => Requeue::InstanceCheck,
        (InstanceState::Running, _) => Requeue::After(10_000),
        _ => Requeue::Poll,
    };
    end(Outcome::Observed, requeue)
}

/// The next step of a live machine with no instance observed: `get` the
/// one it records, adopt one launched for it before, or create one once its
/// bootstrap data is ready.
fn without_instance(view: &MachineView) -> MachineStep {
    if view.provider_id.is_some() {
        return MachineStep::Get;
    }
    // An instance launched for this Machine before (it was restored,
    // re-applied or moved) is adopted, not launched twice.
    match &view.adoption {
        Adoption::NotAsked => return MachineStep::FindInstance,
        Adoption::NothingFound | Adoption::Adopted => {}
        Adoption::Refused { reason, message } => {
            let failed = Outcome::Failed {
                reason: reason.clone(),
                message: message.clone(),
            };
            return end(failed, Requeue::Resync);
        }
    }
    // No instance is created without the data it must boot with.
    match &view.bootstrap {
        Bootstrap::Ready => MachineStep::Create,
        Bootstrap::Wanted => MachineStep::PrepareBootstrap,
        Bootstrap::Retry {
            reason,
            message,
            after_ms,
        } => {
            let waiting = Outcome::Retrying {
                reason: reason.clone(),
                message: message.clone(),
            };
            end(waiting, Requeue::After(*after_ms))
        }
        Bootstrap::Failed { reason, message } => {
            let failed = Outcome::Failed {
                reason: reason.clone(),
                message: message.clone(),
            };
            end(failed, Requeue::Resync)
        }
    }
}

/// The failure of an instance terminated or stopped outside Capstan, if
/// it was: it will not come back by waiting, so the Machine fails and a
/// health check replaces it. (An in-place update may stop its instance on
/// purpose.)
fn gone_outside(instance: &Instance, updating_in_place: bool) -> Option<Outcome> {
    let gone = match instance.state {
        InstanceState::Terminated => Some(("InstanceTerminated", "terminated")),
        InstanceState::Stopped if !updating_in_place => Some(("InstanceStopped", "stopped")),
        _ => None,
    };
    let (reason, state) = gone?;
    let detail = instance
        .message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    let message = format!(
        "the instance {} was {state} outside Capstan{detail}; the Machine will not recover by itself (a MachineHealthCheck replaces it)",
        instance.provider_id
    );
    Some(Outcome::Failed {
        reason: reason.into(),
        message,
    })
}

/// A failed provider call ends the pass: terminal errors fail the machine,
/// the rest are retried.
fn call_failed(
    call: Call,
    error: &CallError,
    provider_id: Option<&str>,
    adopted_now: bool,
) -> MachineStep {
    let failed = |reason: &str, message: String| {
        let outcome = Outcome::Failed {
            reason: reason.into(),
            message,
        };
        end(outcome, Requeue::Resync)
    };
    match (call, error) {
        (Call::Validate, CallError::InvalidConfig(m)) => {
            failed("InvalidConfiguration", format!("spec.provider.config: {m}"))
        }
        (Call::Create, CallError::InvalidConfig(m)) => failed("InvalidConfiguration", m.clone()),
        (Call::Create, CallError::Terminal(m)) => failed("CreateError", m.clone()),
        (Call::Get, CallError::NotFound(m)) => failed(
            "InstanceNotFound",
            format!(
                "the instance behind {} is gone: {m}",
                provider_id.unwrap_or_default()
            ),
        ),
        (Call::Get, CallError::Terminal(m)) => failed("InstanceError", m.clone()),
        // The host's quota held an observation back: it says nothing new
        // about the instance, and writing it would wake the Machine at once
        // for another try (a loop that spends the quota it waits for).
        (
            Call::Get,
            CallError::Retry {
                reason, after_ms, ..
            },
        ) if reason == "PluginQuotaExceeded" && !adopted_now => {
            end(Outcome::Unchanged, Requeue::After(*after_ms))
        }
        (
            _,
            CallError::Retry {
                reason,
                message,
                after_ms,
            },
        ) => {
            let outcome = Outcome::Retrying {
                reason: reason.clone(),
                message: message.clone(),
            };
            end(outcome, Requeue::After(*after_ms))
        }
        // What a call should not answer (validate saying NotFound, say) is
        // reported and tried again later.
        (_, CallError::InvalidConfig(m) | CallError::Terminal(m) | CallError::NotFound(m)) => {
            let outcome = Outcome::Retrying {
                reason: "ProviderError".into(),
                message: m.clone(),
            };
            end(outcome, Requeue::After(30_000))
        }
    }
}

fn hook_message(kind: &str, names: &[String], prefix: &str) -> String {
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

fn next_deletion_step(view: &MachineView) -> MachineStep {
    let mut steps = view.deletion.clone();
    if view.drain == Some(Drain::Complete) {
        steps.drain_complete = true;
    }
    if view.volumes == Some(Volumes::Detached) {
        steps.volumes_detached = true;
    }
    let deleting = |reason, message, instance, drain_skipped: Option<String>| Outcome::Deleting {
        reason,
        message,
        instance,
        drain_ended: reason != "WaitingForPreDrainHook" && reason != "DrainingNode",
        volumes_ended: !matches!(
            reason,
            "WaitingForPreDrainHook" | "DrainingNode" | "WaitingForVolumeDetach"
        ),
        drain_skipped,
    };
    match deletion::next_step(&steps) {
        DeletionStep::WaitForPreDrainHooks(names) => {
            let message = hook_message("pre-drain", &names, view.hook_prefixes.pre_drain);
            end(
                deleting("WaitingForPreDrainHook", message, None, None),
                Requeue::Resync,
            )
        }
        DeletionStep::DrainNode(node) => match &view.drain {
            Some(Drain::Pending { message, blocked }) => {
                // A refused eviction (a PodDisruptionBudget) is retried with
                // backoff; pods already evicted are checked again soon.
                let after = if *blocked { 5_000 } else { 1_000 };
                end(
                    deleting("DrainingNode", message.clone(), None, None),
                    Requeue::After(after),
                )
            }
            _ => MachineStep::DrainNode(node),
        },
        DeletionStep::WaitForVolumeDetach(node) => match &view.volumes {
            // Volume detach is slow (a cloud's detach call, then the
            // attach-detach controller): look again in a few seconds.
            Some(Volumes::Attached(message)) => end(
                deleting("WaitingForVolumeDetach", message.clone(), None, None),
                Requeue::After(2_000),
            ),
            _ => MachineStep::CheckVolumes(node),
        },
        DeletionStep::WaitForPreTerminateHooks {
            hooks,
            drain_skipped,
        } => {
            let mut message =
                hook_message("pre-terminate", &hooks, view.hook_prefixes.pre_terminate);
            if let Some(why) = &drain_skipped {
                message = format!("{message}; {why}");
            }
            end(
                deleting("WaitingForPreTerminateHook", message, None, drain_skipped),
                Requeue::Resync,
            )
        }
        DeletionStep::DeleteInstance { drain_skipped } => {
            let waiting = match &drain_skipped {
                Some(why) => format!("deleting the instance ({why})"),
                None => "deleting the instance".to_string(),
            };
            let releasing = |instance, requeue| {
                end(
                    deleting(
                        "WaitingForInfrastructureDeletion",
                        waiting.clone(),
                        instance,
                        drain_skipped.clone(),
                    ),
                    requeue,
                )
            };
            match (&view.release, &view.plugin) {
                (Some(Release::Done), _) if !view.node_deleted => MachineStep::DeleteNode,
                (Some(Release::Done), _) => MachineStep::RemoveFinalizer,
                (Some(Release::InProgress(ms)), _) => releasing(
                    Some(("Deleting", "the provider is deleting the instance".into())),
                    Requeue::After((*ms).max(100)),
                ),
                (Some(Release::Retry(ms)), _) => releasing(None, Requeue::After(*ms)),
                (Some(Release::Failed(message)), _) => releasing(
                    Some(("DeleteFailed", message.clone())),
                    Requeue::After(30_000),
                ),
                (None, PluginState::Ready) => MachineStep::ReleaseInstance {
                    drain_skipped: drain_skipped.clone(),
                },
                (None, PluginState::Loading) => end(Outcome::Unchanged, Requeue::After(500)),
                (None, PluginState::NotAllowed(reason) | PluginState::Unavailable(reason)) => {
                    releasing(
                        Some((
                            "PluginNotReady",
                            format!("cannot release the instance: {reason}"),
                        )),
                        Requeue::After(15_000),
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn alive() -> MachineView {
        MachineView {
            has_finalizer: true,
            ..Default::default()
        }
    }

    fn instance(state: InstanceState, node: NodeSeen) -> Instance {
        Instance {
            provider_id: "sim://i-1".into(),
            state,
            message: None,
            node,
        }
    }

    fn requeue(step: MachineStep) -> Requeue {
        match step {
            MachineStep::End(e) => e.requeue,
            other => panic!("not an end: {other:?}"),
        }
    }

    fn outcome(step: MachineStep) -> Outcome {
        match step {
            MachineStep::End(e) => e.outcome,
            other => panic!("not an end: {other:?}"),
        }
    }

    /// Run the steps a fresh machine takes, answering each call as `answer`
    /// says, until the pass ends; returns the steps taken and the end.
    fn pass(
        mut view: MachineView,
        answer: impl Fn(&MachineStep, &mut MachineView),
    ) -> (Vec<MachineStep>, End) {
        let mut taken = Vec::new();
        for _ in 0..20 {
            let step = next_step(&view);
            if let MachineStep::End(e) = step {
                return (taken, e);
            }
            answer(&step, &mut view);
            taken.push(step);
        }
        panic!("no end after 20 steps: {taken:?}");
    }

    fn healthy(step: &MachineStep, view: &mut MachineView) {
        match step {
            MachineStep::AddFinalizer => view.has_finalizer = true,
            MachineStep::Validate => view.validated = true,
            MachineStep::PrepareBootstrap => view.bootstrap = Bootstrap::Ready,
            MachineStep::FindInstance => view.adoption = Adoption::NothingFound,
            MachineStep::Create | MachineStep::Get => {
                view.provider_id = Some("sim://i-1".into());
                view.instance = Some(instance(
                    InstanceState::Running,
                    NodeSeen::Ready("n1".into()),
                ));
            }
            MachineStep::AdvanceInPlace => view.in_place = Some(InPlace::Done),
            MachineStep::DrainNode(_) => view.drain = Some(Drain::Complete),
            MachineStep::CheckVolumes(_) => view.volumes = Some(Volumes::Detached),
            MachineStep::ReleaseInstance { .. } => view.release = Some(Release::Done),
            MachineStep::DeleteNode => view.node_deleted = true,
            MachineStep::RemoveFinalizer => view.has_finalizer = false,
            MachineStep::End(_) => unreachable!(),
        }
    }

    #[test]
    fn a_new_machine_gets_its_finalizer_is_validated_created_and_checked_on_its_cadence() {
        let (steps, end) = pass(MachineView::default(), healthy);
        assert_eq!(
            steps,
            [
                MachineStep::AddFinalizer,
                MachineStep::Validate,
                MachineStep::FindInstance,
                MachineStep::Create
            ]
        );
        assert_eq!(end.outcome, Outcome::Observed);
        assert_eq!(end.requeue, Requeue::InstanceCheck);
        // Next pass: validated this generation, the instance is known.
        let view = MachineView {
            validated: true,
            provider_id: Some("sim://i-1".into()),
            ..alive()
        };
        let (steps, _) = pass(view, healthy);
        assert_eq!(steps, [MachineStep::Get]);
    }

    #[test]
    fn an_observation_the_quota_held_back_writes_nothing_unless_just_adopted() {
        let held = CallError::Retry {
            reason: "PluginQuotaExceeded".into(),
            message: "held".into(),
            after_ms: 180,
        };
        let view = MachineView {
            validated: true,
            provider_id: Some("sim://i-1".into()),
            call_error: Some((Call::Get, held.clone())),
            ..alive()
        };
        let MachineStep::End(end) = next_step(&view) else {
            panic!("ends")
        };
        assert_eq!(
            (end.outcome, end.requeue),
            (Outcome::Unchanged, Requeue::After(180))
        );
        // Adopted in this pass: its provider ID must still be written.
        let adopted = MachineView {
            adoption: Adoption::Adopted,
            ..view
        };
        let MachineStep::End(end) = next_step(&adopted) else {
            panic!("ends")
        };
        assert!(matches!(end.outcome, Outcome::Retrying { .. }), "{end:?}");
        // A creation held back says so (nothing else would).
        let creating = MachineView {
            validated: true,
            adoption: Adoption::NothingFound,
            call_error: Some((Call::Create, held)),
            ..alive()
        };
        let MachineStep::End(end) = next_step(&creating) else {
            panic!("ends")
        };
        assert!(matches!(end.outcome, Outcome::Retrying { .. }), "{end:?}");
    }

    #[test]
    fn an_instance_found_for_the_machine_is_adopted_before_any_bootstrap_or_create() {
        let wanted = MachineView {
            bootstrap: Bootstrap::Wanted,
            ..alive()
        };
        // Found and adopted: the controller records its provider ID.
        let (steps, end) = pass(wanted.clone(), |step, view| match step {
            MachineStep::FindInstance => view.provider_id = Some("sim://i-7".into()),
            other => healthy(other, view),
        });
        assert_eq!(
            steps,
            [
                MachineStep::Validate,
                MachineStep::FindInstance,
                MachineStep::Get
            ]
        );
        assert_eq!(end.outcome, Outcome::Observed);
        // Refused: the Machine fails; no token, no data, no instance.
        let (steps, end) = pass(wanted, |step, view| match step {
            MachineStep::FindInstance => {
                view.adoption = Adoption::Refused {
                    reason: "AdoptionRefused".into(),
                    message: "tagged for team-b/x".into(),
                }
            }
            other => healthy(other, view),
        });
        assert_eq!(steps, [MachineStep::Validate, MachineStep::FindInstance]);
        assert!(
            matches!(&end.outcome, Outcome::Failed { reason, .. } if reason == "AdoptionRefused"),
            "{end:?}"
        );
    }

    #[test]
    fn no_instance_is_created_before_its_bootstrap_data() {
        let wanted = MachineView {
            bootstrap: Bootstrap::Wanted,
            ..Default::default()
        };
        let (steps, _) = pass(wanted.clone(), healthy);
        assert_eq!(
            steps,
            [
                MachineStep::AddFinalizer,
                MachineStep::Validate,
                MachineStep::FindInstance,
                MachineStep::PrepareBootstrap,
                MachineStep::Create
            ]
        );
        let waiting = |step: &MachineStep, view: &mut MachineView| match step {
            MachineStep::PrepareBootstrap => {
                view.bootstrap = Bootstrap::Retry {
                    reason: "WaitingForBootstrapData".into(),
                    message: "no Secret".into(),
                    after_ms: 5_000,
                }
            }
            other => healthy(other, view),
        };
        let (steps, end) = pass(wanted.clone(), waiting);
        assert!(!steps.contains(&MachineStep::Create), "{steps:?}");
        assert_eq!(end.requeue, Requeue::After(5_000));
        assert!(
            matches!(end.outcome, Outcome::Retrying { ref reason, .. } if reason == "WaitingForBootstrapData")
        );
        let failing = |step: &MachineStep, view: &mut MachineView| match step {
            MachineStep::PrepareBootstrap => {
                view.bootstrap = Bootstrap::Failed {
                    reason: "BootstrapDataTooLarge".into(),
                    message: "70000 bytes".into(),
                }
            }
            other => healthy(other, view),
        };
        let (steps, end) = pass(wanted, failing);
        assert!(!steps.contains(&MachineStep::Create), "{steps:?}");
        assert!(
            matches!(end.outcome, Outcome::Failed { ref reason, .. } if reason == "BootstrapDataTooLarge")
        );
        // An instance already created needs no bootstrap data again.
        let created = MachineView {
            bootstrap: Bootstrap::Wanted,
            validated: true,
            provider_id: Some("sim://i-1".into()),
            ..alive()
        };
        let (steps, _) = pass(created, healthy);
        assert_eq!(steps, [MachineStep::Get]);
    }

    #[test]
    fn a_paused_machine_takes_no_step_alive_or_deleting() {
        for deleting in [false, true] {
            let view = MachineView {
                paused: true,
                deleting,
                ..Default::default()
            };
            assert_eq!(
                next_step(&view),
                end_of(Outcome::Paused, Requeue::AwaitChange)
            );
        }
    }

    #[test]
    fn a_plugin_that_does_not_allow_the_namespace_holds_before_the_finalizer() {
        let view = MachineView {
            plugin: PluginState::NotAllowed("not in allowedNamespaces".into()),
            ..Default::default()
        };
        let (steps, end) = pass(view, healthy);
        assert!(steps.is_empty(), "no finalizer, no call: {steps:?}");
        assert_eq!(
            end.outcome,
            Outcome::Held {
                reason: "PluginNotAllowed",
                message: "not in allowedNamespaces".into()
            }
        );
        // Loading writes nothing and looks again soon; unavailable holds.
        let loading = MachineView {
            plugin: PluginState::Loading,
            ..alive()
        };
        assert_eq!(
            next_step(&loading),
            end_of(Outcome::Unchanged, Requeue::After(500))
        );
        let broken = MachineView {
            plugin: PluginState::Unavailable("failed to load".into()),
            ..alive()
        };
        assert!(matches!(
            outcome(next_step(&broken)),
            Outcome::Held {
                reason: "PluginNotReady",
                ..
            }
        ));
    }

    fn end_of(outcome: Outcome, requeue: Requeue) -> MachineStep {
        end(outcome, requeue)
    }

    #[test]
    fn a_failure_waits_for_a_new_generation_and_a_changed_provider_is_not_applied() {
        let failed = MachineView {
            failed: true,
            ..alive()
        };
        assert_eq!(
            next_step(&failed),
            end_of(Outcome::Unchanged, Requeue::Resync)
        );
        let moved = MachineView {
            provider_changed: Some("spec.provider.plugin changed".into()),
            ..alive()
        };
        assert!(matches!(
            outcome(next_step(&moved)),
            Outcome::ProviderChanged(_)
        ));
    }

    #[test]
    fn call_errors_fail_or_retry_as_their_kind_says() {
        let with = |call, error| MachineView {
            call_error: Some((call, error)),
            provider_id: Some("sim://i-1".into()),
            ..alive()
        };
        let reason = |step| match outcome(step) {
            Outcome::Failed { reason, .. } | Outcome::Retrying { reason, .. } => reason,
            other => panic!("{other:?}"),
        };
        let m = || "m".to_string();
        for (call, error, expected) in [
            (
                Call::Validate,
                CallError::InvalidConfig(m()),
                "InvalidConfiguration",
            ),
            (
                Call::Create,
                CallError::InvalidConfig(m()),
                "InvalidConfiguration",
            ),
            (Call::Create, CallError::Terminal(m()), "CreateError"),
            (Call::Get, CallError::NotFound(m()), "InstanceNotFound"),
            (Call::Get, CallError::Terminal(m()), "InstanceError"),
            (Call::Validate, CallError::NotFound(m()), "ProviderError"),
            (
                Call::Get,
                CallError::Retry {
                    reason: "ProviderRetrying".into(),
                    message: m(),
                    after_ms: 1500,
                },
                "ProviderRetrying",
            ),
        ] {
            assert_eq!(reason(next_step(&with(call, error.clone()))), expected);
        }
        let retry = with(
            Call::Get,
            CallError::Retry {
                reason: "ProviderRetrying".into(),
                message: m(),
                after_ms: 1500,
            },
        );
        assert_eq!(requeue(next_step(&retry)), Requeue::After(1500));
        let Outcome::Failed { message, .. } =
            outcome(next_step(&with(Call::Get, CallError::NotFound(m()))))
        else {
            unreachable!()
        };
        assert!(message.contains("sim://i-1"), "{message}");
    }

    #[test]
    fn an_instance_gone_outside_capstan_fails_unless_an_update_stopped_it() {
        let seen = |state, updating| MachineView {
            validated: true,
            provider_id: Some("sim://i-1".into()),
            instance: Some(instance(state, NodeSeen::Missing)),
            updating_in_place: updating,
            ..alive()
        };
        assert!(matches!(
            outcome(next_step(&seen(InstanceState::Terminated, true))),
            Outcome::Failed { reason, .. } if reason == "InstanceTerminated"
        ));
        assert!(matches!(
            outcome(next_step(&seen(InstanceState::Stopped, false))),
            Outcome::Failed { reason, .. } if reason == "InstanceStopped"
        ));
        assert_eq!(
            next_step(&seen(InstanceState::Stopped, true)),
            MachineStep::AdvanceInPlace
        );
        // Booting instances are polled; a running one without a Ready Node
        // is looked at every 10 s.
        assert_eq!(
            requeue(next_step(&seen(InstanceState::Pending, false))),
            Requeue::Poll
        );
        assert_eq!(
            requeue(next_step(&seen(InstanceState::Running, false))),
            Requeue::After(10_000)
        );
    }

    #[test]
    fn in_place_steps_end_the_pass_where_the_update_is() {
        let mut view = MachineView {
            validated: true,
            provider_id: Some("sim://i-1".into()),
            instance: Some(instance(
                InstanceState::Updating,
                NodeSeen::Ready("n1".into()),
            )),
            updating_in_place: true,
            ..alive()
        };
        assert_eq!(next_step(&view), MachineStep::AdvanceInPlace);
        for (state, expected) in [
            (InPlace::Wait(2000), Requeue::After(2000)),
            (InPlace::Failed, Requeue::Resync),
            (InPlace::Done, Requeue::After(10)),
        ] {
            view.in_place = Some(state);
            assert_eq!(next_step(&view), end_of(Outcome::Observed, expected));
        }
    }

    fn deleting_view() -> MachineView {
        MachineView {
            deleting: true,
            has_finalizer: true,
            deletion: DeletionView {
                node: Some("n1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn deletion_drains_releases_deletes_the_node_and_lets_go() {
        let (steps, end) = pass(deleting_view(), healthy);
        assert_eq!(
            steps,
            [
                MachineStep::DrainNode("n1".into()),
                MachineStep::CheckVolumes("n1".into()),
                MachineStep::ReleaseInstance {
                    drain_skipped: None
                },
                MachineStep::DeleteNode,
                MachineStep::RemoveFinalizer,
            ]
        );
        assert_eq!(
            end,
            End {
                outcome: Outcome::Unchanged,
                requeue: Requeue::AwaitChange
            }
        );
        // Without the finalizer nothing more happens.
        let gone = MachineView {
            has_finalizer: false,
            ..deleting_view()
        };
        assert_eq!(requeue(next_step(&gone)), Requeue::AwaitChange);
    }

    #[test]
    fn a_pending_drain_holds_and_the_drain_state_comes_from_status_not_a_reason() {
        let mut view = deleting_view();
        view.drain = Some(Drain::Pending {
            message: "evicting 2 pods".into(),
            blocked: true,
        });
        let step = next_step(&view);
        assert_eq!(requeue(step.clone()), Requeue::After(5_000));
        assert!(matches!(
            outcome(step),
            Outcome::Deleting {
                reason: "DrainingNode",
                drain_ended: false,
                ..
            }
        ));
        // A drain recorded as ended is not run again; attached volumes
        // hold the machine next.
        let mut view = deleting_view();
        view.deletion.drain_complete = true;
        assert_eq!(next_step(&view), MachineStep::CheckVolumes("n1".into()));
        view.volumes = Some(Volumes::Attached("1 volume attached".into()));
        let step = next_step(&view);
        assert_eq!(requeue(step.clone()), Requeue::After(2_000));
        assert!(matches!(
            outcome(step),
            Outcome::Deleting {
                reason: "WaitingForVolumeDetach",
                drain_ended: true,
                volumes_ended: false,
                ..
            }
        ));
        view.volumes = None;
        view.deletion.volumes_detached = true;
        assert_eq!(
            next_step(&view),
            MachineStep::ReleaseInstance {
                drain_skipped: None
            }
        );
    }

    #[test]
    fn releasing_reports_what_the_provider_and_the_plugin_say() {
        let mut view = deleting_view();
        view.deletion.node = None;
        view.plugin = PluginState::Loading;
        assert_eq!(
            next_step(&view),
            end_of(Outcome::Unchanged, Requeue::After(500))
        );
        view.plugin = PluginState::Unavailable("gone".into());
        assert!(matches!(
            outcome(next_step(&view)),
            Outcome::Deleting {
                instance: Some(("PluginNotReady", _)),
                drain_ended: true,
                ..
            }
        ));
        view.plugin = PluginState::Ready;
        for (release, expected) in [
            (Release::InProgress(20), Requeue::After(100)),
            (Release::Retry(3000), Requeue::After(3000)),
            (Release::Failed("boom".into()), Requeue::After(30_000)),
        ] {
            view.release = Some(release);
            assert_eq!(requeue(next_step(&view)), expected);
        }
    }

    fn arbitrary_view() -> impl Strategy<Value = MachineView> {
        let plugin = prop_oneof![
            Just(PluginState::Ready),
            Just(PluginState::Loading),
            Just(PluginState::NotAllowed("no".into())),
            Just(PluginState::Unavailable("down".into())),
        ];
        let state = prop_oneof![
            Just(InstanceState::Pending),
            Just(InstanceState::Running),
            Just(InstanceState::Stopped),
            Just(InstanceState::Terminated),
            Just(InstanceState::Updating),
        ];
        (
            (any::<bool>(), any::<bool>(), plugin, any::<bool>()),
            (any::<bool>(), any::<bool>(), proptest::option::of(state)),
            (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        )
            .prop_map(
                |(
                    (deleting, has_finalizer, plugin, failed),
                    (validated, has_id, state),
                    (updating, hooks, node, excluded),
                )| MachineView {
                    deleting,
                    has_finalizer,
                    plugin,
                    failed,
                    validated,
                    provider_id: has_id.then(|| "sim://i-1".into()),
                    instance: state.map(|s| instance(s, NodeSeen::Missing)),
                    updating_in_place: updating,
                    deletion: DeletionView {
                        pre_drain_hooks: if hooks { vec!["h".into()] } else { vec![] },
                        node: node.then(|| "n1".into()),
                        exclude_draining: excluded,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
    }

    proptest! {
        /// Whatever the view, the executor answering every step reaches an
        /// end within a bounded number of steps, never calls a provider for
        /// a machine whose plugin does not allow it (alive) and never adds
        /// a finalizer to a deleting machine.
        #[test]
        fn every_pass_ends_and_respects_the_plugin_and_the_finalizer(view in arbitrary_view()) {
            let not_allowed = matches!(view.plugin, PluginState::NotAllowed(_));
            let (steps, _) = pass(view.clone(), healthy);
            prop_assert!(steps.len() <= 6, "{steps:?}");
            for step in &steps {
                if view.deleting {
                    prop_assert_ne!(step, &MachineStep::AddFinalizer);
                    prop_assert!(!matches!(step, MachineStep::Create | MachineStep::Validate | MachineStep::Get));
                } else {
                    let deletion_step = matches!(step, MachineStep::ReleaseInstance { .. } | MachineStep::RemoveFinalizer | MachineStep::DeleteNode | MachineStep::DrainNode(_) | MachineStep::CheckVolumes(_));
                    prop_assert!(!deletion_step, "{:?}", step);
                    if not_allowed {
                        prop_assert!(!matches!(step, MachineStep::Create | MachineStep::Validate | MachineStep::Get | MachineStep::AddFinalizer));
                    }
                }
            }
            // A deleting machine lets go only after its instance is released
            // and its Node deleted.
            if let Some(i) = steps.iter().position(|s| *s == MachineStep::RemoveFinalizer) {
                let released = steps[..i].iter().any(|s| matches!(s, MachineStep::ReleaseInstance { .. }));
                prop_assert!(released, "{:?}", steps);
                prop_assert!(steps[..i].contains(&MachineStep::DeleteNode));
            }
        }
    }
}
