//! Outbound HTTP for plugins, through `capstan:plugin/http` or `wasi:http`.
//!
//! Inside the sandbox, [`SandboxHttp`] sends requests through the host:
//! [`CapstanHttp`] (contract 0.3.0, one host call per request) unless the
//! SDK's default `capstan-http` feature is off, then [`WasiHttp`] (every
//! host). The host
//! lets a request through only if its destination (scheme, host, port) is
//! declared in the plugin manifest *and* granted by the admin; otherwise the
//! request fails with [`HttpError::Denied`] and the whole call is reported as
//! a capability violation. Redirects are never followed for you: a `3xx` is
//! returned as is, and following it is a new request, checked again.
//! Credentials for granted destinations are attached by the host; the plugin
//! never sees them.
//!
//! Provider logic should take an [`HttpClient`] so the same code also runs
//! natively (in benchmarks and unit tests) with another client.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest response body a plugin reads before giving up.
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    /// The method's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// An outgoing request.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    /// Absolute `http://` or `https://` URL.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// A request with no headers and no body.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Request {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
    /// `GET url`.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::Get, url)
    }
    /// `DELETE url`.
    pub fn delete(url: impl Into<String>) -> Self {
        Self::new(Method::Delete, url)
    }
    /// `method url` with a JSON body.
    pub fn json<T: Serialize>(method: Method, url: impl Into<String>, body: &T) -> Self {
        let mut r = Self::new(method, url);
        r.body = serde_json::to_vec(body).unwrap_or_default();
        r.headers
            .push(("content-type".into(), "application/json".into()));
        r
    }
    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// A response, fully read.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// Deserialize the body as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            HttpError::Transport(format!(
                "response body (HTTP {}) is not the expected JSON: {e}",
                self.status
            ))
        })
    }
    /// The body as (lossy) text, for error messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The contract's error for an unexpected answer to `doing`, by status:
    /// 401/403 `unauthorized`, 404 `not-found`, 429 `transient` after its
    /// `Retry-After` seconds (default 1), other 5xx `transient` after 1 s,
    /// anything else `terminal`. The message has the status and the start
    /// of the body.
    pub fn error(&self, doing: &str) -> crate::PluginError {
        use crate::PluginError;
        let body: String = self.text().chars().take(200).collect();
        let message = format!("{doing}: HTTP {} {body}", self.status);
        match self.status {
            401 | 403 => PluginError::unauthorized(message),
            404 => PluginError::not_found(message),
            429 => {
                let secs = self
                    .header("retry-after")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(1)
                    .max(1);
                PluginError::transient(message, secs.saturating_mul(1_000))
            }
            500..=599 => PluginError::transient(message, 1_000),
            _ => PluginError::terminal(message),
        }
    }
}

/// Why a request did not produce a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The host refused the destination (not declared or not granted).
    Denied(String),
    /// The URL is not an absolute http(s) URL.
    InvalidUrl(String),
    /// Connection, TLS or protocol failure.
    Transport(String),
    /// The sandbox's HTTP is not available (native build without a client).
    Unavailable,
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Denied(m) => write!(f, "request denied by the host: {m}"),
            HttpError::InvalidUrl(m) => write!(f, "invalid URL: {m}"),
            HttpError::Transport(m) => write!(f, "HTTP transport error: {m}"),
            HttpError::Unavailable => {
                f.write_str("the sandbox's HTTP is only available inside the Capstan sandbox")
            }
        }
    }
}

impl std::error::Error for HttpError {}

/// Something that sends HTTP requests.
pub trait HttpClient {
    /// Send `request` and read the whole response.
    fn send(&self, request: &Request) -> Result<Response, HttpError>;
}

/// The sandbox's HTTP client (`wasi:http/outgoing-handler`).
#[derive(Debug, Default, Clone, Copy)]
pub struct WasiHttp;

impl HttpClient for WasiHttp {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        #[cfg(target_arch = "wasm32")]
        {
            wasi_send(request)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = request;
            Err(HttpError::Unavailable)
        }
    }
}

/// The sandbox's HTTP client on contract 0.3.0 hosts
/// (`capstan:plugin/http`): one host call per request, where `wasi:http`
/// takes about a dozen. The host applies the same grants, credentials,
/// budgets, quota and gate. A component that uses it needs a 0.3.0 host, and
/// its manifest must say `"contract": "0.3.0"`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CapstanHttp;

impl HttpClient for CapstanHttp {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        #[cfg(target_arch = "wasm32")]
        {
            capstan_send(request)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = request;
            Err(HttpError::Unavailable)
        }
    }
}

