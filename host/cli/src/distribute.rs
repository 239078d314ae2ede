//! `capstan key generate`, `capstan plugin push|pull|sign|verify`, and
//! `capstan plugin inspect oci://…`: publishing plugins to OCI registries,
//! signing them the way cosign does, and checking them against a policy.

use crate::options::Output;
use crate::supply::{Bars, RegistryArgs, TrustArgs, step};
use anyhow::{Context, bail};
use capstan_registry::keys::PrivateKey;
use capstan_registry::policy::Signer;
use capstan_registry::{Reference, artifact, signature};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `capstan key generate`.
#[derive(Debug, clap::Args)]
pub struct KeyGenerateArgs {
    /// Write PREFIX.key (encrypted private key) and PREFIX.pub (public key).
    #[arg(long, default_value = "cosign")]
    pub output_prefix: String,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
}

/// The password for a private key: `$CAPSTAN_PASSWORD`, else a prompt
/// (twice when creating a key).
fn password(confirm: bool) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var("CAPSTAN_PASSWORD") {
        return Ok(p);
    }
    if !std::io::stdin().is_terminal() {
        bail!("no password: set CAPSTAN_PASSWORD (stdin is not a terminal, so there is no prompt)");
    }
    let first = rpassword::prompt_password("Password for the private key: ")?;
    if confirm {
        let again = rpassword::prompt_password("Again: ")?;
        if again != first {
            bail!("the passwords differ");
        }
    }
    Ok(first)
}

