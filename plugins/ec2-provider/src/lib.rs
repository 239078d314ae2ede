//! `ec2-provider`: a Capstan provider plugin for Amazon EC2, over the EC2
//! Query API (`Version=2016-11-15`). The host signs every request (AWS
//! Signature Version 4, credential slot `aws`); the plugin never sees keys.
//!
//! Provider config (the Machine's `spec.provider.config`), see
//! `plugins/ec2-provider/README.md`:
//!
//! ```json
//! {"region": "us-east-1", "instanceType": "t3.medium", "imageId": "ami-0abcdef1234567890",
//!  "subnetId": "subnet-0123", "securityGroupIds": ["sg-0123"], "keyName": "ops",
//!  "tags": {"team": "platform"}, "rootVolumeSizeGiB": 40}
//! ```
//!
//! - `create`: looks the instance up by the `capstan.dev/machine-uid` tag
//!   first (a test double, and EC2 after its token expiry, may not honour
//!   `ClientToken`), then `RunInstances` with `ClientToken` = machine uid.
//! - `get`: `DescribeInstances` by the instance id in the provider ID
//!   (`aws:///ZONE/i-…`, as Cluster API's AWS provider writes it).
//! - `delete`: `TerminateInstances`, `in-progress` until `terminated`.
//! - `list-instances`: every instance carrying the machine-uid tag.
//!
//! The logic is generic over [`HttpClient`], so it is unit-tested natively.

use capstan_sdk::http::{HttpClient, HttpError, Method, Request, Response, WasiHttp};
use capstan_sdk::{
    AddressKind, Deletion, InstanceState, Machine, MachineAddress, MachineStatus, PluginError,
    Provider,
};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The EC2 API version the plugin speaks.
pub const API_VERSION: &str = "2016-11-15";
/// The tag carrying the machine uid: the idempotency key of `create`.
pub const UID_TAG: &str = "capstan.dev/machine-uid";
/// The tag naming the Machine (`namespace/name`).
pub const MACHINE_TAG: &str = "capstan.dev/machine";
/// The tag naming the cluster, when the machine has one.
pub const CLUSTER_TAG: &str = "capstan.dev/cluster";

/// Provider configuration.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ec2Config {
    /// AWS region, e.g. `us-east-1`. It must match the region of the host's
    /// signing grant.
    pub region: String,
    /// Override the API endpoint (default `https://ec2.REGION.amazonaws.com`),
    /// e.g. a VPC endpoint, or a test double such as moto.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Instance type, e.g. `t3.medium`.
    pub instance_type: String,
    /// AMI id, `ami-…`.
    pub image_id: String,
    /// Subnet to launch into, `subnet-…` (default: the default VPC's).
    #[serde(default)]
    pub subnet_id: Option<String>,
    /// Security groups, `sg-…`.
    #[serde(default)]
    pub security_group_ids: Vec<String>,
    /// EC2 key pair name for SSH.
    #[serde(default)]
    pub key_name: Option<String>,
    /// Extra tags on the instance.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Root volume size in GiB (default: the AMI's).
    #[serde(default, rename = "rootVolumeSizeGiB")]
    pub root_volume_size_gib: Option<u32>,
    /// Root device name for `rootVolumeSizeGiB` (default `/dev/xvda`).
    #[serde(default)]
    pub root_device_name: Option<String>,
}

impl Ec2Config {
    fn endpoint(&self) -> String {
        match &self.endpoint {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => format!("https://ec2.{}.amazonaws.com", self.region),
        }
    }
}

/// The provider, over any HTTP client.
#[derive(Debug, Default, Clone)]
pub struct Ec2Provider<C = WasiHttp> {
    http: C,
}

impl<C> Ec2Provider<C> {
    /// A provider sending its requests through `http`.
    pub fn with_client(http: C) -> Self {
        Ec2Provider { http }
    }
}

