//! Signatures stored the way cosign stores them, and Sigstore bundles.
//!
//! - **cosign `.sig`**: an OCI manifest tagged `sha256-<digest>.sig` in the
//!   artifact's repository; each layer is a simple-signing payload naming the
//!   repository and manifest digest, with the base64 ECDSA signature in the
//!   `dev.cosignproject.cosign/signature` annotation. [`sign`] *appends* a
//!   layer, so several signers coexist.
//! - **Sigstore bundles** (v0.3): a DSSE envelope over an in-toto statement
//!   whose subject is the manifest digest (what `cosign sign
//!   --new-bundle-format` and sigstore-js produce), or a message signature
//!   over the manifest bytes. Read from OCI referrers (the referrers tag
//!   schema `sha256-<digest>`, since registry 2.8 has no referrers API) or
//!   from a file; [`attach_bundle`] writes one.
//!
//! Everything here only *finds* signatures and says what each one claims;
//! [`crate::policy`] decides which keys must have signed.

use crate::client::NoProgress;
use crate::keyless::Keyless;
use crate::keys::{PrivateKey, PublicKey};
use crate::oci::{self, Descriptor, Index, Manifest};
use crate::{Client, Digest, Error, Reference};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The simple-signing `type` cosign writes.
const COSIGN_TYPE: &str = "cosign container image signature";
/// The in-toto predicate type cosign uses for plain image signatures.
pub const COSIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
const IN_TOTO: &str = "application/vnd.in-toto+json";
pub(crate) const MAX_SIGNATURE_BLOB: u64 = 1024 * 1024;

/// One signature found for an artifact, before any key is tried.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Where it came from, for messages: `cosign signature 2 (sha256:…)`.
    pub origin: String,
    /// The bytes the signature is over.
    pub message: Vec<u8>,
    /// The raw signature.
    pub signature: Vec<u8>,
    /// `Err(reason)` when the signed payload does not name this artifact
    /// (another digest, another repository): such a signature never counts.
    pub claim: Result<(), String>,
    /// A keyless signature's bundle (certificate, log entry, timestamps),
    /// for [`crate::keyless::IdentityRule::check`].
    pub keyless: Option<Keyless>,
}

impl Candidate {
    /// Whether `key` made this signature and it is about this artifact.
    pub fn verified_by(&self, key: &PublicKey) -> bool {
        self.claim.is_ok() && key.verifies(&self.message, &self.signature)
    }
}

/// The cosign simple-signing payload for `repository` (`REGISTRY/REPO`) at `digest`.
pub fn simple_signing_payload(repository: &str, digest: &Digest) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest.as_str()},
            "type": COSIGN_TYPE,
        },
        "optional": null,
    }))
    .expect("the payload always serializes")
}

/// Strip a `:tag` or `@digest` from a docker reference.
fn repository_of(reference: &str) -> &str {
    let reference = reference.split('@').next().unwrap_or(reference);
    let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[last_slash..].find(':') {
        Some(i) => &reference[..last_slash + i],
        None => reference,
    }
}

