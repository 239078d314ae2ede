//! Why a plugin call failed, classified for the controllers' decisions
//! ([`ProviderError`]): the plugin's own error variants, the host's limits
//! and quotas, with the plugin's text bounded. Shared by the providers
//! ([`crate::provider`]) and the canary's call counts ([`crate::canary`]).

use capstan_runtime::Error as RuntimeError;
use capstan_runtime::types::PluginError;
use std::time::Duration;

/// Why a provider call failed, classified for the controller's decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The configuration is wrong; a human must change the spec.
    #[error("invalid provider config: {0}")]
    InvalidConfig(String),
    /// The instance does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Try again after the given delay.
    #[error("{message} (retrying in {} ms)", retry_after.as_millis())]
    Transient {
        /// What failed.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// The provider's credentials were refused; fixable by an admin.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// A failure that retrying cannot fix.
    #[error("{0}")]
    Terminal(String),
    /// The plugin misbehaved (trap, deadline, memory, output or capability
    /// limit); retried with backoff because a host can outlive a bad call.
    #[error("{0}")]
    Fault(String),
    /// The host held the call back: the Plugin's quota
    /// (`Plugin.spec.quota`) is used up. Not the plugin's fault; retried
    /// after the given delay.
    #[error("{message}")]
    Quota {
        /// Which quota, its size, and what to do.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
}

/// Plugin text reaches conditions, events and logs: bounded
/// ([`capstan_api::MAX_PLUGIN_TEXT`]), saying so when it was cut.
impl From<RuntimeError> for ProviderError {
    fn from(error: RuntimeError) -> Self {
        let bound = |m: &str| capstan_api::bounded(m, capstan_api::MAX_PLUGIN_TEXT);
        match error.plugin_error() {
            Some(PluginError::InvalidConfig(m)) => ProviderError::InvalidConfig(bound(m)),
            Some(PluginError::NotFound(m)) => ProviderError::NotFound(bound(m)),
            Some(PluginError::Transient(t)) => ProviderError::Transient {
                message: bound(&t.message),
                retry_after: Duration::from_millis(t.retry_after_ms.max(1)),
            },
            Some(PluginError::Unauthorized(m)) => ProviderError::Unauthorized(bound(m)),
            Some(PluginError::Terminal(m)) => ProviderError::Terminal(bound(m)),
            // The plugin's contract cannot do what the spec asks: retrying
            // cannot help, a spec or plugin change can.
            None if matches!(error, RuntimeError::Unsupported { .. }) => {
                ProviderError::Terminal(bound(&error.to_string()))
            }
            None if matches!(
                error,
                RuntimeError::QuotaExceeded { .. } | RuntimeError::HostCapacity { .. }
            ) =>
            {
                ProviderError::Quota {
                    retry_after: error.retry_after().unwrap_or(Duration::from_secs(1)),
                    message: bound(&error.to_string()),
                }
            }
            // The host stopped it (this replica no longer leads): whoever
            // leads now retries; nothing here is the plugin's doing.
            None if matches!(error, RuntimeError::Fenced { .. }) => ProviderError::Transient {
                message: bound(&error.to_string()),
                retry_after: Duration::from_secs(1),
            },
            None => ProviderError::Fault(bound(&error.to_string())),
        }
    }
}

impl ProviderError {
    /// The message and the wait of an error to retry as it is: the
    /// plugin's `transient`, or the host's quota.
    pub fn retry(&self) -> Option<(&str, Duration)> {
        match self {
            ProviderError::Transient {
                message,
                retry_after,
            }
            | ProviderError::Quota {
                message,
                retry_after,
            } => Some((message, *retry_after)),
            _ => None,
        }
    }

    /// Label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::InvalidConfig(_) => "invalid_config",
            ProviderError::NotFound(_) => "not_found",
            ProviderError::Transient { .. } => "transient",
            ProviderError::Unauthorized(_) => "unauthorized",
            ProviderError::Terminal(_) => "terminal",
            ProviderError::Fault(_) => "fault",
            ProviderError::Quota { .. } => "quota",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_text_is_bounded_before_it_reaches_a_status() {
        let long = "x".repeat(100_000);
        for error in [
            PluginError::Terminal(long.clone()),
            PluginError::InvalidConfig(long.clone()),
        ] {
            let converted = ProviderError::from(RuntimeError::Plugin {
                plugin: "hostile".into(),
                call: "create",
                error,
            });
            let text = converted.to_string();
            assert!(
                text.len() <= capstan_api::MAX_PLUGIN_TEXT + 64,
                "{}",
                text.len()
            );
            assert!(text.contains("(truncated)"), "says it was cut");
        }
    }
}
