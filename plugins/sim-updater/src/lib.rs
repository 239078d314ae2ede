//! `sim-updater`: an in-place updater plugin for the simulated cloud.
//!
//! It claims one field, `version`, and applies it with the cloud's in-place
//! update API. `update` is re-entrant: every call looks at the instance first,
//! so calling it again (also after a host restart) continues or confirms the
//! same update instead of starting a new one.

// The updater is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::http::{HttpClient, Method, Request, Response, SandboxHttp};
use capstan_sdk::updater::{Guest, UpdateInProgress, UpdateProgress};
use capstan_sdk::{Machine, PluginError, parse_config};
use serde::Deserialize;

/// The field this updater can change in place.
pub const VERSION_FIELD: &str = "version";

/// The part of the provider config this updater needs.
#[derive(Debug, Deserialize)]
struct Config {
    endpoint: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    state: String,
    version: Option<String>,
    update: Option<UpdateStatus>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateStatus {
    target_version: String,
    percent: u8,
}

fn send(request: Request) -> Result<Response, PluginError> {
    SandboxHttp
        .send(&request)
        .map_err(|e| PluginError::transient(e.to_string(), 1_000))
}

fn instance(resp: &Response) -> Result<Instance, PluginError> {
    resp.json()
        .map_err(|e| PluginError::transient(e.to_string(), 1_000))
}

fn in_progress(percent: u8, message: String) -> UpdateProgress {
    UpdateProgress::InProgress(UpdateInProgress {
        retry_after_ms: 200,
        percent: Some(percent),
        message: Some(message),
    })
}

struct SimUpdater;

impl Guest for SimUpdater {
    fn can_update(
        _current: Machine,
        _desired: Machine,
        changed_fields: Vec<String>,
    ) -> Result<Vec<String>, PluginError> {
        Ok(changed_fields
            .into_iter()
            .filter(|f| f == VERSION_FIELD)
            .collect())
    }

    fn update(
        current: Machine,
        desired: Machine,
        claimed_fields: Vec<String>,
    ) -> Result<UpdateProgress, PluginError> {
        if !claimed_fields.iter().any(|f| f == VERSION_FIELD) {
            return Ok(UpdateProgress::Done);
        }
        let config: Config = parse_config("provider config", &desired.provider_config)?;
        let target = desired.version.ok_or_else(|| {
            PluginError::invalid_config("version: the desired machine has no version")
        })?;
        let id = current
            .provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix("sim://"))
            .ok_or_else(|| PluginError::terminal("the machine has no sim:// provider ID yet"))?;
        let url = format!(
            "{}/v1/instances/{id}",
            config.endpoint.trim_end_matches('/')
        );

        let resp = send(Request::get(&url))?;
        if resp.status != 200 {
            return Err(resp.error("describing the instance"));
        }
        let now = instance(&resp)?;
        if now.state == "terminating" {
            return Ok(UpdateProgress::Failed(
                "the instance is being deleted".into(),
            ));
        }
        match &now.update {
            Some(u) if u.target_version == target => {
                return Ok(in_progress(u.percent, format!("updating to {target}")));
            }
            None if now.version.as_deref() == Some(target.as_str()) => {
                return Ok(UpdateProgress::Done);
            }
            _ => {}
        }
        let body = serde_json::json!({ "version": target });
        let resp = send(Request::json(Method::Post, format!("{url}/update"), &body))?;
        match resp.status {
            202 => Ok(in_progress(0, format!("update to {target} started"))),
            409 => Ok(UpdateProgress::Failed(format!(
                "the cloud refused the update: {}",
                resp.text()
            ))),
            _ => Err(resp.error("starting the update")),
        }
    }
}

capstan_sdk::export_updater!(SimUpdater, manifest: "capstan-plugin.json");