/// One instance, as `DescribeInstances` and `RunInstances` describe it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Instance {
    pub id: String,
    pub state: String,
    pub zone: Option<String>,
    pub private_ip: Option<String>,
    pub public_ip: Option<String>,
    pub private_dns: Option<String>,
    pub public_dns: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl<C: HttpClient> Ec2Provider<C> {
    /// Call one EC2 action and parse the XML answer.
    fn call(
        &self,
        config: &Ec2Config,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, PluginError> {
        let mut body = format!("Action={action}&Version={API_VERSION}");
        for (k, v) in params {
            body.push('&');
            body.push_str(&form_encode(k));
            body.push('=');
            body.push_str(&form_encode(v));
        }
        let mut request = Request::new(Method::Post, format!("{}/", config.endpoint())).header(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8",
        );
        request.body = body.into_bytes();
        let resp = self.http.send(&request).map_err(|e| match e {
            HttpError::Denied(m) => PluginError::unauthorized(format!(
                "{m}; grant the endpoint on the Plugin (spec.grants.http) with an AwsSigV4 credential for slot \"aws\""
            )),
            HttpError::InvalidUrl(m) => PluginError::invalid_config(format!("endpoint: {m}")),
            HttpError::Transport(m) => PluginError::transient(format!("{action}: {m}"), 2_000),
            HttpError::Unavailable => PluginError::terminal(HttpError::Unavailable.to_string()),
        })?;
        let text = String::from_utf8_lossy(&resp.body).into_owned();
        if (200..300).contains(&resp.status) {
            Ok(text)
        } else {
            Err(api_error(action, &resp, &text))
        }
    }

    fn describe(
        &self,
        config: &Ec2Config,
        params: &[(String, String)],
    ) -> Result<Vec<Instance>, PluginError> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        // Pages are bounded by the host's per-call request budget too.
        for _ in 0..20 {
            let mut p = params.to_vec();
            if let Some(t) = &token {
                p.push(("NextToken".into(), t.clone()));
            }
            let xml = self.call(config, "DescribeInstances", &p)?;
            let (page, next) = parse_instances(&xml)?;
            all.extend(page);
            match next {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(all),
            }
        }
        Ok(all)
    }

    /// The live (not terminated) instance launched for `machine`, by its
    /// provider ID when known, otherwise by the machine-uid tag.
    fn find(&self, machine: &Machine, config: &Ec2Config) -> Result<Option<Instance>, PluginError> {
        let found = match machine.provider_id.as_deref() {
            Some(pid) => {
                let id = instance_id(pid)?;
                match self.describe(config, &[("InstanceId.1".into(), id.to_string())]) {
                    Err(PluginError::NotFound(_)) => Vec::new(),
                    other => other?,
                }
            }
            None => self.describe(
                config,
                &[
                    ("Filter.1.Name".into(), format!("tag:{UID_TAG}")),
                    ("Filter.1.Value.1".into(), machine.uid.clone()),
                ],
            )?,
        };
        Ok(found.into_iter().find(|i| i.state != "terminated"))
    }
}

impl<C: HttpClient + Default> Provider for Ec2Provider<C> {
    type Config = Ec2Config;

    fn validate(&self, config: &Ec2Config) -> Result<(), PluginError> {
        validate(config)
    }

    fn create(&self, machine: &Machine, config: &Ec2Config) -> Result<MachineStatus, PluginError> {
        validate(config)?;
        if let Some(existing) = self.find(machine, config)? {
            return Ok(status(existing));
        }
        let xml = self.call(config, "RunInstances", &run_params(machine, config))?;
        let (mut launched, _) = parse_instances(&xml)?;
        let instance = launched.pop().ok_or_else(|| {
            PluginError::transient("RunInstances answered without an instance", 2_000)
        })?;
        Ok(status(instance))
    }

