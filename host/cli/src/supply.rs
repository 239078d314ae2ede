//! Flags and helpers shared by the supply-chain commands (`plugin push`,
//! `pull`, `sign`, `verify`, `inspect oci://…`, `bundle …`, and the
//! controller's OCI sources): how to reach registries, where the cache is,
//! which keys or policy to trust, and progress bars.

use anyhow::{Context, bail};
use capstan_registry::keyless::{IdentityRule, Subject, TrustedRoot};
use capstan_registry::keys::PublicKey;
use capstan_registry::policy::TrustPolicy;
use capstan_registry::verify::Puller;
use capstan_registry::{Cache, Client, ClientOptions, Mirrors, Progress};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How to reach registries.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Allow plain HTTP to registries that are not on loopback (loopback
    /// registries may always use it). TLS, when spoken, is still verified.
    #[arg(long, env = "CAPSTAN_INSECURE")]
    pub insecure: bool,
    /// PEM file with extra CA certificates to trust for registry TLS (in
    /// addition to the system's).
    #[arg(long, env = "CAPSTAN_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// Docker config.json with registry credentials (default:
    /// $DOCKER_CONFIG/config.json, then ~/.docker/config.json).
    #[arg(long, env = "CAPSTAN_REGISTRY_CONFIG", value_name = "FILE")]
    pub registry_config: Option<PathBuf>,
    /// Largest blob accepted from a registry, in MiB.
    #[arg(long, env = "CAPSTAN_MAX_BLOB_MIB", default_value_t = 256)]
    pub max_blob_mib: u64,
    /// Content-addressed cache of pulled blobs and verification results
    /// (default: ~/.cache/capstan/oci).
    #[arg(long, env = "CAPSTAN_OCI_CACHE", value_name = "DIR")]
    pub oci_cache: Option<PathBuf>,
    /// Mirror configuration: fetch `oci://` sources from other registries by
    /// prefix (signatures must still name the original repository).
    #[arg(long, env = "CAPSTAN_MIRROR_CONFIG", value_name = "FILE")]
    pub mirror_config: Option<PathBuf>,
}

impl RegistryArgs {
    /// A registry client from the flags.
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::new(ClientOptions {
            insecure: self.insecure,
            ca_file: self.ca_file.clone(),
            registry_config: self.registry_config.clone(),
            max_blob_bytes: self.max_blob_mib.saturating_mul(1024 * 1024),
        })?)
    }

    /// The cache directory.
    pub fn cache_dir(&self) -> PathBuf {
        self.oci_cache.clone().unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."))
                .join(".cache/capstan/oci")
        })
    }

    /// A puller with the cache and the mirror configuration.
    pub fn puller(&self) -> anyhow::Result<Puller> {
        let mirrors = match &self.mirror_config {
            Some(path) => Mirrors::load(path)?,
            None => Mirrors::default(),
        };
        Ok(Puller {
            client: self.client()?,
            cache: Some(Cache::open(&self.cache_dir())?),
            mirrors,
        })
    }
}

/// Which signatures to require.
#[derive(Debug, Clone, clap::Args)]
pub struct TrustArgs {
    /// Public key (cosign `.pub` PEM) that must have signed. Repeatable: all
    /// of them must have signed.
    #[arg(long = "key", value_name = "PUB", conflicts_with = "policy")]
    pub keys: Vec<PathBuf>,
    /// A keyless signer that must have signed: the OIDC issuer and the
    /// certificate subject, `ISSUER=SUBJECT` (for example
    /// `https://token.actions.githubusercontent.com=https://github.com/ORG/REPO/.github/workflows/release.yml@refs/heads/main`).
    /// Repeatable: all of them (and every --key) must have signed. Needs
    /// --trusted-root.
    #[arg(
        long = "identity",
        value_name = "ISSUER=SUBJECT",
        conflicts_with = "policy",
        requires = "trusted_root"
    )]
    pub identities: Vec<String>,
    /// Sigstore's trusted root (`trusted_root.json`: Fulcio CAs, Rekor, CT
    /// log and timestamp authority keys) that --identity signatures are
    /// verified against, offline.
    #[arg(long = "trusted-root", value_name = "FILE", conflicts_with = "policy")]
    pub trusted_root: Option<PathBuf>,
    /// Trust policy file (per-source allOf/anyOf rules over named keys and
    /// keyless identities).
    #[arg(long, env = "CAPSTAN_TRUST_POLICY", value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

