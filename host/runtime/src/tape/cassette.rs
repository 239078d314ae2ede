//! What a cassette holds (calls, requests, answers, seeds), how a request
//! is keyed and matched, how two bodies differ, and the scan for secrets.
//! Pure: no I/O, no engine.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Headers never written to a cassette, whoever set them.
pub const SENSITIVE_HEADERS: [&str; 8] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-amz-security-token",
    "x-api-key",
    "x-auth-token",
    "x-amz-content-sha256",
];

/// What the plugin sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TapedRequest {
    pub method: String,
    /// `scheme://authority/path?query`, as the plugin sent it.
    pub url: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    #[serde(flatten)]
    pub body: TapedBody,
    /// A stub written by hand: matches whatever body is sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub any_body: bool,
}

/// What the plugin received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TapedResponse {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    #[serde(flatten)]
    pub body: TapedBody,
}

/// A body: text when it is UTF-8, else base64.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TapedBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

impl TapedBody {
    pub fn of(bytes: &[u8]) -> Self {
        if bytes.is_empty() {
            return TapedBody::default();
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => TapedBody {
                body: Some(text.to_string()),
                body_base64: None,
            },
            Err(_) => TapedBody {
                body: None,
                body_base64: Some(base64_encode(bytes)),
            },
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        match (&self.body, &self.body_base64) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64_decode(b64),
            (None, None) => Vec::new(),
        }
    }
}

/// One request and its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interaction {
    pub request: TapedRequest,
    pub response: TapedResponse,
}

/// One plugin call: which export, the seeds of its clocks and randomness,
/// and its requests in the order they were made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TapedCall {
    pub call: String,
    /// Wall clock at the call's start, nanoseconds since the Unix epoch.
    pub wall_start_ns: u64,
    /// Monotonic clock at the call's start, nanoseconds.
    pub monotonic_start_ns: u64,
    /// Seed of the call's randomness (hex, 32 bytes).
    pub random_seed: String,
    #[serde(default)]
    pub interactions: Vec<Interaction>,
}

/// A recording of a plugin's calls.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cassette {
    /// The plugin's name and digest when it was recorded.
    pub plugin: String,
    pub digest: String,
    /// What the recorder wants to replay with (the command line keeps the
    /// provider config and the machine here). Scanned for secrets too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    pub calls: Vec<TapedCall>,
}

/// Why a request found nothing to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    pub key: String,
    pub closest: Option<String>,
    pub body_diff: Option<String>,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no recorded interaction matches {}", self.key)?;
        match &self.closest {
            Some(c) => write!(f, "; the closest recorded is {c}")?,
            None => write!(f, "; nothing recorded is left for this call")?,
        }
        if let Some(diff) = &self.body_diff {
            write!(f, "; body differs: {diff}")?;
        }
        Ok(())
    }
}

/// The body as matched: JSON re-serialised with sorted keys, else as is.
pub fn normalised_body(bytes: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        // serde_json's maps are sorted (no preserve_order feature).
        Ok(v) if !bytes.is_empty() => serde_json::to_vec(&v).unwrap_or_else(|_| bytes.to_vec()),
        _ => bytes.to_vec(),
    }
}

/// `METHOD host/path?sorted&query #body-hash`.
pub fn key(request: &TapedRequest) -> String {
    let rest = request
        .url
        .split_once("://")
        .map_or(request.url.as_str(), |(_, r)| r);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    params.sort_unstable();
    let query = if params.is_empty() {
        String::new()
    } else {
        format!("?{}", params.join("&"))
    };
    let body = request.body.bytes();
    let hash = if request.any_body {
        "any".to_string()
    } else if body.is_empty() {
        "empty".to_string()
    } else {
        hex::encode(&Sha256::digest(normalised_body(&body))[..6])
    };
    format!("{} {path}{query} #{hash}", request.method)
}

/// Whether a recorded request answers `sent` (`wanted` is its key).
pub(crate) fn answers(recorded: &TapedRequest, wanted: &str) -> bool {
    let recorded_key = key(recorded);
    if recorded.any_body {
        return recorded_key.split(" #").next() == wanted.split(" #").next();
    }
    recorded_key == wanted
}

