//! The providers machines are made by, as the Machine controller sees them:
//! a [`MachineProvider`] per plugin name, held in a [`Providers`] registry.
//!
//! The Wasm plugins loaded by the Plugin controller are one implementation
//! ([`WasmProvider`]); the benchmark registers the same logic compiled
//! natively as another, so both run through the identical controller path.

use crate::canary::{CallCounts, Canary};
use crate::metrics::Metrics;
pub use crate::provider_error::ProviderError;
use capstan_runtime::ProviderPlugin;
use capstan_runtime::types::{
    BootstrapData, Deletion, FoundInstance, InstanceCapacity, Machine as PluginMachine,
    MachineStatus,
};
use futures::future::BoxFuture;
use kube::ResourceExt as _;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// What the Machine controller needs from a provider.
pub trait MachineProvider: Send + Sync + std::fmt::Debug {
    /// `sha256:…` of the code acting on machines (recorded in their status).
    fn digest(&self) -> &str;
    /// Who signed that code (recorded in their status too); `None`:
    /// unsigned.
    fn signer(&self) -> Option<&str> {
        None
    }
    /// How the provider IDs of its instances begin, as its signed manifest
    /// declares (`None`: not declared, not checked).
    fn provider_id_prefix(&self) -> Option<&str> {
        None
    }
    /// Which revision of its Plugin this is, as call metrics label it:
    /// `stable`, or `canary` while a canary serves the Machine.
    fn revision(&self) -> &'static str {
        "stable"
    }
    /// Check a provider config.
    fn validate<'a>(&'a self, config: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Whether `create` can pass bootstrap data to the instance (a provider
    /// built against contract 0.2.0 or later).
    fn takes_bootstrap_data(&self) -> bool {
        true
    }
    /// Create (idempotent by machine uid), with the data the instance boots
    /// with, if any.
    fn create<'a>(
        &'a self,
        machine: &'a PluginMachine,
        bootstrap: Option<&'a BootstrapData>,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>>;
    /// Observe.
    fn get<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>>;
    /// Delete (call until `Done`).
    fn delete<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Deletion, ProviderError>>;
    /// Every instance the provider can see with `config` (`None`: it does
    /// not list). The default does not list.
    fn list_instances<'a>(
        &'a self,
        config: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<MachineStatus>>, ProviderError>> {
        let _ = config;
        Box::pin(async { Ok(None) })
    }
    /// The instance a machine with none recorded should adopt (its
    /// `provider_id`'s, else the one tagged for it), with whom it is
    /// tagged for: a claim the host checks before adopting. The default
    /// finds nothing (providers that cannot look up).
    fn find_instance<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Option<FoundInstance>, ProviderError>> {
        let _ = machine;
        Box::pin(async { Ok(None) })
    }
    /// What an instance of `config` offers (a claim the host bounds before
    /// writing it for the cluster-autoscaler). The default does not say.
    fn capacity<'a>(
        &'a self,
        config: &'a str,
    ) -> BoxFuture<'a, Result<Option<InstanceCapacity>, ProviderError>> {
        let _ = config;
        Box::pin(async { Ok(None) })
    }
}

/// A Wasm provider plugin loaded by the runtime.
#[derive(Debug, Clone)]
pub struct WasmProvider {
    plugin: ProviderPlugin,
    digest: String,
    /// Its verified signers, joined (`None`: unsigned).
    signer: Option<String>,
    /// The admin's values of the config keys the manifest declares as
    /// settings.
    settings: serde_json::Map<String, serde_json::Value>,
}

impl WasmProvider {
    /// Wrap a loaded provider plugin.
    pub fn new(plugin: ProviderPlugin) -> Self {
        let digest = plugin.plugin().digest().to_string();
        WasmProvider {
            plugin,
            digest,
            signer: None,
            settings: Default::default(),
        }
    }

    /// Record who signed it (its Plugin's verified signers).
    pub fn signed_by(mut self, signers: &[String]) -> Self {
        self.signer = (!signers.is_empty()).then(|| signers.join(", "));
        self
    }

