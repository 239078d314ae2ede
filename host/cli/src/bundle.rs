//! `capstan bundle create|verify|push`: carry signed plugins, the signed
//! controller image and their trust policy across an air gap in one OCI
//! image layout archive.

use crate::options::Output;
use crate::supply::{Bars, RegistryArgs, TrustArgs, step};
use anyhow::Context;
use capstan_registry::layout::{self, Layout};
use std::path::PathBuf;
use std::process::ExitCode;

/// `capstan bundle …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Pull the plugins and container images `bundle.yaml` lists, check
    /// each against its trust policy, and write them with their signatures
    /// and the policy to one archive.
    Create(CreateArgs),
    /// Check a bundle offline: every blob's digest, every plugin's and
    /// image's signatures under your policy (--policy or --key; the bundle's own
    /// policy must hold too, so it can only narrow yours).
    Verify(VerifyArgs),
    /// Verify a bundle, then push its plugins, images and signatures to a
    /// mirror registry, byte for byte (digests and signatures unchanged).
    Push(PushArgs),
}

/// Flags of `bundle create`.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The bundle description (apiVersion capstan.dev/v1alpha1, kind Bundle,
    /// plugins: [oci://…:TAG], images: [oci://…:TAG], policy: FILE).
    #[arg(short = 'f', long = "file", value_name = "BUNDLE_YAML")]
    pub file: PathBuf,
    /// The archive to write.
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Flags of `bundle verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The archive.
    pub bundle: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Flags of `bundle push`.
#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The archive.
    pub bundle: PathBuf,
    /// `REGISTRY/PREFIX`: `oci://A/capstan/sim:v1` goes to `REGISTRY/PREFIX/capstan/sim:v1`.
    #[arg(long, value_name = "REGISTRY/PREFIX")]
    pub to: String,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

fn signed_by(signers: &[capstan_registry::policy::Signer]) -> String {
    signers
        .iter()
        .map(|s| format!("{} ({})", s.name, s.key_id))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_reports(verified: &layout::Verified) {
    for r in &verified.plugins {
        println!(
            "  plugin {} {} {}  signed by {}",
            r.source,
            r.name,
            r.digest,
            signed_by(&r.signers)
        );
    }
    for r in &verified.images {
        println!(
            "  image {} {}  signed by {}",
            r.source,
            r.digest,
            signed_by(&r.signers)
        );
    }
}

/// Run `bundle create`.
pub fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let client = args.registry.client()?;
    step(format!(
        "collecting the plugins listed in {}",
        args.file.display()
    ));
    let (layout, reports) = layout::create(&client, &args.file, &Bars::default())?;
    layout.write(&args.out, &Bars::default())?;
    let size = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    match args.output {
        Output::Text => {
            println!(
                "wrote {} ({size} bytes) with {} plugin(s) and {} image(s):",
                args.out.display(),
                reports.plugins.len(),
                reports.images.len()
            );
            print_reports(&reports);
        }
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "bundle": args.out,
            "sizeBytes": size,
            "plugins": reports.plugins,
            "images": reports.images,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Run `bundle verify` (no network).
pub fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let layout = Layout::read(&args.bundle)
        .with_context(|| format!("cannot read bundle {}", args.bundle.display()))?;
    let reports = layout.verify(&args.trust.required_for_bundle()?)?;
    match args.output {
        Output::Text => {
            println!(
                "{}: verified {} plugin(s) and {} image(s) offline:",
                args.bundle.display(),
                reports.plugins.len(),
                reports.images.len()
            );
            print_reports(&reports);
        }
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "verified": true,
            "plugins": reports.plugins,
            "images": reports.images,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Run `bundle push`.
pub fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    let layout = Layout::read(&args.bundle)
        .with_context(|| format!("cannot read bundle {}", args.bundle.display()))?;
    step(format!(
        "verifying {} before pushing",
        args.bundle.display()
    ));
    layout.verify(&args.trust.required_for_bundle()?)?;
    let client = args.registry.client()?;
    let pushed = layout.push(&client, &args.to, &Bars::default())?;
    match args.output {
        Output::Text => {
            for p in &pushed {
                println!("{} -> {} ({})", p.source, p.destination, p.digest);
            }
        }
        format @ (Output::Json | Output::Yaml) => {
            format.print(&serde_json::json!({"pushed": pushed}))?
        }
    }
    Ok(ExitCode::SUCCESS)
}
