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
//! EC2 is eventually consistent and `RunInstances` answers can be lost, so
//! the machine-uid tag (`capstan.dev/machine-uid`) is the source of truth:
//!
//! - `create`: an instance already tagged with the uid is the answer (the
//!   earliest; later duplicates are terminated); else `RunInstances` with
//!   `ClientToken` = machine uid. `IdempotentParameterMismatch` means the
//!   instance exists: it is looked up again, never a failure. Quota errors
//!   (`InstanceLimitExceeded`, `VcpuLimitExceeded`) retry every 30 s.
//! - `get`: the uid tag search, which also turns up duplicates (terminated);
//!   else `DescribeInstances` by the id in the provider ID (`aws:///ZONE/i-…`,
//!   as Cluster API's AWS provider writes it), refused when that instance
//!   carries another machine's uid. An id EC2 does not list at all was just
//!   launched (terminated ones stay listed for about an hour): transient.
//! - `delete`: `TerminateInstances` for every live instance with the uid;
//!   done only when the tag search finds none.
//! - `list-instances`: every instance carrying the machine-uid tag.
//! - `find-instance`: by the provider ID when the machine has one, else
//!   the earliest launched live instance whose `capstan.dev/machine` tag
//!   names the machine's namespace and name (a restored Machine has a new
//!   uid). `get` and `delete` then act on it by id: an instance is the
//!   machine's when its uid tag or its machine tag says so, or when it
//!   carries neither (launched outside Capstan, adopted where an admin
//!   allows); one tagged for another machine is refused.
//! - `capacity`: `DescribeInstanceTypes` for the config's instance type:
//!   its default vCPUs, memory and GPUs (for the cluster-autoscaler's
//!   scale from zero).
//!
//! The logic is generic over [`HttpClient`], so it is unit-tested natively.

use capstan_sdk::http::{HttpClient, HttpError, Method, Request, Response, SandboxHttp};
use capstan_sdk::{
    AddressKind, BootstrapData, Deletion, FoundInstance, InstanceCapacity, InstanceState, Machine,
    MachineAddress, MachineStatus, PluginError, Provider,
};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The EC2 API version the plugin speaks.
pub const API_VERSION: &str = "2016-11-15";
/// The tag carrying the machine uid: the idempotency key of `create`.
pub const UID_TAG: &str = "capstan.dev/machine-uid";
/// How long a launch refused for a quota waits before it is tried again.
pub const QUOTA_RETRY_MS: u64 = 30_000;
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
pub struct Ec2Provider<C = SandboxHttp> {
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
    /// `launchTime` (ISO 8601, so it sorts as text).
    pub launch_time: Option<String>,
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

    /// Every instance tagged with `machine`'s uid, terminated ones
    /// included, in launch order (earliest first).
    fn tagged(&self, machine: &Machine, config: &Ec2Config) -> Result<Vec<Instance>, PluginError> {
        let mut found = self.describe(
            config,
            &[
                ("Filter.1.Name".into(), format!("tag:{UID_TAG}")),
                ("Filter.1.Value.1".into(), machine.uid.clone()),
            ],
        )?;
        found.sort_by(|a, b| (&a.launch_time, &a.id).cmp(&(&b.launch_time, &b.id)));
        Ok(found)
    }

