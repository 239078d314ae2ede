//! The cluster an Addon's objects go to ([`Target`]: this one, or a
//! workload cluster from a kubeconfig Secret with inline credentials only),
//! and the object-level writes there: discovery, read, apply when drifted,
//! delete by uid.

use super::{APPLIED, CONTROLLER, Context, Failure, fail};
use crate::Object;
use crate::identity::Actor;
use crate::ownership;
use capstan_api::{Addon, InventoryEntry};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};

/// A cluster objects are applied to.
#[derive(Clone)]
pub(super) struct Target {
    /// Capstan's own client there: discovery.
    pub(super) client: Client,
    /// The client the Addon's objects are read, watched, written and
    /// deleted with: `client`, or the same impersonating the Addon's
    /// ServiceAccount.
    pub(super) writer: Client,
    /// Whose rights `writer` has.
    pub(super) actor: Actor,
    /// Identifies the cluster and credentials (watches and discovery are
    /// kept per key).
    pub(super) key: String,
    /// For status: `in-cluster` or the Secret's name.
    pub(super) shown: String,
}

/// This cluster, or the workload cluster of the Addon's kubeconfig Secret,
/// written to as `actor`.
pub(super) async fn target(addon: &Addon, ctx: &Context, actor: &Actor) -> Result<Target, Failure> {
    let Some(t) = &addon.spec.target else {
        let client = ctx.kube.client.clone();
        let writer = match actor.user() {
            None => client.clone(),
            Some(user) => impersonated(ctx, &client, &user)?,
        };
        return Ok(Target {
            client,
            writer,
            actor: actor.clone(),
            key: "in-cluster".into(),
            shown: "in-cluster".into(),
        });
    };
    if *actor != Actor::Capstan {
        // The ServiceAccount lives in this cluster; a workload cluster's
        // kubeconfig carries its own identity.
        return Err(fail(
            APPLIED,
            "InvalidSpec",
            "spec.serviceAccountName applies to the cluster Capstan runs in; with spec.target the kubeconfig's own credentials apply: unset one of them",
        ));
    }
    let ns = addon.namespace().unwrap_or_default();
    let secret_ref = &t
        .secret_ref(|cluster| {
            ctx.kube
                .stores
                .clusters
                .get(&kube::runtime::reflector::ObjectRef::new(cluster).within(&ns))
                .map(|c| c.kubeconfig_secret())
        })
        .map_err(|m| fail(APPLIED, "InvalidSpec", m))?;
    let key_name = secret_ref.key.as_deref().unwrap_or("value");
    let unavailable = |m: String| fail(APPLIED, "TargetUnavailable", m);
    if let Some(own) = &ctx.kube.secrets_namespace
        && *own != ns
    {
        return Err(unavailable(format!(
            "spec.target: Capstan reads Secrets only from its own namespace {own:?}; create this Addon and its kubeconfig Secret there"
        )));
    }
    let secret = Api::<Secret>::namespaced(ctx.kube.client.clone(), &ns)
        .get_opt(&secret_ref.name)
        .await
        .map_err(|e| unavailable(format!("cannot read Secret {ns}/{}: {e}", secret_ref.name)))?
        .ok_or_else(|| {
            unavailable(format!(
                "spec.target.kubeconfigSecretRef: Secret {ns}/{} does not exist",
                secret_ref.name
            ))
        })?;
    let version = secret.metadata.resource_version.clone().unwrap_or_default();
    let key = format!("{ns}/{}", secret_ref.name);
    let shown = format!("kubeconfig Secret {}", secret_ref.name);
    if let Some((v, client)) = ctx.state.clients.lock().expect("clients lock").get(&key)
        && *v == version
    {
        return Ok(Target {
            client: client.clone(),
            writer: client.clone(),
            actor: Actor::Capstan,
            key: format!("{key}@{version}"),
            shown,
        });
    }
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key_name))
        .ok_or_else(|| {
            unavailable(format!(
                "spec.target.kubeconfigSecretRef: Secret {ns}/{} has no key {key_name:?}",
                secret_ref.name
            ))
        })?;
    let text = String::from_utf8_lossy(&bytes.0);
    let bad = |e: String| {
        unavailable(format!(
            "Secret {ns}/{} key {key_name:?} is not a usable kubeconfig: {e}",
            secret_ref.name
        ))
    };
    // Before the loader sees it: no command runs, no file is read.
    crate::target::check_kubeconfig(&text).map_err(bad)?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| bad(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    // Behind the leader's fence like the controllers' own client: a
    // replica that lost the Lease writes nothing to a workload cluster.
    let client = capstan_kit::leader::fenced_client(config, ctx.kube.fence.as_ref(), None)
        .map_err(|e| bad(e.to_string()))?;
    ctx.state
        .clients
        .lock()
        .expect("clients lock")
        .insert(key.clone(), (version.clone(), client.clone()));
    Ok(Target {
        writer: client.clone(),
        client,
        actor: Actor::Capstan,
        key: format!("{key}@{version}"),
        shown,
    })
}

