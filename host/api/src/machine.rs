//! `Machine`: one instance, provided by a plugin, that should become a Node.

use crate::{Condition, conditions_schema, free_form_object, string_map};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The desired state of one machine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    shortname = "ma",
    derive = "PartialEq",
    derive = "Default",
    doc = "One machine (a cloud instance that becomes a Node), provided by a plugin.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(
        name = "Node Name",
        type_ = "string",
        json_path = ".status.nodeRef.name"
    ),
    printcolumn(
        name = "Provider ID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = 10
    ),
    printcolumn(
        name = "Failure domain",
        type_ = "string",
        json_path = ".spec.failureDomain"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"UpToDate\")].status"
    ),
    printcolumn(
        name = "Internal-IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type==\"InternalIP\")].address",
        priority = 10
    ),
    printcolumn(
        name = "External-IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type==\"ExternalIP\")].address",
        priority = 10
    ),
    printcolumn(
        name = "OS-Image",
        type_ = "string",
        json_path = ".status.nodeInfo.osImage",
        priority = 10
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        priority = 10
    ),
    printcolumn(
        name = "Signer",
        type_ = "string",
        json_path = ".status.pluginSigner",
        priority = 10
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The cluster this machine belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// The Kubernetes version the machine should run (for example `v1.30.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$"))]
    pub version: Option<String>,
    /// The failure domain (zone) to place the machine in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Which plugin provides the instance, and its configuration.
    pub provider: ProviderRef,
    /// An existing instance for this Machine to adopt instead of creating
    /// one (Cluster API's `spec.providerID`; lift and shift): the provider
    /// must find it, it must not be tagged for another Machine, and one
    /// launched outside Capstan is adopted only where its Plugin's
    /// `adoptUntaggedIn` allows the namespace. Not in templates.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
    /// The data the instance boots with to join its cluster (Cluster API's
    /// `spec.bootstrap`). Unset: the instance gets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<MachineBootstrap>,
    /// How the machine is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<MachineDeletionSpec>,
    /// Taints the host keeps on the machine's Node (Cluster API's
    /// `spec.taints`); other taints on the Node are left alone. Changed on
    /// existing machines in place, without a rollout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<MachineTaint>,
    /// Seconds the machine stays Ready before it counts as Available
    /// (Cluster API's `spec.minReadySeconds`). Unset: its set's
    /// `minReadySeconds`, else 0. Changed on existing machines in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_ready_seconds: Option<i32>,
    /// More conditions the machine's `Ready` waits for (Cluster API's
    /// `spec.readinessGates`), for example one a controller installing
    /// drivers sets on the Machine. A condition not reported yet counts as
    /// `Unknown`. Changed on existing machines in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["conditionType"])
    )]
    pub readiness_gates: Vec<MachineReadinessGate>,
}

impl MachineSpec {
    /// How long the machine stays Ready before it is Available: its own
    /// `minReadySeconds`, else its set's.
    pub fn min_ready_seconds_or(&self, set: i32) -> i32 {
        self.min_ready_seconds.unwrap_or(set).max(0)
    }
}

/// Where a machine's bootstrap data comes from: the user's own Secret, or a
/// bootstrap Plugin that renders it (exactly one).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineBootstrap {
    /// A Secret in the Machine's namespace, of type
    /// `cluster.x-k8s.io/secret`, whose key `value` is the data (and `format`,
    /// if set, one of `cloud-config`, `ignition`, `shell`); used as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub data_secret_name: Option<String>,
    /// Name of a (cluster-scoped) bootstrap `Plugin` that renders the data;
    /// it must allow the Machine's namespace. The host mints the machine's
    /// bootstrap token and writes the data into the Secret
    /// `status.bootstrapDataSecretName` names, owned by the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub plugin: Option<String>,
    /// The bootstrap plugin's configuration; its `validate` checks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub config: Option<serde_json::Value>,
}

/// What a machine's initialization has done, as in Cluster API v1beta2's
/// `status.initialization`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// The bootstrap data Secret exists (the instance is created only after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_data_secret_created: Option<bool>,
    /// When the machine's bootstrap token expires (RFC 3339), while it has
    /// one: it is renewed until the Node joins, then deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token_expires: Option<String>,
}

/// A condition of the Machine that must hold for it to be Ready (Cluster
/// API's `MachineReadinessGate`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineReadinessGate {
    /// The type of a condition in the Machine's `status.conditions` (its
    /// own or one another controller sets), for example
    /// `example.com/DriversInstalled`.
    #[schemars(
        length(min = 1, max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
        )
    )]
    pub condition_type: String,
    /// `Positive` (the default): the gate holds while the condition is
    /// `True`; `Negative`: while it is `False`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polarity: Option<ConditionPolarity>,
}

/// Which status of a condition is the good one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConditionPolarity {
    /// `True` is good.
    #[default]
    Positive,
    /// `False` is good.
    Negative,
}

