//! The Plugin controller: load each plugin's component into the sandbox with
//! the grants and limits its spec gives, register providers, and report the
//! digest, declared capabilities and a `Ready` condition (or the exact load
//! error).
//!
//! A plugin is reloaded only when its spec changes or the component's digest
//! does; a revision that fails to load leaves the previous one serving.

use crate::provider::{Registered, WasmProvider};
use crate::{
    Context, Error, apply_status, counted, drain, instrumented, key_of, kube_err, now, retry_soon,
};
use capstan_api::{CredentialType, Plugin, set_condition, status};
use capstan_runtime::{Credential, Grants, Limits, World};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::ReflectHandle;
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "plugin";
/// The condition type on a Plugin.
pub const READY: &str = "Ready";

pub(crate) async fn controller(
    plugins: ReflectHandle<Plugin>,
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let trigger = counted(CONTROLLER, &ctx.metrics, plugins, |p| Some(key_of(p)));
    let stream = Controller::for_shared_stream(trigger, ctx.stores.plugins.clone())
        .with_config(Config::default().concurrency(ctx.options.concurrency.plugins))
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx| instrumented(CONTROLLER, obj, ctx, reconcile),
            retry_soon,
            ctx.clone(),
        );
    drain(CONTROLLER, stream).await;
}

async fn reconcile(plugin: Arc<Plugin>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = plugin.name_any();
    let generation = plugin.metadata.generation.unwrap_or(0);
    let mut status = plugin.status.clone().unwrap_or_default();
    let current = plugin.status.clone();
    status.observed_generation = Some(generation);
    let outcome = load(&plugin, &ctx, &name, generation).await;
    let t = now();
    match outcome {
        Ok(Some(loaded)) => {
            status.digest = Some(loaded.digest);
            status.world = Some(loaded.world);
            status.version = Some(loaded.version);
            status.contract = Some(loaded.contract);
            status.declared_http = loaded.declared_http;
            set_condition(
                &mut status.conditions,
                READY,
                status::TRUE,
                "Loaded",
                loaded.message,
                Some(generation),
                &t,
            );
        }
        Ok(None) => {}
        Err((reason, message)) => {
            tracing::warn!(plugin = %name, reason, %message, "plugin not loaded");
            set_condition(
                &mut status.conditions,
                READY,
                status::FALSE,
                reason,
                message,
                Some(generation),
                &t,
            );
        }
    }
    apply_status(&ctx, CONTROLLER, plugin.as_ref(), current.as_ref(), &status).await?;
    let ready = capstan_api::is_true(&status.conditions, READY);
    Ok(Action::requeue(if ready {
        ctx.options.resync
    } else {
        Duration::from_secs(30)
    }))
}

struct Loaded {
    digest: String,
    world: String,
    version: String,
    contract: String,
    declared_http: Vec<String>,
    message: String,
}

