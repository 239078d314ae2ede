//! What one call holds on the host: its store state (WASI, wasi:http, the
//! resource table, the log host), the memory limiter that counts every
//! memory and table of the instance, and the size of what it returns.

use super::*;

/// Everything one call's store holds.
pub(crate) struct CallState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) http_ctx: WasiHttpCtx,
    pub(crate) http: http::HttpGate,
    pub(crate) memory: MemoryLimiter,
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) log_left: usize,
    pub(crate) log_overflowed: bool,
    /// Told every log line of the call too, if set ([`crate::Plugin::with_log_sink`]).
    pub(crate) log_sink: Option<crate::LogSink>,
    pub(crate) plugin: Arc<str>,
    pub(crate) call: &'static str,
    /// How long instantiation took (set by the world handle).
    pub(crate) instantiate: std::time::Duration,
}

impl CallState {
    /// Turn captured stdout/stderr into log lines tagged with the plugin.
    pub(crate) fn emit_stdio(&self) {
        for (stream, capture) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            for line in capture.text().lines().filter(|l| !l.trim().is_empty()) {
                if let Some(sink) = &self.log_sink {
                    sink(self.call, &format!("{stream}: {line}"));
                }
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
        if let Some(sink) = &self.log_sink {
            let level = match level {
                wit_log::Level::Trace => "TRACE",
                wit_log::Level::Debug => "DEBUG",
                wit_log::Level::Info => "INFO",
                wit_log::Level::Warn => "WARN",
                wit_log::Level::Error => "ERROR",
            };
            sink(call, format!("{level} {message} {fields}").trim_end());
        }
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

pub(crate) struct LogFields<'a>(&'a [(String, String)]);

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
pub(crate) struct MemoryLimiter {
    pub(crate) limit: usize,
    /// Bytes of memories and tables this instance holds now.
    pub(crate) used: usize,
    pub(crate) refused: Option<usize>,
    /// Set once the instance is made: growth from then on is the call's.
    pub(crate) instantiated: bool,
    /// Grows after instantiation (see [`crate::CallProfile::memory_grows`]).
    pub(crate) grows: u64,
}

/// What one table element is counted as: a function reference on the host
/// (pointer plus type information), rounded up.
pub(crate) const TABLE_ELEMENT_BYTES: usize = 16;
/// Most memories, tables and core instances one call's component may have
/// (a Rust plugin has one memory, one or two tables and a handful of core
/// instances).
pub(crate) const MAX_MEMORIES_PER_CALL: usize = 16;
pub(crate) const MAX_TABLES_PER_CALL: usize = 32;
pub(crate) const MAX_INSTANCES_PER_CALL: usize = 64;

impl MemoryLimiter {
    pub(crate) fn new(limit: usize) -> Self {
        MemoryLimiter {
            limit,
            used: 0,
            refused: None,
            instantiated: false,
            grows: 0,
        }
    }

    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.refused.get_or_insert(total);
            return false;
        }
        self.used = total;
        if self.instantiated && desired > current {
            self.grows += 1;
        }
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
pub(crate) trait ReturnSize {
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
impl ReturnSize for BootstrapData {
    fn return_size(&self) -> usize {
        self.value.len() + 1
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
impl ReturnSize for types::FoundInstance {
    fn return_size(&self) -> usize {
        self.status.return_size() + self.machine.return_size() + self.cluster.return_size()
    }
}
impl ReturnSize for types::InstanceCapacity {
    fn return_size(&self) -> usize {
        48 + self.gpu_type.return_size()
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
        self.version.len() + self.channels.return_size() + self.kubernetes.return_size()
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
pub(crate) mod tests {
    use super::*;

    /// A core module with `memories` memories of `pages` 64 KiB pages each
    /// and `tables` funcref tables of `elements` elements each, encoded by
    /// hand (no text-format dependency).
    pub(crate) fn module(memories: u32, pages: u32, tables: u32, elements: u32) -> Vec<u8> {
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
            let mut store = Store::new(&engine, MemoryLimiter::new(64 * 1024 * 1024));
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
