//! `capstan plugin test SUITE.yaml`: a provider's, updater's or addon's
//! test cases, run offline. Each case replays a recorded cassette (every
//! call it holds) or answers one call from inline stubs, and checks what
//! each call gave: a result (a subset of its JSON, or `resultEquals`
//! exactly), an error class, a retry-after, how many requests it made, what
//! it logged. Interactions nothing asked for fail the case. Output as text,
//! JSON or JUnit XML; the exit code is non-zero if a case failed. The
//! inputs and results of updater and addon calls are in [`calls`].
//!
//! ```yaml
//! apiVersion: capstan.dev/v1alpha1
//! kind: PluginTest
//! plugin: sim_provider.wasm        # relative to this file
//! allowHosts: ["127.0.0.1:8787"]   # grants still apply under replay
//! cases:
//!   - name: the recorded lifecycle
//!     cassette: sim.yaml
//!     expect:
//!       - result: {state: "InstanceState::Pending"}
//!   - name: throttling is transient with its retry-after
//!     call: create
//!     config: {endpoint: "http://127.0.0.1:8787"}
//!     stubs:
//!       - request: {method: POST, url: "http://127.0.0.1:8787/v1/instances", anyBody: true}
//!         response: {status: 429, headers: [[retry-after, "3"]], body: '{"code":"Throttling"}'}
//!     expect:
//!       - {error: transient, retryAfterMs: 3000, requests: 1}
//! ```
//!
//! An updater's case gives the machine before and after and the fields;
//! an addon's gives the Addon, its config and (for `assess`) what is
//! observed:
//!
//! ```yaml
//!   - name: a version change is claimed
//!     call: can-update
//!     config: {endpoint: "http://127.0.0.1:8787"}
//!     current: {version: v1.30.0, providerID: "sim://i-1"}
//!     desired: {version: v1.31.0}
//!     fields: [version, labels]
//!     expect:
//!       - resultEquals: [version]
//!   - name: a half-ready DaemonSet is not healthy
//!     call: assess
//!     addon: {version: 1.7.0}
//!     observed:
//!       - {kind: DaemonSet, metadata: {name: node-exporter}, status: {desiredNumberScheduled: 2, numberReady: 1}}
//!     expect:
//!       - result: {healthy: false, details: {numberReady: "1/2"}}
//! ```

mod calls;

use crate::tape::{Outcome, machine, run_calls};
use anyhow::{Context, bail};
use calls::{AddonInput, CallInput, MachineInput};
use capstan_runtime::tape::{Cassette, Interaction, Tape, TapedCall};
use capstan_runtime::types::PluginError;
use capstan_runtime::{Error, World};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `capstan plugin test`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The suite (YAML, `kind: PluginTest`).
    pub suite: PathBuf,
    /// Report format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Format,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Junit,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Suite {
    api_version: String,
    kind: String,
    plugin: PathBuf,
    #[serde(default)]
    allow_hosts: Vec<String>,
    #[serde(default)]
    strict_order: bool,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    name: String,
    /// Replay this cassette's calls.
    #[serde(default)]
    cassette: Option<PathBuf>,
    /// Or make this one call, answered by `stubs`.
    #[serde(default)]
    call: Option<String>,
    /// The provider config (default: the cassette's); an addon's config
    /// (default `{}`); for an updater, the machines' provider config
    /// (default `{}`).
    #[serde(default)]
    config: Option<serde_json::Value>,
    #[serde(default)]
    stubs: Vec<Interaction>,
    /// Addons: the Addon (`name`, `namespace`, `version`, `channel`).
    #[serde(default)]
    addon: Option<AddonInput>,
    /// Addons: the objects `assess` observes.
    #[serde(default)]
    observed: Vec<serde_json::Value>,
    /// Updaters: the machine as it is (`name`, `version`, `providerID`,
    /// `labels`, `providerConfig`).
    #[serde(default)]
    current: Option<MachineInput>,
    /// Updaters: the machine as it should be.
    #[serde(default)]
    desired: Option<MachineInput>,
    /// Updaters: the changed (`can-update`) or claimed (`update`) fields.
    #[serde(default)]
    fields: Vec<String>,
    /// What each call (in order) must give.
    #[serde(default)]
    expect: Vec<Expect>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    /// The call this is about (checked when given).
    #[serde(default)]
    call: Option<String>,
    /// What the result must have: an object's fields recursively, an
    /// array's items each matching some item of the result.
    #[serde(default)]
    result: Option<serde_json::Value>,
    /// The whole result, exactly.
    #[serde(default)]
    result_equals: Option<serde_json::Value>,
    /// The error class: invalid-config, not-found, transient, unauthorized,
    /// terminal (the plugin's), or trap, deadline, memory-limit,
    /// output-limit, capability-denied, replay-miss (the host's).
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    retry_after_ms: Option<u64>,
    /// Requests the call made.
    #[serde(default)]
    requests: Option<usize>,
    /// Text each of which some log line of the call must contain (structured
    /// logs read `LEVEL message k="v"`, captured output `stdout: …`).
    #[serde(default)]
    logs: Vec<String>,
}

