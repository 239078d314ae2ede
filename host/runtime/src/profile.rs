//! Where plugin calls spend their time, summed over every call a
//! [`crate::Runtime`] made: waiting for a call slot, building the store,
//! instantiating, running (guest code and the sandbox's host functions),
//! waiting on outbound HTTP, finishing (limits, stdio, result checks), and,
//! after the caller has its result, releasing the instance to the pool.
//!
//! Always on: a handful of clock reads and relaxed atomic adds per call,
//! noise next to the ~10 µs an instance costs. `capstan-bench-plugin
//! --breakdown` prints the difference of two [`Runtime::call_profile`]
//! snapshots divided by the calls between them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Totals over every call so far (see [`crate::Runtime::call_profile`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallProfile {
    /// Calls finished.
    pub calls: u64,
    /// Waiting for one of the host's call slots.
    pub slot: Duration,
    /// Building the store: WASI and wasi:http contexts, limiter, budgets.
    pub store: Duration,
    /// Instantiating the pre-instantiated component in that store.
    pub instantiate: Duration,
    /// The export running, outbound waits excluded: guest code and the
    /// sandbox's host functions (streams, fields, pollables, the gate).
    pub run: Duration,
    /// From handing a request to the connection pool until its response
    /// headers arrived (the round trip a native client pays too).
    pub outbound: Duration,
    /// Outbound requests sent.
    pub requests: u64,
    /// After the export returned: limit checks, stdio, the result.
    pub finish: Duration,
    /// Whole calls, slot to result.
    pub total: Duration,
    /// Times a call's memories or tables grew after instantiation: each
    /// grow is page-table work (an `mprotect` now and another when the slot
    /// is reused), so a plugin whose initial memory fits its calls has none.
    pub memory_grows: u64,
    /// Calls served by an instance made ready before the call (see
    /// `crate::ready`) rather than instantiated on the caller's path.
    pub prepared: u64,
    /// Calls run on their caller's thread (pure calls, see
    /// `crate::workers`) rather than handed to a call thread.
    pub inline: u64,
    /// Dropping the store, which returns the instance's memories and tables
    /// to the pool (resetting what the call dirtied). CPU every call costs,
    /// but after the caller has its result, so not part of `total`.
    pub release: Duration,
}

/// Every field of two [`CallProfile`]s combined by `$op` (a struct
/// literal, so a new field is a compile error until it is listed here).
macro_rules! fieldwise {
    ($a:expr, $op:tt, $b:expr) => {
        fieldwise!($a, $op, $b; calls, slot, store, instantiate, run, outbound, requests, finish,
            total, memory_grows, prepared, inline, release)
    };
    ($a:expr, $op:tt, $b:expr; $($field:ident),*) => {
        CallProfile { $($field: $a.$field $op $b.$field),* }
    };
}

impl CallProfile {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &CallProfile) -> CallProfile {
        fieldwise!(self, -, earlier)
    }

    /// Each phase's mean per call in µs, named, in call order (`total`,
    /// then `release`, which comes after the caller has its result, last).
    /// Empty when no call finished.
    pub fn mean_us(&self) -> Vec<(&'static str, f64)> {
        if self.calls == 0 {
            return vec![];
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / self.calls as f64;
        vec![
            ("slot", per(self.slot)),
            ("store", per(self.store)),
            ("instantiate", per(self.instantiate)),
            ("run", per(self.run)),
            ("outbound", per(self.outbound)),
            ("finish", per(self.finish)),
            ("total", per(self.total)),
            ("release", per(self.release)),
        ]
    }
}

impl std::ops::Add for CallProfile {
    type Output = CallProfile;
    fn add(self, o: CallProfile) -> CallProfile {
        fieldwise!(self, +, o)
    }
}

/// One call's phases as they are measured.
#[derive(Debug, Default)]
pub(crate) struct CallTimes {
    pub(crate) slot: Duration,
    pub(crate) store: Duration,
    pub(crate) instantiate: Duration,
    /// The export (with instantiation) until it returned.
    pub(crate) export: Duration,
    pub(crate) outbound: Duration,
    pub(crate) requests: u64,
    pub(crate) total: Duration,
    pub(crate) memory_grows: u64,
    /// Served by a ready instance.
    pub(crate) prepared: bool,
    /// Run on the caller's thread.
    pub(crate) inline: bool,
}

/// The runtime's running sums, in nanoseconds.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    calls: AtomicU64,
    slot: AtomicU64,
    store: AtomicU64,
    instantiate: AtomicU64,
    run: AtomicU64,
    outbound: AtomicU64,
    requests: AtomicU64,
    finish: AtomicU64,
    total: AtomicU64,
    memory_grows: AtomicU64,
    prepared: AtomicU64,
    inline: AtomicU64,
    release: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Totals {
    pub(crate) fn add(&self, t: &CallTimes) {
        let run = t.export.saturating_sub(t.instantiate + t.outbound);
        let finish = t.total.saturating_sub(t.slot + t.store + t.export);
        for (sum, d) in [
            (&self.slot, t.slot),
            (&self.store, t.store),
            (&self.instantiate, t.instantiate),
            (&self.run, run),
            (&self.outbound, t.outbound),
            (&self.finish, finish),
            (&self.total, t.total),
        ] {
            sum.fetch_add(nanos(d), Ordering::Relaxed);
        }
        self.requests.fetch_add(t.requests, Ordering::Relaxed);
        self.memory_grows
            .fetch_add(t.memory_grows, Ordering::Relaxed);
        self.prepared
            .fetch_add(u64::from(t.prepared), Ordering::Relaxed);
        self.inline
            .fetch_add(u64::from(t.inline), Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// One call's release, measured after its result was handed back.
    pub(crate) fn add_release(&self, d: Duration) {
        self.release.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CallProfile {
        let d = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        CallProfile {
            calls: self.calls.load(Ordering::Relaxed),
            slot: d(&self.slot),
            store: d(&self.store),
            instantiate: d(&self.instantiate),
            run: d(&self.run),
            outbound: d(&self.outbound),
            requests: self.requests.load(Ordering::Relaxed),
            finish: d(&self.finish),
            total: d(&self.total),
            memory_grows: self.memory_grows.load(Ordering::Relaxed),
            prepared: self.prepared.load(Ordering::Relaxed),
            inline: self.inline.load(Ordering::Relaxed),
            release: d(&self.release),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_to_the_whole_call() {
        let totals = Totals::default();
        let ms = Duration::from_millis;
        totals.add(&CallTimes {
            slot: ms(1),
            store: ms(2),
            instantiate: ms(3),
            export: ms(10),
            outbound: ms(4),
            requests: 1,
            total: ms(14),
            memory_grows: 2,
            prepared: true,
            inline: false,
        });
        let p = totals.snapshot();
        assert_eq!(p.run, ms(3), "export minus instantiation and outbound wait");
        assert_eq!(p.finish, ms(1), "total minus slot, store and export");
        let sum = p.slot + p.store + p.instantiate + p.run + p.outbound + p.finish;
        assert_eq!(sum, p.total);
        assert_eq!((p.memory_grows, p.prepared, p.inline), (2, 1, 0));
        assert_eq!(p.since(&CallProfile::default()), p);
        assert_eq!((p + p).since(&p), p);
        totals.add_release(ms(2));
        let p = totals.snapshot();
        assert_eq!(p.total, ms(14), "the release is not part of the call");
        let means = p.mean_us();
        assert_eq!(means[means.len() - 2], ("total", 14_000.0));
        assert_eq!(means.last(), Some(&("release", 2_000.0)));
        assert!(CallProfile::default().mean_us().is_empty());
    }
}
