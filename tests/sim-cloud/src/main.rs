//! `capstan-sim-cloud`: run the simulated cloud as a process.

#![forbid(unsafe_code)]

use anyhow::Context;
use capstan_sim_cloud::{Faults, KubeTarget, KubeletConfig, SimCloud, SimCloudConfig};
use clap::Parser;
use std::net::SocketAddr;

/// Serve the simulated cloud API until interrupted (Ctrl-C).
#[derive(Debug, Parser)]
#[command(name = "capstan-sim-cloud", version)]
struct Args {
    /// Address to listen on (loopback only is recommended; port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:8787", env = "SIM_CLOUD_LISTEN")]
    listen: SocketAddr,
    /// Bearer token required on /v1 calls.
    #[arg(long, env = "SIM_CLOUD_TOKEN")]
    token: Option<String>,
    /// Milliseconds from create to running.
    #[arg(long, default_value_t = 2000)]
    boot_latency_ms: u64,
    /// Milliseconds from delete to gone.
    #[arg(long, default_value_t = 500)]
    delete_latency_ms: u64,
    /// Milliseconds an in-place update takes.
    #[arg(long, default_value_t = 3000)]
    update_latency_ms: u64,
    /// Fraction of API calls answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Requests per second before HTTP 429.
    #[arg(long)]
    throttle_rps: Option<u32>,
    /// Most live instances at once (stock-out beyond).
    #[arg(long)]
    capacity: Option<usize>,
    /// Act as the kubelet of a Node per booted instance in this Kubernetes
    /// API (https URL): register it, heartbeat, run the pods bound to it.
    #[arg(long, requires_all = ["kube_token_file", "kube_ca_file"])]
    kube_url: Option<String>,
    /// File holding a bearer token allowed to manage Nodes.
    #[arg(long)]
    kube_token_file: Option<std::path::PathBuf>,
    /// PEM file of the CA that signed the API server's certificate.
    #[arg(long)]
    kube_ca_file: Option<std::path::PathBuf>,
    /// Milliseconds between Node Lease renewals and status checks; 0 turns
    /// heartbeats off (Nodes then go Ready=Unknown after the node-lifecycle
    /// controller's grace period).
    #[arg(long, default_value_t = KubeletConfig::default().heartbeat_interval_ms)]
    heartbeat_interval_ms: u64,
    /// Milliseconds between status posts of an unchanged Node.
    #[arg(long, default_value_t = KubeletConfig::default().status_report_interval_ms)]
    status_report_interval_ms: u64,
    /// Milliseconds from a pod being bound to a Node to it running.
    #[arg(long, default_value_t = KubeletConfig::default().pod_start_delay_ms)]
    pod_start_delay_ms: u64,
    /// Milliseconds a pod's containers take to exit once it is deleted
    /// gracefully (its grace period is the upper bound).
    #[arg(long, default_value_t = KubeletConfig::default().pod_stop_delay_ms)]
    pod_stop_delay_ms: u64,
    /// Register instances launched without user data with the kubelet's own
    /// credential (a shared identity), instead of never, as a real instance
    /// without join data would. For runs that are not about joining.
    #[arg(long)]
    shared_identity_without_join_data: bool,
    /// Milliseconds an instance tries to join (token discovery, TLS
    /// bootstrapping) before it gives up.
    #[arg(long, default_value_t = KubeletConfig::default().join_timeout_ms)]
    join_timeout_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.error_rate),
        "--error-rate must be between 0 and 1, got {}",
        args.error_rate
    );
    let kube = match (&args.kube_url, &args.kube_token_file, &args.kube_ca_file) {
        (Some(url), Some(token), Some(ca)) => Some(KubeTarget {
            url: url.clone(),
            token: std::fs::read_to_string(token)
                .with_context(|| format!("cannot read --kube-token-file {}", token.display()))?
                .trim()
                .to_string(),
            ca_pem: std::fs::read(ca)
                .with_context(|| format!("cannot read --kube-ca-file {}", ca.display()))?,
        }),
        _ => None,
    };
    let cloud = SimCloud::start(SimCloudConfig {
        listen: Some(args.listen),
        token: args.token,
        faults: Faults {
            boot_latency_ms: args.boot_latency_ms,
            delete_latency_ms: args.delete_latency_ms,
            update_latency_ms: args.update_latency_ms,
            error_rate: args.error_rate,
            throttle_rps: args.throttle_rps,
            capacity: args.capacity,
            register_nodes: true,
            refuse_updates: false,
            fail_user_agent: None,
            unjoined_user_agent: None,
        },
        seed: 1,
        real_nodes: None,
        kube,
        kubelet: KubeletConfig {
            heartbeat_interval_ms: args.heartbeat_interval_ms,
            status_report_interval_ms: args.status_report_interval_ms,
            pod_start_delay_ms: args.pod_start_delay_ms,
            pod_stop_delay_ms: args.pod_stop_delay_ms,
            shared_identity_without_join_data: args.shared_identity_without_join_data,
            join_timeout_ms: args.join_timeout_ms,
        },
    })
    .await
    .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!("simulated cloud listening on {}", cloud.url());
    tokio::signal::ctrl_c().await?;
    cloud.shutdown().await;
    Ok(())
}
