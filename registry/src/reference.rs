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
    /// Parse `oci://…`; the `oci://` prefix may be omitted. The text is
    /// parsed with the distribution reference grammar (`oci-spec`), the
    /// registry must be named explicitly, and it is normalised: the host is
    /// lowercased and the default HTTPS port `:443` dropped, so the same
    /// repository always has the same name when policies are matched.
    pub fn parse(text: &str) -> Result<Reference, Error> {
        let bad = |reason: &str| Error::InvalidReference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        let rest = text.strip_prefix("oci://").unwrap_or(text);
        let registry = match rest.split_once('/') {
            Some((registry, _)) if names_a_registry(registry) => registry,
            _ => {
                return Err(bad(
                    "expected REGISTRY/REPOSITORY with the registry named (a host with a '.', a ':port', or localhost), like oci://registry.example.com/capstan/sim-provider:v1",
                ));
            }
        };
        let parsed = oci_spec::distribution::Reference::try_from(rest).map_err(|e| {
            bad(&format!(
                "{e}: the repository must be lowercase letters, digits and '.', '_', '-' separated by '/'; a tag is 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
            ))
        })?;
        // oci-spec splits the registry off the same way; a mismatch would
        // mean it applied a default registry, which Capstan never does.
        if parsed.registry() != registry {
            return Err(bad("the registry must be named explicitly"));
        }
        let digest = match parsed.digest() {
            Some(d) => Some(d.parse::<Digest>().map_err(|e| bad(&e))?),
            None => None,
        };
        let tag = match (parsed.tag(), &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference {
            registry: normalise_registry(registry),
            repository: parsed.repository().to_string(),
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

/// Whether the first component of a name is a registry rather than the
/// start of a repository path (the distribution grammar's rule).
fn names_a_registry(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first.eq_ignore_ascii_case("localhost")
}

/// Whether `host[:port]` is a registry a source can name: the
/// distribution grammar's domain (dot-separated labels of letters, digits
/// and inner '-'), named as one (a '.', a port, or localhost).
fn valid_registry(registry: &str) -> bool {
    let (host, port) = registry.split_once(':').unwrap_or((registry, ""));
    let label_ok = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    names_a_registry(registry)
        && host.split('.').all(label_ok)
        && (registry.find(':').is_none()
            || (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())))
}

/// The registry as policies and mirrors compare it: lowercase host, no
/// default HTTPS port.
fn normalise_registry(registry: &str) -> String {
    let lower = registry.to_ascii_lowercase();
    match lower.strip_suffix(":443") {
        Some(host) => host.to_string(),
        None => lower,
    }
}

/// Where a rule applies: every source, an OCI registry or repository path,
/// or a directory of `file://` plugins. Written like a source
/// (`oci://registry.example.com/capstan/`, `file:///opt/plugins/`) and parsed
/// and normalised the way sources are, so `REGISTRY.example.com:443/capstan`
/// means `registry.example.com/capstan`, and a prefix always ends on a `/`
/// boundary: `…/capstan` never covers `…/capstan-evil`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `""` or `*`: every source.
    Everything,
    /// `oci://REGISTRY[/PATH…]`.
    Oci {
        /// The normalised registry.
        registry: String,
        /// Repository path components the source must start with.
        path: Vec<String>,
    },
    /// `file:///DIR…`: files at or below these path components.
    File {
        /// Path components (no `.`, `..` or empty ones).
        path: Vec<String>,
    },
}

/// A plugin source, parsed: an OCI reference or an absolute file path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `oci://…`.
    Oci(Reference),
    /// `file:///…`, with its path components.
    File(Vec<String>),
}

impl Source {
    /// Parse `oci://…` or `file:///…`. A file path must be absolute and
    /// must not contain `.`, `..` or empty components (a policy scope on a
    /// directory must not be escapable).
    pub fn parse(text: &str) -> Result<Source, Error> {
        if let Some(path) = text.strip_prefix("file://") {
            return file_components(text, path).map(Source::File);
        }
        if text.starts_with("oci://") {
            return Reference::parse(text).map(Source::Oci);
        }
        Err(Error::InvalidReference {
            reference: text.to_string(),
            reason: "a plugin source starts with oci:// or file://".into(),
        })
    }
}

