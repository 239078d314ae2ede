//! A small OCI distribution client: manifests and blobs by digest, pushes,
//! registry auth, and every limit a hostile registry could push against.
//!
//! Everything fetched is checked against the digest asked for before it is
//! returned; a descriptor's size is checked before a byte is downloaded and
//! again while reading, so a registry can neither truncate nor inflate a blob.

use crate::auth::{Challenge, CredentialStore};
use crate::oci;
use crate::reference::is_loopback_registry;
use crate::{Digest, Error, Reference};
use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use ureq::http::Response;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

/// Default cap on one blob: 256 MiB (a plugin is usually well under 10 MiB).
pub const DEFAULT_MAX_BLOB_BYTES: u64 = 256 * 1024 * 1024;
/// Cap on one manifest or index (the OCI distribution spec suggests 4 MiB).
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Allow plain HTTP to non-loopback registries (TLS is still verified
    /// when a registry speaks it).
    pub insecure: bool,
    /// A PEM file with extra CA certificates to trust, in addition to the
    /// system's (`/etc/ssl/certs/ca-certificates.crt`).
    pub ca_file: Option<PathBuf>,
    /// A docker `config.json` with registry credentials; default
    /// `$DOCKER_CONFIG/config.json`, then `~/.docker/config.json`.
    pub registry_config: Option<PathBuf>,
    /// Largest blob accepted; 0 means [`DEFAULT_MAX_BLOB_BYTES`].
    pub max_blob_bytes: u64,
}

/// Reports transfer progress (the CLI draws bars with it).
pub trait Progress: Send + Sync {
    /// A transfer of `total` bytes starts.
    fn begin(&self, label: &str, total: u64);
    /// `n` more bytes moved.
    fn advance(&self, n: u64);
    /// The transfer ended.
    fn finish(&self);
}

/// Progress that goes nowhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// The distribution API client. Cheap to share; blocking (run it on a
/// blocking thread from async code).
#[derive(Debug)]
pub struct Client {
    agent: ureq::Agent,
    options: ClientOptions,
    credentials: CredentialStore,
    /// `https://host` or `http://host`, decided once per registry.
    bases: Mutex<HashMap<String, String>>,
    /// `Authorization` values per (registry, repository).
    tokens: Mutex<HashMap<(String, String), String>>,
}

enum Body<'a> {
    None,
    Bytes(&'a [u8]),
}

