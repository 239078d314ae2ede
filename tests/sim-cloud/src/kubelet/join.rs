//! How a simulated instance joins its cluster from its user data, as
//! `kubeadm join` and the kubelet do it:
//!
//! 1. [`join_configuration`]: read the cloud-config the instance booted with
//!    and take the kubeadm `JoinConfiguration` it writes (API server, token,
//!    CA pins, Node name, labels, taints);
//! 2. token discovery ([`verify_cluster_info`]): fetch
//!    `kube-public/cluster-info` anonymously and trust it only if the
//!    controller-manager's bootstrap signer signed it with this token (a
//!    detached HS256 JWS) and its CA matches a pin;
//! 3. TLS bootstrapping ([`bootstrap`]): as the bootstrap token, create a
//!    `kubernetes.io/kube-apiserver-client-kubelet` CSR for
//!    `system:node:<name>` / `system:nodes`, wait until it is approved and
//!    signed, and return a client that authenticates with that certificate.
//!
//! The parsing and checks are pure; [`bootstrap`] does the HTTP.
//!
//! One process simulates many instances, so the anonymous read of
//! `cluster-info` is shared as a fleet of real kubelets would not share it:
//! at most one read per endpoint a second serves every instance still in
//! discovery (each still checks the signature with its own token and the CA
//! against its own pins; at 1,000 machines, one read each a second was
//! 1,000 TLS handshakes and copies of a ConfigMap holding 1,000 signatures
//! a second). Waiting for the CSR is a watch of that one CSR, as the
//! kubelet's own wait is.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a machine's `JoinConfiguration` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinConfig {
    /// `host:port` of the API server.
    pub api_server_endpoint: String,
    /// `<id>.<secret>`.
    pub token: String,
    /// `sha256:<hex>` pins of the cluster CA.
    pub ca_cert_hashes: Vec<String>,
    /// The name the Node registers under.
    pub node_name: String,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// The taints it registers with (Node `spec.taints` entries).
    pub taints: Vec<Value>,
}

impl JoinConfig {
    /// The token's id (the part before the dot).
    pub fn token_id(&self) -> &str {
        self.token.split('.').next().unwrap_or_default()
    }
    fn token_secret(&self) -> &str {
        self.token.split('.').nth(1).unwrap_or_default()
    }
}

