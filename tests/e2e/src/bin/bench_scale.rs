//! `capstan-bench-scale`: scale a MachineDeployment from 0 to N machines
//! until all are Ready, once through the Wasm sim-provider and once through
//! the same provider logic compiled natively, each with its own controller
//! process (`capstan controller`, and `capstan-bench-controller` from
//! `tests/bench` for the native variant), side by side in one run against one local
//! control plane and simulated cloud. Prints `name value` lines (not a timed
//! test): time to all Ready, controller CPU seconds, controller peak RSS, API
//! writes per machine, the API server's CPU seconds, the Wasm/native ratio
//! of each, and the writes and the API server's and etcd's CPU during an
//! idle period after convergence.
//!
//! The simulated kubelet's heartbeats are off by default (Nodes stay as
//! registered; the node-lifecycle grace period is an hour);
//! `--heartbeat-interval-ms 10000` renews every Node's Lease every 10 s as a
//! real kubelet does, with Kubernetes' default 40 s grace period, to show
//! what heartbeats of N Nodes cost the API server.

use anyhow::{Context, bail};
use capstan_api::MachineDeployment;
use capstan_e2e::control_plane::ControlPlaneOptions;
use capstan_e2e::env::{
    CLOUD_TOKEN, ControllerProcess, Env, EnvOptions, SIM_PLUGIN, capstan_bin, sample_deployment,
};
use capstan_e2e::sim_cloud::{Faults, KubeletConfig};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: capstan-bench-scale [--machines N] [--idle-seconds S] [--boot-latency-ms MS] [--heartbeat-interval-ms MS]
  --machines N              machines to scale to (default 1000)
  --idle-seconds S          idle period after convergence in which writes and CPU are counted (default 60)
  --boot-latency-ms MS      simulated instance boot time (default 1000)
  --heartbeat-interval-ms MS  the simulated kubelet renews each Node's Lease this often (default 0: off)";

