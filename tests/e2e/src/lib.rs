//! Fixtures shared by Capstan's end-to-end tests: the wasm test plugins
//! (built on demand, never committed) and helpers around the simulated cloud.
//!
//! [`plugin`] returns the path of a plugin component, building every plugin
//! under `plugins/` for `wasm32-wasip2` once per test process (a no-op when
//! they are up to date). Set `CAPSTAN_PLUGIN_DIR` to use prebuilt components
//! instead. [`control_plane`] starts a real control plane (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler); [`env`] adds
//! the CRDs, the simulated cloud and its kubelet, and the controllers;
//! [`workloads`] runs Deployments, DaemonSets, disruption budgets and
//! evictions on it; [`registry`] starts real OCI registries (Debian's
//! docker-registry).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The plugins built for tests, by crate name.
pub const PLUGIN_CRATES: [&str; 10] = [
    "sim-provider",
    "sim-updater",
    "sim-tagger",
    "sim-team-tagger",
    "broken-updater",
    "hostile-plugin",
    "ec2-provider",
    "coredns-addon",
    "node-exporter-addon",
    "greedy-addon",
];

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/e2e sits two levels below the workspace root")
        .to_path_buf()
}

/// Where the wasm build of the plugins goes (its own target dir, so it never
/// waits on the host build's lock).
pub fn plugin_target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("plugins")
}

static OWN_GROUPS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, long-running children (the control plane, the controller,
/// the registry) start in process groups of their own, so a Ctrl-C in a
/// terminal (SIGINT to the whole foreground group) reaches only this
/// process, which then releases every instance before it stops them. For
/// programs that handle Ctrl-C (the quickstart); tests leave it off, so an
/// interrupted `cargo test` takes its children with it.
pub fn children_in_own_process_groups() {
    OWN_GROUPS.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Put `cmd` in a process group of its own if
/// [`children_in_own_process_groups`] was called.
pub(crate) fn detached(cmd: &mut Command) -> &mut Command {
    if OWN_GROUPS.load(std::sync::atomic::Ordering::SeqCst) {
        std::os::unix::process::CommandExt::process_group(cmd, 0);
    }
    cmd
}

static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Build the test plugins (release, `wasm32-wasip2`) and return their folder.
pub fn plugin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CAPSTAN_PLUGIN_DIR") {
        // Canonical, so `file://` sources built from it have no `//` or
        // `..` (which the controller refuses).
        let dir = PathBuf::from(dir);
        return std::fs::canonicalize(&dir).unwrap_or(dir);
    }
    BUILT
        .get_or_init(|| {
            let target_dir = plugin_target_dir();
            let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cmd.current_dir(workspace_root())
                .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
                .arg(&target_dir);
            for krate in PLUGIN_CRATES {
                cmd.args(["-p", krate]);
            }
            let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "building the test plugins failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`):\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(target_dir.join("wasm32-wasip2").join("release"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Path of a built plugin component, e.g. `plugin("sim_provider")`.
pub fn plugin(file_stem: &str) -> PathBuf {
    let path = plugin_dir().join(format!("{file_stem}.wasm"));
    assert!(
        path.exists(),
        "plugin component {} is missing",
        path.display()
    );
    path
}

pub use capstan_sim_cloud as sim_cloud;

pub mod bench_clusters;
pub mod blob_store;
pub mod cli;
pub mod control_plane;
pub mod env;
pub mod install;
#[cfg(feature = "moto")]
pub mod moto;
pub mod plot;
pub mod registry;
pub mod rollout_watch;
pub mod workloads;
