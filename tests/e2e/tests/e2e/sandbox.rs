//! The sandbox, end to end: the real `sim-provider` plugin driving the
//! simulated cloud through `wasi:http`, and one hostile plugin per limit,
//! each contained with its specific error while the same host keeps serving
//! a well-behaved plugin.

use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::{Faults, SimCloud, SimCloudConfig};
use capstan_runtime::types::{Deletion, InstanceState, Machine, PluginError};
use capstan_runtime::{
    Credential, Error, Grants, Limits, LoadPath, OutputKind, ProviderPlugin, Runtime, RuntimeConfig,
};
use std::time::Duration;

const TOKEN: &str = "sim-token-5f2c";

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig {
        max_concurrent_calls: 64,
        ..Default::default()
    })
    .unwrap()
}

fn grants_for(cloud: &SimCloud) -> Grants {
    let mut g = Grants {
        http: vec![cloud.url().parse().unwrap()],
        ..Default::default()
    };
    g.credentials
        .insert("sim-cloud".into(), Credential::Bearer(TOKEN.into()));
    g
}

async fn cloud() -> SimCloud {
    SimCloud::start(SimCloudConfig {
        token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

fn machine(name: &str, config: serde_json::Value) -> Machine {
    Machine {
        name: name.into(),
        namespace: "default".into(),
        uid: format!("uid-{name}"),
        cluster_name: Some("c1".into()),
        labels: vec![],
        version: Some("v1.30.0".into()),
        failure_domain: None,
        provider_config: config.to_string(),
        infrastructure_config: None,
        provider_id: None,
    }
}

fn sim_provider(rt: &Runtime, cloud: &SimCloud) -> ProviderPlugin {
    rt.load_file(
        &plugin("sim_provider"),
        Limits::default(),
        grants_for(cloud),
    )
    .unwrap()
    .provider()
    .unwrap()
}

fn hostile(rt: &Runtime, cloud: &SimCloud, limits: Limits) -> ProviderPlugin {
    rt.load_file(&plugin("hostile_plugin"), limits, grants_for(cloud))
        .unwrap()
        .provider()
        .unwrap()
}

/// The well-behaved plugin still works on the same host.
async fn assert_host_still_serves(rt: &Runtime, cloud: &SimCloud, name: &str) {
    let sim = sim_provider(rt, cloud);
    let m = machine(name, serde_json::json!({ "endpoint": cloud.url() }));
    let status = sim
        .create(&m)
        .await
        .expect("well-behaved plugin keeps working after a hostile one");
    assert!(status.provider_id.starts_with("sim://"));
}

#[tokio::test]
async fn sim_provider_runs_the_machine_lifecycle_against_the_cloud() {
    let cloud = cloud().await;
    let rt = runtime();
    let sim = sim_provider(&rt, &cloud);
    let config = serde_json::json!({ "endpoint": cloud.url(), "instanceType": "medium" });
    sim.validate(&config.to_string()).await.unwrap();

    let mut m = machine("worker-0", config.clone());
    let first = sim.create(&m).await.unwrap();
    let again = sim.create(&m).await.unwrap();
    assert_eq!(
        first.provider_id, again.provider_id,
        "create is idempotent by machine uid"
    );
    assert_eq!(cloud.stats().instances_launched, 1);
    assert_eq!(
        cloud.stats().unauthorized,
        0,
        "the host attached the granted bearer token"
    );

    // Found by uid without a provider ID, and by provider ID.
    assert_eq!(sim.get(&m).await.unwrap().provider_id, first.provider_id);
    m.provider_id = Some(first.provider_id.clone());
    let got = sim.get(&m).await.unwrap();
    assert_eq!(got.state, InstanceState::Running);
    assert_eq!(got.version.as_deref(), Some("v1.30.0"));
    assert!(!got.addresses.is_empty());

    let listed = sim
        .list(&config.to_string())
        .await
        .unwrap()
        .expect("sim-provider lists");
    assert_eq!(listed.len(), 1);

    let mut rounds = 0;
    while sim.delete(&m).await.unwrap() != Deletion::Done {
        rounds += 1;
        assert!(rounds < 50, "delete never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sim.delete(&m).await.unwrap(),
        Deletion::Done,
        "delete is idempotent"
    );
    let err = sim.get(&m).await.unwrap_err();
    assert!(
        matches!(err.plugin_error(), Some(PluginError::NotFound(_))),
        "{err}"
    );
    assert_eq!(cloud.stats().live_instances, 0);
}

#[tokio::test]
async fn invalid_config_is_a_contract_error_naming_the_field() {
    let cloud = cloud().await;
    let rt = runtime();
    let sim = sim_provider(&rt, &cloud);
    let err = sim
        .validate(r#"{"endpoint":"http://x","instanceType":"huge"}"#)
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::InvalidConfig(m)) => assert!(m.contains("instanceType"), "{m}"),
        _ => panic!("expected invalid-config, got {err}"),
    }
    let err = sim
        .create(&machine("m", serde_json::json!({ "endpont": "x" })))
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::InvalidConfig(m)) => {
            assert!(m.contains("unknown field `endpont`"), "{m}")
        }
        _ => panic!("expected invalid-config, got {err}"),
    }
}

#[tokio::test]
async fn credentials_are_only_attached_when_granted() {
    let cloud = cloud().await;
    let rt = runtime();
    // Destination granted, credential slot not filled: the cloud refuses.
    let grants = Grants {
        http: vec![cloud.url().parse().unwrap()],
        ..Default::default()
    };
    let sim = rt
        .load_file(&plugin("sim_provider"), Limits::default(), grants)
        .unwrap()
        .provider()
        .unwrap();
    let err = sim
        .create(&machine(
            "m",
            serde_json::json!({ "endpoint": cloud.url() }),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err.plugin_error(), Some(PluginError::Unauthorized(_))),
        "{err}"
    );
    assert!(!err.to_string().contains(TOKEN));
    assert_eq!(cloud.stats().unauthorized, 1);
}

#[tokio::test]
async fn throttling_and_faults_are_transient_with_retry_after() {
    let cloud = cloud().await;
    cloud.set_faults(Faults {
        throttle_rps: Some(1),
        ..Default::default()
    });
    let rt = runtime();
    let sim = sim_provider(&rt, &cloud);
    let config = serde_json::json!({ "endpoint": cloud.url() });
    let mut transient = None;
    for i in 0..5 {
        if let Err(e) = sim.create(&machine(&format!("t{i}"), config.clone())).await {
            transient = Some(e);
            break;
        }
    }
    let err = transient.expect("1 request/s must throttle five quick creates");
    match err.plugin_error() {
        Some(PluginError::Transient(t)) => assert_eq!(t.retry_after_ms, 1_000),
        _ => panic!("expected transient, got {err}"),
    }
    cloud.set_faults(Faults {
        capacity: Some(0),
        ..Default::default()
    });
    let err = sim.create(&machine("stockout", config)).await.unwrap_err();
    match err.plugin_error() {
        Some(PluginError::Transient(t)) => {
            assert!(t.message.contains("InsufficientCapacity"), "{}", t.message)
        }
        _ => panic!("expected transient, got {err}"),
    }
}

#[tokio::test]
async fn infinite_loop_hits_the_deadline() {
    let cloud = cloud().await;
    let rt = runtime();
    let limits = Limits {
        call_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let p = hostile(&rt, &cloud, limits);
    let err = p
        .create(&machine(
            "loop",
            serde_json::json!({ "attack": "infinite-loop" }),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::DeadlineExceeded { ref plugin, call: "create", limit } if plugin == "hostile" && limit == Duration::from_millis(300)),
        "{err}"
    );
    assert!(err.to_string().contains("300 ms"), "{err}");
    assert_host_still_serves(&rt, &cloud, "after-loop").await;
}

#[tokio::test]
async fn memory_bomb_hits_the_memory_limit() {
    let cloud = cloud().await;
    let rt = runtime();
    let limits = Limits {
        memory_bytes: 32 * 1024 * 1024,
        ..Default::default()
    };
    let p = hostile(&rt, &cloud, limits);
    let err = p
        .create(&machine(
            "bomb",
            serde_json::json!({ "attack": "memory-bomb" }),
        ))
        .await
        .unwrap_err();
    match &err {
        Error::MemoryLimit {
            plugin,
            call,
            limit_bytes,
            requested_bytes,
        } => {
            assert_eq!(
                (plugin.as_str(), *call, *limit_bytes),
                ("hostile", "create", 32 * 1024 * 1024)
            );
            assert!(*requested_bytes > *limit_bytes);
        }
        other => panic!("expected memory limit, got {other}"),
    }
    assert_host_still_serves(&rt, &cloud, "after-bomb").await;
}

async fn expect_output_limit(attack: &str, kind: OutputKind) {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let err = p
        .create(&machine(attack, serde_json::json!({ "attack": attack })))
        .await
        .unwrap_err();
    match &err {
        Error::OutputLimit {
            plugin,
            call,
            kind: k,
            ..
        } => {
            assert_eq!(
                (plugin.as_str(), *call, *k),
                ("hostile", "create", kind),
                "{err}"
            );
        }
        other => panic!("{attack}: expected {kind} output limit, got {other}"),
    }
    assert!(err.to_string().contains(&format!("{kind} limit")), "{err}");
    assert_host_still_serves(&rt, &cloud, &format!("after-{attack}")).await;
}

#[tokio::test]
async fn stdout_flood_hits_the_output_limit() {
    expect_output_limit("stdout-flood", OutputKind::Stdout).await;
}

#[tokio::test]
async fn log_flood_hits_the_log_limit() {
    expect_output_limit("log-flood", OutputKind::Log).await;
}

#[tokio::test]
async fn oversized_return_hits_the_return_limit() {
    expect_output_limit("oversized-return", OutputKind::ReturnValue).await;
}

#[tokio::test]
async fn http_to_an_undeclared_host_is_denied() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    // 127.0.0.2 is loopback too, but the manifest declares only 127.0.0.1.
    let target = format!("http://127.0.0.2:{}/v1/instances", cloud.addr().port());
    let err = p
        .create(&machine(
            "exfil",
            serde_json::json!({ "attack": "undeclared-host", "target": target }),
        ))
        .await
        .unwrap_err();
    match &err {
        Error::CapabilityDenied {
            plugin,
            call,
            detail,
        } => {
            assert_eq!((plugin.as_str(), *call), ("hostile", "create"));
            assert!(
                detail.contains("127.0.0.2") && detail.contains("not declared"),
                "{detail}"
            );
        }
        other => panic!("expected capability denied, got {other}"),
    }
    assert_eq!(cloud.stats().requests, 0, "nothing reached the network");
    assert_host_still_serves(&rt, &cloud, "after-exfil").await;
}

#[tokio::test]
async fn a_redirect_cannot_escape_the_grant() {
    let granted = cloud().await;
    let elsewhere = cloud().await; // declared pattern (127.0.0.1:*) but not granted
    let rt = runtime();
    let p = hostile(&rt, &granted, Limits::default());
    let target = format!(
        "{}/debug/redirect?to={}/v1/instances",
        granted.url(),
        elsewhere.url()
    );
    let err = p
        .create(&machine(
            "redir",
            serde_json::json!({ "attack": "redirect", "target": target }),
        ))
        .await
        .unwrap_err();
    match &err {
        Error::CapabilityDenied { detail, .. } => {
            assert!(
                detail.contains(&elsewhere.addr().port().to_string())
                    && detail.contains("not granted"),
                "{detail}"
            );
        }
        other => panic!("expected capability denied, got {other}"),
    }
    assert_eq!(
        elsewhere.stats().requests,
        0,
        "the redirect target was never contacted"
    );
    assert_host_still_serves(&rt, &granted, "after-redirect").await;
}

#[tokio::test]
async fn a_forged_host_header_never_leaves_the_sandbox() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let target = format!("{}/v1/instances", cloud.url());
    let err = p
        .create(&machine(
            "host",
            serde_json::json!({ "attack": "host-header", "target": target }),
        ))
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::Terminal(m)) => assert!(m.contains("Forbidden"), "{m}"),
        _ => panic!("expected the guest to be refused the Host header, got {err}"),
    }
    assert_eq!(cloud.stats().requests, 0);
}

