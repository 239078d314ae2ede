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
//! it read, and those its own earlier writes in the pass produced (a
//! finalizer, `spec.providerID`: the cache may show any of them before
//! the last write); a later pass that finds the cache still at one of
//! them waits for the last write's own watch event instead, for at most
//! [`UNSEEN_WAIT`] (a watch that lost the event recovers by relisting;
//! past the wait the cache is trusted again). Holding back only on the
//! version read let a pass run on the version of a pass's `spec.providerID`
//! patch: it saw no instance recorded and adopted the one it had just
//! created (`InstanceAdopted` for 0.43 of 200 new machines).
//!
//! Versions are only compared for equality, as the API asks.

use kube::Resource;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a write the cache has not shown holds back further passes.
pub const UNSEEN_WAIT: Duration = Duration::from_secs(5);

/// Per object uid: the resourceVersions a writing pass read or passed
/// through, and when it wrote last.
#[derive(Debug, Default)]
pub struct UnseenWrites {
    read: Mutex<HashMap<String, (Vec<String>, Instant)>>,
}

impl UnseenWrites {
    /// A pass that read `obj` (at its resourceVersion) wrote it.
    pub fn wrote(&self, obj: &impl Resource) {
        self.wrote_through(obj, &[]);
    }

    /// A pass that read `obj` wrote it, its own earlier writes having left
    /// it at the resourceVersions `through` first.
    pub fn wrote_through(&self, obj: &impl Resource, through: &[String]) {
        let mut stale = vec![version(obj)];
        stale.extend(through.iter().cloned());
        let now = Instant::now();
        let mut read = self.lock();
        forget_old(&mut read, now);
        read.insert(uid(obj), (stale, now));
    }

    /// `by` (a Machine, say) wrote `obj` (its Node), having read it at its
    /// resourceVersion. Successive writes of one pass each add the version
    /// they started from. Held per writer: another writer's view of `obj`
    /// is not affected.
    pub fn wrote_for(&self, by: &impl Resource, obj: &impl Resource) {
        let now = Instant::now();
        let mut read = self.lock();
        forget_old(&mut read, now);
        let (stale, at) = read.entry(pair(by, obj)).or_insert((Vec::new(), now));
        stale.push(version(obj));
        *at = now;
    }

    /// [`wait`](Self::wait) for what `by` wrote to `obj` (`obj` as the
    /// cache has it: a version the cache has moved past ends the wait).
    pub fn wait_for(&self, by: &impl Resource, obj: &impl Resource) -> Option<Duration> {
        self.wait_at(&pair(by, obj), &version(obj), Instant::now())
    }

    /// Whether `obj` is at a version `by`'s own writes have since moved
    /// past (within the wait). Unlike [`wait_for`](Self::wait_for) it ends
    /// nothing, so it may be asked of an object a write returned, which
    /// says nothing about the cache.
    pub fn superseded_for(&self, by: &impl Resource, obj: &impl Resource) -> bool {
        let read = self.lock();
        read.get(&pair(by, obj))
            .is_some_and(|(stale, at)| at.elapsed() < UNSEEN_WAIT && stale.contains(&version(obj)))
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

    #[cfg(test)]
    fn record(&self, uid: &str, resource_versions: &[&str]) {
        let stale = resource_versions.iter().map(|v| v.to_string()).collect();
        self.lock().insert(uid.to_string(), (stale, Instant::now()));
    }

    fn wait_at(&self, uid: &str, resource_version: &str, now: Instant) -> Option<Duration> {
        let mut read = self.lock();
        let (stale, at) = read.get(uid)?;
        let left = UNSEEN_WAIT.saturating_sub(now.saturating_duration_since(*at));
        if stale.iter().any(|v| v == resource_version) && !left.is_zero() {
            return Some(left);
        }
        read.remove(uid);
        None
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Vec<String>, Instant)>> {
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn uid(obj: &impl Resource) -> String {
    obj.meta().uid.clone().unwrap_or_default()
}

/// Entries past their wait are dropped as new ones come (a Machine
/// deleted before its next pass never asks again).
fn forget_old(read: &mut HashMap<String, (Vec<String>, Instant)>, now: Instant) {
    read.retain(|_, (_, at)| now.saturating_duration_since(*at) < UNSEEN_WAIT);
}

fn pair(by: &impl Resource, obj: &impl Resource) -> String {
    format!("{}/{}", uid(by), uid(obj))
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
        w.record("u1", &["10"]);
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
    fn every_version_the_pass_passed_through_waits_for_its_last_write() {
        let w = UnseenWrites::default();
        let mut read = k8s_openapi::api::core::v1::ConfigMap::default();
        read.metadata.uid = Some("u1".into());
        read.metadata.resource_version = Some("10".into());
        // Read at 10; a spec patch made 11, the status write 12.
        w.wrote_through(&read, &["11".into()]);
        assert!(wait(&w, "u1", "10").is_some(), "the version read");
        assert!(wait(&w, "u1", "11").is_some(), "the pass's own spec patch");
        assert_eq!(wait(&w, "u1", "12"), None, "the last write is seen");
        assert!(is_empty(&w));
    }

    #[test]
    fn a_write_for_one_writer_holds_back_only_that_writer() {
        let w = UnseenWrites::default();
        let object = |uid: &str, version: &str| {
            let mut o = k8s_openapi::api::core::v1::ConfigMap::default();
            o.metadata.uid = Some(uid.into());
            o.metadata.resource_version = Some(version.into());
            o
        };
        let (a, b, node) = (object("a", "1"), object("b", "1"), object("n", "5"));
        // a claims the Node at 5 (making 6), then carries labels (7).
        w.wrote_for(&a, &node);
        w.wrote_for(&a, &object("n", "6"));
        // The Node the last write returned is not superseded, and asking
        // about it does not end the wait for the versions before.
        assert!(!w.superseded_for(&a, &object("n", "7")));
        assert!(w.superseded_for(&a, &node));
        assert!(!w.superseded_for(&b, &node));
        assert!(w.wait_for(&a, &node).is_some(), "a's write is unseen");
        assert!(w.wait_for(&a, &object("n", "6")).is_some());
        assert_eq!(w.wait_for(&b, &node), None, "b never wrote it");
        assert_eq!(w.wait(&node), None, "nor did the Node's own writer");
        assert_eq!(w.wait_for(&a, &object("n", "7")), None, "seen");
    }

    #[test]
    fn the_wait_is_bounded_and_a_gone_object_is_forgotten() {
        let w = UnseenWrites::default();
        w.record("u1", &["10"]);
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
