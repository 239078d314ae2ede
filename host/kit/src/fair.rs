//! Fair workers: a controller's reconciles are queued per namespace and
//! per Plugin, so one tenant's (or one plugin's) slow reconciles cannot hold
//! more than its share of the controller's workers.
//!
//! Why: a reconcile that calls a plugin may hold its worker for the whole
//! call deadline. Before this, 100 Machines of one namespace on a hanging
//! provider kept all 32 workers of the Machine controller busy, and every
//! other namespace's Machines, deletions and drains waited behind them.
//!
//! Start at [`FairQueue`], the pure policy (property-tested below);
//! [`FairWorkers`] is its async wrapper that [`crate::controller::run`]
//! puts in front of every reconcile. The policy:
//! - a reconcile belongs to a [`Flow`]: its namespace and, when it calls
//!   one, its Plugin (each with its workload cluster, when it names one,
//!   so a stopped API server holds only its own cluster's share);
//! - while more than a reserve of the workers (an eighth) is free, any
//!   waiter may take one: no worker idles while there is work for it;
//! - the reserve goes only to a flow whose namespace holds less than its
//!   share, `⌈workers / namespaces with work⌉`, and whose Plugin holds
//!   less than its share (counted the same way over Plugins). So a
//!   namespace that shows up while another one is stuck finds a worker at
//!   once, and as the stuck one's reconciles end, the workers they free go
//!   to the newcomer until both hold their share;
//! - free workers go round-robin to the eligible flows; within a flow,
//!   first come first served.
//!
//! Waiting costs a parked future, not a worker: the kube-rs runner is
//! unbounded and this queue is what bounds the reconciles that run.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Who a reconcile works for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flow {
    /// The object's namespace (`""` for cluster-scoped objects).
    pub namespace: String,
    /// The Plugin the reconcile calls, if any.
    pub plugin: Option<String>,
}

impl Flow {
    /// A flow of `namespace` and the workload cluster `cluster` (if any)
    /// that calls `plugin` (if any): each cluster of a namespace is queued
    /// as a namespace of its own, and a Plugin's calls for it as a Plugin
    /// of its own, so a cluster whose API server stopped answering holds
    /// neither its namespace's nor its provider's share for the others.
    pub fn of(namespace: &str, cluster: Option<&str>, plugin: Option<&str>) -> Self {
        let of_cluster = |key: &str| match cluster {
            Some(cluster) => format!("{key} (cluster {cluster})"),
            None => key.to_string(),
        };
        Flow {
            namespace: of_cluster(namespace),
            plugin: plugin.map(of_cluster),
        }
    }

    /// A flow of `namespace` that calls no plugin.
    pub fn namespace(namespace: impl Into<String>) -> Self {
        Flow {
            namespace: namespace.into(),
            plugin: None,
        }
    }
}

/// A waiting reconcile's number.
pub type Ticket = u64;

/// Work per key: reconciles running and waiting.
#[derive(Debug, Default, Clone, Copy)]
struct Load {
    running: usize,
    waiting: usize,
}

impl Load {
    fn demand(self) -> usize {
        self.running + self.waiting
    }
}

/// The pure policy: who runs next. No clocks, no I/O.
#[derive(Debug)]
pub struct FairQueue {
    workers: usize,
    reserve: usize,
    running: usize,
    namespaces: HashMap<String, Load>,
    plugins: HashMap<String, Load>,
    /// Flows with waiters, in round-robin order.
    order: VecDeque<Flow>,
    waiters: HashMap<Flow, VecDeque<Ticket>>,
}

/// What is kept free for a newcomer: an eighth of the workers, at least
/// one when there are two or more.
fn reserve_for(workers: usize) -> usize {
    if workers < 2 { 0 } else { (workers / 8).max(1) }
}

impl FairQueue {
    /// A queue in front of `workers` workers (at least one).
    pub fn new(workers: usize) -> Self {
        let workers = workers.max(1);
        FairQueue {
            workers,
            reserve: reserve_for(workers),
            running: 0,
            namespaces: HashMap::new(),
            plugins: HashMap::new(),
            order: VecDeque::new(),
            waiters: HashMap::new(),
        }
    }

