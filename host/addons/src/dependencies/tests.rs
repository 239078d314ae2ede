use super::*;
use capstan_api::{AddonSpec, AddonStatus, KubeconfigSecretRef};
use proptest::prelude::*;

fn key(name: &str) -> AddonKey {
    AddonKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn view(name: &str) -> AddonView {
    AddonView {
        key: key(name),
        deleting: false,
        generation: 2,
        observed_generation: Some(2),
        healthy: Some(true),
        phase: Some("Ready".into()),
        version: Some("1.8.2".into()),
        target: None,
        depends_on: vec![],
    }
}

fn dep(name: &str, constraint: Option<&str>) -> AddonDependency {
    AddonDependency {
        name: name.into(),
        namespace: None,
        version_constraint: constraint.map(str::to_string),
    }
}

fn addon(name: &str, deps: &[&str]) -> Addon {
    let mut a = Addon::new(
        name,
        AddonSpec {
            plugin: "p".into(),
            channel: Some("stable".into()),
            depends_on: deps.iter().map(|d| dep(d, None)).collect(),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("ns".into());
    a.metadata.generation = Some(3);
    a
}

#[test]
fn a_dependency_is_ready_only_when_every_rule_holds() {
    let ready = |v: &AddonView, d: &AddonDependency| readiness(d, "ns", None, Some(v));
    let base = view("a");
    assert_eq!(ready(&base, &dep("a", None)), Ok(()));
    assert_eq!(
        readiness(&dep("a", None), "ns", None, None),
        Err(NotReady::Missing)
    );
    let mut v = base.clone();
    v.deleting = true;
    assert_eq!(ready(&v, &dep("a", None)), Err(NotReady::Deleting));
    let mut v = base.clone();
    v.observed_generation = Some(1);
    assert_eq!(ready(&v, &dep("a", None)), Err(NotReady::NotReconciled));
    let mut v = base.clone();
    v.healthy = Some(false);
    v.phase = Some("Unhealthy".into());
    let why = ready(&v, &dep("a", None)).unwrap_err();
    assert_eq!(why.to_string(), "is not healthy (phase Unhealthy)");
    // Healthy once, but its latest spec failed to apply: not ready.
    let mut v = base.clone();
    v.phase = Some("Failed".into());
    assert_eq!(
        ready(&v, &dep("a", None)),
        Err(NotReady::NotHealthy(Some("Failed".into())))
    );
    assert_eq!(ready(&base, &dep("a", Some(">=1.8.0, <2"))), Ok(()));
    let why = ready(&base, &dep("a", Some("^1.9"))).unwrap_err();
    assert_eq!(
        why.to_string(),
        "has version 1.8.2, which does not meet \"^1.9\""
    );
    let why = ready(&base, &dep("a", Some("soon"))).unwrap_err();
    assert!(
        why.to_string()
            .contains("versionConstraint \"soon\" is not a semantic-version requirement"),
        "{why}"
    );
    let mut v = base.clone();
    v.target = Some(AddonTarget {
        kubeconfig_secret_ref: Some(KubeconfigSecretRef {
            name: "c1-kubeconfig".into(),
            key: None,
        }),
        cluster_name: None,
    });
    assert_eq!(ready(&v, &dep("a", None)), Err(NotReady::OtherCluster));
}

#[test]
fn versions_with_a_v_and_requirements_are_read_as_semver() {
    assert_eq!(meets("v1.30.2", ">=1.30.0, <1.31"), Ok(true));
    assert_eq!(meets("1.7.0", "^1.8"), Ok(false));
    assert!(
        meets("1.8", "^1.8")
            .unwrap_err()
            .contains("not a semantic version")
    );
}

#[test]
fn the_same_cluster_is_the_same_secret_of_the_same_namespace() {
    let t = |name: &str| AddonTarget {
        kubeconfig_secret_ref: Some(KubeconfigSecretRef {
            name: name.into(),
            key: None,
        }),
        cluster_name: None,
    };
    assert!(same_cluster(("a", None), ("b", None)));
    assert!(same_cluster(("a", Some(&t("k"))), ("a", Some(&t("k")))));
    assert!(!same_cluster(("a", Some(&t("k"))), ("b", Some(&t("k")))));
    assert!(!same_cluster(("a", Some(&t("k"))), ("a", None)));
}

#[test]
fn blockers_name_each_dependency_in_order() {
    let mut views = BTreeMap::new();
    let mut sick = view("b");
    sick.healthy = None;
    sick.phase = None;
    views.insert(key("b"), sick);
    views.insert(key("c"), view("c"));
    let a = addon("a", &["missing", "b", "c"]);
    let b = blockers(&a, &views);
    assert_eq!(
        blocked_message(&b),
        "waiting for Addon ns/missing does not exist; Addon ns/b is not healthy yet"
    );
}

#[test]
fn a_cycle_is_shown_from_the_addon_back_to_it() {
    let graph = BTreeMap::from([
        (key("a"), vec![key("b")]),
        (key("b"), vec![key("x"), key("c")]),
        (key("c"), vec![key("a")]),
    ]);
    let cycle = cycle_through(&key("a"), &graph).unwrap();
    assert_eq!(show_cycle(&cycle), "ns/a -> ns/b -> ns/c -> ns/a");
    assert_eq!(cycle_through(&key("x"), &graph), None);
    // Depending on oneself is a cycle too.
    let own = BTreeMap::from([(key("a"), vec![key("a")])]);
    assert_eq!(
        show_cycle(&cycle_through(&key("a"), &own).unwrap()),
        "ns/a -> ns/a"
    );
}

#[test]
fn dependents_keep_a_deleting_addon_except_across_a_cycle() {
    let mut views = BTreeMap::new();
    let mut b = view("b");
    b.depends_on = vec![key("a")];
    let mut c = view("c");
    c.depends_on = vec![key("a")];
    views.insert(key("a"), view("a"));
    views.insert(key("b"), b);
    views.insert(key("c"), c);
    assert_eq!(dependents(&key("a"), &views), vec![key("b"), key("c")]);
    // a <-> c: c no longer holds a.
    views.get_mut(&key("a")).unwrap().depends_on = vec![key("c")];
    assert_eq!(dependents(&key("a"), &views), vec![key("b")]);
}

#[test]
fn transitions_are_what_changes_and_held_renders_are_what_is_applied() {
    let mut a = addon("a", &["b"]);
    a.spec.config = Some(serde_json::json!({"port": 9300}));
    let applied = AppliedSpec {
        generation: 2,
        version: "1.7.0".into(),
        config: Some(serde_json::json!({"port": 9100})),
        patches: vec![],
        target: None,
    };
    assert_eq!(
        transition(None, None, 3, "1.7.0", "sha256:1"),
        Some(Change::FirstInstall)
    );
    let change = transition(Some(&applied), Some("sha256:1"), 3, "1.8.2", "sha256:1");
    assert_eq!(
        change.as_ref().unwrap().to_string(),
        "the change from version 1.7.0 to 1.8.2"
    );
    assert_eq!(
        transition(Some(&applied), Some("sha256:1"), 3, "1.7.0", "sha256:1"),
        Some(Change::Generation)
    );
    assert_eq!(
        transition(Some(&applied), Some("sha256:1"), 2, "1.7.0", "sha256:2"),
        Some(Change::PluginRevision)
    );
    assert_eq!(
        transition(Some(&applied), Some("sha256:1"), 2, "1.7.0", "sha256:1"),
        None
    );
    match gate(&a, Some(&applied), change, false, true) {
        Gate::Held { spec, .. } => {
            assert_eq!(spec.version.as_deref(), Some("1.7.0"));
            assert_eq!(spec.channel, None);
            assert_eq!(spec.config, applied.config);
            assert_eq!(spec.depends_on, a.spec.depends_on);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        gate(&a, Some(&applied), Some(Change::PluginRevision), true, true),
        Gate::Wait(Change::PluginRevision)
    );
    assert_eq!(
        gate(&a, None, Some(Change::FirstInstall), false, true),
        Gate::Wait(Change::FirstInstall)
    );
    let _ = AddonStatus::default();
}

fn arb_applied() -> impl Strategy<Value = Option<AppliedSpec>> {
    proptest::option::of(
        (
            1i64..4,
            prop::sample::select(vec!["1.7.0", "1.8.2"]),
            0u16..3,
        )
            .prop_map(|(generation, version, port)| AppliedSpec {
                generation,
                version: version.into(),
                config: Some(serde_json::json!({ "port": 9100 + port })),
                patches: vec![],
                target: None,
            }),
    )
}

proptest! {
    /// Cycle detection is complete and sound: a cycle through a node is
    /// found exactly when the node reaches itself, and the path it shows
    /// follows edges of the graph.
    #[test]
    fn cycles_are_found_exactly_when_an_addon_reaches_itself(
        edges in proptest::collection::vec((0u8..6, 0u8..6), 0..14),
        start in 0u8..6,
    ) {
        let k = |i: u8| key(&format!("a{i}"));
        let mut graph: BTreeMap<AddonKey, Vec<AddonKey>> = BTreeMap::new();
        for (from, to) in &edges {
            graph.entry(k(*from)).or_default().push(k(*to));
        }
        // Reachability by fixed point.
        let mut reach: BTreeSet<AddonKey> = graph.get(&k(start)).cloned().unwrap_or_default().into_iter().collect();
        loop {
            let next: BTreeSet<AddonKey> = reach
                .iter()
                .flat_map(|n| graph.get(n).cloned().unwrap_or_default())
                .chain(reach.iter().cloned())
                .collect();
            if next == reach { break; }
            reach = next;
        }
        let found = cycle_through(&k(start), &graph);
        prop_assert_eq!(found.is_some(), reach.contains(&k(start)));
        if let Some(path) = found {
            prop_assert_eq!(path.first(), Some(&k(start)));
            prop_assert_eq!(path.last(), Some(&k(start)));
            for pair in path.windows(2) {
                prop_assert!(graph[&pair[0]].contains(&pair[1]));
            }
        }
    }

    /// No transition while a dependency is not ready; drift correction
    /// (nothing changes) is never gated; nothing held back when ready.
    #[test]
    fn the_gate_holds_transitions_and_never_drift_correction(
        applied in arb_applied(),
        generation in 1i64..4,
        version in prop::sample::select(vec!["1.7.0", "1.8.2"]),
        new_revision in any::<bool>(),
        blocked in any::<bool>(),
    ) {
        let mut a = addon("a", &["b"]);
        a.metadata.generation = Some(generation);
        let digest = if new_revision { "sha256:2" } else { "sha256:1" };
        let applied_digest = applied.as_ref().map(|_| "sha256:1");
        let change = transition(applied.as_ref(), applied_digest, generation, version, digest);
        let new_revision = new_revision && applied.is_some();
        let decision = gate(&a, applied.as_ref(), change.clone(), new_revision, blocked);
        match (&change, blocked) {
            (None, _) | (Some(_), false) => prop_assert_eq!(decision, Gate::Current),
            (Some(_), true) => match decision {
                Gate::Current => prop_assert!(false, "a transition went through while blocked"),
                Gate::Held { spec, .. } => {
                    // What is rendered is exactly what is applied.
                    let applied = applied.as_ref().unwrap();
                    prop_assert_eq!(spec.version.as_deref(), Some(applied.version.as_str()));
                    prop_assert_eq!(&spec.config, &applied.config);
                    prop_assert!(!new_revision);
                }
                Gate::Wait(_) => prop_assert!(applied.is_none() || new_revision),
            },
        }
    }
}