/// What a simple-signing payload claims, checked against what we expect.
pub fn check_simple_signing(
    payload: &[u8],
    repository: &str,
    digest: &Digest,
) -> Result<(), String> {
    let v: Value =
        serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
    let critical = &v["critical"];
    if critical["type"] != COSIGN_TYPE {
        return Err(format!(
            "the payload type is {} (expected {COSIGN_TYPE:?})",
            critical["type"]
        ));
    }
    let signed = critical["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap_or("");
    if signed != digest.as_str() {
        return Err(format!("the payload signs digest {signed}, not {digest}"));
    }
    let named = critical["identity"]["docker-reference"]
        .as_str()
        .unwrap_or("");
    if repository_of(named) != repository {
        return Err(format!(
            "the payload names repository {named:?}, not {repository:?}"
        ));
    }
    Ok(())
}

/// DSSE pre-authentication encoding: what a DSSE signature is over.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Read a Sigstore bundle (JSON) as candidates for `repository` at `digest`;
/// `manifest` is the artifact's manifest bytes (what a message signature
/// covers).
pub fn bundle_candidates(
    origin: &str,
    bundle: &[u8],
    repository: &str,
    digest: &Digest,
    manifest: &[u8],
) -> Result<Vec<Candidate>, Error> {
    candidates_from_bundle(origin, bundle, Some(repository), digest, manifest)
}

/// Read a Sigstore bundle made for a file (`capstan plugin sign FILE`, or
/// `cosign sign-blob --bundle`): the statement's subject, or the message
/// signature, must be the file's digest; its name is not checked (a file
/// has no repository, and the policy scope is its directory).
pub fn file_bundle_candidates(
    origin: &str,
    bundle: &[u8],
    digest: &Digest,
    bytes: &[u8],
) -> Result<Vec<Candidate>, Error> {
    candidates_from_bundle(origin, bundle, None, digest, bytes)
}

fn candidates_from_bundle(
    origin: &str,
    bundle: &[u8],
    repository: Option<&str>,
    digest: &Digest,
    manifest: &[u8],
) -> Result<Vec<Candidate>, Error> {
    let what = origin.to_string();
    let v: Value = serde_json::from_slice(bundle)
        .map_err(|e| Error::malformed(&what, format!("not JSON: {e}")))?;
    let media_type = v["mediaType"].as_str().unwrap_or("");
    if !media_type.starts_with("application/vnd.dev.sigstore.bundle") {
        return Err(Error::malformed(
            &what,
            format!("mediaType {media_type:?} is not a Sigstore bundle"),
        ));
    }
    let keyless = Keyless::from_bundle(&v, bundle, manifest)
        .map_err(|reason| Error::malformed(&what, reason))?;
    let b64 = |field: &Value, name: &str| -> Result<Vec<u8>, Error> {
        STANDARD
            .decode(field.as_str().unwrap_or(""))
            .map_err(|_| Error::malformed(&what, format!("{name} is not base64")))
    };
    if let Some(envelope) = v.get("dsseEnvelope") {
        let payload_type = envelope["payloadType"].as_str().unwrap_or("");
        let payload = b64(&envelope["payload"], "dsseEnvelope.payload")?;
        let claim = if payload_type != IN_TOTO {
            Err(format!(
                "the DSSE payload type is {payload_type:?}, not {IN_TOTO}"
            ))
        } else {
            check_statement(&payload, repository, digest)
        };
        let message = pae(payload_type, &payload);
        let signatures = envelope["signatures"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if signatures.is_empty() {
            return Err(Error::malformed(
                &what,
                "the DSSE envelope has no signatures",
            ));
        }
        if keyless.is_some() && signatures.len() != 1 {
            return Err(Error::malformed(
                &what,
                "a keyless bundle's DSSE envelope must hold exactly one signature (its certificate's)",
            ));
        }
        return signatures
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Ok(Candidate {
                    origin: if signatures.len() == 1 {
                        what.clone()
                    } else {
                        format!("{what} signature {}", i + 1)
                    },
                    message: message.clone(),
                    signature: b64(&s["sig"], "dsseEnvelope.signatures[].sig")?,
                    claim: claim.clone(),
                    keyless: keyless.clone(),
                })
            })
            .collect();
    }
    if let Some(ms) = v.get("messageSignature") {
        let algorithm = ms["messageDigest"]["algorithm"].as_str().unwrap_or("");
        let signed = b64(
            &ms["messageDigest"]["digest"],
            "messageSignature.messageDigest.digest",
        )?;
        let claim = if algorithm != "SHA2_256" {
            Err(format!(
                "message digest algorithm {algorithm:?} (expected SHA2_256)"
            ))
        } else if hex::encode(&signed) != digest.hex() {
            Err(format!(
                "the bundle signs sha256:{}, not {digest}",
                hex::encode(&signed)
            ))
        } else {
            Ok(())
        };
        return Ok(vec![Candidate {
            origin: what.clone(),
            message: manifest.to_vec(),
            signature: b64(&ms["signature"], "messageSignature.signature")?,
            claim,
            keyless,
        }]);
    }
    Err(Error::malformed(
        &what,
        "neither dsseEnvelope nor messageSignature",
    ))
}