    /// Add the Plugin's `spec.settings` to every call's config. Refused
    /// (the text names the key) when one is not a setting its manifest
    /// declares, or the value is not an object.
    pub fn with_settings(mut self, settings: Option<&serde_json::Value>) -> Result<Self, String> {
        let declared = &self.plugin.plugin().manifest().settings;
        self.settings = checked_settings(settings, declared)?;
        Ok(self)
    }

    fn configured(&self, config: &str, set: MachineSets) -> Result<String, ProviderError> {
        let declared = &self.plugin.plugin().manifest().settings;
        with_settings(config, declared, &self.settings, set)
    }

    fn configured_machine(
        &self,
        machine: &PluginMachine,
        set: MachineSets,
    ) -> Result<PluginMachine, ProviderError> {
        Ok(PluginMachine {
            provider_config: self.configured(&machine.provider_config, set)?,
            ..machine.clone()
        })
    }
}

/// The Plugin's `spec.settings`, checked against the keys its manifest
/// declares.
pub fn checked_settings(
    settings: Option<&serde_json::Value>,
    declared: &[String],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let map = match settings {
        None | Some(serde_json::Value::Null) => return Ok(Default::default()),
        Some(serde_json::Value::Object(map)) => map.clone(),
        Some(_) => return Err("spec.settings must be an object of config keys".into()),
    };
    if let Some(key) = map.keys().find(|k| !declared.contains(k)) {
        return Err(format!(
            "spec.settings.{key}: the plugin's manifest declares no such setting ({})",
            if declared.is_empty() {
                "it declares none".to_string()
            } else {
                format!("it declares: {}", declared.join(", "))
            }
        ));
    }
    Ok(map)
}

/// What to do with a setting a Machine's config sets itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineSets {
    /// Refuse the config (`validate`, `create`): the user learns at once.
    Refused,
    /// Replace the value by the admin's (`get`, `delete`): a Machine made
    /// before the setting existed can still be observed and deleted, and
    /// never with its own value.
    Replaced,
}

/// A Machine's provider config with the admin's settings in: a declared
/// setting the Machine sets itself (a tenant would choose where the
/// credential goes) is refused or replaced, as `set` says.
pub fn with_settings(
    config: &str,
    declared: &[String],
    settings: &serde_json::Map<String, serde_json::Value>,
    set: MachineSets,
) -> Result<String, ProviderError> {
    if declared.is_empty() {
        return Ok(config.to_string());
    }
    let mut value: serde_json::Value = match config.trim() {
        "" | "null" => serde_json::Value::Object(Default::default()),
        text => serde_json::from_str(text)
            .map_err(|e| ProviderError::InvalidConfig(format!("not JSON: {e}")))?,
    };
    let Some(object) = value.as_object_mut() else {
        // Not an object: the plugin's own validation says what is wrong.
        return Ok(config.to_string());
    };
    if let Some(key) = declared.iter().find(|k| object.contains_key(*k)) {
        if set == MachineSets::Refused {
            return Err(ProviderError::InvalidConfig(format!(
                "{key}: set by the Plugin's admin (Plugin spec.settings.{key}), not in a Machine's config; remove it"
            )));
        }
        object.retain(|k, _| !declared.contains(k));
    }
    for (key, v) in settings {
        object.insert(key.clone(), v.clone());
    }
    Ok(value.to_string())
}

impl MachineProvider for WasmProvider {
    fn digest(&self) -> &str {
        &self.digest
    }

    fn signer(&self) -> Option<&str> {
        self.signer.as_deref()
    }

