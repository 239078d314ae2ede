//! `capstan`: the Capstan command line.
//!
//! Subcommands live in their own modules: `plugin inspect` ([`inspect`]),
//! `plugin conformance` ([`conformance`]), `plugin annotate` ([`annotate`]), `plugin new` ([`scaffold`]), `plugin record|replay` ([`tape`]), `plugin test` ([`suite`]), `plugin push|pull|sign|verify`
//! and `key generate` ([`distribute`]), `bundle` ([`bundle`]), `crds`,
//! `controller` ([`controller`])
//! and `rollout` ([`rollout`]: status, pause, resume, restart, history, undo, plan), `describe`
//! ([`describe`]), `completion`, `install` and `uninstall` ([`install`]). Shared flag types (grants, limits, output
//! format) are in [`options`]; registry and trust flags in [`supply`]; kubectl's
//! `--kubeconfig`/`--context`/`-n` and `KIND/NAME` references in [`connect`].
//! The binary also runs as the kubectl plugin `kubectl-capstan`.

#![forbid(unsafe_code)]

mod addon;
mod annotate;
mod bundle;
mod canary;
mod conformance;
mod connect;
mod controller;
mod describe;
mod distribute;
mod inspect;
mod install;
mod machines;
mod options;
mod rollout;
mod scaffold;
mod suite;
mod supply;
mod tape;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Capstan: the Cluster API machine lifecycle, with every provider running as
/// a sandboxed WebAssembly plugin.
#[derive(Debug, Parser)]
#[command(name = "capstan", version, propagate_version = true)]
struct Cli {
    /// Log format for diagnostics on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "human",
        env = "CAPSTAN_LOG_FORMAT"
    )]
    log_format: options::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with plugins: inspect, check against the contract, push, pull,
    /// sign and verify.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Signing keys (cosign format).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Air-gap bundles: signed plugins and their trust policy in one file.
    #[command(subcommand)]
    Bundle(bundle::Command),
    /// Print the CustomResourceDefinitions (`capstan crds | kubectl apply -f -`).
    Crds,
    /// Run the controllers (Plugin, Machine, MachineSet, MachineDeployment, MachineHealthCheck)
    /// against a Kubernetes API until SIGINT/SIGTERM.
    Controller(Box<controller::Args>),
    /// Print (or --apply) everything to run Capstan in a cluster: CRDs,
    /// namespace, least-privilege RBAC and a Deployment of leader-elected
    /// replicas (`capstan install | kubectl apply -f -`).
    Install(install::InstallArgs),
    /// Remove what `install` created; refuses while Machines still hold
    /// finalizers unless --force.
    Uninstall(install::UninstallArgs),
    /// Follow and steer MachineDeployment rollouts: status, pause, resume,
    /// restart, history, undo, plan.
    #[command(subcommand)]
    Rollout(rollout::Command),
    /// Show a MachineDeployment, MachineSet, Machine or Addon as a tree:
    /// each object's Ready/Available/UpToDate, phase and what is wrong,
    /// the Node and serving plugin of each Machine, and the last Events.
    Describe(describe::Args),
    /// Print a shell completion script: `source <(capstan completion bash)`.
    Completion(CompletionArgs),
    /// Addons: `capstan addon render ADDON.yaml --plugin PATH` prints what
    /// an Addon would apply.
    #[command(subcommand)]
    Addon(addon::Command),
    /// Machines: `capstan machines orphans` lists instances no Machine owns.
    #[command(subcommand)]
    Machines(machines::Command),
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Show a plugin's manifest, world, contract version and digest: a local
    /// `.wasm` (also imports and exports), or `oci://…` (also each signature
    /// and whether it verifies under --key/--policy; nothing is downloaded
    /// but the manifest and signatures).
    Inspect(inspect::Args),
    /// Run the contract's conformance checks against a plugin and a live target.
    Conformance(conformance::Args),
    /// Run a provider's calls for one machine against its real cloud and
    /// record what the plugin sent and received (never a credential) into a
    /// cassette.
    Record(tape::RecordArgs),
    /// Run the recorded calls again from a cassette: no cloud, no
    /// credential, the plugin's clocks and randomness as recorded.
    Replay(tape::ReplayArgs),
    /// Run a provider's test cases offline (`kind: PluginTest`): recorded
    /// cassettes or inline stubs, with expected results, errors and request
    /// counts; text, JSON or JUnit output.
    Test(suite::Args),
    /// Start a new plugin project in Rust, Python or JavaScript from the
    /// sample for its world: buildable, with tests.
    New(scaffold::Args),
    /// Embed a manifest into a component built by any toolchain (Python,
    /// JavaScript, …), check it against the component's exports and
    /// imports, and say what the sandbox gives each import.
    Annotate(annotate::Args),
    /// Push a component to a registry as an OCI artifact (CNCF Wasm layout);
    /// prints the manifest digest.
    Push(distribute::PushArgs),
    /// Pull a component, verified by --key/--identity/--policy before it is
    /// downloaded.
    Pull(distribute::PullArgs),
    /// Sign a plugin in a registry (cosign `.sig`, appended to existing signatures).
    Sign(distribute::SignArgs),
    /// Check a plugin's signatures against --key, --identity (keyless, offline,
    /// with --trusted-root) or --policy.
    Verify(distribute::VerifyArgs),
    /// Store a Sigstore bundle made by another tool as an OCI referrer of a
    /// plugin, where `verify` and the controller find it.
    Attach(distribute::AttachArgs),
    /// End a Plugin's canary now: serve its revision to every Machine
    /// (`spec.rollout.strategy: Canary`); waits for the controller.
    Promote(canary::Args),
    /// Roll a Plugin's canary back now: every Machine is served by the
    /// revision before it, and its digest is never tried again.
    Abort(canary::Args),
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Create a cosign-format key pair: PREFIX.key (encrypted with
    /// $CAPSTAN_PASSWORD or a prompted password) and PREFIX.pub.
    Generate(distribute::KeyGenerateArgs),
}

