//! `capstan rollout …` on a MachineDeployment: `status` waits for a
//! rollout as `kubectl rollout status` does ([`status`]); `pause`, `resume`
//! and `restart` steer it ([`control`]); `history` and `undo` list its
//! revisions and roll back to one (Cluster API dropped rollback; this brings
//! it back the way `kubectl rollout undo` works for Deployments; the logic
//! is `capstan_controllers::history`); `plan` prints what an in-place
//! rollout does with each machine (the controller's plan, from the
//! deployment's status).

pub mod control;
pub mod status;

use anyhow::bail;
use capstan_controllers::history;
use std::process::ExitCode;

/// Which deployment, and where.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The deployment: `md/NAME`, `machinedeployment/NAME` or `NAME`.
    #[arg(value_parser = crate::connect::deployment_reference)]
    pub deployment: String,
    #[command(flatten)]
    pub connection: crate::connect::Connection,
}

impl Target {
    /// The deployment's name, a client and the namespace.
    async fn open(&self) -> anyhow::Result<(String, kube::Client, String)> {
        use crate::connect::{Kind, parse_reference};
        let (_, name) = parse_reference(
            &self.deployment,
            Some(Kind::MachineDeployment),
            &[Kind::MachineDeployment],
        )?;
        let (client, namespace) = self.connection.connect().await?;
        Ok((name, client, namespace))
    }
}

/// `rollout` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Wait for a rollout to finish, printing its progress (exit 0 when
    /// complete; 1 with the reason when it fails: a progress deadline, an
    /// automatic rollback, a paused deployment, the timeout).
    Status(status::StatusArgs),
    /// Pause a rollout (`spec.paused: true`); scaling still applies.
    Pause(Target),
    /// Resume a paused rollout.
    Resume(Target),
    /// Replace every machine once, template unchanged (sets
    /// `spec.rollout.after` to now, as `clusterctl alpha rollout restart`).
    Restart(Target),
    /// List the revisions of a MachineDeployment (one per MachineSet kept).
    History(HistoryArgs),
    /// Roll a MachineDeployment back to an earlier revision's template.
    Undo(UndoArgs),
    /// Print the in-place plan of a MachineDeployment: per machine, which
    /// updater applies which changed fields, or what is replaced instead.
    /// To read it before anything happens: pause the deployment
    /// (`spec.paused: true`), change the template, run this, then unpause.
    Plan(PlanArgs),
}

/// Flags of `rollout plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    target: Target,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "text")]
    output: crate::options::Output,
    /// How long to wait for the controller to plan the current generation.
    #[arg(long, default_value = "30s", value_parser = crate::options::parse_duration)]
    timeout: std::time::Duration,
}

/// Flags of `rollout history`.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    target: Target,
    /// Output format.
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
    let (name, client, namespace) = args.target.open().await?;
    let revisions = history::history(&client, &namespace, &name).await?;
    match args.output {
        format @ (crate::options::Output::Json | crate::options::Output::Yaml) => {
            format.print(&revisions)?
        }
        crate::options::Output::Text => {
            println!("machinedeployment/{name}");
            println!(
                "{:<10} {:<32} {:<10} {:<9} CHANGE-CAUSE",
                "REVISION", "MACHINESET", "VERSION", "REPLICAS"
            );
            for r in &revisions {
                println!(
                    "{:<10} {:<32} {:<10} {:<9} {}{}{}",
                    r.revision,
                    r.machine_set,
                    r.version.as_deref().unwrap_or("<none>"),
                    r.replicas,
                    r.change_cause.as_deref().unwrap_or("<none>"),
                    if r.current { " (current)" } else { "" },
                    if r.rolled_back_from {
                        " (rolled back automatically)"
                    } else {
                        ""
                    },
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `rollout undo`.
pub async fn undo(args: UndoArgs) -> anyhow::Result<ExitCode> {
    let (name, client, namespace) = args.target.open().await?;
    match history::undo(&client, &namespace, &name, args.to_revision).await? {
        Some(revision) => println!("machinedeployment/{name} rolled back to revision {revision}"),
        None => println!("machinedeployment/{name} already runs that revision; nothing to do"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `rollout plan`.
pub async fn plan(args: PlanArgs) -> anyhow::Result<ExitCode> {
    use capstan_api::MachineDeployment;
    let (name, client, namespace) = args.target.open().await?;
    let api: kube::Api<MachineDeployment> = kube::Api::namespaced(client, &namespace);
    let deadline = std::time::Instant::now() + args.timeout;
    let md = loop {
        let md = api.get_opt(&name).await?.ok_or_else(|| {
            anyhow::anyhow!("machinedeployment/{name} not found in namespace {namespace}")
        })?;
        let seen = md.status.as_ref().and_then(|s| s.observed_generation);
        if seen == md.metadata.generation {
            break md;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the controller has not planned generation {} of machinedeployment/{name} within {:?}; is `capstan controller` running?",
                md.metadata.generation.unwrap_or(0),
                args.timeout
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    if md.spec.rollout_strategy().in_place.is_none() {
        bail!(
            "machinedeployment/{name} has no spec.rollout.strategy.inPlace: its rollouts replace machines; set spec.rollout.strategy.inPlace to update them in place"
        );
    }
    let status = md.status.clone().unwrap_or_default();
    let plan = status.in_place_plan.clone().unwrap_or_default();
    let condition = capstan_api::condition(
        &status.conditions,
        capstan_api::set_conditions::IN_PLACE_UPDATABLE,
    )
    .cloned();
    match args.output {
        format @ (crate::options::Output::Json | crate::options::Output::Yaml) => {
            format.print(&plan)?
        }
        crate::options::Output::Text => {
            let paused = if md.spec.paused { " (paused)" } else { "" };
            println!(
                "machinedeployment/{name}: revision {}{paused}: {}",
                status.revision.unwrap_or(0),
                if plan.decision.is_empty() {
                    "InPlace"
                } else {
                    &plan.decision
                }
            );
            if let Some(c) = &condition
                && !c.message.is_empty()
            {
                println!("  {}", c.message);
            }
            if plan.machines.is_empty() {
                println!("  no machine waits for an update");
            }
            for m in &plan.machines {
                println!("{:<36} {}", m.machine, m.action);
                for (i, step) in m.steps.iter().enumerate() {
                    println!(
                        "  {}. {:<24} {:<32} {}",
                        i + 1,
                        step.updater,
                        step.fields.join(", "),
                        disruption(step)
                    );
                }
                if !m.unclaimed.is_empty() {
                    let instead = if m.action == "Replace" {
                        "replaced instead"
                    } else {
                        "blocks the rollout"
                    };
                    println!("  unclaimed ({instead}): {}", m.unclaimed.join(", "));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a planned step does to the machine's workloads, as its updater
/// declares.
fn disruption(step: &capstan_api::PlannedStep) -> &'static str {
    match (step.drain, step.affects_availability.unwrap_or(true)) {
        (true, _) => "drains the Node first",
        (false, true) => "machine unavailable, no drain",
        (false, false) => "machine stays available",
    }
}
