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

pub(crate) const TOKEN: &str = "sim-token-5f2c";

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig {
        max_concurrent_calls: 64,
        ..Default::default()
    })
    .unwrap()
}

pub(crate) fn grants_for(cloud: &SimCloud) -> Grants {
    let mut g = Grants {
        http: vec![cloud.url().parse().unwrap()],
        ..Default::default()
    };
    g.credentials
        .insert("sim-cloud".into(), Credential::Bearer(TOKEN.into()));
    g
}

pub(crate) async fn cloud() -> SimCloud {
    SimCloud::start(SimCloudConfig {
        token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

pub(crate) fn machine(name: &str, config: serde_json::Value) -> Machine {
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
        .create(&m, None)
        .await
        .expect("well-behaved plugin keeps working after a hostile one");
    assert!(status.provider_id.starts_with("sim://"));
}

/// Every request names the plugin revision that sent it in its
/// User-Agent (host-owned: a product the guest wrote is dropped), so a
/// cloud's own logs — and a cloud failing one revision's requests — tell
/// two revisions of one Plugin apart.
#[tokio::test]
async fn each_request_names_its_plugin_revision_in_the_user_agent() {
    let cloud = cloud().await;
    let rt = runtime();
    let built = std::fs::read(plugin("sim_provider")).unwrap();
    let manifest = std::str::from_utf8(
        &std::fs::read(
            capstan_e2e::workspace_root().join("plugins/sim-provider/capstan-plugin.json"),
        )
        .unwrap(),
    )
    .unwrap()
    .replace("\"version\": \"0.1.0\"", "\"version\": \"0.1.1\"");
    let next = capstan_e2e::cli::with_manifest(&built, &manifest);
    let load = |bytes: &[u8]| {
        rt.load("sim.wasm", bytes, Limits::default(), grants_for(&cloud))
            .unwrap()
            .observed_as("sim")
            .provider()
            .unwrap()
    };
    let (stable, canary) = (load(&built), load(&next));
    assert_ne!(stable.plugin().digest(), canary.plugin().digest());
    let agent = |p: &ProviderPlugin| {
        let hex = p.plugin().digest().trim_start_matches("sha256:");
        format!("capstan-plugin/sim@sha256:{}", &hex[..12])
    };
    let (stable_agent, canary_agent) = (agent(&stable), agent(&canary));
    let config = serde_json::json!({ "endpoint": cloud.url() });
    stable
        .create(&machine("ua-0", config.clone()), None)
        .await
        .unwrap();
    canary
        .create(&machine("ua-1", config.clone()), None)
        .await
        .unwrap();
    let seen = cloud.stats().user_agents;
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        {
            let mut both = vec![stable_agent.clone(), canary_agent.clone()];
            both.sort();
            both
        },
        "{seen:?}"
    );

    // The cloud fails the canary's requests only.
    cloud.set_faults(Faults {
        fail_user_agent: Some(canary_agent.clone()),
        ..Faults::default()
    });
    let err = canary
        .create(&machine("ua-2", config.clone()), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Plugin {
                error: PluginError::Transient(_),
                ..
            }
        ),
        "{err}"
    );
    stable.create(&machine("ua-3", config), None).await.unwrap();
    let stats = cloud.stats();
    assert_eq!(stats.instances_launched, 3, "ua-0, ua-1 and ua-3");
    assert!(stats.injected_errors >= 1);
}

#[tokio::test]
async fn sim_provider_runs_the_machine_lifecycle_against_the_cloud() {
    let cloud = cloud().await;
    let rt = runtime();
    let sim = sim_provider(&rt, &cloud);
    let config = serde_json::json!({ "endpoint": cloud.url(), "instanceType": "medium" });
    sim.validate(&config.to_string()).await.unwrap();

    let mut m = machine("worker-0", config.clone());
    let first = sim.create(&m, None).await.unwrap();
    let again = sim.create(&m, None).await.unwrap();
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
        .create(&machine("m", serde_json::json!({ "endpont": "x" })), None)
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
        .create(
            &machine("m", serde_json::json!({ "endpoint": cloud.url() })),
            None,
        )
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
        if let Err(e) = sim
            .create(&machine(&format!("t{i}"), config.clone()), None)
            .await
        {
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
    let err = sim
        .create(&machine("stockout", config), None)
        .await
        .unwrap_err();
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
        .create(
            &machine("loop", serde_json::json!({ "attack": "infinite-loop" })),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::DeadlineExceeded { ref plugin, call: "create", limit } if plugin == "hostile" && limit == Duration::from_millis(300)),
        "{err}"
    );
    assert!(err.to_string().contains("300 ms"), "{err}");
    assert_host_still_serves(&rt, &cloud, "after-loop").await;
}

/// A one-thread executor (the harshest case: one CPU-bound call without
/// yields would stop everything), four plugins spinning until their
/// deadline, a fifth call waiting for the only call slot, and a 10 ms
/// ticker standing in for leader election and health probes: the ticker
/// is never late by much more than an epoch tick, and the waiting call
/// runs when a slot frees. Calls run on that executor here (no call
/// threads), so only the epoch yields keep it free.
#[tokio::test(flavor = "current_thread")]
async fn cpu_bound_calls_never_hold_the_executor_and_calls_share_a_host_wide_cap() {
    cpu_bound_calls(0).await;
}

/// The same with the calls on one call thread (the default runs one per
/// core): the four spinning calls share that thread and take turns at
/// every epoch tick, so all reach their own deadline together rather than
/// one after another, and the caller's executor is not touched at all.
#[tokio::test(flavor = "current_thread")]
async fn cpu_bound_calls_on_one_call_thread_take_turns_and_leave_the_caller_alone() {
    cpu_bound_calls(1).await;
}

async fn cpu_bound_calls(call_threads: usize) {
    let cloud = cloud().await;
    let rt = Runtime::new(RuntimeConfig {
        max_concurrent_calls: 4,
        call_threads,
        ..Default::default()
    })
    .unwrap();
    let limits = Limits {
        call_timeout: Duration::from_millis(1500),
        ..Default::default()
    };
    let p = hostile(&rt, &cloud, limits);
    let spin = machine("spin", serde_json::json!({ "attack": "infinite-loop" }));
    let ticker = tokio::spawn(async {
        let mut worst = Duration::ZERO;
        let mut next = tokio::time::Instant::now();
        for _ in 0..150 {
            next += Duration::from_millis(10);
            tokio::time::sleep_until(next).await;
            worst = worst.max(tokio::time::Instant::now() - next);
        }
        worst
    });
    let started = std::time::Instant::now();
    let spinning = async {
        let results = futures::future::join_all((0..4).map(|_| p.create(&spin, None))).await;
        (results, started.elapsed())
    };
    // The fifth call waits for a slot: its deadline only starts then.
    let fifth = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let waited = std::time::Instant::now();
        let r = p.create(&spin, None).await;
        (r, waited.elapsed())
    };
    let ((results, spun), (fifth, fifth_took)) = futures::future::join(spinning, fifth).await;
    let worst = ticker.await.unwrap();
    eprintln!(
        "4 CPU-bound calls ({call_threads} call threads) done in {spun:?}: worst ticker delay {worst:?} (epoch tick 5 ms); a 5th call over the cap of 4 took {fifth_took:?}",
    );
    for r in results {
        assert!(matches!(r, Err(Error::DeadlineExceeded { .. })), "{r:?}");
    }
    // Taking turns, all four end at their 1.5 s deadline; one after
    // another they would take 6 s.
    assert!(
        spun < Duration::from_millis(3500),
        "the spinning calls took turns: {spun:?}"
    );
    assert!(
        matches!(fifth, Err(Error::DeadlineExceeded { .. })),
        "{fifth:?}"
    );
    assert!(
        fifth_took >= Duration::from_millis(2500),
        "the 5th call waited for a slot, then ran its own 1.5 s: {fifth_took:?}"
    );
    // Without yields the ticker would wait out whole calls (1.5 s each).
    assert!(
        worst < Duration::from_millis(300),
        "the executor was held for {worst:?}"
    );
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
        .create(
            &machine("bomb", serde_json::json!({ "attack": "memory-bomb" })),
            None,
        )
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

/// What the guest hands the host in one crossing is bounded before the host
/// copies it: a 100 MiB log message (the plugin may hold it: 256 MiB of
/// memory) is refused as host call data, naming the limit, not copied and
/// then found over the log limit.
#[tokio::test]
async fn a_100_mib_log_message_is_refused_before_the_host_copies_it() {
    let cloud = cloud().await;
    let rt = runtime();
    let limits = Limits {
        memory_bytes: 256 * 1024 * 1024,
        ..Default::default()
    };
    let p = hostile(&rt, &cloud, limits);
    let err = p
        .create(
            &machine("log-bomb", serde_json::json!({ "attack": "log-bomb" })),
            None,
        )
        .await
        .unwrap_err();
    match &err {
        Error::OutputLimit {
            kind: OutputKind::HostCall,
            limit_bytes,
            ..
        } => assert_eq!(*limit_bytes, limits.hostcall_bytes()),
        other => panic!("expected the host call data limit, got {other}"),
    }
    assert!(
        err.to_string()
            .contains("exceeded its host call data limit of 5242880 bytes"),
        "{err}"
    );
    assert!(err.is_fault(), "over a limit is the plugin's fault");
    assert_host_still_serves(&rt, &cloud, "after-log-bomb").await;
}

async fn expect_output_limit(attack: &str, kind: OutputKind) {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let err = p
        .create(
            &machine(attack, serde_json::json!({ "attack": attack })),
            None,
        )
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
        .create(
            &machine(
                "exfil",
                serde_json::json!({ "attack": "undeclared-host", "target": target }),
            ),
            None,
        )
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
        .create(
            &machine(
                "redir",
                serde_json::json!({ "attack": "redirect", "target": target }),
            ),
            None,
        )
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
        .create(
            &machine(
                "host",
                serde_json::json!({ "attack": "host-header", "target": target }),
            ),
            None,
        )
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::Terminal(m)) => assert!(m.contains("Forbidden"), "{m}"),
        _ => panic!("expected the guest to be refused the Host header, got {err}"),
    }
    assert_eq!(cloud.stats().requests, 0);
}

