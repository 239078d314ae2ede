//! The registry crate's one error type. Messages name what failed (which
//! reference, which digest, which field) and never carry credentials.

use std::path::PathBuf;

/// Everything that can go wrong between a reference and verified bytes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is not a reference this crate understands.
    #[error("invalid reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },
    /// The network or TLS failed before the registry answered.
    #[error("cannot reach {url}: {reason}")]
    Transport { url: String, reason: String },
    /// The registry refused the credentials (or there were none).
    #[error(
        "registry {registry} refused access to {repository} ({status}); log in with credentials in a docker config.json (--registry-config or $DOCKER_CONFIG)"
    )]
    Unauthorized {
        registry: String,
        repository: String,
        status: u16,
    },
    /// The registry has no such manifest, tag or blob.
    #[error("{what} not found in {repository}")]
    NotFound { repository: String, what: String },
    /// Any other unexpected answer.
    #[error("registry {registry} answered {status} to {request}: {body}")]
    Registry {
        registry: String,
        request: String,
        status: u16,
        body: String,
    },
    /// Content whose digest is not the one asked for.
    #[error(
        "{what}: requested {expected} but got content with digest {actual}; the registry or something in between served different bytes"
    )]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    /// A blob or manifest larger than allowed (declared or actually sent).
    #[error("{what} is {size} bytes, above the limit of {limit} bytes")]
    TooLarge { what: String, size: u64, limit: u64 },
    /// Fewer bytes than the descriptor promised.
    #[error("{what} is truncated: expected {expected} bytes, got {got}")]
    Truncated {
        what: String,
        expected: u64,
        got: u64,
    },
    /// A manifest, config, payload or bundle that does not have the expected shape.
    #[error("{what}: {reason}")]
    Malformed { what: String, reason: String },
    /// A key file that cannot be read, decrypted or used.
    #[error("key {what}: {reason}")]
    Key { what: String, reason: String },
    /// Signatures that do not satisfy the policy.
    #[error("verification of {reference} failed: {reason}")]
    Verification { reference: String, reason: String },
    /// A trust policy or mirror configuration that is not valid.
    #[error("{what}: {reason}")]
    Config { what: String, reason: String },
    /// A local file or directory.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn malformed(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Malformed {
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn key(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Key {
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn config(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Config {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}
