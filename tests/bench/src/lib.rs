//! The sim-provider logic compiled natively, without the sandbox: the
//! comparison point of Capstan's benchmarks. [`NativeHttp`] is a blocking
//! HTTP client for the provider logic; [`NativeSimProvider`] serves it as a
//! controller provider (the native variant of `capstan-bench-scale`, run by
//! the `capstan-bench-controller` binary, so that the product's
//! `capstan controller` carries no benchmark flags).

pub mod languages;
pub mod syscalls;
pub mod webhook;

use capstan_sdk::http::{HttpClient, HttpError, Request, Response};
use capstan_sdk::{Machine, MachineStatus, Provider};
use sim_provider::{SimConfig, SimProvider};
use std::sync::Arc;

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
        let req = http_request(request, self.token.as_deref())?;
        let mut resp = self
            .agent
            .run(req)
            .map_err(|e| HttpError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let headers = header_pairs(resp.headers());
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

/// `request` as an `http` request, with `Authorization: Bearer <token>`
/// when there is a token (in the sandbox the host attaches it).
fn http_request(
    request: &Request,
    token: Option<&str>,
) -> Result<ureq::http::Request<Vec<u8>>, HttpError> {
    let mut builder = ureq::http::Request::builder()
        .method(request.method.as_str())
        .uri(&request.url);
    for (k, v) in &request.headers {
        builder = builder.header(k, v);
    }
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder
        .body(request.body.clone())
        .map_err(|e| HttpError::InvalidUrl(e.to_string()))
}

/// Response headers as the SDK's name-value pairs.
fn header_pairs(headers: &ureq::http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// The HTTP stack the sandbox sends a plugin's requests through, without
/// the sandbox: hyper-util's pooled keep-alive client (no Nagle delay) on a
/// current-thread executor, as on a call thread
/// (`capstan_runtime::workers`). The provider logic over this client is
/// `capstan-bench-plugin`'s `native_hyper` path: against the `wasm` path it
/// tells the sandbox's cost from the HTTP stack's and its scheduling.
/// Plain `http` only (the benchmark's cloud); the runtime wraps the same
/// connector in TLS for `https`.
#[derive(Debug)]
pub struct HyperHttp {
    /// Taken on drop (see there).
    executor: Option<tokio::runtime::Runtime>,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    token: Option<String>,
}

impl HyperHttp {
    /// A client that sends `Authorization: Bearer <token>` itself. Call
    /// [`HttpClient::send`] from a thread that is not in a tokio context:
    /// it drives its own executor while it waits.
    pub fn new(token: Option<String>) -> std::io::Result<Self> {
        let executor = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build(connector);
        Ok(HyperHttp {
            executor: Some(executor),
            client,
            token,
        })
    }
}

impl Default for HyperHttp {
    /// Without a token; panics if the OS refuses an executor (epoll,
    /// eventfd), as a benchmark cannot go on then.
    fn default() -> Self {
        Self::new(None).expect("cannot start a current-thread executor")
    }
}

impl Drop for HyperHttp {
    fn drop(&mut self) {
        // A runtime dropped the ordinary way blocks, which tokio refuses on
        // an async thread; this one may be dropped on either kind.
        if let Some(executor) = self.executor.take() {
            executor.shutdown_background();
        }
    }
}

impl HttpClient for HyperHttp {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        use http_body_util::BodyExt;
        let req = http_request(request, self.token.as_deref())?
            .map(|body| http_body_util::Full::new(bytes::Bytes::from(body)));
        let transport = |e: &dyn std::fmt::Display| HttpError::Transport(e.to_string());
        let executor = self.executor.as_ref().ok_or(HttpError::Unavailable)?;
        executor.block_on(async {
            let resp = self.client.request(req).await.map_err(|e| transport(&e))?;
            let status = resp.status().as_u16();
            let headers = header_pairs(resp.headers());
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| transport(&e))?
                .to_bytes()
                .to_vec();
            Ok(Response {
                status,
                headers,
                body,
            })
        })
    }
}

/// Call `create` natively, parsing the config per call as the plugin does.
pub fn native_create<C: HttpClient + Default>(
    provider: &SimProvider<C>,
    machine: &Machine,
) -> Result<MachineStatus, String> {
    let config: SimConfig = capstan_sdk::parse_config("provider config", &machine.provider_config)
        .map_err(|e| format!("{e:?}"))?;
    provider.validate(&config).map_err(|e| format!("{e:?}"))?;
    provider
        .create(machine, &config, None)
        .map_err(|e| format!("{e:?}"))
}

/// Call `validate` natively (pure logic, no I/O).
pub fn native_validate<C: HttpClient + Default>(
    provider: &SimProvider<C>,
    config: &str,
) -> Result<(), String> {
    let config: SimConfig =
        capstan_sdk::parse_config("provider config", config).map_err(|e| format!("{e:?}"))?;
    provider.validate(&config).map_err(|e| format!("{e:?}"))
}

/// The sim-provider logic compiled natively, as a controller provider: the
/// comparison point of the scale benchmark (`capstan-bench-controller
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

    pub fn bootstrap(b: &host::BootstrapData) -> sdk::BootstrapData {
        sdk::BootstrapData {
            format: match b.format {
                host::BootstrapFormat::CloudConfig => sdk::BootstrapFormat::CloudConfig,
                host::BootstrapFormat::Ignition => sdk::BootstrapFormat::Ignition,
                host::BootstrapFormat::Shell => sdk::BootstrapFormat::Shell,
            },
            value: b.value.clone(),
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
    /// `call` with `machine` in the SDK's types and its parsed config.
    async fn on_machine<T: Send + 'static>(
        &self,
        machine: &capstan_runtime::types::Machine,
        call: impl FnOnce(
            &SimProvider<NativeHttp>,
            &Machine,
            &SimConfig,
        ) -> Result<T, capstan_sdk::PluginError>
        + Send
        + 'static,
    ) -> Result<T, capstan_controllers::ProviderError> {
        let m = convert::machine(machine);
        let config = m.provider_config.clone();
        self.run(&config, move |p, c| call(p, &m, c)).await
    }

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
        bootstrap: Option<&'a capstan_runtime::types::BootstrapData>,
    ) -> futures::future::BoxFuture<
        'a,
        Result<capstan_runtime::types::MachineStatus, capstan_controllers::ProviderError>,
    > {
        let bootstrap = bootstrap.map(convert::bootstrap);
        Box::pin(self.on_machine(machine, move |p, m, c| {
            p.create(m, c, bootstrap.as_ref()).map(convert::status)
        }))
    }
    fn get<'a>(
        &'a self,
        machine: &'a capstan_runtime::types::Machine,
    ) -> futures::future::BoxFuture<
        'a,
        Result<capstan_runtime::types::MachineStatus, capstan_controllers::ProviderError>,
    > {
        Box::pin(self.on_machine(machine, |p, m, c| p.get(m, c).map(convert::status)))
    }
    fn delete<'a>(
        &'a self,
        machine: &'a capstan_runtime::types::Machine,
    ) -> futures::future::BoxFuture<
        'a,
        Result<capstan_runtime::types::Deletion, capstan_controllers::ProviderError>,
    > {
        Box::pin(self.on_machine(machine, |p, m, c| {
            p.delete(m, c).map(|d| match d {
                capstan_sdk::Deletion::Done => capstan_runtime::types::Deletion::Done,
                capstan_sdk::Deletion::InProgress(ms) => {
                    capstan_runtime::types::Deletion::InProgress(ms)
                }
            })
        }))
    }
}
