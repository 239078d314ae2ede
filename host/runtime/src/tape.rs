//! Record and replay at the sandbox's edge: a [`Cassette`] holds, per call,
//! what the *plugin* sent and received through the HTTP gate (after the
//! grant check, before the host attaches credentials) and the seeds of its
//! clocks and randomness, so a replay gives the plugin exactly what the
//! recording gave it, in any language, with no cloud and no secret.
//!
//! Start with [`Tape`]: [`Tape::record`] or [`Tape::replay`], handed to a
//! plugin with [`crate::Plugin::with_tape`]. The HTTP gate asks it
//! ([`CallTape`]) for each request; clocks and randomness come from
//! [`CallTape::clocks`].
//!
//! Clocks and randomness under a tape: each read of either clock returns
//! the recorded start plus 1 µs per read so far, and randomness is a ChaCha
//! stream from a recorded seed. The recording saw the same, so replay is
//! exact however many times the plugin reads them.
//!
//! Matching: a request's key is its method, host, path, sorted query and a
//! hash of its normalised body (JSON with sorted keys, else the bytes).
//! Within a call, interactions with the same key are taken first in, first
//! out, and keys in any order; `strict_order` takes them in recorded order
//! only. A request with no match ends the call with [`crate::Error::ReplayMiss`]
//! naming its key, the closest recorded one and how the bodies differ.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
fn answers(recorded: &TapedRequest, wanted: &str) -> bool {
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

/// How a cassette is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapeMode {
    Record,
    Replay { strict_order: bool },
}

/// A cassette being recorded or replayed, shared by a plugin's calls.
#[derive(Debug, Clone)]
pub struct Tape {
    inner: Arc<TapeInner>,
}

#[derive(Debug)]
struct TapeInner {
    mode: TapeMode,
    cassette: Mutex<Cassette>,
    /// Replay: the next recorded call to hand out.
    next_call: Mutex<usize>,
}

impl Tape {
    /// Record calls into a new cassette.
    pub fn record() -> Self {
        Self::new(TapeMode::Record, Cassette::default())
    }

    /// Replay `cassette`'s calls, in order.
    pub fn replay(cassette: Cassette, strict_order: bool) -> Self {
        Self::new(TapeMode::Replay { strict_order }, cassette)
    }

    fn new(mode: TapeMode, cassette: Cassette) -> Self {
        Tape {
            inner: Arc::new(TapeInner {
                mode,
                cassette: Mutex::new(cassette),
                next_call: Mutex::new(0),
            }),
        }
    }

    pub fn mode(&self) -> TapeMode {
        self.inner.mode
    }

    /// The cassette as recorded so far (replay: what is left unused).
    pub fn cassette(&self) -> Cassette {
        self.inner
            .cassette
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replay: recorded interactions no call has used, by call.
    pub fn unused(&self) -> Vec<(usize, String)> {
        let c = self
            .inner
            .cassette
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let used_calls = *self
            .inner
            .next_call
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        c.calls
            .iter()
            .enumerate()
            .flat_map(|(i, call)| {
                let left: Vec<(usize, String)> = if i < used_calls {
                    call.interactions
                        .iter()
                        .map(|x| (i, key(&x.request)))
                        .collect()
                } else {
                    vec![(i, format!("{} (the call was never made)", call.call))]
                };
                left
            })
            .collect()
    }

    /// The tape of one call of `export`: recorded afresh, or the next
    /// recorded call (which must be of the same export).
    pub(crate) fn start_call(
        &self,
        plugin: &str,
        digest: &str,
        export: &str,
    ) -> Result<CallTape, String> {
        let mut cassette = self
            .inner
            .cassette
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match self.inner.mode {
            TapeMode::Record => {
                if cassette.plugin.is_empty() {
                    cassette.plugin = plugin.to_string();
                    cassette.digest = digest.to_string();
                }
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let seed: [u8; 32] = rand10::random();
                cassette.calls.push(TapedCall {
                    call: export.to_string(),
                    wall_start_ns: u64::try_from(now.as_nanos()).unwrap_or(u64::MAX),
                    monotonic_start_ns: monotonic_now(),
                    random_seed: hex::encode(seed),
                    interactions: Vec::new(),
                });
                Ok(CallTape {
                    tape: self.clone(),
                    index: cassette.calls.len() - 1,
                })
            }
            TapeMode::Replay { .. } => {
                let mut next = self
                    .inner
                    .next_call
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let index = *next;
                let Some(recorded) = cassette.calls.get(index) else {
                    return Err(format!(
                        "the cassette holds {} calls; this is call {} ({export})",
                        cassette.calls.len(),
                        index + 1
                    ));
                };
                if recorded.call != export {
                    return Err(format!(
                        "call {} of the cassette is {}, this call is {export}",
                        index + 1,
                        recorded.call
                    ));
                }
                *next += 1;
                Ok(CallTape {
                    tape: self.clone(),
                    index,
                })
            }
        }
    }
}

fn monotonic_now() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One call's part of a [`Tape`].
#[derive(Debug, Clone)]
pub struct CallTape {
    tape: Tape,
    index: usize,
}

impl CallTape {
    pub(crate) fn mode(&self) -> TapeMode {
        self.tape.inner.mode
    }

