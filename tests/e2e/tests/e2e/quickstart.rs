//! The README's first command, as a user runs it: `capstan-quickstart`
//! brings up the control plane, the cloud, a `capstan controller` process and
//! the sample MachineDeployment, reaches Ready, prints `kubectl get
//! md,ms,ma`, installs CoreDNS through the coredns addon plugin until it is
//! healthy, and (with `--exit-when-ready`) releases every instance.

use std::process::Command;

#[test]
fn quickstart_reaches_ready_and_cleans_up() {
    // The quickstart runs the `capstan` binary next to it, which
    // `cargo test --workspace` builds (the CLI's tests need it).
    capstan_e2e::env::capstan_bin().expect("the capstan binary is built");
    capstan_e2e::plugin("sim_provider");

    let out = Command::new(env!("CARGO_BIN_EXE_capstan-quickstart"))
        .args(["--exit-when-ready", "--boot-latency-ms", "500"])
        .output()
        .expect("the quickstart runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "quickstart failed:\n{stdout}\n{stderr}"
    );
    for expected in [
        "==> kubectl apply -f",
        "machinehealthcheck.capstan.dev/quickstart created",
        "3 Ready",
        "machinedeployment.capstan.dev/quickstart   3          3       3         3           v1.30.0   Running",
        "sim://i-",
        "addon.capstan.dev/dns created",
        "==> CoreDNS healthy; kubectl get addons",
        "healthy true (availableReplicas=2/2",
        "cloud instances left: 0",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
}

/// The README's "Distributing and signing plugins" walk-through, as
/// `capstan-quickstart --oci` runs it: key, push, sign, verify, trust
/// policy, an `oci://` Plugin verified by the controller, machines Ready.
#[test]
fn quickstart_with_a_signed_oci_plugin() {
    capstan_e2e::env::capstan_bin().expect("the capstan binary is built");
    capstan_e2e::plugin("sim_provider");
    let out = Command::new(env!("CARGO_BIN_EXE_capstan-quickstart"))
        .args([
            "--oci",
            "--no-addon",
            "--exit-when-ready",
            "--boot-latency-ms",
            "500",
            "--replicas",
            "2",
        ])
        .output()
        .expect("the quickstart runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "quickstart --oci failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "capstan key generate",
        "capstan plugin push",
        "capstan plugin sign",
        "signed by publisher",
        "--trust-policy=",
        "==> Plugin/sim-oci verified and loaded: oci://",
        "2 Ready",
        "cloud instances left: 0",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
}
