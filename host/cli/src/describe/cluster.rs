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
            .filter(|s| s.owner_references().iter().all(|o| o.controller != Some(true)))
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
