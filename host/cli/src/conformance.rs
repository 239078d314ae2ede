//! `capstan plugin conformance PATH --world provider|updater|addon|bootstrap --config JSON`:
//! run the contract checks of `capstan-conformance` against a plugin and
//! print the report; exit 1 when any check fails. An updater is checked
//! against an instance that `--provider` creates.

use crate::options::{Output, SandboxArgs, parse_duration};
use anyhow::{Context, bail};
use capstan_manifest::World;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `capstan plugin conformance`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example, against a simulated cloud on 127.0.0.1:8787:\n  \
    SIM_TOKEN=s3cret capstan plugin conformance sim_provider.wasm --world provider \\\n    \
    --config '{\"endpoint\":\"http://127.0.0.1:8787\"}' --allow-host 127.0.0.1:8787 \\\n    \
    --bearer-from-env sim-cloud=SIM_TOKEN\n\n\
    An updater, against an instance sim_provider.wasm creates:\n  \
    SIM_TOKEN=s3cret capstan plugin conformance sim_updater.wasm --world updater \\\n    \
    --provider sim_provider.wasm --config '{\"endpoint\":\"http://127.0.0.1:8787\"}' \\\n    \
    --current-version v1.30.0 --desired-version v1.31.0 --allow-host 127.0.0.1:8787 \\\n    \
    --bearer-from-env sim-cloud=SIM_TOKEN\n\n\
    An addon plugin (no cluster needed):\n  \
    capstan plugin conformance coredns_addon.wasm --world addon --config '{\"replicas\":1}'\n\n\
    A bootstrap plugin (no cluster needed):\n  \
    capstan plugin conformance kubeadm_bootstrap.wasm --world bootstrap \\\n    \
    --config '{\"preKubeadmCommands\":[\"swapoff -a\"]}' --invalid-config '{\"files\":[{\"path\":\"x\",\"content\":\"\"}]}'"
)]
pub struct Args {
    /// Path of the plugin component (`.wasm`).
    pub path: PathBuf,
    /// The world to check: `provider`, `updater`, `addon` or `bootstrap`.
    #[arg(long, default_value = "provider")]
    pub world: String,
    /// A valid provider config (JSON object) pointing at a live target.
    /// For an updater: the config the test instance is created with. For an
    /// addon or a bootstrap plugin: the config to render with (default
    /// `{}`).
    #[arg(long)]
    pub config: Option<String>,
    /// Updaters: the provider plugin (`.wasm`) that creates (and at the
    /// end deletes) the instance the updater changes. It gets the same
    /// sandbox grants.
    #[arg(long, value_name = "PATH")]
    pub provider: Option<PathBuf>,
    /// Updaters: the provider config after the change (default: --config).
    #[arg(long, value_name = "JSON")]
    pub desired_config: Option<String>,
    /// Updaters: the version the instance is created with.
    #[arg(long, default_value = "v1.30.0")]
    pub current_version: String,
    /// Updaters: the version after the change.
    #[arg(long, default_value = "v1.31.0")]
    pub desired_version: String,
    /// A config the plugin must reject with invalid-config. Repeatable;
    /// default `[]` (a provider config is always a JSON object).
    #[arg(long = "invalid-config", value_name = "JSON")]
    pub invalid_configs: Vec<String>,
    /// Time budget for the whole run (waiting for running, deletion, retries).
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub timeout: Duration,
    /// Providers (contract 0.2.0): a shell command that prints the user data
    /// the cloud launched the test instance with (the bytes, or their
    /// base64), read from the cloud's own API. It runs with
    /// CAPSTAN_PROVIDER_ID and CAPSTAN_INSTANCE_ID (the provider ID's last
    /// `/` segment) set, for at most 30 s, e.g. `aws ec2
    /// describe-instance-attribute --instance-id "$CAPSTAN_INSTANCE_ID"
    /// --attribute userData --query UserData.Value --output text`. The kit
    /// then checks that the instance got exactly the bootstrap data
    /// `create` passed; without it, that check is skipped.
    #[arg(long, value_name = "COMMAND")]
    pub user_data_command: Option<String>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run the command.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let world: World = args.world.parse()?;
    let config_text = match (&args.config, world) {
        (Some(c), _) => c.clone(),
        (None, World::Addon | World::Bootstrap) => "{}".to_string(),
        (None, _) => bail!(
            "--config is required for the {world} world: a valid provider config (JSON object) pointing at a live target"
        ),
    };
    if world == World::Updater && args.provider.is_none() {
        bail!(
            "--world updater needs --provider PATH: a provider plugin that creates the instance the updater changes"
        );
    }
    if let Some(desired) = &args.desired_config {
        let value: serde_json::Value =
            serde_json::from_str(desired).context("--desired-config is not valid JSON")?;
        if !value.is_object() {
            bail!("--desired-config must be a JSON object, got {value}");
        }
    }
    let config: serde_json::Value =
        serde_json::from_str(&config_text).context("--config is not valid JSON")?;
    if !config.is_object() {
        bail!("--config must be a JSON object, got {config}");
    }
    for invalid in &args.invalid_configs {
        serde_json::from_str::<serde_json::Value>(invalid)
            .with_context(|| format!("--invalid-config {invalid} is not valid JSON"))?;
    }
    let runtime = crate::options::one_shot_runtime(4)?;
    let plugin = runtime.load_file(&args.path, args.sandbox.limits(), args.sandbox.grants()?)?;
    if world == World::Addon {
        let report = capstan_conformance::run_addon(&plugin.addon()?, &config_text).await;
        return print_report(&report, args.output);
    }
    if world == World::Bootstrap {
        let report = capstan_conformance::run_bootstrap(
            &plugin.bootstrap()?,
            &config_text,
            &args.invalid_configs,
        )
        .await;
        return print_report(&report, args.output);
    }
    if world == World::Updater {
        let updater = plugin.updater()?;
        let provider_path = args.provider.as_ref().expect("checked above");
        let provider = runtime
            .load_file(provider_path, args.sandbox.limits(), args.sandbox.grants()?)
            .with_context(|| format!("--provider {}", provider_path.display()))?
            .provider()
            .with_context(|| format!("--provider {}", provider_path.display()))?;
        let options = capstan_conformance::UpdaterOptions {
            config: config_text.clone(),
            desired_config: args.desired_config.clone(),
            version: args.current_version.clone(),
            desired_version: args.desired_version.clone(),
            timeout: args.timeout,
        };
        let report = capstan_conformance::run_updater(&updater, &provider, &options).await;
        return print_report(&report, args.output);
    }
    let provider = plugin.provider()?;
    let mut options = capstan_conformance::Options::new(config_text);
    if !args.invalid_configs.is_empty() {
        options.invalid_configs = args.invalid_configs.clone();
    }
    options.timeout = args.timeout;
    if let Some(command) = args.user_data_command.clone() {
        options.user_data_probe = Some(capstan_conformance::UserDataProbe(std::sync::Arc::new(
            move |provider_id: &str| run_probe(&command, provider_id),
        )));
    }
    let report = capstan_conformance::run_provider(&provider, &options).await;
    print_report(&report, args.output)
}

