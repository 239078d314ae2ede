//! Control planes handed from one test to the next, so a test process
//! starts an API server only when none is idle.
//!
//! Starting kube-apiserver costs about 4–6 s of CPU (its OpenAPI document,
//! bootstrap policy, then the CRDs), and the end-to-end suite is CPU-bound
//! on two cores: started once per test, API servers were half of its CPU.
//! A dropped [`ControlPlane`](super::ControlPlane) whose options allow it
//! is instead put back as it was when it was new and kept idle here, once
//! the test's runtime has ended (no task of the test can write then):
//! its kube-controller-manager and kube-scheduler are stopped, every etcd
//! key written since its [`Snapshot`] is deleted and every changed one is
//! written back, and its API server must show the snapshot's namespaces
//! and no Node from its watch cache. The next test with the same options
//! takes it (checked against the snapshot once more) and gets fresh
//! controllers, so it sees what a new control plane would show it. A test
//! that panicked leaves nothing: its plane is stopped.
//!
//! What cannot be put back is not reused: planes with an audit log (the
//! tests read every line of it), an egress socket or another plane's etcd;
//! a plane whose process died or whose reset failed is stopped instead.
//! Idle planes are stopped by a small shell that waits for this process to
//! end, however it ends. Programs that start one plane (the quickstart,
//! the benchmarks) turn reuse off with [`disable`].

use super::{ControlPlaneOptions, Ports};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Idle planes kept at most; more are stopped (two test threads, and a
/// test may hold two planes).
const MAX_IDLE: usize = 4;

/// Keys the API server keeps itself and must not be put back: its etcd
/// compaction mark, and its own lease as an endpoint of `kubernetes`.
const UNTOUCHED: [&[u8]; 2] = [b"compact_rev_key", b"/registry/masterleases/"];

/// What a plane held when it was new, as a Capstan test environment takes
/// it: bare, or with Capstan's CRDs installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// Only what the control plane itself creates (and `cluster-info`).
    Bare,
    /// The same and Capstan's CRDs, established.
    CapstanCrds,
}

/// Every key in an etcd, its value and revision, and the namespaces.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    keys: BTreeMap<Vec<u8>, Kept>,
    namespaces: Vec<String>,
}

/// What an idle plane keeps: everything a `ControlPlane` is made from,
/// with only etcd and the API server running.
#[derive(Debug)]
pub(super) struct Idle {
    pub url: String,
    pub token: String,
    pub ca_pem: Vec<u8>,
    pub options: ControlPlaneOptions,
    pub dir: PathBuf,
    pub ports: Ports,
    pub children: Vec<(&'static str, Child)>,
    pub snapshot: Snapshot,
    pub baseline: Baseline,
}

impl Idle {
    fn etcd(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);
static IDLE: Mutex<Vec<Idle>> = Mutex::new(Vec::new());
static REAPER: std::sync::Once = std::sync::Once::new();

/// Start a new control plane for every request in this process and stop
/// each when dropped (for programs that start one).
pub fn disable() {
    ENABLED.store(false, Ordering::SeqCst);
    stop_all_idle();
}

/// Whether planes with these options can be put back.
pub(super) fn reusable(options: &ControlPlaneOptions) -> bool {
    ENABLED.load(Ordering::SeqCst)
        && !options.audit
        && options.egress_socket.is_none()
        && options.shared_etcd.is_none()
}

/// An idle plane with these options and baseline, if there is one. It
/// is put back once more first: a write the last test's client had in
/// flight may have reached it after its reset.
pub(super) fn take(options: &ControlPlaneOptions, baseline: Baseline) -> Option<Idle> {
    if !reusable(options) {
        return None;
    }
    let mut plane = {
        let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
        let at = idle
            .iter()
            .position(|i| &i.options == options && i.baseline == baseline)?;
        let plane = idle.swap_remove(at);
        write_reaper_list(&idle);
        plane
    };
    let restored = restore(&plane.etcd(), &mut plane.snapshot);
    trace(&plane, &format!("take: {restored:?} keys put back"));
    match restored {
        Ok(0) => Some(plane),
        Ok(_) if wait_served(&plane, Duration::from_secs(10)).is_ok() => Some(plane),
        _ => {
            stop(plane);
            None
        }
    }
}

/// Put `plane` back when the test's runtime ends (when no task of it can
/// write any more), or now outside a runtime; a test that panicked stops
/// its plane instead, leaving nothing of a failure to the next test.
pub(super) fn put_back_later(plane: Idle) {
    if std::thread::panicking() {
        stop(plane);
        return;
    }
    let guard = PutBack(Some(plane));
    match tokio::runtime::Handle::try_current() {
        // Dropped, never polled to the end, when the runtime shuts down.
        Ok(runtime) => drop(runtime.spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })),
        Err(_) => drop(guard),
    }
}

