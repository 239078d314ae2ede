//! The comparison points for the plugin benchmark: the same `sim-provider`
//! logic compiled natively and called in-process, and the same call served
//! as an HTTPS webhook on loopback (what a Cluster API runtime extension
//! costs).

use anyhow::Context;
use bytes::Bytes;
use capstan_sdk::http::{HttpClient, HttpError, Request, Response};
use capstan_sdk::{Machine, MachineStatus, Provider};
use http_body_util::{BodyExt, Full};
use serde::{Deserialize, Serialize};
use sim_provider::{SimConfig, SimProvider};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// A native HTTP client that, like the sandbox's outbound path, keeps
/// connections alive, so the comparison isolates the sandbox's own cost.
#[derive(Debug, Clone)]
pub struct NativeHttp {
    agent: ureq::Agent,
    token: Option<String>,
}

impl NativeHttp {
    /// A client that sends `Authorization: Bearer <token>` itself (in the
    /// sandbox the host attaches it).
    pub fn new(token: Option<String>) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        NativeHttp { agent, token }
    }
}

impl Default for NativeHttp {
    fn default() -> Self {
        Self::new(None)
    }
}

impl HttpClient for NativeHttp {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        let mut builder = ureq::http::Request::builder()
            .method(request.method.as_str())
            .uri(&request.url);
        for (k, v) in &request.headers {
            builder = builder.header(k, v);
        }
        if let Some(token) = &self.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        let req = builder
            .body(request.body.clone())
            .map_err(|e| HttpError::InvalidUrl(e.to_string()))?;
        let mut resp = self
            .agent
            .run(req)
            .map_err(|e| HttpError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = resp
            .body_mut()
            .read_to_vec()
            .map_err(|e| HttpError::Transport(e.to_string()))?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// Call `create` natively, parsing the config per call as the plugin does.
pub fn native_create(
    provider: &SimProvider<NativeHttp>,
    machine: &Machine,
) -> Result<MachineStatus, String> {
    let config: SimConfig = capstan_sdk::parse_config("provider config", &machine.provider_config)
        .map_err(|e| format!("{e:?}"))?;
    provider.validate(&config).map_err(|e| format!("{e:?}"))?;
    provider
        .create(machine, &config)
        .map_err(|e| format!("{e:?}"))
}

/// Call `validate` natively (pure logic, no I/O).
pub fn native_validate(provider: &SimProvider<NativeHttp>, config: &str) -> Result<(), String> {
    let config: SimConfig =
        capstan_sdk::parse_config("provider config", config).map_err(|e| format!("{e:?}"))?;
    provider.validate(&config).map_err(|e| format!("{e:?}"))
}

/// The webhook's request body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookRequest {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub version: Option<String>,
    pub provider_config: String,
}

/// The webhook's response body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookResponse {
    pub provider_id: Option<String>,
    pub error: Option<String>,
}

fn machine_from(req: WebhookRequest) -> Machine {
    Machine {
        name: req.name,
        namespace: req.namespace,
        uid: req.uid,
        cluster_name: None,
        labels: vec![],
        version: req.version,
        failure_domain: None,
        provider_config: req.provider_config,
        infrastructure_config: None,
        provider_id: None,
    }
}