fn check_statement(
    payload: &[u8],
    repository: Option<&str>,
    digest: &Digest,
) -> Result<(), String> {
    let statement: Value = serde_json::from_slice(payload)
        .map_err(|e| format!("the in-toto statement is not JSON: {e}"))?;
    if !statement["_type"]
        .as_str()
        .unwrap_or("")
        .starts_with("https://in-toto.io/Statement/")
    {
        return Err("the DSSE payload is not an in-toto statement".into());
    }
    // An attestation (SLSA provenance, SBOM, vulnerability scan …) says
    // something *about* an artifact; only the signing predicate says its
    // publisher released it.
    let predicate = statement["predicateType"].as_str().unwrap_or("");
    if predicate != COSIGN_PREDICATE {
        return Err(format!(
            "an attestation with predicate type {predicate:?}, not a signature ({COSIGN_PREDICATE})"
        ));
    }
    let subjects = statement["subject"].as_array().cloned().unwrap_or_default();
    let matching = subjects
        .iter()
        .find(|s| s["digest"]["sha256"].as_str() == Some(digest.hex()));
    let Some(subject) = matching else {
        let named: Vec<String> = subjects
            .iter()
            .filter_map(|s| {
                s["digest"]["sha256"]
                    .as_str()
                    .map(|h| format!("sha256:{h}"))
            })
            .collect();
        return Err(format!(
            "the statement's subjects {named:?} do not include {digest}"
        ));
    };
    let name = subject["name"].as_str().unwrap_or("");
    if let Some(repository) = repository
        && !name.is_empty()
        && repository_of(name) != repository
    {
        return Err(format!(
            "the statement names repository {name:?}, not {repository:?}"
        ));
    }
    Ok(())
}

/// Where signatures are read from: a registry ([`Client`]) or an air-gap
/// bundle ([`crate::layout::Layout`]).
pub trait Fetch {
    /// The manifest or index `reference` names (tag or digest), digest-checked;
    /// `None` when there is none.
    fn manifest(&self, reference: &Reference) -> Result<Option<Vec<u8>>, Error>;
    /// A blob, size- and digest-checked.
    fn blob(&self, reference: &Reference, descriptor: &Descriptor) -> Result<Vec<u8>, Error>;
}

impl Fetch for Client {
    fn manifest(&self, reference: &Reference) -> Result<Option<Vec<u8>>, Error> {
        Ok(self
            .fetch_manifest_opt(reference)?
            .map(|(_, _, bytes)| bytes))
    }
    fn blob(&self, reference: &Reference, descriptor: &Descriptor) -> Result<Vec<u8>, Error> {
        self.fetch_blob(reference, descriptor, &NoProgress)
    }
}

/// Every signature stored in `location`'s repository for `digest`: cosign
/// `.sig` layers and Sigstore bundles among the referrers. `repository` is the
/// name the signatures must carry (the logical source, which differs from
/// `location` behind a mirror).
pub fn find(
    client: &dyn Fetch,
    location: &Reference,
    repository: &str,
    digest: &Digest,
    manifest: &[u8],
) -> Result<Vec<Candidate>, Error> {
    let mut found = Vec::new();
    if let Some(bytes) = client.manifest(&location.with_tag(&digest.signature_tag()))? {
        let sig = Manifest::parse(
            &format!("{} signature manifest", digest.signature_tag()),
            &bytes,
        )?;
        for (i, layer) in sig.layers.iter().enumerate() {
            let origin = format!(
                "cosign signature {} ({})",
                i + 1,
                crate::client::short(&layer.digest)
            );
            if layer.media_type != oci::SIMPLE_SIGNING {
                continue;
            }
            let Some(signature) = layer.annotations.get(oci::ANNOTATION_COSIGN_SIGNATURE) else {
                continue;
            };
            let signature = STANDARD
                .decode(signature)
                .map_err(|_| Error::malformed(&origin, "the signature annotation is not base64"))?;
            if layer.size > MAX_SIGNATURE_BLOB {
                return Err(Error::TooLarge {
                    what: origin,
                    size: layer.size,
                    limit: MAX_SIGNATURE_BLOB,
                });
            }
            let payload = client.blob(location, layer)?;
            found.push(Candidate {
                claim: check_simple_signing(&payload, repository, digest),
                origin,
                message: payload,
                signature,
                keyless: None,
            });
        }
    }
    for (bundle_digest, bundle) in referrer_bundles(client, location, digest)? {
        let origin = format!("sigstore bundle ({})", crate::client::short(&bundle_digest));
        found.extend(bundle_candidates(
            &origin, &bundle, repository, digest, manifest,
        )?);
    }
    Ok(found)
}

