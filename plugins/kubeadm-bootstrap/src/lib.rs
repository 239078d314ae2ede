//! The kubeadm bootstrap plugin: renders cloud-init (`#cloud-config`) that
//! joins a machine to its cluster with `kubeadm join`, as Cluster API's
//! kubeadm bootstrap provider does for a worker's `KubeadmConfig`.
//!
//! What it writes:
//! - `/run/kubeadm/kubeadm-join-config.yaml`: a kubeadm `JoinConfiguration`
//!   (API version by the machine's Kubernetes version: `v1beta2` before
//!   1.22, `v1beta3` before 1.31, `v1beta4` after) with bootstrap token
//!   discovery: the API server endpoint, the token (the host's placeholder;
//!   the host puts the machine's token in its place) and the CA pin; the
//!   Node's name, labels and taints as the host gives them, and the
//!   kubelet's extra arguments;
//! - the configuration's own `files`, `users` and `ntp`;
//! - `runcmd`: `preKubeadmCommands`, `kubeadm join --config …`,
//!   `postKubeadmCommands`.
//!
//! The configuration ([`Config`]) is the join part of `KubeadmConfig`'s
//! spec. Start with [`render`]; the Wasm export is at the bottom.

use capstan_sdk::{Bootstrap, BootstrapData, BootstrapFormat, JoinInfo, Machine, PluginError};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Where the `JoinConfiguration` is written on the machine.
pub const JOIN_CONFIG_PATH: &str = "/run/kubeadm/kubeadm-join-config.yaml";

/// The bootstrap configuration: the join part of Cluster API's
/// `KubeadmConfigSpec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Extra files to write (cloud-init `write_files`).
    #[serde(default)]
    pub files: Vec<File>,
    /// Commands run before `kubeadm join`.
    #[serde(default)]
    pub pre_kubeadm_commands: Vec<String>,
    /// Commands run after `kubeadm join`.
    #[serde(default)]
    pub post_kubeadm_commands: Vec<String>,
    /// Users to create.
    #[serde(default)]
    pub users: Vec<User>,
    /// Time synchronisation.
    #[serde(default)]
    pub ntp: Option<Ntp>,
    /// Extra kubelet flags (`name: value`, without `--`). `node-labels` and
    /// `register-with-taints` come from the Machine and may not be set here.
    #[serde(default)]
    pub kubelet_extra_args: BTreeMap<String, String>,
    /// kubeadm preflight checks to skip.
    #[serde(default)]
    pub ignore_preflight_errors: Vec<String>,
    /// The container runtime's socket, if not the default.
    #[serde(default)]
    pub cri_socket: Option<String>,
}

/// A file cloud-init writes.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct File {
    /// Absolute path.
    pub path: String,
    /// The content, as text.
    pub content: String,
    /// `user:group`, default `root:root`.
    #[serde(default)]
    pub owner: Option<String>,
    /// Octal mode such as `0644`.
    #[serde(default)]
    pub permissions: Option<String>,
}

/// A user cloud-init creates.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct User {
    pub name: String,
    #[serde(default)]
    pub groups: Option<String>,
    #[serde(default)]
    pub shell: Option<String>,
    /// A sudoers rule, for example `ALL=(ALL) NOPASSWD:ALL`.
    #[serde(default)]
    pub sudo: Option<String>,
    #[serde(default)]
    pub ssh_authorized_keys: Vec<String>,
    #[serde(default)]
    pub lock_password: Option<bool>,
}

/// Time synchronisation.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ntp {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub servers: Vec<String>,
}

fn invalid(message: String) -> PluginError {
    PluginError::invalid_config(message)
}

/// One line, no control characters: what cloud-init and a shell take as
/// one value.
fn one_line(field: &str, value: &str) -> Result<(), PluginError> {
    if value.chars().any(|c| c.is_control()) {
        return Err(invalid(format!(
            "{field}: must be one line without control characters"
        )));
    }
    Ok(())
}

