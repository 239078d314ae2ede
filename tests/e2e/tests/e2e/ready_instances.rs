//! Instances made ready before their calls (the runtime's `ready` module),
//! against the real plugins: a call that takes one sees nothing an earlier
//! call left, after a clean return, a trap, a deadline or a memory-limit
//! hit; and what is the call's own (outbound gate, deadline, quota, log
//! sink, recording) is its own, whichever variant of the revision made the
//! instance. The same secrecy holds with no call threads and with no ready
//! instances at all. Pure calls, which run on their caller's thread, keep
//! every limit a call-thread call has. A property test runs random
//! interleavings of all of it (gate flips between refill and take, reloads
//! while warm) and checks each call against a model of what it should see.

use super::sandbox::{cloud, grants_for, machine};
use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::SimCloud;
use capstan_runtime::tape::Tape;
use capstan_runtime::types::PluginError;
use capstan_runtime::{
    CallProfile, Error, Limits, LogSink, Plugin, ProviderPlugin, Quota, QuotaKind, QuotaSpec,
    Runtime, RuntimeConfig,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn runtime(call_threads: usize, ready_instances: u32) -> Runtime {
    Runtime::new(RuntimeConfig {
        max_concurrent_calls: 16,
        call_threads,
        ready_instances,
        ..Default::default()
    })
    .unwrap()
}

fn load(rt: &Runtime, cloud: &SimCloud, stem: &str, limits: Limits) -> Plugin {
    rt.load_file(&plugin(stem), limits, grants_for(cloud))
        .unwrap()
}

/// Wait until at least `n` instances are ready (each is made after the
/// previous call's release, off that call's path).
async fn until_ready(rt: &Runtime, n: usize) {
    for _ in 0..500 {
        if rt.ready_instances() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no instance was made ready: {} ready, {n} expected",
        rt.ready_instances()
    );
}

/// Run `call` once `ready` instances are ready: what it returned and how
/// many ready instances it took.
async fn taking<T>(
    rt: &Runtime,
    ready: usize,
    call: impl std::future::Future<Output = T>,
) -> (T, u64) {
    until_ready(rt, ready).await;
    let before: CallProfile = rt.call_profile();
    let out = call.await;
    (out, rt.call_profile().since(&before).prepared)
}

/// A log sink that keeps every line.
fn sink() -> (LogSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    let sink: LogSink = Arc::new(move |_call, line: &str| kept.lock().unwrap().push(line.into()));
    (sink, lines)
}

fn attack(
    name: &str,
    attack: &str,
    then: Option<&str>,
    cloud: &SimCloud,
) -> capstan_runtime::types::Machine {
    let mut config = serde_json::json!({ "attack": attack, "target": cloud.url() });
    if let Some(then) = then {
        config["then"] = then.into();
    }
    machine(name, config)
}

/// A hostile plugin leaves a secret in a static, its heap, a deep stack
/// frame, a freshly grown region, stdout and a leaked wasi:http header
/// map, then returns, traps, spins to its deadline or allocates to its
/// memory limit. The next call, for another Machine, scans all of its
/// linear memory and its static, and finds only its own marker; its log
/// lines hold none of it. With call threads (the ready instance is taken
/// on the thread that made it), without (taken on the caller's), and with
/// no ready instances (every call instantiates afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_sees_what_an_earlier_call_left_behind() {
    let cloud = cloud().await;
    for (call_threads, ready) in [(2, 8), (0, 8), (2, 0)] {
        let rt = runtime(call_threads, ready);
        let limits = Limits {
            call_timeout: Duration::from_secs(1),
            memory_bytes: 64 * 1024 * 1024,
            ..Default::default()
        };
        let (log_sink, lines) = sink();
        let hostile = load(&rt, &cloud, "hostile_plugin", limits)
            .with_log_sink(Some(log_sink))
            .provider()
            .unwrap();
        for then in [None, Some("trap"), Some("deadline"), Some("memory")] {
            let case = format!("{call_threads} call threads, {ready} ready, then {then:?}");
            let stashed = hostile
                .create(&attack("stash", "stash", then, &cloud), None)
                .await;
            match (then, &stashed) {
                (None, Ok(_)) => {}
                (Some("trap"), Err(Error::Trap { .. }))
                | (Some("deadline"), Err(Error::DeadlineExceeded { .. }))
                | (Some("memory"), Err(Error::MemoryLimit { .. })) => {}
                _ => panic!("{case}: the stash ended as {stashed:?}"),
            }
            if ready > 0 {
                until_ready(&rt, 1).await;
            }
            let seen = lines.lock().unwrap().len();
            let before = rt.call_profile();
            let peeked = hostile
                .create(&attack("peek", "peek", None, &cloud), None)
                .await;
            let taken = rt.call_profile().since(&before).prepared;
            assert_eq!(
                taken,
                u64::from(ready > 0),
                "{case}: the peek took a ready instance iff there were any"
            );
            let Err(Error::Plugin {
                error: PluginError::Terminal(found),
                ..
            }) = peeked
            else {
                panic!("{case}: the peek answered {peeked:?}");
            };
            assert!(
                found.contains("\"self\""),
                "{case}: the scan found its own marker: {found}"
            );
            assert!(
                !found.contains("uid-stash") && found.contains("static: \"\""),
                "{case}: the peek found what the stash left: {found}"
            );
            let after: Vec<String> = lines.lock().unwrap()[seen..].to_vec();
            assert!(
                after.iter().all(|l| !l.contains("uid-stash")),
                "{case}: the peek's log lines hold the stash's: {after:?}"
            );
        }
    }
}

