use super::*;
use capstan_api::{MachineDeploymentSpec, MachineSpec, ProviderRef, RollingUpdate};
use std::collections::BTreeMap;

fn md(surge: Option<IntOrString>) -> MachineDeployment {
    let mut md = MachineDeployment::new(
        "web",
        MachineDeploymentSpec {
            replicas: 10,
            template: MachineTemplateSpec {
                metadata: Default::default(),
                spec: MachineSpec {
                    provider: ProviderRef {
                        plugin: "sim".into(),
                        config: serde_json::json!({"b": 1, "a": {"y": 2, "x": 1}}),
                    },
                    ..Default::default()
                },
            },
            ..Default::default()
        },
    );
    md.spec.rollout_strategy_mut().rolling_update = Some(RollingUpdate {
        max_surge: surge,
        max_unavailable: None,
    });
    md
}

#[test]
fn the_new_set_is_the_one_of_the_same_template_whatever_its_labels_say() {
    let deployment = md(None);
    let hash = template_hash(&deployment.spec.template);
    let set = |name: &str, label: &str, revision: &str, version: Option<&str>| {
        let mut template = deployment.spec.template.clone();
        if let Some(v) = version {
            template.spec.version = Some(v.into());
        }
        template
            .metadata
            .labels
            .insert(LABEL_TEMPLATE_HASH.into(), label.into());
        let mut s = MachineSet::new(
            name,
            capstan_api::MachineSetSpec {
                replicas: 1,
                selector: Default::default(),
                template,
                deletion: None,
                delete_policy: None,
                min_ready_seconds: 0,
                in_place: None,
                cluster_name: None,
            },
        );
        s.metadata.labels = Some(BTreeMap::from([(LABEL_TEMPLATE_HASH.into(), label.into())]));
        s.metadata.annotations = Some(BTreeMap::from([(
            capstan_api::ANNOTATION_REVISION.into(),
            revision.into(),
        )]));
        Arc::new(s)
    };
    // Made before labels left the hash: an older hash label, the same spec.
    let before_upgrade = set("web-0ld", "0ld", "3", None);
    let other = set("web-other", "other", "4", Some("v9.9.9"));
    let sets = vec![other.clone(), before_upgrade.clone()];
    let found = new_set_of(&Target::of(&deployment, 0), &sets).expect("the same template");
    assert_eq!(found.name_any(), "web-0ld", "no rollout after an upgrade");
    let labelled = set("web-new", &hash, "2", None);
    let sets = vec![before_upgrade, labelled, other];
    assert_eq!(
        new_set_of(&Target::of(&deployment, 0), &sets)
            .unwrap()
            .name_any(),
        "web-new"
    );
}

#[test]
fn template_hash_ignores_key_order_and_changes_with_content() {
    let a = md(None);
    let mut b = md(None);
    b.spec.template.spec.provider.config = serde_json::json!({"a": {"x": 1, "y": 2}, "b": 1});
    assert_eq!(
        template_hash(&a.spec.template),
        template_hash(&b.spec.template)
    );
    b.spec.template.spec.deletion = Some(capstan_api::MachineDeletionSpec {
        node_drain_timeout_seconds: Some(30),
        ..Default::default()
    });
    assert_eq!(
        template_hash(&a.spec.template),
        template_hash(&b.spec.template),
        "deletion settings change in place, not by a rollout"
    );
    b.spec
        .template
        .metadata
        .labels
        .insert("team".into(), "b".into());
    b.spec
        .template
        .metadata
        .annotations
        .insert("note".into(), "x".into());
    assert_eq!(
        template_hash(&a.spec.template),
        template_hash(&b.spec.template),
        "template labels and annotations change in place, not by a rollout"
    );
    b.spec.template.spec.min_ready_seconds = Some(30);
    b.spec.template.spec.readiness_gates = vec![capstan_api::MachineReadinessGate {
        condition_type: "example.com/Ready".into(),
        polarity: None,
    }];
    b.spec.template.spec.taints = vec![capstan_api::MachineTaint {
        key: "example.com/pool".into(),
        value: String::new(),
        effect: capstan_api::TaintEffect::NoSchedule,
        propagation: capstan_api::TaintPropagation::Always,
    }];
    assert_eq!(
        template_hash(&a.spec.template),
        template_hash(&b.spec.template),
        "minReadySeconds, readiness gates and taints change in place, not by a rollout"
    );
    // Every field carried in place is one the updaters never see, and
    // the other way round.
    let carried: Vec<&str> = crate::template::carried_in_place(&b.spec.template.spec)
        .iter()
        .map(|(field, _)| *field)
        .collect();
    assert_eq!(carried, capstan_planner::inplace::CARRIED_IN_PLACE);
    assert!(
        crate::inplace::changed_fields(&a.spec.template.spec, &b.spec.template.spec).is_empty()
    );
    // A bootstrap change rolls out like any other template change: new
    // join data means new instances.
    let mut booted = b.clone();
    booted.spec.template.spec.bootstrap = Some(capstan_api::MachineBootstrap {
        plugin: Some("kubeadm".into()),
        config: Some(serde_json::json!({"preKubeadmCommands": ["swapoff -a"]})),
        data_secret_name: None,
    });
    assert_ne!(
        template_hash(&b.spec.template),
        template_hash(&booted.spec.template)
    );
    assert!(
        crate::inplace::changed_fields(&b.spec.template.spec, &booted.spec.template.spec)
            .iter()
            .any(|f| f.starts_with("bootstrap")),
        "an updater sees the bootstrap change (and none claims it by default)"
    );
    b.spec.template.spec.version = Some("v1.31.0".into());
    assert_ne!(
        template_hash(&a.spec.template),
        template_hash(&b.spec.template)
    );
    assert_eq!(template_hash(&a.spec.template).len(), 10);
}

#[test]
fn strategy_errors_name_the_field() {
    let bad = md(Some(IntOrString::String("lots".into())));
    let error = strategy_of(&bad).unwrap_err();
    assert!(
        error.starts_with("spec.rollout.strategy.rollingUpdate.maxSurge:"),
        "{error}"
    );
    // The deprecated v1beta1 place is read, and named, as written.
    let mut old = bad.clone();
    old.spec.strategy = old.spec.rollout.take().and_then(|r| r.strategy);
    let error = strategy_of(&old).unwrap_err();
    assert!(
        error.starts_with("spec.strategy.rollingUpdate.maxSurge:"),
        "{error}"
    );
    let ok = md(Some(IntOrString::String("25%".into())));
    assert_eq!(
        strategy_of(&ok).unwrap(),
        Strategy::RollingUpdate(Bounds {
            max_surge: 3,
            max_unavailable: 0
        })
    );
}
