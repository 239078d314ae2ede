//! What the runtime tells whoever watches it: calls entering and leaving,
//! how long each waited for its plugin's share, quota refusals, and every
//! outbound request's fate. The controllers turn these into per-plugin
//! metrics ([`Runtime::observe`]); the runtime itself keeps no counters.
//!
//! Every method has an empty default, so an observer takes what it needs.

use std::time::Duration;

/// What became of one outbound request a plugin made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outbound {
    /// The response headers arrived (whatever the status).
    Ok,
    /// The destination, method or signing was refused by the gate.
    Denied,
    /// A per-call request budget (in flight, per call) ran out.
    Budget,
    /// The Plugin's `requestsPerMinute` held it back.
    Quota,
    /// The outbound gate was closed (this replica no longer leads).
    Fenced,
    /// It left, but failed (connection refused, protocol error).
    Error,
}

impl Outbound {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outbound::Ok => "ok",
            Outbound::Denied => "denied",
            Outbound::Budget => "budget",
            Outbound::Quota => "quota",
            Outbound::Fenced => "fenced",
            Outbound::Error => "error",
        }
    }
}

/// Told about every plugin call and request (set once per runtime with
/// [`crate::Runtime::observe`]).
pub trait Observer: Send + Sync {
    /// A call of `plugin` starts running, after `waited` for its plugin's
    /// `concurrentCalls` (zero without one).
    fn call_started(&self, plugin: &str, waited: Duration) {
        let _ = (plugin, waited);
    }
    /// A call that started ends (however it ends).
    fn call_ended(&self, plugin: &str) {
        let _ = plugin;
    }
    /// A call of `plugin` was refused by its quota `kind` after `waited`.
    fn quota_refused(&self, plugin: &str, kind: crate::QuotaKind, waited: Duration) {
        let _ = (plugin, kind, waited);
    }
    /// An outbound request of `plugin` ended as `result`.
    fn outbound(&self, plugin: &str, result: Outbound) {
        let _ = (plugin, result);
    }
}

/// Where the runtime keeps its observer: set at most once, read by every
/// call and every request.
pub(crate) type ObserverCell = std::sync::Arc<std::sync::OnceLock<std::sync::Arc<dyn Observer>>>;

/// Ends a started call for the observer when dropped, so a call whose
/// future is dropped (a deadline, a shutdown) still leaves the gauge.
pub(crate) struct Running {
    pub(crate) observer: Option<std::sync::Arc<dyn Observer>>,
    pub(crate) plugin: std::sync::Arc<str>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(observer) = &self.observer {
            observer.call_ended(&self.plugin);
        }
    }
}
