//! Running the `capstan` binary from tests, the way a user would, and
//! small helpers the supply-chain tests share.

use crate::env::capstan_bin;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The password tests encrypt their keys with.
pub const PASSWORD: &str = "test-password";

/// Run `capstan ARGS` with `CAPSTAN_PASSWORD` set and an empty docker config.
pub fn capstan(args: &[&str]) -> Output {
    let bin = capstan_bin().expect("capstan binary");
    Command::new(bin)
        .args(args)
        .env("CAPSTAN_PASSWORD", PASSWORD)
        .env("DOCKER_CONFIG", "/nonexistent-capstan-test")
        .env_remove("CAPSTAN_TRUST_POLICY")
        .output()
        .expect("run capstan")
}

/// Run and require success; returns stdout.
#[track_caller]
pub fn ok(args: &[&str]) -> String {
    let out = capstan(args);
    assert!(
        out.status.success(),
        "capstan {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run and require failure; returns stderr.
#[track_caller]
pub fn fails(args: &[&str]) -> String {
    let out = capstan(args);
    assert!(
        !out.status.success(),
        "capstan {args:?} should have failed but printed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Generate a key pair `DIR/NAME.key` / `DIR/NAME.pub`; returns both paths.
pub fn key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let prefix = dir.join(name);
    ok(&[
        "key",
        "generate",
        "--output-prefix",
        prefix.to_str().expect("utf-8 path"),
    ]);
    (prefix.with_extension("key"), prefix.with_extension("pub"))
}

/// A Plugin's `spec.verification` requiring a signature by the key pair
/// `public` (as made by [`key_pair`]), under the name `publisher`.
pub fn publisher_verification(public: &Path) -> capstan_api::PluginVerification {
    capstan_api::PluginVerification {
        public_keys: vec![capstan_api::NamedPublicKey {
            name: "publisher".into(),
            public_key: std::fs::read_to_string(public).expect("the public key"),
        }],
        identities: vec![],
        all_of: vec!["publisher".into()],
        any_of: vec![],
    }
}

/// A host trust policy: `prefix` must be signed by the key pair `public`
/// (named `publisher`).
pub fn publisher_policy(prefix: &str, public: &Path) -> capstan_registry::policy::TrustPolicy {
    let pem = std::fs::read_to_string(public).expect("the public key");
    let text = format!(
        "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    publicKey: |\n      {}\nsources:\n  - prefix: {prefix}\n    allOf: [publisher]\n",
        pem.trim_end().replace('\n', "\n      ")
    );
    capstan_registry::policy::TrustPolicy::parse("test policy", &text, None)
        .expect("a valid policy")
}

/// The component with an extra custom section of `size` bytes appended:
/// the same plugin (same manifest), a different digest.
pub fn padded(component: &[u8], name: &str, size: usize) -> Vec<u8> {
    use capstan_manifest::component::write_leb;
    let mut payload = Vec::new();
    write_leb(&mut payload, name.len());
    payload.extend_from_slice(name.as_bytes());
    payload.resize(payload.len() + size, 0x5a);
    let mut out = component.to_vec();
    out.push(0);
    write_leb(&mut out, payload.len());
    out.extend_from_slice(&payload);
    out
}

/// The component with its embedded plugin manifest replaced by `json`, as
/// `capstan plugin annotate` does: a new revision of the same plugin
/// declaring something else.
pub fn with_manifest(component: &[u8], json: &str) -> Vec<u8> {
    capstan_manifest::embed_manifest(component, json.as_bytes()).expect("a manifest that fits")
}