/// One case's verdict.
#[derive(Debug, Serialize)]
struct Verdict {
    name: String,
    passed: bool,
    /// Why it failed, one line each.
    failures: Vec<String>,
    seconds: f64,
}

/// A result's class, as `expect.error` names it.
fn class(error: &Error) -> &'static str {
    match error.plugin_error() {
        Some(PluginError::InvalidConfig(_)) => "invalid-config",
        Some(PluginError::NotFound(_)) => "not-found",
        Some(PluginError::Transient(_)) => "transient",
        Some(PluginError::Unauthorized(_)) => "unauthorized",
        Some(PluginError::Terminal(_)) => "terminal",
        None => match error {
            Error::Trap { .. } => "trap",
            Error::DeadlineExceeded { .. } => "deadline",
            Error::MemoryLimit { .. } => "memory-limit",
            Error::OutputLimit { .. } => "output-limit",
            Error::CapabilityDenied { .. } => "capability-denied",
            Error::ReplayMiss { .. } => "replay-miss",
            Error::QuotaExceeded { .. } => "quota",
            _ => "host-error",
        },
    }
}

/// Whether `actual` has every field `expected` has, recursively; each item
/// of an expected array must match some item of the actual one.
fn contains(actual: &serde_json::Value, expected: &serde_json::Value) -> bool {
    use serde_json::Value::{Array, Object};
    match (actual, expected) {
        (Object(a), Object(e)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|av| contains(av, v))),
        (Array(a), Array(e)) => e.iter().all(|ev| a.iter().any(|av| contains(av, ev))),
        _ => actual == expected,
    }
}

fn check(outcome: &Outcome, expect: &Expect, requests: usize) -> Vec<String> {
    let mut failures = Vec::new();
    let call = &outcome.call;
    if let Some(want) = &expect.call
        && want != call
    {
        failures.push(format!("expected a {want} call, the case made {call}"));
    }
    match (&outcome.result, &expect.error) {
        (Ok(result), None) => {
            if let Some(want) = &expect.result
                && !contains(result, want)
            {
                failures.push(format!("{call}: result {result} does not have {want}"));
            }
            if let Some(want) = &expect.result_equals
                && result != want
            {
                failures.push(format!("{call}: result {result} is not {want}"));
            }
        }
        (Ok(result), Some(want)) => {
            failures.push(format!(
                "{call}: expected a {want} error, got the result {result}"
            ));
        }
        (Err(e), None) => {
            failures.push(format!("{call}: expected a result, got {} ({e})", class(e)))
        }
        (Err(e), Some(want)) => {
            if class(e) != want {
                failures.push(format!(
                    "{call}: expected a {want} error, got {} ({e})",
                    class(e)
                ));
            }
        }
    }
    if let Some(want) = expect.retry_after_ms {
        let got = match &outcome.result {
            Err(e) => match e.plugin_error() {
                Some(PluginError::Transient(t)) => Some(t.retry_after_ms),
                _ => e.retry_after().map(|d| d.as_millis() as u64),
            },
            Ok(_) => None,
        };
        if got != Some(want) {
            failures.push(format!(
                "{call}: expected retry after {want} ms, got {got:?}"
            ));
        }
    }
    if let Some(want) = expect.requests
        && want != requests
    {
        failures.push(format!(
            "{call}: expected {want} requests, it made {requests}"
        ));
    }
    for want in &expect.logs {
        if !outcome.logs.iter().any(|line| line.contains(want.as_str())) {
            failures.push(format!(
                "{call}: no log line contains {want:?} (it logged: {})",
                if outcome.logs.is_empty() {
                    "nothing".to_string()
                } else {
                    outcome.logs.join(" | ")
                }
            ));
        }
    }
    failures
}

