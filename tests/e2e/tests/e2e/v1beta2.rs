//! Cluster API v1beta2 conditions on a MachineDeployment and its
//! MachineSet, on a real control plane, each waited for with `kubectl
//! wait` as a user's script would: steady (`Available`, `MachinesReady`,
//! `MachinesUpToDate`), a scale-up and a scale-down (`ScalingUp`,
//! `ScalingDown`), a remediation (`Remediating`), a paused set (`Paused`),
//! a rollout (`RollingOut`) and a deletion (`Deleting`). A paused set
//! (Cluster API's annotation) and a Machine's pre-drain hook hold the
//! moments that otherwise last a pass. `status.versions` is read as the
//! Nodes' versions change, and under OnDelete with two side by side.

use capstan_api::{MachineDeployment, MachineHealthCheck, MachineSet};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{Env, SIM_PLUGIN, poll_until, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const NS: &str = "default";
const MD: &str = "life";
const LONG: Duration = Duration::from_secs(90);

/// `kubectl wait --for=condition=CONDITION OBJECT` (`Type` or
/// `Type=False`), within 90 s.
async fn wait(env: &Env, object: &str, condition: &str) {
    let waited = env.control_plane.kubectl(
        &[
            "wait",
            "-n",
            NS,
            object,
            &format!("--for=condition={condition}"),
            "--timeout=90s",
        ],
        None,
    );
    match waited {
        Ok(out) => assert!(out.contains("condition met"), "{out}"),
        Err(e) => panic!(
            "kubectl wait {object} {condition}: {e}\n{}",
            env.describe(NS).await
        ),
    }
}

async fn patch_md(env: &Env, patch: serde_json::Value) {
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(MD, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// The deployment's current MachineSet (the one with replicas).
async fn current_set(env: &Env) -> String {
    let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    sets.items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .max_by_key(|s| s.spec.replicas)
        .unwrap()
        .name_any()
}

async fn pause_set(env: &Env, set: &str, paused: bool) {
    let value = paused.then_some("true");
    Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .patch(
            set,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": value}}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_reports_every_v1beta2_condition_through_its_lifecycle() {
    crate::logs();
    let mut env = Env::start(Faults {
        boot_latency_ms: 200,
        ..Faults::default()
    })
    .await
    .expect("env");
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let md = sample_deployment(MD, SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, MD, LONG).await;
    let md_ref = format!("machinedeployment/{MD}");
    for steady in [
        "Available",
        "MachinesReady",
        "MachinesUpToDate",
        "RollingOut=False",
        "ScalingUp=False",
        "ScalingDown=False",
        "Remediating=False",
        "Deleting=False",
        "Paused=False",
    ] {
        wait(&env, &md_ref, steady).await;
    }
    let set = current_set(&env).await;
    let set_ref = format!("machineset/{set}");
    wait(&env, &set_ref, "MachinesReady").await;
    let two = json!([{"version": "v1.30.0", "replicas": 2}]);
    versions(&env, &md_ref, two.clone()).await;
    versions(&env, &set_ref, two).await;

    // A paused set holds the scale: the deployment scales up, then down.
    pause_set(&env, &set, true).await;
    wait(&env, &set_ref, "Paused").await;
    patch_md(&env, json!({"spec": {"replicas": 3}})).await;
    wait(&env, &md_ref, "ScalingUp").await;
    patch_md(&env, json!({"spec": {"replicas": 1}})).await;
    wait(&env, &md_ref, "ScalingDown").await;
    wait(&env, &md_ref, "ScalingUp=False").await;
    patch_md(&env, json!({"spec": {"replicas": 2}})).await;
    wait(&env, &md_ref, "ScalingDown=False").await;

    pause_set(&env, &set, false).await;
    wait(&env, &set_ref, "Paused=False").await;

    // A health check marks a Machine whose Node went silent; its
    // pre-drain hook holds its deletion, so the deployment is Remediating.
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": {"name": MD, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"capstan.dev/deployment-name": MD}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
                {"type": "Ready", "status": "False", "timeoutSeconds": 2},
            ]},
        },
    }))
    .unwrap();
    Api::<MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .unwrap();
    let silent = env.machines(NS).await[0].clone();
    let hook = "pre-drain.delete.hook.machine.capstan.dev/e2e";
    let machines = Api::<capstan_api::Machine>::namespaced(env.client.clone(), NS);
    let set_hook = async |name: &str, value: Option<&str>| {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {hook: value}}})),
            )
            .await
            .unwrap();
    };
    set_hook(&silent.name_any(), Some("test")).await;
    let node = capstan_e2e::env::node_of(&silent);
    let (code, body) = env
        .cloud_call(
            "PUT",
            &format!("/admin/nodes/{node}/heartbeats"),
            Some(json!({"enabled": false})),
        )
        .await
        .unwrap();
    assert_eq!(code, 204, "{body}");
    wait(&env, &md_ref, "Remediating").await;
    wait(&env, &set_ref, "Remediating").await;
    set_hook(&silent.name_any(), None).await;
    wait(&env, &md_ref, "Remediating=False").await;
    env.wait_rolled_out(NS, MD, LONG).await;
    wait(&env, &md_ref, "MachinesReady").await;

    // A rollout held by spec.paused: RollingOut until it resumes.
    patch_md(
        &env,
        json!({"spec": {"paused": true, "template": {"spec": {"version": "v1.31.0"}}}}),
    )
    .await;
    wait(&env, &md_ref, "RollingOut").await;
    wait(&env, &md_ref, "MachinesUpToDate=False").await;
    patch_md(&env, json!({"spec": {"paused": false}})).await;
    wait(&env, &md_ref, "RollingOut=False").await;
    wait(&env, &md_ref, "MachinesUpToDate").await;
    versions(
        &env,
        &md_ref,
        json!([{"version": "v1.31.0", "replicas": 2}]),
    )
    .await;

    // OnDelete: a version change replaces only the Machine a user deletes,
    // so two versions run side by side, lowest first.
    patch_md(
        &env,
        json!({"spec": {
            "rollout": {"strategy": {"type": "OnDelete"}},
            "template": {"spec": {"version": "v1.32.0"}},
        }}),
    )
    .await;
    let old_set = set_of_version(&env, "v1.31.0").await;
    // The deployment has seen OnDelete once its new set exists; a Machine
    // deleted before that is replaced by the old set, as in Cluster API.
    let new_set = set_of_version(&env, "v1.32.0").await;
    let replaced = env.machines(NS).await[0].name_any();
    machines
        .delete(&replaced, &DeleteParams::default())
        .await
        .unwrap();
    let both = json!([
        {"version": "v1.31.0", "replicas": 1},
        {"version": "v1.32.0", "replicas": 1},
    ]);
    versions(&env, &md_ref, both).await;
    let one_new = json!([{"version": "v1.32.0", "replicas": 1}]);
    versions(&env, &format!("machineset/{new_set}"), one_new).await;
    let one_old = json!([{"version": "v1.31.0", "replicas": 1}]);
    versions(&env, &format!("machineset/{old_set}"), one_old).await;

    // Deleting, held by a Machine's pre-drain hook.
    let held = env
        .machines(NS)
        .await
        .into_iter()
        .find(|m| m.metadata.deletion_timestamp.is_none())
        .unwrap()
        .name_any();
    set_hook(&held, Some("test")).await;
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .delete(MD, &DeleteParams::default())
        .await
        .unwrap();
    wait(&env, &md_ref, "Deleting").await;
    set_hook(&held, None).await;
    env.eventually("the deployment gone", LONG, async || {
        Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
            .get_opt(MD)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    env.stop_controllers().await;
}

/// Wait until OBJECT's `status.versions` is `expected` (Cluster API
/// v1beta2: each Node's kubelet version, counted, lowest first).
async fn versions(env: &Env, object: &str, expected: serde_json::Value) {
    let read = async || {
        let out = env
            .control_plane
            .kubectl(
                &["get", "-n", NS, object, "-o", "jsonpath={.status.versions}"],
                None,
            )
            .ok()?;
        let got: serde_json::Value = serde_json::from_str(out.trim()).ok()?;
        (got == expected).then_some(())
    };
    if poll_until(LONG, read).await.is_none() {
        panic!(
            "{object}: status.versions never became {expected}\n{}",
            env.describe(NS).await
        );
    }
}

/// The MachineSet whose template has `version`.
async fn set_of_version(env: &Env, version: &str) -> String {
    env.eventually("the version's MachineSet", LONG, async || {
        let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS)
            .list(&Default::default())
            .await
            .ok()?;
        sets.items
            .iter()
            .find(|s| s.spec.template.spec.version.as_deref() == Some(version))
            .map(|s| s.name_any())
    })
    .await
}

