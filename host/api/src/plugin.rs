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
    printcolumn(name = "Canary", type_ = "string", json_path = ".status.canary.phase"),
    printcolumn(
        name = "Weight",
        type_ = "integer",
        json_path = ".status.canary.weight"
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
    /// What the plugin may take from the host across its calls, shared by
    /// every revision of it that serves at once. Unset: no bound beyond
    /// the host-wide ones. A call refused by its quota waits and is
    /// retried (reason `PluginQuotaExceeded`); it is never counted as the
    /// plugin's fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<PluginQuota>,
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
    /// Providers: values for the config keys the plugin's manifest
    /// declares as `settings` (such as the `endpoint` its credential is sent
    /// to). They are the admin's: a Machine's config may not set them, and
    /// the host adds them to every call's config. A key the manifest does
    /// not declare is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::free_form_object")]
    pub settings: Option<serde_json::Value>,
    /// Providers: the namespaces whose Machines may adopt an instance
    /// launched outside Capstan (one carrying no machine tag) by naming it
    /// in `spec.providerID` (lift and shift). Unset: none. Instances tagged
    /// for a Machine are adopted only by that Machine, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt_untagged_in: Option<AllowedNamespaces>,
    /// How a new revision replaces the serving one: at once (the default)
    /// or as a health-gated canary (provider plugins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::PluginRollout>,
}

/// Namespaces allowed to use a plugin: those named, and those whose labels
/// match the selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedNamespaces {
    /// Namespace names; `*` allows every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Namespaces whose labels match (an empty selector matches none). Only
    /// labels a tenant cannot set count: `kubernetes.io/metadata.name` (the
    /// API server sets it) and keys under `tenancy.capstan.dev/` (protect
    /// them with an admission policy); a selector on any other key matches
    /// no namespace, since whoever may label their namespace (a namespace
    /// admin under Capsule or HNC, say) would opt themselves in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Namespace label keys an `allowedNamespaces` selector may use.
pub const TRUSTED_NAMESPACE_LABEL: &str = "kubernetes.io/metadata.name";
/// The admin-only label prefix an `allowedNamespaces` selector may use.
pub const TRUSTED_NAMESPACE_LABEL_PREFIX: &str = "tenancy.capstan.dev/";

impl AllowedNamespaces {
    /// Whether it takes `namespace` (with these labels): by name (`*`:
    /// every one), or by a selector on labels a tenant cannot set.
    pub fn allows(
        &self,
        namespace: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> bool {
        self.names.iter().any(|n| n == "*" || n == namespace)
            || self.selector.as_ref().is_some_and(|s| {
                self.untrusted_selector_keys().is_empty()
                    && labels.is_some_and(|labels| selector_matches(s, labels))
            })
    }

    /// The selector's keys that a tenant might be able to set (those make
    /// the selector match nothing).
    pub fn untrusted_selector_keys(&self) -> Vec<String> {
        let Some(selector) = &self.selector else {
            return vec![];
        };
        let keys = selector
            .match_labels
            .iter()
            .flat_map(|m| m.keys().cloned())
            .chain(
                selector
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|e| e.key.clone()),
            );
        keys.filter(|k| {
            k != TRUSTED_NAMESPACE_LABEL && !k.starts_with(TRUSTED_NAMESPACE_LABEL_PREFIX)
        })
        .collect()
    }
}

impl Plugin {
    /// Whether objects in `namespace` may use this plugin. `labels` are the
    /// namespace's, `None` when it is not in the cache (then only a name
    /// allows it). `own` is Capstan's own namespace, always allowed when
    /// `allowedNamespaces` is unset; `None` (an embedded host with no
    /// namespace of its own) leaves an unset list unscoped.
    pub fn allows_namespace(
        &self,
        namespace: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
        own: Option<&str>,
    ) -> bool {
        match &self.spec.allowed_namespaces {
            None => own.is_none_or(|own| own == namespace),
            Some(allowed) => allowed.allows(namespace, labels),
        }
    }

    /// Whether Machines in `namespace` (with these labels) may adopt an
    /// untagged instance through this plugin (`spec.adoptUntaggedIn`).
    pub fn adopts_untagged_in(
        &self,
        namespace: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> bool {
        self.spec
            .adopt_untagged_in
            .as_ref()
            .is_some_and(|allowed| allowed.allows(namespace, labels))
    }

    /// The condition message for an object in `namespace` that names this
    /// plugin without being allowed to.
    pub fn not_allowed_message(&self, namespace: &str, own: Option<&str>) -> String {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let default = match (&self.spec.allowed_namespaces, own) {
            (None, Some(own)) => format!(" (unset: only Capstan's namespace {own:?})"),
            _ => String::new(),
        };
        let untrusted = self
            .spec
            .allowed_namespaces
            .as_ref()
            .map(AllowedNamespaces::untrusted_selector_keys)
            .unwrap_or_default();
        let selector = if untrusted.is_empty() {
            String::new()
        } else {
            format!(
                " (its selector matches no namespace: it uses {}, which a tenant may be able to set; select on {TRUSTED_NAMESPACE_LABEL} or {TRUSTED_NAMESPACE_LABEL_PREFIX}… labels)",
                untrusted.join(", ")
            )
        };
        format!(
            "plugin {name:?} is not allowed in namespace {namespace:?}: its spec.allowedNamespaces{default} does not include it{selector}; a cluster admin can add the namespace there"
        )
    }
}

/// Which keys or keyless identities must have signed the plugin (in
/// addition to the host policy's rule for its source).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginVerification {
    /// Named public keys (cosign `.pub` PEM).
    #[serde(default)]
    pub public_keys: Vec<NamedPublicKey>,
    /// Named keyless identities, verified against the host policy's
    /// Sigstore trusted root (a Plugin cannot bring its own root).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<NamedIdentity>,
    /// Names of keys or identities that must all have signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub all_of: Vec<String>,
    /// Names of keys or identities of which at least one must have signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub any_of: Vec<String>,
}