#[tokio::test]
async fn a_trace_request_never_carries_the_granted_credential() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let target = format!("{}/v1/instances", cloud.url());
    let err = p
        .create(
            &machine(
                "trace",
                serde_json::json!({ "attack": "trace", "target": target }),
            ),
            None,
        )
        .await
        .unwrap_err();
    match &err {
        Error::CapabilityDenied { detail, .. } => assert!(
            detail.contains("TRACE requests to") && detail.contains("never carry credential slot"),
            "{detail}"
        ),
        other => panic!("expected capability denied, got {other}"),
    }
    assert_eq!(cloud.stats().requests, 0, "nothing reached the cloud");
}

/// The controller ties the runtime's outbound gate to its leader fence: a
/// replica past its renew deadline sends nothing from any plugin call, and
/// sends again once it leads.
#[tokio::test]
async fn a_closed_outbound_gate_lets_no_plugin_request_leave() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let cloud = cloud().await;
    let rt = runtime();
    let leading = Arc::new(AtomicBool::new(false));
    let gate = leading.clone();
    assert!(rt.gate_outbound(move || gate.load(Ordering::SeqCst)));
    assert!(!rt.gate_outbound(|| true), "the gate is set once");
    let sim = sim_provider(&rt, &cloud);
    let m = machine("fenced", serde_json::json!({ "endpoint": cloud.url() }));
    let err = sim.create(&m, None).await.unwrap_err();
    match &err {
        Error::Fenced { call, .. } => assert_eq!(*call, "create"),
        other => panic!("expected fenced, got {other}"),
    }
    assert!(
        err.to_string().contains("this replica may not act now") && !err.is_fault(),
        "the host's decision, not the plugin's fault: {err}"
    );
    assert_eq!(cloud.stats().requests, 0, "nothing reached the cloud");
    leading.store(true, Ordering::SeqCst);
    let status = sim.create(&m, None).await.expect("sends once leading");
    assert!(status.provider_id.starts_with("sim://"));
    assert_eq!(cloud.stats().instances_launched, 1);
}

