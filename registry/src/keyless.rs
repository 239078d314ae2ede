//! Keyless Sigstore signatures, verified offline.
//!
//! A keyless signature is made with a short-lived Fulcio certificate issued
//! for an OIDC identity (a CI workflow, a person's e-mail), and logged in
//! Rekor. Nothing about it needs the network to check, given Sigstore's
//! *trusted root* (`trusted_root.json`: the Fulcio CAs, the Rekor and CT log
//! keys, the timestamp authorities) and a bundle that carries its inclusion
//! proof or an RFC 3161 timestamp. That is the air-gapped case.
//!
//! Where to start: [`TrustedRoot`] loads a root; [`IdentityRule`] is one
//! `identities` entry of the trust policy; [`IdentityRule::check`] decides
//! whether a [`Keyless`] signature (found by [`crate::signature`]) was made
//! by that identity. The cryptography (the certificate chain at signing
//! time, the SCT, the Rekor inclusion proof, checkpoint and promise, RFC 3161
//! timestamps, the signature over the artifact) is `sigstore-verify`'s, run
//! on a `ring` backend ([`RingProvider`]) so no C library is built.

use crate::Error;
use regex::Regex;
use ring::{digest, signature as ring_sig};
use sha2::{Digest as _, Sha256};
use sigstore_verify::crypto::{CryptoProvider, HashContext, SigningScheme};
use sigstore_verify::trust_root::TrustedRoot as SigstoreRoot;
use sigstore_verify::types::{Bundle, HashAlgorithm};
use sigstore_verify::{VerificationPolicy, Verifier};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Once};

/// The trusted root's media type prefix (`…trustedroot+json;version=0.1`).
const TRUSTED_ROOT_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.trustedroot";

/// A Sigstore trusted root, parsed and ready to verify against.
#[derive(Clone)]
pub struct TrustedRoot {
    /// Where it came from (a file name), for messages.
    pub origin: String,
    json: Arc<String>,
    root: Arc<SigstoreRoot>,
    verifier: Arc<Verifier>,
}

impl fmt::Debug for TrustedRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrustedRoot({}, {})", self.origin, self.fingerprint())
    }
}

impl PartialEq for TrustedRoot {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl TrustedRoot {
    /// Read a `trusted_root.json`.
    pub fn load(path: &Path) -> Result<TrustedRoot, Error> {
        let json = std::fs::read_to_string(path).map_err(Error::io(path))?;
        Self::parse(&path.display().to_string(), &json)
    }

    /// Parse a trusted root; `origin` names it in messages. Malformed or
    /// unusable trust material (an unparsable key, an empty chain, a
    /// duplicate log) is refused here, not at the first verification.
    pub fn parse(origin: &str, json: &str) -> Result<TrustedRoot, Error> {
        install_provider();
        let root = SigstoreRoot::from_json(json)
            .map_err(|e| Error::config(origin, format!("not a Sigstore trusted root: {e}")))?;
        if !root.media_type.starts_with(TRUSTED_ROOT_MEDIA_TYPE) {
            return Err(Error::config(
                origin,
                format!(
                    "mediaType {:?} is not a Sigstore trusted root ({TRUSTED_ROOT_MEDIA_TYPE}+json)",
                    root.media_type
                ),
            ));
        }
        if root.certificate_authorities.is_empty() {
            return Err(Error::config(
                origin,
                "names no certificate authority, so no keyless signature could verify against it",
            ));
        }
        let verifier = Verifier::new(&root)
            .map_err(|e| Error::config(origin, format!("unusable trust material: {e}")))?;
        Ok(TrustedRoot {
            origin: origin.to_string(),
            json: Arc::new(json.to_string()),
            root: Arc::new(root),
            verifier: Arc::new(verifier),
        })
    }

    /// The file as read (what an air-gap bundle carries).
    pub fn json(&self) -> &str {
        &self.json
    }

    /// A short, stable name for this root's contents.
    pub fn fingerprint(&self) -> String {
        hex::encode(&Sha256::digest(self.json.as_bytes())[..8])
    }

