//! cosign-format ECDSA P-256 key pairs.
//!
//! The private key is PKCS#8, encrypted the way cosign (via
//! go-securesystemslib) does it: scrypt (N=32768, r=8, p=1) derives a key
//! from the password, NaCl secretbox seals the DER, and the JSON envelope is
//! PEM-armoured as `ENCRYPTED SIGSTORE PRIVATE KEY` (the older
//! `ENCRYPTED COSIGN PRIVATE KEY` label is read too). The public key is a
//! plain SPKI `PUBLIC KEY` PEM, which every Sigstore tool reads.

use crate::Error;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use crypto_secretbox::XSalsa20Poly1305;
use crypto_secretbox::aead::{Aead, KeyInit};
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding,
};
use rand_core::{OsRng, RngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;

const PEM_LABEL: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
const PEM_LABEL_OLD: &str = "ENCRYPTED COSIGN PRIVATE KEY";
const SCRYPT_LOG_N: u8 = 15;

/// A private key that can sign. Its `Debug` shows only the key id.
pub struct PrivateKey {
    key: SigningKey,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey({})", self.public().id())
    }
}

/// A public key that verifies.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.id())
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    kdf: Kdf,
    cipher: Cipher,
    #[serde(with = "b64")]
    ciphertext: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    #[serde(with = "b64")]
    salt: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct ScryptParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    #[serde(with = "b64")]
    nonce: Vec<u8>,
}

mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

impl PrivateKey {
    /// A fresh random key.
    pub fn generate() -> PrivateKey {
        PrivateKey {
            key: SigningKey::random(&mut OsRng),
        }
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            key: *self.key.verifying_key(),
        }
    }

    /// Sign `message` (ECDSA P-256 over its SHA-256); DER-encoded, as cosign
    /// stores it.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let signature: Signature = self.key.sign(message);
        signature.to_der().as_bytes().to_vec()
    }

    /// The encrypted PEM (`ENCRYPTED SIGSTORE PRIVATE KEY`).
    pub fn to_encrypted_pem(&self, password: &[u8]) -> Result<String, Error> {
        let der = self
            .key
            .to_pkcs8_der()
            .map_err(|e| Error::key("encoding", e))?;
        let mut salt = vec![0u8; 32];
        let mut nonce = vec![0u8; 24];
        OsRng.fill_bytes(&mut salt);
        OsRng.fill_bytes(&mut nonce);
        let secret = derive(password, &salt, 1 << SCRYPT_LOG_N, 8, 1)?;
        let ciphertext = XSalsa20Poly1305::new(&secret.into())
            .encrypt(nonce.as_slice().into(), der.as_bytes())
            .map_err(|e| Error::key("encryption", e))?;
        let envelope = Envelope {
            kdf: Kdf {
                name: "scrypt".into(),
                params: ScryptParams {
                    n: 1 << SCRYPT_LOG_N,
                    r: 8,
                    p: 1,
                },
                salt,
            },
            cipher: Cipher {
                name: "nacl/secretbox".into(),
                nonce,
            },
            ciphertext,
        };
        let json = serde_json::to_vec(&envelope).expect("the envelope always serializes");
        Ok(armor(PEM_LABEL, &json))
    }

    /// Read an encrypted cosign private key. `what` names the file in errors.
    pub fn from_encrypted_pem(
        what: &str,
        text: &str,
        password: &[u8],
    ) -> Result<PrivateKey, Error> {
        let json = unarmor(text, &[PEM_LABEL, PEM_LABEL_OLD]).ok_or_else(|| {
            Error::key(
                what,
                format!("not a cosign private key (expected a {PEM_LABEL} PEM block)"),
            )
        })?;
        let envelope: Envelope = serde_json::from_slice(&json).map_err(|e| {
            Error::key(
                what,
                format!("the encrypted key envelope is malformed: {e}"),
            )
        })?;
        if envelope.kdf.name != "scrypt" || envelope.cipher.name != "nacl/secretbox" {
            return Err(Error::key(
                what,
                format!(
                    "unsupported encryption {}/{} (expected scrypt/nacl/secretbox)",
                    envelope.kdf.name, envelope.cipher.name
                ),
            ));
        }
        if envelope.cipher.nonce.len() != 24 {
            return Err(Error::key(what, "the nonce is not 24 bytes"));
        }
        let p = &envelope.kdf.params;
        let secret = derive(password, &envelope.kdf.salt, p.n, p.r, p.p)?;
        let der = XSalsa20Poly1305::new(&secret.into())
            .decrypt(
                envelope.cipher.nonce.as_slice().into(),
                envelope.ciphertext.as_slice(),
            )
            .map_err(|_| Error::key(what, "wrong password (or the file is corrupted)"))?;
        let key = SigningKey::from_pkcs8_der(&der)
            .map_err(|e| Error::key(what, format!("not an ECDSA P-256 key: {e}")))?;
        Ok(PrivateKey { key })
    }
}