#[tokio::test]
async fn a_panic_is_a_trap_naming_plugin_and_call() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let err = p
        .create(&machine("trap", serde_json::json!({ "attack": "trap" })))
        .await
        .unwrap_err();
    match &err {
        Error::Trap {
            plugin,
            call,
            message,
        } => {
            assert_eq!((plugin.as_str(), *call), ("hostile", "create"));
            assert!(message.contains("panicked on purpose"), "{message}");
        }
        other => panic!("expected a trap, got {other}"),
    }
    assert!(err.is_fault());
    // The plugin itself is not poisoned: every call gets a fresh instance.
    let ok = p
        .create(&machine("fine", serde_json::json!({ "attack": "none" })))
        .await
        .unwrap();
    assert!(ok.provider_id.starts_with("hostile://"));
    assert_host_still_serves(&rt, &cloud, "after-trap").await;
}

#[tokio::test]
async fn no_filesystem_environment_or_sockets() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    // The host process has a filesystem, environment
    // variables, and a listening socket at this address; the plugin sees none.
    assert!(std::env::vars().count() > 0);
    let target = cloud.addr().to_string();
    let err = p
        .create(&machine(
            "escape",
            serde_json::json!({ "attack": "escape", "target": target }),
        ))
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::Terminal(m)) => {
            assert!(m.contains("fs: denied"), "{m}");
            assert!(m.contains("env: 0 variables"), "{m}");
            assert!(m.contains("net: denied"), "{m}");
        }
        _ => panic!("expected the plugin's report, got {err}"),
    }
    assert_eq!(cloud.stats().requests, 0);
}

