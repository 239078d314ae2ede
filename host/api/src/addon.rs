//! `Addon`: one addon (CoreDNS, a node agent, …) installed and kept in
//! shape by an addon plugin, in this cluster or a workload cluster.

use crate::{Condition, conditions_schema, free_form_object};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Finalizer on every Addon: what it applied is removed before it goes.
pub const ADDON_FINALIZER: &str = "capstan.dev/addon";
/// Label on every object an Addon applied: the Addon's name.
pub const LABEL_ADDON_NAME: &str = "capstan.dev/addon";
/// Label on every object an Addon applied: the Addon's namespace.
pub const LABEL_ADDON_NAMESPACE: &str = "capstan.dev/addon-namespace";

/// The desired state of one addon.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "Addon",
    namespaced,
    status = "AddonStatus",
    shortname = "ao",
    derive = "PartialEq",
    derive = "Default",
    doc = "An addon installed and kept in shape by an addon plugin.",
    printcolumn(name = "Plugin", type_ = "string", json_path = ".spec.plugin"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.availableVersion"
    ),
    printcolumn(name = "Channel", type_ = "string", json_path = ".spec.channel"),
    printcolumn(name = "Healthy", type_ = "boolean", json_path = ".status.healthy"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Deps",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"DependenciesReady\")].status"
    ),
    printcolumn(
        name = "Compatible",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Compatible\")].status",
        priority = 1
    ),
    printcolumn(
        name = "Signer",
        type_ = "string",
        json_path = ".status.pluginSigner",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AddonSpec {
    /// Name of the addon `Plugin` that renders and judges this addon.
    pub plugin: String,
    /// An exact version to install. Wins over `channel` when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// A channel (such as `stable` or `rapid`) whose current version to
    /// install; the plugin's `versions()` says which version that is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// How a channel's newer version reaches the cluster: `Auto` (apply it),
    /// `Notify` (keep what is applied; report it in `status.availableVersion`,
    /// the `UpdateAvailable` condition and one Event per version) or
    /// `Manual` (keep what is applied; report it in `status.availableVersion`
    /// only). `spec.version` always wins.
    #[serde(default, skip_serializing_if = "UpdatePolicy::is_auto")]
    pub update_policy: UpdatePolicy,
    /// Addon-specific configuration, validated by the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub config: Option<serde_json::Value>,
    /// Break-glass patches applied to the rendered objects before they are
    /// applied. A patch whose target is not rendered is an error, never
    /// silently dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<AddonPatch>,
    /// The workload cluster to install into; default: the cluster Capstan
    /// runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<AddonTarget>,
    /// Paused addons are neither applied nor pruned nor corrected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The ServiceAccount of this Addon's namespace whose rights apply,
    /// read, prune and delete its objects (Capstan impersonates it, as Flux
    /// and Argo CD do). Required for an Addon outside Capstan's namespace
    /// unless the controller names a default (`--tenant-service-account`);
    /// in Capstan's namespace, optional (unset: Capstan's own rights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Addons this one is installed after. Until every one is ready
    /// (exists, is not being deleted, has reconciled its current
    /// generation, is healthy, has a version within `versionConstraint`,
    /// and targets the same cluster), this Addon's transitions wait: its
    /// first install, a version change, a new generation, a new plugin
    /// revision. What is already applied is still corrected and assessed.
    /// Cycles are refused. An Addon that others depend on is deleted after
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<AddonDependency>,
}

/// How a channel's newer version reaches the cluster.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdatePolicy {
    /// Apply the channel's newest version as soon as the plugin offers it.
    #[default]
    Auto,
    /// Keep what is applied; report the newer version and emit an Event.
    Notify,
    /// Keep what is applied; report the newer version in status only.
    Manual,
}

impl UpdatePolicy {
    /// The default (for `skip_serializing_if`).
    pub fn is_auto(&self) -> bool {
        *self == UpdatePolicy::Auto
    }
}

/// One Addon another is installed after.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonDependency {
    /// The Addon's name.
    pub name: String,
    /// Its namespace; default: this Addon's. A tenant's Addon may depend on
    /// an Addon of another namespace only if its ServiceAccount may read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Semantic-version requirement its installed version must meet, such
    /// as `>=1.8.0, <2` or `^1.8` (a leading `v` in versions is ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_constraint: Option<String>,
}

/// One patch of rendered objects.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonPatch {
    /// The rendered object to patch.
    pub target: PatchTarget,
    /// `Merge` (RFC 7386 JSON merge patch) or `Strategic` (lists of objects
    /// with a `name`, such as containers, are merged by name).
    #[serde(default, rename = "type")]
    pub type_: PatchType,
    /// The patch itself.
    #[schemars(schema_with = "free_form_object")]
    pub patch: serde_json::Value,
}

/// Which rendered object a patch applies to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchTarget {
    /// `kind` of the object, such as `Deployment`.
    pub kind: String,
    /// `metadata.name` of the object.
    pub name: String,
    /// `metadata.namespace` of the object, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The kind of a patch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PatchType {
    /// RFC 7386 JSON merge patch.
    #[default]
    Merge,
    /// Like `Merge`, but lists whose items all have a `name` are merged
    /// item by item, by name (as `kubectl patch --type strategic` does for
    /// containers, ports, env, volumes).
    Strategic,
}

