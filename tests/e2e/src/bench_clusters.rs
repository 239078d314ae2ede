//! `capstan-bench-scale --clusters K`: one management cluster running
//! Machines for K workload clusters, beside one workload cluster of the
//! same total size. Every workload cluster is a real API server (with its
//! controller manager, for token discovery and certificate signing), all
//! of them sharing the management cluster's etcd under prefixes of their
//! own; every machine joins its cluster by bootstrap token and TLS
//! bootstrapping. Each run has a fresh `capstan controller` process.
//! Prints `name value` lines: time to all Ready, the controller's CPU
//! seconds and peak RSS (and per cluster), the TCP connections the
//! controller holds to each workload API server, and the watches it
//! added there (the API server's `apiserver_registered_watchers`, before
//! and after).

use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::env::{ControllerProcess, Env, EnvOptions, SIM_PLUGIN, sample_deployment};
use crate::sim_cloud::{Faults, KubeletConfig};
use anyhow::{Context, bail};
use capstan_api::{Cluster, Machine, MachineDeployment};
use kube::api::{Api, DeleteParams, PostParams};
use std::time::{Duration, Instant};

const BOOTSTRAP_PLUGIN: &str = "kubeadm-bootstrap";

/// CPU seconds (user + system) of a process, from /proc.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').context("unexpected /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// Peak resident set size of a process in MiB, from /proc.
pub fn peak_rss_mib(pid: u32) -> anyhow::Result<f64> {
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

/// Established TCP connections of process `pid` to 127.0.0.1:`port`, from
/// its socket descriptors and /proc/net/tcp.
pub fn connections_to(pid: u32, port: u16) -> anyhow::Result<usize> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        let target = target.display().to_string();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let wanted = format!("0100007F:{port:04X}");
    Ok(table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 9 && f[2] == wanted && f[3] == "01" && inodes.contains(f[9])
        })
        .count())
}

