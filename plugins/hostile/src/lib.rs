//! `hostile`: a deliberately misbehaving provider plugin, used only as a test
//! fixture to prove the sandbox's limits. Never deploy it.
//!
//! The provider config picks the attack that `create` performs:
//!
//! | `attack` | what it does | what the host must report |
//! |---|---|---|
//! | `infinite-loop` | spins forever | deadline exceeded |
//! | `memory-bomb` | allocates until it cannot | memory limit |
//! | `stdout-flood` | prints without end | output limit (stdout) |
//! | `log-flood` | logs without end | output limit (log) |
//! | `oversized-return` | returns a 4 MiB status message | output limit (return value) |
//! | `undeclared-host` | GETs `target`, a host its manifest does not declare | capability denied |
//! | `redirect` | GETs `target` (granted) and follows its redirect elsewhere | capability denied |
//! | `host-header` | GETs `target` with a forged `Host` header | the request never leaves with it |
//! | `trap` | panics | trap, naming plugin and function |
//! | `escape` | reads `/`, the environment, and connects a socket to `target` | all three find nothing |
//! | `non-idempotent` | creates a new instance at `endpoint` on every call | conformance failure |
//! | `none` | behaves (validate/get/delete always work) | nothing |

// The plugin is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::http::{HttpClient, Method, Request, WasiHttp};
use capstan_sdk::{Deletion, InstanceState, Machine, MachineStatus, PluginError, Provider};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    attack: String,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
}

#[derive(Default)]
struct Hostile;

fn target(config: &Config) -> Result<&str, PluginError> {
    config
        .target
        .as_deref()
        .ok_or_else(|| PluginError::invalid_config("target: required for this attack"))
}

fn endpoint(config: &Config) -> Result<&str, PluginError> {
    config
        .endpoint
        .as_deref()
        .map(|e| e.trim_end_matches('/'))
        .ok_or_else(|| PluginError::invalid_config("endpoint: required for non-idempotent"))
}

#[derive(Debug, Deserialize)]
struct Instance {
    id: String,
}

impl Provider for Hostile {
    type Config = Config;

    fn create(&self, machine: &Machine, config: &Config) -> Result<MachineStatus, PluginError> {
        let http = WasiHttp;
        match config.attack.as_str() {
            "none" => {}
            "infinite-loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "memory-bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![0xA5; 8 * 1024 * 1024]);
                    std::hint::black_box(&hoard);
                }
            }
            "stdout-flood" => loop {
                println!("{}", "flood ".repeat(200));
            },
            "log-flood" => loop {
                capstan_sdk::log::info(&"flood ".repeat(200), &[("attack", "log-flood")]);
            },
            "oversized-return" => {
                let mut status = MachineStatus::new("hostile://big", InstanceState::Running);
                status.message = Some("x".repeat(4 * 1024 * 1024));
                return Ok(status);
            }
            "undeclared-host" => {
                let resp = http.send(&Request::get(target(config)?));
                return Err(PluginError::terminal(format!("request outcome: {resp:?}")));
            }
            "redirect" => {
                let first = http
                    .send(&Request::get(target(config)?))
                    .map_err(|e| PluginError::terminal(format!("first request failed: {e}")))?;
                let location = first
                    .header("location")
                    .ok_or_else(|| PluginError::terminal("no redirect received"))?
                    .to_string();
                let second = http.send(&Request::get(location));
                return Err(PluginError::terminal(format!(
                    "redirect outcome: {second:?}"
                )));
            }
            "host-header" => {
                let resp =
                    http.send(&Request::get(target(config)?).header("host", "evil.example:80"));
                return Err(PluginError::terminal(format!(
                    "forged host outcome: {resp:?}"
                )));
            }
            "trap" => panic!("hostile plugin panicked on purpose"),
            "escape" => {
                let fs = match std::fs::read_dir("/") {
                    Ok(entries) => format!("fs: listed {} entries", entries.count()),
                    Err(e) => format!("fs: denied ({e})"),
                };
                let env = format!("env: {} variables", std::env::vars().count());
                let addr = target(config)?.trim_start_matches("http://").to_string();
                let net = match std::net::TcpStream::connect(addr.as_str()) {
                    Ok(_) => "net: connected".to_string(),
                    Err(e) => format!("net: denied ({e})"),
                };
                return Err(PluginError::terminal(format!("{fs}; {env}; {net}")));
            }
            "non-idempotent" => {
                // A fresh client token on every call: the bug conformance catches.
                let token = format!(
                    "{}-{}",
                    machine.uid,
                    wasip2::random::random::get_random_u64()
                );
                let body = serde_json::json!({ "clientToken": token, "name": machine.name });
                let resp = http
                    .send(&Request::json(
                        Method::Post,
                        format!("{}/v1/instances", endpoint(config)?),
                        &body,
                    ))
                    .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
                let instance: Instance = resp
                    .json()
                    .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
                return Ok(MachineStatus::new(
                    format!("sim://{}", instance.id),
                    InstanceState::Running,
                ));
            }
            other => {
                return Err(PluginError::invalid_config(format!(
                    "attack: unknown attack `{other}`"
                )));
            }
        }
        Ok(MachineStatus::new(
            format!("hostile://{}", machine.uid),
            InstanceState::Running,
        ))
    }

    fn get(&self, machine: &Machine, config: &Config) -> Result<MachineStatus, PluginError> {
        if config.attack != "non-idempotent" {
            return Ok(MachineStatus::new(
                format!("hostile://{}", machine.uid),
                InstanceState::Running,
            ));
        }
        let id = machine
            .provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix("sim://"))
            .ok_or_else(|| PluginError::not_found("no provider ID"))?;
        let resp = WasiHttp
            .send(&Request::get(format!(
                "{}/v1/instances/{id}",
                endpoint(config)?
            )))
            .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
        match resp.status {
            200 => Ok(MachineStatus::new(
                format!("sim://{id}"),
                InstanceState::Running,
            )),
            404 => Err(PluginError::not_found(format!("instance {id} not found"))),
            s => Err(PluginError::transient(format!("HTTP {s}"), 1_000)),
        }
    }

    fn delete(&self, machine: &Machine, config: &Config) -> Result<Deletion, PluginError> {
        if config.attack != "non-idempotent" {
            return Ok(Deletion::Done);
        }
        let Some(id) = machine
            .provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix("sim://"))
        else {
            return Ok(Deletion::Done);
        };
        let resp = WasiHttp
            .send(&Request::delete(format!(
                "{}/v1/instances/{id}",
                endpoint(config)?
            )))
            .map_err(|e| PluginError::transient(e.to_string(), 1_000))?;
        match resp.status {
            404 => Ok(Deletion::Done),
            _ => Ok(Deletion::InProgress(100)),
        }
    }
}

capstan_sdk::export_provider!(Hostile, manifest: "capstan-plugin.json");
