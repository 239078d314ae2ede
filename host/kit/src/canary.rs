//! A plugin revision on trial beside the serving one: [`Canary`] holds it
//! with the objects (Machines, Addons) the Plugin controller gave it, the
//! objects that failed their health check in the current window, and the
//! [`CallCounts`] each revision's calls add to. The Machine controller and
//! the addon engine route by it; while it shadows ([`shadowing`]) they
//! mirror side-effect-free calls to it and count whether its answers agree
//! with the serving revision's ([`agrees`]). The decisions are
//! `capstan_planner::canary`'s.

use crate::provider_error::ProviderError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A canary revision (`P`: a provider, an addon plugin) and the objects
/// (Machines, Addons) it serves.
#[derive(Debug)]
pub struct Canary<P> {
    /// The canary revision.
    pub serving: P,
    /// Its calls since its window began.
    pub counts: Arc<CallCounts>,
    /// The uids of the objects it serves, and of every object the Plugin
    /// controller gave to it or to the stable revision.
    machines: RwLock<Assignment>,
    /// Shadowing: it serves no object, and the stable revision's
    /// side-effect-free calls are mirrored to it.
    shadow: std::sync::atomic::AtomicBool,
    /// Objects that failed their health check in this window: the
    /// canary's, the stable revision's.
    unhealthy: std::sync::Mutex<(
        std::collections::BTreeSet<String>,
        std::collections::BTreeSet<String>,
    )>,
}

impl<P> Canary<P> {
    /// A canary serving no object yet.
    pub fn new(serving: P) -> Self {
        Self::counted(serving, Arc::default())
    }

    /// A canary serving no object yet whose calls are counted in `counts`
    /// (the revision's own, where the code that calls it counts them).
    pub fn counted(serving: P, counts: Arc<CallCounts>) -> Self {
        Canary {
            serving,
            counts,
            machines: RwLock::default(),
            shadow: Default::default(),
            unhealthy: Default::default(),
        }
    }

    /// Shadow the stable revision (`true`) or serve objects.
    pub fn set_shadow(&self, shadow: bool) {
        self.shadow.store(shadow, Ordering::Relaxed);
    }

    /// Whether it shadows the stable revision.
    pub fn is_shadow(&self) -> bool {
        self.shadow.load(Ordering::Relaxed)
    }

    /// Whether it serves the object with this uid.
    pub fn serves(&self, uid: &str) -> bool {
        self.machines
            .read()
            .expect("canary lock")
            .serves
            .contains(uid)
    }

    /// Note an object that failed its health check in this window, as the
    /// canary's (`true`) or the stable revision's.
    pub fn note_unhealthy(&self, uid: &str, canary: bool) {
        let mut seen = self.unhealthy.lock().expect("canary lock");
        let side = if canary { &mut seen.0 } else { &mut seen.1 };
        side.insert(uid.to_string());
    }

    /// How many objects of the canary and of the stable revision failed
    /// their health check since the last time this was asked.
    pub fn take_unhealthy(&self) -> (u64, u64) {
        let mut seen = self.unhealthy.lock().expect("canary lock");
        let counts = (seen.0.len() as u64, seen.1.len() as u64);
        *seen = Default::default();
        counts
    }

    /// Count one mirrored call of a shadow step: an error when the
    /// canary's answer disagreed with the stable revision's.
    pub fn record_mirrored(&self, agreed: bool) {
        self.counts.record_outcome("shadow", !agreed);
    }

    /// Compare a mirrored call's answers (a provider's, an updater's, a
    /// bootstrap plugin's) and count it ([`agrees`], errors alike by their
    /// kind). A canary call the host's quota held back is not its doing
    /// and is not counted.
    pub fn compare<T>(
        &self,
        stable: &Result<T, ProviderError>,
        canary: &Result<T, ProviderError>,
        same: impl Fn(&T, &T) -> bool,
    ) {
        if matches!(canary, Err(ProviderError::Quota { .. })) {
            return;
        }
        self.record_mirrored(agrees(stable, canary, same, |a, b| a.kind() == b.kind()));
    }

    /// Whether the object with this uid was given to it or to the stable
    /// revision.
    pub fn decided(&self, uid: &str) -> bool {
        self.machines
            .read()
            .expect("canary lock")
            .considered
            .contains(uid)
    }

    /// Serve exactly `serves` (uids), out of `considered`.
    pub fn assign(
        &self,
        serves: impl IntoIterator<Item = String>,
        considered: impl IntoIterator<Item = String>,
    ) {
        *self.machines.write().expect("canary lock") = Assignment {
            serves: serves.into_iter().collect(),
            considered: considered.into_iter().collect(),
        };
    }
}