/// Load the plugin if its spec or bytes changed. `Ok(None)` means nothing
/// changed; `Err((reason, message))` is what the condition shows.
async fn load(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    generation: i64,
) -> Result<Option<Loaded>, (&'static str, String)> {
    let Some(runtime) = ctx.runtime.clone() else {
        return Err((
            "NoRuntime",
            "this host runs without a plugin runtime".to_string(),
        ));
    };
    let source = &plugin.spec.source;
    let path = match source.strip_prefix("file://") {
        Some(path) if path.starts_with('/') => std::path::PathBuf::from(path),
        Some(_) => {
            return Err((
                "InvalidSource",
                format!(
                    "spec.source {source:?}: a file:// source needs an absolute path, like file:///plugins/sim_provider.wasm"
                ),
            ));
        }
        None if source.starts_with("oci://") => {
            return Err((
                "UnsupportedSource",
                format!(
                    "spec.source {source:?}: oci:// sources are not supported by this host yet; use a file:// source"
                ),
            ));
        }
        None => {
            return Err((
                "InvalidSource",
                format!("spec.source {source:?} must start with file://"),
            ));
        }
    };
    let bytes = tokio::fs::read(&path).await.map_err(|e| {
        (
            "SourceUnreadable",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let digest = capstan_runtime::digest(&bytes);
    let already = ctx.loaded.lock().expect("loaded lock").get(name).cloned();
    let status_ready = plugin
        .status
        .as_ref()
        .is_some_and(|s| capstan_api::is_true(&s.conditions, READY));
    if already == Some((generation, digest.clone()))
        && ctx.providers.get(name).is_some()
        && status_ready
    {
        return Ok(None);
    }

    let grants = grants(plugin, ctx).await?;
    let mut limits = Limits::default();
    if let Some(mib) = plugin.spec.limits.memory_mib {
        limits.memory_bytes = mib as usize * 1024 * 1024;
    }
    if let Some(ms) = plugin.spec.limits.call_timeout_ms {
        limits.call_timeout = Duration::from_millis(ms);
    }
    let source_name = source.clone();
    let loaded =
        tokio::task::spawn_blocking(move || runtime.load(&source_name, &bytes, limits, grants))
            .await
            .map_err(|e| ("LoadFailed", format!("the load task failed: {e}")))?
            .map_err(|e| ("LoadFailed", e.to_string()))?;
    let manifest = loaded.manifest().clone();
    let message = match loaded.load_path() {
        capstan_runtime::LoadPath::Compiled => "compiled and loaded".to_string(),
        capstan_runtime::LoadPath::Cached => "loaded from the code cache".to_string(),
    };
    if manifest.world == World::Provider {
        let provider = loaded
            .provider()
            .map_err(|e| ("LoadFailed", e.to_string()))?;
        ctx.providers.insert(
            name,
            Registered {
                provider: Arc::new(WasmProvider::new(provider)),
                generation: Some(generation),
            },
        );
    }
    if manifest.name != name {
        tracing::info!(plugin = %name, manifest_name = %manifest.name, "the Plugin object's name differs from the manifest's; machines refer to the object's name");
    }
    ctx.loaded
        .lock()
        .expect("loaded lock")
        .insert(name.to_string(), (generation, digest.clone()));
    tracing::info!(plugin = %name, %digest, "plugin loaded");
    Ok(Some(Loaded {
        digest,
        world: format!("{}-plugin", manifest.world.as_str()),
        version: manifest.version.clone(),
        contract: manifest.contract.clone(),
        declared_http: manifest
            .capabilities
            .http
            .iter()
            .map(|c| match &c.credential {
                Some(slot) => format!("{} (credential {slot})", c.destination),
                None => c.destination.to_string(),
            })
            .collect(),
        message,
    }))
}

async fn grants(plugin: &Plugin, ctx: &Context) -> Result<Grants, (&'static str, String)> {
    let mut grants = Grants::default();
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
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &grant.secret_ref.namespace);
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
        };
        grants.credentials.insert(grant.slot.clone(), credential);
    }
    Ok(grants)
}

/// Whether machines can use a plugin right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Registered and usable.
    Ready,
    /// This host has not loaded it yet (for example right after a restart);
    /// machines wait quietly instead of reporting a problem.
    Loading,
    /// Missing or failed to load: what to tell the user.
    Unavailable(String),
}

/// Whether machines naming `name` can use it.
pub fn availability(ctx: &Context, name: &str) -> Availability {
    let registered = ctx.providers.get(name);
    let key = kube::runtime::reflector::ObjectRef::<Plugin>::new(name);
    let Some(plugin) = ctx.stores.plugins.get(&key) else {
        return match registered {
            // Built-in providers (the benchmark's native one) have no object.
            Some(r) if r.generation.is_none() => Availability::Ready,
            _ => Availability::Unavailable(format!(
                "plugin {name:?} does not exist; create a Plugin named {name:?} (kubectl get plugins lists the installed ones)"
            )),
        };
    };
    if registered.is_some() {
        return Availability::Ready;
    }
    let condition = plugin
        .status
        .as_ref()
        .and_then(|s| capstan_api::condition(&s.conditions, READY).cloned());
    match condition {
        Some(c) if c.status == status::FALSE => Availability::Unavailable(format!(
            "plugin {name:?} is not ready: {}: {}",
            c.reason, c.message
        )),
        _ => Availability::Loading,
    }
}
