//! Loading a Plugin revision: verify and fetch its component, check what
//! it declares against what it is granted, fit its quota and limits, and
//! register it where the other controllers find it.

use super::*;

pub(super) struct Loaded {
    pub(super) digest: String,
    pub(super) resolved_source: Option<String>,
    pub(super) fetched_from: Option<String>,
    pub(super) signers: Vec<String>,
    pub(super) world: String,
    pub(super) version: String,
    pub(super) contract: String,
    pub(super) declared_http: Vec<String>,
    pub(super) update_fields: Vec<String>,
    pub(super) declared_objects: Vec<String>,
    pub(super) message: String,
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ("LoadFailed", format!("a background task failed: {e}")))
}

/// Load the plugin if its spec or revision changed. `Ok(None)` means
/// nothing changed; `Err((reason, message))` is what the conditions show.
/// In order: find the revision, check its declared capabilities against
/// the grants (before anything is fetched), verify and fetch it, compile
/// and load it, register it by world.
pub(super) async fn load(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    generation: i64,
    grants: Grants,
    fingerprint: String,
) -> Result<Option<Loaded>, Failure> {
    if ctx.runtime.is_none() {
        return Err((
            "NoRuntime",
            "this host runs without a plugin runtime".to_string(),
        ));
    }
    host_bytes_fit(plugin.spec.quota.unwrap_or_default(), &limits_of(plugin))?;
    let found = find(plugin, ctx).await?;
    // What the revision declares is known from its manifest, so a revision
    // asking for more than is granted is refused before anything is
    // fetched. The key holds the grants and the credential Secrets'
    // versions, so a rotated key or a narrowed grant loads the plugin again.
    let loaded_key = format!("{}|{fingerprint}", found.revision);
    let already = ctx.loaded.lock().expect("loaded lock").get(name).cloned();
    let status_ready = plugin
        .status
        .as_ref()
        .is_some_and(|s| capstan_api::is_true(&s.conditions, READY));
    if already == Some((generation, loaded_key.clone()))
        && (ctx.providers.get(name).is_some()
            || ctx.updaters.get(name).is_some()
            || ctx.addons.get(name).is_some())
        && status_ready
    {
        return Ok(None);
    }
    let revision = found.revision.clone();
    let prepared = prepare(plugin, ctx, name, found, grants).await?;
    let Prepared {
        loaded,
        fetched,
        update_fields,
        addon_grants,
        message,
    } = prepared;
    let manifest = loaded.manifest().clone();
    let digest = loaded.digest().to_string();
    register(
        ctx,
        plugin,
        name,
        generation,
        (&loaded, &fetched.signers),
        &update_fields,
        addon_grants,
    )
    .await?;
    if manifest.name != name {
        tracing::info!(plugin = %name, manifest_name = %manifest.name, "the Plugin object's name differs from the manifest's; machines refer to the object's name");
    }
    ctx.loaded
        .lock()
        .expect("loaded lock")
        .insert(name.to_string(), (generation, loaded_key));
    tracing::info!(plugin = %name, %revision, %digest, "plugin loaded");
    Ok(Some(Loaded {
        digest,
        resolved_source: fetched.resolved_source,
        fetched_from: fetched.fetched_from,
        signers: fetched.signers,
        world: format!("{}-plugin", manifest.world.as_str()),
        version: manifest.version.clone(),
        contract: manifest.contract.clone(),
        declared_objects: manifest
            .capabilities
            .objects
            .iter()
            .map(ToString::to_string)
            .collect(),
        update_fields: update_fields.iter().map(ToString::to_string).collect(),
        declared_http: manifest.capabilities.http.iter().map(shown_http).collect(),
        message,
    }))
}

/// A revision checked against the grants, verified, fetched and compiled,
/// not yet serving.
pub(super) struct Prepared {
    pub(super) loaded: capstan_runtime::Plugin,
    pub(super) fetched: fetch::Fetched,
    pub(super) update_fields: Vec<capstan_manifest::FieldPattern>,
    pub(super) addon_grants: capstan_addons::AddonGrants,
    /// How it was loaded (compiled, or from the code cache).
    pub(super) message: String,
}

