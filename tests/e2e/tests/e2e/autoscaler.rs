//! The cluster-autoscaler's clusterapi provider, as it runs against Capstan
//! with `CAPI_GROUP=capstan.dev`, acted out step by step on a real
//! kube-apiserver: it reads only what that provider reads, through the
//! same generic (unstructured) objects, discovery and scale subresource.
//! Each step names the function of `kubernetes/autoscaler`
//! (`cluster-autoscaler/cloudprovider/clusterapi/`) it mirrors, so a user
//! can check it against the source:
//!
//! 1. `getAPIGroupPreferredVersion`: the group's preferred version, from
//!    discovery (`capstan.dev/v1alpha1`).
//! 2. `listScalableResources` + `newNodeGroupFromScalableResource`: every
//!    MachineDeployment, and every MachineSet no MachineDeployment owns;
//!    bounds from `capstan.dev/cluster-api-autoscaler-node-group-min-size`
//!    and `…-max-size` (`parseScalingBounds`); a group at 0 replicas only if
//!    it can scale from zero (`CanScaleFromZero`: the
//!    `capacity.cluster-autoscaler.kubernetes.io/cpu` and `…/memory`
//!    annotations, which the host writes from the provider Plugin's
//!    `capacity` where the user did not); none with max 0.
//! 3. `Replicas` / `SetSize`: GET and merge-PATCH of the `scale`
//!    subresource, refusing sizes outside the bounds.
//! 4. `findScalableResourceProviderIDs`: the Machines `spec.selector`
//!    selects; a failed one (`status.failureMessage`) as
//!    `failed-machine-NS_NAME`; else `spec.providerID`; else
//!    `status.nodeRef` → the Node's `spec.providerID`; else
//!    `pending-machine-NS_NAME`.
//! 5. `nodeGroupForNode` → `findMachineByProviderID`: Machines by their
//!    normalized `spec.providerID` (after the last `/`), else the Node's
//!    `capstan.dev/machine` and `capstan.dev/cluster-namespace`
//!    annotations; then the Machine's `MachineSet` owner and that set's
//!    `MachineDeployment` owner.
//! 6. `DeleteNodes`: refuse below the minimum; `MarkMachineForDeletion`
//!    (an update setting `capstan.dev/delete-machine`), then `SetSize`
//!    one lower.

use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, eventually, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

const GROUP: &str = "capstan.dev";
const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

/// What the provider keeps of a node group.
#[derive(Debug, Clone)]
struct NodeGroup {
    kind: String,
    name: String,
    min: i64,
    max: i64,
}

/// The autoscaler's view of the management cluster.
struct Autoscaler {
    client: Client,
    version: String,
}

fn annotation<'a>(o: &'a DynamicObject, key: &str) -> Option<&'a str> {
    o.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// `normalizedProviderString`: everything after the last `/`.
fn normalized(provider_id: &str) -> String {
    provider_id
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `getOwnerForKind`.
fn owner(o: &DynamicObject, kind: &str) -> Option<String> {
    o.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.kind == kind && !r.name.is_empty())
        .map(|r| r.name.clone())
}

impl Autoscaler {
    /// Step 1.
    async fn discover(client: Client) -> Autoscaler {
        let groups = client.list_api_groups().await.unwrap();
        let group = groups
            .groups
            .iter()
            .find(|g| g.name == GROUP)
            .expect("the group is served");
        let version = group
            .preferred_version
            .as_ref()
            .expect("a preferred version")
            .version
            .clone();
        Autoscaler { client, version }
    }

