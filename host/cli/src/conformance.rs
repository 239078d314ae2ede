//! `capstan plugin conformance PATH --world provider --config JSON`: run the
//! contract checks of `capstan-conformance` against a plugin and print the
//! report; exit 1 when any check fails.

use crate::options::{Output, SandboxArgs, parse_duration};
use anyhow::{Context, bail};
use capstan_manifest::World;
use capstan_runtime::{Runtime, RuntimeConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `capstan plugin conformance`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example, against a simulated cloud on 127.0.0.1:8787:\n  \
    SIM_TOKEN=s3cret capstan plugin conformance sim_provider.wasm --world provider \\\n    \
    --config '{\"endpoint\":\"http://127.0.0.1:8787\"}' --allow-host 127.0.0.1:8787 \\\n    \
    --bearer-from-env sim-cloud=SIM_TOKEN"
)]
pub struct Args {
    /// Path of the plugin component (`.wasm`).
    pub path: PathBuf,
    /// The world to check (only `provider` has a conformance suite so far).
    #[arg(long, default_value = "provider")]
    pub world: String,
    /// A valid provider config (JSON object) pointing at a live target.
    #[arg(long)]
    pub config: String,
    /// A config the plugin must reject with invalid-config. Repeatable;
    /// default `[]` (a provider config is always a JSON object).
    #[arg(long = "invalid-config", value_name = "JSON")]
    pub invalid_configs: Vec<String>,
    /// Time budget for the whole run (waiting for running, deletion, retries).
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub timeout: Duration,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run the command.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let world: World = args.world.parse()?;
    if world != World::Provider {
        bail!("--world {world}: only the provider world has a conformance suite so far");
    }
    let config: serde_json::Value =
        serde_json::from_str(&args.config).context("--config is not valid JSON")?;
    if !config.is_object() {
        bail!("--config must be a JSON object, got {config}");
    }
    for invalid in &args.invalid_configs {
        serde_json::from_str::<serde_json::Value>(invalid)
            .with_context(|| format!("--invalid-config {invalid} is not valid JSON"))?;
    }
    let runtime = Runtime::new(RuntimeConfig {
        max_concurrent_calls: 4,
        ..Default::default()
    })?;
    let plugin = runtime.load_file(&args.path, args.sandbox.limits(), args.sandbox.grants()?)?;
    let provider = plugin.provider()?;
    let mut options = capstan_conformance::Options::new(args.config.clone());
    if !args.invalid_configs.is_empty() {
        options.invalid_configs = args.invalid_configs.clone();
    }
    options.timeout = args.timeout;
    let report = capstan_conformance::run_provider(&provider, &options).await;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => print!("{}", report.render_text()),
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
