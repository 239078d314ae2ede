//! Plugin canaries (`spec.rollout.strategy: Canary`) on a real
//! kube-apiserver, a real OCI registry and the sim cloud: a signed new
//! revision pushed under the same tag serves a share of the Machines first;
//! a canary the cloud fails (by its User-Agent) is rolled back with its
//! numbers, having reached at most its share of the Machines; a healthy one
//! is promoted step by step, survives a controller restart mid-trial
//! without a double advance, and `capstan plugin abort` ends one by hand.
//! Shadow steps for every world (provider `get`, addon renders that
//! differ, updater `can-update`, bootstrap `render`), a progress deadline,
//! and addon, updater and bootstrap canaries.

use capstan_api::{CanaryPhase, Machine, MachineDeployment, Plugin, PluginRollout};
use capstan_controllers::plugin::{READY, UP_TO_DATE};
use capstan_controllers::{Options, Providers};
use capstan_e2e::cli::{key_pair, ok, with_manifest};
use capstan_e2e::env::{Env, eventually, sample_deployment, sim_plugin_spec};
use capstan_e2e::plugin;
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::Faults;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::path::{Path, PathBuf};
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

/// A registry holding two signed revisions of the sim provider (0.1.0 and
/// 0.1.1, same capabilities), and what the host needs to trust them.
struct Published {
    registry: Registry,
    dir: PathBuf,
    public: PathBuf,
    key: String,
    repo: String,
    v2_path: PathBuf,
    v1_digest: String,
    v2_digest: String,
}

fn publish() -> Published {
    publish_plugin("sim_provider", "sim-provider")
}

/// The same for the plugin built as `stem` from `plugins/SAMPLE`.
fn publish_plugin(stem: &str, sample: &str) -> Published {
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let dir = registry.scratch().to_path_buf();
    let (key, public) = key_pair(&dir, "publisher");
    let key = key.to_str().unwrap().to_string();
    let repo = format!("oci://{}/capstan/{sample}", registry.host);
    let v1_bytes = std::fs::read(plugin(stem)).unwrap();
    let manifest = std::fs::read_to_string(
        capstan_e2e::workspace_root().join(format!("plugins/{sample}/capstan-plugin.json")),
    )
    .unwrap();
    let next = manifest.replace("\"version\": \"0.1.0\"", "\"version\": \"0.1.1\"");
    assert_ne!(next, manifest, "the sample's version moved");
    let v2_bytes = with_manifest(&v1_bytes, &next);
    let (v1_path, v2_path) = (dir.join("v1.wasm"), dir.join("v2.wasm"));
    std::fs::write(&v1_path, &v1_bytes).unwrap();
    std::fs::write(&v2_path, &v2_bytes).unwrap();
    let tag = format!("{repo}:stable");
    ok(&["plugin", "push", v1_path.to_str().unwrap(), &tag]);
    ok(&["plugin", "sign", &tag, "--key", &key]);
    Published {
        v1_digest: capstan_runtime::digest(&v1_bytes),
        v2_digest: capstan_runtime::digest(&v2_bytes),
        registry,
        dir,
        public,
        key,
        repo,
        v2_path,
    }
}

impl Published {
    /// Move `stable` to 0.1.1, signed; its manifest digest.
    fn move_tag_to_v2(&self) -> String {
        let tag = format!("{}:stable", self.repo);
        let pushed = ok(&["plugin", "push", self.v2_path.to_str().unwrap(), &tag]);
        ok(&["plugin", "sign", &tag, "--key", &self.key]);
        pushed.trim().to_string()
    }

    /// The host's OCI cache for this registry.
    fn cache(&self) -> PathBuf {
        self.dir.join("oci-cache")
    }

    fn options(&self, cache: &Path) -> Options {
        let prefix = format!("oci://{}/capstan/", self.registry.host);
        Options {
            poll: Duration::from_millis(250),
            // Machines are observed (`get`) every second: a window of a few
            // seconds holds enough calls to judge.
            resync: Duration::from_secs(1),
            supply: Some(std::sync::Arc::new(crate::oci_plugins::supply(
                cache,
                capstan_e2e::cli::publisher_policy(&prefix, &self.public),
            ))),
            ..Options::default()
        }
    }
}

/// The control plane and the sim cloud, the sim provider published (0.1.0
/// on `stable`), a Plugin `name` with this rollout serving it, and the
/// controllers running.
async fn canary_env(name: &str, rollout: serde_json::Value) -> (Env, Published) {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    let published = publish();
    create_plugin(&env, &published, name, rollout).await;
    env.start_controllers(Providers::default(), published.options(&published.cache()))
        .await;
    (env, published)
}

/// `capstan-plugin/NAME@sha256:<12 hex>`: how the host names a revision in
/// the User-Agent of its requests.
fn agent(name: &str, digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    format!("capstan-plugin/{name}@sha256:{}", &hex[..12])
}

async fn create_plugin(env: &Env, p: &Published, name: &str, rollout: serde_json::Value) {
    let mut spec = sim_plugin_spec(&format!("{}:stable", p.repo));
    spec.verification = Some(capstan_e2e::cli::publisher_verification(&p.public));
    spec.rollout = Some(serde_json::from_value::<PluginRollout>(rollout).unwrap());
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new(name, spec))
        .await
        .unwrap();
}

async fn plugin_now(env: &Env, name: &str) -> Plugin {
    Api::<Plugin>::all(env.client.clone())
        .get(name)
        .await
        .unwrap()
}