    /// The instance `id`, looked up directly; `None` when EC2 does not list
    /// it. An instance carrying another machine's uid is never ours: a
    /// provider ID pointing at it is refused, so nothing acts on it.
    fn by_id(
        &self,
        machine: &Machine,
        config: &Ec2Config,
        id: &str,
    ) -> Result<Option<Instance>, PluginError> {
        let found = match self.describe(config, &[("InstanceId.1".into(), id.to_string())]) {
            Err(PluginError::NotFound(_)) => return Ok(None),
            other => other?,
        };
        let Some(instance) = found.into_iter().find(|i| i.id == id) else {
            return Ok(None);
        };
        let owner = format!("{}/{}", machine.namespace, machine.name);
        match (instance.tags.get(UID_TAG), instance.tags.get(MACHINE_TAG)) {
            (Some(uid), _) if *uid == machine.uid => Ok(Some(instance)),
            // The same Machine under a new uid (restored, re-applied,
            // moved): the host adopted it through `find-instance`.
            (_, Some(tagged)) if *tagged == owner => Ok(Some(instance)),
            // Launched outside Capstan: adopted by its provider ID, which
            // the host allows only where an admin granted it.
            (None, None) => Ok(Some(instance)),
            (uid, tagged) => Err(PluginError::terminal(format!(
                "instance {id} carries {UID_TAG}={} and {MACHINE_TAG}={}, not this machine's ({} / {owner}): refusing to act on another machine's instance (is status.providerID right?)",
                uid.map_or("(none)", String::as_str),
                tagged.map_or("(none)", String::as_str),
                machine.uid
            ))),
        }
    }

