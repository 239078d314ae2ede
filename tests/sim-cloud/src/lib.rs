//! The simulated cloud: a small HTTP "cloud API" for scale and fault tests,
//! like Cluster API's in-memory provider.
//!
//! Instances are created idempotently by client token, boot after a
//! configurable latency, can be updated in place (version, asynchronously with
//! progress) and deleted (asynchronously). Faults are configurable at start
//! and at run time (`PUT /admin/faults`): a random error rate (HTTP 500),
//! HTTP 500 for one User-Agent (a plugin revision's requests),
//! throttling (HTTP 429 with `Retry-After`), capacity (HTTP 503
//! `InsufficientCapacity`, a stock-out), and a required bearer token.
//!
//! Start with [`SimCloud::start`]; the HTTP API is described on `router`
//! below (and in the README's configuration reference).
//! State is computed from timestamps when read. With a Kubernetes API
//! configured ([`SimCloudConfig::kube`]), the [`kubelet`] module acts as the
//! kubelet of a Node per instance: it registers the Node once the instance
//! has booted, heartbeats, runs the pods bound to it, and deletes it with
//! the instance; the admin API's fault switches stop a Node's kubelet, bend
//! its conditions or fail a pod's readiness.

#![forbid(unsafe_code)]

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub mod kubelet;
pub mod realnode;
pub mod timeline;
pub use kubelet::{
    ConditionOverride, JoinReport, KubeTarget, Kubelet, KubeletConfig, KubeletStats, NodeSpec,
    agent_trusting, node_name,
};
pub use timeline::{Moment, Timeline};

/// Faults and latencies; all can be changed while running.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Faults {
    /// Time from create to `running`.
    pub boot_latency_ms: u64,
    /// Time from delete to gone.
    pub delete_latency_ms: u64,
    /// Time an in-place update takes.
    pub update_latency_ms: u64,
    /// Fraction (0.0–1.0) of API calls answered with HTTP 500.
    pub error_rate: f64,
    /// Requests per second allowed before HTTP 429; `None` for unlimited.
    pub throttle_rps: Option<u32>,
    /// Most live instances at once; `None` for unlimited.
    pub capacity: Option<usize>,
    /// Whether a booted instance's kubelet registers its Node (default
    /// true); false simulates machines that never join the cluster.
    pub register_nodes: bool,
    /// Refuse in-place version updates with 409 `UpdateRefused` (an
    /// image that does not exist for that version, say).
    pub refuse_updates: bool,
    /// Answer HTTP 500 to every API call whose `User-Agent` contains this
    /// text (one plugin revision's requests: `capstan-plugin/sim@sha256:…`).
    #[serde(default)]
    pub fail_user_agent: Option<String>,
    /// Instances launched by a request whose `User-Agent` contains this
    /// text never register their Node (one plugin revision's instances
    /// never join, as with broken bootstrap data).
    #[serde(default)]
    pub unjoined_user_agent: Option<String>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            boot_latency_ms: 0,
            delete_latency_ms: 0,
            update_latency_ms: 0,
            error_rate: 0.0,
            throttle_rps: None,
            capacity: None,
            register_nodes: true,
            refuse_updates: false,
            fail_user_agent: None,
            unjoined_user_agent: None,
        }
    }
}

/// How to start a simulated cloud.
#[derive(Debug, Clone, Default)]
pub struct SimCloudConfig {
    /// Address to listen on; port 0 picks a free port. Default `127.0.0.1:0`.
    pub listen: Option<SocketAddr>,
    /// Bearer token required on `/v1` calls, if any.
    pub token: Option<String>,
    pub faults: Faults,
    /// Seed of the error-rate dice, for reproducible runs.
    pub seed: u64,
    /// Act as the kubelet of a Node per booted instance in this Kubernetes API.
    pub kube: Option<KubeTarget>,
    /// How that kubelet behaves (heartbeats, pod start delay).
    pub kubelet: KubeletConfig,
    /// Boot every instance as a real node instead ([`realnode`]): real
    /// cloud-init reads its user data, real `kubeadm join` and a real
    /// kubelet join it.
    pub real_nodes: Option<realnode::RealNodeConfig>,
}

/// An instance as the API returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub id: String,
    pub client_token: String,
    pub name: String,
    /// `pending`, `running`, `updating`, `terminating`.
    pub state: String,
    pub version: Option<String>,
    pub instance_type: String,
    pub failure_domain: String,
    pub private_ip: String,
    pub hostname: String,
    pub tags: BTreeMap<String, String>,
    /// In-place update under way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update: Option<UpdateStatus>,
}

/// Progress of an in-place update.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStatus {
    pub target_version: String,
    pub percent: u8,
}

/// Body of `POST /v1/instances`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateInstance {
    pub client_token: String,
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub instance_type: Option<String>,
    #[serde(default)]
    pub failure_domain: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The data the instance boots with (its user data), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<UserData>,
}

/// An instance's user data, as `POST /v1/instances` takes it and
/// `GET /admin/instances/{id}/user-data` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserData {
    /// `cloud-config`, `ignition` or `shell`.
    pub format: String,
    /// Base64 of the data.
    pub value: String,
}