/// The watches an API server holds open (`apiserver_registered_watchers`,
/// summed over kinds).
fn registered_watchers(plane: &ControlPlane) -> anyhow::Result<f64> {
    let (status, text) = plane.get_text("/metrics").map_err(anyhow::Error::msg)?;
    if status != 200 {
        bail!("GET /metrics: {status}");
    }
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_registered_watchers{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

fn port_of(plane: &ControlPlane) -> anyhow::Result<u16> {
    plane
        .url
        .rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .context("the API server's URL has no port")
}

/// Start `count` workload control planes on `env`'s etcd, two at a time
/// (2 cores), and bind what Capstan needs in each.
async fn workload_planes(
    env: &Env,
    first: usize,
    count: usize,
) -> anyhow::Result<Vec<ControlPlane>> {
    let mut planes = vec![];
    for chunk in (first..first + count).collect::<Vec<_>>().chunks(2) {
        let starting: Vec<_> = chunk
            .iter()
            .map(|i| {
                let options = ControlPlaneOptions {
                    shared_etcd: Some((env.control_plane.etcd_url(), format!("/workload-{i}"))),
                    ..ControlPlaneOptions::without_heartbeats()
                };
                tokio::task::spawn_blocking(move || ControlPlane::start_with(options))
            })
            .collect();
        for started in starting {
            planes.push(started.await?.map_err(anyhow::Error::msg)?);
        }
    }
    for plane in &planes {
        crate::install::install_workload_cluster(plane).map_err(anyhow::Error::msg)?;
    }
    Ok(planes)
}

/// The figures of one run.
struct Run {
    clusters: usize,
    seconds_to_ready: f64,
    cpu_seconds: f64,
    peak_rss_mib: f64,
    connections_per_cluster: f64,
    watches_per_cluster: f64,
    seconds_to_released: f64,
}

/// One run: a controller, a Cluster per plane, `machines` spread over them.
async fn run(env: &Env, planes: &[ControlPlane], machines: i32, tag: &str) -> anyhow::Result<Run> {
    let clusters: Api<Cluster> = Api::namespaced(env.client.clone(), "default");
    let mut watchers_before = vec![];
    for plane in planes {
        watchers_before.push(registered_watchers(plane).unwrap_or(f64::NAN));
    }
    let mut controller = ControllerProcess::start(
        env,
        &[
            "--machine-concurrency=64",
            "--poll-interval=1s",
            "--instance-check-interval=5s",
        ],
        &[],
    )
    .map_err(anyhow::Error::msg)?;
    controller
        .wait_ready(Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    let cpu_before = cpu_seconds(controller.pid())?;
    let started = Instant::now();
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), "default");
    let mut names = vec![];
    for (i, plane) in planes.iter().enumerate() {
        let cluster = format!("{tag}-{i}");
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{cluster}-kubeconfig"), "namespace": "default"},
            "stringData": {"value": plane.minimal_kubeconfig_inline()}});
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&secret.to_string()))
            .map_err(anyhow::Error::msg)?;
        let object: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "capstan.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": cluster, "namespace": "default"}, "spec": {}}))?;
        clusters.create(&PostParams::default(), &object).await?;
        let share =
            machines / planes.len() as i32 + i32::from((i as i32) < machines % planes.len() as i32);
        let name = format!("bench-{cluster}");
        let mut md = sample_deployment(&name, SIM_PLUGIN, &env.cloud.url(), share, "v1.30.0");
        md.spec.cluster_name = Some(cluster);
        md.spec.template.spec.bootstrap = Some(capstan_api::MachineBootstrap {
            plugin: Some(BOOTSTRAP_PLUGIN.into()),
            ..Default::default()
        });
        mds.create(&PostParams::default(), &md).await?;
        names.push(name);
    }
    let machine_api: Api<Machine> = Api::namespaced(env.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut last_print = Instant::now();
    loop {
        let list = machine_api.list(&Default::default()).await?.items;
        let ready = list
            .iter()
            .filter(|m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| capstan_api::is_true(&s.conditions, "Ready"))
            })
            .count();
        if ready as i32 >= machines {
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "# {tag}: {ready}/{machines} Ready after {:.0}s",
                started.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        if Instant::now() > deadline {
            bail!("{tag}: {ready}/{machines} Ready after 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seconds_to_ready = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(controller.pid())? - cpu_before;
    let rss = peak_rss_mib(controller.pid())?;
    let mut connections = 0;
    let mut watches = 0.0;
    for (plane, before) in planes.iter().zip(&watchers_before) {
        connections += connections_to(controller.pid(), port_of(plane)?)?;
        watches += registered_watchers(plane).unwrap_or(f64::NAN) - before;
    }
    // Released: every deployment deleted, every instance gone.
    let deleting = Instant::now();
    for name in &names {
        mds.delete(name, &DeleteParams::default()).await?;
    }
    while !env.cloud.instances().is_empty() {
        if deleting.elapsed() > Duration::from_secs(900) {
            bail!("{tag}: instances not released after 15 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seconds_to_released = deleting.elapsed().as_secs_f64();
    for i in 0..planes.len() {
        clusters
            .delete(&format!("{tag}-{i}"), &DeleteParams::default())
            .await?;
    }
    controller.stop();
    let k = planes.len() as f64;
    Ok(Run {
        clusters: planes.len(),
        seconds_to_ready,
        cpu_seconds: cpu,
        peak_rss_mib: rss,
        connections_per_cluster: connections as f64 / k,
        watches_per_cluster: watches / k,
        seconds_to_released,
    })
}

fn print(prefix: &str, r: &Run) {
    let k = r.clusters as f64;
    println!("{prefix}_clusters {}", r.clusters);
    println!("{prefix}_seconds_to_all_ready {:.1}", r.seconds_to_ready);
    println!("{prefix}_controller_cpu_seconds {:.1}", r.cpu_seconds);
    println!(
        "{prefix}_controller_cpu_seconds_per_cluster {:.2}",
        r.cpu_seconds / k
    );
    println!("{prefix}_controller_peak_rss_mib {:.0}", r.peak_rss_mib);
    println!(
        "{prefix}_controller_peak_rss_mib_per_cluster {:.1}",
        r.peak_rss_mib / k
    );
    println!(
        "{prefix}_connections_per_cluster {:.1}",
        r.connections_per_cluster
    );
    println!("{prefix}_watches_per_cluster {:.1}", r.watches_per_cluster);
    println!(
        "{prefix}_seconds_to_all_released {:.1}",
        r.seconds_to_released
    );
}

/// `--clusters K --machines N`: N machines in one workload cluster, then
/// N machines spread over K workload clusters, side by side.
pub async fn bench(clusters: usize, machines: i32, boot_latency_ms: u64) -> anyhow::Result<()> {
    anyhow::ensure!(
        clusters >= 2,
        "--clusters must be 2 or more (one cluster is the baseline)"
    );
    let env = Env::start_with(EnvOptions {
        faults: Faults {
            boot_latency_ms,
            delete_latency_ms: 200,
            ..Default::default()
        },
        kubelet: KubeletConfig {
            heartbeat_interval_ms: 0,
            shared_identity_without_join_data: false,
            join_timeout_ms: 600_000,
            ..Default::default()
        },
        control_plane: ControlPlaneOptions::without_heartbeats(),
        real_nodes: false,
    })
    .await
    .map_err(anyhow::Error::msg)?;
    let yaml = format!(
        "apiVersion: capstan.dev/v1alpha1\nkind: Plugin\nmetadata: {{name: {BOOTSTRAP_PLUGIN}}}\nspec:\n  source: file://{}\n  allowedNamespaces: {{names: [default]}}\n",
        crate::plugin("kubeadm_bootstrap").display()
    );
    env.control_plane
        .kubectl(&["apply", "-f", "-"], Some(&yaml))
        .map_err(anyhow::Error::msg)?;
    eprintln!(
        "# starting {} workload API servers on one etcd",
        clusters + 1
    );
    let planes = workload_planes(&env, 0, clusters + 1).await?;
    let (one, many) = planes.split_at(1);
    println!(
        "# capstan-bench-scale --clusters {clusters}: {machines} machines in one workload cluster, then over {clusters} (API servers on one etcd; every machine joins its cluster by bootstrap token and TLS bootstrap)"
    );
    let single = run(&env, one, machines, "one").await?;
    print("one_cluster", &single);
    let spread = run(&env, many, machines, "many").await?;
    print(&format!("{clusters}_clusters"), &spread);
    println!(
        "ratio_seconds_to_all_ready {:.2}",
        spread.seconds_to_ready / single.seconds_to_ready
    );
    println!(
        "ratio_controller_cpu_seconds {:.2}",
        spread.cpu_seconds / single.cpu_seconds
    );
    println!(
        "ratio_controller_peak_rss_mib {:.2}",
        spread.peak_rss_mib / single.peak_rss_mib
    );
    Ok(())
}