/// One revision, several variants (plain, with a log sink, with a request
/// quota, recorded to a tape), calls interleaved so that each takes an
/// instance another variant's release made ready: the outbound gate as it
/// is when the call starts, the call's own deadline (not the one of when
/// its instance was made), its own quota and sink, and recorded calls
/// never take a ready instance. Dropping the revisions gives every ready
/// instance's room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_instance_is_armed_for_the_call_that_takes_it() {
    let cloud = cloud().await;
    let rt = runtime(2, 8);
    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    rt.gate_outbound(move || gate.load(Ordering::SeqCst));
    let endpoint = serde_json::json!({ "endpoint": cloud.url() });
    let sim = load(&rt, &cloud, "sim_provider", Limits::default());
    let plain = sim.provider().unwrap();
    let create = |p: &ProviderPlugin, name: &str| {
        let (p, m) = (p.clone(), machine(name, endpoint.clone()));
        async move { p.create(&m, None).await }
    };

    create(&plain, "first").await.expect("the gate is open");
    // The instance was made ready while the gate was open.
    open.store(false, Ordering::SeqCst);
    let (closed, taken) = taking(&rt, 1, create(&plain, "closed")).await;
    assert_eq!(taken, 1);
    assert!(matches!(closed, Err(Error::Fenced { .. })), "{closed:?}");
    // And this one while it was closed.
    open.store(true, Ordering::SeqCst);
    let (reopened, taken) = taking(&rt, 1, create(&plain, "reopened")).await;
    assert_eq!(taken, 1);
    reopened.expect("the gate is open again");

    // A quota of one request a minute: its second call is held back; a
    // call of the plain variant taking the instance its release made is
    // not.
    let quoted = sim
        .with_quota(Some(Quota::new(QuotaSpec {
            requests_per_minute: Some(1),
            ..Default::default()
        })))
        .provider()
        .unwrap();
    let (spent, _) = taking(&rt, 1, create(&quoted, "quota-1")).await;
    spent.expect("the first request is within the quota");
    let (held, taken) = taking(&rt, 1, create(&quoted, "quota-2")).await;
    assert_eq!(taken, 1);
    assert!(
        matches!(
            held,
            Err(Error::QuotaExceeded {
                kind: QuotaKind::RequestsPerMinute,
                ..
            })
        ),
        "{held:?}"
    );
    let (free, taken) = taking(&rt, 1, create(&plain, "unquoted")).await;
    assert_eq!(taken, 1);
    free.expect("the plain variant has no quota");

    // Recorded calls neither take nor leave a ready instance.
    let taped = sim.with_tape(Some(Tape::record())).provider().unwrap();
    until_ready(&rt, 1).await;
    let before = rt.call_profile();
    create(&taped, "taped").await.expect("a recorded create");
    assert_eq!(rt.call_profile().since(&before).prepared, 0);

    // Log sinks: a line reaches the sink of the variant that called.
    let limits = Limits {
        call_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let hostile = load(&rt, &cloud, "hostile_plugin", limits);
    let (log_sink, lines) = sink();
    let sunk = hostile.with_log_sink(Some(log_sink)).provider().unwrap();
    let unsunk = hostile.provider().unwrap();
    let say = |p: &ProviderPlugin, name: &str| {
        let (p, m) = (p.clone(), attack(name, "say", None, &cloud));
        async move { p.create(&m, None).await }
    };
    say(&unsunk, "before").await.unwrap();
    let (said, taken) = taking(&rt, 2, say(&sunk, "sunk")).await;
    said.unwrap();
    assert_eq!(taken, 1);
    let (said, taken) = taking(&rt, 2, say(&unsunk, "after")).await;
    said.unwrap();
    assert_eq!(taken, 1);
    let told = lines.lock().unwrap().clone();
    assert!(told.iter().any(|l| l.contains("said uid-sunk")), "{told:?}");
    assert!(
        told.iter()
            .all(|l| !l.contains("uid-before") && !l.contains("uid-after")),
        "another variant's lines reached this sink: {told:?}"
    );

    // Made ready, then left longer than the call's whole deadline: the
    // call still has all of its own.
    until_ready(&rt, 2).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let started = Instant::now();
    let (hung, taken) = taking(
        &rt,
        2,
        unsunk.create(&attack("hang", "hang", None, &cloud), None),
    )
    .await;
    assert_eq!(taken, 1);
    assert!(
        matches!(hung, Err(Error::DeadlineExceeded { .. })),
        "{hung:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "the call ran {:?}, not its own 500 ms",
        started.elapsed()
    );

    // Unloaded while warm: every ready instance goes with its revision.
    drop((plain, quoted, taped, sunk, unsunk, sim, hostile));
    until_none_ready(&rt).await;
}

