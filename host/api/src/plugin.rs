//! `Plugin`: a sandboxed provider plugin, what it is granted, and what it declared.

use crate::{Condition, LabelSelector, conditions_schema, selector_matches};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a plugin comes from and what an admin grants it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "Plugin",
    status = "PluginStatus",
    shortname = "pl",
    derive = "PartialEq",
    derive = "Default",
    doc = "A sandboxed WebAssembly plugin (provider, updater or addon operator).",
    printcolumn(name = "World", type_ = "string", json_path = ".status.world"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".status.digest",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PluginSpec {
    /// The component: `oci://REGISTRY/REPOSITORY:TAG`, `oci://…@sha256:…`,
    /// or `file:///absolute/path.wasm` for development. A tag is resolved to
    /// a digest on every resync; a new digest is verified, checked against
    /// the grants and only then activated.
    #[schemars(regex(pattern = r"^(file|oci)://.+"))]
    pub source: String,
    /// Keys that must have signed an `oci://` source (in addition to the
    /// host's trust policy, if it has a rule for this source). An `oci://`
    /// source needs at least one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<PluginVerification>,
    /// Capabilities the admin grants. A revision is activated only when
    /// every capability it declares is granted; the plugin never gets more
    /// than it declares.
    #[serde(default)]
    pub grants: PluginGrants,
    /// Per-call limits (defaults: 64 MiB, 10 s).
    #[serde(default)]
    pub limits: PluginLimits,
    /// The namespaces whose Machines, MachineSets, MachineDeployments,
    /// MachineHealthChecks and Addons may use this plugin. Unset: only
    /// Capstan's own namespace. Elsewhere the object gets the condition
    /// reason `PluginNotAllowed` and the plugin is never called for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<AllowedNamespaces>,
    /// Updaters only: the position in which in-place updaters are asked to
    /// claim changed fields (lower first; unset comes after every set
    /// value, then by name). Two updaters whose declared fields overlap are
    /// only both activated when each sets a different `updateOrder`; the
    /// earlier one then gets the overlapping fields it claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_order: Option<i32>,
    /// Updaters only: how long one of its update steps may go without
    /// progress before a MachineHealthCheck judges the machine's update
    /// hung (`InPlaceUpdateStalled`) and remediates it through its
    /// short-circuit. Overrides the updater manifest's
    /// `progressDeadlineSeconds`; with neither, 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub progress_deadline_seconds: Option<u32>,
}

/// Namespaces allowed to use a plugin: those named, and those whose labels
/// match the selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedNamespaces {
    /// Namespace names; `*` allows every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Namespaces whose labels match (an empty selector matches none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

impl Plugin {
    /// Whether objects in `namespace` (with these labels) may use this
    /// plugin. `own` is Capstan's own namespace, always allowed when
    /// `allowedNamespaces` is unset; `None` (an embedded host with no
    /// namespace of its own) leaves an unset list unscoped.
    pub fn allows_namespace(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
        own: Option<&str>,
    ) -> bool {
        match &self.spec.allowed_namespaces {
            None => own.is_none_or(|own| own == namespace),
            Some(allowed) => {
                allowed.names.iter().any(|n| n == "*" || n == namespace)
                    || allowed
                        .selector
                        .as_ref()
                        .is_some_and(|s| selector_matches(s, labels))
            }
        }
    }

    /// The condition message for an object in `namespace` that names this
    /// plugin without being allowed to.
    pub fn not_allowed_message(&self, namespace: &str, own: Option<&str>) -> String {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let default = match (&self.spec.allowed_namespaces, own) {
            (None, Some(own)) => format!(" (unset: only Capstan's namespace {own:?})"),
            _ => String::new(),
        };
        format!(
            "plugin {name:?} is not allowed in namespace {namespace:?}: its spec.allowedNamespaces{default} does not include it; a cluster admin can add the namespace there"
        )
    }
}

/// Which keys must have signed the plugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginVerification {
    /// Named public keys (cosign `.pub` PEM).
    pub public_keys: Vec<NamedPublicKey>,
    /// Names of keys that must all have signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub all_of: Vec<String>,
    /// Names of keys of which at least one must have signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub any_of: Vec<String>,
}

/// A public key with a name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamedPublicKey {
    /// How `allOf`/`anyOf` refer to it.
    pub name: String,
    /// The PEM (`-----BEGIN PUBLIC KEY-----…`).
    pub public_key: String,
}