    fn with_call<T>(&self, f: impl FnOnce(&mut TapedCall) -> T) -> T {
        let mut c = self
            .tape
            .inner
            .cassette
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f(&mut c.calls[self.index])
    }

    /// The call's clocks and randomness.
    pub(crate) fn clocks(&self) -> TapedSources {
        let (wall, mono, seed) =
            self.with_call(|c| (c.wall_start_ns, c.monotonic_start_ns, c.random_seed.clone()));
        let mut bytes = [0u8; 32];
        if let Ok(decoded) = hex::decode(&seed) {
            let n = decoded.len().min(32);
            bytes[..n].copy_from_slice(&decoded[..n]);
        }
        let mut insecure = bytes;
        insecure[0] ^= 1;
        let reads = Arc::new(Mutex::new(0u64));
        let stream = |seed| {
            TapeRandom(<rand10::rngs::StdRng as rand10::SeedableRng>::from_seed(
                seed,
            ))
        };
        TapedSources {
            wall: TapeWallClock {
                start: wall,
                reads: reads.clone(),
            },
            monotonic: TapeMonotonicClock { start: mono, reads },
            secure: stream(bytes),
            insecure: stream(insecure),
            insecure_seed: u128::from_le_bytes(bytes[..16].try_into().unwrap_or_default()),
        }
    }

    /// Record what a request got.
    pub(crate) fn push(&self, interaction: Interaction) {
        self.with_call(|c| c.interactions.push(interaction));
    }

    /// Replay: the recorded answer to `request`, taken off the tape.
    pub(crate) fn take(&self, request: &TapedRequest) -> Result<TapedResponse, Miss> {
        let strict = matches!(self.mode(), TapeMode::Replay { strict_order: true });
        let wanted = key(request);
        self.with_call(|c| {
            let found = if strict {
                c.interactions
                    .first()
                    .filter(|x| answers(&x.request, &wanted))
                    .map(|_| 0)
            } else {
                c.interactions
                    .iter()
                    .position(|x| answers(&x.request, &wanted))
            };
            if let Some(i) = found {
                return Ok(c.interactions.remove(i).response);
            }
            // The closest: the same method and path first, else the next in line.
            let path = |k: &str| k.split(" #").next().unwrap_or("").to_string();
            // In strict order only the next one could have matched.
            let closest = if strict {
                c.interactions.first()
            } else {
                c.interactions
                    .iter()
                    .find(|x| path(&key(&x.request)) == path(&wanted))
                    .or(c.interactions.first())
            };
            Err(Miss {
                key: wanted.clone(),
                closest: closest.map(|x| key(&x.request)),
                body_diff: closest
                    .and_then(|x| body_diff(&x.request.body.bytes(), &request.body.bytes())),
            })
        })
    }
}

/// A taped call's clocks and randomness.
pub(crate) struct TapedSources {
    pub(crate) wall: TapeWallClock,
    pub(crate) monotonic: TapeMonotonicClock,
    pub(crate) secure: TapeRandom,
    pub(crate) insecure: TapeRandom,
    pub(crate) insecure_seed: u128,
}

/// `wasi:clocks/wall-clock` under a tape.
pub(crate) struct TapeWallClock {
    start: u64,
    reads: Arc<Mutex<u64>>,
}

/// `wasi:clocks/monotonic-clock` under a tape.
pub(crate) struct TapeMonotonicClock {
    start: u64,
    reads: Arc<Mutex<u64>>,
}

fn tick(reads: &Mutex<u64>) -> u64 {
    let mut n = reads.lock().unwrap_or_else(|p| p.into_inner());
    *n += 1;
    *n * 1_000
}

impl wasmtime_wasi::HostWallClock for TapeWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_micros(1)
    }
    fn now(&self) -> Duration {
        Duration::from_nanos(self.start.saturating_add(tick(&self.reads)))
    }
}

