//! Restore- and move-safe instance identity on a real kube-apiserver and
//! the sim cloud: a MachineDeployment whose objects were lost (finalizers
//! removed, deleted, instances left running; or the API server restored
//! empty from its PKI backup) and re-applied from their YAML adopts its
//! instances instead of launching new ones; a Machine with
//! `spec.providerID` adopts an instance launched outside Capstan where the
//! Plugin allows it, and never an instance tagged for another Machine; the
//! orphan report names an instance no Machine owns until one adopts it.

use capstan_api::{AdoptedBy, Machine, MachineDeployment, MachineSet, Plugin};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, eventually, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

/// Each Machine's provider ID, by name.
async fn provider_ids(env: &Env) -> BTreeMap<String, String> {
    env.machines(NS)
        .await
        .iter()
        .filter_map(|m| Some((m.name_any(), m.status.as_ref()?.provider_id.clone()?)))
        .collect()
}

/// The object as a user re-applies it from saved YAML: no uid, owners,
/// finalizers, resource version or status.
fn as_saved<
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned,
>(
    object: &K,
) -> K {
    let mut value = serde_json::to_value(object).unwrap();
    value.as_object_mut().unwrap().remove("status");
    let meta = value["metadata"].as_object_mut().unwrap();
    for field in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "ownerReferences",
        "finalizers",
        "managedFields",
    ] {
        meta.remove(field);
    }
    serde_json::from_value(value).unwrap()
}

/// Remove every finalizer of `name` and delete it.
async fn lose<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + k8s_openapi::serde::de::DeserializeOwned,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// How a deployment's objects were lost while its instances ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Finalizers removed and deleted (a botched migration, a namespace
    /// wiped with its finalizers stripped).
    Deleted,
    /// The API server restored empty from its PKI backup (etcd lost); its
    /// kubelets restarted after the user's objects were restored.
    FreshApiServer,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_re_applied_after_its_objects_were_lost_adopts_its_instances() {
    lost_and_restored(Loss::Deleted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_restored_into_a_fresh_api_server_adopts_its_instances() {
    lost_and_restored(Loss::FreshApiServer).await;
}

/// A deployment of 3 whose objects are lost while no controller runs and
/// the instances run on, then restored from saved YAML (new uids, no
/// status): zero new instances, the same provider IDs, every Machine
/// Ready.
async fn lost_and_restored(how: Loss) {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let md = sample_deployment("keep", SIM_PLUGIN, &env.cloud.url(), 3, "v1.30.0");
    let deployments = Api::<MachineDeployment>::namespaced(env.client.clone(), NS);
    deployments
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "keep", LONG).await;
    let before = provider_ids(&env).await;
    assert_eq!(before.len(), 3);
    let launched = env.cloud.stats().instances_launched;
    assert_eq!(launched, 3);

    // The objects are lost while no controller runs: the instances run on.
    env.stop_controllers().await;
    let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS);
    let machines = Api::<Machine>::namespaced(env.client.clone(), NS);
    let saved_md = as_saved(&deployments.get("keep").await.unwrap());
    let saved_sets: Vec<MachineSet> = sets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(as_saved)
        .collect();
    let saved_machines: Vec<Machine> = env.machines(NS).await.iter().map(as_saved).collect();
    match how {
        Loss::Deleted => {
            lose(&deployments, "keep").await;
            for s in &saved_sets {
                lose(&sets, &s.name_any()).await;
            }
            for m in &saved_machines {
                lose(&machines, &m.name_any()).await;
            }
        }
        Loss::FreshApiServer => env
            .restore_into_fresh_control_plane()
            .await
            .expect("the control plane restarts empty"),
    }
    eventually("every object gone", LONG, async || {
        (env.machines(NS).await.is_empty()
            && sets
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
            && deployments.get_opt("keep").await.unwrap().is_none())
        .then_some(())
    })
    .await;
    assert_eq!(
        env.cloud.instances().len(),
        3,
        "the instances ran on without their objects"
    );

    // Re-applied from the saved YAML: new uids, empty status.
    deployments
        .create(&PostParams::default(), &saved_md)
        .await
        .unwrap();
    for s in &saved_sets {
        sets.create(&PostParams::default(), s).await.unwrap();
    }
    for m in &saved_machines {
        machines.create(&PostParams::default(), m).await.unwrap();
    }
    if how == Loss::FreshApiServer {
        // Each kubelet registers its Node again with the certificate it
        // holds (the same CA): after the Machines, as a restore runs.
        let (code, body) = env
            .cloud_call("POST", "/admin/kubelet/restart", None)
            .await
            .unwrap();
        assert_eq!(
            (code, &body["nodes"]),
            (200, &serde_json::json!(3)),
            "{body}"
        );
    }
    env.start_controllers(Providers::default(), Options::default())
        .await;
    env.wait_rolled_out(NS, "keep", LONG).await;
    let after = provider_ids(&env).await;
    assert_eq!(after, before, "the same Machines on the same instances");
    let stats = env.cloud.stats();
    assert_eq!(
        stats.instances_launched, launched,
        "no instance launched after the re-apply"
    );
    let ms = env.machines(NS).await;
    assert!(
        ms.iter()
            .all(|m| m.status.as_ref().and_then(|s| s.adopted) == Some(AdoptedBy::Tags)),
        "{ms:?}"
    );
    for m in &ms {
        let status = m.status.as_ref().unwrap();
        let node = status.node_ref.as_ref().map(|n| n.name.as_str());
        assert!(
            capstan_api::is_true(&status.conditions, "Ready") && node.is_some(),
            "{} is Ready on its Node: {status:?}",
            m.name_any()
        );
    }
    let reasons = env.event_reasons(NS);
    assert_eq!(
        reasons.matches("InstanceAdopted").count(),
        3,
        "one adoption Event per Machine: {reasons}"
    );
    println!(
        "{how:?}: {} Machines Ready on the same {} instances; instances launched: {} before, {} after",
        after.len(),
        env.cloud.instances().len(),
        launched,
        stats.instances_launched
    );
    env.stop_controllers().await;
}