    fn provider_id_prefix(&self) -> Option<&str> {
        self.plugin
            .plugin()
            .manifest()
            .provider_id_prefix
            .as_deref()
    }
    fn validate<'a>(&'a self, config: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let config = self.configured(config, MachineSets::Refused)?;
            Ok(self.plugin.validate(&config).await?)
        })
    }
    fn takes_bootstrap_data(&self) -> bool {
        self.plugin.takes_bootstrap_data()
    }
    fn create<'a>(
        &'a self,
        machine: &'a PluginMachine,
        bootstrap: Option<&'a BootstrapData>,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        Box::pin(async move {
            let machine = self.configured_machine(machine, MachineSets::Refused)?;
            Ok(bounded_status(
                self.plugin.create(&machine, bootstrap).await?,
            ))
        })
    }
    fn get<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        Box::pin(async move {
            let machine = self.configured_machine(machine, MachineSets::Replaced)?;
            Ok(bounded_status(self.plugin.get(&machine).await?))
        })
    }
    fn list_instances<'a>(
        &'a self,
        config: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<MachineStatus>>, ProviderError>> {
        Box::pin(async move {
            let config = self.configured(config, MachineSets::Refused)?;
            Ok(self.plugin.list(&config).await?)
        })
    }
    fn capacity<'a>(
        &'a self,
        config: &'a str,
    ) -> BoxFuture<'a, Result<Option<InstanceCapacity>, ProviderError>> {
        Box::pin(async move {
            let config = self.configured(config, MachineSets::Refused)?;
            Ok(self.plugin.capacity(&config).await?)
        })
    }
    fn find_instance<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Option<FoundInstance>, ProviderError>> {
        Box::pin(async move {
            let machine = self.configured_machine(machine, MachineSets::Refused)?;
            Ok(self
                .plugin
                .find_instance(&machine)
                .await?
                .map(|found| FoundInstance {
                    status: bounded_status(found.status),
                    machine: found
                        .machine
                        .map(|m| capstan_api::bounded(&m, capstan_api::MAX_PLUGIN_TEXT)),
                    cluster: found
                        .cluster
                        .map(|c| capstan_api::bounded(&c, capstan_api::MAX_PLUGIN_TEXT)),
                }))
        })
    }
    fn delete<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Deletion, ProviderError>> {
        Box::pin(async move {
            let machine = self.configured_machine(machine, MachineSets::Replaced)?;
            Ok(self.plugin.delete(&machine).await?)
        })
    }
}

/// The stable revision serving a Machine while a shadowing canary gets the
/// same side-effect-free calls (`get`, `validate`, at once): its answer is
/// compared with the stable one and never used ([`Canary::compare`]: one
/// call per mirrored call, an error when the canary failed where the
/// stable revision did not, or answered differently, the message aside).
#[derive(Debug)]
struct Shadowed {
    stable: Counted,
    canary: Arc<Canary<Arc<dyn MachineProvider>>>,
}

impl MachineProvider for Shadowed {
    fn digest(&self) -> &str {
        self.stable.digest()
    }
    fn signer(&self) -> Option<&str> {
        self.stable.signer()
    }
    fn provider_id_prefix(&self) -> Option<&str> {
        self.stable.provider_id_prefix()
    }
    fn takes_bootstrap_data(&self) -> bool {
        self.stable.takes_bootstrap_data()
    }
    fn validate<'a>(&'a self, config: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let (stable, canary) = futures::join!(
                self.stable.validate(config),
                self.canary.serving.validate(config)
            );
            self.canary.compare(&stable, &canary, |_, _| true);
            stable
        })
    }
    fn create<'a>(
        &'a self,
        machine: &'a PluginMachine,
        bootstrap: Option<&'a BootstrapData>,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        self.stable.create(machine, bootstrap)
    }
    fn get<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        Box::pin(async move {
            let (stable, canary) =
                futures::join!(self.stable.get(machine), self.canary.serving.get(machine));
            self.canary.compare(&stable, &canary, |a, b| {
                MachineStatus {
                    message: None,
                    ..a.clone()
                } == MachineStatus {
                    message: None,
                    ..b.clone()
                }
            });
            stable
        })
    }
    fn delete<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Deletion, ProviderError>> {
        self.stable.delete(machine)
    }
    fn find_instance<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Option<FoundInstance>, ProviderError>> {
        self.stable.find_instance(machine)
    }
    fn capacity<'a>(
        &'a self,
        config: &'a str,
    ) -> BoxFuture<'a, Result<Option<InstanceCapacity>, ProviderError>> {
        self.stable.capacity(config)
    }
}

