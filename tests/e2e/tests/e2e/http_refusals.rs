//! One table of outbound-request refusals, run through both ways a plugin
//! sends: `wasi:http` (a dozen host calls per request) and
//! `capstan:plugin/http` (contract 0.3.0, one host call). The hostile
//! plugin sends the same request through either (`transport`); each row
//! says what the host must decide and how many requests may reach the
//! cloud, and both transports must come to the same verdict, word for
//! word where the host words it.

use crate::sandbox::{TOKEN, cloud, grants_for, machine};
use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::SimCloud;
use capstan_runtime::limits::RequestLimit;
use capstan_runtime::{Credential, Error, Grants, Limits, Quota, QuotaKind, QuotaSpec, Runtime};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a row sets up besides the request.
#[derive(Clone, Copy, Default)]
struct Setup {
    /// The credential slot is a SigV4 key (the host signs the body).
    sigv4: bool,
    /// The replica's outbound gate is closed.
    fenced: bool,
    /// The Plugin's requests per minute.
    quota: Option<u32>,
    /// The call's request budget.
    per_call: Option<u32>,
}

/// One refusal (or, for the first row, none).
struct Row {
    what: &'static str,
    setup: Setup,
    /// The hostile plugin's config, given the granted cloud's URL and the
    /// declared-but-ungranted one's.
    config: fn(&str, &str) -> serde_json::Value,
    /// The call's error, checked.
    expect: fn(&Error) -> Result<(), String>,
    /// Requests that reach the granted cloud.
    reached: u64,
}

fn denied(needle: &'static str) -> impl Fn(&Error) -> Result<(), String> {
    move |err| match err {
        Error::CapabilityDenied { detail, .. } if detail.contains(needle) => Ok(()),
        other => Err(format!(
            "expected capability denied naming {needle:?}, got {other}"
        )),
    }
}

fn plugin_failed(needle: &'static str) -> impl Fn(&Error) -> Result<(), String> {
    move |err| match err.plugin_error() {
        Some(e) if format!("{e:?}").contains(needle) => Ok(()),
        _ => Err(format!(
            "expected the plugin's own error with {needle:?}, got {err}"
        )),
    }
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "a granted request goes, with its credential",
            setup: Setup::default(),
            config: |granted, _| serde_json::json!({"attack": "send", "target": format!("{granted}/debug/echo")}),
            expect: |err| plugin_failed("send outcome: Ok(200)")(err),
            reached: 1,
        },
        Row {
            what: "a destination the manifest does not declare",
            setup: Setup::default(),
            config: |granted, _| {
                let port = granted.rsplit(':').next().unwrap_or_default();
                serde_json::json!({"attack": "send", "target": format!("http://127.0.0.2:{port}/debug/echo")})
            },
            expect: |err| denied("not declared")(err),
            reached: 0,
        },
        Row {
            what: "a destination declared but not granted",
            setup: Setup::default(),
            config: |_, elsewhere| serde_json::json!({"attack": "send", "target": format!("{elsewhere}/debug/echo")}),
            expect: |err| denied("not granted")(err),
            reached: 0,
        },
        Row {
            what: "a credential with a method its grant does not allow (TRACE)",
            setup: Setup::default(),
            config: |granted, _| serde_json::json!({"attack": "trace", "target": format!("{granted}/debug/echo")}),
            expect: |err| denied("never carry credential slot")(err),
            reached: 0,
        },
        Row {
            what: "headers over the 16 KiB a header map may hold",
            setup: Setup::default(),
            config: |granted, _| serde_json::json!({"attack": "send", "target": format!("{granted}/debug/echo"), "headerBytes": 20_000}),
            expect: |err| match err {
                Error::Trap { message, .. }
                    if message.ends_with("total size of fields exceeds limit") =>
                {
                    Ok(())
                }
                other => Err(format!("expected the header map's limit, got {other}")),
            },
            reached: 0,
        },
        Row {
            what: "a forged Host header",
            setup: Setup::default(),
            config: |granted, _| serde_json::json!({"attack": "host-header", "target": format!("{granted}/debug/echo")}),
            expect: |err| plugin_failed("forged host outcome: Err(")(err),
            reached: 0,
        },
        Row {
            what: "a body over the 1 MiB the host signs",
            setup: Setup {
                sigv4: true,
                ..Setup::default()
            },
            config: |granted, _| serde_json::json!({"attack": "send", "method": "POST", "target": format!("{granted}/debug/echo"), "bodyBytes": 1_536 * 1024}),
            expect: |err| denied("sign")(err),
            reached: 0,
        },
        Row {
            what: "the replica may not act now (the gate is closed)",
            setup: Setup {
                fenced: true,
                ..Setup::default()
            },
            config: |granted, _| serde_json::json!({"attack": "send", "target": format!("{granted}/debug/echo")}),
            expect: |err| match err {
                Error::Fenced { call: "create", .. } => Ok(()),
                other => Err(format!("expected fenced, got {other}")),
            },
            reached: 0,
        },
        Row {
            what: "the Plugin's requests per minute are spent",
            setup: Setup {
                quota: Some(6),
                ..Setup::default()
            },
            config: |granted, _| serde_json::json!({"attack": "request-serial", "target": format!("{granted}/debug/echo")}),
            expect: |err| match err {
                Error::QuotaExceeded {
                    kind: QuotaKind::RequestsPerMinute,
                    size: 6,
                    ..
                } => Ok(()),
                other => Err(format!("expected the request quota, got {other}")),
            },
            reached: 1,
        },
        Row {
            what: "the call's request budget is spent",
            setup: Setup {
                per_call: Some(5),
                ..Setup::default()
            },
            config: |granted, _| serde_json::json!({"attack": "request-serial", "target": format!("{granted}/debug/echo")}),
            expect: |err| match err {
                Error::RequestLimit {
                    limit: RequestLimit::PerCall,
                    size: 5,
                    ..
                } => Ok(()),
                other => Err(format!("expected the per-call budget, got {other}")),
            },
            reached: 5,
        },
    ]
}