#[tokio::test]
async fn precompiled_code_is_cached_by_digest_and_survives_corruption() {
    let dir = std::env::temp_dir().join(format!("capstan-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = || RuntimeConfig {
        cache_dir: Some(dir.clone()),
        max_concurrent_calls: 4,
        ..Default::default()
    };
    let path = plugin("sim_provider");

    let first = Runtime::new(cfg())
        .unwrap()
        .load_file(&path, Limits::default(), Grants::default())
        .unwrap();
    assert_eq!(first.load_path(), LoadPath::Compiled);
    let rt = Runtime::new(cfg()).unwrap();
    let second = rt
        .load_file(&path, Limits::default(), Grants::default())
        .unwrap();
    assert_eq!(second.load_path(), LoadPath::Cached);
    assert_eq!(first.digest(), second.digest());
    assert_eq!(rt.cache().unwrap().len(), 1);

    // A corrupt entry is discarded and the plugin recompiled.
    for entry in std::fs::read_dir(&dir).unwrap() {
        std::fs::write(entry.unwrap().path(), b"garbage").unwrap();
    }
    let third = Runtime::new(cfg())
        .unwrap()
        .load_file(&path, Limits::default(), Grants::default())
        .unwrap();
    assert_eq!(third.load_path(), LoadPath::Compiled);
    third
        .provider()
        .unwrap()
        .validate(r#"{"endpoint":"http://127.0.0.1:1"}"#)
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn many_concurrent_calls_share_one_pre_instantiated_plugin() {
    let cloud = cloud().await;
    let rt = runtime();
    let sim = sim_provider(&rt, &cloud);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let sim = sim.clone();
        let m = machine(
            &format!("c{i}"),
            serde_json::json!({ "endpoint": cloud.url() }),
        );
        tasks.push(tokio::spawn(async move { sim.create(&m).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(cloud.stats().instances_launched, 40);
}

#[tokio::test]
async fn inspection_reports_manifest_imports_and_exports() {
    let rt = runtime();
    let p = rt
        .load_file(
            &plugin("sim_provider"),
            Limits::default(),
            Grants::default(),
        )
        .unwrap();
    assert_eq!(p.manifest().world, capstan_manifest::World::Provider);
    assert!(
        p.exports()
            .iter()
            .any(|e| e == "capstan:plugin/provider@0.1.0")
    );
    assert!(
        p.imports()
            .iter()
            .any(|i| i.starts_with("wasi:http/outgoing-handler"))
    );
    assert!(p.digest().starts_with("sha256:") && p.digest().len() == 71);
    let err = rt
        .load(
            "empty",
            b"\0asm\x0d\0\x01\0",
            Limits::default(),
            Grants::default(),
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no `capstan-manifest` custom section"),
        "{err}"
    );
}

/// Regression: request bodies must be framed and flushed so that no request
/// fails or is sent twice (a `closed` stream after the host read the whole
/// body once surfaced as a transport error, and retries launched duplicates).
#[tokio::test]
async fn hundreds_of_requests_in_a_row_all_succeed() {
    let cloud = cloud().await;
    let rt = runtime();
    let sim = sim_provider(&rt, &cloud);
    for i in 0..150 {
        let mut m = machine(
            &format!("seq{i}"),
            serde_json::json!({ "endpoint": cloud.url() }),
        );
        let status = sim
            .create(&m)
            .await
            .unwrap_or_else(|e| panic!("create #{i}: {e}"));
        m.provider_id = Some(status.provider_id);
        sim.delete(&m)
            .await
            .unwrap_or_else(|e| panic!("delete #{i}: {e}"));
    }
    let stats = cloud.stats();
    assert_eq!(
        stats.instances_launched, 150,
        "exactly one instance per create"
    );
    assert_eq!(
        stats.requests,
        150 * 3,
        "create, lookup and delete: nothing retried"
    );
}