    /// Terminate every instance in `extra` (duplicates launched under one
    /// uid: a retried `RunInstances` whose first answer was lost). Best
    /// effort: the next look finds any that remain.
    fn terminate_all(&self, config: &Ec2Config, extra: &[&Instance]) -> Result<(), PluginError> {
        if extra.is_empty() {
            return Ok(());
        }
        let params: Vec<(String, String)> = extra
            .iter()
            .enumerate()
            .map(|(i, instance)| (format!("InstanceId.{}", i + 1), instance.id.clone()))
            .collect();
        match self.call(config, "TerminateInstances", &params) {
            Ok(_) | Err(PluginError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Test hook: the live instance a machine without a provider ID has.
    #[cfg(test)]
    fn live_tagged(
        &self,
        machine: &Machine,
        config: &Ec2Config,
    ) -> Result<Option<Instance>, PluginError> {
        Ok(self
            .tagged(machine, config)?
            .into_iter()
            .find(|i| i.state != "terminated"))
    }
}

/// Whether an instance is still alive (not terminated, not on its way).
fn live(i: &Instance) -> bool {
    i.state != "terminated" && i.state != "shutting-down"
}

impl<C: HttpClient + Default> Provider for Ec2Provider<C> {
    type Config = Ec2Config;

    fn validate(&self, config: &Ec2Config) -> Result<(), PluginError> {
        validate(config)
    }

    /// Launch the machine's instance, once: an instance already tagged with
    /// its uid is the answer (the earliest, with any later duplicates
    /// terminated); `RunInstances` carries the uid as `ClientToken`.
    fn create(
        &self,
        machine: &Machine,
        config: &Ec2Config,
        bootstrap: Option<&BootstrapData>,
    ) -> Result<MachineStatus, PluginError> {
        validate(config)?;
        let params = run_params(machine, config, bootstrap)?;
        let tagged = self.tagged(machine, config)?;
        let alive: Vec<&Instance> = tagged.iter().filter(|i| live(i)).collect();
        if let Some((first, duplicates)) = alive.split_first() {
            self.terminate_all(config, duplicates)?;
            return Ok(status((*first).clone()));
        }
        let xml = match self.call(config, "RunInstances", &params) {
            Ok(xml) => xml,
            // The token was used with other parameters: an instance for this
            // machine was launched (a lost answer, then an edited config).
            // It shows up under the uid tag; until it does, try again.
            Err(PluginError::Terminal(m)) if m.contains("IdempotentParameterMismatch") => {
                let tagged = self.tagged(machine, config)?;
                return match tagged.into_iter().find(live) {
                    Some(instance) => Ok(status(instance)),
                    None => Err(PluginError::transient(
                        format!("{m}; an instance for this machine exists but is not listed yet"),
                        5_000,
                    )),
                };
            }
            Err(e) => return Err(e),
        };
        let (mut launched, _) = parse_instances(&xml)?;
        let instance = launched.pop().ok_or_else(|| {
            PluginError::transient("RunInstances answered without an instance", 2_000)
        })?;
        Ok(status(instance))
    }

    /// The machine's instance by the uid tag (which also turns up
    /// duplicates, terminated here), else by its id. EC2 lists terminated
    /// instances for about an hour, so an id it does not list at all was
    /// launched moments ago: that is transient, not gone.
    fn get(&self, machine: &Machine, config: &Ec2Config) -> Result<MachineStatus, PluginError> {
        let Some(pid) = machine.provider_id.as_deref() else {
            return Err(PluginError::not_found(format!(
                "machine {}/{} has no instance yet",
                machine.namespace, machine.name
            )));
        };
        let id = instance_id(pid)?;
        let tagged = self.tagged(machine, config)?;
        if let Some(own) = tagged.iter().find(|i| i.id == id) {
            let duplicates: Vec<&Instance> =
                tagged.iter().filter(|i| i.id != id && live(i)).collect();
            self.terminate_all(config, &duplicates)?;
            if own.state == "terminated" {
                return Err(PluginError::not_found(format!(
                    "EC2 instance {id} is terminated"
                )));
            }
            return Ok(status(own.clone()));
        }
        match self.by_id(machine, config, id)? {
            Some(instance) if instance.state == "terminated" => Err(PluginError::not_found(
                format!("EC2 instance {id} is terminated"),
            )),
            Some(instance) => Ok(status(instance)),
            None => Err(PluginError::transient(
                format!(
                    "EC2 does not list instance {id} yet (InvalidInstanceID.NotFound right after a launch is eventual consistency)"
                ),
                2_000,
            )),
        }
    }

    /// Terminate every live instance of the machine; done only when a
    /// search by its uid tag finds none (duplicates included), never on a
    /// NotFound alone.
    fn delete(&self, machine: &Machine, config: &Ec2Config) -> Result<Deletion, PluginError> {
        let tagged = self.tagged(machine, config)?;
        let mut alive: Vec<Instance> = tagged
            .iter()
            .filter(|i| i.state != "terminated")
            .cloned()
            .collect();
        if let Some(pid) = machine.provider_id.as_deref() {
            let id = instance_id(pid)?;
            if !tagged.iter().any(|i| i.id == id) {
                // Not under the tag (yet): the id may still be live.
                if let Some(instance) = self.by_id(machine, config, id)?
                    && instance.state != "terminated"
                {
                    alive.push(instance);
                }
            }
        }
        if alive.is_empty() {
            return Ok(Deletion::Done);
        }
        let running: Vec<&Instance> = alive
            .iter()
            .filter(|i| i.state != "shutting-down")
            .collect();
        // EC2 takes about a minute to terminate: look again in a few seconds.
        if running.is_empty() {
            return Ok(Deletion::InProgress(5_000));
        }
        self.terminate_all(config, &running)?;
        Ok(Deletion::InProgress(2_000))
    }

    /// By provider ID: that instance (never one tagged for another
    /// machine). Otherwise the earliest launched live instance tagged for
    /// the machine's namespace and name.
    fn find(
        &self,
        machine: &Machine,
        config: &Ec2Config,
    ) -> Result<Option<FoundInstance>, PluginError> {
        let instance = match machine.provider_id.as_deref() {
            Some(pid) => {
                let id = instance_id(pid)?;
                let found = match self.describe(config, &[("InstanceId.1".into(), id.to_string())])
                {
                    Err(PluginError::NotFound(_)) => vec![],
                    other => other?,
                };
                found.into_iter().find(|i| i.id == id)
            }
            None => {
                let owner = format!("{}/{}", machine.namespace, machine.name);
                let mut found = self.describe(
                    config,
                    &[
                        ("Filter.1.Name".into(), format!("tag:{MACHINE_TAG}")),
                        ("Filter.1.Value.1".into(), owner.clone()),
                    ],
                )?;
                found.retain(|i| i.tags.get(MACHINE_TAG) == Some(&owner));
                found.sort_by(|a, b| (&a.launch_time, &a.id).cmp(&(&b.launch_time, &b.id)));
                found.into_iter().find(live)
            }
        };
        Ok(instance.filter(live).map(|mut i| FoundInstance {
            machine: i.tags.remove(MACHINE_TAG),
            cluster: i.tags.remove(CLUSTER_TAG),
            status: status(i),
        }))
    }

    fn capacity(&self, config: &Ec2Config) -> Result<Option<InstanceCapacity>, PluginError> {
        let params = [("InstanceType.1".to_string(), config.instance_type.clone())];
        let xml = self.call(config, "DescribeInstanceTypes", &params)?;
        parse_instance_type(&xml, &config.instance_type)
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
/// EC2's limit on user data, before base64.
pub const MAX_USER_DATA_BYTES: usize = 16 * 1024;

/// `RunInstances` parameters; bootstrap data over [`MAX_USER_DATA_BYTES`]
/// is refused before any call, naming its size.
pub fn run_params(
    machine: &Machine,
    config: &Ec2Config,
    bootstrap: Option<&BootstrapData>,
) -> Result<Vec<(String, String)>, PluginError> {
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
    if let Some(data) = bootstrap {
        if data.value.len() > MAX_USER_DATA_BYTES {
            return Err(PluginError::invalid_config(format!(
                "bootstrap data: {} bytes is over EC2's user data limit of {MAX_USER_DATA_BYTES} bytes (before base64); shorten the bootstrap configuration (files, commands)",
                data.value.len()
            )));
        }
        p.push(("UserData".into(), data.to_base64()));
    }
    Ok(p)
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
            launch_time: text(item, &["launchTime"]),
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

/// The capacity of `instance_type` in a `DescribeInstanceTypesResponse`;
/// `None` when EC2 does not describe it. GPUs count toward the type the
/// device plugin of their maker advertises (`nvidia.com/gpu`,
/// `amd.com/gpu`); another maker's are left out.
pub fn parse_instance_type(
    xml: &str,
    instance_type: &str,
) -> Result<Option<InstanceCapacity>, PluginError> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| {
        PluginError::transient(format!("EC2 answered with malformed XML: {e}"), 2_000)
    })?;
    let Some(item) = doc
        .descendants()
        .filter(|n| n.has_tag_name("item"))
        .find(|n| text(*n, &["instanceType"]).as_deref() == Some(instance_type))
    else {
        return Ok(None);
    };
    let number = |path: &[&str]| text(item, path).and_then(|t| t.trim().parse::<u64>().ok());
    let (Some(cpus), Some(memory_mib)) = (
        number(&["vCpuInfo", "defaultVCpus"]),
        number(&["memoryInfo", "sizeInMiB"]),
    ) else {
        return Ok(None);
    };
    let mut gpu_count = 0u32;
    let mut gpu_type = None;
    if let Some(gpus) = child(item, "gpuInfo").and_then(|g| child(g, "gpus")) {
        for gpu in gpus.children().filter(|c| c.has_tag_name("item")) {
            let kind = match text(gpu, &["manufacturer"]).as_deref() {
                Some("NVIDIA") => "nvidia.com/gpu",
                Some("AMD") => "amd.com/gpu",
                _ => continue,
            };
            let count = text(gpu, &["count"]).and_then(|c| c.parse::<u32>().ok());
            gpu_count = gpu_count.saturating_add(count.unwrap_or(0));
            gpu_type = Some(kind.to_string());
        }
    }
    Ok(Some(InstanceCapacity {
        cpu_millis: u32::try_from(cpus.saturating_mul(1000)).unwrap_or(u32::MAX),
        memory_mib,
        ephemeral_disk_mib: None,
        max_pods: None,
        gpu_count: (gpu_count > 0).then_some(gpu_count),
        gpu_type: gpu_type.filter(|_| gpu_count > 0),
    }))
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
        // A quota: lifted by a support case or a limit increase, which
        // takes minutes, so asking every few seconds only adds noise.
        "InstanceLimitExceeded" | "VcpuLimitExceeded" | "MaxSpotInstanceCountExceeded" => {
            PluginError::transient(
                format!(
                    "{detail} (retried every {} s until the quota allows it)",
                    QUOTA_RETRY_MS / 1000
                ),
                QUOTA_RETRY_MS,
            )
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
