//! Typed handles per world ([`ProviderPlugin`], [`UpdaterPlugin`],
//! [`AddonPlugin`], [`BootstrapPlugin`]): one method per contract function,
//! each a call through [`Plugin`]'s per-call path on one of the runtime's
//! call threads. A provider or addon is bound to its world's interface of
//! its manifest's contract version (0.1.0 or 0.2.0, [`versioned_handle!`]);
//! updaters export the same interface under both.

use super::*;

/// Tell the runtime's input recorder, if any, what this call is given.
macro_rules! record_inputs {
    ($handle:ident, $name:literal, [$($arg:ident),*]) => {
        if let Some(recorder) = $handle.plugin.inner.runtime.recorder.get() {
            recorder(crate::CallInputs {
                plugin: $handle.plugin.name().to_string(),
                call: $name,
                inputs: vec![$(format!("{:?}", $arg)),*],
            });
        }
    };
}

/// Run one contract call on a call thread (`crate::workers`), or on the
/// caller's own thread if it is pure ([`Plugin::runs_inline`]). The call
/// may run on another thread than its caller's, so it takes owned copies
/// of the named arguments (a few strings each; cloning is cheap next to a
/// call) and the body borrows those.
macro_rules! on_call_thread {
    ($handle:ident, $name:literal, [$($arg:ident),*], async |$s:ident, $p:ident| $body:expr) => {{
        let this = $handle.clone();
        $(let $arg = $arg.to_owned();)*
        record_inputs!($handle, $name, [$($arg),*]);
        let call = async move { this.call($name, async |$s, $p| $body).await };
        if $handle.plugin.runs_inline($name) {
            call.await
        } else {
            $handle.plugin.inner.runtime.call_threads.run(call).await
        }
    }};
}

/// A component whose exports are not the interface of the contract its
/// manifest names.
fn exports_mismatch(plugin: &Plugin, world: World, e: wasmtime::Error) -> Error {
    Error::Load {
        plugin: plugin.name().to_string(),
        reason: format!(
            "its {world} exports do not match contract {}: {e:#}",
            plugin.manifest().contract
        ),
    }
}

/// Run export `$accessor` of a component bound by `$exports` in a fresh
/// instance under the plugin's limits (`Plugin::invoke`), giving `$f` the
/// store and the bound interface.
macro_rules! invoke_export {
    ($plugin:expr, $name:expr, $exports:expr, $accessor:ident, $f:expr) => {
        $plugin
            .invoke($name, async |store, instance| {
                let bound = $exports.load(&mut *store, instance)?;
                $f(store, bound.$accessor()).await
            })
            .await
    };
}

/// What every typed handle has: a `Debug` that names its plugin, and
/// `plugin()`.
macro_rules! handle_basics {
    ($name:ident) => {
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("plugin", &self.plugin)
                    .finish()
            }
        }

        impl $name {
            /// The underlying plugin.
            pub fn plugin(&self) -> &Plugin {
                &self.plugin
            }
        }
    };
}

/// A typed handle on a plugin of one world: the struct, its constructor
/// (world check and export type check) and `call`, which instantiates the
/// component in a fresh store and runs one export under the plugin's limits.
macro_rules! world_handle {
    ($(#[$doc:meta])* $name:ident, $world:expr, $module:ident, $pre:ident, $guest:path, $accessor:ident) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name {
            plugin: Plugin,
            exports: bindings::$module::$pre,
        }

        handle_basics!($name);

        impl $name {
            pub(crate) fn new(plugin: &Plugin) -> Result<Self, Error> {
                plugin.expect_world($world)?;
                let exports = bindings::$module::$pre::new(&plugin.inner.pre)
                    .map_err(|e| exports_mismatch(plugin, $world, e))?;
                Ok($name { plugin: plugin.clone(), exports })
            }

            async fn call<T: ReturnSize>(
                &self,
                name: &'static str,
                f: impl AsyncFnOnce(&mut Store<CallState>, &$guest) -> wasmtime::Result<Result<T, PluginError>>,
            ) -> Result<T, Error> {
                invoke_export!(self.plugin, name, self.exports, $accessor, f)
            }
        }
    };
}

world_handle!(
    /// A plugin that implements the `updater` world.
    UpdaterPlugin,
    World::Updater,
    updater,
    UpdaterPluginIndices,
    bindings::updater::exports::capstan::plugin0_1_0::updater::Guest,
    capstan_plugin0_1_0_updater
);

