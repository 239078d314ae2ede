//! [`Expectations`]: creations and deletions a controller issued that its
//! cache has not shown yet, as controller-runtime keeps them. Without them
//! a reconcile right after a create would see too few objects and create
//! duplicates.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What each owner (by key) created or deleted and the cache has not shown.
#[derive(Debug, Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
}

#[derive(Debug, Default, Clone)]
struct Pending {
    created: Vec<String>,
    deleted: Vec<String>,
    since: Option<Instant>,
}

/// How long an unobserved create or delete is waited for before the cache
/// is trusted again (a watch that lost an event recovers by relisting).
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

impl Expectations {
    /// Remember objects `owner` just created / deleted.
    pub fn expect(&self, owner: &str, created: Vec<String>, deleted: Vec<String>) {
        let mut pending = self.pending.lock().expect("expectations lock");
        let entry = pending.entry(owner.to_string()).or_default();
        entry.created.extend(created);
        entry.deleted.extend(deleted);
        entry.since = Some(Instant::now());
    }

    /// Whether the cache shows everything `owner` did: created objects
    /// present, deleted ones gone or marked for deletion.
    pub fn satisfied(&self, owner: &str, seen: impl Fn(&str) -> Seen) -> bool {
        let mut pending = self.pending.lock().expect("expectations lock");
        let Some(entry) = pending.get_mut(owner) else {
            return true;
        };
        entry.created.retain(|n| seen(n) == Seen::Absent);
        entry.deleted.retain(|n| seen(n) == Seen::Present);
        let done = entry.created.is_empty() && entry.deleted.is_empty();
        let expired = entry
            .since
            .is_some_and(|s| s.elapsed() > EXPECTATION_TIMEOUT);
        if done || expired {
            pending.remove(owner);
            return true;
        }
        false
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
}
