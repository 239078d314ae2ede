//! A machine's bootstrap token: minted once (its id derived from the
//! Machine's uid, so every pass and every replica finds it by name), renewed
//! while the Node has not joined, deleted once it has or with the Machine.
//! The decisions are `capstan_planner::bootstrap::token_action`'s.

use super::{Bootstrap, BootstrapData, Context, failed, kube_retry, retry};
use super::{LABEL_TOKEN_MACHINE_UID, TOKEN_NAMESPACE, TOKEN_SECRET_TYPE};
use capstan_api::{Machine, MachineInitialization, MachineStatus};
use capstan_kit::Kube;
use capstan_planner::bootstrap::{self as plan, TokenAction};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The token id for a Machine: 6 characters of `[a-z0-9]` from its uid, so
/// every pass (and every host) finds the same token Secret.
pub(crate) fn token_id(uid: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    Sha256::digest(format!("capstan-bootstrap-token:{uid}"))
        .iter()
        .take(6)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

fn token_secret_name(uid: &str) -> String {
    format!("bootstrap-token-{}", token_id(uid))
}

/// 16 random characters of `[a-z0-9]`: the token's secret half.
fn token_secret_part() -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..16)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

fn expiry_in(ttl: std::time::Duration) -> String {
    let at = k8s_openapi::jiff::Timestamp::now().as_second() + ttl.as_secs() as i64;
    k8s_openapi::jiff::Timestamp::from_second(at)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The machine's token (`<id>.<secret>`), minted if it has none; records its
/// expiry in `draft`.
pub(super) async fn ensure_token(
    ctx: &Context,
    nodes: &Kube,
    machine: &Machine,
    draft: &mut MachineStatus,
) -> Result<String, (Bootstrap, Option<BootstrapData>)> {
    let uid = machine.uid().unwrap_or_default();
    let name = token_secret_name(&uid);
    let tokens: Api<Secret> = Api::namespaced(nodes.client.clone(), TOKEN_NAMESPACE);
    let field = |secret: &Secret, key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let existing = tokens
        .get_opt(&name)
        .await
        .map_err(|e| kube_retry(&format!("reading {TOKEN_NAMESPACE}/{name}"), &e))?;
    if let Some(secret) = existing {
        if secret.labels().get(LABEL_TOKEN_MACHINE_UID) != Some(&uid) {
            return Err(failed(
                "BootstrapTokenConflict",
                format!(
                    "{TOKEN_NAMESPACE}/{name} exists and was not minted for this Machine; delete it if it is stale"
                ),
            ));
        }
        let (Some(id), Some(part)) = (field(&secret, "token-id"), field(&secret, "token-secret"))
        else {
            return Err(failed(
                "BootstrapTokenConflict",
                format!("{TOKEN_NAMESPACE}/{name} has no token-id or token-secret"),
            ));
        };
        draft
            .initialization
            .get_or_insert_with(MachineInitialization::default)
            .bootstrap_token_expires = field(&secret, "expiration");
        return Ok(format!("{id}.{part}"));
    }
    let id = token_id(&uid);
    let part = token_secret_part();
    let expiration = expiry_in(ctx.bootstrap_token.ttl);
    let machine_key = format!(
        "{}/{}",
        machine.namespace().unwrap_or_default(),
        machine.name_any()
    );
    let mut data = BTreeMap::from([
        ("token-id".to_string(), id.clone()),
        ("token-secret".to_string(), part.clone()),
        ("expiration".to_string(), expiration.clone()),
        ("usage-bootstrap-authentication".to_string(), "true".into()),
        ("usage-bootstrap-signing".to_string(), "true".into()),
        (
            "description".to_string(),
            format!("Capstan: bootstrap token of Machine {machine_key}"),
        ),
    ]);
    if !ctx.bootstrap_token.extra_groups.is_empty() {
        data.insert(
            "auth-extra-groups".into(),
            ctx.bootstrap_token.extra_groups.join(","),
        );
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                LABEL_TOKEN_MACHINE_UID.to_string(),
                uid.clone(),
            )])),
            annotations: Some(BTreeMap::from([(
                "capstan.dev/machine".to_string(),
                machine_key,
            )])),
            ..Default::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.into()),
        string_data: Some(data),
        ..Default::default()
    };
    match tokens.create(&PostParams::default(), &secret).await {
        Ok(_) => nodes.metrics.wrote("machine", "bootstrap_token"),
        // Minted by a pass racing this one: use it on the next pass.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Err(retry(
                "BootstrapRetrying",
                format!("{TOKEN_NAMESPACE}/{name} was just created; reading it again"),
                500,
            ));
        }
        Err(e) => {
            return Err(kube_retry(
                &format!("creating {TOKEN_NAMESPACE}/{name}"),
                &e,
            ));
        }
    }
    draft
        .initialization
        .get_or_insert_with(MachineInitialization::default)
        .bootstrap_token_expires = Some(expiration);
    Ok(format!("{id}.{part}"))
}