/// Run `key generate`.
pub fn key_generate(args: KeyGenerateArgs) -> anyhow::Result<ExitCode> {
    let private = PathBuf::from(format!("{}.key", args.output_prefix));
    let public = PathBuf::from(format!("{}.pub", args.output_prefix));
    for path in [&private, &public] {
        if path.exists() && !args.force {
            bail!(
                "{} already exists; pass --force to overwrite it",
                path.display()
            );
        }
    }
    let password = password(true)?;
    let key = PrivateKey::generate();
    let pem = key.to_encrypted_pem(password.as_bytes())?;
    write_private(&private, pem.as_bytes())?;
    std::fs::write(&public, key.public().to_pem())
        .with_context(|| format!("cannot write {}", public.display()))?;
    println!("Private key written to {}", private.display());
    println!(
        "Public key written to {} (key id {})",
        public.display(),
        key.public().id()
    );
    Ok(ExitCode::SUCCESS)
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

pub(crate) fn reference(text: &str) -> anyhow::Result<Reference> {
    if !text.starts_with("oci://") {
        bail!("{text:?}: expected an oci://REGISTRY/REPOSITORY[:TAG][@sha256:…] reference");
    }
    Ok(Reference::parse(text)?)
}

/// `capstan plugin push`.
#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The component (`.wasm`).
    pub path: PathBuf,
    /// Where to push: `oci://REGISTRY/REPOSITORY:TAG`.
    pub reference: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run `plugin push`: prints the manifest digest.
pub fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    let target = reference(&args.reference)?;
    if target.digest.is_some() || target.tag.is_none() {
        bail!(
            "{}: push to a tag (oci://REGISTRY/REPOSITORY:TAG); the digest is computed",
            args.reference
        );
    }
    let component = std::fs::read(&args.path)
        .with_context(|| format!("cannot read {}", args.path.display()))?;
    let client = args.registry.client()?;
    step(format!(
        "pushing {} ({} bytes) to {target}",
        args.path.display(),
        component.len()
    ));
    let (digest, plugin) = artifact::push(&client, &target, &component, &Bars::default())?;
    match args.output {
        Output::Text => println!("{digest}"),
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "reference": target.to_string(),
            "digest": digest,
            "pinned": target.pinned(&digest).to_string(),
            "plugin": plugin,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `capstan plugin pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// `oci://REGISTRY/REPOSITORY:TAG` or `…@sha256:…`.
    pub reference: String,
    /// Where to write the component.
    #[arg(short = 'o', long = "out", value_name = "PATH")]
    pub out: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Pull without checking signatures (the bytes are still checked
    /// against the manifest digest).
    #[arg(long, conflicts_with_all = ["keys", "policy"])]
    pub skip_verify: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run `plugin pull`.
pub fn pull(args: PullArgs) -> anyhow::Result<ExitCode> {
    let source = reference(&args.reference)?;
    let puller = args.registry.puller()?;
    let policy = args.trust.policy()?;
    if policy.is_none() && !args.skip_verify {
        bail!(
            "say whom to trust (--key PUB or --policy FILE), or pass --skip-verify to pull unverified"
        );
    }
    step(format!("resolving {source}"));
    let described = puller.describe(&source)?;
    let signers = match &policy {
        Some(policy) => {
            step(format!("verifying {}", described.digest));
            puller.verify(&source, &described, policy, &[])?.signers
        }
        None => Vec::new(),
    };
    let (component, _) = artifact::fetch_component(
        &puller.client,
        puller.cache.as_ref(),
        &described,
        &Bars::default(),
    )?;
    let temp = args.out.with_extension("partial");
    std::fs::write(&temp, &component)
        .with_context(|| format!("cannot write {}", temp.display()))?;
    std::fs::rename(&temp, &args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    match args.output {
        Output::Text => {
            println!(
                "{} -> {} ({} bytes)",
                source.pinned(&described.digest),
                args.out.display(),
                component.len()
            );
            print_signers(&signers, policy.is_some());
        }
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "reference": source.to_string(),
            "digest": described.digest,
            "path": args.out,
            "verified": policy.is_some(),
            "signers": signers,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_signers(signers: &[Signer], verified: bool) {
    if !verified {
        println!("NOT VERIFIED (--skip-verify)");
    }
    for s in signers {
        let logged = s
            .log_index
            .map(|i| format!(", Rekor log index {i}"))
            .unwrap_or_default();
        println!(
            "verified: signed by {} ({}) in {}{logged}",
            s.name, s.key_id, s.origin
        );
    }
}

/// `capstan plugin sign`.
#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The plugin: `oci://REGISTRY/REPOSITORY:TAG` or `…@sha256:…` (a tag is
    /// resolved once; the signature covers that digest; any OCI artifact,
    /// such as the controller image, is signed the same way), or a local
    /// component (`PATH.wasm` or `file:///PATH.wasm`), whose signature goes
    /// into the Sigstore bundle `PATH.wasm.sigstore.json` next to it, where
    /// the controller looks for it.
    pub reference: String,
    /// The private key (cosign format; password from $CAPSTAN_PASSWORD or a prompt).
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
    /// Also attach a Sigstore bundle (DSSE, v0.3) as an OCI referrer, the
    /// format `cosign --new-bundle-format` and sigstore-js read.
    #[arg(long)]
    pub bundle: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run `plugin sign`.
pub fn sign(args: SignArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.key)
        .with_context(|| format!("cannot read private key {}", args.key.display()))?;
    let key = PrivateKey::from_encrypted_pem(
        &args.key.display().to_string(),
        &text,
        password(false)?.as_bytes(),
    )?;
    if !args.reference.starts_with("oci://") {
        return sign_file(&args, &key);
    }
    let target = reference(&args.reference)?;
    let client = args.registry.client()?;
    // Any manifest: a signature covers its digest, whatever it describes.
    let (digest, media_type, manifest_bytes) = client.fetch_manifest(&target)?;
    let repository = target.repository_name();
    let added = signature::sign(&client, &target, &repository, &digest, &key)?;
    let mut bundle = None;
    if args.bundle {
        let subject = capstan_registry::oci::Descriptor::of(&media_type, &manifest_bytes);
        let json = signature::make_bundle(&repository, &digest, &key);
        bundle = Some(signature::attach_bundle(&client, &target, &subject, &json)?);
    }
    let pinned = target.pinned(&digest);
    match args.output {
        Output::Text => {
            if added {
                println!("signed {pinned} with key {}", key.public().id());
            } else {
                println!(
                    "{pinned} was already signed with key {}; nothing pushed",
                    key.public().id()
                );
            }
            if let Some(d) = &bundle {
                println!("attached Sigstore bundle {d}");
            }
        }
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "reference": pinned.to_string(),
            "digest": digest,
            "keyId": key.public().id(),
            "added": added,
            "bundle": bundle,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `plugin sign PATH.wasm`: add this key's signature to the file's bundle.
fn sign_file(args: &SignArgs, key: &PrivateKey) -> anyhow::Result<ExitCode> {
    let path = PathBuf::from(args.reference.trim_start_matches("file://"));
    let bytes =
        capstan_registry::verify::read_bounded(&path, capstan_registry::DEFAULT_MAX_BLOB_BYTES)
            .with_context(|| format!("cannot read component {}", path.display()))?;
    capstan_runtime::PluginManifest::from_component(&bytes)
        .with_context(|| format!("{} is not a Capstan plugin component", path.display()))?;
    let bundle_path = capstan_registry::verify::file_bundle_path(&path);
    let existing = match std::fs::read(&bundle_path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", bundle_path.display())),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (bundle, added) = signature::sign_file_bundle(&name, &bytes, existing.as_deref(), key);
    if added {
        // Written whole, then renamed: a reader never sees half a bundle.
        let partial = bundle_path.with_extension("json.partial");
        std::fs::write(&partial, &bundle)
            .and_then(|()| std::fs::rename(&partial, &bundle_path))
            .with_context(|| format!("cannot write {}", bundle_path.display()))?;
    }
    let digest = capstan_registry::Digest::of(&bytes);
    match args.output {
        Output::Text if added => println!(
            "signed {} ({digest}) with key {}: {}",
            path.display(),
            key.public().id(),
            bundle_path.display()
        ),
        Output::Text => println!(
            "{} ({digest}) was already signed with key {}; {} unchanged",
            path.display(),
            key.public().id(),
            bundle_path.display()
        ),
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "file": path,
            "digest": digest,
            "keyId": key.public().id(),
            "added": added,
            "bundle": bundle_path,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `capstan plugin attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// The plugin: `oci://REGISTRY/REPOSITORY:TAG` or `…@sha256:…`.
    pub reference: String,
    /// A Sigstore bundle (JSON) made by another tool, for example cosign or
    /// sigstore-js; stored as an OCI referrer of the plugin's manifest.
    #[arg(long, value_name = "FILE")]
    pub bundle: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run `plugin attach`: the bundle must be about this artifact (its
/// statement or message digest names the manifest digest and repository),
/// but its signer is not judged here; verify does that.
pub fn attach(args: AttachArgs) -> anyhow::Result<ExitCode> {
    let target = reference(&args.reference)?;
    let json = std::fs::read(&args.bundle)
        .with_context(|| format!("cannot read bundle {}", args.bundle.display()))?;
    let client = args.registry.client()?;
    let described = artifact::describe(&client, &target)?;
    let origin = format!("sigstore bundle {}", args.bundle.display());
    let candidates = signature::bundle_candidates(
        &origin,
        &json,
        &target.repository_name(),
        &described.digest,
        &described.manifest_bytes,
    )?;
    if let Some(Err(reason)) = candidates
        .iter()
        .map(|c| c.claim.clone())
        .find(Result::is_err)
    {
        bail!(
            "{origin} is not about {}: {reason}",
            target.pinned(&described.digest)
        );
    }
    let subject = capstan_registry::oci::Descriptor::of(
        capstan_registry::oci::MANIFEST,
        &described.manifest_bytes,
    );
    let digest = signature::attach_bundle(&client, &target, &subject, &json)?;
    let pinned = target.pinned(&described.digest);
    match args.output {
        Output::Text => println!(
            "attached {} to {pinned} as referrer {digest}",
            args.bundle.display()
        ),
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "reference": pinned.to_string(),
            "referrer": digest,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `capstan plugin verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The plugin: `oci://REGISTRY/REPOSITORY:TAG` or `…@sha256:…`.
    pub reference: String,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// A Sigstore bundle file to consider besides the signatures stored in
    /// the registry. Repeatable.
    #[arg(long = "bundle", value_name = "FILE")]
    pub bundles: Vec<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Run `plugin verify`: exit 0 when the policy is satisfied.
pub fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let source = reference(&args.reference)?;
    let policy = args.trust.required()?;
    let mut extra = Vec::new();
    for path in &args.bundles {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read bundle {}", path.display()))?;
        extra.push((format!("sigstore bundle {}", path.display()), bytes));
    }
    let mut puller = args.registry.puller()?;
    // Verify for real every time; the cache is for the controller's loads.
    puller.cache = None;
    let described = puller.describe(&source)?;
    let verified = puller.verify(&source, &described, &policy, &extra)?;
    match args.output {
        Output::Text => {
            println!("{}: verified", verified.source);
            print_signers(&verified.signers, true);
        }
        format @ (Output::Json | Output::Yaml) => format.print(&serde_json::json!({
            "reference": verified.source.to_string(),
            "digest": verified.digest,
            "verified": true,
            "signers": verified.signers,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}