impl MachineReadinessGate {
    /// The condition status under which the gate holds.
    pub fn wanted_status(&self) -> &'static str {
        match self.polarity.unwrap_or_default() {
            ConditionPolarity::Positive => "True",
            ConditionPolarity::Negative => "False",
        }
    }
}

/// A taint for the machine's Node (Cluster API's `MachineTaint`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTaint {
    /// Taint key (not under `node.kubernetes.io/` or the keys Cluster API
    /// reserves).
    pub key: String,
    /// Taint value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: TaintEffect,
    /// `Always`: kept on the Node for as long as the machine has it (and
    /// removed when it no longer does); `OnInitialization`: set once when
    /// the Node joins, then left alone.
    pub propagation: TaintPropagation,
}

/// A taint's effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaintEffect {
    /// New pods without a toleration are not scheduled.
    NoSchedule,
    /// The scheduler avoids the Node.
    PreferNoSchedule,
    /// Running pods without a toleration are evicted too.
    NoExecute,
}

impl TaintEffect {
    /// The name Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// When a taint is carried to the Node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaintPropagation {
    /// Kept on the Node continuously.
    Always,
    /// Set once, when the Node joins.
    OnInitialization,
}

/// How a machine is deleted (Cluster API's `spec.deletion`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeletionSpec {
    /// Most seconds spent draining the Node before the instance is deleted
    /// anyway. Unset or 0: wait until the drain completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub node_drain_timeout_seconds: Option<i32>,
    /// Most seconds spent waiting, after the drain, for the Node's volumes
    /// to detach before the instance is deleted anyway. Unset or 0: wait
    /// until they are detached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub node_volume_detach_timeout_seconds: Option<i32>,
    /// Most seconds, counted from the deletion request, that deleting the
    /// Node object is retried before the machine lets go without it. Unset:
    /// 10 (Cluster API's default); 0: retry forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub node_deletion_timeout_seconds: Option<i32>,
}

/// Progress of a machine's deletion.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeletionStatus {
    /// When draining the Node started (the drain timeout counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_drain_start_time: Option<crate::Time>,
    /// When the drain step ended: the Node was drained, or the drain was
    /// skipped or cut short (its timeout, the exclude annotation, no Node).
    /// Later passes go on from there instead of draining again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_drain_end_time: Option<crate::Time>,
    /// When waiting for the Node's volumes to detach started (its timeout
    /// counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_node_volume_detach_start_time: Option<crate::Time>,
    /// When the wait for volumes ended: they were detached, or the wait was
    /// skipped or cut short. Later passes go on from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_volume_detach_end_time: Option<crate::Time>,
}

/// A reference to a provider plugin plus the configuration it gets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderRef {
    /// Name of the (cluster-scoped) `Plugin` object.
    #[schemars(length(min = 1))]
    pub plugin: String,
    /// Provider-specific configuration; the plugin's `validate` checks it.
    #[serde(default = "empty_object")]
    #[schemars(schema_with = "free_form_object")]
    pub config: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// Lifecycle phase of a machine, for humans (`kubectl get ma`); controllers
/// decide from conditions and fields, not from the phase.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MachinePhase {
    /// Accepted, not yet created at the provider.
    #[default]
    Pending,
    /// The provider is creating the instance.
    Provisioning,
    /// The instance runs; its Node has not joined (or is not Ready) yet.
    Provisioned,
    /// The instance runs and its Node is Ready.
    Running,
    /// Being deleted at the provider.
    Deleting,
    /// Deprecated, as in Cluster API v1beta2: never set any more (a failure
    /// is `Ready=False` with `failureReason`); kept so old objects parse.
    Failed,
    /// Being changed in place by updater plugins (see `Updating`).
    Updating,
    /// An in-place update failed; the `Updating` condition says why. The
    /// machine stays as it is until it is deleted (and replaced).
    UpdateFailed,
}

