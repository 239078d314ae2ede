//! `broken-updater`: a deliberately wrong in-place updater for the simulated
//! cloud, used to prove that `capstan plugin conformance --world updater`
//! fails precisely. It declares `version` but:
//!
//! - claims every changed field, plus `failureDomain`, which did not change;
//! - reports progress that runs backwards (100 minus the cloud's percent);
//! - after reporting `done` once, starts over (`done` is not stable);
//! - traps (panics) on a machine without a provider ID instead of
//!   returning an error.
//!
//! Never install it.

// The updater is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::http::{HttpClient, Method, Request, SandboxHttp};
use capstan_sdk::updater::{Guest, UpdateInProgress, UpdateProgress};
use capstan_sdk::{Machine, PluginError};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
struct Config {
    endpoint: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    version: Option<String>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    update: Option<Progress>,
}

#[derive(Debug, Deserialize)]
struct Progress {
    percent: u8,
}

const DONE_TAG: &str = "broken-updater-done";

fn in_progress(percent: u8) -> UpdateProgress {
    UpdateProgress::InProgress(UpdateInProgress {
        retry_after_ms: 100,
        percent: Some(percent),
        message: None,
    })
}

fn transient(e: impl ToString) -> PluginError {
    PluginError::transient(e.to_string(), 500)
}

struct BrokenUpdater;

impl Guest for BrokenUpdater {
    fn can_update(
        _current: Machine,
        _desired: Machine,
        mut changed_fields: Vec<String>,
    ) -> Result<Vec<String>, PluginError> {
        changed_fields.push("failureDomain".into());
        Ok(changed_fields)
    }

    fn update(
        current: Machine,
        desired: Machine,
        claimed_fields: Vec<String>,
    ) -> Result<UpdateProgress, PluginError> {
        if claimed_fields.is_empty() {
            return Ok(UpdateProgress::Done);
        }
        let id = current
            .provider_id
            .expect("a provider ID")
            .replace("sim://", "");
        let config: Config =
            capstan_sdk::parse_config("provider config", &desired.provider_config)?;
        let url = format!(
            "{}/v1/instances/{id}",
            config.endpoint.trim_end_matches('/')
        );
        let resp = SandboxHttp.send(&Request::get(&url)).map_err(transient)?;
        let instance: Instance = resp.json().map_err(transient)?;
        if instance.tags.contains_key(DONE_TAG) {
            return Ok(in_progress(0));
        }
        if let Some(progress) = instance.update {
            return Ok(in_progress(100 - progress.percent.min(100)));
        }
        if instance.version == desired.version {
            let body = serde_json::json!({ DONE_TAG: "1" });
            SandboxHttp
                .send(&Request::json(Method::Patch, format!("{url}/tags"), &body))
                .map_err(transient)?;
            return Ok(UpdateProgress::Done);
        }
        let body = serde_json::json!({ "version": desired.version });
        SandboxHttp
            .send(&Request::json(Method::Post, format!("{url}/update"), &body))
            .map_err(transient)?;
        Ok(in_progress(1))
    }
}

capstan_sdk::export_updater!(BrokenUpdater, manifest: "capstan-plugin.json");
