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
        "plugin.capstan.dev/kubeadm-bootstrap created",
        "==> kubectl apply -f",
        "machinehealthcheck.capstan.dev/quickstart created",
        "3 Ready",
        // Cluster API's columns: CLUSTER (none), AVAILABLE, DESIRED,
        // CURRENT, READY, AVAILABLE, UP-TO-DATE, PHASE.
        "machinedeployment.capstan.dev/quickstart             True        3         3         3       3           3            Running",
        "sim://i-",
        "==> the Nodes joined with their own certificates; kubectl get csr",
        "kubernetes.io/kube-apiserver-client-kubelet",
        "Approved,Issued",
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

/// Ctrl-C from a terminal signals the whole foreground process group, not
/// the quickstart alone: it must still release every instance and exit 0
/// (the control plane and the controller are in groups of their own, so
/// they outlive the signal until the instances are gone).
#[test]
fn ctrl_c_to_the_process_group_releases_every_instance() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    capstan_e2e::env::capstan_bin().expect("the capstan binary is built");
    capstan_e2e::plugin("sim_provider");
    // Its log goes to a file (a pipe nobody reads could fill and stall it).
    let stderr_path =
        std::env::temp_dir().join(format!("quickstart-ctrl-c-{}.log", std::process::id()));
    let stderr_file = std::fs::File::create(&stderr_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_capstan-quickstart"))
        .args(["--no-addon", "--boot-latency-ms", "500", "--replicas", "2"])
        // A terminal's foreground job: a process group of its own.
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr_file)
        .spawn()
        .expect("the quickstart runs");
    let group = child.id();
    let stdout = child.stdout.take().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            all.push_str(&line);
            all.push('\n');
            let _ = lines.send(line);
        }
        all
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match seen.recv_timeout(left) {
            Ok(line) if line.starts_with("Press Ctrl-C to stop") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!(
                    "the quickstart never got ready ({e}):\n{}",
                    reader.join().unwrap()
                );
            }
        }
    }
    // `kill -s INT -- -PGID`: procps' `kill -INT -PGID` signals nothing.
    let interrupt = || {
        let sent = Command::new("kill")
            .args(["-s", "INT", "--", &format!("-{group}")])
            .status()
            .expect("kill");
        assert!(sent.success());
    };
    interrupt();
    let waited = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the quickstart") {
            break status;
        }
        if waited.elapsed() > std::time::Duration::from_secs(180) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the quickstart did not stop within 180 s of Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let stdout = reader.join().unwrap();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    assert!(
        status.success(),
        "Ctrl-C to the group failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("cloud instances left: 0"),
        "instances left behind:\n{stdout}"
    );
}