/// The first lines where two bodies differ, as `-recorded +sent`.
pub fn body_diff(recorded: &[u8], sent: &[u8]) -> Option<String> {
    let pretty = |b: &[u8]| match serde_json::from_slice::<serde_json::Value>(b) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    };
    let (old, new) = (pretty(recorded), pretty(sent));
    if old == new {
        return None;
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut out = Vec::new();
    for i in 0..old.len().max(new.len()) {
        let (o, n) = (old.get(i), new.get(i));
        if o != n {
            if let Some(o) = o {
                out.push(format!("-{}", o.trim()));
            }
            if let Some(n) = n {
                out.push(format!("+{}", n.trim()));
            }
        }
        if out.len() >= 6 {
            break;
        }
    }
    Some(out.join(" "))
}

/// The cassette's text with every loaded secret looked for: raw, base64
/// (standard and URL-safe, padded or not) and URL-encoded. Returns the
/// slots whose secret is in it (never the secret).
pub fn secrets_in(text: &str, secrets: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for (slot, values) in secrets {
        let leaked = values.iter().filter(|v| v.len() >= 4).any(|v| {
            let forms = [
                v.clone(),
                base64_encode(v.as_bytes()),
                base64_encode(v.as_bytes())
                    .trim_end_matches('=')
                    .to_string(),
                base64_encode(v.as_bytes())
                    .replace('+', "-")
                    .replace('/', "_")
                    .trim_end_matches('=')
                    .to_string(),
                url_encode(v),
            ];
            forms
                .iter()
                .any(|f| !f.is_empty() && text.contains(f.as_str()))
        });
        if leaked {
            found.push(slot.clone());
        }
    }
    found
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn request(method: &str, url: &str, body: &str) -> TapedRequest {
        TapedRequest {
            method: method.into(),
            url: url.into(),
            headers: vec![],
            body: TapedBody::of(body.as_bytes()),
            any_body: false,
        }
    }

    #[test]
    fn keys_ignore_query_order_and_json_key_order() {
        let a = request("POST", "http://h:1/v1/i?b=2&a=1", r#"{"x":1,"y":2}"#);
        let b = request("POST", "http://h:1/v1/i?a=1&b=2", r#"{"y":2, "x":1}"#);
        assert_eq!(key(&a), key(&b));
        assert!(
            key(&a).starts_with("POST h:1/v1/i?a=1&b=2 #"),
            "{}",
            key(&a)
        );
        let c = request("POST", "http://h:1/v1/i?a=1&b=2", r#"{"x":1,"y":3}"#);
        assert_ne!(key(&a), key(&c));
        assert!(key(&request("GET", "http://h/x", "")).ends_with("#empty"));
    }

    #[test]
    fn bodies_round_trip_as_text_or_base64() {
        for bytes in [&b"plain text"[..], &[0u8, 159, 146, 150, 255][..], &b""[..]] {
            assert_eq!(TapedBody::of(bytes).bytes(), bytes);
        }
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
        assert_eq!(base64_decode("aGVsbG8="), b"hello");
    }

    #[test]
    fn a_secret_in_any_encoding_is_found_and_named_by_slot() {
        let secrets = BTreeMap::from([
            ("cloud".to_string(), vec!["s3cr3t/token+x".to_string()]),
            ("aws".to_string(), vec!["AKIDEXAMPLE".to_string()]),
        ]);
        assert!(secrets_in("nothing here", &secrets).is_empty());
        assert_eq!(secrets_in("a s3cr3t/token+x b", &secrets), ["cloud"]);
        assert_eq!(
            secrets_in(&base64_encode(b"s3cr3t/token+x"), &secrets),
            ["cloud"]
        );
        assert_eq!(secrets_in("q=s3cr3t%2Ftoken%2Bx", &secrets), ["cloud"]);
        assert_eq!(secrets_in("Credential=AKIDEXAMPLE/2026", &secrets), ["aws"]);
    }
}