/// Check a found revision's declared capabilities against the grants
/// (before anything is fetched), verify and fetch it, compile and load it.
pub(super) async fn prepare(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    found: Found,
    grants: Grants,
) -> Result<Prepared, Failure> {
    let Some(runtime) = ctx.runtime.clone() else {
        return Err((
            "NoRuntime",
            "this host runs without a plugin runtime".to_string(),
        ));
    };
    let (addon_grants, update_fields) = check_declared(plugin, &found, &grants)?;
    let mut fetched = fetch_verified(ctx, plugin, found.origin).await?;
    let limits = limits_of(plugin);
    let source_name = plugin.spec.source.clone();
    let bytes = std::mem::take(&mut fetched.bytes);
    let loaded = blocking(move || runtime.load(&source_name, &bytes, limits, grants))
        .await?
        .map_err(|e| ("LoadFailed", e.to_string()))?
        .with_quota(ctx.quota_for(name, plugin))
        .observed_as(name);
    let (message, compiled) = match loaded.load_path() {
        capstan_runtime::LoadPath::Compiled => ("compiled and loaded".to_string(), "ok"),
        capstan_runtime::LoadPath::Cached => ("loaded from the code cache".to_string(), "cached"),
    };
    ctx.kube.metrics.artifact_step("compile", compiled);
    Ok(Prepared {
        loaded,
        fetched,
        update_fields,
        addon_grants,
        message,
    })
}

/// A declared destination as the status shows it.
pub(super) fn shown_http(c: &capstan_manifest::HttpCapability) -> String {
    let mut shown = c.destination.to_string();
    if let Some(slot) = &c.credential {
        shown.push_str(&format!(" (credential {slot})"));
    }
    if c.optional {
        shown.push_str(" (optional)");
    }
    shown
}

/// Whether the grants cover every capability the revision declares
/// (destinations, object kinds, update fields): its addon grants and the
/// update fields granted, or `GrantsMissing` naming what is not.
pub(super) fn check_declared(
    plugin: &Plugin,
    found: &Found,
    grants: &Grants,
) -> Result<
    (
        capstan_addons::AddonGrants,
        Vec<capstan_manifest::FieldPattern>,
    ),
    Failure,
