//! The controller image as a platform team gets it: built here without a
//! container engine (`scripts/build-image.sh`), reproducible, non-root,
//! labelled; unpacked and run the way the Deployment `capstan install`
//! prints runs it (its flags, the ServiceAccount's token, CA and namespace
//! at the standard path, `KUBERNETES_SERVICE_*`, a read-only root, uid
//! 65532, the generated RBAC), until a MachineDeployment is Ready; and
//! carried with a plugin through an air-gap bundle to a mirror, digest
//! unchanged, for `capstan install --image`.

use crate::logs;
use capstan_api::MachineDeployment;
use capstan_e2e::cli::{self, key_pair, ok};
use capstan_e2e::control_plane::free_port;
use capstan_e2e::env::{CAPSTAN_NAMESPACE, ControllerProcess, Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::install::{install_docs, kubectl_apply, rbac_docs, service_account_token};
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::Faults;
use capstan_e2e::{plugin, workspace_root};
use kube::api::{Api, PostParams};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const BINARY: &str = "/usr/local/bin/capstan";
const UID: u32 = 65532;
const LONG: Duration = Duration::from_secs(120);

/// Run a command; its stdout, or a panic with everything it printed.
#[track_caller]
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn build_image() -> Command {
    let mut cmd = Command::new(workspace_root().join("scripts/build-image.sh"));
    cmd.current_dir(workspace_root());
    cmd
}

/// The image layout of this checkout: `scripts/build-image.sh` runs once
/// per test process (CI built it just before the tests, so cargo has
/// nothing to do and only the layout is rewritten; after a source change
/// the release binary is rebuilt first, which takes a while).
fn image_layout() -> &'static Path {
    static LAYOUT: OnceLock<PathBuf> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        run(&mut build_image());
        target.join("image/capstan")
    })
}

/// The manifest digest the layout's `index.json` names for the version tag.
fn layout_digest(layout: &Path) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let entry = &index["manifests"][0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        VERSION
    );
    entry["digest"].as_str().unwrap().to_string()
}

#[test]
fn the_image_is_reproducible_non_root_and_labelled() {
    let layout = image_layout();
    let reference = format!("oci:{}:{VERSION}", layout.display());
    let config: Value = serde_json::from_str(&run(
        Command::new("skopeo").args(["inspect", "--config", &reference])
    ))
    .unwrap();
    let c = &config["config"];
    assert_eq!(c["User"], format!("{UID}:{UID}"));
    assert_eq!(c["Entrypoint"], serde_json::json!([BINARY, "controller"]));
    let labels = &c["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(
        revision.len() >= 40 && revision[..40].bytes().all(|b| b.is_ascii_hexdigit()),
        "a git commit: {revision}"
    );
    assert!(
        labels["org.opencontainers.image.source"]
            .as_str()
            .unwrap()
            .starts_with("https://"),
        "{labels}"
    );
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let inspected: Value =
        serde_json::from_str(&run(Command::new("skopeo").args(["inspect", &reference]))).unwrap();
    let digest = layout_digest(layout);
    assert_eq!(inspected["Digest"], digest.as_str());

    // Built again from the same commit (and binary): the same digest.
    let again = tempfile::tempdir().unwrap();
    let out = again.path().join("capstan");
    let printed = run(build_image().args(["--no-build", "--out", out.to_str().unwrap()]));
    assert_eq!(layout_digest(&out), digest);
    assert!(printed.trim_end().ends_with(&digest), "{printed}");
}

/// The container's root filesystem: the image unpacked by umoci.
fn unpack(layout: &Path, into: &Path) -> PathBuf {
    let bundle = into.join("bundle");
    run(Command::new("umoci").args([
        "unpack",
        "--image",
        &format!("{}:{VERSION}", layout.display()),
        bundle.to_str().unwrap(),
    ]));
    let rootfs = bundle.join("rootfs");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains(&format!(":{UID}:{UID}:")), "{passwd}");
    rootfs
}

