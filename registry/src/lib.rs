//! Capstan's plugin supply chain: everything between "a publisher built a
//! component" and "the host holds verified bytes", with no wasmtime and no
//! Kubernetes in sight.
//!
//! Where to start:
//! - [`Reference`] parses `oci://REGISTRY/REPO[:TAG][@sha256:…]`.
//! - [`Client`] speaks the OCI distribution API (auth from a docker
//!   `config.json`, TLS with an extra CA, plain HTTP only for loopback or
//!   `insecure`), and refuses blobs that are too large, truncated or not the
//!   digest asked for.
//! - [`artifact`] pushes and pulls plugins in the CNCF Wasm artifact layout
//!   (config `application/vnd.wasm.config.v0+json`, layer `application/wasm`),
//!   with the plugin manifest in an annotation so it can be read without
//!   downloading the component.
//! - [`keys`] reads and writes cosign-format key pairs; [`signature`] signs and
//!   reads cosign `.sig` signatures and Sigstore bundles; [`policy`] decides
//!   whether the signatures found satisfy a trust policy; [`verify`] ties the
//!   three together for one reference.
//! - [`Cache`] is the content-addressed blob store; [`layout`] reads and writes
//!   air-gap bundles (OCI image layout archives); [`Mirrors`] rewrites sources
//!   by prefix so the same `Plugin` objects work on both sides of an air gap.
#![forbid(unsafe_code)]

pub mod artifact;
mod auth;
mod cache;
mod client;
mod digest;
mod error;
pub mod keyless;
pub mod keys;
pub mod layout;
mod mirror;
pub mod oci;
pub mod policy;
mod reference;
pub mod signature;
pub mod verify;

pub use cache::Cache;
pub use client::{Client, ClientOptions, DEFAULT_MAX_BLOB_BYTES, NoProgress, Progress};
pub use digest::Digest;
pub use error::Error;
pub use mirror::Mirrors;
pub use reference::{Reference, Scope, Source};
