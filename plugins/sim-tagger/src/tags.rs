//! Tag updates for the simulated cloud, shared by `sim-tagger` (every tag)
//! and `sim-team-tagger` (the `team` tag only).
//!
//! A tag change is a field `provider.config.tags.KEY`. `update` reads the
//! instance first and writes only the claimed tags that differ, so calling
//! it again (also after a host restart) confirms instead of repeating.

use capstan_sdk::http::{HttpClient, Method, Request, Response, WasiHttp};
use capstan_sdk::updater::{UpdateInProgress, UpdateProgress};
use capstan_sdk::{Machine, PluginError};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The field prefix of a tag.
pub const PREFIX: &str = "provider.config.tags.";

#[derive(Debug, Deserialize)]
struct Config {
    endpoint: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Instance {
    state: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

/// The changed tag fields whose key `manages` accepts.
pub fn claim(changed: Vec<String>, manages: impl Fn(&str) -> bool) -> Vec<String> {
    changed
        .into_iter()
        .filter(|f| f.strip_prefix(PREFIX).is_some_and(&manages))
        .collect()
}

fn send(request: Request) -> Result<Response, PluginError> {
    WasiHttp
        .send(&request)
        .map_err(|e| PluginError::transient(e.to_string(), 1_000))
}

/// Bring the claimed tags of `current`'s instance to `desired`'s values (a
/// tag gone from `desired` is removed).
pub fn update(
    current: &Machine,
    desired: &Machine,
    claimed: &[String],
) -> Result<UpdateProgress, PluginError> {
    let keys: Vec<&str> = claimed
        .iter()
        .filter_map(|f| f.strip_prefix(PREFIX))
        .collect();
    if keys.is_empty() {
        return Ok(UpdateProgress::Done);
    }
    let config: Config = capstan_sdk::parse_config("provider config", &desired.provider_config)?;
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
    let instance: Instance = resp
        .json()
        .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
    if instance.state == "terminating" {
        return Ok(UpdateProgress::Failed(
            "the instance is being deleted".into(),
        ));
    }
    let wanted: BTreeMap<&str, Option<&String>> =
        keys.iter().map(|k| (*k, config.tags.get(*k))).collect();
    let differing: BTreeMap<&str, Option<&String>> = wanted
        .into_iter()
        .filter(|(k, v)| instance.tags.get(*k) != *v)
        .collect();
    if differing.is_empty() {
        return Ok(UpdateProgress::Done);
    }
    let resp = send(Request::json(
        Method::Patch,
        format!("{url}/tags"),
        &differing,
    ))?;
    match resp.status {
        200 => Ok(UpdateProgress::InProgress(UpdateInProgress {
            retry_after_ms: 100,
            percent: Some(50),
            message: Some(format!("wrote {} tag(s); confirming", differing.len())),
        })),
        409 => Ok(UpdateProgress::Failed(format!(
            "the cloud refused the tag change: {}",
            resp.text()
        ))),
        _ => Err(resp.error("changing tags")),
    }
}
