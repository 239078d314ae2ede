//! The Capstan plugin manifest: what a plugin says about itself.
//!
//! Every plugin component carries a JSON manifest in a custom section named
//! [`CUSTOM_SECTION`] (the SDK's `plugin_manifest!` macro embeds it). It names
//! the plugin, the world it implements, the contract version it was built
//! against, and the capabilities it asks for: HTTP destinations and the
//! credential slots the host should fill for them. The same manifest travels
//! in the OCI artifact config, so it can be read without running anything.
//!
//! Start with [`PluginManifest::from_component`] (extract and validate) and
//! [`DestinationPattern`] (how declared and granted destinations match a
//! request); [`component`] reads a component's interfaces and footprint and
//! embeds a manifest into components other toolchains built. This crate is pure: no wasmtime, no I/O.

#![forbid(unsafe_code)]

pub mod component;
mod destination;
mod fields;
mod objects;

pub use component::{Footprint, Interfaces, embed_manifest, footprint, host_provides, interfaces};
pub use destination::{Destination, DestinationPattern};
pub use fields::{FieldPattern, granted_fields, overlapping, path_segment, split_path};
pub use objects::{ObjectKey, ObjectPattern, ObjectScope, group_of, is_dns_label, ungranted_kinds};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Name of the custom section that holds the manifest JSON.
pub const CUSTOM_SECTION: &str = "capstan-manifest";

/// The contract version this host implements (`capstan:plugin@…`).
pub const CONTRACT_VERSION: &str = "0.3.0";

/// Every contract version this host loads, newest first. 0.3.0 added one
/// import (`capstan:plugin/http`) and exports 0.2.0's interfaces; 0.2.0
/// changed `provider` and `addon` and added `bootstrap`; 0.1.0 is the first.
pub const SUPPORTED_CONTRACTS: [&str; 3] = [CONTRACT_VERSION, "0.2.0", FIRST_CONTRACT_VERSION];

/// The first contract version (its `provider` and `addon` interfaces are
/// `@0.1.0`; `updater` is the same under every version).
pub const FIRST_CONTRACT_VERSION: &str = "0.1.0";

/// The contract version whose interfaces a plugin of 0.2.0 or later
/// exports (0.3.0 added an import, no export).
pub const EXPORTS_VERSION: &str = "0.2.0";

/// The import new in contract 0.3.0; a component with it needs a 0.3.0 host.
pub const HTTP_IMPORT: &str = "capstan:plugin/http@0.3.0";

/// Upper bound on the manifest's size; anything larger is refused unread.
pub const MAX_MANIFEST_BYTES: usize = 64 * 1024;

/// Errors reading or validating a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "the component has no `{CUSTOM_SECTION}` custom section; build the plugin with the Capstan SDK's `plugin_manifest!` macro (Rust) or add it with `capstan plugin annotate` (any toolchain)"
    )]
    Missing,
    #[error("the component has {0} `{CUSTOM_SECTION}` sections; exactly one is allowed")]
    Duplicate(usize),
    #[error("the manifest is {0} bytes; at most {MAX_MANIFEST_BYTES} are allowed")]
    TooLarge(usize),
    #[error("the manifest is not valid JSON for a Capstan plugin manifest: {0}")]
    Json(#[from] serde_json::Error),
    #[error("manifest field `{field}` is invalid: {reason}")]
    Invalid { field: String, reason: String },
    #[error("the file is not a WebAssembly component: {0}")]
    NotAComponent(String),
}

/// The world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum World {
    Provider,
    Updater,
    Addon,
    /// Renders the data an instance boots with to join its cluster (0.2.0).
    Bootstrap,
}

