//! Addons in order (`spec.dependsOn`) and their update policies, on a real
//! control plane whose Nodes run pods: a chain created at once installs
//! one after another as each becomes healthy, and leaves in reverse; a
//! cycle is refused with nothing applied; while a dependency is unhealthy,
//! a dependent's version bump waits but hand edits of what it installed
//! are still undone; a new plugin revision whose channel offers a newer
//! version — carried to the site only as a signed bundle pushed into its
//! mirror while the publisher's registry is down — is reported, not
//! applied, under `Notify` and `Manual`.

use crate::addons::{
    NS, addon, condition_of, create, env_with, options, patch_spec, status, wait_status,
};
use capstan_addons::engine::{
    APPLIED, DEPENDENCIES_READY, UP_TO_DATE, UPDATE_AVAILABLE, VALID_SPEC,
};
use capstan_api::Addon;
use capstan_e2e::cli::{key_pair, ok};
use capstan_e2e::env::{Env, eventually};
use capstan_e2e::registry::{Registry, RegistryOptions};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

/// The namespaces the tests' exporters install into.
const NAMESPACES: [&str; 10] = [
    "order-a",
    "order-b",
    "order-c",
    "cycle-x",
    "cycle-y",
    "flap-base",
    "flap-d",
    "policy-n",
    "policy-m",
    "policy-auto",
];

fn grants() -> Vec<String> {
    exporter_grants(&NAMESPACES)
}

/// What node-exporter needs granted to install into each of `namespaces`.
pub(crate) fn exporter_grants(namespaces: &[&str]) -> Vec<String> {
    namespaces
        .iter()
        .flat_map(|ns| {
            [
                format!("Namespace/{ns}"),
                format!("ServiceAccount@{ns}"),
                format!("Service@{ns}"),
                format!("apps/DaemonSet@{ns}"),
            ]
        })
        .collect()
}

/// node-exporter, granted a namespace of its own for each test Addon.
async fn env() -> Env {
    let env = env_with(
        vec![("node-exporter", "node_exporter_addon", grants())],
        options(),
    )
    .await;
    // A node agent: host PID, host network and the host's root mounted.
    Api::<capstan_api::Plugin>::all(env.client.clone())
        .patch(
            "node-exporter",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grants": {"podSecurity": "Privileged"}}})),
        )
        .await
        .unwrap();
    env
}

/// An exporter Addon into namespace `ns` (port `port`), after `after`.
fn exporter(name: &str, ns: &str, port: u16, version: &str, after: &[&str]) -> Addon {
    addon(
        name,
        json!({
            "plugin": "node-exporter",
            "version": version,
            "config": {"namespace": ns, "port": port},
            "dependsOn": after.iter().map(|d| json!({"name": d})).collect::<Vec<_>>(),
        }),
    )
}

async fn daemonset(env: &Env, ns: &str) -> Option<DaemonSet> {
    Api::<DaemonSet>::namespaced(env.client.clone(), ns)
        .get_opt("node-exporter")
        .await
        .unwrap()
}

