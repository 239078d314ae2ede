//! `hostile`: a deliberately misbehaving provider plugin, used only as a test
//! fixture to prove the sandbox's limits. Never deploy it.
//!
//! The provider config picks the attack that `create` performs, and
//! `transport` how its requests leave: `wasi` (`wasi:http`, the default) or
//! `capstan` (`capstan:plugin/http`), so one table of refusals runs
//! through both:
//!
//! | `attack` | what it does | what the host must report |
//! |---|---|---|
//! | `infinite-loop` | spins forever | deadline exceeded |
//! | `memory-bomb` | allocates until it cannot | memory limit |
//! | `stdout-flood` | prints without end | output limit (stdout) |
//! | `log-flood` | logs without end | output limit (log) |
//! | `oversized-return` | returns a 4 MiB status message | output limit (return value) |
//! | `undeclared-host` | GETs `target`, a host its manifest does not declare | capability denied |
//! | `redirect` | GETs `target` (granted) and follows its redirect elsewhere | capability denied |
//! | `host-header` | GETs `target` with a forged `Host` header | the request never leaves with it |
//! | `trap` | panics | trap, naming plugin and function |
//! | `entropy` | POSTs 16 random bytes and the wall-clock time to `endpoint` and returns the answer | a replay reproduces it exactly |
//! | `escape` | reads `/`, the environment, and connects a socket to `target` | all three find nothing |
//! | `non-idempotent` | creates a new instance at `endpoint` on every call | conformance failure |
//! | `request-flood` | starts 400 GETs of `target` at once and keeps the answers unread, then 100,000 more without waiting | requests-in-flight limit; the host's memory stays flat |
//! | `header-hoard` | builds wasi:http header maps of 12 KiB each and keeps them all | the per-call handle cap and header-map size: host memory within 16 MiB |
//! | `long-message` | answers with a 200 KiB status message (create and get) | plugin text bounded to 1 KiB in conditions |
//! | `long-error` | fails with a 200 KiB terminal error | plugin text bounded in status and Events |
//! | `request-serial` | GETs `target` 1,000 times, one after another | requests-per-call limit |
//! | `probe-credentials` | reports its environment and what `target` (an echo) received, then GETs `endpoint` | no secret in what it saw; `endpoint` never contacted |
//! | `trace` | sends a TRACE request to `target` (granted, with a credential) to have its Authorization header echoed back | capability denied: credentials never go with TRACE |
//! | `claim-node` | reports `target` as its instance's provider ID (create and get) | the Node with that ID is never linked, tainted, drained or deleted |
//! | `absurd-capacity` | says an instance has 4 million cores and a GPU type with a line break | nothing it says reaches the autoscaler's annotations |
//! | `stash` | leaves `capstan-secret:<machine uid>` in a static, the heap, a deep stack frame, a freshly grown memory region, stdout and a leaked wasi:http header map, then does what `then` says (`trap`, `deadline`: spin, `memory`: allocate without end; default: return) | the next call finds none of it |
//! | `peek` | scans all of its linear memory and its static for `capstan-secret:` and fails with what it found (its own `self` marker included, proving the scan works) | only `self` |
//! | `say` | logs and prints `said <machine uid>` | the line reaches this call's log sink only |
//! | `validate-loop`, `validate-memory`, `validate-request` | in `validate` (a pure call, run on its caller's thread): spins, allocates without end, or GETs `target` | deadline, memory limit, and the request refused or sent as any call's |
//! | `send` | sends one `method` request to `target` with `headerBytes` of headers and a `bodyBytes` body | whatever the host's rules say of it |
//! | `none` | behaves (validate/get/delete always work; a modest capacity) | nothing |

// The plugin is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::http::{CapstanHttp, HttpClient, Method, Request, WasiHttp};
use capstan_sdk::{
    Deletion, InstanceCapacity, InstanceState, Machine, MachineStatus, PluginError, Provider,
};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    attack: String,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    /// What `stash` does once the secret is left everywhere.
    #[serde(default)]
    then: Option<String>,
    /// How requests leave: `wasi` (`wasi:http`, the default) or `capstan`
    /// (`capstan:plugin/http`, contract 0.3.0).
    #[serde(default)]
    transport: Option<String>,
    /// `send`: the method (default `GET`).
    #[serde(default)]
    method: Option<String>,
    /// `send`: this many bytes of `x-filler` header values.
    #[serde(default)]
    header_bytes: usize,
    /// `send`: a body of this many bytes.
    #[serde(default)]
    body_bytes: usize,
}