/// An address of a machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct MachineAddress {
    /// `InternalIP`, `ExternalIP`, `InternalDNS`, `ExternalDNS` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// The Node a machine became.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct NodeRef {
    /// Node name.
    pub name: String,
    /// Node uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// What the controller observed about a machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// The provider's stable ID for the instance; the Node carries the same
    /// value in `spec.providerID`.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Human-readable phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    /// Addresses the provider reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// The Node whose `spec.providerID` matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<NodeRef>,
    /// The version the instance runs, as the provider reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Machine-readable reason of a terminal failure; the controller stops
    /// retrying until the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Human-readable detail of a terminal failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// The Plugin that created the instance: it alone reads and releases
    /// it, whatever `spec.provider.plugin` says later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_plugin: Option<String>,
    /// Set when the instance was adopted instead of created, and how: its
    /// tags name this Machine (`Tags`: a restore, a re-apply, a move, or a
    /// `spec.providerID` naming such an instance), or it is untagged and
    /// `spec.providerID` named it where the Plugin allows (`ProviderID`:
    /// lift and shift).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted: Option<AdoptedBy>,
    /// Digest (`sha256:…`) of the plugin that last acted on this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_digest: Option<String>,
    /// Who signed that plugin revision: key names or keyless identities,
    /// as its Plugin's `status.signers` (unset: an unsigned development
    /// plugin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_signer: Option<String>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Progress of the deletion, once it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<MachineDeletionStatus>,
    /// The in-place update under way (or the last one): the plan, recorded
    /// before the first updater runs, and each step's progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update: Option<InPlaceUpdateStatus>,
    /// Provenance: the updaters (and their digests) that changed this
    /// machine in place, oldest first (the last 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub updated_by: Vec<UpdateRecord>,
    /// The Secret (in the Machine's namespace) holding the bootstrap data
    /// the instance was created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_data_secret_name: Option<String>,
    /// What the machine's initialization has done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// What the Node's kubelet reports about the machine (kubelet and
    /// kernel versions, OS image, machine ID), as in Cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<k8s_openapi::api::core::v1::NodeSystemInfo>,
    /// `Ready` (the Node is Ready), `InstanceProvisioned`, `ConfigValid`,
    /// `Deleting` (which deletion step, what blocks it); written by the
    /// health check: `HealthCheckSucceeded`, `OwnerRemediated`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// How a Machine's instance was adopted (`status.adopted`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AdoptedBy {
    /// Its tags named this Machine's namespace and name.
    Tags,
    /// Untagged, named by `spec.providerID` under the Plugin's
    /// `spec.adoptUntaggedIn`.
    ProviderID,
}

impl Machine {
    /// The Plugin that owns the machine's instance: the one that created
    /// it, or (before one was created, or for machines created before this
    /// was recorded) the spec's.
    pub fn instance_plugin(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.provider_plugin.as_deref())
            .unwrap_or(&self.spec.provider.plugin)
    }

    /// Why the spec cannot be acted on: the provider Plugin changed after
    /// the instance was created (a Machine keeps its instance).
    pub fn provider_changed(&self) -> Option<String> {
        let status = self.status.as_ref()?;
        status.provider_id.as_ref()?;
        let created_with = status.provider_plugin.as_deref()?;
        (created_with != self.spec.provider.plugin).then(|| {
            format!(
                "spec.provider.plugin changed from {created_with:?} to {:?} after instance {} was created; a Machine keeps its instance: change it back, or delete the Machine (its instance is released through {created_with:?})",
                self.spec.provider.plugin,
                status.provider_id.as_deref().unwrap_or_default()
            )
        })
    }
}

#[cfg(test)]
mod instance_tests {
    use super::*;

    #[test]
    fn the_plugin_that_created_the_instance_keeps_it() {
        let mut m = Machine::new("m", MachineSpec::default());
        m.spec.provider.plugin = "ec2".into();
        assert_eq!(m.instance_plugin(), "ec2");
        assert!(m.provider_changed().is_none(), "no instance yet");
        m.status = Some(MachineStatus {
            provider_id: Some("aws:///z/i-1".into()),
            provider_plugin: Some("ec2".into()),
            ..Default::default()
        });
        assert!(m.provider_changed().is_none());
        m.spec.provider.plugin = "sim".into();
        assert_eq!(m.instance_plugin(), "ec2");
        let why = m.provider_changed().unwrap();
        assert!(
            why.starts_with(
                "spec.provider.plugin changed from \"ec2\" to \"sim\" after instance aws:///z/i-1"
            ),
            "{why}"
        );
    }
}

/// An in-place update of one machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceUpdateStatus {
    /// The spec generation the update brings the machine to.
    pub generation: i64,
    /// When the plan was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<crate::Time>,
    /// The updaters in the order they run.
    #[serde(default)]
    pub steps: Vec<InPlaceStep>,
    /// Changed fields no updater claimed (the update fails when any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclaimed: Vec<String>,
    /// When the Node was drained for a step whose updater declares a
    /// drain; later steps run on the drained Node without draining again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_drained_time: Option<crate::Time>,
    /// The Node this update cordoned (it was schedulable before), made
    /// schedulable again once every step is done. Recorded before the
    /// cordon, so a restart cannot forget it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncordon_node: Option<String>,
}

impl InPlaceUpdateStatus {
    /// Whether the machine stays available while updated: every step's
    /// updater declares that it does not affect availability.
    pub fn keeps_availability(&self) -> bool {
        !self.steps.is_empty() && self.steps.iter().all(|s| !s.affects_availability())
    }
}