/// The window a stopped leader's request slipped through (CI, stop 50): the
/// gate said yes when the plugin made the request, and no by the time it
/// would have gone out (the process was stopped in between). A gate that
/// allows exactly its first question stands in for that: the request is
/// made, then refused before it leaves, and the cloud sees nothing.
#[tokio::test]
async fn a_request_made_before_the_gate_closed_does_not_leave_after() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let cloud = cloud().await;
    let rt = runtime();
    let asked = Arc::new(AtomicU32::new(0));
    let counter = asked.clone();
    assert!(rt.gate_outbound(move || counter.fetch_add(1, Ordering::SeqCst) == 0));
    let sim = sim_provider(&rt, &cloud);
    let m = machine("late", serde_json::json!({ "endpoint": cloud.url() }));
    let err = sim.create(&m, None).await.unwrap_err();
    match &err {
        Error::Fenced { call, .. } => assert_eq!(*call, "create"),
        other => panic!("expected fenced, got {other}"),
    }
    assert!(
        err.to_string().contains("this replica may not act now") && !err.is_fault(),
        "the host's decision, not the plugin's fault: {err}"
    );
    assert!(
        asked.load(Ordering::SeqCst) >= 2,
        "the gate was asked again after the request was made"
    );
    assert_eq!(cloud.stats().requests, 0, "nothing reached the cloud");
}

