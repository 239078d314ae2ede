//! Call threads: where plugin calls run.
//!
//! One call wakes several tasks: the guest's call itself, wasi-http's
//! request and body tasks, and the pooled connection's task. On the host's
//! multi-thread executor those hop between worker threads at every wake-up;
//! measured with `capstan-bench-plugin --breakdown`, the hops were most of
//! a `create`'s time in the sandbox (about 90 of 116 µs of its `run` phase).
//! So calls run on a few dedicated threads instead, each a current-thread
//! executor with its own outbound connection pool: everything one call
//! wakes stays on one thread, and the only hops left are handing the call
//! to its thread and the result back.
//!
//! It also keeps plugins' CPU off the controllers' executor: a busy plugin
//! delays other plugin calls on its thread (it still yields at every epoch
//! tick), never a Lease renewal or a watch.
//!
//! Start with [`CallThreads::run`]. With no threads configured, calls run
//! on the caller's executor, as before.

use crate::Error;
use crate::http::{PooledClient, pooled_client};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// The connection pool of the call thread this is, if it is one.
    static THREAD_CLIENT: std::cell::OnceCell<PooledClient> = const { std::cell::OnceCell::new() };
    /// Which call thread this is, if it is one.
    static THREAD_INDEX: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The outbound connection pool of the current call thread; `None` on any
/// other thread. Connections are driven by tasks on the thread that opened
/// them, so a call thread uses only its own.
pub(crate) fn thread_client() -> Option<PooledClient> {
    THREAD_CLIENT.with(|c| c.get().cloned())
}

/// Whether this thread is a call thread.
pub(crate) fn on_call_thread() -> bool {
    call_thread_index().is_some()
}

/// The index of the call thread this is (`0..count`), if it is one.
pub(crate) fn call_thread_index() -> Option<usize> {
    THREAD_INDEX.with(std::cell::Cell::get)
}

/// The call threads of one [`crate::Runtime`].
pub(crate) struct CallThreads {
    threads: Vec<CallThread>,
}

struct CallThread {
    handle: tokio::runtime::Handle,
    /// Calls handed to this thread and not yet finished.
    load: Arc<AtomicUsize>,
    /// Dropped to stop the thread.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl CallThreads {
    /// Start `count` call threads (none: calls run where they are awaited).
    pub(crate) fn start(count: usize, gate: crate::gate::OutboundGateCell) -> Result<Self, Error> {
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            threads.push(CallThread::start(i, gate.clone())?);
        }
        Ok(CallThreads { threads })
    }

    /// Run `call` on the least busy call thread and wait for its result.
    /// Dropping the returned future cancels the call, as it would if the
    /// call ran in place.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        call: impl Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<T, Error> {
        let Some(thread) = self.pick() else {
            return call.await;
        };
        let counted = Counted::new(&thread.load);
        let task = AbortOnDrop(thread.handle.spawn(async move {
            let _counted = counted;
            call.await
        }));
        match (&mut { task }).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::Engine("the runtime is shutting down".into())),
        }
    }

    /// How many call threads there are.
    pub(crate) fn count(&self) -> usize {
        self.threads.len()
    }

    /// The thread with the fewest calls; among equals the first, so calls
    /// one after another stay on one thread and find its caches warm
    /// (measured: a pure call took 14.7 µs inside the sandbox when
    /// sequential calls alternated between two threads, 11.5 µs on one).
    fn pick(&self) -> Option<&CallThread> {
        self.threads
            .iter()
            .min_by_key(|t| t.load.load(Ordering::Relaxed))
    }
}

