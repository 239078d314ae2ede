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

use kube::Resource;
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
    /// A pass that read `obj` (at its resourceVersion) wrote it.
    pub fn wrote(&self, obj: &impl Resource) {
        self.record(&uid(obj), &version(obj));
    }

    /// How long to wait before reconciling `obj` as the cache has it:
    /// `None` once the cache has moved past the last write (or the wait is
    /// over), and the entry is gone.
    pub fn wait(&self, obj: &impl Resource) -> Option<Duration> {
        self.wait_at(&uid(obj), &version(obj), Instant::now())
    }

    /// `obj` is gone (its finalizer removed): nothing to wait for.
    pub fn forget(&self, obj: &impl Resource) {
        self.lock().remove(&uid(obj));
    }

    fn record(&self, uid: &str, resource_version: &str) {
        self.lock().insert(
            uid.to_string(),
            (resource_version.to_string(), Instant::now()),
        );
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn uid(obj: &impl Resource) -> String {
    obj.meta().uid.clone().unwrap_or_default()
}

fn version(obj: &impl Resource) -> String {
    obj.meta().resource_version.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(w: &UnseenWrites, uid: &str, version: &str) -> Option<Duration> {
        w.wait_at(uid, version, Instant::now())
    }

    fn is_empty(w: &UnseenWrites) -> bool {
        w.lock().is_empty()
    }

    #[test]
    fn a_pass_on_the_version_it_wrote_from_waits_and_a_newer_one_goes_on() {
        let w = UnseenWrites::default();
        assert_eq!(wait(&w, "u1", "10"), None, "nothing written");
        w.record("u1", "10");
        let left = wait(&w, "u1", "10").expect("cache still at the read version");
        assert!(left <= UNSEEN_WAIT && left > Duration::from_secs(4));
        assert_eq!(wait(&w, "u2", "10"), None, "other objects are not held");
        assert_eq!(
            wait(&w, "u1", "11"),
            None,
            "the write (or a later one) is seen"
        );
        assert!(is_empty(&w), "seen writes are forgotten");
        assert_eq!(wait(&w, "u1", "10"), None);
    }

    #[test]
    fn the_wait_is_bounded_and_a_gone_object_is_forgotten() {
        let w = UnseenWrites::default();
        w.record("u1", "10");
        let later = Instant::now() + UNSEEN_WAIT;
        assert_eq!(
            w.wait_at("u1", "10", later),
            None,
            "the cache is trusted again"
        );
        assert!(is_empty(&w));
        let mut gone = k8s_openapi::api::core::v1::ConfigMap::default();
        gone.metadata.uid = Some("u2".into());
        gone.metadata.resource_version = Some("7".into());
        w.wrote(&gone);
        assert!(w.wait(&gone).is_some());
        w.forget(&gone);
        assert_eq!(w.wait(&gone), None);
    }
}
