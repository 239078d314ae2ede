//! Credentials the host attaches to an allowed outbound request; the plugin
//! never sees them.
//!
//! Bearer and basic credentials become the `Authorization` header. An AWS
//! SigV4 credential is applied once the guest has written the whole body
//! (at most [`MAX_SIGNED_BODY_BYTES`]): the host hashes it and signs the
//! method, path, query, `host`, `content-type` and body, replacing any
//! `authorization` or `x-amz-*` signing header the guest set.

use crate::grants::Credential;
use bytes::Bytes;
use http::HeaderMap;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use http_body_util::BodyExt;
use std::time::SystemTime;
use wasmtime_wasi_http::WasiBody;

/// The largest request body the host buffers to sign (SigV4 hashes it).
pub const MAX_SIGNED_BODY_BYTES: usize = 1024 * 1024;

/// Set the `Authorization` header a bearer or basic credential carries
/// (marked sensitive, so it never reaches a log).
pub(crate) fn authorize(headers: &mut HeaderMap, credential: &Credential) {
    if let Some(value) = credential.authorization()
        && let Ok(mut v) = HeaderValue::from_str(&value)
    {
        v.set_sensitive(true);
        headers.insert(AUTHORIZATION, v);
    }
}

/// Replace the guest's signing headers with a SigV4 signature over the
/// buffered body.
pub(crate) async fn sign_aws(
    request: http::Request<WasiBody>,
    authority: &str,
    credentials: &capstan_sigv4::Credentials,
    scope: &capstan_sigv4::Scope,
) -> Result<http::Request<WasiBody>, String> {
    let (mut parts, mut body) = request.into_parts();
    let mut payload = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the request body to sign it: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if payload.len() + data.len() > MAX_SIGNED_BODY_BYTES {
                return Err(format!(
                    "request body exceeds {MAX_SIGNED_BODY_BYTES} bytes, the most the host signs"
                ));
            }
            payload.extend_from_slice(&data);
        }
    }
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut to_sign = vec![("host", authority)];
    if let Some(ct) = content_type.as_deref() {
        to_sign.push(("content-type", ct));
    }
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let signed = capstan_sigv4::sign(
        &capstan_sigv4::Request {
            method: parts.method.as_str(),
            path_and_query: &path_and_query,
            headers: &to_sign,
            payload: &payload,
        },
        credentials,
        scope,
        SystemTime::now(),
    );
    for name in ["x-amz-date", "x-amz-security-token", "x-amz-content-sha256"] {
        parts.headers.remove(name);
    }
    for (name, value) in signed.headers {
        let mut v = HeaderValue::from_str(&value)
            .map_err(|_| format!("a signed {name} header is not a valid header value"))?;
        v.set_sensitive(name != "x-amz-date");
        parts.headers.insert(HeaderName::from_static(name), v);
    }
    let body = http_body_util::Full::new(Bytes::from(payload))
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(http::Request::from_parts(parts, body))
}
