//! OCI image-spec documents (manifest, index, descriptor) and the media types
//! Capstan reads and writes.

use crate::{Digest, Error};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// OCI image manifest.
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image config (what cosign uses for `.sig` manifests).
pub const IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// The empty config blob `{}` of artifacts that need no config.
pub const EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// CNCF Wasm artifact config.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// CNCF Wasm artifact layer: the component itself.
pub const WASM_LAYER: &str = "application/wasm";
/// A cosign simple-signing payload layer.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// A Sigstore bundle (artifact type and layer media type).
pub const SIGSTORE_BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// Capstan's trust policy, as carried in air-gap bundles.
pub const TRUST_POLICY: &str = "application/vnd.capstan.trust-policy.v1+yaml";

/// Annotation holding the plugin manifest (JSON) on a plugin's OCI manifest,
/// so `inspect` can show it without downloading the component.
pub const ANNOTATION_PLUGIN_MANIFEST: &str = "dev.capstan.plugin.manifest";
/// Annotation cosign puts the base64 signature in, on each `.sig` layer.
pub const ANNOTATION_COSIGN_SIGNATURE: &str = "dev.cosignproject.cosign/signature";
/// Standard title annotation.
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
/// Standard version annotation.
pub const ANNOTATION_VERSION: &str = "org.opencontainers.image.version";
/// OCI image layout: the name of a manifest in `index.json`.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// Its digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// For index entries that point at artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    /// Describe `bytes` of `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        }
    }
}

/// An OCI image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MANIFEST`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The artifact type, for artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// The manifest this one refers to (signatures, bundles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// Always 2.
    pub schema_version: u32,
    /// [`INDEX`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            schema_version: 2,
            media_type: Some(INDEX.to_string()),
            manifests: Vec::new(),
            annotations: BTreeMap::new(),
        }
    }
}

impl Manifest {
    /// Parse manifest JSON.
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Manifest, Error> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::malformed(what, format!("not an OCI image manifest: {e}")))?;
        if m.schema_version != 2 {
            return Err(Error::malformed(
                what,
                format!("schemaVersion {} (expected 2)", m.schema_version),
            ));
        }
        Ok(m)
    }

    /// Canonical bytes to push (compact JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest always serializes")
    }
}

impl Index {
    /// Parse index JSON.
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Index, Error> {
        serde_json::from_slice(bytes)
            .map_err(|e| Error::malformed(what, format!("not an OCI image index: {e}")))
    }

    /// Canonical bytes to push (compact JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an index always serializes")
    }
}