/// The client `config.transport` names.
fn client(config: &Config) -> Result<&'static dyn HttpClient, PluginError> {
    match config.transport.as_deref() {
        None | Some("wasi") => Ok(&WasiHttp),
        Some("capstan") => Ok(&CapstanHttp),
        Some(other) => Err(PluginError::invalid_config(format!(
            "transport: `{other}` is not wasi or capstan"
        ))),
    }
}

#[derive(Default)]
struct Hostile;

fn target(config: &Config) -> Result<&str, PluginError> {
    config
        .target
        .as_deref()
        .ok_or_else(|| PluginError::invalid_config("target: required for this attack"))
}

fn endpoint(config: &Config) -> Result<&str, PluginError> {
    config
        .endpoint
        .as_deref()
        .map(|e| e.trim_end_matches('/'))
        .ok_or_else(|| PluginError::invalid_config("endpoint: required for non-idempotent"))
}

#[derive(Debug, Deserialize)]
struct Instance {
    id: String,
}

impl Provider for Hostile {
    type Config = Config;

    fn validate(&self, config: &Config) -> Result<(), PluginError> {
        match config.attack.as_str() {
            "validate-loop" => spin_forever(),
            "validate-memory" => allocate_forever(),
            "validate-request" => {
                let answer = client(config)?.send(&Request::get(target(config)?));
                Err(PluginError::terminal(format!(
                    "validate sent: {:?}",
                    answer.map(|r| r.status)
                )))
            }
            _ => Ok(()),
        }
    }

