//! The engine: one wasmtime `Engine` per host (pooling allocator, epoch
//! ticker, async), the sandbox linker, and loading a component (compile or
//! precompiled code from the cache) into a [`Plugin`].

use super::*;

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
    /// Threads plugin calls run on, each a current-thread executor with its
    /// own outbound connection pool (see the `workers` module); 0 runs
    /// calls on the caller's executor.
    pub call_threads: usize,
    /// Instances the host keeps ready before their calls, over all plugin
    /// revisions (see the `ready` module): the instance pool holds this
    /// many on top of `max_concurrent_calls`. 0 instantiates every call on
    /// its caller's path.
    pub ready_instances: u32,
}

/// The default number of call threads: one per core.
pub fn default_call_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            max_concurrent_calls: 256,
            max_memory_bytes: 1024 * 1024 * 1024,
            epoch_tick: Duration::from_millis(5),
            call_threads: default_call_threads(),
            ready_instances: DEFAULT_READY_INSTANCES,
        }
    }
}

/// Instances kept ready when not configured: one per call thread and one
/// for callers' threads for each of 16 plugin revisions on a 2-core host.
pub const DEFAULT_READY_INSTANCES: u32 = 48;

/// The plugin host: one engine, one linker, one code cache.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<CallState>,
    pub(crate) cache: Option<CodeCache>,
    pub(crate) engine_hash: String,
    pub(crate) config: RuntimeConfig,
    pub(crate) ticker_stop: Arc<AtomicBool>,
    pub(crate) ticker: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) http_client: http::PooledClient,
    /// One permit per call that may run at once.
    pub(crate) calls: Arc<tokio::sync::Semaphore>,
    /// One permit per instance kept ready before its call (or being made).
    pub(crate) ready_permits: Arc<tokio::sync::Semaphore>,
    /// Instances ready now.
    pub(crate) ready_count: Arc<std::sync::atomic::AtomicUsize>,
    /// Where calls spent their time, summed.
    pub(crate) profile: crate::profile::Totals,
    /// Where calls run.
    pub(crate) call_threads: crate::workers::CallThreads,
    /// Asked before every outbound request of every call
    /// ([`Runtime::gate_outbound`]).
    /// Shared with the connection pools, whose connection tasks stop once
    /// it says no.
    pub(crate) outbound: OutboundGateCell,
    /// Told the inputs of every call ([`Runtime::record_inputs`]).
    pub(crate) recorder: std::sync::OnceLock<InputRecorder>,
    /// Told about calls and requests ([`Runtime::observe`]).
    pub(crate) observer: crate::observe::ObserverCell,
}

pub use crate::gate::OutboundGate;
pub(crate) use crate::gate::OutboundGateCell;

/// One plugin call's inputs, as the host passes them to the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInputs {
    /// The plugin's name.
    pub plugin: String,
    /// The export called (`create`, `render`, …).
    pub call: &'static str,
    /// The arguments, each as its `Debug` text (strings quoted, bytes as
    /// numbers), in order.
    pub inputs: Vec<String>,
}

/// Told the inputs of every plugin call before it runs.
pub type InputRecorder = Arc<dyn Fn(CallInputs) + Send + Sync>;

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

/// Dirty bytes of a returned memory slot reset in place rather than
/// unmapped (see [`Runtime::new`]); at most this much stays resident per
/// pooled memory.
const KEEP_RESIDENT_BYTES: usize = 1024 * 1024;

/// What stays resident of a returned table slot: one host page.
const TABLE_KEEP_RESIDENT_BYTES: usize = 4096;

