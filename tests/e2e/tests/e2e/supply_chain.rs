//! The plugin supply chain as a user runs it, against real registries:
//! push, sign (several signers), verify, pull, inspect, and every way a
//! registry or an attacker can hand over something else — each refused with
//! a message that says what failed.

use capstan_e2e::cli::{fails, key_pair, ok, padded};
use capstan_e2e::plugin;
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_registry::oci::{self, Manifest};
use capstan_registry::{Client, ClientOptions, Digest, Reference};
use std::path::PathBuf;

struct Published {
    registry: Registry,
    reference: String,
    digest: String,
    publisher: (PathBuf, PathBuf),
    component: PathBuf,
}

/// A registry with sim-provider pushed to capstan/sim-provider:v1 and signed
/// by a fresh "publisher" key.
fn published() -> Published {
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let publisher = key_pair(registry.scratch(), "publisher");
    let component = plugin("sim_provider");
    let reference = format!("oci://{}/capstan/sim-provider:v1", registry.host);
    let digest = ok(&["plugin", "push", component.to_str().unwrap(), &reference])
        .trim()
        .to_string();
    ok(&[
        "plugin",
        "sign",
        &reference,
        "--key",
        publisher.0.to_str().unwrap(),
    ]);
    Published {
        registry,
        reference,
        digest,
        publisher,
        component,
    }
}

impl Published {
    fn pub_key(&self) -> &str {
        self.publisher.1.to_str().unwrap()
    }
    fn pinned(&self) -> String {
        format!("{}@{}", self.reference.trim_end_matches(":v1"), self.digest)
    }
    fn manifest(&self) -> Manifest {
        let client = Client::new(ClientOptions::default()).unwrap();
        let r = Reference::parse(&self.pinned()).unwrap();
        let (_, _, bytes) = client.fetch_manifest(&r).unwrap();
        Manifest::parse("m", &bytes).unwrap()
    }
    /// Push the component padded by `pad` bytes (same plugin, another
    /// digest) to `tag`; returns the reference and the digest `push` printed.
    fn push_variant(&self, tag: &str, pad: usize) -> (String, String) {
        let bytes = padded(&std::fs::read(&self.component).unwrap(), "padding", pad);
        let path = self.registry.scratch().join(format!("{tag}.wasm"));
        std::fs::write(&path, bytes).unwrap();
        let reference = self.reference.replace(":v1", &format!(":{tag}"));
        let digest = ok(&["plugin", "push", path.to_str().unwrap(), &reference])
            .trim()
            .to_string();
        (reference, digest)
    }

    fn verify_fails(&self, reference: &str) -> String {
        fails(&["plugin", "verify", reference, "--key", self.pub_key()])
    }
    fn pull_fails(&self, reference: &str) -> String {
        let out = self.registry.scratch().join("pulled.wasm");
        let cache = self.registry.scratch().join("cache-fresh");
        fails(&[
            "plugin",
            "pull",
            reference,
            "-o",
            out.to_str().unwrap(),
            "--key",
            self.pub_key(),
            "--oci-cache",
            cache.to_str().unwrap(),
        ])
    }
}