impl Client {
    /// A client with these options; reads the CA file and docker config now,
    /// so a bad path fails here rather than on the first pull.
    pub fn new(options: ClientOptions) -> Result<Client, Error> {
        let mut tls = TlsConfig::builder();
        if let Some(ca_file) = &options.ca_file {
            let mut certs = Vec::new();
            for path in [
                PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
                ca_file.clone(),
            ] {
                let pem = match std::fs::read(&path) {
                    Ok(pem) => pem,
                    Err(_) if &path != ca_file => continue,
                    Err(e) => return Err(Error::io(&path)(e)),
                };
                for item in ureq::tls::parse_pem(&pem) {
                    if let Ok(PemItem::Certificate(cert)) = item {
                        certs.push(cert);
                    }
                }
            }
            if certs.is_empty() {
                return Err(Error::config(
                    ca_file.display().to_string(),
                    "holds no PEM certificate",
                ));
            }
            let certs: Vec<Certificate<'static>> = certs;
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(Duration::from_secs(600)))
            .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
            // Registries backed by S3 or a CDN redirect blob downloads to
            // presigned URLs on another host: follow them, but never send
            // the registry's credentials there.
            .max_redirects(10)
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::Never)
            .tls_config(tls.build())
            .build();
        let credentials = CredentialStore::load(options.registry_config.as_deref())?;
        Ok(Client {
            agent: config.into(),
            options,
            credentials,
            bases: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// The largest blob this client accepts.
    pub fn max_blob_bytes(&self) -> u64 {
        if self.options.max_blob_bytes == 0 {
            DEFAULT_MAX_BLOB_BYTES
        } else {
            self.options.max_blob_bytes
        }
    }

    fn base(&self, registry: &str) -> Result<String, Error> {
        if let Some(base) = self.bases.lock().expect("bases lock").get(registry) {
            return Ok(base.clone());
        }
        let https = format!("https://{registry}");
        let base = match self.agent.get(format!("{https}/v2/")).call() {
            Ok(_) => https,
            Err(tls_error) => {
                if !(is_loopback_registry(registry) || self.options.insecure) {
                    return Err(Error::Transport {
                        url: format!("{https}/v2/"),
                        reason: format!(
                            "{tls_error} (plain HTTP is used only for loopback registries or with --insecure)"
                        ),
                    });
                }
                // Only a registry counts: a TLS server answers plain HTTP
                // with a 400 too, without the distribution API header.
                let http = format!("http://{registry}");
                match self.agent.get(format!("{http}/v2/")).call() {
                    Ok(r) if r.headers().contains_key("docker-distribution-api-version") => http,
                    _ => {
                        return Err(Error::Transport {
                            url: format!("{https}/v2/"),
                            reason: tls_error.to_string(),
                        });
                    }
                }
            }
        };
        self.bases
            .lock()
            .expect("bases lock")
            .insert(registry.to_string(), base.clone());
        Ok(base)
    }

    /// Send a request, answering one auth challenge if the registry asks.
    fn send(
        &self,
        method: &str,
        reference: &Reference,
        path_or_url: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
        push: bool,
    ) -> Result<Response<ureq::Body>, Error> {
        let url = if path_or_url.starts_with("http://") || path_or_url.starts_with("https://") {
            path_or_url.to_string()
        } else {
            format!("{}{path_or_url}", self.base(&reference.registry)?)
        };
        let key = (reference.registry.clone(), reference.repository.clone());
        let mut authorization = self.tokens.lock().expect("tokens lock").get(&key).cloned();
        for attempt in 0..2 {
            let response = self.request(method, &url, headers, authorization.as_deref(), &body)?;
            let status = response.status().as_u16();
            if status != 401 || attempt == 1 {
                if status == 401 || status == 403 {
                    return Err(Error::Unauthorized {
                        registry: reference.registry.clone(),
                        repository: reference.repository.clone(),
                        status,
                    });
                }
                return Ok(response);
            }
            let challenge = response
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .and_then(Challenge::parse);
            authorization = Some(self.authenticate(reference, challenge, push)?);
            self.tokens
                .lock()
                .expect("tokens lock")
                .insert(key.clone(), authorization.clone().unwrap_or_default());
        }
        unreachable!("the loop returns on its second attempt")
    }

    fn request(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        authorization: Option<&str>,
        body: &Body<'_>,
    ) -> Result<Response<ureq::Body>, Error> {
        let transport = |e: ureq::Error| Error::Transport {
            url: url.to_string(),
            reason: e.to_string(),
        };
        macro_rules! with_headers {
            ($builder:expr) => {{
                let mut b = $builder;
                for (k, v) in headers {
                    b = b.header(*k, *v);
                }
                if let Some(a) = authorization {
                    b = b.header("Authorization", a);
                }
                b
            }};
        }
        match (method, body) {
            ("GET", _) => with_headers!(self.agent.get(url)).call(),
            ("HEAD", _) => with_headers!(self.agent.head(url)).call(),
            ("POST", Body::Bytes(b)) => with_headers!(self.agent.post(url)).send(*b),
            ("POST", Body::None) => with_headers!(self.agent.post(url)).send_empty(),
            ("PUT", Body::Bytes(b)) => with_headers!(self.agent.put(url)).send(*b),
            ("PUT", Body::None) => with_headers!(self.agent.put(url)).send_empty(),
            _ => unreachable!("only the methods above are used"),
        }
        .map_err(transport)
    }

    fn authenticate(
        &self,
        reference: &Reference,
        challenge: Option<Challenge>,
        push: bool,
    ) -> Result<String, Error> {
        let credentials = self.credentials.get(&reference.registry);
        let unauthorized = || Error::Unauthorized {
            registry: reference.registry.clone(),
            repository: reference.repository.clone(),
            status: 401,
        };
        match challenge {
            Some(Challenge::Basic) | None => {
                credentials.map(|c| c.basic()).ok_or_else(unauthorized)
            }
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let scope = scope.unwrap_or_else(|| {
                    format!(
                        "repository:{}:{}",
                        reference.repository,
                        if push { "pull,push" } else { "pull" }
                    )
                });
                let mut request = self.agent.get(&realm).query("scope", &scope);
                if let Some(service) = &service {
                    request = request.query("service", service);
                }
                if let Some(c) = credentials {
                    request = request.header("Authorization", &c.basic());
                }
                let mut response = request.call().map_err(|e| Error::Transport {
                    url: realm.clone(),
                    reason: e.to_string(),
                })?;
                if !response.status().is_success() {
                    return Err(unauthorized());
                }
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let body = response
                    .body_mut()
                    .with_config()
                    .limit(1024 * 1024)
                    .read_to_vec()
                    .map_err(|e| Error::malformed(format!("token from {realm}"), e))?;
                let token: Token = serde_json::from_slice(&body)
                    .map_err(|e| Error::malformed(format!("token from {realm}"), e))?;
                let token = token
                    .token
                    .or(token.access_token)
                    .ok_or_else(unauthorized)?;
                Ok(format!("Bearer {token}"))
            }
        }
    }

    fn unexpected(
        reference: &Reference,
        request: String,
        mut response: Response<ureq::Body>,
    ) -> Error {
        let status = response.status().as_u16();
        // After a redirect (blob storage), say which host answered — only
        // the host: a presigned URL's query is a credential.
        let request = {
            use ureq::ResponseExt;
            match response.get_uri().authority() {
                Some(host) if host.as_str() != reference.registry => {
                    let scheme = response.get_uri().scheme_str().unwrap_or("https");
                    format!("{request} (redirected to {scheme}://{host})")
                }
                _ => request,
            }
        };
        let body = response
            .body_mut()
            .with_config()
            .limit(4096)
            .lossy_utf8(true)
            .read_to_string()
            .unwrap_or_default();
        if status == 404 {
            return Error::NotFound {
                repository: reference.repository_name(),
                what: request,
            };
        }
        Error::Registry {
            registry: reference.registry.clone(),
            request,
            status,
            body: body.chars().take(300).collect(),
        }
    }

    /// Fetch a manifest or index by the reference's digest (checked) or tag
    /// (digest computed from the bytes). Returns the digest, media type and bytes.
    pub fn fetch_manifest(
        &self,
        reference: &Reference,
    ) -> Result<(Digest, String, Vec<u8>), Error> {
        self.fetch_manifest_opt(reference)?
            .ok_or_else(|| Error::NotFound {
                repository: reference.repository_name(),
                what: format!("manifest {}", reference.manifest_reference()),
            })
    }

    /// Like [`Client::fetch_manifest`], with `None` for "no such tag or digest".
    pub fn fetch_manifest_opt(
        &self,
        reference: &Reference,
    ) -> Result<Option<(Digest, String, Vec<u8>)>, Error> {
        let want = reference.manifest_reference();
        let path = format!("/v2/{}/manifests/{want}", reference.repository);
        let response = self.send(
            "GET",
            reference,
            &path,
            &[("Accept", ACCEPT_MANIFESTS)],
            Body::None,
            false,
        )?;
        if response.status().as_u16() == 404 {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(Self::unexpected(
                reference,
                format!("GET manifest {want}"),
                response,
            ));
        }
        let what = format!("manifest {}@{want}", reference.repository_name());
        let media_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(oci::MANIFEST)
            .to_string();
        let header_digest = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = read_limited(response, &what, None, MAX_MANIFEST_BYTES, &NoProgress)?;
        let actual = Digest::of(&bytes);
        if let Some(expected) = &reference.digest {
            expected.check(&what, &bytes)?;
        } else if let Some(header) = header_digest.filter(|h| h != actual.as_str()) {
            return Err(Error::DigestMismatch {
                what: format!("{what} (the registry's Docker-Content-Digest header)"),
                expected: header,
                actual: actual.to_string(),
            });
        }
        Ok(Some((actual, media_type, bytes)))
    }

    /// Fetch a blob, refusing it if it is larger than the limit, shorter or
    /// longer than the descriptor says, or not the digest asked for.
    pub fn fetch_blob(
        &self,
        reference: &Reference,
        descriptor: &oci::Descriptor,
        progress: &dyn Progress,
    ) -> Result<Vec<u8>, Error> {
        let what = format!(
            "blob {} of {}",
            descriptor.digest,
            reference.repository_name()
        );
        let limit = self.max_blob_bytes();
        if descriptor.size > limit {
            return Err(Error::TooLarge {
                what: format!("{what} (size declared by the manifest)"),
                size: descriptor.size,
                limit,
            });
        }
        let path = format!("/v2/{}/blobs/{}", reference.repository, descriptor.digest);
        let response = self.send("GET", reference, &path, &[], Body::None, false)?;
        if !response.status().is_success() {
            return Err(Self::unexpected(
                reference,
                format!("GET blob {}", descriptor.digest),
                response,
            ));
        }
        progress.begin(&short(&descriptor.digest), descriptor.size);
        let bytes = read_limited(response, &what, Some(descriptor.size), limit, progress);
        progress.finish();
        let bytes = bytes?;
        descriptor.digest.check(&what, &bytes)?;
        Ok(bytes)
    }

    /// Whether the repository has this blob.
    pub fn blob_exists(&self, reference: &Reference, digest: &Digest) -> Result<bool, Error> {
        let path = format!("/v2/{}/blobs/{digest}", reference.repository);
        let response = self.send("HEAD", reference, &path, &[], Body::None, true)?;
        match response.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(Self::unexpected(
                reference,
                format!("HEAD blob {digest}"),
                response,
            )),
        }
    }

