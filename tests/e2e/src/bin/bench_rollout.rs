//! `capstan-bench-rollout`: a version change across N machines, once in
//! place (through the Wasm `sim-updater`) and once by replacement, side by
//! side in one run against one local control plane, simulated cloud and
//! `capstan controller` process, with the same `maxSurge` / `maxUnavailable`
//! for both. Prints `name value` lines (not a timed test): seconds from the
//! template change until every machine is up to date and available, cloud
//! instances launched, controller API writes per machine, and the
//! in-place / replacement ratios.
//!
//! An instance boots in `--boot-latency-ms` and updates its version in
//! `--update-latency-ms`, so the two take the same simulated cloud time
//! per machine by default and the difference is what replacing costs.

use anyhow::{Context, bail};
use capstan_api::{
    InPlaceFallback, InPlaceStrategy, IntOrString, MachineDeployment, Plugin, RollingUpdate,
};
use capstan_e2e::control_plane::ControlPlaneOptions;
use capstan_e2e::env::{ControllerProcess, Env, EnvOptions, SIM_PLUGIN, sample_deployment};
use capstan_e2e::sim_cloud::{Faults, KubeletConfig};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: capstan-bench-rollout [--machines N] [--max-unavailable PCT] [--boot-latency-ms MS] [--update-latency-ms MS]
  --machines N            machines in the deployment (default 200)
  --max-unavailable PCT   maxUnavailable of both rollouts, in percent (default 10; maxSurge is 0)
  --boot-latency-ms MS    simulated instance boot time (default 1000)
  --update-latency-ms MS  simulated in-place version update time (default 1000)";

struct Args {
    machines: i32,
    max_unavailable: u64,
    boot_latency_ms: u64,
    update_latency_ms: u64,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        machines: 200,
        max_unavailable: 10,
        boot_latency_ms: 1000,
        update_latency_ms: 1000,
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
            "--max-unavailable" => args.max_unavailable = value("--max-unavailable")?,
            "--boot-latency-ms" => args.boot_latency_ms = value("--boot-latency-ms")?,
            "--update-latency-ms" => args.update_latency_ms = value("--update-latency-ms")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(args)
}

struct Figures {
    seconds: f64,
    launched: u64,
    writes_per_machine: f64,
}