> {
    let addon_grants = capstan_addons::AddonGrants::from_spec(&plugin.spec.grants)
        .map_err(|e| ("InvalidGrant", e))?;
    let mut missing = grants.missing(&found.manifest.capabilities.http);
    missing.extend(capstan_manifest::ungranted_kinds(
        &found.manifest.capabilities.objects,
        &addon_grants.objects,
    ));
    let update_fields = granted_update_fields(plugin, &found.manifest)?;
    if !found.manifest.update_fields.is_empty() && update_fields.is_empty() {
        missing.push(format!(
            "updateFields {} (spec.grants.updateFields covers none of them)",
            found
                .manifest
                .update_fields
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !missing.is_empty() {
        return Err((
            "GrantsMissing",
            format!(
                "revision {} ({} {}) declares capabilities spec.grants does not grant: {}; grant them to activate it",
                found.revision,
                found.manifest.name,
                found.manifest.version,
                missing.join(", ")
            ),
        ));
    }
    Ok((addon_grants, update_fields))
}

impl Context {
    /// The quota a Plugin's calls count against: the one its revisions
    /// already share while `spec.quota` is unchanged, a fresh one when it
    /// changed, none when unset.
    fn quota_for(&self, name: &str, plugin: &Plugin) -> Option<capstan_runtime::Quota> {
        let mut quotas = self.quotas.lock().expect("quotas lock");
        let spec = quota_of(plugin);
        let quota = quotas
            .entry(name.to_string())
            .and_modify(|q| {
                if q.spec() != spec {
                    *q = capstan_runtime::Quota::new(spec);
                }
            })
            .or_insert_with(|| capstan_runtime::Quota::new(spec));
        Some(quota.clone())
    }
}

/// The quota a Plugin's `spec.quota` asks for; unset, only the default
/// bound on concurrent calls.
pub(super) fn quota_of(plugin: &Plugin) -> capstan_runtime::QuotaSpec {
    let q = plugin.spec.quota.unwrap_or_default();
    capstan_runtime::QuotaSpec {
        concurrent_calls: Some(q.concurrent_calls()),
        queue_timeout: q
            .queue_timeout_ms
            .map(|ms| Duration::from_millis(u64::from(ms))),
        calls_per_minute: q.calls_per_minute,
        requests_per_minute: q.requests_per_minute,
    }
}

/// `spec.quota.hostBytes`, if set, must hold `concurrentCalls` calls at
/// their most (so the bound holds by construction): refused otherwise,
/// before anything is fetched.
pub(super) fn host_bytes_fit(
    quota: capstan_api::PluginQuota,
    limits: &Limits,
) -> Result<(), Failure> {
    let Some(host_bytes) = quota.host_bytes else {
        return Ok(());
    };
    let calls = quota.concurrent_calls();
    let per_call = limits.host_bytes_per_call();
    let needed = u64::from(calls).saturating_mul(per_call);
    if needed <= host_bytes {
        return Ok(());
    }
    Err((
        "HostBytesTooSmall",
        format!(
            "spec.quota.hostBytes is {host_bytes}, but {calls} concurrent calls \
             (spec.quota.concurrentCalls) of up to {per_call} bytes each (hostBytesPerCall, \
             from spec.limits: memory, host objects, host call data, output, signed bodies) \
             need {needed}; raise hostBytes, or lower concurrentCalls or spec.limits.memoryMib"
        ),
    ))
}

/// The sandbox limits a Plugin's `spec.limits` ask for (defaults
/// elsewhere).
pub(super) fn limits_of(plugin: &Plugin) -> Limits {
    let mut limits = Limits::default();
    if let Some(mib) = plugin.spec.limits.memory_mib {
        limits.memory_bytes = mib as usize * 1024 * 1024;
    }
    if let Some(n) = plugin.spec.limits.max_requests_in_flight {
        limits.max_requests_in_flight = n;
    }
    if let Some(n) = plugin.spec.limits.max_requests_per_call {
        limits.max_requests_per_call = n;
    }
    if let Some(ms) = plugin.spec.limits.call_timeout_ms {
        limits.call_timeout = Duration::from_millis(ms);
    }
    limits
}

/// An updater's progress deadline: the Plugin's, else its manifest's, else
/// the default. The manifest's was checked when it was read.
pub(super) fn progress_deadline(
    plugin: &Plugin,
    manifest: &capstan_manifest::PluginManifest,
) -> Result<Duration, Failure> {
    if let Some(seconds) = plugin.spec.progress_deadline_seconds {
        capstan_manifest::check_progress_deadline(seconds).map_err(|message| {
            (
                "InvalidSpec",
                format!("spec.progressDeadlineSeconds: {message}"),
            )
        })?;
    }
    let seconds = plugin
        .spec
        .progress_deadline_seconds
        .or(manifest.progress_deadline_seconds)
        .unwrap_or(capstan_manifest::DEFAULT_PROGRESS_DEADLINE_SECONDS);
    Ok(Duration::from_secs(seconds.into()))
}

/// Serve a loaded revision as what its world is: a provider, an updater
/// (its fields checked against the other updaters' in the same step), a
/// bootstrap plugin or an addon plugin.
pub(super) async fn register(
    ctx: &Context,
    plugin: &Plugin,
    name: &str,
    generation: i64,
    (loaded, signers): (&capstan_runtime::Plugin, &[String]),
    update_fields: &[capstan_manifest::FieldPattern],
    addon_grants: capstan_addons::AddonGrants,
) -> Result<(), Failure> {
    if loaded.manifest().world != World::Provider && plugin.spec.settings.is_some() {
        return Err((
            "InvalidSettings",
            format!(
                "spec.settings: only provider plugins have settings; this is a {} plugin",
                loaded.manifest().world
            ),
        ));
    }
    match loaded.manifest().world {
        World::Provider => {
            let provider = loaded
                .provider()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            let provider = WasmProvider::new(provider)
                .signed_by(signers)
                .with_settings(plugin.spec.settings.as_ref())
                .map_err(|m| ("InvalidSettings", m))?;
            let registered = Registered::new(Arc::new(provider), Some(generation));
            ctx.providers.insert(name, registered);
        }
        World::Updater => {
            let updater = loaded
                .updater()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            // Checking and registering is one step, so two overlapping
            // updaters activated at once cannot both pass.
            let _one_at_a_time = ctx.updater_activation.lock().await;
            check_field_ownership(plugin, update_fields, ctx)?;
            let progress_deadline = progress_deadline(plugin, loaded.manifest())?;
            let registered = RegisteredUpdater {
                plugin: updater,
                fields: update_fields.to_vec(),
                order: plugin.spec.update_order,
                progress_deadline,
                disruption: loaded.manifest().disruption.unwrap_or_default(),
                revision: "stable",
                counts: Arc::default(),
                canary: Arc::default(),
            };
            ctx.updaters.insert(name, registered);
        }
        World::Bootstrap => {
            let bootstrap = loaded
                .bootstrap()
                .map_err(|e| ("LoadFailed", e.to_string()))?;
            ctx.bootstraps.insert(
                name,
                capstan_kit::registry::RegisteredBootstrap::new(bootstrap),
            );
        }
        World::Addon => {
            let addon = loaded.addon().map_err(|e| ("LoadFailed", e.to_string()))?;
            let grants = addon_grants;
            let signer = (!signers.is_empty()).then(|| signers.join(", "));
            ctx.addons
                .insert(name, RegisteredAddon::new(addon, grants, signer));
        }
    }
    Ok(())
}
