//! The plumbing every Capstan controller shares, and nothing of any one
//! controller's feature. The controllers (`capstan-controllers`, and the
//! addon engine in `capstan-addons`) each build a small context of their
//! own around a [`Kube`] and start through [`controller::run`].
//!
//! Where to start:
//! - [`Kube`]: the API client, the shared caches ([`Stores`]), metrics and
//!   the Event recorder; [`watch::Watches`] fills the caches;
//! - [`controller::run`]: one way to run a controller (queue metrics,
//!   timing, retries, graceful shutdown);
//! - [`write`]: the status write path, the finalizer helper and Events —
//!   every write a controller makes goes through one of these;
//! - [`Conditions`]: sets conditions with one generation and time;
//! - [`Expectations`]: creations and deletions the cache has not shown yet;
//!   [`unseen::UnseenWrites`]: own writes it has not shown yet;
//! - [`claims`]: Machines by provider ID (an index), for the Node claim
//!   check and for finding a Node's machines;
//! - [`owners`]: owner references and adopting orphans; [`cascade`]: a
//!   deleting owner deletes what it controls before it goes;
//! - [`registry`] and [`provider`]: what the Plugin controller loaded, and
//!   whether a namespace may use a Plugin now;
//! - [`impersonate`]: a client that acts as a tenant's ServiceAccount;
//! - [`metrics`], [`leader`] (election and the write fence) and
//!   [`ratelimit`] (client-side QPS).

#![forbid(unsafe_code)]

pub mod canary;
pub mod capacity;
pub mod cascade;
pub mod claims;
pub mod conditions;
pub mod context;
pub mod controller;
pub mod expectations;
pub mod fair;
pub mod impersonate;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod objects;
pub mod owners;
pub mod provider;
pub mod provider_error;
pub mod ratelimit;
pub mod registry;
pub mod unseen;
pub mod watch;
pub mod workload;
pub mod write;

pub use conditions::Conditions;
pub use context::{Kind, Kube, ScopeApi, Stores};
pub use expectations::{Check, Expectations, Seen};
pub use metrics::Metrics;
pub use objects::{key_of, merge_patch, now, paused};
pub use owners::owner_key;
pub use provider::{MachineProvider, ProviderError, Providers, Registered, WasmProvider};

/// Field manager of every write.
pub const FIELD_MANAGER: &str = "capstan";
/// The controller name on the Events Capstan records.
pub const REPORTING_CONTROLLER: &str = "capstan";

/// Errors of the controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An object the caller named does not exist (the text says which).
    #[error("{0}")]
    NotFound(String),
    /// An object Capstan would create already exists and is not its own
    /// (the text says whose it is and what to do).
    #[error("{0}")]
    Conflict(String),
    /// The metrics or health server could not start (the text says which).
    #[error("{0}")]
    Serve(String),
    /// This replica lost the leader Lease and stopped reconciling.
    #[error("lost the leader Lease: {0}")]
    LeadershipLost(String),
    /// An identity to act as cannot be used (the text says why).
    #[error("{0}")]
    Identity(String),
    /// A workload cluster cannot be reached now (the text says which and
    /// why); the work is tried again.
    #[error("{0}")]
    Unavailable(String),
    /// A watch failed at startup.
    #[error(
        "cannot watch {0}: check the CRDs are installed (`capstan crds | kubectl apply -f -`) and RBAC allows list/watch"
    )]
    Watch(String),
}

/// Shorthand for wrapping kube errors with context.
pub fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}
