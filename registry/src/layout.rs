//! Air-gap bundles: one OCI image layout archive (tar) holding plugins,
//! container images (the controller's own), their signatures (cosign `.sig`
//! manifests and Sigstore bundle referrers) and the trust policy.
//!
//! - [`create`] resolves each plugin and image listed in a `bundle.yaml`,
//!   refuses any that does not verify under the policy, and writes every
//!   manifest and blob byte-for-byte, so digests and signatures survive the
//!   trip.
//! - [`Layout::read`] loads an archive into memory, accepting only the names
//!   an OCI layout has (`oci-layout`, `index.json`, `blobs/sha256/<hex>`) and
//!   checking every blob's digest; nothing is extracted to disk, so a
//!   hostile archive cannot write anywhere.
//! - [`Layout::verify`] checks every plugin offline; [`Layout::push`] mirrors
//!   them to another registry under a prefix.

use crate::artifact;
use crate::client::{NoProgress, Progress};
use crate::oci::{self, Descriptor, Index, Manifest};
use crate::policy::{self, Signer, TrustPolicy};
use crate::signature::{self, Fetch};
use crate::{Client, Digest, Error, Reference};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Annotation on `index.json` entries: the full `oci://` reference the entry
/// was copied from (tag included).
pub const ANNOTATION_SOURCE: &str = "dev.capstan.bundle.source";
/// Annotation on `index.json` entries of container images: what the entry
/// is ([`KIND_IMAGE`]); plugins are known by their Wasm config instead.
pub const ANNOTATION_KIND: &str = "dev.capstan.bundle.kind";
/// [`ANNOTATION_KIND`] of a container image.
pub const KIND_IMAGE: &str = "image";
/// `ref.name` of the trust policy entry.
pub const POLICY_REF_NAME: &str = "capstan-trust-policy";
/// The largest archive member accepted.
const MAX_MEMBER_BYTES: u64 = crate::client::DEFAULT_MAX_BLOB_BYTES;

/// `bundle.yaml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleSpec {
    /// `capstan.dev/v1alpha1`.
    pub api_version: String,
    /// `Bundle`.
    pub kind: String,
    /// `oci://` references of the plugins to carry.
    #[serde(default)]
    pub plugins: Vec<String>,
    /// `oci://` references of container images to carry (the controller's
    /// own, for one file that brings both across the gap); signed and
    /// verified like plugins.
    #[serde(default)]
    pub images: Vec<String>,
    /// The trust policy file (relative to `bundle.yaml`); it goes into the
    /// bundle with every key inline.
    pub policy: String,
}

/// An air-gap bundle in memory.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    blobs: BTreeMap<Digest, Vec<u8>>,
    index: Index,
}

/// What [`Layout::verify`] found for one plugin.
#[derive(Debug, Clone, Serialize)]
pub struct PluginReport {
    /// The source it was bundled from.
    pub source: String,
    /// Its manifest digest.
    pub digest: Digest,
    /// Plugin name and version.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// Keys whose signatures counted.
    pub signers: Vec<Signer>,
}

/// What [`Layout::verify`] found for one container image.
#[derive(Debug, Clone, Serialize)]
pub struct ImageReport {
    /// The source it was bundled from.
    pub source: String,
    /// Its manifest (or index) digest: what a Deployment pins.
    pub digest: Digest,
    /// Keys whose signatures counted.
    pub signers: Vec<Signer>,
}

/// Everything [`Layout::verify`] checked.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verified {
    /// The plugins.
    pub plugins: Vec<PluginReport>,
    /// The container images.
    pub images: Vec<ImageReport>,
}

/// What [`Layout::push`] did for one entry.
#[derive(Debug, Clone, Serialize)]
pub struct Pushed {
    /// Where it came from.
    pub source: String,
    /// Where it went.
    pub destination: String,
    /// Its digest (unchanged).
    pub digest: Digest,
}