/// The Sigstore bundles among `digest`'s referrers (tag schema).
fn referrer_bundles(
    client: &dyn Fetch,
    location: &Reference,
    digest: &Digest,
) -> Result<Vec<(Digest, Vec<u8>)>, Error> {
    let Some(bytes) = client.manifest(&location.with_tag(&digest.referrers_tag()))? else {
        return Ok(Vec::new());
    };
    let index = Index::parse(&format!("referrers of {digest}"), &bytes)?;
    let mut out = Vec::new();
    for entry in index
        .manifests
        .iter()
        .filter(|d| d.artifact_type.as_deref() == Some(oci::SIGSTORE_BUNDLE))
    {
        let bytes = client
            .manifest(&location.pinned(&entry.digest))?
            .ok_or_else(|| Error::NotFound {
                repository: location.repository_name(),
                what: format!("bundle manifest {}", entry.digest),
            })?;
        let manifest = Manifest::parse(&format!("bundle manifest {}", entry.digest), &bytes)?;
        if manifest.subject.as_ref().map(|s| &s.digest) != Some(digest) {
            continue;
        }
        let Some(layer) = manifest
            .layers
            .iter()
            .find(|l| l.media_type == oci::SIGSTORE_BUNDLE)
        else {
            continue;
        };
        if layer.size > MAX_SIGNATURE_BLOB {
            return Err(Error::TooLarge {
                what: format!("sigstore bundle {}", layer.digest),
                size: layer.size,
                limit: MAX_SIGNATURE_BLOB,
            });
        }
        out.push((layer.digest.clone(), client.blob(location, layer)?));
    }
    Ok(out)
}

/// Append a cosign signature by `key` for `digest` to `location`'s `.sig`
/// tag. `repository` is the name the payload carries. Returns `false` when
/// this key had already signed (nothing is pushed: signing is idempotent).
pub fn sign(
    client: &Client,
    location: &Reference,
    repository: &str,
    digest: &Digest,
    key: &PrivateKey,
) -> Result<bool, Error> {
    let sig_ref = location.with_tag(&digest.signature_tag());
    let payload = simple_signing_payload(repository, digest);
    let mut layers = Vec::new();
    if let Some((_, _, bytes)) = client.fetch_manifest_opt(&sig_ref)? {
        let existing = Manifest::parse(
            &format!("{} signature manifest", digest.signature_tag()),
            &bytes,
        )?;
        let public = key.public();
        for layer in existing.layers {
            let already = layer.media_type == oci::SIMPLE_SIGNING
                && layer.digest == Digest::of(&payload)
                && layer
                    .annotations
                    .get(oci::ANNOTATION_COSIGN_SIGNATURE)
                    .and_then(|s| STANDARD.decode(s).ok())
                    .is_some_and(|s| public.verifies(&payload, &s));
            if already {
                return Ok(false);
            }
            layers.push(layer);
        }
    }
    let signature = key.sign(&payload);
    client.push_blob(location, &payload, &NoProgress)?;
    let mut layer = Descriptor::of(oci::SIMPLE_SIGNING, &payload);
    layer.annotations.insert(
        oci::ANNOTATION_COSIGN_SIGNATURE.to_string(),
        STANDARD.encode(&signature),
    );
    layers.push(layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.as_str()).collect::<Vec<_>>()},
        "config": {},
    }))
    .expect("the config always serializes");
    client.push_blob(location, &config, &NoProgress)?;
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(oci::MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::of(oci::IMAGE_CONFIG, &config),
        layers,
        subject: None,
        annotations: BTreeMap::new(),
    };
    client.push_manifest(
        &sig_ref,
        sig_ref.tag.as_deref(),
        oci::MANIFEST,
        &manifest.to_bytes(),
    )?;
    Ok(true)
}

