//! `capstan:plugin/http` (contract 0.3.0): one outbound request per host
//! call, request in and whole response out.
//!
//! The request is checked for shape here (method, absolute URL, header names
//! and values, header size, forbidden headers), then handed to the very
//! function every `wasi:http` request goes through
//! ([`crate::http::HttpGate`]'s `send_request`), so the gate, the grants,
//! the credential, SigV4 signing, the request budgets, the quota, the
//! cassette and the pooled client are the same code, not a copy. What
//! `wasi:http` makes the guest do in a dozen crossings (fields, request,
//! body stream, future, response, body stream) is one here, and the
//! response body is read by the host, bounded by [`MAX_RESPONSE_BODY_BYTES`].

use crate::call::CallState;
use crate::limits::{MAX_FIELDS_BYTES, MAX_RESPONSE_BODY_BYTES};
use crate::wit_http::{Error as WitError, Request, Response};
use http::{HeaderName, HeaderValue, Method, Uri};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, WasiHttpHooks};

impl crate::wit_http::Host for CallState {
    async fn send(&mut self, request: Request) -> wasmtime::Result<Result<Response, WitError>> {
        // As `wasi:http`'s header map: more than it may hold ends the call.
        if fields_size(&request.headers) > MAX_FIELDS_BYTES {
            wasmtime::bail!("total size of fields exceeds limit");
        }
        Ok(self.send_checked(request).await)
    }
}

impl CallState {
    async fn send_checked(&mut self, request: Request) -> Result<Response, WitError> {
        let request = shaped(&mut self.http, request)?;
        let no_body_task: Box<dyn Future<Output = Result<(), HttpError>> + Send> =
            Box::new(async { Ok(()) });
        let answer = Box::into_pin(self.http.send_request(request, None, no_body_task)).await;
        let (response, _done) = match answer {
            Ok(answer) => answer,
            Err(code) => return Err(refusal(code)),
        };
        let (parts, body) = response.into_parts();
        // The in-flight slot rides on the body; it is released once read.
        let body = match http_body_util::Limited::new(body, MAX_RESPONSE_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e)
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return Err(WitError::TooLarge);
            }
            Err(e) => return Err(WitError::Transport(format!("reading the response: {e}"))),
        };
        Ok(Response {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_string(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: Vec::from(body),
        })
    }
}

/// The request as `wasi:http` would have built it, or why it is not one:
/// the same header rules (forbidden names), and the host's
/// `content-length` from the body.
fn shaped(
    hooks: &mut crate::http::HttpGate,
    request: Request,
) -> Result<http::Request<wasmtime_wasi_http::WasiBody>, WitError> {
    let invalid = |field: &str, why: String| WitError::InvalidRequest(format!("{field}: {why}"));
    let method = Method::from_bytes(request.method.as_bytes()).map_err(|_| {
        invalid(
            "method",
            format!("`{}` is not an HTTP method", request.method),
        )
    })?;
    let uri: Uri = request
        .url
        .parse()
        .map_err(|e| invalid("url", format!("`{}` is not a URL: {e}", request.url)))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => {}
        _ => {
            return Err(invalid(
                "url",
                format!(
                    "`{}` is not an absolute http:// or https:// URL",
                    request.url
                ),
            ));
        }
    }
    let mut builder = http::Request::builder().method(method).uri(uri);
    for (name, value) in &request.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("headers", format!("`{name}` is not a header name")))?;
        if hooks.is_forbidden_header(&header) {
            return Err(invalid(
                "headers",
                format!("`{header}` is set by the host, not the plugin"),
            ));
        }
        if header == http::header::CONTENT_LENGTH {
            continue;
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            invalid(
                "headers",
                format!("the value of `{name}` is not a header value"),
            )
        })?;
        builder = builder.header(header, value);
    }
    let body = http_body_util::Full::new(bytes::Bytes::from(request.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    builder
        .body(body)
        .map_err(|e| invalid("request", e.to_string()))
}

/// The size of `headers` as `wasi:http`'s header map accounts it (each
/// distinct name once, each value, each with its entry's own size), so the
/// same headers hit [`MAX_FIELDS_BYTES`] through either interface.
fn fields_size(headers: &[(String, String)]) -> usize {
    let mut names = std::collections::HashSet::new();
    headers
        .iter()
        .map(|(name, value)| {
            let name_size = if names.insert(name.to_ascii_lowercase()) {
                name.len() + size_of::<HeaderName>()
            } else {
                0
            };
            name_size + value.len() + size_of::<HeaderValue>()
        })
        .sum()
}

/// What the plugin is told of a request that got no response; the reason
/// of a refusal stays with the host, which reports it with the call.
fn refusal(code: HttpError) -> WitError {
    match code {
        HttpError::HttpRequestDenied => WitError::Denied,
        HttpError::ConnectionLimitReached => WitError::LimitReached,
        HttpError::ConnectionRefused => WitError::ConnectionRefused,
        other => WitError::Transport(format!("{other:?}")),
    }
}