/// The ValidSpec condition of a MachineDeployment (or, with `set`, a
/// MachineSet): (status, reason, message).
async fn valid_spec(env: &Env, name: &str, set: bool) -> Option<(String, String, String)> {
    let conditions = if set {
        let api = Api::<MachineSet>::namespaced(env.client.clone(), NS);
        api.get(name).await.ok()?.status?.conditions
    } else {
        let api = Api::<MachineDeployment>::namespaced(env.client.clone(), NS);
        api.get(name).await.ok()?.status?.conditions
    };
    let c = capstan_api::condition(&conditions, "ValidSpec")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// A user's v1beta1-shaped YAML (`spec.strategy`, `spec.deletePolicy`)
/// still works, with `ValidSpec` reason `DeprecatedFields` and a Warning
/// Event naming the move; both names set and different is refused naming
/// both; the v1beta2 names take over once the old one is removed. `kubectl
/// get` prints Cluster API's columns, `spec.providerID` is written by the
/// controller, and a tenant's rewrite of it is set back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn v1beta1_names_are_accepted_with_a_warning_and_tables_print_as_cluster_api() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let url = env.cloud.url();
    // OnDelete under the old name: a template change replaces nothing, so
    // the old field is shown to be read, not just tolerated.
    let yaml = format!(
        r#"apiVersion: capstan.dev/v1alpha1
kind: MachineDeployment
metadata: {{name: old, namespace: {NS}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{capstan.dev/pool: old}}}}
  strategy: {{type: OnDelete}}
  template:
    metadata: {{labels: {{capstan.dev/pool: old}}}}
    spec:
      version: v1.30.0
      provider: {{plugin: {SIM_PLUGIN}, config: {{endpoint: "{url}", instanceType: small}}}}
---
apiVersion: capstan.dev/v1alpha1
kind: MachineSet
metadata: {{name: spare, namespace: {NS}}}
spec:
  replicas: 0
  deletePolicy: Oldest
  selector: {{matchLabels: {{capstan.dev/pool: spare}}}}
  template:
    metadata: {{labels: {{capstan.dev/pool: spare}}}}
    spec:
      provider: {{plugin: {SIM_PLUGIN}, config: {{endpoint: "{url}", instanceType: small}}}}
"#
    );
    env.control_plane
        .kubectl(&["apply", "-f", "-"], Some(&yaml))
        .expect("kubectl apply");
    env.wait_rolled_out(NS, "old", LONG).await;
    let deployments = Api::<MachineDeployment>::namespaced(env.client.clone(), NS);
    let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS);
    let (status, reason, message) = valid_spec(&env, "old", false).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DeprecatedFields")
    );
    assert!(
        message.contains("spec.strategy is deprecated: move it to spec.rollout.strategy"),
        "{message}"
    );
    let spare = env
        .eventually("the set's ValidSpec", LONG, async || {
            valid_spec(&env, "spare", true).await
        })
        .await;
    assert_eq!(spare.1, "DeprecatedFields", "{spare:?}");
    assert!(
        spare
            .2
            .contains("spec.deletePolicy is deprecated: move it to spec.deletion.order")
    );
    let warned = env
        .eventually("the DeprecatedFields Event", LONG, async || {
            let events = env.events_for(NS, "old").await;
            events
                .into_iter()
                .find(|(reason, _)| reason == "DeprecatedFields")
        })
        .await;
    assert!(warned.1.contains("spec.rollout.strategy"), "{warned:?}");

    let version = |v: &'static str| json!({"spec": {"template": {"spec": {"version": v}}}});
    deployments
        .patch(
            "old",
            &PatchParams::default(),
            &Patch::Merge(version("v1.31.0")),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let machines = env.machines(NS).await;
    assert!(
        machines
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.30.0")),
        "OnDelete (the deprecated spec.strategy) replaced a machine"
    );

    // Both names, disagreeing: refused, naming both.
    let both = json!({"spec": {"rollout": {"strategy": {"type": "RollingUpdate"}}}});
    deployments
        .patch("old", &PatchParams::default(), &Patch::Merge(both))
        .await
        .unwrap();
    wait(&env, "machinedeployment/old", "ValidSpec=False").await;
    let (_, reason, message) = valid_spec(&env, "old", false).await.unwrap();
    assert_eq!(reason, "InvalidSpec");
    assert!(
        message.contains("spec.strategy and spec.rollout.strategy are both set and differ"),
        "{message}"
    );
    // The old name removed: the v1beta2 one rolls the new version out, and
    // `spec.deletion.order` reaches the sets at its v1beta2 place.
    let moved = json!({"spec": {"strategy": null, "deletion": {"order": "Newest"}}});
    deployments
        .patch("old", &PatchParams::default(), &Patch::Merge(moved))
        .await
        .unwrap();
    wait(&env, "machinedeployment/old", "ValidSpec").await;
    assert_eq!(valid_spec(&env, "old", false).await.unwrap().1, "Valid");
    env.wait_rolled_out(NS, "old", LONG).await;
    let machines = env.machines(NS).await;
    assert!(
        machines
            .iter()
            .all(|m| m.spec.version.as_deref() == Some("v1.31.0"))
    );
    let set = sets.get(&current_set(&env).await).await.unwrap();
    assert_eq!(
        set.spec.deletion.map(|d| d.order),
        Some(capstan_api::DeletePolicy::Newest)
    );
    assert_eq!(set.spec.delete_policy, None);

    // spec.providerID, written by the controller as Cluster API does.
    for m in &machines {
        let recorded = m.status.as_ref().and_then(|s| s.provider_id.clone());
        assert!(recorded.is_some());
        assert_eq!(m.spec.provider_id, recorded, "{}", m.name_any());
    }
    // Cluster API's columns.
    let table = env
        .control_plane
        .kubectl(&["get", "md", "old", "-n", NS], None)
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CLUSTER",
            "AVAILABLE",
            "DESIRED",
            "CURRENT",
            "READY",
            "AVAILABLE",
            "UP-TO-DATE",
            "PHASE",
            "AGE",
            "VERSION"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    // No cluster name: the column is empty, so the row starts with `True`.
    assert_eq!(&row[1..7], ["True", "2", "2", "2", "2", "2"], "{table}");
    let wide = env
        .control_plane
        .kubectl(&["get", "ma", "-n", NS, "-o", "wide"], None)
        .unwrap();
    for heading in [
        "NODE NAME",
        "PROVIDER ID",
        "READY",
        "UP-TO-DATE",
        "INTERNAL-IP",
    ] {
        assert!(wide.contains(heading), "{heading}: {wide}");
    }
    for m in &machines {
        assert!(
            wide.contains(m.spec.provider_id.as_deref().unwrap()),
            "{wide}"
        );
    }

    // A tenant rewrites one Machine's spec.providerID to another instance:
    // the recorded one outranks the claim and it is set back.
    let victim = &machines[0];
    let other = machines[1].spec.provider_id.clone().unwrap();
    let ma = Api::<capstan_api::Machine>::namespaced(env.client.clone(), NS);
    let claim = json!({"spec": {"providerID": other}});
    ma.patch(
        &victim.name_any(),
        &PatchParams::default(),
        &Patch::Merge(claim),
    )
    .await
    .unwrap();
    let restored = env
        .eventually("spec.providerID set back", LONG, async || {
            let m = ma.get(&victim.name_any()).await.ok()?;
            (m.spec.provider_id == victim.spec.provider_id).then_some(())
        })
        .await;
    let _: () = restored;
    let events = env.events_for(NS, &victim.name_any()).await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "ProviderIDRestored" && m.contains(&other)),
        "{events:?}"
    );
    assert_eq!(env.cloud.instances().len(), 2, "no instance was touched");
    env.stop_controllers().await;
}
