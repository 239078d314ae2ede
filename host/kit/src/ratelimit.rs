//! Client-side rate limiting of the controllers' Kubernetes requests, as
//! client-go's `QPS` and `Burst` (controller-runtime's and Cluster API's
//! `--kube-api-qps` / `--kube-api-burst`): a token bucket holding up to
//! `burst` requests, refilled at `qps` per second. A request that finds the
//! bucket empty reserves the next token and waits for it, so requests leave
//! in order and never faster than the rate on average.
//!
//! [`RateLimitLayer`] wraps a client's stack below the leader fence, so a
//! write kept waiting here still counts against the leadership left (it is
//! cut short at the fence's deadline like any other). The election's own
//! client is not limited: a renewal must never queue behind a burst of
//! reconciles.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// A token bucket shared by every clone of a client.
#[derive(Debug)]
pub struct RateLimit {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Tokens available now; negative when later requests reserved tokens
    /// not yet refilled.
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// A bucket of `burst` tokens (at least 1) refilled at `qps` per second
    /// (`qps` must be positive).
    pub fn new(qps: f64, burst: u32) -> Arc<RateLimit> {
        let burst = f64::from(burst.max(1));
        Arc::new(RateLimit {
            qps,
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                last: Instant::now(),
            }),
        })
    }

    /// Take a token: how long the caller must wait before its request may
    /// leave (zero while the bucket has tokens).
    pub fn reserve(&self) -> Duration {
        let mut bucket = self.state.lock().expect("rate limit lock");
        let now = Instant::now();
        let refilled = now.duration_since(bucket.last).as_secs_f64() * self.qps;
        bucket.tokens = (bucket.tokens + refilled).min(self.burst);
        bucket.last = now;
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / self.qps)
        }
    }
}

/// A tower layer that paces requests through a [`RateLimit`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer(pub Arc<RateLimit>);

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;
    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService {
            inner,
            limit: self.0.clone(),
            due: None,
            reserved: false,
        }
    }
}

/// The service [`RateLimitLayer`] wraps around a client's stack. Like
/// tower's own rate limit, it waits in `poll_ready`: a request is called
/// only once its token is due, so the client's buffer hands requests out in
/// order and none overtakes the line.
#[derive(Debug)]
pub struct RateLimitService<S> {
    inner: S,
    limit: Arc<RateLimit>,
    /// The wait for the token reserved for the next call.
    due: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A token is reserved for the next call.
    reserved: bool,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower::Service<http::Request<B>> for RateLimitService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        if !self.reserved {
            self.reserved = true;
            let wait = self.limit.reserve();
            if !wait.is_zero() {
                self.due = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
        if let Some(due) = self.due.as_mut() {
            if due.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.due = None;
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.reserved = false;
        let call = self.inner.call(request);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_leaves_at_once_then_requests_are_paced_at_the_rate() {
        let limit = RateLimit::new(10.0, 3);
        let waits: Vec<Duration> = (0..5).map(|_| limit.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        // The 4th and 5th reserve the next tokens: 100 ms and 200 ms away.
        assert_eq!(waits[3].as_millis(), 100);
        assert_eq!(waits[4].as_millis(), 200);
        // After a quiet second the bucket is full again, never fuller.
        tokio::time::advance(Duration::from_secs(10)).await;
        let waits: Vec<Duration> = (0..4).map(|_| limit.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3].as_millis(), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_delays_requests_past_the_burst() {
        use tower::{Service as _, ServiceExt as _};
        let calls = Arc::new(Mutex::new(Vec::<Instant>::new()));
        let seen = calls.clone();
        let inner = tower::service_fn(move |_: http::Request<()>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(Instant::now());
                Ok::<_, std::convert::Infallible>(())
            }
        });
        let mut service = tower::Layer::layer(&RateLimitLayer(RateLimit::new(2.0, 1)), inner);
        let start = Instant::now();
        for _ in 0..3 {
            service
                .ready()
                .await
                .unwrap()
                .call(http::Request::new(()))
                .await
                .unwrap();
        }
        let at: Vec<u128> = calls
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.duration_since(start).as_millis())
            .collect();
        assert_eq!(at, [0, 500, 1000]);
    }
}
