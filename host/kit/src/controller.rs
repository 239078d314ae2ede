//! One way to run a controller: [`run`] takes the kind it reconciles, what
//! else it watches, its context and its reconcile function, and adds what
//! every controller has — queue-depth bookkeeping, reconcile timing and
//! error metrics, no decision from a half-listed cache, a retry after a
//! failure, graceful shutdown, logging, and fair workers ([`crate::fair`]):
//! the reconciles that run at once are bounded per namespace and per
//! Plugin, not only in total.

use crate::fair::{FairWorkers, Flow};
use crate::{Kind, Kube, Metrics, key_of};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a failed reconcile waits before it is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What a controller reconciles: its name (in logs and metrics), the
/// objects that trigger it, their cache, and how many reconciles may run
/// at once.
pub struct Spec<K: Resource<DynamicType = ()> + Clone + 'static> {
    /// The controller's name.
    pub name: &'static str,
    /// Changes of the kind it reconciles.
    pub trigger: ReflectHandle<K>,
    /// The cache of that kind.
    pub store: Store<K>,
    /// Concurrent reconciles.
    pub concurrency: u16,
    /// Whom a reconcile of an object works for (fair queueing); by
    /// default its namespace.
    pub flow: fn(&K) -> Flow,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::fmt::Debug for Spec<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec")
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Spec<K> {
    /// A controller named `name` over `trigger` (cached in `store`).
    pub fn new(
        name: &'static str,
        trigger: ReflectHandle<K>,
        store: Store<K>,
        concurrency: u16,
    ) -> Self {
        Spec {
            name,
            trigger,
            store,
            concurrency,
            flow: |o| Flow::namespace(o.meta().namespace.clone().unwrap_or_default()),
        }
    }

    /// Queue reconciles by `flow` (for example namespace and Plugin) rather
    /// than by namespace alone.
    pub fn with_flow(mut self, flow: fn(&K) -> Flow) -> Self {
        self.flow = flow;
        self
    }
}

/// Run the controller `spec` until `shutdown` resolves and its in-flight
/// reconciles finish. `watches` adds what else triggers it (a mapping from
/// other kinds, extra streams).
pub async fn run<K, C, E, Fut, R>(
    spec: Spec<K>,
    ctx: Arc<C>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    watches: impl FnOnce(Controller<K>) -> Controller<K>,
    reconcile: R,
) where
    K: Kind,
    C: AsRef<Kube> + Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    R: Fn(Arc<K>, Arc<C>) -> Fut + Copy + Send + Sync + 'static,
{
    let Spec {
        name,
        trigger,
        store,
        concurrency,
        flow,
    } = spec;
    let trigger = counted(name, &(*ctx).as_ref().metrics, trigger, |o| Some(key_of(o)));
    let controller = Controller::for_shared_stream(trigger, store);
    // The runner itself is unbounded: a queued reconcile is a parked future
    // in the fair queue, which is what bounds those that run.
    let (running_gauge, waiting_gauge) = (*ctx).as_ref().metrics.worker_gauges(name);
    let workers = FairWorkers::observed(usize::from(concurrency), move |running, waiting| {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        running_gauge.set(count(running));
        waiting_gauge.set(count(waiting));
    });
    let closing = workers.clone();
    let shutdown = async move {
        shutdown.await;
        // Reconciles not started yet do not start during shutdown.
        closing.close();
    };
    let stream = watches(controller)
        .with_config(Config::default().concurrency(0))
        .graceful_shutdown_on(shutdown)
        .run(
            move |obj, ctx| {
                let flow = flow(&obj);
                instrumented(name, obj, ctx, (workers.clone(), flow), reconcile)
            },
            |_, _, _| Action::requeue(RETRY_AFTER),
            ctx,
        );
    drain(name, stream).await;
}

/// Wrap a reconcile with timing, queue bookkeeping and error metrics.
async fn instrumented<K, C, E, F>(
    controller: &'static str,
    obj: Arc<K>,
    ctx: Arc<C>,
    (workers, flow): (FairWorkers, Flow),
    reconcile: impl FnOnce(Arc<K>, Arc<C>) -> F,
) -> Result<Action, E>
where
    K: Resource,
    C: AsRef<Kube>,
    E: std::fmt::Display,
    F: Future<Output = Result<Action, E>>,
{
    let key = key_of(obj.as_ref());
    let metrics = (*ctx).as_ref().metrics.clone();
    // Deciding from a partly listed cache would, for example, make a
    // MachineSet whose machines are not listed yet create them again.
    if !metrics.is_ready() {
        return Ok(Action::requeue(Duration::from_millis(250)));
    }
    let Some(_worker) = workers.acquire(flow).await else {
        // Shutting down: what did not start stays for the next leader.
        return Ok(Action::await_change());
    };
    metrics.dequeued(controller, &key);
    let started = Instant::now();
    let result = reconcile(obj, ctx).await;
    metrics.reconciled(controller, started.elapsed(), result.is_err());
    if let Err(error) = &result {
        tracing::warn!(controller, object = %key, %error, "reconcile failed; retrying");
    }
    result
}

/// Count triggers into the queue-depth metric as they pass.
fn counted<K>(
    controller: &'static str,
    metrics: &Metrics,
    stream: impl Stream<Item = Arc<K>> + Send + 'static,
    key: impl Fn(&K) -> Option<String> + Send + 'static,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
{
    let metrics = metrics.clone();
    stream.inspect(move |obj| {
        if let Some(k) = key(obj) {
            metrics.enqueued(controller, k);
        }
    })
}

/// Map an object to the objects of another kind it triggers, counting each
/// into `controller`'s queue depth (for `watches_shared_stream` mappers).
pub fn enqueue<K: Resource<DynamicType = ()>>(
    metrics: &Metrics,
    controller: &'static str,
    refs: Vec<ObjectRef<K>>,
) -> Vec<ObjectRef<K>> {
    for r in &refs {
        metrics.enqueued(
            controller,
            format!("{}/{}", r.namespace.as_deref().unwrap_or(""), r.name),
        );
    }
    refs
}

/// Drive a controller's result stream, logging failures, until it ends.
async fn drain<K, E1, E2>(
    name: &'static str,
    stream: impl Stream<Item = Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E1, E2>>>,
) where
    K: Resource,
    E1: std::error::Error + 'static,
    E2: std::error::Error + 'static,
{
    stream
        .for_each(|result| async move {
            if let Err(error) = result {
                match &error {
                    kube::runtime::controller::Error::ObjectNotFound(_) => {}
                    _ => tracing::debug!(controller = name, %error, "reconcile failed"),
                }
            }
        })
        .await;
}
