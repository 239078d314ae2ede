//! Keyless Sigstore signatures, verified offline by identity. The bundles
//! are made by the real sigstore-js signer (`@sigstore/sign`) against
//! `@sigstore/mock`'s Fulcio, Rekor and timestamp authority, in-process in
//! node (`interop/sigstore-keyless.cjs`); Capstan sees only the bundles and
//! the mock instance's `trusted_root.json`, and has no route to any Sigstore
//! service (the mock's URLs are `.invalid`).
//!
//! Each refusal names its reason, and two independent verifiers are asked
//! the same question about every bundle: sigstore-js's (`@sigstore/verify`)
//! and the Sigstore Python client (`sigstore verify identity --offline`).

use crate::interop::node_script;
use crate::oci_plugins::wait_condition;
use capstan_api::Plugin;
use capstan_controllers::plugin::READY;
use capstan_e2e::cli::{fails, ok};
use capstan_e2e::env::{ControllerProcess, Env, sim_plugin_spec};
use capstan_e2e::plugin;
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::Faults;
use capstan_registry::oci::{Index, Manifest, SIGSTORE_BUNDLE};
use capstan_registry::{Client, ClientOptions, Digest, Reference};
use kube::api::{Api, PostParams};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SUBJECT: &str =
    "https://github.com/example/plugins/.github/workflows/release.yml@refs/heads/main";
const ISSUER: &str = "https://token.actions.githubusercontent.com";

/// A plugin pushed to `registry` and the keyless cases made for its manifest.
struct Signed {
    reference: String,
    digest: String,
    cases: PathBuf,
}

impl Signed {
    fn make(registry: &Registry) -> Signed {
        let reference = format!("oci://{}/capstan/sim-provider:v1", registry.host);
        let digest = ok(&[
            "plugin",
            "push",
            plugin("sim_provider").to_str().unwrap(),
            &reference,
        ])
        .trim()
        .to_string();
        let cases = registry.scratch().join("keyless");
        let out = node_script(
            "sigstore-keyless.cjs",
            &[
                "cases",
                "--out",
                cases.to_str().unwrap(),
                "--registry",
                &registry.host,
                "--repository",
                "capstan/sim-provider",
                "--digest",
                &digest,
                "--name",
                &format!("{}/capstan/sim-provider", registry.host),
            ],
        );
        assert!(
            out.status.success(),
            "sigstore-js could not sign: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // No transparency log entry at all: nothing proves the signing time.
        let mut no_time: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cases.join("good.json")).unwrap()).unwrap();
        no_time["verificationMaterial"]["tlogEntries"] = serde_json::json!([]);
        std::fs::write(
            cases.join("no-time.json"),
            serde_json::to_vec(&no_time).unwrap(),
        )
        .unwrap();
        Signed {
            reference,
            digest,
            cases,
        }
    }

    fn file(&self, name: &str) -> String {
        self.cases.join(name).to_str().unwrap().to_string()
    }

    /// A trust policy naming the identity by `subject_rule` (`subject: …` or
    /// `subjectRegExp: …`) under `root`, for every source of `host`.
    fn policy(&self, name: &str, host: &str, subject_rule: &str, root: &str) -> PathBuf {
        let path = self.cases.join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nidentities:\n  - name: release-ci\n    issuer: {ISSUER}\n    {subject_rule}\n    trustedRoot: {root}\nsources:\n  - prefix: oci://{host}/\n    anyOf: [release-ci]\n"
            ),
        )
        .unwrap();
        path
    }

    /// `capstan plugin verify` with `--identity` and `bundle` as an extra file.
    fn verify_args<'a>(
        &'a self,
        identity: &'a str,
        root: &'a str,
        bundle: &'a str,
    ) -> Vec<&'a str> {
        vec![
            "plugin",
            "verify",
            &self.reference,
            "--identity",
            identity,
            "--trusted-root",
            root,
            "--bundle",
            bundle,
        ]
    }

    /// Whether sigstore-js's verifier accepts `bundle` for this identity.
    fn sigstore_js_accepts(&self, bundle: &str) -> bool {
        node_script(
            "sigstore-keyless.cjs",
            &[
                "verify",
                "--bundle",
                bundle,
                "--root",
                &self.file("trusted_root.json"),
                "--subject",
                SUBJECT,
                "--issuer",
                ISSUER,
                "--artifact",
                &self.file("artifact"),
            ],
        )
        .status
        .success()
    }

    /// Whether the Sigstore Python client accepts `bundle` for this
    /// identity, offline, with the same trusted root.
    fn sigstore_python_accepts(&self, bundle: &str) -> bool {
        let config = self.cases.join("trust-config.json");
        if !config.exists() {
            let root: serde_json::Value =
                serde_json::from_slice(&std::fs::read(self.file("trusted_root.json")).unwrap())
                    .unwrap();
            // Signing endpoints are required by the format; nothing calls them.
            let service = serde_json::json!([{"url": "https://mock.capstan.invalid", "majorApiVersion": 1, "validFor": {"start": "2020-01-01T00:00:00Z"}, "operator": "mock"}]);
            let trust = serde_json::json!({
                "mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
                "trustedRoot": root,
                "signingConfig": {
                    "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
                    "caUrls": service, "oidcUrls": [], "rekorTlogUrls": service, "tsaUrls": [],
                    "rekorTlogConfig": {"selector": "ANY"}, "tsaConfig": {"selector": "ANY"},
                },
            });
            std::fs::write(&config, serde_json::to_vec(&trust).unwrap()).unwrap();
        }
        // Protobuf's JSON leaves out default values (an inclusion proof's
        // `logIndex: 0`, empty `hashes`), and sigstore-python's reader wants
        // them spelled out; filling them in changes nothing the bundle says.
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bundle).unwrap()).unwrap();
        if let Some(entries) = json["verificationMaterial"]["tlogEntries"].as_array_mut() {
            for proof in entries
                .iter_mut()
                .filter_map(|e| e.get_mut("inclusionProof"))
            {
                let proof = proof.as_object_mut().unwrap();
                proof.entry("logIndex").or_insert(serde_json::json!("0"));
                proof.entry("hashes").or_insert(serde_json::json!([]));
            }
        }
        let filled = self.cases.join("python-bundle.json");
        std::fs::write(&filled, serde_json::to_vec(&json).unwrap()).unwrap();
        let python = std::env::var_os("CAPSTAN_PYTHON_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/capstan/python")
            });
        let out = std::process::Command::new(python.join("bin/sigstore"))
            .args(["--trust-config", config.to_str().unwrap()])
            .args(["verify", "identity", "--offline", "--bundle"])
            .arg(&filled)
            .args(["--cert-identity", SUBJECT, "--cert-oidc-issuer", ISSUER])
            .arg(self.file("artifact"))
            .output()
            .expect("sigstore-python is installed by scripts/setup.sh");
        out.status.success()
    }
}