/// Body of `POST /v1/instances/{id}/update`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateInstance {
    pub version: String,
}

/// Error body of every non-2xx answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub code: String,
    pub message: String,
}

/// Counters, from `GET /admin/stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub requests: u64,
    /// API calls by `User-Agent` (authenticated ones, before any fault).
    pub user_agents: std::collections::BTreeMap<String, u64>,
    /// The client tokens (a Machine's uid, for Capstan's providers) of the
    /// instances each `User-Agent` asked about or for, faults or not:
    /// which machines one plugin revision reached.
    pub client_tokens_by_user_agent: BTreeMap<String, std::collections::BTreeSet<String>>,
    pub creates: u64,
    /// Creates that made a new instance (the rest were idempotent repeats).
    pub instances_launched: u64,
    pub deletes: u64,
    pub throttled: u64,
    pub injected_errors: u64,
    pub stockouts: u64,
    pub unauthorized: u64,
    /// Instances that exist now (any state but gone).
    pub live_instances: u64,
    /// Nodes registered in Kubernetes (when configured).
    pub nodes_registered: u64,
    /// Nodes deleted from Kubernetes.
    pub nodes_deleted: u64,
    /// Failed Kubernetes calls (details in the log).
    pub node_errors: u64,
    /// Node Lease renewals (heartbeats).
    pub lease_renewals: u64,
    /// Node status writes (registration aside).
    pub node_status_posts: u64,
    /// Pods the kubelet started.
    pub pods_started: u64,
    /// Pods the kubelet removed after their grace period.
    pub pods_removed: u64,
    /// Requests to `/debug/echo`, `/debug/slow` and `/debug/bytes`.
    pub debug_requests: u64,
    /// The most `/debug/slow` requests open at once.
    pub max_slow_in_flight: u64,
    /// In-place version updates started (a repeated request for the same
    /// target is not counted: it continues the one under way).
    pub updates_started: u64,
    /// Tag changes applied (`PATCH /v1/instances/{id}/tags` calls that
    /// changed something).
    pub tag_writes: u64,
    /// Nodes that joined with their own identity (from user data).
    pub nodes_joined: u64,
    /// Instances that tried to join and gave up.
    pub join_failures: u64,
}

impl Stats {
    fn with_kubelet(mut self, k: Option<KubeletStats>) -> Stats {
        if let Some(k) = k {
            self.nodes_registered = k.nodes_registered;
            self.nodes_deleted = k.nodes_deleted;
            self.node_errors = k.errors;
            self.lease_renewals = k.lease_renewals;
            self.node_status_posts = k.node_status_posts;
            self.pods_started = k.pods_started;
            self.pods_removed = k.pods_removed;
            self.nodes_joined = k.nodes_joined;
            self.join_failures = k.join_failures;
        }
        self
    }
}

#[derive(Debug)]
struct Record {
    id: String,
    req: CreateInstance,
    seq: u64,
    created: Instant,
    version: Option<String>,
    deleting_since: Option<Instant>,
    update: Option<(String, Instant)>,
    /// Stopped out of band (`/admin/instances/{id}/stop`).
    stopped: bool,
}

#[derive(Debug)]
struct Inner {
    faults: Faults,
    token: Option<String>,
    records: BTreeMap<String, Record>,
    by_token: HashMap<String, String>,
    /// Ids with a deletion or an update under way: all that `settle` visits,
    /// so a request costs the same with ten instances or ten thousand.
    changing: BTreeSet<String>,
    next_seq: u64,
    stats: Stats,
    rng: u64,
    bucket: (f64, Instant),
    kubelet: Option<Kubelet>,
    real: Option<realnode::RealNodes>,
    timeline: Timeline,
    echoed: Vec<Echoed>,
    slow_in_flight: u64,
}

