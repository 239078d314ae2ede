//! The gate every outbound `wasi:http` request passes through.
//!
//! The destination is taken from the request URI (scheme and authority) and
//! checked with [`crate::grants::decide`]. Allowed requests get their `Host`
//! header rewritten from that same authority (so a forged `Host` cannot point
//! a shared front end elsewhere) and the granted credential attached. Denied
//! requests fail inside the guest with `http-request-denied`, and the denial
//! is recorded so the whole call is reported as a capability violation.
//! Redirects are never followed by the host: a guest that follows one makes a
//! new request, which is checked again.
//!
//! Credentials are attached by [`crate::credentials`] (an `Authorization`
//! header, or an AWS SigV4 signature over the whole body).
//!
//! Every call has two request budgets ([`crate::Limits`]): requests in
//! flight at once (a request counts until its response body is read or
//! dropped, so it also bounds open connections) and requests in total. The
//! request that would exceed one is refused, and the call fails with
//! [`crate::Error::RequestLimit`] whatever the plugin makes of the refusal.
//!
//! Allowed requests go through one connection pool per [`crate::Runtime`]
//! (keep-alive, http and https with the Web PKI roots), so a plugin call does
//! not pay for a TCP and TLS handshake every time. The pool is invisible to
//! plugins: each request still carries only its own headers.

use crate::gate::OutboundGateCell;
use crate::grants::{Credential, Grants, HttpDecision, decide};
use crate::limits::RequestLimit;
use capstan_manifest::{Destination, HttpCapability};
use http::header::{HOST, HeaderValue, USER_AGENT};
use http_body_util::BodyExt;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// The host's outbound connection pool.
pub(crate) type PooledClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<
        hyper_util::client::legacy::connect::HttpConnector<crate::resolve::GrantedNames>,
    >,
    WasiBody,
>;

/// Build the pool: http and https (ring, Web PKI roots), HTTP/1.1,
/// keep-alive with idle connections closed after 30 s; names never resolve
/// to internal addresses ([`crate::resolve`]). Its connection tasks stop at
/// `gate` once one is set and says no ([`GatedExecutor`]).
pub(crate) fn pooled_client(gate: OutboundGateCell) -> Result<PooledClient, String> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(
        crate::resolve::GrantedNames::new(),
    );
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|e| format!("cannot configure TLS for outbound requests: {e}"))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(GatedExecutor(gate))
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build(connector),
    )
}

/// The executor of the pool's connection tasks. A request is written to
/// the socket by its connection's task, not by the call that made it, so a
/// request handed over just before the process was stopped (SIGSTOP, a
/// long pause) would otherwise still go out when it runs again, after the
/// Lease it was sent under was lost. Each task stops (closing its
/// connection) the first time it would run while the gate says no.
#[derive(Clone)]
struct GatedExecutor(OutboundGateCell);

type ConnectionTask = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

impl hyper::rt::Executor<ConnectionTask> for GatedExecutor {
    fn execute(&self, mut task: ConnectionTask) {
        let gate = self.0.clone();
        tokio::spawn(std::future::poll_fn(move |cx| {
            if gate.get().is_some_and(|may_send| !may_send()) {
                return std::task::Poll::Ready(());
            }
            task.as_mut().poll(cx)
        }));
    }
}

/// The User-Agent product naming a plugin revision:
/// `capstan-plugin/<Plugin name>@sha256:<first 12 hex digits>`.
pub(crate) fn plugin_agent(label: &str, digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!(
        "capstan-plugin/{label}@sha256:{}",
        &hex[..hex.len().min(12)]
    )
}