#[test]
fn keyless_signatures_verify_offline_by_identity_and_each_refusal_says_why() {
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let signed = Signed::make(&registry);
    let identity = format!("{ISSUER}={SUBJECT}");
    let root = signed.file("trusted_root.json");

    // Accepted: a message signature over the manifest in a v0.3 bundle with
    // a Rekor entry; DSSE (an in-toto statement naming this repository and
    // digest); a v0.2 bundle with a Rekor entry and an RFC 3161 timestamp.
    for good in ["good.json", "good-dsse.json", "good-v02-timestamp.json"] {
        let bundle = signed.file(good);
        let out = ok(&signed.verify_args(&identity, &root, &bundle));
        assert!(
            out.contains(&format!("signed by identity-1 ({SUBJECT} from {ISSUER})"))
                && out.contains("Rekor log index"),
            "{good}: {out}"
        );
        assert!(
            signed.sigstore_js_accepts(&bundle),
            "sigstore-js refused {good}"
        );
        // sigstore-python reads integrated times only from hashedrekord and
        // dsse entries, not the intoto entry the DSSE bundle has.
        if good != "good-dsse.json" {
            assert!(
                signed.sigstore_python_accepts(&bundle),
                "sigstore-python refused {good}"
            );
        }
    }

    // Refused, each naming what did not hold.
    let refusals = [
        (
            "other-subject.json",
            "not subject \"https://github.com/example/plugins/",
        ),
        (
            "other-issuer.json",
            "not issuer \"https://token.actions.githubusercontent.com\"",
        ),
        (
            "untrusted-ca.json",
            "does not chain to a certificate authority of the trusted root",
        ),
        (
            "tampered-proof.json",
            "inclusion proof root hash does not match",
        ),
        (
            "expired.json",
            "had expired at the signing time the log entry or timestamp proves",
        ),
        ("no-time.json", "nothing proves when it was signed"),
        ("missing-sct.json", "missing SCT"),
        ("other-digest.json", "the bundle signs sha256:"),
    ];
    for (case, reason) in refusals {
        let bundle = signed.file(case);
        let err = fails(&signed.verify_args(&identity, &root, &bundle));
        assert!(
            err.contains(reason) && err.contains("has no valid signature"),
            "{case}: expected {reason:?} in: {err}"
        );
        assert!(
            !signed.sigstore_python_accepts(&bundle),
            "sigstore-python accepted {case}, which Capstan refuses: {err}"
        );
        // sigstore-js checks a log entry's signed promise and stops there,
        // so it accepts a bundle whose inclusion proof was tampered with;
        // on every other case the three verifiers agree.
        if case != "tampered-proof.json" {
            assert!(
                !signed.sigstore_js_accepts(&bundle),
                "sigstore-js accepted {case}, which Capstan refuses: {err}"
            );
        }
    }

    // Subject patterns match the whole subject.
    let host = &registry.host;
    let pattern = signed.policy(
        "pattern.yaml",
        host,
        "subjectRegExp: https://github.com/example/plugins/.*",
        "trusted_root.json",
    );
    let good = signed.file("good.json");
    let out = ok(&[
        "plugin",
        "verify",
        &signed.reference,
        "--policy",
        pattern.to_str().unwrap(),
        "--bundle",
        &good,
    ]);
    assert!(out.contains("signed by release-ci"), "{out}");
    let inside = signed.policy(
        "inside.yaml",
        host,
        "subjectRegExp: example/plugins",
        "trusted_root.json",
    );
    let err = fails(&[
        "plugin",
        "verify",
        &signed.reference,
        "--policy",
        inside.to_str().unwrap(),
        "--bundle",
        &good,
    ]);
    assert!(err.contains("not subject /example/plugins/"), "{err}");

    // Stored as a referrer, it is found in the registry; inspect shows who
    // signed and where it was logged.
    ok(&["plugin", "attach", &signed.reference, "--bundle", &good]);
    let out = ok(&[
        "plugin",
        "verify",
        &signed.reference,
        "--identity",
        &identity,
        "--trusted-root",
        &root,
    ]);
    assert!(out.contains("signed by identity-1"), "{out}");
    let out = ok(&[
        "plugin",
        "inspect",
        &signed.reference,
        "--identity",
        &identity,
        "--trusted-root",
        &root,
    ]);
    assert!(
        out.contains("verifies as identity identity-1")
            && out.contains(&format!(
                "keyless: {SUBJECT} from {ISSUER}, Rekor log index"
            )),
        "{out}"
    );
    let err = fails(&[
        "plugin",
        "verify",
        &signed.reference,
        "--identity",
        &format!(
            "{ISSUER}=https://github.com/example/plugins/.github/workflows/other.yml@refs/heads/main"
        ),
        "--trusted-root",
        &root,
    ]);
    assert!(err.contains("not subject"), "{err}");
    let err = fails(&[
        "plugin",
        "verify",
        &signed.reference,
        "--identity",
        &identity,
    ]);
    assert!(err.contains("--trusted-root"), "{err}");
}

