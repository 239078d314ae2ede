//! `MachineSet` (keeps N machines of one template) and `MachineDeployment`
//! (rolls a template out across MachineSets).

use crate::{Condition, IntOrString, LabelSelector, MachineTemplateSpec, Time, conditions_schema};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which machines a MachineSet removes first when scaling down (after
/// failed and not-ready machines, which always go first): Cluster API
/// v1beta2's `spec.deletion.order`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletePolicy {
    /// Any machine (stable per machine, so repeated reconciles agree).
    #[default]
    Random,
    /// The most recently created machines.
    Newest,
    /// The oldest machines.
    Oldest,
}

/// How a set or deployment scales down (Cluster API v1beta2's
/// `spec.deletion`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletionOrder {
    /// Which machines go first: `Random` (default), `Newest` or `Oldest`.
    #[serde(default)]
    pub order: DeletePolicy,
}

/// The desired state of a MachineSet.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "MachineSet",
    namespaced,
    status = "MachineSetStatus",
    shortname = "ms",
    derive = "PartialEq",
    derive = "Default",
    doc = "Keeps a number of machines made from one template.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.upToDateReplicas"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        priority = 10
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.template.spec.version"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// The workload `Cluster` (same namespace) its machines' Nodes live
    /// in; the template's `spec.clusterName` defaults to it and may not
    /// name another. Unset: the cluster Capstan runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub cluster_name: Option<String>,
    /// Number of machines wanted.
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Which machines belong to the set; must match the template's labels.
    pub selector: LabelSelector,
    /// What each machine looks like.
    pub template: MachineTemplateSpec,
    /// Which machines go first when scaling down (`spec.deletion.order`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<DeletionOrder>,
    /// Deprecated: v1beta1's name of `spec.deletion.order`, accepted for
    /// one release (`ValidSpec` says `DeprecatedFields`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_policy: Option<DeletePolicy>,
    /// Seconds a machine must have been Ready to count as available.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_ready_seconds: i32,
    /// The in-place policy of the deployment that made this set (copied
    /// from its `spec.rollout.strategy.inPlace`): which updaters may change the
    /// machines handed over to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<InPlaceStrategy>,
}

fn one() -> i32 {
    1
}

impl MachineSetSpec {
    /// Which machines go first: `spec.deletion.order`, else the deprecated
    /// `spec.deletePolicy`, else `Random`.
    pub fn deletion_order(&self) -> DeletePolicy {
        self.deletion
            .as_ref()
            .map(|d| d.order)
            .or(self.delete_policy)
            .unwrap_or_default()
    }

    /// The v1beta1 names this spec still uses, or which old and new name
    /// disagree.
    pub fn renamed_fields(&self) -> Result<Vec<Renamed>, String> {
        let mut renamed = Vec::new();
        let new = self.deletion.as_ref().map(|d| d.order);
        renamed.extend(Renamed::check(DELETE_POLICY, self.delete_policy, new)?);
        Ok(renamed)
    }
}

/// A v1beta1 field name still in use, and its v1beta2 name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renamed {
    /// The v1beta1 path, e.g. `spec.strategy`.
    pub old: &'static str,
    /// Its v1beta2 path, e.g. `spec.rollout.strategy`.
    pub new: &'static str,
}

const DELETE_POLICY: Renamed = Renamed {
    old: "spec.deletePolicy",
    new: "spec.deletion.order",
};
const STRATEGY: Renamed = Renamed {
    old: "spec.strategy",
    new: "spec.rollout.strategy",
};

impl Renamed {
    /// `Some(self)` when the old name is used; an error when both are set
    /// and differ (which one is meant cannot be known).
    fn check<T: PartialEq>(self, old: Option<T>, new: Option<T>) -> Result<Option<Self>, String> {
        match (old, new) {
            (None, _) => Ok(None),
            (Some(o), Some(n)) if o != n => Err(format!(
                "{} and {} are both set and differ; keep only {} ({} is its deprecated v1beta1 name)",
                self.old, self.new, self.new, self.old
            )),
            (Some(_), _) => Ok(Some(self)),
        }
    }

    /// What `ValidSpec` and the Warning Event say about the names in use.
    pub fn message(renamed: &[Renamed]) -> String {
        let moves: Vec<String> = renamed
            .iter()
            .map(|r| format!("{} is deprecated: move it to {}", r.old, r.new))
            .collect();
        format!(
            "{} (the v1beta1 names are accepted until the API leaves v1alpha1; see \"Coming from Cluster API\" in docs/concepts.md)",
            moves.join("; ")
        )
    }
}

