//! Real OCI registries for tests: Debian's `docker-registry` (distribution
//! 2.8) on a loopback port, optionally with TLS (a throwaway CA) and htpasswd
//! auth, and optionally redirecting blob downloads to a separate blob store
//! the way registries backed by S3 or a CDN do. Its storage directory is
//! exposed so tests can tamper with what it serves at rest, the way a
//! compromised registry would.

use crate::blob_store::BlobStore;
use crate::control_plane::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start a registry.
#[derive(Debug, Default, Clone)]
pub struct RegistryOptions {
    /// Serve TLS with a certificate for 127.0.0.1 signed by a fresh CA.
    pub tls: bool,
    /// Require this username/password (htpasswd, bcrypt).
    pub basic_auth: Option<(String, String)>,
    /// Answer blob GET/HEAD with a 307 to a [`BlobStore`] (distribution's
    /// `redirect` storage middleware), as S3- or CDN-backed registries do.
    pub redirect_blobs: bool,
}

/// A running registry; stopped on drop.
#[derive(Debug)]
pub struct Registry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// The CA certificate (PEM file) when TLS is on.
    pub ca_file: Option<PathBuf>,
    /// Where blob downloads are redirected, with `redirect_blobs`.
    pub blob_store: Option<BlobStore>,
    dir: tempfile::TempDir,
    child: Option<Child>,
    options: RegistryOptions,
    port: u16,
}

impl Registry {
    /// Start a registry and wait until it answers.
    pub fn start(options: RegistryOptions) -> Result<Registry, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port();
        let mut registry = Registry {
            host: format!("127.0.0.1:{port}"),
            ca_file: None,
            blob_store: None,
            dir,
            child: None,
            options,
            port,
        };
        registry.write_config()?;
        registry.spawn()?;
        Ok(registry)
    }

    fn write_config(&mut self) -> Result<(), String> {
        let root = self.dir.path();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{}\n",
            root.join("data").display(),
            self.port
        );
        if self.options.tls {
            let ca_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
            let mut ca_params =
                rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
            ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            ca_params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "capstan test registry CA");
            let ca = ca_params.self_signed(&ca_key).map_err(|e| e.to_string())?;
            let issuer = rcgen::Issuer::new(ca_params, ca_key);
            let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
            let params = rcgen::CertificateParams::new(vec![
                "127.0.0.1".to_string(),
                "localhost".to_string(),
            ])
            .map_err(|e| e.to_string())?;
            let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
            std::fs::write(root.join("ca.pem"), ca.pem()).map_err(|e| e.to_string())?;
            std::fs::write(root.join("server.pem"), cert.pem()).map_err(|e| e.to_string())?;
            std::fs::write(root.join("server.key"), key.serialize_pem())
                .map_err(|e| e.to_string())?;
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                root.join("server.pem").display(),
                root.join("server.key").display()
            ));
            self.ca_file = Some(root.join("ca.pem"));
        }
        if self.options.redirect_blobs {
            let store = BlobStore::start(root.join("data"))?;
            config.push_str(&format!(
                "middleware:\n  storage:\n    - name: redirect\n      options:\n        baseurl: {}\n",
                store.url
            ));
            self.blob_store = Some(store);
        }
        if let Some((user, password)) = &self.options.basic_auth {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .map_err(|e| format!("htpasswd (apt-get install apache2-utils): {e}"))?;
            std::fs::write(root.join("htpasswd"), &out.stdout).map_err(|e| e.to_string())?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: capstan-test\n    path: {}\n",
                root.join("htpasswd").display()
            ));
        }
        std::fs::write(root.join("config.yml"), config).map_err(|e| e.to_string())
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("registry.log"))
            .map_err(|e| e.to_string())?;
        let child = crate::detached(&mut Command::new("docker-registry"))
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                format!("cannot start docker-registry (apt-get install docker-registry): {e}")
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "docker-registry did not listen on {}: {}",
            self.host,
            self.log()
        ))
    }

    /// The registry's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Stop it (the data stays; [`Registry::restart`] serves it again).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port with the same data.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()
    }

    /// The file holding a blob (or manifest) at rest.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// A scratch directory that lives as long as the registry.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
