//! `capstan addon updates`: the newer versions Addons' channels offer,
//! beside what is applied and each Addon's update policy, read from the
//! Addons' status (`availableVersion`, which the controller fills from the
//! signed plugin it loaded, so this works in an air gap too).

use capstan_api::Addon;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `capstan addon updates`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  capstan addon updates                 # Addons with a newer version available, every namespace
  capstan addon updates -n monitoring --all -o json
Apply one by setting its spec.version (kubectl patch addon NAME --type merge -p '{\"spec\":{\"version\":\"1.8.2\"}}').")]
pub struct UpdatesArgs {
    /// Only this namespace (default: every namespace).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Every Addon, also those whose applied version is the newest.
    #[arg(long)]
    pub all: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: crate::options::Output,
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// One Addon's line.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Line {
    namespace: String,
    name: String,
    policy: String,
    channel: Option<String>,
    applied: Option<String>,
    available: Option<String>,
    /// Digest of the plugin revision that offers `available`.
    offered_by: Option<String>,
    update_available: bool,
}

fn line(addon: &Addon) -> Line {
    let status = addon.status.clone().unwrap_or_default();
    let update_available = match (&status.available_version, &status.version) {
        (Some(a), Some(v)) => capstan_addons::version_order(a, v) == std::cmp::Ordering::Greater,
        (Some(_), None) => true,
        _ => false,
    };
    Line {
        namespace: addon.namespace().unwrap_or_default(),
        name: addon.name_any(),
        policy: format!("{:?}", addon.spec.update_policy),
        channel: addon.spec.channel.clone(),
        applied: status.version,
        available: status.available_version,
        offered_by: status.available_from,
        update_available,
    }
}

fn table(lines: &[Line]) -> String {
    let rows: Vec<[String; 7]> = lines
        .iter()
        .map(|l| {
            let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            [
                l.namespace.clone(),
                l.name.clone(),
                l.policy.clone(),
                dash(&l.channel),
                dash(&l.applied),
                dash(&l.available),
                l.offered_by
                    .as_deref()
                    .map_or("-".into(), |d| d.chars().take(19).collect()),
            ]
        })
        .collect();
    let header = [
        "NAMESPACE",
        "NAME",
        "POLICY",
        "CHANNEL",
        "APPLIED",
        "AVAILABLE",
        "OFFERED BY",
    ];
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let render = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = render(header.to_vec()) + "\n";
    for r in &rows {
        out.push_str(&render(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Run the command.
pub async fn updates(args: UpdatesArgs) -> anyhow::Result<ExitCode> {
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    let api: Api<Addon> = match &args.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let mut lines: Vec<Line> = api
        .list(&ListParams::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot list Addons: {e}"))?
        .items
        .iter()
        .map(line)
        .filter(|l| args.all || l.update_available)
        .collect();
    lines.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    if args.output != crate::options::Output::Text {
        args.output.print(&lines)?;
    } else if lines.is_empty() {
        println!(
            "{}",
            if args.all {
                "No Addons."
            } else {
                "No Addon has a newer version available."
            }
        );
    } else {
        print!("{}", table(&lines));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{AddonSpec, AddonStatus, UpdatePolicy};

    #[test]
    fn a_line_says_whether_the_channel_is_ahead_and_the_table_aligns() {
        let mut a = Addon::new(
            "metrics",
            AddonSpec {
                plugin: "node-exporter".into(),
                channel: Some("stable".into()),
                update_policy: UpdatePolicy::Notify,
                ..Default::default()
            },
        );
        a.metadata.namespace = Some("monitoring".into());
        a.status = Some(AddonStatus {
            version: Some("1.7.0".into()),
            available_version: Some("1.8.2".into()),
            available_from: Some(format!("sha256:{}", "ab".repeat(32))),
            ..Default::default()
        });
        let l = line(&a);
        assert!(l.update_available);
        assert_eq!(l.policy, "Notify");
        let text = table(&[l]);
        assert!(
            text.starts_with(
                "NAMESPACE   NAME     POLICY  CHANNEL  APPLIED  AVAILABLE  OFFERED BY\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "monitoring  metrics  Notify  stable   1.7.0    1.8.2      sha256:abababababab"
            ),
            "{text}"
        );
        a.status.as_mut().unwrap().version = Some("1.8.2".into());
        assert!(!line(&a).update_available);
    }
}
