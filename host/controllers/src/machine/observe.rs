//! What a Machine pass observes before the planner decides: the state of
//! its provider Plugin (and canary), how far its deletion got, and the
//! provider's answers (errors, instance states) in the planner's terms.

use super::*;

/// The provider Plugin's state for this pass, and its provider when it is
/// ready: through its canary when one runs (which also hears of a failed
/// health check); a bootstrap Plugin the namespace may not use refuses a
/// machine yet to be created like its provider would.
pub(super) fn plugin_state(
    ctx: &Context,
    machine: &Machine,
    plugin_name: &str,
    status: &MachineStatus,
) -> (PluginState, Option<Arc<dyn MachineProvider>>) {
    let deleting = machine.metadata.deletion_timestamp.is_some();
    let namespace = machine.namespace().unwrap_or_default();
    let (plugin, provider) = match capstan_kit::registry::availability(
        &ctx.kube,
        &ctx.providers,
        plugin_name,
        &namespace,
    ) {
        Availability::Ready => match ctx.providers.get(plugin_name) {
            Some(registered) => {
                let uid = machine.uid().unwrap_or_default();
                let served_by = status.plugin_digest.as_deref();
                let creating = !deleting && status.provider_id.is_none();
                if machine.failed_health_check() {
                    registered.note_unhealthy(&uid, served_by);
                    if let Some(b) = machine
                        .spec
                        .bootstrap
                        .as_ref()
                        .and_then(|b| b.plugin.as_deref())
                        && let Some(bootstrap) = ctx.bootstraps.get(b)
                    {
                        bootstrap.note_unhealthy(&uid);
                    }
                }
                match registered.for_machine(&uid, served_by, creating) {
                    Some(provider) => (PluginState::Ready, Some(provider)),
                    // A canary runs and has not yet said who creates it.
                    None => (PluginState::Loading, None),
                }
            }
            None => (PluginState::Loading, None),
        },
        Availability::Loading => (PluginState::Loading, None),
        Availability::NotAllowed(message) => (PluginState::NotAllowed(message), None),
        Availability::Unavailable(message) => (PluginState::Unavailable(message), None),
    };
    // A machine yet to be created may use its bootstrap Plugin only where
    // that Plugin allows: refused, like its provider, before anything is
    // written (no token, no data, no instance).
    let plugin = match machine
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.plugin.as_deref())
    {
        Some(bootstrap) if !deleting && status.provider_id.is_none() => {
            match capstan_kit::registry::not_allowed(&ctx.kube, bootstrap, &namespace) {
                Some(message) => PluginState::NotAllowed(message),
                None => plugin,
            }
        }
        _ => plugin,
    };
    (plugin, provider)
}

/// What the deletion of a machine has done and may do next, from its
/// annotations, its spec's timeouts and the status earlier passes wrote.
pub(super) fn deletion_view(
    machine: &Machine,
    status: &MachineStatus,
    node: Option<&Node>,
    t: &capstan_api::Time,
) -> DeletionView {
    let recorded = status.deletion.clone().unwrap_or_default();
    let spec = machine.spec.deletion.clone().unwrap_or_default();
    let seconds_since = |start: &Option<capstan_api::Time>| {
        start.as_ref().map(|s| t.0.as_second() - s.0.as_second())
    };
    let seconds = |limit: Option<i32>| limit.map_or(0, |s| i64::from(s.max(0)));
    DeletionView {
        pre_drain_hooks: hooks(machine, PRE_DRAIN_HOOK_PREFIX),
        pre_terminate_hooks: hooks(machine, PRE_TERMINATE_HOOK_PREFIX),
        node: node.as_ref().map(|n| n.name_any()),
        exclude_draining: [
            ANNOTATION_EXCLUDE_NODE_DRAINING,
            ANNOTATION_EXCLUDE_NODE_DRAINING_CAPI,
        ]
        .iter()
        .any(|key| machine.annotations().contains_key(*key)),
        drained_for: seconds_since(&recorded.node_drain_start_time),
        drain_timeout: seconds(spec.node_drain_timeout_seconds),
        // A pass that went past the drain recorded so; later passes
        // (the instance takes a while to go) resume from there
        // instead of listing the Node's pods again.
        drain_complete: recorded.node_drain_end_time.is_some(),
        exclude_volume_wait: machine
            .annotations()
            .contains_key(ANNOTATION_EXCLUDE_WAIT_FOR_VOLUME_DETACH),
        volumes_waited_for: seconds_since(&recorded.wait_for_node_volume_detach_start_time),
        volume_detach_timeout: seconds(spec.node_volume_detach_timeout_seconds),
        volumes_detached: recorded.node_volume_detach_end_time.is_some(),
    }
}

/// A provider error as the planner weighs it.
pub(super) fn call_error(error: ProviderError) -> CallError {
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
        ProviderError::Quota { retry_after, .. } => {
            retry("PluginQuotaExceeded", *retry_after, &error)
        }
    }
}

pub(super) fn instance_state(state: &InstanceState) -> PlannedState {
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

/// The names of the hooks with this annotation prefix, sorted.
fn hooks(machine: &Machine, prefix: &str) -> Vec<String> {
    machine
        .annotations()
        .keys()
        .filter_map(|k| k.strip_prefix(prefix))
        .map(str::to_string)
        .collect()
}