fn file_components(text: &str, path: &str) -> Result<Vec<String>, Error> {
    let bad = |reason: &str| Error::InvalidReference {
        reference: text.to_string(),
        reason: reason.to_string(),
    };
    let Some(rest) = path.strip_prefix('/') else {
        return Err(bad(
            "a file:// source needs an absolute path, like file:///plugins/sim_provider.wasm",
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<String> = rest.split('/').map(str::to_string).collect();
    if parts.iter().any(|p| p.is_empty() || p == "." || p == "..") {
        return Err(bad(
            "a file path must not contain '.', '..' or '//' (write the path it means)",
        ));
    }
    Ok(parts)
}

impl Scope {
    /// Parse a rule's prefix. A prefix that could never match a source (a
    /// repository path the grammar refuses, a relative file path) is an
    /// error here, not a rule that silently never applies.
    pub fn parse(text: &str) -> Result<Scope, Error> {
        let bad = |reason: &str| Error::InvalidReference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        if text.is_empty() || text == "*" {
            return Ok(Scope::Everything);
        }
        if let Some(path) = text.strip_prefix("file://") {
            return file_components(text, path).map(|path| Scope::File { path });
        }
        let Some(rest) = text.strip_prefix("oci://") else {
            return Err(bad(
                "a prefix is oci://REGISTRY[/PATH/], file:///DIR/, or \"*\" for every source",
            ));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (registry, path) = rest.split_once('/').unwrap_or((rest, ""));
        if path.is_empty() {
            if !valid_registry(registry) {
                return Err(bad(
                    "the registry must be a host name with a '.' (or localhost) and an optional :port",
                ));
            }
            return Ok(Scope::Oci {
                registry: normalise_registry(registry),
                path: Vec::new(),
            });
        }
        if path.contains([':', '@']) {
            return Err(bad(
                "a prefix names a registry and repository path, without a tag or digest",
            ));
        }
        let parsed = Reference::parse(&format!("oci://{registry}/{path}"))
            .map_err(|e| bad(&format!("cannot match any source: {e}")))?;
        Ok(Scope::Oci {
            registry: parsed.registry,
            path: parsed.repository.split('/').map(str::to_string).collect(),
        })
    }

    /// Whether this scope covers `source`.
    pub fn covers(&self, source: &Source) -> bool {
        match (self, source) {
            (Scope::Everything, _) => true,
            (Scope::Oci { registry, path }, Source::Oci(r)) => {
                *registry == r.registry && starts_with(&r.repository, path)
            }
            (Scope::File { path }, Source::File(parts)) => parts.starts_with(path),
            _ => false,
        }
    }

    /// How specific the scope is: the most specific covering rule decides.
    pub fn specificity(&self) -> usize {
        match self {
            Scope::Everything => 0,
            Scope::Oci { path, .. } => 1 + path.len(),
            Scope::File { path } => 1 + path.len(),
        }
    }

    /// The repository components of `source` after this scope's path (for
    /// mirror rewrites); `None` when the scope does not cover it.
    pub fn remainder<'a>(&self, source: &'a Reference) -> Option<Vec<&'a str>> {
        let Scope::Oci { registry, path } = self else {
            return None;
        };
        if *registry != source.registry || !starts_with(&source.repository, path) {
            return None;
        }
        Some(source.repository.split('/').skip(path.len()).collect())
    }
}

fn starts_with(repository: &str, path: &[String]) -> bool {
    let mut parts = repository.split('/');
    path.iter().all(|p| parts.next() == Some(p.as_str()))
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Everything => write!(f, "*"),
            Scope::Oci { registry, path } if path.is_empty() => write!(f, "oci://{registry}/"),
            Scope::Oci { registry, path } => write!(f, "oci://{registry}/{}/", path.join("/")),
            Scope::File { path } => write!(f, "file:///{}/", path.join("/")),
        }
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
        // Normalised: one repository has one name.
        let r = Reference::parse("oci://REGISTRY.Example.com:443/capstan/x:v1").unwrap();
        assert_eq!(r.to_string(), "oci://registry.example.com/capstan/x:v1");
    }

    #[test]
    fn scopes_match_on_component_boundaries_after_normalising() {
        let scope = Scope::parse("oci://registry.example.com/capstan").unwrap();
        assert_eq!(
            scope,
            Scope::parse("oci://registry.example.com/capstan/").unwrap()
        );
        let covers = |s: &str| scope.covers(&Source::parse(s).unwrap());
        assert!(covers("oci://registry.example.com/capstan/sim:v1"));
        assert!(covers("oci://REGISTRY.example.com/capstan/sim:v1"));
        assert!(covers("oci://registry.example.com:443/capstan/sim:v1"));
        assert!(!covers("oci://registry.example.com/capstan-evil/sim:v1"));
        assert!(!covers("oci://registry.example.com:5000/capstan/sim:v1"));
        assert!(!covers("file:///registry.example.com/capstan/sim.wasm"));
        assert!(
            Scope::parse("oci://registry/").is_err(),
            "no source can name it"
        );
        assert!(Scope::parse("oci://reg.io:port/").is_err());
        let host = Scope::parse("oci://Registry.example.com:443").unwrap();
        assert!(host.covers(&Source::parse("oci://registry.example.com/a/b:1").unwrap()));
        let dir = Scope::parse("file:///opt/plugins/").unwrap();
        assert!(dir.covers(&Source::parse("file:///opt/plugins/a.wasm").unwrap()));
        assert!(!dir.covers(&Source::parse("file:///opt/plugins-evil/a.wasm").unwrap()));
        assert!(Source::parse("file:///opt/plugins/../../tmp/a.wasm").is_err());
        assert!(Source::parse("file://opt/a.wasm").is_err());
        for never in [
            "oci://registry.example.com/Capstan/",
            "oci://registry.example.com/capstan:v1",
            "registry.example.com/capstan/",
            "file://relative/dir/",
            "oci://bad host/",
        ] {
            assert!(Scope::parse(never).is_err(), "{never}");
        }
        assert_eq!(
            Scope::parse("oci://R.example.com:443/a/b")
                .unwrap()
                .to_string(),
            "oci://r.example.com/a/b/"
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
            "oci://capstan/sim:v1",
        ] {
            let err = Reference::parse(bad).unwrap_err().to_string();
            assert!(err.contains("invalid reference"), "{bad}: {err}");
        }
    }
}
