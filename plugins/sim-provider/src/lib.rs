//! `sim-provider`: a Capstan provider plugin for the simulated cloud
//! (`tests/sim-cloud`).
//!
//! Provider config (the Machine's `spec.provider.config`):
//!
//! ```json
//! {"endpoint": "http://127.0.0.1:8787", "instanceType": "small"}
//! ```
//!
//! The machine uid is the cloud's client token, so `create` is idempotent even
//! across host restarts; the provider ID is `sim://<instance-id>`. The
//! credential slot `sim-cloud` is filled by the host (bearer token).
//!
//! The logic is generic over [`HttpClient`], so the same code runs inside the
//! sandbox (through `capstan:plugin/http`, the SDK's `SandboxHttp`) and
//! natively (benchmarks).

use capstan_sdk::http::{HttpClient, HttpError, Method, Request, Response, SandboxHttp};
use capstan_sdk::{
    AddressKind, BootstrapData, BootstrapFormat, Deletion, FoundInstance, InstanceCapacity,
    InstanceState, Machine, MachineAddress, MachineStatus, PluginError, Provider,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Instance types the simulated cloud offers.
pub const INSTANCE_TYPES: [&str; 3] = ["small", "medium", "large"];

/// Provider configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimConfig {
    /// Base URL of the simulated cloud API.
    pub endpoint: String,
    /// One of [`INSTANCE_TYPES`]; default `small`.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// Tags put on the instance at creation (`sim-tagger` changes them in
    /// place). Keys under `capstan.dev/` are the provider's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// The provider, over any HTTP client.
#[derive(Debug, Default, Clone)]
pub struct SimProvider<C = SandboxHttp> {
    http: C,
}

impl<C> SimProvider<C> {
    /// A provider sending its requests through `http`.
    pub fn with_client(http: C) -> Self {
        SimProvider { http }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    id: String,
    state: String,
    version: Option<String>,
    failure_domain: Option<String>,
    private_ip: Option<String>,
    hostname: Option<String>,
    update: Option<UpdateStatus>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateStatus {
    target_version: String,
    percent: u8,
}

#[derive(Debug, Deserialize)]
struct InstanceList {
    instances: Vec<Instance>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CreateInstance<'a> {
    client_token: &'a str,
    name: &'a str,
    version: Option<&'a str>,
    instance_type: Option<&'a str>,
    failure_domain: Option<&'a str>,
    tags: BTreeMap<&'a str, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_data: Option<UserData>,
}

/// The instance's bootstrap data, as the simulated cloud takes it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct UserData {
    /// `cloud-config`, `ignition` or `shell`.
    format: &'static str,
    /// Base64 of the data.
    value: String,
}

impl UserData {
    fn from(data: &BootstrapData) -> Self {
        UserData {
            format: match data.format {
                BootstrapFormat::CloudConfig => "cloud-config",
                BootstrapFormat::Ignition => "ignition",
                BootstrapFormat::Shell => "shell",
            },
            value: data.to_base64(),
        }
    }
}

const PROVIDER_ID_PREFIX: &str = "sim://";
/// The tag naming the machine (`namespace/name`) an instance was launched
/// for, and the one naming its cluster.
const MACHINE_TAG: &str = "capstan.dev/machine";
const CLUSTER_TAG: &str = "capstan.dev/cluster";

impl<C: HttpClient> SimProvider<C> {
    fn send(&self, request: Request) -> Result<Response, PluginError> {
        self.http.send(&request).map_err(|e| match e {
            HttpError::Denied(m) => PluginError::unauthorized(m),
            HttpError::InvalidUrl(m) => PluginError::invalid_config(format!("endpoint: {m}")),
            HttpError::Transport(m) => PluginError::transient(m, 2_000),
            HttpError::Unavailable => PluginError::terminal(HttpError::Unavailable.to_string()),
        })
    }

    fn url(config: &SimConfig, path: &str) -> String {
        format!("{}{path}", config.endpoint.trim_end_matches('/'))
    }

    /// The instance behind `machine`: by provider ID when known, otherwise by
    /// the client token (the machine uid), which survives a lost provider ID.
    fn instance_of(
        &self,
        machine: &Machine,
        config: &SimConfig,
    ) -> Result<Option<Instance>, PluginError> {
        if let Some(id) = machine.provider_id.as_deref() {
            let id = instance_id(id)?;
            let resp = self.send(Request::get(Self::url(
                config,
                &format!("/v1/instances/{id}"),
            )))?;
            return match resp.status {
                200 => Ok(Some(json(&resp)?)),
                404 => Ok(None),
                _ => Err(api_error(&resp, "describing the instance")),
            };
        }
        let resp = self.send(Request::get(Self::url(
            config,
            &format!("/v1/instances?clientToken={}", machine.uid),
        )))?;
        match resp.status {
            200 => Ok(json::<InstanceList>(&resp)?.instances.into_iter().next()),
            _ => Err(api_error(&resp, "looking up the instance by machine uid")),
        }
    }
}

impl<C: HttpClient + Default> Provider for SimProvider<C> {
    type Config = SimConfig;

    fn validate(&self, config: &SimConfig) -> Result<(), PluginError> {
        if !(config.endpoint.starts_with("http://") || config.endpoint.starts_with("https://")) {
            return Err(PluginError::invalid_config(format!(
                "endpoint: `{}` must be an http:// or https:// URL",
                config.endpoint
            )));
        }
        if let Some(key) = config.tags.keys().find(|k| k.starts_with("capstan.dev/")) {
            return Err(PluginError::invalid_config(format!(
                "tags: `{key}` is reserved (keys under capstan.dev/ are set by the provider)"
            )));
        }
        if let Some(t) = &config.instance_type
            && !INSTANCE_TYPES.contains(&t.as_str())
        {
            return Err(PluginError::invalid_config(format!(
                "instanceType: `{t}` is not one of {}",
                INSTANCE_TYPES.join(", ")
            )));
        }
        Ok(())
    }

    fn create(
        &self,
        machine: &Machine,
        config: &SimConfig,
        bootstrap: Option<&BootstrapData>,
    ) -> Result<MachineStatus, PluginError> {
        let mut tags: BTreeMap<&str, String> = config
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        tags.insert(
            MACHINE_TAG,
            format!("{}/{}", machine.namespace, machine.name),
        );
        if let Some(cluster) = &machine.cluster_name {
            tags.insert(CLUSTER_TAG, cluster.clone());
        }
        let body = CreateInstance {
            client_token: &machine.uid,
            name: &machine.name,
            version: machine.version.as_deref(),
            instance_type: config.instance_type.as_deref(),
            failure_domain: machine.failure_domain.as_deref(),
            tags,
            user_data: bootstrap.map(UserData::from),
        };
        let resp = self.send(Request::json(
            Method::Post,
            Self::url(config, "/v1/instances"),
            &body,
        ))?;
        match resp.status {
            200 | 201 => Ok(status(json(&resp)?)),
            _ => Err(api_error(&resp, "creating the instance")),
        }
    }

    fn get(&self, machine: &Machine, config: &SimConfig) -> Result<MachineStatus, PluginError> {
        match self.instance_of(machine, config)? {
            Some(instance) => Ok(status(instance)),
            None => Err(PluginError::not_found(format!(
                "no instance for machine {}/{} (uid {})",
                machine.namespace, machine.name, machine.uid
            ))),
        }
    }

    fn delete(&self, machine: &Machine, config: &SimConfig) -> Result<Deletion, PluginError> {
        let Some(instance) = self.instance_of(machine, config)? else {
            return Ok(Deletion::Done);
        };
        let resp = self.send(Request::delete(Self::url(
            config,
            &format!("/v1/instances/{}", instance.id),
        )))?;
        match resp.status {
            404 => Ok(Deletion::Done),
            200 | 202 => Ok(Deletion::InProgress(250)),
            _ => Err(api_error(&resp, "deleting the instance")),
        }
    }

    fn find(
        &self,
        machine: &Machine,
        config: &SimConfig,
    ) -> Result<Option<FoundInstance>, PluginError> {
        let live = |i: &Instance| i.state != "terminating";
        let instance = if machine.provider_id.is_some() {
            self.instance_of(machine, config)?.filter(live)
        } else {
            let owner = format!("{}/{}", machine.namespace, machine.name);
            let resp = self.send(Request::get(Self::url(
                config,
                &format!("/v1/instances?tagKey={MACHINE_TAG}&tagValue={owner}"),
            )))?;
            if resp.status != 200 {
                return Err(api_error(&resp, "looking up instances by machine tag"));
            }
            json::<InstanceList>(&resp)?
                .instances
                .into_iter()
                .filter(|i| i.tags.get(MACHINE_TAG) == Some(&owner))
                .find(live)
        };
        Ok(instance.map(|mut i| FoundInstance {
            machine: i.tags.remove(MACHINE_TAG),
            cluster: i.tags.remove(CLUSTER_TAG),
            status: status(i),
        }))
    }

    fn capacity(&self, config: &SimConfig) -> Result<Option<InstanceCapacity>, PluginError> {
        /// What the simulated cloud says of one instance type.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct InstanceType {
            cpus: u32,
            #[serde(rename = "memoryMiB")]
            memory_mib: u64,
            max_pods: Option<u32>,
            #[serde(rename = "ephemeralDiskMiB")]
            ephemeral_disk_mib: Option<u64>,
        }
        let name = config.instance_type.as_deref().unwrap_or("small");
        let path = format!("/v1/instance-types/{name}");
        let resp = self.send(Request::get(Self::url(config, &path)))?;
        match resp.status {
            200 => {
                let t: InstanceType = json(&resp)?;
                Ok(Some(InstanceCapacity {
                    cpu_millis: t.cpus.saturating_mul(1000),
                    memory_mib: t.memory_mib,
                    ephemeral_disk_mib: t.ephemeral_disk_mib,
                    max_pods: t.max_pods,
                    gpu_count: None,
                    gpu_type: None,
                }))
            }
            404 => Ok(None),
            _ => Err(api_error(&resp, "describing the instance type")),
        }
    }

    fn list(&self, config: &SimConfig) -> Result<Option<Vec<MachineStatus>>, PluginError> {
        let resp = self.send(Request::get(Self::url(config, "/v1/instances")))?;
        match resp.status {
            200 => Ok(Some(
                json::<InstanceList>(&resp)?
                    .instances
                    .into_iter()
                    .map(status)
                    .collect(),
            )),
            _ => Err(api_error(&resp, "listing instances")),
        }
    }
}

fn instance_id(provider_id: &str) -> Result<&str, PluginError> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|id| !id.is_empty() && !id.contains(['/', '?', '#']))
        .ok_or_else(|| {
            PluginError::terminal(format!(
                "provider ID `{provider_id}` is not a {PROVIDER_ID_PREFIX}<instance-id> ID"
            ))
        })
}