/// Puts its plane back when dropped.
#[derive(Debug)]
struct PutBack(Option<Idle>);

impl Drop for PutBack {
    fn drop(&mut self) {
        if let Some(plane) = self.0.take() {
            put_back(plane);
        }
    }
}

/// Keep `plane` idle if it can be reset to its snapshot; stop it otherwise.
fn put_back(mut plane: Idle) {
    let reset = reset(&mut plane);
    if let Err(e) = &reset {
        eprintln!("the control plane is stopped, not reused: {e}");
    }
    let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
    if reset.is_ok() && idle.len() < MAX_IDLE && ENABLED.load(Ordering::SeqCst) {
        REAPER.call_once(start_reaper);
        idle.push(plane);
        write_reaper_list(&idle);
    } else {
        drop(idle);
        stop(plane);
    }
}

/// Stop controllers, put etcd back, and wait until the API server serves it.
fn reset(plane: &mut Idle) -> Result<(), String> {
    for (name, child) in plane.children.iter_mut() {
        if !matches!(*name, "etcd" | "kube-apiserver") {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    plane
        .children
        .retain(|(name, _)| matches!(*name, "etcd" | "kube-apiserver"));
    if plane.children.len() != 2
        || plane
            .children
            .iter_mut()
            .any(|(_, c)| !matches!(c.try_wait(), Ok(None)))
    {
        return Err("a process of the control plane has exited".into());
    }
    let restored = restore(&plane.etcd(), &mut plane.snapshot)?;
    trace(plane, &format!("put back: {restored} keys"));
    // kubectl's discovery cache may know API groups the last test added.
    let _ = std::fs::remove_dir_all(plane.dir.join("kubectl-cache"));
    wait_served(plane, Duration::from_secs(10))
}

/// Wait until the API server's watch cache shows the snapshot's namespaces
/// and no Node: what the next test lists first.
fn wait_served(plane: &Idle, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let agent = capstan_sim_cloud::agent_trusting(&plane.ca_pem)?;
    let names = |path: &str| -> Result<Vec<String>, String> {
        let text = agent
            .get(format!("{}{path}", plane.url))
            .header("authorization", format!("Bearer {}", plane.token))
            .call()
            .map_err(|e| e.to_string())?
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        let body: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let mut names: Vec<String> = body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(String::from))
            .collect();
        names.sort();
        Ok(names)
    };
    loop {
        let namespaces = names("/api/v1/namespaces?resourceVersion=0");
        let nodes = names("/api/v1/nodes?resourceVersion=0");
        match (namespaces, nodes) {
            (Ok(ns), Ok(nodes)) if ns == plane.snapshot.namespaces && nodes.is_empty() => {
                return Ok(());
            }
            (ns, nodes) if Instant::now() > deadline => {
                return Err(format!(
                    "the API server still serves namespaces {ns:?} and nodes {nodes:?} after the reset"
                ));
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// With `CAPSTAN_E2E_REUSE_LOG=FILE`, a line per take and put-back: which
/// plane (its API server) and how many keys were put back.
fn trace(plane: &Idle, what: &str) {
    let Some(path) = std::env::var_os("CAPSTAN_E2E_REUSE_LOG") else {
        return;
    };
    use std::io::Write;
    let line = format!(
        "{:?} {} {what}\n",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default(),
        plane.url,
    );
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = file.write_all(line.as_bytes());
    }
}

/// Every key of the etcd at `url` (over its JSON gateway) and the
/// namespaces among them.
pub(super) fn snapshot(url: &str) -> Result<Snapshot, String> {
    let keys = range_all(url, false)?;
    let mut namespaces: Vec<String> = keys
        .keys()
        .filter_map(|k| k.strip_prefix(b"/registry/namespaces/".as_slice()))
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect();
    namespaces.sort();
    Ok(Snapshot { keys, namespaces })
}

/// Delete every key the snapshot does not have and write back every one
/// changed since (by its revision) or deleted; how many keys it changed.
fn restore(url: &str, snapshot: &mut Snapshot) -> Result<usize, String> {
    let current = range_all(url, true)?;
    let untouched = |key: &[u8]| UNTOUCHED.iter().any(|p| key.starts_with(p));
    let mut changed = 0;
    for key in current.keys() {
        if !snapshot.keys.contains_key(key) && !untouched(key) {
            etcd_call(
                url,
                "deleterange",
                serde_json::json!({"key": B64.encode(key)}),
            )?;
            changed += 1;
        }
    }
    for (key, kept) in snapshot.keys.iter_mut() {
        if current.get(key).map(|c| c.revision) != Some(kept.revision) && !untouched(key) {
            let answer = etcd_call(
                url,
                "put",
                serde_json::json!({"key": B64.encode(key), "value": B64.encode(&kept.value)}),
            )?;
            kept.revision = int(&answer["header"]["revision"]);
            changed += 1;
        }
    }
    Ok(changed)
}

/// One key's value and the revision that last wrote it.
#[derive(Debug, Clone, Default)]
struct Kept {
    value: Vec<u8>,
    revision: i64,
}

/// Every key from the smallest to the end of the key space (without
/// values if `keys_only`).
fn range_all(url: &str, keys_only: bool) -> Result<BTreeMap<Vec<u8>, Kept>, String> {
    let all = serde_json::json!({
        "key": B64.encode([0u8]),
        "range_end": B64.encode([0u8]),
        "keys_only": keys_only,
    });
    let answer = etcd_call(url, "range", all)?;
    let decode = |v: &serde_json::Value| {
        B64.decode(v.as_str().unwrap_or_default())
            .map_err(|e| format!("etcd answered a key that is not base64: {e}"))
    };
    let mut keys = BTreeMap::new();
    for kv in answer["kvs"].as_array().into_iter().flatten() {
        let kept = Kept {
            value: decode(&kv["value"])?,
            revision: int(&kv["mod_revision"]),
        };
        keys.insert(decode(&kv["key"])?, kept);
    }
    Ok(keys)
}

/// An int64 of etcd's JSON gateway (a string, or absent for 0).
fn int(v: &serde_json::Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

fn etcd_call(url: &str, call: &str, body: serde_json::Value) -> Result<serde_json::Value, String> {
    let text = ureq::post(format!("{url}/v3/kv/{call}"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .map_err(|e| format!("etcd {call}: {e}"))?
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_string()
        .map_err(|e| format!("etcd {call}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("etcd {call}: {e}"))
}

/// Stop a plane's processes and remove its directory.
pub(super) fn stop(mut plane: Idle) {
    for (_, child) in plane.children.iter_mut().rev() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&plane.dir);
}

fn stop_all_idle() {
    let planes: Vec<Idle> = {
        let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
        let planes = idle.drain(..).collect();
        write_reaper_list(&idle);
        planes
    };
    planes.into_iter().for_each(stop);
}

/// The file the reaper reads: what to kill and remove if this process
/// ends while planes are idle.
fn reaper_list() -> PathBuf {
    std::env::temp_dir().join(format!("capstan-idle-planes-{}", std::process::id()))
}

/// Rewrite the reaper's list from the idle planes (under the lock).
fn write_reaper_list(idle: &[Idle]) {
    let mut text = String::new();
    for plane in idle {
        for (_, child) in &plane.children {
            text.push_str(&format!("kill {}\n", child.id()));
        }
        text.push_str(&format!("rm {}\n", plane.dir.display()));
    }
    let path = reaper_list();
    let partial = path.with_extension("partial");
    if std::fs::write(&partial, text).is_ok() {
        let _ = std::fs::rename(&partial, &path);
    }
}

/// A shell that waits for this process to end however it ends (returning
/// from `main`, `exit`, a signal) and then stops what is idle: libtest
/// has no hook at the end of a run, and statics are never dropped.
fn start_reaper() {
    let script = r#"trap '' INT TERM HUP
while kill -0 "$1" 2>/dev/null; do sleep 1; done
[ -f "$2" ] || exit 0
while read -r what arg; do
  case "$what" in kill) kill -9 "$arg" 2>/dev/null ;; rm) rm -rf "$arg" ;; esac
done < "$2"
rm -f "$2""#;
    let spawned = std::process::Command::new("sh")
        .args(["-c", script, "capstan-plane-reaper"])
        .arg(std::process::id().to_string())
        .arg(reaper_list())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        eprintln!(
            "cannot start the control planes' reaper ({e}): idle planes outlive this process"
        );
    }
}
