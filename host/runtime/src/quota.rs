//! Per-plugin quotas: what one plugin may take from the host *across* its
//! calls, where [`crate::Limits`] bound each call alone.
//!
//! A [`Quota`] is made once per Plugin and shared by every revision of it
//! that is live at once (attach it with [`crate::Plugin::with_quota`]), so
//! a new revision does not get a fresh allowance. Three bounds, each
//! optional:
//!
//! - **concurrent calls**: a per-plugin semaphore taken before the call's
//!   store is made; a call waits for it at most the queue timeout;
//! - **calls per minute**: a token bucket taken once per call;
//! - **requests per minute**: a token bucket taken by the HTTP gate for
//!   every outbound request.
//!
//! Running out of any of them ends the call with
//! [`crate::Error::QuotaExceeded`], a host decision with a retry-after,
//! never the plugin's fault. [`TokenBucket`] is the pure part, tested with
//! an injected clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The queue timeout when none is set: about a provider call's typical
/// length, so a burst queues briefly instead of failing at once.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

/// How many seconds' worth of a rate a bucket holds: a plugin idle for
/// that long may spend that much at once.
pub const BURST_SECONDS: u32 = 10;

/// What a Plugin may take across its calls (`Plugin.spec.quota`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaSpec {
    /// Calls of the plugin running at once.
    pub concurrent_calls: Option<u32>,
    /// How long a call waits for one of those before it is refused
    /// ([`DEFAULT_QUEUE_TIMEOUT`] when unset).
    pub queue_timeout: Option<Duration>,
    /// Calls started per minute.
    pub calls_per_minute: Option<u32>,
    /// Outbound requests sent per minute, by all calls together.
    pub requests_per_minute: Option<u32>,
}

/// Which quota a call ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    /// No concurrent-call slot freed within the queue timeout.
    ConcurrentCalls,
    /// The calls-per-minute bucket was empty.
    CallsPerMinute,
    /// The requests-per-minute bucket was empty.
    RequestsPerMinute,
}

impl std::fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuotaKind::ConcurrentCalls => "concurrentCalls",
            QuotaKind::CallsPerMinute => "callsPerMinute",
            QuotaKind::RequestsPerMinute => "requestsPerMinute",
        })
    }
}

/// A quota that ran out: which one, its size, and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaHit {
    pub kind: QuotaKind,
    pub size: u32,
    pub retry_after: Duration,
}

/// A token bucket: `per_minute` tokens a minute, holding at most
/// [`BURST_SECONDS`] worth (at least one), full when made.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_minute: u32,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket as of `now`.
    pub fn new(per_minute: u32, now: Instant) -> Self {
        // Whole tokens: the burst is a number of calls or requests.
        let capacity = f64::from((per_minute.saturating_mul(BURST_SECONDS) / 60).max(1));
        TokenBucket {
            per_minute,
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// The most tokens the bucket holds.
    pub fn burst(&self) -> u32 {
        self.capacity as u32
    }

    /// Take one token at `now`, or say how long until one is there. A
    /// clock that goes backwards adds nothing.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        let per_second = f64::from(self.per_minute) / 60.0;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * per_second).min(self.capacity);
        // A hair of tolerance, so float rounding never makes an honest
        // retry-after come up short.
        if self.tokens + 1e-9 >= 1.0 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            return Ok(());
        }
        if per_second <= 0.0 {
            return Err(Duration::from_secs(60));
        }
        let wait = (1.0 - self.tokens) / per_second;
        // Rounded up to the next millisecond, so waiting that long finds
        // the token there.
        Err(Duration::from_millis((wait * 1000.0).ceil() as u64))
    }
}

/// One Plugin's quotas, shared by its live revisions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Quota {
    inner: Arc<QuotaInner>,
}

#[derive(Debug)]
struct QuotaInner {
    spec: QuotaSpec,
    calls: Option<Arc<tokio::sync::Semaphore>>,
    call_rate: Option<Mutex<TokenBucket>>,
    request_rate: Option<Mutex<TokenBucket>>,
}

/// Holds one of a plugin's concurrent-call slots until dropped.
#[derive(Debug)]
pub struct QuotaPermit(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>);

impl Quota {
    /// The quotas of `spec`, all full.
    pub fn new(spec: QuotaSpec) -> Self {
        let now = Instant::now();
        Quota {
            inner: Arc::new(QuotaInner {
                spec,
                calls: spec
                    .concurrent_calls
                    .map(|n| Arc::new(tokio::sync::Semaphore::new(n as usize))),
                call_rate: spec
                    .calls_per_minute
                    .map(|n| Mutex::new(TokenBucket::new(n, now))),
                request_rate: spec
                    .requests_per_minute
                    .map(|n| Mutex::new(TokenBucket::new(n, now))),
            }),
        }
    }

    /// What this quota was made from.
    pub fn spec(&self) -> QuotaSpec {
        self.inner.spec
    }

    /// Calls of the plugin running now, under this quota (0 without a
    /// concurrent-call bound: they are not counted).
    pub fn calls_in_flight(&self) -> u32 {
        match (&self.inner.calls, self.inner.spec.concurrent_calls) {
            (Some(s), Some(n)) => n.saturating_sub(s.available_permits() as u32),
            _ => 0,
        }
    }

