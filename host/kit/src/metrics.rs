//! Prometheus metrics of the controllers, and the HTTP server that serves
//! them with `/healthz` and `/readyz`.
//!
//! Metrics: `capstan_reconcile_duration_seconds{controller}`,
//! `capstan_reconcile_errors_total{controller}`,
//! `capstan_plugin_call_duration_seconds{plugin,revision,function,result}`,
//! `capstan_queue_depth{controller}` (objects triggered but not yet picked
//! up by a reconcile), `capstan_reconciles_running{controller}` and
//! `capstan_reconciles_waiting{controller}` (reconciles holding a worker,
//! and waiting in the fair queue for one: [`crate::fair`]), `capstan_api_writes_total{controller,verb}`,
//! `capstan_leader` (1 while this replica holds the leader Lease, 0 while it
//! stands by; 1 without leader election).
//!
//! Per plugin, from the runtime ([`capstan_runtime::Observer`]):
//! `capstan_plugin_calls_in_flight{plugin}`,
//! `capstan_plugin_quota_wait_seconds{plugin}` (how long calls waited for
//! the plugin's `concurrentCalls`), `capstan_plugin_quota_rejections_total{plugin,quota}`
//! and `capstan_plugin_outbound_requests_total{plugin,result}` (`ok`,
//! `denied`, `budget`, `quota`, `fenced`, `error`).
//!
//! `/readyz` answers 200 once a leader's caches are synced, and 200 for a
//! standby replica (its body says `standby`), so a rollout of the
//! controller's Deployment does not wait for a replica that must not lead.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    plugin: String,
    revision: String,
    function: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabel {
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    plugin: String,
    quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundLabels {
    plugin: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    controller: String,
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ArtifactLabels {
    step: String,
    result: String,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 20))
}

/// The controllers' metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Mutex<Registry>,
    reconcile: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    reconcile_errors: Family<ControllerLabel, Counter>,
    plugin_calls: Family<CallLabels, Histogram, fn() -> Histogram>,
    queue_depth: Family<ControllerLabel, Gauge>,
    running: Family<ControllerLabel, Gauge>,
    waiting: Family<ControllerLabel, Gauge>,
    calls_in_flight: Family<PluginLabel, Gauge>,
    quota_wait: Family<PluginLabel, Histogram, fn() -> Histogram>,
    quota_rejections: Family<QuotaLabels, Counter>,
    outbound: Family<OutboundLabels, Counter>,
    writes: Family<WriteLabels, Counter>,
    artifacts: Family<ArtifactLabels, Counter>,
    writes_total: AtomicU64,
    dirty: Mutex<HashMap<&'static str, HashSet<String>>>,
    ready: AtomicBool,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl capstan_runtime::Observer for Metrics {
    fn call_started(&self, plugin: &str, waited: Duration) {
        let label = PluginLabel {
            plugin: plugin.to_string(),
        };
        self.inner.calls_in_flight.get_or_create(&label).inc();
        self.inner
            .quota_wait
            .get_or_create(&label)
            .observe(waited.as_secs_f64());
    }

    fn call_ended(&self, plugin: &str) {
        self.inner
            .calls_in_flight
            .get_or_create(&PluginLabel {
                plugin: plugin.to_string(),
            })
            .dec();
    }

    fn quota_refused(&self, plugin: &str, kind: capstan_runtime::QuotaKind, waited: Duration) {
        self.inner
            .quota_wait
            .get_or_create(&PluginLabel {
                plugin: plugin.to_string(),
            })
            .observe(waited.as_secs_f64());
        self.inner
            .quota_rejections
            .get_or_create(&QuotaLabels {
                plugin: plugin.to_string(),
                quota: kind.to_string(),
            })
            .inc();
    }

    fn outbound(&self, plugin: &str, result: capstan_runtime::Outbound) {
        self.inner
            .outbound
            .get_or_create(&OutboundLabels {
                plugin: plugin.to_string(),
                result: result.as_str().to_string(),
            })
            .inc();
    }
}