/// A request `/debug/echo` received, as it arrived.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Echoed {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers in arrival order, names lower-case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Inner {
    /// Remove instances whose deletion finished; finish due updates.
    fn settle(&mut self, now: Instant) {
        let delete_after = Duration::from_millis(self.faults.delete_latency_ms);
        let update_after = Duration::from_millis(self.faults.update_latency_ms);
        let mut settled = Vec::new();
        for id in &self.changing {
            let Some(r) = self.records.get_mut(id) else {
                settled.push(id.clone());
                continue;
            };
            if r.deleting_since.is_some_and(|t| now >= t + delete_after) {
                settled.push(id.clone());
                continue;
            }
            if let Some((target, since)) = &r.update
                && now >= *since + update_after
            {
                r.version = Some(target.clone());
                r.update = None;
            }
            if r.deleting_since.is_none() && r.update.is_none() {
                settled.push(id.clone());
            }
        }
        for id in settled {
            self.changing.remove(&id);
            if let Some(r) = self.records.get(&id)
                && r.deleting_since.is_some_and(|t| now >= t + delete_after)
                && let Some(r) = self.records.remove(&id)
            {
                self.by_token.remove(&r.req.client_token);
            }
        }
    }

    fn view(&self, r: &Record, now: Instant) -> Instance {
        let booted = now >= r.created + Duration::from_millis(self.faults.boot_latency_ms);
        let update = r.update.as_ref().map(|(target, since)| {
            let total = self.faults.update_latency_ms.max(1) as f64;
            let done = now.duration_since(*since).as_millis() as f64;
            UpdateStatus {
                target_version: target.clone(),
                percent: ((done / total) * 100.0).min(99.0) as u8,
            }
        });
        let state = if r.deleting_since.is_some() {
            "terminating"
        } else if r.stopped {
            "stopped"
        } else if !booted {
            "pending"
        } else if update.is_some() {
            "updating"
        } else {
            "running"
        };
        Instance {
            id: r.id.clone(),
            client_token: r.req.client_token.clone(),
            name: r.req.name.clone(),
            state: state.to_string(),
            version: r.version.clone(),
            instance_type: r
                .req
                .instance_type
                .clone()
                .unwrap_or_else(|| "small".into()),
            failure_domain: r
                .req
                .failure_domain
                .clone()
                .unwrap_or_else(|| format!("zone-{}", (b'a' + (r.seq % 3) as u8) as char)),
            private_ip: format!(
                "10.{}.{}.{}",
                (r.seq >> 16) & 255,
                (r.seq >> 8) & 255,
                r.seq & 255
            ),
            hostname: format!("{}.sim.internal", r.req.name),
            tags: r.req.tags.clone(),
            update,
        }
    }

    fn roll(&mut self) -> f64 {
        // xorshift64*: good enough dice, reproducible by seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Auth, throttling and error injection, in that order.
    fn admit(&mut self, headers: &HeaderMap, now: Instant) -> Result<(), Box<Response>> {
        self.stats.requests += 1;
        if let Some(token) = &self.token {
            let expected = format!("Bearer {token}");
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if given != Some(expected.as_str()) {
                self.stats.unauthorized += 1;
                return Err(Box::new(api_error(
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized",
                    "a valid bearer token is required",
                )));
            }
        }
        if let Some(rps) = self.faults.throttle_rps {
            let (tokens, last) = self.bucket;
            let rps = f64::from(rps.max(1));
            let refilled = (tokens + now.duration_since(last).as_secs_f64() * rps).min(rps);
            if refilled < 1.0 {
                self.bucket = (refilled, now);
                self.stats.throttled += 1;
                let mut resp = api_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Throttling",
                    "request rate exceeded",
                );
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                return Err(Box::new(resp));
            }
            self.bucket = (refilled - 1.0, now);
        }
        let agent = headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !agent.is_empty() {
            *self.stats.user_agents.entry(agent.to_string()).or_default() += 1;
        }
        if let Some(failing) = &self.faults.fail_user_agent
            && agent.contains(failing.as_str())
        {
            self.stats.injected_errors += 1;
            return Err(Box::new(api_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "injected fault for this User-Agent",
            )));
        }
        if self.faults.error_rate > 0.0 && self.roll() < self.faults.error_rate {
            self.stats.injected_errors += 1;
            return Err(Box::new(api_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "injected fault",
            )));
        }
        Ok(())
    }
}

type Shared = Arc<Mutex<Inner>>;

fn api_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(ApiError {
            code: code.into(),
            message: message.into(),
        }),
    )
        .into_response()
}