/// A standalone Machine of the sim provider in `namespace`, naming
/// `provider_id` to adopt.
fn naming(name: &str, namespace: &str, env: &Env, provider_id: &str) -> Machine {
    let md = sample_deployment(name, SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    let mut machine = Machine::new(name, md.spec.template.spec.clone());
    machine.metadata.namespace = Some(namespace.into());
    machine.spec.provider_id = Some(provider_id.into());
    machine
}

/// The Machine's failure reason and message, once it has one.
async fn failure(env: &Env, namespace: &str, name: &str) -> (String, String) {
    let api = Api::<Machine>::namespaced(env.client.clone(), namespace);
    eventually(&format!("{namespace}/{name} refused"), LONG, async || {
        let s = api.get(name).await.ok()?.status?;
        Some((s.failure_reason?, s.failure_message.unwrap_or_default()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_naming_an_instance_adopts_it_only_where_allowed_and_never_another_machines() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    // An instance launched outside Capstan: no machine tag.
    let (code, legacy) = env
        .cloud_call(
            "POST",
            "/v1/instances",
            Some(serde_json::json!({"clientToken": "legacy-vm-1", "name": "legacy", "version": "v1.30.0"})),
        )
        .await
        .unwrap();
    assert_eq!(code, 201, "{legacy}");
    let legacy = format!("sim://{}", legacy["id"].as_str().unwrap());
    let tenant = "team-b";
    env.control_plane
        .kubectl(&["create", "namespace", tenant], None)
        .unwrap();
    // The sim Plugin serves both namespaces; only `default` may adopt
    // untagged instances.
    Api::<Plugin>::all(env.client.clone())
        .patch(
            SIM_PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "allowedNamespaces": {"names": [NS, tenant]},
                "adoptUntaggedIn": {"names": [NS]},
            }})),
        )
        .await
        .unwrap();
    env.start_controllers(
        Providers::default(),
        Options {
            resync: Duration::from_secs(1),
            orphan_scan: Duration::from_secs(1),
            ..Options::default()
        },
    )
    .await;
    let md = sample_deployment("owned", SIM_PLUGIN, &env.cloud.url(), 1, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "owned", LONG).await;
    let owned = provider_ids(&env).await.into_values().next().unwrap();
    let launched = env.cloud.stats().instances_launched;

    // The untagged instance has no Machine: the orphan report names it
    // (two scans in a row), and `capstan machines orphans` says so.
    let plugins = Api::<Plugin>::all(env.client.clone());
    eventually("the orphan reported", LONG, async || {
        let report = plugins.get(SIM_PLUGIN).await.ok()?.status?.orphans?;
        (report.instances == [legacy.clone()]).then_some(())
    })
    .await;
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let listed = capstan_e2e::cli::capstan(&["machines", "orphans", "--kubeconfig", &kubeconfig]);
    let printed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert_eq!(listed.status.code(), Some(1), "orphans exit 1: {printed}");
    assert!(
        printed.contains("sim: 1 orphaned instance(s)") && printed.contains(&legacy),
        "{printed}"
    );

    // Another namespace names default's Machine's instance: refused, and
    // nothing is launched for it.
    Api::<Machine>::namespaced(env.client.clone(), tenant)
        .create(
            &PostParams::default(),
            &naming("grab", tenant, &env, &owned),
        )
        .await
        .unwrap();
    let (reason, message) = failure(&env, tenant, "grab").await;
    assert_eq!(reason, "AdoptionRefused", "{message}");
    assert!(message.contains("tagged for Machine default/"), "{message}");
    // The tenant may not adopt the untagged instance either.
    Api::<Machine>::namespaced(env.client.clone(), tenant)
        .create(
            &PostParams::default(),
            &naming("lift-b", tenant, &env, &legacy),
        )
        .await
        .unwrap();
    let (reason, message) = failure(&env, tenant, "lift-b").await;
    assert_eq!(reason, "AdoptionRefused", "{message}");
    assert!(message.contains("spec.adoptUntaggedIn"), "{message}");

    // Where the Plugin allows it, the untagged instance is adopted: its
    // Node (registered before the Machine existed) becomes the Machine's.
    let machines = Api::<Machine>::namespaced(env.client.clone(), NS);
    machines
        .create(&PostParams::default(), &naming("lifted", NS, &env, &legacy))
        .await
        .unwrap();
    let lifted = eventually("the lifted Machine Ready", LONG, async || {
        let m = machines.get("lifted").await.ok()?;
        let s = m.status.clone()?;
        capstan_api::is_true(&s.conditions, "Ready").then_some(s)
    })
    .await;
    assert_eq!(lifted.provider_id.as_deref(), Some(legacy.as_str()));
    assert_eq!(lifted.adopted, Some(AdoptedBy::ProviderID));
    assert!(lifted.node_ref.is_some(), "{lifted:?}");
    assert_eq!(
        env.cloud.stats().instances_launched,
        launched,
        "nothing launched for the refused or the adopting Machines"
    );
    // The instance the tenant named is untouched and still default's.
    assert!(env.instance_exists(&owned).await);
    // Adopted, the instance is nobody's orphan any more.
    eventually("no orphans", LONG, async || {
        let report = plugins.get(SIM_PLUGIN).await.ok()?.status?.orphans?;
        (report.count == 0).then_some(())
    })
    .await;
    let listed = capstan_e2e::cli::capstan(&["machines", "orphans", "--kubeconfig", &kubeconfig]);
    let printed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.status.success(), "{printed}");
    assert!(printed.contains("sim: no orphans"), "{printed}");
    // A template naming an instance would make every Machine adopt it.
    let mut bad = sample_deployment("one-for-all", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    bad.spec.template.spec.provider_id = Some(legacy.clone());
    let deployments = Api::<MachineDeployment>::namespaced(env.client.clone(), NS);
    deployments
        .create(&PostParams::default(), &bad)
        .await
        .unwrap();
    let refused = eventually("the template refused", LONG, async || {
        let s = deployments.get("one-for-all").await.ok()?.status?;
        capstan_api::condition(&s.conditions, "ValidSpec")
            .filter(|c| c.status == "False")
            .map(|c| c.message.clone())
    })
    .await;
    assert!(
        refused.starts_with("spec.template.spec.providerID: "),
        "{refused}"
    );
    println!("lifted {legacy} into default/lifted; refused team-b/grab and team-b/lift-b");
    env.stop_controllers().await;
}
