//! `capstan-bench-supply`: what it costs to bring a signed plugin into the
//! host, cold versus warm, against a real registry (Debian's docker-registry
//! on loopback). Prints `name value` lines (not a timed test).
//!
//! - **cold**: empty blob, verification and code caches: resolve the tag,
//!   fetch and check the signatures, download the component, compile it.
//! - **warm, pinned**: the source names a digest that was verified and
//!   compiled before: manifest, verification record, component and
//!   precompiled code all come from the caches (no network at all).
//! - **warm, tag**: the same with a tag, which costs one manifest request
//!   to resolve.
//!
//! Each path runs `--iterations` times with its own fresh runtime; the
//! figures are medians, and the ratios compare the medians of one run.

use anyhow::Context;
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_registry::keys::PrivateKey;
use capstan_registry::policy::TrustPolicy;
use capstan_registry::verify::Puller;
use capstan_registry::{
    Cache, Client, ClientOptions, Mirrors, NoProgress, Reference, artifact, signature,
};
use capstan_runtime::{Grants, Limits, Runtime, RuntimeConfig};
use std::path::Path;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: capstan-bench-supply [--iterations N]
  --iterations N  loads per path (default 20)";

#[derive(Default)]
struct Steps {
    resolve: Vec<Duration>,
    verify: Vec<Duration>,
    fetch: Vec<Duration>,
    compile: Vec<Duration>,
    total: Vec<Duration>,
}

fn median_ms(v: &[Duration]) -> f64 {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

fn load(
    source: &Reference,
    policy: &TrustPolicy,
    cache: &Path,
    steps: &mut Steps,
) -> anyhow::Result<()> {
    let puller = Puller {
        client: Client::new(ClientOptions::default())?,
        cache: Some(Cache::open(&cache.join("oci"))?),
        mirrors: Mirrors::default(),
    };
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache.join("code")),
        max_concurrent_calls: 4,
        ..Default::default()
    })?;
    let start = Instant::now();
    let described = puller.describe(source)?;
    let t1 = Instant::now();
    puller.verify(source, &described, policy, &[])?;
    let t2 = Instant::now();
    let (bytes, _) = artifact::fetch_component(
        &puller.client,
        puller.cache.as_ref(),
        &described,
        &NoProgress,
    )?;
    let t3 = Instant::now();
    let loaded = runtime.load(
        &source.to_string(),
        &bytes,
        Limits::default(),
        Grants::default(),
    )?;
    let t4 = Instant::now();
    loaded.provider()?;
    steps.resolve.push(t1 - start);
    steps.verify.push(t2 - t1);
    steps.fetch.push(t3 - t2);
    steps.compile.push(t4 - t3);
    steps.total.push(t4 - start);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut iterations = 20usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--iterations" => iterations = args.next().context(USAGE)?.parse().context(USAGE)?,
            _ => anyhow::bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    let registry = Registry::start(RegistryOptions::default()).map_err(anyhow::Error::msg)?;
    let component = std::fs::read(capstan_e2e::plugin("sim_provider"))?;
    let client = Client::new(ClientOptions::default())?;
    let tagged = Reference::parse(&format!("oci://{}/capstan/sim-provider:v1", registry.host))?;
    let (digest, _) = artifact::push(&client, &tagged, &component, &NoProgress)?;
    let key = PrivateKey::generate();
    signature::sign(&client, &tagged, &tagged.repository_name(), &digest, &key)?;
    let policy = TrustPolicy::single(
        vec![("publisher".into(), key.public())],
        vec!["publisher".into()],
        vec![],
    )?;
    let pinned = tagged.pinned(&digest);

    let scratch = tempfile::tempdir()?;
    let (mut cold, mut warm_pinned, mut warm_tag) =
        (Steps::default(), Steps::default(), Steps::default());
    let warm_cache = scratch.path().join("warm");
    load(&tagged, &policy, &warm_cache, &mut Steps::default())?;
    for i in 0..iterations {
        load(
            &tagged,
            &policy,
            &scratch.path().join(format!("cold-{i}")),
            &mut cold,
        )?;
        load(&pinned, &policy, &warm_cache, &mut warm_pinned)?;
        load(&tagged, &policy, &warm_cache, &mut warm_tag)?;
    }

    println!(
        "# capstan-bench-supply: sim-provider ({} bytes), docker-registry on loopback, {iterations} loads per path, medians",
        component.len()
    );
    for (name, steps) in [
        ("cold", &cold),
        ("warm_pinned", &warm_pinned),
        ("warm_tag", &warm_tag),
    ] {
        println!("{name}_resolve_ms {:.3}", median_ms(&steps.resolve));
        println!("{name}_verify_ms {:.3}", median_ms(&steps.verify));
        println!("{name}_fetch_ms {:.3}", median_ms(&steps.fetch));
        println!("{name}_compile_or_load_ms {:.3}", median_ms(&steps.compile));
        println!("{name}_total_ms {:.3}", median_ms(&steps.total));
    }
    println!(
        "ratio_cold_vs_warm_pinned {:.1}",
        median_ms(&cold.total) / median_ms(&warm_pinned.total)
    );
    println!(
        "ratio_cold_vs_warm_tag {:.1}",
        median_ms(&cold.total) / median_ms(&warm_tag.total)
    );
    Ok(())
}
