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
//! - no host thread held: running Wasm yields to the executor at every
//!   epoch tick, so a CPU-bound plugin never starves leader election,
//!   health probes or other calls; and at most `max_concurrent_calls`
//!   calls run at once, host-wide (later ones wait their turn);
//! - a linear-memory cap (a store limiter);
//! - bounded stdout/stderr and log volume, and a bounded return value;
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

pub mod cache;
mod capture;
mod error;
pub mod grants;
mod http;
pub mod limits;

pub use cache::CodeCache;
pub use capstan_manifest::{PluginManifest, World};
pub use capstan_sigv4::{Credentials as AwsCredentials, Scope as AwsScope};
pub use error::{Error, OutputKind, describe};
pub use grants::{Credential, Grants};
pub use limits::Limits;

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
    pub mod provider {
        wasmtime::component::bindgen!({
            path: "../../wit",
            world: "capstan:plugin/provider-plugin@0.1.0",
            imports: { default: trappable },
            exports: { default: async },
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        });
    }
    pub mod updater {
        wasmtime::component::bindgen!({
            path: "../../wit",
            world: "capstan:plugin/updater-plugin@0.1.0",
            imports: { default: trappable },
            exports: { default: async },
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
            with: {
                "capstan:plugin/types": super::provider::capstan::plugin::types,
                "capstan:plugin/log": super::provider::capstan::plugin::log,
            },
        });
    }
    pub mod addon {
        wasmtime::component::bindgen!({
            path: "../../wit",
            world: "capstan:plugin/addon-plugin@0.1.0",
            imports: { default: trappable },
            exports: { default: async },
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
            with: {
                "capstan:plugin/types": super::provider::capstan::plugin::types,
                "capstan:plugin/log": super::provider::capstan::plugin::log,
            },
        });
    }
}

/// The contract's data types, as the host sees them.
pub mod types {
    pub use crate::bindings::addon::exports::capstan::plugin::addon::{
        AddonSpec, Health, VersionInfo,
    };
    pub use crate::bindings::provider::capstan::plugin::types::*;
    pub use crate::bindings::provider::exports::capstan::plugin::provider::Deletion;
    pub use crate::bindings::updater::exports::capstan::plugin::updater::{
        UpdateInProgress, UpdateProgress,
    };
}

use bindings::provider::capstan::plugin::log as wit_log;
use types::{
    AddonSpec, Deletion, Health, Machine, MachineStatus, PluginError, UpdateProgress, VersionInfo,
};

pub use limits::MAX_RESOURCES_PER_CALL;

/// Engine-wide settings. Per-plugin settings are [`Limits`] and [`Grants`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where precompiled code is cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Most plugin calls in flight at once, host-wide (sizes the instance
    /// pool; further calls wait for a slot).
    pub max_concurrent_calls: u32,
    /// Largest memory cap any plugin may be given.
    pub max_memory_bytes: usize,
    /// Epoch tick: the granularity of call deadlines.
    pub epoch_tick: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            max_concurrent_calls: 256,
            max_memory_bytes: 1024 * 1024 * 1024,
            epoch_tick: Duration::from_millis(5),
        }
    }
}

/// The plugin host: one engine, one linker, one code cache.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    linker: Linker<CallState>,
    cache: Option<CodeCache>,
    engine_hash: String,
    config: RuntimeConfig,
    ticker_stop: Arc<AtomicBool>,
    ticker: Mutex<Option<std::thread::JoinHandle<()>>>,
    http_client: http::PooledClient,
    /// One permit per call that may run at once.
    calls: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for RuntimeInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeInner")
            .field("engine_hash", &self.engine_hash)
            .field("cache", &self.cache)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// How a plugin was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadPath {
    /// Compiled now (and stored in the cache, if any).
    Compiled,
    /// Native code loaded from the cache.
    Cached,
}

