//! The Capstan plugin runtime: the only crate that knows wasmtime.
//!
//! One [`Runtime`] owns one `wasmtime::Engine` (pooling allocator, epoch
//! interruption), the linker with the sandbox's imports, and the
//! precompiled-code cache. [`Runtime::load`] verifies a component's manifest,
//! compiles it once per digest (or loads the cached native code), and
//! pre-instantiates it. Every call then gets a fresh store and instance, with
//! the plugin's [`Limits`] and [`Grants`] applied:
//!
//! - a wall-clock deadline (epoch interruption while running Wasm, a timer
//!   around waits on HTTP), at most [`limits::MAX_CALL_TIMEOUT`];
//! - no host thread held: calls run on the runtime's own call threads
//!   (`RuntimeConfig::call_threads`, one per core by default), not the
//!   controllers' executor, and running Wasm yields at every epoch tick,
//!   so a CPU-bound plugin never starves leader election, health probes
//!   or other calls; and at most `max_concurrent_calls` calls run at once,
//!   host-wide (later ones wait their turn);
//! - a memory cap over every memory and table of the instance (a store
//!   limiter), and host-side objects within a per-call budget;
//! - bounded stdout/stderr and log volume, and a bounded return value;
//!   what the guest hands the host in one crossing is bounded before the
//!   host copies it (wasmtime's hostcall fuel, [`Limits::hostcall_bytes`]);
//! - outbound HTTP only to destinations declared *and* granted, with
//!   credentials attached (or AWS requests signed) by the host (see
//!   [`grants`]), within per-call budgets of requests in flight and in total;
//! - a bounded resource table, so a guest cannot pile up host-side handles;
//! - no filesystem, environment, sockets or stdin.
//!
//! Start with [`Runtime::new`], [`Runtime::load`], and the typed handle of
//! each world: [`ProviderPlugin`], [`UpdaterPlugin`], [`AddonPlugin`].
//! Errors are one typed [`Error`], distinguishing contract errors returned by
//! the plugin from traps and each kind of limit.
//!
//! Where each concern lives:
//!
//! | module | what |
//! |---|---|
//! | `engine` | [`Runtime`]: the engine, pooling allocator, epoch ticker, linker, loading |
//! | `plugin` | [`Plugin`]: a loaded component and the per-call path (store, slot, deadline, error classification) |
//! | `worlds` | typed handles per world, one method per contract function |
//! | `call` | what one call holds: store state, log host, memory limiter, return sizes |
//! | `tape` | record and replay at the sandbox's edge: cassettes, matching, taped clocks and randomness, the secret scan |
//! | `last_words` | what a guest said on stderr before it trapped (Rust panic, Python traceback, JavaScript error) |
//! | `http` | the egress gate every outbound request passes |
//! | `quota` | per-plugin quotas across calls: concurrent calls, calls and requests per minute |
//! | [`observe`] | what the runtime tells its observer (the controllers' per-plugin metrics) |
//! | `resolve` | name resolution of that gate: granted names never reach internal addresses |
//! | `workers` | the call threads calls run on (one executor and connection pool each) |
//! | [`profile`] | where calls spend their time ([`Runtime::call_profile`]) |
//! | [`grants`] | what an admin granted, and the gate's decision |
//! | `credentials` | credentials attached by the host (Authorization, AWS SigV4) |
//! | [`limits`] | per-plugin limits and their defaults |
//! | [`cache`] | precompiled code by digest |

mod allocator;
pub mod cache;
mod call;
mod capstan_http;
mod capture;
mod credentials;
mod engine;
mod error;
mod gate;
pub mod grants;
mod http;
mod last_words;
pub mod limits;
pub mod observe;
mod plugin;
pub mod profile;
pub mod quota;
mod ready;
mod resolve;
pub mod tape;
mod workers;
mod worlds;

pub use allocator::keep_allocator_headroom;
pub use cache::CodeCache;
pub use capstan_manifest::{Footprint, PluginManifest, World};
pub use capstan_sigv4::{Credentials as AwsCredentials, Scope as AwsScope};
pub use engine::{CallInputs, InputRecorder, OutboundGate};
pub use error::{Error, OutputKind, describe};
pub use grants::{CREDENTIAL_METHODS, Credential, Grants};
pub use limits::Limits;
pub use observe::{Observer, Outbound};
pub use profile::CallProfile;
pub use quota::{Quota, QuotaHit, QuotaKind, QuotaSpec};

