//! Finding a Plugin's revision and checking who signed it: a local file
//! (read only under a trust rule or an allowed unsigned directory) or an
//! OCI artifact (resolved, verified under every policy that applies, then
//! its component downloaded, digest-checked and cached).

use super::{Context, Failure, Revision, Supply, blocking};
use capstan_api::Plugin;
use capstan_registry::keyless::{IdentityRule, Subject};
use capstan_registry::keys::PublicKey;
use capstan_registry::policy::TrustPolicy;
use capstan_registry::{Reference, Source};
use capstan_runtime::PluginManifest;
use std::sync::Arc;

/// A revision found at the source, before it is activated.
pub(super) struct Found {
    pub(super) revision: Revision,
    pub(super) manifest: PluginManifest,
    pub(super) origin: Origin,
}

/// Where a found revision comes from.
pub(super) enum Origin {
    /// A local component, read whole, and the policies its signatures must
    /// meet (`None`: a directory the host allows unsigned).
    File {
        source: Source,
        path: String,
        bytes: Vec<u8>,
        policies: Option<Vec<TrustPolicy>>,
    },
    /// An OCI artifact, resolved; its component is downloaded only after
    /// grants and signatures check out.
    Oci {
        reference: Reference,
        described: Box<capstan_registry::artifact::Described>,
    },
}

pub(super) async fn find(plugin: &Plugin, ctx: &Context) -> Result<Found, Failure> {
    let source = &plugin.spec.source;
    let parsed =
        Source::parse(source).map_err(|e| ("InvalidSource", format!("spec.source: {e}")))?;
    if let Source::File(_) = parsed {
        // Decided before the file is read: an untrusted path never is.
        let policies = file_policies(plugin, ctx, &parsed)?;
        let path = source.strip_prefix("file://").unwrap_or(source).to_string();
        let read_path = path.clone();
        let bytes = blocking(move || {
            let path = read_path;
            let read = capstan_registry::verify::read_bounded(
                std::path::Path::new(&path),
                capstan_registry::DEFAULT_MAX_BLOB_BYTES,
            );
            read.map_err(|e| ("SourceUnreadable", format!("cannot read {path}: {e}")))
        })
        .await??;
        let manifest = PluginManifest::from_component(&bytes)
            .map_err(|e| ("LoadFailed", format!("{source}: {e}")))?;
        return Ok(Found {
            revision: capstan_runtime::digest(&bytes),
            manifest,
            origin: Origin::File {
                source: parsed,
                path,
                bytes,
                policies,
            },
        });
    }
    let Source::Oci(reference) = parsed else {
        unreachable!("a source is a file or an OCI reference")
    };
    let supply = supply(ctx)?;
    let r = reference.clone();
    let described = blocking(move || supply.puller.describe(&r)).await?;
    let described = match described {
        Ok(d) => {
            ctx.kube.metrics.artifact_step("resolve", "ok");
            d
        }
        Err(e) => {
            ctx.kube.metrics.artifact_step("resolve", "failed");
            return Err(("ResolveFailed", e.to_string()));
        }
    };
    Ok(Found {
        revision: described.digest.to_string(),
        manifest: described.plugin.clone(),
        origin: Origin::Oci {
            reference,
            described: Box::new(described),
        },
    })
}

pub(super) fn supply(ctx: &Context) -> Result<Arc<Supply>, Failure> {
    ctx.supply.clone().ok_or_else(|| {
        (
            "UnsupportedSource",
            "this host has no registry configuration for oci:// sources".to_string(),
        )
    })
}

