//! Plugins in Python and JavaScript, built from source by
//! scripts/build-polyglot-plugins.sh with the pinned toolchains
//! (componentize-py, componentize-js) and annotated with `capstan plugin
//! annotate`: the annotate round trip and its refusals, conformance, the
//! same limits as a Rust plugin for a hostile Python plugin, 100 Python
//! calls queueing for 8 slots, and on a real control plane the signed
//! Python provider bringing a MachineDeployment to Ready and the signed
//! JavaScript addon applying and judged healthy.

use crate::sandbox::{TOKEN, cloud, grants_for, machine};
use capstan_api::machine_conditions::INSTANCE_PROVISIONED;
use capstan_api::{Addon, AddonSpec, Machine, MachineDeployment, Plugin, PluginGrants, PluginSpec};
use capstan_controllers::{Options, Providers};
use capstan_e2e::cli::{capstan, fails, key_pair, ok};
use capstan_e2e::env::{Env, eventually, sample_deployment, sim_plugin_spec};
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::{Faults, SimCloud};
use capstan_runtime::types::PluginError;
use capstan_runtime::{Error, Limits, OutputKind, Runtime, RuntimeConfig};
use kube::api::{Api, PostParams};
use std::path::PathBuf;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(120);

/// A component built by scripts/build-polyglot-plugins.sh.
fn built(stem: &str) -> PathBuf {
    let path = capstan_e2e::plugin_dir().join(format!("{stem}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/build-polyglot-plugins.sh (the README's test command does)",
        path.display()
    );
    path
}

fn manifest_count(path: &std::path::Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    capstan_manifest::custom_sections(&bytes, capstan_manifest::CUSTOM_SECTION)
        .unwrap()
        .len()
}

fn inspect_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&ok(&[
        "plugin",
        "inspect",
        path.to_str().unwrap(),
        "-o",
        "json",
    ]))
    .unwrap()
}