/// A Sigstore bundle (v0.3, DSSE over an in-toto statement naming
/// `repository@digest`) signed with `key`.
pub fn make_bundle(repository: &str, digest: &Digest, key: &PrivateKey) -> Vec<u8> {
    make_statement_bundle(repository, digest, COSIGN_PREDICATE, key)
}

/// A Sigstore bundle over an in-toto statement with any predicate type (an
/// attestation, unless the type is [`COSIGN_PREDICATE`]).
pub fn make_statement_bundle(
    repository: &str,
    digest: &Digest,
    predicate_type: &str,
    key: &PrivateKey,
) -> Vec<u8> {
    let statement = serde_json::to_vec(&json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": repository, "digest": {"sha256": digest.hex()}}],
        "predicateType": predicate_type,
        "predicate": {},
    }))
    .expect("the statement always serializes");
    let signature = key.sign(&pae(IN_TOTO, &statement));
    serde_json::to_vec(&json!({
        "mediaType": oci::SIGSTORE_BUNDLE,
        "verificationMaterial": {
            "publicKey": {"hint": key.public().id()},
            "tlogEntries": [],
        },
        "dsseEnvelope": {
            "payload": STANDARD.encode(&statement),
            "payloadType": IN_TOTO,
            "signatures": [{"sig": STANDARD.encode(signature), "keyid": ""}],
        },
    }))
    .expect("the bundle always serializes")
}

/// Add `key`'s signature for a file to its Sigstore bundle: a new bundle
/// when `existing` is `None` or was made for other bytes, else the same
/// statement with one more DSSE signature (several signers share one
/// file). Returns the bundle and whether anything was added.
pub fn sign_file_bundle(
    name: &str,
    bytes: &[u8],
    existing: Option<&[u8]>,
    key: &PrivateKey,
) -> (Vec<u8>, bool) {
    let digest = Digest::of(bytes);
    let fresh = || (make_bundle(name, &digest, key), true);
    let Some(existing) = existing else {
        return fresh();
    };
    let Ok(mut bundle) = serde_json::from_slice::<Value>(existing) else {
        return fresh();
    };
    let Ok(found) = file_bundle_candidates("existing", existing, &digest, bytes) else {
        return fresh();
    };
    if found.iter().any(|c| c.claim.is_err()) {
        return fresh();
    }
    if found.iter().any(|c| c.verified_by(&key.public())) {
        return (existing.to_vec(), false);
    }
    let Some(envelope) = bundle.get_mut("dsseEnvelope") else {
        return fresh();
    };
    let payload = STANDARD
        .decode(envelope["payload"].as_str().unwrap_or(""))
        .unwrap_or_default();
    let signature = key.sign(&pae(IN_TOTO, &payload));
    if let Some(list) = envelope["signatures"].as_array_mut() {
        list.push(json!({"sig": STANDARD.encode(signature), "keyid": ""}));
    }
    (
        serde_json::to_vec(&bundle).expect("the bundle always serializes"),
        true,
    )
}