    fn api(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(GROUP, &self.version, kind);
        Api::namespaced_with(
            self.client.clone(),
            NS,
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    }

    fn api_of(&self, kind: &str) -> Api<DynamicObject> {
        match kind {
            "MachineDeployment" => self.api(kind, "machinedeployments"),
            "MachineSet" => self.api(kind, "machinesets"),
            _ => self.api("Machine", "machines"),
        }
    }

    /// Step 2.
    async fn node_groups(&self) -> Vec<NodeGroup> {
        let mut found = vec![];
        let sets = self
            .api_of("MachineSet")
            .list(&Default::default())
            .await
            .unwrap();
        let deployments = self
            .api_of("MachineDeployment")
            .list(&Default::default())
            .await
            .unwrap();
        let scalable = sets
            .items
            .into_iter()
            .filter(|s| owner(s, "MachineDeployment").is_none())
            .map(|s| ("MachineSet", s))
            .chain(
                deployments
                    .items
                    .into_iter()
                    .map(|d| ("MachineDeployment", d)),
            );
        for (kind, r) in scalable {
            let bound = |which: &str| {
                annotation(
                    &r,
                    &format!("{GROUP}/cluster-api-autoscaler-node-group-{which}-size"),
                )
                .map(|v| v.parse::<i64>().expect("an integer bound"))
                .unwrap_or(0)
            };
            let (min, max) = (bound("min"), bound("max"));
            let replicas = r.data["spec"]["replicas"].as_i64();
            let from_zero = annotation(&r, "capacity.cluster-autoscaler.kubernetes.io/cpu")
                .is_some_and(|v| !v.is_empty())
                && annotation(&r, "capacity.cluster-autoscaler.kubernetes.io/memory")
                    .is_some_and(|v| !v.is_empty());
            if replicas == Some(0) && !from_zero {
                continue;
            }
            if max < min || max == 0 {
                continue;
            }
            found.push(NodeGroup {
                kind: kind.to_string(),
                name: r.name_any(),
                min,
                max,
            });
        }
        found
    }

    /// Step 3: `Replicas`.
    async fn target_size(&self, ng: &NodeGroup) -> i64 {
        let scale = self.api_of(&ng.kind).get_scale(&ng.name).await.unwrap();
        i64::from(scale.spec.and_then(|s| s.replicas).unwrap_or(0))
    }

    /// Step 3: `SetSize`.
    async fn set_size(&self, ng: &NodeGroup, replicas: i64) -> Result<(), String> {
        if replicas > ng.max {
            return Err(format!(
                "size increase too large - desired:{replicas} max:{}",
                ng.max
            ));
        }
        if replicas < ng.min {
            return Err(format!(
                "size decrease too large - desired:{replicas} min:{}",
                ng.min
            ));
        }
        self.api_of(&ng.kind)
            .patch_scale(
                &ng.name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Step 4.
    async fn provider_ids(&self, ng: &NodeGroup) -> Vec<String> {
        let r = self.api_of(&ng.kind).get(&ng.name).await.unwrap();
        let labels: BTreeMap<String, String> =
            serde_json::from_value(r.data["spec"]["selector"]["matchLabels"].clone())
                .unwrap_or_default();
        let selector = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let machines = self
            .api_of("Machine")
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap();
        let nodes = Api::<Node>::all(self.client.clone());
        let mut ids = vec![];
        for m in machines.items {
            let (ns, name) = (m.namespace().unwrap_or_default(), m.name_any());
            if m.data["status"]["failureMessage"].is_string() {
                ids.push(format!("failed-machine-{ns}_{name}"));
                continue;
            }
            if let Some(id) = m.data["spec"]["providerID"]
                .as_str()
                .filter(|s| !s.is_empty())
            {
                ids.push(id.to_string());
                continue;
            }
            let Some(node) = m.data["status"]["nodeRef"]["name"].as_str() else {
                ids.push(format!("pending-machine-{ns}_{name}"));
                continue;
            };
            if let Some(id) = nodes
                .get_opt(node)
                .await
                .unwrap()
                .and_then(|n| n.spec?.provider_id)
            {
                ids.push(id);
            }
        }
        ids
    }

    /// Step 5: `findMachineByProviderID`.
    async fn machine_for_node(&self, node: &Node) -> Option<DynamicObject> {
        let id = normalized(node.spec.as_ref()?.provider_id.as_deref()?);
        let machines = self
            .api_of("Machine")
            .list(&Default::default())
            .await
            .unwrap();
        let by_spec: Vec<&DynamicObject> = machines
            .items
            .iter()
            .filter(|m| m.data["spec"]["providerID"].as_str().map(normalized) == Some(id.clone()))
            .collect();
        if let [one] = by_spec.as_slice() {
            return Some((*one).clone());
        }
        let annotations = node.metadata.annotations.as_ref()?;
        let name = annotations.get(&format!("{GROUP}/machine"))?;
        let ns = annotations.get(&format!("{GROUP}/cluster-namespace"))?;
        let api = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            ns,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(GROUP, &self.version, "Machine"),
                "machines",
            ),
        );
        api.get_opt(name).await.unwrap()
    }

    /// Step 5: `nodeGroupForNode` (the group's `kind/name`).
    async fn node_group_for_node(&self, node: &Node) -> Option<String> {
        let machine = self.machine_for_node(node).await?;
        let set_name = owner(&machine, "MachineSet")?;
        let set = self
            .api_of("MachineSet")
            .get_opt(&set_name)
            .await
            .unwrap()?;
        Some(match owner(&set, "MachineDeployment") {
            Some(md) => format!("MachineDeployment/{md}"),
            None => format!("MachineSet/{set_name}"),
        })
    }

    /// Step 6: `DeleteNodes` for one Node.
    async fn delete_node(&self, ng: &NodeGroup, node: &Node) -> Result<(), String> {
        let replicas = self.target_size(ng).await;
        if replicas - 1 < ng.min {
            return Err(format!(
                "unable to delete 1 machines in {:?}, machine replicas are {replicas}, minSize is {}",
                ng.name, ng.min
            ));
        }
        let machine = self
            .machine_for_node(node)
            .await
            .ok_or("no machine for the node")?;
        let api = self.api_of("Machine");
        let mut fresh = api.get(&machine.name_any()).await.unwrap();
        fresh
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                format!("{GROUP}/delete-machine"),
                "2026-11-28 09:00:00 +0000 UTC".into(),
            );
        api.replace(&fresh.name_any(), &PostParams::default(), &fresh)
            .await
            .map_err(|e| e.to_string())?;
        self.set_size(ng, replicas - 1).await
    }
}

