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
    version_table, with_kubernetes,
};
use capstan_sdk::{PluginError, parse_config};
use serde::Deserialize;
use serde_json::{Value, json};

/// The versions this plugin renders, with their channels.
pub const VERSIONS: [(&str, &str); 2] = [("1.10.1", "stable"), ("1.11.3", "rapid")];

/// The Kubernetes versions each supports: the host applies a version only
/// while the cluster's API server and kubelets are within its range.
pub const KUBERNETES: [(&str, &str); 2] = [("1.10.1", ">=1.20.0"), ("1.11.3", ">=1.20.0")];

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

/// Config values end up inside the Corefile, where a newline or a brace
/// would start a directive or a server block of the Addon author's
/// choosing (a `hosts` entry for `kubernetes.default.svc`, say): every
/// value is checked against its grammar, never escaped.
fn config(spec: &AddonSpec) -> Result<Config, PluginError> {
    let config: Config = parse_config("addon config", &spec.config)?;
    if config.upstreams.is_empty() {
        return Err(PluginError::invalid_config(
            "upstreams: list at least one upstream resolver (an address or /etc/resolv.conf)",
        ));
    }
    for (i, upstream) in config.upstreams.iter().enumerate() {
        if !is_upstream(upstream) {
            return Err(PluginError::invalid_config(format!(
                "upstreams[{i}]: {upstream:?} is not an upstream resolver; write an IP address, IP:PORT, [IPv6]:PORT or /etc/resolv.conf"
            )));
        }
    }
    if !is_dns_name(&config.cluster_domain) {
        return Err(PluginError::invalid_config(format!(
            "clusterDomain: {:?} is not a DNS domain (dot-separated labels of a-z, 0-9 and '-', such as cluster.local)",
            config.cluster_domain
        )));
    }
    if !is_dns_label(&config.namespace) {
        return Err(PluginError::invalid_config(format!(
            "namespace: {:?} is not a namespace name (a DNS label: a-z, 0-9 and '-', at most 63)",
            config.namespace
        )));
    }
    if let Some(ip) = &config.cluster_ip
        && ip.parse::<std::net::IpAddr>().is_err()
    {
        return Err(PluginError::invalid_config(format!(
            "clusterIP: {ip:?} is not an IP address"
        )));
    }
    Ok(config)
}

fn is_upstream(text: &str) -> bool {
    use std::net::{IpAddr, SocketAddr};
    text == "/etc/resolv.conf"
        || text.parse::<IpAddr>().is_ok()
        || text.parse::<SocketAddr>().is_ok()
}

/// An RFC 1123 label: what Kubernetes accepts as a namespace name.
fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

fn is_dns_name(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns_label)
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
        Ok(with_kubernetes(version_table(&VERSIONS), &KUBERNETES))
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
            kubernetes_version: Some("v1.30.2".into()),
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
    fn config_that_would_change_the_corefile_is_refused() {
        for (config, field) in [
            (
                r#"{"upstreams": ["8.8.8.8 {\n}\nkubernetes.default.svc:53 {\n hosts {\n 6.6.6.6 kubernetes.default.svc\n }\n}\n. {"]}"#,
                "upstreams[0]",
            ),
            (r#"{"upstreams": ["10.0.0.2 10.0.0.3"]}"#, "upstreams[0]"),
            (r#"{"upstreams": ["/etc/shadow"]}"#, "upstreams[0]"),
            (
                r#"{"clusterDomain": "cluster.local {\n}"}"#,
                "clusterDomain",
            ),
            (r#"{"clusterDomain": "Cluster.local"}"#, "clusterDomain"),
            (r#"{"clusterDomain": "a..b"}"#, "clusterDomain"),
            (r#"{"namespace": "kube-system\"x"}"#, "namespace"),
            (r#"{"clusterIP": "10.0.0.10 }"}"#, "clusterIP"),
        ] {
            let e = CoreDns::render(spec("1.11.3", config)).unwrap_err();
            assert!(
                matches!(&e, PluginError::InvalidConfig(m) if m.starts_with(field)),
                "{config}: {e:?}"
            );
        }
        for fine in [
            r#"{"upstreams": ["10.0.0.2:5353", "[fd00::53]:53", "fd00::54", "/etc/resolv.conf"]}"#,
            r#"{"clusterDomain": "k8s.example-corp.internal", "clusterIP": "10.96.0.10"}"#,
        ] {
            assert!(CoreDns::render(spec("1.11.3", fine)).is_ok(), "{fine}");
        }
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