/// What the kubelet would do for the Deployment's pod, with a mount
/// namespace instead of a container runtime: the ServiceAccount's files at
/// the standard path, emptyDirs on /tmp and the cache, the root remounted
/// read-only, then `capstan controller FLAGS` as uid and gid 65532 with
/// only the pod's environment.
fn pod_command(rootfs: &Path, service_account: &Path, cache: &Path, flags: &[String]) -> Command {
    let plugins = capstan_e2e::plugin_dir();
    let script = r#"set -eu
R="$1"; SA="$2"; CACHE="$3"; PLUGINS="$4"; shift 4
mount --bind "$R" "$R"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount --bind "$CACHE" "$R/var/cache/capstan"
mkdir -p "$R/var/run/secrets/kubernetes.io/serviceaccount" "$R/proc" "$R/dev" "$R$PLUGINS"
mount --bind "$SA" "$R/var/run/secrets/kubernetes.io/serviceaccount"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount --bind "$PLUGINS" "$R$PLUGINS"
mount -o remount,bind,ro "$R$PLUGINS"
mount -o remount,bind,ro "$R"
exec chroot --userspec=65532:65532 "$R" "$@"
"#;
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "pod",
    ])
    .arg(rootfs)
    .arg(service_account)
    .arg(cache)
    .arg(&plugins)
    // The image's entrypoint, then the Deployment's args.
    .args([BINARY, "controller"])
    .args(flags)
    .env_clear()
    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_runs_the_controller_as_its_deployment_would() {
    logs();
    let layout = image_layout();
    let env = Env::start(Faults::default()).await.expect("environment");
    let dir = tempfile::tempdir().unwrap();
    let rootfs = unpack(layout, dir.path());

    // The RBAC `capstan install` generates, and what a pod of its
    // Deployment would mount for the ServiceAccount.
    kubectl_apply(&env, &rbac_docs(None));
    let service_account = dir.path().join("serviceaccount");
    std::fs::create_dir(&service_account).unwrap();
    std::fs::write(
        service_account.join("token"),
        service_account_token(&env).await,
    )
    .unwrap();
    std::fs::write(service_account.join("ca.crt"), &env.control_plane.ca_pem).unwrap();
    std::fs::write(service_account.join("namespace"), CAPSTAN_NAMESPACE).unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(UID), Some(UID)).unwrap();

    // The Deployment's container, as printed: its flags (the metrics and
    // health servers moved to a free loopback port, as no pod network
    // separates this from other tests) and its environment.
    let docs = install_docs();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], UID);
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let port = free_port();
    let flags: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            match a.split_once('=') {
                Some(("--metrics-addr" | "--health-addr", _)) => {
                    format!("{}=127.0.0.1:{port}", a.split_once('=').unwrap().0)
                }
                _ => a.to_string(),
            }
        })
        .collect();
    let (host, api_port) = env
        .control_plane
        .url
        .trim_start_matches("https://")
        .split_once(':')
        .expect("https://HOST:PORT");
    let mut cmd = pod_command(&rootfs, &service_account, &cache, &flags);
    cmd.env("KUBERNETES_SERVICE_HOST", host)
        .env("KUBERNETES_SERVICE_PORT", api_port)
        .env("CAPSTAN_NAMESPACE", CAPSTAN_NAMESPACE)
        .env("POD_NAME", "capstan-controller-image-test")
        .env("RUST_LOG", "info,kube=warn")
        // The test plugins are built here, unsigned: trusted as a
        // development directory, as every other controller in the tests.
        .env("CAPSTAN_ALLOW_UNSIGNED_DIRS", capstan_e2e::plugin_dir());
    for var in container["env"].as_array().unwrap() {
        if let Some(value) = var["value"].as_str() {
            cmd.env(var["name"].as_str().unwrap(), value);
        }
    }
    let log = dir.path().join("controller.log");
    let mut controller = ControllerProcess::spawn(cmd, port, log.clone()).unwrap();
    controller
        .wait_ready(LONG)
        .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));

    // Not root: the process's real and effective uid, seen from outside.
    let status = std::fs::read_to_string(format!("/proc/{}/status", controller.pid())).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uids.split_whitespace().skip(1).collect::<Vec<_>>(),
        vec!["65532"; 4],
        "{uids}"
    );

    let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), 2, "v1.30.0");
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    let rolled = tokio::time::timeout(LONG, env.wait_rolled_out("default", "pool", LONG)).await;
    if rolled.is_err() {
        panic!(
            "not rolled out; controller log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("Forbidden"),
        "the generated RBAC suffices:\n{text}"
    );
    controller.stop();
    assert!(controller.exited().is_some());
}