/// The part of a call's error both transports must agree on: the host's
/// own words, or for the plugin's errors and quotas (whose wait depends
/// on the clock) their kind.
fn verdict(err: &Error) -> String {
    match err {
        Error::QuotaExceeded { kind, size, .. } => format!("quota {kind} {size}"),
        Error::Plugin { .. } => "the plugin's own error".into(),
        // The backtrace names the guest's own frames; the reason is last.
        Error::Trap { message, .. } => {
            format!("trap: {}", message.rsplit(": ").next().unwrap_or(message))
        }
        other => other.to_string(),
    }
}

fn grants(cloud: &SimCloud, sigv4: bool) -> Grants {
    let mut grants = grants_for(cloud);
    if sigv4 {
        grants.credentials.insert(
            "sim-cloud".into(),
            Credential::AwsSigV4 {
                credentials: capstan_runtime::AwsCredentials {
                    access_key_id: "AKIDCAPSTANTEST".into(),
                    secret_access_key: TOKEN.into(),
                    session_token: None,
                },
                scope: capstan_runtime::AwsScope {
                    region: "us-east-1".into(),
                    service: "ec2".into(),
                },
            },
        );
    }
    grants
}

fn reached(cloud: &SimCloud) -> u64 {
    let stats = cloud.stats();
    stats.requests + stats.debug_requests
}