    /// `bundled` (a root that travelled with an air-gap bundle) may only
    /// narrow this one: every authority and log it names must be one this
    /// root already trusts. Refuses, naming the first entry this root does
    /// not have. (What a bundled root leaves out needs no check: a bundle's
    /// signatures must satisfy the site's policy, under the site's root, and
    /// the bundle's own.)
    pub fn only_narrows(&self, bundled: &TrustedRoot) -> Result<(), Error> {
        let (site, theirs) = (&self.root, &bundled.root);
        let chain = |c: &sigstore_verify::trust_root::trusted_root::CertChain| {
            c.certificates
                .iter()
                .map(|e| e.raw_bytes.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        let named = |n: &Option<String>| n.as_deref().unwrap_or("no common name").to_string();
        let added = theirs
            .certificate_authorities
            .iter()
            .enumerate()
            .find(|(_, ca)| {
                !site
                    .certificate_authorities
                    .iter()
                    .any(|s| chain(&s.cert_chain) == chain(&ca.cert_chain))
            })
            .map(|(i, ca)| {
                format!(
                    "certificate authority {i} ({}, {})",
                    named(&ca.subject.common_name),
                    ca.uri
                )
            })
            .or_else(|| {
                theirs
                    .timestamp_authorities
                    .iter()
                    .enumerate()
                    .find(|(_, tsa)| {
                        !site
                            .timestamp_authorities
                            .iter()
                            .any(|s| chain(&s.cert_chain) == chain(&tsa.cert_chain))
                    })
                    .map(|(i, tsa)| {
                        format!(
                            "timestamp authority {i} ({})",
                            named(&tsa.subject.common_name)
                        )
                    })
            })
            .or_else(|| {
                theirs
                    .tlogs
                    .iter()
                    .find(|log| {
                        !site
                            .tlogs
                            .iter()
                            .any(|s| s.public_key.raw_bytes == log.public_key.raw_bytes)
                    })
                    .map(|log| format!("transparency log {}", log.base_url))
            })
            .or_else(|| {
                theirs
                    .ctlogs
                    .iter()
                    .find(|log| {
                        !site
                            .ctlogs
                            .iter()
                            .any(|s| s.public_key.raw_bytes == log.public_key.raw_bytes)
                    })
                    .map(|log| format!("certificate transparency log {}", log.base_url))
            });
        match added {
            None => Ok(()),
            Some(what) => Err(Error::config(
                &bundled.origin,
                format!(
                    "adds {what}, which the site's trusted root {} does not have; a bundled root can only narrow the site's",
                    self.origin
                ),
            )),
        }
    }
}

/// How a rule matches the certificate's subject (its SAN: an e-mail or a URI).
#[derive(Debug, Clone)]
pub enum Subject {
    /// Exactly this value.
    Exact(String),
    /// A regular expression that must match the whole value (as written,
    /// and compiled anchored).
    Pattern {
        /// As the policy wrote it.
        text: String,
        /// `^(?:text)$`.
        regex: Regex,
    },
}

impl Subject {
    /// A subject given as a regular expression; anchored at both ends, as
    /// cosign's `--certificate-identity-regexp` is not, because a pattern
    /// that matches inside a longer identity is an easy mistake to exploit.
    pub fn pattern(text: &str) -> Result<Subject, String> {
        Regex::new(&format!("^(?:{text})$"))
            .map(|regex| Subject::Pattern {
                text: text.to_string(),
                regex,
            })
            .map_err(|e| format!("subjectRegExp {text:?} is not a regular expression: {e}"))
    }

    /// A subject as a policy names it: exactly one of `subject` and
    /// `subjectRegExp`.
    pub fn from_fields(exact: Option<&str>, pattern: Option<&str>) -> Result<Subject, String> {
        match (exact, pattern) {
            (Some(s), None) if !s.is_empty() => Ok(Subject::Exact(s.to_string())),
            (None, Some(re)) => Subject::pattern(re),
            _ => Err("give exactly one of subject or subjectRegExp".into()),
        }
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Subject::Exact(s) => s == value,
            Subject::Pattern { regex, .. } => regex.is_match(value),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Exact(s) => write!(f, "{s:?}"),
            Subject::Pattern { text, .. } => write!(f, "/{text}/"),
        }
    }
}

/// One identity a trust policy accepts: who (subject), vouched for by whom
/// (the OIDC issuer), under which trusted root.
#[derive(Debug, Clone)]
pub struct IdentityRule {
    /// The OIDC issuer, exactly (`https://token.actions.githubusercontent.com`).
    pub issuer: String,
    /// The certificate's subject.
    pub subject: Subject,
    /// The root the certificate, its log entry and its timestamps must chain to.
    pub root: TrustedRoot,
}

/// A keyless signature as found: the bundle and the bytes it must cover.
#[derive(Clone)]
pub struct Keyless {
    bundle: Arc<Bundle>,
    artifact: Arc<Vec<u8>>,
}

impl fmt::Debug for Keyless {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keyless")
    }
}

/// What a verified keyless signature says about its signer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The certificate's subject (SAN).
    pub subject: String,
    /// The certificate's OIDC issuer.
    pub issuer: String,
    /// The Rekor log index, when the signature was logged.
    pub log_index: Option<u64>,
}