/// `base` acting as `user`, made once per user and kept.
pub(super) fn impersonated(ctx: &Context, base: &Client, user: &str) -> Result<Client, Failure> {
    let key = format!("as {user}");
    let mut clients = ctx.state.clients.lock().expect("clients lock");
    if let Some((_, client)) = clients.get(&key) {
        return Ok(client.clone());
    }
    let client = capstan_kit::impersonate::impersonating(base, user)
        .map_err(|e| fail(APPLIED, "ServiceAccountRequired", e.to_string()))?;
    clients.insert(key, (String::new(), client.clone()));
    Ok(client)
}

/// Why discovery found no API resource for a kind.
#[derive(Debug)]
pub(super) enum KindError {
    /// The cluster answered: it does not serve the kind (its group or
    /// version is gone, or the kind is not in it).
    NotServed(String),
    /// Discovery itself failed (a connection, a timeout, a 5xx): nothing is
    /// known about the kind.
    Failed(String),
}

impl std::fmt::Display for KindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KindError::NotServed(m) | KindError::Failed(m) => f.write_str(m),
        }
    }
}

/// The API resource of a kind in a target cluster and whether it is
/// namespaced (discovery, remembered per cluster).
pub(super) async fn kind_of(
    ctx: &Context,
    target: &Target,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, bool), KindError> {
    let cache_key = (target.key.clone(), format!("{api_version}/{kind}"));
    if let Some(found) = ctx.state.kinds.lock().expect("kinds lock").get(&cache_key) {
        return Ok(found.clone());
    }
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(&target.client, &gvk)
        .await
        .map_err(|e| {
            let not_served = matches!(&e, kube::Error::Api(s) if s.code == 404)
                || matches!(&e, kube::Error::Discovery(_));
            if not_served {
                KindError::NotServed(format!(
                    "{target} does not serve {kind} {api_version}: {e}",
                    target = target.shown
                ))
            } else {
                KindError::Failed(format!(
                    "cannot discover {kind} {api_version} on {target}: {e}",
                    target = target.shown
                ))
            }
        })?;
    let found = (resource, caps.scope == kube::discovery::Scope::Namespaced);
    ctx.state
        .kinds
        .lock()
        .expect("kinds lock")
        .insert(cache_key, found.clone());
    Ok(found)
}

pub(super) fn api_for(
    target: &Target,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(target.writer.clone(), ns, resource),
        None => Api::all_with(target.writer.clone(), resource),
    }
}

pub(super) fn apply_failed(
    target: &Target,
    object: &Object,
    what: &str,
    e: kube::Error,
) -> Failure {
    let (reason, message) = denied(target, &format!("{what} {}", object.entry()), &e)
        .unwrap_or_else(|| {
            (
                "ApplyFailed",
                format!("cannot {what} {} ({}): {e}", object.entry(), target.shown),
            )
        });
    fail(APPLIED, reason, message)
}