impl Runtime {
    /// Build the engine, the sandbox linker and the cache, and start the
    /// epoch ticker that enforces deadlines.
    pub fn new(config: RuntimeConfig) -> Result<Self, Error> {
        let engine_err = |e: wasmtime::Error| Error::Engine(format!("{e:#}"));
        let mut pool = PoolingAllocationConfig::new();
        let n = config.max_concurrent_calls.max(1);
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(4))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(4))
            .total_stacks(n)
            .max_memory_size(config.max_memory_bytes);
        let mut wasm = Config::new();
        wasm.wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm).map_err(engine_err)?;

        let mut linker = Linker::<CallState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_err)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(engine_err)?;
        wit_log::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(engine_err)?;

        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_hash = format!("{:016x}", hasher.finish());
        let http_client = http::pooled_client().map_err(Error::Engine)?;
        let cache = config
            .cache_dir
            .as_deref()
            .map(CodeCache::open)
            .transpose()?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            let tick = config.epoch_tick;
            std::thread::Builder::new()
                .name("capstan-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })
                .map_err(|error| Error::Io {
                    what: "cannot start the epoch ticker".into(),
                    error,
                })?
        };
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                linker,
                cache,
                engine_hash,
                config,
                ticker_stop,
                ticker: Mutex::new(Some(ticker)),
                http_client,
                calls: Arc::new(tokio::sync::Semaphore::new(n as usize)),
            }),
        })
    }

    /// The precompiled-code cache, if configured.
    pub fn cache(&self) -> Option<&CodeCache> {
        self.inner.cache.as_ref()
    }

    /// Load a plugin from a file (development sources, `file://`).
    pub fn load_file(&self, path: &Path, limits: Limits, grants: Grants) -> Result<Plugin, Error> {
        let bytes = std::fs::read(path).map_err(|error| Error::Io {
            what: format!("cannot read plugin {}", path.display()),
            error,
        })?;
        self.load(&path.display().to_string(), &bytes, limits, grants)
    }

    /// Load a plugin component: check its manifest, compile it (or load the
    /// cached code), and pre-instantiate it against the sandbox.
    /// `source` names where the bytes came from, for error messages.
    pub fn load(
        &self,
        source: &str,
        bytes: &[u8],
        limits: Limits,
        grants: Grants,
    ) -> Result<Plugin, Error> {
        let manifest = PluginManifest::from_component(bytes).map_err(|error| Error::Manifest {
            source_name: source.to_string(),
            error,
        })?;
        let name = manifest.name.clone();
        if limits.call_timeout > limits::MAX_CALL_TIMEOUT {
            return Err(Error::Load {
                plugin: name,
                reason: format!(
                    "call timeout {} ms exceeds the host's maximum of {} ms",
                    limits.call_timeout.as_millis(),
                    limits::MAX_CALL_TIMEOUT.as_millis()
                ),
            });
        }
        if limits.memory_bytes > self.inner.config.max_memory_bytes {
            return Err(Error::Load {
                plugin: name,
                reason: format!(
                    "memory limit {} exceeds the host's maximum of {} bytes",
                    limits.memory_bytes, self.inner.config.max_memory_bytes
                ),
            });
        }
        let digest = digest(bytes);
        let (component, load_path) = self.compile_cached(&name, &digest, bytes)?;

        let export = manifest.world.export_interface();
        let engine = &self.inner.engine;
        let exports: Vec<String> = component
            .component_type()
            .exports(engine)
            .map(|(n, _)| n.to_string())
            .collect();
        if !exports.contains(&export) {
            return Err(Error::Load {
                plugin: name,
                reason: format!(
                    "the manifest says world `{}` but the component does not export {export} (it exports: {})",
                    manifest.world,
                    if exports.is_empty() {
                        "nothing".into()
                    } else {
                        exports.join(", ")
                    }
                ),
            });
        }
        let pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| Error::Link {
                plugin: name.clone(),
                reason: format!("{e:#}"),
            })?;
        let declared: Arc<[HttpCapability]> = manifest.capabilities.http.clone().into();
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                name: name.into(),
                manifest,
                digest,
                load_path,
                component,
                pre,
                limits,
                grants: Arc::new(grants),
                declared,
                runtime: self.inner.clone(),
            }),
        })
    }

    fn compile_cached(
        &self,
        name: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, LoadPath), Error> {
        let key = CodeCache::key(digest, &self.inner.engine_hash);
        if let Some(cache) = &self.inner.cache
            && let Some(code) = cache.get(&key)
        {
            match self.deserialize(&code) {
                Ok(component) => return Ok((component, LoadPath::Cached)),
                Err(e) => {
                    tracing::warn!(plugin = name, error = %e, "discarding unusable precompiled code");
                    cache.remove(&key);
                }
            }
        }
        let component = Component::new(&self.inner.engine, bytes).map_err(|e| Error::Load {
            plugin: name.to_string(),
            reason: format!("does not compile: {e:#}"),
        })?;
        if let Some(cache) = &self.inner.cache {
            match component.serialize() {
                Ok(code) => {
                    if let Err(e) = cache.put(&key, &code) {
                        tracing::warn!(plugin = name, error = %e, "cannot store precompiled code");
                    }
                }
                Err(e) => {
                    tracing::warn!(plugin = name, error = %e, "cannot serialize compiled code")
                }
            }
        }
        Ok((component, LoadPath::Compiled))
    }

    #[allow(unsafe_code)]
    fn deserialize(&self, code: &[u8]) -> wasmtime::Result<Component> {
        // SAFETY: `code` was produced by `Component::serialize` on an engine
        // with the same compatibility hash (it is in the cache key) and read
        // from the host-owned 0700 cache directory; wasmtime additionally
        // checks the header and version before using it.
        unsafe { Component::deserialize(&self.inner.engine, code) }
    }
}

