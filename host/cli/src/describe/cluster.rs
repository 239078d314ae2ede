//! A Cluster's row for `describe cluster/NAME`: the Cluster, then its
//! MachineDeployments (with their sets and Machines), the sets no
//! deployment owns and the Machines no set owns, as `clusterctl describe
//! cluster` lists a cluster's workers.

use super::tree::{Row, count, deployment_row, machine_row, owned_by, row, set_row, state};
use capstan_api::{Cluster, Machine, MachineDeployment, MachineSet};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// The tree of `cluster`: `deployments`, `sets` and `machines` are the
/// namespace's; those naming the Cluster are shown.
pub fn cluster_row(
    cluster: &Cluster,
    deployments: &[MachineDeployment],
    sets: &[MachineSet],
    machines: &[Machine],
    grouping: bool,
    now: Timestamp,
) -> Row {
    let s = cluster.status.clone().unwrap_or_default();
    let mut r = row(
        format!("Cluster/{}", cluster.name_any()),
        &s.conditions,
        &cluster.metadata,
        now,
    );
    let workers = s.workers.clone().unwrap_or_default();
    r.ready = count(workers.ready_replicas, workers.desired_replicas);
    r.available = state(&s.conditions, "Available");
    r.up_to_date = count(workers.up_to_date_replicas, workers.desired_replicas);
    r.phase = s.phase.clone().unwrap_or_default();
    r.details.push(format!(
        "kubeconfig Secret {}, API server {}",
        cluster.kubeconfig_secret(),
        match capstan_api::condition(&s.conditions, "RemoteConnectionProbe") {
            Some(c) if c.status == "True" => "answering".to_string(),
            Some(c) => format!("not answering ({})", c.reason),
            None => "not probed yet".to_string(),
        }
    ));
    if cluster.spec.paused {
        r.details.push("paused".into());
    }
    let name = cluster.name_any();
    let mine = |n: Option<&String>| n.map(String::as_str) == Some(name.as_str());
    let sets: Vec<MachineSet> = sets
        .iter()
        .filter(|s| mine(s.spec.cluster_name.as_ref()))
        .cloned()
        .collect();
    let machines: Vec<Machine> = machines
        .iter()
        .filter(|m| mine(m.spec.cluster_name.as_ref()))
        .cloned()
        .collect();
    let mut children: Vec<Row> = deployments
        .iter()
        .filter(|md| mine(md.spec.cluster_name.as_ref()))
        .map(|md| deployment_row(md, &sets, &machines, grouping, now))
        .collect();
    let set_uids: Vec<String> = sets.iter().filter_map(|s| s.uid()).collect();
    children.extend(
        sets.iter()
            .filter(|s| {
                s.owner_references()
                    .iter()
                    .all(|o| o.controller != Some(true))
            })
            .map(|s| set_row(s, &machines, grouping, now)),
    );
    children.extend(
        machines
            .iter()
            .filter(|m| !set_uids.iter().any(|uid| owned_by(&m.metadata, Some(uid))))
            .map(|m| machine_row(m, now)),
    );
    r.children = children;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{ClusterStatus, Condition, MachineSetSpec, MachineSpec, WorkersStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn probe(status: &str, reason: &str) -> Condition {
        Condition {
            type_: "RemoteConnectionProbe".into(),
            status: status.into(),
            reason: reason.into(),
            message: "no answer within 5 s".into(),
            observed_generation: None,
            last_transition_time: capstan_api::Time(Timestamp::UNIX_EPOCH),
        }
    }

    fn machine(name: &str, cluster: Option<&str>, owner: Option<&MachineSet>) -> Machine {
        let mut m = Machine::new(
            name,
            MachineSpec {
                cluster_name: cluster.map(str::to_string),
                ..Default::default()
            },
        );
        m.metadata.uid = Some(format!("uid-{name}"));
        m.metadata.owner_references = owner.map(|s| {
            vec![OwnerReference {
                kind: "MachineSet".into(),
                name: s.name_any(),
                uid: s.uid().unwrap(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        m
    }

    #[test]
    fn a_clusters_tree_holds_its_own_sets_and_machines_and_says_why_it_is_unreachable() {
        let mut cluster = Cluster::new("prod", Default::default());
        cluster.status = Some(ClusterStatus {
            conditions: vec![probe("False", "ProbeFailed")],
            workers: Some(WorkersStatus {
                desired_replicas: 3,
                ready_replicas: 1,
                ..Default::default()
            }),
            phase: Some("Provisioned".into()),
            ..Default::default()
        });
        let mut set = MachineSet::new(
            "solo",
            MachineSetSpec {
                cluster_name: Some("prod".into()),
                replicas: 1,
                ..Default::default()
            },
        );
        set.metadata.uid = Some("uid-solo".into());
        let other = MachineSet::new(
            "elsewhere",
            MachineSetSpec {
                cluster_name: Some("dev".into()),
                ..Default::default()
            },
        );
        let machines = [
            machine("in-set", Some("prod"), Some(&set)),
            machine("by-hand", Some("prod"), None),
            machine("of-dev", Some("dev"), None),
            machine("of-none", None, None),
        ];
        let row = cluster_row(
            &cluster,
            &[],
            &[set, other],
            &machines,
            false,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(row.name, "Cluster/prod");
        assert_eq!(row.ready, "1/3");
        assert_eq!(row.reason, "RemoteConnectionProbe: ProbeFailed");
        assert!(
            row.details[0].contains("prod-kubeconfig") && row.details[0].contains("not answering")
        );
        let children: Vec<&str> = row.children.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(children, ["MachineSet/solo", "Machine/by-hand"]);
        assert_eq!(row.children[0].children[0].name, "Machine/in-set");
    }
}
