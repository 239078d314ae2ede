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
    policy.rule_for(&text).ok_or_else(|| Error::Verification {
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