/// The policies a source must satisfy: the host policy's rule for it
/// (required: the host's policy is the floor) and, if the Plugin has one,
/// its own `verification`, which can only add to that rule.
pub(super) fn policies(
    plugin: &Plugin,
    host: Option<&TrustPolicy>,
    source: &Source,
) -> Result<Vec<TrustPolicy>, Failure> {
    let Some(host) = host.filter(|h| h.rule_for(source).is_some()) else {
        return Err((
            "NoTrustPolicy",
            format!(
                "{} is not covered by any rule of the host's trust policy (--trust-policy); a Plugin's spec.verification can only add to a host rule, so ask the cluster admin for a sources entry covering it",
                plugin.spec.source
            ),
        ));
    };
    let mut policies = vec![host.clone()];
    if let Some(v) = &plugin.spec.verification {
        let mut keys = Vec::new();
        for (i, k) in v.public_keys.iter().enumerate() {
            let key = PublicKey::from_pem(
                &format!("spec.verification.publicKeys[{i}] ({:?})", k.name),
                &k.public_key,
            )
            .map_err(|e| ("InvalidVerification", e.to_string()))?;
            keys.push((k.name.clone(), key));
        }
        let identities = spec_identities(&v.identities, host)?;
        let policy = TrustPolicy::single_with(keys, identities, v.all_of.clone(), v.any_of.clone())
            .map_err(|e| ("InvalidVerification", format!("spec.{e}")))?;
        policies.push(policy);
    }
    Ok(policies)
}

/// A Plugin's keyless identities, under the host policy's trusted root: a
/// Plugin may ask for more signers, never bring the root they chain to.
fn spec_identities(
    identities: &[capstan_api::NamedIdentity],
    host: &TrustPolicy,
) -> Result<Vec<(String, IdentityRule)>, Failure> {
    if identities.is_empty() {
        return Ok(Vec::new());
    }
    let root = match host.trusted_roots().as_slice() {
        [root] => (*root).clone(),
        [] => {
            return Err((
                "InvalidVerification",
                "spec.verification.identities needs the host's Sigstore trusted root, and the host's trust policy names none; ask the cluster admin to add an identities entry with trustedRoot to it".into(),
            ));
        }
        roots => {
            return Err((
                "InvalidVerification",
                format!(
                    "spec.verification.identities are verified against the host's trusted root, and the host's trust policy names {} of them; name the identity in the host's policy instead",
                    roots.len()
                ),
            ));
        }
    };
    identities
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let field = format!("spec.verification.identities[{i}] ({:?})", id.name);
            Subject::from_fields(id.subject.as_deref(), id.subject_reg_exp.as_deref())
                .and_then(|subject| IdentityRule::new(&id.issuer, subject, root.clone()))
                .map(|rule| (id.name.clone(), rule))
                .map_err(|e| ("InvalidVerification", format!("{field}: {e}")))
        })
        .collect()
}

/// What a `file://` source must satisfy: `None` when it is in a directory
/// the host allows unsigned, else the policies its signatures must meet
/// (checked before the file is read, so an untrusted path is never read).
pub(super) fn file_policies(
    plugin: &Plugin,
    ctx: &Context,
    source: &Source,
) -> Result<Option<Vec<TrustPolicy>>, Failure> {
    if ctx.unsigned_plugin_dirs.iter().any(|d| d.covers(source)) {
        return Ok(None);
    }
    let host = ctx.supply.as_ref().and_then(|s| s.policy.as_ref());
    policies(plugin, host, source).map(Some).map_err(|(reason, message)| {
        (reason, format!("{message}, or sign it and add a file:///DIR/ rule (or, for development only, start the host with --allow-unsigned-dir DIR)"))
    })
}

/// Who signed a `file://` plugin, under each policy it must meet
/// ([`file_policies`], decided before it was read).
pub(super) async fn check_file(
    ctx: &Context,
    source: Source,
    path: String,
    bytes: &Arc<Vec<u8>>,
    policies: Option<Vec<TrustPolicy>>,
) -> Result<Vec<String>, Failure> {
    let Some(policies) = policies else {
        return Ok(vec![
            "nobody: unsigned, in a directory allowed by --allow-unsigned-dir".into(),
        ]);
    };
    let mut signers = Vec::new();
    for policy in policies {
        let (source, path, bytes) = (source.clone(), path.clone(), bytes.clone());
        let verified = blocking(move || {
            capstan_registry::verify::verify_file(
                &policy,
                &source,
                std::path::Path::new(&path),
                &bytes,
            )
        })
        .await?;
        match verified {
            Ok(found) => {
                ctx.kube.metrics.artifact_step("verify", "ok");
                add_signers(&mut signers, found);
            }
            Err(e) => {
                ctx.kube.metrics.artifact_step("verify", "failed");
                return Err(("VerificationFailed", e.to_string()));
            }
        }
    }
    Ok(signers)
}