/// `sha256:<hex>` of some bytes: how plugins are identified.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A loaded, pre-instantiated plugin. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    name: Arc<str>,
    manifest: PluginManifest,
    digest: String,
    load_path: LoadPath,
    component: Component,
    pre: InstancePre<CallState>,
    limits: Limits,
    grants: Arc<Grants>,
    declared: Arc<[HttpCapability]>,
    runtime: Arc<RuntimeInner>,
}

impl std::fmt::Debug for PluginInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// The plugin's name (from its manifest).
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The verified manifest.
    pub fn manifest(&self) -> &PluginManifest {
        &self.inner.manifest
    }
    /// `sha256:<hex>` of the component bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }
    /// Whether this load compiled or used cached code.
    pub fn load_path(&self) -> LoadPath {
        self.inner.load_path
    }
    /// The limits applied to every call.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }
    /// Names of the component's imports (interfaces and functions).
    pub fn imports(&self) -> Vec<String> {
        let engine = &self.inner.runtime.engine;
        self.inner
            .component
            .component_type()
            .imports(engine)
            .map(|(n, _)| n.to_string())
            .collect()
    }
    /// Names of the component's exports.
    pub fn exports(&self) -> Vec<String> {
        let engine = &self.inner.runtime.engine;
        self.inner
            .component
            .component_type()
            .exports(engine)
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// This plugin as a provider; fails if it implements another world.
    pub fn provider(&self) -> Result<ProviderPlugin, Error> {
        ProviderPlugin::new(self)
    }

    /// This plugin as an in-place updater; fails if it implements another world.
    pub fn updater(&self) -> Result<UpdaterPlugin, Error> {
        UpdaterPlugin::new(self)
    }

    /// This plugin as an addon operator; fails if it implements another world.
    pub fn addon(&self) -> Result<AddonPlugin, Error> {
        AddonPlugin::new(self)
    }

    fn expect_world(&self, expected: World) -> Result<(), Error> {
        let actual = self.inner.manifest.world;
        if actual == expected {
            Ok(())
        } else {
            Err(Error::WrongWorld {
                plugin: self.name().to_string(),
                expected,
                actual,
            })
        }
    }

    /// A fresh store for one call, with every limit armed.
    fn new_store(&self, call: &'static str) -> Store<CallState> {
        let inner = &self.inner;
        let limits = inner.limits;
        let stdout = Capture::new("stdout", limits.stdio_bytes);
        let stderr = Capture::new("stderr", limits.stdio_bytes);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = CallState {
            wasi,
            table: {
                let mut table = ResourceTable::new();
                table.set_max_capacity(MAX_RESOURCES_PER_CALL);
                table
            },
            http_ctx: {
                let mut ctx = WasiHttpCtx::new();
                ctx.set_field_size_limit(limits::MAX_FIELDS_BYTES);
                ctx
            },
            http: http::HttpGate {
                plugin: inner.name.clone(),
                declared: inner.declared.clone(),
                grants: inner.grants.clone(),
                denial: Arc::default(),
                exhausted: Arc::default(),
                max_in_flight: limits.max_requests_in_flight,
                max_total: limits.max_requests_per_call,
                in_flight: Arc::default(),
                sent: 0,
                client: inner.runtime.http_client.clone(),
            },
            memory: MemoryLimiter {
                limit: limits.memory_bytes,
                used: 0,
                refused: None,
            },
            stdout,
            stderr,
            log_left: limits.log_bytes,
            log_overflowed: false,
            plugin: inner.name.clone(),
            call,
        };
        let mut store = Store::new(&inner.runtime.engine, state);
        store.limiter(|s| &mut s.memory);
        // Every tick, running Wasm hands its thread back to the executor
        // (tokio's own yield, so the task's budget is honoured too); past
        // the wall-clock deadline it traps. Set before instantiating, since
        // instantiation runs guest code.
        let deadline = std::time::Instant::now() + limits.call_timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            Ok(if std::time::Instant::now() >= deadline {
                wasmtime::UpdateDeadline::Interrupt
            } else {
                wasmtime::UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now()))
            })
        });
        store
    }

    /// Run one call in a fresh store under the plugin's limits and turn
    /// whatever happened into a typed result.
    async fn invoke<T: ReturnSize>(
        &self,
        call: &'static str,
        f: impl AsyncFnOnce(&mut Store<CallState>) -> wasmtime::Result<Result<T, PluginError>>,
    ) -> Result<T, Error> {
        let started = std::time::Instant::now();
        let limit = self.inner.limits.call_timeout;
        // A slot first: the deadline counts from when the call may run.
        let _slot = tokio::time::timeout(limit, self.inner.runtime.calls.clone().acquire_owned())
            .await
            .map_err(|_| Error::DeadlineExceeded {
                plugin: self.name().into(),
                call,
                limit,
            })?
            .map_err(|_| Error::Engine("the runtime is shutting down".into()))?;
        let mut store = self.new_store(call);
        let outcome = tokio::time::timeout(limit, f(&mut store)).await;
        let state = store.data();
        let result = match outcome {
            Err(_) => Err(Error::DeadlineExceeded {
                plugin: self.name().into(),
                call,
                limit,
            }),
            Ok(Err(e)) => Err(self.classify(call, &e, state)),
            Ok(Ok(r)) => self.check_returned(call, r, state),
        };
        state.emit_stdio();
        tracing::debug!(
            plugin = %self.inner.name,
            call,
            elapsed_us = started.elapsed().as_micros() as u64,
            ok = result.is_ok(),
            "plugin call"
        );
        result
    }

    fn limit_hit(&self, call: &'static str, state: &CallState) -> Option<Error> {
        let plugin = self.name().to_string();
        let limits = &self.inner.limits;
        if let Some(requested_bytes) = state.memory.refused {
            return Some(Error::MemoryLimit {
                plugin,
                call,
                limit_bytes: limits.memory_bytes,
                requested_bytes,
            });
        }
        let output = |kind, limit_bytes| Error::OutputLimit {
            plugin: plugin.clone(),
            call,
            kind,
            limit_bytes,
        };
        if state.stdout.overflowed() {
            return Some(output(OutputKind::Stdout, limits.stdio_bytes));
        }
        if state.stderr.overflowed() {
            return Some(output(OutputKind::Stderr, limits.stdio_bytes));
        }
        if state.log_overflowed {
            return Some(output(OutputKind::Log, limits.log_bytes));
        }
        if let Some((limit, size)) = state.http.exhausted() {
            return Some(Error::RequestLimit {
                plugin,
                call,
                limit,
                size,
            });
        }
        state.http.denial().map(|detail| Error::CapabilityDenied {
            plugin: plugin.clone(),
            call,
            detail,
        })
    }

    fn classify(&self, call: &'static str, err: &wasmtime::Error, state: &CallState) -> Error {
        if let Some(limit) = self.limit_hit(call, state) {
            return limit;
        }
        if err.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            return Error::DeadlineExceeded {
                plugin: self.name().into(),
                call,
                limit: self.inner.limits.call_timeout,
            };
        }
        let mut message = match err.downcast_ref::<Trap>() {
            Some(trap) => trap.to_string(),
            None => format!("{err:#}"),
        };
        // A Rust guest says why it panicked on stderr just before trapping.
        // Its message follows on the next line(s), before any `note:` hint.
        let stderr = state.stderr.text();
        if let Some(at) = stderr.rfind("panicked at") {
            let panic: Vec<&str> = stderr[at..]
                .lines()
                .take_while(|l| !l.starts_with("note:"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .take(4)
                .collect();
            message = format!("{message}; the plugin {}", panic.join(" "));
        }
        Error::Trap {
            plugin: self.name().into(),
            call,
            message,
        }
    }

    fn check_returned<T: ReturnSize>(
        &self,
        call: &'static str,
        returned: Result<T, PluginError>,
        state: &CallState,
    ) -> Result<T, Error> {
        // A limit or a denial wins over whatever the plugin made of it.
        if let Some(limit) = self.limit_hit(call, state) {
            return Err(limit);
        }
        let size = match &returned {
            Ok(v) => v.return_size(),
            Err(e) => e.return_size(),
        };
        let limit_bytes = self.inner.limits.return_bytes;
        if size > limit_bytes {
            return Err(Error::OutputLimit {
                plugin: self.name().into(),
                call,
                kind: OutputKind::ReturnValue,
                limit_bytes,
            });
        }
        returned.map_err(|error| Error::Plugin {
            plugin: self.name().into(),
            call,
            error,
        })
    }
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
            fn new(plugin: &Plugin) -> Result<Self, Error> {
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
                        let instance = pre.instantiate_async(&mut *store).await?;
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
        self.call("versions", async |s, p| p.call_versions(s).await)
            .await
    }

    /// `render`: the objects (JSON text each) for `spec`.
    pub async fn render(&self, spec: &AddonSpec) -> Result<Vec<String>, Error> {
        self.call("render", async |s, p| p.call_render(s, spec).await)
            .await
    }

    /// `assess`: health judged from the observed objects (JSON text each).
    pub async fn assess(&self, spec: &AddonSpec, observed: &[String]) -> Result<Health, Error> {
        self.call("assess", async |s, p| {
            p.call_assess(s, spec, observed).await
        })
        .await
    }
}