impl wasmtime_wasi::HostMonotonicClock for TapeMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000
    }
    fn now(&self) -> u64 {
        self.start.saturating_add(tick(&self.reads))
    }
}

/// `wasi:random` under a tape: a ChaCha stream from the recorded seed.
pub(crate) struct TapeRandom(rand10::rngs::StdRng);

impl rand10::TryRng for TapeRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        self.0.try_next_u32()
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0.try_next_u64()
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.try_fill_bytes(dst)
    }
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
mod tests {
    use super::*;

    fn request(method: &str, url: &str, body: &str) -> TapedRequest {
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
    fn replay_is_fifo_within_a_key_any_order_across_keys_and_misses_say_why() {
        let tape = Tape::record();
        let call = tape.start_call("p", "sha256:x", "create").unwrap();
        let answer = |s: u16| TapedResponse {
            status: s,
            headers: vec![],
            body: TapedBody::of(b"{}"),
        };
        let get = request("GET", "http://h/v1/i", "");
        let post = request("POST", "http://h/v1/i", r#"{"name":"a"}"#);
        for (req, status) in [(&get, 200), (&post, 201), (&get, 404)] {
            call.push(Interaction {
                request: req.clone(),
                response: answer(status),
            });
        }
        let replay = Tape::replay(tape.cassette(), false);
        let call = replay.start_call("p", "sha256:x", "create").unwrap();
        assert_eq!(call.take(&post).unwrap().status, 201);
        assert_eq!(call.take(&get).unwrap().status, 200);
        let changed = request("POST", "http://h/v1/i", r#"{"name":"b"}"#);
        let miss = call.take(&changed).unwrap_err();
        assert_eq!(miss.closest.as_deref(), Some(key(&get).as_str()));
        assert_eq!(call.take(&get).unwrap().status, 404);
        assert!(replay.unused().is_empty());
        let err = replay.start_call("p", "sha256:x", "get").unwrap_err();
        assert!(err.contains("holds 1 calls"), "{err}");

        // Strict order: only the next recorded request matches.
        let strict = Tape::replay(tape.cassette(), true);
        let call = strict.start_call("p", "sha256:x", "create").unwrap();
        let miss = call.take(&post).unwrap_err();
        assert!(
            miss.to_string().contains("the closest recorded is GET"),
            "{miss}"
        );
        let miss = Tape::replay(tape.cassette(), false)
            .start_call("p", "d", "create")
            .unwrap()
            .take(&changed)
            .unwrap_err();
        assert!(
            miss.body_diff
                .as_deref()
                .unwrap()
                .contains(r#"-"name": "a" +"name": "b""#),
            "{miss}"
        );
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

    #[test]
    fn taped_clocks_and_randomness_repeat_exactly() {
        let tape = Tape::record();
        let call = tape.start_call("p", "d", "create").unwrap();
        let replayed = Tape::replay(tape.cassette(), false)
            .start_call("p", "d", "create")
            .unwrap();
        use rand10::Rng;
        use wasmtime_wasi::{HostMonotonicClock, HostWallClock};
        let (mut one, mut two) = (call.clocks(), replayed.clocks());
        assert_eq!(
            (
                one.wall.now(),
                one.monotonic.now(),
                one.wall.now(),
                one.secure.next_u64()
            ),
            (
                two.wall.now(),
                two.monotonic.now(),
                two.wall.now(),
                two.secure.next_u64()
            )
        );
        assert!(one.monotonic.now() > 0);
    }
}
