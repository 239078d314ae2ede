//! Instances made ready before the call.
//!
//! Instantiating a component is most of what a pure call costs (tens of µs
//! on a host with nested paging). So after a call has released its
//! instance, the runtime builds the next one for the same plugin revision
//! and place (its call thread, or the callers' threads for pure calls)
//! right away, in a task of its own on the executor the call ran on, off
//! the caller's path, and the next call there takes it. Isolation is
//! unchanged: a ready instance has served no call, serves exactly one, and
//! is then dropped like any other.
//!
//! What is the call's, not the instance's, is armed when it is taken
//! ([`crate::Plugin`]'s `arm`): the call's name, deadline, hostcall
//! budget, request budget, quota, outbound gate, observer, log sink and
//! this thread's connection pool. While it waits, nothing can leave it:
//! its request budget is zero, and an instance whose instantiation tried a
//! request (or hit any limit) is dropped rather than kept. Taped calls
//! (record and replay) never take one and never make one, since their
//! clocks and randomness are the tape's from the start.
//!
//! Each revision keeps at most one ready instance per call thread, plus
//! one for calls made on their callers' threads; each holds one of the
//! runtime's ready permits, which the instance pool has room for on top of
//! the call slots, so a ready instance never takes a call's room. Dropping
//! the last handle on a revision drops its ready instances.

use crate::call::CallState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::Store;
use wasmtime::component::Instance;

/// One instance made before its call.
pub(crate) struct Ready {
    pub(crate) store: Store<CallState>,
    pub(crate) instance: Instance,
    /// One of the runtime's ready permits, given back when the instance is
    /// taken (its call holds a call slot then) or dropped.
    pub(crate) permit: tokio::sync::OwnedSemaphorePermit,
    /// Counts it among the runtime's ready instances while it waits.
    pub(crate) counted: Counted,
}

/// One instance counted as ready (`Runtime::ready_instances`) until
/// dropped.
pub(crate) struct Counted(Arc<AtomicUsize>);

impl Counted {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A revision's ready instances: one place per call thread, and a last one
/// for calls on their callers' threads.
pub(crate) struct ReadyInstances {
    places: Box<[Mutex<Option<Ready>>]>,
}

impl std::fmt::Debug for ReadyInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyInstances")
            .field("places", &self.places.len())
            .field("ready", &self.count())
            .finish()
    }
}

impl ReadyInstances {
    /// Places for `call_threads` call threads and the callers' threads.
    pub(crate) fn new(call_threads: usize) -> Self {
        ReadyInstances {
            places: (0..=call_threads).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// The place of the current thread: its call thread's, or the callers'.
    pub(crate) fn here(&self) -> usize {
        crate::workers::call_thread_index()
            .filter(|i| *i + 1 < self.places.len())
            .unwrap_or(self.places.len() - 1)
    }

    fn place(&self, at: usize) -> std::sync::MutexGuard<'_, Option<Ready>> {
        self.places[at.min(self.places.len() - 1)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Take the instance ready at `at`, if there is one.
    pub(crate) fn take(&self, at: usize) -> Option<Ready> {
        self.place(at).take()
    }

    /// Whether an instance is ready at `at`.
    pub(crate) fn is_ready(&self, at: usize) -> bool {
        self.place(at).is_some()
    }

    /// Keep `ready` at `at`, unless one already is there (then `ready` is
    /// dropped, its slot and permit with it).
    pub(crate) fn put(&self, at: usize, ready: Ready) {
        let refused = {
            let mut place = self.place(at);
            match *place {
                None => {
                    *place = Some(ready);
                    None
                }
                Some(_) => Some(ready),
            }
        };
        drop(refused);
    }

    /// How many instances are ready.
    pub(crate) fn count(&self) -> usize {
        (0..self.places.len())
            .filter(|at| self.is_ready(*at))
            .count()
    }
}
