//! The runtime's one error type.
//!
//! Load-time errors say which plugin and what was wrong with it. Call-time
//! errors always name the plugin, the call, and the limit or capability
//! involved, so a status condition built from them tells an operator what to
//! do. They never contain credentials.

use crate::types::PluginError;
use std::time::Duration;

/// Which bounded output a plugin overflowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Stdout,
    Stderr,
    Log,
    ReturnValue,
    /// What the guest hands the host in one crossing (a host call's
    /// arguments, or the call's result), bounded before it is copied.
    HostCall,
}

impl std::fmt::Display for OutputKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OutputKind::Stdout => "stdout",
            OutputKind::Stderr => "stderr",
            OutputKind::Log => "log",
            OutputKind::ReturnValue => "return value",
            OutputKind::HostCall => "host call data",
        })
    }
}

/// Everything that can go wrong loading or calling a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin's manifest is missing or invalid.
    #[error("plugin {source_name}: {error}")]
    Manifest {
        source_name: String,
        #[source]
        error: capstan_manifest::ManifestError,
    },
    /// The component does not compile, or does not match its manifest.
    #[error("plugin {plugin}: {reason}")]
    Load { plugin: String, reason: String },
    /// The component imports something the sandbox does not provide.
    #[error(
        "plugin {plugin} cannot be linked: {reason} (the sandbox provides only the Capstan contract, wasi:http, clocks, random and stdio)"
    )]
    Link { plugin: String, reason: String },
    /// The plugin was asked for a world it does not implement.
    #[error("plugin {plugin} implements the {actual} world, not {expected}")]
    WrongWorld {
        plugin: String,
        expected: capstan_manifest::World,
        actual: capstan_manifest::World,
    },
    /// Reading a plugin file or the precompiled-code cache failed.
    #[error("{what}: {error}")]
    Io {
        what: String,
        #[source]
        error: std::io::Error,
    },
    /// The engine could not be configured.
    #[error("cannot configure the WebAssembly engine: {0}")]
    Engine(String),

    /// The plugin returned an error from the contract (not a fault).
    #[error("plugin {plugin} {call}: {}", describe(error))]
    Plugin {
        plugin: String,
        call: &'static str,
        error: PluginError,
    },
    /// The plugin trapped (panic, `unreachable`, a bug).
    #[error("plugin {plugin} trapped in {call}: {message}")]
    Trap {
        plugin: String,
        call: &'static str,
        message: String,
    },
    /// The call ran past its deadline and was stopped.
    #[error("plugin {plugin} {call} exceeded its deadline of {} ms and was stopped", limit.as_millis())]
    DeadlineExceeded {
        plugin: String,
        call: &'static str,
        limit: Duration,
    },
    /// The call tried to grow memory past its cap.
    #[error(
        "plugin {plugin} {call} exceeded its memory limit of {limit_bytes} bytes (asked for {requested_bytes})"
    )]
    MemoryLimit {
        plugin: String,
        call: &'static str,
        limit_bytes: usize,
        requested_bytes: usize,
    },
    /// The call's outbound request was held back because this replica may
    /// not act now (it lost, or could not renew, the leader Lease): the
    /// host's decision, never the plugin's fault.
    #[error(
        "plugin {plugin} {call} was stopped before sending: this replica may not act now (it is not the leader, or could not renew its Lease in time)"
    )]
    Fenced { plugin: String, call: &'static str },
    /// The call produced more output than allowed.
    #[error("plugin {plugin} {call} exceeded its {kind} limit of {limit_bytes} bytes")]
    OutputLimit {
        plugin: String,
        call: &'static str,
        kind: OutputKind,
        limit_bytes: usize,
    },
    /// The call ran out of an outbound-request budget.
    #[error(
        "plugin {plugin} {call} exceeded its limit of {size} {limit}; raise spec.limits on the Plugin if the plugin legitimately needs more"
    )]
    RequestLimit {
        plugin: String,
        call: &'static str,
        limit: crate::limits::RequestLimit,
        size: u32,
    },
    /// The call tried to use a capability it was not granted.
    #[error("plugin {plugin} {call} was denied a capability: {detail}")]
    CapabilityDenied {
        plugin: String,
        call: &'static str,
        detail: String,
    },
    /// The plugin's quota (`Plugin.spec.quota`) ran out: a host decision,
    /// not the plugin's fault; try again after `retry_after`.
    #[error(
        "plugin {plugin} {call} was held back: its quota of {size} {kind} is used up (retry after {} ms); raise spec.quota on the Plugin if it legitimately needs more", retry_after.as_millis()
    )]
    QuotaExceeded {
        plugin: String,
        call: &'static str,
        kind: crate::quota::QuotaKind,
        size: u32,
        retry_after: Duration,
    },
    /// The host had no instance slot for the call right now (its pool of
    /// core instances, memories or tables was full): the host's capacity,
    /// never the plugin's fault; try again after `retry_after`.
    #[error(
        "plugin {plugin} {call} was held back: the host has no room for another instance now ({detail}); retry after {} ms", retry_after.as_millis()
    )]
    HostCapacity {
        plugin: String,
        call: &'static str,
        detail: String,
        retry_after: Duration,
    },
    /// Under replay ([`crate::tape`]), the call asked for something the
    /// cassette does not hold: a request with no recorded answer, or a call
    /// the recording did not make. A test failure, not the plugin's fault.
    #[error("plugin {plugin} {call} cannot be replayed: {detail}")]
    ReplayMiss {
        plugin: String,
        call: &'static str,
        detail: String,
    },
    /// The plugin's contract version cannot carry what the call needs (a
    /// 0.1.0 provider asked to create an instance with bootstrap data).
    #[error("plugin {plugin} {call}: {reason}")]
    Unsupported {
        plugin: String,
        call: &'static str,
        reason: String,
    },
}

impl Error {
    /// The contract error, when the plugin returned one.
    pub fn plugin_error(&self) -> Option<&PluginError> {
        match self {
            Error::Plugin { error, .. } => Some(error),
            _ => None,
        }
    }

    /// When a call refused by the host (a quota) may be tried again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::QuotaExceeded { retry_after, .. } | Error::HostCapacity { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// Whether the plugin itself misbehaved (a trap or a limit), as opposed
    /// to returning a contract error or failing to load.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Error::Trap { .. }
                | Error::DeadlineExceeded { .. }
                | Error::MemoryLimit { .. }
                | Error::OutputLimit { .. }
                | Error::RequestLimit { .. }
                | Error::CapabilityDenied { .. }
        )
    }
}

/// A readable one-line description of a contract error (the generated
/// `Display` is the `Debug` form).
pub fn describe(error: &PluginError) -> String {
    {
        match error {
            PluginError::InvalidConfig(m) => format!("invalid config: {m}"),
            PluginError::NotFound(m) => format!("not found: {m}"),
            PluginError::Transient(t) => format!(
                "transient error (retry after {} ms): {}",
                t.retry_after_ms, t.message
            ),
            PluginError::Unauthorized(m) => format!("unauthorized: {m}"),
            PluginError::Terminal(m) => format!("terminal error: {m}"),
        }
    }
}