/// Capabilities an admin grants a plugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginGrants {
    /// HTTP destinations (`scheme://host[:port]`, host may start with `*.`,
    /// port may be `*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<String>,
    /// Credentials for the slots the plugin declares, read from Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialGrant>,
    /// Addon plugins: the objects they may apply, as
    /// `[group/]Kind[/name][@namespace|@*]` (`apps/Deployment@kube-system`,
    /// `ConfigMap@*`, `rbac.authorization.k8s.io/ClusterRole/system:coredns`).
    /// Every kind the plugin declares must be granted in some scope; a
    /// rendered object outside these is refused before anything is applied.
    /// RBAC, webhook, CRD, APIService and Namespace grants must name the
    /// object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<String>,
    /// Addon plugins: the highest Pod Security level of the pods they
    /// render (default `Baseline`: no privileged containers, host
    /// namespaces, hostPath volumes, host ports or added capabilities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,
    /// Addon plugins: which fields an Addon's `spec.patches` may change.
    /// Without an entry here a patch is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<PatchGrant>,
    /// Addon plugins: existing objects an Addon may take over, as named
    /// object patterns (`Namespace/monitoring`). Any other object that
    /// exists and the Addon did not create is never applied over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adopt: Vec<String>,
    /// Updaters: the Machine spec fields they may change (`version`,
    /// `provider.config.tags.*`). An updater's declared `updateFields` take
    /// effect only as far as these cover them; `provider.plugin` and
    /// `clusterName` are never changed in place, whatever is granted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub update_fields: Vec<String>,
    /// Providers: which of Cluster API's managed Machine labels
    /// (`node-role.kubernetes.io/…`, `node-restriction.kubernetes.io/…`,
    /// `node.cluster.x-k8s.io/…`) the machines of this Plugin carry onto
    /// their Nodes: label keys, or prefixes ending in `/`. Empty: none.
    /// Node labels steer other people's pods and whoever may create a
    /// Machine may be a tenant, so an admin says which.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_labels: Vec<String>,
}

/// Pod Security Standards levels (as the Kubernetes Pod Security admission
/// names them).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PodSecurityLevel {
    /// No restriction: host namespaces, hostPath, privileged containers.
    Privileged,
    /// The Baseline level's pod fields.
    #[default]
    Baseline,
}

/// Fields an Addon's patches may change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchGrant {
    /// The objects, as an object pattern (`apps/Deployment@kube-system`).
    pub objects: String,
    /// JSON pointer prefixes a patch may change (`/spec/replicas`,
    /// `/spec/template/spec/containers/*/resources`; `*` is one list item
    /// or key).
    pub paths: Vec<String>,
    /// Whether Addons outside Capstan's own namespace may use this grant
    /// too (default: only Addons in Capstan's namespace may patch).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tenants: bool,
}

/// One credential slot filled from a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialGrant {
    /// The slot name the plugin's manifest declares.
    pub slot: String,
    /// The Secret holding the value.
    pub secret_ref: SecretKeyRef,
    /// `Bearer` (default): the key holds a token. `Basic`: the Secret has
    /// `username` and `password` keys and `key` is ignored. `AwsSigV4`: the
    /// Secret has `accessKeyId`, `secretAccessKey` and optionally
    /// `sessionToken`; the host signs every request to the slot's
    /// destinations with them, for `region` and `service`.
    #[serde(default, rename = "type")]
    pub type_: CredentialType,
    /// `AwsSigV4` only: the region of the signing scope (`us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `AwsSigV4` only: the service of the signing scope (`ec2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// How a credential is sent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CredentialType {
    /// `Authorization: Bearer <token>`.
    #[default]
    Bearer,
    /// `Authorization: Basic …`.
    Basic,
    /// AWS Signature Version 4, computed by the host for each request.
    AwsSigV4,
}

/// A key in a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret namespace.
    pub namespace: String,
    /// Secret name.
    pub name: String,
    /// Key within the Secret (default `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Per-call limits of a plugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginLimits {
    /// Linear memory per call, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub memory_mib: Option<u32>,
    /// Wall-clock time per call, in milliseconds (at most 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60000))]
    pub call_timeout_ms: Option<u64>,
    /// Outbound requests in flight at once per call (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_requests_in_flight: Option<u32>,
    /// Outbound requests per call (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_requests_per_call: Option<u32>,
}

/// What the host found when it loaded the plugin. Fields describe the
/// revision that is serving; `UpToDate` says whether that is what the spec
/// names now.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginStatus {
    /// `sha256:…` of the component bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// For `oci://` sources: the source pinned to the OCI manifest digest
    /// (what the signatures cover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_source: Option<String>,
    /// Where the bytes were fetched from, when a mirror served them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_from: Option<String>,
    /// The keys whose signatures were verified: `name (key id)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signers: Vec<String>,
    /// The revision that served before this one (kept in the caches, so
    /// pinning the source back to it switches without a download).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_source: Option<String>,
    /// The world the plugin implements (`provider-plugin`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<String>,
    /// The plugin's own version (from its manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The contract version the plugin was built against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<String>,
    /// HTTP destinations the plugin declares (with their credential slots).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub declared_http: Vec<String>,
    /// Updaters: the Machine spec fields the serving revision may change
    /// (what it declares, as far as `spec.grants.updateFields` covers it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub update_fields: Vec<String>,
    /// Addon plugins: the object kinds the serving revision declares it
    /// renders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub declared_objects: Vec<String>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: a revision is serving (or the exact error when none is).
    /// `UpToDate`: the serving revision is the one the spec names; when a
    /// newer one is blocked (missing grants, failed verification) it says
    /// exactly why while the previous revision keeps serving.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}