#[test]
fn annotate_embeds_replaces_and_refuses_a_manifest_the_component_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let js = built("node_exporter_js");
    let rust = capstan_e2e::plugin("sim_provider");
    let write = |name: &str, json: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, json).unwrap();
        path.to_str().unwrap().to_string()
    };
    let renamed = write(
        "renamed.json",
        r#"{"name":"renamed-js","version":"0.3.0","world":"addon","contract":"0.3.0","capabilities":{"objects":["Namespace"]}}"#,
    );
    let out = dir.path().join("renamed.wasm");
    let report = ok(&[
        "plugin",
        "annotate",
        js.to_str().unwrap(),
        "-m",
        &renamed,
        "-o",
        out.to_str().unwrap(),
    ]);
    // What the sandbox gives each WASI import the JavaScript runtime asks for.
    assert!(
        report.contains("wasi:filesystem/preopens") && report.contains("nothing preopened"),
        "{report}"
    );
    assert!(report.contains("Per call:   4 core instances"), "{report}");
    let seen = inspect_json(&out);
    assert_eq!(seen["manifest"]["name"], "renamed-js");
    assert_eq!(seen["manifest"]["version"], "0.3.0");
    assert_eq!(
        manifest_count(&out),
        1,
        "the old manifest is replaced, not added to"
    );

    // Annotating again with the same manifest changes nothing; a Rust
    // component (its manifest inside a nested core module) is re-annotated too.
    let again = dir.path().join("again.wasm");
    ok(&[
        "plugin",
        "annotate",
        out.to_str().unwrap(),
        "-m",
        &renamed,
        "-o",
        again.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    let rust_manifest = write(
        "rust.json",
        r#"{"name":"sim-provider","version":"9.9.9","world":"provider","contract":"0.3.0","capabilities":{"http":[{"destination":"http://127.0.0.1:*","credential":"sim-cloud"}]}}"#,
    );
    let rust_out = dir.path().join("rust.wasm");
    // It calls capstan:plugin/http (0.3.0): a manifest naming an older
    // contract would let an older host try it and fail to link.
    let older = write(
        "older.json",
        r#"{"name":"sim-provider","version":"9.9.9","world":"provider","contract":"0.2.0"}"#,
    );
    let err = fails(&[
        "plugin",
        "annotate",
        rust.to_str().unwrap(),
        "-m",
        &older,
        "-o",
        rust_out.to_str().unwrap(),
    ]);
    assert!(
        err.contains("imports capstan:plugin/http@0.3.0, new in contract 0.3.0")
            && err.contains("manifest says contract 0.2.0"),
        "{err}"
    );
    ok(&[
        "plugin",
        "annotate",
        rust.to_str().unwrap(),
        "-m",
        &rust_manifest,
        "-o",
        rust_out.to_str().unwrap(),
    ]);
    assert_eq!(manifest_count(&rust_out), 1);
    assert_eq!(inspect_json(&rust_out)["manifest"]["version"], "9.9.9");

    // A manifest for another world: the component does not export it.
    let provider = write(
        "provider.json",
        r#"{"name":"js","version":"0.1.0","world":"provider","contract":"0.3.0"}"#,
    );
    let refused = dir.path().join("refused.wasm");
    let err = fails(&[
        "plugin",
        "annotate",
        js.to_str().unwrap(),
        "-m",
        &provider,
        "-o",
        refused.to_str().unwrap(),
    ]);
    assert!(
        err.contains("does not export capstan:plugin/provider@0.2.0")
            && err.contains("capstan:plugin/addon@0.2.0"),
        "{err}"
    );
    assert!(!refused.exists(), "nothing is written after a refusal");
    let bad = write(
        "bad.json",
        r#"{"name":"Bad Name","version":"0.1.0","world":"addon","contract":"0.3.0"}"#,
    );
    let err = fails(&[
        "plugin",
        "annotate",
        js.to_str().unwrap(),
        "-m",
        &bad,
        "-o",
        refused.to_str().unwrap(),
    ]);
    assert!(err.contains("manifest field `name`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_and_javascript_providers_updaters_and_addons_pass_conformance() {
    // The providers send their requests through wasi:http: Python's SDK
    // over the bindings, JavaScript's through `fetch`.
    for stem in ["sim_provider_py", "sim_provider_js"] {
        let cloud = cloud().await;
        let report = provider_conformance(built(stem), &cloud).await;
        assert!(
            report.contains("PASS  create is idempotent"),
            "{stem}: {report}"
        );
        // Their POSTs reached the cloud whole (the create body names the machine).
        assert!(cloud.stats().instances_launched >= 1, "{stem}");
    }

    // The updaters change the version of an instance the Rust provider made.
    for stem in ["sim_updater_py", "sim_updater_js"] {
        let cloud = cloud().await;
        let report = updater_conformance(built(stem), &cloud).await;
        assert!(
            report.contains("PASS  update reaches done with monotonic progress")
                && report.contains("0 failed"),
            "{stem}: {report}"
        );
        assert!(cloud.stats().updates_started >= 1, "{stem}: {report}");
    }

    for stem in ["node_exporter_js", "node_exporter_py"] {
        let addon = built(stem);
        let report = addon_conformance(&addon);
        assert!(report.contains("14 passed"), "{stem}: {report}");
    }
    let out = capstan(&[
        "plugin",
        "conformance",
        built("node_exporter_py").to_str().unwrap(),
        "--world",
        "addon",
        "-o",
        "json",
    ]);
    assert!(out.status.success());
}

/// A runtime with 8 call slots.
fn eight_slots() -> Runtime {
    Runtime::new(RuntimeConfig {
        max_concurrent_calls: 8,
        ..Default::default()
    })
    .unwrap()
}

/// `capstan plugin conformance --world addon PATH`, which must pass.
fn addon_conformance(path: &std::path::Path) -> String {
    let report = ok(&[
        "plugin",
        "conformance",
        "--world",
        "addon",
        path.to_str().unwrap(),
    ]);
    assert!(report.contains("0 failed"), "{report}");
    report
}

/// `capstan plugin conformance PATH` for a sim provider against `cloud`,
/// the token from the environment, as a user runs it; the report.
async fn provider_conformance(path: PathBuf, cloud: &SimCloud) -> String {
    conformance(path, cloud, &[]).await
}

/// `capstan plugin conformance --world updater PATH` against `cloud`,
/// changing the version of an instance the Rust sim provider makes.
async fn updater_conformance(path: PathBuf, cloud: &SimCloud) -> String {
    let provider = built("sim_provider");
    conformance(
        path,
        cloud,
        &[
            "--world",
            "updater",
            "--provider",
            provider.to_str().unwrap(),
        ],
    )
    .await
}

/// `capstan plugin conformance PATH ARGS…` against `cloud`, as
/// [`provider_conformance`]; it must pass.
async fn conformance(path: PathBuf, cloud: &SimCloud, args: &[&str]) -> String {
    let config = serde_json::json!({ "endpoint": cloud.url() }).to_string();
    let host = cloud.addr().to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(capstan_e2e::env::capstan_bin().unwrap())
            .args([
                "plugin",
                "conformance",
                path.to_str().unwrap(),
                "--config",
                &config,
            ])
            .args(&args)
            .args([
                "--allow-host",
                &host,
                "--bearer-from-env",
                "sim-cloud=POLYGLOT_TOKEN",
            ])
            .env("POLYGLOT_TOKEN", TOKEN)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        report
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_hostile_python_plugin_is_held_by_the_same_limits_as_a_rust_one() {
    let cloud = cloud().await;
    let rt = eight_slots();
    let limits = Limits {
        call_timeout: Duration::from_millis(1500),
        memory_bytes: 48 * 1024 * 1024,
        ..Default::default()
    };
    let hostile = rt
        .load_file(&built("hostile_py"), limits, grants_for(&cloud))
        .unwrap()
        .provider()
        .unwrap();
    let attack = |name: &str, attack: &str| {
        machine(
            name,
            serde_json::json!({ "attack": attack, "target": cloud.addr().to_string() }),
        )
    };

    let err = hostile
        .create(&attack("loop", "infinite-loop"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
    let err = hostile
        .create(&attack("bomb", "memory-bomb"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::MemoryLimit { limit_bytes, .. } if limit_bytes == 48 * 1024 * 1024),
        "{err}"
    );
    let err = hostile
        .create(&attack("flood", "stdout-flood"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                kind: OutputKind::Stdout,
                ..
            }
        ),
        "{err}"
    );
    // The exception's own words, not the runtime's `unreachable`.
    let err = hostile
        .create(&attack("oops", "exception"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Trap { .. }) && err.is_fault(), "{err}");
    assert!(
        err.to_string()
            .contains("raised ValueError: hostile-py could not create oops: on purpose"),
        "{err}"
    );
    let err = hostile
        .create(&attack("escape", "escape"), None)
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::Terminal(m)) => {
            assert!(m.contains("open: denied"), "{m}");
            assert!(m.contains("listdir: denied"), "{m}");
            assert!(m.contains("env: 0 variables"), "{m}");
            assert!(m.contains("net: denied"), "{m}");
        }
        _ => panic!("expected the plugin's report, got {err}"),
    }
    assert_eq!(cloud.stats().requests, 0, "no attack reached the cloud");

    // Built for the frozen 0.2.0 world (its manifest says 0.2.0), it
    // imports no capstan:plugin/http, and the SDK's `send` goes through
    // wasi:http, under the same grants.
    let imports = inspect_json(&built("hostile_py"))["imports"].clone();
    let names: Vec<&str> = imports
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.as_str())
        .collect();
    assert!(
        names.contains(&"wasi:http/outgoing-handler@0.2.12")
            && !names.iter().any(|i| i.starts_with("capstan:plugin/http")),
        "{names:?}"
    );
    let request = |name: &str, url: String| {
        machine(name, serde_json::json!({ "attack": "request", "url": url }))
    };
    let err = hostile
        .create(
            &request("echo", format!("{}/debug/echo", cloud.url())),
            None,
        )
        .await
        .unwrap_err();
    match err.plugin_error() {
        Some(PluginError::Terminal(m)) => assert!(m.contains("request outcome: HTTP 200"), "{m}"),
        _ => panic!("expected the plugin's report, got {err}"),
    }
    assert_eq!(cloud.stats().debug_requests, 1);
    let undeclared = format!("http://127.0.0.2:{}/debug/echo", cloud.addr().port());
    let err = hostile
        .create(&request("undeclared", undeclared), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::CapabilityDenied { detail, .. } if detail.contains("not declared")),
        "{err}"
    );

    // The same host still serves a well-behaved Python plugin.
    let sim = rt
        .load_file(
            &built("sim_provider_py"),
            Limits::default(),
            grants_for(&cloud),
        )
        .unwrap()
        .provider()
        .unwrap();
    let status = sim
        .create(
            &machine("after", serde_json::json!({ "endpoint": cloud.url() })),
            None,
        )
        .await
        .unwrap();
    assert!(status.provider_id.starts_with("sim://"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_python_calls_queue_for_eight_slots_and_all_complete() {
    let cloud = cloud().await;
    let rt = eight_slots();
    let loaded = rt
        .load_file(
            &built("sim_provider_py"),
            Limits::default(),
            grants_for(&cloud),
        )
        .unwrap();
    // Measured at load: a Python component instantiates 14 core modules
    // per call, which the pool holds for every slot at once.
    let footprint = loaded.footprint();
    assert!(footprint.core_instances > 4, "{footprint:?}");
    let sim = loaded.provider().unwrap();
    let calls = (0..100).map(|i| {
        let sim = sim.clone();
        let m = machine(
            &format!("m{i}"),
            serde_json::json!({ "endpoint": cloud.url() }),
        );
        tokio::spawn(async move { sim.create(&m, None).await })
    });
    let results = futures::future::join_all(calls).await;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.unwrap().err().map(|e| e.to_string()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(cloud.stats().instances_launched, 100);
}

/// One control plane for both samples: pushed and signed to a registry,
/// pulled and verified by the Plugin controller; the Python provider brings
/// a MachineDeployment of 3 to Ready, the JavaScript addon applies and is
/// judged healthy, and a Python exception's own message reaches the
/// Machine's condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signed_python_and_javascript_plugins_from_a_registry_run_machines_and_an_addon() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    env.add_nodes(2).await.expect("two Nodes");
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let dir = registry.scratch().to_path_buf();
    let (key, public) = key_pair(&dir, "publisher");
    let prefix = format!("oci://{}/polyglot/", registry.host);
    for (stem, repo) in [
        ("sim_provider_py", "sim-provider-py"),
        ("node_exporter_js", "node-exporter-js"),
    ] {
        let reference = format!("{prefix}{repo}:v1");
        ok(&["plugin", "push", built(stem).to_str().unwrap(), &reference]);
        ok(&["plugin", "sign", &reference, "--key", key.to_str().unwrap()]);
    }
    // The cloud's Secret and namespace, and the hostile plugin from a file.
    env.create_plugin("hostile-py", &built("hostile_py"))
        .await
        .unwrap();
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    let mut python = sim_plugin_spec(&format!("{prefix}sim-provider-py:v1"));
    python.verification = Some(capstan_e2e::cli::publisher_verification(&public));
    plugins
        .create(&PostParams::default(), &Plugin::new("sim-py", python))
        .await
        .unwrap();
    let js = PluginSpec {
        source: format!("{prefix}node-exporter-js:v1"),
        verification: Some(capstan_e2e::cli::publisher_verification(&public)),
        grants: PluginGrants {
            objects: vec![
                "Namespace/monitoring".into(),
                "ServiceAccount@monitoring".into(),
                "Service@monitoring".into(),
                "apps/DaemonSet@monitoring".into(),
            ],
            // A node agent: host PID, host network and the host's root mounted.
            pod_security: Some(capstan_api::PodSecurityLevel::Privileged),
            ..Default::default()
        },
        ..Default::default()
    };
    plugins
        .create(&PostParams::default(), &Plugin::new("node-exporter-js", js))
        .await
        .unwrap();
    env.start_controllers(
        Providers::default(),
        Options {
            poll: Duration::from_millis(250),
            resync: Duration::from_secs(5),
            supply: Some(std::sync::Arc::new(crate::oci_plugins::supply(
                &dir.join("oci-cache"),
                capstan_e2e::cli::publisher_policy(&prefix, &public),
            ))),
            ..Options::default()
        },
    )
    .await;

    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(
            &PostParams::default(),
            &sample_deployment("py-pool", "sim-py", &env.cloud.url(), 3, "v1.30.0"),
        )
        .await
        .unwrap();
    let mut addon = Addon::new(
        "metrics",
        serde_json::from_value::<AddonSpec>(
            serde_json::json!({"plugin": "node-exporter-js", "channel": "rapid"}),
        )
        .unwrap(),
    );
    addon.metadata.namespace = Some(NS.into());
    Api::<Addon>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &addon)
        .await
        .unwrap();
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), NS);
    let failing: Machine = serde_json::from_value(serde_json::json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "raises", "namespace": NS },
        "spec": { "provider": { "plugin": "hostile-py", "config": { "attack": "exception" } } },
    }))
    .unwrap();
    machines
        .create(&PostParams::default(), &failing)
        .await
        .unwrap();

    env.wait_rolled_out(NS, "py-pool", LONG).await;
    let ready = env
        .machines(NS)
        .await
        .into_iter()
        .filter(|m| m.spec.provider.plugin == "sim-py")
        .filter(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.provider_id
                    .as_deref()
                    .is_some_and(|id| id.starts_with("sim://"))
                    && s.phase == Some(capstan_api::MachinePhase::Running)
            })
        })
        .count();
    assert_eq!(ready, 3, "3 Machines running through the Python provider");
    // Its `capacity` (the sim cloud's instance type), for the autoscaler.
    let capacity = eventually("the Python provider's capacity", LONG, async || {
        let md = Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
            .get("py-pool")
            .await
            .ok()?;
        let a = md.metadata.annotations?;
        let key = |k: &str| format!("capacity.cluster-autoscaler.kubernetes.io/{k}");
        Some((a.get(&key("cpu"))?.clone(), a.get(&key("memory"))?.clone()))
    })
    .await;
    assert_eq!(capacity, ("4".to_string(), "16384Mi".to_string()));
    let status = eventually("the JavaScript addon healthy at 1.8.2", LONG, async || {
        let a = Api::<Addon>::namespaced(env.client.clone(), NS)
            .get("metrics")
            .await
            .ok()?;
        let s = a.status?;
        (s.healthy == Some(true) && s.version.as_deref() == Some("1.8.2")).then_some(s)
    })
    .await;
    // It records who signed the revision that rendered it.
    assert!(
        status
            .plugin_signer
            .as_deref()
            .is_some_and(|s| s.starts_with("publisher")),
        "{status:?}"
    );
    // Every Node runs it: the two added and those of the Python machines.
    let ready = status
        .health_details
        .iter()
        .find_map(|d| d.strip_prefix("numberReady="))
        .and_then(|n| n.split_once('/'))
        .map(|(a, b)| (a.parse::<u32>().unwrap(), b.parse::<u32>().unwrap()));
    assert!(
        matches!(ready, Some((a, b)) if a == b && a >= 2),
        "{:?}",
        status.health_details
    );
    let message = eventually(
        "the exception in the Machine's condition",
        LONG,
        async || {
            let m = machines.get("raises").await.ok()?;
            let c = capstan_api::condition(&m.status?.conditions, INSTANCE_PROVISIONED)?.clone();
            c.message.contains("raised ValueError").then_some(c.message)
        },
    )
    .await;
    assert!(
        message.contains("hostile-py could not create raises: on purpose"),
        "{message}"
    );
    let p = plugins.get("sim-py").await.unwrap().status.unwrap();
    assert!(p.signers[0].starts_with("publisher"), "{:?}", p.signers);
    env.stop_controllers().await;
}

