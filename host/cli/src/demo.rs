//! `capstan demo`: the plugin runtime at work, with visible progress. Starts
//! a simulated cloud on loopback, loads the sandboxed `sim-provider` plugin
//! (granting it only that cloud and a bearer token it never sees), creates
//! machines, follows them until running, and deletes them again.

use crate::options::{default_plugin, parse_duration};
use anyhow::{Context, bail};
use capstan_runtime::types::{Deletion, InstanceState, Machine, MachineStatus, PluginError};
use capstan_runtime::{Credential, Grants, Limits, LoadPath, Runtime, RuntimeConfig};
use capstan_sim_cloud::{Faults, SimCloud, SimCloudConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments of `capstan demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sim-provider component (default: the one built by scripts/build-plugins.sh).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// How many machines to create.
    #[arg(long, default_value_t = 3)]
    pub machines: usize,
    /// How long the simulated cloud takes to boot an instance.
    #[arg(long, value_parser = parse_duration, default_value = "1500ms")]
    pub boot_latency: Duration,
    /// Kubernetes version of the machines.
    #[arg(long, default_value = "v1.30.0")]
    pub kubernetes_version: String,
    /// Where precompiled plugin code is cached.
    #[arg(long, env = "CAPSTAN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
}

fn cache_dir(args: &Args) -> PathBuf {
    args.cache_dir.clone().unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir)
            .join("capstan/code")
    })
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

fn state(s: &InstanceState) -> &'static str {
    match s {
        InstanceState::Pending => "pending",
        InstanceState::Running => "running",
        InstanceState::Updating => "updating",
        InstanceState::Stopping => "stopping",
        InstanceState::Stopped => "stopped",
        InstanceState::Terminated => "terminated",
        InstanceState::Unknown => "unknown",
    }
}

/// Retry transient plugin errors as the plugin asks (up to five attempts),
/// the way a controller would.
async fn retrying<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, capstan_runtime::Error>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(capstan_runtime::Error::Plugin {
                error: PluginError::Transient(t),
                ..
            }) if attempt < 5 => {
                println!(
                    "           {what}: transient error, retrying in {} ms: {}",
                    t.retry_after_ms, t.message
                );
                tokio::time::sleep(Duration::from_millis(t.retry_after_ms.min(5_000))).await;
                attempt += 1;
            }
            other => return Ok(other?),
        }
    }
}

/// Run the demo.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.machines == 0 || args.machines > 500 {
        bail!("--machines must be between 1 and 500");
    }
    let started = Instant::now();
    let elapsed = || format!("[{:>5.1}s]", started.elapsed().as_secs_f64());
    let path = match &args.plugin {
        Some(p) => p.clone(),
        None => default_plugin("sim_provider")?,
    };
    println!("Capstan demo: a sandboxed provider plugin drives a (simulated) cloud.\n");

    let token = format!("demo-{:x}", std::process::id());
    let cloud = SimCloud::start(SimCloudConfig {
        token: Some(token.clone()),
        faults: Faults {
            boot_latency_ms: args.boot_latency.as_millis() as u64,
            delete_latency_ms: 300,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .context("cannot start the simulated cloud")?;
    println!(
        "{} simulated cloud listening on {} (boot latency {:?})",
        elapsed(),
        cloud.url(),
        args.boot_latency
    );

    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache_dir(&args)),
        ..Default::default()
    })?;
    let mut grants = Grants {
        http: vec![cloud.url().parse()?],
        ..Default::default()
    };
    grants
        .credentials
        .insert("sim-cloud".into(), Credential::Bearer(token));
    let t = Instant::now();
    let plugin = runtime.load_file(&path, Limits::default(), grants)?;
    let how = match plugin.load_path() {
        LoadPath::Compiled => "compiled",
        LoadPath::Cached => "precompiled code from cache",
    };
    println!(
        "{} loaded plugin {} {} ({}…, {how} in {} ms)",
        elapsed(),
        plugin.name(),
        plugin.manifest().version,
        short(plugin.digest()),
        t.elapsed().as_millis()
    );
    println!(
        "{} granted: outbound HTTP to {} only, bearer token for slot `sim-cloud` attached by the host",
        elapsed(),
        cloud.url()
    );
    let provider = plugin.provider()?;
    let config =
        serde_json::json!({ "endpoint": cloud.url(), "instanceType": "small" }).to_string();
    provider.validate(&config).await?;

    let mut machines: Vec<Machine> = (0..args.machines)
        .map(|i| Machine {
            name: format!("worker-{i}"),
            namespace: "default".into(),
            uid: format!("demo-{}-{i}", std::process::id()),
            cluster_name: Some("demo".into()),
            labels: vec![],
            version: Some(args.kubernetes_version.clone()),
            failure_domain: None,
            provider_config: config.clone(),
            infrastructure_config: None,
            provider_id: None,
        })
        .collect();

    println!("\n{} creating {} machines…", elapsed(), machines.len());
    let mut tasks = Vec::new();
    for m in &machines {
        let (p, m) = (provider.clone(), m.clone());
        tasks.push(tokio::spawn(async move {
            retrying(&m.name, || p.create(&m)).await
        }));
    }
    let mut statuses: Vec<MachineStatus> = Vec::new();
    for (m, task) in machines.iter_mut().zip(tasks) {
        let status = task.await??;
        println!(
            "{}   {:<10} created {} ({})",
            elapsed(),
            m.name,
            status.provider_id,
            state(&status.state)
        );
        m.provider_id = Some(status.provider_id.clone());
        statuses.push(status);
    }

    let deadline = Instant::now() + args.boot_latency + Duration::from_secs(30);
    loop {
        let running = statuses
            .iter()
            .filter(|s| s.state == InstanceState::Running)
            .count();
        if running == machines.len() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "machines did not reach running in time ({running}/{} running)",
                machines.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (m, old) in machines.iter().zip(statuses.iter_mut()) {
            let new = retrying(&m.name, || provider.get(m)).await?;
            if new.state != old.state {
                println!(
                    "{}   {:<10} {} → {}",
                    elapsed(),
                    m.name,
                    state(&old.state),
                    state(&new.state)
                );
            }
            *old = new;
        }
        let running = statuses
            .iter()
            .filter(|s| s.state == InstanceState::Running)
            .count();
        println!("{} {running}/{} running", elapsed(), machines.len());
    }

    println!(
        "\n{:<10}  {:<16}  {:<8}  {:<8}  {:<10}  ZONE",
        "NAME", "PROVIDER-ID", "STATE", "VERSION", "ADDRESS"
    );
    for (m, s) in machines.iter().zip(&statuses) {
        println!(
            "{:<10}  {:<16}  {:<8}  {:<8}  {:<10}  {}",
            m.name,
            s.provider_id,
            state(&s.state),
            s.version.as_deref().unwrap_or("-"),
            s.addresses.first().map_or("-", |a| a.address.as_str()),
            s.failure_domain.as_deref().unwrap_or("-")
        );
    }

    println!(
        "\n{} the sandbox at work: a config error is a typed contract error, not a crash:",
        elapsed()
    );
    if let Err(e) = provider.validate(r#"{"endpoint":"ftp://nowhere"}"#).await {
        println!("           {e}");
    }

    println!("\n{} deleting the machines…", elapsed());
    for m in &machines {
        loop {
            match retrying(&m.name, || provider.delete(m)).await? {
                Deletion::Done => break,
                Deletion::InProgress(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms.min(1_000))).await
                }
            }
        }
        println!("{}   {:<10} deleted", elapsed(), m.name);
    }
    let left = cloud.stats().live_instances;
    println!("{} done: the cloud has {left} instances left.", elapsed());
    cloud.shutdown().await;
    println!(
        "\nNext: `capstan plugin inspect {p}`, `capstan plugin conformance {p} --help`, `capstan bench plugin`.",
        p = path.display()
    );
    Ok(if left == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
