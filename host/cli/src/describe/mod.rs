//! `capstan describe md/NAME | ms/NAME | machine/NAME | addon/NAME |
//! cluster/NAME`: the tree `clusterctl describe` prints, for Capstan's
//! objects. This module
//! reads the objects and their Events; [`tree`] turns them into rows and
//! text.

pub mod cluster;
pub mod tree;

use crate::connect::{Connection, Kind, parse_reference};
use anyhow::anyhow;
use capstan_api::{Addon, Cluster, Machine, MachineDeployment, MachineSet};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use std::collections::HashSet;
use std::io::IsTerminal;
use std::process::ExitCode;
use tree::{Description, EventLine, Style};

/// Flags of `describe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to describe: `md/NAME`, `ms/NAME`, `machine/NAME`,
    /// `addon/NAME` or `cluster/NAME` (long and plural kind names work too).
    #[arg(value_parser = crate::connect::describable_reference)]
    pub object: String,
    #[command(flatten)]
    pub connection: Connection,
    /// List every condition of these kinds' rows (`all`, or a comma list
    /// such as `machine,machineset`); otherwise each row shows the first
    /// condition that is not True.
    #[arg(long, value_delimiter = ',', value_name = "KINDS")]
    pub show_conditions: Vec<String>,
    /// Group Machines alike in every column into one row
    /// (`--grouping=false` lists each).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub grouping: bool,
    /// Colour the states: `auto` (only on a terminal, and not with
    /// $NO_COLOR), `always` or `never`.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: Color,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: crate::options::Output,
    /// How many of the newest Events to list.
    #[arg(long, default_value_t = 10)]
    pub events: usize,
}

/// When to colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Color {
    Auto,
    Always,
    Never,
}

/// `describe`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (kind, name) = parse_reference(&args.object, None, &crate::connect::DESCRIBABLE)?;
    let (client, namespace) = args.connection.connect().await?;
    let now = Timestamp::now();
    let machines = || async {
        anyhow::Ok(
            Api::<Machine>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await?
                .items,
        )
    };
    let (tree, uids) = match kind {
        Kind::MachineDeployment => {
            let md: MachineDeployment = named(&client, &namespace, &name, kind).await?;
            let sets = Api::<MachineSet>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await?
                .items;
            let machines = machines().await?;
            let row = tree::deployment_row(&md, &sets, &machines, args.grouping, now);
            (
                row,
                uids(
                    [&md.metadata]
                        .into_iter()
                        .chain(sets.iter().map(|s| &s.metadata))
                        .chain(machines.iter().map(|m| &m.metadata)),
                ),
            )
        }
        Kind::MachineSet => {
            let ms: MachineSet = named(&client, &namespace, &name, kind).await?;
            let machines = machines().await?;
            let row = tree::set_row(&ms, &machines, args.grouping, now);
            (
                row,
                uids(
                    [&ms.metadata]
                        .into_iter()
                        .chain(machines.iter().map(|m| &m.metadata)),
                ),
            )
        }
        Kind::Machine => {
            let m: Machine = named(&client, &namespace, &name, kind).await?;
            (tree::machine_row(&m, now), uids([&m.metadata]))
        }
        Kind::Addon => {
            let addon: Addon = named(&client, &namespace, &name, kind).await?;
            (tree::addon_row(&addon, now), uids([&addon.metadata]))
        }
        Kind::Cluster => {
            let c: Cluster = named(&client, &namespace, &name, kind).await?;
            let deployments = Api::<MachineDeployment>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await?
                .items;
            let sets = Api::<MachineSet>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await?
                .items;
            let machines = machines().await?;
            let row = cluster::cluster_row(&c, &deployments, &sets, &machines, args.grouping, now);
            let metas = [&c.metadata]
                .into_iter()
                .chain(deployments.iter().map(|d| &d.metadata))
                .chain(sets.iter().map(|s| &s.metadata))
                .chain(machines.iter().map(|m| &m.metadata));
            (row, uids(metas))
        }
    };
    let shown = shown_names(&tree);
    let events = events(&client, &namespace, &uids, &shown, args.events, now).await?;
    let description = Description { tree, events };
    match args.output {
        crate::options::Output::Text => {
            let color = match args.color {
                Color::Always => true,
                Color::Never => false,
                Color::Auto => {
                    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
                }
            };
            let style = Style {
                show_conditions: args
                    .show_conditions
                    .iter()
                    .map(|k| k.trim().to_ascii_lowercase())
                    .collect(),
                color,
            };
            print!("{}", tree::render(&description, &style));
        }
        format => format.print(&description)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The object `name` of `namespace`, or an error naming what is missing.
async fn named<K>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    kind: Kind,
) -> anyhow::Result<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .ok_or_else(|| anyhow!("{}/{name} not found in namespace {namespace}", kind.noun()))
}

fn uids<'a>(metas: impl IntoIterator<Item = &'a kube::api::ObjectMeta>) -> HashSet<String> {
    metas.into_iter().filter_map(|m| m.uid.clone()).collect()
}

/// `Kind/name` of every row and group member in the tree.
fn shown_names(row: &tree::Row) -> HashSet<String> {
    let mut names: HashSet<String> = row
        .members
        .iter()
        .map(|m| format!("Machine/{m}"))
        .chain([row.name.clone()])
        .collect();
    for child in &row.children {
        names.extend(shown_names(child));
    }
    names
}

/// The newest `limit` Events of objects in the tree, oldest first.
async fn events(
    client: &kube::Client,
    namespace: &str,
    uids: &HashSet<String>,
    shown: &HashSet<String>,
    limit: usize,
    now: Timestamp,
) -> anyhow::Result<Vec<EventLine>> {
    let events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items;
    let mut lines: Vec<(i64, EventLine)> = events
        .into_iter()
        .filter(|e| {
            let o = &e.involved_object;
            let object = format!(
                "{}/{}",
                o.kind.as_deref().unwrap_or_default(),
                o.name.as_deref().unwrap_or_default()
            );
            o.uid.as_ref().is_some_and(|u| uids.contains(u)) && shown.contains(&object)
        })
        .map(|e| {
            let at = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.first_timestamp.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .map_or(0, |t| t.as_second());
            let o = &e.involved_object;
            let line = EventLine {
                age_seconds: (now.as_second() - at).max(0),
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                object: format!(
                    "{}/{}",
                    o.kind.as_deref().unwrap_or_default(),
                    o.name.as_deref().unwrap_or_default()
                ),
                message: e.message.clone().unwrap_or_default().trim_end().to_string(),
            };
            (at, line)
        })
        .collect();
    lines.sort_by_key(|(at, _)| *at);
    let skip = lines.len().saturating_sub(limit);
    Ok(lines.into_iter().skip(skip).map(|(_, l)| l).collect())
}
