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

use crate::grants::{Grants, HttpDecision, decide};
use capstan_manifest::{Destination, HttpCapability};
use http::header::{AUTHORIZATION, HOST, HeaderValue};
use http_body_util::BodyExt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// Per-call HTTP gate.
#[derive(Debug)]
pub(crate) struct HttpGate {
    pub(crate) plugin: Arc<str>,
    pub(crate) declared: Arc<[HttpCapability]>,
    pub(crate) grants: Arc<Grants>,
    /// The first denial of this call.
    pub(crate) denial: Arc<Mutex<Option<String>>>,
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
                Box::new(async move {
                    let (response, io) =
                        wasmtime_wasi_http::default_send_request(request, options).await?;
                    Ok((
                        response.map(BodyExt::boxed_unsync),
                        Box::new(io) as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
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