/// A 403 for an Addon applied as a ServiceAccount, explained: either
/// Capstan may not act as it (`ImpersonationForbidden`), or it may not do
/// `what` (`Forbidden`). `None` for any other error or identity.
pub(super) fn denied(
    target: &Target,
    what: &str,
    e: &kube::Error,
) -> Option<(&'static str, String)> {
    let kube::Error::Api(status) = e else {
        return None;
    };
    let Actor::ServiceAccount { namespace, name } = &target.actor else {
        return None;
    };
    if status.code != 403 {
        return None;
    }
    Some(if status.message.contains("cannot impersonate") {
        // The API server names Capstan's own user; a binding needs it.
        let capstan = status
            .message
            .split("User \"system:serviceaccount:")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("CAPSTAN_NAMESPACE:capstan-controller");
        (
            "ImpersonationForbidden",
            format!(
                "Capstan may not act as ServiceAccount {namespace}/{name}: the API server said: {}. \
                 Let it act as ServiceAccounts of {namespace} (what `capstan install --tenant-namespace {namespace}` adds): \
                 kubectl -n {namespace} create rolebinding {TENANT_BINDING} \
                 --clusterrole={TENANT_ROLE} --serviceaccount={capstan}",
                status.message
            ),
        )
    } else {
        (
            "Forbidden",
            format!(
                "ServiceAccount {namespace}/{name} may not {what}: the API server said: {}. \
                 The Addon's objects are written with that ServiceAccount's rights: bind it a Role \
                 that allows this, or render only what it may write",
                status.message
            ),
        )
    })
}

/// The ClusterRole `capstan install` makes for acting as tenants'
/// ServiceAccounts; a RoleBinding in a tenant namespace lets Capstan do so
/// there only.
pub const TENANT_ROLE: &str = "capstan-controller-tenants";
/// The name of that RoleBinding in each tenant namespace.
pub const TENANT_BINDING: &str = "capstan-controller-tenant";

/// The live object a rendered one would be applied over, if it exists.
pub(super) async fn read_live(
    target: &Target,
    resource: &ApiResource,
    object: &Object,
) -> Result<Option<serde_json::Value>, Failure> {
    Ok(api_for(target, resource, object.namespace.as_deref())
        .get_opt(&object.name)
        .await
        .map_err(|e| apply_failed(target, object, "read", e))?
        .map(|o| serde_json::to_value(o).unwrap_or_default()))
}

/// Create an object the ownership check found missing, with a create
/// request: of two Addons that both found it missing only one succeeds,
/// and the other is refused as `ObjectExists` (a forced apply would let
/// both record it as theirs). Returns the live object.
pub(super) async fn create(
    ctx: &Context,
    target: &Target,
    resource: &ApiResource,
    object: &Object,
    manager: &str,
) -> Result<serde_json::Value, Failure> {
    let api = api_for(target, resource, object.namespace.as_deref());
    let dynamic: DynamicObject = serde_json::from_value(object.value.clone())
        .map_err(|e| fail(APPLIED, "InvalidRender", format!("{}: {e}", object.entry())))?;
    let params = PostParams {
        field_manager: Some(manager.to_string()),
        ..Default::default()
    };
    match api.create(&params, &dynamic).await {
        Ok(created) => {
            ctx.kube.metrics.wrote(CONTROLLER, "create");
            tracing::info!(object = %object.entry(), target = %target.shown, "created addon object");
            Ok(serde_json::to_value(created).unwrap_or_default())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Err(fail(
            APPLIED,
            "ObjectExists",
            format!(
                "refused the whole render: {} was created by someone else while this Addon was creating it; Capstan never takes over an object it did not create",
                object.entry()
            ),
        )),
        Err(e) => Err(apply_failed(target, object, "create", e)),
    }
}

/// Server-side apply the rendered object (under this Addon's own field
/// manager) only when the live one is missing or no longer carries it.
/// Returns the live object.
pub(super) async fn apply_if_drifted(
    ctx: &Context,
    target: &Target,
    resource: &ApiResource,
    object: &Object,
    live: Option<serde_json::Value>,
    manager: &str,
    key: (String, String),
) -> Result<serde_json::Value, Failure> {
    let api = api_for(target, resource, object.namespace.as_deref());
    // Fields another manager took over (an HPA, `kubectl scale`) are left
    // to it: neither drift nor applied.
    let yielded = live
        .as_ref()
        .map(|l| crate::taken_over(&object.value, l, manager))
        .unwrap_or_default();
    let calm;
    let object = if yielded.is_empty() {
        object
    } else {
        tracing::debug!(object = %object.entry(), fields = ?yielded, "leaving fields another manager took over");
        calm = Object {
            value: crate::without(&object.value, &yielded),
            ..object.clone()
        };
        &calm
    };
    if let Some(live) = &live {
        let expected = ctx
            .state
            .expected
            .lock()
            .expect("expected lock")
            .get(&key)
            .cloned();
        let desired = match &expected {
            Some((rendered, applied)) if *rendered == object.value => applied,
            _ => &object.value,
        };
        if crate::conforms(desired, live) {
            return Ok(live.clone());
        }
    }
    // Forced only over fields of an object this Addon owns (the ownership
    // check ran first): hand edits of what it renders are put back.
    let applied = api
        .patch(
            &object.name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&object.value),
        )
        .await
        .map_err(|e| apply_failed(target, object, "apply", e))?;
    let applied = serde_json::to_value(applied).unwrap_or_default();
    ctx.state.expected.lock().expect("expected lock").insert(
        key,
        (
            object.value.clone(),
            crate::project(&object.value, &applied),
        ),
    );
    ctx.kube.metrics.wrote(CONTROLLER, "apply");
    tracing::info!(object = %object.entry(), target = %target.shown, created = live.is_none(), "applied addon object");
    Ok(applied)
}

