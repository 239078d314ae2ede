//! A loaded plugin: its pre-instantiated component, grants and limits, and
//! the per-call path — a fresh store with every limit armed, the host-wide
//! call slot, the deadline, and the errors a call can end in.

use super::*;

/// A loaded, pre-instantiated plugin. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

#[derive(Clone)]
pub(crate) struct PluginInner {
    pub(crate) name: Arc<str>,
    pub(crate) manifest: PluginManifest,
    pub(crate) digest: String,
    pub(crate) load_path: LoadPath,
    pub(crate) component: Component,
    pub(crate) pre: InstancePre<CallState>,
    pub(crate) limits: Limits,
    pub(crate) grants: Arc<Grants>,
    pub(crate) declared: Arc<[HttpCapability]>,
    pub(crate) runtime: Arc<RuntimeInner>,
    /// Shared with the Plugin's other live revisions.
    pub(crate) quota: Option<crate::Quota>,
    /// The name the observer is told (the Plugin object's; the manifest's
    /// until [`Plugin::observed_as`]).
    pub(crate) label: Arc<str>,
    /// The User-Agent product its requests carry (label and digest).
    pub(crate) agent: Arc<str>,
    /// What one instantiation holds, counted at load.
    pub(crate) footprint: capstan_manifest::Footprint,
    /// The cassette its calls are recorded to or replayed from, if any.
    pub(crate) tape: Option<crate::tape::Tape>,
    /// Told its calls' log lines, if set.
    pub(crate) log_sink: Option<crate::LogSink>,
    /// Instances made ready for its next calls; shared by every variant
    /// of this revision (quota, label, sink), which arm it when they take it.
    pub(crate) ready: Arc<crate::ready::ReadyInstances>,
}

/// What a call holds from admission until its instance is released: its
/// quota permit and its host-wide slot. Held only to be dropped.
struct Admitted {
    _quota_permit: Option<crate::quota::QuotaPermit>,
    _slot_permit: tokio::sync::OwnedSemaphorePermit,
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
    /// This plugin with its calls counted against `quota`, which the
    /// Plugin's other live revisions share. Cheap: the component and its
    /// pre-instantiation are shared.
    pub fn with_quota(&self, quota: Option<crate::Quota>) -> Plugin {
        let mut inner = (*self.inner).clone();
        inner.quota = quota;
        Plugin {
            inner: Arc::new(inner),
        }
    }

    /// This plugin with its calls and requests reported to the runtime's
    /// observer as `label` (the Plugin object's name, which metrics use),
    /// not the manifest's name. Cheap, as [`Self::with_quota`].
    pub fn observed_as(&self, label: &str) -> Plugin {
        let mut inner = (*self.inner).clone();
        inner.label = label.into();
        inner.agent = http::plugin_agent(label, &inner.digest).into();
        Plugin {
            inner: Arc::new(inner),
        }
    }

    /// This plugin with its calls recorded to, or replayed from, `tape`
    /// (see [`crate::tape`]). Cheap, as [`Self::with_quota`].
    pub fn with_tape(&self, tape: Option<crate::tape::Tape>) -> Plugin {
        let mut inner = (*self.inner).clone();
        inner.tape = tape;
        Plugin {
            inner: Arc::new(inner),
        }
    }

    /// This plugin with every log line of its calls (structured logs as
    /// `LEVEL message k="v"`, captured output as `stdout: …`) also told to
    /// `sink` with the call's name: what a test asserts on. Cheap, as
    /// [`Self::with_quota`].
    pub fn with_log_sink(&self, sink: Option<crate::LogSink>) -> Plugin {
        let mut inner = (*self.inner).clone();
        inner.log_sink = sink;
        Plugin {
            inner: Arc::new(inner),
        }
    }