/// Wait until the deployment has every machine on its template, available.
async fn wait_rolled_out(
    mds: &Api<MachineDeployment>,
    name: &str,
    machines: i32,
    what: &str,
    controller: &ControllerProcess,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let md = mds.get(name).await?;
        if capstan_controllers::deployment::rolled_out(&md) {
            return Ok(());
        }
        let status = md.status.unwrap_or_default();
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "# {what}: {:.0}s: {} of {machines} up to date, {} available",
                started.elapsed().as_secs_f64(),
                status.updated_replicas,
                status.available_replicas
            );
            last_print = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!(
                "{what}: not rolled out after 30 minutes (controller log {})",
                controller.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn run_variant(
    env: &Env,
    args: &Args,
    controller: &ControllerProcess,
    in_place: bool,
) -> anyhow::Result<Figures> {
    let variant = if in_place { "in-place" } else { "replace" };
    let name = format!("bench-{variant}");
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), "default");
    let mut md = sample_deployment(
        &name,
        SIM_PLUGIN,
        &env.cloud.url(),
        args.machines,
        "v1.30.0",
    );
    md.spec.rollout_strategy_mut().rolling_update = Some(RollingUpdate {
        max_surge: Some(IntOrString::Int(0)),
        max_unavailable: Some(IntOrString::String(format!("{}%", args.max_unavailable))),
    });
    if in_place {
        md.spec.rollout_strategy_mut().in_place = Some(InPlaceStrategy {
            updaters: None,
            fallback: InPlaceFallback::None,
        });
    }
    eprintln!(
        "# {variant}: creating md/{name} with {} machines",
        args.machines
    );
    mds.create(&PostParams::default(), &md).await?;
    wait_rolled_out(&mds, &name, args.machines, variant, controller).await?;

    let launched_before = env.cloud.stats().instances_launched;
    let writes_before = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?;
    eprintln!("# {variant}: changing the version");
    let started = Instant::now();
    mds.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"template": {"spec": {"version": "v1.31.0"}}}})),
    )
    .await?;
    // The status of the new generation first, then the rollout.
    loop {
        let md = mds.get(&name).await?;
        if md.status.as_ref().and_then(|s| s.observed_generation) == md.metadata.generation {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_rolled_out(&mds, &name, args.machines, variant, controller).await?;
    let seconds = started.elapsed().as_secs_f64();
    // Let the last status writes land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = controller
        .metric_sum("capstan_api_writes_total")
        .map_err(anyhow::Error::msg)?
        - writes_before;
    let launched = env.cloud.stats().instances_launched - launched_before;
    eprintln!("# {variant}: rolled out in {seconds:.1}s; deleting md/{name}");
    mds.delete(&name, &DeleteParams::foreground()).await?;
    let deadline = Instant::now() + Duration::from_secs(900);
    while !env.cloud.instances().is_empty() {
        if Instant::now() > deadline {
            bail!("{variant}: instances not released after 15 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(Figures {
        seconds,
        launched,
        writes_per_machine: writes / f64::from(args.machines.max(1)),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    // One run, its own control planes: nothing to hand on.
    capstan_e2e::control_plane::reuse::disable();
    eprintln!("# starting the control plane and the simulated cloud");
    let env = Env::start_with(EnvOptions {
        faults: Faults {
            boot_latency_ms: args.boot_latency_ms,
            update_latency_ms: args.update_latency_ms,
            delete_latency_ms: 200,
            ..Default::default()
        },
        kubelet: KubeletConfig {
            heartbeat_interval_ms: 0,
            // Not about joining: instances register with the kubelet's identity.
            shared_identity_without_join_data: true,
            ..Default::default()
        },
        control_plane: ControlPlaneOptions::without_heartbeats(),
        real_nodes: false,
    })
    .await
    .map_err(anyhow::Error::msg)?;
    env.create_plugin("sim-updater", &capstan_e2e::plugin("sim_updater"))
        .await
        .map_err(anyhow::Error::msg)?;
    let mut controller = ControllerProcess::start(
        &env,
        &["--machine-concurrency=64", "--poll-interval=1s"],
        &[],
    )
    .map_err(anyhow::Error::msg)?;
    controller
        .wait_ready(Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = plugins.get("sim-updater").await?;
        if p.status
            .as_ref()
            .is_some_and(|s| capstan_api::is_true(&s.conditions, "Ready"))
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("the sim-updater Plugin is not Ready: {:?}", p.status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let in_place = run_variant(&env, &args, &controller, true).await?;
    let replace = run_variant(&env, &args, &controller, false).await?;
    controller.stop();
    println!(
        "# capstan-bench-rollout: v1.30.0 -> v1.31.0 on {} machines, maxSurge 0, maxUnavailable {}%, boot {} ms, in-place update {} ms, controller --machine-concurrency=64",
        args.machines, args.max_unavailable, args.boot_latency_ms, args.update_latency_ms
    );
    let lines = [
        ("seconds_to_all_updated", in_place.seconds, replace.seconds),
        (
            "instances_launched",
            in_place.launched as f64,
            replace.launched as f64,
        ),
        (
            "api_writes_per_machine",
            in_place.writes_per_machine,
            replace.writes_per_machine,
        ),
    ];
    for (name, i, r) in lines {
        println!("{name}_in_place {i:.3}");
        println!("{name}_replace {r:.3}");
        println!(
            "ratio_{name}_in_place_vs_replace {:.3}",
            if r > 0.0 { i / r } else { f64::NAN }
        );
    }
    Ok(())
}