/// Renew the machine's token while its Node has not joined; delete it once
/// it has. Only for machines whose status says they hold one.
pub(in crate::machine) async fn tend_token(
    ctx: &Context,
    nodes: &Kube,
    machine: &Machine,
    joined: bool,
    draft: &mut MachineStatus,
) {
    let Some(expires) = draft
        .initialization
        .as_ref()
        .and_then(|i| i.bootstrap_token_expires.clone())
    else {
        return;
    };
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let expires_in = expires
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second() - now)
        .unwrap_or(0);
    let ttl = ctx.bootstrap_token.ttl.as_secs() as i64;
    let uid = machine.uid().unwrap_or_default();
    let name = token_secret_name(&uid);
    let tokens: Api<Secret> = Api::namespaced(nodes.client.clone(), TOKEN_NAMESPACE);
    let init = draft
        .initialization
        .get_or_insert_with(MachineInitialization::default);
    match plan::token_action(joined, expires_in, ttl) {
        TokenAction::Keep => {}
        TokenAction::Delete => match delete_token(&tokens, &name, &uid).await {
            Ok(()) => {
                nodes.metrics.wrote("machine", "bootstrap_token_delete");
                init.bootstrap_token_expires = None
            }
            Err(error) => {
                tracing::warn!(machine = %capstan_kit::key_of(machine), %error, "bootstrap token not deleted");
            }
        },
        TokenAction::Renew => {
            let expiration = expiry_in(ctx.bootstrap_token.ttl);
            let patch = serde_json::json!({"stringData": {"expiration": expiration}});
            match tokens
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    nodes.metrics.wrote("machine", "bootstrap_token_renew");
                    init.bootstrap_token_expires = Some(expiration)
                }
                // Gone (the token cleaner, or by hand): nothing to renew.
                Err(kube::Error::Api(s)) if s.code == 404 => init.bootstrap_token_expires = None,
                Err(error) => {
                    tracing::warn!(machine = %capstan_kit::key_of(machine), %error, "bootstrap token not renewed");
                }
            }
        }
    }
}

/// Delete the machine's token, if it has one and it is its own.
async fn delete_token(tokens: &Api<Secret>, name: &str, uid: &str) -> Result<(), kube::Error> {
    let Some(secret) = tokens.get_opt(name).await? else {
        return Ok(());
    };
    if secret
        .labels()
        .get(LABEL_TOKEN_MACHINE_UID)
        .map(String::as_str)
        != Some(uid)
    {
        return Ok(());
    }
    match tokens.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Delete the token of a Machine that is going away, joined or not.
pub(in crate::machine) async fn release_token(
    nodes: &Kube,
    machine: &Machine,
) -> Result<(), kube::Error> {
    if machine
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.plugin.as_ref())
        .is_none()
    {
        return Ok(());
    }
    let uid = machine.uid().unwrap_or_default();
    let tokens: Api<Secret> = Api::namespaced(nodes.client.clone(), TOKEN_NAMESPACE);
    delete_token(&tokens, &token_secret_name(&uid), &uid).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_are_kubeadm_shaped_and_stable() {
        let id = token_id("0b3c1c9e-0000-4000-8000-000000000001");
        assert_eq!(id.len(), 6);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_eq!(id, token_id("0b3c1c9e-0000-4000-8000-000000000001"));
        assert_ne!(id, token_id("0b3c1c9e-0000-4000-8000-000000000002"));
        let part = token_secret_part();
        assert_eq!(part.len(), 16);
        assert!(
            part.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
    }
}