async fn canary_phase(env: &Env, name: &str, phase: CanaryPhase) -> Plugin {
    let last = std::sync::Mutex::new(String::new());
    let found = capstan_e2e::env::poll_until(LONG, async || {
        let p = plugin_now(env, name).await;
        let canary = p.status.as_ref()?.canary.clone();
        *last.lock().unwrap() = format!("{canary:?}");
        (canary?.phase == phase).then_some(p)
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "plugin {name}: canary {phase:?} not reached in {LONG:?}; last: {}",
            last.lock().unwrap()
        )
    })
}

async fn machines(env: &Env) -> Vec<Machine> {
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
}

/// Every Machine Ready, and last served by the revision with `digest`.
async fn all_ready_on(env: &Env, count: usize, digest: &str) {
    let what = format!("{count} Machines Ready and served by {digest}");
    eventually(&what, LONG, async || {
        let ms = machines(env).await;
        let ok = ms.len() == count
            && ms.iter().all(|m| {
                let s = m.status.as_ref();
                s.is_some_and(|s| {
                    capstan_api::is_true(&s.conditions, "Ready")
                        && s.plugin_digest.as_deref() == Some(digest)
                })
            });
        ok.then_some(())
    })
    .await;
}

fn event_reasons(env: &Env, name: &str) -> Vec<(String, String)> {
    let out = env
        .control_plane
        .kubectl(&["get", "events", "-A", "-o", "json"], None)
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["kind"] == "Plugin" && e["involvedObject"]["name"] == name)
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn deploy(env: &Env, name: &str, plugin: &str, replicas: i32) {
    let md = sample_deployment(name, plugin, &env.cloud.url(), replicas, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_the_cloud_fails_is_rolled_back_having_reached_only_its_share() {
    let name = "canary-sim";
    let (mut env, published) = canary_env(
        name,
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 50, "durationSeconds": 6}, {"weight": 100, "durationSeconds": 6}],
            "analysis": {"minSamples": 3}
        }),
    )
    .await;
    deploy(&env, "canary-pool", name, 4).await;
    all_ready_on(&env, 4, &published.v1_digest).await;

    // The cloud fails every request of the coming revision.
    let canary_agent = agent(name, &published.v2_digest);
    env.cloud.set_faults(Faults {
        fail_user_agent: Some(canary_agent.clone()),
        ..Faults::default()
    });
    let v2_manifest = published.move_tag_to_v2();
    let p = canary_phase(&env, name, CanaryPhase::RolledBack).await;
    let s = p.status.clone().unwrap();
    let canary = s.canary.clone().unwrap();
    assert_eq!(canary.digest, published.v2_digest);
    assert_eq!((canary.weight, canary.objects), (0, 0));
    let failed = canary.windows.last().expect("a judged window");
    assert_eq!(failed.verdict, "Fail", "{canary:?}");
    assert_eq!(failed.weight, 50);
    assert!(failed.canary.calls >= 3, "{failed:?}");
    assert_eq!(failed.canary.errors, failed.canary.calls, "{failed:?}");
    assert_eq!(failed.stable.errors, 0, "{failed:?}");
    assert!(
        failed.reason.starts_with(&format!(
            "canary: {0} of {0} calls failed (100.0%), over the maximum 10%",
            failed.canary.calls
        )),
        "{failed:?}"
    );
    assert_eq!(s.rejected, vec![v2_manifest.clone()]);
    // The stable revision kept serving; the spec was never rewritten.
    assert_eq!(s.digest.as_deref(), Some(published.v1_digest.as_str()));
    assert_eq!(p.spec.source, format!("{}:stable", published.repo));
    let up_to_date = capstan_api::condition(&s.conditions, UP_TO_DATE).unwrap();
    assert_eq!(
        (up_to_date.status.as_str(), up_to_date.reason.as_str()),
        ("False", "CanaryRolledBack")
    );
    assert!(capstan_api::is_true(&s.conditions, READY));

    // At most ⌈50% × 4⌉ = 2 Machines ever reached the cloud through it.
    let stats = env.cloud.stats();
    let reached = stats
        .client_tokens_by_user_agent
        .get(&canary_agent)
        .cloned()
        .unwrap_or_default();
    assert!(
        (1..=2).contains(&reached.len()),
        "machines the canary reached: {reached:?}"
    );
    // Every Machine ends Ready on the stable digest, and the canary's
    // requests stop.
    all_ready_on(&env, 4, &published.v1_digest).await;
    let requests = env.cloud.stats().user_agents.get(&canary_agent).copied();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.cloud.stats().user_agents.get(&canary_agent).copied(),
        requests,
        "the canary's request count stopped growing"
    );
    // Call metrics tell the two revisions apart (a bounded label).
    let metrics = env.metrics.encode();
    let failed_canary_calls = metrics.lines().any(|l| {
        l.starts_with("capstan_plugin_call_duration_seconds_count{")
            && l.contains(&format!("plugin=\"{name}\""))
            && l.contains("revision=\"canary\"")
            && l.contains("result=\"transient\"")
    });
    assert!(failed_canary_calls, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("revision=\"stable\"") && l.contains("result=\"ok\"")),
        "{metrics}"
    );
    let events = event_reasons(&env, name);
    for reason in ["CanaryStarted", "CanaryWindowFailed", "CanaryRolledBack"] {
        assert!(
            events.iter().any(|(r, _)| r == reason),
            "{reason}: {events:?}"
        );
    }
    let listed = env
        .control_plane
        .kubectl(&["get", "plugins", name], None)
        .unwrap();
    assert!(
        listed.contains("CANARY") && listed.contains("RolledBack"),
        "{listed}"
    );
    println!(
        "canary rolled back: window {:?}; machines reached through it: {}; requests with its User-Agent: {:?}; {}",
        failed.canary,
        reached.len(),
        requests,
        failed.reason
    );

    // Never retried while the tag names the same digest.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = plugin_now(&env, name).await;
    assert_eq!(
        again.status.unwrap().canary.unwrap().phase,
        CanaryPhase::RolledBack
    );
    drop(published);
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_that_cannot_be_judged_is_rolled_back_at_its_progress_deadline() {
    let name = "canary-late";
    let (mut env, published) = canary_env(
        name,
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 50, "durationSeconds": 3}],
            // Never enough calls to judge: every window is inconclusive,
            // it pauses after two, and the deadline ends the wait.
            "analysis": {"minSamples": 100000, "inconclusiveLimit": 1, "progressDeadlineSeconds": 8}
        }),
    )
    .await;
    deploy(&env, "late-pool", name, 2).await;
    all_ready_on(&env, 2, &published.v1_digest).await;
    let v2_manifest = published.move_tag_to_v2();
    canary_phase(&env, name, CanaryPhase::Paused).await;
    let p = canary_phase(&env, name, CanaryPhase::RolledBack).await;
    let s = p.status.clone().unwrap();
    let c = s.canary.clone().unwrap();
    assert!(
        c.windows.len() >= 3 && c.windows.iter().all(|w| w.verdict == "Inconclusive"),
        "{c:?}"
    );
    let why = c.message.clone().unwrap_or_default();
    assert!(
        why.starts_with("step 1 made no progress for ")
            && why.contains("past progressDeadlineSeconds 8")
            && why.contains("paused"),
        "{why}"
    );
    assert_eq!(s.rejected, vec![v2_manifest]);
    let events = event_reasons(&env, name);
    for reason in [
        "CanaryPaused",
        "CanaryProgressDeadlineExceeded",
        "CanaryRolledBack",
    ] {
        assert!(
            events.iter().any(|(r, _)| r == reason),
            "{reason}: {events:?}"
        );
    }
    all_ready_on(&env, 2, &published.v1_digest).await;
    println!("canary past its deadline: {why}");
    drop(published);
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_healthy_canary_is_promoted_step_by_step_across_restarts() {
    let name = "canary-ok";
    let (mut env, mut published) = canary_env(
        name,
        serde_json::json!({
            "strategy": "Canary",
            "steps": [
                {"weight": 25, "durationSeconds": 5},
                {"weight": 50, "durationSeconds": 8},
                {"weight": 100, "durationSeconds": 4}
            ],
            "analysis": {"minSamples": 3},
            "revisionHistoryLimit": 2
        }),
    )
    .await;
    let cache = published.cache();
    deploy(&env, "ok-pool", name, 4).await;
    all_ready_on(&env, 4, &published.v1_digest).await;

    let v2_manifest = published.move_tag_to_v2();
    // Step 2 (50%): the first window passed. Restart the controllers
    // mid-step: the trial resumes at the same step.
    let at_step_two = eventually("the canary at step 2", LONG, async || {
        let c = plugin_now(&env, name).await.status?.canary?;
        (c.step == 1 && c.phase == CanaryPhase::Progressing).then_some(c)
    })
    .await;
    assert_eq!(at_step_two.weight, 50);
    assert_eq!(at_step_two.windows.len(), 1, "{at_step_two:?}");
    assert_eq!(at_step_two.windows[0].verdict, "Pass");
    env.stop_controllers().await;
    env.start_controllers(Providers::default(), published.options(&cache))
        .await;
    let p = canary_phase(&env, name, CanaryPhase::Promoted).await;
    let s = p.status.clone().unwrap();
    let canary = s.canary.clone().unwrap();
    let steps: Vec<(u32, &str)> = canary
        .windows
        .iter()
        .map(|w| (w.weight, w.verdict.as_str()))
        .collect();
    // One pass per step; the restart neither skipped nor repeated one.
    assert_eq!(
        steps,
        vec![(25, "Pass"), (50, "Pass"), (100, "Pass")],
        "{canary:?}"
    );
    assert_eq!(s.digest.as_deref(), Some(published.v2_digest.as_str()));
    assert_eq!(s.version.as_deref(), Some("0.1.1"));
    let v1_source = s.previous_source.clone().expect("0.1.0 served before");
    assert!(v1_source.starts_with(&format!("{}@sha256:", published.repo)));
    assert_eq!(s.history, vec![v1_source.clone()]);
    assert_eq!(
        s.resolved_source.as_deref(),
        Some(format!("{}@{v2_manifest}", published.repo).as_str())
    );
    all_ready_on(&env, 4, &published.v2_digest).await;

    // An unsigned revision moves the tag and the controllers restart: the
    // last promoted revision serves, and the unsigned one is refused.
    let v3_path = published.dir.join("v3.wasm");
    std::fs::write(
        &v3_path,
        capstan_e2e::cli::padded(&std::fs::read(&published.v2_path).unwrap(), "v3", 32),
    )
    .unwrap();
    let tag = format!("{}:stable", published.repo);
    ok(&["plugin", "push", v3_path.to_str().unwrap(), &tag]);
    env.stop_controllers().await;
    env.start_controllers(Providers::default(), published.options(&cache))
        .await;
    let refused = eventually("the unsigned revision refused", LONG, async || {
        let p = plugin_now(&env, name).await;
        let s = p.status.clone()?;
        let c = capstan_api::condition(&s.conditions, UP_TO_DATE)?;
        (c.reason == "VerificationFailed").then_some(p)
    })
    .await;
    let s = refused.status.unwrap();
    assert_eq!(s.digest.as_deref(), Some(published.v2_digest.as_str()));
    assert!(capstan_api::is_true(&s.conditions, READY));
    all_ready_on(&env, 4, &published.v2_digest).await;

    // Pinning back to 0.1.0 with the registry stopped: its canary starts
    // from the caches (no download), and `capstan plugin abort` ends it.
    published.registry.stop();
    Api::<Plugin>::all(env.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"source": v1_source}})),
        )
        .await
        .unwrap();
    let pinned_back = eventually("a canary of 0.1.0 from the caches", LONG, async || {
        let c = plugin_now(&env, name).await.status?.canary?;
        (c.digest == published.v1_digest && c.phase == CanaryPhase::Progressing).then_some(c)
    })
    .await;
    assert_eq!(pinned_back.version.as_deref(), Some("0.1.0"));
    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let out = ok(&[
        "plugin",
        "abort",
        name,
        "--kubeconfig",
        &kubeconfig,
        "--timeout",
        "60s",
    ]);
    assert!(out.contains("RolledBack"), "{out}");
    let p = plugin_now(&env, name).await;
    let s = p.status.unwrap();
    assert_eq!(s.digest.as_deref(), Some(published.v2_digest.as_str()));
    assert!(
        s.canary
            .unwrap()
            .message
            .unwrap_or_default()
            .contains("aborted by hand"),
    );
    let refused =
        capstan_e2e::cli::capstan(&["plugin", "promote", name, "--kubeconfig", &kubeconfig]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("is already RolledBack; nothing to promote"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let events = event_reasons(&env, name);
    let passed = events
        .iter()
        .filter(|(r, _)| r == "CanaryWindowPassed")
        .count();
    assert!(passed >= 3, "{events:?}");
    assert!(
        events.iter().any(|(r, _)| r == "CanaryPromoted"),
        "{events:?}"
    );
    env.stop_controllers().await;
}

/// The digest each Machine of deployment `md` was last served by (two
/// Machines each).
async fn digests_of(env: &Env, md: &str) -> Vec<Option<String>> {
    let of: Vec<Option<String>> = machines(env)
        .await
        .into_iter()
        .filter(|m| {
            m.labels()
                .get("capstan.dev/deployment-name")
                .map(String::as_str)
                == Some(md)
        })
        .map(|m| m.status.and_then(|s| s.plugin_digest))
        .collect();
    assert_eq!(of.len(), 2, "machines of {md}: {of:?}");
    of
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shadow_step_a_selected_deployment_and_an_outage_that_pauses_instead_of_rolling_back() {
    let name = "canary-sel";
    let (mut env, published) = canary_env(
        name,
        serde_json::json!({
        "strategy": "Canary",
        "steps": [{"shadow": true, "durationSeconds": 4}, {"weight": 100, "durationSeconds": 6}],
        "selector": {"matchLabels": {"capstan.dev/deployment-name": "picked"}},
        // The outage below starts a little into a window: a wide
        // allowance over the stable ratio keeps the verdict about the
        // outage, not about which calls fell before it.
        "analysis": {"minSamples": 3, "inconclusiveLimit": 0, "maxErrorPercentOverStable": 50}
    }),
    )
    .await;
    deploy(&env, "picked", name, 2).await;
    deploy(&env, "other", name, 2).await;
    all_ready_on(&env, 4, &published.v1_digest).await;
    published.move_tag_to_v2();

    // Shadow: the canary serves no Machine, but sees their `get` calls.
    let shadow = canary_phase(&env, name, CanaryPhase::Shadow).await;
    let c = shadow.status.unwrap().canary.unwrap();
    assert_eq!((c.weight, c.objects), (0, 0));
    let canary_agent = agent(name, &published.v2_digest);
    let mirrored = eventually("mirrored calls from the canary", LONG, async || {
        let stats = env.cloud.stats();
        let reached = stats.client_tokens_by_user_agent.get(&canary_agent)?.len();
        (reached == 4).then_some(reached)
    })
    .await;
    assert_eq!(mirrored, 4, "shadowing mirrors every Machine's get");
    for md in ["picked", "other"] {
        assert!(
            digests_of(&env, md)
                .await
                .iter()
                .all(|d| d.as_deref() == Some(published.v1_digest.as_str())),
            "no Machine is served by a shadow"
        );
    }

    // The shadow window passes: the selected deployment's Machines only
    // move to the canary.
    let second = eventually("step 2", LONG, async || {
        let c = plugin_now(&env, name).await.status?.canary?;
        (c.step == 1 && c.phase == CanaryPhase::Progressing).then_some(c)
    })
    .await;
    assert_eq!(second.windows[0].verdict, "Pass", "{second:?}");
    assert_eq!(second.objects, 2, "{second:?}");
    eventually("picked on the canary, other on stable", LONG, async || {
        let picked = digests_of(&env, "picked").await;
        let other = digests_of(&env, "other").await;
        (picked
            .iter()
            .all(|d| d.as_deref() == Some(published.v2_digest.as_str()))
            && other
                .iter()
                .all(|d| d.as_deref() == Some(published.v1_digest.as_str())))
        .then_some(())
    })
    .await;

    // A cloud-wide outage: both revisions fail alike, so the window is
    // inconclusive and the canary pauses for a human instead of rolling back.
    env.cloud.set_faults(Faults {
        error_rate: 1.0,
        ..Faults::default()
    });
    let paused = canary_phase(&env, name, CanaryPhase::Paused).await;
    let c = paused.status.clone().unwrap().canary.unwrap();
    let window = c.windows.last().unwrap();
    assert_eq!(window.verdict, "Inconclusive", "{c:?}");
    assert!(window.reason.contains("cloud-wide"), "{window:?}");
    assert!(paused.status.unwrap().rejected.is_empty());
    env.cloud.set_faults(Faults::default());

    let kubeconfig = env.control_plane.kubeconfig().display().to_string();
    let out = ok(&["plugin", "promote", name, "--kubeconfig", &kubeconfig]);
    assert!(out.contains("Promoted"), "{out}");
    all_ready_on(&env, 4, &published.v2_digest).await;
    let events = event_reasons(&env, name);
    assert!(
        events.iter().any(|(r, _)| r == "CanaryPaused"),
        "{events:?}"
    );
    drop(published);
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machines_that_never_join_under_a_canary_roll_it_back_through_the_health_check() {
    let name = "canary-join";
    let (mut env, published) = canary_env(
        name,
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 100, "durationSeconds": 20}],
            "analysis": {"minSamples": 1}
        }),
    )
    .await;
    deploy(&env, "join-pool", name, 2).await;
    let check: capstan_api::MachineHealthCheck = serde_json::from_value(serde_json::json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": { "name": "join-pool", "namespace": NS },
        "spec": {
            "selector": { "matchLabels": { "capstan.dev/pool": "join-pool" } },
            "checks": { "nodeStartupTimeoutSeconds": 4 },
        },
    }))
    .unwrap();
    Api::<capstan_api::MachineHealthCheck>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &check)
        .await
        .unwrap();
    all_ready_on(&env, 2, &published.v1_digest).await;

    // Instances the canary launches never join.
    let canary_agent = agent(name, &published.v2_digest);
    env.cloud.set_faults(Faults {
        unjoined_user_agent: Some(canary_agent.clone()),
        ..Faults::default()
    });
    published.move_tag_to_v2();
    canary_phase(&env, name, CanaryPhase::Progressing).await;
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "join-pool",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();

    let p = canary_phase(&env, name, CanaryPhase::RolledBack).await;
    let c = p.status.unwrap().canary.unwrap();
    let failed = c.windows.last().unwrap();
    assert_eq!(failed.verdict, "Fail", "{c:?}");
    assert!(
        failed.canary.unhealthy >= 1
            && failed
                .reason
                .contains("objects it served were unhealthy, over the maximum 0"),
        "{failed:?}"
    );
    // The new Machines waited for the canary's decision: they were created
    // through it, not by the stable revision behind its back.
    let launched_by_canary = env
        .cloud
        .stats()
        .client_tokens_by_user_agent
        .get(&canary_agent)
        .map_or(0, |t| t.len());
    assert!(launched_by_canary >= 3, "{launched_by_canary}");
    // Remediation replaces the Machines that never joined, through the
    // stable revision: every Machine ends Ready on it.
    all_ready_on(&env, 4, &published.v1_digest).await;
    println!(
        "never-joined canary rolled back: {}; machines it reached: {launched_by_canary}",
        failed.reason
    );
    drop(published);
    env.stop_controllers().await;
}

