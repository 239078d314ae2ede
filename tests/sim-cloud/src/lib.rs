//! The simulated cloud: a small HTTP "cloud API" for scale and fault tests,
//! like Cluster API's in-memory provider.
//!
//! Instances are created idempotently by client token, boot after a
//! configurable latency, can be updated in place (version, asynchronously with
//! progress) and deleted (asynchronously). Faults are configurable at start
//! and at run time (`PUT /admin/faults`): a random error rate (HTTP 500),
//! throttling (HTTP 429 with `Retry-After`), capacity (HTTP 503
//! `InsufficientCapacity`, a stock-out), and a required bearer token.
//!
//! Start with [`SimCloud::start`]; the HTTP API is described on `router`
//! below (and in the README).
//! State is computed from timestamps when read. With a Kubernetes API
//! configured ([`SimCloudConfig::kube`]), the [`kubelet`] module registers a
//! Node for each instance once it has booted, and deletes it with the
//! instance.

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
pub use kubelet::{KubeTarget, Kubelet, NodeSpec, agent_trusting, node_name};

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
    /// Register a Node per booted instance in this Kubernetes API.
    pub kube: Option<KubeTarget>,
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
        let kubelet = config
            .kube
            .clone()
            .map(Kubelet::new)
            .transpose()
            .map_err(std::io::Error::other)?;
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
        let mut inner = lock(&self.state);
        inner.settle(Instant::now());
        let mut stats = inner.stats.clone();
        stats.live_instances = inner.records.len() as u64;
        stats
    }

    /// Every live instance.
    pub fn instances(&self) -> Vec<Instance> {
        let mut inner = lock(&self.state);
        let now = Instant::now();
        inner.settle(now);
        inner.records.values().map(|r| inner.view(r, now)).collect()
    }

    /// Replace the fault settings.
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.state).faults = faults;
    }

    /// Stop serving and wait for the server task to end.
    pub async fn shutdown(mut self) {
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
) -> Result<(std::sync::MutexGuard<'a, Inner>, Instant), Response> {
    let now = Instant::now();
    let mut inner = lock(state);
    inner.admit(headers, now).map_err(|r| *r)?;
    inner.settle(now);
    Ok((inner, now))
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
}

/// The HTTP API:
///
/// | method and path | answer |
/// |---|---|
/// | `POST /v1/instances` ([`CreateInstance`]) | 201 new, 200 existing (same client token), 503 `InsufficientCapacity` |
/// | `GET /v1/instances[?clientToken=T]` | 200 `{"instances": [...]}` |
/// | `GET /v1/instances/{id}` | 200 [`Instance`], 404 |
/// | `DELETE /v1/instances/{id}` | 202 terminating, 404 gone |
/// | `POST /v1/instances/{id}/update` ([`UpdateInstance`]) | 202 updating, 404, 409 while terminating |
/// | `GET /admin/stats` | [`Stats`] |
/// | `PUT /admin/faults` ([`Faults`]) | 204 |
/// | `PUT /admin/instances/{id}/ready` (`{"ready": false}`) | 204; flips the Node's `Ready` condition |
/// | `GET /debug/redirect?to=URL` | 302 to `URL` (for redirect-escape tests) |
///
/// Every `/v1` call may answer 401 (token), 429 with `Retry-After`
/// (throttling) or 500 (injected error).
fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/instances", post(create).get(list))
        .route("/v1/instances/{id}", get(describe).delete(delete))
        .route("/v1/instances/{id}/update", post(update))
        .route("/admin/stats", get(stats))
        .route("/admin/faults", put(set_faults))
        .route("/admin/instances/{id}/ready", put(set_node_ready))
        .route("/debug/redirect", get(redirect))
        .with_state(state)
}

