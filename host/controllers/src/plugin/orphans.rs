//! The orphan report of a provider Plugin: instances its plugin lists
//! (`list-instances`, with each distinct config its Machines use, at most
//! [`MAX_CONFIGS`]) that no Machine records. A scan runs at most once per
//! `--orphan-scan-interval` (a failed one waits as long); an instance is reported only when two scans in a row find it
//! orphaned, so one launched a moment before its Machine's status records
//! it is not. The report goes to `status.orphans` when what it says
//! changes, with an Event naming new orphans; `capstan machines orphans`
//! prints it.

use super::{CONTROLLER, Context};
use capstan_api::{OrphanReport, Plugin, PluginStatus};
use capstan_kit::provider::timed_as;
use capstan_kit::write::record_event;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use std::collections::BTreeSet;

/// Distinct provider configs listed per scan, at most.
const MAX_CONFIGS: usize = 5;
/// Orphans named in the status, at most.
const MAX_SHOWN: usize = 50;

/// Every instance the provider lists for the machines' configs, or what
/// stopped the listing (then the set is partial and says nothing).
async fn list_instances(
    ctx: &Context,
    name: &str,
    provider: &dyn capstan_kit::MachineProvider,
    configs: &BTreeSet<String>,
) -> (BTreeSet<String>, Option<String>) {
    let mut listed = BTreeSet::new();
    let mut problem = None;
    for config in configs {
        let labels = (name, "stable");
        let answer = timed_as(
            &ctx.kube.metrics,
            labels,
            "list-instances",
            provider.list_instances(config),
        )
        .await;
        match answer {
            Ok(Some(instances)) => listed.extend(instances.into_iter().map(|s| s.provider_id)),
            Ok(None) => {
                problem = Some(
                    "the plugin does not list its instances (list-instances answered none)"
                        .to_string(),
                );
                break;
            }
            Err(e) => {
                problem = Some(format!("list-instances failed: {e}"));
                break;
            }
        }
    }
    (listed, problem)
}

/// Scan again if the last scan is an interval old, and record what two scans
/// in a row found (the status only when that changed).
pub(super) async fn scan(plugin: &Plugin, ctx: &Context, status: &mut PluginStatus) {
    let name = plugin.name_any();
    let Some(registered) = ctx.providers.get(&name) else {
        return;
    };
    let due = ctx
        .orphan_scans
        .lock()
        .expect("orphans lock")
        .get(&name)
        .is_none_or(|(at, _)| at.elapsed() >= ctx.orphan_scan);
    if !due {
        return;
    }
    let machines = ctx.kube.stores.machines.state();
    let configs: BTreeSet<String> = machines
        .iter()
        .filter(|m| m.instance_plugin() == name)
        .filter(|m| {
            capstan_kit::registry::allowed_in(&ctx.kube, plugin, &m.namespace().unwrap_or_default())
        })
        .map(|m| m.spec.provider.config.to_string())
        .take(MAX_CONFIGS)
        .collect();
    if configs.is_empty() {
        status.orphans = None;
        return;
    }
    let (listed, problem) =
        list_instances(ctx, &name, registered.provider.as_ref(), &configs).await;
    let unowned: BTreeSet<String> = listed
        .into_iter()
        .filter(|id| ctx.kube.stores.machine_ids.machines(id).is_empty())
        .collect();
    let before = {
        let mut scans = ctx.orphan_scans.lock().expect("orphans lock");
        let before = scans
            .remove(&name)
            .map(|(_, seen)| seen)
            .unwrap_or_default();
        let kept = if problem.is_none() {
            unowned.clone()
        } else {
            before.clone()
        };
        scans.insert(name.clone(), (std::time::Instant::now(), kept));
        before
    };
    let previous = status.orphans.clone();
    let (count, instances) = match &problem {
        // A failed scan says nothing new about which instances are orphans.
        Some(_) => previous
            .as_ref()
            .map(|o| (o.count, o.instances.clone()))
            .unwrap_or_default(),
        None => {
            let confirmed: Vec<String> = unowned.intersection(&before).cloned().collect();
            let shown = confirmed.iter().take(MAX_SHOWN).cloned().collect();
            (confirmed.len() as u32, shown)
        }
    };
    let unchanged = previous
        .as_ref()
        .is_some_and(|o| o.count == count && o.instances == instances && o.message == problem);
    if unchanged {
        return;
    }
    status.orphans = Some(OrphanReport {
        since: capstan_kit::now(),
        count,
        instances: instances.clone(),
        message: problem,
    });
    let newly: Vec<&String> = instances
        .iter()
        .filter(|id| previous.as_ref().is_none_or(|o| !o.instances.contains(id)))
        .collect();
    if !newly.is_empty() {
        let note = format!(
            "{count} instance(s) the plugin lists have no Machine (two scans in a row), newly {}; adopt one with a Machine's spec.providerID, or delete it in the cloud",
            newly
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        record_event(
            &ctx.kube,
            CONTROLLER,
            &plugin.object_ref(&()),
            EventType::Warning,
            "OrphanedInstances",
            note,
        )
        .await;
    }
}