/// Wait until no instance is ready (after every revision was unloaded).
async fn until_none_ready(rt: &Runtime) {
    for _ in 0..500 {
        if rt.ready_instances() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{} instances still ready after unloading",
        rt.ready_instances()
    );
}

/// Pure calls (`validate`) run on their caller's thread with every limit
/// a call-thread call has: the deadline, the memory limit, the grants,
/// the outbound gate and the plugin's quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pure_calls_on_the_callers_thread_keep_every_limit() {
    let cloud = cloud().await;
    let rt = runtime(2, 8);
    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    rt.gate_outbound(move || gate.load(Ordering::SeqCst));
    let limits = Limits {
        call_timeout: Duration::from_millis(500),
        memory_bytes: 64 * 1024 * 1024,
        ..Default::default()
    };
    let hostile = load(&rt, &cloud, "hostile_plugin", limits);
    let plain = hostile.provider().unwrap();
    let validate = |p: &ProviderPlugin, attack: &str, target: &str| {
        let config = serde_json::json!({ "attack": attack, "target": target }).to_string();
        let p = p.clone();
        async move { p.validate(&config).await }
    };
    let granted = format!("{}/v1/instances", cloud.url());
    let before = rt.call_profile();

    let looped = validate(&plain, "validate-loop", &granted).await;
    assert!(
        matches!(
            looped,
            Err(Error::DeadlineExceeded {
                call: "validate",
                ..
            })
        ),
        "{looped:?}"
    );
    let bombed = validate(&plain, "validate-memory", &granted).await;
    assert!(
        matches!(
            bombed,
            Err(Error::MemoryLimit {
                call: "validate",
                ..
            })
        ),
        "{bombed:?}"
    );
    let sent = validate(&plain, "validate-request", &granted).await;
    assert!(
        matches!(&sent, Err(Error::Plugin { error: PluginError::Terminal(m), .. }) if m.contains("validate sent: Ok(")),
        "a granted request leaves a pure call too: {sent:?}"
    );
    let denied = validate(&plain, "validate-request", "http://example.invalid/").await;
    assert!(
        matches!(
            denied,
            Err(Error::CapabilityDenied {
                call: "validate",
                ..
            })
        ),
        "{denied:?}"
    );
    open.store(false, Ordering::SeqCst);
    let fenced = validate(&plain, "validate-request", &granted).await;
    open.store(true, Ordering::SeqCst);
    assert!(
        matches!(
            fenced,
            Err(Error::Fenced {
                call: "validate",
                ..
            })
        ),
        "{fenced:?}"
    );
    let quoted = hostile
        .with_quota(Some(Quota::new(QuotaSpec {
            calls_per_minute: Some(1),
            ..Default::default()
        })))
        .provider()
        .unwrap();
    validate(&quoted, "none", &granted)
        .await
        .expect("the first call is within the quota");
    let held = validate(&quoted, "none", &granted).await;
    assert!(
        matches!(
            held,
            Err(Error::QuotaExceeded {
                kind: QuotaKind::CallsPerMinute,
                ..
            })
        ),
        "{held:?}"
    );

    let profile = rt.call_profile().since(&before);
    assert_eq!(
        (profile.calls, profile.inline),
        (6, 6),
        "every admitted validate ran on its caller's thread"
    );
}