/// The guest's User-Agent with the host's product appended; any
/// `capstan-plugin/` product the guest wrote itself is dropped, so a
/// revision cannot pass its requests off as another's.
fn with_plugin_agent(guest: Option<&str>, agent: &str) -> String {
    guest
        .unwrap_or_default()
        .split_whitespace()
        .filter(|product| !product.starts_with("capstan-plugin/"))
        .chain(std::iter::once(agent))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a request is refused while the runtime's outbound gate is closed.
pub(crate) const GATE_CLOSED: &str = "this replica may not act now (it is not the leader, or could not renew its Lease in time): nothing is sent";

/// Per-call HTTP gate.
pub(crate) struct HttpGate {
    pub(crate) plugin: Arc<str>,
    /// The User-Agent product the host appends to every request
    /// ([`plugin_agent`]).
    pub(crate) agent: Arc<str>,
    pub(crate) declared: Arc<[HttpCapability]>,
    pub(crate) grants: Arc<Grants>,
    /// The first denial of this call.
    pub(crate) denial: Arc<Mutex<Option<String>>>,
    /// The first request budget this call ran out of, and its size.
    pub(crate) exhausted: Arc<Mutex<Option<(RequestLimit, u32)>>>,
    pub(crate) max_in_flight: u32,
    pub(crate) max_total: u32,
    pub(crate) in_flight: Arc<AtomicU32>,
    pub(crate) sent: u32,
    pub(crate) client: PooledClient,
    /// Nanoseconds this call's requests waited for their response headers
    /// (summed; requests may overlap and run on other tasks).
    pub(crate) waited: Arc<std::sync::atomic::AtomicU64>,
    /// The runtime's outbound gate, if it has one.
    pub(crate) may_send: Option<crate::OutboundGate>,
    /// The Plugin's quota, if it has one (requests per minute).
    pub(crate) quota: Option<crate::Quota>,
    /// The first quota this call's requests ran out of.
    pub(crate) quota_hit: Arc<Mutex<Option<crate::QuotaHit>>>,
    /// Told what became of each request, with the plugin's label.
    pub(crate) observer: Option<(Arc<dyn crate::Observer>, Arc<str>)>,
    /// The cassette this call records to or replays from, if any.
    pub(crate) tape: Option<crate::tape::CallTape>,
    /// Replay: why a request found no recorded answer.
    pub(crate) tape_miss: Arc<Mutex<Option<String>>>,
}

/// Tell `observer` (if any) what became of a request.
fn tell(observer: Option<&(Arc<dyn crate::Observer>, Arc<str>)>, result: crate::Outbound) {
    if let Some((observer, label)) = observer {
        observer.outbound(label, result);
    }
}

/// Holds one slot of the in-flight budget until dropped (with the response
/// body, or with the request when it fails).
struct InFlight(Arc<AtomicU32>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for HttpGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpGate")
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

impl HttpGate {
    pub(crate) fn denial(&self) -> Option<String> {
        self.denial
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn tape_miss(&self) -> Option<String> {
        self.tape_miss
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn quota_hit(&self) -> Option<crate::QuotaHit> {
        *self.quota_hit.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn exhausted(&self) -> Option<(RequestLimit, u32)> {
        *self.exhausted.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deny(&self, reason: String) {
        tracing::warn!(plugin = %self.plugin, %reason, "outbound request denied");
        let mut slot = self.denial.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(reason);
    }

    /// Take a slot of both budgets, or record which one ran out.
    fn admit(&mut self) -> Result<InFlight, ()> {
        let exhausted = |limit, size| {
            tracing::warn!(plugin = %self.plugin, %limit, size, "outbound request refused: budget exhausted");
            let mut slot = self.exhausted.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert((limit, size));
        };
        if self.sent >= self.max_total {
            exhausted(RequestLimit::PerCall, self.max_total);
            return Err(());
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            exhausted(RequestLimit::InFlight, self.max_in_flight);
            return Err(());
        }
        self.sent += 1;
        Ok(InFlight(self.in_flight.clone()))
    }
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for HttpGate {
    // One buffered chunk of at most this size per outgoing body, so every
    // handle's host memory stays within the per-call object budget.
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        1
    }
    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        crate::limits::OUTGOING_BODY_CHUNK_BYTES
    }

    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> ResponseFuture {
        drop(fut);
        if let Some(may_send) = &self.may_send
            && !may_send()
        {
            self.deny(GATE_CLOSED.into());
            tell(self.observer.as_ref(), crate::Outbound::Fenced);
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let uri = request.uri();
        let dest = match (uri.scheme_str(), uri.authority()) {
            (Some(scheme), Some(authority)) => Destination::new(scheme, authority.as_str())
                .map(|d| (d, authority.as_str().to_string())),
            _ => Err(format!("`{uri}` is not an absolute http(s) URL")),
        };
        // The method decides too: a credential goes only with the methods
        // its grant allows, never with TRACE or CONNECT.
        let verdict = match &dest {
            Ok((d, _)) => decide(&self.declared, &self.grants, d, request.method().as_str()),
            Err(e) => HttpDecision::Deny { reason: e.clone() },
        };
        match (verdict, dest) {
            (HttpDecision::Allow { credential }, Ok((_, authority))) => {
                let credential = credential.cloned();
                // The Plugin's requests-per-minute, shared by all its calls:
                // counted only for requests that would otherwise leave.
                if let Some(quota) = &self.quota
                    && let Err(hit) = quota.admit_request()
                {
                    tracing::info!(plugin = %self.plugin, quota = %hit.kind, "outbound request held back by the plugin's quota");
                    self.quota_hit
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(hit);
                    tell(self.observer.as_ref(), crate::Outbound::Quota);
                    return Box::new(async { Err(HttpError::HttpRequestDenied) });
                }
                let Ok(slot) = self.admit() else {
                    tell(self.observer.as_ref(), crate::Outbound::Budget);
                    return Box::new(async { Err(HttpError::ConnectionLimitReached) });
                };
                let headers = request.headers_mut();
                headers.remove(HOST);
                if let Ok(v) = HeaderValue::from_str(&authority) {
                    headers.insert(HOST, v);
                }
                // What the plugin sent, as a cassette keeps it: before any
                // credential is attached, sensitive headers left out.
                let taped = self.tape.clone().map(|tape| (tape, taped_head(&request)));
                let tape_miss = self.tape_miss.clone();
                let headers = request.headers_mut();
                // Host-owned, like Host: which revision of which Plugin sent
                // this, for the cloud's own logs. Before any signature.
                let guest = headers.get(USER_AGENT).and_then(|v| v.to_str().ok());
                if let Ok(v) = HeaderValue::from_str(&with_plugin_agent(guest, &self.agent)) {
                    headers.insert(USER_AGENT, v);
                }
                if let Some(credential) = &credential {
                    crate::credentials::authorize(headers, credential);
                }
                // The call's deadline bounds the whole request; per-request
                // timeouts from the guest are not needed on top of it.
                let _ = options;
                let forwarding = Forwarding {
                    client: self.client.clone(),
                    plugin: self.plugin.clone(),
                    denial: self.denial.clone(),
                    tape_miss,
                    waited: self.waited.clone(),
                    may_send: self.may_send.clone(),
                    observer: self.observer.clone(),
                };
                Box::new(forwarding.forward(request, authority, credential, taped, slot))
            }
            (HttpDecision::Deny { reason }, _) | (_, Err(reason)) => {
                self.deny(reason);
                tell(self.observer.as_ref(), crate::Outbound::Denied);
                Box::new(async { Err(HttpError::HttpRequestDenied) })
            }
        }
    }
}

/// The body-end future of an answer that is complete when handed over.
type BodyDone = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// An answer for the plugin: the response and its body-end future.
type Answer = Result<(http::Response<WasiBody>, BodyDone), HttpError>;

fn body_done() -> BodyDone {
    Box::new(async { Ok(()) })
}

/// What a request that passed the gate, the grants, the quota and the
/// budgets carries into its future: the pooled client, and where to record
/// what became of it.
struct Forwarding {
    client: PooledClient,
    plugin: Arc<str>,
    denial: Arc<Mutex<Option<String>>>,
    tape_miss: Arc<Mutex<Option<String>>>,
    waited: Arc<std::sync::atomic::AtomicU64>,
    may_send: Option<crate::OutboundGate>,
    observer: Option<(Arc<dyn crate::Observer>, Arc<str>)>,
}

/// A request as the cassette left it: answered from a replay, or to be
/// sent and its answer recorded.
enum Taped {
    Replayed(http::Response<WasiBody>),
    Recording(Box<(http::Request<WasiBody>, Recording)>),
}

/// The cassette a request is recorded to, and the request as kept there.
type Recording = (crate::tape::CallTape, crate::tape::TapedRequest);

/// What the plugin sent, as a cassette keeps it: method, URL, headers.
type TapedHead = (String, String, Vec<(String, String)>);

impl Forwarding {
    fn told(&self, result: crate::Outbound) {
        tell(self.observer.as_ref(), result);
    }

    /// Record the call's first denial; the plugin sees only "denied".
    fn refused(&self, reason: String) -> HttpError {
        self.denial
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason);
        HttpError::HttpRequestDenied
    }

    /// Replay, sign, send and hand back: the whole life of an admitted
    /// request. `slot` (its place in the in-flight budget) is held until
    /// its response body is read or it fails.
    async fn forward(
        self,
        mut request: http::Request<WasiBody>,
        authority: String,
        credential: Option<Credential>,
        taped: Option<(crate::tape::CallTape, TapedHead)>,
        slot: InFlight,
    ) -> Answer {
        let mut recording = None;
        if let Some((tape, head)) = taped {
            match self.replay_or_keep(tape, head, request).await? {
                Taped::Replayed(answer) => return Ok((answer, body_done())),
                Taped::Recording(kept) => {
                    let (kept, record) = *kept;
                    request = kept;
                    recording = Some(record);
                }
            }
        }
        if let Some(Credential::AwsSigV4 { credentials, scope }) = &credential {
            request = crate::credentials::sign_aws(request, &authority, credentials, scope)
                .await
                .map_err(|reason| {
                    tracing::warn!(plugin = %self.plugin, %reason, "outbound request not signed");
                    self.told(crate::Outbound::Denied);
                    self.refused(reason)
                })?;
        }
        let response = self.send_while_open(request).await?;
        self.told(crate::Outbound::Ok);
        let Some((tape, sent)) = recording else {
            let streamed = response.map(|body| {
                body.map_err(HttpError::from)
                    .map_frame(move |frame| {
                        let _held = &slot;
                        frame
                    })
                    .boxed_unsync()
            });
            return Ok((streamed, body_done()));
        };
        // Recording: the whole answer is read here, kept, and handed to
        // the plugin as it came.
        let (parts, body) = response.into_parts();
        let bytes = taped_bytes(body).await?;
        drop(slot);
        tape.push(crate::tape::Interaction {
            request: sent,
            response: crate::tape::TapedResponse {
                status: parts.status.as_u16(),
                headers: kept_headers(&parts.headers),
                body: crate::tape::TapedBody::of(&bytes),
            },
        });
        Ok((
            http::Response::from_parts(parts, full_body(bytes)),
            body_done(),
        ))
    }

    /// With a cassette: the recorded answer (replay), or the request read
    /// whole and kept for the recording.
    async fn replay_or_keep(
        &self,
        tape: crate::tape::CallTape,
        (method, url, head): TapedHead,
        request: http::Request<WasiBody>,
    ) -> Result<Taped, HttpError> {
        let (parts, body) = request.into_parts();
        let bytes = taped_bytes(body).await?;
        let sent = crate::tape::TapedRequest {
            method,
            url,
            headers: head,
            body: crate::tape::TapedBody::of(&bytes),
            any_body: false,
        };
        if !matches!(tape.mode(), crate::tape::TapeMode::Replay { .. }) {
            let request = http::Request::from_parts(parts, full_body(bytes));
            return Ok(Taped::Recording(Box::new((request, (tape, sent)))));
        }
        match tape.take(&sent) {
            Ok(answer) => {
                self.told(crate::Outbound::Ok);
                Ok(Taped::Replayed(replayed_response(&answer)?))
            }
            Err(miss) => {
                tracing::warn!(plugin = %self.plugin, %miss, "request not in the cassette");
                self.tape_miss
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(miss.to_string());
                Err(HttpError::HttpRequestDenied)
            }
        }
    }

    /// Send, asking the gate again before every poll: this future may
    /// first run long after `send_request` returned (the process was
    /// stopped in between). Adds the wait for the response headers to the
    /// call's total; a failure is classified for the plugin.
    async fn send_while_open(
        &self,
        request: http::Request<WasiBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, HttpError> {
        let sent = std::time::Instant::now();
        let mut request = std::pin::pin!(self.client.request(request));
        let may_send = self.may_send.clone();
        let response = std::future::poll_fn(|cx| {
            if may_send.as_ref().is_some_and(|may_send| !may_send()) {
                return std::task::Poll::Ready(None);
            }
            request.as_mut().poll(cx).map(Some)
        })
        .await;
        let Some(response) = response else {
            tracing::warn!(plugin = %self.plugin, reason = GATE_CLOSED, "outbound request denied");
            self.told(crate::Outbound::Fenced);
            return Err(self.refused(GATE_CLOSED.into()));
        };
        self.waited.fetch_add(
            u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        response.map_err(|e| {
            tracing::debug!(plugin = %self.plugin, error = %e, "outbound request failed");
            match crate::resolve::refusal(&e) {
                Some(reason) => {
                    self.told(crate::Outbound::Denied);
                    self.refused(reason)
                }
                None => {
                    self.told(crate::Outbound::Error);
                    if e.is_connect() {
                        HttpError::ConnectionRefused
                    } else {
                        HttpError::HttpProtocolError
                    }
                }
            }
        })
    }
}

/// A request's method, URL and the headers a cassette may keep.
fn taped_head(request: &http::Request<WasiBody>) -> (String, String, Vec<(String, String)>) {
    (
        request.method().to_string(),
        request.uri().to_string(),
        kept_headers(request.headers()),
    )
}

/// Headers a cassette keeps: not sensitive ([`crate::tape::SENSITIVE_HEADERS`])
/// and not `host` (the URL says it), values as text.
fn kept_headers(headers: &http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            name != "host" && !crate::tape::SENSITIVE_HEADERS.contains(&name)
        })
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
        .collect()
}

/// Most bytes of one body a cassette takes in (the request's or the
/// answer's); a larger one fails the request rather than the host's memory.
const MAX_TAPED_BODY_BYTES: usize = 8 * 1024 * 1024;

/// A body read whole for a cassette, bounded.
async fn taped_bytes<B>(body: B) -> Result<bytes::Bytes, HttpError>
where
    B: hyper::body::Body<Data = bytes::Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    http_body_util::Limited::new(body, MAX_TAPED_BODY_BYTES)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|_| HttpError::HttpProtocolError)
}

fn full_body(bytes: bytes::Bytes) -> WasiBody {
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A recorded answer as the response the plugin reads.
fn replayed_response(
    answer: &crate::tape::TapedResponse,
) -> Result<http::Response<WasiBody>, HttpError> {
    let mut response = http::Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        response = response.header(name, value);
    }
    response
        .body(full_body(answer.body.bytes().into()))
        .map_err(|_| HttpError::HttpProtocolError)
}

#[cfg(test)]
mod agent_tests {
    use super::*;

    #[test]
    fn the_hosts_product_is_appended_and_a_forged_one_dropped() {
        let agent = plugin_agent("sim", "sha256:0123456789abcdef0123");
        assert_eq!(agent, "capstan-plugin/sim@sha256:0123456789ab");
        assert_eq!(with_plugin_agent(None, &agent), agent);
        assert_eq!(
            with_plugin_agent(Some("aws-sdk-rust/1.0 os/wasi"), &agent),
            format!("aws-sdk-rust/1.0 os/wasi {agent}")
        );
        assert_eq!(
            with_plugin_agent(
                Some("capstan-plugin/other@sha256:ffffffffffff  curl/8"),
                &agent
            ),
            format!("curl/8 {agent}")
        );
    }
}
