//! A stand-in for the object storage that production registries redirect
//! blob downloads to (S3, a CDN): it serves a registry's storage directory
//! over plain HTTP on loopback and, like S3 answering a presigned URL,
//! refuses any request that carries an `Authorization` header. It counts
//! both, so a test can assert that blobs really came from here and that the
//! registry's credentials never followed the redirect.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// A running blob store; stopped on drop.
#[derive(Debug)]
pub struct BlobStore {
    /// `http://127.0.0.1:<port>/`.
    pub url: String,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Counts {
    served: AtomicUsize,
    with_authorization: AtomicUsize,
}

impl BlobStore {
    /// Serve the files under `root` (request paths are relative to it).
    pub fn start(root: PathBuf) -> Result<BlobStore, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (counts, stop) = (counts.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        // A client that hangs up mid-request is its problem.
                        let _ = serve(stream, &root, &counts);
                    }
                }
            })
        };
        Ok(BlobStore {
            url: format!("http://127.0.0.1:{port}/"),
            counts,
            stop,
            port,
            thread: Some(thread),
        })
    }

    /// Requests answered with a file.
    pub fn served(&self) -> usize {
        self.counts.served.load(Ordering::SeqCst)
    }

    /// Requests that arrived with an `Authorization` header (all refused).
    pub fn with_authorization(&self) -> usize {
        self.counts.with_authorization.load(Ordering::SeqCst)
    }
}

fn serve(stream: TcpStream, root: &Path, counts: &Counts) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut authorization = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if line.to_ascii_lowercase().starts_with("authorization:") {
            authorization = true;
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    let path = path.split('?').next().unwrap_or_default();
    let mut stream = stream;
    let respond = |stream: &mut TcpStream, status: &str, body: &[u8], send_body: bool| {
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )?;
        if send_body {
            stream.write_all(body)?;
        }
        stream.flush()
    };
    if authorization {
        counts.with_authorization.fetch_add(1, Ordering::SeqCst);
        return respond(
            &mut stream,
            "400 Bad Request",
            b"Only one auth mechanism allowed",
            true,
        );
    }
    let file = (!path.split('/').any(|segment| segment == ".."))
        .then(|| root.join(path.trim_start_matches('/')))
        .filter(|file| file.is_file());
    match (method, file) {
        ("GET" | "HEAD", Some(file)) => {
            let mut body = Vec::new();
            std::fs::File::open(file)?.read_to_end(&mut body)?;
            counts.served.fetch_add(1, Ordering::SeqCst);
            respond(&mut stream, "200 OK", &body, method == "GET")
        }
        _ => respond(
            &mut stream,
            "404 Not Found",
            b"no such blob",
            method != "HEAD",
        ),
    }
}

impl Drop for BlobStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