    /// The workers behind the queue.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Reconciles running now.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Reconciles waiting now.
    pub fn waiting(&self) -> usize {
        self.waiters.values().map(VecDeque::len).sum()
    }

    /// Reconciles of `namespace` running now.
    pub fn running_in(&self, namespace: &str) -> usize {
        self.namespaces.get(namespace).map_or(0, |l| l.running)
    }

    /// Reconciles calling `plugin` running now.
    pub fn running_for(&self, plugin: &str) -> usize {
        self.plugins.get(plugin).map_or(0, |l| l.running)
    }

    /// The share of one key while `demanding` keys have work: what it may
    /// hold once no more than the reserve is free.
    pub fn cap(&self, demanding: usize) -> usize {
        let share = self.workers.div_ceil(demanding.max(1));
        share.min(self.workers - self.reserve).max(1)
    }

    fn namespace_cap(&self) -> usize {
        self.cap(self.namespaces.len())
    }

    fn plugin_cap(&self) -> usize {
        self.cap(self.plugins.len())
    }

    /// Whether a waiter of `flow` may take a free worker: anyone may while
    /// more than the reserve is free (no worker idles while there is work
    /// for it); past that, only a flow whose namespace and Plugin are both
    /// under their share.
    fn eligible(&self, flow: &Flow) -> bool {
        if self.running < self.workers - self.reserve {
            return true;
        }
        let ns = self
            .namespaces
            .get(&flow.namespace)
            .map_or(0, |l| l.running);
        if ns >= self.namespace_cap() {
            return false;
        }
        match &flow.plugin {
            Some(p) => self.plugins.get(p).map_or(0, |l| l.running) < self.plugin_cap(),
            None => true,
        }
    }

    fn load(&mut self, flow: &Flow, change: impl Fn(&mut Load)) {
        let ns = self.namespaces.entry(flow.namespace.clone()).or_default();
        change(ns);
        if ns.demand() == 0 {
            self.namespaces.remove(&flow.namespace);
        }
        if let Some(p) = &flow.plugin {
            let load = self.plugins.entry(p.clone()).or_default();
            change(load);
            if load.demand() == 0 {
                self.plugins.remove(p);
            }
        }
    }

    /// `ticket` of `flow` waits for a worker. Call [`Self::grants`] next.
    pub fn push(&mut self, ticket: Ticket, flow: Flow) {
        self.load(&flow, |l| l.waiting += 1);
        let queue = self.waiters.entry(flow.clone()).or_default();
        if queue.is_empty() {
            self.order.push_back(flow);
        }
        queue.push_back(ticket);
    }

    /// A waiting `ticket` gave up. `false` if it was not waiting (it was
    /// granted a worker, which the caller must then [`Self::release`]).
    pub fn cancel(&mut self, ticket: Ticket, flow: &Flow) -> bool {
        let Some(queue) = self.waiters.get_mut(flow) else {
            return false;
        };
        let Some(at) = queue.iter().position(|t| *t == ticket) else {
            return false;
        };
        queue.remove(at);
        if queue.is_empty() {
            self.waiters.remove(flow);
            self.order.retain(|f| f != flow);
        }
        self.load(flow, |l| l.waiting -= 1);
        true
    }

    /// A granted reconcile of `flow` finished and gives its worker back.
    /// Call [`Self::grants`] next.
    pub fn release(&mut self, flow: &Flow) {
        self.running -= 1;
        self.load(flow, |l| l.running -= 1);
    }

    /// Hand free workers to waiters, round-robin over eligible flows;
    /// returns the tickets granted, each now running.
    pub fn grants(&mut self) -> Vec<(Ticket, Flow)> {
        let mut granted = Vec::new();
        while self.running < self.workers {
            let Some(at) = self.order.iter().position(|f| self.eligible(f)) else {
                break;
            };
            let flow = self.order.remove(at).expect("position is in range");
            let queue = self.waiters.get_mut(&flow).expect("ordered flows wait");
            let ticket = queue.pop_front().expect("ordered flows are not empty");
            if queue.is_empty() {
                self.waiters.remove(&flow);
            } else {
                self.order.push_back(flow.clone());
            }
            self.load(&flow, |l| {
                l.waiting -= 1;
                l.running += 1;
            });
            self.running += 1;
            granted.push((ticket, flow));
        }
        granted
    }
}

