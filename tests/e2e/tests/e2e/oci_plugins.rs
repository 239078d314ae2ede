//! `Plugin` objects with `oci://` sources on a real kube-apiserver, against
//! real registries: verification before activation, grants that must cover
//! every declared capability, revision switches and rollback without a
//! restart (or a registry), the last activated revision restored after a
//! restart with the registry down, and the air gap: bundle from registry A, A
//! stopped, mirror into registry B, the host pulling from B and verifying
//! with the publisher's original key.

use capstan_api::{MachineDeployment, Plugin, is_true};
use capstan_controllers::plugin::{READY, Supply, UP_TO_DATE};
use capstan_controllers::{Options, Providers};
use capstan_e2e::cli::{key_pair, ok, with_manifest};
use capstan_e2e::env::{ControllerProcess, Env, eventually, sample_deployment, sim_plugin_spec};
use capstan_e2e::plugin;
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::Faults;
use capstan_registry::policy::TrustPolicy;
use capstan_registry::verify::Puller;
use capstan_registry::{Cache, Client, ClientOptions, Mirrors};
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::path::Path;
use std::time::Duration;

const NS: &str = "default";
const LONG: Duration = Duration::from_secs(90);

pub(crate) fn supply(cache: &Path, policy: TrustPolicy) -> Supply {
    Supply {
        puller: Puller {
            client: Client::new(ClientOptions::default()).unwrap(),
            cache: Some(Cache::open(cache).unwrap()),
            mirrors: Mirrors::default(),
        },
        policy: Some(policy),
    }
}

async fn plugin_status(env: &Env, name: &str) -> Plugin {
    Api::<Plugin>::all(env.client.clone())
        .get(name)
        .await
        .unwrap()
}

