//! The Plugin controller: fetch each plugin (a local file, or an OCI
//! artifact resolved, verified and pulled through `capstan-registry`), check
//! that its grants cover every capability it declares (HTTP destinations,
//! credential slots, object kinds), load it into the sandbox, and register
//! it as a provider, an in-place updater or an addon plugin.
//!
//! Order matters and never changes: resolve the manifest → check grants
//! against the declared capabilities (read from the manifest, before any
//! download) → verify signatures (cached by digest) → download the
//! component (digest-checked, cached) → compile (cached) → swap. A revision
//! that fails any step is not activated; the previous one keeps serving and
//! `UpToDate=False` says exactly why.
//!
//! Revocation is immediate: credential Secrets are watched, and a serving
//! revision whose grants were narrowed, or whose credential Secret was
//! deleted, is either registered again with what is still granted or
//! stops serving (`Ready=False`) in the same reconcile — never left serving
//! with what it was granted before.

use capstan_addons::engine::{Addons, RegisteredAddon};
use capstan_api::{CredentialType, Plugin, PluginStatus, status};
use capstan_kit::controller::Spec;
use capstan_kit::provider::{Providers, Registered, WasmProvider};
use capstan_kit::registry::{RegisteredUpdater, Updaters};
use capstan_kit::write::{apply_status, record_event};
use capstan_kit::{Conditions, Error, Kube, kube_err, now};
use capstan_registry::keys::PublicKey;
use capstan_registry::policy::TrustPolicy;
use capstan_registry::verify::Puller;
use capstan_registry::{Reference, Source};
use capstan_runtime::{Credential, Grants, Limits, PluginManifest, World};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "plugin";
/// The condition type on a Plugin: a revision is serving.
pub const READY: &str = "Ready";
/// The condition type on a Plugin: the serving revision is the one the spec names.
pub const UP_TO_DATE: &str = "UpToDate";

/// How `oci://` sources are fetched and whom they must be signed by.
#[derive(Debug)]
pub struct Supply {
    /// Registry client, blob and verification cache, mirrors.
    pub puller: Puller,
    /// The host's trust policy (`--trust-policy`): every source needs a
    /// rule in it (a Plugin's `spec.verification` only adds to that rule).
    pub policy: Option<TrustPolicy>,
}

/// What identifies a loaded revision: the OCI manifest digest for `oci://`
/// sources, the component digest for files.
pub(crate) type Revision = String;