impl World {
    /// The world's name in the WIT package.
    pub fn as_str(self) -> &'static str {
        match self {
            World::Provider => "provider",
            World::Updater => "updater",
            World::Addon => "addon",
            World::Bootstrap => "bootstrap",
        }
    }

    /// The fully qualified interface a component built against `contract`
    /// (a supported version) must export. 0.2.0 changed `provider` and
    /// `addon` and added `bootstrap`, and 0.3.0 exports those unchanged;
    /// updaters export the 0.1.0 interface under every version.
    pub fn export_interface(self, contract: &str) -> String {
        let changed_in_0_2 = contract_minor(contract) >= contract_minor(EXPORTS_VERSION);
        let version = match self {
            World::Provider | World::Addon if changed_in_0_2 => EXPORTS_VERSION,
            World::Bootstrap => EXPORTS_VERSION,
            _ => FIRST_CONTRACT_VERSION,
        };
        format!("capstan:plugin/{}@{version}", self.as_str())
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for World {
    type Err = ManifestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "provider" => Ok(World::Provider),
            "updater" => Ok(World::Updater),
            "addon" => Ok(World::Addon),
            "bootstrap" => Ok(World::Bootstrap),
            other => Err(ManifestError::Invalid {
                field: "world".into(),
                reason: format!("`{other}` is not one of provider, updater, addon, bootstrap"),
            }),
        }
    }
}

/// A plugin's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginManifest {
    /// Plugin name (lowercase letters, digits and `-`).
    pub name: String,
    /// Plugin version (semver).
    pub version: String,
    /// The world the component implements.
    pub world: World,
    /// The contract version it was built against, for example `0.1.0`.
    pub contract: String,
    /// What the plugin asks the host for.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// Updaters only (and required for them): the Machine spec fields the
    /// updater may claim, such as `version` or `provider.config.tags.*`.
    /// Claims outside these are ignored; two active updaters may declare
    /// overlapping fields only when both Plugins set `spec.updateOrder`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub update_fields: Vec<FieldPattern>,
    /// Updaters only: how long one of its update steps may go without
    /// progress (its percent rising) before a health check judges the
    /// machine's update hung ([`DEFAULT_PROGRESS_DEADLINE_SECONDS`] when
    /// unset). The updater knows how long its work takes; the Plugin's
    /// `spec.progressDeadlineSeconds` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<u32>,
    /// Updaters only: what its update does to the workloads on the
    /// machine. Unset: it affects availability and needs no drain (an
    /// update counts against `maxUnavailable`, as in Cluster API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<Disruption>,
    /// Providers: how the provider IDs of its instances begin (`aws:///`,
    /// `sim://`). The host links a Machine to a Node only when the Node's
    /// `spec.providerID` begins so: a plugin cannot claim another
    /// provider's Nodes. Unset (manifests written before it existed): the
    /// prefix is not checked, the other claim checks still are.
    #[serde(
        default,
        rename = "providerIDPrefix",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id_prefix: Option<String>,
    /// Providers: top-level keys of its config that only the Plugin's admin
    /// sets, in `Plugin.spec.settings` — such as an `endpoint` that receives
    /// the granted credential. A Machine whose config sets one is refused
    /// (`InvalidConfiguration`); the host puts the admin's values into the
    /// config of every call, so the plugin reads them where it always did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
}

/// What an updater's step does to the machine's workloads, as its signed
/// manifest declares: the host cordons and drains the Node only before the
/// steps that say so, and counts against `maxUnavailable` only the
/// machines whose update affects availability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disruption {
    /// Its pods must leave first (a reboot, a kubelet or runtime upgrade):
    /// the host cordons the Node and drains it, respecting
    /// PodDisruptionBudgets, before the step, and uncordons it once the
    /// whole update is done.
    #[serde(default)]
    pub drain: bool,
    /// The machine is unavailable while the step runs (default): the
    /// update counts against `maxUnavailable`. `false` (relabelling,
    /// tags): the machine stays available throughout.
    #[serde(default = "yes")]
    pub affects_availability: bool,
}

fn yes() -> bool {
    true
}

impl Default for Disruption {
    /// Cluster API's assumption: potentially disruptive, no drain.
    fn default() -> Self {
        Disruption {
            drain: false,
            affects_availability: true,
        }
    }
}

