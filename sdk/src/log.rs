//! Structured logging into the host's logs.
//!
//! Records are tagged with the plugin's name by the host, and their volume is
//! limited per call (a plugin that floods its log fails that call with an
//! output-limit error). Outside the sandbox (native builds, unit tests) these
//! functions do nothing.

pub use crate::bindings::provider::capstan::plugin0_1_0::log::Level;

/// Emit a record with structured `fields`.
pub fn record(level: Level, message: &str, fields: &[(&str, &str)]) {
    #[cfg(target_arch = "wasm32")]
    {
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        crate::bindings::provider::capstan::plugin0_1_0::log::log(level, message, &fields);
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = (level, message, fields);
    }
}

/// Emit a debug record.
pub fn debug(message: &str, fields: &[(&str, &str)]) {
    record(Level::Debug, message, fields)
}
/// Emit an info record.
pub fn info(message: &str, fields: &[(&str, &str)]) {
    record(Level::Info, message, fields)
}
/// Emit a warning record.
pub fn warn(message: &str, fields: &[(&str, &str)]) {
    record(Level::Warn, message, fields)
}
/// Emit an error record.
pub fn error(message: &str, fields: &[(&str, &str)]) {
    record(Level::Error, message, fields)
}
