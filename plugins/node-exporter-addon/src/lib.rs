//! `node-exporter`: an addon plugin that runs the Prometheus node exporter
//! on every Node as a DaemonSet, in a Namespace of its own.
//!
//! Two versions, one per channel: `1.7.0` (`stable`) and `1.8.2`
//! (`rapid`). Config (all optional): `namespace` (`monitoring`), `port`
//! (9100), `createNamespace` (`true`; `false` renders into an existing
//! namespace, such as a tenant's own). Health is the DaemonSet's rollout: every Node that should run it
//! runs an updated, ready pod ([`capstan_sdk::addon::daemonset_health`]).

// The addon is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::addon::{
    AddonSpec, Guest, Health, VersionInfo, daemonset_health, find_observed, pick_version,
    version_table, with_kubernetes,
};
use capstan_sdk::{PluginError, parse_config};
use serde::Deserialize;
use serde_json::{Value, json};

/// The versions this plugin renders, with their channels.
pub const VERSIONS: [(&str, &str); 2] = [("1.7.0", "stable"), ("1.8.2", "rapid")];

/// The Kubernetes versions each supports: the host applies a version only
/// while the cluster's API server and kubelets are within its range.
pub const KUBERNETES: [(&str, &str); 2] = [("1.7.0", ">=1.16.0"), ("1.8.2", ">=1.20.0")];

const NAME: &str = "node-exporter";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Config {
    namespace: String,
    port: u16,
    create_namespace: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: "monitoring".into(),
            port: 9100,
            create_namespace: true,
        }
    }
}

fn objects(version: &str, config: &Config) -> Vec<Value> {
    let ns = config.namespace.as_str();
    let labels = json!({"app.kubernetes.io/name": NAME});
    let mut args = vec![
        "--path.rootfs=/host".to_string(),
        format!("--web.listen-address=:{}", config.port),
    ];
    // 1.8 reads systemd units too.
    if version != "1.7.0" {
        args.push("--collector.systemd".into());
    }
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    let mut objects = vec![];
    if config.create_namespace {
        objects.push(namespace);
    }
    objects.extend([
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": NAME, "namespace": ns}}),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": ns, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "hostNetwork": true,
                    "hostPID": true,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": NAME,
                        "image": format!("quay.io/prometheus/node-exporter:v{version}"),
                        "args": args,
                        "ports": [{"name": "metrics", "containerPort": config.port, "protocol": "TCP"}],
                        "volumeMounts": [{"name": "root", "mountPath": "/host", "readOnly": true}]
                    }],
                    "volumes": [{"name": "root", "hostPath": {"path": "/"}}]
                }
            }
        }}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": NAME, "namespace": ns, "labels": labels},
               "spec": {"selector": labels, "clusterIP": "None",
                        "ports": [{"name": "metrics", "port": config.port, "targetPort": config.port, "protocol": "TCP"}]}}),
    ]);
    objects
}

struct NodeExporter;

impl Guest for NodeExporter {
    fn versions() -> Result<Vec<VersionInfo>, PluginError> {
        Ok(with_kubernetes(version_table(&VERSIONS), &KUBERNETES))
    }

    fn render(spec: AddonSpec) -> Result<Vec<String>, PluginError> {
        let version = pick_version(&spec, &VERSIONS)?;
        let config: Config = parse_config("addon config", &spec.config)?;
        if config.port < 1024 {
            return Err(PluginError::invalid_config(format!(
                "port: {} is privileged; use 1024 or above",
                config.port
            )));
        }
        Ok(objects(version, &config)
            .iter()
            .map(Value::to_string)
            .collect())
    }

    fn assess(_spec: AddonSpec, observed: Vec<String>) -> Result<Health, PluginError> {
        let daemonset = find_observed(&observed, "DaemonSet", NAME);
        Ok(daemonset_health(daemonset.as_ref(), NAME))
    }
}

capstan_sdk::export_addon!(NodeExporter, manifest: "capstan-plugin.json");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_renders_its_namespace_first_and_its_own_image() {
        for (version, _) in VERSIONS {
            let spec = AddonSpec {
                name: "ne".into(),
                namespace: "default".into(),
                version: Some(version.into()),
                channel: None,
                config: r#"{"port": 9200}"#.into(),
                kubernetes_version: Some("v1.30.2".into()),
            };
            let r = NodeExporter::render(spec).unwrap();
            assert!(r[0].contains("\"kind\":\"Namespace\""));
            assert!(
                r.iter()
                    .any(|o| o.contains(&format!("node-exporter:v{version}")))
            );
            assert!(r.iter().any(|o| o.contains(":9200")));
        }
    }

    #[test]
    fn an_existing_namespace_is_rendered_into_not_created() {
        let spec = AddonSpec {
            name: "ne".into(),
            namespace: "team-a".into(),
            version: Some("1.7.0".into()),
            channel: None,
            config: r#"{"namespace": "team-a", "createNamespace": false}"#.into(),
            kubernetes_version: None,
        };
        let r = NodeExporter::render(spec).unwrap();
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|o| !o.contains("\"kind\":\"Namespace\"")));
        assert!(r.iter().all(|o| o.contains("\"namespace\":\"team-a\"")));
    }
}