    fn create(
        &self,
        machine: &Machine,
        config: &Config,
        _bootstrap: Option<&capstan_sdk::BootstrapData>,
    ) -> Result<MachineStatus, PluginError> {
        let http = client(config)?;
        match config.attack.as_str() {
            "none" => {}
            "claim-node" => {
                return Ok(MachineStatus::new(target(config)?, InstanceState::Running));
            }
            "infinite-loop" => spin_forever(),
            // Waits, costing no CPU, until the host's deadline ends the
            // call: a slow endpoint, or a plugin holding workers on purpose.
            "hang" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
            "memory-bomb" => allocate_forever(),
            "stdout-flood" => loop {
                println!("{}", "flood ".repeat(200));
            },
            // One log message far over every output limit: the host must
            // refuse it before copying it out of the guest.
            "log-bomb" => {
                let message = "b".repeat(100 * 1024 * 1024);
                capstan_sdk::log::info(&message, &[("attack", "log-bomb")]);
            }
            "log-flood" => loop {
                capstan_sdk::log::info(&"flood ".repeat(200), &[("attack", "log-flood")]);
            },
            "oversized-return" => {
                let mut status = MachineStatus::new("hostile://big", InstanceState::Running);
                status.message = Some("x".repeat(4 * 1024 * 1024));
                return Ok(status);
            }
            // Plugin text meant to flood conditions and events.
            "long-message" => {
                let mut status = MachineStatus::new("hostile://long", InstanceState::Pending);
                status.message = Some("m".repeat(200 * 1024));
                return Ok(status);
            }
            "long-error" => return Err(PluginError::terminal("e".repeat(200 * 1024))),
            "undeclared-host" => {
                let resp = http.send(&Request::get(target(config)?));
                return Err(PluginError::terminal(format!("request outcome: {resp:?}")));
            }
            "redirect" => {
                let first = http
                    .send(&Request::get(target(config)?))
                    .map_err(|e| PluginError::terminal(format!("first request failed: {e}")))?;
                let location = first
                    .header("location")
                    .ok_or_else(|| PluginError::terminal("no redirect received"))?
                    .to_string();
                let second = http.send(&Request::get(location));
                return Err(PluginError::terminal(format!(
                    "redirect outcome: {second:?}"
                )));
            }
            "host-header" => {
                let resp =
                    http.send(&Request::get(target(config)?).header("host", "evil.example:80"));
                return Err(PluginError::terminal(format!(
                    "forged host outcome: {resp:?}"
                )));
            }
            "trace" => {
                if config.transport.as_deref() == Some("capstan") {
                    return Err(PluginError::terminal(send_once(config, "TRACE")?));
                }
                return Err(PluginError::terminal(trace(target(config)?)));
            }
            "send" => {
                let method = config.method.as_deref().unwrap_or("GET");
                return Err(PluginError::terminal(send_once(config, method)?));
            }
            "trap" => panic!("hostile plugin panicked on purpose"),
            "entropy" => {
                // Random bytes and the time in a request body: what record
                // and replay must reproduce exactly.
                let random = wasip2::random::random::get_random_bytes(16);
                let now = wasip2::clocks::wall_clock::now();
                let body = serde_json::json!({
                    "clientToken": hex_of(&random),
                    "name": format!("t{}-{}", now.seconds, now.nanoseconds),
                });
                let resp = post_instance(http, config, &body)?;
                capstan_sdk::log::info("entropy sent", &[("status", &resp.status.to_string())]);
                let mut status = MachineStatus::new("hostile://entropy", InstanceState::Running);
                status.message = Some(resp.text());
                return Ok(status);
            }
            "escape" => {
                let fs = match std::fs::read_dir("/") {
                    Ok(entries) => format!("fs: listed {} entries", entries.count()),
                    Err(e) => format!("fs: denied ({e})"),
                };
                let env = format!("env: {} variables", std::env::vars().count());
                let addr = target(config)?.trim_start_matches("http://").to_string();
                let net = match std::net::TcpStream::connect(addr.as_str()) {
                    Ok(_) => "net: connected".to_string(),
                    Err(e) => format!("net: denied ({e})"),
                };
                return Err(PluginError::terminal(format!("{fs}; {env}; {net}")));
            }
            "non-idempotent" => {
                // A fresh client token on every call: the bug conformance catches.
                let token = format!(
                    "{}-{}",
                    machine.uid,
                    wasip2::random::random::get_random_u64()
                );
                let body = serde_json::json!({ "clientToken": token, "name": machine.name });
                let resp = post_instance(http, config, &body)?;
                let instance: Instance = resp
                    .json()
                    .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
                return Ok(MachineStatus::new(
                    format!("sim://{}", instance.id),
                    InstanceState::Running,
                ));
            }
            "stash" => {
                secrecy::stash(&format!("{}{}", secrecy::marker(), machine.uid));
                match config.then.as_deref() {
                    Some("trap") => panic!("hostile plugin trapped after stashing"),
                    Some("deadline") => spin_forever(),
                    Some("memory") => allocate_forever(),
                    _ => {}
                }
            }
            "peek" => return Err(PluginError::terminal(secrecy::peek())),
            "say" => {
                let line = format!("said {}", machine.uid);
                println!("{line}");
                capstan_sdk::log::info(&line, &[]);
            }
            "request-flood" => return Err(PluginError::terminal(flood(target(config)?))),
            "header-hoard" => return Err(PluginError::terminal(header_hoard())),
            "request-serial" => {
                let (mut ok, mut failed) = (0, 0);
                for _ in 0..1_000 {
                    match http.send(&Request::get(target(config)?)) {
                        Ok(_) => ok += 1,
                        Err(_) => failed += 1,
                    }
                }
                return Err(PluginError::terminal(format!(
                    "serial: {ok} answered, {failed} failed"
                )));
            }
            "probe-credentials" => {
                let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                // Try to pre-empt the host's signature with our own headers.
                let echoed = http
                    .send(
                        &Request::get(target(config)?)
                            .header("authorization", "guest-chosen")
                            .header("x-amz-security-token", "guest-chosen")
                            .header("x-amz-date", "19990101T000000Z"),
                    )
                    .map(|r| r.text());
                let elsewhere = http.send(&Request::get(endpoint(config)?));
                return Err(PluginError::terminal(format!(
                    "env: {env:?}; echoed: {echoed:?}; elsewhere: {elsewhere:?}"
                )));
            }
            other => {
                return Err(PluginError::invalid_config(format!(
                    "attack: unknown attack `{other}`"
                )));
            }
        }
        Ok(MachineStatus::new(
            format!("hostile://{}", machine.uid),
            InstanceState::Running,
        ))
    }