impl Keyless {
    /// Read `bundle` (JSON; `parsed` is the same, as already read) if it is
    /// a keyless bundle: one whose verification material is a certificate
    /// (v0.3) or a certificate chain (v0.1, v0.2). `artifact` is what the
    /// signature must cover (the manifest, or the file).
    pub fn from_bundle(
        parsed: &serde_json::Value,
        bundle: &[u8],
        artifact: &[u8],
    ) -> Result<Option<Keyless>, String> {
        // Keyed bundles are read by `crate::signature` alone: whether this
        // crate's stricter reader takes them must not decide if they count.
        let material = &parsed["verificationMaterial"];
        if material.get("certificate").is_none() && material.get("x509CertificateChain").is_none() {
            return Ok(None);
        }
        let text =
            std::str::from_utf8(bundle).map_err(|_| "the bundle is not UTF-8".to_string())?;
        let read =
            Bundle::from_json(text).map_err(|e| format!("not a readable Sigstore bundle: {e}"))?;
        if read.signing_certificate().is_none() {
            return Ok(None);
        }
        Ok(Some(Keyless {
            bundle: Arc::new(read),
            artifact: Arc::new(artifact.to_vec()),
        }))
    }

    /// The signer as the certificate claims it, unverified (for messages
    /// and `capstan plugin inspect` before a root is chosen).
    pub fn claimed(&self) -> Option<Signed> {
        let cert = self.bundle.signing_certificate()?;
        let info = sigstore_verify::crypto::parse_certificate_info(cert).ok()?;
        Some(Signed {
            subject: info.identity.map(|i| i.as_str().to_string())?,
            issuer: info.issuer.unwrap_or_default(),
            log_index: self.log_index(),
        })
    }

    fn log_index(&self) -> Option<u64> {
        self.bundle
            .verification_material
            .tlog_entries
            .first()
            .map(|e| e.log_index.get())
    }

    /// Verify everything but the identity against `root`: the certificate
    /// chains to one of its CAs valid at signing time, the signing time is
    /// proven (a Rekor inclusion proof or promise, or an RFC 3161 timestamp),
    /// the SCT verifies against one of its CT logs, and the signature covers
    /// the artifact. `Err` says what did not hold.
    pub fn verify(&self, root: &TrustedRoot) -> Result<Signed, String> {
        install_provider();
        let result = root
            .verifier
            .verify(
                self.artifact.as_slice(),
                &self.bundle,
                &VerificationPolicy::any_identity(),
            )
            .map_err(|e| explain(&e.to_string(), root))?;
        let subject = result
            .identity()
            .map(|i| i.as_str().to_string())
            .ok_or("the certificate names no subject")?;
        let issuer = result
            .issuer()
            .ok_or("the certificate names no OIDC issuer")?
            .to_string();
        Ok(Signed {
            subject,
            issuer,
            log_index: self.log_index(),
        })
    }
}

