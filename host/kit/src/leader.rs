//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several
//! replicas only one reconciles.
//!
//! Start with [`Elector::acquire`], which returns once this replica holds
//! the Lease; then run the controllers next to [`Elector::hold`], which
//! renews it and returns only when it is lost; [`Elector::release`] hands it
//! over on shutdown. The timing follows client-go and controller-runtime:
//! a holder renews every retry period and gives up once it could not renew
//! for the renew deadline, which is shorter than the lease duration, so it
//! stops before any other replica may take over. Expiry is judged by how
//! long the Lease has stayed unchanged as seen by this replica (its own
//! clock), never by comparing clocks across machines. [`decide`] is the
//! pure part, tested without a cluster.
//!
//! Leadership is **fenced**: every write the controllers send goes through
//! a [`Fence`] (a layer on their Kubernetes clients, [`FenceLayer`], and
//! the executor of their connection tasks, [`FencedExecutor`]) that lets
//! it out only until the renew deadline counted from when the last
//! successful renewal *started*. The fence is a clock, not a flag someone
//! must remember to lower: a replica that was stopped (SIGSTOP, a long
//! GC pause, a starved executor) finds its writes refused the moment it
//! runs again, before any code notices the Lease is gone. A standby can
//! take over only a lease duration after it saw the last renewal, which
//! the renew deadline (plus a retry period, checked at startup) is shorter
//! than.

use crate::{Error, Metrics, kube_err};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Whether this replica may write: until a moment in time that only a
/// timely renewal moves forward.
#[derive(Debug, Default)]
pub struct Fence {
    until: Mutex<Option<Instant>>,
}

impl Fence {
    /// A closed fence (nothing leaves until leadership is acquired).
    pub fn new() -> Arc<Fence> {
        Arc::default()
    }