/// Whether the kernel has `PAGEMAP_SCAN` (Linux 6.7 and later), with which
/// wasmtime resets only the pages a call dirtied.
fn pagemap_scan_supported() -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release.trim().split(['.', '-']);
    let number = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
    let (major, minor) = (number(parts.next()), number(parts.next()));
    (major, minor) >= (6, 7)
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
    /// Have every outbound request of every plugin call ask `may_send`
    /// first; while it says no, requests are refused as a capability
    /// violation and nothing leaves. The controller ties it to its leader
    /// election's write fence, so a replica that lost the Lease (stopped,
    /// paused, cut off) sends nothing to a cloud even from a call that was
    /// already running. Set once; a second gate is ignored (`false`).
    pub fn gate_outbound(&self, may_send: impl Fn() -> bool + Send + Sync + 'static) -> bool {
        self.inner.outbound.set(Arc::new(may_send)).is_ok()
    }

    /// Tell `observer` about every call and outbound request from now on
    /// (per-plugin metrics). Set once; a second observer is ignored
    /// (`false`).
    pub fn observe(&self, observer: Arc<dyn crate::Observer>) -> bool {
        self.inner.observer.set(observer).is_ok()
    }

    /// Tell `recorder` the inputs of every plugin call before it runs:
    /// what lets a test check what a plugin was (and was not) given, such
    /// as that a bootstrap plugin never receives a token. Set once; a
    /// second recorder is ignored (`false`).
    pub fn record_inputs(&self, recorder: impl Fn(CallInputs) + Send + Sync + 'static) -> bool {
        self.inner.recorder.set(Arc::new(recorder)).is_ok()
    }

    /// Build the engine, the sandbox linker and the cache, and start the
    /// epoch ticker that enforces deadlines.
    pub fn new(config: RuntimeConfig) -> Result<Self, Error> {
        let engine_err = |e: wasmtime::Error| Error::Engine(format!("{e:#}"));
        let mut pool = PoolingAllocationConfig::new();
        // Every call slot and every ready instance holds room for one call.
        let n = config
            .max_concurrent_calls
            .max(1)
            .saturating_add(config.ready_instances);
        // Room for every call to hold the most a call may hold, so the calls
        // of one plugin with many memories (or core instances) never leave
        // another plugin's call without a slot: a full pool would fail the
        // other call's instantiation, not queue it. Slots are address space
        // reserved up front, touched only when used.
        let per_call = |most: usize| n.saturating_mul(u32::try_from(most).unwrap_or(u32::MAX));
        pool.total_component_instances(n)
            .total_core_instances(per_call(crate::call::MAX_INSTANCES_PER_CALL))
            .total_memories(per_call(crate::call::MAX_MEMORIES_PER_CALL))
            .total_tables(per_call(crate::call::MAX_TABLES_PER_CALL))
            .total_stacks(n)
            .max_memory_size(config.max_memory_bytes);
        // Reset a returned slot's memory by rewriting the pages the call
        // dirtied (found with the kernel's PAGEMAP_SCAN, Linux 6.7+) up to
        // this much, instead of unmapping it: the next call then takes no
        // page faults on its hot pages. Measured with `capstan-bench-plugin
        // --breakdown`: a pure call 27 -> 12 µs. Without PAGEMAP_SCAN
        // (older kernels) wasmtime would memset the whole prefix, which is
        // slower than unmapping, so keep nothing resident there.
        //
        // Tables keep one page: a plugin's table fits in it, and wasmtime
        // resets a table of at most one page kept resident with a plain
        // memset; a larger keep-resident size makes every reset scan the
        // page tables instead (a 3 µs ioctl on a host with nested paging).
        pool.pagemap_scan(wasmtime::Enabled::Auto);
        if pagemap_scan_supported() {
            pool.linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
                .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES);
        }
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
        wit_http::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(engine_err)?;

        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_hash = format!("{:016x}", hasher.finish());
        let outbound = OutboundGateCell::default();
        let http_client = http::pooled_client(outbound.clone()).map_err(Error::Engine)?;
        let cache = config
            .cache_dir
            .as_deref()
            .map(CodeCache::open)
            .transpose()?;

        let call_threads =
            crate::workers::CallThreads::start(config.call_threads, outbound.clone())?;
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
                ticker_stop,
                ticker: Mutex::new(Some(ticker)),
                http_client,
                calls: Arc::new(tokio::sync::Semaphore::new(
                    config.max_concurrent_calls.max(1) as usize,
                )),
                ready_permits: Arc::new(tokio::sync::Semaphore::new(
                    config.ready_instances as usize,
                )),
                ready_count: Arc::default(),
                profile: Default::default(),
                call_threads,
                outbound,
                recorder: std::sync::OnceLock::new(),
                observer: Default::default(),
                config,
            }),
        })
    }

    /// Where every call so far spent its time, summed by phase (see
    /// [`crate::profile`]); subtract two snapshots to profile what ran
    /// between them.
    pub fn call_profile(&self) -> crate::CallProfile {
        self.inner.profile.snapshot()
    }

    /// Instances made ready before their calls and not yet taken, over
    /// all plugin revisions; see the `ready` module.
    pub fn ready_instances(&self) -> usize {
        self.inner.ready_count.load(Ordering::Relaxed)
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
        // Every call slot holds room for the most one call may hold (see
        // `Runtime::new`); a component that needs more would fail every
        // instantiation, so it is refused here with its counts.
        let footprint = capstan_manifest::footprint(bytes).map_err(|error| Error::Manifest {
            source_name: source.to_string(),
            error,
        })?;
        if let Some(reason) = over_call_maxima(footprint) {
            return Err(Error::Load {
                plugin: name,
                reason,
            });
        }
        let digest = digest(bytes);
        let (component, load_path) = self.compile_cached(&name, &digest, bytes)?;

        let export = manifest.world.export_interface(&manifest.contract);
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
        capstan_manifest::contract_covers_imports(
            &manifest.contract,
            component.component_type().imports(engine).map(|(n, _)| n),
        )
        .map_err(|reason| Error::Load {
            plugin: name.clone(),
            reason,
        })?;
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
                label: name.as_str().into(),
                agent: crate::http::plugin_agent(&name, &digest).into(),
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
                quota: None,
                footprint,
                tape: None,
                log_sink: None,
                ready: Arc::new(crate::ready::ReadyInstances::new(
                    self.inner.call_threads.count(),
                )),
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

/// Why a component holds more than one call may (core instances, memories,
/// tables), if it does.
pub fn over_call_maxima(f: capstan_manifest::Footprint) -> Option<String> {
    use crate::call::{MAX_INSTANCES_PER_CALL, MAX_MEMORIES_PER_CALL, MAX_TABLES_PER_CALL};
    let over: Vec<String> = [
        ("core instances", f.core_instances, MAX_INSTANCES_PER_CALL),
        ("memories", f.memories, MAX_MEMORIES_PER_CALL),
        ("tables", f.tables, MAX_TABLES_PER_CALL),
    ]
    .into_iter()
    .filter(|(_, has, most)| has > most)
    .map(|(what, has, most)| format!("{has} {what} (at most {most})"))
    .collect();
    (!over.is_empty()).then(|| {
        format!(
            "one instantiation holds {}; the host gives each call room for at most {MAX_INSTANCES_PER_CALL} core instances, {MAX_MEMORIES_PER_CALL} memories and {MAX_TABLES_PER_CALL} tables",
            over.join(", ")
        )
    })
}

/// `sha256:<hex>` of some bytes: how plugins are identified.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::tests::module;
    use crate::call::{MAX_INSTANCES_PER_CALL, MAX_MEMORIES_PER_CALL, MAX_TABLES_PER_CALL};

    /// Every call slot may hold the most one call may hold at the same
    /// time: calls of a plugin with 16 memories (or 64 core instances) at
    /// the host's full concurrency leave room for every other call.
    #[tokio::test]
    async fn the_pool_holds_every_call_at_its_most_at_once() {
        let calls = 8;
        let rt = Runtime::new(RuntimeConfig {
            max_concurrent_calls: calls,
            call_threads: 0,
            ..Default::default()
        })
        .expect("runtime");
        let engine = &rt.inner.engine;
        let module = |memories, tables| {
            wasmtime::Module::new(engine, module(memories, 1, tables, 1)).expect("a valid module")
        };
        // The pool allows one memory and one table per core module: a call
        // at its most is core instances with a memory each, with a table
        // each, and empty ones.
        let (with_memory, with_table, empty) = (module(1, 0), module(0, 1), module(0, 0));
        let memories = MAX_MEMORIES_PER_CALL;
        let tables = MAX_TABLES_PER_CALL;
        let rest = MAX_INSTANCES_PER_CALL - memories - tables;
        let mut held = Vec::new();
        for _ in 0..calls {
            let mut store = Store::new(engine, ());
            for (module, count) in [
                (&with_memory, memories),
                (&with_table, tables),
                (&empty, rest),
            ] {
                for _ in 0..count {
                    wasmtime::Instance::new_async(&mut store, module, &[])
                        .await
                        .expect("every call fits at its most, all calls at once");
                }
            }
            held.push(store);
        }
        assert_eq!(held.len(), calls as usize);
    }
}