/// `sigstore-verify`'s error, led by what it means for the signer when the
/// raw text (a webpki error name) would not say.
fn explain(error: &str, root: &TrustedRoot) -> String {
    let meaning = if error.contains("CertExpired") {
        "the signing certificate had expired at the signing time the log entry or timestamp proves: "
    } else if error.contains("CertNotValidYet") {
        "the signing certificate was not yet valid at the signing time the log entry or timestamp proves: "
    } else if error.contains("certificate chain validation failed") {
        "the signing certificate does not chain to a certificate authority of the trusted root: "
    } else if error.contains("must have an inclusion proof")
        || error.contains("no verified timestamp")
    {
        "nothing proves when it was signed (no transparency log inclusion proof and no RFC 3161 timestamp), so the short-lived certificate cannot be checked: "
    } else {
        ""
    };
    format!("{meaning}{error} (trusted root {})", root.origin)
}

impl IdentityRule {
    /// An identity as a policy or a Plugin names it: the OIDC issuer
    /// (exactly, and not empty) and the subject, under `root`.
    pub fn new(issuer: &str, subject: Subject, root: TrustedRoot) -> Result<IdentityRule, String> {
        Self::check_issuer(issuer)?;
        Ok(IdentityRule {
            issuer: issuer.to_string(),
            subject,
            root,
        })
    }

    /// An issuer must be named (checked before a root file is read).
    pub fn check_issuer(issuer: &str) -> Result<(), String> {
        if issuer.is_empty() {
            return Err("issuer is empty; give the OIDC issuer URL exactly (for GitHub Actions, https://token.actions.githubusercontent.com)".into());
        }
        Ok(())
    }

    /// Whether `signature` was made by this identity under this rule's root.
    pub fn check(&self, signature: &Keyless) -> Result<Signed, String> {
        let signed = signature.verify(&self.root)?;
        if signed.issuer != self.issuer {
            return Err(format!(
                "signed by {:?} from issuer {:?}, not issuer {:?}",
                signed.subject, signed.issuer, self.issuer
            ));
        }
        if !self.subject.matches(&signed.subject) {
            return Err(format!(
                "signed by {:?} (issuer {:?}), not subject {}",
                signed.subject, signed.issuer, self.subject
            ));
        }
        Ok(signed)
    }

    /// What the rule accepts, for messages: `"SUBJECT" from ISSUER`.
    pub fn describe(&self) -> String {
        format!("{} from {}", self.subject, self.issuer)
    }
}

/// `sigstore-crypto`'s primitives on `ring` (already in the tree for TLS),
/// instead of its default `aws-lc-rs`, whose C build would cost minutes.
/// ML-DSA, which Sigstore does not use for Fulcio, Rekor or CT, is refused.
#[derive(Debug)]
pub struct RingProvider;

static RING: RingProvider = RingProvider;

/// Make [`RingProvider`] the process's Sigstore backend (once; a backend
/// another part of the process installed first is kept).
pub fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = sigstore_verify::crypto::install_default_provider(&RING);
    });
}

struct RingHash(digest::Context);

impl HashContext for RingHash {
    fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    fn finalize(self: Box<Self>) -> Vec<u8> {
        self.0.finish().as_ref().to_vec()
    }
}

type CryptoResult<T> = sigstore_verify::crypto::Result<T>;
use sigstore_verify::crypto::Error as CryptoError;

fn ring_algorithm(
    scheme: SigningScheme,
) -> CryptoResult<&'static dyn ring_sig::VerificationAlgorithm> {
    Ok(match scheme {
        SigningScheme::EcdsaP256Sha256 => &ring_sig::ECDSA_P256_SHA256_ASN1,
        SigningScheme::EcdsaP256Sha384 => &ring_sig::ECDSA_P256_SHA384_ASN1,
        SigningScheme::EcdsaP384Sha256 => &ring_sig::ECDSA_P384_SHA256_ASN1,
        SigningScheme::EcdsaP384Sha384 => &ring_sig::ECDSA_P384_SHA384_ASN1,
        SigningScheme::Ed25519 => &ring_sig::ED25519,
        SigningScheme::RsaPssSha256 => &ring_sig::RSA_PSS_2048_8192_SHA256,
        SigningScheme::RsaPssSha384 => &ring_sig::RSA_PSS_2048_8192_SHA384,
        SigningScheme::RsaPssSha512 => &ring_sig::RSA_PSS_2048_8192_SHA512,
        SigningScheme::RsaPkcs1Sha256 => &ring_sig::RSA_PKCS1_2048_8192_SHA256,
        SigningScheme::RsaPkcs1Sha384 => &ring_sig::RSA_PKCS1_2048_8192_SHA384,
        SigningScheme::RsaPkcs1Sha512 => &ring_sig::RSA_PKCS1_2048_8192_SHA512,
        other => {
            return Err(CryptoError::UnsupportedAlgorithm(format!(
                "{} is not supported by Capstan's verifier",
                other.name()
            )));
        }
    })
}