/// The cassette, calls and config a case runs.
fn case_input(
    case: &Case,
    dir: &Path,
    world: World,
) -> anyhow::Result<(Cassette, Vec<String>, String, String)> {
    match (&case.cassette, &case.call) {
        (Some(path), None) => {
            let path = dir.join(path);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let cassette: Cassette = serde_yaml::from_str(&text)
                .with_context(|| format!("{} is not a cassette", path.display()))?;
            let calls = cassette.calls.iter().map(|c| c.call.clone()).collect();
            let config = match &case.config {
                Some(c) => c.to_string(),
                None => cassette.meta.get("config").cloned().with_context(|| {
                    format!(
                        "{}: no `meta.config`; give the case a config",
                        path.display()
                    )
                })?,
            };
            let name = cassette
                .meta
                .get("machine")
                .cloned()
                .unwrap_or_else(|| "machine-1".into());
            Ok((cassette, calls, config, name))
        }
        (None, Some(call)) => {
            let config = match (&case.config, world) {
                (Some(config), _) => config.to_string(),
                (None, World::Provider) => bail!("a provider case with `call` needs `config`"),
                (None, _) => "{}".to_string(),
            };
            let cassette = Cassette {
                plugin: String::new(),
                digest: String::new(),
                meta: Default::default(),
                // Stubs: fixed clocks (2026-01-01T00:00:00Z) and seed.
                calls: vec![TapedCall {
                    call: call.clone(),
                    wall_start_ns: 1_767_225_600_000_000_000,
                    monotonic_start_ns: 0,
                    random_seed: "00".repeat(32),
                    interactions: case.stubs.clone(),
                }],
            };
            Ok((cassette, vec![call.clone()], config, "machine-1".into()))
        }
        _ => bail!("give either `cassette` or `call` (with `stubs`), not both or neither"),
    }
}

/// Inputs that belong to another world's calls: a mistake worth naming.
fn misplaced(case: &Case, world: World) -> Option<String> {
    let updater = case.current.is_some() || case.desired.is_some() || !case.fields.is_empty();
    let addon = case.addon.is_some() || !case.observed.is_empty();
    let (field, of) = match world {
        World::Updater if addon => ("addon/observed", "addon"),
        World::Addon if updater => ("current/desired/fields", "updater"),
        World::Provider if addon => ("addon/observed", "addon"),
        World::Provider if updater => ("current/desired/fields", "updater"),
        _ => return None,
    };
    Some(format!(
        "`{field}` are inputs of {of} calls; this plugin implements the {world} world"
    ))
}

async fn run_case(
    plugin: &capstan_runtime::Plugin,
    case: &Case,
    dir: &Path,
    strict_order: bool,
) -> Vec<String> {
    let world = plugin.manifest().world;
    if let Some(reason) = misplaced(case, world) {
        return vec![reason];
    }
    let (cassette, calls, config, name) = match case_input(case, dir, world) {
        Ok(input) => input,
        Err(e) => return vec![format!("{e:#}")],
    };
    let recorded: Vec<usize> = cassette
        .calls
        .iter()
        .map(|c| c.interactions.len())
        .collect();
    let tape = Tape::replay(cassette, strict_order);
    let logs = crate::tape::LogBuffer::default();
    let sink = {
        let logs = logs.clone();
        std::sync::Arc::new(move |_call: &'static str, line: &str| {
            logs.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(line.to_string());
        })
    };
    let taped = plugin
        .with_tape(Some(tape.clone()))
        .with_log_sink(Some(sink));
    let outcomes = match world {
        World::Provider => match taped.provider() {
            Ok(provider) => {
                run_calls(&provider, &calls, machine(&name, &config), Some(&logs)).await
            }
            Err(e) => Err(e.into()),
        },
        _ => {
            let input = CallInput {
                config: &config,
                addon: case.addon.as_ref(),
                observed: &case.observed,
                current: case.current.as_ref(),
                desired: case.desired.as_ref(),
                fields: &case.fields,
            };
            run_world_calls(&taped, &calls, &input, &logs).await
        }
    };
    let outcomes = match outcomes {
        Ok(o) => o,
        Err(e) => return vec![format!("{e:#}")],
    };
    let left = tape.cassette();
    let mut failures = Vec::new();
    for (i, outcome) in outcomes.iter().enumerate() {
        let requests = recorded[i] - left.calls[i].interactions.len();
        if let Some(expect) = case.expect.get(i) {
            failures.extend(check(outcome, expect, requests));
        } else if let Err(e) = &outcome.result
            && e.plugin_error().is_none()
        {
            // No expectation: the host's errors still fail the case.
            failures.push(format!("{}: {e}", outcome.call));
        }
    }
    if case.expect.len() > outcomes.len() {
        failures.push(format!(
            "{} expectations for {} calls",
            case.expect.len(),
            outcomes.len()
        ));
    }
    for (call, key) in tape.unused() {
        failures.push(format!(
            "call {}: recorded {key} was never asked for",
            call + 1
        ));
    }
    failures
}

/// An updater's or addon's calls, in order, each with the case's inputs.
async fn run_world_calls(
    plugin: &capstan_runtime::Plugin,
    calls: &[String],
    input: &CallInput<'_>,
    logs: &crate::tape::LogBuffer,
) -> anyhow::Result<Vec<Outcome>> {
    let mut out = Vec::new();
    for call in calls {
        let result = calls::run_one(plugin, call, input).await?;
        let logs = std::mem::take(&mut *logs.lock().unwrap_or_else(|p| p.into_inner()));
        out.push(Outcome {
            call: call.clone(),
            result,
            logs,
        });
    }
    Ok(out)
}