async fn ready_machines(env: &Env, pool: &str) -> Vec<String> {
    env.machines(NS)
        .await
        .iter()
        .filter(|m| {
            m.labels()
                .get("capstan.dev/deployment-name")
                .map(String::as_str)
                == Some(pool)
                && m.metadata.deletion_timestamp.is_none()
                && m.status
                    .as_ref()
                    .is_some_and(|s| capstan_api::is_true(&s.conditions, "Ready"))
        })
        .map(|m| m.name_any())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_autoscalers_clusterapi_provider_scales_capstan_deployments() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    env.start_controllers(
        Providers::default(),
        Options {
            resync: Duration::from_secs(2),
            ..Options::default()
        },
    )
    .await;
    let deployments = Api::<capstan_api::MachineDeployment>::namespaced(env.client.clone(), NS);
    let bounded = |name: &str, replicas: i32, min: &str, max: &str, capacity: bool| {
        let mut md = sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), replicas, "v1.30.0");
        let mut annotations = BTreeMap::from([
            (
                format!("{GROUP}/cluster-api-autoscaler-node-group-min-size"),
                min.to_string(),
            ),
            (
                format!("{GROUP}/cluster-api-autoscaler-node-group-max-size"),
                max.to_string(),
            ),
        ]);
        if capacity {
            annotations.insert(
                "capacity.cluster-autoscaler.kubernetes.io/cpu".into(),
                "2".into(),
            );
            annotations.insert(
                "capacity.cluster-autoscaler.kubernetes.io/memory".into(),
                "4Gi".into(),
            );
        }
        md.metadata.annotations = Some(annotations);
        md
    };
    for md in [
        bounded("asg", 1, "1", "3", false),
        bounded("from-zero", 0, "0", "2", true),
        bounded("zero-bare", 0, "0", "2", false),
    ] {
        deployments
            .create(&PostParams::default(), &md)
            .await
            .unwrap();
    }
    env.wait_rolled_out(NS, "asg", LONG).await;

    let autoscaler = Autoscaler::discover(env.client.clone()).await;
    assert_eq!(autoscaler.version, "v1alpha1");
    // `zero-bare` has no capacity annotations of its user's: the host
    // writes what the sim provider says of its instance type, which makes
    // it a node group at zero too.
    let groups = eventually("3 node groups", LONG, async || {
        let groups = autoscaler.node_groups().await;
        (groups.len() == 3).then_some(groups)
    })
    .await;
    let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(
        names,
        ["asg", "from-zero", "zero-bare"],
        "the sets a deployment owns are no node groups"
    );
    let annotations_of = async |name: &str| {
        deployments
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
    };
    let capacity = |key: &str| format!("capacity.cluster-autoscaler.kubernetes.io/{key}");
    let bare = annotations_of("zero-bare").await;
    // The sim cloud's Node: 4 CPUs, 16 GiB, 110 pods, 100 GiB of disk.
    for (key, value) in [
        ("cpu", "4"),
        ("memory", "16384Mi"),
        ("maxPods", "110"),
        ("ephemeral-disk", "102400Mi"),
    ] {
        assert_eq!(
            bare.get(&capacity(key)).map(String::as_str),
            Some(value),
            "{bare:?}"
        );
    }
    // The user's cpu and memory stay theirs; the host adds only the rest
    // (`from-zero` was a node group before it did: wait for it).
    let user = eventually("the host's capacity on from-zero", LONG, async || {
        let user = annotations_of("from-zero").await;
        user.contains_key("capstan.dev/capacity-from")
            .then_some(user)
    })
    .await;
    assert_eq!(user[&capacity("cpu")], "2");
    assert_eq!(user[&capacity("memory")], "4Gi");
    assert_eq!(user[&capacity("maxPods")], "110");
    assert_eq!(
        user["capstan.dev/capacity-from"],
        format!(
            "{SIM_PLUGIN}:{},{}",
            capacity("ephemeral-disk"),
            capacity("maxPods")
        )
    );
    let asg = groups[0].clone();
    assert_eq!(
        (asg.kind.as_str(), asg.min, asg.max),
        ("MachineDeployment", 1, 3)
    );
    assert_eq!(autoscaler.target_size(&asg).await, 1);

    // Scale up 1 → 3 through the scale subresource; the maximum holds.
    autoscaler.set_size(&asg, 3).await.unwrap();
    eventually("3 asg Machines Ready", LONG, async || {
        (ready_machines(&env, "asg").await.len() == 3).then_some(())
    })
    .await;
    assert!(
        autoscaler
            .set_size(&asg, 4)
            .await
            .unwrap_err()
            .contains("max:3")
    );
    let ids = eventually("3 cloud provider IDs", LONG, async || {
        let ids = autoscaler.provider_ids(&asg).await;
        (ids.len() == 3 && ids.iter().all(|i| i.starts_with("sim://"))).then_some(ids)
    })
    .await;
    // Every Node maps back to the deployment.
    let nodes = Api::<Node>::all(env.client.clone());
    let mut ours = vec![];
    for node in nodes.list(&Default::default()).await.unwrap().items {
        let id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
        if id.as_ref().is_some_and(|i| ids.contains(i)) {
            assert_eq!(
                autoscaler.node_group_for_node(&node).await.as_deref(),
                Some("MachineDeployment/asg"),
                "{}",
                node.name_any()
            );
            ours.push(node);
        }
    }
    assert_eq!(ours.len(), 3);

    // Scale down: the marked Machine goes, and only it.
    let victim = &ours[1];
    let doomed = autoscaler
        .machine_for_node(victim)
        .await
        .unwrap()
        .name_any();
    autoscaler.delete_node(&asg, victim).await.unwrap();
    let left = eventually(
        "2 asg Machines Ready, without the marked one",
        LONG,
        async || {
            let ready = ready_machines(&env, "asg").await;
            let all: Vec<String> = env
                .machines(NS)
                .await
                .iter()
                .filter(|m| {
                    m.labels()
                        .get("capstan.dev/deployment-name")
                        .map(String::as_str)
                        == Some("asg")
                })
                .map(|m| m.name_any())
                .collect();
            (ready.len() == 2 && all.len() == 2 && !all.contains(&doomed)).then_some(all)
        },
    )
    .await;
    assert_eq!(autoscaler.target_size(&asg).await, 2);
    // The minimum holds.
    autoscaler.set_size(&asg, 1).await.unwrap();
    eventually("1 asg Machine", LONG, async || {
        (ready_machines(&env, "asg").await.len() == 1).then_some(())
    })
    .await;
    let remaining = ready_machines(&env, "asg").await;
    assert!(left.contains(&remaining[0]), "{left:?} {remaining:?}");
    let last = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|n| {
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("capstan.dev/machine"))
                == Some(&remaining[0])
        })
        .expect("the last Machine's Node");
    let refused = autoscaler.delete_node(&asg, &last).await.unwrap_err();
    assert!(refused.contains("minSize is 1"), "{refused}");

    // Scale from zero: the capacity annotations make it a node group.
    let from_zero = groups[1].clone();
    assert_eq!(autoscaler.target_size(&from_zero).await, 0);
    autoscaler.set_size(&from_zero, 1).await.unwrap();
    eventually("1 from-zero Machine Ready", LONG, async || {
        (ready_machines(&env, "from-zero").await.len() == 1).then_some(())
    })
    .await;
    let ids = eventually("its provider ID", LONG, async || {
        let ids = autoscaler.provider_ids(&from_zero).await;
        (ids.len() == 1 && ids[0].starts_with("sim://")).then_some(ids)
    })
    .await;
    println!(
        "autoscaler contract: asg 1 → 3 → 2 (marked {doomed} removed) → 1; from-zero 0 → 1 ({})",
        ids[0]
    );
    env.stop_controllers().await;
}
