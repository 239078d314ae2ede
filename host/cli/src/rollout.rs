//! `capstan rollout history|undo md/NAME`: list a MachineDeployment's
//! revisions and roll back to one (Cluster API dropped rollback; this brings
//! it back the way `kubectl rollout undo` works for Deployments). The logic
//! is `capstan_controllers::history`.

use anyhow::bail;
use capstan_controllers::history;
use std::path::PathBuf;
use std::process::ExitCode;

/// Which deployment, and where.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The deployment: `md/NAME`, `machinedeployment/NAME` or `NAME`.
    pub deployment: String,
    /// Namespace.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

impl Target {
    fn name(&self) -> anyhow::Result<&str> {
        let reference = self.deployment.as_str();
        let (kind, name) = reference.split_once('/').unwrap_or(("md", reference));
        if !["md", "machinedeployment", "machinedeployments"]
            .contains(&kind.to_ascii_lowercase().as_str())
        {
            bail!("{reference:?}: rollout works on MachineDeployments; write md/NAME");
        }
        if name.is_empty() {
            bail!("{reference:?}: the deployment name is missing; write md/NAME");
        }
        Ok(name)
    }
}

/// `rollout` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List the revisions of a MachineDeployment (one per MachineSet kept).
    History(HistoryArgs),
    /// Roll a MachineDeployment back to an earlier revision's template.
    Undo(UndoArgs),
}

/// Flags of `rollout history`.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    target: Target,
    /// `text` or `json`.
    #[arg(short, long, value_enum, default_value = "text")]
    output: crate::options::Output,
}

/// Flags of `rollout undo`.
#[derive(Debug, clap::Args)]
pub struct UndoArgs {
    #[command(flatten)]
    target: Target,
    /// The revision to return to (default: the one before the current).
    #[arg(long)]
    to_revision: Option<i64>,
}

/// `rollout history`.
pub async fn history(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let name = args.target.name()?;
    let client = crate::controller::client(args.target.kubeconfig.as_ref()).await?;
    let revisions = history::history(&client, &args.target.namespace, name).await?;
    match args.output {
        crate::options::Output::Json => println!("{}", serde_json::to_string_pretty(&revisions)?),
        crate::options::Output::Text => {
            println!("machinedeployment/{name}");
            println!(
                "{:<10} {:<32} {:<10} {:<9} CHANGE-CAUSE",
                "REVISION", "MACHINESET", "VERSION", "REPLICAS"
            );
            for r in &revisions {
                println!(
                    "{:<10} {:<32} {:<10} {:<9} {}{}",
                    r.revision,
                    r.machine_set,
                    r.version.as_deref().unwrap_or("<none>"),
                    r.replicas,
                    r.change_cause.as_deref().unwrap_or("<none>"),
                    if r.current { " (current)" } else { "" },
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `rollout undo`.
pub async fn undo(args: UndoArgs) -> anyhow::Result<ExitCode> {
    let name = args.target.name()?;
    let client = crate::controller::client(args.target.kubeconfig.as_ref()).await?;
    match history::undo(&client, &args.target.namespace, name, args.to_revision).await? {
        Some(revision) => println!("machinedeployment/{name} rolled back to revision {revision}"),
        None => println!("machinedeployment/{name} already runs that revision; nothing to do"),
    }
    Ok(ExitCode::SUCCESS)
}