/// Store `bundle` as a referrer of `subject` (the artifact's manifest) in
/// `location`'s repository, and list it in the referrers tag.
pub fn attach_bundle(
    client: &Client,
    location: &Reference,
    subject: &Descriptor,
    bundle: &[u8],
) -> Result<Digest, Error> {
    let empty = b"{}";
    client.push_blob(location, empty, &NoProgress)?;
    client.push_blob(location, bundle, &NoProgress)?;
    let annotations = BTreeMap::from([
        (
            "dev.sigstore.bundle.content".to_string(),
            "dsse-envelope".to_string(),
        ),
        (
            "dev.sigstore.bundle.predicateType".to_string(),
            COSIGN_PREDICATE.to_string(),
        ),
    ]);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(oci::MANIFEST.into()),
        artifact_type: Some(oci::SIGSTORE_BUNDLE.into()),
        config: Descriptor::of(oci::EMPTY, empty),
        layers: vec![Descriptor::of(oci::SIGSTORE_BUNDLE, bundle)],
        subject: Some(subject.clone()),
        annotations: annotations.clone(),
    };
    let bytes = manifest.to_bytes();
    let digest = client.push_manifest(location, None, oci::MANIFEST, &bytes)?;
    let tag_ref = location.with_tag(&subject.digest.referrers_tag());
    let mut index = match client.fetch_manifest_opt(&tag_ref)? {
        Some((_, _, bytes)) => Index::parse("referrers index", &bytes)?,
        None => Index::default(),
    };
    if !index.manifests.iter().any(|d| d.digest == digest) {
        let mut entry = Descriptor::of(oci::MANIFEST, &bytes);
        entry.artifact_type = Some(oci::SIGSTORE_BUNDLE.into());
        entry.annotations = annotations;
        index.manifests.push(entry);
        client.push_manifest(
            &tag_ref,
            tag_ref.tag.as_deref(),
            oci::INDEX,
            &index.to_bytes(),
        )?;
    }
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_claims_are_checked() {
        let d = Digest::of(b"m");
        let other = Digest::of(b"n");
        let p = simple_signing_payload("reg:5000/capstan/sim", &d);
        assert!(check_simple_signing(&p, "reg:5000/capstan/sim", &d).is_ok());
        let err = check_simple_signing(&p, "reg:5000/capstan/sim", &other).unwrap_err();
        assert!(err.contains("signs digest"), "{err}");
        let err = check_simple_signing(&p, "reg:5000/other/repo", &d).unwrap_err();
        assert!(
            err.contains("names repository \"reg:5000/capstan/sim\""),
            "{err}"
        );
        let tagged = simple_signing_payload("reg:5000/capstan/sim:v1", &d);
        assert!(check_simple_signing(&tagged, "reg:5000/capstan/sim", &d).is_ok());
    }

    #[test]
    fn bundles_round_trip_and_bind_to_the_digest() {
        let key = PrivateKey::generate();
        let d = Digest::of(b"manifest");
        let bundle = make_bundle("reg/capstan/sim", &d, &key);
        let found = bundle_candidates("b", &bundle, "reg/capstan/sim", &d, b"manifest").unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].verified_by(&key.public()));
        assert!(!found[0].verified_by(&PrivateKey::generate().public()));
        let elsewhere =
            bundle_candidates("b", &bundle, "reg/capstan/sim", &Digest::of(b"x"), b"x").unwrap();
        assert!(!elsewhere[0].verified_by(&key.public()));
        assert!(
            elsewhere[0]
                .claim
                .as_ref()
                .unwrap_err()
                .contains("do not include")
        );
        // An attestation by the right key, about the right digest, is still
        // not a signature.
        let provenance = make_statement_bundle(
            "reg/capstan/sim",
            &d,
            "https://slsa.dev/provenance/v1",
            &key,
        );
        let found =
            bundle_candidates("b", &provenance, "reg/capstan/sim", &d, b"manifest").unwrap();
        assert!(!found[0].verified_by(&key.public()));
        let reason = found[0].claim.as_ref().unwrap_err();
        assert!(reason.contains("an attestation"), "{reason}");
        let renamed = bundle_candidates("b", &bundle, "reg/evil/sim", &d, b"manifest").unwrap();
        assert!(
            renamed[0]
                .claim
                .as_ref()
                .unwrap_err()
                .contains("names repository")
        );
    }
}
