//! `coredns`: an addon plugin that installs CoreDNS, the cluster DNS.
//!
//! Two versions, one per channel: `1.10.1` (`stable`) and `1.11.3`
//! (`rapid`). `1.10.1` serves its Prometheus metrics through a Service of
//! its own (`coredns-metrics`); from `1.11` the metrics port is on the
//! `kube-dns` Service, so upgrading prunes `coredns-metrics`.
//!
//! Config (all optional): `namespace` (`kube-system`), `replicas` (2),
//! `clusterDomain` (`cluster.local`), `upstreams` (`["/etc/resolv.conf"]`),
//! `clusterIP` (the `kube-dns` Service's address; the API server picks one
//! when unset). Health is the Deployment's rollout (see
//! [`capstan_sdk::addon::deployment_health`]).

// The addon is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::addon::{
    AddonSpec, Guest, Health, VersionInfo, deployment_health, find_observed, pick_version,
    version_table,
};
use capstan_sdk::{PluginError, parse_config};
use serde::Deserialize;
use serde_json::{Value, json};

/// The versions this plugin renders, with their channels.
pub const VERSIONS: [(&str, &str); 2] = [("1.10.1", "stable"), ("1.11.3", "rapid")];

const NAME: &str = "coredns";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Config {
    namespace: String,
    replicas: u32,
    cluster_domain: String,
    upstreams: Vec<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: "kube-system".into(),
            replicas: 2,
            cluster_domain: "cluster.local".into(),
            upstreams: vec!["/etc/resolv.conf".into()],
            cluster_ip: None,
        }
    }
}

fn config(spec: &AddonSpec) -> Result<Config, PluginError> {
    let config: Config = parse_config("addon config", &spec.config)?;
    if config.upstreams.is_empty() {
        return Err(PluginError::invalid_config(
            "upstreams: list at least one upstream resolver (an address or /etc/resolv.conf)",
        ));
    }
    if config.cluster_domain.is_empty() || config.cluster_domain.contains(char::is_whitespace) {
        return Err(PluginError::invalid_config(format!(
            "clusterDomain: {:?} is not a DNS domain",
            config.cluster_domain
        )));
    }
    Ok(config)
}

fn corefile(config: &Config) -> String {
    format!(
        ".:53 {{\n    errors\n    health {{\n        lameduck 5s\n    }}\n    ready\n    kubernetes {domain} in-addr.arpa ip6.arpa {{\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 30\n    }}\n    prometheus :9153\n    forward . {upstreams} {{\n        max_concurrent 1000\n    }}\n    cache 30\n    loop\n    reload\n    loadbalance\n}}\n",
        domain = config.cluster_domain,
        upstreams = config.upstreams.join(" "),
    )
}

/// The objects for one version and config, in apply order.
fn objects(version: &str, config: &Config) -> Vec<Value> {
    let ns = config.namespace.as_str();
    let labels = json!({"k8s-app": "kube-dns"});
    let metrics_on_main_service = version != "1.10.1";
    let mut dns_ports = vec![
        json!({"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}),
        json!({"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}),
    ];
    let metrics_port =
        json!({"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153});
    if metrics_on_main_service {
        dns_ports.push(metrics_port.clone());
    }
    let mut service_spec = json!({"selector": labels, "ports": dns_ports});
    if let Some(ip) = &config.cluster_ip {
        service_spec["clusterIP"] = json!(ip);
    }
    let mut out = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": NAME, "namespace": ns}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "system:coredns"},
               "rules": [
                   {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "system:coredns"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
               "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": NAME, "namespace": ns},
               "data": {"Corefile": corefile(config)}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": config.replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": "system-cluster-critical",
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                    "containers": [{
                        "name": NAME,
                        "image": format!("registry.k8s.io/coredns/coredns:v{version}"),
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "ports": [
                            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                            {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}],
                        "resources": {"requests": {"cpu": "100m", "memory": "70Mi"},
                                      "limits": {"memory": "170Mi"}},
                        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181, "scheme": "HTTP"}}
                    }],
                    "volumes": [{"name": "config-volume", "configMap": {"name": NAME,
                        "items": [{"key": "Corefile", "path": "Corefile"}]}}]
                }
            }
        }}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "kube-dns", "namespace": ns, "labels": labels},
               "spec": service_spec}),
    ];
    if !metrics_on_main_service {
        out.push(json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "coredns-metrics", "namespace": ns, "labels": labels},
               "spec": {"selector": labels, "ports": [metrics_port]}}));
    }
    out
}

struct CoreDns;

impl Guest for CoreDns {
    fn versions() -> Result<Vec<VersionInfo>, PluginError> {
        Ok(version_table(&VERSIONS))
    }

    fn render(spec: AddonSpec) -> Result<Vec<String>, PluginError> {
        let version = pick_version(&spec, &VERSIONS)?;
        let config = config(&spec)?;
        Ok(objects(version, &config)
            .iter()
            .map(Value::to_string)
            .collect())
    }

    fn assess(_spec: AddonSpec, observed: Vec<String>) -> Result<Health, PluginError> {
        let deployment = find_observed(&observed, "Deployment", NAME);
        Ok(deployment_health(deployment.as_ref(), NAME))
    }
}

capstan_sdk::export_addon!(CoreDns, manifest: "capstan-plugin.json");

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(version: &str, config: &str) -> AddonSpec {
        AddonSpec {
            name: "dns".into(),
            namespace: "default".into(),
            version: Some(version.into()),
            channel: None,
            config: config.into(),
        }
    }

    #[test]
    fn upgrading_moves_metrics_onto_the_main_service() {
        let old = CoreDns::render(spec("1.10.1", "{}")).unwrap();
        let new = CoreDns::render(spec("1.11.3", "{}")).unwrap();
        assert_eq!(old.len(), 7);
        assert_eq!(new.len(), 6);
        assert!(old.iter().any(|o| o.contains("coredns-metrics")));
        assert!(new.iter().any(|o| o.contains("coredns:v1.11.3")));
    }

    #[test]
    fn config_goes_into_the_corefile_and_mistakes_are_named() {
        let r = CoreDns::render(spec(
            "1.11.3",
            r#"{"upstreams": ["10.0.0.2"], "clusterDomain": "example.internal", "replicas": 3}"#,
        ))
        .unwrap();
        assert!(
            r.iter()
                .any(|o| o.contains("kubernetes example.internal")
                    && o.contains("forward . 10.0.0.2"))
        );
        assert!(r.iter().any(|o| o.contains("\"replicas\":3")));
        let e = CoreDns::render(spec("1.11.3", r#"{"upstream": []}"#)).unwrap_err();
        assert!(matches!(e, PluginError::InvalidConfig(m) if m.contains("upstream")));
        let e = CoreDns::render(spec("9.9.9", "{}")).unwrap_err();
        assert!(matches!(e, PluginError::InvalidConfig(m) if m.contains("1.10.1, 1.11.3")));
    }
}
