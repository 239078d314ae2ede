//! Day two as a kubectl or clusterctl user works, with the real `capstan`
//! binary against a real control plane and controllers running as the
//! ServiceAccount `capstan install` generates: `rollout status` waits and
//! fails for the right reasons, `pause` stops a rollout half way and
//! `resume` finishes it, `restart` replaces every machine once, `describe`
//! shows a rollout's tree with its one unhealthy Machine, and the real
//! `kubectl` finds and runs `kubectl capstan`.

use crate::rollback::{faults, set_version, start};
use capstan_api::MachineSet;
use capstan_e2e::cli::capstan;
use capstan_e2e::env::Env;
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};
use std::process::Output;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

/// `capstan ARGS --kubeconfig …` against the env's control plane.
fn run(env: &Env, args: &[&str]) -> Output {
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let mut all = args.to_vec();
    all.extend(["--kubeconfig", kubeconfig.as_str()]);
    capstan(&all)
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[track_caller]
fn succeeds(out: Output) -> String {
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[track_caller]
fn fails(out: Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Live machines: (name, version), sorted by name.
async fn machines(env: &Env) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = env
        .machines(NS)
        .await
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| (m.name_any(), m.spec.version.clone().unwrap_or_default()))
        .collect();
    v.sort();
    v
}

/// `rollout status` on a finished rollout exits 0; during a rollout whose
/// new machine never joins, `describe` shows the tree (the new set's
/// unhealthy Machine with what is wrong, the old set's three Machines as
/// one group) in text and JSON; and the waiting `rollout status` exits 1
/// naming the progress deadline when the deployment rolls itself back.
#[tokio::test(flavor = "multi_thread")]
async fn rollout_status_fails_on_an_automatic_rollback_and_describe_shows_the_stuck_machine() {
    let env = start(3, Some(json!({ "progressDeadlineSeconds": 20 }))).await;
    let done = succeeds(run(
        &env,
        &["rollout", "status", "md/pool", "--timeout", "30s"],
    ));
    assert!(
        done.contains("machinedeployment \"pool\" successfully rolled out"),
        "{done}"
    );

    env.cloud.set_faults(Faults {
        register_nodes: false,
        ..faults()
    });
    set_version(&env, "v1.31.0").await;
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let waiting = std::thread::spawn(move || {
        capstan(&[
            "rollout",
            "status",
            "md/pool",
            "--timeout",
            "80s",
            "--kubeconfig",
            &kubeconfig,
        ])
    });
    let stuck = env
        .eventually("a v1.31.0 machine waiting for its Node", LONG, async || {
            machines(&env)
                .await
                .into_iter()
                .find(|(_, v)| v == "v1.31.0")
                .map(|(name, _)| name)
        })
        .await;

    let tree = succeeds(run(&env, &["describe", "md/pool"]));
    println!("{tree}");
    let lines: Vec<&str> = tree.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("UP-TO-DATE"),
        "{tree}"
    );
    assert!(lines[1].starts_with("MachineDeployment/pool"), "{tree}");
    let sets: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("MachineSet/pool-"))
        .collect();
    assert_eq!(sets.len(), 2, "the new and the old set: {tree}");
    assert!(
        sets[0].starts_with("├─MachineSet/"),
        "newest revision first: {tree}"
    );
    let group = lines
        .iter()
        .find(|l| l.contains("3 Machines..."))
        .unwrap_or_else(|| panic!("the old set's machines grouped: {tree}"));
    assert!(group.contains("True"), "{tree}");
    let row = lines
        .iter()
        .find(|l| l.contains(&format!("Machine/{stuck}")))
        .unwrap_or_else(|| panic!("the stuck machine's row: {tree}"));
    assert!(
        !row.contains("True  True  True"),
        "the stuck machine is not healthy: {row}"
    );
    assert!(tree.contains("no Node yet"), "{tree}");
    assert!(
        tree.contains("plugin sim@sha256:"),
        "the serving revision: {tree}"
    );
    assert!(!tree.contains('\x1b'), "no colour off a terminal: {tree}");
    assert!(tree.contains("Events:"), "{tree}");

    let listed = succeeds(run(&env, &["describe", "md/pool", "--grouping=false"]));
    assert_eq!(
        listed
            .lines()
            .filter(|l| l.contains("─Machine/pool-"))
            .count(),
        4,
        "every machine on its own row: {listed}"
    );
    let json: Value =
        serde_json::from_str(&succeeds(run(&env, &["describe", "md/pool", "-o", "json"])))
            .expect("describe -o json is JSON");
    let stuck_row = json["tree"]["children"]
        .as_array()
        .expect("sets")
        .iter()
        .flat_map(|s| s["children"].as_array().cloned().unwrap_or_default())
        .find(|m| m["name"] == format!("Machine/{stuck}"))
        .expect("the stuck machine in JSON");
    let reason = stuck_row["reason"].as_str().unwrap_or_default();
    assert!(
        !reason.is_empty(),
        "what is wrong, as a condition reason: {stuck_row}"
    );
    assert!(
        tree.contains(reason),
        "the text names the same reason {reason:?}: {tree}"
    );
    let conditions = succeeds(run(
        &env,
        &[
            "describe",
            &format!("machine/{stuck}"),
            "--show-conditions",
            "all",
        ],
    ));
    assert!(
        conditions.contains("· Ready "),
        "every condition listed: {conditions}"
    );

    let out = tokio::task::spawn_blocking(move || waiting.join().expect("the thread"))
        .await
        .expect("join");
    let why = fails(out);
    assert!(why.contains("ProgressDeadlineExceeded"), "{why}");
    assert!(why.contains("rolled back automatically"), "{why}");
    let after = succeeds(run(&env, &["describe", "md/pool"]));
    let events = after.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("RolledBack") && events.contains("MachineDeployment/pool"),
        "the rollback's Event is listed: {after}"
    );
}

