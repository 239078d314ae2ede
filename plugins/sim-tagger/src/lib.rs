//! `sim-tagger`: an in-place updater plugin for the simulated cloud that
//! changes instance tags (`provider.config.tags.*`) without a restart.
//!
//! With `sim-updater` (which claims `version`) it composes: one rollout
//! changing both the version and tags is applied in place by the two of
//! them, one after the other.

// The updater is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

mod tags;

use capstan_sdk::updater::{Guest, UpdateProgress};
use capstan_sdk::{Machine, PluginError};

struct SimTagger;

impl Guest for SimTagger {
    fn can_update(
        _current: Machine,
        _desired: Machine,
        changed_fields: Vec<String>,
    ) -> Result<Vec<String>, PluginError> {
        Ok(tags::claim(changed_fields, |_| true))
    }

    fn update(
        current: Machine,
        desired: Machine,
        claimed_fields: Vec<String>,
    ) -> Result<UpdateProgress, PluginError> {
        tags::update(&current, &desired, &claimed_fields)
    }
}

capstan_sdk::export_updater!(SimTagger, manifest: "capstan-plugin.json");