    /// The quota this plugin's calls count against, if any.
    pub fn quota(&self) -> Option<&crate::Quota> {
        self.inner.quota.as_ref()
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
    /// What one call's instance holds: core instances, memories, tables.
    pub fn footprint(&self) -> capstan_manifest::Footprint {
        self.inner.footprint
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

    /// This plugin as a bootstrap provider; fails if it implements another world.
    pub fn bootstrap(&self) -> Result<BootstrapPlugin, Error> {
        BootstrapPlugin::new(self)
    }

    /// Whether `call` runs on its caller's thread rather than a call
    /// thread: a call that makes no outbound request gains nothing there
    /// but pays two thread hops (tens of µs where a wake-up crosses vCPUs).
    /// That is `validate`, which the contract says has no side effects,
    /// any call of a plugin that declares no HTTP destination (it cannot
    /// send one), and the benchmarks' bare instantiation. The deadline,
    /// quota, gate and memory limits are the same wherever a call runs; a
    /// plugin's CPU on the caller's executor yields at every epoch tick.
    pub(crate) fn runs_inline(&self, call: &str) -> bool {
        matches!(call, "validate" | "instantiate") || self.inner.declared.is_empty()
    }

    pub(crate) fn expect_world(&self, expected: World) -> Result<(), Error> {
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
    pub(crate) fn new_store(
        &self,
        call: &'static str,
        tape: Option<crate::tape::CallTape>,
    ) -> Store<CallState> {
        let inner = &self.inner;
        let limits = inner.limits;
        let stdout = Capture::new("stdout", limits.stdio_bytes);
        let stderr = Capture::new("stderr", limits.stdio_bytes);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(tape) = &tape {
            let taped = tape.clocks();
            wasi.wall_clock(taped.wall)
                .monotonic_clock(taped.monotonic)
                .secure_random(taped.secure)
                .insecure_random(taped.insecure)
                .insecure_random_seed(taped.insecure_seed);
        }
        let wasi = wasi.build();
        // What belongs to the call rather than the revision (its name,
        // budgets, gate, quota, observer, sink, connection pool, deadline)
        // starts closed here and is set by `arm`, the one place either
        // kind of instance, fresh or ready, is given to a call.
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
                agent: inner.agent.clone(),
                declared: inner.declared.clone(),
                grants: inner.grants.clone(),
                denial: Arc::default(),
                exhausted: Arc::default(),
                max_in_flight: limits.max_requests_in_flight,
                max_total: 0,
                in_flight: Arc::default(),
                sent: 0,
                client: inner.runtime.http_client.clone(),
                waited: Arc::default(),
                may_send: None,
                observer: None,
                quota: None,
                quota_hit: Arc::default(),
                tape,
                tape_miss: Arc::default(),
            },
            memory: MemoryLimiter::new(limits.memory_bytes),
            stdout,
            stderr,
            log_left: limits.log_bytes,
            log_overflowed: false,
            log_sink: None,
            plugin: inner.name.clone(),
            call,
            instantiate: std::time::Duration::ZERO,
        };
        let mut store = Store::new(&inner.runtime.engine, state);
        store.limiter(|s| &mut s.memory);
        self.arm(&mut store, call);
        store
    }

    /// Give `store` to the call `call` of this plugin (this variant: its
    /// label, quota and sink), on this thread, from now: everything a call
    /// has of its own. Used on fresh stores and on ready instances alike.
    pub(crate) fn arm(&self, store: &mut Store<CallState>, call: &'static str) {
        let inner = &self.inner;
        let limits = inner.limits;
        let state = store.data_mut();
        state.call = call;
        state.log_sink = inner.log_sink.clone();
        let http = &mut state.http;
        http.agent = inner.agent.clone();
        http.max_total = limits.max_requests_per_call;
        http.client =
            crate::workers::thread_client().unwrap_or_else(|| inner.runtime.http_client.clone());
        http.may_send = inner.runtime.outbound.get().cloned();
        http.observer = inner
            .runtime
            .observer
            .get()
            .map(|o| (o.clone(), inner.label.clone()));
        http.quota = inner.quota.clone();
        store.set_hostcall_fuel(limits.hostcall_bytes());
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
    }

    /// Make an instance ready for this revision's next call at `place` (a
    /// call thread's, or the callers'), if none is, the host has a ready
    /// permit free and the plugin is not taped; see [`crate::ready`].
    pub(crate) async fn prepare(&self, place: usize) {
        let inner = &self.inner;
        if inner.tape.is_some() || inner.ready.is_ready(place) {
            return;
        }
        let Ok(permit) = inner.runtime.ready_permits.clone().try_acquire_owned() else {
            return;
        };
        let mut store = self.new_store("instantiate", None);
        // Nothing leaves an instance before its call.
        store.data_mut().http.max_total = 0;
        let instantiated = tokio::time::timeout(
            inner.limits.call_timeout,
            inner.pre.instantiate_async(&mut store),
        )
        .await;
        let Ok(Ok(instance)) = instantiated else {
            return;
        };
        // An instantiation that tried a request, logged past its budget or
        // hit a limit is not handed to a call: that call instantiates
        // afresh and meets the same limit as its own.
        let state = store.data();
        if self.limit_hit("instantiate", state).is_some() || state.http.sent > 0 {
            return;
        }
        inner.ready.put(
            place,
            crate::ready::Ready {
                store,
                instance,
                permit,
                counted: crate::ready::Counted::new(&inner.runtime.ready_count),
            },
        );
    }

    /// Run one call under the plugin's limits, in an instance made ready
    /// before it or a fresh one, and turn whatever happened into a typed
    /// result.
    pub(crate) async fn invoke<T: ReturnSize>(
        &self,
        call: &'static str,
        f: impl AsyncFnOnce(
            &mut Store<CallState>,
            &wasmtime::component::Instance,
        ) -> wasmtime::Result<Result<T, PluginError>>,
    ) -> Result<T, Error> {
        let started = std::time::Instant::now();
        let limit = self.inner.limits.call_timeout;
        let (admitted, _running) = self.admit(call, started).await?;
        let slot = started.elapsed();
        let place = self.inner.ready.here();
        let (mut store, instance) = self.store_for(call, place)?;
        let prepared = instance.is_some();
        let stored = started.elapsed();
        let pre = &self.inner.pre;
        let outcome = tokio::time::timeout(limit, async {
            let instance = match instance {
                Some(instance) => instance,
                None => {
                    let instantiating = std::time::Instant::now();
                    let instance = pre.instantiate_async(&mut store).await?;
                    store.data_mut().instantiate = instantiating.elapsed();
                    instance
                }
            };
            store.data_mut().memory.instantiated = true;
            f(&mut store, &instance).await
        })
        .await;
        let exported = started.elapsed();
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
        let runtime = &self.inner.runtime;
        let mut times = crate::profile::CallTimes {
            slot,
            store: stored - slot,
            instantiate: if prepared {
                std::time::Duration::ZERO
            } else {
                state.instantiate
            },
            export: exported - stored,
            outbound: std::time::Duration::from_nanos(
                state.http.waited.load(std::sync::atomic::Ordering::Relaxed),
            ),
            requests: u64::from(state.http.sent),
            total: std::time::Duration::ZERO,
            memory_grows: state.memory.grows,
            prepared,
            inline: runtime.call_threads.count() > 0 && !crate::workers::on_call_thread(),
        };
        times.total = started.elapsed();
        runtime.profile.add(&times);
        self.release_later(store, admitted, place);
        tracing::debug!(
            plugin = %self.inner.name,
            call,
            elapsed_us = times.total.as_micros() as u64,
            ok = result.is_ok(),
            prepared,
            "plugin call"
        );
        result
    }

    /// Admit a call: the plugin's own quota before a host-wide slot (a
    /// plugin over its share waits, briefly, without holding what others
    /// need), then a slot, within the call's deadline, which counts from
    /// when the call may run. The observer counts the call as running
    /// until the returned guard goes, at the end of the call.
    async fn admit(
        &self,
        call: &'static str,
        started: std::time::Instant,
    ) -> Result<(Admitted, crate::observe::Running), Error> {
        let limit = self.inner.limits.call_timeout;
        let observer = self.inner.runtime.observer.get().cloned();
        let quota_permit = match &self.inner.quota {
            Some(quota) => Some(quota.admit_call().await.map_err(|hit| {
                tracing::info!(plugin = %self.inner.name, call, quota = %hit.kind, "plugin call refused by its quota");
                if let Some(observer) = &observer {
                    observer.quota_refused(&self.inner.label, hit.kind, started.elapsed());
                }
                self.quota_exceeded(call, hit)
            })?),
            None => None,
        };
        if let Some(observer) = &observer {
            observer.call_started(&self.inner.label, started.elapsed());
        }
        let running = crate::observe::Running {
            observer,
            plugin: self.inner.label.clone(),
        };
        let slot_permit =
            tokio::time::timeout(limit, self.inner.runtime.calls.clone().acquire_owned())
                .await
                .map_err(|_| Error::DeadlineExceeded {
                    plugin: self.name().into(),
                    call,
                    limit,
                })?
                .map_err(|_| Error::Engine("the runtime is shutting down".into()))?;
        Ok((
            Admitted {
                _quota_permit: quota_permit,
                _slot_permit: slot_permit,
            },
            running,
        ))
    }

    /// The store a call runs in: the instance ready at `place`, armed for
    /// this call, or a fresh store (taped calls always: their clocks and
    /// randomness are the tape's from instantiation on).
    fn store_for(
        &self,
        call: &'static str,
        place: usize,
    ) -> Result<(Store<CallState>, Option<wasmtime::component::Instance>), Error> {
        if let Some(tape) = &self.inner.tape {
            let tape = tape
                .start_call(&self.inner.name, &self.inner.digest, call)
                .map_err(|detail| Error::ReplayMiss {
                    plugin: self.name().into(),
                    call,
                    detail,
                })?;
            return Ok((self.new_store(call, Some(tape)), None));
        }
        Ok(match self.inner.ready.take(place) {
            Some(ready) => {
                // The call's slot now holds the instance's room.
                drop((ready.permit, ready.counted));
                let mut store = ready.store;
                self.arm(&mut store, call);
                (store, Some(ready.instance))
            }
            None => (self.new_store(call, None), None),
        })
    }

    /// Release a finished call's store, and make the next instance ready
    /// at `place`, after the caller has its result.
    ///
    /// Dropping the store returns the instance to the pool, resetting the
    /// pages the call dirtied: CPU every call costs, but nothing the caller
    /// needs to wait for. It runs as a task of its own on the executor the
    /// call ran on (a call thread's, or the caller's for a pure call), the
    /// next thing that executor does once this call's task has handed its
    /// result back or yields, and the same task then makes the next
    /// instance. A task spawned from a worker of a multi-thread executor
    /// starts on that worker, where the instance's pages are warm. With no
    /// executor (a blocking caller) it runs here and nothing is made ready.
    /// The call's slot and quota permit go with the store, so there are
    /// never more live instances than slots and ready permits.
    fn release_later(&self, store: Store<CallState>, admitted: Admitted, place: usize) {
        let runtime = self.inner.runtime.clone();
        let release = move || {
            let releasing = std::time::Instant::now();
            drop(store);
            drop(admitted);
            runtime.profile.add_release(releasing.elapsed());
        };
        match tokio::runtime::Handle::try_current() {
            Ok(executor) => {
                let next = self.clone();
                drop(executor.spawn(async move {
                    release();
                    next.prepare(place).await;
                }));
            }
            Err(_) => release(),
        }
    }

    fn quota_exceeded(&self, call: &'static str, hit: crate::QuotaHit) -> Error {
        Error::QuotaExceeded {
            plugin: self.name().into(),
            call,
            kind: hit.kind,
            size: hit.size,
            retry_after: hit.retry_after,
        }
    }

    pub(crate) fn limit_hit(&self, call: &'static str, state: &CallState) -> Option<Error> {
        // The host held the call back: whatever the plugin made of the
        // refused request, the call is the quota's, not a fault.
        if let Some(hit) = state.http.quota_hit() {
            return Some(self.quota_exceeded(call, hit));
        }
        let plugin = self.name().to_string();
        // Under replay, a request the cassette cannot answer ends the call.
        if let Some(detail) = state.http.tape_miss() {
            return Some(Error::ReplayMiss {
                plugin,
                call,
                detail,
            });
        }
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
        state.http.denial().map(|detail| {
            // A closed gate is the host's decision (this replica may not
            // act), not a destination the plugin was refused.
            if detail == http::GATE_CLOSED {
                return Error::Fenced {
                    plugin: plugin.clone(),
                    call,
                };
            }
            Error::CapabilityDenied {
                plugin: plugin.clone(),
                call,
                detail,
            }
        })
    }

    pub(crate) fn classify(
        &self,
        call: &'static str,
        err: &wasmtime::Error,
        state: &CallState,
    ) -> Error {
        if let Some(limit) = self.limit_hit(call, state) {
            return limit;
        }
        if hostcall_fuel_exhausted(err) {
            return Error::OutputLimit {
                plugin: self.name().into(),
                call,
                kind: OutputKind::HostCall,
                limit_bytes: self.inner.limits.hostcall_bytes(),
            };
        }
        if let Some(detail) = pool_exhausted(err) {
            return Error::HostCapacity {
                plugin: self.name().into(),
                call,
                detail,
                retry_after: std::time::Duration::from_secs(1),
            };
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
        // The guest says why on stderr just before trapping, in its own
        // language's words (a panic, a traceback, a thrown error).
        if let Some(words) = crate::last_words::last_words(&state.stderr.text()) {
            message = format!("{message}; the plugin {words}");
        }
        Error::Trap {
            plugin: self.name().into(),
            call,
            message,
        }
    }

    pub(crate) fn check_returned<T: ReturnSize>(
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

/// Whether wasmtime refused to copy guest data past the hostcall fuel. Its
/// error type is private, so this reads its message.
fn hostcall_fuel_exhausted(err: &wasmtime::Error) -> bool {
    err.chain().any(|e| {
        e.to_string()
            .contains("fuel allocated for hostcalls has been exhausted")
    })
}

/// wasmtime's pooling allocator refusing an instance (`maximum concurrent
/// limit of N for core instances reached`), if that is what failed. The
/// pool holds every call slot at its most (see `Runtime::new`) and loading
/// refuses components over that, so this is a safety net: if it ever
/// happens it is the host's capacity, retried, never the plugin's crash.
fn pool_exhausted(err: &wasmtime::Error) -> Option<String> {
    err.chain()
        .map(|e| e.to_string())
        .find(|m| m.contains("maximum concurrent limit of") && m.contains("reached"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_full_pool_is_recognised_and_a_trap_is_not() {
        let full = wasmtime::Error::msg("maximum concurrent limit of 8 for core instances reached");
        let full = full.context("instantiating the plugin");
        assert!(
            super::pool_exhausted(&full)
                .unwrap()
                .contains("core instances")
        );
        let trap = wasmtime::Error::msg("wasm trap: wasm `unreachable` instruction executed");
        assert_eq!(super::pool_exhausted(&trap), None);
    }
}