impl CryptoProvider for RingProvider {
    fn hash(&self, algorithm: HashAlgorithm) -> CryptoResult<Box<dyn HashContext>> {
        let algorithm = match algorithm {
            HashAlgorithm::Sha2256 => &digest::SHA256,
            HashAlgorithm::Sha2384 => &digest::SHA384,
            HashAlgorithm::Sha2512 => &digest::SHA512,
            other => {
                return Err(CryptoError::UnsupportedAlgorithm(format!(
                    "cannot compute {other} digests"
                )));
            }
        };
        Ok(Box::new(RingHash(digest::Context::new(algorithm))))
    }

    fn verify_raw(
        &self,
        scheme: SigningScheme,
        spki_pubkey_bytes: &[u8],
        data: &[u8],
        signature: &[u8],
    ) -> CryptoResult<()> {
        ring_sig::UnparsedPublicKey::new(ring_algorithm(scheme)?, spki_pubkey_bytes)
            .verify(data, signature)
            .map_err(|_| CryptoError::Verification(format!("{} signature invalid", scheme.name())))
    }

    /// `ring` verifies only whole messages; a prehashed ECDSA P-256
    /// signature (a hashedrekord over a digest) is checked with `p256`.
    fn verify_prehashed(
        &self,
        scheme: SigningScheme,
        spki_pubkey_bytes: &[u8],
        digest: &[u8],
        signature: &[u8],
    ) -> CryptoResult<()> {
        use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
        if scheme != SigningScheme::EcdsaP256Sha256 {
            return Err(CryptoError::UnsupportedAlgorithm(format!(
                "{} over a precomputed digest is not supported by Capstan's verifier",
                scheme.name()
            )));
        }
        let invalid = || CryptoError::Verification(format!("{} signature invalid", scheme.name()));
        let key =
            p256::ecdsa::VerifyingKey::from_sec1_bytes(spki_pubkey_bytes).map_err(|_| invalid())?;
        let signature = p256::ecdsa::Signature::from_der(signature).map_err(|_| invalid())?;
        key.verify_prehash(digest, &signature)
            .map_err(|_| invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_patterns_match_the_whole_subject() {
        let s = Subject::pattern("https://github.com/example/.*").unwrap();
        assert!(
            s.matches("https://github.com/example/plugins/.github/workflows/r.yml@refs/heads/main")
        );
        // A pattern that would match inside a longer identity does not.
        assert!(!s.matches("https://evil.example/?https://github.com/example/x"));
        let inner = Subject::pattern("example/plugins").unwrap();
        assert!(!inner.matches("https://github.com/example/plugins/x"));
        assert!(inner.matches("example/plugins"));
        // Alternatives stay inside the anchors.
        let alt = Subject::pattern("a@example.com|b@example.com").unwrap();
        assert!(alt.matches("b@example.com"));
        assert!(!alt.matches("xb@example.com"));
        assert_eq!(inner.to_string(), "/example/plugins/");
        assert_eq!(Subject::Exact("a@b".into()).to_string(), "\"a@b\"");
        let err = Subject::pattern("(").unwrap_err();
        assert!(
            err.contains("subjectRegExp \"(\" is not a regular expression"),
            "{err}"
        );
    }

    #[test]
    fn a_root_that_is_not_a_trusted_root_is_refused_with_its_name() {
        let err = TrustedRoot::parse("root.json", "{}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("root.json") && err.contains("trusted root"),
            "{err}"
        );
        let err = TrustedRoot::parse(
            "root.json",
            r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1","tlogs":[],"certificateAuthorities":[],"ctlogs":[],"timestampAuthorities":[]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("names no certificate authority"), "{err}");
    }
}