/// Counts a MachineSet observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    /// Machines that belong to the set (including ones being deleted).
    #[serde(default)]
    pub replicas: i32,
    /// Machines whose Node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Machines Ready for at least `minReadySeconds`.
    #[serde(default)]
    pub available_replicas: i32,
    /// Machines in a terminal failure.
    #[serde(default)]
    pub failed_replicas: i32,
    /// Machines (not being deleted) that no in-place update is changing:
    /// up to date with the set's template, as Cluster API v1beta2 counts
    /// `upToDateReplicas`. Its change when an update finishes is what
    /// wakes the set's deployment.
    #[serde(default)]
    pub up_to_date_replicas: i32,
    /// Machines this set has deleted because a MachineHealthCheck handed
    /// them over, ever (a deployment's `spec.rollback` counts them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub remediated_replicas: i32,
    /// The Kubernetes versions its Machines run, lowest first, with how
    /// many run each (Cluster API v1beta2's `status.versions`): a
    /// Machine's Node's kubelet version, else its `spec.version`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 100),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["version"])
    )]
    pub versions: Vec<StatusVersion>,
    /// The selector as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (all replicas available), `ValidSpec`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// How a MachineDeployment replaces machines when its template changes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum StrategyType {
    /// Replace machines a few at a time within `maxSurge` / `maxUnavailable`.
    #[default]
    RollingUpdate,
    /// Only replace machines a user deleted.
    OnDelete,
}

/// Bounds of a rolling update.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Machines allowed above `replicas` during a rollout: a count or a
    /// percentage of `replicas` (rounded up). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// Machines allowed to be unavailable below `replicas`: a count or a
    /// percentage of `replicas` (rounded down). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// The rollout strategy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    /// `RollingUpdate` (default) or `OnDelete`.
    #[serde(default, rename = "type")]
    pub type_: StrategyType,
    /// Bounds for `RollingUpdate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
    /// Opt in to in-place updates (`RollingUpdate` only; `OnDelete` never
    /// updates in place): machines whose changes updater plugins claim are
    /// changed where they run instead of replaced, within the same
    /// `maxSurge` / `maxUnavailable` bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<InPlaceStrategy>,
}

/// Which updaters a deployment may use, and what happens to changes none
/// of them claims.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceStrategy {
    /// Names of updater Plugins that may be used (default: every active
    /// updater). They are asked in `spec.updateOrder`, then name, order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updaters: Option<Vec<String>>,
    /// When some changed field is claimed by no updater: `None` (default)
    /// changes nothing and reports the unclaimed fields in the
    /// `InPlaceUpdatable` condition; `Replace` rolls the machines by
    /// replacement. Decided before a machine starts updating, never
    /// switched mid-update.
    #[serde(default)]
    pub fallback: InPlaceFallback,
}

/// What an in-place rollout does with changes no updater claims.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum InPlaceFallback {
    /// Change nothing; wait for the spec, the updaters or the fallback to change.
    #[default]
    None,
    /// Replace the machines (a rolling replacement, as without `inPlace`).
    Replace,
}

/// The desired state of a MachineDeployment.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "MachineDeployment",
    namespaced,
    status = "MachineDeploymentStatus",
    shortname = "md",
    derive = "PartialEq",
    derive = "Default",
    doc = "Rolls a machine template out across MachineSets.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.upToDateReplicas"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        priority = 10
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.template.spec.version"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// The workload `Cluster` (same namespace) its machines' Nodes live
    /// in; the template's `spec.clusterName` defaults to it and may not
    /// name another. Unset: the cluster Capstan runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub cluster_name: Option<String>,
    /// Number of machines wanted.
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Which machines belong to the deployment; must match the template's labels.
    pub selector: LabelSelector,
    /// What each machine looks like; changing it starts a rollout.
    pub template: MachineTemplateSpec,
    /// Deprecated: v1beta1's name of `spec.rollout.strategy`, accepted for
    /// one release (`ValidSpec` says `DeprecatedFields`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// Which machines go first when scaling down; copied to its sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<DeletionOrder>,
    /// Seconds a machine must have been Ready to count as available.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_ready_seconds: i32,
    /// Stop rolling out (scaling still applies).
    #[serde(default)]
    pub paused: bool,
    /// Old MachineSets (with zero replicas) kept for rollback. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub revision_history_limit: Option<i32>,
    /// How the machines a MachineHealthCheck hands over are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<DeploymentRemediation>,
    /// How machines are replaced (`strategy`), and rollout triggers other
    /// than a template change (`after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<DeploymentRollout>,
    /// Roll a failing rollout back by itself (beyond Cluster API). Unset:
    /// never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<AutomaticRollback>,
}

