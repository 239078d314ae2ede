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

mod cassette;
mod sources;

pub use cassette::{
    Cassette, Interaction, Miss, SENSITIVE_HEADERS, TapedBody, TapedCall, TapedRequest,
    TapedResponse, body_diff, key, normalised_body, secrets_in,
};
pub(crate) use sources::TapedSources;
use sources::{TapeMonotonicClock, TapeRandom, TapeWallClock};

use cassette::answers;
use std::sync::{Arc, Mutex};

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

#[cfg(test)]
mod tests {
    use super::*;
    use cassette::tests::request;

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
