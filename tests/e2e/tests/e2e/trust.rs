//! The host's trust policy is a floor: every way a Plugin author once had
//! to pick their own trust is refused with a reason that says why, and the
//! legitimate paths (a publisher-signed OCI artifact, a signed file) still
//! load. The host is the real controller against a real registry.

use capstan_api::Plugin;
use capstan_controllers::plugin::Supply;
use capstan_controllers::{Options, Providers};
use capstan_e2e::cli::{PASSWORD, key_pair, ok, publisher_verification};
use capstan_e2e::env::{Env, sim_plugin_spec};
use capstan_e2e::plugin;
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::Faults;
use capstan_registry::keys::PrivateKey;
use capstan_registry::policy::TrustPolicy;
use capstan_registry::verify::Puller;
use capstan_registry::{Cache, Client, ClientOptions, Mirrors, Reference, signature};
use kube::api::{Api, PostParams};
use std::path::Path;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

async fn create(env: &Env, name: &str, source: &str, verification_key: Option<&Path>) {
    let mut spec = sim_plugin_spec(source);
    spec.verification = verification_key.map(publisher_verification);
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new(name, spec))
        .await
        .unwrap();
}

/// Wait for Plugin `name`'s Ready condition to have `reason`; its message.
async fn ready_reason(env: &Env, name: &str, reason: &str) -> String {
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    let last = std::sync::Mutex::new(String::new());
    let found = capstan_e2e::env::poll_until(LONG, async || {
        let p = plugins.get(name).await.ok()?;
        let c = capstan_api::condition(&p.status.as_ref()?.conditions, "Ready")?.clone();
        *last.lock().unwrap() = format!("{} {}: {}", c.status, c.reason, c.message);
        (c.reason == reason).then_some(c.message)
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "Plugin {name} never reached Ready reason {reason}; last: {}",
            last.lock().unwrap()
        )
    })
}

