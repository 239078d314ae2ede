//! `capstan-bench-controller`: the native variant of the scale benchmark.
//! It runs the same controllers as `capstan controller`
//! ([`capstan_controllers::serve`]) and also serves machines whose
//! `provider.plugin` is `--native-sim-provider NAME` with the sim-provider
//! logic compiled natively (no sandbox). Its bearer token comes from
//! `$CAPSTAN_NATIVE_SIM_TOKEN`. Not part of the product binary.

use capstan_bench::NativeSimProvider;
use capstan_controllers::serve::{Process, serve};
use capstan_controllers::{Concurrency, Options, Providers, Registered};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

const USAGE: &str = "usage: capstan-bench-controller --kubeconfig FILE --native-sim-provider NAME \
[--metrics-addr ADDR] [--health-addr ADDR] [--machine-concurrency N] [--poll-interval-ms MS] [--instance-check-ms MS] \
[--code-cache DIR] [--namespace NS]";

struct Args {
    kubeconfig: PathBuf,
    plugin: String,
    metrics_addr: std::net::SocketAddr,
    health_addr: std::net::SocketAddr,
    machine_concurrency: u16,
    poll: Duration,
    instance_check: Duration,
    code_cache: Option<PathBuf>,
    namespace: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut kubeconfig = None;
    let mut plugin = None;
    let mut args = Args {
        kubeconfig: PathBuf::new(),
        plugin: String::new(),
        metrics_addr: "127.0.0.1:9090".parse().expect("an address"),
        health_addr: "127.0.0.1:9091".parse().expect("an address"),
        machine_concurrency: 32,
        poll: Duration::from_secs(1),
        instance_check: Duration::from_secs(60),
        code_cache: None,
        namespace: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = inline
            .or_else(|| it.next())
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value:?}: {e}");
        match flag.as_str() {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(&value)),
            "--native-sim-provider" => plugin = Some(value),
            "--metrics-addr" => args.metrics_addr = value.parse().map_err(|e| bad(&e))?,
            "--health-addr" => args.health_addr = value.parse().map_err(|e| bad(&e))?,
            "--machine-concurrency" => {
                args.machine_concurrency = value.parse().map_err(|e| bad(&e))?
            }
            "--poll-interval-ms" => {
                args.poll = Duration::from_millis(value.parse().map_err(|e| bad(&e))?)
            }
            "--instance-check-ms" => {
                args.instance_check = Duration::from_millis(value.parse().map_err(|e| bad(&e))?)
            }
            "--code-cache" => args.code_cache = Some(PathBuf::from(value)),
            "--namespace" => args.namespace = Some(value),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    args.kubeconfig = kubeconfig.ok_or(format!("--kubeconfig is required\n{USAGE}"))?;
    args.plugin = plugin.ok_or(format!("--native-sim-provider is required\n{USAGE}"))?;
    Ok(args)
}

async fn run(args: Args) -> Result<(), String> {
    let kc = kube::config::Kubeconfig::read_from(&args.kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let runtime = capstan_runtime::Runtime::new(capstan_runtime::RuntimeConfig {
        cache_dir: args.code_cache,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let providers = Providers::default();
    let token = std::env::var("CAPSTAN_NATIVE_SIM_TOKEN").ok();
    providers.insert(
        &args.plugin,
        Registered::new(Arc::new(NativeSimProvider::new(token)), None),
    );
    let process = Process {
        config,
        runtime: Some(runtime),
        providers,
        options: Options {
            concurrency: Concurrency {
                machines: args.machine_concurrency.max(1),
                ..Concurrency::default()
            },
            poll: args.poll,
            instance_check: args.instance_check,
            secrets_namespace: args.namespace,
            ..Options::default()
        },
        metrics_addr: args.metrics_addr,
        health_addr: args.health_addr,
        election: None,
    };
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    serve(process, shutdown).await.map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match parse() {
        Ok(args) => run(args).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