/// A keyless signer: a Fulcio certificate's OIDC issuer and subject.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamedIdentity {
    /// How `allOf`/`anyOf` refer to it.
    pub name: String,
    /// The OIDC issuer, exactly (`https://token.actions.githubusercontent.com`).
    pub issuer: String,
    /// The certificate subject (e-mail or URI), exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Or a regular expression the whole subject must match.
    #[serde(
        default,
        rename = "subjectRegExp",
        skip_serializing_if = "Option::is_none"
    )]
    pub subject_reg_exp: Option<String>,
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
    /// Addon plugins: the Pod Security Standards level every rendered pod
    /// must meet (default `Baseline`, checked control by control as the
    /// upstream `pod-security-admission` does; `Restricted` is stricter,
    /// `Privileged` lifts the pod checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,
    /// Addon plugins: ServiceAccounts that rendered pods may run as although
    /// the render does not create them, as `NAMESPACE/NAME` or `NAME` (in
    /// the pod's own namespace). A pod may always run as a ServiceAccount
    /// its own render creates, or as its namespace's `default`; any other
    /// would borrow rights nobody granted the plugin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    /// Addon plugins: the RBAC a render may hand out beyond its own objects
    /// (by default a binding may only reference roles and ServiceAccounts
    /// the same render creates, and no role may carry an escalation route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbac: Option<RbacGrant>,
    /// Addon plugins: objects that Addons outside Capstan's namespace may
    /// render outside their own namespace (object patterns, as `objects`).
    /// Without an entry here a tenant's render stays in its namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenant_objects: Vec<String>,
    /// Addon plugins: where the pod spec is in custom workload kinds, as
    /// `GROUP/KIND=/json/pointer` (`example.com/Agent=/spec/template/spec`),
    /// so the Pod Security check covers them too. Built-in workload kinds
    /// (Pod, PodTemplate, Deployment, DaemonSet, StatefulSet, ReplicaSet,
    /// ReplicationController, Job, CronJob) need no entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_spec_paths: Vec<String>,
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
    /// Providers: whether its machines may be linked to Nodes with a
    /// control-plane role (`node-role.kubernetes.io/control-plane` or
    /// `…/master`). Default false: a provider that names a control-plane
    /// Node's providerID gets no taint, drain or deletion of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control_plane_nodes: bool,
}

/// Pod Security Standards levels (as the Kubernetes Pod Security admission
/// names them).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PodSecurityLevel {
    /// No restriction: host namespaces, hostPath, privileged containers.
    Privileged,
    /// The Baseline level's controls.
    #[default]
    Baseline,
    /// Baseline's controls and the Restricted level's (non-root, no
    /// privilege escalation, a seccomp profile, capabilities dropped).
    Restricted,
}

impl PodSecurityLevel {
    /// The level's name as Pod Security admission labels spell it.
    pub fn label_value(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }

    /// How strict: Privileged 0, Baseline 1, Restricted 2.
    pub fn strictness(self) -> u8 {
        match self {
            PodSecurityLevel::Privileged => 0,
            PodSecurityLevel::Baseline => 1,
            PodSecurityLevel::Restricted => 2,
        }
    }
}

/// What RBAC an addon render may hand out beyond its own objects.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RbacGrant {
    /// Roles outside the render that its bindings may reference:
    /// `ClusterRole/NAME` or `Role/NAMESPACE/NAME` (`cluster-admin` never).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub role_refs: Vec<String>,
    /// Subjects outside the render that its bindings may name:
    /// `ServiceAccount/NAMESPACE/NAME`, `User/NAME` or `Group/NAME`
    /// (`system:masters` never).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<String>,
    /// Escalation routes its roles may carry, as the Kubernetes
    /// documentation's RBAC good practices list them: `secrets`,
    /// `workloads`, `persistentvolumes`, `nodes/proxy`, `escalate`, `bind`,
    /// `impersonate`, `certificates`, `serviceaccounts/token`, `admission`,
    /// `namespaces`, `pods/ephemeralcontainers`, `exec` (`pods/exec`,
    /// `pods/attach`), `pods/portforward`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub powers: Vec<String>,
    /// Routes a rendered ClusterRole that aggregates into another
    /// ClusterRole (by an `aggregate-to-*` label, or any label an
    /// `aggregationRule` of the cluster selects) may carry: aggregation
    /// gives them to every holder of that role, so `powers` alone never
    /// lets them through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregate_to: Vec<AggregationGrant>,
}