/// `capstan … | head` closes the pipe early: end quietly with the shell's
/// code for SIGPIPE (128 + 13), as command-line tools do, instead of a
/// panic and a stack trace from `println!`.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = parse_command_line();
    options::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Plugin(PluginCommand::Inspect(args)) => inspect::run(args).await,
            Command::Plugin(PluginCommand::Promote(args)) => {
                canary::run(canary::Verb::Promote, args).await
            }
            Command::Plugin(PluginCommand::Abort(args)) => {
                canary::run(canary::Verb::Abort, args).await
            }
            Command::Plugin(PluginCommand::Conformance(args)) => conformance::run(args).await,
            Command::Plugin(PluginCommand::Annotate(args)) => annotate::run(args),
            Command::Plugin(PluginCommand::New(args)) => scaffold::run(args),
            Command::Plugin(PluginCommand::Record(args)) => tape::record(args).await,
            Command::Plugin(PluginCommand::Test(args)) => suite::run(args).await,
            Command::Plugin(PluginCommand::Replay(args)) => tape::replay(args).await,
            Command::Plugin(PluginCommand::Push(args)) => {
                blocking(move || distribute::push(args)).await
            }
            Command::Plugin(PluginCommand::Pull(args)) => {
                blocking(move || distribute::pull(args)).await
            }
            Command::Plugin(PluginCommand::Sign(args)) => {
                blocking(move || distribute::sign(args)).await
            }
            Command::Plugin(PluginCommand::Attach(args)) => {
                blocking(move || distribute::attach(args)).await
            }
            Command::Plugin(PluginCommand::Verify(args)) => {
                blocking(move || distribute::verify(args)).await
            }
            Command::Key(KeyCommand::Generate(args)) => distribute::key_generate(args),
            Command::Bundle(bundle::Command::Create(args)) => {
                blocking(move || bundle::create(args)).await
            }
            Command::Bundle(bundle::Command::Verify(args)) => {
                blocking(move || bundle::verify(args)).await
            }
            Command::Bundle(bundle::Command::Push(args)) => {
                blocking(move || bundle::push(args)).await
            }
            Command::Crds => {
                print!("{}", capstan_api::crds_yaml());
                Ok(ExitCode::SUCCESS)
            }
            Command::Controller(args) => controller::run(*args).await,
            Command::Install(args) => install::install(args).await,
            Command::Uninstall(args) => install::uninstall(args).await,
            Command::Rollout(rollout::Command::Status(args)) => rollout::status::run(args).await,
            Command::Rollout(rollout::Command::Pause(target)) => {
                rollout::control::run(rollout::control::Verb::Pause, target).await
            }
            Command::Rollout(rollout::Command::Resume(target)) => {
                rollout::control::run(rollout::control::Verb::Resume, target).await
            }
            Command::Rollout(rollout::Command::Restart(target)) => {
                rollout::control::run(rollout::control::Verb::Restart, target).await
            }
            Command::Rollout(rollout::Command::History(args)) => rollout::history(args).await,
            Command::Rollout(rollout::Command::Undo(args)) => rollout::undo(args).await,
            Command::Rollout(rollout::Command::Plan(args)) => rollout::plan(args).await,
            Command::Describe(args) => describe::run(args).await,
            Command::Completion(args) => {
                completion(args.shell);
                Ok(ExitCode::SUCCESS)
            }
            Command::Addon(addon::Command::Render(args)) => addon::render(args).await,
            Command::Addon(addon::Command::Updates(args)) => addon::updates(args).await,
            Command::Machines(machines::Command::Orphans(args)) => machines::orphans(args).await,
        }
    });
    // Every command has awaited its own work by now. What is left are
    // detached tasks (watches, pooled connections) and, at worst, a
    // blocking thread stuck in a syscall: none of them may hold up the
    // exit a supervisor waits for after SIGTERM.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command line, with help and errors naming the command as the user
/// typed it: `kubectl capstan` when run as the kubectl plugin
/// `kubectl-capstan`.
fn parse_command_line() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let invoked = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let mut command = Cli::command();
    if invoked.as_deref() == Some("kubectl-capstan") {
        command = command.bin_name("kubectl capstan");
    }
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Flags of `completion`.
#[derive(Debug, clap::Args)]
struct CompletionArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

/// The completion script for `shell`, for the name the binary runs under
/// (`capstan`, or `kubectl-capstan` as a kubectl plugin).
fn completion(shell: clap_complete::Shell) {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "capstan", &mut script);
    // print! (not a writer of clap's) so a closed pipe ends quietly.
    print!("{}", String::from_utf8_lossy(&script));
}

/// Registry work is blocking I/O: keep it off the async workers.
async fn blocking(
    f: impl FnOnce() -> anyhow::Result<ExitCode> + Send + 'static,
) -> anyhow::Result<ExitCode> {
    tokio::task::spawn_blocking(f).await?
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
