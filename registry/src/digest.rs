//! `sha256:<hex>` content digests, always checked on the way in.

use crate::Error;
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A validated `sha256:<64 lowercase hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The digest of some bytes.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex characters.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tag cosign stores signatures under: `sha256-<hex>.sig`.
    pub fn signature_tag(&self) -> String {
        format!("sha256-{}.sig", self.hex())
    }

    /// The referrers tag schema fallback tag: `sha256-<hex>`.
    pub fn referrers_tag(&self) -> String {
        format!("sha256-{}", self.hex())
    }

    /// Check that `bytes` have this digest.
    pub fn check(&self, what: &str, bytes: &[u8]) -> Result<(), Error> {
        let actual = Digest::of(bytes);
        if &actual != self {
            return Err(Error::DigestMismatch {
                what: what.to_string(),
                expected: self.0.clone(),
                actual: actual.0,
            });
        }
        Ok(())
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some(hex) = s.strip_prefix("sha256:") else {
            return Err(format!(
                "digest {s:?} must start with sha256: (other algorithms are not accepted)"
            ));
        };
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "digest {s:?} must be sha256: followed by 64 lowercase hex digits"
            ));
        }
        Ok(Digest(s.to_string()))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked_and_tagged_like_cosign() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.as_str(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(d.signature_tag(), format!("sha256-{}.sig", d.hex()));
        assert!(d.check("x", b"hello").is_ok());
        let err = d.check("blob", b"hellO").unwrap_err().to_string();
        assert!(err.contains("requested sha256:2cf2"), "{err}");
        assert!("sha512:00".parse::<Digest>().is_err());
        assert!("sha256:ABC".parse::<Digest>().is_err());
        assert!(d.as_str().parse::<Digest>().is_ok());
    }
}