/// Run a project's script the way its author would; panics with its output.
fn run_in(dir: &std::path::Path, program: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{program} {args:?} in {}:\n{text}",
        dir.display()
    );
    text
}

/// `capstan plugin new` in each language: the project's own tests pass, it
/// builds with its own script, and the component passes conformance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_plugins_in_each_language_test_build_and_pass_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let polyglot = std::env::var_os("CAPSTAN_POLYGLOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/capstan/polyglot")
        });
    let capstan = capstan_e2e::env::capstan_bin().unwrap();
    let env = [
        ("CAPSTAN", capstan.display().to_string()),
        (
            "COMPONENTIZE_PY",
            polyglot
                .join("python/bin/componentize-py")
                .display()
                .to_string(),
        ),
    ];
    let new = |lang: &str, world: &str, name: &str| {
        let at = root.join(name);
        ok(&[
            "plugin",
            "new",
            "--lang",
            lang,
            "--world",
            world,
            name,
            "--dir",
            at.to_str().unwrap(),
        ]);
        at
    };

    // Python provider: its tests, its build, conformance against the cloud.
    let python = new("python", "provider", "my-cloud");
    let blocking = |f: Box<dyn FnOnce() + Send>| tokio::task::spawn_blocking(f);
    {
        let (python, env) = (python.clone(), env.clone());
        blocking(Box::new(move || {
            run_in(&python, "./test.sh", &[], &env);
            run_in(&python, "./build.sh", &[], &env);
        }))
        .await
        .unwrap();
    }
    let report = provider_conformance(python.join("my_cloud.wasm"), &cloud().await).await;
    assert!(
        report.contains("Conformance of plugin my-cloud 0.1.0"),
        "{report}"
    );

    // JavaScript addon: npm install, npm test, its build, conformance.
    let js = new("js", "addon", "my-addon-js");
    {
        let (js, env) = (js.clone(), env.clone());
        blocking(Box::new(move || {
            run_in(
                &js,
                "npm",
                &["install", "--silent", "--no-audit", "--no-fund"],
                &env,
            );
            let tests = run_in(&js, "npm", &["test", "--silent"], &env);
            assert!(tests.contains("# fail 0"), "{tests}");
            run_in(&js, "./build.sh", &[], &env);
        }))
        .await
        .unwrap();
    }
    addon_conformance(&js.join("my_addon_js.wasm"));

    // Rust addon: cargo builds it for wasm32-wasip2 (the plugins' target
    // directory, so the SDK's dependencies are built already).
    let rust = new("rust", "addon", "my-addon-rs");
    let target = capstan_e2e::workspace_root().join("target/scaffold-plugins");
    {
        let (rust, target) = (rust.clone(), target.clone());
        blocking(Box::new(move || {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            run_in(
                &rust,
                &cargo,
                &[
                    "build",
                    "--release",
                    "--target",
                    "wasm32-wasip2",
                    "--target-dir",
                    target.to_str().unwrap(),
                ],
                &[],
            );
        }))
        .await
        .unwrap();
    }
    let rust_addon = target.join("wasm32-wasip2/release/my_addon_rs.wasm");
    let report = addon_conformance(&rust_addon);
    assert!(
        report.contains("Conformance of plugin my-addon-rs"),
        "{report}"
    );

    // Python updater: its tests run against the updater world's bindings;
    // built, it changes the version of an instance the Rust provider made.
    let updater = new("python", "updater", "my-updater");
    {
        let (updater, env) = (updater.clone(), env.clone());
        blocking(Box::new(move || {
            run_in(&updater, "./test.sh", &[], &env);
            run_in(&updater, "./build.sh", &[], &env);
        }))
        .await
        .unwrap();
    }
    let report = updater_conformance(updater.join("my_updater.wasm"), &cloud().await).await;
    assert!(
        report.contains("Conformance of plugin my-updater 0.1.0") && report.contains("0 failed"),
        "{report}"
    );

    // Refusal: an existing directory.
    let err = fails(&[
        "plugin",
        "new",
        "--lang",
        "rust",
        "--world",
        "addon",
        "y",
        "--dir",
        rust.to_str().unwrap(),
    ]);
    assert!(err.contains("already exists"), "{err}");
}