impl Layout {
    fn add(&mut self, bytes: Vec<u8>) -> Digest {
        let digest = Digest::of(&bytes);
        self.blobs.insert(digest.clone(), bytes);
        digest
    }

    fn entry(
        &mut self,
        media_type: &str,
        bytes: Vec<u8>,
        source: &str,
        ref_name: &str,
        kind: Option<&str>,
    ) {
        let mut descriptor = Descriptor::of(media_type, &bytes);
        if let Some(kind) = kind {
            descriptor
                .annotations
                .insert(ANNOTATION_KIND.into(), kind.into());
        }
        descriptor
            .annotations
            .insert(oci::ANNOTATION_REF_NAME.into(), ref_name.into());
        descriptor
            .annotations
            .insert(ANNOTATION_SOURCE.into(), source.into());
        self.add(bytes);
        self.index
            .manifests
            .retain(|d| d.annotations.get(ANNOTATION_SOURCE).map(String::as_str) != Some(source));
        self.index.manifests.push(descriptor);
    }

    /// Copy a manifest (or index, recursively) and its blobs from a registry.
    fn copy(
        &mut self,
        client: &Client,
        reference: &Reference,
        progress: &dyn Progress,
    ) -> Result<Option<(String, Vec<u8>)>, Error> {
        let Some((_, media_type, bytes)) = client.fetch_manifest_opt(reference)? else {
            return Ok(None);
        };
        if media_type.contains("index") {
            let index = Index::parse(&reference.to_string(), &bytes)?;
            for child in &index.manifests {
                if let Some((_, child_bytes)) =
                    self.copy(client, &reference.pinned(&child.digest), progress)?
                {
                    self.add(child_bytes);
                }
            }
            return Ok(Some((oci::INDEX.into(), bytes)));
        }
        let manifest = Manifest::parse(&reference.to_string(), &bytes)?;
        for descriptor in std::iter::once(&manifest.config).chain(&manifest.layers) {
            if !self.blobs.contains_key(&descriptor.digest) {
                let blob = client.fetch_blob(reference, descriptor, progress)?;
                self.add(blob);
            }
        }
        Ok(Some((oci::MANIFEST.into(), bytes)))
    }

    /// Add `reference` (resolved to `digest`, manifest `bytes`) with its
    /// blobs and signatures, once its signatures satisfy `policy`: a bundle
    /// never carries what its own policy rejects.
    #[allow(clippy::too_many_arguments)]
    fn carry(
        &mut self,
        client: &Client,
        policy: &TrustPolicy,
        reference: &Reference,
        digest: &Digest,
        bytes: &[u8],
        kind: Option<&str>,
        progress: &dyn Progress,
    ) -> Result<(), Error> {
        let candidates = signature::find(
            client,
            reference,
            &reference.repository_name(),
            digest,
            bytes,
        )?;
        let rule = crate::verify::rule_for(policy, reference)?;
        policy::evaluate(&rule, &candidates).map_err(|reason| Error::Verification {
            reference: reference.pinned(digest).to_string(),
            reason,
        })?;
        let pinned = reference.pinned(digest);
        if let Some((media_type, bytes)) = self.copy(client, &pinned, progress)? {
            self.entry(
                &media_type,
                bytes,
                &reference.to_string(),
                &format!(
                    "{}:{}",
                    reference.repository_name(),
                    reference.tag.as_deref().unwrap_or_default()
                ),
                kind,
            );
        }
        for tag in [digest.signature_tag(), digest.referrers_tag()] {
            let tagged = reference.with_tag(&tag);
            if let Some((media_type, bytes)) = self.copy(client, &tagged, &NoProgress)? {
                self.entry(
                    &media_type,
                    bytes,
                    &tagged.to_string(),
                    &format!("{}:{tag}", reference.repository_name()),
                    None,
                );
            }
        }
        Ok(())
    }

