//! `capstan plugin inspect PATH|oci://…`: what a plugin component is and
//! asks for. Remote references are handled by [`crate::distribute`].

use crate::options::Output;
use anyhow::Context;
use capstan_runtime::{Grants, Limits, Runtime, RuntimeConfig};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `capstan plugin inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Path of the plugin component (`.wasm`), or `oci://REGISTRY/REPO:TAG`.
    pub path: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
    #[command(flatten)]
    pub trust: crate::supply::TrustArgs,
    #[command(flatten)]
    pub registry: crate::supply::RegistryArgs,
}

#[derive(Debug, Serialize)]
struct Inspection {
    path: String,
    digest: String,
    size_bytes: usize,
    manifest: capstan_runtime::PluginManifest,
    world: String,
    contract: String,
    host_supports_contract: bool,
    imports: Vec<String>,
    exports: Vec<String>,
}

/// Run the command.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let text = args.path.display().to_string();
    if text.starts_with("oci://") {
        return tokio::task::spawn_blocking(move || {
            crate::distribute::inspect_remote(&text, &args.trust, &args.registry, args.output)
        })
        .await?;
    }
    let bytes = std::fs::read(&args.path)
        .with_context(|| format!("cannot read {}", args.path.display()))?;
    // Loading compiles and links the component, so inspect also proves it
    // would run in this host.
    let runtime = Runtime::new(RuntimeConfig {
        max_concurrent_calls: 1,
        ..Default::default()
    })?;
    let plugin = runtime.load(
        &args.path.display().to_string(),
        &bytes,
        Limits::default(),
        Grants::default(),
    )?;
    let manifest = plugin.manifest().clone();
    let inspection = Inspection {
        path: args.path.display().to_string(),
        digest: plugin.digest().to_string(),
        size_bytes: bytes.len(),
        world: manifest.world.to_string(),
        contract: manifest.contract.clone(),
        host_supports_contract: capstan_runtime::PluginManifest::validate(&manifest).is_ok(),
        imports: plugin.imports(),
        exports: plugin.exports(),
        manifest,
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&inspection)?),
        Output::Text => print!("{}", render(&inspection)),
    }
    Ok(ExitCode::SUCCESS)
}

fn render(i: &Inspection) -> String {
    let m = &i.manifest;
    let mut out = format!(
        "Plugin:     {} {}\nPath:       {} ({} bytes)\nDigest:     {}\nWorld:      {} (exports capstan:plugin/{}@{})\nContract:   {}{}\n",
        m.name,
        m.version,
        i.path,
        i.size_bytes,
        i.digest,
        i.world,
        i.world,
        i.contract,
        i.contract,
        if i.host_supports_contract {
            " (supported by this host)"
        } else {
            " (NOT supported by this host)"
        },
    );
    out.push_str(&render_capabilities(m));
    out.push_str("Exports:\n");
    for e in &i.exports {
        out.push_str(&format!("  {e}\n"));
    }
    out.push_str("Imports:\n");
    for e in &i.imports {
        out.push_str(&format!("  {e}\n"));
    }
    out
}

/// The `Capabilities:` block of a manifest (local and remote inspect).
pub(crate) fn render_capabilities(m: &capstan_runtime::PluginManifest) -> String {
    let mut out = String::from("Capabilities:\n");
    if m.capabilities.http.is_empty() {
        out.push_str("  (none: no outbound HTTP)\n");
    }
    for cap in &m.capabilities.http {
        let mut line = format!("  http  {}", cap.destination);
        if let Some(slot) = &cap.credential {
            line.push_str(&format!("  credential slot `{slot}`"));
        }
        if cap.optional {
            line.push_str("  (optional: may stay ungranted)");
        }
        out.push_str(&line);
        out.push('\n');
    }
    for pattern in &m.capabilities.objects {
        out.push_str(&format!("  objects  {pattern}\n"));
    }
    out
}