/// Routes a ClusterRole aggregated into `clusterRole` may carry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AggregationGrant {
    /// The aggregating ClusterRole (`view`, `edit`, `admin`, or the
    /// cluster's own).
    pub cluster_role: String,
    /// The routes (names as in `powers`).
    pub powers: Vec<String>,
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
    /// The HTTP methods a request may carry this credential with (`GET`,
    /// `HEAD`, `POST`, `PUT`, `PATCH`, `DELETE`, `OPTIONS`); a request with
    /// another method to the slot's destinations is refused. Empty: any of
    /// those. `TRACE` and `CONNECT` never carry a credential.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
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

/// A plugin's share of the host across its calls (`spec.quota`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginQuota {
    /// Calls of this plugin running at once, for every object using it
    /// (default 16: half the Machine controller's workers, so a plugin
    /// whose calls hang cannot hold all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub concurrent_calls: Option<u32>,
    /// How long a call waits for one of those before it is refused, in
    /// milliseconds (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 60000))]
    pub queue_timeout_ms: Option<u32>,
    /// Calls started per minute (a token bucket holding ten seconds'
    /// worth, at least one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub calls_per_minute: Option<u32>,
    /// Outbound requests per minute, by all calls together, counted at the
    /// sandbox's HTTP gate (a token bucket holding ten seconds' worth, at
    /// least one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub requests_per_minute: Option<u32>,
    /// Host memory all the plugin's calls may hold at once, in bytes. A
    /// revision is refused (`HostBytesTooSmall`) unless `concurrentCalls`
    /// calls at their most fit: `capstan plugin inspect` prints what one
    /// call may hold (`hostBytesPerCall`, from the limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1048576))]
    pub host_bytes: Option<u64>,
}

impl PluginQuota {
    /// `concurrentCalls` when unset.
    pub const DEFAULT_CONCURRENT_CALLS: u32 = 16;

    /// `concurrentCalls`, or its default when unset.
    pub fn concurrent_calls(&self) -> u32 {
        self.concurrent_calls
            .unwrap_or(Self::DEFAULT_CONCURRENT_CALLS)
    }
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
    /// The revisions that served before this one, newest first (at most
    /// `spec.rollout.revisionHistoryLimit`, default 3): still in the
    /// caches, so pinning the source back to one switches without a
    /// download.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<String>,
    /// A revision on trial (`spec.rollout.strategy: Canary`), or the last
    /// one that was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<crate::CanaryStatus>,
    /// Digests of canaries that were rolled back: never tried again until
    /// the source resolves to another digest (newest first, at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<String>,
    /// Providers: instances the plugin lists (`list-instances`, with the
    /// configs its Machines use) that no Machine records, found by two
    /// scans in a row (`capstan machines orphans` prints them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphans: Option<OrphanReport>,
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

/// Instances a provider plugin knows that no Machine owns.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrphanReport {
    /// When a scan first found this (the report is rewritten only when
    /// what it says changes, so Machines are not woken by every scan).
    pub since: crate::Time,
    /// How many orphans the last two scans both found.
    pub count: u32,
    /// Their provider IDs, sorted (the first 50).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<String>,
    /// Why the scan could not say, when it could not (listing unsupported
    /// or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn plugin(selector: serde_json::Value) -> Plugin {
        let spec: PluginSpec = serde_json::from_value(serde_json::json!({
            "source": "file:///p.wasm",
            "allowedNamespaces": {"names": ["named"], "selector": selector}
        }))
        .unwrap();
        Plugin::new("p", spec)
    }

    #[test]
    fn selectors_count_only_labels_a_tenant_cannot_set() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let trusted =
            plugin(serde_json::json!({"matchLabels": {"tenancy.capstan.dev/tier": "gold"}}));
        let gold = labels(&[("tenancy.capstan.dev/tier", "gold")]);
        assert!(trusted.allows_namespace("team-a", Some(&gold), None));
        assert!(!trusted.allows_namespace("team-a", Some(&labels(&[])), None));
        // Not in the cache: only a name allows it.
        assert!(!trusted.allows_namespace("team-a", None, None));
        assert!(trusted.allows_namespace("named", None, None));
        let by_name = plugin(serde_json::json!({"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]}));
        assert!(by_name.allows_namespace(
            "team-a",
            Some(&labels(&[("kubernetes.io/metadata.name", "team-a")])),
            None
        ));

        // A label the namespace's own admin may set opts nobody in.
        let loose = plugin(serde_json::json!({"matchLabels": {"team": "a"}}));
        let opted = labels(&[("team", "a")]);
        assert!(!loose.allows_namespace("team-a", Some(&opted), None));
        let message = loose.not_allowed_message("team-a", None);
        assert!(
            message.contains(
                "its selector matches no namespace: it uses team, which a tenant may be able to set"
            ),
            "{message}"
        );
        assert!(loose.allows_namespace("named", Some(&opted), None));
    }
}
