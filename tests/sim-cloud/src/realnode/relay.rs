//! The two ways traffic crosses between the host and a real instance's
//! network namespace, both over unix sockets (nothing listens on any
//! address but loopback):
//!
//! - [`api_server`]: the instances' way to the API server. Inside each
//!   instance `socat` listens on `127.0.0.1:<the API server's port>` (the
//!   address cluster-info gives, so kubeadm and the kubelet use it
//!   unchanged) and connects to this socket, which connects to the API
//!   server on the host's loopback.
//! - [`egress`]: the API server's way to the kubelets (logs, exec): the
//!   API server's egress selector sends its "cluster" traffic as HTTP
//!   CONNECT over this socket; the instance with the asked address is
//!   reached through the socket its own `socat` serves for its kubelet.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

/// Where each instance's kubelet is reached, by its Node address.
pub type Kubelets = Arc<Mutex<HashMap<String, PathBuf>>>;

/// Relay connections on `socket` to `api` (`127.0.0.1:<port>`) until the
/// task is aborted.
pub fn api_server(socket: &Path, api: String) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = bind(socket)?;
    Ok(tokio::spawn(async move {
        while let Ok((mut from, _)) = listener.accept().await {
            let api = api.clone();
            tokio::spawn(async move {
                if let Ok(mut to) = TcpStream::connect(&api).await {
                    let _ = tokio::io::copy_bidirectional(&mut from, &mut to).await;
                }
            });
        }
    }))
}

/// Serve HTTP CONNECT on `socket` for the API server's egress: `CONNECT
/// <node address>:10250` reaches that instance's kubelet; anything else is
/// refused.
pub fn egress(socket: &Path, kubelets: Kubelets) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = bind(socket)?;
    Ok(tokio::spawn(async move {
        while let Ok((from, _)) = listener.accept().await {
            let kubelets = kubelets.clone();
            tokio::spawn(async move {
                let _ = connect(from, &kubelets).await;
            });
        }
    }))
}

fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(socket);
    UnixListener::bind(socket)
}

/// One CONNECT: read the request head, answer, then copy both ways.
async fn connect(mut from: UnixStream, kubelets: &Kubelets) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || from.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let target = text
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("CONNECT "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    let socket = target.rsplit_once(':').and_then(|(host, port)| {
        (port == "10250")
            .then(|| kubelets.lock().ok()?.get(host).cloned())
            .flatten()
    });
    let Some(socket) = socket else {
        from.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
        return Ok(());
    };
    let mut to = match UnixStream::connect(&socket).await {
        Ok(to) => to,
        Err(_) => {
            from.write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
                .await?;
            return Ok(());
        }
    };
    from.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut from, &mut to).await?;
    Ok(())
}