/// When a rollout that is going wrong returns to the previous revision by
/// itself. Either trigger (or both) may be set; a rollout that completed is
/// never rolled back automatically, and a template is rolled back from at
/// most once (see `capstan.dev/automatic-rollback`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutomaticRollback {
    /// Roll back when the rollout has made no progress (no machine of the
    /// new revision became available) for this many seconds, as a
    /// Deployment's `progressDeadlineSeconds` judges progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: Option<i32>,
    /// Roll back once this many machines of the new revision have been
    /// remediated (deleted by their set after a MachineHealthCheck handed
    /// them over) during the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub remediated_machines: Option<i32>,
}

/// The last automatic rollback of a deployment (the
/// `capstan.dev/automatic-rollback` annotation's value).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AutomaticRollbackRecord {
    /// Template hash rolled back from.
    pub from: String,
    /// Its revision.
    pub from_revision: i64,
    /// Template hash rolled back to.
    pub to: String,
    /// Its revision when it was restored.
    pub to_revision: i64,
    /// `ProgressDeadlineExceeded` or `MachinesRemediated`.
    pub reason: String,
    /// What triggered it, in words.
    pub message: String,
}

/// Rollout triggers other than a template change (Cluster API's
/// `MachineDeployment.spec.rollout`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentRollout {
    /// Once this time has passed, every machine made before it is replaced
    /// by a rollout, even if the template did not change (to recycle
    /// machines: credentials, images baked at boot). RFC 3339, e.g.
    /// `2026-12-01T09:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<crate::Time>,
    /// How machines are replaced: `RollingUpdate` (default) or `OnDelete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
}

/// `RollingUpdate` with Cluster API's default bounds.
const DEFAULT_STRATEGY: Strategy = Strategy {
    type_: StrategyType::RollingUpdate,
    rolling_update: None,
    in_place: None,
};

impl MachineDeploymentSpec {
    /// How machines are replaced: `spec.rollout.strategy`, else the
    /// deprecated `spec.strategy`, else a rolling update.
    pub fn rollout_strategy(&self) -> &Strategy {
        self.rollout_strategy_at().0
    }

    /// The strategy in effect and the field it was read from (for errors
    /// that name the field the user wrote): `spec.rollout.strategy`, else
    /// the deprecated `spec.strategy`, else the default (reported at its
    /// v1beta2 place).
    pub fn rollout_strategy_at(&self) -> (&Strategy, &'static str) {
        match (
            self.rollout.as_ref().and_then(|r| r.strategy.as_ref()),
            self.strategy.as_ref(),
        ) {
            (Some(strategy), _) => (strategy, "spec.rollout.strategy"),
            (None, Some(strategy)) => (strategy, "spec.strategy"),
            (None, None) => (&DEFAULT_STRATEGY, "spec.rollout.strategy"),
        }
    }

    /// The strategy to edit, at its v1beta2 place (moved there from the
    /// deprecated `spec.strategy` when only that is set).
    pub fn rollout_strategy_mut(&mut self) -> &mut Strategy {
        let old = self.strategy.take();
        let rollout = self.rollout.get_or_insert_with(Default::default);
        rollout
            .strategy
            .get_or_insert_with(|| old.unwrap_or_default())
    }

    /// Which machines go first when scaling down (default `Random`).
    pub fn deletion_order(&self) -> DeletePolicy {
        self.deletion.as_ref().map(|d| d.order).unwrap_or_default()
    }

    /// The v1beta1 names this spec still uses, or which old and new name
    /// disagree.
    pub fn renamed_fields(&self) -> Result<Vec<Renamed>, String> {
        let new = self.rollout.as_ref().and_then(|r| r.strategy.as_ref());
        Ok(STRATEGY
            .check(self.strategy.as_ref(), new)?
            .into_iter()
            .collect())
    }
}

/// How a deployment's unhealthy machines are replaced (Cluster API's
/// `MachineDeployment.spec.remediation`). Only the current revision's set
/// remediates; older sets' machines go with the rollout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentRemediation {
    /// Most machines being remediated at once: a count, or a percentage of
    /// `replicas` rounded up. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<crate::IntOrString>,
}

