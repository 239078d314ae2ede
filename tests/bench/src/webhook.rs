//! The webhook comparison point of the plugin benchmark: the same
//! `sim-provider` call served as an HTTPS webhook on loopback (what a
//! Cluster API runtime extension costs).

use anyhow::Context;
use bytes::Bytes;
use capstan_sdk::Machine;
use http_body_util::{BodyExt, Full};
use serde::{Deserialize, Serialize};
use sim_provider::SimProvider;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

use crate::{NativeHttp, native_create, native_validate};

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
