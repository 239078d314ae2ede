//! A controller process: the metrics and health servers, leader election
//! when asked, and the controllers ([`crate::run`]) while this replica
//! leads, until shutdown. `capstan controller` is a thin layer of flags over
//! [`serve`]; the benchmarks' native controller uses it too.

use crate::leader::{ElectionConfig, Elector, Fence};
use crate::{Error, Metrics, Options, Providers};
use std::net::SocketAddr;

/// Everything a controller process needs.
pub struct Process {
    /// How to reach the API server.
    pub config: kube::Config,
    /// The plugin sandbox (`None`: only built-in providers).
    pub runtime: Option<capstan_runtime::Runtime>,
    /// Built-in providers by plugin name.
    pub providers: Providers,
    /// Controller tuning.
    pub options: Options,
    /// Where `/metrics` is served.
    pub metrics_addr: SocketAddr,
    /// Where `/healthz` and `/readyz` are served (may equal `metrics_addr`).
    pub health_addr: SocketAddr,
    /// Leader election (`None`: this process always reconciles).
    pub election: Option<ElectionConfig>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("metrics_addr", &self.metrics_addr)
            .field("health_addr", &self.health_addr)
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

async fn listen(addr: SocketAddr, flag: &str) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Serve(format!("cannot listen on {flag} {addr}: {e}")))
}

/// Run until `shutdown` completes: in-flight reconciles finish, then the
/// leader Lease is released so a standby takes over at once.
///
/// Returns [`Error::LeadershipLost`] as soon as the Lease is lost; the
/// controllers are dropped before it returns, and the caller should exit
/// (a restarted process becomes a fresh candidate).
pub async fn serve(
    process: Process,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let metrics = Metrics::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut servers = vec![tokio::spawn(crate::metrics::serve(
        listen(process.metrics_addr, "--metrics-addr").await?,
        metrics.clone(),
        stopped(),
    ))];
    if process.health_addr != process.metrics_addr {
        servers.push(tokio::spawn(crate::metrics::serve(
            listen(process.health_addr, "--health-addr").await?,
            metrics.clone(),
            stopped(),
        )));
    }
    eprintln!(
        "capstan controller: metrics on http://{}/metrics, health on http://{}/healthz",
        process.metrics_addr, process.health_addr
    );
    let shutdown: Shutdown = Box::pin(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight reconciles");
    });
    let shutdown = futures::future::FutureExt::shared(shutdown);
    let result = lead_and_run(process, metrics, shutdown).await;
    let _ = stop_tx.send(true);
    for server in servers {
        server.abort();
    }
    result
}

type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

async fn lead_and_run(
    mut process: Process,
    metrics: Metrics,
    shutdown: futures::future::Shared<Shutdown>,
) -> Result<(), Error> {
    // With an election, every write of the controllers is fenced by it.
    let fence = process.election.as_ref().map(|_| Fence::new());
    process.options.write_fence = fence.clone();
    // Plugin calls send nothing past the fence either (a call running
    // when the replica was stopped must not reach the cloud on resuming).
    if let (Some(runtime), Some(fence)) = (&process.runtime, &fence) {
        let fence = fence.clone();
        runtime.gate_outbound(move || fence.allows_writes());
    }
    // Futures are lazy: nothing runs until it is awaited, after the Lease.
    let controllers = crate::run(
        process.config.clone(),
        process.runtime,
        process.providers,
        metrics.clone(),
        process.options,
        shutdown.clone(),
    );
    let Some(election) = process.election else {
        return controllers.await;
    };
    let client = kube::Client::try_from(process.config.clone()).map_err(|source| Error::Kube {
        what: "cannot build a Kubernetes client".into(),
        source,
    })?;
    let fence = fence.expect("made above for an election");
    let elector = Elector::new(client, election, metrics.clone(), fence);
    eprintln!(
        "capstan controller: waiting to lead (identity {})",
        elector.identity()
    );
    tokio::select! {
        () = elector.acquire() => {}
        () = shutdown.clone() => return Ok(()),
    }
    eprintln!("capstan controller: leading");
    tokio::select! {
        result = controllers => {
            tracing::info!("controllers stopped");
            elector.release().await;
            result
        }
        why = elector.hold() => {
            tracing::error!(%why, "lost the leader Lease: stopping at once");
            Err(Error::LeadershipLost(why))
        }
    }
}