impl ProviderPlugin {
    /// `validate(config)`.
    pub async fn validate(&self, config: &str) -> Result<(), Error> {
        self.call("validate", async |s, p| p.call_validate(s, config).await)
            .await
    }

    /// `create(machine)`.
    pub async fn create(&self, machine: &Machine) -> Result<MachineStatus, Error> {
        self.call("create", async |s, p| p.call_create(s, machine).await)
            .await
    }

    /// `get(machine)`.
    pub async fn get(&self, machine: &Machine) -> Result<MachineStatus, Error> {
        self.call("get", async |s, p| p.call_get(s, machine).await)
            .await
    }

    /// `delete(machine)`.
    pub async fn delete(&self, machine: &Machine) -> Result<Deletion, Error> {
        self.call("delete", async |s, p| p.call_delete(s, machine).await)
            .await
    }

    /// `list-instances(config)`; `None` when the plugin does not list.
    pub async fn list(&self, config: &str) -> Result<Option<Vec<MachineStatus>>, Error> {
        self.call("list-instances", async |s, p| {
            p.call_list_instances(s, config).await
        })
        .await
    }

    /// Instantiate in a fresh store and call nothing: measures the per-call
    /// setup cost (benchmarks).
    pub async fn instantiate_only(&self) -> Result<(), Error> {
        let pre = &self.pre;
        self.plugin
            .invoke("instantiate", async |store| {
                pre.instantiate_async(&mut *store).await?;
                Ok(Ok(()))
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
        self.call("can-update", async |s, p| {
            p.call_can_update(s, current, desired, changed_fields).await
        })
        .await
    }

    /// `update`: apply the claimed fields (re-entrant).
    pub async fn update(
        &self,
        current: &Machine,
        desired: &Machine,
        claimed_fields: &[String],
    ) -> Result<UpdateProgress, Error> {
        self.call("update", async |s, p| {
            p.call_update(s, current, desired, claimed_fields).await
        })
        .await
    }
}

/// Everything one call's store holds.
struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    http_ctx: WasiHttpCtx,
    http: http::HttpGate,
    memory: MemoryLimiter,
    stdout: Capture,
    stderr: Capture,
    log_left: usize,
    log_overflowed: bool,
    plugin: Arc<str>,
    call: &'static str,
}

impl CallState {
    /// Turn captured stdout/stderr into log lines tagged with the plugin.
    fn emit_stdio(&self) {
        for (stream, capture) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            for line in capture.text().lines().filter(|l| !l.trim().is_empty()) {
                tracing::info!(target: "capstan::plugin", plugin = %self.plugin, call = self.call, stream, "{line}");
            }
        }
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http,
        }
    }
}