    fn capacity(&self, config: &Config) -> Result<Option<InstanceCapacity>, PluginError> {
        let absurd = config.attack == "absurd-capacity";
        Ok(Some(InstanceCapacity {
            cpu_millis: if absurd { u32::MAX } else { 1000 },
            memory_mib: 512,
            ephemeral_disk_mib: None,
            max_pods: None,
            gpu_count: absurd.then_some(1),
            gpu_type: absurd.then(|| "nvidia.com/gpu\ninjected: true".to_string()),
        }))
    }

    fn get(&self, machine: &Machine, config: &Config) -> Result<MachineStatus, PluginError> {
        if config.attack == "claim-node" {
            return Ok(MachineStatus::new(target(config)?, InstanceState::Running));
        }
        if config.attack == "long-message" {
            let mut status = MachineStatus::new("hostile://long", InstanceState::Pending);
            status.message = Some("m".repeat(200 * 1024));
            return Ok(status);
        }
        if config.attack != "non-idempotent" {
            return Ok(MachineStatus::new(
                format!("hostile://{}", machine.uid),
                InstanceState::Running,
            ));
        }
        let id = machine
            .provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix("sim://"))
            .ok_or_else(|| PluginError::not_found("no provider ID"))?;
        let resp = client(config)?
            .send(&Request::get(format!(
                "{}/v1/instances/{id}",
                endpoint(config)?
            )))
            .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
        match resp.status {
            200 => Ok(MachineStatus::new(
                format!("sim://{id}"),
                InstanceState::Running,
            )),
            404 => Err(PluginError::not_found(format!("instance {id} not found"))),
            s => Err(PluginError::transient(format!("HTTP {s}"), 1_000)),
        }
    }

    fn delete(&self, machine: &Machine, config: &Config) -> Result<Deletion, PluginError> {
        if config.attack != "non-idempotent" {
            return Ok(Deletion::Done);
        }
        let Some(id) = machine
            .provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix("sim://"))
        else {
            return Ok(Deletion::Done);
        };
        let resp = client(config)?
            .send(&Request::delete(format!(
                "{}/v1/instances/{id}",
                endpoint(config)?
            )))
            .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
        match resp.status {
            404 => Ok(Deletion::Done),
            _ => Ok(Deletion::InProgress(100)),
        }
    }
}

/// Send one request to `target` with any method (the SDK's `Method` has
/// five), `header_bytes` of headers and a `body_bytes` body, through
/// `config.transport`, and report what came back.
fn send_once(config: &Config, method: &str) -> Result<String, PluginError> {
    let url = target(config)?.to_string();
    let mut headers = Vec::new();
    let mut left = config.header_bytes;
    while left > 0 {
        let value = "f".repeat(left.min(4096));
        left -= value.len();
        headers.push(("x-filler".to_string(), value));
    }
    let body = vec![b'b'; config.body_bytes];
    match config.transport.as_deref() {
        Some("capstan") => {
            use capstan_sdk::bindings::http_v3::capstan::plugin0_3_0::http as host;
            #[cfg(target_arch = "wasm32")]
            let sent = host::send(&host::Request {
                method: method.to_string(),
                url,
                headers,
                body,
            })
            .map(|r| r.status);
            #[cfg(not(target_arch = "wasm32"))]
            let sent: Result<u16, host::Error> = {
                let _ = (method, url, headers, body);
                Err(host::Error::Transport("needs the sandbox".into()))
            };
            Ok(format!("send outcome: {sent:?}"))
        }
        _ => {
            let mut request = Request::new(Method::Get, url);
            if method != "GET" {
                let known = [Method::Post, Method::Put, Method::Patch, Method::Delete];
                request.method = *known
                    .iter()
                    .find(|m| m.as_str() == method)
                    .ok_or_else(|| PluginError::invalid_config(format!("method: {method}")))?;
            }
            request.headers = headers;
            request.body = body;
            let sent = WasiHttp.send(&request).map(|r| r.status);
            Ok(format!("send outcome: {sent:?}"))
        }
    }
}

