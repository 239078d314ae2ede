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
//! Allowed requests go through one connection pool per [`crate::Runtime`]
//! (keep-alive, http and https with the Web PKI roots), so a plugin call does
//! not pay for a TCP and TLS handshake every time. The pool is invisible to
//! plugins: each request still carries only its own headers.

use crate::grants::{Grants, HttpDecision, decide};
use capstan_manifest::{Destination, HttpCapability};
use http::header::{AUTHORIZATION, HOST, HeaderValue};
use http_body_util::BodyExt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// The host's outbound connection pool.
pub(crate) type PooledClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    WasiBody,
>;

/// Build the pool: http and https (ring, Web PKI roots), HTTP/1.1,
/// keep-alive with idle connections closed after 30 s.
pub(crate) fn pooled_client() -> Result<PooledClient, String> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
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
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build(connector),
    )
}

/// Per-call HTTP gate.
pub(crate) struct HttpGate {
    pub(crate) plugin: Arc<str>,
    pub(crate) declared: Arc<[HttpCapability]>,
    pub(crate) grants: Arc<Grants>,
    /// The first denial of this call.
    pub(crate) denial: Arc<Mutex<Option<String>>>,
    pub(crate) client: PooledClient,
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

    fn deny(&self, reason: String) {
        tracing::warn!(plugin = %self.plugin, %reason, "outbound request denied");
        let mut slot = self.denial.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(reason);
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
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> ResponseFuture {
        drop(fut);
        let uri = request.uri();
        let dest = match (uri.scheme_str(), uri.authority()) {
            (Some(scheme), Some(authority)) => Destination::new(scheme, authority.as_str())
                .map(|d| (d, authority.as_str().to_string())),
            _ => Err(format!("`{uri}` is not an absolute http(s) URL")),
        };
        let verdict = match &dest {
            Ok((d, _)) => decide(&self.declared, &self.grants, d),
            Err(e) => HttpDecision::Deny { reason: e.clone() },
        };
        match (verdict, dest) {
            (HttpDecision::Allow { credential }, Ok((_, authority))) => {
                let headers = request.headers_mut();
                headers.remove(HOST);
                if let Ok(v) = HeaderValue::from_str(&authority) {
                    headers.insert(HOST, v);
                }
                if let Some(credential) = credential
                    && let Ok(mut v) = HeaderValue::from_str(&credential.authorization())
                {
                    v.set_sensitive(true);
                    headers.insert(AUTHORIZATION, v);
                }
                // The call's deadline bounds the whole request; per-request
                // timeouts from the guest are not needed on top of it.
                let _ = options;
                let client = self.client.clone();
                let plugin = self.plugin.clone();
                Box::new(async move {
                    let response = client.request(request).await.map_err(|e| {
                        tracing::debug!(%plugin, error = %e, "outbound request failed");
                        if e.is_connect() {
                            HttpError::ConnectionRefused
                        } else {
                            HttpError::HttpProtocolError
                        }
                    })?;
                    Ok((
                        response.map(|body| body.map_err(HttpError::from).boxed_unsync()),
                        Box::new(async { Ok(()) })
                            as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                    ))
                })
            }
            (HttpDecision::Deny { reason }, _) | (_, Err(reason)) => {
                self.deny(reason);
                Box::new(async { Err(HttpError::HttpRequestDenied) })
            }
        }
    }
}