/// One step of [`interleaved_calls_each_see_their_own_gate_deadline_quota_and_sink`].
#[derive(Debug, Clone)]
enum Step {
    /// Open or close the host's outbound gate.
    Gate(bool),
    /// `create` through one variant of the sim provider.
    Create(Variant),
    /// The hostile plugin logs a line naming the Machine, through the
    /// variant with a log sink or the one without.
    Say { sunk: bool },
    /// The hostile plugin hangs, after the instance waited `idle_ms`.
    Hang { idle_ms: u64 },
    /// Give the refills a moment, so a later step takes a ready instance.
    Settle,
    /// Unload the sim provider while its instances are ready, load it again.
    Reload,
}

#[derive(Debug, Clone, Copy)]
enum Variant {
    Plain,
    /// One outbound request a minute.
    Quota,
    /// Recorded (a taped call never takes a ready instance).
    Taped,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => any::<bool>().prop_map(Step::Gate),
        6 => prop_oneof![Just(Variant::Plain), Just(Variant::Quota), Just(Variant::Taped)]
            .prop_map(Step::Create),
        3 => any::<bool>().prop_map(|sunk| Step::Say { sunk }),
        1 => prop_oneof![Just(0u64), Just(300)].prop_map(|idle_ms| Step::Hang { idle_ms }),
        2 => Just(Step::Settle),
        1 => Just(Step::Reload),
    ]
}

/// Whether the quota variant has spent its one request this minute: a
/// fenced call may or may not have counted, so after one it is unknown.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Spent {
    No,
    Yes,
    Unknown,
}