    /// How long writes may still leave, if they may.
    pub fn remaining(&self) -> Option<Duration> {
        let until = (*self.until.lock().expect("fence lock"))?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// Whether a write may leave now.
    pub fn allows_writes(&self) -> bool {
        self.remaining().is_some()
    }

    /// Leadership confirmed by a renewal (or acquisition) that started at
    /// `started`: writes may leave until `started + renew_deadline`.
    pub fn confirm(&self, started: Instant, renew_deadline: Duration) {
        let mut until = self.until.lock().expect("fence lock");
        let new = started + renew_deadline;
        if until.is_none_or(|u| u < new) {
            *until = Some(new);
        }
    }

    /// Leadership is over: nothing more leaves.
    pub fn close(&self) {
        *self.until.lock().expect("fence lock") = None;
    }
}

/// A layer for the controllers' Kubernetes clients: reads always pass;
/// writes (anything but GET, HEAD and OPTIONS) pass only while the
/// [`Fence`] allows, and may take no longer than the leadership left.
#[derive(Debug, Clone)]
pub struct FenceLayer(pub Arc<Fence>);

impl<S> tower::Layer<S> for FenceLayer {
    type Service = FenceService<S>;
    fn layer(&self, inner: S) -> FenceService<S> {
        FenceService {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// The service [`FenceLayer`] wraps around a client's stack.
#[derive(Debug, Clone)]
pub struct FenceService<S> {
    inner: S,
    fence: Arc<Fence>,
}

/// A write refused because this replica is not (or no longer) the leader.
#[derive(Debug, thiserror::Error)]
#[error("write refused: this replica does not hold the leader Lease (fenced)")]
pub struct Fenced;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower::Service<http::Request<B>> for FenceService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let reads = matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if reads {
            let call = self.inner.call(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        let Some(left) = self.fence.remaining() else {
            tracing::warn!(method = %request.method(), path = %request.uri().path(), "write refused: not the leader");
            return Box::pin(futures::future::ready(Err(Box::new(Fenced) as BoxError)));
        };
        let call = self.inner.call(request);
        let fence = self.fence.clone();
        Box::pin(async move {
            let mut call = std::pin::pin!(call);
            // The fence is looked at again before every poll: a write still
            // waiting (for a connection, a token) when the process was
            // stopped is refused when it runs again, before it can go on.
            let fenced = std::future::poll_fn(|cx| {
                if !fence.allows_writes() {
                    return Poll::Ready(Err(Box::new(Fenced) as BoxError));
                }
                call.as_mut().poll(cx).map_err(Into::into)
            });
            match tokio::time::timeout(left, fenced).await {
                Ok(result) => result,
                Err(_) => Err(Box::new(Fenced) as BoxError),
            }
        })
    }
}

/// The executor of a fenced client's connections: each connection task
/// stops (closing its connection) the first time it would run after the
/// fence closed. A request is written to the socket by its connection's
/// task, not by the caller, so a write handed over just before the process
/// was stopped would otherwise still go out when it runs again (the e2e
/// test `a_stopped_leader_writes_nothing_once_a_standby_took_over` caught
/// two such). Reads lose their connections too, which is fine: a closed
/// fence means leadership is over and the process is stopping.
#[derive(Debug, Clone)]
pub struct FencedExecutor(pub Arc<Fence>);

type Task = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

impl hyper::rt::Executor<Task> for FencedExecutor {
    fn execute(&self, mut task: Task) {
        let fence = self.0.clone();
        tokio::spawn(std::future::poll_fn(move |cx| {
            if !fence.allows_writes() {
                return Poll::Ready(());
            }
            task.as_mut().poll(cx)
        }));
    }
}

/// A client for `config`, its writes behind `fence` when there is one and
/// every request paced by `rate` when there is one (inside the fence, so
/// time spent waiting for a token counts against the leadership left).
/// Every client that writes for the controllers is made here: the
/// management cluster's and each workload cluster's.
pub fn fenced_client(
    config: kube::Config,
    fence: Option<&Arc<Fence>>,
    rate: Option<&Arc<crate::ratelimit::RateLimit>>,
) -> Result<Client, Error> {
    let built = match fence {
        // Connection tasks stop at the fence too: they, not the callers,
        // write requests to the socket.
        Some(f) => kube::client::ClientBuilder::try_from((config, FencedExecutor(f.clone()))),
        None => kube::client::ClientBuilder::try_from(config),
    };
    let builder = built.map_err(|source| Error::Kube {
        what: "cannot build a Kubernetes client".into(),
        source,
    })?;
    let fence = fence.map(|f| FenceLayer(f.clone()));
    let rate = rate.map(|r| crate::ratelimit::RateLimitLayer(r.clone()));
    Ok(match (fence, rate) {
        (Some(fence), Some(rate)) => builder.with_layer(&rate).with_layer(&fence).build(),
        (Some(fence), None) => builder.with_layer(&fence).build(),
        (None, Some(rate)) => builder.with_layer(&rate).build(),
        (None, None) => builder.build(),
    })
}

/// Timing and identity of the election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Namespace of the Lease (Capstan's own).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (unique per process).
    pub identity: String,
    /// How long a Lease stays valid without renewal (default 15 s).
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up (10 s).
    pub renew_deadline: Duration,
    /// How often candidates retry and the holder renews (2 s).
    pub retry_period: Duration,
}

/// The parts of a Lease that decide who may hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Holder identity (`None` or empty: released).
    pub holder: Option<String>,
    /// Lease duration the holder announced.
    pub duration: Duration,
}

/// What a replica does with the Lease it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create,
    /// Released, expired or already ours: write ourselves in as holder.
    Take,
    /// Another replica holds it: look again after this long at most.
    Wait(Duration),
}

/// What to do with `record`, which has stayed unchanged for `unchanged_for`
/// as this replica observed it.
pub fn decide(record: Option<&Record>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(record) = record else {
        return Decision::Create;
    };
    match record.holder.as_deref() {
        None | Some("") => Decision::Take,
        Some(holder) if holder == me => Decision::Take,
        Some(_) if unchanged_for >= record.duration => Decision::Take,
        Some(_) => Decision::Wait(record.duration - unchanged_for),
    }
}

fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity,
        duration: Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        ),
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    metrics: Metrics,
    fence: Arc<Fence>,
    changed: Arc<Notify>,
    watch: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Elector {
    /// An elector for `config`; it reports through `metrics` (standby until
    /// it leads). It watches the Lease so that a released one is taken at
    /// once rather than at the next retry.
    /// `fence` is opened on acquisition, moved on by each timely renewal,
    /// and closed when the Lease is lost; the elector's own client must not
    /// be fenced.
    pub fn new(
        client: Client,
        config: ElectionConfig,
        metrics: Metrics,
        fence: Arc<Fence>,
    ) -> Elector {
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let stream = watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", config.name)),
        );
        let watch = tokio::spawn(async move {
            stream
                .for_each(|_| async {
                    notify.notify_one();
                })
                .await;
        });
        metrics.set_leading(false);
        Elector {
            api,
            config,
            metrics,
            fence,
            changed,
            watch,
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Wait until this replica holds the Lease. API errors are logged and
    /// retried (a candidate has nothing to lose by waiting).
    pub async fn acquire(&self) {
        let mut seen: Option<(Option<String>, Instant)> = None;
        loop {
            let started = Instant::now();
            let wait = match self.try_acquire(&mut seen).await {
                Ok(None) => {
                    self.fence.confirm(started, self.config.renew_deadline);
                    self.metrics.set_leading(true);
                    tracing::info!(identity = %self.config.identity, lease = %self.lease_name(), "leading");
                    return;
                }
                Ok(Some(wait)) => wait.min(self.config.retry_period),
                Err(error) => {
                    tracing::warn!(%error, "leader election: cannot read or write the Lease; retrying");
                    self.config.retry_period
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.changed.notified() => {}
            }
        }
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    /// One attempt: `Ok(None)` when this replica now holds the Lease,
    /// `Ok(Some(wait))` when another does.
    async fn try_acquire(
        &self,
        seen: &mut Option<(Option<String>, Instant)>,
    ) -> Result<Option<Duration>, Error> {
        let current = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(kube_err(format!("cannot read Lease {}", self.lease_name())))?;
        // Every write (a renewal too) changes the resourceVersion: the time
        // since it last changed is how long the holder has been silent.
        let version = current.as_ref().and_then(|l| l.resource_version());
        let unchanged_for = match seen {
            Some((v, since)) if *v == version => since.elapsed(),
            _ => {
                *seen = Some((version, Instant::now()));
                Duration::ZERO
            }
        };
        let record = current.as_ref().map(record_of);
        match (
            decide(record.as_ref(), &self.config.identity, unchanged_for),
            current,
        ) {
            (Decision::Wait(d), _) => Ok(Some(d)),
            (Decision::Create, _) | (Decision::Take, None) => self.create().await,
            (Decision::Take, Some(lease)) => {
                let transitions = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_transitions)
                    .unwrap_or(0);
                let ours = record.and_then(|r| r.holder).as_deref() == Some(&self.config.identity);
                let mut taken = lease.clone();
                taken.spec = Some(self.spec(if ours { transitions } else { transitions + 1 }));
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &taken)
                    .await
                {
                    Ok(_) => Ok(None),
                    // Another candidate wrote first.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(Duration::ZERO)),
                    Err(e) => Err(kube_err(format!("cannot take Lease {}", self.lease_name()))(e)),
                }
            }
        }
    }

    async fn create(&self) -> Result<Option<Duration>, Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(self.spec(0)),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(Duration::ZERO)),
            Err(e) => Err(kube_err(format!(
                "cannot create Lease {}",
                self.lease_name()
            ))(e)),
        }
    }

    fn spec(&self, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(now()),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Renew the Lease every retry period; return when it is lost: another
    /// replica holds it, a renewal was refused (409), or none that started
    /// within the renew deadline succeeded. The deadline runs on its own
    /// timer, whatever a renewal in flight is doing, and the fence closes
    /// on it by itself. The caller must stop reconciling at once when this
    /// returns.
    pub async fn hold(&self) -> String {
        let why = self.renew_until_lost().await;
        self.fence.close();
        self.metrics.set_leading(false);
        why
    }

    async fn renew_until_lost(&self) -> String {
        let mut last_started = Instant::now();
        let mut last_error = String::from("no renewal yet");
        loop {
            let deadline =
                tokio::time::Instant::from_std(last_started + self.config.renew_deadline);
            let attempt = async {
                tokio::time::sleep(self.config.retry_period).await;
                let started = Instant::now();
                (started, self.renew().await)
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    return format!(
                        "no renewal of Lease {} succeeded within {:?} (renew deadline): {last_error}",
                        self.lease_name(),
                        self.config.renew_deadline
                    );
                }
                (started, result) = attempt => match result {
                    Ok(()) => {
                        last_started = started;
                        self.fence.confirm(started, self.config.renew_deadline);
                    }
                    Err(Lost(why)) => return why,
                    Err(Retry(error)) => {
                        tracing::warn!(%error, "leader election: renewal failed; retrying");
                        last_error = error;
                    }
                }
            }
        }
    }

    async fn renew(&self) -> Result<(), RenewError> {
        let lease = tokio::time::timeout(self.config.retry_period, self.api.get(&self.config.name))
            .await
            .map_err(|_| Retry("reading the Lease timed out".into()))?
            .map_err(|e| match e {
                kube::Error::Api(ref a) if a.code == 404 => {
                    Lost(format!("Lease {} was deleted", self.lease_name()))
                }
                e => Retry(e.to_string()),
            })?;
        let holder = record_of(&lease).holder;
        if holder.as_deref() != Some(&self.config.identity) {
            return Err(Lost(format!(
                "Lease {} is now held by {}",
                self.lease_name(),
                holder.unwrap_or_else(|| "nobody".into())
            )));
        }
        let mut renewed = lease;
        if let Some(spec) = renewed.spec.as_mut() {
            spec.renew_time = Some(now());
        }
        tokio::time::timeout(
            self.config.retry_period,
            self.api
                .replace(&self.config.name, &PostParams::default(), &renewed),
        )
        .await
        .map_err(|_| Retry("renewing the Lease timed out".into()))?
        .map(drop)
        .map_err(|e| match e {
            // Someone else wrote the Lease since it was read: whoever it
            // was, this replica's hold on it is not what it thought.
            kube::Error::Api(ref a) if a.code == 409 => Lost(format!(
                "Lease {} was changed by another replica during renewal",
                self.lease_name()
            )),
            e => Retry(e.to_string()),
        })
    }

    /// Hand the Lease over: clear the holder so a standby takes it at once
    /// instead of waiting for it to expire. Best effort.
    pub async fn release(&self) {
        self.fence.close();
        self.metrics.set_leading(false);
        let result = async {
            let mut lease = self.api.get(&self.config.name).await?;
            if record_of(&lease).holder.as_deref() != Some(&self.config.identity) {
                return Ok(());
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(now());
            }
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
                .map(drop)
        }
        .await;
        match result {
            Ok(()) => tracing::info!(lease = %self.lease_name(), "released the leader Lease"),
            Err(error) => {
                tracing::warn!(%error, "cannot release the leader Lease; it expires on its own")
            }
        }
    }
}