/// The `JoinConfiguration` in a `#cloud-config` document (a `write_files`
/// entry whose content is one), as `kubeadm join --config` would read it.
pub fn join_configuration(format: &str, data: &[u8]) -> Result<JoinConfig, String> {
    if format != "cloud-config" {
        return Err(format!(
            "the user data is {format}; this simulated instance runs cloud-init and reads cloud-config"
        ));
    }
    let text = std::str::from_utf8(data).map_err(|_| "the user data is not UTF-8 text")?;
    if !text.starts_with("#cloud-config") {
        return Err("the user data does not start with #cloud-config".into());
    }
    let doc: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| format!("the cloud-config is not YAML: {e}"))?;
    let files = doc["write_files"]
        .as_sequence()
        .ok_or("the cloud-config writes no files, so there is no JoinConfiguration")?;
    let join = files
        .iter()
        .filter_map(|f| f["content"].as_str())
        .filter_map(|c| serde_yaml::from_str::<serde_yaml::Value>(c).ok())
        .find(|c| c["kind"] == "JoinConfiguration")
        .ok_or("the cloud-config writes no kubeadm JoinConfiguration")?;
    let token = &join["discovery"]["bootstrapToken"];
    let text_of = |v: &serde_yaml::Value, what: &str| {
        v.as_str()
            .map(String::from)
            .ok_or_else(|| format!("JoinConfiguration: {what} is missing"))
    };
    let registration = &join["nodeRegistration"];
    let args = &registration["kubeletExtraArgs"];
    // A map before kubeadm v1beta4, a list of {name, value} since.
    let node_labels_arg = match args {
        serde_yaml::Value::Sequence(list) => list
            .iter()
            .find(|a| a["name"] == "node-labels")
            .and_then(|a| a["value"].as_str()),
        other => other["node-labels"].as_str(),
    };
    let mut node_labels = BTreeMap::new();
    for pair in node_labels_arg.unwrap_or_default().split(',') {
        if let Some((k, v)) = pair.split_once('=') {
            node_labels.insert(k.to_string(), v.to_string());
        }
    }
    let taints = registration["taints"]
        .as_sequence()
        .map(|list| {
            list.iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect()
        })
        .unwrap_or_default();
    let config = JoinConfig {
        api_server_endpoint: text_of(
            &token["apiServerEndpoint"],
            "discovery.bootstrapToken.apiServerEndpoint",
        )?,
        token: text_of(&token["token"], "discovery.bootstrapToken.token")?,
        ca_cert_hashes: token["caCertHashes"]
            .as_sequence()
            .map(|l| {
                l.iter()
                    .filter_map(|h| h.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        node_name: text_of(&registration["name"], "nodeRegistration.name")?,
        node_labels,
        taints,
    };
    let shaped = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !(shaped(config.token_id(), 6) && shaped(config.token_secret(), 16)) {
        return Err(
            "JoinConfiguration: the bootstrap token is not of the form [a-z0-9]{6}.[a-z0-9]{16}"
                .into(),
        );
    }
    if config.ca_cert_hashes.is_empty() {
        return Err(
            "JoinConfiguration: no caCertHashes (unpinned discovery is refused, as kubeadm refuses it by default)"
                .into(),
        );
    }
    Ok(config)
}

/// `cluster-info`'s server and CA, if the bootstrap signer signed its
/// kubeconfig with this token and the CA matches one of the pins.
pub fn verify_cluster_info(
    data: &BTreeMap<String, String>,
    join: &JoinConfig,
) -> Result<(String, Vec<u8>), String> {
    let kubeconfig = data
        .get("kubeconfig")
        .ok_or("cluster-info has no kubeconfig")?;
    let signature = data
        .get(&format!("jws-kubeconfig-{}", join.token_id()))
        .ok_or_else(|| {
            format!(
                "cluster-info is not signed with token id {:?}: the token is unknown to the cluster or expired",
                join.token_id()
            )
        })?;
    let (header, sig) = signature
        .split_once("..")
        .ok_or("the cluster-info signature is not a detached JWS")?;
    let mut mac = Hmac::<Sha256>::new_from_slice(join.token_secret().as_bytes())
        .map_err(|e| e.to_string())?;
    mac.update(format!("{header}.{}", URL_SAFE_NO_PAD.encode(kubeconfig)).as_bytes());
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| "the cluster-info signature is not base64url")?;
    mac.verify_slice(&sig)
        .map_err(|_| "the cluster-info signature does not verify with this token's secret")?;
    let parsed: serde_yaml::Value = serde_yaml::from_str(kubeconfig)
        .map_err(|e| format!("cluster-info's kubeconfig is not YAML: {e}"))?;
    let cluster = &parsed["clusters"][0]["cluster"];
    let server = cluster["server"]
        .as_str()
        .ok_or("cluster-info's kubeconfig has no server")?
        .to_string();
    let ca = STANDARD
        .decode(
            cluster["certificate-authority-data"]
                .as_str()
                .ok_or("cluster-info's kubeconfig has no certificate-authority-data")?,
        )
        .map_err(|_| "cluster-info's certificate-authority-data is not base64")?;
    let pins = ca_pins(&ca);
    if !pins.iter().any(|p| join.ca_cert_hashes.contains(p)) {
        return Err(format!(
            "the cluster CA's public key ({}) matches none of the pinned caCertHashes",
            pins.first().map(String::as_str).unwrap_or("no certificate")
        ));
    }
    Ok((server, ca))
}

/// `sha256:<hex>` of every certificate's SubjectPublicKeyInfo in a PEM
/// bundle (kubeadm's pin).
pub fn ca_pins(pem: &[u8]) -> Vec<String> {
    ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => spki(c.der()).map(|s| s.to_vec()),
            _ => None,
        })
        .map(|spki| format!("sha256:{}", hex_lower(&Sha256::digest(spki))))
        .collect()
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One DER element: (tag, whole element, content).
fn der(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *d.first()?;
    let first = *d.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        let mut len = 0usize;
        for b in d.get(2..2 + n)? {
            len = (len << 8) | usize::from(*b);
        }
        (len, 2 + n)
    };
    let whole = d.get(..header + len)?;
    Some((tag, whole, &whole[header..]))
}

/// The certificate's SubjectPublicKeyInfo element.
fn spki(cert: &[u8]) -> Option<&[u8]> {
    let (_, _, certificate) = der(cert)?;
    let (_, _, mut tbs) = der(certificate)?;
    let mut fields = Vec::new();
    while !tbs.is_empty() && fields.len() < 8 {
        let (tag, whole, _) = der(tbs)?;
        fields.push((tag, whole));
        tbs = &tbs[whole.len()..];
    }
    let skip = usize::from(fields.first()?.0 == 0xa0);
    fields.get(skip + 5).map(|(_, w)| *w)
}