/// Record `found` as `name (key id)` lines, each once.
pub(super) fn add_signers(signers: &mut Vec<String>, found: Vec<capstan_registry::policy::Signer>) {
    for s in found {
        let line = format!("{} ({})", s.name, s.key_id);
        if !signers.contains(&line) {
            signers.push(line);
        }
    }
}

/// A revision's component, verified, and where it came from.
pub(super) struct Fetched {
    pub(super) bytes: Vec<u8>,
    pub(super) resolved_source: Option<String>,
    pub(super) fetched_from: Option<String>,
    pub(super) signers: Vec<String>,
}

/// The revision's component, its signatures checked under every policy
/// that applies (a file's before it is used, an artifact's before its
/// component is downloaded).
pub(super) async fn fetch_verified(
    ctx: &Context,
    plugin: &Plugin,
    origin: Origin,
) -> Result<Fetched, Failure> {
    match origin {
        Origin::File {
            source,
            path,
            bytes,
            policies,
        } => {
            let bytes = Arc::new(bytes);
            let signers = check_file(ctx, source, path, &bytes, policies).await?;
            Ok(Fetched {
                bytes: Arc::try_unwrap(bytes).unwrap_or_else(|shared| (*shared).clone()),
                resolved_source: None,
                fetched_from: None,
                signers,
            })
        }
        Origin::Oci {
            reference,
            described,
        } => fetch_oci(ctx, plugin, reference, *described).await,
    }
}

/// An `oci://` revision: verified under each policy, then its component
/// downloaded (digest-checked, cached).
pub(super) async fn fetch_oci(
    ctx: &Context,
    plugin: &Plugin,
    reference: Reference,
    described: capstan_registry::artifact::Described,
) -> Result<Fetched, Failure> {
    let metrics = &ctx.kube.metrics;
    let supply = supply(ctx)?;
    let source = Source::Oci(reference.clone());
    let mut signers = Vec::new();
    for policy in policies(plugin, supply.policy.as_ref(), &source)? {
        let (s, r, d) = (supply.clone(), reference.clone(), described.clone());
        match blocking(move || s.puller.verify(&r, &d, &policy, &[])).await? {
            Ok(v) => {
                metrics.artifact_step("verify", if v.cached { "cached" } else { "ok" });
                add_signers(&mut signers, v.signers);
            }
            Err(e) => {
                metrics.artifact_step("verify", "failed");
                return Err(("VerificationFailed", e.to_string()));
            }
        }
    }
    let resolved_source = Some(reference.pinned(&described.digest).to_string());
    let fetched_from = (described.reference.registry != reference.registry
        || described.reference.repository != reference.repository)
        .then(|| described.reference.to_string());
    let s = supply.clone();
    let fetched = blocking(move || {
        capstan_registry::artifact::fetch_component(
            &s.puller.client,
            s.puller.cache.as_ref(),
            &described,
            &capstan_registry::NoProgress,
        )
    })
    .await?;
    match fetched {
        Ok((bytes, cached)) => {
            metrics.artifact_step("fetch", if cached { "cached" } else { "ok" });
            Ok(Fetched {
                bytes,
                resolved_source,
                fetched_from,
                signers,
            })
        }
        Err(e) => {
            metrics.artifact_step("fetch", "failed");
            Err(("PullFailed", e.to_string()))
        }
    }
}
