//! [`Expectations`]: creations and deletions a controller issued that its
//! cache has not shown yet, as controller-runtime keeps them. Without them
//! a reconcile right after a create would see too few objects and create
//! duplicates. Unlike Kubernetes' ReplicaSet, which trusts its cache again
//! after a timeout, an overdue expectation is [settled](Expectations::settle)
//! against a consistent read: an API server whose watch lags by more than
//! the timeout (a loaded control plane at thousands of Machines) must not
//! make a set create its missing-looking Machines twice.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What each owner (by key) created or deleted and the cache has not shown.
#[derive(Debug)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
    timeout: Duration,
}

impl Default for Expectations {
    fn default() -> Self {
        Self::with_timeout(EXPECTATION_TIMEOUT)
    }
}

#[derive(Debug, Default, Clone)]
struct Pending {
    created: Vec<String>,
    deleted: Vec<String>,
    since: Option<Instant>,
}

/// How long an unobserved create or delete is waited for before the
/// caller asks the API server whether the cache lags or missed an event.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Where an owner's expectations stand (see [`Expectations::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The cache shows everything the owner did: act on it.
    Satisfied,
    /// Not yet, within the timeout: look again soon.
    Waiting,
    /// Not yet, past the timeout: the cache may lag the API server (then
    /// acting on it would create or delete twice) or have missed an event
    /// for good. Ask the API server and [`Expectations::settle`].
    Overdue,
}

impl Expectations {
    /// Expectations waited for `timeout` before they are overdue.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            pending: Mutex::default(),
            timeout,
        }
    }

    /// Remember objects `owner` just created / deleted.
    pub fn expect(&self, owner: &str, created: Vec<String>, deleted: Vec<String>) {
        let mut pending = self.pending.lock().expect("expectations lock");
        let entry = pending.entry(owner.to_string()).or_default();
        entry.created.extend(created);
        entry.deleted.extend(deleted);
        entry.since = Some(Instant::now());
    }

    /// Whether the cache shows everything `owner` did: created objects
    /// present, deleted ones gone or marked for deletion. Satisfied ones
    /// are forgotten; overdue ones are kept for [`Expectations::settle`].
    pub fn check(&self, owner: &str, seen: impl Fn(&str) -> Seen) -> Check {
        let mut pending = self.pending.lock().expect("expectations lock");
        let Some(entry) = pending.get_mut(owner) else {
            return Check::Satisfied;
        };
        entry.created.retain(|n| seen(n) == Seen::Absent);
        entry.deleted.retain(|n| seen(n) == Seen::Present);
        if entry.created.is_empty() && entry.deleted.is_empty() {
            pending.remove(owner);
            return Check::Satisfied;
        }
        if entry.since.is_some_and(|s| s.elapsed() > self.timeout) {
            Check::Overdue
        } else {
            Check::Waiting
        }
    }

    /// [`Expectations::check`] for work that is safe to repeat (a delete
    /// is idempotent): an overdue owner trusts its cache again.
    pub fn satisfied(&self, owner: &str, seen: impl Fn(&str) -> Seen) -> bool {
        match self.check(owner, seen) {
            Check::Satisfied => true,
            Check::Waiting => false,
            Check::Overdue => {
                self.forget(owner);
                true
            }
        }
    }

    /// What `owner` still awaits after its last [`Expectations::check`]:
    /// (created, deleted) names, to ask the API server about.
    pub fn unseen(&self, owner: &str) -> (Vec<String>, Vec<String>) {
        let pending = self.pending.lock().expect("expectations lock");
        pending
            .get(owner)
            .map(|e| (e.created.clone(), e.deleted.clone()))
            .unwrap_or_default()
    }

    /// Settle an overdue owner against the API server's own view (`live`,
    /// from consistent reads; `None`: not asked): what the API server
    /// shows and the cache (`cached`) does not, or was not asked about, is
    /// still awaited, with the timeout re-armed, because the cache lags;
    /// the rest is forgotten, because the cache shows the truth (a create
    /// that failed, or an object created and deleted before the cache saw
    /// it). Returns how many are still awaited (0: act on the cache).
    pub fn settle(
        &self,
        owner: &str,
        cached: impl Fn(&str) -> Seen,
        live: impl Fn(&str) -> Option<Seen>,
    ) -> usize {
        let mut pending = self.pending.lock().expect("expectations lock");
        let Some(entry) = pending.get_mut(owner) else {
            return 0;
        };
        entry
            .created
            .retain(|n| cached(n) == Seen::Absent && live(n) != Some(Seen::Absent));
        entry
            .deleted
            .retain(|n| cached(n) == Seen::Present && live(n) != Some(Seen::Present));
        let lagging = entry.created.len() + entry.deleted.len();
        if lagging == 0 {
            pending.remove(owner);
        } else {
            entry.since = Some(Instant::now());
        }
        lagging
    }

    fn forget(&self, owner: &str) {
        self.pending
            .lock()
            .expect("expectations lock")
            .remove(owner);
    }
}

/// How the cache shows an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not in the cache.
    Absent,
    /// In the cache, not being deleted.
    Present,
    /// In the cache with a deletion timestamp.
    Deleting,
}