    fn get(&self, machine: &Machine, config: &Ec2Config) -> Result<MachineStatus, PluginError> {
        match self.find(machine, config)? {
            Some(instance) => Ok(status(instance)),
            None => Err(PluginError::not_found(format!(
                "no live instance for machine {}/{} (uid {})",
                machine.namespace, machine.name, machine.uid
            ))),
        }
    }

    fn delete(&self, machine: &Machine, config: &Ec2Config) -> Result<Deletion, PluginError> {
        let Some(instance) = self.find(machine, config)? else {
            return Ok(Deletion::Done);
        };
        if instance.state == "shutting-down" {
            return Ok(Deletion::InProgress(75));
        }
        match self.call(
            config,
            "TerminateInstances",
            &[("InstanceId.1".into(), instance.id.clone())],
        ) {
            Ok(_) | Err(PluginError::NotFound(_)) => Ok(Deletion::InProgress(50)),
            Err(e) => Err(e),
        }
    }

    fn list(&self, config: &Ec2Config) -> Result<Option<Vec<MachineStatus>>, PluginError> {
        let instances = self.describe(
            config,
            &[
                ("Filter.1.Name".into(), "tag-key".into()),
                ("Filter.1.Value.1".into(), UID_TAG.into()),
            ],
        )?;
        Ok(Some(
            instances
                .into_iter()
                .filter(|i| i.state != "terminated")
                .map(status)
                .collect(),
        ))
    }
}

/// Check a config without calling AWS; errors name the field.
pub fn validate(config: &Ec2Config) -> Result<(), PluginError> {
    let bad =
        |field: &str, why: String| Err(PluginError::invalid_config(format!("{field}: {why}")));
    let region_ok = {
        let parts: Vec<&str> = config.region.split('-').collect();
        parts.len() >= 3
            && parts.iter().all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            })
            && parts
                .last()
                .is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()))
    };
    if !region_ok {
        return bad(
            "region",
            format!("`{}` is not an AWS region such as us-east-1", config.region),
        );
    }
    if let Some(e) = &config.endpoint
        && !(e.starts_with("https://") || e.starts_with("http://"))
    {
        return bad(
            "endpoint",
            format!("`{e}` must be an http:// or https:// URL"),
        );
    }
    let family_size = config.instance_type.split_once('.');
    if !family_size.is_some_and(|(f, s)| !f.is_empty() && !s.is_empty()) {
        return bad(
            "instanceType",
            format!(
                "`{}` is not an instance type such as t3.medium",
                config.instance_type
            ),
        );
    }
    let prefixed = |field: &str, value: &str, prefix: &str| {
        if value.len() > prefix.len() && value.starts_with(prefix) {
            Ok(())
        } else {
            bad(field, format!("`{value}` must start with `{prefix}`"))
        }
    };
    prefixed("imageId", &config.image_id, "ami-")?;
    if let Some(s) = &config.subnet_id {
        prefixed("subnetId", s, "subnet-")?;
    }
    for (i, sg) in config.security_group_ids.iter().enumerate() {
        prefixed(&format!("securityGroupIds[{i}]"), sg, "sg-")?;
    }
    if config.key_name.as_deref() == Some("") {
        return bad(
            "keyName",
            "must not be empty (leave it out for no key pair)".into(),
        );
    }
    for key in config.tags.keys() {
        if key.starts_with("aws:")
            || key.starts_with("capstan.dev/")
            || key.is_empty()
            || key.len() > 128
        {
            return bad(
                "tags",
                format!(
                    "key `{key}` is reserved or invalid (aws: and capstan.dev/ prefixes are reserved; 1 to 128 characters)"
                ),
            );
        }
    }
    if let Some(size) = config.root_volume_size_gib
        && !(1..=16_384).contains(&size)
    {
        return bad("rootVolumeSizeGiB", format!("{size} is outside 1..=16384"));
    }
    Ok(())
}

