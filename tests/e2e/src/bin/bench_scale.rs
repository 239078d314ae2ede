//! `capstan-bench-scale`: scale a MachineDeployment from 0 to N machines
//! until all are Ready, once through the Wasm sim-provider and once through
//! the same provider logic compiled natively, each with its own
//! `capstan controller` process, side by side in one run against one local
//! control plane and simulated cloud. Prints `name value` lines (not a timed
//! test): time to all Ready, controller CPU seconds, controller peak RSS, API
//! writes per machine, the Wasm/native ratio of each, and the writes during
//! an idle period after convergence.

use anyhow::{Context, bail};
use capstan_api::MachineDeployment;
use capstan_e2e::env::{CLOUD_TOKEN, ControllerProcess, Env, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::Faults;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: capstan-bench-scale [--machines N] [--idle-seconds S] [--boot-latency-ms MS]
  --machines N          machines to scale to (default 1000)
  --idle-seconds S      idle period after convergence in which writes are counted (default 60)
  --boot-latency-ms MS  simulated instance boot time (default 1000)";

struct Args {
    machines: i32,
    idle: Duration,
    boot_latency_ms: u64,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        machines: 1000,
        idle: Duration::from_secs(60),
        boot_latency_ms: 1000,
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
    idle_writes: f64,
}

async fn run_variant(
    env: &Env,
    args: &Args,
    variant: &str,
    plugin: &str,
) -> anyhow::Result<Figures> {
    let name = format!("bench-{variant}");
    let extra: Vec<&str> = if variant == "native" {
        vec!["--native-sim-provider", plugin]
    } else {
        vec![]
    };
    let mut controller = ControllerProcess::start(
        env,
        &[
            extra.as_slice(),
            &["--machine-concurrency=64", "--poll-interval=1s"],
        ]
        .concat(),
        &[("CAPSTAN_NATIVE_SIM_TOKEN", CLOUD_TOKEN)],
    )
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
    tokio::time::sleep(args.idle).await;
    let idle_writes = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?
        - idle_before;

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
        idle_writes,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    eprintln!("# starting the control plane and the simulated cloud");
    let env = Env::start(Faults {
        boot_latency_ms: args.boot_latency_ms,
        delete_latency_ms: 200,
        ..Default::default()
    })
    .await
    .map_err(anyhow::Error::msg)?;
    let wasm = run_variant(&env, &args, "wasm", SIM_PLUGIN).await?;
    let native = run_variant(&env, &args, "native", "sim-native").await?;
    println!(
        "# capstan-bench-scale: 0 -> {} machines, boot latency {} ms, controller --machine-concurrency=64",
        args.machines, args.boot_latency_ms
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
    Ok(())
}