/// [`FairQueue`] for async reconciles: [`FairWorkers::acquire`] waits for a
/// worker without holding one. Cheap to clone.
#[derive(Clone)]
pub struct FairWorkers {
    inner: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for FairWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (running, waiting) = self.load();
        f.debug_struct("FairWorkers")
            .field("running", &running)
            .field("waiting", &waiting)
            .finish()
    }
}

/// Told the reconciles running and waiting after every change.
type Observer = Box<dyn Fn(usize, usize) + Send + Sync>;

struct Shared {
    queue: FairQueue,
    next: Ticket,
    wakers: HashMap<Ticket, (tokio::sync::oneshot::Sender<()>, Flow)>,
    closed: bool,
    observe: Observer,
}

/// A worker held by a running reconcile; dropping it frees the worker.
#[derive(Debug)]
pub struct Worker {
    workers: FairWorkers,
    flow: Flow,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.workers.release(&self.flow);
    }
}

/// A waiter's place: dropped before its grant arrived, it leaves the
/// queue; dropped with a grant delivered but not taken, it frees the worker.
struct Waiting<'a> {
    workers: &'a FairWorkers,
    ticket: Ticket,
    flow: &'a Flow,
    rx: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut shared = self.workers.lock();
        if rx.try_recv().is_ok() {
            shared.queue.release(self.flow);
            FairWorkers::wake(&mut shared);
        } else if shared.wakers.remove(&self.ticket).is_some() {
            // Not granted yet (grants take the waker first). One flow
            // less with work may raise the others' shares.
            shared.queue.cancel(self.ticket, self.flow);
            FairWorkers::wake(&mut shared);
        }
    }
}

impl FairWorkers {
    /// Fair queueing in front of `workers` workers.
    pub fn new(workers: usize) -> Self {
        Self::observed(workers, |_, _| {})
    }