impl Seen {
    /// How a view (the cache, or a read from the API server) shows an
    /// object: `None` when it is not there.
    pub fn of(object: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>) -> Self {
        match object {
            None => Seen::Absent,
            Some(meta) if meta.deletion_timestamp.is_some() => Seen::Deleting,
            Some(_) => Seen::Present,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_is_awaited_until_the_cache_shows_it() {
        let expectations = Expectations::default();
        assert!(expectations.satisfied("ns/set", |_| Seen::Absent));
        expectations.expect("ns/set", vec!["m1".into()], vec!["m0".into()]);
        // Neither shows yet: m1 not created, m0 not deleting.
        let before = |n: &str| {
            if n == "m1" {
                Seen::Absent
            } else {
                Seen::Present
            }
        };
        assert!(!expectations.satisfied("ns/set", before));
        // m1 appeared, m0 is still there (not deleting yet).
        assert!(!expectations.satisfied("ns/set", |_| Seen::Present));
        // m0 is now deleting: both are seen.
        assert!(expectations.satisfied("ns/set", |n| if n == "m1" {
            Seen::Present
        } else {
            Seen::Deleting
        }));
        // Satisfied once, forgotten.
        assert!(expectations.satisfied("ns/set", |_| Seen::Absent));
    }

    #[test]
    fn an_overdue_create_the_api_server_shows_is_awaited_again() {
        let expectations = Expectations::with_timeout(Duration::ZERO);
        expectations.expect("ns/set", vec!["m1".into(), "m2".into()], vec![]);
        std::thread::sleep(Duration::from_millis(2));
        // The cache shows neither after the timeout.
        assert_eq!(
            expectations.check("ns/set", |_| Seen::Absent),
            Check::Overdue
        );
        // The API server has m1 (the cache lags) but not m2 (deleted
        // before the cache saw it): m1 is still awaited.
        let live = |n: &str| {
            Some(if n == "m1" {
                Seen::Present
            } else {
                Seen::Absent
            })
        };
        assert_eq!(
            expectations.unseen("ns/set"),
            (vec!["m1".to_string(), "m2".to_string()], vec![])
        );
        assert_eq!(expectations.settle("ns/set", |_| Seen::Absent, live), 1);
        // Re-armed, and still overdue (zero timeout) while the cache lags.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(
            expectations.check("ns/set", |_| Seen::Absent),
            Check::Overdue
        );
        // The cache catches up.
        assert_eq!(
            expectations.check("ns/set", |n| if n == "m1" {
                Seen::Present
            } else {
                Seen::Absent
            }),
            Check::Satisfied
        );
    }

    #[test]
    fn an_overdue_delete_the_cache_missed_is_forgotten_once_the_api_server_agrees() {
        let expectations = Expectations::with_timeout(Duration::ZERO);
        expectations.expect("ns/set", vec![], vec!["m0".into()]);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(
            expectations.check("ns/set", |_| Seen::Present),
            Check::Overdue
        );
        // The API server shows it deleting while the cache does not: wait.
        assert_eq!(
            expectations.settle("ns/set", |_| Seen::Present, |_| Some(Seen::Deleting)),
            1
        );
        // Both show it present (the delete never took): act on the cache.
        assert_eq!(
            expectations.settle("ns/set", |_| Seen::Present, |_| Some(Seen::Present)),
            0
        );
        assert_eq!(
            expectations.check("ns/set", |_| Seen::Present),
            Check::Satisfied
        );
    }

    #[test]
    fn names_not_asked_about_stay_awaited() {
        let expectations = Expectations::with_timeout(Duration::ZERO);
        expectations.expect("ns/set", vec!["a".into(), "b".into(), "c".into()], vec![]);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(
            expectations.check("ns/set", |_| Seen::Absent),
            Check::Overdue
        );
        // Asked about `a` (a failed create: absent) and `b` (there: the
        // cache lags), which settles that the set waits; `c` not asked.
        let live = |n: &str| match n {
            "a" => Some(Seen::Absent),
            "b" => Some(Seen::Present),
            _ => None,
        };
        assert_eq!(expectations.settle("ns/set", |_| Seen::Absent, live), 2);
        assert_eq!(
            expectations.unseen("ns/set"),
            (vec!["b".to_string(), "c".to_string()], vec![])
        );
    }

    #[test]
    fn idempotent_work_trusts_the_cache_once_overdue() {
        let expectations = Expectations::with_timeout(Duration::ZERO);
        expectations.expect("ns/owner", vec![], vec!["c".into()]);
        std::thread::sleep(Duration::from_millis(2));
        assert!(expectations.satisfied("ns/owner", |_| Seen::Present));
        assert_eq!(
            expectations.check("ns/owner", |_| Seen::Present),
            Check::Satisfied
        );
    }

    #[test]
    fn within_the_timeout_an_owner_waits() {
        let expectations = Expectations::default();
        expectations.expect("ns/set", vec!["m1".into()], vec![]);
        assert_eq!(
            expectations.check("ns/set", |_| Seen::Absent),
            Check::Waiting
        );
        assert!(!expectations.satisfied("ns/set", |_| Seen::Absent));
    }
}