/// The canary in `slot` if it shadows the serving revision (its calls are
/// to be mirrored, never served).
pub fn shadowing<P>(slot: &RwLock<Option<Arc<Canary<P>>>>) -> Option<Arc<Canary<P>>> {
    slot.read()
        .expect("canary lock")
        .clone()
        .filter(|c| c.is_shadow())
}

/// Whether a shadowing canary's answer to a mirrored call agrees with the
/// stable revision's: the same value (by `same`), or failures alike (by
/// `same_error`). When only the stable revision failed (the cloud, say)
/// there is nothing to hold against the canary.
pub fn agrees<T, E>(
    stable: &Result<T, E>,
    canary: &Result<T, E>,
    same: impl Fn(&T, &T) -> bool,
    same_error: impl Fn(&E, &E) -> bool,
) -> bool {
    match (stable, canary) {
        (Ok(a), Ok(b)) => same(a, b),
        (Err(a), Err(b)) => same_error(a, b),
        (Err(_), Ok(_)) => true,
        (Ok(_), Err(_)) => false,
    }
}

/// Which objects a canary serves, out of which the Plugin controller
/// looked at.
#[derive(Debug, Default)]
struct Assignment {
    serves: std::collections::BTreeSet<String>,
    considered: std::collections::BTreeSet<String>,
}

/// Calls one revision made, counted until taken.
#[derive(Debug, Default)]
pub struct CallCounts {
    calls: AtomicU64,
    errors: AtomicU64,
    failed_creates: AtomicU64,
}

impl CallCounts {
    /// Count a call's outcome. Calls the host's quota held back are not
    /// the revision's doing and are not counted; nor is `not found`, the
    /// answer for an instance already gone.
    pub fn record<T>(&self, function: &str, result: &Result<T, ProviderError>) {
        match result {
            Err(ProviderError::Quota { .. }) => {}
            Ok(_) | Err(ProviderError::NotFound(_)) => self.record_outcome(function, false),
            Err(_) => self.record_outcome(function, true),
        }
    }

    /// Count one call of `function` that failed or not.
    pub fn record_outcome(&self, function: &str, failed: bool) {
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
            if function == "create" {
                self.failed_creates.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, starting again from zero.
    pub fn take(&self) -> capstan_api::CallTally {
        capstan_api::CallTally {
            calls: self.calls.swap(0, Ordering::Relaxed),
            errors: self.errors.swap(0, Ordering::Relaxed),
            failed_creates: self.failed_creates.swap(0, Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// The counts so far.
    pub fn peek(&self) -> capstan_api::CallTally {
        capstan_api::CallTally {
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            failed_creates: self.failed_creates.load(Ordering::Relaxed),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn quota() -> ProviderError {
        ProviderError::Quota {
            message: String::new(),
            retry_after: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_mirrored_answer_counts_an_error_only_when_the_canary_is_worse_or_different() {
        let shadow = Canary::new(());
        let same = |a: &u32, b: &u32| a == b;
        shadow.compare(&Ok(1), &Ok(1), same);
        shadow.compare(&Ok(1), &Ok(2), same);
        shadow.compare(&Ok(1), &Err(ProviderError::Fault("trap".into())), same);
        // Only the stable revision failed: nothing against the canary.
        shadow.compare(&Err(ProviderError::Fault("cloud".into())), &Ok(1), same);
        // Failures of the same kind agree; another kind does not.
        shadow.compare(
            &Err(ProviderError::Fault("a".into())),
            &Err(ProviderError::Fault("b".into())),
            same,
        );
        shadow.compare(
            &Err(ProviderError::Fault("a".into())),
            &Err(ProviderError::InvalidConfig("b".into())),
            same,
        );
        // Held back by the host's quota: not the canary's doing.
        shadow.compare(&Ok(1), &Err(quota()), same);
        let tally = shadow.counts.take();
        assert_eq!((tally.calls, tally.errors), (6, 3));
    }

    #[test]
    fn only_a_shadowing_canary_is_mirrored_to() {
        let slot = RwLock::new(Some(Arc::new(Canary::new(()))));
        assert!(shadowing(&slot).is_none());
        slot.read().unwrap().as_ref().unwrap().set_shadow(true);
        assert!(shadowing(&slot).is_some());
        assert!(shadowing::<()>(&RwLock::new(None)).is_none());
    }
}
