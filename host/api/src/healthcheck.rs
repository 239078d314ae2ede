//! `MachineHealthCheck`: which machines are unhealthy, and whether their
//! owners may replace them. Field names follow Cluster API v1beta2.

use crate::{Condition, IntOrString, LabelSelector, conditions_schema};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default `checks.nodeStartupTimeoutSeconds`, as in Cluster API.
pub const DEFAULT_NODE_STARTUP_TIMEOUT_SECONDS: i32 = 600;

/// The desired state of a MachineHealthCheck.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "MachineHealthCheck",
    namespaced,
    status = "MachineHealthCheckStatus",
    shortname = "mhc",
    derive = "PartialEq",
    derive = "Default",
    doc = "Marks machines unhealthy by their Node's conditions and asks their owners to replace them.",
    printcolumn(
        name = "Expected",
        type_ = "integer",
        json_path = ".status.expectedMachines"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".status.currentHealthy"
    ),
    printcolumn(
        name = "Allowed",
        type_ = "integer",
        json_path = ".status.remediationsAllowed"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckSpec {
    /// The cluster the machines belong to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Which Machines (in the check's namespace) are checked.
    pub selector: LabelSelector,
    /// When a machine counts as unhealthy.
    #[serde(default)]
    pub checks: HealthChecks,
    /// When and how fast unhealthy machines are remediated.
    #[serde(default)]
    pub remediation: HealthCheckRemediation,
}

/// When a machine counts as unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthChecks {
    /// Seconds a machine may run without its Node appearing (counted from
    /// the machine's creation). Default 600; 0 disables the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub node_startup_timeout_seconds: Option<i32>,
    /// Node conditions that make a machine unhealthy once they have held
    /// for `timeoutSeconds` (for example `Ready` `Unknown` for 300 s).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_node_conditions: Vec<UnhealthyCondition>,
    /// Machine conditions that make a machine unhealthy the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_machine_conditions: Vec<UnhealthyCondition>,
}

/// A condition that, held long enough, makes a machine unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyCondition {
    /// Condition type (for example `Ready`).
    #[serde(rename = "type")]
    #[schemars(length(min = 1))]
    pub type_: String,
    /// Condition status that is unhealthy.
    #[schemars(regex(pattern = r"^(True|False|Unknown)$"))]
    pub status: String,
    /// Seconds the condition must have held.
    #[schemars(range(min = 0))]
    pub timeout_seconds: i32,
}

/// When and how fast unhealthy machines are remediated.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckRemediation {
    /// The short-circuit: remediate only while the unhealthy count is within
    /// these bounds (too much broken at once usually means the problem is
    /// not the machines). Unset: always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_if: Option<RemediationTrigger>,
    /// Most machines being remediated (deleted and replaced) at once: a
    /// count or a percentage of the expected machines. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<IntOrString>,
    /// `Remediate` (the default): unhealthy machines are handed to their
    /// owners for replacement. `Report`: they are only marked
    /// (`HealthCheckSucceeded=False`), nothing is replaced — to try a check
    /// out, or to watch a fleet before trusting it with deletions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RemediationMode>,
}

/// What a health check does with the unhealthy machines it finds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RemediationMode {
    /// Hand them to their owners for replacement.
    #[default]
    Remediate,
    /// Only mark them.
    Report,
}

/// Bounds on the unhealthy count within which remediation happens.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationTrigger {
    /// Remediate only while at most this many (or this percentage of the
    /// expected) machines are unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_less_than_or_equal_to: Option<IntOrString>,
    /// Remediate only while the unhealthy count is in this range, written
    /// `[min-max]` (for example `[1-3]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\[[0-9]+-[0-9]+\]$"))]
    pub unhealthy_in_range: Option<String>,
}

/// What the health check observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckStatus {
    /// Machines the selector matches (not being deleted).
    #[serde(default)]
    pub expected_machines: i32,
    /// Of those, how many are healthy.
    #[serde(default)]
    pub current_healthy: i32,
    /// How many more machines may be remediated before the short-circuit
    /// stops remediation.
    #[serde(default)]
    pub remediations_allowed: i32,
    /// Names of the machines checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `RemediationAllowed` (the short-circuit), `ValidSpec`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// MachineHealthCheck condition types.
pub mod health_check_conditions {
    /// The short-circuit allows remediation.
    pub const REMEDIATION_ALLOWED: &str = "RemediationAllowed";
    /// The spec is usable.
    pub const VALID_SPEC: &str = "ValidSpec";
}
