//! Interoperability with sigstore-js, an independent Sigstore implementation
//! (installed by scripts/setup.sh into ~/.cache/capstan/sigstore-js):
//! what Capstan signs, sigstore-js verifies straight from the registry; what
//! sigstore-js signs, Capstan verifies. Both directions also check that a
//! wrong key is refused. The cosign private-key format is cross-checked
//! against independent crypto (OpenSSL scrypt, libsodium secretbox,
//! pyca/cryptography) in ~/.cache/capstan/python.

use capstan_e2e::cli::{fails, key_pair, ok};
use capstan_e2e::plugin;
use capstan_e2e::registry::{Registry, RegistryOptions};
use std::path::PathBuf;
use std::process::Command;

fn sigstore_js(args: &[&str]) -> std::process::Output {
    node_script("sigstore-js.cjs", args)
}

/// Run `tests/e2e/interop/SCRIPT` with sigstore-js's modules on its path.
pub(crate) fn node_script(script: &str, args: &[&str]) -> std::process::Output {
    let modules = std::env::var_os("CAPSTAN_SIGSTORE_JS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/capstan/sigstore-js")
        })
        .join("node_modules");
    assert!(
        modules.join("@sigstore/verify").exists() && modules.join("@sigstore/mock").exists(),
        "sigstore-js is not installed in {}; run scripts/setup.sh",
        modules.display()
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("interop")
        .join(script);
    Command::new("node")
        .arg(script)
        .args(args)
        .env("NODE_PATH", modules)
        .output()
        .expect("run node")
}

#[test]
fn capstan_and_sigstore_js_verify_each_others_signatures() {
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let dir = registry.scratch();
    let (key, public) = key_pair(dir, "publisher");
    let component = plugin("sim_provider");
    let reference = format!("oci://{}/capstan/sim-provider:v1", registry.host);
    let digest = ok(&["plugin", "push", component.to_str().unwrap(), &reference])
        .trim()
        .to_string();
    // Capstan signs both ways: a cosign .sig and a Sigstore bundle referrer.
    ok(&[
        "plugin",
        "sign",
        &reference,
        "--key",
        key.to_str().unwrap(),
        "--bundle",
    ]);

    // Capstan -> sigstore-js, read from the registry by sigstore-js itself.
    let verify_registry = |public: &str| {
        sigstore_js(&[
            "verify-registry",
            "--registry",
            &registry.host,
            "--repository",
            "capstan/sim-provider",
            "--digest",
            &digest,
            "--pub",
            public,
        ])
    };
    let out = verify_registry(public.to_str().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sigstore-js refused Capstan's signatures: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("cosign signature") && stdout.contains("sigstore bundle"),
        "{stdout}"
    );

    // sigstore-js -> Capstan: a DSSE bundle made by sigstore-js's builder.
    let js = dir.join("js");
    assert!(
        sigstore_js(&["genkey", "--out-prefix", js.to_str().unwrap()])
            .status
            .success()
    );
    let bundle = dir.join("js-bundle.json");
    let out = sigstore_js(&[
        "sign",
        "--key",
        dir.join("js.pem").to_str().unwrap(),
        "--name",
        &format!("{}/capstan/sim-provider", registry.host),
        "--digest",
        &digest,
        "--out",
        bundle.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let js_pub = dir.join("js.pub");
    let out = ok(&[
        "plugin",
        "verify",
        &reference,
        "--key",
        js_pub.to_str().unwrap(),
        "--bundle",
        bundle.to_str().unwrap(),
    ]);
    assert!(
        out.contains("signed by js") && out.contains("js-bundle.json"),
        "{out}"
    );

    // Wrong keys are refused in both directions.
    let out = verify_registry(js_pub.to_str().unwrap());
    assert!(
        !out.status.success(),
        "sigstore-js accepted Capstan's signature under another key"
    );
    let err = fails(&[
        "plugin",
        "verify",
        &reference,
        "--key",
        public.to_str().unwrap(),
        "--key",
        js_pub.to_str().unwrap(),
    ]);
    assert!(
        err.contains("allOf key \"js\""),
        "without the bundle file, js has no signature: {err}"
    );

    // A sigstore-js bundle for another digest does not count for this one.
    let other = dir.join("other-bundle.json");
    let zeros = format!("sha256:{}", "0".repeat(64));
    assert!(
        sigstore_js(&[
            "sign",
            "--key",
            dir.join("js.pem").to_str().unwrap(),
            "--name",
            &format!("{}/capstan/sim-provider", registry.host),
            "--digest",
            &zeros,
            "--out",
            other.to_str().unwrap(),
        ])
        .status
        .success()
    );
    let err = fails(&[
        "plugin",
        "verify",
        &reference,
        "--key",
        js_pub.to_str().unwrap(),
        "--bundle",
        other.to_str().unwrap(),
    ]);
    assert!(err.contains("do not include"), "{err}");
    let err = fails(&[
        "plugin",
        "attach",
        &reference,
        "--bundle",
        other.to_str().unwrap(),
    ]);
    assert!(
        err.contains("is not about") && err.contains("do not include"),
        "{err}"
    );

    // Attached as an OCI referrer, the sigstore-js bundle is found without
    // the file, next to Capstan's own signature.
    let attached = ok(&[
        "plugin",
        "attach",
        &reference,
        "--bundle",
        bundle.to_str().unwrap(),
    ]);
    assert!(attached.contains("as referrer sha256:"), "{attached}");
    let out = ok(&[
        "plugin",
        "verify",
        &reference,
        "--key",
        public.to_str().unwrap(),
        "--key",
        js_pub.to_str().unwrap(),
    ]);
    assert!(
        out.contains("signed by publisher") && out.contains("signed by js"),
        "{out}"
    );
}

/// `cosign_key.py ARGS` in the venv scripts/setup.sh prepares.
fn python_key_tool_output(args: &[&str]) -> std::process::Output {
    let env = std::env::var_os("CAPSTAN_PYTHON_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/capstan/python")
        });
    let python = env.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing; run scripts/setup.sh",
        python.display()
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop/cosign_key.py");
    Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .expect("run python")
}