impl TrustArgs {
    /// The policy the flags describe, if any.
    pub fn policy(&self) -> anyhow::Result<Option<TrustPolicy>> {
        if let Some(path) = &self.policy {
            return Ok(Some(TrustPolicy::load(path)?));
        }
        if self.keys.is_empty() && self.identities.is_empty() {
            if self.trusted_root.is_some() {
                bail!(
                    "--trusted-root needs at least one --identity ISSUER=SUBJECT to verify against it"
                );
            }
            return Ok(None);
        }
        let mut keys = Vec::new();
        for path in &self.keys {
            keys.push((key_name(path), read_public_key(path)?));
        }
        let mut identities = Vec::new();
        if let Some(path) = &self.trusted_root {
            let root = TrustedRoot::load(path)?;
            for (i, text) in self.identities.iter().enumerate() {
                identities.push((format!("identity-{}", i + 1), identity(text, &root)?));
            }
        }
        let names = keys
            .iter()
            .map(|(n, _)| n.clone())
            .chain(identities.iter().map(|(n, _)| n.clone()))
            .collect();
        Ok(Some(TrustPolicy::single_with(
            keys,
            identities,
            names,
            Vec::new(),
        )?))
    }

    /// The host's policy for `bundle verify|push`: required, because the
    /// policy a bundle carries came with the bundle and cannot vouch for it.
    pub fn required_for_bundle(&self) -> anyhow::Result<TrustPolicy> {
        match self.policy()? {
            Some(p) => Ok(p),
            None => bail!(
                "say whom this site trusts: --policy FILE (or $CAPSTAN_TRUST_POLICY) or --key PUB; the bundle's own trust policy came with the bundle, so it can only narrow yours, never replace it"
            ),
        }
    }

    /// Like [`TrustArgs::policy`], but one is required.
    pub fn required(&self) -> anyhow::Result<TrustPolicy> {
        match self.policy()? {
            Some(p) => Ok(p),
            None => bail!("say whom to trust: --key PUB (repeatable) or --policy FILE"),
        }
    }
}

/// `--identity ISSUER=SUBJECT`, split at the first `=` (an issuer is a
/// plain URL; a subject URI may carry `=` in its query).
fn identity(text: &str, root: &TrustedRoot) -> anyhow::Result<IdentityRule> {
    let Some((issuer, subject)) = text.split_once('=') else {
        bail!(
            "--identity {text:?}: expected ISSUER=SUBJECT (the OIDC issuer URL, then the certificate subject)"
        );
    };
    if issuer.is_empty() || subject.is_empty() {
        bail!("--identity {text:?}: both the issuer and the subject are needed (ISSUER=SUBJECT)");
    }
    IdentityRule::new(issuer, Subject::Exact(subject.to_string()), root.clone())
        .map_err(|e| anyhow::anyhow!("--identity {text:?}: {e}"))
}

/// `keys/publisher.pub` is called `publisher`.
fn key_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Read a public key file.
pub fn read_public_key(path: &Path) -> anyhow::Result<PublicKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read public key {}", path.display()))?;
    Ok(PublicKey::from_pem(&path.display().to_string(), &text)?)
}

/// Progress bars on stderr (hidden when stderr is not a terminal).
#[derive(Debug, Default)]
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
}

impl Progress for Bars {
    fn begin(&self, label: &str, total: u64) {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>20} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .expect("the template is valid")
            .progress_chars("=> "),
        );
        bar.set_message(label.to_string());
        *self.bar.lock().expect("bar lock") = Some(bar);
    }
    fn advance(&self, n: u64) {
        if let Some(bar) = self.bar.lock().expect("bar lock").as_ref() {
            bar.inc(n);
        }
    }
    fn finish(&self) {
        if let Some(bar) = self.bar.lock().expect("bar lock").take() {
            bar.finish_and_clear();
        }
    }
}

/// A status line on stderr, for steps without a byte count.
pub fn step(message: impl std::fmt::Display) {
    eprintln!("{message}");
}