fn derive(password: &[u8], salt: &[u8], n: u64, r: u32, p: u32) -> Result<[u8; 32], Error> {
    if !n.is_power_of_two() || !(2..=1 << 20).contains(&n) {
        return Err(Error::key(
            "scrypt parameters",
            format!("N={n} is not a power of two up to 2^20"),
        ));
    }
    let params = scrypt::Params::new(n.trailing_zeros() as u8, r, p, 32)
        .map_err(|e| Error::key("scrypt parameters", e))?;
    let mut out = [0u8; 32];
    scrypt::scrypt(password, salt, &params, &mut out).map_err(|e| Error::key("scrypt", e))?;
    Ok(out)
}

impl PublicKey {
    /// Read a `PUBLIC KEY` PEM (ECDSA P-256).
    pub fn from_pem(what: &str, text: &str) -> Result<PublicKey, Error> {
        let key = VerifyingKey::from_public_key_pem(text.trim())
            .map_err(|e| Error::key(what, format!("not an ECDSA P-256 PUBLIC KEY PEM: {e}")))?;
        Ok(PublicKey { key })
    }

    /// The `PUBLIC KEY` PEM.
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("a P-256 key always encodes")
    }

    /// The SPKI DER.
    pub fn to_der(&self) -> Vec<u8> {
        self.key
            .to_public_key_der()
            .expect("a P-256 key always encodes")
            .into_vec()
    }

    /// A stable id: `sha256:` of the SPKI DER, first 16 hex digits.
    pub fn id(&self) -> String {
        format!(
            "sha256:{}",
            &hex::encode(Sha256::digest(self.to_der()))[..16]
        )
    }

    /// Whether `signature` (DER, or the 64-byte r‖s form) signs `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let signature =
            Signature::from_der(signature).or_else(|_| Signature::from_slice(signature));
        match signature {
            Ok(s) => self.key.verify(message, &s).is_ok(),
            Err(_) => false,
        }
    }
}

fn armor(label: &str, bytes: &[u8]) -> String {
    let body = STANDARD.encode(bytes);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn unarmor(text: &str, labels: &[&str]) -> Option<Vec<u8>> {
    for label in labels {
        let begin = format!("-----BEGIN {label}-----");
        let end = format!("-----END {label}-----");
        if let Some(start) = text.find(&begin) {
            let rest = &text[start + begin.len()..];
            let stop = rest.find(&end)?;
            let body: String = rest[..stop]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            return STANDARD.decode(body).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_pairs_round_trip_and_passwords_matter() {
        let key = PrivateKey::generate();
        let pem = key.to_encrypted_pem(b"correct horse").unwrap();
        assert!(pem.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"));
        let json = unarmor(&pem, &[PEM_LABEL]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["kdf"]["params"]["N"], 32768);
        assert_eq!(v["cipher"]["name"], "nacl/secretbox");

        let back = PrivateKey::from_encrypted_pem("k", &pem, b"correct horse").unwrap();
        assert_eq!(back.public(), key.public());
        let err = PrivateKey::from_encrypted_pem("k.key", &pem, b"wrong").unwrap_err();
        assert!(err.to_string().contains("k.key: wrong password"), "{err}");

        let public = PublicKey::from_pem("k.pub", &key.public().to_pem()).unwrap();
        let signature = key.sign(b"payload");
        assert!(public.verifies(b"payload", &signature));
        assert!(!public.verifies(b"payload!", &signature));
        assert!(
            !PrivateKey::generate()
                .public()
                .verifies(b"payload", &signature)
        );
        assert!(PublicKey::from_pem("x", "not a key").is_err());
    }
}