#[test]
fn a_bundle_carries_the_signed_image_to_a_mirror_with_its_digest() {
    let layout = image_layout();
    let mut a = Registry::start(RegistryOptions::default()).expect("registry A");
    let b = Registry::start(RegistryOptions::default()).expect("registry B");
    let dir = a.scratch().to_path_buf();
    let (key, _) = key_pair(&dir, "publisher");
    let digest = layout_digest(layout);

    // The publisher pushes the image (digest preserved) and signs it, and
    // a plugin beside it.
    let pushed = run(build_image().args([
        "--no-build",
        "--out",
        dir.join("layout").to_str().unwrap(),
        "--push",
        &format!("{}/capstan/controller", a.host),
        "--insecure",
    ]));
    assert_eq!(
        pushed.lines().last().unwrap(),
        format!("{}/capstan/controller@{digest}", a.host)
    );
    let image = format!("oci://{}/capstan/controller:{VERSION}", a.host);
    let signed = ok(&["plugin", "sign", &image, "--key", key.to_str().unwrap()]);
    assert!(signed.contains(&digest), "{signed}");
    let plugin_source = format!("oci://{}/capstan/sim-provider:v1", a.host);
    ok(&[
        "plugin",
        "push",
        plugin("sim_provider").to_str().unwrap(),
        &plugin_source,
    ]);
    ok(&[
        "plugin",
        "sign",
        &plugin_source,
        "--key",
        key.to_str().unwrap(),
    ]);
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!("apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    path: publisher.pub\nsources:\n  - prefix: oci://{}/capstan/\n    allOf: [publisher]\n", a.host),
    )
    .unwrap();

    // An unsigned image is not carried.
    let unsigned = format!("oci://{}/capstan/unsigned:{VERSION}", a.host);
    run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        "--preserve-digests",
        "--dest-tls-verify=false",
        &format!("oci:{}:{VERSION}", layout.display()),
        &format!("docker://{}", unsigned.trim_start_matches("oci://")),
    ]));
    let spec = dir.join("bundle.yaml");
    std::fs::write(
        &spec,
        format!("apiVersion: capstan.dev/v1alpha1\nkind: Bundle\nplugins:\n  - {plugin_source}\nimages:\n  - {image}\n  - {unsigned}\npolicy: policy.yaml\n"),
    )
    .unwrap();
    let archive = dir.join("site.tar");
    let args = [
        "bundle",
        "create",
        "-f",
        spec.to_str().unwrap(),
        "-o",
        archive.to_str().unwrap(),
    ];
    let err = cli::fails(&args);
    assert!(err.contains("unsigned") && err.contains(&digest), "{err}");
    assert!(!archive.exists(), "nothing half-written");

    std::fs::write(
        &spec,
        format!("apiVersion: capstan.dev/v1alpha1\nkind: Bundle\nplugins:\n  - {plugin_source}\nimages:\n  - {image}\npolicy: policy.yaml\n"),
    )
    .unwrap();
    let out = ok(&args);
    assert!(
        out.contains(&format!("image {image} {digest}  signed by publisher")),
        "{out}"
    );

    // Across the gap: A is gone; the site verifies and mirrors to B.
    a.stop();
    // An image entry whose mark was taken off would skip verification; the
    // bundle is refused instead, since push would mirror it unverified.
    let mut bytes = std::fs::read(&archive).unwrap();
    let mark = br#""dev.capstan.bundle.kind":"image""#;
    let at = bytes
        .windows(mark.len())
        .position(|w| w == mark)
        .expect("the image's mark in index.json");
    bytes[at..at + mark.len()].copy_from_slice(br#""dev.capstan.bundle.kinx":"image""#);
    let tampered = dir.join("unmarked.tar");
    std::fs::write(&tampered, bytes).unwrap();
    let err = cli::fails(&[
        "bundle",
        "verify",
        tampered.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(
        err.contains(&format!(
            "entry {image} is neither a verified plugin or image"
        )),
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
    let verified: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(verified["images"][0]["digest"], digest.as_str());
    let out = ok(&[
        "bundle",
        "push",
        archive.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--to",
        &format!("{}/mirror", b.host),
    ]);
    let mirrored = format!("{}/mirror/capstan/controller", b.host);
    assert!(
        out.contains(&format!("oci://{mirrored}:{VERSION} ({digest})")),
        "{out}"
    );
    // The registry serves it under the same digest, as a kubelet would pull it.
    let inspected: Value = serde_json::from_str(&run(Command::new("skopeo").args([
        "inspect",
        "--tls-verify=false",
        &format!("docker://{mirrored}:{VERSION}"),
    ])))
    .unwrap();
    assert_eq!(inspected["Digest"], digest.as_str());
    assert_eq!(
        inspected["Labels"]["org.opencontainers.image.version"],
        VERSION
    );

    // The site installs from the mirror: directly, or by rewriting the
    // publisher's reference.
    let pinned_at_a = format!("{}/capstan/controller:{VERSION}@{digest}", a.host);
    for args in [
        vec![
            "install".to_string(),
            "--image".into(),
            format!("{mirrored}@{digest}"),
        ],
        vec![
            "install".into(),
            "--image".into(),
            pinned_at_a.clone(),
            "--image-mirror".into(),
            format!("{}/={}/mirror/", a.host, b.host),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cli::capstan(&args);
        assert!(out.status.success(), "{args:?}");
        let yaml = String::from_utf8_lossy(&out.stdout);
        assert!(yaml.contains(&format!("image: {mirrored}")), "{yaml}");
        assert!(yaml.contains(&format!("@{digest}\n")), "{yaml}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("not pinned"),
            "pinned by digest"
        );
    }
    // A tag alone is accepted with a warning.
    let out = cli::capstan(&["install", "--image", &format!("{mirrored}:{VERSION}")]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not pinned by a digest"));
}
