//! The simulated cloud's HTTP API, as a provider plugin sees it.

use capstan_sim_cloud::{Faults, SimCloud, SimCloudConfig};
use serde_json::{Value, json};
use std::time::Duration;

struct Fixture {
    cloud: SimCloud,
    agent: ureq::Agent,
    _rt: tokio::runtime::Runtime,
}

fn start(faults: Faults) -> Fixture {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cloud = rt
        .block_on(SimCloud::start(SimCloudConfig {
            token: Some("t0k".into()),
            faults,
            seed: 3,
            ..Default::default()
        }))
        .unwrap();
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    Fixture {
        cloud,
        agent,
        _rt: rt,
    }
}

/// Poll `check` until it holds (10 s at most): completion is asserted by
/// waiting for it, never by assuming how long a sleep took.
fn eventually(mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached in 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Fixture {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value, Option<String>) {
        let url = format!("{}{path}", self.cloud.url());
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("authorization", "Bearer t0k")
            .header("content-type", "application/json")
            .body(body.map(|b| b.to_string()).unwrap_or_default())
            .unwrap();
        let mut resp = self.agent.run(req).unwrap();
        let retry = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let text = resp.body_mut().read_to_string().unwrap();
        (
            resp.status().as_u16(),
            serde_json::from_str(&text).unwrap_or(Value::Null),
            retry,
        )
    }
}

#[test]
fn create_is_idempotent_by_client_token_and_boots_after_the_latency() {
    let f = start(Faults {
        boot_latency_ms: 300,
        ..Default::default()
    });
    let body = json!({ "clientToken": "uid-1", "name": "m1", "version": "v1.30.0" });
    let (s1, i1, _) = f.call("POST", "/v1/instances", Some(body.clone()));
    let (s2, i2, _) = f.call("POST", "/v1/instances", Some(body));
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(i1["id"], i2["id"]);
    assert_eq!(i1["state"], "pending");
    let path = format!("/v1/instances/{}", i1["id"].as_str().unwrap());
    eventually(|| f.call("GET", &path, None).1["state"] == "running");
    let (_, by_token, _) = f.call("GET", "/v1/instances?clientToken=uid-1", None);
    assert_eq!(by_token["instances"].as_array().unwrap().len(), 1);
    assert_eq!(f.cloud.stats().instances_launched, 1);
}

#[test]
fn in_place_update_is_asynchronous_with_progress() {
    let f = start(Faults {
        update_latency_ms: 1_500,
        ..Default::default()
    });
    let (_, i, _) = f.call(
        "POST",
        "/v1/instances",
        Some(json!({ "clientToken": "u", "name": "m", "version": "v1.30.0" })),
    );
    let id = i["id"].as_str().unwrap().to_string();
    let (s, upd, _) = f.call(
        "POST",
        &format!("/v1/instances/{id}/update"),
        Some(json!({ "version": "v1.31.0" })),
    );
    assert_eq!(s, 202);
    assert_eq!(upd["state"], "updating");
    assert_eq!(upd["update"]["targetVersion"], "v1.31.0");
    // Progress grows while the update runs; the old version stays until done.
    let mut progress_seen = Vec::new();
    eventually(|| {
        let (_, now, _) = f.call("GET", &format!("/v1/instances/{id}"), None);
        match now["update"]["percent"].as_u64() {
            Some(p) => {
                assert_eq!(now["version"], "v1.30.0", "old version until done");
                progress_seen.push(p);
                false
            }
            None => true,
        }
    });
    assert!(
        progress_seen.windows(2).all(|w| w[0] <= w[1]),
        "progress never goes back: {progress_seen:?}"
    );
    assert!(
        progress_seen.iter().any(|p| (1..100).contains(p)),
        "intermediate progress reported: {progress_seen:?}"
    );
    let (_, done, _) = f.call("GET", &format!("/v1/instances/{id}"), None);
    assert_eq!(
        (done["state"].as_str(), done["version"].as_str()),
        (Some("running"), Some("v1.31.0"))
    );
    assert!(done.get("update").is_none());
}

#[test]
fn delete_is_asynchronous_then_gone() {
    let f = start(Faults {
        delete_latency_ms: 1_000,
        ..Default::default()
    });
    let (_, i, _) = f.call(
        "POST",
        "/v1/instances",
        Some(json!({ "clientToken": "u", "name": "m" })),
    );
    let path = format!("/v1/instances/{}", i["id"].as_str().unwrap());
    let (s, del, _) = f.call("DELETE", &path, None);
    assert_eq!((s, del["state"].as_str()), (202, Some("terminating")));
    let (s, _, _) = f.call(
        "POST",
        &format!("{path}/update"),
        Some(json!({ "version": "v2" })),
    );
    assert_eq!(s, 409, "no update while terminating");
    eventually(|| f.call("GET", &path, None).0 == 404);
    assert_eq!(f.call("DELETE", &path, None).0, 404);
    assert_eq!(f.cloud.stats().live_instances, 0);
    // The token is free again: a new create launches a new instance.
    assert_eq!(
        f.call(
            "POST",
            "/v1/instances",
            Some(json!({ "clientToken": "u", "name": "m" }))
        )
        .0,
        201
    );
}

#[test]
fn faults_throttle_stock_out_refuse_and_fail() {
    let f = start(Faults {
        throttle_rps: Some(1),
        capacity: Some(1),
        ..Default::default()
    });
    assert_eq!(
        f.call(
            "POST",
            "/v1/instances",
            Some(json!({ "clientToken": "a", "name": "a" }))
        )
        .0,
        201
    );
    let (s, body, retry) = f.call("GET", "/v1/instances", None);
    assert_eq!(
        (s, body["code"].as_str(), retry.as_deref()),
        (429, Some("Throttling"), Some("1"))
    );
    std::thread::sleep(Duration::from_millis(1100));
    let (s, body, _) = f.call(
        "POST",
        "/v1/instances",
        Some(json!({ "clientToken": "b", "name": "b" })),
    );
    assert_eq!(
        (s, body["code"].as_str()),
        (503, Some("InsufficientCapacity"))
    );

    f.cloud.set_faults(Faults {
        error_rate: 1.0,
        ..Default::default()
    });
    assert_eq!(f.call("GET", "/v1/instances", None).0, 500);
    let url = format!("{}/v1/instances", f.cloud.url());
    let unauth = f.agent.get(&url).call().unwrap();
    assert_eq!(unauth.status().as_u16(), 401);
    let stats = f.cloud.stats();
    assert_eq!(
        (
            stats.throttled,
            stats.stockouts,
            stats.injected_errors,
            stats.unauthorized
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn kubelet_switches_need_a_kubernetes_api() {
    let f = start(Faults::default());
    for (method, path, body) in [
        ("GET", "/admin/nodes", None),
        (
            "PUT",
            "/admin/nodes/sim-i-000001/heartbeats",
            Some(json!({ "enabled": false })),
        ),
        (
            "PUT",
            "/admin/nodes/sim-i-000001/conditions",
            Some(json!({ "type": "Ready", "status": "False" })),
        ),
        (
            "PUT",
            "/admin/pods/default/web-0/readiness",
            Some(json!({ "ready": false })),
        ),
    ] {
        let (s, answer, _) = f.call(method, path, body);
        assert_eq!(
            (s, answer["code"].as_str()),
            (409, Some("NoKubernetes")),
            "{path}"
        );
        assert!(
            answer["message"].as_str().unwrap().contains("--kube-url"),
            "{answer}"
        );
    }
}