/// Send one TRACE request (a method the SDK does not offer) and report
/// what came back.
#[cfg(target_arch = "wasm32")]
fn trace(url: &str) -> String {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, Method, OutgoingRequest, Scheme};
    let Ok(parts) = capstan_sdk::http::split_url(url) else {
        return format!("bad target {url}");
    };
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_method(&Method::Trace);
    let _ = request.set_scheme(Some(&Scheme::Http));
    let _ = request.set_authority(Some(parts.authority));
    let _ = request.set_path_with_query(Some(&parts.path_and_query));
    match outgoing_handler::handle(request, None) {
        Err(e) => format!("trace refused: {e:?}"),
        Ok(future) => {
            let outcome = loop {
                match future.get() {
                    Some(r) => break r,
                    None => future.subscribe().block(),
                }
            };
            format!("trace outcome: {outcome:?}")
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn trace(url: &str) -> String {
    format!("trace of {url} needs the sandbox")
}

/// Start 400 requests without waiting for any, then wait for them all
/// (keeping every response unread, so its connection stays busy); then
/// start requests in a loop that never waits, 100,000 times.
#[cfg(target_arch = "wasm32")]
fn flood(url: &str) -> String {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, FutureIncomingResponse, OutgoingRequest, Scheme};
    let Ok(parts) = capstan_sdk::http::split_url(url) else {
        return format!("bad target {url}");
    };
    let start = || -> Option<FutureIncomingResponse> {
        let request = OutgoingRequest::new(Fields::new());
        let _ = request.set_scheme(Some(&Scheme::Http));
        let _ = request.set_authority(Some(parts.authority));
        let _ = request.set_path_with_query(Some(&parts.path_and_query));
        outgoing_handler::handle(request, None).ok()
    };
    // Fewer attempts than the handle cap (512), so this phase ends and its
    // requests are answered before the loop below runs into the cap.
    let pending: Vec<_> = (0..400).filter_map(|_| start()).collect();
    let mut answered = Vec::new();
    let mut failed = 0u32;
    for future in &pending {
        let outcome = loop {
            match future.get() {
                Some(r) => break r,
                None => future.subscribe().block(),
            }
        };
        match outcome {
            Ok(Ok(response)) => answered.push(response),
            _ => failed += 1,
        }
    }
    let mut hoard = Vec::new();
    for _ in 0..100_000 {
        if let Some(f) = start() {
            hoard.push(f);
        }
    }
    format!(
        "flood: {} started, {} answered, {failed} failed; then {} more started",
        pending.len(),
        answered.len(),
        hoard.len()
    )
}

/// Build header maps on the host, each filled to the per-map cap (15 values
/// of 1 KiB with their bookkeeping; a 16th would cross the 16 KiB cap, which
/// traps), and keep them all: host memory the guest's own memory limit does
/// not see.
#[cfg(target_arch = "wasm32")]
fn header_hoard() -> String {
    use wasip2::http::types::Fields;
    let value = vec![b'v'; 1024];
    let mut hoard = Vec::new();
    let mut accepted = 0usize;
    for _ in 0..100_000 {
        let fields = Fields::new();
        for _ in 0..15 {
            if fields.append("x-hoard", &value).is_err() {
                break;
            }
            accepted += value.len();
        }
        hoard.push(fields);
    }
    format!(
        "hoard: {} header maps holding {accepted} bytes",
        hoard.len()
    )
}

#[cfg(not(target_arch = "wasm32"))]
fn header_hoard() -> String {
    "header hoarding needs the sandbox".to_string()
}

#[cfg(not(target_arch = "wasm32"))]
fn flood(url: &str) -> String {
    format!("flood of {url} needs the sandbox")
}

/// What one call may leave behind for the next, and how the next looks.
mod secrecy {
    use std::sync::Mutex;

    static STASHED: Mutex<String> = Mutex::new(String::new());

    /// `capstan-secret:`, built at run time so the plugin's data segment
    /// does not hold it and the scan finds only what a call put there.
    pub(crate) fn marker() -> String {
        ":terces-natspac".chars().rev().collect()
    }

    /// Leave `secret` in every place a call can reach.
    pub(crate) fn stash(secret: &str) {
        *STASHED.lock().unwrap_or_else(|p| p.into_inner()) = secret.to_string();
        std::hint::black_box(Box::leak(secret.to_string().into_boxed_str()));
        deep_frame(secret, 64);
        // Past the heap's slack: the memory grows for it.
        let mut grown = vec![0u8; 4 * 1024 * 1024];
        let end = grown.len() - secret.len();
        grown[end..].copy_from_slice(secret.as_bytes());
        std::hint::black_box(grown.leak());
        println!("{secret}");
        leak_header_map(secret);
    }

    #[inline(never)]
    fn deep_frame(secret: &str, depth: u32) {
        let mut frame = [0u8; 256];
        let n = secret.len().min(frame.len());
        frame[..n].copy_from_slice(&secret.as_bytes()[..n]);
        std::hint::black_box(&mut frame);
        if depth > 0 {
            deep_frame(secret, depth - 1);
        }
    }

    #[cfg(target_arch = "wasm32")]
    fn leak_header_map(secret: &str) {
        let fields = wasip2::http::types::Fields::new();
        let _ = fields.append("x-secret", secret.as_bytes());
        std::mem::forget(fields);
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn leak_header_map(_secret: &str) {}

    /// Every `capstan-secret:<value>` in linear memory and the static,
    /// after leaving `self` to find (a scan that finds nothing proves
    /// nothing).
    pub(crate) fn peek() -> String {
        let needle = marker();
        let own = format!("{needle}self");
        std::hint::black_box(&own);
        let mut found = std::collections::BTreeSet::new();
        for (at, value) in scan(needle.as_bytes()) {
            // The needle itself, not a stash.
            if at == needle.as_ptr() as usize {
                continue;
            }
            found.insert(value);
        }
        let stashed = STASHED.lock().unwrap_or_else(|p| p.into_inner()).clone();
        format!("found: {found:?}; static: {stashed:?}")
    }

    /// Where `needle` occurs in linear memory, with the name-like bytes
    /// after it.
    #[cfg(target_arch = "wasm32")]
    #[allow(unsafe_code)]
    fn scan(needle: &[u8]) -> Vec<(usize, String)> {
        let size = core::arch::wasm32::memory_size(0) * 65536;
        let byte = |at: usize| -> u8 {
            // SAFETY: every address below the memory's size is readable in
            // a wasm linear memory; volatile so the reads are not elided.
            unsafe { std::ptr::read_volatile(at as *const u8) }
        };
        let mut hits = Vec::new();
        let mut at = 1;
        while at + needle.len() < size {
            if needle.iter().enumerate().all(|(i, b)| byte(at + i) == *b) {
                let mut value = String::new();
                let mut i = at + needle.len();
                while i < size && value.len() < 64 {
                    let b = byte(i);
                    if !(b.is_ascii_alphanumeric() || b == b'-') {
                        break;
                    }
                    value.push(b as char);
                    i += 1;
                }
                hits.push((at, value));
            }
            at += 1;
        }
        hits
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn scan(_needle: &[u8]) -> Vec<(usize, String)> {
        vec![]
    }
}

/// Spin until the host's deadline ends the call.
fn spin_forever() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

/// Allocate 8 MiB at a time until the host's memory limit ends the call.
fn allocate_forever() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![0xA5; 8 * 1024 * 1024]);
        std::hint::black_box(&hoard);
    }
}

capstan_sdk::export_provider!(Hostile, manifest: "capstan-plugin.json");

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// POST `body` to the cloud's `/v1/instances` at `endpoint`.
fn post_instance(
    http: &dyn HttpClient,
    config: &Config,
    body: &serde_json::Value,
) -> Result<capstan_sdk::http::Response, PluginError> {
    http.send(&Request::json(
        Method::Post,
        format!("{}/v1/instances", endpoint(config)?),
        body,
    ))
    .map_err(|e| PluginError::transient(e.to_string(), 1_000))
}