/// A kube-rs client for `server` trusting `ca`, with a bearer token or a
/// client certificate.
fn client(server: &str, ca: &[u8], auth: kube::config::AuthInfo) -> Result<kube::Client, String> {
    let roots: Vec<Vec<u8>> = ureq::tls::parse_pem(ca)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c.der().to_vec()),
            _ => None,
        })
        .collect();
    let mut config = kube::Config::new(server.parse().map_err(|e| format!("{server}: {e}"))?);
    config.root_cert = Some(roots);
    config.auth_info = auth;
    kube::Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))
}

/// Token discovery and TLS bootstrapping for `join`: a client of the Node's
/// own identity (`system:node:<name>`). `timeout` bounds the whole join, as
/// kubeadm's discovery timeout does.
pub async fn bootstrap(join: &JoinConfig, timeout: Duration) -> Result<kube::Client, String> {
    let deadline = Instant::now() + timeout;
    let endpoint = format!("https://{}", join.api_server_endpoint);
    // Discovery: cluster-info fetched without trusting anything yet; it is
    // believed only once the token's signature and a CA pin check out.
    let (server, ca) = loop {
        let result = shared_cluster_info(&endpoint)
            .await
            .and_then(|data| verify_cluster_info(&data, join));
        match result {
            Ok(found) => break found,
            Err(e) if Instant::now() >= deadline => return Err(format!("token discovery: {e}")),
            // The bootstrap signer signs a new token within moments; every
            // instance polls, so not too often (kubeadm: every 5 s).
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    };
    let as_token = kube::config::AuthInfo {
        token: Some(join.token.clone().into()),
        ..Default::default()
    };
    let bootstrap_client = client(&server, &ca, as_token)?;
    let key = rcgen::KeyPair::generate().map_err(|e| format!("key: {e}"))?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{}", join.node_name),
    );
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| format!("CSR: {e}"))?;
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(bootstrap_client);
    let csr = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "request": STANDARD.encode(csr_pem.as_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "key encipherment", "client auth"],
        },
    }))
    .map_err(|e| e.to_string())?;
    let created = loop {
        match csrs.create(&Default::default(), &csr).await {
            Ok(c) => break c,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "TLS bootstrap: creating the CSR as the bootstrap token: {e}"
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let name = kube::ResourceExt::name_any(&created);
    let answered = |csr: Option<&CertificateSigningRequest>| {
        csr.and_then(|c| c.status.as_ref()).is_some_and(|s| {
            s.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
                || s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Denied" || c.type_ == "Failed")
        })
    };
    let remaining = deadline.saturating_duration_since(Instant::now());
    // A watch of this one CSR; should the watch fail, polling below.
    let _ = tokio::time::timeout(
        remaining,
        kube::runtime::wait::await_condition(csrs.clone(), &name, answered),
    )
    .await;
    let certificate = loop {
        if let Ok(current) = csrs.get(&name).await {
            let status = current.status.unwrap_or_default();
            let denied = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Denied" || c.type_ == "Failed");
            if denied {
                return Err(format!("TLS bootstrap: CSR {name} was denied"));
            }
            if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                break cert.0;
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "TLS bootstrap: CSR {name} was not approved and signed in time"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let as_node = kube::config::AuthInfo {
        client_certificate_data: Some(STANDARD.encode(&certificate)),
        client_key_data: Some(STANDARD.encode(key.serialize_pem()).into()),
        ..Default::default()
    };
    client(&server, &ca, as_node)
}

/// How old a shared read of `cluster-info` may be.
const CLUSTER_INFO_MAX_AGE: Duration = Duration::from_secs(1);

type ClusterInfo = Result<std::sync::Arc<BTreeMap<String, String>>, String>;

/// The last read of `cluster-info` per endpoint, shared by every instance in
/// discovery (the lock is held while reading, so one read serves all that
/// wait for it).
static CLUSTER_INFO: tokio::sync::Mutex<BTreeMap<String, (Instant, ClusterInfo)>> =
    tokio::sync::Mutex::const_new(BTreeMap::new());

/// `cluster-info`'s data, read at most once a [`CLUSTER_INFO_MAX_AGE`] per
/// endpoint for all instances.
async fn shared_cluster_info(endpoint: &str) -> ClusterInfo {
    let mut reads = CLUSTER_INFO.lock().await;
    if let Some((at, info)) = reads.get(endpoint)
        && at.elapsed() < CLUSTER_INFO_MAX_AGE
    {
        return info.clone();
    }
    let info = fetch_cluster_info(endpoint).await.map(std::sync::Arc::new);
    reads.insert(endpoint.to_string(), (Instant::now(), info.clone()));
    info
}

/// `kube-public/cluster-info`'s data, fetched anonymously without trusting
/// the server's certificate (what it says is checked afterwards).
async fn fetch_cluster_info(endpoint: &str) -> Result<BTreeMap<String, String>, String> {
    let url = format!("{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info");
    tokio::task::spawn_blocking(move || {
        let tls = ureq::tls::TlsConfig::builder()
            .disable_verification(true)
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let mut resp = agent.get(&url).call().map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("{url}: {e}"))?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status != 200 {
            return Err(format!("{url}: HTTP {status}: {}", body["message"]));
        }
        Ok(body["data"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default())
    })
    .await
    .map_err(|e| e.to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOIN: &str = "#cloud-config
write_files:
- path: /run/kubeadm/kubeadm-join-config.yaml
  content: |
    apiVersion: kubeadm.k8s.io/v1beta2
    kind: JoinConfiguration
    discovery:
      bootstrapToken:
        apiServerEndpoint: 127.0.0.1:6443
        token: abcdef.0123456789abcdef
        caCertHashes: [sha256:PIN]
    nodeRegistration:
      name: workers-1
      kubeletExtraArgs: {node-labels: 'node.cluster.x-k8s.io/pool=a'}
      taints: [{key: dedicated, value: gpu, effect: NoSchedule}]
runcmd: [kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml]
";

    fn signed(kubeconfig: &str, id: &str, secret: &str) -> String {
        let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#));
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{header}.{}", URL_SAFE_NO_PAD.encode(kubeconfig)).as_bytes());
        format!(
            "{header}..{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    fn ca() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["kubernetes".into()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let pin = ca_pins(cert.pem().as_bytes()).remove(0);
        (cert.pem(), pin)
    }

    #[test]
    fn the_join_configuration_is_read_from_the_cloud_config() {
        let join = join_configuration("cloud-config", JOIN.as_bytes()).unwrap();
        assert_eq!(join.api_server_endpoint, "127.0.0.1:6443");
        assert_eq!(join.token_id(), "abcdef");
        assert_eq!(join.node_name, "workers-1");
        assert_eq!(join.node_labels["node.cluster.x-k8s.io/pool"], "a");
        assert_eq!(join.taints[0]["key"], "dedicated");
        assert!(join_configuration("shell", b"#!/bin/sh").is_err());
        let err =
            join_configuration("cloud-config", b"#cloud-config\nruncmd: [true]\n").unwrap_err();
        assert!(err.contains("no files"), "{err}");
        let bad = JOIN.replace("abcdef.0123456789abcdef", "nope");
        assert!(
            join_configuration("cloud-config", bad.as_bytes())
                .unwrap_err()
                .contains("form")
        );
    }

    #[test]
    fn cluster_info_is_believed_only_when_signed_with_the_token_and_pinned() {
        let (pem, pin) = ca();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: ''\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\n",
            STANDARD.encode(&pem)
        );
        let join = join_configuration("cloud-config", JOIN.replace("sha256:PIN", &pin).as_bytes())
            .unwrap();
        let data = |sig: String| {
            BTreeMap::from([
                ("kubeconfig".to_string(), kubeconfig.clone()),
                ("jws-kubeconfig-abcdef".to_string(), sig),
            ])
        };
        let good = data(signed(&kubeconfig, "abcdef", "0123456789abcdef"));
        let (server, trusted) = verify_cluster_info(&good, &join).unwrap();
        assert_eq!(server, "https://127.0.0.1:6443");
        assert_eq!(trusted, pem.as_bytes());
        // Signed with another secret: a wrong or forged token.
        let forged = data(signed(&kubeconfig, "abcdef", "ffffffffffffffff"));
        assert!(
            verify_cluster_info(&forged, &join)
                .unwrap_err()
                .contains("does not verify")
        );
        // No signature for this token id: unknown or expired (cleaned up).
        let unsigned = BTreeMap::from([("kubeconfig".to_string(), kubeconfig.clone())]);
        assert!(
            verify_cluster_info(&unsigned, &join)
                .unwrap_err()
                .contains("expired")
        );
        // A pin for another CA.
        let (_, other_pin) = ca();
        let wrong_pin = join_configuration(
            "cloud-config",
            JOIN.replace("sha256:PIN", &other_pin).as_bytes(),
        )
        .unwrap();
        assert!(
            verify_cluster_info(&good, &wrong_pin)
                .unwrap_err()
                .contains("matches none")
        );
    }
}
