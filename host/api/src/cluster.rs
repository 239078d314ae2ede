//! `Cluster`: a workload cluster the management cluster runs Machines for,
//! reached through its kubeconfig Secret (Cluster API's convention:
//! `<name>-kubeconfig`, key `value`, in the Cluster's namespace). Machines,
//! MachineSets, MachineDeployments and MachineHealthChecks name it with
//! `spec.clusterName`; their Nodes live there. Field and condition names
//! follow Cluster API v1beta2 (the parts without a control plane or an
//! infrastructure provider: Capstan manages worker machines).

use crate::{Condition, StatusVersion, conditions_schema};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label naming the Cluster a Machine, MachineSet or MachineDeployment
/// belongs to (Cluster API's; the cluster-autoscaler's auto-discovery
/// filters by it).
pub const LABEL_CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";

/// The key of a kubeconfig Secret that holds the kubeconfig.
pub const KUBECONFIG_KEY: &str = "value";

/// Condition types of a Cluster.
pub mod cluster_conditions {
    /// The workload cluster's API server answers the controller's probes.
    pub const REMOTE_CONNECTION_PROBE: &str = "RemoteConnectionProbe";
    /// Not being deleted, and the remote connection holds.
    pub const AVAILABLE: &str = "Available";
    /// `spec.paused`: nothing of the cluster is reconciled.
    pub const PAUSED: &str = "Paused";
    /// Being deleted: its deployments, sets and Machines go first.
    pub const DELETING: &str = "Deleting";
}

/// The desired state of a Cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    shortname = "cl",
    derive = "PartialEq",
    derive = "Default",
    doc = "A workload cluster whose Machines the management cluster runs, reached through its kubeconfig Secret.",
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Available")].status"#
    ),
    printcolumn(
        name = "W Desired",
        type_ = "integer",
        json_path = ".status.workers.desiredReplicas"
    ),
    printcolumn(
        name = "W Current",
        type_ = "integer",
        json_path = ".status.workers.replicas",
        priority = 10
    ),
    printcolumn(
        name = "W Ready",
        type_ = "integer",
        json_path = ".status.workers.readyReplicas",
        priority = 10
    ),
    printcolumn(
        name = "W Available",
        type_ = "integer",
        json_path = ".status.workers.availableReplicas"
    ),
    printcolumn(
        name = "W Up-to-date",
        type_ = "integer",
        json_path = ".status.workers.upToDateReplicas"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Paused")].status"#,
        priority = 10
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Nothing of the cluster is reconciled while set: its Machines, sets,
    /// deployments and health checks hold still (as with Cluster API's
    /// `spec.paused`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The API server machines of this cluster join (what bootstrap data
    /// names), when it differs from the kubeconfig's server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// The Secret (in the Cluster's namespace) whose key `value` holds the
    /// kubeconfig Capstan reaches the cluster with. Default:
    /// `<name>-kubeconfig`, as Cluster API names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<LocalSecretReference>,
}

/// An API server's host and port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// Host name or address.
    #[schemars(length(min = 1, max = 512))]
    pub host: String,
    /// Port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// A Secret in the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalSecretReference {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What the controller observed of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// `RemoteConnectionProbe`, `Available`, `Paused`, `Deleting`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The cluster's worker Machines, counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersStatus>,
    /// `Provisioning` (not reached yet), `Provisioned`, `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A cluster's worker Machines, counted (Cluster API v1beta2's
/// `status.workers`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkersStatus {
    /// The replicas its MachineDeployments and their sets (and Machines of
    /// no set) want.
    #[serde(default)]
    pub desired_replicas: i32,
    /// Its Machines, those being deleted included.
    #[serde(default)]
    pub replicas: i32,
    /// Machines whose `Ready` is `True`.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Machines whose `Available` is `True`.
    #[serde(default)]
    pub available_replicas: i32,
    /// Machines whose `UpToDate` is `True`.
    #[serde(default)]
    pub up_to_date_replicas: i32,
    /// The Kubernetes versions its Machines run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub versions: Vec<StatusVersion>,
}

impl Cluster {
    /// The name of the Secret holding its kubeconfig.
    pub fn kubeconfig_secret(&self) -> String {
        self.spec
            .kubeconfig_secret_ref
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_else(|| {
                format!(
                    "{}-kubeconfig",
                    self.metadata.name.as_deref().unwrap_or_default()
                )
            })
    }
}