/// Four Addons of one addon Plugin (the Python node-exporter sample,
/// signed, in a real registry) healthy on its first revision, in four
/// namespaces on two Nodes, with `rollout`; and a next revision, built but
/// not pushed yet, that renders another image the cluster cannot run.
struct AddonCanary {
    env: Env,
    _registry: Registry,
    _dir: tempfile::TempDir,
    key: String,
    tag: String,
    next: PathBuf,
    v1_digest: String,
    v2_digest: String,
    namespaces: [&'static str; 4],
}

impl AddonCanary {
    async fn start(name: &str, prefix: &'static str, rollout: serde_json::Value) -> AddonCanary {
        crate::logs();
        let dir = tempfile::tempdir().unwrap();
        // The next revision renders another image; the cluster cannot run it
        // (its pods never get ready).
        let next = tokio::task::block_in_place(|| {
            crate::addon_order::exporter_variant(
                dir.path(),
                &[(
                    "quay.io/prometheus/node-exporter:v",
                    "quay.io/prometheus/node-exporter-next:v",
                )],
            )
        });
        let registry = Registry::start(RegistryOptions::default()).expect("registry");
        let (key, public) = key_pair(dir.path(), "publisher");
        let key = key.to_str().unwrap().to_string();
        let tag = format!("oci://{}/capstan/{name}:stable", registry.host);
        let first = capstan_e2e::plugin("node_exporter_py");
        ok(&["plugin", "push", first.to_str().unwrap(), &tag]);
        ok(&["plugin", "sign", &tag, "--key", &key]);
        let (v1_digest, v2_digest) = (
            capstan_runtime::digest(&std::fs::read(&first).unwrap()),
            capstan_runtime::digest(&std::fs::read(&next).unwrap()),
        );

        let mut env = Env::start(Faults::default()).await.expect("env");
        env.add_nodes(2).await.expect("two Nodes");
        env.cloud
            .kubelet()
            .unwrap()
            .set_image_ready("node-exporter-next", false);
        let namespaces = ["a", "b", "c", "d"].map(|n| &*format!("{prefix}-{n}").leak());
        let spec = capstan_api::PluginSpec {
            source: tag.clone(),
            grants: capstan_api::PluginGrants {
                objects: crate::addon_order::exporter_grants(&namespaces),
                pod_security: Some(capstan_api::PodSecurityLevel::Privileged),
                ..Default::default()
            },
            rollout: Some(serde_json::from_value(rollout).unwrap()),
            ..Default::default()
        };
        Api::<Plugin>::all(env.client.clone())
            .create(&PostParams::default(), &Plugin::new(name, spec))
            .await
            .unwrap();
        let prefix = format!("oci://{}/capstan/", registry.host);
        env.start_controllers(
            Providers::default(),
            Options {
                poll: Duration::from_millis(250),
                resync: Duration::from_secs(1),
                supply: Some(std::sync::Arc::new(crate::oci_plugins::supply(
                    &dir.path().join("oci-cache"),
                    capstan_e2e::cli::publisher_policy(&prefix, &public),
                ))),
                ..Options::default()
            },
        )
        .await;
        for (i, ns) in namespaces.iter().enumerate() {
            let addon = crate::addons::addon(
                ns,
                serde_json::json!({"plugin": name, "version": "1.7.0",
                                   "config": {"namespace": ns, "port": 9141 + i}}),
            );
            crate::addons::create(&env, &addon).await;
        }
        let started = AddonCanary {
            env,
            _registry: registry,
            _dir: dir,
            key,
            tag,
            next,
            v1_digest,
            v2_digest,
            namespaces,
        };
        started
            .all_healthy_on_v1("healthy on the first revision")
            .await;
        started
    }