/// How long `--user-data-command` may run.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Run `--user-data-command` for one instance; its stdout.
fn run_probe(command: &str, provider_id: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let instance_id = provider_id.rsplit('/').next().unwrap_or(provider_id);
    let mut child = std::process::Command::new("sh")
        .args(["-c", command])
        .env("CAPSTAN_PROVIDER_ID", provider_id)
        .env("CAPSTAN_INSTANCE_ID", instance_id)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("--user-data-command: cannot run sh: {e}"))?;
    // Read while it runs, so a large output cannot block it on a full pipe.
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).map(|_| out)
    });
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > PROBE_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "--user-data-command did not finish within {PROBE_TIMEOUT:?}"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("--user-data-command: {e}")),
        }
    };
    let stdout = reader
        .join()
        .map_err(|_| "--user-data-command: reading its output failed".to_string())?
        .map_err(|e| format!("--user-data-command: reading its output: {e}"))?;
    if !status.success() {
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        let stderr: String = stderr.trim().chars().take(500).collect();
        return Err(format!(
            "--user-data-command exited with {status}: {stderr}"
        ));
    }
    Ok(stdout)
}

fn print_report(report: &capstan_conformance::Report, output: Output) -> anyhow::Result<ExitCode> {
    match output {
        format @ (Output::Json | Output::Yaml) => format.print(&report)?,
        Output::Text => print!("{}", report.render_text()),
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