impl Metrics {
    /// Fresh metrics in their own registry.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("capstan");
        let reconcile = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
        let reconcile_errors = Family::default();
        let plugin_calls = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
        let queue_depth = Family::default();
        let writes = Family::default();
        let artifacts = Family::default();
        let running = Family::default();
        let waiting = Family::default();
        let calls_in_flight = Family::default();
        let quota_wait = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
        let quota_rejections = Family::default();
        let outbound = Family::default();
        registry.register(
            "plugin_calls_in_flight",
            "Plugin calls running now, by plugin",
            calls_in_flight.clone(),
        );
        registry.register(
            "plugin_quota_wait_seconds",
            "How long plugin calls waited for their plugin's concurrentCalls, by plugin",
            quota_wait.clone(),
        );
        registry.register(
            "plugin_quota_rejections",
            "Plugin calls refused by their plugin's quota, by plugin and quota",
            quota_rejections.clone(),
        );
        registry.register(
            "plugin_outbound_requests",
            "Outbound requests of plugin calls, by plugin and result",
            outbound.clone(),
        );
        registry.register(
            "reconciles_running",
            "Reconciles holding one of the controller's workers",
            running.clone(),
        );
        registry.register(
            "reconciles_waiting",
            "Reconciles waiting in the fair queue (per namespace and Plugin) for a worker",
            waiting.clone(),
        );
        registry.register(
            "plugin_artifact_steps",
            "Plugin supply steps by step (resolve, verify, fetch for oci:// sources; compile for every load) and result (ok, cached, failed)",
            artifacts.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            reconcile.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that returned an error",
            reconcile_errors.clone(),
        );
        registry.register(
            "plugin_call_duration_seconds",
            "Plugin calls by plugin, function and result",
            plugin_calls.clone(),
        );
        registry.register(
            "queue_depth",
            "Objects triggered and waiting for a reconcile",
            queue_depth.clone(),
        );
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API by controller and verb",
            writes.clone(),
        );
        let leader = Gauge::default();
        leader.set(1);
        registry.register(
            "leader",
            "1 while this replica leads (holds the leader Lease), 0 while it stands by",
            leader.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry: Mutex::new(registry),
                reconcile,
                reconcile_errors,
                plugin_calls,
                queue_depth,
                running,
                waiting,
                calls_in_flight,
                quota_wait,
                quota_rejections,
                outbound,
                writes,
                artifacts,
                writes_total: AtomicU64::new(0),
                dirty: Mutex::new(HashMap::new()),
                ready: AtomicBool::new(false),
                leader,
            }),
        }
    }

    fn label(controller: &str) -> ControllerLabel {
        ControllerLabel {
            controller: controller.to_string(),
        }
    }

    /// Record one reconcile.
    pub fn reconciled(&self, controller: &'static str, took: Duration, failed: bool) {
        self.inner
            .reconcile
            .get_or_create(&Self::label(controller))
            .observe(took.as_secs_f64());
        if failed {
            self.inner
                .reconcile_errors
                .get_or_create(&Self::label(controller))
                .inc();
        }
    }

    /// Record one plugin call. `revision` is `stable`, or `canary` for a
    /// Plugin's canary (bounded: never a digest).
    pub fn plugin_call(
        &self,
        (plugin, revision): (&str, &str),
        function: &str,
        result: &str,
        took: Duration,
    ) {
        self.inner
            .plugin_calls
            .get_or_create(&CallLabels {
                plugin: plugin.to_string(),
                revision: revision.to_string(),
                function: function.to_string(),
                result: result.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// The gauges of `controller`'s reconciles running and waiting for a
    /// worker, looked up once: the fair queue sets them on every change.
    pub fn worker_gauges(&self, controller: &str) -> (Gauge, Gauge) {
        let label = Self::label(controller);
        (
            self.inner.running.get_or_create(&label).clone(),
            self.inner.waiting.get_or_create(&label).clone(),
        )
    }

    /// Record one API write.
    pub fn wrote(&self, controller: &'static str, verb: &'static str) {
        self.inner
            .writes
            .get_or_create(&WriteLabels {
                controller: controller.to_string(),
                verb: verb.to_string(),
            })
            .inc();
        self.inner.writes_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Record one supply-chain step of an `oci://` plugin.
    pub fn artifact_step(&self, step: &'static str, result: &'static str) {
        self.inner
            .artifacts
            .get_or_create(&ArtifactLabels {
                step: step.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// All API writes so far (tests and the benchmark count them).
    pub fn writes(&self) -> u64 {
        self.inner.writes_total.load(Ordering::Relaxed)
    }

    /// An object was triggered for `controller`.
    pub fn enqueued(&self, controller: &'static str, key: String) {
        let mut dirty = self.inner.dirty.lock().expect("queue lock");
        let set = dirty.entry(controller).or_default();
        set.insert(key);
        self.inner
            .queue_depth
            .get_or_create(&Self::label(controller))
            .set(set.len() as i64);
    }

    /// A reconcile of `key` started for `controller`.
    pub fn dequeued(&self, controller: &'static str, key: &str) {
        let mut dirty = self.inner.dirty.lock().expect("queue lock");
        let set = dirty.entry(controller).or_default();
        set.remove(key);
        self.inner
            .queue_depth
            .get_or_create(&Self::label(controller))
            .set(set.len() as i64);
    }

    /// Mark the controllers ready (caches synced) or not.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the controllers are ready.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// This replica leads (`true`) or stands by for the leader Lease.
    pub fn set_leading(&self, leading: bool) {
        self.inner.leader.set(i64::from(leading));
    }

    /// Whether this replica leads (always, without leader election).
    pub fn is_leading(&self) -> bool {
        self.inner.leader.get() == 1
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.inner.registry.lock().expect("registry lock");
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let for_metrics = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = for_metrics.clone();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let m = metrics.clone();
                async move {
                    if !m.is_leading() {
                        (StatusCode::OK, "ok: standby, another replica leads")
                    } else if m.is_ready() {
                        (StatusCode::OK, "ok: leading")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_family() {
        let m = Metrics::new();
        m.reconciled("machine", Duration::from_millis(3), true);
        m.plugin_call(("sim", "stable"), "create", "ok", Duration::from_millis(1));
        m.wrote("machine", "patch_status");
        m.artifact_step("verify", "cached");
        m.enqueued("machine", "ns/a".into());
        m.enqueued("machine", "ns/a".into());
        m.enqueued("machine", "ns/b".into());
        m.dequeued("machine", "ns/a");
        let text = m.encode();
        assert!(
            text.contains("capstan_reconcile_duration_seconds_count{controller=\"machine\"} 1")
        );
        assert!(text.contains("capstan_reconcile_errors_total{controller=\"machine\"} 1"));
        assert!(text.contains(
            "capstan_plugin_call_duration_seconds_count{plugin=\"sim\",revision=\"stable\",function=\"create\",result=\"ok\"} 1"
        ));
        assert!(text.contains("capstan_queue_depth{controller=\"machine\"} 1"));
        assert!(
            text.contains(
                "capstan_api_writes_total{controller=\"machine\",verb=\"patch_status\"} 1"
            )
        );
        assert!(
            text.contains(
                "capstan_plugin_artifact_steps_total{step=\"verify\",result=\"cached\"} 1"
            )
        );
        assert_eq!(m.writes(), 1);
    }
}