/// The plugin's words in an observed status (its `message`, which goes
/// into a condition) bounded like error text.
fn bounded_status(mut status: MachineStatus) -> MachineStatus {
    if let Some(message) = &status.message {
        status.message = Some(capstan_api::bounded(message, capstan_api::MAX_PLUGIN_TEXT));
    }
    status
}

/// One registered provider and the Plugin generation it was loaded for.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The provider.
    pub provider: Arc<dyn MachineProvider>,
    /// `metadata.generation` of the Plugin it came from (`None` for
    /// built-in providers).
    pub generation: Option<i64>,
    /// The provider's calls since its canary's window began.
    pub counts: Arc<CallCounts>,
    /// A revision on trial for some of the Machines, if any.
    pub canary: Option<Arc<Canary<Arc<dyn MachineProvider>>>>,
}

impl Registered {
    /// A serving provider with no canary.
    pub fn new(provider: Arc<dyn MachineProvider>, generation: Option<i64>) -> Self {
        Registered {
            provider,
            generation,
            counts: Arc::default(),
            canary: None,
        }
    }

    /// Note a Machine that failed its health check for the canary's
    /// window, if a canary runs (as the canary's when it serves or served
    /// it).
    pub fn note_unhealthy(&self, uid: &str, served_by: Option<&str>) {
        if let Some(canary) = &self.canary {
            let its = canary.serves(uid) || served_by == Some(canary.serving.digest());
            canary.note_unhealthy(uid, its);
        }
    }

    /// The provider that acts on a Machine: the canary for the Machines it
    /// serves (chosen by the Plugin controller, or served by it before:
    /// `served_by` is the digest the Machine's status records), the stable
    /// revision for the rest. Its calls are counted for the canary's
    /// windows. `None` while a canary runs and a Machine yet to be
    /// `creating` was not yet given to either: it waits (a second or two)
    /// for the Plugin controller, so the canary's share counts new
    /// Machines too.
    pub fn for_machine(
        &self,
        uid: &str,
        served_by: Option<&str>,
        creating: bool,
    ) -> Option<Arc<dyn MachineProvider>> {
        if let Some(canary) = &self.canary
            && creating
            && !canary.is_shadow()
            && !canary.decided(uid)
        {
            return None;
        }
        let (provider, counts, revision) = match &self.canary {
            Some(canary) if canary.is_shadow() => {
                return Some(Arc::new(Shadowed {
                    stable: Counted {
                        provider: self.provider.clone(),
                        counts: self.counts.clone(),
                        revision: "stable",
                    },
                    canary: canary.clone(),
                }));
            }
            Some(canary) if canary.serves(uid) || served_by == Some(canary.serving.digest()) => {
                (canary.serving.clone(), canary.counts.clone(), "canary")
            }
            _ => (self.provider.clone(), self.counts.clone(), "stable"),
        };
        Some(Arc::new(Counted {
            provider,
            counts,
            revision,
        }))
    }
}

/// A provider whose calls are counted.
#[derive(Debug)]
struct Counted {
    provider: Arc<dyn MachineProvider>,
    counts: Arc<CallCounts>,
    revision: &'static str,
}

impl Counted {
    /// `call`, counted under `function` when it ends.
    fn counted<'a, T: 'a>(
        &'a self,
        function: &'static str,
        call: BoxFuture<'a, Result<T, ProviderError>>,
    ) -> BoxFuture<'a, Result<T, ProviderError>> {
        Box::pin(async move {
            let result = call.await;
            self.counts.record(function, &result);
            result
        })
    }
}