/// Check a configuration: paths, modes, names and the kubelet flags the
/// Machine owns.
pub fn validate(config: &Config) -> Result<(), PluginError> {
    let mut paths = std::collections::BTreeSet::new();
    for (i, f) in config.files.iter().enumerate() {
        if !f.path.starts_with('/') || f.path.contains("..") {
            return Err(invalid(format!(
                "files[{i}].path: `{}` must be an absolute path without `..`",
                f.path
            )));
        }
        one_line(&format!("files[{i}].path"), &f.path)?;
        if f.path == JOIN_CONFIG_PATH {
            return Err(invalid(format!(
                "files[{i}].path: {JOIN_CONFIG_PATH} is written by this plugin (the JoinConfiguration)"
            )));
        }
        if !paths.insert(f.path.as_str()) {
            return Err(invalid(format!(
                "files[{i}].path: `{}` is listed twice",
                f.path
            )));
        }
        if let Some(mode) = &f.permissions
            && !(mode.len() == 3 || mode.len() == 4)
                | !mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
        {
            return Err(invalid(format!(
                "files[{i}].permissions: `{mode}` is not an octal mode like 0644"
            )));
        }
        if let Some(owner) = &f.owner {
            one_line(&format!("files[{i}].owner"), owner)?;
        }
    }
    for (i, u) in config.users.iter().enumerate() {
        let ok = !u.name.is_empty()
            && u.name.len() <= 32
            && u.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            && !u.name.starts_with('-');
        if !ok {
            return Err(invalid(format!(
                "users[{i}].name: `{}` must be 1-32 lowercase letters, digits, '-' or '_'",
                u.name
            )));
        }
        for (k, key) in u.ssh_authorized_keys.iter().enumerate() {
            one_line(&format!("users[{i}].sshAuthorizedKeys[{k}]"), key)?;
        }
        if let Some(sudo) = &u.sudo {
            one_line(&format!("users[{i}].sudo"), sudo)?;
        }
    }
    for (i, c) in config.pre_kubeadm_commands.iter().enumerate() {
        one_line(&format!("preKubeadmCommands[{i}]"), c)?;
    }
    for (i, c) in config.post_kubeadm_commands.iter().enumerate() {
        one_line(&format!("postKubeadmCommands[{i}]"), c)?;
    }
    for (name, value) in &config.kubelet_extra_args {
        if name == "node-labels" || name == "register-with-taints" {
            return Err(invalid(format!(
                "kubeletExtraArgs.{name}: set by the host from the Machine (spec.taints, node labels); remove it here"
            )));
        }
        if name.starts_with('-') || name.is_empty() {
            return Err(invalid(format!(
                "kubeletExtraArgs: `{name}` must be a flag name without leading dashes"
            )));
        }
        one_line(&format!("kubeletExtraArgs.{name}"), value)?;
    }
    Ok(())
}

/// `(minor)` of a `v1.30.2`-like version; `None` when unreadable.
fn minor(version: &str) -> Option<u32> {
    let mut parts = version.trim_start_matches('v').split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    (major == 1).then_some(minor)
}

/// The kubeadm API version for a Kubernetes version (the newest one it
/// reads; the newest overall when the version is not given).
pub fn kubeadm_api(version: Option<&str>) -> &'static str {
    match version.and_then(minor) {
        Some(m) if m < 22 => "kubeadm.k8s.io/v1beta2",
        Some(m) if m < 31 => "kubeadm.k8s.io/v1beta3",
        _ => "kubeadm.k8s.io/v1beta4",
    }
}

/// The `JoinConfiguration` document (YAML).
pub fn join_configuration(config: &Config, join: &JoinInfo) -> Result<String, PluginError> {
    let endpoint = join
        .api_server_endpoints
        .first()
        .ok_or_else(|| PluginError::terminal("the host gave no API server endpoint"))?;
    let endpoint = endpoint
        .trim_start_matches("https://")
        .trim_end_matches('/');
    let api = kubeadm_api(join.kubernetes_version.as_deref());
    let mut args: BTreeMap<String, String> = config.kubelet_extra_args.clone();
    if !join.node_labels.is_empty() {
        let labels: Vec<String> = join
            .node_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        args.insert("node-labels".into(), labels.join(","));
    }
    let kubelet_args = if api.ends_with("v1beta4") {
        Value::Array(
            args.iter()
                .map(|(name, value)| json!({"name": name, "value": value}))
                .collect(),
        )
    } else {
        json!(args)
    };
    let taints: Vec<Value> = join
        .node_taints
        .iter()
        .map(|t| {
            let mut taint = Map::new();
            taint.insert("key".into(), json!(t.key));
            if let Some(v) = &t.value {
                taint.insert("value".into(), json!(v));
            }
            taint.insert("effect".into(), json!(t.effect));
            Value::Object(taint)
        })
        .collect();
    let mut registration = Map::new();
    registration.insert("name".into(), json!(join.node_name));
    registration.insert("kubeletExtraArgs".into(), kubelet_args);
    registration.insert("taints".into(), Value::Array(taints));
    if let Some(socket) = &config.cri_socket {
        registration.insert("criSocket".into(), json!(socket));
    }
    if !config.ignore_preflight_errors.is_empty() {
        registration.insert(
            "ignorePreflightErrors".into(),
            json!(config.ignore_preflight_errors),
        );
    }
    let document = json!({
        "apiVersion": api,
        "kind": "JoinConfiguration",
        "discovery": {
            "bootstrapToken": {
                "apiServerEndpoint": endpoint,
                "token": join.token_placeholder,
                "caCertHashes": [join.ca_certificate_hash],
            },
        },
        "nodeRegistration": Value::Object(registration),
    });
    serde_yaml::to_string(&document)
        .map_err(|e| PluginError::terminal(format!("cannot write the JoinConfiguration: {e}")))
}