/// The sandbox's client this SDK was built for: [`CapstanHttp`] with the
/// default `capstan-http` feature (contract 0.3.0 hosts), [`WasiHttp`]
/// without it (hosts of every contract version). Plugins name this, so
/// the choice is one line in their `Cargo.toml`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SandboxHttp;

impl HttpClient for SandboxHttp {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        #[cfg(feature = "capstan-http")]
        {
            CapstanHttp.send(request)
        }
        #[cfg(not(feature = "capstan-http"))]
        {
            WasiHttp.send(request)
        }
    }
}

#[cfg(target_arch = "wasm32")]
fn capstan_send(request: &Request) -> Result<Response, HttpError> {
    use crate::bindings::http_v3::capstan::plugin0_3_0::http as host;
    let sent = host::send(&host::Request {
        method: request.method.as_str().to_string(),
        url: request.url.clone(),
        headers: request.headers.clone(),
        body: request.body.clone(),
    });
    match sent {
        Ok(response) => Ok(Response {
            status: response.status,
            headers: response.headers,
            body: response.body,
        }),
        Err(host::Error::Denied) => Err(HttpError::Denied(format!(
            "{} is not a destination this plugin may reach",
            request.url
        ))),
        Err(host::Error::InvalidRequest(why)) => Err(HttpError::InvalidUrl(why)),
        Err(host::Error::LimitReached) => Err(HttpError::Transport(
            "this call's outbound request budget is spent".into(),
        )),
        Err(host::Error::TooLarge) => Err(HttpError::Transport(format!(
            "the request headers or the response body of {} are larger than the host takes",
            request.url
        ))),
        Err(host::Error::ConnectionRefused) => Err(HttpError::Transport(format!(
            "connection to {} refused",
            request.url
        ))),
        Err(host::Error::Transport(why)) => Err(HttpError::Transport(why)),
    }
}

/// The parts of an absolute URL that `wasi:http` wants.
#[derive(Debug, PartialEq, Eq)]
pub struct UrlParts<'a> {
    pub https: bool,
    pub authority: &'a str,
    /// Always starts with `/`.
    pub path_and_query: String,
}

/// Split an absolute `http(s)://authority/path?query` URL.
pub fn split_url(url: &str) -> Result<UrlParts<'_>, HttpError> {
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(HttpError::InvalidUrl(format!(
            "`{url}` must start with http:// or https://"
        )));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(HttpError::InvalidUrl(format!("`{url}` has no host")));
    }
    Ok(UrlParts {
        https,
        authority,
        path_and_query: if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        },
    })
}

/// The most `blocking-write-and-flush` takes in one call (WASI 0.2).
#[cfg(target_arch = "wasm32")]
const MAX_WRITE_AND_FLUSH_BYTES: usize = 4096;

/// The most one read of a response body asks for.
#[cfg(target_arch = "wasm32")]
const READ_CHUNK_BYTES: usize = 64 * 1024;