    /// Admit one call: a token from the call rate first (refusing at once
    /// costs nothing), then a concurrent-call slot, waited for at most the
    /// queue timeout.
    pub async fn admit_call(&self) -> Result<QuotaPermit, QuotaHit> {
        if let (Some(bucket), Some(size)) =
            (&self.inner.call_rate, self.inner.spec.calls_per_minute)
        {
            let taken = bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(Instant::now());
            if let Err(retry_after) = taken {
                return Err(QuotaHit {
                    kind: QuotaKind::CallsPerMinute,
                    size,
                    retry_after,
                });
            }
        }
        let (Some(calls), Some(size)) = (&self.inner.calls, self.inner.spec.concurrent_calls)
        else {
            return Ok(QuotaPermit(None));
        };
        let wait = self
            .inner
            .spec
            .queue_timeout
            .unwrap_or(DEFAULT_QUEUE_TIMEOUT);
        match tokio::time::timeout(wait, calls.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(QuotaPermit(Some(permit))),
            // Closed never happens (the semaphore is never closed); treat
            // it as full rather than letting the call through unbounded.
            Ok(Err(_)) | Err(_) => Err(QuotaHit {
                kind: QuotaKind::ConcurrentCalls,
                size,
                retry_after: wait.max(Duration::from_millis(100)),
            }),
        }
    }

    /// Admit one outbound request (the HTTP gate asks before sending).
    pub fn admit_request(&self) -> Result<(), QuotaHit> {
        let (Some(bucket), Some(size)) = (
            &self.inner.request_rate,
            self.inner.spec.requests_per_minute,
        ) else {
            return Ok(());
        };
        bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now())
            .map_err(|retry_after| QuotaHit {
                kind: QuotaKind::RequestsPerMinute,
                size,
                retry_after,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_full_bucket_spends_its_burst_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(60, t0);
        assert_eq!(b.burst(), 10, "ten seconds of one a second");
        for _ in 0..10 {
            b.take(t0).unwrap();
        }
        let wait = b.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(1));
        assert!(b.take(at(t0, 999)).is_err());
        b.take(at(t0, 1000)).expect("a token a second later");
    }

    #[test]
    fn a_slow_rate_still_allows_one_call() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1, t0);
        assert_eq!(b.burst(), 1);
        b.take(t0).unwrap();
        assert_eq!(b.take(t0).unwrap_err(), Duration::from_secs(60));
    }

    #[test]
    fn a_zero_rate_admits_one_and_then_nothing() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0, t0);
        b.take(t0).unwrap();
        assert!(b.take(at(t0, 3_600_000)).is_err());
    }

    proptest! {
        /// However takes are spaced (the clock may even step back), no
        /// window from the start admits more than burst + rate × t, and
        /// a refusal's retry-after is honest: taking then succeeds.
        #[test]
        fn no_window_admits_more_than_burst_plus_rate(
            per_minute in 1u32..2000,
            steps in proptest::collection::vec((0u64..3000, any::<bool>()), 1..300),
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(per_minute, t0);
            let burst = b.burst() as f64;
            let mut now_ms = 0u64;
            let mut admitted = 0u64;
            for (advance, back) in steps {
                let when = if back { now_ms.saturating_sub(advance) } else { now_ms + advance };
                now_ms = now_ms.max(when);
                match b.take(at(t0, when)) {
                    Ok(()) => admitted += 1,
                    Err(wait) => {
                        let mut probe = b.clone();
                        let later = now_ms.max(when) + wait.as_millis() as u64;
                        prop_assert!(probe.take(at(t0, later)).is_ok(), "retry-after {wait:?} was too short");
                    }
                }
                let allowed = burst + f64::from(per_minute) * now_ms as f64 / 60_000.0;
                prop_assert!(admitted as f64 <= allowed + 1e-6, "{admitted} > {allowed}");
            }
        }
    }

    #[tokio::test]
    async fn concurrent_calls_never_exceed_the_quota_and_waiters_time_out() {
        let quota = Quota::new(QuotaSpec {
            concurrent_calls: Some(2),
            queue_timeout: Some(Duration::from_millis(50)),
            ..Default::default()
        });
        let a = quota.admit_call().await.unwrap();
        let _b = quota.admit_call().await.unwrap();
        assert_eq!(quota.calls_in_flight(), 2);
        let hit = quota.admit_call().await.unwrap_err();
        assert_eq!((hit.kind, hit.size), (QuotaKind::ConcurrentCalls, 2));
        drop(a);
        let _c = quota.admit_call().await.expect("a freed slot is taken");
        assert_eq!(quota.calls_in_flight(), 2);
    }

    proptest! {
        /// Random interleavings of admissions and releases: the count of
        /// permits held never exceeds the quota, and a call is refused only
        /// while the quota is full.
        #[test]
        fn the_semaphore_never_exceeds_concurrent_calls(
            limit in 1u32..6,
            ops in proptest::collection::vec(any::<bool>(), 1..100),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            rt.block_on(async {
                let quota = Quota::new(QuotaSpec {
                    concurrent_calls: Some(limit),
                    queue_timeout: Some(Duration::from_millis(1)),
                    ..Default::default()
                });
                let mut held = Vec::new();
                for admit in ops {
                    if admit {
                        match quota.admit_call().await {
                            Ok(p) => held.push(p),
                            Err(_) => prop_assert_eq!(held.len() as u32, limit),
                        }
                    } else {
                        held.pop();
                    }
                    prop_assert!(held.len() as u32 <= limit);
                    prop_assert_eq!(quota.calls_in_flight(), held.len() as u32);
                }
                Ok(())
            })?;
        }
    }

    #[test]
    fn requests_are_refused_past_the_rate_with_a_retry_after() {
        let quota = Quota::new(QuotaSpec {
            requests_per_minute: Some(6),
            ..Default::default()
        });
        // Burst: ten seconds of 6 a minute is one request.
        quota.admit_request().unwrap();
        let hit = quota.admit_request().unwrap_err();
        assert_eq!((hit.kind, hit.size), (QuotaKind::RequestsPerMinute, 6));
        assert!(
            hit.retry_after > Duration::from_secs(9),
            "{:?}",
            hit.retry_after
        );
    }
}