#[tokio::test]
async fn wasi_http_and_capstan_http_refuse_alike_by_one_table() {
    let granted = cloud().await;
    let elsewhere = cloud().await; // declared (127.0.0.1:*) but not granted
    let rt = Runtime::new(capstan_runtime::RuntimeConfig {
        max_concurrent_calls: 8,
        ..Default::default()
    })
    .unwrap();
    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    assert!(rt.gate_outbound(move || gate.load(Ordering::SeqCst)));
    let mut failures = Vec::new();
    for row in rows() {
        let mut verdicts = Vec::new();
        for transport in ["wasi", "capstan"] {
            let limits = Limits {
                max_requests_per_call: row.setup.per_call.unwrap_or(100),
                ..Limits::default()
            };
            let quota = row.setup.quota.map(|n| {
                Quota::new(QuotaSpec {
                    requests_per_minute: Some(n),
                    ..Default::default()
                })
            });
            let hostile = rt
                .load_file(
                    &plugin("hostile_plugin"),
                    limits,
                    grants(&granted, row.setup.sigv4),
                )
                .unwrap()
                .with_quota(quota)
                .provider()
                .unwrap();
            let mut config = (row.config)(&granted.url(), &elsewhere.url());
            config["transport"] = transport.into();
            let before = (reached(&granted), reached(&elsewhere));
            open.store(!row.setup.fenced, Ordering::SeqCst);
            let outcome = hostile.create(&machine("refused", config), None).await;
            open.store(true, Ordering::SeqCst);
            let after = (reached(&granted), reached(&elsewhere));
            let label = format!("{} ({transport})", row.what);
            let err = match outcome {
                Ok(status) => {
                    failures.push(format!("{label}: the call succeeded: {status:?}"));
                    continue;
                }
                Err(err) => err,
            };
            if let Err(why) = (row.expect)(&err) {
                failures.push(format!("{label}: {why}"));
            }
            if after.0 - before.0 != row.reached || after.1 != before.1 {
                failures.push(format!(
                    "{label}: {} requests reached the granted cloud (expected {}), {} the ungranted one",
                    after.0 - before.0,
                    row.reached,
                    after.1 - before.1
                ));
            }
            verdicts.push(verdict(&err));
        }
        if let [wasi, capstan] = &verdicts[..]
            && wasi != capstan
        {
            failures.push(format!(
                "{}: the transports disagree:\n  wasi:    {wasi}\n  capstan: {capstan}",
                row.what
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What only `capstan:plugin/http` must bound, as it carries whole bodies
/// in one crossing: an answer over 8 MiB is `too-large` (the host reads no
/// further), and a request body over the call's host-call data limit ends
/// the call before the host copies it (nothing is sent).
#[tokio::test]
async fn capstan_http_bounds_the_whole_bodies_it_carries() {
    let cloud = cloud().await;
    let rt = Runtime::new(capstan_runtime::RuntimeConfig {
        max_concurrent_calls: 4,
        ..Default::default()
    })
    .unwrap();
    let hostile = rt
        .load_file(
            &plugin("hostile_plugin"),
            Limits::default(),
            grants_for(&cloud),
        )
        .unwrap()
        .provider()
        .unwrap();
    let send = |method: &str, target: String, body_bytes: usize| {
        machine(
            "bodies",
            serde_json::json!({
                "attack": "send", "transport": "capstan", "method": method,
                "target": target, "bodyBytes": body_bytes,
            }),
        )
    };
    let get = |n: usize| send("GET", format!("{}/debug/bytes?n={n}", cloud.url()), 0);
    let outcome = |err: Error| match err.plugin_error() {
        Some(e) => format!("{e:?}"),
        None => panic!("expected the plugin's report, got {err}"),
    };
    let err = hostile.create(&get(8 << 20), None).await.unwrap_err();
    assert!(outcome(err).contains("send outcome: Ok(200)"));
    let err = hostile.create(&get((8 << 20) + 1), None).await.unwrap_err();
    assert!(outcome(err).contains("send outcome: Err(Error::TooLarge)"));

    let before = reached(&cloud);
    let err = hostile
        .create(
            &send("POST", format!("{}/debug/echo", cloud.url()), 6 << 20),
            None,
        )
        .await
        .unwrap_err();
    match &err {
        Error::OutputLimit {
            kind: capstan_runtime::OutputKind::HostCall,
            limit_bytes,
            ..
        } => assert_eq!(*limit_bytes, Limits::default().hostcall_bytes()),
        other => panic!("expected the host-call data limit, got {other}"),
    }
    assert_eq!(reached(&cloud), before, "nothing was sent");
}

/// A component that calls `capstan:plugin/http` under a manifest naming an
/// older contract is refused at load, naming both: an older host would
/// accept the manifest and then fail to link.
#[test]
fn a_component_calling_capstan_http_must_say_contract_0_3_0() {
    let bytes = std::fs::read(plugin("sim_provider")).unwrap();
    let (said, older) = (b"\"contract\": \"0.3.0\"", b"\"contract\": \"0.2.0\"");
    // Every copy of the manifest (its custom section, and the SDK's copy
    // in the data segment), same length, so the component stays valid.
    let mut relabelled = bytes.clone();
    let mut copies = 0;
    while let Some(at) = relabelled.windows(said.len()).position(|w| w == said) {
        relabelled[at..at + said.len()].copy_from_slice(older);
        copies += 1;
    }
    assert!(copies > 0, "the embedded manifest names contract 0.3.0");
    let rt = Runtime::new(capstan_runtime::RuntimeConfig::default()).unwrap();
    let err = rt
        .load(
            "relabelled",
            &relabelled,
            Limits::default(),
            Grants::default(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::Load { reason, .. }
            if reason.contains("imports capstan:plugin/http@0.3.0, new in contract 0.3.0")
                && reason.contains("manifest says contract 0.2.0")),
        "{err}"
    );
    rt.load("as built", &bytes, Limits::default(), Grants::default())
        .expect("the same component under its own manifest loads");
}
