//! What a `Cluster` says about itself and what its deletion does next, from
//! what the controller observed: its connection, its descendants (the
//! deployments, sets and Machines naming it) and its spec. The Cluster
//! controller (`capstan_controllers::cluster`) does the I/O.
//!
//! Conditions follow Cluster API v1beta2 for the parts Capstan has (no
//! control plane or infrastructure provider): `RemoteConnectionProbe`,
//! `Available`, `Paused`, `Deleting`.

/// The workload cluster's connection, as the cluster cache reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// The API server answers the probes.
    Up,
    /// No probe has answered yet (a new connection).
    Connecting,
    /// Probes failed in a row past the threshold (why).
    Down(String),
    /// The connection cannot be made: (reason, message), e.g. the
    /// kubeconfig Secret is missing or refused.
    Unusable(String, String),
}

/// The objects that name a Cluster in `spec.clusterName`, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Descendants {
    /// MachineDeployments.
    pub deployments: usize,
    /// MachineSets no deployment owns.
    pub sets: usize,
    /// Machines no set owns.
    pub machines: usize,
    /// Every MachineSet and Machine, owned or not.
    pub all: usize,
}

/// What the controller observed of a Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.paused`.
    pub paused: bool,
    /// The connection.
    pub connection: Connection,
    /// Its descendants.
    pub descendants: Descendants,
}

/// A condition to set: type, status, reason, message.
pub type PlannedCondition = (&'static str, &'static str, String, String);

/// The Cluster's conditions.
pub fn conditions(view: &ClusterView) -> Vec<PlannedCondition> {
    let (probe_status, probe_reason, probe_message) = match &view.connection {
        Connection::Up => ("True", "ProbeSucceeded".to_string(), String::new()),
        Connection::Connecting => (
            "Unknown",
            "ProbeNotYetReported".to_string(),
            "the first probe has not answered yet".to_string(),
        ),
        Connection::Down(message) => ("False", "ProbeFailed".to_string(), message.clone()),
        Connection::Unusable(reason, message) => ("False", reason.clone(), message.clone()),
    };
    let (available, available_reason, available_message) = if view.deleting {
        (
            "False",
            "Deleting",
            "the Cluster is being deleted".to_string(),
        )
    } else if probe_status == "True" {
        ("True", "Available", String::new())
    } else {
        (
            if probe_status == "Unknown" {
                "Unknown"
            } else {
                "False"
            },
            "NotAvailable",
            format!("RemoteConnectionProbe: {probe_message}"),
        )
    };
    let paused = if view.paused {
        (
            "True",
            "Paused",
            "spec.paused: nothing of the cluster is reconciled".to_string(),
        )
    } else {
        ("False", "NotPaused", String::new())
    };
    let deleting = if view.deleting {
        let d = view.descendants;
        let message = if d.deployments + d.all > 0 {
            format!(
                "waiting for {} MachineDeployment(s) and {} MachineSet(s) and Machine(s) to be deleted",
                d.deployments, d.all
            )
        } else {
            "removing the finalizer".into()
        };
        ("True", "WaitingForWorkersDeletion", message)
    } else {
        ("False", "NotDeleting", String::new())
    };
    vec![
        (
            "RemoteConnectionProbe",
            probe_status,
            probe_reason,
            probe_message,
        ),
        (
            "Available",
            available,
            available_reason.to_string(),
            available_message,
        ),
        ("Paused", paused.0, paused.1.to_string(), paused.2),
        ("Deleting", deleting.0, deleting.1.to_string(), deleting.2),
    ]
}

/// The Cluster's `status.phase`, as Cluster API names them.
pub fn phase(view: &ClusterView) -> &'static str {
    if view.deleting {
        "Deleting"
    } else if view.connection == Connection::Up {
        "Provisioned"
    } else {
        "Provisioning"
    }
}

/// What deleting a Cluster does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletionStep {
    /// Delete its MachineDeployments, the sets no deployment owns and
    /// the Machines no set owns (their owners take the rest with them),
    /// then wait.
    DeleteDescendants,
    /// Wait for the descendants to go (their Machines drain).
    Wait,
    /// Nothing of it is left: remove the finalizer.
    RemoveFinalizer,
}

