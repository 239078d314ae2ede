//! The Capstan plugin SDK: write a provider, updater or addon plugin in Rust.
//!
//! A plugin is a WebAssembly component built with `cargo build --target
//! wasm32-wasip2`. This crate gives you:
//!
//! - the contract's types ([`Machine`], [`MachineStatus`], [`PluginError`], …)
//!   generated from `wit/` (`capstan:plugin@0.3.0`; its worlds export
//!   0.2.0's interfaces, bound here);
//! - a trait per world ([`Provider`], [`Bootstrap`], and the raw [`updater`]
//!   / [`addon`] guest traits) and an export macro per world
//!   ([`export_provider!`], [`export_bootstrap!`], [`export_updater!`],
//!   [`export_addon!`]) that also embeds your plugin manifest into the
//!   component;
//! - your provider configuration deserialized into your own serde type, with
//!   an `invalid-config` error naming the field when it does not fit;
//! - [`workload_health`] (also under [`addon`]): judge a Deployment or
//!   DaemonSet in an addon plugin's `assess` as `kubectl rollout status` does;
//! - [`http`]: outbound HTTP, [`http::SandboxHttp`]: through
//!   `capstan:plugin/http` (contract 0.3.0, one host call per request) or,
//!   with the default `capstan-http` feature off, `wasi:http` (any host);
//!   the host only lets through destinations your manifest declares and the
//!   admin grants, and attaches credentials itself; and [`log`]: structured
//!   logs into the host's logs.
//!
//! # A minimal provider
//!
//! `capstan-plugin.json`, next to the plugin's `Cargo.toml`, declares what the
//! plugin asks for (see `capstan_manifest` in the host for the format):
//!
//! ```json
//! {"name": "example", "version": "0.1.0", "world": "provider", "contract": "0.3.0",
//!  "capabilities": {"http": [{"destination": "https://api.example.com", "credential": "api"}]}}
//! ```
//!
//! ```rust,no_run
//! use capstan_sdk::{
//!     BootstrapData, Deletion, InstanceState, Machine, MachineStatus, PluginError, Provider,
//! };
//!
//! #[derive(serde::Deserialize)]
//! #[serde(rename_all = "camelCase", deny_unknown_fields)]
//! struct Config {
//!     instance_type: String,
//! }
//!
//! #[derive(Default)]
//! struct Example;
//!
//! impl Provider for Example {
//!     type Config = Config;
//!
//!     fn validate(&self, config: &Config) -> Result<(), PluginError> {
//!         if config.instance_type.is_empty() {
//!             return Err(PluginError::invalid_config("instanceType: must not be empty"));
//!         }
//!         Ok(())
//!     }
//!     fn create(
//!         &self,
//!         machine: &Machine,
//!         _config: &Config,
//!         _bootstrap: Option<&BootstrapData>,
//!     ) -> Result<MachineStatus, PluginError> {
//!         // Use machine.uid as the cloud's idempotency token, and pass the
//!         // bootstrap data to the instance as its user data.
//!         Ok(MachineStatus::new(format!("example://{}", machine.uid), InstanceState::Pending))
//!     }
//!     fn get(&self, machine: &Machine, _config: &Config) -> Result<MachineStatus, PluginError> {
//!         Err(PluginError::not_found(format!("no instance for {}", machine.name)))
//!     }
//!     fn delete(&self, _machine: &Machine, _config: &Config) -> Result<Deletion, PluginError> {
//!         Ok(Deletion::Done)
//!     }
//! }
//!
//! capstan_sdk::export_provider!(Example, manifest: "examples/capstan-plugin.json");
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`, then check
//! it with `capstan plugin inspect` and `capstan plugin conformance`.

use serde::de::DeserializeOwned;

pub mod http;
pub mod log;

/// Bindings generated from the WIT contract, one module per world. Plugin
/// authors normally use the re-exports at the crate root instead.
#[allow(missing_docs, missing_debug_implementations, unsafe_code, clippy::all)]
pub mod bindings {
    /// The `provider` world.
    pub mod provider {
        wit_bindgen::generate!({
            path: "../wit",
            world: "capstan:plugin/provider-plugin@0.2.0",
            generate_all,
            pub_export_macro: true,
            export_macro_name: "__export_provider_world",
            default_bindings_module: "capstan_sdk::bindings::provider",
        });
    }
    /// The `updater` world (its interface is 0.1.0's, unchanged in 0.2.0).
    pub mod updater {
        wit_bindgen::generate!({
            path: "../wit",
            world: "capstan:plugin/updater-plugin@0.2.0",
            pub_export_macro: true,
            export_macro_name: "__export_updater_world",
            default_bindings_module: "capstan_sdk::bindings::updater",
            with: {
                "capstan:plugin/types@0.1.0": crate::bindings::provider::capstan::plugin0_1_0::types,
                "capstan:plugin/log@0.1.0": crate::bindings::provider::capstan::plugin0_1_0::log,
            },
        });
    }
    /// The `addon` world (0.2.0: the cluster's Kubernetes version in, a
    /// Kubernetes range per version out).
    pub mod addon {
        wit_bindgen::generate!({
            path: "../wit",
            world: "capstan:plugin/addon-plugin@0.2.0",
            pub_export_macro: true,
            export_macro_name: "__export_addon_world",
            default_bindings_module: "capstan_sdk::bindings::addon",
            with: {
                "capstan:plugin/types@0.1.0": crate::bindings::provider::capstan::plugin0_1_0::types,
                "capstan:plugin/log@0.1.0": crate::bindings::provider::capstan::plugin0_1_0::log,
            },
        });
    }
    /// Contract 0.3.0's `capstan:plugin/http` import (one host call per
    /// request), used by [`crate::http::CapstanHttp`]. Only that import:
    /// the worlds' exports are 0.2.0's, bound above.
    pub mod http_v3 {
        wit_bindgen::generate!({
            path: "../wit",
            inline: "package capstan:sdk; world http-client { import capstan:plugin/http@0.3.0; }",
            world: "capstan:sdk/http-client",
            generate_all,
            default_bindings_module: "capstan_sdk::bindings::http_v3",
        });
    }
    /// The `bootstrap` world (new in 0.2.0).
    pub mod bootstrap {
        wit_bindgen::generate!({
            path: "../wit",
            world: "capstan:plugin/bootstrap-plugin@0.2.0",
            pub_export_macro: true,
            export_macro_name: "__export_bootstrap_world",
            default_bindings_module: "capstan_sdk::bindings::bootstrap",
            with: {
                "capstan:plugin/types@0.1.0": crate::bindings::provider::capstan::plugin0_1_0::types,
                "capstan:plugin/log@0.1.0": crate::bindings::provider::capstan::plugin0_1_0::log,
                "capstan:plugin/bootstrap-types@0.2.0": crate::bindings::provider::capstan::plugin0_2_0::bootstrap_types,
            },
        });
    }
}

pub use bindings::provider::capstan::plugin0_1_0::types::{
    AddressKind, InstanceState, Machine, MachineAddress, MachineStatus, PluginError, TransientError,
};
pub use bindings::provider::capstan::plugin0_2_0::bootstrap_types::{
    BootstrapData, BootstrapFormat, JoinInfo, Taint,
};
pub use bindings::provider::exports::capstan::plugin0_2_0::provider::{
    Deletion, FoundInstance, InstanceCapacity,
};

/// The raw `updater` guest trait and its types; implement
/// [`updater::Guest`] and call [`export_updater!`].
pub mod updater {
    pub use crate::bindings::updater::exports::capstan::plugin0_1_0::updater::{
        Guest, UpdateInProgress, UpdateProgress,
    };
}

/// The raw `addon` guest trait and its types; implement [`addon::Guest`] and
/// call [`export_addon!`].
pub mod addon {
    use crate::PluginError;
    pub use crate::bindings::addon::exports::capstan::plugin0_2_0::addon::{
        AddonSpec, Guest, Health, VersionInfo,
    };
    pub use crate::workload_health::*;

    /// `versions()` for a plugin that renders a fixed table of
    /// `(version, channel)` pairs (a version may appear once per channel).
    pub fn version_table(table: &[(&str, &str)]) -> Vec<VersionInfo> {
        let mut out: Vec<VersionInfo> = Vec::new();
        for (version, channel) in table {
            match out.iter_mut().find(|v| v.version == *version) {
                Some(v) => v.channels.push(channel.to_string()),
                None => out.push(VersionInfo {
                    version: version.to_string(),
                    channels: vec![channel.to_string()],
                    kubernetes: None,
                }),
            }
        }
        out
    }

    /// `table` with the Kubernetes versions each listed version supports:
    /// `(version, requirement)` pairs such as `("1.8.2", ">=1.20.0")`.
    /// The host applies a version only while the cluster's API server and
    /// every kubelet meet its requirement; a version not named supports
    /// every Kubernetes version.
    pub fn with_kubernetes(
        mut table: Vec<VersionInfo>,
        ranges: &[(&str, &str)],
    ) -> Vec<VersionInfo> {
        for (version, range) in ranges {
            if let Some(v) = table.iter_mut().find(|v| v.version == *version) {
                v.kubernetes = Some(range.to_string());
            }
        }
        table
    }

    /// The table's entry for the version the host resolved (`spec.version`),
    /// or the `invalid-config` error naming the known versions.
    pub fn pick_version<'a>(
        spec: &AddonSpec,
        table: &[(&'a str, &str)],
    ) -> Result<&'a str, PluginError> {
        let asked = spec.version.as_deref().unwrap_or_default();
        table
            .iter()
            .map(|(v, _)| *v)
            .find(|v| *v == asked)
            .ok_or_else(|| {
                let mut known: Vec<&str> = table.iter().map(|(v, _)| *v).collect();
                known.dedup();
                PluginError::invalid_config(format!(
                    "version: {asked:?} is not one of {}",
                    known.join(", ")
                ))
            })
    }
}

pub mod workload_health;

impl PluginError {
    /// The configuration is wrong; `message` names the field and the problem.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        PluginError::InvalidConfig(message.into())
    }
    /// The thing asked about does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        PluginError::NotFound(message.into())
    }
    /// Retry after `retry_after_ms` milliseconds (at least 1 ms is reported).
    pub fn transient(message: impl Into<String>, retry_after_ms: u64) -> Self {
        PluginError::Transient(TransientError {
            message: message.into(),
            retry_after_ms: retry_after_ms.max(1),
        })
    }
    /// Credentials were refused.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        PluginError::Unauthorized(message.into())
    }
    /// Retrying will not help; a human must look.
    pub fn terminal(message: impl Into<String>) -> Self {
        PluginError::Terminal(message.into())
    }
}

// `Display` and `Error` for `PluginError` come from the generated bindings.

impl MachineStatus {
    /// A status with only a provider ID and a state.
    pub fn new(provider_id: impl Into<String>, state: InstanceState) -> Self {
        MachineStatus {
            provider_id: provider_id.into(),
            state,
            addresses: Vec::new(),
            failure_domain: None,
            version: None,
            message: None,
        }
    }
}

impl BootstrapData {
    /// The data base64-encoded (standard alphabet, padded), as EC2's
    /// `UserData` and most clouds' user-data fields take it.
    pub fn to_base64(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&self.value)
    }
}

/// Deserialize a configuration (JSON object text) into `T`. Errors become
/// `invalid-config` with serde's description, which names the field.
pub fn parse_config<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, PluginError> {
    serde_json::from_str(json)
        .map_err(|e| PluginError::invalid_config(format!("{what} is invalid: {e}")))
}

/// An infrastructure provider, with the configuration already parsed.
///
/// The host creates a fresh instance of your plugin for every call, so keep
/// no state between calls: anything that must survive belongs in the cloud
/// (tag instances with the machine uid) or in the returned status.
pub trait Provider: Default {
    /// Your provider configuration (the Machine's `spec.provider.config`).
    type Config: DeserializeOwned;

    /// Check a configuration without side effects. The default accepts
    /// anything that deserializes.
    fn validate(&self, config: &Self::Config) -> Result<(), PluginError> {
        let _ = config;
        Ok(())
    }

    /// Create the instance for `machine`, or return the existing one.
    /// Must be idempotent by `machine.uid`. `bootstrap`, when set, is what
    /// the instance must boot with (its user data, in its format); it holds
    /// the machine's join credential: pass it to the instance only, and never
    /// log it or return it.
    fn create(
        &self,
        machine: &Machine,
        config: &Self::Config,
        bootstrap: Option<&BootstrapData>,
    ) -> Result<MachineStatus, PluginError>;

    /// Describe the instance for `machine`; `not-found` when there is none.
    fn get(&self, machine: &Machine, config: &Self::Config) -> Result<MachineStatus, PluginError>;

    /// Delete the instance for `machine`; `Done` when there is none.
    fn delete(&self, machine: &Machine, config: &Self::Config) -> Result<Deletion, PluginError>;

    /// List visible instances; `None` when listing is not supported.
    fn list(&self, config: &Self::Config) -> Result<Option<Vec<MachineStatus>>, PluginError> {
        let _ = config;
        Ok(None)
    }

    /// The instance a machine the host has recorded none for should adopt
    /// (after a restore, a re-apply or a move): the one `machine.provider_id`
    /// names when set, otherwise the live instance tagged for the machine's
    /// namespace and name, with the tags that say whom it was launched for.
    /// Tag instances at `create` so this can find them. The default finds
    /// nothing: a restored Machine then launches a second instance.
    fn find(
        &self,
        machine: &Machine,
        config: &Self::Config,
    ) -> Result<Option<FoundInstance>, PluginError> {
        let _ = (machine, config);
        Ok(None)
    }

    /// What one instance of `config` offers (CPU, memory, and what else you
    /// know), without launching one: the host writes it for the
    /// cluster-autoscaler, so a group at zero machines can scale up. The
    /// default says nothing (then a user sets the capacity annotations).
    fn capacity(&self, config: &Self::Config) -> Result<Option<InstanceCapacity>, PluginError> {
        let _ = config;
        Ok(None)
    }
}

/// Glue between the generated guest trait and [`Provider`]; used by
/// [`export_provider!`], and by native hosts calling a provider in-process.
pub mod provider_glue {
    use super::*;

    fn config<P: Provider>(json: &str) -> Result<P::Config, PluginError> {
        parse_config::<P::Config>("provider config", json)
    }

    pub fn validate<P: Provider>(json: &str) -> Result<(), PluginError> {
        let p = P::default();
        p.validate(&config::<P>(json)?)
    }
    pub fn create<P: Provider>(
        machine: &Machine,
        bootstrap: Option<&BootstrapData>,
    ) -> Result<MachineStatus, PluginError> {
        let p = P::default();
        let c = config::<P>(&machine.provider_config)?;
        p.validate(&c)?;
        p.create(machine, &c, bootstrap)
    }
    pub fn get<P: Provider>(machine: &Machine) -> Result<MachineStatus, PluginError> {
        let p = P::default();
        p.get(machine, &config::<P>(&machine.provider_config)?)
    }
    pub fn delete<P: Provider>(machine: &Machine) -> Result<Deletion, PluginError> {
        let p = P::default();
        p.delete(machine, &config::<P>(&machine.provider_config)?)
    }
    pub fn list<P: Provider>(json: &str) -> Result<Option<Vec<MachineStatus>>, PluginError> {
        let p = P::default();
        p.list(&config::<P>(json)?)
    }
    pub fn find<P: Provider>(machine: &Machine) -> Result<Option<FoundInstance>, PluginError> {
        let p = P::default();
        p.find(machine, &config::<P>(&machine.provider_config)?)
    }
    pub fn capacity<P: Provider>(json: &str) -> Result<Option<InstanceCapacity>, PluginError> {
        let p = P::default();
        let c = config::<P>(json)?;
        p.validate(&c)?;
        p.capacity(&c)
    }
}

/// Embed a plugin manifest file (path relative to the plugin's `Cargo.toml`)
/// into the component's `capstan-manifest` custom section. The export macros
/// call this for you.
#[macro_export]
macro_rules! plugin_manifest {
    ($path:literal) => {
        #[cfg_attr(target_arch = "wasm32", unsafe(link_section = "capstan-manifest"))]
        #[used]
        static __CAPSTAN_PLUGIN_MANIFEST: [u8; include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/",
            $path
        ))
        .len()] = *include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $path));
    };
}

/// Export a [`Provider`] implementation as the component's `provider` world
/// and embed its manifest: `export_provider!(MyProvider, manifest: "capstan-plugin.json");`
#[macro_export]
macro_rules! export_provider {
    ($ty:ty, manifest: $manifest:literal) => {
        $crate::plugin_manifest!($manifest);
        // Component exports exist only in the wasm build; natively the
        // provider is an ordinary Rust type (benchmarks, unit tests).
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::bindings::provider::exports::capstan::plugin0_2_0::provider as __world;
            struct __CapstanProvider;
            impl __world::Guest for __CapstanProvider {
                fn validate(config: String) -> Result<(), $crate::PluginError> {
                    $crate::provider_glue::validate::<$ty>(&config)
                }
                fn create(
                    machine: $crate::Machine,
                    bootstrap: Option<$crate::BootstrapData>,
                ) -> Result<$crate::MachineStatus, $crate::PluginError> {
                    $crate::provider_glue::create::<$ty>(&machine, bootstrap.as_ref())
                }
                fn get(
                    machine: $crate::Machine,
                ) -> Result<$crate::MachineStatus, $crate::PluginError> {
                    $crate::provider_glue::get::<$ty>(&machine)
                }
                fn delete(
                    machine: $crate::Machine,
                ) -> Result<$crate::Deletion, $crate::PluginError> {
                    $crate::provider_glue::delete::<$ty>(&machine)
                }
                fn list_instances(
                    config: String,
                ) -> Result<Option<Vec<$crate::MachineStatus>>, $crate::PluginError> {
                    $crate::provider_glue::list::<$ty>(&config)
                }
                fn find_instance(
                    machine: $crate::Machine,
                ) -> Result<Option<$crate::FoundInstance>, $crate::PluginError> {
                    $crate::provider_glue::find::<$ty>(&machine)
                }
                fn capacity(
                    config: String,
                ) -> Result<Option<$crate::InstanceCapacity>, $crate::PluginError> {
                    $crate::provider_glue::capacity::<$ty>(&config)
                }
            }
            $crate::bindings::provider::__export_provider_world!(__CapstanProvider);
        };
    };
}

/// A bootstrap provider, with the configuration already parsed: renders
/// the data an instance boots with to join its cluster.
///
/// You never see the join credential: write [`JoinInfo::token_placeholder`]
/// where the token goes (for example `token: <placeholder>` in a kubeadm
/// `JoinConfiguration`), and the host puts the machine's bootstrap token in
/// its place. Render deterministically: the same input, the same bytes.
pub trait Bootstrap: Default {
    /// Your bootstrap configuration (the Machine's `spec.bootstrap.config`).
    type Config: DeserializeOwned;

    /// Check a configuration without side effects. The default accepts
    /// anything that deserializes.
    fn validate(&self, config: &Self::Config) -> Result<(), PluginError> {
        let _ = config;
        Ok(())
    }

    /// Render the bootstrap data for `machine`.
    fn render(
        &self,
        machine: &Machine,
        config: &Self::Config,
        join: &JoinInfo,
    ) -> Result<BootstrapData, PluginError>;
}

/// Glue between the generated guest trait and [`Bootstrap`]; used by
/// [`export_bootstrap!`] and by native tests calling a plugin in-process.
pub mod bootstrap_glue {
    use super::*;

    fn config<B: Bootstrap>(json: &str) -> Result<B::Config, PluginError> {
        parse_config::<B::Config>("bootstrap config", json)
    }

    pub fn validate<B: Bootstrap>(json: &str) -> Result<(), PluginError> {
        B::default().validate(&config::<B>(json)?)
    }
    pub fn render<B: Bootstrap>(
        machine: &Machine,
        json: &str,
        join: &JoinInfo,
    ) -> Result<BootstrapData, PluginError> {
        let b = B::default();
        let c = config::<B>(json)?;
        b.validate(&c)?;
        b.render(machine, &c, join)
    }
}

/// Export a [`Bootstrap`] implementation as the component's `bootstrap`
/// world and embed its manifest: `export_bootstrap!(MyBootstrap, manifest: "capstan-plugin.json");`
#[macro_export]
macro_rules! export_bootstrap {
    ($ty:ty, manifest: $manifest:literal) => {
        $crate::plugin_manifest!($manifest);
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::bindings::bootstrap::exports::capstan::plugin0_2_0::bootstrap as __world;
            struct __CapstanBootstrap;
            impl __world::Guest for __CapstanBootstrap {
                fn validate(config: String) -> Result<(), $crate::PluginError> {
                    $crate::bootstrap_glue::validate::<$ty>(&config)
                }
                fn render(
                    machine: $crate::Machine,
                    config: String,
                    join: $crate::JoinInfo,
                ) -> Result<$crate::BootstrapData, $crate::PluginError> {
                    $crate::bootstrap_glue::render::<$ty>(&machine, &config, &join)
                }
            }
            $crate::bindings::bootstrap::__export_bootstrap_world!(__CapstanBootstrap);
        };
    };
}

/// Export an [`updater::Guest`] implementation (a type name in scope) as the
/// `updater` world and embed its manifest.
#[macro_export]
macro_rules! export_updater {
    ($ty:ident, manifest: $manifest:literal) => {
        $crate::plugin_manifest!($manifest);
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::updater::__export_updater_world!($ty);
    };
}

/// Export an [`addon::Guest`] implementation (a type name in scope) as the
/// `addon` world and embed its manifest.
#[macro_export]
macro_rules! export_addon {
    ($ty:ident, manifest: $manifest:literal) => {
        $crate::plugin_manifest!($manifest);
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::addon::__export_addon_world!($ty);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Cfg {
        endpoint: String,
    }

    #[test]
    fn config_errors_name_the_field() {
        let err = parse_config::<Cfg>("provider config", r#"{"endpont":"x"}"#).unwrap_err();
        match err {
            PluginError::InvalidConfig(m) => {
                assert!(m.contains("unknown field `endpont`"), "{m}");
                assert!(m.contains("endpoint"), "{m}");
            }
            other => panic!("expected invalid-config, got {other}"),
        }
        let err = parse_config::<Cfg>("provider config", "{}").unwrap_err();
        assert!(
            err.to_string().contains("missing field `endpoint`"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_ranges_attach_to_the_versions_they_name() {
        let table = addon::with_kubernetes(
            addon::version_table(&[("1.7.0", "stable"), ("1.8.2", "rapid"), ("1.8.2", "stable")]),
            &[("1.8.2", ">=1.20.0"), ("9.9.9", ">=2")],
        );
        assert_eq!(table.len(), 2);
        assert_eq!(table[0].kubernetes, None);
        assert_eq!(table[1].kubernetes.as_deref(), Some(">=1.20.0"));
        assert_eq!(table[1].channels, ["rapid", "stable"]);
    }

    #[test]
    fn transient_never_carries_zero_retry() {
        match PluginError::transient("busy", 0) {
            PluginError::Transient(t) => assert_eq!(t.retry_after_ms, 1),
            _ => unreachable!(),
        }
    }
}
