//! Typed handles per world ([`ProviderPlugin`], [`UpdaterPlugin`],
//! [`AddonPlugin`]): one method per contract function, each a call through
//! [`Plugin`]'s per-call path on one of the runtime's call threads.

use super::*;

/// Run one contract call on a call thread (`crate::workers`). The call
/// may run on another thread than its caller's, so it takes owned copies
/// of the named arguments (a few strings each; cloning is cheap next to a
/// call) and the body borrows those.
macro_rules! on_call_thread {
    ($handle:ident, $name:literal, [$($arg:ident),*], async |$s:ident, $p:ident| $body:expr) => {{
        let this = $handle.clone();
        $(let $arg = $arg.to_owned();)*
        $handle
            .plugin
            .inner
            .runtime
            .call_threads
            .run(async move { this.call($name, async |$s, $p| $body).await })
            .await
    }};
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
            pre: bindings::$module::$pre<CallState>,
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)).field("plugin", &self.plugin).finish()
            }
        }

        impl $name {
            pub(crate) fn new(plugin: &Plugin) -> Result<Self, Error> {
                plugin.expect_world($world)?;
                let pre = bindings::$module::$pre::new(plugin.inner.pre.clone()).map_err(|e| Error::Load {
                    plugin: plugin.name().to_string(),
                    reason: format!(
                        "its {} exports do not match contract {}: {e:#}",
                        $world,
                        capstan_manifest::CONTRACT_VERSION
                    ),
                })?;
                Ok($name { plugin: plugin.clone(), pre })
            }

            /// The underlying plugin.
            pub fn plugin(&self) -> &Plugin {
                &self.plugin
            }

            async fn call<T: ReturnSize>(
                &self,
                name: &'static str,
                f: impl AsyncFnOnce(&mut Store<CallState>, &$guest) -> wasmtime::Result<Result<T, PluginError>>,
            ) -> Result<T, Error> {
                let pre = &self.pre;
                self.plugin
                    .invoke(name, async |store| {
                        let started = std::time::Instant::now();
                        let instance = pre.instantiate_async(&mut *store).await?;
                        store.data_mut().instantiate = started.elapsed();
                        f(store, instance.$accessor()).await
                    })
                    .await
            }
        }
    };
}

world_handle!(
    /// A plugin that implements the `provider` world.
    ProviderPlugin,
    World::Provider,
    provider,
    ProviderPluginPre,
    bindings::provider::exports::capstan::plugin::provider::Guest,
    capstan_plugin_provider
);

world_handle!(
    /// A plugin that implements the `updater` world.
    UpdaterPlugin,
    World::Updater,
    updater,
    UpdaterPluginPre,
    bindings::updater::exports::capstan::plugin::updater::Guest,
    capstan_plugin_updater
);

world_handle!(
    /// A plugin that implements the `addon` world.
    AddonPlugin,
    World::Addon,
    addon,
    AddonPluginPre,
    bindings::addon::exports::capstan::plugin::addon::Guest,
    capstan_plugin_addon
);

impl AddonPlugin {
    /// `versions`: the versions it knows and their channels.
    pub async fn versions(&self) -> Result<Vec<VersionInfo>, Error> {
        on_call_thread!(self, "versions", [], async |s, p| p.call_versions(s).await)
    }

    /// `render`: the objects (JSON text each) for `spec`.
    pub async fn render(&self, spec: &AddonSpec) -> Result<Vec<String>, Error> {
        on_call_thread!(self, "render", [spec], async |s, p| p
            .call_render(s, &spec)
            .await)
    }

    /// `assess`: health judged from the observed objects (JSON text each).
    pub async fn assess(&self, spec: &AddonSpec, observed: &[String]) -> Result<Health, Error> {
        on_call_thread!(self, "assess", [spec, observed], async |s, p| p
            .call_assess(s, &spec, &observed)
            .await)
    }
}

impl ProviderPlugin {
    /// `validate(config)`.
    pub async fn validate(&self, config: &str) -> Result<(), Error> {
        on_call_thread!(self, "validate", [config], async |s, p| p
            .call_validate(s, &config)
            .await)
    }

    /// `create(machine)`.
    pub async fn create(&self, machine: &Machine) -> Result<MachineStatus, Error> {
        on_call_thread!(self, "create", [machine], async |s, p| p
            .call_create(s, &machine)
            .await)
    }

    /// `get(machine)`.
    pub async fn get(&self, machine: &Machine) -> Result<MachineStatus, Error> {
        on_call_thread!(self, "get", [machine], async |s, p| p
            .call_get(s, &machine)
            .await)
    }

    /// `delete(machine)`.
    pub async fn delete(&self, machine: &Machine) -> Result<Deletion, Error> {
        on_call_thread!(self, "delete", [machine], async |s, p| p
            .call_delete(s, &machine)
            .await)
    }

    /// `list-instances(config)`; `None` when the plugin does not list.
    pub async fn list(&self, config: &str) -> Result<Option<Vec<MachineStatus>>, Error> {
        on_call_thread!(self, "list-instances", [config], async |s, p| p
            .call_list_instances(s, &config)
            .await)
    }

    /// Instantiate in a fresh store and call nothing: measures the per-call
    /// setup cost (benchmarks).
    pub async fn instantiate_only(&self) -> Result<(), Error> {
        let this = self.clone();
        self.plugin
            .inner
            .runtime
            .call_threads
            .run(async move {
                let pre = &this.pre;
                this.plugin
                    .invoke("instantiate", async |store| {
                        let started = std::time::Instant::now();
                        pre.instantiate_async(&mut *store).await?;
                        store.data_mut().instantiate = started.elapsed();
                        Ok(Ok(()))
                    })
                    .await
            })
            .await
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
