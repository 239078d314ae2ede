//! Bounded capture of a plugin's stdout and stderr.
//!
//! Output is kept in memory up to a cap; the write that would pass the cap
//! traps the guest and marks the capture as overflowed, which the runtime
//! reports as an output-limit error. After the call, captured text becomes
//! log lines tagged with the plugin.

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use wasmtime::format_err;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

#[derive(Debug, Default)]
struct Buffer {
    bytes: Vec<u8>,
    overflowed: bool,
}

/// One bounded output stream; clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    name: &'static str,
    cap: usize,
    buffer: Arc<Mutex<Buffer>>,
}

impl Capture {
    pub(crate) fn new(name: &'static str, cap: usize) -> Self {
        Capture {
            name,
            cap,
            buffer: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn overflowed(&self) -> bool {
        self.lock().overflowed
    }

    /// The captured text, lossily decoded.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.lock().bytes).into_owned()
    }

    fn overflow(&self, buf: &mut Buffer) -> StreamError {
        buf.overflowed = true;
        StreamError::Trap(format_err!(
            "{} exceeded its limit of {} bytes",
            self.name,
            self.cap
        ))
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        let mut buf = self.lock();
        if buf.bytes.len() + bytes.len() > self.cap {
            return Err(self.overflow(&mut buf));
        }
        buf.bytes.extend_from_slice(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        let mut buf = self.lock();
        match self.cap - buf.bytes.len() {
            0 => Err(self.overflow(&mut buf)),
            room => Ok(room),
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut buf = self.lock();
        if buf.bytes.len() + data.len() > self.cap {
            buf.overflowed = true;
            return std::task::Poll::Ready(Err(std::io::Error::other("output limit exceeded")));
        }
        buf.bytes.extend_from_slice(data);
        std::task::Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}