#[cfg(target_arch = "wasm32")]
fn wasi_send(request: &Request) -> Result<Response, HttpError> {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{ErrorCode, OutgoingBody};

    let out = outgoing_request(request)?;
    let body = out
        .body()
        .map_err(|_| HttpError::Transport("request body already taken".into()))?;
    let denied_or = |e: ErrorCode| match e {
        ErrorCode::HttpRequestDenied => HttpError::Denied(format!(
            "{} is not a destination this plugin may reach",
            request.url
        )),
        other => HttpError::Transport(format!("{other:?}")),
    };
    let future = outgoing_handler::handle(out, None).map_err(denied_or)?;
    // A bodiless request (GET, DELETE) may already be on its way once
    // `handle` returns; touching its body stream could then see `closed`.
    if !request.body.is_empty() {
        write_body(&body, &request.body)?;
    }
    OutgoingBody::finish(body, None)
        .map_err(|e| HttpError::Transport(format!("finishing request body: {e:?}")))?;

    // The response is hardly ever there yet: wait first, then take it (one
    // host call fewer than asking first).
    let response = loop {
        future.subscribe().block();
        match future.get() {
            Some(Ok(Ok(r))) => break r,
            Some(Ok(Err(e))) => return Err(denied_or(e)),
            Some(Err(())) => return Err(HttpError::Transport("response already taken".into())),
            None => {}
        }
    };
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let body = read_body(response)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// The request as wasi:http takes it: headers (with the body framed by an
/// exact `content-length`), method, scheme, authority and path.
#[cfg(target_arch = "wasm32")]
fn outgoing_request(request: &Request) -> Result<wasip2::http::types::OutgoingRequest, HttpError> {
    use wasip2::http::types::{Fields, Method as WMethod, OutgoingRequest, Scheme};

    let parts = split_url(&request.url)?;
    let mut headers: Vec<(String, Vec<u8>)> = request
        .headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("content-length"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
        .collect();
    // Always frame the body exactly: without a length, a bodiless DELETE
    // goes out chunked, which some servers answer by closing the connection.
    headers.push((
        "content-length".into(),
        request.body.len().to_string().into_bytes(),
    ));
    let fields = Fields::from_list(&headers)
        .map_err(|e| HttpError::Transport(format!("invalid request header: {e:?}")))?;
    let out = OutgoingRequest::new(fields);
    let method = match request.method {
        Method::Get => WMethod::Get,
        Method::Post => WMethod::Post,
        Method::Put => WMethod::Put,
        Method::Patch => WMethod::Patch,
        Method::Delete => WMethod::Delete,
    };
    let bad = |what: &str| HttpError::InvalidUrl(format!("`{}`: invalid {what}", request.url));
    out.set_method(&method).map_err(|_| bad("method"))?;
    out.set_scheme(Some(if parts.https {
        &Scheme::Https
    } else {
        &Scheme::Http
    }))
    .map_err(|_| bad("scheme"))?;
    out.set_authority(Some(parts.authority))
        .map_err(|_| bad("authority"))?;
    out.set_path_with_query(Some(&parts.path_and_query))
        .map_err(|_| bad("path"))?;
    Ok(out)
}

/// Write the whole request body. Once the host has read `content-length`
/// bytes it may close the stream: `closed` on the final flush means
/// everything was delivered.
#[cfg(target_arch = "wasm32")]
fn write_body(body: &wasip2::http::types::OutgoingBody, bytes: &[u8]) -> Result<(), HttpError> {
    use std::io::Write as _;
    use wasip2::io::streams::StreamError;

    let mut stream = body
        .write()
        .map_err(|_| HttpError::Transport("request body stream unavailable".into()))?;
    let flushed = if bytes.len() <= MAX_WRITE_AND_FLUSH_BYTES {
        // One host call instead of check-write, write and flush.
        stream.blocking_write_and_flush(bytes)
    } else {
        stream
            .write_all(bytes)
            .map_err(|e| HttpError::Transport(format!("writing request body: {e}")))?;
        stream.blocking_flush()
    };
    match flushed {
        Ok(()) | Err(StreamError::Closed) => Ok(()),
        Err(StreamError::LastOperationFailed(e)) => Err(HttpError::Transport(format!(
            "writing request body: {}",
            e.to_debug_string()
        ))),
    }
}

/// The response body, at most [`MAX_RESPONSE_BYTES`].
#[cfg(target_arch = "wasm32")]
fn read_body(response: wasip2::http::types::IncomingResponse) -> Result<Vec<u8>, HttpError> {
    use wasip2::http::types::IncomingBody;
    use wasip2::io::streams::StreamError;

    let incoming = response
        .consume()
        .map_err(|_| HttpError::Transport("response body already taken".into()))?;
    let mut body = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|_| HttpError::Transport("response body stream unavailable".into()))?;
        // Large reads: a small body comes in one host call and the end in
        // a second (`read_to_end` starts with small probing reads).
        loop {
            let room = (MAX_RESPONSE_BYTES + 1 - body.len()).min(READ_CHUNK_BYTES);
            match stream.blocking_read(room as u64) {
                Ok(chunk) => body.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(HttpError::Transport(format!(
                        "reading response body: {}",
                        e.to_debug_string()
                    )));
                }
            }
            if body.len() > MAX_RESPONSE_BYTES {
                break;
            }
        }
    }
    let _ = IncomingBody::finish(incoming);
    if body.len() > MAX_RESPONSE_BYTES {
        return Err(HttpError::Transport(format!(
            "response body exceeds {MAX_RESPONSE_BYTES} bytes"
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_wasi_parts() {
        assert_eq!(
            split_url("http://127.0.0.1:8080/v1/instances?x=1").unwrap(),
            UrlParts {
                https: false,
                authority: "127.0.0.1:8080",
                path_and_query: "/v1/instances?x=1".into()
            }
        );
        assert_eq!(split_url("https://h").unwrap().path_and_query, "/");
        assert_eq!(split_url("https://h?q").unwrap().path_and_query, "/?q");
        assert!(split_url("ftp://h").is_err());
        assert!(split_url("http:///x").is_err());
    }
}
