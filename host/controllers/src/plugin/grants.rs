//! What a Plugin is granted, read on every reconcile: its grants with the
//! credential Secrets they name (only from Capstan's own namespace), a
//! fingerprint of both so a narrowed grant or a rotated key reloads it,
//! the update fields it may claim (never another updater's), and revoking
//! what may no longer serve.

use super::{Context, Failure, READY};
use capstan_api::{CredentialType, Plugin};
use capstan_kit::kube_err;
use capstan_runtime::{Credential, Grants, PluginManifest};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

/// The fields an updater may change: what its manifest declares, as far as
/// the Plugin's `spec.grants.updateFields` covers it.
pub(super) fn granted_update_fields(
    plugin: &Plugin,
    manifest: &PluginManifest,
) -> Result<Vec<capstan_manifest::FieldPattern>, Failure> {
    let granted = plugin
        .spec
        .grants
        .update_fields
        .iter()
        .enumerate()
        .map(|(i, text)| {
            text.parse().map_err(|e| {
                (
                    "InvalidGrant",
                    format!("spec.grants.updateFields[{i}]: {e}"),
                )
            })
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok(capstan_manifest::granted_fields(
        &manifest.update_fields,
        &granted,
    ))
}

/// What a revision is registered under: the Plugin's grants and the
/// versions of the credential Secrets they name.
pub(super) fn grants_fingerprint(plugin: &Plugin, secret_versions: &str) -> String {
    format!(
        "{}|{secret_versions}",
        serde_json::to_string(&plugin.spec.grants).unwrap_or_default()
    )
}

/// The grants fingerprint the serving revision was registered under, if a
/// revision of this Plugin is serving.
pub(super) fn serving_fingerprint(ctx: &Context, name: &str) -> Option<String> {
    let registered = ctx
        .providers
        .get(name)
        .is_some_and(|r| r.generation.is_some())
        || ctx.updaters.get(name).is_some()
        || ctx.addons.get(name).is_some();
    let loaded = ctx.loaded.lock().expect("loaded lock").get(name).cloned();
    match loaded {
        Some((_, key)) if registered => key
            .split_once('|')
            .map(|(_, fingerprint)| fingerprint.to_string()),
        _ => None,
    }
}

/// Stop serving a Plugin's revision: it was registered with grants or
/// credentials it no longer has, and cannot be registered again with the
/// current ones.
pub(super) fn revoke(ctx: &Context, name: &str) {
    let was_serving = serving_fingerprint(ctx, name).is_some();
    ctx.providers.remove(name);
    ctx.updaters.remove(name);
    ctx.bootstraps.remove(name);
    ctx.addons.remove(name);
    ctx.loaded.lock().expect("loaded lock").remove(name);
    if was_serving {
        tracing::warn!(plugin = %name, "grants or credentials were revoked; the plugin stopped serving");
    }
}

/// The grants a Plugin's spec describes, with the credentials read from their
/// Secrets, and those Secrets' resource versions (what changes when a key is
/// rotated).
pub(super) async fn grants(plugin: &Plugin, ctx: &Context) -> Result<(Grants, String), Failure> {
    let mut grants = Grants::default();
    let mut versions = Vec::new();
    for (i, text) in plugin.spec.grants.http.iter().enumerate() {
        let pattern = text.parse().map_err(|e| {
            (
                "InvalidGrant",
                format!("spec.grants.http[{i}] {text:?}: {e}"),
            )
        })?;
        grants.http.push(pattern);
    }
    for (i, grant) in plugin.spec.grants.credentials.iter().enumerate() {
        if let Some(own) = &ctx.kube.secrets_namespace
            && grant.secret_ref.namespace != *own
        {
            return Err((
                "CredentialOutOfNamespace",
                format!(
                    "spec.grants.credentials[{i}]: Secret {}/{} is outside Capstan's namespace {own:?}; \
                     Capstan reads credential Secrets only from its own namespace: move the Secret there",
                    grant.secret_ref.namespace, grant.secret_ref.name
                ),
            ));
        }
        let secrets: Api<Secret> =
            Api::namespaced(ctx.kube.client.clone(), &grant.secret_ref.namespace);
        let secret = secrets
            .get_opt(&grant.secret_ref.name)
            .await
            .map_err(kube_err("cannot read a credential Secret"))
            .map_err(|e| ("CredentialUnavailable", e.to_string()))?
            .ok_or_else(|| {
                (
                    "CredentialMissing",
                    format!(
                        "spec.grants.credentials[{i}]: Secret {}/{} does not exist",
                        grant.secret_ref.namespace, grant.secret_ref.name
                    ),
                )
            })?;
        versions.push(format!(
            "{}/{}@{}",
            grant.secret_ref.namespace,
            grant.secret_ref.name,
            secret.metadata.resource_version.as_deref().unwrap_or("")
        ));
        let data = secret.data.unwrap_or_default();
        let value = |key: &str| {
            data.get(key)
                .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
                .ok_or_else(|| {
                    (
                        "CredentialMissing",
                        format!(
                            "spec.grants.credentials[{i}]: Secret {}/{} has no key {key:?}",
                            grant.secret_ref.namespace, grant.secret_ref.name
                        ),
                    )
                })
        };
        let credential = match grant.type_ {
            CredentialType::Bearer => {
                Credential::Bearer(value(grant.secret_ref.key.as_deref().unwrap_or("token"))?)
            }
            CredentialType::Basic => Credential::Basic {
                username: value("username")?,
                password: value("password")?,
            },
            CredentialType::AwsSigV4 => {
                let scope_part = |field: &Option<String>, name: &str, example: &str| {
                    field.clone().filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                        (
                            "InvalidGrant",
                            format!(
                                "spec.grants.credentials[{i}].{name}: required for type AwsSigV4 (for example {example:?})"
                            ),
                        )
                    })
                };
                Credential::AwsSigV4 {
                    credentials: capstan_runtime::AwsCredentials {
                        access_key_id: value("accessKeyId")?,
                        secret_access_key: value("secretAccessKey")?,
                        session_token: value("sessionToken").ok().filter(|t| !t.is_empty()),
                    },
                    scope: capstan_runtime::AwsScope {
                        region: scope_part(&grant.region, "region", "us-east-1")?,
                        service: scope_part(&grant.service, "service", "ec2")?,
                    },
                }
            }
        };
        let methods: Vec<String> = grant
            .methods
            .iter()
            .map(|m| m.trim().to_ascii_uppercase())
            .collect();
        if let Some(bad) = methods
            .iter()
            .find(|m| !capstan_runtime::CREDENTIAL_METHODS.contains(&m.as_str()))
        {
            return Err((
                "InvalidGrant",
                format!(
                    "spec.grants.credentials[{i}].methods: {bad:?} is not a method a credential may go with; use {}",
                    capstan_runtime::CREDENTIAL_METHODS.join(", ")
                ),
            ));
        }
        if !methods.is_empty() {
            grants
                .credential_methods
                .insert(grant.slot.clone(), methods);
        }
        grants.credentials.insert(grant.slot.clone(), credential);
    }
    Ok((grants, versions.join(",")))
}

