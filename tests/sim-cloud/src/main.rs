//! `capstan-sim-cloud`: run the simulated cloud as a process.

#![forbid(unsafe_code)]

use anyhow::Context;
use capstan_sim_cloud::{Faults, SimCloud, SimCloudConfig};
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.error_rate),
        "--error-rate must be between 0 and 1, got {}",
        args.error_rate
    );
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
        },
        seed: 1,
    })
    .await
    .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!("simulated cloud listening on {}", cloud.url());
    tokio::signal::ctrl_c().await?;
    cloud.shutdown().await;
    Ok(())
}