/// One updater's part of an in-place update.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceStep {
    /// Updater Plugin name.
    pub updater: String,
    /// The fields it claimed.
    pub fields: Vec<String>,
    /// `Pending`, `Updating`, `Done` or `Failed`.
    pub state: String,
    /// Percent done, as the updater last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
    /// The updater's last message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Digest of the updater that ran this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// How long the step may go without progress before a health check
    /// judges it hung: its updater's deadline when the plan was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<u32>,
    /// Its updater declares that its pods must leave first: the Node is
    /// cordoned and drained before the step runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// Whether the machine is unavailable while the step runs, as its
    /// updater declares. Unset: it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
    /// When the step became the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<crate::Time>,
    /// When the step last made progress: it became the current step, or
    /// its percent rose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_time: Option<crate::Time>,
}

impl InPlaceStep {
    /// Whether the machine is unavailable while the step runs.
    pub fn affects_availability(&self) -> bool {
        self.affects_availability.unwrap_or(true)
    }
}

/// Which updater changed a machine in place, and when.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateRecord {
    /// Updater Plugin name.
    pub updater: String,
    /// `sha256:…` of the updater's component.
    pub digest: String,
    /// The fields it applied.
    pub fields: Vec<String>,
    /// The spec generation it brought the machine to.
    pub generation: i64,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<crate::Time>,
}

/// Labels and annotations stamped on every machine made from a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels; must match the owner's selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "string_map")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "string_map")]
    pub annotations: BTreeMap<String, String>,
}

/// The template machines are made from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateSpec {
    /// Labels and annotations for the machines.
    #[serde(default)]
    pub metadata: TemplateMeta,
    /// The machines' spec.
    pub spec: MachineSpec,
}

/// Machine condition types.
impl Machine {
    /// Whether a MachineHealthCheck found it unhealthy
    /// (`HealthCheckSucceeded=False`) or is having it remediated
    /// (`OwnerRemediated`).
    pub fn failed_health_check(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        crate::condition(
            &status.conditions,
            machine_conditions::HEALTH_CHECK_SUCCEEDED,
        )
        .is_some_and(|c| c.status == crate::status::FALSE)
            || crate::condition(&status.conditions, machine_conditions::OWNER_REMEDIATED).is_some()
    }
}

pub mod machine_conditions {
    /// The instance runs, its Node exists and is Ready, a health check (if
    /// one watches the machine) finds it healthy, and its
    /// `spec.readinessGates` hold.
    pub const READY: &str = "Ready";
    /// The provider reports the instance as running.
    pub const INSTANCE_PROVISIONED: &str = "InstanceProvisioned";
    /// The plugin accepted the provider config.
    pub const CONFIG_VALID: &str = "ConfigValid";
    /// The machine is being deleted; the reason says which step it is at
    /// (`WaitingForPreDrainHook`, `DrainingNode`, `WaitingForPreTerminateHook`,
    /// `WaitingForInfrastructureDeletion`, `DeletingNode`) and the message
    /// what blocks it.
    pub const DELETING: &str = "Deleting";
    /// `False` while an in-place update brings the machine to its spec (or
    /// after it failed), `True` once it did.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// `True` while updaters change the machine in place (the message has
    /// the updater's percent and message); `False` with reason
    /// `UpdateFailed` when one failed.
    pub const UPDATING: &str = "Updating";
    /// Written by a MachineHealthCheck: `False` when the machine is unhealthy.
    pub const HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";
    /// Written by a MachineHealthCheck: `False` while the machine waits for
    /// (or undergoes) remediation by its owner.
    pub const OWNER_REMEDIATED: &str = "OwnerRemediated";
    /// `True` (reason `Paused`) while the `cluster.x-k8s.io/paused`
    /// annotation holds the machine; `False` once it is gone.
    pub const PAUSED: &str = "Paused";
    /// Cluster API's name for [`INSTANCE_PROVISIONED`]: the same status,
    /// reason and message, for dashboards and tools that look for it.
    pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
    /// The Node's own `Ready` condition, mirrored (`Unknown` with reason
    /// `NodeDoesNotExist` before there is a Node).
    pub const NODE_READY: &str = "NodeReady";
    /// The Node is Ready and under no memory, disk or PID pressure.
    pub const NODE_HEALTHY: &str = "NodeHealthy";
    /// Ready for at least its `minReadySeconds` (the machine's own, else
    /// its set's; Cluster API's machine-level `Available`).
    pub const AVAILABLE: &str = "Available";
    /// The condition types the Machine controller owns (the others on a
    /// Machine belong to other controllers and are left alone).
    pub const OWNED_BY_MACHINE_CONTROLLER: [&str; 11] = [
        READY,
        INSTANCE_PROVISIONED,
        CONFIG_VALID,
        DELETING,
        UP_TO_DATE,
        UPDATING,
        PAUSED,
        INFRASTRUCTURE_READY,
        NODE_READY,
        NODE_HEALTHY,
        AVAILABLE,
    ];
}
