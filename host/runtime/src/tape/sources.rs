//! A taped call's clocks and randomness: each clock read is the recorded
//! start plus 1 µs per read so far, randomness a ChaCha stream from the
//! recorded seed, the same under record and replay.

use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    pub(crate) start: u64,
    pub(crate) reads: Arc<Mutex<u64>>,
}

/// `wasi:clocks/monotonic-clock` under a tape.
pub(crate) struct TapeMonotonicClock {
    pub(crate) start: u64,
    pub(crate) reads: Arc<Mutex<u64>>,
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
pub(crate) struct TapeRandom(pub(crate) rand10::rngs::StdRng);

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
