//! The same plugins written in Rust, Python and JavaScript, measured side
//! by side in one run (`capstan-bench-plugin --languages`): component size,
//! first compile, the code cache's entry and a load from it, a fresh
//! instance, and a call (`validate` and `create` for the sim providers,
//! `render` for the node-exporter addons). Figures are printed by the
//! caller as `lang_<language>_<what>` lines.

use anyhow::Context;
use capstan_runtime::types::{AddonSpec, Machine};
use capstan_runtime::{Grants, Limits, Plugin, Runtime, RuntimeConfig};
use std::path::Path;
use std::time::{Duration, Instant};

/// What a plugin is measured doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// A sim-cloud provider: `validate` and `create` against `endpoint`.
    Provider,
    /// The node-exporter addon: `render`.
    Addon,
}

/// One measured figure.
pub type Figure = (String, f64);

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64()
}

fn runtime(cache: Option<&Path>) -> anyhow::Result<Runtime> {
    Ok(Runtime::new(RuntimeConfig {
        cache_dir: cache.map(Path::to_path_buf),
        max_concurrent_calls: 8,
        ..Default::default()
    })?)
}

fn sim_machine(i: usize, endpoint: &str) -> Machine {
    Machine {
        name: format!("lang-{i}"),
        namespace: "default".into(),
        uid: format!("lang-uid-{i}-{}", std::process::id()),
        cluster_name: Some("bench".into()),
        labels: vec![],
        version: Some("v1.30.0".into()),
        failure_domain: None,
        provider_config: serde_json::json!({ "endpoint": endpoint, "instanceType": "small" })
            .to_string(),
        infrastructure_config: None,
        provider_id: None,
    }
}

/// Measure one plugin: `label` names it in the figures (`lang_<label>_…`).
pub async fn measure(
    label: &str,
    path: &Path,
    job: Job,
    grants: &Grants,
    endpoint: &str,
    calls: usize,
) -> anyhow::Result<Vec<Figure>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let cache = tempfile::tempdir()?;
    let mut out: Vec<Figure> = vec![(format!("lang_{label}_size_bytes"), bytes.len() as f64)];

    let started = Instant::now();
    runtime(Some(cache.path()))?.load(label, &bytes, Limits::default(), grants.clone())?;
    out.push((
        format!("lang_{label}_compile_ms"),
        started.elapsed().as_secs_f64() * 1e3,
    ));
    let entries: u64 = std::fs::read_dir(cache.path())?
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    out.push((format!("lang_{label}_cache_entry_bytes"), entries as f64));

    // A new process's first load: a fresh engine reading the cache.
    let mut loads = Vec::new();
    let mut plugin: Option<Plugin> = None;
    for _ in 0..5 {
        let rt = runtime(Some(cache.path()))?;
        let t = Instant::now();
        let loaded = rt.load(label, &bytes, Limits::default(), grants.clone())?;
        loads.push(t.elapsed());
        plugin = Some(loaded);
    }
    out.push((
        format!("lang_{label}_load_precompiled_ms"),
        median(loads) * 1e3,
    ));
    let plugin = plugin.context("loaded")?;
    let footprint = plugin.footprint();
    out.push((
        format!("lang_{label}_core_instances_per_call"),
        footprint.core_instances as f64,
    ));

    match job {
        Job::Provider => {
            let provider = plugin.provider()?;
            let mut inst = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                provider.instantiate_only().await?;
                inst.push(t.elapsed());
            }
            out.push((
                format!("lang_{label}_instantiate_us_p50"),
                median(inst) * 1e6,
            ));
            let config = sim_machine(0, endpoint).provider_config;
            let mut validate = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                provider.validate(&config).await?;
                validate.push(t.elapsed());
            }
            out.push((
                format!("lang_{label}_validate_us_p50"),
                median(validate) * 1e6,
            ));
            let mut create = Vec::with_capacity(calls);
            for i in 0..calls {
                let m = sim_machine(i, endpoint);
                let t = Instant::now();
                provider.create(&m, None).await?;
                create.push(t.elapsed());
            }
            out.push((format!("lang_{label}_create_us_p50"), median(create) * 1e6));
        }
        Job::Addon => {
            let addon = plugin.addon()?;
            let spec = AddonSpec {
                name: "metrics".into(),
                namespace: "default".into(),
                version: Some("1.8.2".into()),
                channel: None,
                config: r#"{"port": 9200}"#.into(),
                kubernetes_version: Some("v1.30.0".into()),
            };
            let mut render = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                let objects = addon.render(&spec).await?;
                anyhow::ensure!(
                    objects.len() == 4,
                    "{label} rendered {} objects",
                    objects.len()
                );
                render.push(t.elapsed());
            }
            out.push((format!("lang_{label}_render_us_p50"), median(render) * 1e6));
        }
    }
    Ok(out)
}

/// `lang_ratio_<label>_vs_<base>_<what>` for every figure both have.
pub fn ratios(label: &str, base: &str, figures: &[Figure]) -> Vec<Figure> {
    let value = |name: &str| figures.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let prefix = format!("lang_{label}_");
    figures
        .iter()
        .filter_map(|(name, v)| {
            let what = name.strip_prefix(&prefix)?;
            let b = value(&format!("lang_{base}_{what}"))?;
            (b > 0.0).then(|| (format!("lang_ratio_{label}_vs_{base}_{what}"), v / b))
        })
        .collect()
}