impl wit_log::Host for CallState {
    fn log(
        &mut self,
        level: wit_log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let size = message.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if size > self.log_left {
            self.log_overflowed = true;
            self.log_left = 0;
            wasmtime::bail!("log volume limit exceeded");
        }
        self.log_left -= size;
        let plugin = &*self.plugin;
        let call = self.call;
        let fields = LogFields(&fields);
        match level {
            wit_log::Level::Trace => {
                tracing::trace!(target: "capstan::plugin", plugin, call, %fields, "{message}")
            }
            wit_log::Level::Debug => {
                tracing::debug!(target: "capstan::plugin", plugin, call, %fields, "{message}")
            }
            wit_log::Level::Info => {
                tracing::info!(target: "capstan::plugin", plugin, call, %fields, "{message}")
            }
            wit_log::Level::Warn => {
                tracing::warn!(target: "capstan::plugin", plugin, call, %fields, "{message}")
            }
            wit_log::Level::Error => {
                tracing::error!(target: "capstan::plugin", plugin, call, %fields, "{message}")
            }
        }
        Ok(())
    }
}

struct LogFields<'a>(&'a [(String, String)]);

impl std::fmt::Display for LogFields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k}={v:?}")?;
        }
        Ok(())
    }
}

/// Refuses memory growth past the plugin's cap and remembers that it did,
/// so the resulting trap is reported as a memory limit, not a bug.
/// The plugin's memory limit over the whole instance: every linear memory
/// and every table of every core instance in the component counts against
/// one budget (a component may hold several, each within the pool's size).
struct MemoryLimiter {
    limit: usize,
    /// Bytes of memories and tables this instance holds now.
    used: usize,
    refused: Option<usize>,
}