/// The `#cloud-config` document for `machine`.
pub fn render(config: &Config, join: &JoinInfo) -> Result<BootstrapData, PluginError> {
    validate(config)?;
    let mut files = vec![json!({
        "path": JOIN_CONFIG_PATH,
        "owner": "root:root",
        "permissions": "0640",
        "content": join_configuration(config, join)?,
    })];
    for f in &config.files {
        files.push(json!({
            "path": f.path,
            "owner": f.owner.as_deref().unwrap_or("root:root"),
            "permissions": f.permissions.as_deref().unwrap_or("0644"),
            "content": f.content,
        }));
    }
    let mut commands: Vec<Value> = config
        .pre_kubeadm_commands
        .iter()
        .map(|c| json!(c))
        .collect();
    commands.push(json!(format!("kubeadm join --config {JOIN_CONFIG_PATH}")));
    commands.extend(config.post_kubeadm_commands.iter().map(|c| json!(c)));
    let mut doc = Map::new();
    doc.insert("write_files".into(), Value::Array(files));
    doc.insert("runcmd".into(), Value::Array(commands));
    if !config.users.is_empty() {
        let users: Vec<Value> = config
            .users
            .iter()
            .map(|u| {
                let mut user = Map::new();
                user.insert("name".into(), json!(u.name));
                for (key, value) in [
                    ("groups", &u.groups),
                    ("shell", &u.shell),
                    ("sudo", &u.sudo),
                ] {
                    if let Some(v) = value {
                        user.insert(key.into(), json!(v));
                    }
                }
                if let Some(lock) = u.lock_password {
                    user.insert("lock_passwd".into(), json!(lock));
                }
                if !u.ssh_authorized_keys.is_empty() {
                    user.insert("ssh_authorized_keys".into(), json!(u.ssh_authorized_keys));
                }
                Value::Object(user)
            })
            .collect();
        doc.insert("users".into(), Value::Array(users));
    }
    if let Some(ntp) = &config.ntp {
        let mut n = Map::new();
        n.insert("enabled".into(), json!(ntp.enabled.unwrap_or(true)));
        if !ntp.servers.is_empty() {
            n.insert("servers".into(), json!(ntp.servers));
        }
        doc.insert("ntp".into(), Value::Object(n));
    }
    let yaml = serde_yaml::to_string(&Value::Object(doc))
        .map_err(|e| PluginError::terminal(format!("cannot write the cloud-config: {e}")))?;
    Ok(BootstrapData {
        format: BootstrapFormat::CloudConfig,
        value: format!("#cloud-config\n{yaml}").into_bytes(),
    })
}

/// The plugin.
#[derive(Debug, Default)]
pub struct KubeadmBootstrap;

impl Bootstrap for KubeadmBootstrap {
    type Config = Config;

    fn validate(&self, config: &Config) -> Result<(), PluginError> {
        validate(config)
    }

    fn render(
        &self,
        _machine: &Machine,
        config: &Config,
        join: &JoinInfo,
    ) -> Result<BootstrapData, PluginError> {
        render(config, join)
    }
}

capstan_sdk::export_bootstrap!(KubeadmBootstrap, manifest: "capstan-plugin.json");

#[cfg(test)]
mod tests;