type Failure = (&'static str, String);

/// What the Plugin controller works with: the sandbox, the registries it
/// fills, and how it fetches and trusts plugins.
pub(crate) struct Context {
    kube: Kube,
    /// The sandbox plugins load into (`None` runs only built-in providers).
    runtime: Option<capstan_runtime::Runtime>,
    providers: Providers,
    updaters: Updaters,
    addons: Addons,
    /// Activating an updater checks its fields against the others and
    /// registers it as one step.
    updater_activation: tokio::sync::Mutex<()>,
    /// Plugins loaded so far: name → (generation, revision), so an idle
    /// reconcile does not reload.
    loaded: std::sync::Mutex<std::collections::HashMap<String, (i64, Revision)>>,
    /// Registry access and trust for `oci://` sources.
    supply: Option<Arc<Supply>>,
    /// `file://` directories whose plugins load unsigned.
    unsigned_plugin_dirs: Vec<capstan_registry::Scope>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("plugin::Context").finish_non_exhaustive()
    }
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

impl Context {
    /// The Plugin controller's context: it registers what it loads in
    /// `providers`, `updaters` and `addons`.
    pub(crate) fn new(
        kube: Kube,
        runtime: Option<capstan_runtime::Runtime>,
        providers: Providers,
        updaters: Updaters,
        addons: Addons,
        options: &crate::Options,
    ) -> Self {
        Context {
            kube,
            runtime,
            providers,
            updaters,
            addons,
            updater_activation: tokio::sync::Mutex::default(),
            loaded: std::sync::Mutex::default(),
            supply: options.supply.clone(),
            unsigned_plugin_dirs: options.unsigned_plugin_dirs.clone(),
        }
    }
}

pub(crate) async fn controller(
    plugins: ReflectHandle<Plugin>,
    ctx: Arc<Context>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let secrets: Api<Secret> = match &ctx.kube.secrets_namespace {
        Some(ns) => Api::namespaced(ctx.kube.client.clone(), ns),
        None => Api::all(ctx.kube.client.clone()),
    };
    let store = ctx.kube.stores.plugins.clone();
    let by_secret = store.clone();
    // A credential Secret changed or deleted: its Plugins at once.
    let watches = move |controller: Controller<Plugin>| {
        controller.watches(
            secrets,
            kube::runtime::watcher::Config::default(),
            move |secret: Secret| {
                let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
                by_secret
                    .state()
                    .into_iter()
                    .filter(|p| {
                        p.spec
                            .grants
                            .credentials
                            .iter()
                            .any(|c| c.secret_ref.namespace == ns && c.secret_ref.name == name)
                    })
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
    };
    let spec = Spec::new(CONTROLLER, plugins, store, concurrency);
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// One pass over a Plugin: its grants first (what an admin narrowed is
/// taken away now), then load the revision the spec names if it changed,
/// revoke what may no longer serve, and write the status once.
async fn reconcile(plugin: Arc<Plugin>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = plugin.name_any();
    let generation = plugin.metadata.generation.unwrap_or(0);
    let mut status = plugin.status.clone().unwrap_or_default();
    let current = plugin.status.clone();
    status.observed_generation = Some(generation);
    // Grants first, every time: what an admin narrowed or deleted is
    // taken away in this reconcile, whatever happens to the revision.
    let granted = grants(&plugin, &ctx).await;
    let fingerprint = match &granted {
        Ok((_, secret_versions)) => Some(grants_fingerprint(&plugin, secret_versions)),
        // A transient read error says nothing about what is granted.
        Err((reason, _)) if *reason == "CredentialUnavailable" => serving_fingerprint(&ctx, &name),
        Err(_) => None,
    };
    let outcome = match granted {
        Ok((g, _)) => {
            let fingerprint = fingerprint.clone().unwrap_or_default();
            load(&plugin, &ctx, &name, generation, g, fingerprint).await
        }
        Err(f) => Err(f),
    };
    if outcome.is_err() && serving_fingerprint(&ctx, &name) != fingerprint {
        revoke(&ctx, &name);
    }
    let at = (Some(generation), now());
    // What `kubectl describe plugin` should tell, if this reconcile changes
    // the status: a revision activated, or one refused.
    let (settled, event) = match outcome {
        Ok(Some(loaded)) => (true, Some(activated(&mut status, &plugin, loaded, &at))),
        // Unchanged: the serving revision is still the spec's.
        Ok(None) => (true, None),
        Err((reason, message)) => {
            let serving = serving_fingerprint(&ctx, &name).is_some();
            tracing::warn!(plugin = %name, reason, %message, serving, "plugin revision not activated");
            let event = refused(&mut status, reason, message, serving, &at);
            (false, Some(event))
        }
    };
    if settled {
        Conditions::new(&mut status.conditions, at.0, &at.1).set(
            UP_TO_DATE,
            status::TRUE,
            "Active",
            "the revision the spec names is serving",
        );
    }
    let changed = apply_status(
        &ctx.kube,
        CONTROLLER,
        plugin.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    if let Some((type_, reason, note)) = event.filter(|_| changed) {
        let object = plugin.object_ref(&());
        record_event(&ctx.kube, CONTROLLER, &object, type_, reason, note).await;
    }
    Ok(Action::requeue(if settled {
        ctx.kube.resync
    } else {
        Duration::from_secs(30)
    }))
}

/// An Event to record if the status changed: type, reason, note.
type Note = (EventType, &'static str, String);

/// Record a newly activated revision in the status; the Event that says so.
fn activated(
    status: &mut PluginStatus,
    plugin: &Plugin,
    loaded: Loaded,
    (generation, t): &(Option<i64>, capstan_api::Time),
) -> Note {
    let serving = loaded
        .resolved_source
        .clone()
        .unwrap_or_else(|| format!("{} ({})", plugin.spec.source, loaded.digest));
    let signed = if loaded.signers.is_empty() {
        String::new()
    } else {
        format!(", signed by {}", loaded.signers.join(", "))
    };
    let note = format!(
        "now serving {serving} (version {}){signed}; {}",
        loaded.version, loaded.message
    );
    if status.resolved_source != loaded.resolved_source
        || status.digest.as_ref() != Some(&loaded.digest)
    {
        status.previous_source = status
            .resolved_source
            .clone()
            .or_else(|| {
                status
                    .digest
                    .as_ref()
                    .map(|d| format!("{} ({d})", plugin.spec.source))
            })
            .filter(|_| status.digest.is_some());
    }
    status.digest = Some(loaded.digest);
    status.resolved_source = loaded.resolved_source;
    status.fetched_from = loaded.fetched_from;
    status.signers = loaded.signers;
    status.world = Some(loaded.world);
    status.version = Some(loaded.version);
    status.contract = Some(loaded.contract);
    status.declared_http = loaded.declared_http;
    status.update_fields = loaded.update_fields;
    status.declared_objects = loaded.declared_objects;
    Conditions::new(&mut status.conditions, *generation, t).set(
        READY,
        status::TRUE,
        "Loaded",
        loaded.message,
    );
    (EventType::Normal, "Activated", note)
}

/// Record a refused revision in the status (`UpToDate=False`, and
/// `Ready=False` too when nothing serves); the Event that says so.
fn refused(
    status: &mut PluginStatus,
    reason: &'static str,
    message: String,
    serving: bool,
    (generation, t): &(Option<i64>, capstan_api::Time),
) -> Note {
    let still = status
        .resolved_source
        .clone()
        .or(status.digest.clone())
        .unwrap_or_default();
    let mut conditions = Conditions::new(&mut status.conditions, *generation, t);
    let message = if serving {
        format!("{message}; still serving {still}")
    } else {
        // Nothing serves: the plugin itself is not ready.
        conditions.set(READY, status::FALSE, reason, message.clone());
        message
    };
    conditions.set(UP_TO_DATE, status::FALSE, reason, message.clone());
    (EventType::Warning, reason, message)
}

struct Loaded {
    digest: String,
    resolved_source: Option<String>,
    fetched_from: Option<String>,
    signers: Vec<String>,
    world: String,
    version: String,
    contract: String,
    declared_http: Vec<String>,
    update_fields: Vec<String>,
    declared_objects: Vec<String>,
    message: String,
}

/// A revision found at the source, before it is activated.
struct Found {
    revision: Revision,
    manifest: PluginManifest,
    origin: Origin,
}

/// Where a found revision comes from.
enum Origin {
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

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ("LoadFailed", format!("a background task failed: {e}")))
}

async fn find(plugin: &Plugin, ctx: &Context) -> Result<Found, Failure> {
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

fn supply(ctx: &Context) -> Result<Arc<Supply>, Failure> {
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
fn policies(
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
        let policy = TrustPolicy::single(keys, v.all_of.clone(), v.any_of.clone())
            .map_err(|e| ("InvalidVerification", format!("spec.{e}")))?;
        policies.push(policy);
    }
    Ok(policies)
}

/// What a `file://` source must satisfy: `None` when it is in a directory
/// the host allows unsigned, else the policies its signatures must meet
/// (checked before the file is read, so an untrusted path is never read).
fn file_policies(
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
async fn check_file(
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
fn add_signers(signers: &mut Vec<String>, found: Vec<capstan_registry::policy::Signer>) {
    for s in found {
        let line = format!("{} ({})", s.name, s.key_id);
        if !signers.contains(&line) {
            signers.push(line);
        }
    }
}

/// Load the plugin if its spec or revision changed. `Ok(None)` means
/// nothing changed; `Err((reason, message))` is what the conditions show.
async fn load(
    plugin: &Plugin,
    ctx: &Context,
    name: &str,
    generation: i64,
    grants: Grants,
    fingerprint: String,
) -> Result<Option<Loaded>, Failure> {
    let Some(runtime) = ctx.runtime.clone() else {
        return Err((
            "NoRuntime",
            "this host runs without a plugin runtime".to_string(),
        ));
    };
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

    let mut resolved_source = None;
    let mut fetched_from = None;
    let mut signers = Vec::new();
    let bytes = match found.origin {
        Origin::File {
            source,
            path,
            bytes,
            policies,
        } => {
            let bytes = Arc::new(bytes);
            signers = check_file(ctx, source, path, &bytes, policies).await?;
            Arc::try_unwrap(bytes).unwrap_or_else(|shared| (*shared).clone())
        }
        Origin::Oci {
            reference,
            described,
        } => {
            let described = *described;
            let supply = supply(ctx)?;
            let source = Source::Oci(reference.clone());
            for policy in policies(plugin, supply.policy.as_ref(), &source)? {
                let (s, r, d) = (supply.clone(), reference.clone(), described.clone());
                let verified = blocking(move || s.puller.verify(&r, &d, &policy, &[])).await?;
                let verified = match verified {
                    Ok(v) => {
                        ctx.kube
                            .metrics
                            .artifact_step("verify", if v.cached { "cached" } else { "ok" });
                        v
                    }
                    Err(e) => {
                        ctx.kube.metrics.artifact_step("verify", "failed");
                        return Err(("VerificationFailed", e.to_string()));
                    }
                };
                add_signers(&mut signers, verified.signers);
            }
            resolved_source = Some(reference.pinned(&described.digest).to_string());
            if described.reference.registry != reference.registry
                || described.reference.repository != reference.repository
            {
                fetched_from = Some(described.reference.to_string());
            }
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
                    ctx.kube
                        .metrics
                        .artifact_step("fetch", if cached { "cached" } else { "ok" });
                    bytes
                }
                Err(e) => {
                    ctx.kube.metrics.artifact_step("fetch", "failed");
                    return Err(("PullFailed", e.to_string()));
                }
            }
        }
    };

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
    let source_name = plugin.spec.source.clone();
    let loaded = blocking(move || runtime.load(&source_name, &bytes, limits, grants))
        .await?
        .map_err(|e| ("LoadFailed", e.to_string()))?;
    let manifest = loaded.manifest().clone();
    let digest = loaded.digest().to_string();
    let (message, compiled) = match loaded.load_path() {
        capstan_runtime::LoadPath::Compiled => ("compiled and loaded".to_string(), "ok"),
        capstan_runtime::LoadPath::Cached => ("loaded from the code cache".to_string(), "cached"),
    };
    ctx.kube.metrics.artifact_step("compile", compiled);
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
    if manifest.world == World::Updater {
        let updater = loaded
            .updater()
            .map_err(|e| ("LoadFailed", e.to_string()))?;
        // Checking and registering is one step, so two overlapping
        // updaters activated at once cannot both pass.
        let _one_at_a_time = ctx.updater_activation.lock().await;
        check_field_ownership(plugin, &update_fields, ctx)?;
        ctx.updaters.insert(
            name,
            RegisteredUpdater {
                plugin: updater,
                fields: update_fields.clone(),
                order: plugin.spec.update_order,
            },
        );
    }
    if manifest.world == World::Addon {
        let addon = loaded.addon().map_err(|e| ("LoadFailed", e.to_string()))?;
        ctx.addons.insert(
            name,
            RegisteredAddon {
                plugin: addon,
                grants: addon_grants,
            },
        );
    }
    if manifest.name != name {
        tracing::info!(plugin = %name, manifest_name = %manifest.name, "the Plugin object's name differs from the manifest's; machines refer to the object's name");
    }
    ctx.loaded
        .lock()
        .expect("loaded lock")
        .insert(name.to_string(), (generation, loaded_key));
    tracing::info!(plugin = %name, revision = %found.revision, %digest, "plugin loaded");
    Ok(Some(Loaded {
        digest,
        resolved_source,
        fetched_from,
        signers,
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
        declared_http: manifest
            .capabilities
            .http
            .iter()
            .map(|c| {
                let mut shown = c.destination.to_string();
                if let Some(slot) = &c.credential {
                    shown.push_str(&format!(" (credential {slot})"));
                }
                if c.optional {
                    shown.push_str(" (optional)");
                }
                shown
            })
            .collect(),
        message,
    }))
}

/// The fields an updater may change: what its manifest declares, as far as
/// the Plugin's `spec.grants.updateFields` covers it.
fn granted_update_fields(
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
fn grants_fingerprint(plugin: &Plugin, secret_versions: &str) -> String {
    format!(
        "{}|{secret_versions}",
        serde_json::to_string(&plugin.spec.grants).unwrap_or_default()
    )
}

/// The grants fingerprint the serving revision was registered under, if a
/// revision of this Plugin is serving.
fn serving_fingerprint(ctx: &Context, name: &str) -> Option<String> {
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
fn revoke(ctx: &Context, name: &str) {
    let was_serving = serving_fingerprint(ctx, name).is_some();
    ctx.providers.remove(name);
    ctx.updaters.remove(name);
    ctx.addons.remove(name);
    ctx.loaded.lock().expect("loaded lock").remove(name);
    if was_serving {
        tracing::warn!(plugin = %name, "grants or credentials were revoked; the plugin stopped serving");
    }
}

/// The grants a Plugin's spec describes, with the credentials read from their
/// Secrets, and those Secrets' resource versions (what changes when a key is
/// rotated).
async fn grants(plugin: &Plugin, ctx: &Context) -> Result<(Grants, String), Failure> {
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
        grants.credentials.insert(grant.slot.clone(), credential);
    }
    Ok((grants, versions.join(",")))
}

/// Refuse an updater whose declared fields overlap those of another active
/// updater, unless both Plugins set different `spec.updateOrder`s. Active
/// means registered in this host or Ready in its status (so after a restart
/// the updater that was serving keeps its fields, whichever reconciles
/// first).
fn check_field_ownership(
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
