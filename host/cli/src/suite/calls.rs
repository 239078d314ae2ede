//! The inputs of an updater's or an addon's call in a `PluginTest` case,
//! and what each call gave as JSON for `expect.result` (providers' calls
//! are `crate::tape::run_calls`, shared with record and replay).
//!
//! | call | input | result |
//! |---|---|---|
//! | `can-update` | `current`, `desired`, `fields` | the claimed fields |
//! | `update` | `current`, `desired`, `fields` | `"done"`, `{inProgress: {retryAfterMs, percent, message}}` or `{failed: message}` |
//! | `versions` | | `[{version, channels, kubernetes?}]` |
//! | `render` | `addon`, `config` | the objects (parsed JSON) |
//! | `assess` | `addon`, `config`, `observed` | `{healthy, message, details: {key: value}}` |

use anyhow::bail;
use capstan_runtime::types::{AddonSpec, Health, Machine, UpdateProgress};
use capstan_runtime::{Error, Plugin, World};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The calls a case may make of a plugin of each world.
pub(super) fn calls_of(world: World) -> &'static [&'static str] {
    match world {
        World::Provider => &crate::tape::CALLS,
        World::Updater => &["can-update", "update"],
        World::Addon => &["versions", "render", "assess"],
        World::Bootstrap => &[],
    }
}

/// The Addon a `render` or `assess` call is about (`addon:` in a case).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct AddonInput {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    /// The version the host resolved (a pin, or the channel's current one).
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    channel: Option<String>,
    /// The target cluster's Kubernetes version the plugin is told.
    #[serde(default)]
    kubernetes_version: Option<String>,
}

/// A machine as an updater sees it (`current:` and `desired:` in a case).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct MachineInput {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default, rename = "providerID")]
    provider_id: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Default: the case's `config`.
    #[serde(default)]
    provider_config: Option<serde_json::Value>,
}

/// What one updater or addon call is given.
#[derive(Debug)]
pub(super) struct CallInput<'a> {
    pub(super) config: &'a str,
    pub(super) addon: Option<&'a AddonInput>,
    pub(super) observed: &'a [serde_json::Value],
    pub(super) current: Option<&'a MachineInput>,
    pub(super) desired: Option<&'a MachineInput>,
    pub(super) fields: &'a [String],
}

impl CallInput<'_> {
    fn machine(&self, input: Option<&MachineInput>) -> Machine {
        let input = input.cloned().unwrap_or_default();
        let name = input.name.unwrap_or_else(|| "machine-1".into());
        Machine {
            uid: format!("capstan-test-{name}"),
            name,
            namespace: "default".into(),
            cluster_name: None,
            labels: input.labels.into_iter().collect(),
            version: input.version,
            failure_domain: None,
            provider_config: input
                .provider_config
                .map_or_else(|| self.config.to_string(), |c| c.to_string()),
            infrastructure_config: None,
            provider_id: input.provider_id,
        }
    }

    fn addon_spec(&self) -> AddonSpec {
        let input = self.addon.cloned().unwrap_or_default();
        AddonSpec {
            name: input.name.unwrap_or_else(|| "addon-1".into()),
            namespace: input.namespace.unwrap_or_else(|| "default".into()),
            version: input.version,
            channel: input.channel,
            config: self.config.to_string(),
            kubernetes_version: input.kubernetes_version,
        }
    }
}