/// The `RunInstances` parameters for one machine.
pub fn run_params(machine: &Machine, config: &Ec2Config) -> Vec<(String, String)> {
    let mut p: Vec<(String, String)> = vec![
        ("ImageId".into(), config.image_id.clone()),
        ("InstanceType".into(), config.instance_type.clone()),
        ("MinCount".into(), "1".into()),
        ("MaxCount".into(), "1".into()),
        // At most 64 ASCII characters; a Kubernetes uid is 36.
        ("ClientToken".into(), machine.uid.chars().take(64).collect()),
    ];
    if let Some(s) = &config.subnet_id {
        p.push(("SubnetId".into(), s.clone()));
    } else if let Some(zone) = &machine.failure_domain {
        p.push(("Placement.AvailabilityZone".into(), zone.clone()));
    }
    for (i, sg) in config.security_group_ids.iter().enumerate() {
        p.push((format!("SecurityGroupId.{}", i + 1), sg.clone()));
    }
    if let Some(k) = &config.key_name {
        p.push(("KeyName".into(), k.clone()));
    }
    if let Some(size) = config.root_volume_size_gib {
        let device = config
            .root_device_name
            .clone()
            .unwrap_or_else(|| "/dev/xvda".into());
        p.push(("BlockDeviceMapping.1.DeviceName".into(), device));
        p.push((
            "BlockDeviceMapping.1.Ebs.VolumeSize".into(),
            size.to_string(),
        ));
    }
    let mut tags: Vec<(String, String)> = vec![
        ("Name".into(), machine.name.clone()),
        (UID_TAG.into(), machine.uid.clone()),
        (
            MACHINE_TAG.into(),
            format!("{}/{}", machine.namespace, machine.name),
        ),
    ];
    if let Some(cluster) = &machine.cluster_name {
        tags.push((CLUSTER_TAG.into(), cluster.clone()));
    }
    tags.extend(config.tags.iter().map(|(k, v)| (k.clone(), v.clone())));
    p.push(("TagSpecification.1.ResourceType".into(), "instance".into()));
    for (i, (k, v)) in tags.into_iter().enumerate() {
        p.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), k));
        p.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), v));
    }
    p
}

/// The instance id in an `aws:///ZONE/i-…` provider ID.
pub fn instance_id(provider_id: &str) -> Result<&str, PluginError> {
    provider_id
        .strip_prefix("aws:///")
        .and_then(|rest| rest.rsplit_once('/'))
        .map(|(_, id)| id)
        .filter(|id| {
            id.starts_with("i-")
                && id.len() > 2
                && id[2..].chars().all(|c| c.is_ascii_alphanumeric())
        })
        .ok_or_else(|| {
            PluginError::terminal(format!(
                "provider ID `{provider_id}` is not an aws:///ZONE/i-… ID"
            ))
        })
}

/// The provider ID of an instance, as Cluster API's AWS provider writes it.
pub fn provider_id(instance: &Instance) -> String {
    format!(
        "aws:///{}/{}",
        instance.zone.as_deref().unwrap_or(""),
        instance.id
    )
}

/// Map an instance to the contract's status.
pub fn status(i: Instance) -> MachineStatus {
    let state = match i.state.as_str() {
        "pending" => InstanceState::Pending,
        "running" => InstanceState::Running,
        "stopping" | "shutting-down" => InstanceState::Stopping,
        "stopped" => InstanceState::Stopped,
        "terminated" => InstanceState::Terminated,
        _ => InstanceState::Unknown,
    };
    let mut addresses = Vec::new();
    let mut add = |kind, value: &Option<String>| {
        if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
            addresses.push(MachineAddress {
                kind,
                address: v.clone(),
            });
        }
    };
    add(AddressKind::InternalIp, &i.private_ip);
    add(AddressKind::ExternalIp, &i.public_ip);
    add(AddressKind::InternalDns, &i.private_dns);
    add(AddressKind::ExternalDns, &i.public_dns);
    add(AddressKind::Hostname, &i.private_dns);
    MachineStatus {
        provider_id: provider_id(&i),
        message: Some(format!("EC2 instance {} is {}", i.id, i.state)),
        failure_domain: i.zone.clone(),
        state,
        addresses,
        version: None,
    }
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|c| c.has_tag_name(name))
}