/// Overwrite a blob at rest with same-length different bytes.
fn corrupt(registry: &Registry, digest: &str) {
    let path = registry.blob_file(digest);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn publish_sign_with_two_keys_verify_pull_and_inspect() {
    let p = published();
    let scratch = p.registry.scratch();
    assert!(
        p.digest.starts_with("sha256:") && p.digest.len() == 71,
        "push prints the digest: {}",
        p.digest
    );

    // The manifest follows the CNCF Wasm layout and carries the plugin manifest.
    let m = p.manifest();
    assert_eq!(m.config.media_type, oci::WASM_CONFIG);
    assert_eq!(m.layers.len(), 1);
    assert_eq!(m.layers[0].media_type, oci::WASM_LAYER);
    let annotation: serde_json::Value =
        serde_json::from_str(&m.annotations[oci::ANNOTATION_PLUGIN_MANIFEST]).unwrap();
    assert_eq!(annotation["world"], "provider");

    // Pushing the same bytes again is idempotent: same digest.
    let again = ok(&[
        "plugin",
        "push",
        p.component.to_str().unwrap(),
        &p.reference,
    ]);
    assert_eq!(again.trim(), p.digest);

    let out = ok(&["plugin", "verify", &p.reference, "--key", p.pub_key()]);
    assert!(
        out.contains("verified") && out.contains("signed by publisher"),
        "{out}"
    );

    // Signing twice with one key adds nothing; a second signer appends.
    let out = ok(&[
        "plugin",
        "sign",
        &p.reference,
        "--key",
        p.publisher.0.to_str().unwrap(),
    ]);
    assert!(out.contains("already signed"), "{out}");
    let ops = key_pair(scratch, "ops");
    ok(&[
        "plugin",
        "sign",
        &p.pinned(),
        "--key",
        ops.0.to_str().unwrap(),
    ]);
    let policy = scratch.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    path: publisher.pub\n  - name: ops\n    path: ops.pub\nsources:\n  - prefix: oci://{}/capstan/\n    allOf: [publisher, ops]\n",
            p.registry.host
        ),
    )
    .unwrap();
    let json = ok(&[
        "plugin",
        "verify",
        &p.reference,
        "--policy",
        policy.to_str().unwrap(),
        "--output",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let signers: Vec<&str> = v["signers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        signers,
        ["publisher", "ops"],
        "both signatures coexist: {json}"
    );

    // allOf with a key that never signed fails and says which.
    let stranger = key_pair(scratch, "stranger");
    let strict = scratch.join("strict.yaml");
    std::fs::write(
        &strict,
        std::fs::read_to_string(&policy)
            .unwrap()
            .replace("allOf: [publisher, ops]", "allOf: [publisher, stranger]")
            .replace(
                "  - name: ops\n    path: ops.pub\n",
                "  - name: stranger\n    path: stranger.pub\n",
            ),
    )
    .unwrap();
    let err = fails(&[
        "plugin",
        "verify",
        &p.reference,
        "--policy",
        strict.to_str().unwrap(),
    ]);
    assert!(err.contains("allOf key \"stranger\""), "{err}");
    let _ = stranger;

    // Inspect reads the manifest and every signature without the component.
    let out = ok(&[
        "plugin",
        "inspect",
        &p.reference,
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(out.contains("Plugin:     sim-provider"), "{out}");
    assert!(
        out.contains("cosign signature 1") && out.contains("verifies with key publisher"),
        "{out}"
    );
    assert!(out.contains("verifies with key ops"), "{out}");
    assert!(out.contains("Policy:     satisfied"), "{out}");
    let json = ok(&["plugin", "inspect", &p.reference, "--output", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["signatures"].as_array().unwrap().len(), 2);

    // Pull: verified, byte-identical, atomically written.
    let out_path = scratch.join("pulled.wasm");
    let cache = scratch.join("cache");
    let json = ok(&[
        "plugin",
        "pull",
        &p.reference,
        "-o",
        out_path.to_str().unwrap(),
        "--key",
        p.pub_key(),
        "--oci-cache",
        cache.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert_eq!(
        std::fs::read(&out_path).unwrap(),
        std::fs::read(&p.component).unwrap()
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["digest"], p.digest.as_str());
    assert_eq!(v["verified"], true);
    let err = fails(&[
        "plugin",
        "pull",
        &p.reference,
        "-o",
        out_path.to_str().unwrap(),
    ]);
    assert!(
        err.contains("--skip-verify"),
        "pull asks whom to trust: {err}"
    );
}

#[test]
fn rejects_an_unsigned_artifact() {
    let p = published();
    let unsigned = format!("oci://{}/capstan/unsigned:v1", p.registry.host);
    ok(&["plugin", "push", p.component.to_str().unwrap(), &unsigned]);
    let err = p.verify_fails(&unsigned);
    assert!(
        err.contains("no signatures found: the artifact is unsigned"),
        "{err}"
    );
    let err = p.pull_fails(&unsigned);
    assert!(err.contains("unsigned"), "{err}");
}

#[test]
fn rejects_the_wrong_key() {
    let p = published();
    let other = key_pair(p.registry.scratch(), "other");
    let err = fails(&[
        "plugin",
        "verify",
        &p.reference,
        "--key",
        other.1.to_str().unwrap(),
    ]);
    assert!(err.contains("allOf key \"other\""), "{err}");
    assert!(
        err.contains("cosign signature 1") && err.contains("not made by any key"),
        "{err}"
    );
}

#[test]
fn rejects_a_signature_over_a_different_digest() {
    let p = published();
    // Another artifact in the same repository, whose .sig tag holds the
    // first artifact's signature (a replayed signature).
    let (other_ref, other_digest) = p.push_variant("v2", 16);
    let other_digest: Digest = other_digest.parse().unwrap();
    let client = Client::new(ClientOptions::default()).unwrap();
    let repo = Reference::parse(&p.reference).unwrap();
    let first: Digest = p.digest.parse().unwrap();
    let (_, _, sig) = client
        .fetch_manifest(&repo.with_tag(&first.signature_tag()))
        .unwrap();
    client
        .push_manifest(
            &repo,
            Some(&other_digest.signature_tag()),
            oci::MANIFEST,
            &sig,
        )
        .unwrap();
    let err = p.verify_fails(&other_ref);
    assert!(
        err.contains(&format!(
            "the payload signs digest {}, not {other_digest}",
            p.digest
        )),
        "{err}"
    );
}

#[test]
fn rejects_a_tampered_layer() {
    let p = published();
    corrupt(&p.registry, p.manifest().layers[0].digest.as_str());
    // The signatures are over the manifest, so verify passes; the pull
    // refuses the bytes.
    let err = p.pull_fails(&p.reference);
    assert!(
        err.contains(&format!("blob {}", p.manifest().layers[0].digest))
            && err.contains("but got content with digest"),
        "{err}"
    );
}

#[test]
fn rejects_a_tampered_config() {
    let p = published();
    corrupt(&p.registry, p.manifest().config.digest.as_str());
    let err = p.pull_fails(&p.reference);
    assert!(
        err.contains(&format!("blob {}", p.manifest().config.digest))
            && err.contains("but got content with digest"),
        "{err}"
    );
}

#[test]
fn rejects_a_tampered_manifest() {
    let p = published();
    corrupt(&p.registry, &p.digest);
    let err = p.verify_fails(&p.reference);
    assert!(
        err.contains("manifest") && err.contains(&format!("requested {}", p.digest)),
        "{err}"
    );
    let err = p.verify_fails(&p.pinned());
    assert!(err.contains(&format!("requested {}", p.digest)), "{err}");
}

#[test]
fn rejects_a_tag_re_pushed_after_signing() {
    let p = published();
    let (_, new_digest) = p.push_variant("v1", 64);
    assert_ne!(new_digest, p.digest);
    let err = p.verify_fails(&p.reference);
    assert!(
        err.contains(&new_digest) && err.contains("unsigned"),
        "{err}"
    );
    // The signed digest itself still verifies.
    ok(&["plugin", "verify", &p.pinned(), "--key", p.pub_key()]);
}

#[test]
fn rejects_a_signature_payload_naming_another_repository() {
    let p = published();
    // Copy the artifact and its signature byte for byte to another repository.
    let client = Client::new(ClientOptions::default()).unwrap();
    let from = Reference::parse(&p.reference).unwrap();
    let to = Reference::parse(&format!("oci://{}/evil/sim-provider:v1", p.registry.host)).unwrap();
    let digest: Digest = p.digest.parse().unwrap();
    for tag in ["v1".to_string(), digest.signature_tag()] {
        let (_, _, bytes) = client.fetch_manifest(&from.with_tag(&tag)).unwrap();
        let m = Manifest::parse("m", &bytes).unwrap();
        for d in std::iter::once(&m.config).chain(&m.layers) {
            let blob = client
                .fetch_blob(&from, d, &capstan_registry::NoProgress)
                .unwrap();
            client
                .push_blob(&to, &blob, &capstan_registry::NoProgress)
                .unwrap();
        }
        client
            .push_manifest(&to, Some(&tag), oci::MANIFEST, &bytes)
            .unwrap();
    }
    let err = p.verify_fails(&to.to_string());
    assert!(
        err.contains(&format!("the payload names repository \"{}/capstan/sim-provider\", not \"{}/evil/sim-provider\"", p.registry.host, p.registry.host)),
        "{err}"
    );
}

#[test]
fn rejects_a_truncated_blob() {
    let p = published();
    let layer = p.manifest().layers[0].clone();
    let path = p.registry.blob_file(layer.digest.as_str());
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = p.pull_fails(&p.reference);
    assert!(
        err.contains("is truncated") && err.contains(&format!("expected {} bytes", layer.size)),
        "{err}"
    );
}

#[test]
fn rejects_oversized_blobs_declared_or_sent() {
    let p = published();
    // Declared: a 2 MiB component against a 1 MiB limit is refused before
    // a byte of it is downloaded.
    let (big_ref, _) = p.push_variant("big", 2 * 1024 * 1024);
    ok(&[
        "plugin",
        "sign",
        &big_ref,
        "--key",
        p.publisher.0.to_str().unwrap(),
    ]);
    let out = p.registry.scratch().join("big-pulled.wasm");
    let err = fails(&[
        "plugin",
        "pull",
        &big_ref,
        "-o",
        out.to_str().unwrap(),
        "--key",
        p.pub_key(),
        "--max-blob-mib",
        "1",
        "--oci-cache",
        p.registry.scratch().join("c1").to_str().unwrap(),
    ]);
    assert!(
        err.contains("above the limit of 1048576 bytes")
            && err.contains("size declared by the manifest"),
        "{err}"
    );
    assert!(!out.exists());

    // Sent: the registry serves more bytes than the manifest declares.
    let layer = p.manifest().layers[0].clone();
    let path = p.registry.blob_file(layer.digest.as_str());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&path, bytes).unwrap();
    let err = p.pull_fails(&p.reference);
    assert!(
        err.contains("bytes actually sent")
            && err.contains(&format!("the manifest says {}", layer.size)),
        "{err}"
    );
}

#[test]
fn rejects_a_registry_serving_another_digest_than_requested() {
    let p = published();
    // The registry's storage answers a request for the signed manifest with
    // a different, valid manifest (what a compromised mirror would do).
    let (_, other_digest) = p.push_variant("other", 8);
    std::fs::copy(
        p.registry.blob_file(&other_digest),
        p.registry.blob_file(&p.digest),
    )
    .unwrap();
    let err = p.verify_fails(&p.pinned());
    assert!(
        err.contains(&format!(
            "requested {} but got content with digest {other_digest}",
            p.digest
        )),
        "{err}"
    );
}

#[test]
fn authenticated_registry_over_tls_with_an_extra_ca() {
    let registry = Registry::start(RegistryOptions {
        tls: true,
        basic_auth: Some(("alice".into(), "s3cret-pass".into())),
        ..Default::default()
    })
    .expect("registry");
    let ca = registry.ca_file.clone().unwrap();
    let ca = ca.to_str().unwrap();
    let component = plugin("sim_provider");
    let component = component.to_str().unwrap();
    let reference = format!("oci://{}/capstan/sim-provider:v1", registry.host);

    // No extra CA: TLS fails and says so (no fallback to plain HTTP).
    let err = fails(&["plugin", "push", component, &reference]);
    assert!(err.contains("cannot reach https://"), "{err}");
    // The CA but no credentials: refused, with what to do.
    let err = fails(&["plugin", "push", component, &reference, "--ca-file", ca]);
    assert!(
        err.contains("refused access to capstan/sim-provider (401)")
            && err.contains("docker config.json"),
        "{err}"
    );
    // Credentials from a docker config.json.
    let config = registry.scratch().join("docker-config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"YWxpY2U6czNjcmV0LXBhc3M="}}}}}}"#,
            registry.host
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let digest = ok(&[
        "plugin",
        "push",
        component,
        &reference,
        "--ca-file",
        ca,
        "--registry-config",
        config,
    ]);
    let out = registry.scratch().join("pulled.wasm");
    ok(&[
        "plugin",
        "pull",
        &reference,
        "-o",
        out.to_str().unwrap(),
        "--skip-verify",
        "--ca-file",
        ca,
        "--registry-config",
        config,
        "--oci-cache",
        registry.scratch().join("cache").to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(component).unwrap()
    );
    assert!(digest.trim().starts_with("sha256:"));
    // The password never shows up in errors.
    let bad = registry.scratch().join("bad.json");
    std::fs::write(
        &bad,
        format!(
            r#"{{"auths":{{"{}":{{"username":"alice","password":"wrong-pass"}}}}}}"#,
            registry.host
        ),
    )
    .unwrap();
    let err = fails(&[
        "plugin",
        "push",
        component,
        &reference,
        "--ca-file",
        ca,
        "--registry-config",
        bad.to_str().unwrap(),
    ]);
    assert!(
        err.contains("refused access") && !err.contains("wrong-pass"),
        "{err}"
    );
}

/// Registries backed by S3 or a CDN answer blob downloads with a redirect to
/// a presigned URL. The download must follow it, must not carry the
/// registry's credentials there (S3 refuses a second auth mechanism, and the
/// storage host is not the registry), and must still be digest-checked.
#[test]
fn blob_downloads_follow_redirects_without_the_registry_credentials() {
    let registry = Registry::start(RegistryOptions {
        basic_auth: Some(("alice".into(), "s3cret-pass".into())),
        redirect_blobs: true,
        ..Default::default()
    })
    .expect("registry");
    let store = registry.blob_store.as_ref().unwrap();
    let scratch = registry.scratch();
    let config = scratch.join("docker-config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"auths":{{"{}":{{"username":"alice","password":"s3cret-pass"}}}}}}"#,
            registry.host
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let (key, public) = key_pair(scratch, "publisher");
    let component = plugin("sim_provider");
    let reference = format!("oci://{}/capstan/sim-provider:v1", registry.host);
    let digest = ok(&[
        "plugin",
        "push",
        component.to_str().unwrap(),
        &reference,
        "--registry-config",
        config,
    ])
    .trim()
    .to_string();
    ok(&[
        "plugin",
        "sign",
        &reference,
        "--key",
        key.to_str().unwrap(),
        "--registry-config",
        config,
    ]);
    let out = scratch.join("pulled.wasm");
    let pull = |cache: &str| {
        vec![
            "plugin".to_string(),
            "pull".into(),
            reference.clone(),
            "-o".into(),
            out.to_str().unwrap().into(),
            "--key".into(),
            public.to_str().unwrap().into(),
            "--registry-config".into(),
            config.into(),
            "--oci-cache".into(),
            scratch.join(cache).to_str().unwrap().into(),
        ]
    };
    let args = pull("cache-a");
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&component).unwrap()
    );
    assert!(
        store.served() >= 2,
        "the signature payload and the component came from the blob store ({} served)",
        store.served()
    );
    assert_eq!(
        store.with_authorization(),
        0,
        "the registry's credentials followed a redirect"
    );

    // Whatever the storage host sends is checked like the registry's own.
    let client = Client::new(ClientOptions {
        registry_config: Some(config.into()),
        ..Default::default()
    })
    .unwrap();
    let pinned =
        Reference::parse(&format!("{}@{digest}", reference.trim_end_matches(":v1"))).unwrap();
    let (_, _, bytes) = client.fetch_manifest(&pinned).unwrap();
    let layer = Manifest::parse("m", &bytes).unwrap().layers[0].clone();
    corrupt(&registry, layer.digest.as_str());
    let args = pull("cache-b");
    let err = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        err.contains(&format!("blob {}", layer.digest))
            && err.contains("but got content with digest"),
        "{err}"
    );
    assert_eq!(store.with_authorization(), 0);
}