fn python_key_tool(args: &[&str]) -> String {
    let out = python_key_tool_output(args);
    assert!(
        out.status.success(),
        "cosign_key.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cosign_key_format_round_trips_with_independent_crypto() {
    let registry = Registry::start(RegistryOptions::default()).expect("registry");
    let dir = registry.scratch();
    let password = capstan_e2e::cli::PASSWORD;

    // Capstan writes, independent crypto decrypts to the same public key.
    let (key, public) = key_pair(dir, "capstan");
    let decrypted = python_key_tool(&["decrypt", key.to_str().unwrap(), password]);
    assert_eq!(
        decrypted.trim(),
        std::fs::read_to_string(&public).unwrap().trim()
    );
    let wrong = python_key_tool_output(&["decrypt", key.to_str().unwrap(), "not-the-password"]);
    assert!(
        !wrong.status.success(),
        "the password really encrypts the key"
    );

    // Independent crypto writes a key (N=65536, as cosign does); Capstan
    // signs with it, and what it signs verifies with that key's .pub.
    let prefix = dir.join("python");
    python_key_tool(&["generate", prefix.to_str().unwrap(), password]);
    let reference = format!("oci://{}/capstan/sim-provider:v1", registry.host);
    ok(&[
        "plugin",
        "push",
        plugin("sim_provider").to_str().unwrap(),
        &reference,
    ]);
    ok(&[
        "plugin",
        "sign",
        &reference,
        "--key",
        prefix.with_extension("key").to_str().unwrap(),
    ]);
    let out = ok(&[
        "plugin",
        "verify",
        &reference,
        "--key",
        prefix.with_extension("pub").to_str().unwrap(),
    ]);
    assert!(out.contains("signed by python"), "{out}");

    // And a signature pyca/cryptography makes verifies in Capstan.
    let message = dir.join("message");
    std::fs::write(&message, b"capstan interop").unwrap();
    let signature = python_key_tool(&[
        "sign",
        prefix.with_extension("key").to_str().unwrap(),
        password,
        message.to_str().unwrap(),
    ]);
    use base64::Engine as _;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(signature.trim())
        .unwrap();
    let public = capstan_registry::keys::PublicKey::from_pem(
        "python.pub",
        &std::fs::read_to_string(prefix.with_extension("pub")).unwrap(),
    )
    .unwrap();
    assert!(public.verifies(b"capstan interop", &signature));
    assert!(!public.verifies(b"something else", &signature));
}
