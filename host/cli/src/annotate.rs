//! `capstan plugin annotate IN.wasm --manifest capstan-plugin.json -o
//! OUT.wasm`: give a component built by any toolchain (componentize-py,
//! componentize-js, wit-bindgen for another language) the manifest the host
//! reads, so it reaches the same supply chain as a Rust plugin (`push`,
//! `sign`, bundles). The byte work is `capstan_manifest::component`; this
//! module reads files, reports and writes atomically.

use crate::options::Output;
use anyhow::Context;
use capstan_manifest::{Footprint, Interfaces, PluginManifest};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `capstan plugin annotate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The component to annotate (`.wasm`, any toolchain). Left unchanged.
    pub input: PathBuf,
    /// The manifest to embed (JSON: name, version, world, contract,
    /// capabilities). Replaces any manifest the component already carries.
    #[arg(long, short = 'm', value_name = "JSON")]
    pub manifest: PathBuf,
    /// Where to write the annotated component (may be the input itself).
    #[arg(long = "out", short = 'o', value_name = "PATH")]
    pub out: PathBuf,
    /// Report format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Output,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    path: String,
    digest: String,
    size_bytes: usize,
    manifest: PluginManifest,
    export: String,
    /// One instantiation's core instances, memories and tables.
    core_instances: usize,
    memories: usize,
    tables: usize,
    /// Imports beyond the contract's own, with what the host gives for each.
    sandbox: Vec<SandboxImport>,
}

#[derive(Debug, Serialize)]
struct SandboxImport {
    import: String,
    host_gives: String,
}

/// Run the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let component = std::fs::read(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let json = std::fs::read(&args.manifest)
        .with_context(|| format!("cannot read the manifest {}", args.manifest.display()))?;
    let annotated = capstan_manifest::embed_manifest(&component, &json).with_context(|| {
        format!(
            "cannot annotate {} with {}",
            args.input.display(),
            args.manifest.display()
        )
    })?;
    let footprint = capstan_manifest::footprint(&annotated)?;
    if let Some(reason) = capstan_runtime::over_call_maxima(footprint) {
        anyhow::bail!(
            "{} would not load: {reason}; split the component or build it with fewer modules",
            args.input.display()
        );
    }
    let manifest = PluginManifest::from_component(&annotated)?;
    let interfaces = capstan_manifest::interfaces(&annotated)?;
    write_atomically(&args.out, &annotated)?;
    let report = report(&args.out, &annotated, manifest, footprint, &interfaces);
    match args.format {
        format @ (Output::Json | Output::Yaml) => format.print(&report)?,
        Output::Text => print!("{}", render(&report)),
    }
    Ok(ExitCode::SUCCESS)
}

fn report(
    out: &Path,
    bytes: &[u8],
    manifest: PluginManifest,
    footprint: Footprint,
    interfaces: &Interfaces,
) -> Report {
    let sandbox = interfaces
        .imports
        .iter()
        .filter(|i| !i.starts_with("capstan:plugin/"))
        .map(|i| SandboxImport {
            import: i.clone(),
            host_gives: capstan_manifest::host_provides(i)
                .unwrap_or("not provided")
                .to_string(),
        })
        .collect();
    Report {
        path: out.display().to_string(),
        digest: capstan_runtime::digest(bytes),
        size_bytes: bytes.len(),
        export: manifest.world.export_interface(&manifest.contract),
        manifest,
        core_instances: footprint.core_instances,
        memories: footprint.memories,
        tables: footprint.tables,
        sandbox,
    }
}

fn render(r: &Report) -> String {
    let m = &r.manifest;
    let mut out = format!(
        "Annotated {} ({} bytes)\nDigest:     {}\nPlugin:     {} {} (world {}, contract {}; exports {})\n",
        r.path, r.size_bytes, r.digest, m.name, m.version, m.world, m.contract, r.export,
    );
    out.push_str(&crate::inspect::render_per_call(
        r.core_instances,
        r.memories,
        r.tables,
    ));
    out.push_str(&crate::inspect::render_capabilities(m));
    if r.sandbox.is_empty() {
        out.push_str("Sandbox:    imports nothing beyond the contract\n");
    } else {
        out.push_str(
            "Sandbox:    what the component imports beyond the contract, and what the host gives\n",
        );
        let width = r.sandbox.iter().map(|s| s.import.len()).max().unwrap_or(0);
        for s in &r.sandbox {
            out.push_str(&format!("  {:width$}  {}\n", s.import, s.host_gives));
        }
    }
    out
}

/// Write next to the destination, then rename: a failure never leaves a
/// half-written component where a push or a Plugin would pick it up.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let file_name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}
