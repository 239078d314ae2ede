//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:…]` references.

use crate::{Digest, Error};
use std::fmt;
use std::str::FromStr;

/// A parsed OCI reference. The registry is always explicit: there is no
/// default registry, so a reference always says where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `path/to/repo` (lowercase).
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// The digest, if pinned.
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parse `oci://…`; the `oci://` prefix may be omitted.
    pub fn parse(text: &str) -> Result<Reference, Error> {
        let bad = |reason: &str| Error::InvalidReference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        let rest = text.strip_prefix("oci://").unwrap_or(text);
        let (rest, digest) = match rest.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest.parse::<Digest>().map_err(|e| bad(&e))?)),
            None => (rest, None),
        };
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(bad(
                "expected REGISTRY/REPOSITORY, like oci://registry.example.com/capstan/sim-provider:v1",
            ));
        };
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(bad(
                "the registry must be a host name or address with an optional :port",
            ));
        }
        // A ':' after the last '/' starts the tag.
        let last_slash = path.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match path[last_slash..].find(':') {
            Some(i) => (&path[..last_slash + i], Some(&path[last_slash + i + 1..])),
            None => (path, None),
        };
        if repository.is_empty()
            || repository.split('/').any(|part| {
                part.is_empty()
                    || !part.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
                    || !part.as_bytes()[0].is_ascii_alphanumeric()
            })
        {
            return Err(bad(
                "the repository must be lowercase letters, digits, '.', '_' and '-' separated by '/'",
            ));
        }
        if let Some(tag) = tag
            && (tag.is_empty()
                || tag.len() > 128
                || tag.starts_with(['.', '-'])
                || !tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(bad(
                "a tag is 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// `REGISTRY/REPOSITORY`: what cosign calls the docker reference.
    pub fn repository_name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// The same repository pinned to `digest` (the tag is dropped: after
    /// resolution everything goes by digest).
    pub fn pinned(&self, digest: &Digest) -> Reference {
        Reference {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest.clone()),
        }
    }

    /// The same repository with another tag.
    pub fn with_tag(&self, tag: &str) -> Reference {
        Reference {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: Some(tag.to_string()),
            digest: None,
        }
    }

    /// Whether the registry is on this machine (plain HTTP is allowed there).
    pub fn is_loopback(&self) -> bool {
        is_loopback_registry(&self.registry)
    }
}

/// Whether `host[:port]` names this machine.
pub(crate) fn is_loopback_registry(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl FromStr for Reference {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Reference::parse(s)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tags_digests_and_ports() {
        let r = Reference::parse("oci://127.0.0.1:5000/capstan/sim:v1").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "capstan/sim");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert!(r.is_loopback());
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/capstan/sim:v1");

        let d = Digest::of(b"x");
        let r = Reference::parse(&format!("oci://reg.example.com/a/b@{d}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_ref(), Some(&d));
        assert_eq!(r.manifest_reference(), d.to_string());
        assert!(!r.is_loopback());

        let r = Reference::parse("localhost:5000/x").unwrap();
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert!(r.is_loopback());
        assert!(
            Reference::parse("oci://[::1]:5000/x:1")
                .unwrap()
                .is_loopback()
        );
    }

    #[test]
    fn rejects_what_a_registry_would_not_accept() {
        for bad in [
            "oci://registry",
            "oci://reg/Upper",
            "oci://reg/a//b",
            "oci://reg/a:",
            "oci://reg/a:-x",
            "oci://reg/a@sha256:12",
            "oci://re g/a",
        ] {
            let err = Reference::parse(bad).unwrap_err().to_string();
            assert!(err.contains("invalid reference"), "{bad}: {err}");
        }
    }
}