/// An update step's progress deadline when neither the updater's manifest
/// nor its Plugin sets one: Kubernetes Deployments' default.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 600;

/// The longest progress deadline a manifest or Plugin may set (a day): a
/// longer one would keep a hung machine out of every health check.
pub const MAX_PROGRESS_DEADLINE_SECONDS: u32 = 86_400;

/// Check a progress deadline; the error says what is allowed.
pub fn check_progress_deadline(seconds: u32) -> Result<(), String> {
    if (1..=MAX_PROGRESS_DEADLINE_SECONDS).contains(&seconds) {
        Ok(())
    } else {
        Err(format!(
            "{seconds} is out of range: a step's progress deadline is 1 to {MAX_PROGRESS_DEADLINE_SECONDS} seconds"
        ))
    }
}

/// Capabilities a plugin declares. Declaring is asking: the admin's grant
/// decides what it gets, and it never gets more than it declared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capabilities {
    /// Outbound HTTP destinations.
    #[serde(default)]
    pub http: Vec<HttpCapability>,
    /// Addon plugins only (and required for them): the kinds of Kubernetes
    /// objects the plugin renders, such as `apps/Deployment@kube-system`
    /// (see [`ObjectPattern`]). The host applies nothing outside them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectPattern>,
}

/// One declared HTTP destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpCapability {
    /// `scheme://host[:port]`; host may start with `*.`, port may be `*`.
    pub destination: DestinationPattern,
    /// Name of a credential slot the host fills for requests to this
    /// destination (for example `cloud-api`). The plugin never sees the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// An optional destination (an endpoint override such as a VPC endpoint
    /// or a test double): the plugin may be activated without it being
    /// granted, and requests to it are denied unless it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

