//! The outbound gate: whether plugin calls may send requests now (the
//! leader's write fence, told to the runtime once). The engine keeps it, the
//! HTTP client asks it before each request, and the call threads hand it
//! to the clients they make; so it lives here, below all three.

use std::sync::Arc;

/// Whether plugin calls may send requests now.
pub type OutboundGate = Arc<dyn Fn() -> bool + Send + Sync>;

/// Where a runtime's [`OutboundGate`] is kept once set.
pub(crate) type OutboundGateCell = Arc<std::sync::OnceLock<OutboundGate>>;
