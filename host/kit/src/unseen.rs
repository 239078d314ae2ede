//! [`UnseenWrites`]: objects a controller wrote whose write its cache has
//! not shown yet.
//!
//! A trigger that arrives while an object is being reconciled (a Node
//! event from the pass's own cordon, say) runs the next pass as soon as
//! this one ends, often before the watch has delivered the status the pass
//! just wrote. That pass would read the old status and repeat the steps it
//! records (a drain's Event, a provider call, the same status write again).
//! Measured with `capstan-bench-scale`: 1.9 Events per deleting machine
//! where one was due. So a pass that wrote remembers the resourceVersion
//! it read; a later pass that finds the cache still at that version waits
//! for the write's own watch event instead, for at most [`UNSEEN_WAIT`]
//! (a watch that lost the event recovers by relisting; past the wait the
//! cache is trusted again).
//!
//! Versions are only compared for equality, as the API asks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a write the cache has not shown holds back further passes.
pub const UNSEEN_WAIT: Duration = Duration::from_secs(5);

/// Per object uid: the resourceVersion a writing pass read, and when.
#[derive(Debug, Default)]
pub struct UnseenWrites {
    read: Mutex<HashMap<String, (String, Instant)>>,
}

impl UnseenWrites {
    /// A pass that read `resource_version` of object `uid` wrote it.
    pub fn wrote(&self, uid: &str, resource_version: &str) {
        self.lock().insert(
            uid.to_string(),
            (resource_version.to_string(), Instant::now()),
        );
    }

    /// How long to wait before reconciling object `uid`, found at
    /// `resource_version` in the cache: `None` once the cache has moved
    /// past the last write (or the wait is over), and the entry is gone.
    pub fn wait(&self, uid: &str, resource_version: &str) -> Option<Duration> {
        self.wait_at(uid, resource_version, Instant::now())
    }

    fn wait_at(&self, uid: &str, resource_version: &str, now: Instant) -> Option<Duration> {
        let mut read = self.lock();
        let (version, at) = read.get(uid)?;
        let left = UNSEEN_WAIT.saturating_sub(now.saturating_duration_since(*at));
        if version == resource_version && !left.is_zero() {
            return Some(left);
        }
        read.remove(uid);
        None
    }

    /// Object `uid` is gone (its finalizer removed): nothing to wait for.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Objects waited for (metrics, tests).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no write is waited for.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_on_the_version_it_wrote_from_waits_and_a_newer_one_goes_on() {
        let w = UnseenWrites::default();
        assert_eq!(w.wait("u1", "10"), None, "nothing written");
        w.wrote("u1", "10");
        let left = w.wait("u1", "10").expect("cache still at the read version");
        assert!(left <= UNSEEN_WAIT && left > Duration::from_secs(4));
        assert_eq!(w.wait("u2", "10"), None, "other objects are not held");
        assert_eq!(
            w.wait("u1", "11"),
            None,
            "the write (or a later one) is seen"
        );
        assert!(w.is_empty(), "seen writes are forgotten");
        assert_eq!(w.wait("u1", "10"), None);
    }

    #[test]
    fn the_wait_is_bounded_and_a_gone_object_is_forgotten() {
        let w = UnseenWrites::default();
        w.wrote("u1", "10");
        let later = Instant::now() + UNSEEN_WAIT;
        assert_eq!(
            w.wait_at("u1", "10", later),
            None,
            "the cache is trusted again"
        );
        assert!(w.is_empty());
        w.wrote("u2", "7");
        w.forget("u2");
        assert_eq!(w.wait("u2", "7"), None);
    }
}