#[test]
fn an_air_gap_bundle_carries_keyless_signatures_and_its_root_can_only_narrow_the_sites() {
    let mut a = Registry::start(RegistryOptions::default()).expect("registry A");
    let b = Registry::start(RegistryOptions::default()).expect("registry B");
    let signed = Signed::make(&a);
    let good = std::fs::read(signed.cases.join("good.json")).unwrap();
    ok(&[
        "plugin",
        "attach",
        &signed.reference,
        "--bundle",
        &signed.file("good.json"),
    ]);
    let policy = signed.policy(
        "policy.yaml",
        &a.host,
        &format!("subject: {SUBJECT}"),
        "trusted_root.json",
    );
    // A publisher whose own policy names a root with one more CA.
    signed.policy(
        "wider.yaml",
        &a.host,
        &format!("subject: {SUBJECT}"),
        "root-adds-ca.json",
    );
    let create = |policy: &str, out: &Path| {
        let spec = signed.cases.join(format!("{policy}.bundle.yaml"));
        std::fs::write(
            &spec,
            format!(
                "apiVersion: capstan.dev/v1alpha1\nkind: Bundle\nplugins:\n  - {}\npolicy: {policy}\n",
                signed.reference
            ),
        )
        .unwrap();
        ok(&[
            "bundle",
            "create",
            "-f",
            spec.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
    };
    let archive = signed.cases.join("site.tar");
    let out = create("policy.yaml", &archive);
    assert!(out.contains("signed by release-ci"), "{out}");
    let wide_archive = signed.cases.join("wide.tar");
    create("wider.yaml", &wide_archive);

    // Across the gap: A is gone, and no Sigstore service is reachable.
    a.stop();
    let out = ok(&[
        "bundle",
        "verify",
        archive.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(out.contains("signed by release-ci"), "{out}");
    let err = fails(&[
        "bundle",
        "verify",
        wide_archive.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(
        err.contains("adds certificate authority") && err.contains("can only narrow the site's"),
        "{err}"
    );
    // A site with keys only has no root for the bundle's identities.
    let (_, public) = capstan_e2e::cli::key_pair(&signed.cases, "site");
    let err = fails(&[
        "bundle",
        "verify",
        archive.to_str().unwrap(),
        "--key",
        public.to_str().unwrap(),
    ]);
    assert!(err.contains("has no trusted root"), "{err}");

    // Mirrored to B byte for byte: the referrer's bundle is the one signed.
    ok(&[
        "bundle",
        "push",
        archive.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--to",
        &format!("{}/mirror", b.host),
    ]);
    let client = Client::new(ClientOptions::default()).unwrap();
    let digest: Digest = signed.digest.parse().unwrap();
    let repo = format!("oci://{}/mirror/capstan/sim-provider", b.host);
    let referrers = Reference::parse(&format!("{repo}:{}", digest.referrers_tag())).unwrap();
    let (_, _, index) = client.fetch_manifest(&referrers).expect("referrers on B");
    let index = Index::parse("referrers", &index).unwrap();
    let entry = index
        .manifests
        .iter()
        .find(|d| d.artifact_type.as_deref() == Some(SIGSTORE_BUNDLE))
        .expect("the keyless bundle among B's referrers");
    let pinned = Reference::parse(&format!("{repo}@{}", entry.digest)).unwrap();
    let (_, _, manifest) = client.fetch_manifest(&pinned).unwrap();
    let manifest = Manifest::parse("bundle manifest", &manifest).unwrap();
    assert_eq!(manifest.layers[0].digest, Digest::of(&good));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_signed_keyless_loads_under_an_identity_rule_and_shows_its_signer() {
    crate::logs();
    let env = Env::start(Faults::default()).await.expect("env");
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let signed = Signed::make(&registry);
    ok(&[
        "plugin",
        "attach",
        &signed.reference,
        "--bundle",
        &signed.file("good.json"),
    ]);
    let policy = signed.policy(
        "host.yaml",
        &registry.host,
        "subjectRegExp: https://github.com/example/plugins/\\.github/workflows/release\\.yml@refs/heads/.*",
        "trusted_root.json",
    );
    Api::<Plugin>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Plugin::new("keyless-sim", sim_plugin_spec(&signed.reference)),
        )
        .await
        .unwrap();
    // A Plugin's own verification can ask for more keyless signers, under
    // the host's trusted root: the release workflow signed, a second
    // workflow did not.
    let identity = |name: &str, subject: &str| capstan_api::NamedIdentity {
        name: name.into(),
        issuer: ISSUER.into(),
        subject: Some(subject.into()),
        subject_reg_exp: None,
    };
    let mut also_release = sim_plugin_spec(&signed.reference);
    also_release.verification = Some(capstan_api::PluginVerification {
        identities: vec![identity("release", SUBJECT)],
        all_of: vec!["release".into()],
        ..Default::default()
    });
    let mut also_audit = also_release.clone();
    also_audit.verification = Some(capstan_api::PluginVerification {
        identities: vec![identity(
            "audit",
            "https://github.com/example/plugins/.github/workflows/audit.yml@refs/heads/main",
        )],
        all_of: vec!["audit".into()],
        ..Default::default()
    });
    for (name, spec) in [
        ("keyless-release", also_release),
        ("keyless-audit", also_audit),
    ] {
        Api::<Plugin>::all(env.client.clone())
            .create(&PostParams::default(), &Plugin::new(name, spec))
            .await
            .unwrap();
    }
    let cache = signed.cases.join("host-cache");
    let mut host = ControllerProcess::start(
        &env,
        &[
            "--trust-policy",
            policy.to_str().unwrap(),
            "--oci-cache",
            cache.to_str().unwrap(),
            "--poll-interval",
            "250ms",
        ],
        &[],
    )
    .expect("capstan controller");
    host.wait_ready(Duration::from_secs(90))
        .expect("controller ready");
    let p = wait_condition(&env, "keyless-sim", READY, "True", "Loaded").await;
    let signers = p.status.unwrap().signers;
    assert_eq!(
        signers,
        [format!("release-ci ({SUBJECT} from {ISSUER})")],
        "the Plugin shows who signed the revision it serves"
    );
    let p = wait_condition(&env, "keyless-release", READY, "True", "Loaded").await;
    assert!(
        p.status
            .unwrap()
            .signers
            .contains(&format!("release ({SUBJECT} from {ISSUER})")),
        "the Plugin's own identity counted too"
    );
    let p = wait_condition(&env, "keyless-audit", READY, "False", "VerificationFailed").await;
    let (_, _, message) = crate::oci_plugins::condition(&p, READY).unwrap();
    assert!(
        message.contains("allOf identity \"audit\"") && message.contains("not subject"),
        "{message}"
    );
    host.stop();
}