/// Run the command.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.suite)
        .with_context(|| format!("cannot read {}", args.suite.display()))?;
    let suite: Suite = serde_yaml::from_str(&text)
        .with_context(|| format!("{} is not a PluginTest suite", args.suite.display()))?;
    if suite.kind != "PluginTest" || suite.api_version != "capstan.dev/v1alpha1" {
        bail!(
            "{}: expected apiVersion capstan.dev/v1alpha1 and kind PluginTest, got {} {}",
            args.suite.display(),
            suite.api_version,
            suite.kind
        );
    }
    let dir = args
        .suite
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let sandbox = crate::options::SandboxArgs::offline(suite.allow_hosts.clone());
    let runtime = crate::options::one_shot_runtime(2)?;
    let plugin_path = dir.join(&suite.plugin);
    let plugin = runtime
        .load_file(&plugin_path, sandbox.limits(), sandbox.grants()?)
        .with_context(|| format!("plugin {}", plugin_path.display()))?;
    if plugin.manifest().world == World::Bootstrap {
        bail!(
            "{}: suites test provider, updater and addon plugins; check a bootstrap plugin with `capstan plugin conformance --world bootstrap`",
            plugin_path.display()
        );
    }
    let mut verdicts = Vec::new();
    for case in &suite.cases {
        let started = std::time::Instant::now();
        let failures = run_case(&plugin, case, &dir, suite.strict_order).await;
        verdicts.push(Verdict {
            name: case.name.clone(),
            passed: failures.is_empty(),
            failures,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let suite_name = args
        .suite
        .file_stem()
        .map_or("plugin-test".into(), |s| s.to_string_lossy().into_owned());
    match args.output {
        Format::Text => print!("{}", text_report(plugin.name(), &verdicts)),
        Format::Json => println!("{}", serde_json::to_string_pretty(&verdicts)?),
        Format::Junit => print!("{}", junit(&suite_name, &verdicts)),
    }
    Ok(if verdicts.iter().all(|v| v.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn text_report(plugin: &str, verdicts: &[Verdict]) -> String {
    let mut out = format!("Plugin tests of {plugin}\n\n");
    for v in verdicts {
        out.push_str(&format!(
            "  {}  {}\n",
            if v.passed { "PASS" } else { "FAIL" },
            v.name
        ));
        for f in &v.failures {
            out.push_str(&format!("        {f}\n"));
        }
    }
    let failed = verdicts.iter().filter(|v| !v.passed).count();
    out.push_str(&format!(
        "\n{} cases: {} passed, {failed} failed\n",
        verdicts.len(),
        verdicts.len() - failed
    ));
    out
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn junit(suite: &str, verdicts: &[Verdict]) -> String {
    let failed = verdicts.iter().filter(|v| !v.passed).count();
    let total: f64 = verdicts.iter().map(|v| v.seconds).sum();
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" time=\"{total:.3}\">\n",
        xml_escape(suite),
        verdicts.len()
    );
    for v in verdicts {
        out.push_str(&format!(
            "  <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\"",
            xml_escape(&v.name),
            xml_escape(suite),
            v.seconds
        ));
        if v.passed {
            out.push_str("/>\n");
        } else {
            out.push_str(&format!(
                ">\n    <failure message=\"{}\">{}</failure>\n  </testcase>\n",
                xml_escape(v.failures.first().map_or("", String::as_str)),
                xml_escape(&v.failures.join("\n"))
            ));
        }
    }
    out.push_str("</testsuite>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_match_as_subsets_and_junit_escapes() {
        let actual = serde_json::json!({"a": 1, "b": {"c": 2, "d": 3}});
        assert!(contains(&actual, &serde_json::json!({"b": {"c": 2}})));
        assert!(!contains(&actual, &serde_json::json!({"b": {"c": 3}})));
        let objects = serde_json::json!([{"kind": "Namespace"}, {"kind": "DaemonSet", "n": 1}]);
        assert!(contains(
            &objects,
            &serde_json::json!([{"kind": "DaemonSet"}])
        ));
        assert!(!contains(
            &objects,
            &serde_json::json!([{"kind": "Service"}])
        ));
        assert!(contains(&objects, &serde_json::json!([])));
        let xml = junit(
            "s",
            &[Verdict {
                name: "a <b>".into(),
                passed: false,
                failures: vec!["x & \"y\"".into()],
                seconds: 0.5,
            }],
        );
        assert!(xml.contains("tests=\"1\" failures=\"1\""), "{xml}");
        assert!(xml.contains("name=\"a &lt;b&gt;\""), "{xml}");
        assert!(xml.contains("message=\"x &amp; &quot;y&quot;\""), "{xml}");
    }
}
