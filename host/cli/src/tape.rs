//! `capstan plugin record` and `capstan plugin replay`: run a provider's
//! calls (`create`, `get`, `delete`, …) for one machine, recording what the
//! plugin sent and received at the sandbox's edge into a cassette, or
//! replaying them from one with no cloud and no credential. The cassette
//! format, matching and the taped clocks are `capstan_runtime::tape`.
//!
//! Credentials stay out of cassettes in layers: requests are recorded
//! before the host attaches any, sensitive headers are never kept,
//! `--redact-json` blanks fields of recorded answers, and the cassette is
//! refused (naming the slot) if any loaded secret is still in it, raw,
//! base64- or URL-encoded.

use crate::options::SandboxArgs;
use anyhow::{Context, bail};
use capstan_runtime::tape::{Cassette, Tape};
use capstan_runtime::types::{Deletion, Machine, MachineStatus};
use capstan_runtime::{Credential, Grants};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// The provider exports a session may call, in the order given.
pub(crate) const CALLS: [&str; 5] = ["validate", "create", "get", "delete", "list-instances"];

/// Arguments of `capstan plugin record`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:
  SIM_TOKEN=… capstan plugin record sim_provider.wasm --cassette sim.yaml \\
      --config '{\"endpoint\":\"http://127.0.0.1:8787\"}' --allow-host 127.0.0.1:8787 \\
      --bearer-from-env sim-cloud=SIM_TOKEN --calls create,get,delete
  capstan plugin replay sim_provider.wasm --cassette sim.yaml --allow-host 127.0.0.1:8787")]
pub struct RecordArgs {
    /// The provider plugin component (`.wasm`).
    pub path: PathBuf,
    /// Where to write the cassette (YAML). Not written if the session fails
    /// or a secret would be in it.
    #[arg(long)]
    pub cassette: PathBuf,
    /// The machine's provider config (JSON object) for every call.
    #[arg(long)]
    pub config: String,
    /// The calls to make, in order: validate, create, get, delete,
    /// list-instances. `get` and `delete` use the provider ID `create` returned.
    #[arg(long, value_delimiter = ',', default_value = "create,get,delete")]
    pub calls: Vec<String>,
    /// The machine's name (its uid is derived from it, so a re-recording is
    /// idempotent at the cloud).
    #[arg(long, default_value = "machine-1")]
    pub machine: String,
    /// Blank this field of every recorded JSON answer (a JSON pointer such
    /// as `/credentials/token`). Repeatable.
    #[arg(long = "redact-json", value_name = "POINTER")]
    pub redact_json: Vec<String>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// Arguments of `capstan plugin replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The provider plugin component (`.wasm`).
    pub path: PathBuf,
    /// The cassette to replay.
    #[arg(long)]
    pub cassette: PathBuf,
    /// Take recorded requests in their recorded order only (by default,
    /// requests match by key in any order, first in first out per key).
    #[arg(long)]
    pub strict_order: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

pub(crate) fn machine(name: &str, config: &str) -> Machine {
    Machine {
        name: name.to_string(),
        namespace: "default".into(),
        uid: format!("capstan-recorded-{name}"),
        cluster_name: None,
        labels: vec![],
        version: None,
        failure_domain: None,
        provider_config: config.to_string(),
        infrastructure_config: None,
        provider_id: None,
    }
}

/// Where a plugin's log lines are gathered while a session runs.
pub(crate) type LogBuffer = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// What one call of a session gave.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) call: String,
    pub(crate) result: Result<serde_json::Value, capstan_runtime::Error>,
    /// The call's log lines, when a log buffer was given.
    pub(crate) logs: Vec<String>,
}

impl Outcome {
    /// One JSON line: the result, or the plugin's contract error.
    fn line(&self) -> Option<serde_json::Value> {
        match &self.result {
            Ok(result) => Some(serde_json::json!({ "call": self.call, "result": result })),
            Err(e) => e.plugin_error().map(|pe| {
                serde_json::json!({ "call": self.call, "error": capstan_runtime::describe(pe) })
            }),
        }
    }
}