#[tokio::test]
async fn a_panic_is_a_trap_naming_plugin_and_call() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let err = p
        .create(
            &machine("trap", serde_json::json!({ "attack": "trap" })),
            None,
        )
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
        .create(
            &machine("fine", serde_json::json!({ "attack": "none" })),
            None,
        )
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
        .create(
            &machine(
                "escape",
                serde_json::json!({ "attack": "escape", "target": target }),
            ),
            None,
        )
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
        tasks.push(tokio::spawn(async move { sim.create(&m, None).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(cloud.stats().instances_launched, 40);
}

/// Contract 0.2.0 is additive: a provider built against 0.1.0 (the frozen
/// package, `create(machine)`) loads and serves the whole lifecycle; only
/// bootstrap data, which its `create` cannot carry, is refused before any
/// call, naming the contract.
#[tokio::test]
async fn a_provider_built_against_contract_0_1_keeps_working() {
    let rt = runtime();
    let legacy = rt
        .load_file(
            &plugin("contract_0_1_provider"),
            Limits::default(),
            Grants::default(),
        )
        .unwrap();
    assert_eq!(legacy.manifest().contract, "0.1.0");
    assert!(
        legacy
            .exports()
            .iter()
            .any(|e| e == "capstan:plugin/provider@0.1.0")
    );
    let p = legacy.provider().unwrap();
    assert!(!p.takes_bootstrap_data());
    let m = machine("legacy", serde_json::json!({}));
    p.validate("{}").await.unwrap();
    let created = p.create(&m, None).await.unwrap();
    assert_eq!(created.provider_id, format!("legacy://{}", m.uid));
    assert_eq!(p.get(&m).await.unwrap().provider_id, created.provider_id);
    assert_eq!(
        p.delete(&m).await.unwrap(),
        capstan_runtime::types::Deletion::Done
    );
    let data = capstan_runtime::types::BootstrapData {
        format: capstan_runtime::types::BootstrapFormat::CloudConfig,
        value: b"#cloud-config\n".to_vec(),
    };
    let err = p.create(&m, Some(&data)).await.unwrap_err();
    assert!(
        matches!(err, capstan_runtime::Error::Unsupported { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("contract 0.1.0"), "{err}");
    // A 0.2.0 provider takes it.
    let current = rt
        .load_file(
            &plugin("sim_provider"),
            Limits::default(),
            Grants::default(),
        )
        .unwrap()
        .provider()
        .unwrap();
    assert!(current.takes_bootstrap_data());
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
            .any(|e| e == "capstan:plugin/provider@0.2.0")
    );
    assert!(p.imports().iter().any(|i| i == "capstan:plugin/http@0.3.0"));
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
            .create(&m, None)
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

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    proc_status_kib("VmRSS:").unwrap_or(0)
}

/// One `kB` field of `/proc/self/status`.
fn proc_status_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The peak resident memory of this process while it runs, sampled every
/// 5 ms.
struct PeakRss {
    sampling: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<u64>,
}

impl PeakRss {
    fn start() -> PeakRss {
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = sampling.clone();
        let sampler = std::thread::spawn(move || {
            let mut peak = 0;
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib());
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        });
        PeakRss { sampling, sampler }
    }

    /// Stop sampling; the peak in KiB.
    fn stop(self) -> u64 {
        self.sampling
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.sampler.join().unwrap()
    }
}

#[tokio::test]
async fn a_request_flood_is_held_to_the_in_flight_budget_and_host_memory_stays_flat() {
    let cloud = cloud().await;
    let rt = runtime();
    let p = hostile(&rt, &cloud, Limits::default());
    let target = format!("{}/debug/slow?ms=300", cloud.url());
    let attack = machine(
        "flood",
        serde_json::json!({ "attack": "request-flood", "target": target }),
    );
    // One warm-up call so the pool and code are in place before measuring.
    let _ = p.create(&attack, None).await;
    let before = rss_kib();
    // The peak while the calls run, sampled every 5 ms.
    let sampler = PeakRss::start();
    for round in 0..3 {
        let err = p.create(&attack, None).await.unwrap_err();
        match &err {
            Error::RequestLimit {
                plugin,
                call,
                limit,
                size,
            } => {
                assert_eq!((plugin.as_str(), *call), ("hostile", "create"));
                assert_eq!(*limit, capstan_runtime::limits::RequestLimit::InFlight);
                assert_eq!(
                    *size,
                    capstan_runtime::limits::DEFAULT_MAX_REQUESTS_IN_FLIGHT
                );
                assert!(
                    err.to_string().contains("16 outbound requests in flight"),
                    "{err}"
                );
            }
            other => panic!("round {round}: expected the in-flight limit, got {other}"),
        }
    }
    let grown_mib = sampler.stop().saturating_sub(before) / 1024;
    let stats = cloud.stats();
    eprintln!(
        "flood: 3 calls, {} requests reached the target, at most {} at once, host memory peak +{grown_mib} MiB",
        stats.debug_requests, stats.max_slow_in_flight
    );
    assert!(
        stats.max_slow_in_flight <= 16,
        "the target saw {} requests open at once",
        stats.max_slow_in_flight
    );
    assert!(
        stats.debug_requests <= 4 * 16,
        "4 calls reached the target {} times",
        stats.debug_requests
    );
    // Measured alone: +1 MiB at the peak with the handle cap (the guest traps
    // at 10,000 handles), +16 MiB without it (100,000 handles, growing with
    // the loop until the deadline). Other tests run in this process at the
    // same time, hence the slack.
    assert!(grown_mib < 64, "host memory peaked {grown_mib} MiB higher");
    assert_host_still_serves(&rt, &cloud, "after-flood").await;
}

/// Header maps filled to the field cap and hoarded until the handle cap
/// traps grow the host's memory by at most what the plugin's host bytes
/// allow: one call by `hostBytesPerCall` (+10 %), eight calls under
/// `concurrentCalls: 4` by the smallest `hostBytes` admission takes (4 ×
/// `hostBytesPerCall`). Measured in a process of its own
/// ([`host_memory_of_hoarding_calls`]), since this binary runs other tests
/// at the same time and a process's memory cannot be split between them.
#[test]
fn hoarded_header_maps_grow_host_memory_within_the_plugins_host_bytes() {
    let exe = std::env::current_exe().unwrap();
    let child = "sandbox::host_memory_of_hoarding_calls";
    let out = std::process::Command::new(exe)
        .args([
            child,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the measuring process failed:\n{stdout}\n{stderr}"
    );
}

/// Run alone by the test above. Peak resident memory is the kernel's high
/// water mark (`VmHWM`), reset before each measurement, so no sampling
/// interval can miss a peak.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "run in a process of its own by hoarded_header_maps_grow_host_memory_within_the_plugins_host_bytes"]
async fn host_memory_of_hoarding_calls() {
    let cloud = cloud().await;
    let rt = runtime();
    let limits = Limits::default();
    let per_call = limits.host_bytes_per_call();
    let loaded = rt
        .load_file(&plugin("hostile_plugin"), limits, grants_for(&cloud))
        .unwrap();
    let p = loaded.provider().unwrap();
    let attack = |name: &str| machine(name, serde_json::json!({ "attack": "header-hoard" }));
    let traps_at_the_handle_cap = |err: Error| {
        // The guest traps when its handle table is full, long before it
        // has made its 100,000 header maps.
        assert!(
            matches!(err, Error::Trap { .. }),
            "expected a trap at the handle cap, got {err}"
        );
    };
    // A harmless call first, so code, call thread and the first pool slot
    // are in place: what is measured is what an attack adds to a host that
    // has been serving.
    let harmless = machine("warm", serde_json::json!({ "attack": "none" }));
    let _ = p.create(&harmless, None).await;

    let before = reset_peak_rss();
    traps_at_the_handle_cap(p.create(&attack("one"), None).await.unwrap_err());
    let one = (peak_rss_kib() - before) * 1024;

    let concurrent = 4;
    let quota = capstan_runtime::Quota::new(capstan_runtime::QuotaSpec {
        concurrent_calls: Some(concurrent),
        ..Default::default()
    });
    let q = loaded.with_quota(Some(quota)).provider().unwrap();
    let before = reset_peak_rss();
    let calls = (0..8).map(|i| {
        let q = q.clone();
        let m = attack(&format!("hoard-{i}"));
        async move {
            // A call the quota holds back longer than its admission wait
            // (a slow, shared CI machine) asks again after the wait it is
            // told, as a controller does: all eight still run, four at a time.
            loop {
                match q.create(&m, None).await {
                    Err(Error::QuotaExceeded { retry_after, .. }) => {
                        tokio::time::sleep(retry_after).await;
                    }
                    other => return other,
                }
            }
        }
    });
    for result in futures::future::join_all(calls).await {
        traps_at_the_handle_cap(result.unwrap_err());
    }
    let eight = (peak_rss_kib() - before) * 1024;
    let host_bytes = u64::from(concurrent) * per_call;
    eprintln!(
        "header hoard (maps at the {} KiB field cap, {} handles): host memory peak \
         +{:.1} MiB for one call (hostBytesPerCall {:.1} MiB), \
         +{:.1} MiB for 8 calls under concurrentCalls {concurrent} (hostBytes {:.1} MiB)",
        capstan_runtime::limits::MAX_FIELDS_BYTES >> 10,
        capstan_runtime::MAX_RESOURCES_PER_CALL,
        one as f64 / MIB,
        per_call as f64 / MIB,
        eight as f64 / MIB,
        host_bytes as f64 / MIB,
    );
    assert!(
        one as f64 <= per_call as f64 * 1.1,
        "one call grew host memory by {one} bytes, over hostBytesPerCall {per_call} + 10 %"
    );
    assert!(
        eight <= host_bytes,
        "8 calls grew host memory by {eight} bytes, over hostBytes {host_bytes}"
    );
    assert_host_still_serves(&rt, &cloud, "after-hoard").await;
}

const MIB: f64 = 1024.0 * 1024.0;

/// Reset this process's peak resident memory to its current one; the
/// current one, in KiB.
fn reset_peak_rss() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS (Linux 4.0+)");
    rss_kib()
}

/// This process's peak resident memory since the last reset, in KiB.
fn peak_rss_kib() -> u64 {
    proc_status_kib("VmHWM:").expect("VmHWM in /proc/self/status")
}

#[tokio::test]
async fn a_call_makes_at_most_its_request_budget_and_the_plugin_override_applies() {
    let cloud = cloud().await;
    let rt = runtime();
    let target = format!("{}/debug/echo", cloud.url());
    let attack = machine(
        "serial",
        serde_json::json!({ "attack": "request-serial", "target": target }),
    );
    let p = hostile(&rt, &cloud, Limits::default());
    let err = p.create(&attack, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::RequestLimit {
                limit: capstan_runtime::limits::RequestLimit::PerCall,
                size: 100,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(cloud.stats().debug_requests, 100);

    let tight = hostile(
        &rt,
        &cloud,
        Limits {
            max_requests_per_call: 5,
            ..Limits::default()
        },
    );
    let err = tight.create(&attack, None).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("exceeded its limit of 5 outbound requests per call"),
        "{err}"
    );
    assert_eq!(cloud.stats().debug_requests, 105);
}

#[tokio::test]
async fn aws_keys_sign_requests_but_never_reach_the_plugin() {
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY";
    let granted = cloud().await;
    let elsewhere = cloud().await; // declared (127.0.0.1:*) but not granted
    let rt = runtime();
    let credentials = capstan_runtime::AwsCredentials {
        access_key_id: "AKIDCAPSTANTEST".into(),
        secret_access_key: SECRET.into(),
        session_token: None,
    };
    let scope = capstan_runtime::AwsScope {
        region: "us-east-1".into(),
        service: "ec2".into(),
    };
    let mut grants = Grants {
        http: vec![granted.url().parse().unwrap()],
        ..Default::default()
    };
    grants.credentials.insert(
        "sim-cloud".into(),
        Credential::AwsSigV4 {
            credentials: credentials.clone(),
            scope: scope.clone(),
        },
    );
    let p = rt
        .load_file(&plugin("hostile_plugin"), Limits::default(), grants)
        .unwrap()
        .provider()
        .unwrap();
    let err = p
        .create(
            &machine(
                "probe",
                serde_json::json!({
                    "attack": "probe-credentials",
                    "target": format!("{}/debug/echo?Action=DescribeInstances", granted.url()),
                    "endpoint": format!("{}/debug/echo", elsewhere.url()),
                }),
            ),
            None,
        )
        .await
        .unwrap_err();
    let shown = err.to_string();
    // The denial of the second request wins over what the plugin returned.
    assert!(
        matches!(&err, Error::CapabilityDenied { detail, .. } if detail.contains("not granted")),
        "{shown}"
    );
    assert!(!shown.contains(SECRET), "{shown}");
    assert_eq!(elsewhere.stats().debug_requests, 0, "never contacted");

    // What the granted endpoint received: the host's signature, not the
    // guest's headers, and it verifies with the secret the plugin never had.
    let echoed = granted.echoed();
    assert_eq!(echoed.len(), 1);
    let got = &echoed[0];
    let header = |name: &str| {
        got.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    let authorization = header("authorization");
    assert_eq!(authorization.len(), 1, "{got:?}");
    assert!(
        authorization[0].starts_with("AWS4-HMAC-SHA256 Credential=AKIDCAPSTANTEST/")
            && authorization[0].contains("/us-east-1/ec2/aws4_request"),
        "{got:?}"
    );
    assert!(header("x-amz-security-token").is_empty(), "{got:?}");
    let date = header("x-amz-date");
    assert_eq!(date.len(), 1);
    assert_ne!(date[0], "19990101T000000Z");
    let host = header("host")[0].to_string();
    let expected = capstan_sigv4::sign_with_date(
        &capstan_sigv4::Request {
            method: &got.method,
            path_and_query: &got.path,
            headers: &[("host", host.as_str())],
            payload: got.body.as_bytes(),
        },
        &credentials,
        &scope,
        date[0].to_string(),
    );
    assert_eq!(expected.get("authorization"), Some(authorization[0]));
    assert!(!format!("{got:?}").contains(SECRET));
}

/// `Plugin.spec.quota.requestsPerMinute` as the runtime enforces it: a
/// hostile plugin sending requests one after another is stopped at the
/// bucket's burst, and the call ends as a host decision with a retry-after
/// (not a fault, not the per-call request limit). The quota is the
/// Plugin's, not the revision's: another revision sharing it finds it
/// spent, and sends nothing.
#[tokio::test]
async fn a_request_quota_is_shared_by_revisions_and_is_never_the_plugins_fault() {
    use capstan_runtime::{Quota, QuotaKind, QuotaSpec};
    let cloud = cloud().await;
    let rt = runtime();
    let quota = Quota::new(QuotaSpec {
        requests_per_minute: Some(6),
        ..Default::default()
    });
    let hostile = hostile(&rt, &cloud, Limits::default())
        .plugin()
        .with_quota(Some(quota.clone()))
        .provider()
        .unwrap();
    let target = format!("{}/debug/echo", cloud.url());
    let attack = machine(
        "metered",
        serde_json::json!({ "attack": "request-serial", "target": target }),
    );
    let err = hostile.create(&attack, None).await.unwrap_err();
    match &err {
        Error::QuotaExceeded {
            kind,
            size,
            retry_after,
            ..
        } => {
            assert_eq!((*kind, *size), (QuotaKind::RequestsPerMinute, 6));
            assert!(
                *retry_after > Duration::ZERO && *retry_after <= Duration::from_secs(10),
                "one token every ten seconds: {retry_after:?}"
            );
        }
        other => panic!("expected the quota, got {other}"),
    }
    assert!(!err.is_fault(), "a quota is the host's decision");
    assert!(err.to_string().contains("spec.quota"), "{err}");
    // Ten seconds' worth of 6 a minute: one request, then nothing.
    assert_eq!(cloud.stats().debug_requests, 1);

    // Another revision of the same Plugin shares the spent quota.
    let next = sim_provider(&rt, &cloud)
        .plugin()
        .with_quota(Some(quota))
        .provider()
        .unwrap();
    let m = machine("next", serde_json::json!({ "endpoint": cloud.url() }));
    let err = next.create(&m, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::QuotaExceeded {
                kind: QuotaKind::RequestsPerMinute,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(cloud.stats().requests, 0, "nothing reached the cloud API");
}

/// `concurrentCalls` as the runtime enforces it: a plugin whose calls hang
/// holds at most its quota of calls; one more waits the queue timeout and
/// is refused (a host decision), while another plugin's calls run as if
/// nothing happened; a slot freed is taken again.
#[tokio::test(flavor = "multi_thread")]
async fn a_concurrent_call_quota_holds_a_hanging_plugin_back_and_no_one_else() {
    use capstan_runtime::{Quota, QuotaKind, QuotaSpec};
    let cloud = cloud().await;
    let rt = runtime();
    let quota = Quota::new(QuotaSpec {
        concurrent_calls: Some(2),
        queue_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    });
    let spinner = hostile(
        &rt,
        &cloud,
        Limits {
            call_timeout: Duration::from_secs(3),
            ..Limits::default()
        },
    )
    .plugin()
    .with_quota(Some(quota.clone()))
    .provider()
    .unwrap();
    let spin = machine("spin", serde_json::json!({ "attack": "infinite-loop" }));
    let hanging: Vec<_> = (0..2)
        .map(|_| {
            let (p, m) = (spinner.clone(), spin.clone());
            tokio::spawn(async move { p.create(&m, None).await })
        })
        .collect();
    eventually_in_flight(&quota, 2).await;
    let asked = std::time::Instant::now();
    let err = spinner.create(&spin, None).await.unwrap_err();
    let waited = asked.elapsed();
    assert!(
        matches!(
            err,
            Error::QuotaExceeded {
                kind: QuotaKind::ConcurrentCalls,
                size: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        waited >= Duration::from_millis(300),
        "it queued first: {waited:?}"
    );
    assert!(!err.is_fault());
    assert_eq!(quota.calls_in_flight(), 2, "never more than the quota");
    // Another plugin is not held back by this one's quota.
    assert_host_still_serves(&rt, &cloud, "beside-the-spinner").await;
    for call in hanging {
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
    }
    // A slot is held until the call's store is released, which the call
    // thread does just after handing back the result; it comes back soon.
    slots_come_back(&quota).await;
    let fine = machine("fine", serde_json::json!({ "attack": "none" }));
    spinner
        .create(&fine, None)
        .await
        .expect("a freed slot is taken");
}

async fn slots_come_back(quota: &capstan_runtime::Quota) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while quota.calls_in_flight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "slots come back with the calls: {} still held 5 s after the results",
            quota.calls_in_flight()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn eventually_in_flight(quota: &capstan_runtime::Quota, n: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while quota.calls_in_flight() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} calls never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
