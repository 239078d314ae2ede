//! The `capstan` binary as a user runs it: inspect, conformance (passing and
//! failing), crds, a closed output pipe, and clear errors.

use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::{Faults, SimCloud, SimCloudConfig};
use sha2::{Digest, Sha256};
use std::process::{Command, Output};

fn capstan(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_capstan"));
    cmd.args(args)
        .env("SIM_TOKEN", "cli-test-token")
        .env("RUST_LOG", "error");
    cmd
}

async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("capstan runs"))
        .await
        .unwrap()
}

/// Run `capstan ARGS`, expect exit `code`, and return its stderr.
fn fails_with(args: &[&str], code: i32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(code), "capstan {args:?}");
    text(&out.stderr)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn cloud(faults: Faults) -> SimCloud {
    SimCloud::start(SimCloudConfig {
        token: Some("cli-test-token".into()),
        faults,
        seed: 7,
        ..Default::default()
    })
    .await
    .unwrap()
}

fn conformance_args<'a>(path: &'a str, config: &'a str, host: &'a str) -> Vec<&'a str> {
    let mut args = vec!["plugin", "conformance", path, "--world", "provider"];
    args.extend(against_sim_cloud(config, host));
    args
}

/// Conformance's flags for a sample plugin against the test's sim cloud:
/// `config`, the cloud's `host` allowed, its token from `SIM_TOKEN`.
fn against_sim_cloud<'a>(config: &'a str, host: &'a str) -> [&'a str; 8] {
    [
        "--config",
        config,
        "--allow-host",
        host,
        "--bearer-from-env",
        "sim-cloud=SIM_TOKEN",
        "--timeout",
        "60s",
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_passes_for_sim_provider_even_with_cloud_faults() {
    let cloud = cloud(Faults {
        boot_latency_ms: 200,
        delete_latency_ms: 100,
        error_rate: 0.2,
        ..Default::default()
    })
    .await;
    let path = plugin("sim_provider").display().to_string();
    let config = format!(r#"{{"endpoint":"{}"}}"#, cloud.url());
    let host = cloud.addr().to_string();
    // The sim cloud's admin API says what the instance was launched with.
    let probe = format!(
        "curl -sf {}/admin/instances/$CAPSTAN_INSTANCE_ID/user-data | python3 -c 'import json, sys; print(json.load(sys.stdin)[\"value\"])'",
        cloud.url()
    );
    let mut args = conformance_args(&path, &config, &host);
    args.extend(["--user-data-command", &probe]);
    let out = run(capstan(&args)).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for check in [
        "PASS  create is idempotent for the same machine uid",
        "PASS  the instance got the bootstrap data create passed",
        "PASS  find-instance finds the instance tagged for the machine under a new uid",
        "PASS  find-instance by provider ID finds it, and get acts on it for the new uid",
        "PASS  find-instance finds nothing for another machine's name",
        "PASS  find-instance skips a deleted instance",
    ] {
        assert!(stdout.contains(check), "{stdout}");
    }
    assert!(stdout.contains("0 failed"), "{stdout}");
    assert_eq!(
        cloud.stats().live_instances,
        0,
        "conformance cleans up after itself"
    );
    // Data other than what create passed fails the check, naming sizes.
    let mut args = conformance_args(&path, &config, &host);
    args.extend(["--user-data-command", "echo '#cloud-config'"]);
    let out = run(capstan(&args)).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  the instance got the bootstrap data create passed")
            && stdout.contains("the instance's user data (14 bytes) is not the"),
        "{stdout}"
    );
    assert_eq!(cloud.stats().live_instances, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_fails_precisely_for_a_non_idempotent_provider() {
    let cloud = cloud(Faults::default()).await;
    let path = plugin("hostile_plugin").display().to_string();
    let config = format!(
        r#"{{"attack":"non-idempotent","endpoint":"{}"}}"#,
        cloud.url()
    );
    let host = cloud.addr().to_string();
    let mut args = conformance_args(&path, &config, &host);
    args.extend(["--output", "json"]);
    let out = run(capstan(&args)).await;
    assert_eq!(out.status.code(), Some(1), "a failing check exits 1");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let failed: Vec<&serde_json::Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["result"] == "fail")
        .collect();
    let idempotency = failed
        .iter()
        .find(|c| c["name"] == "create is idempotent for the same machine uid")
        .expect("the idempotency check fails");
    let detail = idempotency["detail"].as_str().unwrap();
    let uid = report["machine_uid"].as_str().unwrap();
    assert!(detail.contains("create is not idempotent"), "{detail}");
    assert!(detail.contains(uid), "names the machine uid: {detail}");
    assert!(
        detail.contains("sim://i-000001") && detail.contains("sim://i-000002"),
        "names both provider IDs: {detail}"
    );
    // It cannot look its instances up either: a restore would duplicate them.
    let lookup = failed
        .iter()
        .find(|c| {
            c["name"] == "find-instance finds the instance tagged for the machine under a new uid"
        })
        .expect("the lookup check fails");
    assert!(
        lookup["detail"]
            .as_str()
            .unwrap()
            .contains("a Machine restored under a new uid would launch a second instance"),
        "{lookup}"
    );
    assert_eq!(
        cloud.stats().live_instances,
        0,
        "the duplicate instance was cleaned up too"
    );
}

fn updater_args<'a>(
    path: &'a str,
    provider: &'a str,
    config: &'a str,
    host: &'a str,
) -> Vec<&'a str> {
    let mut args = vec!["plugin", "conformance", path, "--world", "updater"];
    args.extend(["--provider", provider]);
    args.extend(against_sim_cloud(config, host));
    args
}

#[tokio::test(flavor = "multi_thread")]
async fn updater_conformance_passes_for_both_sample_updaters() {
    let cloud = cloud(Faults {
        boot_latency_ms: 100,
        update_latency_ms: 500,
        ..Default::default()
    })
    .await;
    let provider = plugin("sim_provider").display().to_string();
    let config = format!(r#"{{"endpoint":"{}","tags":{{"team":"a"}}}}"#, cloud.url());
    let desired = format!(r#"{{"endpoint":"{}","tags":{{"team":"b"}}}}"#, cloud.url());
    let host = cloud.addr().to_string();
    for (stem, extra) in [
        ("sim_updater", vec![]),
        (
            "sim_tagger",
            vec![
                "--desired-config",
                desired.as_str(),
                "--desired-version",
                "v1.30.0",
            ],
        ),
    ] {
        let path = plugin(stem).display().to_string();
        let mut args = updater_args(&path, &provider, &config, &host);
        args.extend(extra);
        let out = run(capstan(&args)).await;
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{stem}: {stdout}\n{}",
            text(&out.stderr)
        );
        for check in [
            "PASS  can-update claims only changed fields it declares",
            "PASS  update reaches done with monotonic progress",
            "PASS  done is stable when called again",
            "PASS  update of a machine without an instance is a typed error",
        ] {
            assert!(stdout.contains(check), "{stem}: {stdout}");
        }
        assert!(stdout.contains("0 failed"), "{stem}: {stdout}");
    }
    assert_eq!(cloud.stats().live_instances, 0, "conformance cleans up");
    assert_eq!(cloud.stats().tag_writes, 1, "sim-tagger wrote the tag once");
}

#[tokio::test(flavor = "multi_thread")]
async fn updater_conformance_fails_precisely_for_a_broken_updater() {
    let cloud = cloud(Faults {
        boot_latency_ms: 100,
        update_latency_ms: 1_500,
        ..Default::default()
    })
    .await;
    let provider = plugin("sim_provider").display().to_string();
    let path = plugin("broken_updater").display().to_string();
    let config = format!(r#"{{"endpoint":"{}"}}"#, cloud.url());
    let host = cloud.addr().to_string();
    let mut args = updater_args(&path, &provider, &config, &host);
    args.extend(["--output", "json"]);
    let out = run(capstan(&args)).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let outcome = |name: &str| -> (String, String) {
        let check = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name:?} in {report}"));
        (
            check["result"].as_str().unwrap().to_string(),
            check["detail"].as_str().unwrap_or_default().to_string(),
        )
    };
    let (result, detail) = outcome("can-update claims only changed fields it declares");
    assert_eq!(result, "fail");
    assert!(detail.contains("failureDomain"), "{detail}");
    let (result, detail) = outcome("update reaches done with monotonic progress");
    assert_eq!(result, "fail");
    assert!(detail.contains("progress went backwards"), "{detail}");
    let (result, detail) = outcome("done is stable when called again");
    assert_eq!(result, "fail");
    assert!(
        detail.contains("after done returned") && detail.contains("InProgress"),
        "{detail}"
    );
    let (result, detail) = outcome("update of a machine without an instance is a typed error");
    assert_eq!(result, "fail");
    assert!(detail.contains("not a typed error"), "{detail}");
    let (result, detail) = outcome("can-update claims nothing when nothing changed");
    assert_eq!(result, "fail");
    assert!(detail.contains("failureDomain"), "{detail}");
    for passing in [
        "can-update answers the same twice",
        "update with nothing claimed is done",
    ] {
        assert_eq!(outcome(passing).0, "pass", "{passing}: {report}");
    }
    assert_eq!(cloud.stats().live_instances, 0, "cleaned up even so");
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_explains_bad_flags() {
    let path = plugin("sim_provider").display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (&["--config", "[1]"], "--config must be a JSON object"),
        (
            &["--config", "{}", "--allow-host", "nohost"],
            "expected HOST:PORT",
        ),
        (
            &["--config", "{}", "--world", "updater"],
            "--world updater needs --provider PATH",
        ),
        (
            &["--world", "addon"],
            "implements the provider world, not addon",
        ),
        (&[], "--config is required for the provider world"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["plugin", "conformance", path.as_str()];
        args.extend_from_slice(flags);
        let out = run(capstan(&args)).await;
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_manifest_world_imports_exports_and_digest() {
    let path = plugin("sim_provider");
    let digest = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(std::fs::read(&path).unwrap()))
    );
    let p = path.display().to_string();

    let out = run(capstan(&["plugin", "inspect", &p])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "Plugin:     sim-provider 0.1.0",
        "World:      provider",
        "Contract:   0.3.0",
        &digest,
        "http  http://127.0.0.1:*  credential slot `sim-cloud`",
        "capstan:plugin/provider@0.2.0",
        "capstan:plugin/http@0.3.0",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }

    let out = run(capstan(&["plugin", "inspect", &p, "--output", "json"])).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["digest"], digest.as_str());
    assert_eq!(json["manifest"]["name"], "sim-provider");
    assert_eq!(json["world"], "provider");
    assert!(
        json["exports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "capstan:plugin/provider@0.2.0")
    );
    assert!(
        json["imports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "capstan:plugin/http@0.3.0")
    );

    // A provider built against 0.1.0 (before bootstrap data) still loads,
    // and says which contract it has.
    let legacy = plugin("contract_0_1_provider").display().to_string();
    let out = run(capstan(&["plugin", "inspect", &legacy])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in ["Contract:   0.1.0", "capstan:plugin/provider@0.1.0"] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    // So does a bootstrap plugin (new in 0.2.0).
    let kubeadm = plugin("kubeadm_bootstrap").display().to_string();
    let out = run(capstan(&["plugin", "inspect", &kubeadm])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in ["World:      bootstrap", "capstan:plugin/bootstrap@0.2.0"] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_refuses_a_file_that_is_not_a_plugin() {
    let junk = std::env::temp_dir().join(format!("capstan-junk-{}.wasm", std::process::id()));
    std::fs::write(&junk, b"\0asm\x01\0\0\0").unwrap();
    let out = run(capstan(&["plugin", "inspect", &junk.display().to_string()])).await;
    let _ = std::fs::remove_file(&junk);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("core WebAssembly module") && stderr.contains("wasm32-wasip2"),
        "{stderr}"
    );
}

#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    // `capstan crds | head -1`: the reader goes after one line.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' crds | head -c 1 >/dev/null; '{}' crds | (exec 0<&-; sleep 0.2)",
            env!("CARGO_BIN_EXE_capstan"),
            env!("CARGO_BIN_EXE_capstan")
        ))
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
}

#[test]
fn crds_print_every_kind_for_kubectl_apply() {
    let out = Command::new(env!("CARGO_BIN_EXE_capstan"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        yaml.matches("kind: CustomResourceDefinition").count(),
        8,
        "{yaml}"
    );
    for name in [
        "clusters.capstan.dev",
        "addons.capstan.dev",
        "plugins.capstan.dev",
        "machines.capstan.dev",
        "machinesets.capstan.dev",
        "machinedrainrules.capstan.dev",
        "machinedeployments.capstan.dev",
        "machinehealthchecks.capstan.dev",
    ] {
        assert!(yaml.contains(&format!("name: {name}")), "{name} missing");
    }
}

#[test]
fn controller_explains_an_unusable_kubeconfig() {
    let stderr = fails_with(
        &["controller", "--kubeconfig", "/nonexistent/kubeconfig"],
        1,
    );
    assert!(
        stderr.contains("cannot read kubeconfig /nonexistent/kubeconfig"),
        "{stderr}"
    );
}

/// A wrong kind is a usage error (exit 2), named before any cluster is
/// contacted, with what to write instead.
#[test]
fn rollout_rejects_other_kinds() {
    let history = [
        "rollout",
        "history",
        "deploy/web",
        "--kubeconfig",
        "/nonexistent",
    ];
    let stderr = fails_with(&history, 2);
    assert!(stderr.contains("write md/NAME"), "{stderr}");
    let stderr = fails_with(
        &["describe", "deploy/web", "--kubeconfig", "/nonexistent"],
        2,
    );
    assert!(
        stderr.contains("write md/NAME, ms/NAME, ma/NAME, addon/NAME"),
        "{stderr}"
    );
}

/// Completion scripts for bash and zsh know the day-two commands; run as
/// `kubectl-capstan`, help names the command as kubectl runs it.
#[test]
fn completions_and_the_kubectl_plugin_name() {
    for (shell, marker) in [
        ("bash", "complete -F _capstan"),
        ("zsh", "#compdef capstan"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        for word in ["rollout", "describe", "restart", "--show-conditions"] {
            assert!(script.contains(word), "{shell} completes {word}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-capstan");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_capstan"), &plugin).unwrap();
    let out = Command::new(&plugin)
        .args(["rollout", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: kubectl capstan rollout"), "{help}");
}

/// Report lines of `capstan plugin conformance … -o json` as (name, result, detail).
fn checks(report: &serde_json::Value) -> Vec<(String, String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("result"), s("detail"))
        })
        .collect()
}

/// `capstan plugin conformance STEM.wasm --world addon --config CONFIG -o json`:
/// (exit code, report).
async fn addon_conformance(stem: &str, config: &str) -> (Option<i32>, serde_json::Value) {
    let path = plugin(stem).display().to_string();
    let args = [
        "plugin",
        "conformance",
        &path,
        "--world",
        "addon",
        "--config",
        config,
        "-o",
        "json",
    ];
    let out = run(capstan(&args)).await;
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn addon_conformance_passes_both_sample_addons_and_fails_the_greedy_one_precisely() {
    // Every text field of their configs is tried with newlines, braces and
    // quotes: refused or kept whole, never pasted into a Corefile.
    for (stem, config) in [
        (
            "coredns_addon",
            r#"{"namespace": "kube-system", "clusterDomain": "cluster.local", "upstreams": ["10.0.0.2", "/etc/resolv.conf"], "clusterIP": "10.96.0.10"}"#,
        ),
        ("node_exporter_addon", r#"{"namespace": "monitoring"}"#),
    ] {
        let (code, report) = addon_conformance(stem, config).await;
        assert_eq!(code, Some(0), "{stem}: {report:#}");
        let checks = checks(&report);
        assert_eq!(checks.len(), 15, "{report:#}");
        assert!(
            checks.iter().any(|(n, r, _)| n
                == "each declared Kubernetes range is a semantic-version requirement"
                && r == "pass"),
            "{report:#}"
        );
        assert!(
            checks.iter().any(|(n, r, _)| n
                == "config text is checked, never pasted into rendered text"
                && r == "pass"),
            "{report:#}"
        );
    }
    let (code, report) = addon_conformance("greedy_addon", "{}").await;
    assert_eq!(code, Some(1));
    let failed: Vec<(String, String)> = checks(&report)
        .into_iter()
        .filter(|(_, r, _)| r == "fail")
        .map(|(n, _, d)| (n, d))
        .collect();
    let names: Vec<&str> = failed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "versions lists at least one version, each once",
            "render 1.0.0 stays within the declared kinds",
            "render 1.0.0 is deterministic",
            "a version it does not list is a typed error",
            "assess answers for nothing observed",
        ],
        "{report:#}"
    );
    assert!(
        failed[1].1.contains("ClusterRoleBinding greedy-admin"),
        "{failed:?}"
    );
    assert!(failed[4].1.contains("trapped in assess"), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn addon_render_refuses_a_version_outside_the_clusters_kubernetes_and_a_0_1_addon_still_renders()
 {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, spec: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: capstan.dev/v1alpha1\nkind: Addon\nmetadata: {{name: ne}}\nspec: {spec}\n"
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    let exporter = plugin("node_exporter_addon").display().to_string();
    // A node agent: privileged, as the e2e tests grant it.
    let grants = dir.path().join("plugin.yaml");
    std::fs::write(
        &grants,
        "apiVersion: capstan.dev/v1alpha1\nkind: Plugin\nmetadata: {name: ne}\nspec:\n  source: file:///ne.wasm\n  grants: {objects: ['Namespace/monitoring', 'ServiceAccount@monitoring', 'Service@monitoring', 'apps/DaemonSet@monitoring', 'ConfigMap@default'], podSecurity: Privileged}\n",
    )
    .unwrap();
    let grants = grants.display().to_string();
    let render = async |addon: &str, plugin: &str, kubernetes: &str| {
        run(capstan(&[
            "addon",
            "render",
            addon,
            "--plugin",
            plugin,
            "--grants-from",
            &grants,
            "--kubernetes-version",
            kubernetes,
        ]))
        .await
    };
    // 1.8.2 declares >=1.20.0.
    let pinned = write("pinned.yaml", "{plugin: ne, version: 1.8.2}");
    let out = render(&pinned, &exporter, "v1.19.4").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("version 1.8.2 does not fit the target cluster: it supports Kubernetes \">=1.20.0\", and the cluster runs v1.19.4 (API server): v1.19.4 (API server) outside it; nothing of it was applied"),
        "{}",
        text(&out.stderr)
    );
    let out = render(&pinned, &exporter, "v1.30.2-eks-4f4795d").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("node-exporter:v1.8.2"));
    // A channel whose only version does not fit is refused too.
    let rapid = write("rapid.yaml", "{plugin: ne, channel: rapid}");
    let out = render(&rapid, &exporter, "v1.19.4").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("version 1.8.2 does not fit"));
    let out = render(&rapid, &exporter, "latest").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--kubernetes-version: \"latest\" is not a Kubernetes version"),
        "{}",
        text(&out.stderr)
    );

    // An addon built against 0.1.0 (no ranges, not told the version) loads,
    // says which contract it has, and fits every cluster.
    let legacy = plugin("contract_0_1_addon").display().to_string();
    let out = run(capstan(&["plugin", "inspect", &legacy])).await;
    let stdout = text(&out.stdout);
    for needle in ["Contract:   0.1.0", "capstan:plugin/addon@0.1.0"] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    let stable = write("legacy.yaml", "{plugin: legacy, channel: stable}");
    let out = render(&stable, &legacy, "v1.19.4").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("name: legacy") && stdout.contains("version: 1.0.0"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn addon_render_prints_what_would_be_applied_and_refuses_ungranted_objects() {
    let dir = tempfile::tempdir().unwrap();
    let addon = dir.path().join("dns.yaml");
    std::fs::write(
        &addon,
        "apiVersion: capstan.dev/v1alpha1
kind: Addon
metadata: {name: dns}
spec:
  plugin: coredns
  channel: rapid
  config: {replicas: 1}
  patches:
  - target: {kind: Deployment, name: coredns}
    type: Strategic
    patch: {spec: {template: {spec: {containers: [{name: coredns, resources: {limits: {memory: 300Mi}}}]}}}}
",
    )
    .unwrap();
    let path = plugin("coredns_addon").display().to_string();
    let a = addon.display().to_string();
    let out = run(capstan(&["plugin", "inspect", &path])).await;
    assert!(
        text(&out.stdout).contains("objects  rbac.authorization.k8s.io/ClusterRoleBinding"),
        "inspect shows the declared kinds: {}",
        text(&out.stdout)
    );
    // Patches change only what the Plugin's grants let them.
    let out = run(capstan(&["addon", "render", &a, "--plugin", &path])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("spec.patches[0]: changes /spec/template/spec/containers/0/resources/limits/memory of Deployment kube-system/coredns, which the Plugin's spec.grants.patches does not allow"),
        "{}",
        text(&out.stderr)
    );
    let plugin_yaml = dir.path().join("plugin.yaml");
    std::fs::write(
        &plugin_yaml,
        "apiVersion: capstan.dev/v1alpha1
kind: Plugin
metadata: {name: coredns}
spec:
  source: file:///coredns.wasm
  grants:
    patches:
    - objects: apps/Deployment@kube-system
      paths: [/spec/template/spec/containers/*/resources]
",
    )
    .unwrap();
    let out = run(capstan(&[
        "addon",
        "render",
        &a,
        "--plugin",
        &path,
        "--grants-from",
        &plugin_yaml.display().to_string(),
        "--image-rewrite",
        "registry.k8s.io/=mirror.local/",
        "-o",
        "json",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("coredns 1.11.3 (channel rapid): 6 objects"),
        "{}",
        text(&out.stderr)
    );
    let objects: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Service"
        ]
    );
    let container = &objects[4]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "mirror.local/coredns/coredns:v1.11.3");
    assert_eq!(container["resources"]["limits"]["memory"], "300Mi");
    assert_eq!(
        container["resources"]["requests"]["cpu"], "100m",
        "merged, not replaced"
    );
    assert_eq!(objects[0]["metadata"]["labels"]["capstan.dev/addon"], "dns");

    // With the Plugin's grants, an object outside them refuses everything.
    let out = run(capstan(&[
        "addon",
        "render",
        &a,
        "--plugin",
        &path,
        "--grants-from",
        &plugin_yaml.display().to_string(),
        "--grant",
        "ServiceAccount@kube-system",
        "--grant",
        "ConfigMap@kube-system",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ClusterRole system:coredns is outside spec.grants.objects (it needs a grant covering rbac.authorization.k8s.io/ClusterRole/system:coredns)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing printed when refused");

    // An unknown version names the known ones.
    std::fs::write(&addon, "apiVersion: capstan.dev/v1alpha1\nkind: Addon\nmetadata: {name: dns}\nspec: {plugin: coredns, version: '2.0.0'}\n").unwrap();
    let out = run(capstan(&["addon", "render", &a, "--plugin", &path])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("known versions: 1.10.1, 1.11.3"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 40's findings, rendered as their author did: with the README's
/// coredns grants, each is refused with exit 1 naming the rule, and
/// nothing is printed.
#[tokio::test(flavor = "multi_thread")]
async fn addon_render_refuses_borrowed_identities_injected_config_and_tenants_outside_their_namespace()
 {
    let dir = tempfile::tempdir().unwrap();
    let path = plugin("coredns_addon").display().to_string();
    let plugin_yaml = dir.path().join("plugin.yaml");
    std::fs::write(
        &plugin_yaml,
        "apiVersion: capstan.dev/v1alpha1
kind: Plugin
metadata: {name: coredns}
spec:
  source: file:///coredns.wasm
  grants:
    objects: [ServiceAccount@*, ConfigMap@*, Service@*, apps/Deployment@*,
      rbac.authorization.k8s.io/ClusterRole/system:coredns,
      rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns]
    patches:
    - objects: apps/Deployment@kube-system
      paths: [/spec/template/spec/serviceAccountName]
      tenants: true
",
    )
    .unwrap();
    let grants = plugin_yaml.display().to_string();
    let render = async |addon_yaml: &str, extra: &[&str]| {
        let addon = dir.path().join("addon.yaml");
        std::fs::write(&addon, addon_yaml).unwrap();
        let a = addon.display().to_string();
        let mut args = vec![
            "addon",
            "render",
            &a,
            "--plugin",
            &path,
            "--grants-from",
            &grants,
        ];
        args.extend_from_slice(extra);
        let out = run(capstan(&args)).await;
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let header = "apiVersion: capstan.dev/v1alpha1\nkind: Addon\nmetadata: {name: dns, namespace: capstan-system}\n";

    // The admin's own render passes.
    let (code, stdout, stderr) = render(
        &format!("{header}spec: {{plugin: coredns, channel: stable}}\n"),
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("kind: Deployment"), "{stdout}");

    // A break-glass patch that runs CoreDNS as a controller's identity.
    let (code, stdout, stderr) = render(
        &format!(
            "{header}spec:
  plugin: coredns
  channel: stable
  patches:
  - target: {{kind: Deployment, name: coredns}}
    patch: {{spec: {{template: {{spec: {{serviceAccountName: clusterrole-aggregation-controller}}}}}}}}
"
        ),
        &[],
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("Deployment kube-system/coredns: runs as ServiceAccount kube-system/clusterrole-aggregation-controller, which the render does not create and spec.grants.serviceAccounts does not name"),
        "{stderr}"
    );

    // A tenant's upstream that adds a server block hijacking the API's name.
    let (code, stdout, stderr) = render(
        &format!(
            "{header}spec:
  plugin: coredns
  channel: stable
  config:
    upstreams: [\"8.8.8.8 {{\\n}}\\nkubernetes.default.svc:53 {{\\n hosts {{\\n 6.6.6.6 kubernetes.default.svc\\n }}\\n}}\\n. {{\"]
"
        ),
        &[],
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("upstreams[0]: \"8.8.8.8 {\\n}")
            && stderr.contains("is not an upstream resolver"),
        "{stderr}"
    );

    // A tenant's Addon rendering kube-system and cluster-wide objects.
    let tenant = "apiVersion: capstan.dev/v1alpha1\nkind: Addon\nmetadata: {name: dns, namespace: team-a}\nspec: {plugin: coredns, channel: stable}\n";
    let (code, stdout, stderr) = render(tenant, &["--tenant"]).await;
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    for object in [
        "ServiceAccount kube-system/coredns",
        "ClusterRole system:coredns",
        "ClusterRoleBinding system:coredns",
        "Deployment kube-system/coredns",
    ] {
        assert!(
            stderr.contains(&format!("{object} is outside namespace team-a")),
            "{object}: {stderr}"
        );
    }
}

/// `capstan plugin conformance --world bootstrap`: the kubeadm plugin passes
/// every check; a config it must refuse is refused as invalid-config.
#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_conformance_passes_the_kubeadm_plugin() {
    let path = plugin("kubeadm_bootstrap").display().to_string();
    let args = [
        "plugin",
        "conformance",
        &path,
        "--world",
        "bootstrap",
        "--config",
        r#"{"preKubeadmCommands":["swapoff -a"]}"#,
        "--invalid-config",
        r#"{"files":[{"path":"relative","content":""}]}"#,
        "-o",
        "json",
    ];
    let out = run(capstan(&args)).await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() >= 8, "{report:#}");
    assert!(checks.iter().all(|c| c["result"] == "pass"), "{report:#}");
    assert!(
        checks
            .iter()
            .any(|c| c["name"].as_str().unwrap().contains("token placeholder")),
        "{report:#}"
    );
}