pub(crate) fn condition(p: &Plugin, kind: &str) -> Option<(String, String, String)> {
    let s = p.status.as_ref()?;
    capstan_api::condition(&s.conditions, kind)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn set_spec(env: &Env, name: &str, spec: serde_json::Value) {
    Api::<Plugin>::all(env.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

pub(crate) async fn wait_condition(
    env: &Env,
    name: &str,
    kind: &str,
    status: &str,
    reason: &str,
) -> Plugin {
    let last = std::sync::Mutex::new(String::new());
    let found = capstan_e2e::env::poll_until(LONG, async || {
        let p = plugin_status(env, name).await;
        *last.lock().unwrap() = format!("{:?}", p.status);
        let generation = p.metadata.generation;
        let c = condition(&p, kind)?;
        let current = p.status.as_ref()?.observed_generation == generation;
        (current && c.0 == status && c.1 == reason).then_some(p)
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "plugin {name} {kind}={status} {reason} not reached in {LONG:?}; last status: {}",
            last.lock().unwrap()
        )
    })
}

/// The Events recorded about Plugin `name`, as `kubectl get events -A` shows
/// them (the same list `kubectl describe plugin` prints): (type, reason,
/// message).
fn plugin_events(env: &Env, name: &str) -> Vec<(String, String, String)> {
    let out = env
        .control_plane
        .kubectl(&["get", "events", "-A", "-o", "json"], None)
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["kind"] == "Plugin" && e["involvedObject"]["name"] == name)
        .map(|e| (text(&e["type"]), text(&e["reason"]), text(&e["message"])))
        .collect()
}

async fn ready_machines(env: &Env, md: &str) -> i32 {
    let d: MachineDeployment = Api::namespaced(env.client.clone(), NS)
        .get(md)
        .await
        .unwrap();
    d.status.map(|s| s.ready_replicas).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oci_revisions_are_verified_granted_switched_and_rolled_back_without_a_restart() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    let mut registry = Registry::start(RegistryOptions::default()).expect("registry");
    let dir = registry.scratch().to_path_buf();
    let (key, public) = key_pair(&dir, "publisher");
    let key = key.to_str().unwrap().to_string();
    let repo = format!("oci://{}/capstan/sim-provider", registry.host);

    // v1 as built; v2 is the same plugin declaring one more destination.
    let v1_bytes = std::fs::read(plugin("sim_provider")).unwrap();
    let v2_bytes = with_manifest(
        &v1_bytes,
        r#"{"name":"sim-provider","version":"0.2.0","world":"provider","contract":"0.3.0","capabilities":{"http":[{"destination":"http://127.0.0.1:*","credential":"sim-cloud"},{"destination":"http://localhost:*","credential":"sim-cloud"},{"destination":"https://api.example.com:443"}]}}"#,
    );
    let (v1_path, v2_path) = (dir.join("v1.wasm"), dir.join("v2.wasm"));
    std::fs::write(&v1_path, &v1_bytes).unwrap();
    std::fs::write(&v2_path, &v2_bytes).unwrap();
    let v1 = ok(&[
        "plugin",
        "push",
        v1_path.to_str().unwrap(),
        &format!("{repo}:v1"),
    ])
    .trim()
    .to_string();
    let v2 = ok(&[
        "plugin",
        "push",
        v2_path.to_str().unwrap(),
        &format!("{repo}:v2"),
    ])
    .trim()
    .to_string();
    ok(&["plugin", "sign", &format!("{repo}:v1"), "--key", &key]);
    ok(&["plugin", "sign", &format!("{repo}:v2"), "--key", &key]);

    // The controllers' options, the same before and after a restart: the
    // publisher's key for the registry's prefix, a cache on disk.
    let prefix = format!("oci://{}/capstan/", registry.host);
    let options = || Options {
        poll: Duration::from_millis(250),
        resync: Duration::from_secs(5),
        supply: Some(std::sync::Arc::new(supply(
            &dir.join("oci-cache"),
            capstan_e2e::cli::publisher_policy(&prefix, &public),
        ))),
        ..Options::default()
    };
    let mut spec = sim_plugin_spec(&format!("{repo}:v1"));
    spec.verification = Some(capstan_e2e::cli::publisher_verification(&public));
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new("oci-sim", spec))
        .await
        .unwrap();
    env.start_controllers(Providers::default(), options()).await;

    // v1: verified and serving; status records digest, signer, capabilities.
    let p = wait_condition(&env, "oci-sim", READY, "True", "Loaded").await;
    let s = p.status.clone().unwrap();
    assert_eq!(
        s.resolved_source.as_deref(),
        Some(format!("{repo}@{v1}").as_str())
    );
    assert_eq!(s.signers.len(), 1);
    assert!(
        s.signers[0].starts_with("publisher (sha256:"),
        "{:?}",
        s.signers
    );
    assert_eq!(s.version.as_deref(), Some("0.1.0"));
    assert!(s.declared_http.iter().any(|d| d.contains("127.0.0.1")));
    let md = sample_deployment("oci-pool", "oci-sim", &env.cloud.url(), 1, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    eventually("1 machine Ready through the OCI plugin", LONG, async || {
        (ready_machines(&env, "oci-pool").await == 1).then_some(())
    })
    .await;
    // Each Machine records the revision that served it and who signed it.
    let machines = Api::<capstan_api::Machine>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    for m in &machines.items {
        let ms = m.status.clone().unwrap();
        assert_eq!(ms.plugin_digest, s.digest, "{ms:?}");
        assert_eq!(ms.plugin_signer.as_deref(), Some(s.signers[0].as_str()));
    }

    // v2 declares more than is granted: not activated, v1 keeps serving.
    set_spec(
        &env,
        "oci-sim",
        serde_json::json!({ "source": format!("{repo}:v2") }),
    )
    .await;
    let p = wait_condition(&env, "oci-sim", UP_TO_DATE, "False", "GrantsMissing").await;
    let (_, _, message) = condition(&p, UP_TO_DATE).unwrap();
    assert!(
        message.contains(&format!("revision {v2} (sim-provider 0.2.0)")),
        "{message}"
    );
    assert!(
        message.contains("spec.grants does not grant: http https://api.example.com:443;"),
        "exactly the missing capability: {message}"
    );
    assert!(
        message.contains(&format!("still serving {repo}@{v1}")),
        "{message}"
    );
    assert_eq!(condition(&p, READY).unwrap().0, "True");
    assert_eq!(p.status.as_ref().unwrap().version.as_deref(), Some("0.1.0"));
    let events = eventually("a GrantsMissing Event", LONG, async || {
        let events = plugin_events(&env, "oci-sim");
        events
            .iter()
            .any(|(_, reason, _)| reason == "GrantsMissing")
            .then_some(events)
    })
    .await;
    assert!(
        events
            .iter()
            .any(|(type_, reason, message)| type_ == "Normal"
                && reason == "Activated"
                && message.contains(&v1)),
        "v1's activation was recorded: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(type_, reason, message)| type_ == "Warning"
                && reason == "GrantsMissing"
                && message.contains("does not grant: http https://api.example.com:443")),
        "the refusal names the missing capability: {events:?}"
    );
    let described = env
        .control_plane
        .kubectl(&["describe", "plugin", "oci-sim"], None)
        .unwrap();
    assert!(
        described.contains("Warning  GrantsMissing"),
        "kubectl describe shows the Event: {described}"
    );
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "oci-pool",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    eventually("v1 still creates machines", LONG, async || {
        (ready_machines(&env, "oci-pool").await == 2).then_some(())
    })
    .await;

    // Granting it activates v2, without a restart.
    set_spec(
        &env,
        "oci-sim",
        serde_json::json!({ "grants": { "http": ["http://127.0.0.1:*", "http://localhost:*", "https://api.example.com:443"] } }),
    )
    .await;
    let p = wait_condition(&env, "oci-sim", UP_TO_DATE, "True", "Active").await;
    let s = p.status.clone().unwrap();
    assert_eq!(s.version.as_deref(), Some("0.2.0"));
    assert_eq!(
        s.resolved_source.as_deref(),
        Some(format!("{repo}@{v2}").as_str())
    );
    assert_eq!(
        s.previous_source.as_deref(),
        Some(format!("{repo}@{v1}").as_str())
    );

    // Roll back to v1 by digest with the registry down: verification,
    // bytes and compiled code all come from the caches.
    registry.stop();
    set_spec(
        &env,
        "oci-sim",
        serde_json::json!({ "source": format!("{repo}@{v1}") }),
    )
    .await;
    let p = eventually("rolled back to v1", LONG, async || {
        let p = plugin_status(&env, "oci-sim").await;
        let s = p.status.as_ref()?;
        (s.version.as_deref() == Some("0.1.0") && s.observed_generation == p.metadata.generation)
            .then_some(p)
    })
    .await;
    assert_eq!(condition(&p, UP_TO_DATE).unwrap().0, "True");
    assert_eq!(
        p.status.as_ref().unwrap().previous_source.as_deref(),
        Some(format!("{repo}@{v2}").as_str())
    );
    assert_eq!(ready_machines(&env, "oci-pool").await, 2);

    // An unsigned revision is refused; v1 keeps serving.
    registry.restart().unwrap();
    let v3_path = dir.join("v3.wasm");
    std::fs::write(&v3_path, capstan_e2e::cli::padded(&v1_bytes, "v3", 32)).unwrap();
    let v3 = ok(&[
        "plugin",
        "push",
        v3_path.to_str().unwrap(),
        &format!("{repo}:v3"),
    ])
    .trim()
    .to_string();
    set_spec(
        &env,
        "oci-sim",
        serde_json::json!({ "source": format!("{repo}:v3") }),
    )
    .await;
    let p = wait_condition(&env, "oci-sim", UP_TO_DATE, "False", "VerificationFailed").await;
    let (_, _, message) = condition(&p, UP_TO_DATE).unwrap();
    assert!(
        message.contains(&v3) && message.contains("unsigned"),
        "{message}"
    );
    assert!(is_true(&p.status.as_ref().unwrap().conditions, READY));

    // A restart with the registry down: the spec's v3 cannot even be
    // resolved, and v1 — the last activated revision — serves again from
    // the caches, verified under the same policy.
    registry.stop();
    env.stop_controllers().await;
    env.start_controllers(Providers::default(), options()).await;
    let restored = eventually("v1 restored after the restart", LONG, async || {
        plugin_events(&env, "oci-sim")
            .into_iter()
            .find(|(_, reason, _)| reason == "Restored")
    })
    .await;
    assert!(
        restored.2.contains("ResolveFailed")
            && restored.2.contains(&format!("restored {repo}@{v1}")),
        "{restored:?}"
    );
    let p = plugin_status(&env, "oci-sim").await;
    let (status, _, message) = condition(&p, UP_TO_DATE).unwrap();
    assert_eq!(status, "False");
    assert!(
        message.ends_with(&format!("still serving {repo}@{v1}")),
        "{message}"
    );
    assert!(is_true(&p.status.as_ref().unwrap().conditions, READY));
    assert_eq!(p.status.as_ref().unwrap().version.as_deref(), Some("0.1.0"));
    // And it serves: a third machine comes up through it.
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .patch(
            "oci-pool",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    eventually("v1 creates machines after the restart", LONG, async || {
        (ready_machines(&env, "oci-pool").await == 3).then_some(())
    })
    .await;
    env.stop_controllers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn air_gap_bundle_from_registry_a_mirrored_to_b_runs_in_the_host() {
    let env = Env::start(Faults::default()).await.expect("env");
    let mut a = Registry::start(RegistryOptions::default()).expect("registry A");
    let b = Registry::start(RegistryOptions::default()).expect("registry B");
    let dir = a.scratch().to_path_buf();
    let (key, public) = key_pair(&dir, "publisher");
    let source = format!("oci://{}/capstan/sim-provider:v1", a.host);

    // Publisher side: push and sign on A (cosign .sig and a Sigstore bundle).
    let digest = ok(&[
        "plugin",
        "push",
        plugin("sim_provider").to_str().unwrap(),
        &source,
    ])
    .trim()
    .to_string();
    ok(&[
        "plugin",
        "sign",
        &source,
        "--key",
        key.to_str().unwrap(),
        "--bundle",
    ]);
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!("apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    path: publisher.pub\nsources:\n  - prefix: oci://{}/capstan/\n    allOf: [publisher]\n", a.host),
    )
    .unwrap();
    let spec = dir.join("bundle.yaml");
    std::fs::write(&spec, format!("apiVersion: capstan.dev/v1alpha1\nkind: Bundle\nplugins:\n  - {source}\npolicy: policy.yaml\n")).unwrap();
    let archive = dir.join("site.tar");
    let out = ok(&[
        "bundle",
        "create",
        "-f",
        spec.to_str().unwrap(),
        "-o",
        archive.to_str().unwrap(),
    ]);
    assert!(
        out.contains(&digest) && out.contains("signed by publisher"),
        "{out}"
    );

    // Across the gap: A is gone.
    a.stop();
    // The site's own policy is required: a bundle cannot vouch for itself.
    let err = capstan_e2e::cli::fails(&["bundle", "verify", archive.to_str().unwrap()]);
    assert!(
        err.contains("the bundle's own trust policy came with the bundle"),
        "{err}"
    );
    let out = ok(&[
        "bundle",
        "verify",
        archive.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--output",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["plugins"][0]["digest"], digest.as_str());
    let out = ok(&[
        "bundle",
        "push",
        archive.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--to",
        &format!("{}/mirror", b.host),
    ]);
    assert!(
        out.contains(&format!(
            "oci://{}/mirror/capstan/sim-provider:v1 ({digest})",
            b.host
        )),
        "digest unchanged: {out}"
    );

    // A tampered bundle is refused offline.
    let mut bytes = std::fs::read(&archive).unwrap();
    let wasm = bytes
        .windows(8)
        .position(|w| w == b"\0asm\x0d\0\x01\0")
        .expect("the component in the archive");
    bytes[wasm + 1000] ^= 0xff;
    let tampered = dir.join("tampered.tar");
    std::fs::write(&tampered, bytes).unwrap();
    let err = capstan_e2e::cli::fails(&[
        "bundle",
        "verify",
        tampered.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(err.contains("but got content with digest"), "{err}");

    // Site side: the same Plugin source, rewritten to B by the mirror config,
    // verified with the publisher's original key.
    let mirrors = dir.join("mirrors.yaml");
    std::fs::write(
        &mirrors,
        format!(
            "mirrors:\n  - source: oci://{}/\n    mirror: oci://{}/mirror/\n",
            a.host, b.host
        ),
    )
    .unwrap();
    let out = ok(&[
        "plugin",
        "verify",
        &source,
        "--key",
        public.to_str().unwrap(),
        "--mirror-config",
        mirrors.to_str().unwrap(),
    ]);
    assert!(out.contains("signed by publisher"), "{out}");
    Api::<Plugin>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Plugin::new("oci-sim", sim_plugin_spec(&source)),
        )
        .await
        .unwrap();
    let cache = dir.join("host-cache");
    let mut host = ControllerProcess::start(
        &env,
        &[
            "--trust-policy",
            policy.to_str().unwrap(),
            "--mirror-config",
            mirrors.to_str().unwrap(),
            "--oci-cache",
            cache.to_str().unwrap(),
            "--poll-interval",
            "250ms",
        ],
        &[],
    )
    .expect("capstan controller");
    host.wait_ready(LONG).expect("controller ready");
    let p = wait_condition(&env, "oci-sim", READY, "True", "Loaded").await;
    let s = p.status.clone().unwrap();
    assert_eq!(
        s.resolved_source.as_deref(),
        Some(format!("oci://{}/capstan/sim-provider@{digest}", a.host).as_str())
    );
    assert_eq!(
        s.fetched_from.as_deref(),
        Some(format!("oci://{}/mirror/capstan/sim-provider@{digest}", b.host).as_str())
    );
    assert!(s.signers[0].starts_with("publisher ("), "{:?}", s.signers);
    let md = sample_deployment("site-pool", "oci-sim", &env.cloud.url(), 1, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    eventually(
        "a machine Ready from the mirrored plugin",
        LONG,
        async || (ready_machines(&env, "site-pool").await == 1).then_some(()),
    )
    .await;
    assert!(
        host.metric_sum("capstan_plugin_artifact_steps_total")
            .unwrap()
            >= 3.0
    );
    host.stop();
}