fn push(component: &Path, reference: &str) {
    ok(&["plugin", "push", component.to_str().unwrap(), reference]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_hosts_trust_policy_is_a_floor_for_every_source() {
    crate::logs();
    let mut env = Env::start(Faults::default()).await.expect("env");
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let dir = registry.scratch().to_path_buf();
    let (publisher_key, publisher) = key_pair(&dir, "publisher");
    let (attacker_key, attacker) = key_pair(&dir, "attacker");
    let component = plugin("sim_provider");
    // Spelled with a host name, so an upper-case spelling can be tried.
    let host = registry.host.replace("127.0.0.1", "localhost");

    // The host trusts the publisher for `localhost:PORT/capstan` (written
    // without the trailing '/') and for one directory of signed files.
    let signed_dir = dir.join("signed");
    let unsigned_dir = dir.join("unsigned");
    std::fs::create_dir_all(&signed_dir).unwrap();
    std::fs::create_dir_all(&unsigned_dir).unwrap();
    let pem = std::fs::read_to_string(&publisher)
        .unwrap()
        .trim_end()
        .replace('\n', "\n      ");
    let policy = TrustPolicy::parse(
        "host policy",
        &format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    publicKey: |\n      {pem}\nsources:\n  - prefix: oci://{host}/capstan\n    allOf: [publisher]\n  - prefix: file://{}/\n    allOf: [publisher]\n",
            signed_dir.display()
        ),
        None,
    )
    .expect("the host policy");

    let sign = |reference: &str, key: &Path| {
        ok(&["plugin", "sign", reference, "--key", key.to_str().unwrap()]);
    };
    // The publisher's release, and the attacker's artifacts.
    push(&component, &format!("oci://{host}/capstan/good:v1"));
    sign(&format!("oci://{host}/capstan/good:v1"), &publisher_key);
    push(&component, &format!("oci://{host}/capstan/sim:v1"));
    sign(&format!("oci://{host}/capstan/sim:v1"), &attacker_key);
    push(&component, &format!("oci://{host}/capstan-evil/sim:v1"));
    sign(&format!("oci://{host}/capstan-evil/sim:v1"), &attacker_key);
    // An attestation by the publisher's key (provenance, not a release).
    let attested = Reference::parse(&format!("oci://{host}/capstan/attested:v1")).unwrap();
    push(&component, &attested.to_string());
    let client = Client::new(ClientOptions::default()).unwrap();
    let described = capstan_registry::artifact::describe(&client, &attested).unwrap();
    let text = std::fs::read_to_string(&publisher_key).unwrap();
    let key = PrivateKey::from_encrypted_pem("publisher", &text, PASSWORD.as_bytes()).unwrap();
    let provenance = signature::make_statement_bundle(
        &attested.repository_name(),
        &described.digest,
        "https://slsa.dev/provenance/v1",
        &key,
    );
    let subject = capstan_registry::oci::Descriptor::of(
        capstan_registry::oci::MANIFEST,
        &described.manifest_bytes,
    );
    signature::attach_bundle(&client, &attested, &subject, &provenance).unwrap();
    // Files: one signed by the publisher, one by the attacker, one unsigned
    // (none of them in a directory the host trusts unsigned).
    let bytes = std::fs::read(&component).unwrap();
    for (path, key) in [
        (signed_dir.join("sim.wasm"), Some(&publisher_key)),
        (signed_dir.join("wrong.wasm"), Some(&attacker_key)),
        (unsigned_dir.join("sim.wasm"), None),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        if let Some(key) = key {
            let out = ok(&[
                "plugin",
                "sign",
                path.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
            ]);
            assert!(out.contains(".wasm.sigstore.json"), "{out}");
        }
    }

    let upper = host.replace("localhost", "LOCALHOST");
    create(&env, "good", &format!("oci://{host}/capstan/good:v1"), None).await;
    // The attacker names their own key: under the host rule it only adds.
    create(
        &env,
        "upper-case",
        &format!("oci://{upper}/capstan/sim:v1"),
        Some(&attacker),
    )
    .await;
    create(
        &env,
        "sibling",
        &format!("oci://{host}/capstan-evil/sim:v1"),
        Some(&attacker),
    )
    .await;
    create(&env, "attested", &attested.to_string(), None).await;
    let file = |p: &Path| format!("file://{}", p.display());
    create(
        &env,
        "file-signed",
        &file(&signed_dir.join("sim.wasm")),
        None,
    )
    .await;
    create(
        &env,
        "file-wrong",
        &file(&signed_dir.join("wrong.wasm")),
        None,
    )
    .await;
    create(
        &env,
        "file-unsigned",
        &file(&unsigned_dir.join("sim.wasm")),
        None,
    )
    .await;
    // A device that never ends, outside any trusted directory: refused
    // before it is read.
    create(&env, "dev-zero", "file:///dev/zero", None).await;
    create(
        &env,
        "file-escape",
        &format!("file://{}/../unsigned/sim.wasm", signed_dir.display()),
        None,
    )
    .await;

    env.start_controllers(
        Providers::default(),
        Options {
            supply: Some(std::sync::Arc::new(Supply {
                puller: Puller {
                    client,
                    cache: Some(Cache::open(&dir.join("cache")).unwrap()),
                    mirrors: Mirrors::default(),
                },
                policy: Some(policy),
            })),
            ..Options::default()
        },
    )
    .await;

    ready_reason(&env, "good", "Loaded").await;
    ready_reason(&env, "file-signed", "Loaded").await;
    let signed = Api::<Plugin>::all(env.client.clone())
        .get("file-signed")
        .await
        .unwrap();
    let signers = signed.status.unwrap().signers;
    assert!(
        signers.len() == 1 && signers[0].starts_with("publisher ("),
        "{signers:?}"
    );

    let m = ready_reason(&env, "upper-case", "VerificationFailed").await;
    assert!(
        m.contains(&format!("oci://{host}/capstan/sim@")) && m.contains("allOf key \"publisher\""),
        "the upper-case spelling is the same repository, under the host's rule: {m}"
    );
    let m = ready_reason(&env, "sibling", "NoTrustPolicy").await;
    assert!(
        m.contains("not covered by any rule of the host's trust policy")
            && m.contains("spec.verification can only add"),
        "{m}"
    );
    let m = ready_reason(&env, "attested", "VerificationFailed").await;
    assert!(
        m.contains("an attestation with predicate type \"https://slsa.dev/provenance/v1\""),
        "{m}"
    );
    let m = ready_reason(&env, "file-wrong", "VerificationFailed").await;
    assert!(m.contains("allOf key \"publisher\""), "{m}");
    let m = ready_reason(&env, "file-unsigned", "NoTrustPolicy").await;
    assert!(m.contains("--allow-unsigned-dir"), "{m}");
    let m = ready_reason(&env, "dev-zero", "NoTrustPolicy").await;
    assert!(m.contains("file:///dev/zero is not covered"), "{m}");
    let m = ready_reason(&env, "file-escape", "InvalidSource").await;
    assert!(m.contains("must not contain '.', '..'"), "{m}");
}