    /// The same, telling `observe` the reconciles running and waiting
    /// after every change (for gauges).
    pub fn observed(
        workers: usize,
        observe: impl Fn(usize, usize) + Send + Sync + 'static,
    ) -> Self {
        FairWorkers {
            inner: Arc::new(Mutex::new(Shared {
                queue: FairQueue::new(workers),
                next: 0,
                wakers: HashMap::new(),
                closed: false,
                observe: Box::new(observe),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner.lock().expect("fair queue lock")
    }

    /// Wait for a worker for `flow`. `None` once [`Self::close`]d (the
    /// controller is shutting down: nothing new starts).
    pub async fn acquire(&self, flow: Flow) -> Option<Worker> {
        let (ticket, rx) = {
            let mut shared = self.lock();
            if shared.closed {
                return None;
            }
            let ticket = shared.next;
            shared.next += 1;
            let (tx, rx) = tokio::sync::oneshot::channel();
            shared.wakers.insert(ticket, (tx, flow.clone()));
            shared.queue.push(ticket, flow.clone());
            Self::wake(&mut shared);
            (ticket, rx)
        };
        let mut waiting = Waiting {
            workers: self,
            ticket,
            flow: &flow,
            rx: Some(rx),
        };
        let granted = waiting.rx.as_mut().expect("set above").await.is_ok();
        if !granted {
            // Closed: close() took the ticket out of the queue.
            return None;
        }
        waiting.rx = None;
        drop(waiting);
        Some(Worker {
            workers: self.clone(),
            flow,
        })
    }

    /// Stop handing out workers: waiters and later callers get `None`.
    pub fn close(&self) {
        let mut shared = self.lock();
        shared.closed = true;
        for (ticket, (_, flow)) in std::mem::take(&mut shared.wakers) {
            shared.queue.cancel(ticket, &flow);
        }
        (shared.observe)(shared.queue.running(), shared.queue.waiting());
    }

    /// Reconciles running and waiting now.
    pub fn load(&self) -> (usize, usize) {
        let shared = self.lock();
        (shared.queue.running(), shared.queue.waiting())
    }

    fn release(&self, flow: &Flow) {
        let mut shared = self.lock();
        shared.queue.release(flow);
        Self::wake(&mut shared);
    }

    fn wake(shared: &mut Shared) {
        // A grant whose waiter is gone (closed, or dropped between grant
        // and delivery) gives its worker back at once, which may free it
        // for another waiter: grant until every grant is delivered.
        loop {
            let mut returned = false;
            for (ticket, flow) in shared.queue.grants() {
                let delivered = shared
                    .wakers
                    .remove(&ticket)
                    .is_some_and(|(tx, _)| tx.send(()).is_ok());
                if !delivered {
                    shared.queue.release(&flow);
                    returned = true;
                }
            }
            if !returned {
                break;
            }
        }
        (shared.observe)(shared.queue.running(), shared.queue.waiting());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_workload_cluster_of_a_namespace_is_a_flow_of_its_own() {
        let a = Flow::of("team", Some("a"), Some("sim"));
        let b = Flow::of("team", Some("b"), Some("sim"));
        let here = Flow::of("team", None, Some("sim"));
        assert_ne!(a.namespace, b.namespace);
        assert_ne!(a.namespace, here.namespace);
        assert_eq!(here, flow("team", Some("sim")));
        // Cluster a's API server stopped: its reconciles hang. Cluster b
        // of the same namespace still finds a worker at once.
        let mut q = FairQueue::new(32);
        for t in 0..100 {
            q.push(t, a.clone());
        }
        assert_eq!(q.grants().len(), 28, "32 workers less a reserve of 4");
        q.push(100, b.clone());
        assert_eq!(q.grants(), vec![(100, b)]);
    }

    use proptest::prelude::*;

    fn flow(ns: &str, plugin: Option<&str>) -> Flow {
        Flow {
            namespace: ns.into(),
            plugin: plugin.map(Into::into),
        }
    }

    #[test]
    fn one_namespace_alone_leaves_the_reserve_free() {
        let mut q = FairQueue::new(32);
        for t in 0..100 {
            q.push(t, flow("hog", Some("hanging")));
        }
        assert_eq!(q.grants().len(), 28, "32 workers less a reserve of 4");
        // A newcomer runs at once, beside the stuck namespace.
        q.push(100, flow("team", Some("sim")));
        assert_eq!(q.grants(), vec![(100, flow("team", Some("sim")))]);
    }

    #[test]
    fn a_stuck_namespace_shrinks_to_its_share_as_its_calls_end() {
        let mut q = FairQueue::new(32);
        for t in 0..100 {
            q.push(t, flow("hog", None));
        }
        assert_eq!(q.grants().len(), 28);
        for t in 100..140 {
            q.push(t, flow("team", None));
        }
        q.grants();
        // The hog's calls end one by one; its freed workers go to the team
        // until each holds its share of 16.
        for _ in 0..28 {
            q.release(&flow("hog", None));
            q.grants();
        }
        assert_eq!(q.running_in("hog"), 16);
        assert_eq!(q.running_in("team"), 16);
    }

    #[test]
    fn a_plugin_is_capped_across_namespaces() {
        let mut q = FairQueue::new(8);
        for ns in 0..8 {
            for t in 0..4 {
                q.push(ns * 10 + t, flow(&format!("ns{ns}"), Some("slow")));
            }
        }
        q.push(999, flow("other", Some("fast")));
        let mut running: Vec<Flow> = q.grants().into_iter().map(|(_, f)| f).collect();
        // The slow plugin fills the open workers; the reserve goes to the
        // other plugin, under its share, whatever namespace it comes from.
        assert_eq!(q.running_for("slow"), 7);
        assert_eq!(q.running_for("fast"), 1);
        // As slow calls end, it shrinks to its share of 4 while the fast
        // plugin has work.
        for t in 1000..1010 {
            q.push(t, flow(&format!("team{t}"), Some("fast")));
        }
        for _ in 0..12 {
            let at = running
                .iter()
                .position(|f| f.plugin.as_deref() == Some("slow"))
                .expect("a slow call runs");
            q.release(&running.remove(at));
            running.extend(q.grants().into_iter().map(|(_, f)| f));
        }
        assert_eq!(q.running_for("slow"), 4);
        assert_eq!(q.running_for("fast"), 4);
    }

    #[test]
    fn cancelled_waiters_leave_no_trace() {
        let mut q = FairQueue::new(1);
        q.push(1, flow("a", None));
        q.push(2, flow("a", None));
        assert_eq!(q.grants().len(), 1);
        assert!(q.cancel(2, &flow("a", None)));
        assert!(!q.cancel(1, &flow("a", None)), "1 was granted, not waiting");
        q.release(&flow("a", None));
        assert_eq!((q.running(), q.waiting()), (0, 0));
        assert!(q.namespaces.is_empty() && q.order.is_empty() && q.waiters.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Push(u8, Option<u8>),
        Release(usize),
        Cancel(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0u8..4, proptest::option::of(0u8..3)).prop_map(|(n, p)| Step::Push(n, p)),
            2 => any::<usize>().prop_map(Step::Release),
            1 => any::<usize>().prop_map(Step::Cancel),
        ]
    }

    proptest! {
        /// Under any interleaving: never more running than workers; a
        /// grant into the reserve respects both shares as they stood; no
        /// eligible waiter is left while a worker is free; within a flow,
        /// first come first served; a lone namespace never takes the
        /// reserve.
        #[test]
        fn grants_respect_every_cap_and_leave_no_eligible_waiter(
            workers in 1usize..12,
            steps in proptest::collection::vec(step(), 1..200),
        ) {
            let mut q = FairQueue::new(workers);
            let mut running: Vec<Flow> = Vec::new();
            let mut waiting: Vec<(Ticket, Flow)> = Vec::new();
            let mut next = 0;
            for s in steps {
                match s {
                    Step::Push(n, p) => {
                        let f = flow(&format!("ns{n}"), p.map(|p| format!("p{p}")).as_deref());
                        q.push(next, f.clone());
                        waiting.push((next, f));
                        next += 1;
                    }
                    Step::Release(i) if !running.is_empty() => {
                        let f = running.remove(i % running.len());
                        q.release(&f);
                    }
                    Step::Cancel(i) if !waiting.is_empty() => {
                        let (t, f) = waiting.remove(i % waiting.len());
                        prop_assert!(q.cancel(t, &f));
                    }
                    _ => continue,
                }
                let ns_cap = q.namespace_cap();
                let plugin_cap = q.plugin_cap();
                let lone = q.namespaces.len() == 1;
                let open = workers - q.reserve;
                let granted = q.grants();
                for (t, f) in &granted {
                    let before = waiting.iter().position(|(w, _)| w == t).expect("granted a waiter");
                    prop_assert!(
                        !waiting[..before].iter().any(|(_, g)| g == f),
                        "an older waiter of the same flow was passed over"
                    );
                    waiting.remove(before);
                    running.push(f.clone());
                    // Past the open workers, only under both shares.
                    if running.len() > open {
                        prop_assert!(q.running_in(&f.namespace) <= ns_cap);
                        if let Some(p) = &f.plugin {
                            prop_assert!(q.running_for(p) <= plugin_cap);
                        }
                    }
                }
                prop_assert_eq!(q.running(), running.len());
                prop_assert_eq!(q.waiting(), waiting.len());
                prop_assert!(q.running() <= workers);
                if lone && workers >= 2 {
                    prop_assert!(q.running() < workers, "a lone namespace took the reserve");
                }
                if q.running() < workers {
                    prop_assert!(
                        !waiting.iter().any(|(_, f)| q.eligible(f)),
                        "a worker is free and an eligible waiter waits"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn a_dropped_waiter_and_a_dropped_worker_free_their_place() {
        let workers = FairWorkers::new(1);
        let held = workers.acquire(Flow::namespace("a")).await.expect("open");
        let waiter = workers.acquire(Flow::namespace("a"));
        // Poll once so it is queued, then drop it.
        let mut waiter = Box::pin(waiter);
        assert!(futures::poll!(&mut waiter).is_pending());
        drop(waiter);
        assert_eq!(workers.load(), (1, 0));
        drop(held);
        let again = workers.acquire(Flow::namespace("b")).await;
        assert!(again.is_some());
        workers.close();
        assert!(workers.acquire(Flow::namespace("c")).await.is_none());
    }
}
