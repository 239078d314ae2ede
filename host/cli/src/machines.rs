//! `capstan machines orphans`: instances provider plugins list that no
//! Machine owns, as the Plugin controller last reported them
//! (`status.orphans`: two scans in a row, at most once per resync).

use anyhow::Context as _;
use capstan_api::Plugin;
use kube::api::Api;
use std::path::PathBuf;
use std::process::ExitCode;

/// `capstan machines …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List instances the provider plugins see that no Machine records
    /// (left running after a Machine's objects were lost, or launched
    /// outside Capstan). Exits 1 when there are any.
    Orphans(OrphansArgs),
}

/// Flags of `machines orphans`.
#[derive(Debug, clap::Args)]
pub struct OrphansArgs {
    /// Only this provider Plugin.
    #[arg(long)]
    pub plugin: Option<String>,
    /// Output format (`json` and `yaml`: each provider Plugin's
    /// `status.orphans`, by name).
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: crate::options::Output,
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Print each provider Plugin's orphans, or why it could not tell.
pub async fn orphans(args: OrphansArgs) -> anyhow::Result<ExitCode> {
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    let plugins: Vec<Plugin> = Api::<Plugin>::all(client)
        .list(&Default::default())
        .await
        .context("cannot list plugins")?
        .items;
    if args.output != crate::options::Output::Text {
        let reports: std::collections::BTreeMap<String, _> = plugins
            .iter()
            .filter_map(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                let report = p.status.as_ref()?.orphans.as_ref()?;
                args.plugin
                    .as_ref()
                    .is_none_or(|want| *want == name)
                    .then_some((name, report))
            })
            .collect();
        args.output.print(&reports)?;
        let any = reports.values().any(|r| r.count > 0);
        return Ok(if any {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let mut any = false;
    let mut shown = 0;
    for plugin in &plugins {
        let name = plugin.metadata.name.clone().unwrap_or_default();
        if args.plugin.as_ref().is_some_and(|p| *p != name) {
            continue;
        }
        let Some(report) = plugin.status.as_ref().and_then(|s| s.orphans.as_ref()) else {
            continue;
        };
        shown += 1;
        let since = report.since.0.to_string();
        if let Some(message) = &report.message {
            println!("{name}: the last scan could not tell: {message}");
        }
        if report.count == 0 {
            if report.message.is_none() {
                println!("{name}: no orphans (since {since})");
            }
            continue;
        }
        any = true;
        println!(
            "{name}: {} orphaned instance(s) (since {since}):",
            report.count
        );
        for id in &report.instances {
            println!("  {id}");
        }
        if report.count as usize > report.instances.len() {
            println!(
                "  … and {} more",
                report.count as usize - report.instances.len()
            );
        }
    }
    if shown == 0 {
        match &args.plugin {
            Some(p) => println!(
                "plugin {p:?} has no orphan report (not a provider, no Machines use it, or not scanned yet)"
            ),
            None => println!(
                "no provider Plugin has an orphan report yet (they scan once their Machines exist, every resync)"
            ),
        }
    }
    Ok(if any {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
