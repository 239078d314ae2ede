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
                max_total: limits.max_requests_per_call,
                in_flight: Arc::default(),
                sent: 0,
                client: crate::workers::thread_client()
                    .unwrap_or_else(|| inner.runtime.http_client.clone()),
                waited: Arc::default(),
                may_send: inner.runtime.outbound.get().cloned(),
                observer: inner
                    .runtime
                    .observer
                    .get()
                    .map(|o| (o.clone(), inner.label.clone())),
                quota: inner.quota.clone(),
                quota_hit: Arc::default(),
                tape,
                tape_miss: Arc::default(),
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
            log_sink: inner.log_sink.clone(),
            plugin: inner.name.clone(),
            call,
            instantiate: std::time::Duration::ZERO,
        };
        let mut store = Store::new(&inner.runtime.engine, state);
        store.limiter(|s| &mut s.memory);
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
        store
    }

    /// Run one call in a fresh store under the plugin's limits and turn
    /// whatever happened into a typed result.
    pub(crate) async fn invoke<T: ReturnSize>(
        &self,
        call: &'static str,
        f: impl AsyncFnOnce(&mut Store<CallState>) -> wasmtime::Result<Result<T, PluginError>>,
    ) -> Result<T, Error> {
        let started = std::time::Instant::now();
        let limit = self.inner.limits.call_timeout;
        // The plugin's own quota before a host-wide slot: a plugin over its
        // share waits (briefly) without holding what others need.
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
        let _running = crate::observe::Running {
            observer,
            plugin: self.inner.label.clone(),
        };
        // A slot first: the deadline counts from when the call may run.
        let slot_permit =
            tokio::time::timeout(limit, self.inner.runtime.calls.clone().acquire_owned())
                .await
                .map_err(|_| Error::DeadlineExceeded {
                    plugin: self.name().into(),
                    call,
                    limit,
                })?
                .map_err(|_| Error::Engine("the runtime is shutting down".into()))?;
        let slot = started.elapsed();
        let tape = match &self.inner.tape {
            Some(tape) => Some(
                tape.start_call(&self.inner.name, &self.inner.digest, call)
                    .map_err(|detail| Error::ReplayMiss {
                        plugin: self.name().into(),
                        call,
                        detail,
                    })?,
            ),
            None => None,
        };
        let mut store = self.new_store(call, tape);
        let stored = started.elapsed();
        let outcome = tokio::time::timeout(limit, f(&mut store)).await;
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
        let mut times = crate::profile::CallTimes {
            slot,
            store: stored - slot,
            instantiate: state.instantiate,
            export: exported - stored,
            outbound: std::time::Duration::from_nanos(
                state.http.waited.load(std::sync::atomic::Ordering::Relaxed),
            ),
            requests: u64::from(state.http.sent),
            total: std::time::Duration::ZERO,
        };
        times.total = started.elapsed();
        self.inner.runtime.profile.add(&times);
        // Dropping the store returns the instance to the pool, resetting
        // the pages the call dirtied: CPU every call costs, but nothing the
        // caller needs to wait for. On a call thread it runs as a task of
        // its own, the next thing the thread does after this call's task
        // has handed its result back. Elsewhere it stays inline: on a
        // multi-thread executor the task would move to another worker and
        // find the instance's pages cold (measured: 34 µs instead of 7).
        // The host's call slot and the plugin's quota permit go with the
        // store, so there are never more live instances than slots.
        let runtime = self.inner.runtime.clone();
        let release = move || {
            let releasing = std::time::Instant::now();
            drop(store);
            drop((slot_permit, quota_permit));
            runtime.profile.add_release(releasing.elapsed());
        };
        match tokio::runtime::Handle::try_current() {
            Ok(executor) if crate::workers::on_call_thread() => {
                drop(executor.spawn(async move { release() }));
            }
            _ => release(),
        }
        tracing::debug!(
            plugin = %self.inner.name,
            call,
            elapsed_us = times.total.as_micros() as u64,
            ok = result.is_ok(),
            "plugin call"
        );
        result
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