/// The Python and JavaScript SDKs send through `capstan:plugin/http` (the
/// plugins are built for contract 0.3.0's worlds) and pass the host's
/// error kind on: a granted destination where nothing listens comes back
/// as the host's `connection-refused`, a transient error naming it.
#[tokio::test]
async fn python_and_javascript_plugins_send_through_capstan_http_and_read_its_errors() {
    let cloud = cloud().await;
    let rt = eight_slots();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("http://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    for (stem, kind) in [
        ("sim_provider_py", "ConnectionRefused"),
        ("sim_provider_js", "connection-refused"),
    ] {
        let path = built(stem);
        let imports = inspect_json(&path)["imports"].clone();
        assert!(
            imports
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i == "capstan:plugin/http@0.3.0"),
            "{stem} imports {imports}"
        );
        let mut grants = grants_for(&cloud);
        grants.http.push(nobody.parse().unwrap());
        let provider = rt
            .load_file(&path, Limits::default(), grants)
            .unwrap()
            .provider()
            .unwrap();
        let launched = cloud.stats().instances_launched;
        provider
            .create(
                &machine(stem, serde_json::json!({ "endpoint": cloud.url() })),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert_eq!(cloud.stats().instances_launched, launched + 1, "{stem}");
        let err = provider
            .create(
                &machine(
                    &format!("{stem}-nobody"),
                    serde_json::json!({ "endpoint": nobody }),
                ),
                None,
            )
            .await
            .unwrap_err();
        match err.plugin_error() {
            Some(PluginError::Transient(t)) => {
                assert!(t.message.contains(kind), "{stem}: {}", t.message)
            }
            _ => panic!("{stem}: expected a transient error naming {kind}, got {err}"),
        }
    }
}