/// Refuse an updater whose declared fields overlap those of another active
/// updater, unless both Plugins set different `spec.updateOrder`s. Active
/// means registered in this host or Ready in its status (so after a restart
/// the updater that was serving keeps its fields, whichever reconciles
/// first).
pub(super) fn check_field_ownership(
    plugin: &Plugin,
    fields: &[capstan_manifest::FieldPattern],
    ctx: &Context,
) -> Result<(), Failure> {
    let name = plugin.name_any();
    let mine = plugin.spec.update_order;
    let mut conflicts = vec![];
    for other in ctx.kube.stores.plugins.state() {
        let other_name = other.name_any();
        if other_name == name || other.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let registered = ctx.updaters.get(&other_name);
        let status = other.status.clone().unwrap_or_default();
        let ready_updater = status.world.as_deref() == Some("updater-plugin")
            && capstan_api::is_true(&status.conditions, READY);
        let fields_of_other: Vec<capstan_manifest::FieldPattern> =
            match (&registered, ready_updater) {
                (Some(r), _) => r.fields.clone(),
                (None, true) => status
                    .update_fields
                    .iter()
                    .filter_map(|f| f.parse().ok())
                    .collect(),
                (None, false) => continue,
            };
        let theirs = other.spec.update_order;
        if matches!((mine, theirs), (Some(a), Some(b)) if a != b) {
            continue;
        }
        let overlap = capstan_manifest::overlapping(fields, &fields_of_other);
        if !overlap.is_empty() {
            let pairs: Vec<String> = overlap
                .iter()
                .map(|(a, b)| {
                    if a == b {
                        a.clone()
                    } else {
                        format!("{a} / {b}")
                    }
                })
                .collect();
            conflicts.push(format!("{other_name} ({})", pairs.join(", ")));
        }
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    Err((
        "FieldsOverlap",
        format!(
            "updater {name} declares fields that active updaters also declare: {}; set spec.updateOrder on both Plugins (different values, lower is asked first) to compose them, or remove one",
            conflicts.join("; ")
        ),
    ))
}