/// What one table element is counted as: a function reference on the host
/// (pointer plus type information), rounded up.
const TABLE_ELEMENT_BYTES: usize = 16;
/// Most memories, tables and core instances one call's component may have
/// (a Rust plugin has one memory, one or two tables and a handful of core
/// instances).
const MAX_MEMORIES_PER_CALL: usize = 16;
const MAX_TABLES_PER_CALL: usize = 32;
const MAX_INSTANCES_PER_CALL: usize = 64;

impl MemoryLimiter {
    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.refused.get_or_insert(total);
            return false;
        }
        self.used = total;
        true
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }
    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }
    fn instances(&self) -> usize {
        MAX_INSTANCES_PER_CALL
    }
    fn tables(&self) -> usize {
        MAX_TABLES_PER_CALL
    }
    fn memories(&self) -> usize {
        MAX_MEMORIES_PER_CALL
    }
}

/// Approximate wire size of a returned value (strings and list elements).
trait ReturnSize {
    fn return_size(&self) -> usize;
}

impl ReturnSize for () {
    fn return_size(&self) -> usize {
        0
    }
}
impl ReturnSize for String {
    fn return_size(&self) -> usize {
        self.len()
    }
}
impl<T: ReturnSize> ReturnSize for Option<T> {
    fn return_size(&self) -> usize {
        self.as_ref().map_or(0, ReturnSize::return_size)
    }
}
impl<T: ReturnSize> ReturnSize for Vec<T> {
    fn return_size(&self) -> usize {
        self.iter().map(|v| v.return_size() + 8).sum()
    }
}
impl ReturnSize for Deletion {
    fn return_size(&self) -> usize {
        8
    }
}
impl ReturnSize for types::MachineAddress {
    fn return_size(&self) -> usize {
        self.address.len() + 1
    }
}
impl ReturnSize for MachineStatus {
    fn return_size(&self) -> usize {
        self.provider_id.len()
            + self.addresses.return_size()
            + self.failure_domain.return_size()
            + self.version.return_size()
            + self.message.return_size()
            + 1
    }
}
impl ReturnSize for UpdateProgress {
    fn return_size(&self) -> usize {
        match self {
            UpdateProgress::Done => 1,
            UpdateProgress::InProgress(p) => p.message.return_size() + 16,
            UpdateProgress::Failed(m) => m.len(),
        }
    }
}