impl PluginManifest {
    /// Parse and validate manifest JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge(bytes.len()));
        }
        let manifest: PluginManifest = serde_json::from_slice(bytes)?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Extract the manifest from a component's custom section and validate it.
    pub fn from_component(component: &[u8]) -> Result<Self, ManifestError> {
        let sections = custom_sections(component, CUSTOM_SECTION)?;
        match sections.as_slice() {
            [] => Err(ManifestError::Missing),
            [one] => Self::from_json(one),
            many => Err(ManifestError::Duplicate(many.len())),
        }
    }

    /// Check field contents beyond what the JSON shape says.
    pub fn validate(&self) -> Result<(), ManifestError> {
        self.check_identity()?;
        self.check_world_fields()?;
        self.check_world_declarations()?;
        self.check_http()
    }

    /// The name, the versions, and the contract this host implements.
    fn check_identity(&self) -> Result<(), ManifestError> {
        if self.name.is_empty()
            || self.name.len() > 63
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "name",
                format!(
                    "`{}` must be 1-63 lowercase letters, digits or '-'",
                    self.name
                ),
            ));
        }
        if !is_semver(&self.version) {
            return Err(invalid(
                "version",
                format!("`{}` is not a semantic version like 1.2.3", self.version),
            ));
        }
        if !is_semver(&self.contract) {
            return Err(invalid(
                "contract",
                format!("`{}` is not a semantic version like 0.1.0", self.contract),
            ));
        }
        if !contract_supported(&self.contract) {
            return Err(invalid(
                "contract",
                format!(
                    "contract {} is not supported by this host (it implements {})",
                    self.contract,
                    SUPPORTED_CONTRACTS.join(", ")
                ),
            ));
        }
        if self.world == World::Bootstrap
            && contract_minor(&self.contract) < contract_minor(EXPORTS_VERSION)
        {
            return Err(invalid(
                "contract",
                format!(
                    "the bootstrap world is new in contract {EXPORTS_VERSION}; this manifest says {}",
                    self.contract
                ),
            ));
        }
        Ok(())
    }

    /// The fields only one world declares: an updater's fields and
    /// progress deadline, a provider's ID prefix.
    fn check_world_fields(&self) -> Result<(), ManifestError> {
        match (self.world, self.update_fields.is_empty()) {
            (World::Updater, true) => {
                return Err(invalid(
                    "updateFields",
                    "an updater must declare the fields it may change, for example [\"version\"]"
                        .into(),
                ));
            }
            (World::Provider | World::Addon | World::Bootstrap, false) => {
                return Err(invalid(
                    "updateFields",
                    format!(
                        "only updaters declare fields; this is a {} plugin",
                        self.world
                    ),
                ));
            }
            _ => {}
        }
        if let Some(seconds) = self.progress_deadline_seconds {
            if self.world != World::Updater {
                return Err(invalid(
                    "progressDeadlineSeconds",
                    format!(
                        "only updaters declare a progress deadline; this is a {} plugin",
                        self.world
                    ),
                ));
            }
            check_progress_deadline(seconds)
                .map_err(|message| invalid("progressDeadlineSeconds", message))?;
        }
        if let Some(prefix) = &self.provider_id_prefix {
            if self.world != World::Provider {
                return Err(invalid(
                    "providerIDPrefix",
                    format!(
                        "only providers declare a provider ID prefix; this is a {} plugin",
                        self.world
                    ),
                ));
            }
            let scheme_ok = prefix.split_once("://").is_some_and(|(scheme, _)| {
                !scheme.is_empty()
                    && scheme
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            });
            if !scheme_ok || prefix.len() > 128 || prefix.chars().any(char::is_whitespace) {
                return Err(invalid(
                    "providerIDPrefix",
                    format!(
                        "`{prefix}` is not the start of a provider ID; write its scheme and what follows, such as `aws:///` or `sim://`"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A provider's settings, an updater's disruption, an addon's kinds.
    fn check_world_declarations(&self) -> Result<(), ManifestError> {
        if !self.settings.is_empty() && self.world != World::Provider {
            return Err(invalid(
                "settings",
                format!(
                    "only providers declare settings; this is a {} plugin",
                    self.world
                ),
            ));
        }
        for key in &self.settings {
            let ok = !key.is_empty()
                && key.len() <= 64
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            if !ok {
                return Err(invalid(
                    "settings",
                    format!(
                        "`{key}` is not a config key (letters, digits, '-' and '_', at most 64)"
                    ),
                ));
            }
        }
        if let Some(disruption) = self.disruption {
            if self.world != World::Updater {
                return Err(invalid(
                    "disruption",
                    format!(
                        "only updaters declare a disruption; this is a {} plugin",
                        self.world
                    ),
                ));
            }
            if disruption.drain && !disruption.affects_availability {
                return Err(invalid(
                    "disruption",
                    "a step that drains the Node affects availability; drop `affectsAvailability: false` or `drain: true`"
                        .into(),
                ));
            }
        }
        match (self.world, self.capabilities.objects.is_empty()) {
            (World::Addon, true) => {
                return Err(invalid(
                    "capabilities.objects",
                    "an addon plugin must declare the kinds it renders, for example [\"apps/Deployment@kube-system\"]"
                        .into(),
                ));
            }
            (World::Provider | World::Updater | World::Bootstrap, false) => {
                return Err(invalid(
                    "capabilities.objects",
                    format!(
                        "only addon plugins render objects; this is a {} plugin",
                        self.world
                    ),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The HTTP declarations: credential slot names, and no two
    /// overlapping destinations with different slots.
    fn check_http(&self) -> Result<(), ManifestError> {
        for (i, cap) in self.capabilities.http.iter().enumerate() {
            if let Some(slot) = &cap.credential
                && (slot.is_empty()
                    || !slot
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
            {
                return Err(invalid(
                    &format!("capabilities.http[{i}].credential"),
                    format!("`{slot}` must be letters, digits, '-' or '_'"),
                ));
            }
        }
        // A request goes with the credential of the first declaration that
        // matches it: two overlapping declarations with different slots
        // would make the order, not the admin, choose a credential.
        let http = &self.capabilities.http;
        for (i, a) in http.iter().enumerate() {
            for (j, b) in http.iter().enumerate().skip(i + 1) {
                if a.credential != b.credential && a.destination.overlaps(&b.destination) {
                    return Err(invalid(
                        &format!("capabilities.http[{j}]"),
                        format!(
                            "{} overlaps capabilities.http[{i}] ({}) with another credential slot: a request to both would carry whichever is declared first; make the destinations disjoint",
                            b.destination, a.destination
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The credential slots the plugin asks for.
    pub fn credential_slots(&self) -> impl Iterator<Item = &str> {
        self.capabilities
            .http
            .iter()
            .filter_map(|c| c.credential.as_deref())
    }
}

/// A field of the manifest that is wrong, and why.
fn invalid(field: &str, reason: String) -> ManifestError {
    ManifestError::Invalid {
        field: field.to_string(),
        reason,
    }
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<_> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a plugin built against `contract` can run on this host: the same
/// major and minor version as one of [`SUPPORTED_CONTRACTS`] (0.x minors
/// are distinct, as in Cargo).
pub fn contract_supported(contract: &str) -> bool {
    let theirs: Vec<_> = contract.split('.').collect();
    theirs.len() == 3
        && SUPPORTED_CONTRACTS
            .iter()
            .any(|v| contract_minor(v) == contract_minor(contract))
}

/// Whether a plugin's `contract` covers what its component imports: one
/// that imports [`HTTP_IMPORT`] must say contract 0.3.0 or later, since an
/// older host would accept its manifest and then fail to link it. `Err`
/// says why, naming both versions.
pub fn contract_covers_imports<'a>(
    contract: &str,
    mut imports: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    if imports.any(|i| i == HTTP_IMPORT)
        && contract_minor(contract) < contract_minor(CONTRACT_VERSION)
    {
        return Err(format!(
            "the component imports {HTTP_IMPORT}, new in contract {CONTRACT_VERSION}, but the manifest says contract {contract}; say {CONTRACT_VERSION} (so older hosts refuse it by its manifest), or build against the {contract} worlds, which use wasi:http"
        ));
    }
    Ok(())
}

/// `(major, minor)` of a version; `(u64::MAX, u64::MAX)` when unreadable.
fn contract_minor(version: &str) -> (u64, u64) {
    let mut parts = version
        .split('.')
        .map(|p| p.parse::<u64>().unwrap_or(u64::MAX));
    (
        parts.next().unwrap_or(u64::MAX),
        parts.next().unwrap_or(u64::MAX),
    )
}

/// All custom sections called `name` in a component, including those of the
/// core modules nested inside it (where the Rust toolchain places them).
pub fn custom_sections(component: &[u8], name: &str) -> Result<Vec<Vec<u8>>, ManifestError> {
    use wasmparser::{Parser, Payload};
    let mut found = Vec::new();
    let mut is_component = false;
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|e| ManifestError::NotAComponent(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } if !is_component => {
                if encoding != wasmparser::Encoding::Component {
                    return Err(ManifestError::NotAComponent(
                        "it is a core WebAssembly module; plugins must be components (build for wasm32-wasip2)"
                            .into(),
                    ));
                }
                is_component = true;
            }
            Payload::CustomSection(reader) if reader.name() == name => {
                found.push(reader.data().to_vec());
            }
            _ => {}
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_declarations_with_different_slots_are_refused() {
        let p = |s: &str| s.parse::<DestinationPattern>().unwrap();
        assert!(p("https://*.example.com").overlaps(&p("https://api.example.com")));
        assert!(p("https://*.example.com:*").overlaps(&p("https://api.example.com:8443")));
        assert!(!p("https://*.example.com:443").overlaps(&p("https://api.example.com:8443")));
        assert!(!p("https://*.example.com").overlaps(&p("https://a.b.example.com")));
        assert!(!p("http://api.example.com").overlaps(&p("https://api.example.com")));
        let manifest = |slots: [&str; 2]| {
            serde_json::from_value::<PluginManifest>(serde_json::json!({
                "name": "p", "version": "0.1.0", "world": "provider", "contract": "0.1.0",
                "capabilities": {"http": [
                    {"destination": "https://*.example.com", "credential": slots[0]},
                    {"destination": "https://api.example.com", "credential": slots[1]}]}
            }))
            .unwrap()
        };
        manifest(["cloud", "cloud"]).validate().unwrap();
        let e = manifest(["cloud", "admin"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("capabilities.http[1]") && e.contains("overlaps capabilities.http[0]"),
            "{e}"
        );
    }

    #[test]
    fn manifest_validation_names_the_field() {
        let ok = br#"{"name":"sim","version":"0.1.0","world":"provider","contract":"0.1.0",
            "capabilities":{"http":[{"destination":"http://127.0.0.1:*","credential":"cloud"}]}}"#;
        let m = PluginManifest::from_json(ok).unwrap();
        assert_eq!(m.credential_slots().collect::<Vec<_>>(), ["cloud"]);

        let cases: [(&[u8], &str); 12] = [
            (br#"{"name":"Sim","version":"0.1.0","world":"provider","contract":"0.1.0"}"#, "`name`"),
            (br#"{"name":"sim","version":"1","world":"provider","contract":"0.1.0"}"#, "`version`"),
            (br#"{"name":"sim","version":"0.1.0","world":"provider","contract":"0.4.0"}"#, "not supported"),
            (br#"{"name":"boot","version":"0.1.0","world":"bootstrap","contract":"0.1.0"}"#, "new in contract 0.2.0"),
            (br#"{"name":"sim","version":"0.1.0","world":"robot","contract":"0.1.0"}"#, "unknown variant"),
            (br#"{"name":"sim","version":"0.1.0","world":"provider","contract":"0.1.0","extra":1}"#, "unknown field"),
            (br#"{"name":"sim","version":"0.1.0","world":"provider","contract":"0.1.0","progressDeadlineSeconds":60}"#, "`progressDeadlineSeconds` is invalid: only updaters"),
            (br#"{"name":"up","version":"0.1.0","world":"updater","contract":"0.1.0","updateFields":["version"],"progressDeadlineSeconds":0}"#, "1 to 86400 seconds"),
            (br#"{"name":"up","version":"0.1.0","world":"updater","contract":"0.1.0","updateFields":["version"],"progressDeadlineSeconds":90000}"#, "out of range"),
            (br#"{"name":"sim","version":"0.1.0","world":"provider","contract":"0.1.0","disruption":{"drain":true}}"#, "only updaters declare a disruption"),
            (br#"{"name":"up","version":"0.1.0","world":"updater","contract":"0.1.0","updateFields":["version"],"disruption":{"drain":true,"affectsAvailability":false}}"#, "affects availability"),
            (br#"{"name":"up","version":"0.1.0","world":"updater","contract":"0.1.0","updateFields":["version"],"disruption":{"reboot":true}}"#, "unknown field"),
        ];
        for (json, needle) in cases {
            let err = PluginManifest::from_json(json).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        let updater = br#"{"name":"up","version":"0.1.0","world":"updater","contract":"0.1.0","updateFields":["version"],"progressDeadlineSeconds":120}"#;
        let m = PluginManifest::from_json(updater).unwrap();
        assert_eq!(m.progress_deadline_seconds, Some(120));
        assert_eq!(m.disruption, None);
        let tagger = br#"{"name":"up","version":"0.1.0","world":"updater","contract":"0.1.0","updateFields":["tags.*"],"disruption":{"affectsAvailability":false}}"#;
        let m = PluginManifest::from_json(tagger).unwrap();
        assert_eq!(
            m.disruption,
            Some(Disruption {
                drain: false,
                affects_availability: false
            })
        );
    }

    #[test]
    fn core_modules_are_refused_with_a_hint() {
        // The smallest core module: magic + version 1.
        let err = PluginManifest::from_component(b"\0asm\x01\0\0\0").unwrap_err();
        assert!(err.to_string().contains("wasm32-wasip2"), "{err}");
    }
}