impl MachineProvider for Counted {
    fn digest(&self) -> &str {
        self.provider.digest()
    }
    fn revision(&self) -> &'static str {
        self.revision
    }
    fn signer(&self) -> Option<&str> {
        self.provider.signer()
    }
    fn provider_id_prefix(&self) -> Option<&str> {
        self.provider.provider_id_prefix()
    }
    fn takes_bootstrap_data(&self) -> bool {
        self.provider.takes_bootstrap_data()
    }
    fn validate<'a>(&'a self, config: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.counted("validate", self.provider.validate(config))
    }
    fn create<'a>(
        &'a self,
        machine: &'a PluginMachine,
        bootstrap: Option<&'a BootstrapData>,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        self.counted("create", self.provider.create(machine, bootstrap))
    }
    fn get<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        self.counted("get", self.provider.get(machine))
    }
    fn delete<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Deletion, ProviderError>> {
        self.counted("delete", self.provider.delete(machine))
    }
    fn find_instance<'a>(
        &'a self,
        machine: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Option<FoundInstance>, ProviderError>> {
        self.counted("find-instance", self.provider.find_instance(machine))
    }
    fn capacity<'a>(
        &'a self,
        config: &'a str,
    ) -> BoxFuture<'a, Result<Option<InstanceCapacity>, ProviderError>> {
        self.counted("capacity", self.provider.capacity(config))
    }
}

/// Providers by plugin name. The Plugin controller fills it; the Machine
/// controller reads it.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    inner: Arc<RwLock<HashMap<String, Registered>>>,
}

impl Providers {
    /// Register (or replace) the provider for a plugin name.
    pub fn insert(&self, name: &str, registered: Registered) {
        self.inner
            .write()
            .expect("providers lock")
            .insert(name.to_string(), registered);
    }

    /// Put a canary beside a plugin's serving provider (`None`: none). A
    /// plugin not registered gets none.
    pub fn set_canary(&self, name: &str, canary: Option<Arc<Canary<Arc<dyn MachineProvider>>>>) {
        if let Some(registered) = self.inner.write().expect("providers lock").get_mut(name) {
            registered.canary = canary;
        }
    }

    /// Forget a plugin.
    pub fn remove(&self, name: &str) {
        self.inner.write().expect("providers lock").remove(name);
    }

    /// The provider for a plugin name.
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.inner
            .read()
            .expect("providers lock")
            .get(name)
            .cloned()
    }
}

/// Time a plugin call and record it under plugin / function / result,
/// as the stable revision's.
pub async fn timed<T>(
    metrics: &Metrics,
    plugin: &str,
    function: &'static str,
    call: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    timed_as(metrics, (plugin, "stable"), function, call).await
}

/// Time a call of one revision of a plugin (`stable` or `canary`:
/// [`MachineProvider::revision`]) and record it.
pub async fn timed_as<T>(
    metrics: &Metrics,
    (plugin, revision): (&str, &str),
    function: &'static str,
    call: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    let started = Instant::now();
    let result = call.await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    metrics.plugin_call((plugin, revision), function, outcome, started.elapsed());
    result
}

/// The machine as the plugin contract describes it.
///
/// Only the provider ID the status records (one the host created or
/// adopted) is passed: a `spec.providerID` not adopted yet never reaches
/// `get` or `delete`.
pub fn to_plugin_machine(machine: &capstan_api::Machine) -> PluginMachine {
    PluginMachine {
        name: machine.name_any(),
        namespace: machine.namespace().unwrap_or_default(),
        uid: machine.uid().unwrap_or_default(),
        cluster_name: machine.spec.cluster_name.clone(),
        labels: machine
            .labels()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        version: machine.spec.version.clone(),
        failure_domain: machine.spec.failure_domain.clone(),
        provider_config: machine.spec.provider.config.to_string(),
        infrastructure_config: None,
        provider_id: machine.status.as_ref().and_then(|s| s.provider_id.clone()),
    }
}

#[cfg(test)]
mod tests;