use capstan_manifest::HttpCapability;
use capture::Capture;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// Host bindings generated from `wit/`, one module per world; the shared
/// interfaces are generated once (in `provider`) and reused.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod bindings {
    /// One world's bindings, generated as every world's are (trappable
    /// imports, async exports, serializable types); `with` reuses the
    /// interfaces another module already generated.
    macro_rules! world {
        ($world:literal $(, with: { $($with:tt)* })?) => {
            wasmtime::component::bindgen!({
                path: "../../wit",
                world: $world,
                imports: { default: trappable },
                exports: { default: async },
                additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
                $(with: { $($with)* },)?
            });
        };
    }

    pub mod provider {
        world!("capstan:plugin/provider-plugin@0.1.0");
    }
    pub mod updater {
        world!("capstan:plugin/updater-plugin@0.1.0", with: {
            "capstan:plugin/types@0.1.0": super::provider::capstan::plugin0_1_0::types,
            "capstan:plugin/log@0.1.0": super::provider::capstan::plugin0_1_0::log,
        });
    }
    pub mod addon {
        world!("capstan:plugin/addon-plugin@0.1.0", with: {
            "capstan:plugin/types@0.1.0": super::provider::capstan::plugin0_1_0::types,
            "capstan:plugin/log@0.1.0": super::provider::capstan::plugin0_1_0::log,
        });
    }
    /// Contract 0.2.0's provider world: `create` also takes bootstrap data.
    pub mod provider_v2 {
        world!("capstan:plugin/provider-plugin@0.2.0", with: {
            "capstan:plugin/types@0.1.0": super::provider::capstan::plugin0_1_0::types,
            "capstan:plugin/log@0.1.0": super::provider::capstan::plugin0_1_0::log,
        });
    }
    /// Contract 0.2.0's addon world: the cluster's Kubernetes version in,
    /// a Kubernetes range per version out.
    pub mod addon_v2 {
        world!("capstan:plugin/addon-plugin@0.2.0", with: {
            "capstan:plugin/types@0.1.0": super::provider::capstan::plugin0_1_0::types,
            "capstan:plugin/log@0.1.0": super::provider::capstan::plugin0_1_0::log,
        });
    }
    /// Contract 0.3.0's one new import, `capstan:plugin/http` (one host
    /// call per outbound request). Its worlds export 0.2.0's interfaces,
    /// bound by the modules above; only the import is used from here.
    pub mod http_v3 {
        wasmtime::component::bindgen!({
            path: "../../wit",
            world: "capstan:plugin/bootstrap-plugin@0.3.0",
            imports: { default: trappable, "capstan:plugin/http.send": async | trappable },
            exports: { default: async },
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
            with: {
                "capstan:plugin/types@0.1.0": super::provider::capstan::plugin0_1_0::types,
                "capstan:plugin/log@0.1.0": super::provider::capstan::plugin0_1_0::log,
                "capstan:plugin/bootstrap-types@0.2.0": super::provider_v2::capstan::plugin0_2_0::bootstrap_types,
            },
        });
    }
    /// Contract 0.2.0's bootstrap world.
    pub mod bootstrap {
        world!("capstan:plugin/bootstrap-plugin@0.2.0", with: {
            "capstan:plugin/types@0.1.0": super::provider::capstan::plugin0_1_0::types,
            "capstan:plugin/log@0.1.0": super::provider::capstan::plugin0_1_0::log,
            "capstan:plugin/bootstrap-types@0.2.0": super::provider_v2::capstan::plugin0_2_0::bootstrap_types,
        });
    }
}

/// The contract's data types, as the host sees them.
pub mod types {
    pub use crate::bindings::addon_v2::exports::capstan::plugin0_2_0::addon::{
        AddonSpec, Health, VersionInfo,
    };
    pub use crate::bindings::provider::capstan::plugin0_1_0::types::*;
    pub use crate::bindings::provider::exports::capstan::plugin0_1_0::provider::Deletion;
    pub use crate::bindings::provider_v2::capstan::plugin0_2_0::bootstrap_types::{
        BootstrapData, BootstrapFormat, JoinInfo, Taint,
    };
    pub use crate::bindings::provider_v2::exports::capstan::plugin0_2_0::provider::{
        FoundInstance, InstanceCapacity,
    };
    pub use crate::bindings::updater::exports::capstan::plugin0_1_0::updater::{
        UpdateInProgress, UpdateProgress,
    };
}

use bindings::http_v3::capstan::plugin0_3_0::http as wit_http;
use bindings::provider::capstan::plugin0_1_0::log as wit_log;
use types::{
    AddonSpec, BootstrapData, Deletion, FoundInstance, Health, InstanceCapacity, JoinInfo, Machine,
    MachineStatus, PluginError, UpdateProgress, VersionInfo,
};

pub use limits::MAX_RESOURCES_PER_CALL;

use call::{CallState, MemoryLimiter, ReturnSize};
use engine::RuntimeInner;
pub use engine::{
    DEFAULT_READY_INSTANCES, LoadPath, Runtime, RuntimeConfig, default_call_threads, digest,
    over_call_maxima,
};
pub use plugin::Plugin;

/// Told each log line of a plugin's calls, with the call's name
/// ([`Plugin::with_log_sink`]).
pub type LogSink = Arc<dyn Fn(&'static str, &str) + Send + Sync>;
use plugin::PluginInner;
pub use worlds::{AddonPlugin, BootstrapPlugin, ProviderPlugin, UpdaterPlugin};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn provider_calls_are_send_so_controllers_can_spawn_them() {
        // Compile-time check on the future type of every call.
        fn check(p: &ProviderPlugin, m: &Machine) {
            assert_send(&p.create(m, None));
            assert_send(&p.get(m));
            assert_send(&p.delete(m));
            assert_send(&p.validate(""));
            assert_send(&p.list(""));
        }
        let _ = check;
    }

    #[test]
    fn loading_garbage_names_the_source() {
        let rt = Runtime::new(RuntimeConfig {
            max_concurrent_calls: 2,
            ..Default::default()
        })
        .unwrap();
        let err = rt
            .load(
                "junk.wasm",
                b"not wasm",
                Limits::default(),
                Grants::default(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("junk.wasm"), "{err}");
    }
}