/// A running simulated cloud. Dropping it stops the server.
#[derive(Debug)]
pub struct SimCloud {
    addr: SocketAddr,
    state: Shared,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl SimCloud {
    /// Bind and serve in the background on the current tokio runtime.
    pub async fn start(config: SimCloudConfig) -> std::io::Result<SimCloud> {
        let timeline = Timeline::default();
        let kubelet = match config.kube.clone() {
            Some(target) => Some(
                Kubelet::start(target, config.kubelet.clone(), timeline.clone())
                    .await
                    .map_err(std::io::Error::other)?,
            ),
            None => None,
        };
        let real = match config.real_nodes.clone() {
            Some(real) => Some(
                realnode::RealNodes::start(real)
                    .await
                    .map_err(std::io::Error::other)?,
            ),
            None => None,
        };
        let listen = config
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let rps = f64::from(config.faults.throttle_rps.unwrap_or(1).max(1));
        let state: Shared = Arc::new(Mutex::new(Inner {
            faults: config.faults,
            token: config.token,
            records: BTreeMap::new(),
            by_token: HashMap::new(),
            changing: BTreeSet::new(),
            next_seq: 1,
            stats: Stats::default(),
            rng: config.seed | 1,
            bucket: (rps, Instant::now()),
            kubelet,
            real,
            timeline,
            echoed: Vec::new(),
            slow_in_flight: 0,
        }));
        let app = router(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(SimCloud {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, for example `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        current_stats(&self.state)
    }

    /// The simulated kubelet, when a Kubernetes API was configured.
    pub fn kubelet(&self) -> Option<Kubelet> {
        lock(&self.state).kubelet.clone()
    }

    /// The real instances, when the cloud boots real nodes.
    pub fn real_nodes(&self) -> Option<realnode::RealNodes> {
        lock(&self.state).real.clone()
    }

    /// Every live instance.
    pub fn instances(&self) -> Vec<Instance> {
        let mut inner = lock(&self.state);
        let now = Instant::now();
        inner.settle(now);
        inner.records.values().map(|r| inner.view(r, now)).collect()
    }

    /// Every request `/debug/echo` received, oldest first.
    pub fn echoed(&self) -> Vec<Echoed> {
        lock(&self.state).echoed.clone()
    }

    /// Replace the fault settings.
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.state).faults = faults;
    }

    /// Stop serving and wait for the server task to end.
    pub async fn shutdown(mut self) {
        let real = lock(&self.state).real.take();
        if let Some(real) = real {
            let _ = tokio::task::spawn_blocking(move || real.shutdown()).await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimCloud {
    fn drop(&mut self) {
        // Real instances are processes of this machine: none outlives the cloud.
        if let Some(real) = lock(&self.state).real.take() {
            real.shutdown();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The prologue of every `/v1` call: lock, admit (auth, throttling, error
/// injection), and settle finished deletions and updates.
#[allow(clippy::result_large_err)]
fn begin<'a>(
    state: &'a Shared,
    headers: &HeaderMap,
    about: About<'_>,
) -> Result<(std::sync::MutexGuard<'a, Inner>, Instant), Response> {
    let now = Instant::now();
    let mut inner = lock(state);
    inner.attribute(headers, about);
    inner.admit(headers, now).map_err(|r| *r)?;
    inner.settle(now);
    Ok((inner, now))
}

/// The instance a call is about, for [`Stats::client_tokens_by_user_agent`].
#[derive(Debug, Clone, Copy)]
enum About<'a> {
    /// A client token (create, list by token).
    Token(&'a str),
    /// An instance id.
    Instance(&'a str),
    /// No one instance.
    Nothing,
}

impl Inner {
    fn attribute(&mut self, headers: &HeaderMap, about: About<'_>) {
        let Some(agent) = headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .filter(|a| !a.is_empty())
        else {
            return;
        };
        let token = match about {
            About::Token(t) => Some(t.to_string()),
            About::Instance(id) => self.records.get(id).map(|r| r.req.client_token.clone()),
            About::Nothing => None,
        };
        if let Some(token) = token {
            self.stats
                .client_tokens_by_user_agent
                .entry(agent.to_string())
                .or_default()
                .insert(token);
        }
    }
}

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, Inner> {
    // A panic while holding the lock leaves consistent data (every mutation
    // is a single step), so a poisoned lock is still usable.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    client_token: Option<String>,
    /// With `tagValue`: only instances carrying this tag.
    tag_key: Option<String>,
    tag_value: Option<String>,
}

/// The HTTP API:
///
/// | method and path | answer |
/// |---|---|
/// | `POST /v1/instances` ([`CreateInstance`]) | 201 new, 200 existing (same client token), 503 `InsufficientCapacity` |
/// | `GET /v1/instances[?clientToken=T][&tagKey=K&tagValue=V]` | 200 `{"instances": [...]}` (with a tag: only those carrying it) |
/// | `GET /v1/instances/{id}` | 200 [`Instance`], 404 |
/// | `DELETE /v1/instances/{id}` | 202 terminating, 404 gone |
/// | `POST /v1/instances/{id}/update` ([`UpdateInstance`]) | 202 updating, 404, 409 while terminating or with the `refuseUpdates` fault |
/// | `PATCH /v1/instances/{id}/tags` (`{"key": "value" or null}`) | 200 [`Instance`] with the tags set or removed at once, 404, 409 while terminating |
/// | `GET /admin/stats` | [`Stats`] |
/// | `PUT /admin/faults` ([`Faults`]) | 204 |
/// | `PUT /admin/instances/{id}/ready` (`{"ready": false}`) | 204; the instance's Node reports `Ready=False` (`true` clears it) |
/// | `GET /admin/instances/{id}/user-data` | 200 [`UserData`] the instance was launched with, 404 (`NoUserData` when it has none) |
/// | `POST /admin/instances/{id}/stop` | 204; the instance is `stopped`, as if stopped from the cloud console (its Node is left alone) |
/// | `POST /admin/instances/{id}/vanish` | 204; the instance is gone at once, as if terminated and reaped out of band, and its Node is left in place |
/// | `POST /admin/instances/{id}/kubelet/{STOP,CONT,KILL}` | 204; a real instance's kubelet gets that signal (409 `NoRealNodes` in a cloud without real nodes) |
/// | `GET /admin/joins` | 200 how each instance's join went ([`JoinReport`]: `joining`, `joined`, `failed` with why, `no-join-data`) |
/// | `GET /admin/nodes` | 200 the kubelet's Nodes and their fault switches |
/// | `POST /admin/kubelet/restart` | 200 `{"nodes": N}`; restarts the kubelet on every instance (as after a control-plane restore): new watches, and each Node registers again with its own credentials, created anew if it was lost |
/// | `PUT /admin/nodes/{node}/heartbeats` (`{"enabled": false}`) | 204; stops (or restarts) that Node's kubelet: no Lease, no status, no pod changes |
/// | `PUT /admin/nodes/{node}/conditions` ([`ConditionOverride`]) | 204; the Node reports that condition, for `seconds` or until cleared |
/// | `DELETE /admin/nodes/{node}/conditions/{type}` | 204; the kubelet reports its own again |
/// | `PUT /admin/pods/{namespace}/{name}/readiness` (`{"ready": false}`) | 204; the pod fails (or passes) readiness |
/// | `GET /debug/redirect?to=URL` | 302 to `URL` (for redirect-escape tests) |
/// | `ANY /debug/echo` | 200 [`Echoed`]: the request as received (for credential tests) |
/// | `GET /debug/bytes?n=N` | 200, `N` bytes (at most 64 MiB): an answer of a chosen size |
/// | `GET /debug/slow?ms=N` | 200 after `N` ms; counts how many are open at once (for request-budget tests) |
///
/// The kubelet routes answer 409 `NoKubernetes` when the cloud was started
/// without a Kubernetes API, 404 `NodeNotFound` for an unknown Node and 400
/// `InvalidParameter` for a bad request.
///
/// Every `/v1` call may answer 401 (token), 429 with `Retry-After`
/// (throttling) or 500 (injected error).
fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/instances", post(create).get(list))
        .route("/v1/instances/{id}", get(describe).delete(delete))
        .route("/v1/instances/{id}/update", post(update))
        .route("/v1/instances/{id}/tags", axum::routing::patch(patch_tags))
        .route("/v1/instance-types/{name}", get(describe_instance_type))
        .route("/admin/stats", get(stats))
        .route("/admin/faults", put(set_faults))
        .route("/admin/instances/{id}/ready", put(set_node_ready))
        .route("/admin/instances/{id}/user-data", get(user_data))
        .route("/admin/instances/{id}/stop", post(stop_instance))
        .route("/admin/instances/{id}/vanish", post(vanish_instance))
        .route(
            "/admin/instances/{id}/kubelet/{signal}",
            post(signal_kubelet),
        )
        .route("/admin/nodes", get(list_nodes))
        .route("/admin/kubelet/restart", post(restart_kubelet))
        .route("/admin/joins", get(list_joins))
        .route("/admin/timeline", get(timeline))
        .route("/admin/nodes/{node}/heartbeats", put(set_heartbeats))
        .route("/admin/nodes/{node}/conditions", put(set_condition))
        .route(
            "/admin/nodes/{node}/conditions/{type}",
            axum::routing::delete(clear_condition),
        )
        .route(
            "/admin/pods/{namespace}/{name}/readiness",
            put(set_pod_ready),
        )
        .route("/debug/redirect", get(redirect))
        .route("/debug/echo", axum::routing::any(echo))
        .route("/debug/slow", get(slow))
        .route("/debug/bytes", get(bytes_of))
        .with_state(state)
}

async fn create(
    State(state): State<Shared>,
    headers: HeaderMap,
    Json(req): Json<CreateInstance>,
) -> Response {
    let (mut inner, now) = match begin(&state, &headers, About::Token(&req.client_token)) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    inner.stats.creates += 1;
    if req.client_token.is_empty() {
        return api_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "clientToken is required",
        );
    }
    if let Some(id) = inner.by_token.get(&req.client_token)
        && let Some(r) = inner.records.get(id)
    {
        return (StatusCode::OK, Json(inner.view(r, now))).into_response();
    }
    if let Some(cap) = inner.faults.capacity
        && inner.records.len() >= cap
    {
        inner.stats.stockouts += 1;
        return api_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "InsufficientCapacity",
            "no capacity left for this instance type",
        );
    }
    let seq = inner.next_seq;
    inner.next_seq += 1;
    let id = format!("i-{seq:06}");
    let record = Record {
        id: id.clone(),
        version: req.version.clone(),
        req,
        seq,
        created: now,
        deleting_since: None,
        update: None,
        stopped: false,
    };
    inner
        .by_token
        .insert(record.req.client_token.clone(), id.clone());
    let view = inner.view(&record, now);
    inner.records.insert(id, record);
    inner.stats.instances_launched += 1;
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let joins = inner.faults.register_nodes
        && !inner
            .faults
            .unjoined_user_agent
            .as_deref()
            .is_some_and(|unjoined| agent.contains(unjoined));
    if let Some(real) = inner.real.clone() {
        // A real node boots from its user data (without any it boots, and
        // joins nothing).
        let boot = Duration::from_millis(inner.faults.boot_latency_ms);
        let data = inner
            .records
            .get(&view.id)
            .and_then(|r| r.req.user_data.clone());
        let id = view.id.clone();
        node_call_later(boot, async move {
            use base64::Engine as _;
            let bytes = match data {
                Some(d) => base64::engine::general_purpose::STANDARD
                    .decode(&d.value)
                    .map_err(|e| format!("user data is not base64: {e}"))?,
                None => Vec::new(),
            };
            let booted = real.boot(&id, &bytes);
            if let Err(e) = &booted {
                tracing::warn!(instance = %id, error = %e, "the real instance did not boot");
            }
            booted
        });
    } else if let Some(kubelet) = inner.kubelet.clone().filter(|_| joins) {
        let boot = Duration::from_millis(inner.faults.boot_latency_ms);
        let node = NodeSpec {
            name: node_name(&view.id),
            provider_id: format!("sim://{}", view.id),
            internal_ip: view.private_ip.clone(),
            hostname: view.hostname.clone(),
            zone: view.failure_domain.clone(),
            version: view.version.clone(),
            ..Default::default()
        };
        let user_data = inner
            .records
            .get(&view.id)
            .and_then(|r| r.req.user_data.clone());
        // It boots from its user data, as a real instance does; without
        // any it joins nothing, unless the kubelet registers it as itself.
        match user_data {
            Some(data) => node_call_later(boot, async move {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&data.value)
                    .map_err(|e| format!("user data is not base64: {e}"))?;
                kubelet.join(node, &data.format, &bytes).await
            }),
            None if kubelet.config().shared_identity_without_join_data => {
                node_call_later(boot, async move { kubelet.register(node).await })
            }
            None => kubelet.no_join_data(&node.provider_id),
        }
    }
    (StatusCode::CREATED, Json(view)).into_response()
}

async fn list(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    let (inner, now) = match begin(
        &state,
        &headers,
        q.client_token
            .as_deref()
            .map_or(About::Nothing, About::Token),
    ) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    let instances: Vec<Instance> = match &q.client_token {
        Some(token) => inner
            .by_token
            .get(token)
            .and_then(|id| inner.records.get(id))
            .map(|r| inner.view(r, now))
            .into_iter()
            .collect(),
        None => inner.records.values().map(|r| inner.view(r, now)).collect(),
    };
    let instances: Vec<Instance> = match (&q.tag_key, &q.tag_value) {
        (Some(key), Some(value)) => instances
            .into_iter()
            .filter(|i| i.tags.get(key) == Some(value))
            .collect(),
        _ => instances,
    };
    Json(serde_json::json!({ "instances": instances })).into_response()
}

async fn describe(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let (inner, now) = match begin(&state, &headers, About::Instance(&id)) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    match inner.records.get(&id) {
        Some(r) => Json(inner.view(r, now)).into_response(),
        None => not_found(&id),
    }
}

/// The simulated instance types: each boots the same Node (the
/// kubelet's `CAPACITY_*`), so this is what any of them offers.
const INSTANCE_TYPES: [&str; 3] = ["small", "medium", "large"];

async fn describe_instance_type(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Err(resp) = begin(&state, &headers, About::Nothing) {
        return resp;
    }
    if !INSTANCE_TYPES.contains(&name.as_str()) {
        return api_error(
            StatusCode::NOT_FOUND,
            "InstanceTypeNotFound",
            &format!("instance type {name} does not exist"),
        );
    }
    let quantity = |q: &str| q.trim_end_matches("Gi").parse::<u64>().unwrap_or(0) * 1024;
    Json(serde_json::json!({
        "name": name,
        "cpus": kubelet::node::CAPACITY_CPU.parse::<u32>().unwrap_or(0),
        "memoryMiB": quantity(kubelet::node::CAPACITY_MEMORY),
        "maxPods": kubelet::node::CAPACITY_PODS.parse::<u32>().unwrap_or(0),
        "ephemeralDiskMiB": quantity(kubelet::node::CAPACITY_EPHEMERAL_STORAGE),
    }))
    .into_response()
}

fn not_found(id: &str) -> Response {
    api_error(
        StatusCode::NOT_FOUND,
        "InstanceNotFound",
        &format!("instance {id} does not exist"),
    )
}

async fn delete(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let (mut inner, now) = match begin(&state, &headers, About::Instance(&id)) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    inner.stats.deletes += 1;
    let Some(r) = inner.records.get_mut(&id) else {
        return not_found(&id);
    };
    let first_delete = r.deleting_since.is_none();
    r.deleting_since.get_or_insert(now);
    if first_delete {
        inner
            .timeline
            .record("instance-delete-requested", &id, Some(&node_name(&id)));
    }
    inner.changing.insert(id.clone());
    if first_delete && let Some(real) = inner.real.clone() {
        let after = Duration::from_millis(inner.faults.delete_latency_ms);
        let id = id.clone();
        node_call_later(after, async move {
            let _ = tokio::task::spawn_blocking(move || real.terminate(&id)).await;
            Ok(())
        });
    } else if first_delete && let Some(kubelet) = inner.kubelet.clone() {
        let after = Duration::from_millis(inner.faults.delete_latency_ms);
        let name = kubelet
            .node_of(&format!("sim://{id}"))
            .unwrap_or_else(|| node_name(&id));
        node_call_later(after, async move { kubelet.unregister(&name).await });
    }
    inner.settle(now);
    match inner.records.get(&id) {
        Some(r) => (StatusCode::ACCEPTED, Json(inner.view(r, now))).into_response(),
        None => not_found(&id),
    }
}

async fn update(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(req): Json<UpdateInstance>,
) -> Response {
    let (mut inner, now) = match begin(&state, &headers, About::Instance(&id)) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    let Some(r) = inner.records.get_mut(&id) else {
        return not_found(&id);
    };
    if r.deleting_since.is_some() {
        return api_error(
            StatusCode::CONFLICT,
            "IncorrectState",
            "instance is terminating",
        );
    }
    if inner.faults.refuse_updates {
        return api_error(
            StatusCode::CONFLICT,
            "UpdateRefused",
            &format!("no image for version {} (injected fault)", req.version),
        );
    }
    let r = inner.records.get_mut(&id).expect("looked up above");
    let same_target = r.update.as_ref().is_some_and(|(t, _)| *t == req.version);
    if !same_target && r.version.as_deref() != Some(req.version.as_str()) {
        r.update = Some((req.version, now));
        inner.changing.insert(id.clone());
        inner.stats.updates_started += 1;
        inner
            .timeline
            .record("instance-update-started", &id, Some(&node_name(&id)));
    }
    inner.settle(now);
    match inner.records.get(&id) {
        Some(r) => (StatusCode::ACCEPTED, Json(inner.view(r, now))).into_response(),
        None => not_found(&id),
    }
}

/// `PATCH /v1/instances/{id}/tags`: set (string) or remove (`null`) tags,
/// at once, without a restart.
async fn patch_tags(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(req): Json<BTreeMap<String, Option<String>>>,
) -> Response {
    let (mut inner, now) = match begin(&state, &headers, About::Instance(&id)) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    let Some(r) = inner.records.get_mut(&id) else {
        return not_found(&id);
    };
    if r.deleting_since.is_some() {
        return api_error(
            StatusCode::CONFLICT,
            "IncorrectState",
            "instance is terminating",
        );
    }
    let mut changed = false;
    for (key, value) in req {
        let before = r.req.tags.get(&key).cloned();
        if before != value {
            changed = true;
            match value {
                Some(v) => r.req.tags.insert(key, v),
                None => r.req.tags.remove(&key),
            };
        }
    }
    if changed {
        inner.stats.tag_writes += 1;
    }
    match inner.records.get(&id) {
        Some(r) => (StatusCode::OK, Json(inner.view(r, now))).into_response(),
        None => not_found(&id),
    }
}

fn current_stats(state: &Shared) -> Stats {
    let mut inner = lock(state);
    inner.settle(Instant::now());
    let mut stats = inner.stats.clone();
    stats.live_instances = inner.records.len() as u64;
    stats.with_kubelet(inner.kubelet.as_ref().map(Kubelet::stats))
}

async fn stats(State(state): State<Shared>) -> Response {
    Json(current_stats(&state)).into_response()
}

async fn timeline(State(state): State<Shared>) -> Response {
    Json(serde_json::json!({ "moments": lock(&state).timeline.moments() })).into_response()
}

async fn set_faults(State(state): State<Shared>, Json(faults): Json<Faults>) -> StatusCode {
    lock(&state).faults = faults;
    StatusCode::NO_CONTENT
}

/// Run a kubelet call after `delay` without holding up the cloud's answer
/// (its errors are counted and logged by the kubelet).
fn node_call_later(
    delay: Duration,
    call: impl std::future::Future<Output = Result<(), String>> + Send + 'static,
) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let _ = call.await;
    });
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeReady {
    ready: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Enabled {
    enabled: bool,
}

/// The kubelet, or the 409 that says the cloud runs without Kubernetes.
#[allow(clippy::result_large_err)]
fn kubelet_of(state: &Shared) -> Result<Kubelet, Response> {
    lock(state).kubelet.clone().ok_or_else(|| {
        api_error(
            StatusCode::CONFLICT,
            "NoKubernetes",
            "the simulated cloud was started without a Kubernetes API (--kube-url)",
        )
    })
}

fn switched(result: Result<(), kubelet::SwitchError>) -> Response {
    use kubelet::SwitchError;
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e @ SwitchError::UnknownNode(_)) => {
            api_error(StatusCode::NOT_FOUND, "NodeNotFound", &e.to_string())
        }
        Err(e @ SwitchError::Invalid(_)) => {
            api_error(StatusCode::BAD_REQUEST, "InvalidParameter", &e.to_string())
        }
        Err(e @ SwitchError::Kubernetes(_)) => {
            api_error(StatusCode::BAD_GATEWAY, "KubernetesError", &e.to_string())
        }
    }
}

/// Shorthand kept from before the general switches: `ready: false` forces
/// `Ready=False` on the instance's Node, `ready: true` clears that.
async fn user_data(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match lock(&state).records.get(&id) {
        Some(r) => match &r.req.user_data {
            Some(data) => Json(data.clone()).into_response(),
            None => api_error(
                StatusCode::NOT_FOUND,
                "NoUserData",
                &format!("instance {id} was launched without user data"),
            ),
        },
        None => not_found(&id),
    }
}

async fn stop_instance(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let real = {
        let mut inner = lock(&state);
        let real = inner.real.clone();
        match inner.records.get_mut(&id) {
            Some(r) => r.stopped = true,
            None => return not_found(&id),
        }
        real
    };
    // A real instance powers off: every process of it stops.
    if let Some(real) = real {
        let _ = tokio::task::spawn_blocking(move || real.power_off(&id)).await;
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /admin/instances/{id}/kubelet/{signal}`: send a real instance's
/// kubelet `STOP`, `CONT` or `KILL`.
async fn signal_kubelet(
    State(state): State<Shared>,
    Path((id, signal)): Path<(String, String)>,
) -> Response {
    let Some(real) = lock(&state).real.clone() else {
        return api_error(
            StatusCode::CONFLICT,
            "NoRealNodes",
            "this cloud boots no real nodes",
        );
    };
    if !["STOP", "CONT", "KILL"].contains(&signal.as_str()) {
        return api_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "signal must be STOP, CONT or KILL",
        );
    }
    match real.signal_kubelet(&id, &signal) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(StatusCode::NOT_FOUND, "NoKubelet", &e),
    }
}

async fn vanish_instance(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut inner = lock(&state);
    match inner.records.remove(&id) {
        Some(r) => {
            inner.by_token.remove(&r.req.client_token);
            inner.changing.remove(&id);
            if let Some(real) = inner.real.clone() {
                let id = id.clone();
                tokio::task::spawn_blocking(move || real.terminate(&id));
            }
            StatusCode::NO_CONTENT.into_response()
        }
        None => not_found(&id),
    }
}

async fn set_node_ready(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<NodeReady>,
) -> Response {
    if !lock(&state).records.contains_key(&id) {
        return not_found(&id);
    }
    let kubelet = match kubelet_of(&state) {
        Ok(k) => k,
        Err(resp) => return resp,
    };
    let name = kubelet
        .node_of(&format!("sim://{id}"))
        .unwrap_or_else(|| node_name(&id));
    switched(if req.ready {
        kubelet.clear_condition(&name, "Ready").await
    } else {
        kubelet
            .set_condition(
                &name,
                ConditionOverride {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: Some("KubeletNotReady".into()),
                    message: Some("simulated kubelet was told to report not ready".into()),
                    seconds: None,
                },
            )
            .await
    })
}

async fn list_joins(State(state): State<Shared>) -> Response {
    match kubelet_of(&state) {
        Ok(k) => Json(serde_json::json!({ "joins": k.joins() })).into_response(),
        Err(resp) => resp,
    }
}

async fn list_nodes(State(state): State<Shared>) -> Response {
    match kubelet_of(&state) {
        Ok(k) => Json(serde_json::json!({ "nodes": k.nodes() })).into_response(),
        Err(resp) => resp,
    }
}

async fn restart_kubelet(State(state): State<Shared>) -> Response {
    let kubelet = match kubelet_of(&state) {
        Ok(k) => k,
        Err(resp) => return resp,
    };
    match kubelet.restart().await {
        Ok(nodes) => Json(serde_json::json!({ "nodes": nodes })).into_response(),
        Err(e) => api_error(StatusCode::BAD_GATEWAY, "KubernetesError", &e),
    }
}

async fn set_heartbeats(
    State(state): State<Shared>,
    Path(node): Path<String>,
    Json(req): Json<Enabled>,
) -> Response {
    match kubelet_of(&state) {
        Ok(k) => switched(k.set_heartbeats(&node, req.enabled)),
        Err(resp) => resp,
    }
}

async fn set_condition(
    State(state): State<Shared>,
    Path(node): Path<String>,
    Json(req): Json<ConditionOverride>,
) -> Response {
    match kubelet_of(&state) {
        Ok(k) => switched(k.set_condition(&node, req).await),
        Err(resp) => resp,
    }
}

async fn clear_condition(
    State(state): State<Shared>,
    Path((node, type_)): Path<(String, String)>,
) -> Response {
    match kubelet_of(&state) {
        Ok(k) => switched(k.clear_condition(&node, &type_).await),
        Err(resp) => resp,
    }
}

async fn set_pod_ready(
    State(state): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    Json(req): Json<NodeReady>,
) -> Response {
    match kubelet_of(&state) {
        Ok(k) => {
            k.set_pod_ready(&namespace, &name, req.ready);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(resp) => resp,
    }
}

#[derive(Debug, Deserialize)]
struct RedirectQuery {
    to: String,
}

async fn echo(
    State(state): State<Shared>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let echoed = Echoed {
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "/".into()),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let mut inner = lock(&state);
    inner.stats.debug_requests += 1;
    inner.echoed.push(echoed.clone());
    Json(echoed).into_response()
}

#[derive(Deserialize)]
struct SlowQuery {
    ms: u64,
}

async fn slow(State(state): State<Shared>, Query(q): Query<SlowQuery>) -> Response {
    {
        let mut inner = lock(&state);
        inner.stats.debug_requests += 1;
        inner.slow_in_flight += 1;
        inner.stats.max_slow_in_flight = inner.stats.max_slow_in_flight.max(inner.slow_in_flight);
    }
    // Counted out when the answer is sent or the client goes away.
    struct Open(Shared);
    impl Drop for Open {
        fn drop(&mut self) {
            lock(&self.0).slow_in_flight -= 1;
        }
    }
    let _open = Open(state);
    tokio::time::sleep(Duration::from_millis(q.ms.min(60_000))).await;
    StatusCode::OK.into_response()
}

#[derive(Deserialize)]
struct BytesQuery {
    n: usize,
}

/// `n` bytes (at most 64 MiB): an answer of a chosen size.
async fn bytes_of(State(state): State<Shared>, Query(q): Query<BytesQuery>) -> Response {
    lock(&state).stats.debug_requests += 1;
    vec![b'x'; q.n.min(64 * 1024 * 1024)].into_response()
}

async fn redirect(Query(q): Query<RedirectQuery>) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, q.to)]).into_response()
}
