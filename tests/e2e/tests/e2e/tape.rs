//! Record and replay at the sandbox's edge, as a plugin author runs them
//! (`capstan plugin record`, `capstan plugin replay`): the sim provider in
//! Rust, Python and JavaScript and the EC2 provider against moto, recorded, then
//! replayed with the cloud stopped and no credential, giving the same
//! results; cassettes hold no secret; a changed request misses naming the
//! difference; randomness and time replay exactly; a cassette that would
//! hold a secret is refused.

use crate::sandbox::{TOKEN, cloud};
use capstan_e2e::moto::{Auth, Moto, REGION};
use capstan_e2e::plugin_dir;
use capstan_e2e::sim_cloud::SimCloud;
use std::path::{Path, PathBuf};
use std::process::Command;

fn component(stem: &str) -> PathBuf {
    let path = plugin_dir().join(format!("{stem}.wasm"));
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// `capstan ARGS` with `env`; (success, stdout, stderr).
fn capstan(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(capstan_e2e::env::capstan_bin().unwrap())
        .args(args)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .envs(env.iter().copied())
        .output()
        .expect("run capstan");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn record_sim(
    stem: &str,
    cloud: &SimCloud,
    cassette: &Path,
    config: &str,
) -> (bool, String, String) {
    let host = cloud.addr().to_string();
    capstan(
        &[
            "plugin",
            "record",
            component(stem).to_str().unwrap(),
            "--cassette",
            cassette.to_str().unwrap(),
            "--config",
            config,
            "--allow-host",
            &host,
            "--bearer-from-env",
            "sim-cloud=TAPE_TOKEN",
        ],
        &[("TAPE_TOKEN", TOKEN)],
    )
}

fn replay(stem: &str, cassette: &Path, host: &str) -> (bool, String, String) {
    capstan(
        &[
            "plugin",
            "replay",
            component(stem).to_str().unwrap(),
            "--cassette",
            cassette.to_str().unwrap(),
            "--allow-host",
            host,
        ],
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sim_provider_in_rust_python_and_javascript_replays_offline_with_the_same_results() {
    let dir = tempfile::tempdir().unwrap();
    for stem in ["sim_provider", "sim_provider_py", "sim_provider_js"] {
        let cloud = cloud().await;
        let host = cloud.addr().to_string();
        let cassette = dir.path().join(format!("{stem}.yaml"));
        let config =
            serde_json::json!({ "endpoint": cloud.url(), "tags": {"team": "a"} }).to_string();
        let (ok, recorded, err) =
            tokio::task::block_in_place(|| record_sim(stem, &cloud, &cassette, &config));
        assert!(ok, "{stem}: {err}");
        assert_eq!(recorded.lines().count(), 3, "{recorded}");
        assert!(recorded.contains("\"providerID\":\"sim://i-"), "{recorded}");
        let requests = cloud.stats().requests;
        assert!(requests >= 3, "{requests}");
        cloud.shutdown().await;

        // The cloud is gone and no credential is given: the same results.
        let (ok, replayed, err) = tokio::task::block_in_place(|| replay(stem, &cassette, &host));
        assert!(ok, "{stem}: {err}");
        assert_eq!(replayed, recorded, "{stem}");

        let text = std::fs::read_to_string(&cassette).unwrap();
        assert!(
            !text.contains(TOKEN),
            "{stem}: the token is in the cassette"
        );
        assert!(!text.to_lowercase().contains("authorization"), "{stem}");

        // Grants still apply under replay: ungranted, the request is denied.
        let (ok, _, err) = tokio::task::block_in_place(|| replay(stem, &cassette, "127.0.0.1:1"));
        assert!(!ok && err.contains("denied"), "{stem}: {err}");

        // A request that differs from the recording misses, naming the key,
        // the closest recorded one and how the bodies differ.
        let mut edited: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let changed = config.replace("\"team\":\"a\"", "\"team\":\"b\"");
        edited["meta"]["config"] = serde_yaml::Value::String(changed);
        let edited_path = dir.path().join(format!("{stem}-edited.yaml"));
        std::fs::write(&edited_path, serde_yaml::to_string(&edited).unwrap()).unwrap();
        let (ok, _, err) = tokio::task::block_in_place(|| replay(stem, &edited_path, &host));
        assert!(!ok, "{stem}: a changed body replayed");
        assert!(
            err.contains("cannot be replayed: no recorded interaction matches POST")
                && err.contains("the closest recorded is POST")
                && err.contains(r#"-"team": "a""#)
                && err.contains(r#"+"team": "b""#),
            "{stem}: {err}"
        );
    }
}

#[test]
fn the_ec2_provider_replays_without_moto_and_its_cassette_holds_no_aws_secret() {
    let moto = Moto::start(Auth::Checked).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("ec2.yaml");
    let config = moto.provider_config("t3.micro").to_string();
    let host = moto.url.trim_start_matches("http://").to_string();
    let key_id = moto.credentials.access_key_id.clone();
    let secret = moto.credentials.secret_access_key.clone();
    let (ok, recorded, err) = capstan(
        &[
            "plugin",
            "record",
            capstan_e2e::plugin("ec2_provider").to_str().unwrap(),
            "--cassette",
            cassette.to_str().unwrap(),
            "--config",
            &config,
            "--allow-host",
            &host,
            "--aws-sigv4-from-env",
            &format!("aws={REGION}/ec2"),
            "--call-timeout",
            "60s",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", &key_id),
            ("AWS_SECRET_ACCESS_KEY", &secret),
        ],
    );
    assert!(ok, "{err}");
    assert!(recorded.contains("\"providerID\":\"aws:///"), "{recorded}");
    drop(moto);

    let text = std::fs::read_to_string(&cassette).unwrap();
    for secret_text in [key_id.as_str(), secret.as_str(), "AWS4-HMAC-SHA256"] {
        assert!(
            !text.contains(secret_text),
            "the cassette holds {secret_text}"
        );
    }
    assert!(!text.to_lowercase().contains("authorization"));
    assert!(
        text.contains("Action=RunInstances"),
        "the EC2 query is recorded"
    );
    let (ok, replayed, err) = capstan(
        &[
            "plugin",
            "replay",
            capstan_e2e::plugin("ec2_provider").to_str().unwrap(),
            "--cassette",
            cassette.to_str().unwrap(),
            "--allow-host",
            &host,
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(replayed, recorded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomness_and_time_in_a_request_replay_exactly_twenty_times() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = cloud().await;
    let host = cloud.addr().to_string();
    let cassette = dir.path().join("entropy.yaml");
    let config = serde_json::json!({ "attack": "entropy", "endpoint": cloud.url() }).to_string();
    let (ok, recorded, err) = tokio::task::block_in_place(|| {
        capstan(
            &[
                "plugin",
                "record",
                component("hostile_plugin").to_str().unwrap(),
                "--cassette",
                cassette.to_str().unwrap(),
                "--config",
                &config,
                "--calls",
                "create",
                "--allow-host",
                &host,
                "--bearer-from-env",
                "sim-cloud=TAPE_TOKEN",
            ],
            &[("TAPE_TOKEN", TOKEN)],
        )
    });
    assert!(ok, "{err}");
    cloud.shutdown().await;
    // The request body (random bytes, the time) is part of the match key:
    // every replay must send exactly what was recorded.
    for round in 0..20 {
        let (ok, replayed, err) =
            tokio::task::block_in_place(|| replay("hostile_plugin", &cassette, &host));
        assert!(ok, "round {round}: {err}");
        assert_eq!(replayed, recorded, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cassette_that_would_hold_a_secret_is_refused_naming_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = cloud().await;
    let cassette = dir.path().join("leak.yaml");
    // The token pasted into the config ends up in the create request body
    // (the instance's tags), base64- or not.
    let config =
        serde_json::json!({ "endpoint": cloud.url(), "tags": {"oops": TOKEN} }).to_string();
    let (ok, _, err) =
        tokio::task::block_in_place(|| record_sim("sim_provider", &cloud, &cassette, &config));
    assert!(!ok);
    assert!(
        err.contains("refusing to write") && err.contains("sim-cloud") && !err.contains(TOKEN),
        "{err}"
    );
    assert!(!cassette.exists(), "nothing is written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_test_suite_reports_each_case_and_fails_on_a_failed_one() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = cloud().await;
    let host = cloud.addr().to_string();
    let cassette = dir.path().join("lifecycle.yaml");
    let config = serde_json::json!({ "endpoint": cloud.url() }).to_string();
    let (ok, _, err) =
        tokio::task::block_in_place(|| record_sim("sim_provider", &cloud, &cassette, &config));
    assert!(ok, "{err}");
    cloud.shutdown().await;
    std::fs::copy(component("sim_provider"), dir.path().join("plugin.wasm")).unwrap();
    let suite = |cases: &str| {
        format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: PluginTest\nplugin: plugin.wasm\nallowHosts: [\"{host}\"]\ncases:\n{cases}"
        )
    };
    let passing = format!(
        r#"  - name: the recorded lifecycle
    cassette: lifecycle.yaml
    expect:
      - {{call: create, result: {{providerID: "sim://i-000001"}}, requests: 1}}
      - {{call: get, requests: 1}}
      - {{call: delete}}
  - name: throttling is transient with its retry-after
    call: create
    config: {{endpoint: "http://{host}"}}
    stubs:
      - request: {{method: POST, url: "http://{host}/v1/instances", anyBody: true}}
        response: {{status: 429, headers: [[retry-after, "3"]], body: '{{"code":"Throttling","message":"slow down"}}'}}
    expect:
      - {{error: transient, retryAfterMs: 3000, requests: 1}}
"#
    );
    let path = dir.path().join("suite.yaml");
    std::fs::write(&path, suite(&passing)).unwrap();
    let (ok, out, err) = capstan(&["plugin", "test", path.to_str().unwrap()], &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("PASS  the recorded lifecycle") && out.contains("2 cases: 2 passed, 0 failed"),
        "{out}"
    );

    let failing = format!(
        r#"{passing}  - name: a denied create is not transient
    call: create
    config: {{endpoint: "http://{host}"}}
    stubs:
      - request: {{method: POST, url: "http://{host}/v1/instances", anyBody: true}}
        response: {{status: 403, body: '{{"code":"Denied","message":"no"}}'}}
      - request: {{method: GET, url: "http://{host}/v1/never"}}
        response: {{status: 200}}
    expect:
      - {{error: transient}}
"#
    );
    std::fs::write(&path, suite(&failing)).unwrap();
    let (ok, out, _) = capstan(
        &["plugin", "test", path.to_str().unwrap(), "-o", "junit"],
        &[],
    );
    assert!(!ok, "a failed case exits non-zero");
    assert!(
        out.contains(r#"<testsuite name="suite" tests="3" failures="1""#),
        "{out}"
    );
    assert!(
        out.contains(r#"<testcase name="the recorded lifecycle" classname="suite""#),
        "{out}"
    );
    assert!(
        out.contains("expected a transient error, got unauthorized")
            && out.contains("/v1/never #empty was never asked for"),
        "{out}"
    );
    // What a call logged is checked too.
    std::fs::copy(component("hostile_plugin"), dir.path().join("hostile.wasm")).unwrap();
    let logs = |want: &str| {
        format!(
            r#"apiVersion: capstan.dev/v1alpha1
kind: PluginTest
plugin: hostile.wasm
allowHosts: ["{host}"]
cases:
  - name: entropy logs what it got
    call: create
    config: {{attack: entropy, endpoint: "http://{host}"}}
    stubs:
      - request: {{method: POST, url: "http://{host}/v1/instances", anyBody: true}}
        response: {{status: 201, body: '{{"id":"i-1"}}'}}
    expect:
      - {{result: {{providerID: "hostile://entropy"}}, logs: ["{want}"]}}
"#
        )
    };
    std::fs::write(&path, logs(r#"INFO entropy sent status=\"201\""#)).unwrap();
    let (ok, out, err) = capstan(&["plugin", "test", path.to_str().unwrap()], &[]);
    assert!(ok, "{out}{err}");
    std::fs::write(&path, logs("WARN nothing like this")).unwrap();
    let (ok, out, _) = capstan(&["plugin", "test", path.to_str().unwrap()], &[]);
    assert!(
        !ok && out.contains(
            r#"no log line contains "WARN nothing like this" (it logged: INFO entropy sent"#
        ),
        "{out}"
    );
}

/// `capstan plugin test SUITE` in a fresh folder holding `plugin.wasm`
/// (a copy of `stem`) and the suite; (success, text report).
fn run_suite(stem: &str, host: &str, cases: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(component(stem), dir.path().join("plugin.wasm")).unwrap();
    let path = dir.path().join("suite.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: PluginTest\nplugin: plugin.wasm\nallowHosts: [\"{host}\"]\ncases:\n{cases}"
        ),
    )
    .unwrap();
    let (ok, out, err) = capstan(&["plugin", "test", path.to_str().unwrap()], &[]);
    (ok, format!("{out}{err}"))
}

#[test]
fn updater_and_addon_suites_run_offline_in_each_language() {
    // Nothing listens here: every answer is a stub.
    let host = "127.0.0.1:9";
    let url = format!("http://{host}/v1/instances/i-1");
    let updater = format!(
        r#"  - name: only the version is claimed
    call: can-update
    config: {{endpoint: "http://{host}"}}
    current: {{version: v1.30.0, providerID: "sim://i-1"}}
    desired: {{version: v1.31.0}}
    fields: [labels, version]
    expect:
      - resultEquals: [version]
  - name: an update starts once
    call: update
    config: {{endpoint: "http://{host}"}}
    current: {{version: v1.30.0, providerID: "sim://i-1"}}
    desired: {{version: v1.31.0}}
    fields: [version]
    stubs:
      - request: {{method: GET, url: "{url}"}}
        response: {{status: 200, body: '{{"id":"i-1","state":"running","version":"v1.30.0"}}'}}
      - request: {{method: POST, url: "{url}/update", body: '{{"version":"v1.31.0"}}'}}
        response: {{status: 202, body: '{{}}'}}
    expect:
      - {{result: {{inProgress: {{percent: 0}}}}, requests: 2}}
  - name: an instance at the version is done
    call: update
    config: {{endpoint: "http://{host}"}}
    current: {{version: v1.30.0, providerID: "sim://i-1"}}
    desired: {{version: v1.31.0}}
    fields: [version]
    stubs:
      - request: {{method: GET, url: "{url}"}}
        response: {{status: 200, body: '{{"id":"i-1","state":"running","version":"v1.31.0"}}'}}
    expect:
      - {{resultEquals: done, requests: 1}}
  - name: a cloud error is transient
    call: update
    config: {{endpoint: "http://{host}"}}
    current: {{providerID: "sim://i-1"}}
    desired: {{version: v1.31.0}}
    fields: [version]
    stubs:
      - request: {{method: GET, url: "{url}"}}
        response: {{status: 500, body: '{{"code":"Internal","message":"oops"}}'}}
    expect:
      - {{error: transient, retryAfterMs: 1000}}
"#
    );
    for stem in ["sim_updater", "sim_updater_py", "sim_updater_js"] {
        let (ok, report) = run_suite(stem, host, &updater);
        assert!(
            ok && report.contains("4 cases: 4 passed"),
            "{stem}: {report}"
        );
    }

    let addon = r#"  - name: versions and their channels
    call: versions
    expect:
      - resultEquals: [{version: 1.7.0, channels: [stable], kubernetes: ">=1.16.0"}, {version: 1.8.2, channels: [rapid], kubernetes: ">=1.20.0"}]
  - name: the asked version renders on the asked port
    call: render
    addon: {version: 1.8.2, channel: rapid, kubernetesVersion: v1.30.2}
    config: {port: 9200}
    expect:
      - result:
          - {kind: Namespace, metadata: {name: monitoring}}
          - {kind: DaemonSet, spec: {template: {spec: {containers: [{image: "quay.io/prometheus/node-exporter:v1.8.2", args: ["--web.listen-address=:9200"]}]}}}}
  - name: a privileged port is invalid config
    call: render
    addon: {version: 1.7.0}
    config: {port: 80}
    expect:
      - error: invalid-config
  - name: a half-ready DaemonSet is not healthy
    call: assess
    addon: {version: 1.7.0}
    observed:
      - {kind: DaemonSet, metadata: {name: node-exporter}, status: {desiredNumberScheduled: 2, numberReady: 1, updatedNumberScheduled: 2}}
    expect:
      - result: {healthy: false, details: {numberReady: "1/2"}}
"#;
    for stem in [
        "node_exporter_addon",
        "node_exporter_py",
        "node_exporter_js",
    ] {
        let (ok, report) = run_suite(stem, host, addon);
        assert!(
            ok && report.contains("4 cases: 4 passed"),
            "{stem}: {report}"
        );
    }
    // What the Python and JavaScript addons log is checked; a wrong
    // expectation and another world's inputs fail their cases.
    let logged = r#"  - name: render logs what it rendered
    call: render
    addon: {version: 1.7.0}
    expect:
      - logs: ['INFO rendered version="1.7.0" objects="4"']
  - name: a wrong claim fails
    call: assess
    addon: {version: 1.7.0}
    expect:
      - result: {healthy: true}
  - name: updater inputs are not an addon's
    call: render
    fields: [version]
  - name: a provider's call is not an addon's
    call: create
"#;
    for stem in ["node_exporter_py", "node_exporter_js"] {
        let (ok, report) = run_suite(stem, host, logged);
        assert!(!ok, "{stem}: {report}");
        assert!(
            report.contains("PASS  render logs what it rendered")
                && report.contains("FAIL  a wrong claim fails")
                && report.contains(r#"does not have {"healthy":true}"#)
                && report.contains("`current/desired/fields` are inputs of updater calls; this plugin implements the addon world")
                && report.contains("`create` is not a call of the addon world, whose calls are: versions, render, assess")
                && report.contains("4 cases: 1 passed, 3 failed"),
            "{stem}: {report}"
        );
    }
}