    /// Upload a blob unless the repository already has it.
    pub fn push_blob(
        &self,
        reference: &Reference,
        bytes: &[u8],
        progress: &dyn Progress,
    ) -> Result<Digest, Error> {
        let digest = Digest::of(bytes);
        progress.begin(&short(&digest), bytes.len() as u64);
        if self.blob_exists(reference, &digest)? {
            progress.advance(bytes.len() as u64);
            progress.finish();
            return Ok(digest);
        }
        let path = format!("/v2/{}/blobs/uploads/", reference.repository);
        let response = self.send("POST", reference, &path, &[], Body::None, true)?;
        if response.status().as_u16() != 202 {
            return Err(Self::unexpected(
                reference,
                "POST blob upload".into(),
                response,
            ));
        }
        let location = response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Error::malformed("blob upload", "the registry sent no Location"))?
            .to_string();
        let location = if location.starts_with('/') {
            format!("{}{location}", self.base(&reference.registry)?)
        } else {
            location
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let url = format!("{location}{separator}digest={digest}");
        let response = self.send(
            "PUT",
            reference,
            &url,
            &[("Content-Type", "application/octet-stream")],
            Body::Bytes(bytes),
            true,
        )?;
        progress.advance(bytes.len() as u64);
        progress.finish();
        if response.status().as_u16() != 201 {
            return Err(Self::unexpected(
                reference,
                format!("PUT blob {digest}"),
                response,
            ));
        }
        Ok(digest)
    }

