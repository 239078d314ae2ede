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
    /// The Machine's workload cluster does not answer: its Node cannot be
    /// seen (why).
    Unreachable(String),
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
    /// Why the Machine's workload cluster (`spec.clusterName`) cannot be
    /// used now, if it cannot (`None`: it can, or the Machine names none):
    /// no instance is made for it meanwhile.
    pub cluster_held: Option<(String, String)>,
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
    // No instance is made for a cluster it cannot join.
    if let Some((reason, message)) = &view.cluster_held {
        let held = Outcome::Retrying {
            reason: reason.clone(),
            message: message.clone(),
        };
        return end(held, Requeue::After(10_000));
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
mod tests;