enum RenewError {
    Lost(String),
    Retry(String),
}
use RenewError::{Lost, Retry};

/// A process-unique identity: the host (or pod) name and a random suffix,
/// as client-go does, so a restarted replica is a new candidate.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "capstan".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{:x}{nanos:08x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_opens_from_a_renewal_start_and_closes_by_itself() {
        let fence = Fence::new();
        assert!(!fence.allows_writes(), "closed until leadership");
        let deadline = Duration::from_millis(200);
        fence.confirm(Instant::now(), deadline);
        assert!(fence.allows_writes());
        // A renewal that started earlier never moves the fence back.
        fence.confirm(Instant::now() - Duration::from_secs(10), deadline);
        assert!(fence.allows_writes());
        std::thread::sleep(deadline + Duration::from_millis(20));
        assert!(!fence.allows_writes(), "closed by the clock alone");
        fence.confirm(Instant::now(), deadline);
        fence.close();
        assert!(!fence.allows_writes());
    }

    #[tokio::test]
    async fn fenced_clients_read_always_and_write_only_while_leading() {
        use tower::{Layer, Service, ServiceExt};
        let fence = Fence::new();
        let inner = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>("sent")
        });
        let mut service = FenceLayer(fence.clone()).layer(inner);
        let request = |method: http::Method| {
            http::Request::builder()
                .method(method)
                .uri("/apis/capstan.dev/v1alpha1/machines")
                .body(())
                .unwrap()
        };
        let get = service
            .ready()
            .await
            .unwrap()
            .call(request(http::Method::GET));
        assert_eq!(get.await.unwrap(), "sent");
        let patch = service
            .ready()
            .await
            .unwrap()
            .call(request(http::Method::PATCH));
        let refused = patch.await.unwrap_err();
        assert!(refused.is::<Fenced>(), "{refused}");
        fence.confirm(Instant::now(), Duration::from_secs(5));
        let post = service
            .ready()
            .await
            .unwrap()
            .call(request(http::Method::POST));
        assert_eq!(post.await.unwrap(), "sent");
    }

    /// A write handed over before the fence closed does not go on after:
    /// the caller's future refuses on its next poll, and the connection
    /// task that would write it ends instead of running.
    #[tokio::test]
    async fn nothing_fenced_runs_again_once_the_fence_closed() {
        use tower::{Layer, Service, ServiceExt};
        let fence = Fence::new();
        fence.confirm(Instant::now(), Duration::from_millis(1500));
        // A write that waits (for a connection, say) past the fence.
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let wait = std::sync::Mutex::new(Some(wait));
        let inner = tower::service_fn(move |_: http::Request<()>| {
            let wait = wait.lock().unwrap().take();
            async move {
                if let Some(wait) = wait {
                    let _ = wait.await;
                }
                Ok::<_, std::convert::Infallible>("sent")
            }
        });
        let mut service = FenceLayer(fence.clone()).layer(inner);
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri("/apis/capstan.dev/v1alpha1/machines")
            .body(())
            .unwrap();
        let call = service.ready().await.unwrap().call(request);
        let pending = tokio::spawn(call);
        // A connection task, polled again whenever it is woken.
        let (stop_tx, mut ran) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (wake, mut woken) = tokio::sync::mpsc::unbounded_channel::<()>();
        hyper::rt::Executor::execute(
            &FencedExecutor(fence.clone()),
            Box::pin(async move {
                while woken.recv().await.is_some() {
                    let _ = stop_tx.send(());
                }
            }),
        );
        wake.send(()).unwrap();
        assert!(ran.recv().await.is_some(), "runs while the fence is open");
        while fence.allows_writes() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Woken after the fence closed: the task ends without running.
        let _ = wake.send(());
        assert_eq!(ran.recv().await, None, "the task ended instead");
        let _ = release.send(());
        let refused = pending.await.unwrap().unwrap_err();
        assert!(refused.is::<Fenced>(), "{refused}");
    }

    fn held(by: &str, secs: u64) -> Record {
        Record {
            holder: Some(by.into()),
            duration: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_missing_lease_is_created() {
        assert_eq!(decide(None, "a", Duration::ZERO), Decision::Create);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        for holder in [None, Some(String::new())] {
            let r = Record {
                holder,
                duration: Duration::from_secs(1),
            };
            assert_eq!(decide(Some(&r), "a", Duration::ZERO), Decision::Take);
        }
    }

    #[test]
    fn a_live_lease_of_another_is_waited_for_until_it_expires() {
        let r = held("b", 15);
        assert_eq!(
            decide(Some(&r), "a", Duration::from_secs(4)),
            Decision::Wait(Duration::from_secs(11))
        );
        assert_eq!(
            decide(Some(&r), "a", Duration::from_secs(15)),
            Decision::Take
        );
        assert_eq!(
            decide(Some(&r), "a", Duration::from_secs(40)),
            Decision::Take
        );
    }

    #[test]
    fn our_own_lease_is_ours() {
        assert_eq!(
            decide(Some(&held("a", 15)), "a", Duration::ZERO),
            Decision::Take
        );
    }

    #[test]
    fn identities_differ_between_processes_on_one_host() {
        let a = default_identity();
        std::thread::sleep(Duration::from_millis(1));
        assert_ne!(a, default_identity());
    }
}
