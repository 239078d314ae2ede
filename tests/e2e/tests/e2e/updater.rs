//! The updater world end to end: `sim-updater` claims the `version` field and
//! applies it in place through the simulated cloud, re-entrantly, while the
//! instance keeps its provider ID.

use capstan_e2e::plugin;
use capstan_e2e::sim_cloud::{Faults, SimCloud, SimCloudConfig};
use capstan_runtime::types::{Machine, UpdateProgress};
use capstan_runtime::{Credential, Error, Grants, Limits, Runtime, RuntimeConfig, World};
use std::time::{Duration, Instant};

fn grants(cloud: &SimCloud) -> Grants {
    let mut g = Grants {
        http: vec![cloud.url().parse().unwrap()],
        ..Default::default()
    };
    g.credentials
        .insert("sim-cloud".into(), Credential::Bearer("upd".into()));
    g
}

fn machine(cloud: &SimCloud, version: &str) -> Machine {
    Machine {
        name: "m0".into(),
        namespace: "default".into(),
        uid: "uid-m0".into(),
        cluster_name: None,
        labels: vec![],
        version: Some(version.into()),
        failure_domain: None,
        provider_config: serde_json::json!({ "endpoint": cloud.url(), "instanceType": "small" })
            .to_string(),
        infrastructure_config: None,
        provider_id: None,
    }
}

#[tokio::test]
async fn sim_updater_claims_version_and_updates_in_place() {
    let cloud = SimCloud::start(SimCloudConfig {
        token: Some("upd".into()),
        faults: Faults {
            update_latency_ms: 600,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .unwrap();
    let rt = Runtime::new(RuntimeConfig {
        max_concurrent_calls: 8,
        ..Default::default()
    })
    .unwrap();
    let provider = rt
        .load_file(&plugin("sim_provider"), Limits::default(), grants(&cloud))
        .unwrap()
        .provider()
        .unwrap();
    let updater_plugin = rt
        .load_file(&plugin("sim_updater"), Limits::default(), grants(&cloud))
        .unwrap();
    assert_eq!(updater_plugin.manifest().world, World::Updater);
    let updater = updater_plugin.updater().unwrap();

    let mut current = machine(&cloud, "v1.30.0");
    let created = provider.create(&current, None).await.unwrap();
    current.provider_id = Some(created.provider_id.clone());
    let mut desired = current.clone();
    desired.version = Some("v1.31.0".into());

    let changed = vec![
        "version".to_string(),
        "provider.config.instanceType".to_string(),
    ];
    let claimed = updater
        .can_update(&current, &desired, &changed)
        .await
        .unwrap();
    assert_eq!(
        claimed,
        ["version"],
        "only the version is claimed; the rest needs a replace"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut progress = Vec::new();
    loop {
        match updater.update(&current, &desired, &claimed).await.unwrap() {
            UpdateProgress::Done => break,
            UpdateProgress::InProgress(p) => {
                progress.push(p.percent.unwrap_or(0));
                assert!(p.retry_after_ms > 0);
                tokio::time::sleep(Duration::from_millis(p.retry_after_ms)).await;
            }
            UpdateProgress::Failed(reason) => panic!("update failed: {reason}"),
        }
        assert!(
            Instant::now() < deadline,
            "update never finished: {progress:?}"
        );
    }
    assert!(
        !progress.is_empty(),
        "the update reported progress before finishing"
    );
    // Re-entrant: asking again after done confirms, it does not start over.
    assert_eq!(
        updater.update(&current, &desired, &claimed).await.unwrap(),
        UpdateProgress::Done
    );

    let after = provider.get(&current).await.unwrap();
    assert_eq!(
        after.provider_id, created.provider_id,
        "updated in place, not replaced"
    );
    assert_eq!(after.version.as_deref(), Some("v1.31.0"));
    assert_eq!(cloud.stats().instances_launched, 1);
}

#[tokio::test]
async fn a_plugin_is_only_usable_as_its_own_world() {
    let rt = Runtime::new(RuntimeConfig {
        max_concurrent_calls: 2,
        ..Default::default()
    })
    .unwrap();
    let updater = rt
        .load_file(&plugin("sim_updater"), Limits::default(), Grants::default())
        .unwrap();
    let err = updater.provider().unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongWorld {
                expected: World::Provider,
                actual: World::Updater,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("implements the updater world, not provider"),
        "{err}"
    );
    let provider = rt
        .load_file(
            &plugin("sim_provider"),
            Limits::default(),
            Grants::default(),
        )
        .unwrap();
    assert!(matches!(
        provider.updater().unwrap_err(),
        Error::WrongWorld { .. }
    ));
}