/// Random interleavings of plugins, revisions (a reload while instances
/// are ready) and variants of one revision (a request quota, a log sink, a
/// tape), with the outbound gate flipped between one call's release (when
/// the next instance is made) and the next call's take. Every call must see
/// its own gate, deadline, quota and sink, whichever variant's release made
/// the instance it took, and unloading leaves no ready instance behind.
#[test]
fn interleaved_calls_each_see_their_own_gate_deadline_quota_and_sink() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cloud = executor.block_on(cloud());
    let rt = executor.block_on(async { runtime(2, 8) });
    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    rt.gate_outbound(move || gate.load(Ordering::SeqCst));
    let endpoint = serde_json::json!({ "endpoint": cloud.url() });
    let hang_limit = Duration::from_millis(200);
    let hostile = load(
        &rt,
        &cloud,
        "hostile_plugin",
        Limits {
            call_timeout: hang_limit,
            ..Default::default()
        },
    );
    let (log_sink, lines) = sink();
    let sunk = hostile.with_log_sink(Some(log_sink)).provider().unwrap();
    let unsunk = hostile.provider().unwrap();
    let sim = Mutex::new(load(&rt, &cloud, "sim_provider", Limits::default()));
    let counter = std::sync::atomic::AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 16,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(step(), 1..24), |steps| {
        executor.block_on(async {
            open.store(true, Ordering::SeqCst);
            let variants = |sim: &Plugin| {
                let quota = Quota::new(QuotaSpec {
                    requests_per_minute: Some(1),
                    ..Default::default()
                });
                (
                    sim.provider().unwrap(),
                    sim.with_quota(Some(quota)).provider().unwrap(),
                    sim.with_tape(Some(Tape::record())).provider().unwrap(),
                )
            };
            let (mut plain, mut quoted, mut taped) = variants(&sim.lock().unwrap());
            let mut spent = Spent::No;
            let (mut said_sunk, mut said_unsunk) = (Vec::new(), Vec::new());
            for step in steps {
                let name = format!("m{}", counter.fetch_add(1, Ordering::Relaxed));
                let is_open = open.load(Ordering::SeqCst);
                match step {
                    Step::Gate(to) => open.store(to, Ordering::SeqCst),
                    Step::Settle => tokio::time::sleep(Duration::from_millis(20)).await,
                    Step::Reload => {
                        drop((plain, quoted, taped));
                        let reloaded = load(&rt, &cloud, "sim_provider", Limits::default());
                        *sim.lock().unwrap() = reloaded;
                        (plain, quoted, taped) = variants(&sim.lock().unwrap());
                        spent = Spent::No;
                    }
                    Step::Create(variant) => {
                        let p = match variant {
                            Variant::Plain => &plain,
                            Variant::Quota => &quoted,
                            Variant::Taped => &taped,
                        };
                        let out = p.create(&machine(&name, endpoint.clone()), None).await;
                        let fenced = matches!(out, Err(Error::Fenced { .. }));
                        let over = matches!(
                            out,
                            Err(Error::QuotaExceeded {
                                kind: QuotaKind::RequestsPerMinute,
                                ..
                            })
                        );
                        let fits = match (variant, is_open, spent) {
                            (Variant::Quota, true, Spent::No) => out.is_ok(),
                            (Variant::Quota, true, Spent::Yes) => over,
                            (Variant::Quota, true, Spent::Unknown) => out.is_ok() || over,
                            (Variant::Quota, false, Spent::No) => fenced,
                            (Variant::Quota, false, _) => fenced || over,
                            (_, true, _) => out.is_ok(),
                            (_, false, _) => fenced,
                        };
                        if !fits {
                            return Err(TestCaseError::fail(format!(
                                "{variant:?} create {name} with the gate {} (quota spent: {spent:?}): {out:?}",
                                if is_open { "open" } else { "closed" }
                            )));
                        }
                        if let Variant::Quota = variant {
                            spent = match (is_open, spent, out.is_ok()) {
                                (true, _, _) => Spent::Yes,
                                (false, Spent::No, _) => Spent::Unknown,
                                (false, other, _) => other,
                            };
                        }
                    }
                    Step::Say { sunk: to_sink } => {
                        let p = if to_sink { &sunk } else { &unsunk };
                        p.create(&attack(&name, "say", None, &cloud), None)
                            .await
                            .map_err(|e| TestCaseError::fail(format!("say {name}: {e:?}")))?;
                        if to_sink {
                            said_sunk.push(format!("said uid-{name}"));
                        } else {
                            said_unsunk.push(format!("said uid-{name}"));
                        }
                    }
                    Step::Hang { idle_ms } => {
                        tokio::time::sleep(Duration::from_millis(idle_ms)).await;
                        let started = Instant::now();
                        let out = unsunk.create(&attack(&name, "hang", None, &cloud), None).await;
                        let ran = started.elapsed();
                        if !matches!(out, Err(Error::DeadlineExceeded { .. }))
                            || ran < hang_limit.mul_f32(0.9)
                        {
                            return Err(TestCaseError::fail(format!(
                                "hang {name} after {idle_ms} ms idle: {out:?} in {ran:?}, not its own {hang_limit:?}"
                            )));
                        }
                    }
                }
            }
            let told = lines.lock().unwrap().clone();
            for line in &said_sunk {
                if !told.iter().any(|t| t.contains(line.as_str())) {
                    return Err(TestCaseError::fail(format!("{line:?} missed its sink")));
                }
            }
            for line in &said_unsunk {
                if told.iter().any(|t| t.contains(line.as_str())) {
                    return Err(TestCaseError::fail(format!(
                        "{line:?}, said without a sink, reached another variant's sink"
                    )));
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    drop((sunk, unsunk, hostile, sim));
    executor.block_on(until_none_ready(&rt));
}