/// A workload cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonTarget {
    /// A Secret in the Addon's namespace holding a kubeconfig (Cluster API
    /// writes one per cluster as `<cluster>-kubeconfig`, key `value`).
    /// Either this or `clusterName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<KubeconfigSecretRef>,
    /// A `Cluster` of the Addon's namespace: the Addon goes to that
    /// workload cluster through the Cluster's kubeconfig Secret. Either
    /// this or `kubeconfigSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub cluster_name: Option<String>,
}

impl AddonTarget {
    /// The kubeconfig Secret reference the target names, the Cluster's
    /// resolved by `secret_of_cluster` (its Secret's name, if the Cluster
    /// exists); `Err` says which field is wrong.
    pub fn secret_ref(
        &self,
        secret_of_cluster: impl FnOnce(&str) -> Option<String>,
    ) -> Result<KubeconfigSecretRef, String> {
        match (&self.kubeconfig_secret_ref, &self.cluster_name) {
            (Some(secret), None) => Ok(secret.clone()),
            (None, Some(cluster)) => secret_of_cluster(cluster)
                .map(|name| KubeconfigSecretRef { name, key: None })
                .ok_or_else(|| {
                    format!("spec.target.clusterName: Cluster {cluster:?} does not exist in the Addon's namespace")
                }),
            (Some(_), Some(_)) => Err(
                "spec.target: set one of kubeconfigSecretRef and clusterName, not both".into(),
            ),
            (None, None) => Err(
                "spec.target: name the workload cluster with kubeconfigSecretRef or clusterName".into(),
            ),
        }
    }
}

/// Where a kubeconfig is.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSecretRef {
    /// Secret name, in the Addon's namespace.
    pub name: String,
    /// Key in the Secret's data; default `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// What the addon controller observed and did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonStatus {
    /// The version installed (or being installed): `spec.version`, or the
    /// channel's current version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Whether the plugin judged the applied objects healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// `Applying`, `Ready`, `Degraded`, `Paused`, `Failed` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The plugin's observations (for example `readyReplicas=2/2`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_details: Vec<String>,
    /// Where the objects go: `in-cluster`, or the kubeconfig Secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What was applied, in apply order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<InventoryEntry>,
    /// Container images the host's rewrite rules changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_rewrites: Vec<ImageRewriteRecord>,
    /// Digest of the plugin component that rendered the inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_digest: Option<String>,
    /// Who signed that plugin revision: key names or keyless identities,
    /// as its Plugin's `status.signers` (unset: an unsigned development
    /// plugin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_signer: Option<String>,
    /// The newest version of `spec.channel` the loaded plugin offers (under
    /// every update policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_version: Option<String>,
    /// Digest of the plugin revision that offers `availableVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_from: Option<String>,
    /// What the inventory was rendered from. While a dependency is not
    /// ready, drift is corrected by rendering this again, not the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied: Option<AppliedSpec>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Applied`, `Healthy`, `UpToDate`, `DependenciesReady`, `ValidSpec`,
    /// `UpdateAvailable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// The inputs of the render that is applied: the resolved version and the
/// parts of the spec that shape a render.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedSpec {
    /// The Addon's generation then.
    pub generation: i64,
    /// The version rendered.
    pub version: String,
    /// `spec.config` then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub config: Option<serde_json::Value>,
    /// `spec.patches` then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<AddonPatch>,
    /// `spec.target` then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<AddonTarget>,
}

/// One applied object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    /// `apiVersion` it was applied with.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// Namespace (none for cluster-scoped objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// The uid of the object this Addon created (or adopted): prune and
    /// delete only ever act on this very object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Taken over under a `spec.grants.adopt` grant rather than created:
    /// left in place when the Addon goes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

impl std::fmt::Display for InventoryEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One image a rewrite rule changed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageRewriteRecord {
    /// The image as rendered.
    pub from: String,
    /// The image as applied.
    pub to: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_names_one_cluster_by_secret_or_by_cluster() {
        let secret = KubeconfigSecretRef {
            name: "k".into(),
            key: Some("config".into()),
        };
        let by_secret = AddonTarget {
            kubeconfig_secret_ref: Some(secret.clone()),
            cluster_name: None,
        };
        assert_eq!(by_secret.secret_ref(|_| None), Ok(secret.clone()));
        let by_cluster = AddonTarget {
            kubeconfig_secret_ref: None,
            cluster_name: Some("prod".into()),
        };
        let resolved = by_cluster.secret_ref(|c| Some(format!("{c}-kubeconfig")));
        assert_eq!(resolved.map(|r| r.name), Ok("prod-kubeconfig".to_string()));
        let missing = by_cluster.secret_ref(|_| None).unwrap_err();
        assert!(
            missing.contains("spec.target.clusterName") && missing.contains("prod"),
            "{missing}"
        );
        let both = AddonTarget {
            kubeconfig_secret_ref: Some(secret),
            cluster_name: Some("prod".into()),
        };
        assert!(both.secret_ref(|_| None).unwrap_err().contains("not both"));
        let neither = AddonTarget::default();
        assert!(
            neither
                .secret_ref(|_| None)
                .unwrap_err()
                .contains("kubeconfigSecretRef or clusterName")
        );
    }
}