/// The next deletion step; `requested` is whether every top-level
/// descendant already carries a deletion timestamp.
pub fn deletion_step(descendants: &Descendants, requested: bool) -> DeletionStep {
    let top = descendants.deployments + descendants.sets + descendants.machines;
    if top + descendants.all == 0 {
        DeletionStep::RemoveFinalizer
    } else if top > 0 && !requested {
        DeletionStep::DeleteDescendants
    } else {
        DeletionStep::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(connection: Connection) -> ClusterView {
        ClusterView {
            deleting: false,
            paused: false,
            connection,
            descendants: Descendants::default(),
        }
    }

    fn status_of<'a>(conditions: &'a [PlannedCondition], type_: &str) -> (&'a str, &'a str) {
        let c = conditions.iter().find(|c| c.0 == type_).unwrap();
        (c.1, c.2.as_str())
    }

    #[test]
    fn a_cluster_that_answers_is_available_and_provisioned() {
        let v = view(Connection::Up);
        let c = conditions(&v);
        assert_eq!(
            status_of(&c, "RemoteConnectionProbe"),
            ("True", "ProbeSucceeded")
        );
        assert_eq!(status_of(&c, "Available"), ("True", "Available"));
        assert_eq!(status_of(&c, "Paused"), ("False", "NotPaused"));
        assert_eq!(status_of(&c, "Deleting"), ("False", "NotDeleting"));
        assert_eq!(phase(&v), "Provisioned");
    }

    #[test]
    fn a_cluster_that_stopped_answering_is_not_available_and_says_why() {
        let v = view(Connection::Down("no answer within 1 s".into()));
        let c = conditions(&v);
        assert_eq!(
            status_of(&c, "RemoteConnectionProbe"),
            ("False", "ProbeFailed")
        );
        assert_eq!(status_of(&c, "Available"), ("False", "NotAvailable"));
        let available = c.iter().find(|c| c.0 == "Available").unwrap();
        assert!(
            available.3.contains("no answer within 1 s"),
            "{available:?}"
        );
        assert_eq!(phase(&v), "Provisioning");
    }

    #[test]
    fn a_missing_kubeconfig_is_the_probe_condition_with_its_own_reason() {
        let v = view(Connection::Unusable(
            "KubeconfigSecretNotFound".into(),
            "Secret a/b does not exist".into(),
        ));
        let c = conditions(&v);
        assert_eq!(
            status_of(&c, "RemoteConnectionProbe"),
            ("False", "KubeconfigSecretNotFound")
        );
        let v = view(Connection::Connecting);
        assert_eq!(status_of(&conditions(&v), "Available").0, "Unknown");
    }

    #[test]
    fn paused_and_deleting_show() {
        let mut v = view(Connection::Up);
        v.paused = true;
        v.deleting = true;
        v.descendants.deployments = 1;
        v.descendants.all = 3;
        let c = conditions(&v);
        assert_eq!(status_of(&c, "Paused"), ("True", "Paused"));
        assert_eq!(
            status_of(&c, "Deleting"),
            ("True", "WaitingForWorkersDeletion")
        );
        assert_eq!(status_of(&c, "Available"), ("False", "Deleting"));
        assert_eq!(phase(&v), "Deleting");
    }

    #[test]
    fn deletion_removes_descendants_before_the_finalizer() {
        let none = Descendants::default();
        assert_eq!(deletion_step(&none, false), DeletionStep::RemoveFinalizer);
        let some = Descendants {
            deployments: 1,
            sets: 0,
            machines: 1,
            all: 4,
        };
        assert_eq!(deletion_step(&some, false), DeletionStep::DeleteDescendants);
        assert_eq!(deletion_step(&some, true), DeletionStep::Wait);
        // Owned sets and Machines still going: wait, even with no
        // top-level descendant left.
        let owned = Descendants {
            all: 2,
            ..Default::default()
        };
        assert_eq!(deletion_step(&owned, false), DeletionStep::Wait);
    }
}