impl CallThread {
    fn start(index: usize, gate: crate::gate::OutboundGateCell) -> Result<Self, Error> {
        let io = |error| Error::Io {
            what: "cannot start a plugin call thread".into(),
            error,
        };
        let executor = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io)?;
        let handle = executor.handle().clone();
        let client = pooled_client(gate).map_err(Error::Engine)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let join = std::thread::Builder::new()
            .name(format!("capstan-calls-{index}"))
            .spawn(move || {
                THREAD_CLIENT.with(|c| {
                    let _ = c.set(client);
                });
                THREAD_INDEX.with(|i| i.set(Some(index)));
                // Runs the calls handed over until the stop sender goes
                // (with the Runtime); calls still running then are
                // cancelled as the executor is dropped.
                let _ = executor.block_on(stopped);
            })
            .map_err(io)?;
        Ok(CallThread {
            handle,
            load: Arc::default(),
            stop: Some(stop),
            join: Some(join),
        })
    }
}

impl Drop for CallThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(join) = self.join.take()
            // The last handle on the runtime may go with a call on this
            // very thread; it then ends by itself once the call returns.
            && join.thread().id() != std::thread::current().id()
        {
            let _ = join.join();
        }
    }
}

/// One call counted against its thread's load until dropped (finished or
/// cancelled).
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(load: &Arc<AtomicUsize>) -> Self {
        load.fetch_add(1, Ordering::Relaxed);
        Counted(load.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A spawned call that is cancelled when its caller stops waiting.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_run_on_the_call_threads_and_spread_over_them() {
        let threads = CallThreads::start(2, Default::default()).unwrap();
        // Two calls that can only finish together: the second finds the
        // first thread busy.
        let both = Arc::new(tokio::sync::Barrier::new(2));
        let name = || {
            let both = both.clone();
            async move {
                both.wait().await;
                Ok(std::thread::current().name().map(str::to_string))
            }
        };
        let (a, b) = tokio::join!(threads.run(name()), threads.run(name()));
        let mut names = vec![a.unwrap().unwrap(), b.unwrap().unwrap()];
        names.sort();
        assert_eq!(names, ["capstan-calls-0", "capstan-calls-1"]);
        assert!(thread_client().is_none(), "the caller is no call thread");
        // One after another, calls stay on the first thread.
        for _ in 0..3 {
            let here = threads
                .run(async { Ok(std::thread::current().name().map(str::to_string)) })
                .await
                .unwrap();
            assert_eq!(here.as_deref(), Some("capstan-calls-0"));
        }
    }

    #[tokio::test]
    async fn without_threads_a_call_runs_in_place() {
        let threads = CallThreads::start(0, Default::default()).unwrap();
        let here = std::thread::current().id();
        let there = threads
            .run(async { Ok(std::thread::current().id()) })
            .await
            .unwrap();
        assert_eq!(here, there);
    }

    #[tokio::test]
    async fn a_call_whose_caller_stops_waiting_is_cancelled() {
        let threads = CallThreads::start(1, Default::default()).unwrap();
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        struct Guard(Option<tokio::sync::oneshot::Sender<()>>);
        impl Drop for Guard {
            fn drop(&mut self) {
                let _ = self.0.take().map(|t| t.send(()));
            }
        }
        let call = async move {
            let _guard = Guard(Some(dropped_tx));
            std::future::pending::<()>().await;
            Ok(())
        };
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(50), threads.run(call)).await;
        assert!(waited.is_err(), "the call never ends by itself");
        tokio::time::timeout(std::time::Duration::from_secs(5), dropped_rx)
            .await
            .expect("the abandoned call was dropped on its thread")
            .unwrap();
        let load = &threads.threads[0].load;
        for _ in 0..100 {
            if load.load(Ordering::Relaxed) == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            load.load(Ordering::Relaxed),
            0,
            "a cancelled call no longer counts"
        );
    }

    #[tokio::test]
    async fn a_panicking_call_panics_its_caller() {
        let threads = Arc::new(CallThreads::start(1, Default::default()).unwrap());
        let t = threads.clone();
        let caller = tokio::spawn(async move {
            t.run(async {
                if true {
                    panic!("plugin host bug");
                }
                Ok(())
            })
            .await
        });
        let err = caller.await.unwrap_err();
        assert!(err.is_panic());
        // The thread survives a panicking call.
        assert_eq!(threads.run(async { Ok(7) }).await.unwrap(), 7);
    }
}