/// Human-readable phase of a MachineDeployment.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeploymentPhase {
    /// Fewer machines than wanted.
    ScalingUp,
    /// More machines than wanted.
    ScalingDown,
    /// Replacing machines with the new template.
    RollingOut,
    /// A rollout is paused.
    Paused,
    /// All wanted machines are up to date and available.
    Running,
    /// The spec is invalid or machines failed terminally.
    Failed,
    /// An in-place rollout cannot go on: an update failed, or changes no
    /// updater claims wait for a decision (see `InPlaceUpdatable`).
    Blocked,
}

/// What a MachineDeployment observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStatus {
    /// Machines across all its MachineSets.
    #[serde(default)]
    pub replicas: i32,
    /// Machines made from the current template (v1beta1's name; v1beta2
    /// counts `upToDateReplicas`).
    #[serde(default)]
    pub updated_replicas: i32,
    /// Machines whose `UpToDate` condition is `True` (Cluster API v1beta2).
    #[serde(default)]
    pub up_to_date_replicas: i32,
    /// Machines whose Node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Machines available (Ready for `minReadySeconds`).
    #[serde(default)]
    pub available_replicas: i32,
    /// `replicas` wanted minus available (never negative).
    #[serde(default)]
    pub unavailable_replicas: i32,
    /// The Kubernetes versions its Machines run, lowest first, with how
    /// many run each (Cluster API v1beta2's `status.versions`): a
    /// Machine's Node's kubelet version, else its `spec.version`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 100),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["version"])
    )]
    pub versions: Vec<StatusVersion>,
    /// The current template's revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The selector as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Human-readable phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DeploymentPhase>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// With `spec.rollout.strategy.inPlace`: what the rollout does with each
    /// machine not yet on the current template (`capstan rollout plan`
    /// prints it). Computed also while paused, so a plan can be read
    /// before anything happens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_plan: Option<RolloutPlan>,
    /// The rollout of the current template, as `spec.rollback` judges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutProgress>,
    /// `Available`, `Progressing`, `ValidSpec`, `InPlaceUpdatable`,
    /// `RolledBack`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// A Kubernetes version and how many Machines run it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusVersion {
    #[schemars(length(min = 1, max = 256))]
    pub version: String,
    #[schemars(range(min = 1))]
    pub replicas: i32,
}

/// Where the rollout of the current template started, for `spec.rollback`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutProgress {
    /// The template's hash.
    pub template: String,
    /// When its rollout started (or was last resumed).
    pub start_time: Time,
    /// Its set's `remediatedReplicas` then: the rollout's remediations are
    /// counted from there.
    #[serde(default)]
    pub remediated_before: i32,
    /// The rollout completed once; it is not rolled back automatically
    /// after that.
    #[serde(default)]
    pub complete: bool,
}

/// What an in-place rollout will do.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPlan {
    /// The revision the plan rolls out.
    pub revision: i64,
    /// `InPlace`, `Replace` (the fallback applies) or `Blocked`.
    pub decision: String,
    /// Per machine not yet on the current template, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<MachinePlanView>,
}

/// One machine's part in a rollout plan.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePlanView {
    /// Machine name.
    pub machine: String,
    /// `InPlace`, `Replace`, `Blocked`, `Updating` or `UpdateFailed`.
    pub action: String,
    /// Updaters in the order they run, with the fields each applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<PlannedStep>,
    /// Changed fields no updater claims.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclaimed: Vec<String>,
}

/// An updater and the fields it applies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedStep {
    /// Updater Plugin name.
    pub updater: String,
    /// Fields it claimed.
    pub fields: Vec<String>,
    /// The Node is cordoned and drained before this step (its updater
    /// declares it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// The machine is unavailable while the step runs (counts against
    /// `maxUnavailable`). Unset: it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

/// MachineSet and MachineDeployment condition types.
pub mod set_conditions {
    /// All wanted replicas are available (at least `replicas - maxUnavailable`
    /// for a deployment).
    pub const AVAILABLE: &str = "Available";
    /// A rollout is making progress (or has completed).
    pub const PROGRESSING: &str = "Progressing";
    /// The spec passes the checks the schema cannot express.
    pub const VALID_SPEC: &str = "ValidSpec";
    /// With `spec.rollout.strategy.inPlace`: whether the rollout can go on in
    /// place (`False` names the unclaimed fields or the failed update).
    pub const IN_PLACE_UPDATABLE: &str = "InPlaceUpdatable";
    /// The deployment runs a template it returned to automatically
    /// (`spec.rollback`); the message says from which and why.
    pub const ROLLED_BACK: &str = "RolledBack";
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}