fn json<T: serde::de::DeserializeOwned>(resp: &Response) -> Result<T, PluginError> {
    resp.json()
        .map_err(|e| PluginError::transient(e.to_string(), 2_000))
}

fn status(i: Instance) -> MachineStatus {
    let state = match i.state.as_str() {
        "pending" => InstanceState::Pending,
        "running" => InstanceState::Running,
        "updating" => InstanceState::Updating,
        "terminating" => InstanceState::Stopping,
        "stopped" => InstanceState::Stopped,
        _ => InstanceState::Unknown,
    };
    let mut addresses = Vec::new();
    if let Some(ip) = i.private_ip {
        addresses.push(MachineAddress {
            kind: AddressKind::InternalIp,
            address: ip,
        });
    }
    if let Some(h) = i.hostname {
        addresses.push(MachineAddress {
            kind: AddressKind::Hostname,
            address: h,
        });
    }
    let message = i
        .update
        .map(|u| format!("updating to {} ({}%)", u.target_version, u.percent));
    MachineStatus {
        provider_id: format!("{PROVIDER_ID_PREFIX}{}", i.id),
        state,
        addresses,
        failure_domain: i.failure_domain,
        version: i.version,
        message,
    }
}

/// Map a non-success API answer to the contract's error kinds.
fn api_error(resp: &Response, doing: &str) -> PluginError {
    let detail = match resp.json::<serde_json::Value>() {
        Ok(v) => format!(
            "{}: {}",
            v["code"].as_str().unwrap_or("Unknown"),
            v["message"].as_str().unwrap_or("")
        ),
        Err(_) => resp.text().chars().take(200).collect(),
    };
    let message = format!("{doing}: HTTP {} {detail}", resp.status);
    match resp.status {
        401 | 403 => PluginError::unauthorized(message),
        404 => PluginError::not_found(message),
        429 => {
            let secs = resp
                .header("retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1);
            PluginError::transient(message, secs.saturating_mul(1_000))
        }
        // Stock-out: capacity may come back, but not within a second.
        503 => PluginError::transient(message, 5_000),
        500..=599 => PluginError::transient(message, 1_000),
        400 | 422 => PluginError::invalid_config(message),
        _ => PluginError::terminal(message),
    }
}

#[cfg(feature = "export")]
capstan_sdk::export_provider!(SimProvider, manifest: "capstan-plugin.json");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip_and_reject_foreign_ones() {
        assert_eq!(instance_id("sim://i-000001").unwrap(), "i-000001");
        for bad in ["aws:///us-east-1/i-1", "sim://", "sim://../admin"] {
            let err = instance_id(bad).unwrap_err();
            assert!(matches!(err, PluginError::Terminal(_)), "{bad}");
        }
    }

    #[test]
    fn throttling_becomes_transient_with_retry_after() {
        let resp = Response {
            status: 429,
            headers: vec![("Retry-After".into(), "3".into())],
            body: br#"{"code":"Throttling","message":"slow down"}"#.to_vec(),
        };
        match api_error(&resp, "creating") {
            PluginError::Transient(t) => {
                assert_eq!(t.retry_after_ms, 3_000);
                assert!(t.message.contains("Throttling"), "{}", t.message);
            }
            other => panic!("expected transient, got {other}"),
        }
    }

    #[test]
    fn config_validation_names_the_field() {
        let p = SimProvider::<SandboxHttp>::default();
        let bad = SimConfig {
            tags: BTreeMap::new(),
            endpoint: "127.0.0.1:1".into(),
            instance_type: None,
        };
        assert!(
            p.validate(&bad)
                .unwrap_err()
                .to_string()
                .contains("endpoint")
        );
        let bad = SimConfig {
            tags: BTreeMap::new(),
            endpoint: "http://x".into(),
            instance_type: Some("huge".into()),
        };
        assert!(
            p.validate(&bad)
                .unwrap_err()
                .to_string()
                .contains("instanceType")
        );
    }
}