async fn create(
    State(state): State<Shared>,
    headers: HeaderMap,
    Json(req): Json<CreateInstance>,
) -> Response {
    let (mut inner, now) = match begin(&state, &headers) {
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
    };
    inner
        .by_token
        .insert(record.req.client_token.clone(), id.clone());
    let view = inner.view(&record, now);
    inner.records.insert(id, record);
    inner.stats.instances_launched += 1;
    if let Some(kubelet) = inner.kubelet.clone() {
        let boot = Duration::from_millis(inner.faults.boot_latency_ms);
        let node = NodeSpec {
            name: node_name(&view.id),
            provider_id: format!("sim://{}", view.id),
            internal_ip: view.private_ip.clone(),
            hostname: view.hostname.clone(),
            zone: view.failure_domain.clone(),
            version: view.version.clone(),
        };
        node_call_later(
            &state,
            boot,
            move || kubelet.register(&node),
            |s| s.nodes_registered += 1,
        );
    }
    (StatusCode::CREATED, Json(view)).into_response()
}

async fn list(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    let (inner, now) = match begin(&state, &headers) {
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
    Json(serde_json::json!({ "instances": instances })).into_response()
}

async fn describe(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let (inner, now) = match begin(&state, &headers) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    match inner.records.get(&id) {
        Some(r) => Json(inner.view(r, now)).into_response(),
        None => not_found(&id),
    }
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
    let (mut inner, now) = match begin(&state, &headers) {
        Ok(begun) => begun,
        Err(resp) => return resp,
    };
    inner.stats.deletes += 1;
    let Some(r) = inner.records.get_mut(&id) else {
        return not_found(&id);
    };
    let first_delete = r.deleting_since.is_none();
    r.deleting_since.get_or_insert(now);
    inner.changing.insert(id.clone());
    if first_delete && let Some(kubelet) = inner.kubelet.clone() {
        let after = Duration::from_millis(inner.faults.delete_latency_ms);
        let name = node_name(&id);
        node_call_later(
            &state,
            after,
            move || kubelet.delete(&name),
            |s| s.nodes_deleted += 1,
        );
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
    let (mut inner, now) = match begin(&state, &headers) {
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
    let same_target = r.update.as_ref().is_some_and(|(t, _)| *t == req.version);
    if !same_target && r.version.as_deref() != Some(req.version.as_str()) {
        r.update = Some((req.version, now));
        inner.changing.insert(id.clone());
    }
    inner.settle(now);
    match inner.records.get(&id) {
        Some(r) => (StatusCode::ACCEPTED, Json(inner.view(r, now))).into_response(),
        None => not_found(&id),
    }
}

async fn stats(State(state): State<Shared>) -> Response {
    let mut inner = lock(&state);
    inner.settle(Instant::now());
    let mut stats = inner.stats.clone();
    stats.live_instances = inner.records.len() as u64;
    Json(stats).into_response()
}

async fn set_faults(State(state): State<Shared>, Json(faults): Json<Faults>) -> StatusCode {
    lock(&state).faults = faults;
    StatusCode::NO_CONTENT
}

/// Run a Kubernetes call after `delay`, off the async threads, and count it.
fn node_call_later(
    state: &Shared,
    delay: Duration,
    call: impl FnOnce() -> Result<(), String> + Send + 'static,
    on_ok: impl FnOnce(&mut Stats) + Send + 'static,
) {
    let state = state.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let result = tokio::task::spawn_blocking(call)
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        let mut inner = lock(&state);
        match result {
            Ok(()) => on_ok(&mut inner.stats),
            Err(e) => {
                inner.stats.node_errors += 1;
                tracing::warn!(error = %e, "simulated kubelet call failed");
            }
        }
    });
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeReady {
    ready: bool,
}

async fn set_node_ready(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<NodeReady>,
) -> Response {
    let kubelet = {
        let inner = lock(&state);
        if !inner.records.contains_key(&id) {
            return not_found(&id);
        }
        inner.kubelet.clone()
    };
    let Some(kubelet) = kubelet else {
        return api_error(
            StatusCode::CONFLICT,
            "NoKubernetes",
            "the simulated cloud was started without a Kubernetes API",
        );
    };
    let name = node_name(&id);
    match tokio::task::spawn_blocking(move || kubelet.set_ready(&name, req.ready)).await {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => api_error(StatusCode::BAD_GATEWAY, "KubernetesError", &e),
        Err(e) => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            &e.to_string(),
        ),
    }
}

#[derive(Debug, Deserialize)]
struct RedirectQuery {
    to: String,
}

async fn redirect(Query(q): Query<RedirectQuery>) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, q.to)]).into_response()
}
