//! `capstan`: the Capstan command line.
//!
//! Subcommands live in their own modules: `plugin inspect` ([`inspect`]),
//! `plugin conformance` ([`conformance`]), `bench plugin` ([`bench`]) and
//! `demo` ([`demo`]), `crds`, `controller` ([`controller`]) and `rollout`
//! ([`rollout`]). Shared flag types (grants, limits, output format) are
//! in [`options`].

#![forbid(unsafe_code)]

mod bench;
mod conformance;
mod controller;
mod demo;
mod inspect;
mod native;
mod options;
mod rollout;

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
    /// Work with plugin components: inspect them, check them against the contract.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Benchmarks that print `name value` lines.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run the sim-provider plugin against a local simulated cloud: create
    /// machines, follow them until running, then delete them.
    Demo(demo::Args),
    /// Print the CustomResourceDefinitions (`capstan crds | kubectl apply -f -`).
    Crds,
    /// Run the controllers (Plugin, Machine, MachineSet, MachineDeployment)
    /// against a Kubernetes API until SIGINT/SIGTERM.
    Controller(controller::Args),
    /// Inspect and roll back MachineDeployment rollouts.
    #[command(subcommand)]
    Rollout(rollout::Command),
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Show a plugin's manifest, world, contract version, imports, exports and digest.
    Inspect(inspect::Args),
    /// Run the contract's conformance checks against a plugin and a live target.
    Conformance(conformance::Args),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Plugin runtime costs, side by side with native and webhook calls.
    Plugin(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
            Command::Plugin(PluginCommand::Conformance(args)) => conformance::run(args).await,
            Command::Bench(BenchCommand::Plugin(args)) => bench::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Crds => {
                print!("{}", capstan_api::crds_yaml());
                Ok(ExitCode::SUCCESS)
            }
            Command::Controller(args) => controller::run(args).await,
            Command::Rollout(rollout::Command::History(args)) => rollout::history(args).await,
            Command::Rollout(rollout::Command::Undo(args)) => rollout::undo(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
