//! AWS Signature Version 4, as the host applies it to a plugin's outbound
//! request: pure functions from a request and credentials to the headers
//! that sign it. No I/O, no clock (the caller passes the time), so every
//! step is checked against the published AWS test-suite vectors.
//!
//! Start with [`sign`]. The steps it chains are public for tests and for
//! debugging a `SignatureDoesNotMatch`: [`canonical_request`],
//! [`string_to_sign`], [`signing_key`].
//!
//! What is signed: every header the caller passes (at least `host`), plus
//! `x-amz-date` and, with temporary credentials, `x-amz-security-token`.
//! Both are set by the signer; values the caller passed for them are
//! replaced, so a guest cannot choose the date or smuggle its own token.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// The algorithm name in the string to sign and the `Authorization` header.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An access key pair, optionally with a session token (temporary
/// credentials). Its `Debug` never shows the secret or the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Where a signature is valid: the region and service of the credential
/// scope (`us-east-1`, `ec2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub region: String,
    pub service: String,
}

/// The parts of a request that are signed.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `GET`, `POST`, …
    pub method: &'a str,
    /// The path and query as sent (`/`, `/?Action=DescribeInstances`).
    pub path_and_query: &'a str,
    /// The headers to sign, in the order they are sent; names in any case.
    /// Must include `host`.
    pub headers: &'a [(&'a str, &'a str)],
    /// The exact body bytes.
    pub payload: &'a [u8],
}

/// The headers to add to the request: `x-amz-date`, `x-amz-security-token`
/// (with temporary credentials) and `authorization`, in that order.
#[derive(Clone, PartialEq, Eq)]
pub struct Signed {
    pub headers: Vec<(&'static str, String)>,
}

impl fmt::Debug for Signed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| *n).collect();
        f.debug_struct("Signed").field("headers", &names).finish()
    }
}

impl Signed {
    /// One header's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sign `request` at `time` with `credentials` for `scope`.
pub fn sign(
    request: &Request<'_>,
    credentials: &Credentials,
    scope: &Scope,
    time: SystemTime,
) -> Signed {
    sign_with_date(request, credentials, scope, amz_date(time))
}

/// [`sign`] at a given `x-amz-date` (`YYYYMMDDTHHMMSSZ`), e.g. to check a
/// signature a server received.
pub fn sign_with_date(
    request: &Request<'_>,
    credentials: &Credentials,
    scope: &Scope,
    amz_date: String,
) -> Signed {
    let headers = headers_to_sign(request.headers, &amz_date, credentials);
    let (canonical, signed_headers) = canonical_request(request, &headers);
    let to_sign = string_to_sign(&amz_date, scope, &canonical);
    let key = signing_key(&credentials.secret_access_key, &amz_date[..8], scope);
    let signature = hex::encode(hmac(&key, to_sign.as_bytes()));
    let authorization = format!(
        "{ALGORITHM} Credential={}/{}, SignedHeaders={signed_headers}, Signature={signature}",
        credentials.access_key_id,
        credential_scope(&amz_date[..8], scope),
    );
    let mut out = vec![("x-amz-date", amz_date)];
    if let Some(token) = &credentials.session_token {
        out.push(("x-amz-security-token", token.clone()));
    }
    out.push(("authorization", authorization));
    Signed { headers: out }
}

/// The caller's headers without any it may not choose, plus the signer's
/// own `x-amz-date` and session token.
fn headers_to_sign(
    headers: &[(&str, &str)],
    amz_date: &str,
    credentials: &Credentials,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| {
            !["x-amz-date", "x-amz-security-token", "authorization"]
                .iter()
                .any(|own| n.eq_ignore_ascii_case(own))
        })
        .map(|(n, v)| (n.to_ascii_lowercase(), (*v).to_string()))
        .collect();
    out.push(("x-amz-date".into(), amz_date.into()));
    if let Some(token) = &credentials.session_token {
        out.push(("x-amz-security-token".into(), token.clone()));
    }
    out
}

/// The canonical request and the `SignedHeaders` list, for headers already
/// lower-cased (as [`sign`] prepares them).
pub fn canonical_request(request: &Request<'_>, headers: &[(String, String)]) -> (String, String) {
    let (path, query) = match request.path_and_query.split_once('?') {
        Some((p, q)) => (p, q),
        None => (request.path_and_query, ""),
    };
    // Repeated headers join in the order sent; names sort.
    let mut names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut canonical_headers = String::new();
    for name in &names {
        let values: Vec<String> = headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| collapse_spaces(v))
            .collect();
        canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    let signed_headers = names.join(";");
    let canonical = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        canonical_path(path),
        canonical_query(query),
        hex::encode(Sha256::digest(request.payload)),
    );
    (canonical, signed_headers)
}

/// The string to sign for a canonical request.
pub fn string_to_sign(amz_date: &str, scope: &Scope, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{}\n{}",
        credential_scope(&amz_date[..8], scope),
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    )
}

/// The key derived from the secret for one day, region and service.
pub fn signing_key(secret_access_key: &str, date: &str, scope: &Scope) -> Vec<u8> {
    let k_date = hmac(
        format!("AWS4{secret_access_key}").as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, scope.region.as_bytes());
    let k_service = hmac(&k_region, scope.service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

fn credential_scope(date: &str, scope: &Scope) -> String {
    format!("{date}/{}/{}/aws4_request", scope.region, scope.service)
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// Trim and collapse runs of whitespace (including folded lines) to one space.
fn collapse_spaces(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Remove empty, `.` and `..` segments; keep a trailing slash; encode each
/// segment once (decoding what was already encoded first).
fn canonical_path(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::from("/");
    out.push_str(
        &segments
            .iter()
            .map(|s| encode(&decode(s)))
            .collect::<Vec<_>>()
            .join("/"),
    );
    if !segments.is_empty() && (path.ends_with('/') || path.ends_with("/.")) {
        out.push('/');
    }
    out
}

/// Parameters encoded once and sorted by name, then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (encode(&decode(k)), encode(&decode(v)))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encode everything but the unreserved characters.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match escaped {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
pub fn amz_date(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