/// Run a session's calls for one machine, in order; `get` and `delete`
/// use the provider ID `create` returned.
pub(crate) async fn run_calls(
    provider: &capstan_runtime::ProviderPlugin,
    calls: &[String],
    mut m: Machine,
    logs: Option<&LogBuffer>,
) -> anyhow::Result<Vec<Outcome>> {
    let mut out = Vec::new();
    for call in calls {
        let result: Result<serde_json::Value, capstan_runtime::Error> = match call.as_str() {
            "validate" => provider
                .validate(&m.provider_config)
                .await
                .map(|()| serde_json::Value::Null),
            "create" => provider.create(&m, None).await.map(|s| {
                m.provider_id = Some(s.provider_id.clone());
                status_json(&s)
            }),
            "get" => provider.get(&m).await.map(|s| status_json(&s)),
            "delete" => provider.delete(&m).await.map(|d| match d {
                Deletion::Done => serde_json::json!("done"),
                Deletion::InProgress(ms) => serde_json::json!({ "inProgressMs": ms }),
            }),
            "list-instances" => provider.list(&m.provider_config).await.map(|l| {
                serde_json::Value::Array(l.unwrap_or_default().iter().map(status_json).collect())
            }),
            other => bail!(
                "`{other}` is not a call a session makes: {}",
                CALLS.join(", ")
            ),
        };
        let logs = logs
            .map(|b| std::mem::take(&mut *b.lock().unwrap_or_else(|p| p.into_inner())))
            .unwrap_or_default();
        out.push(Outcome {
            call: call.clone(),
            result,
            logs,
        });
    }
    Ok(out)
}

/// Run a session and print one JSON line per call; anything but a result
/// or a contract error stops it.
async fn session(
    provider: &capstan_runtime::ProviderPlugin,
    calls: &[String],
    m: Machine,
) -> anyhow::Result<()> {
    for outcome in run_calls(provider, calls, m, None).await? {
        match outcome.line() {
            Some(line) => println!("{line}"),
            None => {
                let call = outcome.call;
                return Err(outcome.result.expect_err("a line for every result"))
                    .with_context(|| format!("the {call} call failed"));
            }
        }
    }
    Ok(())
}

fn status_json(s: &MachineStatus) -> serde_json::Value {
    serde_json::json!({
        "providerID": s.provider_id,
        "state": format!("{:?}", s.state),
        "addresses": s.addresses.iter().map(|a| format!("{:?} {}", a.kind, a.address)).collect::<Vec<_>>(),
        "failureDomain": s.failure_domain,
        "version": s.version,
        "message": s.message,
    })
}

/// Every secret the grants hold, by slot: what must never be in a cassette.
fn loaded_secrets(grants: &Grants) -> BTreeMap<String, Vec<String>> {
    grants
        .credentials
        .iter()
        .map(|(slot, credential)| {
            let values = match credential {
                Credential::Bearer(token) => vec![token.clone()],
                Credential::Basic { username, password } => {
                    vec![password.clone(), format!("{username}:{password}")]
                }
                Credential::AwsSigV4 { credentials, .. } => {
                    let mut v = vec![
                        credentials.access_key_id.clone(),
                        credentials.secret_access_key.clone(),
                    ];
                    v.extend(credentials.session_token.clone());
                    v
                }
            };
            (slot.clone(), values)
        })
        .collect()
}

fn redact(cassette: &mut Cassette, pointers: &[String]) -> anyhow::Result<()> {
    for pointer in pointers {
        if !pointer.starts_with('/') {
            bail!(
                "--redact-json {pointer}: a JSON pointer starts with '/' (for example /credentials/token)"
            );
        }
    }
    for call in &mut cassette.calls {
        for x in &mut call.interactions {
            let Some(text) = &x.response.body.body else {
                continue;
            };
            let Ok(mut value) = serde_json::from_str::<serde_json::Value>(text) else {
                continue;
            };
            let mut changed = false;
            for pointer in pointers {
                if let Some(field) = value.pointer_mut(pointer) {
                    *field = serde_json::Value::String("REDACTED".into());
                    changed = true;
                }
            }
            if changed {
                x.response.body.body = Some(value.to_string());
            }
        }
    }
    Ok(())
}