/// An HTTPS webhook on loopback serving `POST /create` and `POST /validate`
/// with the native provider logic. Stops when dropped.
#[derive(Debug)]
pub struct Webhook {
    pub addr: SocketAddr,
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Webhook {
    /// Start serving with a fresh self-signed certificate for `localhost`.
    pub async fn start(token: Option<String>) -> anyhow::Result<Webhook> {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])
            .context("cannot generate the webhook certificate")?;
        let cert_der = cert.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let provider = Arc::new(SimProvider::with_client(NativeHttp::new(token)));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    break;
                };
                let acceptor = acceptor.clone();
                let provider = provider.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req| handle(provider.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Webhook {
            addr,
            ca_pem: cert.cert.pem(),
            task,
        })
    }

    /// A keep-alive HTTPS client trusting this webhook's certificate, as a
    /// Cluster API controller's webhook client would be.
    pub fn client(&self) -> anyhow::Result<ureq::Agent> {
        capstan_sim_cloud::agent_trusting(self.ca_pem.as_bytes()).map_err(anyhow::Error::msg)
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

async fn handle(
    provider: Arc<SimProvider<NativeHttp>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await?.to_bytes();
    let reply = match serde_json::from_slice::<WebhookRequest>(&body) {
        Err(e) => WebhookResponse {
            provider_id: None,
            error: Some(format!("bad request: {e}")),
        },
        Ok(request) => {
            let machine = machine_from(request);
            let outcome = tokio::task::spawn_blocking(move || match path.as_str() {
                "/create" => native_create(&provider, &machine).map(|s| Some(s.provider_id)),
                "/validate" => native_validate(&provider, &machine.provider_config).map(|()| None),
                other => Err(format!("no such hook {other}")),
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            match outcome {
                Ok(provider_id) => WebhookResponse {
                    provider_id,
                    error: None,
                },
                Err(error) => WebhookResponse {
                    provider_id: None,
                    error: Some(error),
                },
            }
        }
    };
    let json = serde_json::to_vec(&reply).unwrap_or_default();
    Ok(hyper::Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json)))
        .unwrap_or_default())
}

/// Call the webhook (blocking; run it off the async threads).
pub fn call_webhook(
    agent: &ureq::Agent,
    url: &str,
    hook: &str,
    body: &WebhookRequest,
) -> Result<WebhookResponse, String> {
    let json = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    let mut resp = agent
        .post(format!("{url}/{hook}"))
        .header("content-type", "application/json")
        .send(&json[..])
        .map_err(|e| e.to_string())?;
    let bytes = resp.body_mut().read_to_vec().map_err(|e| e.to_string())?;
    let reply: WebhookResponse = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    match &reply.error {
        Some(e) => Err(e.clone()),
        None => Ok(reply),
    }
}

/// The sim-provider logic compiled natively, as a controller provider: the
/// comparison point of the scale benchmark (`capstan controller
/// --native-sim-provider NAME`). Calls run on the blocking pool since the
/// native HTTP client blocks.
#[derive(Debug, Clone)]
pub struct NativeSimProvider {
    provider: Arc<SimProvider<NativeHttp>>,
    digest: String,
}

impl NativeSimProvider {
    /// A provider sending `token` as its bearer credential.
    pub fn new(token: Option<String>) -> Self {
        NativeSimProvider {
            provider: Arc::new(SimProvider::with_client(NativeHttp::new(token))),
            digest: "native:sim-provider".into(),
        }
    }
}

mod convert {
    //! The host's (wasmtime) and the SDK's (wit-bindgen) renderings of the
    //! same WIT types.
    use capstan_controllers::ProviderError;
    use capstan_runtime::types as host;
    use capstan_sdk as sdk;
    use std::time::Duration;

    pub fn machine(m: &host::Machine) -> sdk::Machine {
        sdk::Machine {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            cluster_name: m.cluster_name.clone(),
            labels: m.labels.clone(),
            version: m.version.clone(),
            failure_domain: m.failure_domain.clone(),
            provider_config: m.provider_config.clone(),
            infrastructure_config: m.infrastructure_config.clone(),
            provider_id: m.provider_id.clone(),
        }
    }