struct Args {
    machines: i32,
    idle: Duration,
    boot_latency_ms: u64,
    heartbeat_interval_ms: u64,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        machines: 1000,
        idle: Duration::from_secs(60),
        boot_latency_ms: 1000,
        heartbeat_interval_ms: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| -> anyhow::Result<u64> {
            let v = it
                .next()
                .with_context(|| format!("{flag} needs a number"))?;
            v.parse()
                .with_context(|| format!("{flag} {v:?} is not a number"))
        };
        match arg.as_str() {
            "--machines" => args.machines = i32::try_from(value("--machines")?)?,
            "--idle-seconds" => args.idle = Duration::from_secs(value("--idle-seconds")?),
            "--boot-latency-ms" => args.boot_latency_ms = value("--boot-latency-ms")?,
            "--heartbeat-interval-ms" => {
                args.heartbeat_interval_ms = value("--heartbeat-interval-ms")?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(args)
}

/// CPU seconds (user + system) of a process, from /proc.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').context("unexpected /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// Peak resident set size of a process in MiB, from /proc.
fn peak_rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM in /proc status")?;
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .context("bad VmHWM")?
        .parse()?;
    Ok(kib / 1024.0)
}

struct Figures {
    seconds_to_ready: f64,
    cpu_seconds: f64,
    peak_rss_mib: f64,
    writes_per_machine: f64,
    apiserver_cpu_seconds: f64,
    idle_writes: f64,
    idle_apiserver_cpu_percent: f64,
    idle_etcd_cpu_percent: f64,
    idle_kubelet_writes: u64,
}

/// CPU seconds of a control-plane process.
fn plane_cpu(env: &Env, name: &str) -> anyhow::Result<f64> {
    let pid = env
        .control_plane
        .pid(name)
        .with_context(|| format!("no {name} process"))?;
    cpu_seconds(pid)
}

/// Writes the simulated kubelet made so far (Lease renewals and status posts).
fn kubelet_writes(env: &Env) -> u64 {
    let s = env.cloud.stats();
    s.lease_renewals + s.node_status_posts
}

async fn run_variant(
    env: &Env,
    args: &Args,
    variant: &str,
    plugin: &str,
) -> anyhow::Result<Figures> {
    let name = format!("bench-{variant}");
    let kubeconfig = env.control_plane.kubeconfig();
    let mut controller = if variant == "native" {
        // The native comparison point is its own binary, so the product's
        // `capstan controller` has no benchmark flags.
        let program = capstan_bin()
            .map_err(anyhow::Error::msg)?
            .with_file_name("capstan-bench-controller");
        if !program.exists() {
            build_bench_controller(&program)?;
        }
        ControllerProcess::start_program(
            &program,
            &[],
            &kubeconfig,
            &[
                "--native-sim-provider",
                plugin,
                "--machine-concurrency=64",
                "--poll-interval-ms=1000",
                // Running instances are checked every 5 s, so the idle
                // window counts those checks (they must write nothing).
                "--instance-check-ms=5000",
            ],
            &[("CAPSTAN_NATIVE_SIM_TOKEN", CLOUD_TOKEN)],
        )
    } else {
        ControllerProcess::start(
            env,
            &[
                "--machine-concurrency=64",
                "--poll-interval=1s",
                "--instance-check-interval=5s",
            ],
            &[],
        )
    }
    .map_err(anyhow::Error::msg)?;
    controller
        .wait_ready(Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    let pid = controller.pid();
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), "default");
    let md = sample_deployment(&name, plugin, &env.cloud.url(), 0, "v1.30.0");
    mds.create(&PostParams::default(), &md).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu_before = cpu_seconds(pid)?;
    let apiserver_before = plane_cpu(env, "kube-apiserver")?;
    let writes_before = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?;
    eprintln!("# {variant}: scaling md/{name} from 0 to {}", args.machines);
    let started = Instant::now();
    mds.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": args.machines}})),
    )
    .await?;
    let mut last_print = Instant::now();
    loop {
        let md = mds.get(&name).await?;
        let status = md.status.unwrap_or_default();
        if status.ready_replicas == args.machines && status.updated_replicas == args.machines {
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "# {variant}: {:.0}s: {} machines, {} ready, cloud {} instances",
                started.elapsed().as_secs_f64(),
                status.replicas,
                status.ready_replicas,
                env.cloud.instances().len()
            );
            last_print = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!(
                "{variant}: not Ready after 30 minutes (controller log {})",
                controller.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds_to_ready = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)? - cpu_before;
    let apiserver_cpu_seconds = plane_cpu(env, "kube-apiserver")? - apiserver_before;
    let rss = peak_rss_mib(pid)?;
    // Let the last status writes land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?
        - writes_before;
    eprintln!(
        "# {variant}: all Ready after {seconds_to_ready:.1}s; idle for {}s",
        args.idle.as_secs()
    );
    let idle_before = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?;
    let (apiserver_idle, etcd_idle, kubelet_idle) = (
        plane_cpu(env, "kube-apiserver")?,
        plane_cpu(env, "etcd")?,
        kubelet_writes(env),
    );
    let idle_started = Instant::now();
    tokio::time::sleep(args.idle).await;
    let idle_writes = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?
        - idle_before;
    let idle_seconds = idle_started.elapsed().as_secs_f64();
    let idle_apiserver_cpu_percent =
        100.0 * (plane_cpu(env, "kube-apiserver")? - apiserver_idle) / idle_seconds;
    let idle_etcd_cpu_percent = 100.0 * (plane_cpu(env, "etcd")? - etcd_idle) / idle_seconds;
    let idle_kubelet_writes = kubelet_writes(env) - kubelet_idle;

    eprintln!("# {variant}: deleting md/{name} and waiting for every instance to be released");
    mds.delete(&name, &DeleteParams::foreground()).await?;
    let deadline = Instant::now() + Duration::from_secs(900);
    while !env.cloud.instances().is_empty() {
        if Instant::now() > deadline {
            bail!("{variant}: instances not released after 15 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    controller.stop();
    Ok(Figures {
        seconds_to_ready,
        cpu_seconds: cpu,
        peak_rss_mib: rss,
        writes_per_machine: writes / f64::from(args.machines.max(1)),
        apiserver_cpu_seconds,
        idle_writes,
        idle_apiserver_cpu_percent,
        idle_etcd_cpu_percent,
        idle_kubelet_writes,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    eprintln!("# starting the control plane and the simulated cloud");
    let heartbeat = Duration::from_millis(args.heartbeat_interval_ms);
    let control_plane = if heartbeat.is_zero() {
        ControlPlaneOptions::without_heartbeats()
    } else {
        // Kubernetes' own timings, stretched for slower heartbeats.
        ControlPlaneOptions {
            node_monitor_period: Duration::from_secs(5),
            node_monitor_grace_period: (heartbeat * 4).max(Duration::from_secs(40)),
            node_startup_grace_period: (heartbeat * 6).max(Duration::from_secs(60)),
            pod_toleration_seconds: 300,
            ..ControlPlaneOptions::default()
        }
    };
    let env = Env::start_with(EnvOptions {
        faults: Faults {
            boot_latency_ms: args.boot_latency_ms,
            delete_latency_ms: 200,
            ..Default::default()
        },
        kubelet: KubeletConfig {
            heartbeat_interval_ms: args.heartbeat_interval_ms,
            ..Default::default()
        },
        control_plane,
    })
    .await
    .map_err(anyhow::Error::msg)?;
    let wasm = run_variant(&env, &args, "wasm", SIM_PLUGIN).await?;
    let native = run_variant(&env, &args, "native", "sim-native").await?;
    println!(
        "# capstan-bench-scale: 0 -> {} machines, boot latency {} ms, controller --machine-concurrency=64, kubelet heartbeats {}",
        args.machines,
        args.boot_latency_ms,
        if heartbeat.is_zero() {
            "off".to_string()
        } else {
            format!("every {heartbeat:?}")
        }
    );
    let lines = [
        (
            "seconds_to_all_ready",
            wasm.seconds_to_ready,
            native.seconds_to_ready,
        ),
        (
            "controller_cpu_seconds",
            wasm.cpu_seconds,
            native.cpu_seconds,
        ),
        (
            "controller_peak_rss_mib",
            wasm.peak_rss_mib,
            native.peak_rss_mib,
        ),
        (
            "api_writes_per_machine",
            wasm.writes_per_machine,
            native.writes_per_machine,
        ),
        (
            "apiserver_cpu_seconds",
            wasm.apiserver_cpu_seconds,
            native.apiserver_cpu_seconds,
        ),
    ];
    for (name, w, n) in lines {
        println!("{name}_wasm {w:.3}");
        println!("{name}_native {n:.3}");
        println!(
            "ratio_{name}_wasm_vs_native {:.3}",
            if n > 0.0 { w / n } else { f64::NAN }
        );
    }
    println!(
        "idle_{}s_writes_wasm {}",
        args.idle.as_secs(),
        wasm.idle_writes
    );
    println!(
        "idle_{}s_writes_native {}",
        args.idle.as_secs(),
        native.idle_writes
    );
    let idle = args.idle.as_secs();
    for (variant, f) in [("wasm", &wasm), ("native", &native)] {
        println!(
            "idle_{idle}s_apiserver_cpu_percent_{variant} {:.1}",
            f.idle_apiserver_cpu_percent
        );
        println!(
            "idle_{idle}s_etcd_cpu_percent_{variant} {:.1}",
            f.idle_etcd_cpu_percent
        );
        println!(
            "idle_{idle}s_kubelet_writes_{variant} {}",
            f.idle_kubelet_writes
        );
    }
    Ok(())
}

/// Build `capstan-bench-controller` next to `capstan` (same profile) when it
/// is missing, so the benchmark runs from one command.
fn build_bench_controller(program: &std::path::Path) -> anyhow::Result<()> {
    let release = program
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|d| d == "release");
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(capstan_e2e::workspace_root()).args([
        "build",
        "-p",
        "capstan-bench",
        "--bin",
        "capstan-bench-controller",
    ]);
    if release {
        cmd.arg("--release");
    }
    if let Some(target_dir) = program.parent().and_then(|d| d.parent()) {
        cmd.arg("--target-dir").arg(target_dir);
    }
    eprintln!("# {} is missing: building it ({cmd:?})", program.display());
    let status = cmd.status()?;
    anyhow::ensure!(
        status.success() && program.exists(),
        "cannot build {}: run `cargo build{} -p capstan-bench --bins`",
        program.display(),
        if release { " --release" } else { "" }
    );
    Ok(())
}