/// `pause` stops a rollout half way (and `rollout status` says so, exit 1),
/// `resume` finishes it; `restart` replaces every machine exactly once;
/// the real `kubectl` runs the binary as the plugin `kubectl capstan`.
#[tokio::test(flavor = "multi_thread")]
async fn pause_stops_a_rollout_half_way_resume_finishes_it_and_restart_replaces_each_machine_once()
{
    let env = start(3, None).await;
    set_version(&env, "v1.31.0").await;
    env.eventually("one machine on v1.31.0 and available", LONG, async || {
        let md = env.deployment(NS, "pool").await;
        let s = md.status.unwrap_or_default();
        (s.updated_replicas >= 1 && s.available_replicas >= 3).then_some(())
    })
    .await;
    let paused = succeeds(run(&env, &["rollout", "pause", "md/pool"]));
    assert_eq!(paused.trim(), "machinedeployment/pool paused");
    let again = succeeds(run(&env, &["rollout", "pause", "md/pool"]));
    assert_eq!(again.trim(), "machinedeployment/pool already paused");
    // Let a pass that started before the pause end, then nothing moves.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = machines(&env).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(machines(&env).await, held, "nothing moves while paused");
    let old = held.iter().filter(|(_, v)| v == "v1.30.0").count();
    assert!((1..3).contains(&old), "half way: {held:?}");
    let why = fails(run(
        &env,
        &["rollout", "status", "md/pool", "--timeout", "20s"],
    ));
    assert!(why.contains("DeploymentPaused"), "{why}");
    assert!(why.contains("capstan rollout resume md/pool"), "{why}");
    let refused = fails(run(&env, &["rollout", "restart", "md/pool"]));
    assert!(refused.contains("is paused; resume it first"), "{refused}");

    let resumed = succeeds(run(&env, &["rollout", "resume", "md/pool"]));
    assert_eq!(resumed.trim(), "machinedeployment/pool resumed");
    let progress = succeeds(run(
        &env,
        &["rollout", "status", "md/pool", "--timeout", "80s"],
    ));
    assert!(progress.contains("successfully rolled out"), "{progress}");
    let after_resume = machines(&env).await;
    assert!(
        after_resume.iter().all(|(_, v)| v == "v1.31.0"),
        "{after_resume:?}"
    );
    assert_eq!(after_resume.len(), 3);

    // Wait for old machines to be gone from the cloud, then count.
    env.eventually("three instances", LONG, async || {
        (env.cloud.stats().live_instances == 3).then_some(())
    })
    .await;
    let launched = env.cloud.stats().instances_launched;
    // The plugin binary as kubectl finds plugins: an executable named
    // kubectl-capstan on PATH.
    let plugins = tempfile::tempdir().expect("a temporary directory");
    std::os::unix::fs::symlink(
        capstan_e2e::env::capstan_bin().expect("the capstan binary"),
        plugins.path().join("kubectl-capstan"),
    )
    .expect("link kubectl-capstan");
    let kubectl = |args: &[&str]| {
        let path = format!(
            "{}:{}",
            plugins.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new(capstan_e2e::control_plane::bin_dir().join("kubectl"))
            .args(args)
            .arg(format!(
                "--kubeconfig={}",
                env.control_plane.kubeconfig().display()
            ))
            .env("PATH", path)
            .output()
            .expect("run kubectl");
        succeeds(out)
    };
    let restarted = kubectl(&["capstan", "rollout", "restart", "md/pool"]);
    assert_eq!(restarted.trim(), "machinedeployment/pool restarted");
    let status = kubectl(&["capstan", "rollout", "status", "md/pool", "--timeout=80s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
    let after_restart = machines(&env).await;
    assert_eq!(after_restart.len(), 3);
    for (name, _) in &after_restart {
        assert!(
            !after_resume.iter().any(|(n, _)| n == name),
            "{name} was not replaced: {after_restart:?}"
        );
    }
    env.eventually("three instances again", LONG, async || {
        (env.cloud.stats().live_instances == 3).then_some(())
    })
    .await;
    assert_eq!(
        env.cloud.stats().instances_launched,
        launched + 3,
        "each machine replaced exactly once"
    );
    let sets = Api::<MachineSet>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("list sets");
    let live: Vec<_> = sets.items.iter().filter(|s| s.spec.replicas > 0).collect();
    assert_eq!(live.len(), 1, "one set holds the machines");
    let listed = kubectl(&["plugin", "list"]);
    assert!(listed.contains("kubectl-capstan"), "{listed}");
}