    pub fn status(s: sdk::MachineStatus) -> host::MachineStatus {
        host::MachineStatus {
            provider_id: s.provider_id,
            state: match s.state {
                sdk::InstanceState::Pending => host::InstanceState::Pending,
                sdk::InstanceState::Running => host::InstanceState::Running,
                sdk::InstanceState::Updating => host::InstanceState::Updating,
                sdk::InstanceState::Stopping => host::InstanceState::Stopping,
                sdk::InstanceState::Stopped => host::InstanceState::Stopped,
                sdk::InstanceState::Terminated => host::InstanceState::Terminated,
                sdk::InstanceState::Unknown => host::InstanceState::Unknown,
            },
            addresses: s
                .addresses
                .into_iter()
                .map(|a| host::MachineAddress {
                    kind: match a.kind {
                        sdk::AddressKind::InternalIp => host::AddressKind::InternalIp,
                        sdk::AddressKind::ExternalIp => host::AddressKind::ExternalIp,
                        sdk::AddressKind::InternalDns => host::AddressKind::InternalDns,
                        sdk::AddressKind::ExternalDns => host::AddressKind::ExternalDns,
                        sdk::AddressKind::Hostname => host::AddressKind::Hostname,
                    },
                    address: a.address,
                })
                .collect(),
            failure_domain: s.failure_domain,
            version: s.version,
            message: s.message,
        }
    }

    pub fn error(e: sdk::PluginError) -> ProviderError {
        match e {
            sdk::PluginError::InvalidConfig(m) => ProviderError::InvalidConfig(m),
            sdk::PluginError::NotFound(m) => ProviderError::NotFound(m),
            sdk::PluginError::Transient(t) => ProviderError::Transient {
                message: t.message,
                retry_after: Duration::from_millis(t.retry_after_ms.max(1)),
            },
            sdk::PluginError::Unauthorized(m) => ProviderError::Unauthorized(m),
            sdk::PluginError::Terminal(m) => ProviderError::Terminal(m),
        }
    }
}

impl NativeSimProvider {
    async fn run<T: Send + 'static>(
        &self,
        config: &str,
        call: impl FnOnce(&SimProvider<NativeHttp>, &SimConfig) -> Result<T, capstan_sdk::PluginError>
        + Send
        + 'static,
    ) -> Result<T, capstan_controllers::ProviderError> {
        let provider = self.provider.clone();
        let config = config.to_string();
        tokio::task::spawn_blocking(move || {
            let config: SimConfig = capstan_sdk::parse_config("provider config", &config)?;
            provider.validate(&config)?;
            call(&provider, &config)
        })
        .await
        .map_err(|e| capstan_controllers::ProviderError::Fault(e.to_string()))?
        .map_err(convert::error)
    }
}

impl capstan_controllers::MachineProvider for NativeSimProvider {
    fn digest(&self) -> &str {
        &self.digest
    }
    fn validate<'a>(
        &'a self,
        config: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), capstan_controllers::ProviderError>> {
        Box::pin(self.run(config, |_, _| Ok(())))
    }
    fn create<'a>(
        &'a self,
        machine: &'a capstan_runtime::types::Machine,
    ) -> futures::future::BoxFuture<
        'a,
        Result<capstan_runtime::types::MachineStatus, capstan_controllers::ProviderError>,
    > {
        let m = convert::machine(machine);
        Box::pin(async move {
            let config = m.provider_config.clone();
            self.run(&config, move |p, c| p.create(&m, c).map(convert::status))
                .await
        })
    }
    fn get<'a>(
        &'a self,
        machine: &'a capstan_runtime::types::Machine,
    ) -> futures::future::BoxFuture<
        'a,
        Result<capstan_runtime::types::MachineStatus, capstan_controllers::ProviderError>,
    > {
        let m = convert::machine(machine);
        Box::pin(async move {
            let config = m.provider_config.clone();
            self.run(&config, move |p, c| p.get(&m, c).map(convert::status))
                .await
        })
    }
    fn delete<'a>(
        &'a self,
        machine: &'a capstan_runtime::types::Machine,
    ) -> futures::future::BoxFuture<
        'a,
        Result<capstan_runtime::types::Deletion, capstan_controllers::ProviderError>,
    > {
        let m = convert::machine(machine);
        Box::pin(async move {
            let config = m.provider_config.clone();
            self.run(&config, move |p, c| {
                p.delete(&m, c).map(|d| match d {
                    capstan_sdk::Deletion::Done => capstan_runtime::types::Deletion::Done,
                    capstan_sdk::Deletion::InProgress(ms) => {
                        capstan_runtime::types::Deletion::InProgress(ms)
                    }
                })
            })
            .await
        })
    }
}