    /// Read an archive written by [`create`] (or any OCI image layout tar).
    pub fn read(path: &Path) -> Result<Layout, Error> {
        let file = std::fs::File::open(path).map_err(Error::io(path))?;
        let what = path.display().to_string();
        let mut archive = tar::Archive::new(file);
        let mut layout = Layout::default();
        let mut index = None;
        for entry in archive.entries().map_err(Error::io(path))? {
            let mut entry = entry.map_err(Error::io(path))?;
            let name = entry
                .path()
                .map_err(Error::io(path))?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_string();
            let kind = entry.header().entry_type();
            if kind.is_dir() {
                continue;
            }
            if !kind.is_file() {
                return Err(Error::malformed(
                    &what,
                    format!("member {name:?} is not a regular file (links are not accepted)"),
                ));
            }
            if entry.size() > MAX_MEMBER_BYTES {
                return Err(Error::TooLarge {
                    what: format!("{what}: member {name}"),
                    size: entry.size(),
                    limit: MAX_MEMBER_BYTES,
                });
            }
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry
                .by_ref()
                .take(MAX_MEMBER_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(Error::io(path))?;
            match name.as_str() {
                "oci-layout" => {
                    let v: serde_json::Value = serde_json::from_slice(&bytes)
                        .map_err(|e| Error::malformed(format!("{what}: oci-layout"), e))?;
                    if v["imageLayoutVersion"] != "1.0.0" {
                        return Err(Error::malformed(
                            format!("{what}: oci-layout"),
                            "imageLayoutVersion is not 1.0.0",
                        ));
                    }
                }
                "index.json" => index = Some(Index::parse(&format!("{what}: index.json"), &bytes)?),
                _ => {
                    let digest = name
                        .strip_prefix("blobs/sha256/")
                        .and_then(|hex| format!("sha256:{hex}").parse::<Digest>().ok())
                        .ok_or_else(|| Error::malformed(&what, format!("unexpected member {name:?} (an OCI layout holds only oci-layout, index.json and blobs/sha256/<hex>)")))?;
                    digest.check(&format!("{what}: {name}"), &bytes)?;
                    layout.blobs.insert(digest, bytes);
                }
            }
        }
        layout.index = index.ok_or_else(|| {
            Error::malformed(
                &what,
                "no index.json (is this an OCI image layout archive?)",
            )
        })?;
        for entry in &layout.index.manifests {
            if !layout.blobs.contains_key(&entry.digest) {
                return Err(Error::malformed(
                    &what,
                    format!(
                        "index.json names {} but the archive lacks that blob",
                        entry.digest
                    ),
                ));
            }
        }
        Ok(layout)
    }

    /// Write the archive (deterministic: sorted blobs, zero timestamps).
    pub fn write(&self, path: &Path, progress: &dyn Progress) -> Result<(), Error> {
        let temp = path.with_extension("partial");
        let file = std::fs::File::create(&temp).map_err(Error::io(&temp))?;
        let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
        let total: u64 = self.blobs.values().map(|b| b.len() as u64).sum();
        progress.begin("writing bundle", total);
        let mut append = |name: &str, bytes: &[u8]| -> Result<(), Error> {
            let mut header = tar::Header::new_ustar();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, name, bytes)
                .map_err(Error::io(&temp))
        };
        append("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        append("index.json", &self.index.to_bytes())?;
        for (digest, bytes) in &self.blobs {
            append(&format!("blobs/sha256/{}", digest.hex()), bytes)?;
            progress.advance(bytes.len() as u64);
        }
        builder
            .into_inner()
            .and_then(|mut w| std::io::Write::flush(&mut w))
            .map_err(Error::io(&temp))?;
        progress.finish();
        std::fs::rename(&temp, path).map_err(Error::io(path))
    }

    /// The trust policy carried in the bundle.
    pub fn policy(&self) -> Result<TrustPolicy, Error> {
        let entry = self
            .index
            .manifests
            .iter()
            .find(|d| {
                d.annotations
                    .get(oci::ANNOTATION_REF_NAME)
                    .map(String::as_str)
                    == Some(POLICY_REF_NAME)
            })
            .ok_or_else(|| Error::malformed("bundle", "it carries no trust policy"))?;
        let manifest = Manifest::parse("bundle trust policy", &self.blobs[&entry.digest])?;
        let layer = manifest
            .layers
            .iter()
            .find(|l| l.media_type == oci::TRUST_POLICY)
            .and_then(|l| self.blobs.get(&l.digest))
            .ok_or_else(|| Error::malformed("bundle trust policy", "its layer is missing"))?;
        TrustPolicy::parse("bundle trust policy", &String::from_utf8_lossy(layer), None)
    }

    /// The plugin entries: `(source, manifest descriptor)`.
    fn plugins(&self) -> impl Iterator<Item = (&str, &Descriptor)> {
        self.index.manifests.iter().filter_map(|d| {
            let source = d.annotations.get(ANNOTATION_SOURCE)?;
            let manifest = Manifest::parse("", self.blobs.get(&d.digest)?).ok()?;
            (manifest.config.media_type == oci::WASM_CONFIG).then_some((source.as_str(), d))
        })
    }

    /// The container image entries: `(source, manifest descriptor)`.
    fn images(&self) -> impl Iterator<Item = (&str, &Descriptor)> {
        self.index.manifests.iter().filter_map(|d| {
            let source = d.annotations.get(ANNOTATION_SOURCE)?;
            (d.annotations.get(ANNOTATION_KIND).map(String::as_str) == Some(KIND_IMAGE))
                .then_some((source.as_str(), d))
        })
    }

    /// The keys whose signatures on `digest` (the manifest of `source`)
    /// satisfy both the host's `policy` and the bundle's own `bundled` one.
    fn signers(
        &self,
        source: &Reference,
        digest: &Digest,
        policy: &TrustPolicy,
        bundled: &TrustPolicy,
    ) -> Result<Vec<Signer>, Error> {
        let manifest = self
            .blobs
            .get(digest)
            .ok_or_else(|| Error::malformed("bundle", format!("manifest {digest} is missing")))?;
        let candidates =
            signature::find(self, source, &source.repository_name(), digest, manifest)?;
        let mut signers: Vec<Signer> = Vec::new();
        for (whose, policy) in [("the host's", policy), ("the bundle's own", bundled)] {
            let rule = crate::verify::rule_for(policy, source).map_err(|e| match e {
                Error::Verification { reference, reason } => Error::Verification {
                    reference,
                    reason: format!("{whose} trust policy: {reason}"),
                },
                other => other,
            })?;
            let found =
                policy::evaluate(&rule, &candidates).map_err(|reason| Error::Verification {
                    reference: source.pinned(digest).to_string(),
                    reason: format!("{whose} trust policy: {reason}"),
                })?;
            for s in found {
                if !signers.contains(&s) {
                    signers.push(s);
                }
            }
        }
        Ok(signers)
    }

    /// Every blob an image manifest (or each manifest of an index) names
    /// must be in the bundle, or a push would leave a broken image behind.
    fn check_image_blobs(
        &self,
        what: &str,
        digest: &Digest,
        media_type: &str,
    ) -> Result<(), Error> {
        let bytes = self.blobs.get(digest).ok_or_else(|| {
            Error::malformed(what, format!("manifest {digest} is not in the bundle"))
        })?;
        if media_type == oci::INDEX {
            let index = Index::parse(what, bytes)?;
            for child in &index.manifests {
                self.check_image_blobs(what, &child.digest, &child.media_type)?;
            }
            return Ok(());
        }
        let manifest = Manifest::parse(what, bytes)?;
        for descriptor in std::iter::once(&manifest.config).chain(&manifest.layers) {
            if !self.blobs.contains_key(&descriptor.digest) {
                return Err(Error::malformed(
                    what,
                    format!("blob {} is not in the bundle", descriptor.digest),
                ));
            }
        }
        Ok(())
    }

    /// Verify every plugin and image offline under the host's `policy` and
    /// the policy the bundle carries: both must be satisfied, so the
    /// bundle's own policy can only narrow the host's (a bundle cannot vouch
    /// for itself). Signatures first, then a plugin's config and component
    /// against the verified manifest, and an image's blobs (their digests
    /// were checked when the archive was read).
    pub fn verify(&self, policy: &TrustPolicy) -> Result<Verified, Error> {
        let bundled = self.policy()?;
        bundled_roots_only_narrow(policy, &bundled)?;
        let mut verified = Verified::default();
        for (source, descriptor) in self.plugins() {
            let reference = Reference::parse(source)?;
            let bytes = self.blobs[&descriptor.digest].clone();
            let described = artifact::parse(
                reference.pinned(&descriptor.digest),
                descriptor.digest.clone(),
                bytes,
            )?;
            let signers = self.signers(&reference, &described.digest, policy, &bundled)?;
            let config = self.blob(&reference, &described.manifest.config)?;
            let component = self.blob(&reference, &described.manifest.layers[0])?;
            artifact::check_component(&described, &config, &component)?;
            verified.plugins.push(PluginReport {
                source: source.to_string(),
                digest: described.digest.clone(),
                name: described.plugin.name.clone(),
                version: described.plugin.version.clone(),
                signers,
            });
        }
        for (source, descriptor) in self.images() {
            let reference = Reference::parse(source)?;
            let signers = self.signers(&reference, &descriptor.digest, policy, &bundled)?;
            self.check_image_blobs(
                &format!("image {source}"),
                &descriptor.digest,
                &descriptor.media_type,
            )?;
            verified.images.push(ImageReport {
                source: source.to_string(),
                digest: descriptor.digest.clone(),
                signers,
            });
        }
        if verified.plugins.is_empty() && verified.images.is_empty() {
            return Err(Error::malformed(
                "bundle",
                "it holds no plugins and no images",
            ));
        }
        self.check_accounted_for(&verified)?;
        Ok(verified)
    }

    /// Every `index.json` entry must be the trust policy, a verified plugin
    /// or image, or a signature of one: `push` mirrors every entry, so an
    /// entry nothing verified (an image whose mark was taken off, say)
    /// must stop the bundle rather than reach the mirror.
    fn check_accounted_for(&self, verified: &Verified) -> Result<(), Error> {
        let mut known: Vec<String> = Vec::new();
        for (source, digest) in verified
            .plugins
            .iter()
            .map(|p| (&p.source, &p.digest))
            .chain(verified.images.iter().map(|i| (&i.source, &i.digest)))
        {
            let reference = Reference::parse(source)?;
            known.push(source.clone());
            for tag in [digest.signature_tag(), digest.referrers_tag()] {
                known.push(reference.with_tag(&tag).to_string());
            }
        }
        for entry in &self.index.manifests {
            let is_policy = entry
                .annotations
                .get(oci::ANNOTATION_REF_NAME)
                .map(String::as_str)
                == Some(POLICY_REF_NAME)
                && !entry.annotations.contains_key(ANNOTATION_SOURCE);
            let accounted = is_policy
                || entry
                    .annotations
                    .get(ANNOTATION_SOURCE)
                    .is_some_and(|s| known.contains(s));
            if !accounted {
                let name = entry
                    .annotations
                    .get(ANNOTATION_SOURCE)
                    .or_else(|| entry.annotations.get(oci::ANNOTATION_REF_NAME))
                    .cloned()
                    .unwrap_or_else(|| entry.digest.to_string());
                return Err(Error::malformed(
                    "bundle",
                    format!(
                        "entry {name} is neither a verified plugin or image, a signature of one, nor the trust policy; refusing the bundle"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Push every plugin and its signatures to `destination` (`REGISTRY/PREFIX`):
    /// `oci://A/capstan/sim:v1` goes to `oci://REGISTRY/PREFIX/capstan/sim:v1`,
    /// byte for byte.
    pub fn push(
        &self,
        client: &Client,
        destination: &str,
        progress: &dyn Progress,
    ) -> Result<Vec<Pushed>, Error> {
        let destination = destination
            .trim_start_matches("oci://")
            .trim_end_matches('/');
        let mut pushed = Vec::new();
        for entry in &self.index.manifests {
            let Some(source) = entry.annotations.get(ANNOTATION_SOURCE) else {
                continue;
            };
            let reference = Reference::parse(source)?;
            let target =
                Reference::parse(&format!("oci://{destination}/{}", reference.repository))?;
            let target = match &reference.tag {
                Some(tag) => target.with_tag(tag),
                None => target.pinned(&entry.digest),
            };
            self.push_entry(
                client,
                &target,
                &entry.digest,
                &entry.media_type,
                reference.tag.as_deref(),
                progress,
            )?;
            pushed.push(Pushed {
                source: source.clone(),
                destination: target.to_string(),
                digest: entry.digest.clone(),
            });
        }
        Ok(pushed)
    }

    fn push_entry(
        &self,
        client: &Client,
        target: &Reference,
        digest: &Digest,
        media_type: &str,
        tag: Option<&str>,
        progress: &dyn Progress,
    ) -> Result<(), Error> {
        let bytes = &self.blobs[digest];
        if media_type == oci::INDEX {
            let index = Index::parse("bundle index entry", bytes)?;
            for child in &index.manifests {
                self.push_entry(
                    client,
                    target,
                    &child.digest,
                    &child.media_type,
                    None,
                    progress,
                )?;
            }
        } else {
            let manifest = Manifest::parse("bundle manifest", bytes)?;
            for descriptor in std::iter::once(&manifest.config).chain(&manifest.layers) {
                let blob = self.blobs.get(&descriptor.digest).ok_or_else(|| {
                    Error::malformed("bundle", format!("blob {} is missing", descriptor.digest))
                })?;
                client.push_blob(target, blob, progress)?;
            }
        }
        let pushed = client.push_manifest(target, tag, media_type, bytes)?;
        debug_assert_eq!(&pushed, digest);
        Ok(())
    }
}

impl Fetch for Layout {
    fn manifest(&self, reference: &Reference) -> Result<Option<Vec<u8>>, Error> {
        if let Some(digest) = &reference.digest {
            return Ok(self.blobs.get(digest).cloned());
        }
        let wanted = reference.to_string();
        Ok(self
            .index
            .manifests
            .iter()
            .find(|d| d.annotations.get(ANNOTATION_SOURCE) == Some(&wanted))
            .and_then(|d| self.blobs.get(&d.digest).cloned()))
    }

    fn blob(&self, reference: &Reference, descriptor: &Descriptor) -> Result<Vec<u8>, Error> {
        self.blobs
            .get(&descriptor.digest)
            .cloned()
            .ok_or_else(|| Error::NotFound {
                repository: reference.repository_name(),
                what: format!("blob {} (not in the bundle)", descriptor.digest),
            })
    }
}

/// Build a bundle from `bundle.yaml`: every plugin must verify under the
/// policy first, so a bundle never carries what its own policy rejects.
pub fn create(
    client: &Client,
    spec_path: &Path,
    progress: &dyn Progress,
) -> Result<(Layout, Verified), Error> {
    let text = std::fs::read_to_string(spec_path).map_err(Error::io(spec_path))?;
    let what = spec_path.display().to_string();
    let spec: BundleSpec = serde_yaml::from_str(&text).map_err(|e| Error::config(&what, e))?;
    if spec.api_version != "capstan.dev/v1alpha1" || spec.kind != "Bundle" {
        return Err(Error::config(
            &what,
            "expected apiVersion: capstan.dev/v1alpha1 and kind: Bundle",
        ));
    }
    if spec.plugins.is_empty() && spec.images.is_empty() {
        return Err(Error::config(
            format!("{what}: plugins"),
            "lists no plugins and no images",
        ));
    }
    let base = spec_path.parent().unwrap_or(Path::new("."));
    let policy = TrustPolicy::load(&base.join(&spec.policy))?;
    let mut layout = Layout {
        index: Index::default(),
        ..Layout::default()
    };
    let tagged = |field: &str, i: usize, text: &str| -> Result<Reference, Error> {
        let reference = Reference::parse(text)
            .map_err(|e| Error::config(format!("{what}: {field}[{i}]"), e))?;
        if reference.tag.is_none() {
            return Err(Error::config(
                format!("{what}: {field}[{i}]"),
                "needs a tag, so the mirror can serve it under the same name",
            ));
        }
        Ok(reference)
    };
    for (i, text) in spec.plugins.iter().enumerate() {
        let reference = tagged("plugins", i, text)?;
        // A plugin is checked to be one before anything is copied.
        let described = artifact::describe(client, &reference)?;
        layout.carry(
            client,
            &policy,
            &reference,
            &described.digest,
            &described.manifest_bytes,
            None,
            progress,
        )?;
    }
    for (i, text) in spec.images.iter().enumerate() {
        let reference = tagged("images", i, text)?;
        let (digest, _, bytes) = client.fetch_manifest(&reference)?;
        layout.carry(
            client,
            &policy,
            &reference,
            &digest,
            &bytes,
            Some(KIND_IMAGE),
            progress,
        )?;
    }
    let policy_yaml = policy.to_yaml().into_bytes();
    let empty = layout.add(b"{}".to_vec());
    let layer = Descriptor::of(oci::TRUST_POLICY, &policy_yaml);
    layout.add(policy_yaml);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(oci::MANIFEST.into()),
        artifact_type: Some(oci::TRUST_POLICY.into()),
        config: Descriptor {
            media_type: oci::EMPTY.into(),
            digest: empty,
            size: 2,
            artifact_type: None,
            annotations: BTreeMap::new(),
        },
        layers: vec![layer],
        subject: None,
        annotations: BTreeMap::new(),
    };
    let mut descriptor = Descriptor::of(oci::MANIFEST, &manifest.to_bytes());
    descriptor
        .annotations
        .insert(oci::ANNOTATION_REF_NAME.into(), POLICY_REF_NAME.into());
    layout.add(manifest.to_bytes());
    layout.index.manifests.push(descriptor);
    let reports = layout.verify(&policy)?;
    Ok((layout, reports))
}

/// A bundle's own policy may name keyless identities, with the trusted
/// roots it was made under. Both policies must hold anyway, but a bundled
/// root is checked up front so the refusal says what is wrong: the site
/// must have its own trusted root, and every authority and log a bundled
/// root names must be one a root of the site already trusts (a bundle can
/// narrow the site's trust, never add to it).
fn bundled_roots_only_narrow(site: &TrustPolicy, bundled: &TrustPolicy) -> Result<(), Error> {
    let ours = site.trusted_roots();
    for theirs in bundled.trusted_roots() {
        if ours.is_empty() {
            return Err(Error::config(
                "the bundle's trust policy",
                "names keyless identities, but the site's policy has no trusted root; add an identities entry with trustedRoot: FILE (your own copy of Sigstore's trusted_root.json) to your policy",
            ));
        }
        if ours.iter().any(|root| root.only_narrows(theirs).is_ok()) {
            continue;
        }
        let refusal = ours[0].only_narrows(theirs).unwrap_err();
        return Err(Error::config(
            "the bundle's trust policy",
            format!("its trusted root is not within the site's: {refusal}"),
        ));
    }
    Ok(())
}