/// `capstan plugin record`.
pub async fn record(args: RecordArgs) -> anyhow::Result<ExitCode> {
    let config: serde_json::Value =
        serde_json::from_str(&args.config).context("--config is not valid JSON")?;
    anyhow::ensure!(
        config.is_object(),
        "--config must be a JSON object, got {config}"
    );
    let grants = args.sandbox.grants()?;
    let secrets = loaded_secrets(&grants);
    let runtime = crate::options::one_shot_runtime(2)?;
    let tape = Tape::record();
    let provider = runtime
        .load_file(&args.path, args.sandbox.limits(), grants)?
        .with_tape(Some(tape.clone()))
        .provider()?;
    session(&provider, &args.calls, machine(&args.machine, &args.config)).await?;
    let mut cassette = tape.cassette();
    cassette.meta = BTreeMap::from([
        ("config".to_string(), args.config.clone()),
        ("machine".to_string(), args.machine.clone()),
        ("calls".to_string(), args.calls.join(",")),
    ]);
    redact(&mut cassette, &args.redact_json)?;
    let text = serde_yaml::to_string(&cassette).context("cannot write the cassette as YAML")?;
    let leaked = capstan_runtime::tape::secrets_in(&text, &secrets);
    if !leaked.is_empty() {
        bail!(
            "refusing to write {}: the secret of credential slot(s) {} is in what the plugin sent or received; find where with --redact-json, or keep the secret out of the plugin's config",
            args.cassette.display(),
            leaked.join(", ")
        );
    }
    std::fs::write(&args.cassette, text)
        .with_context(|| format!("cannot write {}", args.cassette.display()))?;
    let requests: usize = cassette.calls.iter().map(|c| c.interactions.len()).sum();
    eprintln!(
        "recorded {} calls and {requests} requests of {} to {}",
        cassette.calls.len(),
        cassette.plugin,
        args.cassette.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `capstan plugin replay`.
pub async fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.cassette)
        .with_context(|| format!("cannot read {}", args.cassette.display()))?;
    let cassette: Cassette = serde_yaml::from_str(&text)
        .with_context(|| format!("{} is not a cassette", args.cassette.display()))?;
    let meta = |k: &str| {
        cassette.meta.get(k).cloned().with_context(|| {
            format!(
                "{}: the cassette has no `meta.{k}`",
                args.cassette.display()
            )
        })
    };
    let (config, name, calls) = (meta("config")?, meta("machine")?, meta("calls")?);
    let calls: Vec<String> = calls.split(',').map(str::to_string).collect();
    let grants = args.sandbox.grants()?;
    anyhow::ensure!(
        grants.credentials.is_empty(),
        "replay needs no credential: drop --bearer-from-env and --aws-sigv4-from-env"
    );
    let runtime = crate::options::one_shot_runtime(2)?;
    let plugin = runtime.load_file(&args.path, args.sandbox.limits(), grants)?;
    if plugin.digest() != cassette.digest {
        eprintln!(
            "note: recorded with {} {}, replaying {}",
            cassette.plugin,
            cassette.digest,
            plugin.digest()
        );
    }
    let tape = Tape::replay(cassette, args.strict_order);
    let provider = plugin.with_tape(Some(tape.clone())).provider()?;
    session(&provider, &calls, machine(&name, &config)).await?;
    let unused = tape.unused();
    if !unused.is_empty() {
        let list: Vec<String> = unused
            .iter()
            .map(|(call, key)| format!("call {}: {key}", call + 1))
            .collect();
        bail!(
            "{} recorded interaction(s) were never asked for: {}",
            list.len(),
            list.join("; ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
