//! Per-plugin resource limits and their defaults.
//!
//! Every limit applies to one call (a fresh store and instance per call), so
//! a plugin cannot accumulate usage across calls. Defaults are chosen for
//! provider calls that make a handful of HTTP requests; raise them per plugin
//! where a plugin legitimately needs more.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Default wall-clock deadline per call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest deadline a plugin may be given: a call holds a host-wide
/// call slot (and its instance) until it ends.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default cap on a call's linear memory.
pub const DEFAULT_MEMORY_BYTES: usize = 64 * 1024 * 1024;
/// Default cap on captured stdout and on captured stderr, each.
pub const DEFAULT_STDIO_BYTES: usize = 64 * 1024;
/// Default cap on structured log volume (messages plus fields).
pub const DEFAULT_LOG_BYTES: usize = 256 * 1024;
/// Default cap on the size of a returned value (strings and lists).
pub const DEFAULT_RETURN_BYTES: usize = 1024 * 1024;
/// Default cap on outbound requests in flight at once in one call. A cloud
/// provider's call makes its requests one after another; a few in parallel
/// (describe calls fanned out) stay well inside.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: u32 = 16;
/// Default cap on outbound requests in one call: a create or delete makes
/// two to five, a paginated list of a large account a few dozen.
pub const DEFAULT_MAX_REQUESTS_PER_CALL: u32 = 100;

/// The most host-side handles (requests, header maps, bodies, streams,
/// futures, …) one call may hold at once. A call within its request budgets
/// holds a few dozen (about nine per request in flight); the cap keeps a
/// guest that opens handles in a loop from growing host memory.
pub const MAX_RESOURCES_PER_CALL: usize = 512;
/// The most a `wasi:http` header map the guest builds may hold on the host
/// (names, values and the map's own bookkeeping; a signed cloud API
/// request's headers are about 2 KiB).
pub const MAX_FIELDS_BYTES: usize = 16 * 1024;
/// What an outgoing request body buffers on the host before the guest must
/// wait for it to drain (one chunk).
pub const OUTGOING_BODY_CHUNK_BYTES: usize = 32 * 1024;
/// The per-call byte budget for host-side objects: every handle the call
/// may hold at its largest ([`MAX_RESOURCES_PER_CALL`] ×
/// [`OUTGOING_BODY_CHUNK_BYTES`], the largest object a handle can own),
/// 16 MiB, separate from and in addition to the plugin's memory limit.
/// Response bodies are bounded by the HTTP gate's response limit.
pub const HOST_OBJECT_BYTES_PER_CALL: usize = MAX_RESOURCES_PER_CALL * OUTGOING_BODY_CHUNK_BYTES;

/// Most bytes of a response body the host reads for one
/// `capstan:plugin/http` request (larger answers are `too-large`); a call
/// makes one such request at a time, so one body is buffered at most.
pub const MAX_RESPONSE_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Which outbound-request budget a call ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestLimit {
    /// Requests in flight at once.
    InFlight,
    /// Requests in the whole call.
    PerCall,
}

impl std::fmt::Display for RequestLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RequestLimit::InFlight => "outbound requests in flight",
            RequestLimit::PerCall => "outbound requests per call",
        })
    }
}

/// Limits for one plugin's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock deadline per call, including time spent waiting on HTTP.
    #[serde(with = "millis")]
    pub call_timeout: Duration,
    /// Linear memory cap per call.
    pub memory_bytes: usize,
    /// Captured stdout cap (stderr has the same cap, separately).
    pub stdio_bytes: usize,
    /// Structured log volume cap.
    pub log_bytes: usize,
    /// Returned value size cap.
    pub return_bytes: usize,
    /// Outbound requests in flight at once (a request holds its slot until
    /// its response body is read or dropped).
    pub max_requests_in_flight: u32,
    /// Outbound requests in one call.
    pub max_requests_per_call: u32,
}

impl Limits {
    /// The most host memory one call may hold, by construction: its
    /// memories and tables (`memory_bytes`), its host-side objects
    /// ([`HOST_OBJECT_BYTES_PER_CALL`]), one crossing's data
    /// ([`Self::hostcall_bytes`]), its captured output (stdout, stderr and
    /// log), the request bodies the host buffers to sign, one per request
    /// in flight, and one `capstan:plugin/http` response body. A Plugin's
    /// `spec.quota.hostBytes` must hold `concurrentCalls` of these;
    /// `capstan plugin inspect` prints it.
    pub fn host_bytes_per_call(&self) -> u64 {
        let signed = (self.max_requests_in_flight as usize)
            .saturating_mul(crate::credentials::MAX_SIGNED_BODY_BYTES);
        [
            self.memory_bytes,
            HOST_OBJECT_BYTES_PER_CALL,
            self.hostcall_bytes(),
            self.stdio_bytes.saturating_mul(2),
            self.log_bytes,
            signed,
            MAX_RESPONSE_BODY_BYTES,
        ]
        .into_iter()
        .fold(0u64, |sum, b| sum.saturating_add(b as u64))
    }

    /// The most the guest may hand the host in one crossing (a host call's
    /// arguments or the call's result), set as wasmtime's hostcall fuel so
    /// it is refused before the host copies it: the largest output limit
    /// four times over (fuel counts a list element at its host size, larger
    /// than its bytes in the guest), plus 1 MiB. With the defaults, 5 MiB
    /// instead of wasmtime's 128 MiB.
    pub fn hostcall_bytes(&self) -> usize {
        let largest = self.return_bytes.max(self.log_bytes).max(self.stdio_bytes);
        largest.saturating_mul(4).saturating_add(1024 * 1024)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            stdio_bytes: DEFAULT_STDIO_BYTES,
            log_bytes: DEFAULT_LOG_BYTES,
            return_bytes: DEFAULT_RETURN_BYTES,
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            max_requests_per_call: DEFAULT_MAX_REQUESTS_PER_CALL,
        }
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}