    /// Push a manifest or index under `tag` (or by its digest when `None`).
    pub fn push_manifest(
        &self,
        reference: &Reference,
        tag: Option<&str>,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Digest, Error> {
        let digest = Digest::of(bytes);
        let target = tag.map_or_else(|| digest.to_string(), str::to_string);
        let path = format!("/v2/{}/manifests/{target}", reference.repository);
        let response = self.send(
            "PUT",
            reference,
            &path,
            &[("Content-Type", media_type)],
            Body::Bytes(bytes),
            true,
        )?;
        if response.status().as_u16() != 201 {
            return Err(Self::unexpected(
                reference,
                format!("PUT manifest {target}"),
                response,
            ));
        }
        Ok(digest)
    }
}

/// `sha256:0123456789ab` for progress labels.
pub(crate) fn short(digest: &Digest) -> String {
    digest.as_str()[..19].to_string()
}

fn read_limited(
    response: Response<ureq::Body>,
    what: &str,
    expected: Option<u64>,
    limit: u64,
    progress: &dyn Progress,
) -> Result<Vec<u8>, Error> {
    let cap = expected.unwrap_or(limit).min(limit);
    let mut reader = response
        .into_body()
        .into_with_config()
        .limit(u64::MAX)
        .reader();
    let mut out = Vec::with_capacity(cap.min(16 * 1024 * 1024) as usize);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                // A body that ends early (Content-Length larger than what
                // was sent) shows up as an error mid-read.
                if let Some(expected) = expected {
                    return Err(Error::Truncated {
                        what: format!("{what} ({e})"),
                        expected,
                        got: out.len() as u64,
                    });
                }
                return Err(Error::Transport {
                    url: what.to_string(),
                    reason: e.to_string(),
                });
            }
        };
        out.extend_from_slice(&buf[..n]);
        progress.advance(n as u64);
        let got = out.len() as u64;
        if got > cap {
            return Err(Error::TooLarge {
                what: format!(
                    "{what} (bytes actually sent{})",
                    expected.map_or(String::new(), |e| format!("; the manifest says {e}"))
                ),
                size: got,
                limit: cap,
            });
        }
    }
    if let Some(expected) = expected
        && (out.len() as u64) < expected
    {
        return Err(Error::Truncated {
            what: what.to_string(),
            expected,
            got: out.len() as u64,
        });
    }
    Ok(out)
}