/// Make `call` of an updater or addon plugin; the result as JSON. An
/// error of the test itself (a call the world has not) is the outer one.
pub(super) async fn run_one(
    plugin: &Plugin,
    call: &str,
    input: &CallInput<'_>,
) -> anyhow::Result<Result<serde_json::Value, Error>> {
    let world = plugin.manifest().world;
    Ok(match (world, call) {
        (World::Updater, "can-update") => {
            let (current, desired) = (input.machine(input.current), input.machine(input.desired));
            plugin
                .updater()?
                .can_update(&current, &desired, input.fields)
                .await
                .map(|claimed| serde_json::json!(claimed))
        }
        (World::Updater, "update") => {
            let (current, desired) = (input.machine(input.current), input.machine(input.desired));
            plugin
                .updater()?
                .update(&current, &desired, input.fields)
                .await
                .map(|p| progress_json(&p))
        }
        (World::Addon, "versions") => plugin.addon()?.versions().await.map(|versions| {
            versions
                .iter()
                .map(|v| {
                    let mut entry =
                        serde_json::json!({ "version": v.version, "channels": v.channels });
                    if let Some(range) = &v.kubernetes {
                        entry["kubernetes"] = range.clone().into();
                    }
                    entry
                })
                .collect()
        }),
        (World::Addon, "render") => plugin
            .addon()?
            .render(&input.addon_spec())
            .await
            .map(|objects| objects.iter().map(|o| parsed(o)).collect()),
        (World::Addon, "assess") => {
            let observed: Vec<String> = input.observed.iter().map(|o| o.to_string()).collect();
            plugin
                .addon()?
                .assess(&input.addon_spec(), &observed)
                .await
                .map(|h| health_json(&h))
        }
        _ => bail!(
            "`{call}` is not a call of the {world} world, whose calls are: {}",
            calls_of(world).join(", ")
        ),
    })
}

/// Rendered text as JSON when it is, else as a string.
fn parsed(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

fn progress_json(progress: &UpdateProgress) -> serde_json::Value {
    match progress {
        UpdateProgress::Done => serde_json::json!("done"),
        UpdateProgress::InProgress(u) => serde_json::json!({
            "inProgress": {
                "retryAfterMs": u.retry_after_ms,
                "percent": u.percent,
                "message": u.message,
            }
        }),
        UpdateProgress::Failed(message) => serde_json::json!({ "failed": message }),
    }
}

fn health_json(health: &Health) -> serde_json::Value {
    let details: serde_json::Map<String, serde_json::Value> = health
        .details
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::json!({
        "healthy": health.healthy,
        "message": health.message,
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_runtime::types::UpdateInProgress;

    #[test]
    fn answers_read_as_the_table_says() {
        assert_eq!(progress_json(&UpdateProgress::Done), "done");
        let p = progress_json(&UpdateProgress::InProgress(UpdateInProgress {
            retry_after_ms: 200,
            percent: Some(40),
            message: None,
        }));
        assert_eq!(p["inProgress"]["retryAfterMs"], 200);
        assert_eq!(p["inProgress"]["percent"], 40);
        let h = health_json(&Health {
            healthy: false,
            message: Some("1/2 ready".into()),
            details: vec![("numberReady".into(), "1/2".into())],
        });
        assert_eq!(h["details"]["numberReady"], "1/2");
        assert_eq!(parsed("{\"kind\":\"x\"}")["kind"], "x");
        assert_eq!(parsed("not json"), "not json");
    }

    #[test]
    fn machines_default_to_the_case_config_and_keep_what_is_given() {
        let current = MachineInput {
            version: Some("v1".into()),
            provider_id: Some("sim://i-1".into()),
            ..Default::default()
        };
        let desired = MachineInput {
            version: Some("v2".into()),
            provider_config: Some(serde_json::json!({"endpoint": "http://b"})),
            ..Default::default()
        };
        let input = CallInput {
            config: r#"{"endpoint":"http://a"}"#,
            addon: None,
            observed: &[],
            current: Some(&current),
            desired: Some(&desired),
            fields: &[],
        };
        let (c, d) = (input.machine(input.current), input.machine(input.desired));
        assert_eq!(c.provider_config, r#"{"endpoint":"http://a"}"#);
        assert_eq!(c.provider_id.as_deref(), Some("sim://i-1"));
        assert_eq!(d.provider_config, r#"{"endpoint":"http://b"}"#);
        assert_eq!(d.version.as_deref(), Some("v2"));
        assert_eq!(c.uid, d.uid, "one machine, before and after");
        assert_eq!(input.addon_spec().name, "addon-1");
    }
}