world_handle!(
    /// A plugin that implements the `bootstrap` world (contract 0.2.0).
    BootstrapPlugin,
    World::Bootstrap,
    bootstrap,
    BootstrapPluginIndices,
    bindings::bootstrap::exports::capstan::plugin0_2_0::bootstrap::Guest,
    capstan_plugin0_2_0_bootstrap
);

impl BootstrapPlugin {
    /// `validate(config)`.
    pub async fn validate(&self, config: &str) -> Result<(), Error> {
        on_call_thread!(self, "validate", [config], async |s, p| p
            .call_validate(s, &config)
            .await)
    }

    /// `render`: the bootstrap data for `machine`, with the token still a
    /// placeholder.
    pub async fn render(
        &self,
        machine: &Machine,
        config: &str,
        join: &JoinInfo,
    ) -> Result<BootstrapData, Error> {
        on_call_thread!(self, "render", [machine, config, join], async |s, p| p
            .call_render(s, &machine, &config, &join)
            .await)
    }
}

/// A typed handle on a plugin of a world whose interface changed in 0.2.0:
/// the component is bound to the interface of its manifest's contract
/// version (`V1`: 0.1.0, `V2`: 0.2.0), and `call` runs `v1` or `v2`.
macro_rules! versioned_handle {
    ($(#[$doc:meta])* $name:ident, $pre_enum:ident, $world:expr,
     v1: ($m1:ident, $guest1:ident = $g1:path, $acc1:ident),
     v2: ($m2:ident, $guest2:ident = $g2:path, $acc2:ident),
     $pre:ident) => {
        /// Where the exports of the interface of the component's contract
        /// version are found in an instance of it.
        #[derive(Clone)]
        enum $pre_enum {
            /// Contract 0.1.0.
            V1(bindings::$m1::$pre),
            /// Contract 0.2.0.
            V2(bindings::$m2::$pre),
        }

        type $guest1 = $g1;
        type $guest2 = $g2;

        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name {
            plugin: Plugin,
            pre: $pre_enum,
        }

        handle_basics!($name);

        impl $name {
            pub(crate) fn new(plugin: &Plugin) -> Result<Self, Error> {
                plugin.expect_world($world)?;
                let mismatch = |e| exports_mismatch(plugin, $world, e);
                let export = $world.export_interface(&plugin.manifest().contract);
                let pre = if export.ends_with(capstan_manifest::FIRST_CONTRACT_VERSION) {
                    $pre_enum::V1(
                        bindings::$m1::$pre::new(&plugin.inner.pre).map_err(mismatch)?,
                    )
                } else {
                    $pre_enum::V2(
                        bindings::$m2::$pre::new(&plugin.inner.pre).map_err(mismatch)?,
                    )
                };
                Ok($name {
                    plugin: plugin.clone(),
                    pre,
                })
            }

            /// Whether the plugin implements contract 0.2.0's interface.
            fn is_v2(&self) -> bool {
                matches!(self.pre, $pre_enum::V2(_))
            }

            async fn call<T: ReturnSize>(
                &self,
                name: &'static str,
                v1: impl AsyncFnOnce(
                    &mut Store<CallState>,
                    &$guest1,
                ) -> wasmtime::Result<Result<T, PluginError>>,
                v2: impl AsyncFnOnce(
                    &mut Store<CallState>,
                    &$guest2,
                ) -> wasmtime::Result<Result<T, PluginError>>,
            ) -> Result<T, Error> {
                match &self.pre {
                    $pre_enum::V1(exports) => {
                        invoke_export!(self.plugin, name, exports, $acc1, v1)
                    }
                    $pre_enum::V2(exports) => {
                        invoke_export!(self.plugin, name, exports, $acc2, v2)
                    }
                }
            }
        }
    };
}

versioned_handle!(
    /// A plugin that implements the `provider` world (contract 0.1.0 or 0.2.0).
    ProviderPlugin,
    ProviderPre,
    World::Provider,
    v1: (provider, ProviderV1 = bindings::provider::exports::capstan::plugin0_1_0::provider::Guest, capstan_plugin0_1_0_provider),
    v2: (provider_v2, ProviderV2 = bindings::provider_v2::exports::capstan::plugin0_2_0::provider::Guest, capstan_plugin0_2_0_provider),
    ProviderPluginIndices
);

versioned_handle!(
    /// A plugin that implements the `addon` world (contract 0.1.0 or 0.2.0).
    AddonPlugin,
    AddonPre,
    World::Addon,
    v1: (addon, AddonV1 = bindings::addon::exports::capstan::plugin0_1_0::addon::Guest, capstan_plugin0_1_0_addon),
    v2: (addon_v2, AddonV2 = bindings::addon_v2::exports::capstan::plugin0_2_0::addon::Guest, capstan_plugin0_2_0_addon),
    AddonPluginIndices
);

/// [`on_call_thread!`] for a [`versioned_handle!`]: `$v1` runs against a
/// 0.1.0 plugin, `$v2` against a 0.2.0 one (the same expression when the
/// function did not change).
macro_rules! on_versioned_call {
    ($handle:ident, $name:literal, [$($arg:ident),*], async |$s:ident, $p:ident| $v1:expr, $v2:expr) => {{
        let this = $handle.clone();
        $(let $arg = $arg.to_owned();)*
        record_inputs!($handle, $name, [$($arg),*]);
        let call = async move { this.call($name, async |$s, $p| $v1, async |$s, $p| $v2).await };
        if $handle.plugin.runs_inline($name) {
            call.await
        } else {
            $handle.plugin.inner.runtime.call_threads.run(call).await
        }
    }};
    ($handle:ident, $name:literal, [$($arg:ident),*], async |$s:ident, $p:ident| $body:expr) => {
        on_versioned_call!($handle, $name, [$($arg),*], async |$s, $p| $body, $body)
    };
}

impl ProviderPlugin {
    /// Whether `create` can pass bootstrap data to the instance (contract
    /// 0.2.0 and later).
    pub fn takes_bootstrap_data(&self) -> bool {
        self.is_v2()
    }
}

/// The 0.2.0 deletion as the host's (0.1.0's) type: the same two cases.
fn deletion_v1(
    d: bindings::provider_v2::exports::capstan::plugin0_2_0::provider::Deletion,
) -> Deletion {
    use bindings::provider_v2::exports::capstan::plugin0_2_0::provider::Deletion as V2;
    match d {
        V2::Done => Deletion::Done,
        V2::InProgress(ms) => Deletion::InProgress(ms),
    }
}

impl AddonPlugin {
    /// Whether `versions` may declare Kubernetes ranges and `render` is told
    /// the cluster's version (contract 0.2.0 and later).
    pub fn knows_kubernetes_versions(&self) -> bool {
        self.is_v2()
    }

    /// `versions`: the versions it knows and their channels (and, from
    /// 0.2.0, the Kubernetes versions each supports).
    pub async fn versions(&self) -> Result<Vec<VersionInfo>, Error> {
        on_versioned_call!(
            self,
            "versions",
            [],
            async |s, p| Ok(p
                .call_versions(s)
                .await?
                .map(|versions| versions.into_iter().map(version_info_v2).collect())),
            p.call_versions(s).await
        )
    }

    /// `render`: the objects (JSON text each) for `spec`. A 0.1.0 plugin is
    /// not told `spec.kubernetes_version`.
    pub async fn render(&self, spec: &AddonSpec) -> Result<Vec<String>, Error> {
        on_versioned_call!(
            self,
            "render",
            [spec],
            async |s, p| p.call_render(s, &addon_spec_v1(&spec)).await,
            p.call_render(s, &spec).await
        )
    }

    /// `assess`: health judged from the observed objects (JSON text each).
    pub async fn assess(&self, spec: &AddonSpec, observed: &[String]) -> Result<Health, Error> {
        on_versioned_call!(
            self,
            "assess",
            [spec, observed],
            async |s, p| Ok(p
                .call_assess(s, &addon_spec_v1(&spec), &observed)
                .await?
                .map(health_v2)),
            p.call_assess(s, &spec, &observed).await
        )
    }
}

/// The addon spec as a 0.1.0 plugin takes it: without the cluster's version.
fn addon_spec_v1(
    spec: &AddonSpec,
) -> bindings::addon::exports::capstan::plugin0_1_0::addon::AddonSpec {
    bindings::addon::exports::capstan::plugin0_1_0::addon::AddonSpec {
        name: spec.name.clone(),
        namespace: spec.namespace.clone(),
        version: spec.version.clone(),
        channel: spec.channel.clone(),
        config: spec.config.clone(),
    }
}

/// A 0.1.0 version entry as the host's type: no Kubernetes range (any).
fn version_info_v2(
    v: bindings::addon::exports::capstan::plugin0_1_0::addon::VersionInfo,
) -> VersionInfo {
    VersionInfo {
        version: v.version,
        channels: v.channels,
        kubernetes: None,
    }
}

/// A 0.1.0 health as the host's type: the same fields.
fn health_v2(h: bindings::addon::exports::capstan::plugin0_1_0::addon::Health) -> Health {
    Health {
        healthy: h.healthy,
        message: h.message,
        details: h.details,
    }
}

impl ProviderPlugin {
    /// `validate(config)`.
    pub async fn validate(&self, config: &str) -> Result<(), Error> {
        on_versioned_call!(self, "validate", [config], async |s, p| p
            .call_validate(s, &config)
            .await)
    }

    /// `create(machine, bootstrap)`. A 0.1.0 provider cannot take
    /// bootstrap data: asking it to is [`Error::Unsupported`], before any
    /// call, since its instance would boot without it and never join.
    pub async fn create(
        &self,
        machine: &Machine,
        bootstrap: Option<&BootstrapData>,
    ) -> Result<MachineStatus, Error> {
        if bootstrap.is_some() && !self.takes_bootstrap_data() {
            return Err(Error::Unsupported {
                plugin: self.plugin.name().to_string(),
                call: "create",
                reason: format!(
                    "it implements contract {}, whose create cannot pass bootstrap data to the instance; use a provider built against contract {}",
                    self.plugin.manifest().contract,
                    capstan_manifest::CONTRACT_VERSION
                ),
            });
        }
        let bootstrap = bootstrap.cloned();
        on_versioned_call!(
            self,
            "create",
            [machine, bootstrap],
            async |s, p| p.call_create(s, &machine).await,
            p.call_create(s, &machine, bootstrap.as_ref()).await
        )
    }

    /// `get(machine)`.
    pub async fn get(&self, machine: &Machine) -> Result<MachineStatus, Error> {
        on_versioned_call!(self, "get", [machine], async |s, p| p
            .call_get(s, &machine)
            .await)
    }

    /// `delete(machine)`.
    pub async fn delete(&self, machine: &Machine) -> Result<Deletion, Error> {
        on_versioned_call!(
            self,
            "delete",
            [machine],
            async |s, p| p.call_delete(s, &machine).await,
            Ok(p.call_delete(s, &machine).await?.map(deletion_v1))
        )
    }

    /// `list-instances(config)`; `None` when the plugin does not list.
    pub async fn list(&self, config: &str) -> Result<Option<Vec<MachineStatus>>, Error> {
        on_versioned_call!(self, "list-instances", [config], async |s, p| p
            .call_list_instances(s, &config)
            .await)
    }

    /// `find-instance(machine)`: the instance a machine with none recorded
    /// should adopt. A 0.1.0 provider cannot look up by tags: it is asked
    /// `get` for the instance `machine.provider_id` names (untagged, as far
    /// as the host can tell), and finds nothing otherwise.
    pub async fn find_instance(&self, machine: &Machine) -> Result<Option<FoundInstance>, Error> {
        if !self.is_v2() && machine.provider_id.is_none() {
            return Ok(None);
        }
        on_versioned_call!(
            self,
            "find-instance",
            [machine],
            async |s, p| Ok(match p.call_get(s, &machine).await? {
                Ok(status) => Ok(Some(FoundInstance {
                    status,
                    machine: None,
                    cluster: None,
                })),
                Err(types::PluginError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            }),
            p.call_find_instance(s, &machine).await
        )
    }

    /// `capacity(config)`: what an instance of `config` offers. A 0.1.0
    /// provider cannot say: `None`, without a call.
    pub async fn capacity(&self, config: &str) -> Result<Option<InstanceCapacity>, Error> {
        if !self.is_v2() {
            return Ok(None);
        }
        on_versioned_call!(
            self,
            "capacity",
            [config],
            async |s, p| {
                let _ = (s, p);
                Ok(Ok(None))
            },
            p.call_capacity(s, &config).await
        )
    }

    /// Instantiate in a fresh store and call nothing: measures the per-call
    /// setup cost (benchmarks).
    pub async fn instantiate_only(&self) -> Result<(), Error> {
        on_versioned_call!(self, "instantiate", [], async |_s, _p| Ok(Ok(())))
    }
}

impl UpdaterPlugin {
    /// `can-update`: which of `changed_fields` this updater claims.
    pub async fn can_update(
        &self,
        current: &Machine,
        desired: &Machine,
        changed_fields: &[String],
    ) -> Result<Vec<String>, Error> {
        on_call_thread!(
            self,
            "can-update",
            [current, desired, changed_fields],
            async |s, p| p
                .call_can_update(s, &current, &desired, &changed_fields)
                .await
        )
    }

    /// `update`: apply the claimed fields (re-entrant).
    pub async fn update(
        &self,
        current: &Machine,
        desired: &Machine,
        claimed_fields: &[String],
    ) -> Result<UpdateProgress, Error> {
        on_call_thread!(
            self,
            "update",
            [current, desired, claimed_fields],
            async |s, p| p.call_update(s, &current, &desired, &claimed_fields).await
        )
    }
}