/// Delete one inventory object if it is still there and still ours.
/// `grants`: the Plugin's, when it is registered (an entry outside them is
/// left alone); without them the object's own proof ([`ownership::may_delete`])
/// still decides.
pub(super) async fn delete_entry(
    ctx: &Context,
    target: &Target,
    entry: &InventoryEntry,
    addon: &Addon,
    grants: Option<&crate::AddonGrants>,
) -> Result<Deleted, String> {
    let ns = addon.namespace().unwrap_or_default();
    let tenant = super::is_tenant(ctx, addon).then_some(ns.as_str());
    if let Some(grants) = grants
        && !crate::still_granted(entry, grants, tenant)
    {
        tracing::warn!(object = %entry, addon = %capstan_kit::key_of(addon), "leaving an inventory object outside the Plugin's current grants");
        return Ok(Deleted::Gone);
    }
    let (resource, _) = match kind_of(ctx, target, &entry.api_version, &entry.kind).await {
        Ok(k) => k,
        // The kind itself is gone (its CRD was removed): so is the object.
        Err(KindError::NotServed(_)) => return Ok(Deleted::Gone),
        // Nothing is known: the entry stays, and the next pass tries again.
        Err(KindError::Failed(m)) => return Err(m),
    };
    let api = api_for(target, &resource, entry.namespace.as_deref());
    let live = api.get_opt(&entry.name).await.map_err(|e| {
        match denied(target, &format!("read {entry}"), &e) {
            Some((_, m)) => m,
            None => format!("cannot read {entry}: {e}"),
        }
    })?;
    let Some(live) = live else {
        return Ok(Deleted::Gone);
    };
    let value = serde_json::to_value(&live).unwrap_or_default();
    let (name, manager) = (addon.name_any(), super::field_manager(addon));
    let me = ownership::Me {
        addon: (&ns, &name),
        manager: &manager,
    };
    if !ownership::may_delete(entry, &value, me) {
        tracing::info!(object = %entry, adopted = entry.adopted, "leaving an inventory object this Addon did not create (or that was replaced)");
        return Ok(Deleted::Gone);
    }
    if live.metadata.deletion_timestamp.is_some() {
        return Ok(Deleted::Going);
    }
    // Only the very object recorded: a uid precondition, so an object
    // recreated under the same name in between is left alone.
    let mut params = DeleteParams::background();
    if let Some(uid) = &entry.uid {
        params = params.preconditions(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        });
    }
    match api.delete(&entry.name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(Deleted::Gone),
        Err(e) => {
            return Err(match denied(target, &format!("delete {entry}"), &e) {
                Some((_, m)) => m,
                None => format!("cannot delete {entry}: {e}"),
            });
        }
    }
    ctx.kube.metrics.wrote(CONTROLLER, "delete");
    tracing::info!(object = %entry, target = %target.shown, "deleted addon object");
    Ok(Deleted::Going)
}

/// Where an inventory object is after [`delete_entry`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Deleted {
    Gone,
    Going,
}
