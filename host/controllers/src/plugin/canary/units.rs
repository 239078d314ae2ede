//! Which objects a canary may serve, per world, and the pick
//! ([`assign`]): every one it served, then the lowest-ranked others up to
//! its share (`capstan_planner::canary::assign`).

use super::super::Context;
use super::trialed::Held;
use capstan_api::{Machine, Plugin, PluginRollout};
use capstan_planner::canary as plan;
use kube::ResourceExt;

/// One object a canary may serve, as [`assign`] weighs it.
pub(super) struct Unit {
    uid: String,
    /// Its status records the canary's digest as what last served it.
    served_before: bool,
    /// The selector takes it, and it is not being deleted.
    eligible: bool,
    /// A Machine failing its health check, an Addon not healthy.
    unhealthy: bool,
}

/// Pick the objects the canary serves (every one it served, then the
/// lowest-ranked others the selector allows, up to its share), mark every
/// other one as the stable revision's, and note which of them are
/// unhealthy; how many it serves, of how many it could.
pub(super) fn assign(held: &Held, weight: u32, units: Vec<Unit>) -> (usize, usize) {
    let candidates: Vec<(String, bool)> = units
        .iter()
        .filter_map(|u| {
            let sticky = u.served_before || held.canary.serves(&u.uid);
            (sticky || u.eligible).then(|| (u.uid.clone(), sticky))
        })
        .collect();
    let chosen = plan::assign(&held.digest, &candidates, weight);
    {
        let mut seen = held.window.lock().expect("window lock");
        seen.canary = chosen.len() as u64;
        seen.stable = (units.len() - chosen.len()) as u64;
    }
    // The Machine controller and the addon engine note them as they see
    // them; this catches the ones they have not looked at since (after a
    // restart, say).
    for u in units.iter().filter(|u| u.unhealthy) {
        held.canary
            .note_unhealthy(&u.uid, u.served_before || chosen.contains(&u.uid));
    }
    let serves = chosen.len();
    let considered = units.into_iter().map(|u| u.uid).collect();
    held.canary.assign(chosen, considered);
    (serves, candidates.len())
}

/// The Plugin's Machines (those it creates, and those it releases while
/// they are deleted).
pub(super) fn machine_units(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    digest: &str,
) -> Vec<Unit> {
    let name = plugin.name_any();
    let uses = |m: &Machine| {
        let used = if m.metadata.deletion_timestamp.is_some() {
            m.instance_plugin()
        } else {
            m.spec.provider.plugin.as_str()
        };
        used == name
    };
    let served =
        |m: &Machine| m.status.as_ref().and_then(|s| s.plugin_digest.as_deref()) == Some(digest);
    machines_where(plugin, ctx, rollout, uses, served)
}

/// The Machines an updater may update (every Machine its Plugin may act
/// on); those it updated are the ones whose in-place step records it.
pub(super) fn updated_units(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    digest: &str,
) -> Vec<Unit> {
    let updated_by_it = |m: &Machine| {
        m.status
            .as_ref()
            .and_then(|s| s.in_place_update.as_ref())
            .is_some_and(|u| u.steps.iter().any(|s| s.digest.as_deref() == Some(digest)))
    };
    machines_where(plugin, ctx, rollout, |_| true, updated_by_it)
}

/// The Machines whose data the bootstrap plugin renders. Nothing records
/// which revision rendered a Machine's data; the canary keeps the Machines
/// it served while it lives.
pub(super) fn bootstrapped_units(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
) -> Vec<Unit> {
    let name = plugin.name_any();
    let renders = |m: &Machine| {
        m.spec.bootstrap.as_ref().and_then(|b| b.plugin.as_deref()) == Some(name.as_str())
    };
    machines_where(plugin, ctx, rollout, renders, |_| false)
}

/// The Machines `uses` takes, as units: eligible when alive, taken by the
/// selector and in a namespace the Plugin allows (a Machine elsewhere never
/// reaches the plugin, so it neither gets the canary nor widens its share).
fn machines_where(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    uses: impl Fn(&Machine) -> bool,
    served_before: impl Fn(&Machine) -> bool,
) -> Vec<Unit> {
    ctx.kube
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| uses(m))
        .filter_map(|m| {
            Some(Unit {
                uid: m.uid()?,
                served_before: served_before(&m),
                eligible: m.metadata.deletion_timestamp.is_none()
                    && takes(plugin, ctx, rollout, m.as_ref()),
                unhealthy: m.failed_health_check(),
            })
        })
        .collect()
}

/// The Plugin's Addons.
pub(super) fn addon_units(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    digest: &str,
) -> Vec<Unit> {
    let name = plugin.name_any();
    ctx.kube
        .stores
        .addons
        .state()
        .into_iter()
        .filter(|a| a.spec.plugin == name)
        .filter_map(|a| {
            let status = a.status.as_ref();
            Some(Unit {
                uid: a.uid()?,
                served_before: status.and_then(|s| s.plugin_digest.as_deref()) == Some(digest),
                eligible: a.metadata.deletion_timestamp.is_none()
                    && takes(plugin, ctx, rollout, a.as_ref()),
                unhealthy: status.and_then(|s| s.healthy) == Some(false),
            })
        })
        .collect()
}

/// Whether the canary may be given this object: the selector (unset:
/// everything) takes its labels and its namespace may use the Plugin.
fn takes<K: ResourceExt>(
    plugin: &Plugin,
    ctx: &Context,
    rollout: &PluginRollout,
    object: &K,
) -> bool {
    let namespace = object.namespace().unwrap_or_default();
    rollout
        .selector
        .as_ref()
        .is_none_or(|s| capstan_api::selector_matches(s, object.labels()))
        && capstan_kit::registry::allowed_in(&ctx.kube, plugin, &namespace)
}