async fn namespace_exists(env: &Env, ns: &str) -> bool {
    Api::<Namespace>::all(env.client.clone())
        .get_opt(ns)
        .await
        .unwrap()
        .is_some_and(|n| n.metadata.deletion_timestamp.is_none())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_installs_in_order_as_each_gets_healthy_and_leaves_in_reverse() {
    let env = env().await;
    let kubelet = env.cloud.kubelet().unwrap();
    // The first addon's pods never get ready, until we say so.
    kubelet.set_pod_ready("order-a", "*", false);
    for a in [
        exporter("c", "order-c", 9103, "1.7.0", &["b"]),
        exporter("b", "order-b", 9102, "1.7.0", &["a"]),
        exporter("a", "order-a", 9101, "1.7.0", &[]),
    ] {
        create(&env, &a).await;
    }
    let a = wait_status(&env, "a", "applied, not healthy", |s| {
        condition_of(s, APPLIED).0 == "True" && s.healthy == Some(false)
    })
    .await;
    assert!(daemonset(&env, "order-a").await.is_some());
    // Once b has seen a applied (a's status above), it waits on a's health.
    let b = wait_status(&env, "b", "waiting for a's health", |s| {
        let (status, _, message) = condition_of(s, DEPENDENCIES_READY);
        status == "False" && message.contains("is not healthy")
    })
    .await;
    let (_, reason, message) = condition_of(&b, DEPENDENCIES_READY);
    assert_eq!(reason, "WaitingForDependencies");
    assert!(
        message.contains("Addon default/a is not healthy"),
        "{message}"
    );
    assert_eq!(b.phase.as_deref(), Some("Pending"), "{b:?}");
    assert!(
        condition_of(&b, UP_TO_DATE)
            .2
            .starts_with("the first install waits: waiting for Addon default/a"),
        "{b:?}"
    );
    // Held for a while: nothing of b or c exists.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for ns in ["order-b", "order-c"] {
        assert!(!namespace_exists(&env, ns).await, "{ns} was created early");
    }
    let c = status(&env, "c").await;
    assert!(
        condition_of(&c, DEPENDENCIES_READY)
            .2
            .contains("Addon default/b"),
        "{c:?}"
    );
    assert_eq!(a.version.as_deref(), Some("1.7.0"));

    // Ready now: b, then c, each only once the one before is healthy.
    kubelet.set_pod_ready("order-a", "*", true);
    let api: Api<Addon> = Api::namespaced(env.client.clone(), NS);
    let healthy = async |name: &str| {
        api.get(name)
            .await
            .ok()
            .and_then(|a| a.status)
            .and_then(|s| s.healthy)
            == Some(true)
    };
    let mut seen_b = false;
    eventually("b and c installed in order", LONG, async || {
        if !seen_b && daemonset(&env, "order-b").await.is_some() {
            assert!(healthy("a").await, "b was applied before a was healthy");
            seen_b = true;
        }
        if daemonset(&env, "order-c").await.is_some() {
            assert!(seen_b, "c was applied before b");
            assert!(healthy("b").await, "c was applied before b was healthy");
            return Some(());
        }
        None
    })
    .await;
    let c = wait_status(&env, "c", "healthy", |s| s.healthy == Some(true)).await;
    assert_eq!(condition_of(&c, DEPENDENCIES_READY).0, "True");

    // Deleting a waits for b and c (its dependents), naming them.
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let waiting = eventually("a waits for its dependents", LONG, async || {
        let a = api.get("a").await.ok()?;
        let s = a.status?;
        (condition_of(&s, APPLIED).1 == "WaitingForDependents").then_some(s)
    })
    .await;
    assert!(
        condition_of(&waiting, APPLIED).2.ends_with("default/b"),
        "{waiting:?}"
    );
    assert!(
        daemonset(&env, "order-a").await.is_some(),
        "a keeps its objects"
    );
    api.delete("c", &DeleteParams::default()).await.unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    eventually("all three gone, a last", LONG, async || {
        let mut present = Vec::new();
        for name in ["a", "b", "c"] {
            if api.get_opt(name).await.ok()?.is_some() {
                present.push(name);
            }
        }
        // While b or c is there, a is too.
        if present.iter().any(|n| *n != "a") {
            assert!(
                present.contains(&"a"),
                "a went before a dependent: {present:?}"
            );
        }
        present.is_empty().then_some(())
    })
    .await;
    assert!(env.event_reasons(NS).contains("WaitingForDependents"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cycle_is_refused_and_a_held_version_bump_still_undoes_hand_edits() {
    let env = env().await;
    let kubelet = env.cloud.kubelet().unwrap();
    // x <-> y: both refused, nothing applied.
    create(&env, &exporter("x", "cycle-x", 9111, "1.7.0", &["y"])).await;
    create(&env, &exporter("y", "cycle-y", 9112, "1.7.0", &["x"])).await;
    let x = wait_status(&env, "x", "refused", |s| {
        condition_of(s, VALID_SPEC).1 == "DependencyCycle"
    })
    .await;
    let (state, _, message) = condition_of(&x, VALID_SPEC);
    assert_eq!(state, "False");
    assert!(
        message.contains("default/x -> default/y -> default/x"),
        "{message}"
    );
    assert!(x.inventory.is_empty() && x.last_applied.is_none(), "{x:?}");
    assert_eq!(x.phase.as_deref(), Some("Failed"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    for ns in ["cycle-x", "cycle-y"] {
        assert!(!namespace_exists(&env, ns).await, "{ns} was created");
    }

    // d depends on base; both installed and healthy.
    create(&env, &exporter("base", "flap-base", 9121, "1.7.0", &[])).await;
    create(&env, &exporter("d", "flap-d", 9122, "1.7.0", &["base"])).await;
    wait_status(&env, "d", "healthy at 1.7.0", |s| {
        s.healthy == Some(true) && s.version.as_deref() == Some("1.7.0")
    })
    .await;

    // base flaps (its pods fail readiness): d's version bump waits…
    kubelet.set_pod_ready("flap-base", "*", false);
    wait_status(&env, "base", "unhealthy", |s| s.healthy == Some(false)).await;
    patch_spec(&env, "d", json!({"version": "1.8.2"})).await;
    let d = wait_status(&env, "d", "the bump held", |s| {
        condition_of(s, UP_TO_DATE).1 == "WaitingForDependencies"
    })
    .await;
    assert_eq!(d.version.as_deref(), Some("1.7.0"), "{d:?}");
    assert!(
        condition_of(&d, UP_TO_DATE)
            .2
            .contains("the change from version 1.7.0 to 1.8.2 waits"),
        "{d:?}"
    );
    let image = async || {
        daemonset(&env, "flap-d")
            .await?
            .spec?
            .template
            .spec?
            .containers[0]
            .image
            .clone()
    };
    assert_eq!(
        image().await.as_deref(),
        Some("quay.io/prometheus/node-exporter:v1.7.0")
    );
    // …but a hand edit of what d installed is still undone, at 1.7.0.
    Api::<DaemonSet>::namespaced(env.client.clone(), "flap-d")
        .patch(
            "node-exporter",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "node-exporter", "image": "example.com/edited:1"}]}}}})),
        )
        .await
        .unwrap();
    eventually(
        "the hand edit undone at the held version",
        LONG,
        async || {
            (image().await.as_deref() == Some("quay.io/prometheus/node-exporter:v1.7.0"))
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(status(&env, "d").await.version.as_deref(), Some("1.7.0"));

    // base healthy again: the bump goes through.
    kubelet.set_pod_ready("flap-base", "*", true);
    let d = wait_status(&env, "d", "healthy at 1.8.2", |s| {
        s.healthy == Some(true) && s.version.as_deref() == Some("1.8.2")
    })
    .await;
    assert_eq!(condition_of(&d, UP_TO_DATE).0, "True");
    assert_eq!(
        image().await.as_deref(),
        Some("quay.io/prometheus/node-exporter:v1.8.2")
    );
}

/// node-exporter-py rebuilt with its stable channel moved to 1.8.2 (as a
/// publisher's next revision would), annotated; its path.
fn next_revision(dir: &std::path::Path) -> std::path::PathBuf {
    exporter_variant(
        dir,
        &[(
            r#"VERSIONS = [("1.7.0", "stable"), ("1.8.2", "rapid")]"#,
            r#"VERSIONS = [("1.7.0", "stable"), ("1.8.2", "stable"), ("1.8.2", "rapid")]"#,
        )],
    )
}

/// node-exporter-py with each `(from, to)` of its source replaced, built
/// into `dir` with componentize-py and annotated; its path.
pub(crate) fn exporter_variant(
    dir: &std::path::Path,
    edits: &[(&str, &str)],
) -> std::path::PathBuf {
    let root = capstan_e2e::workspace_root();
    let source = root.join("plugins/node-exporter-py");
    let mut app = std::fs::read_to_string(source.join("app.py")).unwrap();
    for (from, to) in edits {
        assert!(app.contains(from), "the sample has {from:?}");
        app = app.replace(from, to);
    }
    std::fs::write(dir.join("app.py"), app).unwrap();
    let polyglot = std::env::var_os("CAPSTAN_POLYGLOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/capstan/polyglot")
        });
    let component = dir.join("next.component.wasm");
    let out = std::process::Command::new(polyglot.join("python/bin/componentize-py"))
        .args([
            "-d",
            root.join("wit").to_str().unwrap(),
            "-w",
            "addon-plugin",
            "componentize",
            "app",
        ])
        .args([
            "-p",
            dir.to_str().unwrap(),
            "-p",
            root.join("sdk/python").to_str().unwrap(),
        ])
        .args(["-o", component.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let annotated = dir.join("next.wasm");
    let out = std::process::Command::new(capstan_e2e::env::capstan_bin().unwrap())
        .args(["plugin", "annotate", component.to_str().unwrap(), "-m"])
        .arg(source.join("capstan-plugin.json"))
        .args(["-o", annotated.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    annotated
}

fn updates(env: &Env, args: &[&str]) -> String {
    let out = std::process::Command::new(capstan_e2e::env::capstan_bin().unwrap())
        .args(["addon", "updates"])
        .args(args)
        .env("KUBECONFIG", env.control_plane.kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_and_manual_report_a_channel_move_and_apply_only_spec_version() {
    let dir = tempfile::tempdir().unwrap();
    let next = tokio::task::block_in_place(|| next_revision(dir.path()));
    // The publisher's registry A, and the site's mirror B: the host is
    // configured to fetch A's artifacts from B only.
    let mut a = Registry::start(RegistryOptions::default()).expect("registry A");
    let b = Registry::start(RegistryOptions::default()).expect("registry B");
    let (key, public) = key_pair(dir.path(), "publisher");
    let source = format!("oci://{}/capstan/ne-py:stable", a.host);
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!("apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    path: publisher.pub\nsources:\n  - prefix: oci://{}/capstan/\n    allOf: [publisher]\n", a.host),
    )
    .unwrap();
    // Publish a revision on A and carry it across to B as a signed bundle;
    // `before_push` runs between the two (the gap).
    let carry = |component: &std::path::Path, name: &str, before_push: &mut dyn FnMut()| {
        let digest = ok(&["plugin", "push", component.to_str().unwrap(), &source])
            .trim()
            .to_string();
        ok(&["plugin", "sign", &source, "--key", key.to_str().unwrap()]);
        let spec = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&spec, format!("apiVersion: capstan.dev/v1alpha1\nkind: Bundle\nplugins:\n  - {source}\npolicy: policy.yaml\n")).unwrap();
        let archive = dir.path().join(format!("{name}.tar"));
        ok(&[
            "bundle",
            "create",
            "-f",
            spec.to_str().unwrap(),
            "-o",
            archive.to_str().unwrap(),
        ]);
        before_push();
        let out = ok(&[
            "bundle",
            "push",
            archive.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
            "--to",
            &format!("{}/mirror", b.host),
        ]);
        assert!(out.contains(&digest), "{out}");
        digest
    };
    let first = capstan_e2e::plugin("node_exporter_py");
    tokio::task::block_in_place(|| carry(&first, "first", &mut || {}));

    let mut env = Env::start(capstan_e2e::sim_cloud::Faults::default())
        .await
        .expect("environment starts");
    env.add_nodes(2).await.expect("two Nodes");
    let plugins = Api::<capstan_api::Plugin>::all(env.client.clone());
    plugins
        .create(
            &PostParams::default(),
            &capstan_api::Plugin::new(
                "ne-py",
                capstan_api::PluginSpec {
                    source: source.clone(),
                    grants: capstan_api::PluginGrants {
                        objects: grants(),
                        pod_security: Some(capstan_api::PodSecurityLevel::Privileged),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
        )
        .await
        .unwrap();
    let mirrors = capstan_registry::Mirrors::parse(
        "test mirrors",
        &format!(
            "mirrors:\n  - source: oci://{}/\n    mirror: oci://{}/mirror/\n",
            a.host, b.host
        ),
    )
    .unwrap();
    let mut supply = crate::oci_plugins::supply(
        &dir.path().join("oci-cache"),
        capstan_e2e::cli::publisher_policy(&format!("oci://{}/capstan/", a.host), &public),
    );
    supply.puller.mirrors = mirrors;
    env.start_controllers(
        capstan_controllers::Providers::default(),
        capstan_controllers::Options {
            // Five resyncs take five seconds; the Plugin's tag is resolved
            // again on each.
            resync: Duration::from_secs(1),
            supply: Some(std::sync::Arc::new(supply)),
            ..options()
        },
    )
    .await;
    // Host network: each exporter on a port of its own.
    for (name, policy, port) in [
        ("n", "Notify", 9131),
        ("m", "Manual", 9132),
        ("auto", "Auto", 9133),
    ] {
        create(
            &env,
            &addon(
                name,
                json!({"plugin": "ne-py", "channel": "stable", "updatePolicy": policy,
                       "config": {"namespace": format!("policy-{name}"), "port": port}}),
            ),
        )
        .await;
    }
    for name in ["n", "m", "auto"] {
        let s = wait_status(&env, name, "healthy at 1.7.0", |s| {
            s.healthy == Some(true) && s.version.as_deref() == Some("1.7.0")
        })
        .await;
        assert_eq!(s.available_version.as_deref(), Some("1.7.0"), "{name}");
    }
    assert!(updates(&env, &[]).contains("No Addon has a newer version available."));
    let resource_version =
        async |ns: &str| daemonset(&env, ns).await.unwrap().metadata.resource_version;
    let (n_before, m_before) = (
        resource_version("policy-n").await,
        resource_version("policy-m").await,
    );

    // The publisher's next revision moves stable to 1.8.2; it reaches the
    // site only as a bundle pushed into B, with A down.
    let next_digest = tokio::task::block_in_place(|| carry(&next, "next", &mut || a.stop()));
    wait_status(&env, "auto", "Auto follows the channel", |s| {
        s.healthy == Some(true) && s.version.as_deref() == Some("1.8.2")
    })
    .await;
    let n = wait_status(&env, "n", "the update reported", |s| {
        condition_of(s, UPDATE_AVAILABLE).0 == "True"
    })
    .await;
    assert_eq!(n.version.as_deref(), Some("1.7.0"));
    assert_eq!(n.available_version.as_deref(), Some("1.8.2"));
    let digest = plugins
        .get("ne-py")
        .await
        .unwrap()
        .status
        .unwrap()
        .digest
        .unwrap();
    assert_eq!(n.available_from.as_deref(), Some(digest.as_str()));
    // The artifact the bundle carried, fetched from the mirror.
    let fetched = plugins
        .get("ne-py")
        .await
        .unwrap()
        .status
        .unwrap()
        .fetched_from;
    assert_eq!(
        fetched.as_deref(),
        Some(format!("oci://{}/mirror/capstan/ne-py@{next_digest}", b.host).as_str())
    );
    assert!(
        condition_of(&n, UPDATE_AVAILABLE)
            .2
            .contains("set spec.version to 1.8.2"),
        "{n:?}"
    );
    let m = wait_status(&env, "m", "the update shown", |s| {
        s.available_version.as_deref() == Some("1.8.2")
    })
    .await;
    assert_eq!(m.version.as_deref(), Some("1.7.0"));
    assert_eq!(
        condition_of(&m, UPDATE_AVAILABLE).0,
        "",
        "Manual sets no condition"
    );
    let listed = updates(&env, &[]);
    for row in [
        "default    m     Manual  stable   1.7.0    1.8.2",
        "default    n     Notify  stable   1.7.0    1.8.2",
    ] {
        assert!(listed.contains(row), "{listed}");
    }

    // Five resyncs: one Event, nothing of n's or m's objects written.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), NS)
        .list(
            &kube::api::ListParams::default()
                .fields("involvedObject.name=n,reason=UpdateAvailable"),
        )
        .await
        .unwrap();
    // An Event repeated is one object with a count (or a series).
    let emitted: i32 = events
        .items
        .iter()
        .map(|e| {
            e.count
                .unwrap_or(1)
                .max(e.series.as_ref().and_then(|s| s.count).unwrap_or(1))
        })
        .sum();
    assert_eq!(emitted, 1, "one Event for 1.8.2: {:?}", events.items);
    assert_eq!(resource_version("policy-n").await, n_before);
    assert_eq!(resource_version("policy-m").await, m_before);

    // Setting spec.version applies it and clears the condition.
    patch_spec(&env, "n", json!({"version": "1.8.2"})).await;
    let n = wait_status(&env, "n", "healthy at 1.8.2", |s| {
        s.healthy == Some(true) && s.version.as_deref() == Some("1.8.2")
    })
    .await;
    assert_eq!(condition_of(&n, UPDATE_AVAILABLE).0, "False", "{n:?}");
    let listed = updates(&env, &["-o", "json"]);
    let lines: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["m"], "{listed}");
}