impl ReturnSize for VersionInfo {
    fn return_size(&self) -> usize {
        self.version.len() + self.channels.return_size()
    }
}
impl ReturnSize for (String, String) {
    fn return_size(&self) -> usize {
        self.0.len() + self.1.len()
    }
}
impl ReturnSize for Health {
    fn return_size(&self) -> usize {
        1 + self.message.return_size() + self.details.return_size()
    }
}

impl ReturnSize for PluginError {
    fn return_size(&self) -> usize {
        match self {
            PluginError::InvalidConfig(m)
            | PluginError::NotFound(m)
            | PluginError::Unauthorized(m)
            | PluginError::Terminal(m) => m.len(),
            PluginError::Transient(t) => t.message.len() + 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn provider_calls_are_send_so_controllers_can_spawn_them() {
        // Compile-time check on the future type of every call.
        fn check(p: &ProviderPlugin, m: &Machine) {
            assert_send(&p.create(m));
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

    /// A core module with `memories` memories of `pages` 64 KiB pages each
    /// and `tables` funcref tables of `elements` elements each, encoded by
    /// hand (no text-format dependency).
    fn module(memories: u32, pages: u32, tables: u32, elements: u32) -> Vec<u8> {
        fn leb(mut n: u32, out: &mut Vec<u8>) {
            loop {
                let byte = (n & 0x7f) as u8;
                n >>= 7;
                if n == 0 {
                    out.push(byte);
                    return;
                }
                out.push(byte | 0x80);
            }
        }
        fn section(id: u8, body: Vec<u8>, out: &mut Vec<u8>) {
            out.push(id);
            leb(body.len() as u32, out);
            out.extend(body);
        }
        let mut out = b"\0asm\x01\0\0\0".to_vec();
        let mut body = Vec::new();
        leb(tables, &mut body);
        for _ in 0..tables {
            body.extend([0x70, 0x00]);
            leb(elements, &mut body);
        }
        section(4, body, &mut out);
        let mut body = Vec::new();
        leb(memories, &mut body);
        for _ in 0..memories {
            body.push(0x00);
            leb(pages, &mut body);
        }
        section(5, body, &mut out);
        out
    }

    #[test]
    fn every_memory_and_table_of_an_instance_counts_against_one_limit() {
        let engine = wasmtime::Engine::default();
        let instantiate = |bytes: Vec<u8>| {
            let module = wasmtime::Module::new(&engine, bytes).expect("a valid module");
            let mut store = Store::new(
                &engine,
                MemoryLimiter {
                    limit: 64 * 1024 * 1024,
                    used: 0,
                    refused: None,
                },
            );
            store.limiter(|l| l);
            let ok = wasmtime::Instance::new(&mut store, &module, &[]).is_ok();
            (ok, store.data().used, store.data().refused)
        };
        // 20 MiB memories: three fit in 64 MiB, four do not, although each
        // alone is far below the limit.
        let (ok, used, _) = instantiate(module(3, 320, 0, 0));
        assert!(ok);
        assert_eq!(used, 60 * 1024 * 1024);
        let (ok, _, refused) = instantiate(module(4, 320, 0, 0));
        assert!(!ok, "four 20 MiB memories exceed a 64 MiB limit");
        assert_eq!(refused, Some(80 * 1024 * 1024));
        // Tables count too: 2 × 2.2M elements × 16 bytes is 67 MB, over
        // 64 MiB (each table alone is within it).
        let (ok, _, refused) = instantiate(module(0, 0, 1, 2_200_000));
        assert!(ok, "one table of 35 MB fits");
        let (ok, _, refused_two) = instantiate(module(0, 0, 2, 2_200_000));
        assert!(refused.is_none() && refused_two.is_some());
        assert!(!ok, "two large tables exceed the limit");
        // More memories than any plugin needs are refused outright.
        let (ok, _, _) = instantiate(module(MAX_MEMORIES_PER_CALL as u32 + 1, 0, 0, 0));
        assert!(!ok);
    }
}