    /// Every Addon healthy, last served by the first revision.
    async fn all_healthy_on_v1(&self, what: &str) {
        for ns in self.namespaces {
            crate::addons::wait_status(&self.env, ns, what, |s| {
                s.healthy == Some(true)
                    && s.plugin_digest.as_deref() == Some(self.v1_digest.as_str())
            })
            .await;
        }
    }

    /// Each Addon's DaemonSet's `resourceVersion`: unchanged, not written.
    async fn daemonsets(&self) -> Vec<String> {
        let mut versions = vec![];
        for ns in self.namespaces {
            let ds = Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(
                self.env.client.clone(),
                ns,
            )
            .get("node-exporter")
            .await
            .unwrap();
            versions.push(ds.metadata.resource_version.unwrap());
        }
        versions
    }

    /// Push and sign the next revision under the same tag.
    fn push_next(&self) {
        ok(&["plugin", "push", self.next.to_str().unwrap(), &self.tag]);
        ok(&["plugin", "sign", &self.tag, "--key", &self.key]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_addon_canary_whose_pods_never_get_ready_is_rolled_back_and_the_rest_see_no_writes() {
    let name = "ne-canary";
    let trial = AddonCanary::start(
        name,
        "canary",
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 50, "durationSeconds": 15}],
            "analysis": {"minSamples": 1}
        }),
    )
    .await;
    let env = &trial.env;
    let before = trial.daemonsets().await;

