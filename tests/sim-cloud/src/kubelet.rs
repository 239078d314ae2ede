//! The simulated kubelet: registers a Node for every instance that finishes
//! booting, the way a real kubelet would (`spec.providerID` set, a `Ready`
//! condition and addresses in status), flips `Ready` on request, and deletes
//! the Node when the instance is gone.
//!
//! It talks to the Kubernetes API over HTTPS with a bearer token and the API
//! server's CA, using plain REST calls (no client library), from blocking
//! worker threads so the cloud's API never waits on Kubernetes.

use serde_json::json;
use std::sync::Arc;

/// Where and how to reach the Kubernetes API.
#[derive(Clone)]
pub struct KubeTarget {
    /// For example `https://127.0.0.1:6443`.
    pub url: String,
    /// Bearer token allowed to create, patch and delete Nodes.
    pub token: String,
    /// PEM of the CA that signed the API server's certificate (may be a chain).
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTarget")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// What a Node is made from.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub provider_id: String,
    pub internal_ip: String,
    pub hostname: String,
    pub zone: String,
    pub version: Option<String>,
}

/// A Kubernetes client for Node objects.
#[derive(Clone)]
pub struct Kubelet {
    target: Arc<KubeTarget>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// An HTTPS client that trusts every certificate in `pem` (which may be a
/// chain, as a self-signed API server's certificate file is) and returns
/// error statuses as responses.
pub fn agent_trusting(pem: &[u8]) -> Result<ureq::Agent, String> {
    let certs: Vec<_> = ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err("the CA file holds no PEM certificate".into());
    }
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .build()
        .into())
}

/// The Node name for an instance id (`i-000001` → `sim-i-000001`).
pub fn node_name(instance_id: &str) -> String {
    format!("sim-{instance_id}")
}

impl Kubelet {
    /// A client trusting `target.ca_pem`.
    pub fn new(target: KubeTarget) -> Result<Self, String> {
        let agent = agent_trusting(&target.ca_pem)?;
        Ok(Kubelet {
            target: Arc::new(target),
            agent,
        })
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<serde_json::Value>,
    ) -> Result<u16, String> {
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.target.url))
            .header("authorization", format!("Bearer {}", self.target.token))
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(body.map(|b| b.to_string()).unwrap_or_default())
            .map_err(|e| e.to_string())?;
        let mut resp = self
            .agent
            .run(req)
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status().as_u16();
        if status >= 400 && status != 404 && status != 409 {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            return Err(format!("{method} {path}: HTTP {status}: {text}"));
        }
        Ok(status)
    }

    /// Create the Node (or keep the existing one) and report it Ready.
    pub fn register(&self, node: &NodeSpec) -> Result<(), String> {
        let mut labels = json!({
            "kubernetes.io/hostname": node.name,
            "topology.kubernetes.io/zone": node.zone,
            "capstan.dev/simulated": "true",
        });
        if let Some(v) = &node.version {
            labels["capstan.dev/version"] = json!(v.replace('+', "_"));
        }
        let object = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node.name, "labels": labels },
            "spec": { "providerID": node.provider_id },
        });
        self.send("POST", "/api/v1/nodes", "application/json", Some(object))?;
        let status = json!({ "status": {
            "addresses": [
                { "type": "InternalIP", "address": node.internal_ip },
                { "type": "Hostname", "address": node.hostname },
            ],
        }});
        self.send(
            "PATCH",
            &format!("/api/v1/nodes/{}/status", node.name),
            "application/merge-patch+json",
            Some(status),
        )?;
        self.set_ready(&node.name, true)
    }

    /// Set the Node's `Ready` condition.
    pub fn set_ready(&self, name: &str, ready: bool) -> Result<(), String> {
        let now = now_rfc3339();
        let (status, reason, message) = if ready {
            (
                "True",
                "KubeletReady",
                "simulated kubelet is posting ready status",
            )
        } else {
            (
                "False",
                "KubeletNotReady",
                "simulated kubelet was told to report not ready",
            )
        };
        let patch = json!({ "status": { "conditions": [{
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }]}});
        self.send(
            "PATCH",
            &format!("/api/v1/nodes/{name}/status"),
            "application/strategic-merge-patch+json",
            Some(patch),
        )
        .map(|_| ())
    }

    /// Delete the Node; a missing Node is fine.
    pub fn delete(&self, name: &str) -> Result<(), String> {
        self.send(
            "DELETE",
            &format!("/api/v1/nodes/{name}"),
            "application/json",
            None,
        )
        .map(|_| ())
    }
}

/// The current UTC time as RFC 3339 (seconds), without a date crate.
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        (rem % 3_600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_has_the_right_shape() {
        let t = super::now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{t}"
        );
    }

    #[test]
    fn node_names_are_dns_labels() {
        assert_eq!(super::node_name("i-000042"), "sim-i-000042");
    }
}
