//! `sim-team-tagger`: an in-place updater plugin that changes only the
//! `team` tag of simulated-cloud instances. Its declared field
//! (`provider.config.tags.team`) overlaps `sim-tagger`'s
//! (`provider.config.tags.*`): the two are active together only when both
//! Plugins set `spec.updateOrder`, and then the earlier one applies `team`.

// The updater is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[path = "../../sim-tagger/src/tags.rs"]
mod tags;

use capstan_sdk::updater::{Guest, UpdateProgress};
use capstan_sdk::{Machine, PluginError};

/// The one tag this updater manages.
const TEAM: &str = "team";

struct SimTeamTagger;

impl Guest for SimTeamTagger {
    fn can_update(
        _current: Machine,
        _desired: Machine,
        changed_fields: Vec<String>,
    ) -> Result<Vec<String>, PluginError> {
        Ok(tags::claim(changed_fields, |key| key == TEAM))
    }

    fn update(
        current: Machine,
        desired: Machine,
        claimed_fields: Vec<String>,
    ) -> Result<UpdateProgress, PluginError> {
        tags::update(&current, &desired, &claimed_fields)
    }
}

capstan_sdk::export_updater!(SimTeamTagger, manifest: "capstan-plugin.json");
