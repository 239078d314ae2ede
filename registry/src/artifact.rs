//! Plugins as OCI artifacts in the CNCF Wasm layout: one `application/wasm`
//! layer (the component), an `application/vnd.wasm.config.v0+json` config,
//! and Capstan's plugin manifest in the `dev.capstan.plugin.manifest`
//! annotation, so `inspect` needs one manifest request and no download.
//!
//! On pull, the annotation must equal the manifest embedded in the component
//! (its custom section): a registry cannot advertise one set of capabilities
//! and serve a component declaring another.

use crate::client::{NoProgress, Progress};
use crate::oci::{self, Descriptor, Manifest};
use crate::{Cache, Client, Digest, Error, Reference};
use capstan_manifest::PluginManifest;
use std::collections::BTreeMap;

/// A plugin's OCI manifest, resolved and checked, without the component.
#[derive(Debug, Clone)]
pub struct Described {
    /// The reference pinned to the manifest digest.
    pub reference: Reference,
    /// The manifest digest (what signatures cover).
    pub digest: Digest,
    /// The manifest bytes, exactly as served (and digest-checked).
    pub manifest_bytes: Vec<u8>,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// The plugin manifest from the annotation.
    pub plugin: PluginManifest,
}

/// The config document (CNCF Wasm artifact spec fields Capstan fills in).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig {
    architecture: String,
    os: String,
    layer_digests: Vec<Digest>,
}

/// The config blob and manifest for a component (pure; nothing is pushed).
pub fn build(component: &[u8]) -> Result<(Vec<u8>, Manifest, PluginManifest), Error> {
    let plugin =
        PluginManifest::from_component(component).map_err(|e| Error::malformed("component", e))?;
    let layer = Descriptor {
        annotations: BTreeMap::from([(
            oci::ANNOTATION_TITLE.to_string(),
            format!("{}.wasm", plugin.name),
        )]),
        ..Descriptor::of(oci::WASM_LAYER, component)
    };
    let config = serde_json::to_vec(&WasmConfig {
        architecture: "wasm".into(),
        os: "wasip2".into(),
        layer_digests: vec![layer.digest.clone()],
    })
    .expect("the config always serializes");
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(oci::MANIFEST.into()),
        artifact_type: Some(oci::WASM_CONFIG.into()),
        config: Descriptor::of(oci::WASM_CONFIG, &config),
        layers: vec![layer],
        subject: None,
        annotations: BTreeMap::from([
            (
                oci::ANNOTATION_PLUGIN_MANIFEST.to_string(),
                serde_json::to_string(&plugin).expect("a manifest always serializes"),
            ),
            (oci::ANNOTATION_TITLE.to_string(), plugin.name.clone()),
            (oci::ANNOTATION_VERSION.to_string(), plugin.version.clone()),
        ]),
    };
    Ok((config, manifest, plugin))
}

/// Push a component to `reference`'s tag; returns the manifest digest.
pub fn push(
    client: &Client,
    reference: &Reference,
    component: &[u8],
    progress: &dyn Progress,
) -> Result<(Digest, PluginManifest), Error> {
    let (config, manifest, plugin) = build(component)?;
    client.push_blob(reference, component, progress)?;
    client.push_blob(reference, &config, &NoProgress)?;
    let bytes = manifest.to_bytes();
    let tag = reference.tag.as_deref();
    let digest = client.push_manifest(reference, tag, oci::MANIFEST, &bytes)?;
    Ok((digest, plugin))
}

/// Resolve `reference` and check that it is a Capstan plugin; the component
/// is not downloaded.
pub fn describe(client: &Client, reference: &Reference) -> Result<Described, Error> {
    let (digest, _media_type, bytes) = client.fetch_manifest(reference)?;
    parse(reference.pinned(&digest), digest, bytes)
}

/// Check a manifest's shape and read its plugin manifest.
pub fn parse(reference: Reference, digest: Digest, bytes: Vec<u8>) -> Result<Described, Error> {
    let what = format!("manifest of {reference}");
    let manifest = Manifest::parse(&what, &bytes)?;
    if manifest.config.media_type != oci::WASM_CONFIG {
        return Err(Error::malformed(
            &what,
            format!(
                "config media type {:?} is not {} (is this a Capstan plugin?)",
                manifest.config.media_type,
                oci::WASM_CONFIG
            ),
        ));
    }
    if manifest.layers.len() != 1 || manifest.layers[0].media_type != oci::WASM_LAYER {
        return Err(Error::malformed(
            &what,
            format!("a plugin has exactly one {} layer", oci::WASM_LAYER),
        ));
    }
    let annotation = manifest
        .annotations
        .get(oci::ANNOTATION_PLUGIN_MANIFEST)
        .ok_or_else(|| {
            Error::malformed(
                &what,
                format!("no {} annotation", oci::ANNOTATION_PLUGIN_MANIFEST),
            )
        })?;
    let plugin = PluginManifest::from_json(annotation.as_bytes())
        .map_err(|e| Error::malformed(format!("{what}: plugin manifest annotation"), e))?;
    Ok(Described {
        reference,
        digest,
        manifest_bytes: bytes,
        manifest,
        plugin,
    })
}

/// Download (or take from the cache) the config and component of a
/// described plugin and check them against the manifest. Returns the
/// component and whether it came from the cache.
pub fn fetch_component(
    client: &Client,
    cache: Option<&Cache>,
    described: &Described,
    progress: &dyn Progress,
) -> Result<(Vec<u8>, bool), Error> {
    let fetch =
        |descriptor: &Descriptor, progress: &dyn Progress| -> Result<(Vec<u8>, bool), Error> {
            if let Some(cache) = cache
                && let Some(bytes) = cache.get(&descriptor.digest)?
                && bytes.len() as u64 == descriptor.size
            {
                return Ok((bytes, true));
            }
            let bytes = client.fetch_blob(&described.reference, descriptor, progress)?;
            if bytes.len() as u64 != descriptor.size {
                return Err(Error::Truncated {
                    what: format!("blob {}", descriptor.digest),
                    expected: descriptor.size,
                    got: bytes.len() as u64,
                });
            }
            if let Some(cache) = cache {
                cache.put(&descriptor.digest, &bytes)?;
            }
            Ok((bytes, false))
        };
    let (config, _) = fetch(&described.manifest.config, &NoProgress)?;
    let (component, cached) = fetch(&described.manifest.layers[0], progress)?;
    check_component(described, &config, &component)?;
    Ok((component, cached))
}

/// The config and component must agree with the manifest that was verified.
pub fn check_component(
    described: &Described,
    config: &[u8],
    component: &[u8],
) -> Result<(), Error> {
    let what = format!("plugin {}", described.reference);
    let config: WasmConfig = serde_json::from_slice(config)
        .map_err(|e| Error::malformed(format!("{what}: config"), e))?;
    if config.layer_digests != [described.manifest.layers[0].digest.clone()] {
        return Err(Error::malformed(
            format!("{what}: config"),
            "layerDigests does not list the manifest's layer",
        ));
    }
    let embedded = PluginManifest::from_component(component)
        .map_err(|e| Error::malformed(format!("{what}: component"), e))?;
    if embedded != described.plugin {
        return Err(Error::malformed(
            what,
            "the manifest annotation and the component's embedded plugin manifest differ",
        ));
    }
    Ok(())
}
