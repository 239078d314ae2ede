//! From a source reference to a verified manifest, in the only order that
//! is safe: resolve the manifest (by digest from then on) and check the
//! signatures over that digest against the policy. Only then may the caller
//! download the component ([`crate::artifact::fetch_component`]), whose
//! bytes must match the verified manifest; the controller checks grants in
//! between.
//!
//! [`Puller`] holds the client, the cache and the mirror rewrites. Results
//! of verification are cached by (digest, rule, repository), so a digest is
//! verified once, not on every load.

use crate::artifact::{self, Described};
use crate::policy::{self, Rule, Signer, TrustPolicy};
use crate::signature::{self, Candidate};
use crate::{Cache, Client, Digest, Error, Mirrors, Reference};
use sha2::{Digest as _, Sha256};

/// Fetches and verifies plugins.
#[derive(Debug)]
pub struct Puller {
    /// The registry client.
    pub client: Client,
    /// The blob and verification cache, if any.
    pub cache: Option<Cache>,
    /// Source → location rewrites.
    pub mirrors: Mirrors,
}

/// A plugin whose signatures satisfied the policy and whose bytes match.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The source as named (logical), pinned to the digest.
    pub source: Reference,
    /// Where the bytes came from (differs behind a mirror).
    pub location: Reference,
    /// The manifest digest.
    pub digest: Digest,
    /// The checked manifest.
    pub described: Described,
    /// The keys whose signatures counted.
    pub signers: Vec<Signer>,
    /// Whether the verification result came from the cache.
    pub cached: bool,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    digest: Digest,
    signers: Vec<Signer>,
}

impl Puller {
    /// Resolve `source` (through the mirrors) to its checked manifest. A
    /// digest-pinned source whose manifest is cached needs no network.
    pub fn describe(&self, source: &Reference) -> Result<Described, Error> {
        let location = self.mirrors.location(source)?;
        if let (Some(digest), Some(cache)) = (&source.digest, &self.cache)
            && let Some(bytes) = cache.get(digest)?
        {
            return artifact::parse(location.pinned(digest), digest.clone(), bytes);
        }
        let described = artifact::describe(&self.client, &location)?;
        if let Some(cache) = &self.cache {
            cache.put(&described.digest, &described.manifest_bytes)?;
        }
        Ok(described)
    }

    /// Every signature stored for the described artifact, plus `extra`
    /// Sigstore bundles (`(origin, json)`, for example from files).
    pub fn signatures(
        &self,
        source: &Reference,
        described: &Described,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Vec<Candidate>, Error> {
        let repository = source.repository_name();
        let mut found = signature::find(
            &self.client,
            &described.reference,
            &repository,
            &described.digest,
            &described.manifest_bytes,
        )?;
        for (origin, bundle) in extra {
            found.extend(signature::bundle_candidates(
                origin,
                bundle,
                &repository,
                &described.digest,
                &described.manifest_bytes,
            )?);
        }
        Ok(found)
    }

    /// Verify `described` (resolved from `source`) under `policy`.
    pub fn verify(
        &self,
        source: &Reference,
        described: &Described,
        policy: &TrustPolicy,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Verified, Error> {
        let pinned = source.pinned(&described.digest);
        let rule = rule_for(policy, source)?;
        let record_name = format!(
            "verified-{}-{}",
            described.digest.hex(),
            record_key(&rule, &source.repository_name())
        );
        let verified = |signers, cached| Verified {
            source: pinned.clone(),
            location: described.reference.clone(),
            digest: described.digest.clone(),
            described: described.clone(),
            signers,
            cached,
        };
        if extra.is_empty()
            && let Some(cache) = &self.cache
            && let Some(bytes) = cache.record(&record_name)?
            && let Ok(record) = serde_json::from_slice::<Record>(&bytes)
            && record.digest == described.digest
        {
            return Ok(verified(record.signers, true));
        }
        let candidates = self.signatures(source, described, extra)?;
        let signers =
            policy::evaluate(&rule, &candidates).map_err(|reason| Error::Verification {
                reference: pinned.to_string(),
                reason,
            })?;
        if extra.is_empty()
            && let Some(cache) = &self.cache
        {
            let record = Record {
                digest: described.digest.clone(),
                signers: signers.clone(),
            };
            cache.put_record(
                &record_name,
                &serde_json::to_vec(&record).expect("a record serializes"),
            )?;
        }
        Ok(verified(signers, false))
    }
}

/// The policy's rule for `source`, or an error saying no rule covers it.
pub fn rule_for(policy: &TrustPolicy, source: &Reference) -> Result<Rule, Error> {
    let text = source.to_string();
    let parsed = crate::Source::Oci(source.clone());
    policy.rule_for(&parsed).ok_or_else(|| Error::Verification {
        reference: text.clone(),
        reason: "no rule in the trust policy covers this source; add a sources entry whose prefix matches it".into(),
    })
}

fn record_key(rule: &Rule, repository: &str) -> String {
    let mut h = Sha256::new();
    h.update(rule.fingerprint());
    h.update(repository);
    hex::encode(&h.finalize()[..8])
}

/// Where a file plugin's signatures live: a Sigstore bundle next to it.
pub fn file_bundle_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".sigstore.json");
    name.into()
}

/// Verify a `file://` plugin's bytes under `policy`: the rule covering its
/// directory, over the signatures in its Sigstore bundle
/// ([`file_bundle_path`]).
pub fn verify_file(
    policy: &TrustPolicy,
    source: &crate::Source,
    path: &std::path::Path,
    bytes: &[u8],
) -> Result<Vec<Signer>, Error> {
    let shown = format!("file://{}", path.display());
    let rule = policy
        .rule_for(source)
        .ok_or_else(|| Error::Verification {
            reference: shown.clone(),
            reason: "no rule in the trust policy covers this file; add a sources entry with a file:///DIR/ prefix".into(),
        })?;
    let bundle_path = file_bundle_path(path);
    let candidates = match read_bounded(&bundle_path, signature::MAX_SIGNATURE_BLOB) {
        Ok(bundle) => signature::file_bundle_candidates(
            &bundle_path.display().to_string(),
            &bundle,
            &Digest::of(bytes),
            bytes,
        )?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io(&bundle_path)(e)),
    };
    policy::evaluate(&rule, &candidates).map_err(|reason| Error::Verification {
        reference: shown,
        reason: reason.replace(
            "sign it with `capstan plugin sign`",
            &format!(
                "sign it with `capstan plugin sign {} --key KEY`, which writes {}",
                path.display(),
                bundle_path.display()
            ),
        ),
    })
}

/// Read at most `limit` bytes of a file; a longer file is an error (a
/// plugin source or bundle must never be read without bound, and
/// `/dev/zero` never ends).
pub fn read_bounded(path: &std::path::Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the limit of {limit} bytes"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sources_are_read_with_a_bound_even_when_they_never_end() {
        let err = super::read_bounded(std::path::Path::new("/dev/zero"), 1024 * 1024).unwrap_err();
        assert!(
            err.to_string()
                .contains("larger than the limit of 1048576 bytes"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.wasm");
        std::fs::write(&small, b"0123456789").unwrap();
        assert_eq!(super::read_bounded(&small, 10).unwrap(), b"0123456789");
        assert!(super::read_bounded(&small, 9).is_err());
    }
}