    trial.push_next();
    let p = canary_phase(env, name, CanaryPhase::RolledBack).await;
    let c = p.status.clone().unwrap().canary.unwrap();
    assert_eq!(c.digest, trial.v2_digest);
    let failed = c.windows.last().unwrap();
    assert_eq!(failed.verdict, "Fail", "{c:?}");
    assert_eq!(failed.canary.objects, 2, "⌈50% × 4⌉ Addons: {failed:?}");
    assert!(
        failed.canary.calls >= 1,
        "its render and assess calls: {failed:?}"
    );
    assert!(failed.canary.unhealthy >= 1, "{failed:?}");
    assert!(
        failed.reason.contains("objects it served were unhealthy"),
        "{failed:?}"
    );
    // Every Addon ends healthy on the first revision again.
    trial
        .all_healthy_on_v1("healthy on the first revision again")
        .await;
    // The two Addons outside the canary saw no write at all.
    let after = trial.daemonsets().await;
    let untouched = before.iter().zip(&after).filter(|(b, a)| b == a).count();
    assert_eq!(untouched, 2, "before {before:?}, after {after:?}");
    println!(
        "addon canary rolled back: {}; DaemonSets untouched: {untouched} of 4",
        failed.reason
    );
    let metrics = env.metrics.encode();
    assert!(
        metrics.lines().any(|l| l.contains(&format!("plugin=\"{name}\""))
            && l.contains("revision=\"canary\"")),
        "{metrics}"
    );
    let mut trial = trial;
    trial.env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_addon_canary_whose_shadow_renders_differ_is_rolled_back_having_written_nothing() {
    let name = "ne-shadow";
    let trial = AddonCanary::start(
        name,
        "shadow",
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"shadow": true, "durationSeconds": 8}, {"weight": 50, "durationSeconds": 30}],
            "analysis": {"minSamples": 2}
        }),
    )
    .await;
    let env = &trial.env;
    let before = trial.daemonsets().await;

    trial.push_next();
    let shadowing = canary_phase(env, name, CanaryPhase::Shadow).await;
    let message = capstan_api::condition(&shadowing.status.unwrap().conditions, UP_TO_DATE)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("versions, render and assess calls are mirrored"),
        "{message}"
    );
    let p = canary_phase(env, name, CanaryPhase::RolledBack).await;
    let c = p.status.clone().unwrap().canary.unwrap();
    assert_eq!(c.digest, trial.v2_digest);
    let failed = c.windows.last().unwrap();
    assert_eq!(
        (failed.step, failed.weight, failed.verdict.as_str()),
        (0, 0, "Fail"),
        "the shadow window: {c:?}"
    );
    assert_eq!(
        failed.canary.objects, 0,
        "a shadow serves nothing: {failed:?}"
    );
    // Each mirrored render differs (another image); `assess` of the same
    // observed objects agrees.
    assert!(
        failed.canary.errors >= 2 && failed.canary.errors < failed.canary.calls,
        "{failed:?}"
    );
    assert!(failed.reason.contains("calls failed"), "{failed:?}");
    // No Addon was ever served by the canary, and nothing was written.
    trial
        .all_healthy_on_v1("healthy on the first revision throughout")
        .await;
    assert_eq!(trial.daemonsets().await, before);
    let metrics = env.metrics.encode();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("capstan_plugin_call_duration_seconds_count{")
                && l.contains(&format!("plugin=\"{name}\""))
                && l.contains("revision=\"canary\"")
                && l.contains("function=\"render\"")
        ),
        "{metrics}"
    );
    println!(
        "addon shadow rolled back: {}; DaemonSets written: 0 of 4",
        failed.reason
    );
    let mut trial = trial;
    trial.env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_updater_canary_the_cloud_fails_is_rolled_back_and_stable_finishes_the_update() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    let published = publish_plugin("sim_updater", "sim-updater");
    let name = "upd-canary";
    create_plugin(
        &env,
        &published,
        name,
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 50, "durationSeconds": 10}],
            "analysis": {"minSamples": 1, "inconclusiveLimit": 20}
        }),
    )
    .await;
    env.start_controllers(Providers::default(), published.options(&published.cache()))
        .await;
    let mut md = sample_deployment(
        "upd-pool",
        capstan_e2e::env::SIM_PLUGIN,
        &env.cloud.url(),
        4,
        "v1.30.0",
    );
    // In place only: no surge machine.
    md.spec.rollout_strategy_mut().rolling_update = Some(capstan_api::RollingUpdate {
        max_surge: Some(capstan_api::IntOrString::Int(0)),
        max_unavailable: Some(capstan_api::IntOrString::Int(1)),
    });
    md.spec.rollout_strategy_mut().in_place = Some(capstan_api::InPlaceStrategy {
        updaters: Some(vec![name.to_string()]),
        fallback: capstan_api::InPlaceFallback::None,
    });
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    eventually("4 Machines Ready", LONG, async || {
        let ms = machines(&env).await;
        (ms.len() == 4
            && ms.iter().all(|m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| capstan_api::is_true(&s.conditions, "Ready"))
            }))
        .then_some(())
    })
    .await;
    let instances: std::collections::BTreeSet<String> = machines(&env)
        .await
        .iter()
        .filter_map(|m| m.status.as_ref()?.provider_id.clone())
        .collect();

    // The cloud fails the coming revision's requests.
    let canary_agent = agent(name, &published.v2_digest);
    env.cloud.set_faults(Faults {
        fail_user_agent: Some(canary_agent.clone()),
        ..Faults::default()
    });
    published.move_tag_to_v2();
    let serving = eventually("the canary serving 2 Machines", LONG, async || {
        let c = plugin_now(&env, name).await.status?.canary?;
        (c.phase == CanaryPhase::Progressing && c.objects == 2).then_some(c)
    })
    .await;
    assert_eq!(serving.weight, 50);
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "upd-pool",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
            ),
        )
        .await
        .unwrap();
    let p = canary_phase(&env, name, CanaryPhase::RolledBack).await;
    let c = p.status.unwrap().canary.unwrap();
    let failed = c.windows.last().unwrap();
    assert_eq!(failed.verdict, "Fail", "{c:?}");
    assert!(failed.canary.errors >= 1, "{failed:?}");
    let reached = env
        .cloud
        .stats()
        .client_tokens_by_user_agent
        .get(&canary_agent)
        .map_or(0, |t| t.len());
    assert!(
        (1..=2).contains(&reached),
        "machines the canary reached: {reached}"
    );
    // The stable revision finishes the update in place: same instances,
    // every Machine at the new version.
    eventually("4 Machines at v1.31.0, in place", LONG, async || {
        let ms = machines(&env).await;
        let ids: std::collections::BTreeSet<String> = ms
            .iter()
            .filter_map(|m| m.status.as_ref()?.provider_id.clone())
            .collect();
        (ms.len() == 4
            && ids == instances
            && ms.iter().all(|m| {
                m.spec.version.as_deref() == Some("v1.31.0")
                    && m.status
                        .as_ref()
                        .is_some_and(|s| capstan_api::is_true(&s.conditions, "Ready"))
            }))
        .then_some(())
    })
    .await;
    println!(
        "updater canary rolled back: {}; machines it reached: {reached}",
        failed.reason
    );
    drop(published);
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_updater_canary_shadows_can_update_and_never_updates_until_promoted() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    let published = publish_plugin("sim_updater", "sim-updater");
    let name = "upd-shadow";
    create_plugin(
        &env,
        &published,
        name,
        serde_json::json!({
            "strategy": "Canary",
            "steps": [{"shadow": true, "durationSeconds": 20}],
            "analysis": {"minSamples": 1}
        }),
    )
    .await;
    env.start_controllers(Providers::default(), published.options(&published.cache()))
        .await;
    let mut md = sample_deployment(
        "shadow-pool",
        capstan_e2e::env::SIM_PLUGIN,
        &env.cloud.url(),
        2,
        "v1.30.0",
    );
    md.spec.rollout_strategy_mut().rolling_update = Some(capstan_api::RollingUpdate {
        max_surge: Some(capstan_api::IntOrString::Int(0)),
        max_unavailable: Some(capstan_api::IntOrString::Int(1)),
    });
    md.spec.rollout_strategy_mut().in_place = Some(capstan_api::InPlaceStrategy {
        updaters: Some(vec![name.to_string()]),
        fallback: capstan_api::InPlaceFallback::None,
    });
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "shadow-pool", LONG).await;

    published.move_tag_to_v2();
    canary_phase(&env, name, CanaryPhase::Shadow).await;
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "shadow-pool",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}}),
            ),
        )
        .await
        .unwrap();
    // The serving revision updates both instances in place while the
    // canary is only asked `can-update`.
    eventually("both instances at v1.31.0", LONG, async || {
        let instances = env.cloud.instances();
        (instances.len() == 2
            && instances
                .iter()
                .all(|i| i.version.as_deref() == Some("v1.31.0") && i.update.is_none()))
        .then_some(())
    })
    .await;
    let stats = env.cloud.stats();
    let canary_agent = agent(name, &published.v2_digest);
    assert_eq!(
        stats.client_tokens_by_user_agent.get(&canary_agent),
        None,
        "the shadow reached no instance: {:?}",
        stats.client_tokens_by_user_agent
    );
    assert!(
        stats
            .client_tokens_by_user_agent
            .get(&agent(name, &published.v1_digest))
            .is_some_and(|t| t.len() == 2),
        "the serving revision updated both: {:?}",
        stats.client_tokens_by_user_agent
    );
    let p = canary_phase(&env, name, CanaryPhase::Promoted).await;
    let c = p.status.unwrap().canary.unwrap();
    let shadowed = c.windows.last().unwrap();
    assert_eq!(
        (shadowed.weight, shadowed.verdict.as_str()),
        (0, "Pass"),
        "{c:?}"
    );
    assert!(
        shadowed.canary.calls >= 2 && shadowed.canary.errors == 0,
        "both Machines' can-update, mirrored and the same: {shadowed:?}"
    );
    println!("updater shadow promoted: {}", shadowed.reason);
    drop(published);
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bootstrap_canary_renders_the_new_machines_data_and_is_promoted() {
    crate::logs();
    let mut options = capstan_e2e::env::EnvOptions::new(Faults {
        boot_latency_ms: 200,
        ..Faults::default()
    });
    // Instances join only with the data the bootstrap plugin rendered.
    options.kubelet.shared_identity_without_join_data = false;
    let mut env = Env::start_with(options).await.expect("env");
    let published = publish_plugin("kubeadm_bootstrap", "kubeadm-bootstrap");
    let name = "kb-canary";
    let mut spec = sim_plugin_spec(&format!("{}:stable", published.repo));
    spec.grants = Default::default();
    spec.verification = Some(capstan_e2e::cli::publisher_verification(&published.public));
    spec.rollout = Some(
        serde_json::from_value(serde_json::json!({
            "strategy": "Canary",
            "steps": [{"shadow": true, "durationSeconds": 10}, {"weight": 100, "durationSeconds": 10}],
            "analysis": {"minSamples": 1}
        }))
        .unwrap(),
    );
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new(name, spec))
        .await
        .unwrap();
    // As installed: its ServiceAccount, Capstan's own namespace.
    let config = capstan_e2e::install::controller_config(&env).await;
    env.start_controllers_as(
        config,
        Providers::default(),
        Options {
            secrets_namespace: Some(capstan_e2e::env::CAPSTAN_NAMESPACE.into()),
            ..published.options(&published.cache())
        },
    )
    .await;
    let mut md = sample_deployment(
        "kb-pool",
        capstan_e2e::env::SIM_PLUGIN,
        &env.cloud.url(),
        2,
        "v1.20.2",
    );
    md.spec.template.spec.bootstrap = Some(capstan_api::MachineBootstrap {
        plugin: Some(name.into()),
        config: Some(serde_json::json!({})),
        data_secret_name: None,
    });
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    env.wait_rolled_out(NS, "kb-pool", LONG).await;

    published.move_tag_to_v2();
    let scale = async |replicas: i32| {
        Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
            .patch(
                "kb-pool",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
            )
            .await
            .unwrap();
    };
    // Shadowing: the new Machine's data is rendered by both, compared, and
    // the serving revision's is used.
    canary_phase(&env, name, CanaryPhase::Shadow).await;
    scale(3).await;
    canary_phase(&env, name, CanaryPhase::Progressing).await;
    scale(4).await;
    let p = canary_phase(&env, name, CanaryPhase::Promoted).await;
    let c = p.status.clone().unwrap().canary.unwrap();
    let shadowed = &c.windows[0];
    assert_eq!(
        (shadowed.step, shadowed.weight, shadowed.verdict.as_str()),
        (0, 0, "Pass"),
        "{c:?}"
    );
    assert!(
        shadowed.canary.calls >= 1 && shadowed.canary.errors == 0,
        "the third Machine's data, rendered by both and the same: {shadowed:?}"
    );
    let passed = c.windows.last().unwrap();
    assert_eq!((passed.step, passed.verdict.as_str()), (1, "Pass"), "{c:?}");
    assert!(
        passed.canary.calls >= 1,
        "the fourth Machine's data, rendered by the canary: {passed:?}"
    );
    assert_eq!(
        p.status.unwrap().digest.as_deref(),
        Some(published.v2_digest.as_str())
    );
    env.wait_rolled_out(NS, "kb-pool", LONG).await;
    let joined = machines(&env).await;
    assert_eq!(joined.len(), 4);
    let metrics = env.metrics.encode();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("capstan_plugin_call_duration_seconds_count{")
                && l.contains(&format!("plugin=\"{name}\""))
                && l.contains("revision=\"canary\"")
                && l.contains("function=\"render\"")
        ),
        "{metrics}"
    );
    drop(published);
    env.stop_controllers().await;
}