fn text(node: roxmltree::Node<'_, '_>, path: &[&str]) -> Option<String> {
    let mut n = node;
    for name in path {
        n = child(n, name)?;
    }
    n.text().map(str::to_string)
}

/// Instances in a `DescribeInstancesResponse` (every reservation) or a
/// `RunInstancesResponse`, and the next page's token.
pub fn parse_instances(xml: &str) -> Result<(Vec<Instance>, Option<String>), PluginError> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| {
        PluginError::transient(format!("EC2 answered with malformed XML: {e}"), 2_000)
    })?;
    let root = doc.root_element();
    let instances = root
        .descendants()
        .filter(|n| n.has_tag_name("instancesSet"))
        .flat_map(|set| set.children().filter(|c| c.has_tag_name("item")))
        .map(|item| Instance {
            id: text(item, &["instanceId"]).unwrap_or_default(),
            state: text(item, &["instanceState", "name"]).unwrap_or_default(),
            zone: text(item, &["placement", "availabilityZone"]),
            private_ip: text(item, &["privateIpAddress"]),
            public_ip: text(item, &["ipAddress"]),
            private_dns: text(item, &["privateDnsName"]),
            public_dns: text(item, &["dnsName"]),
            tags: child(item, "tagSet")
                .map(|set| {
                    set.children()
                        .filter(|c| c.has_tag_name("item"))
                        .filter_map(|t| {
                            Some((text(t, &["key"])?, text(t, &["value"]).unwrap_or_default()))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .filter(|i| !i.id.is_empty())
        .collect();
    Ok((instances, text(root, &["nextToken"])))
}

/// Map an EC2 error answer (`<Response><Errors><Error><Code>…`) to the
/// contract's error kinds.
pub fn api_error(action: &str, resp: &Response, body: &str) -> PluginError {
    let (code, message) = roxmltree::Document::parse(body)
        .ok()
        .and_then(|doc| {
            let error = doc.descendants().find(|n| n.has_tag_name("Error"))?;
            Some((
                text(error, &["Code"])?,
                text(error, &["Message"]).unwrap_or_default(),
            ))
        })
        .unwrap_or_else(|| {
            (
                format!("HTTP{}", resp.status),
                body.chars().take(200).collect(),
            )
        });
    let detail = format!("{action}: {code}: {message}");
    let retry_after = resp
        .header("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| s.saturating_mul(1_000));
    match code.as_str() {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
            PluginError::transient(detail, retry_after.unwrap_or(2_000))
        }
        "InsufficientInstanceCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientCapacity"
        | "InsufficientAddressCapacity"
        | "Unavailable"
        | "ServiceUnavailable"
        | "InternalError"
        | "InternalFailure" => PluginError::transient(detail, retry_after.unwrap_or(10_000)),
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "Blocked"
        | "PendingVerification"
        | "RequestExpired" => PluginError::unauthorized(detail),
        c if c.starts_with("InvalidInstanceID.NotFound") || c == "InvalidInstanceID.Malformed" => {
            PluginError::not_found(detail)
        }
        c if c.starts_with("Invalid")
            || c.starts_with("MissingParameter")
            || c == "UnknownParameter"
            || c == "Unsupported"
            || c == "ValidationError" =>
        {
            PluginError::invalid_config(detail)
        }
        _ if resp.status >= 500 => PluginError::transient(detail, retry_after.unwrap_or(2_000)),
        _ => PluginError::terminal(detail),
    }
}

/// `application/x-www-form-urlencoded` with `%20` for spaces, as AWS expects.
fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(target_arch = "wasm32")]
capstan_sdk::export_provider!(Ec2Provider, manifest: "capstan-plugin.json");

#[cfg(test)]
mod tests;
