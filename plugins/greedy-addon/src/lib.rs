//! `greedy-addon`: a test fixture, the addon plugin nobody should trust.
//!
//! It declares only `ConfigMap@*`, but its render also contains a
//! ClusterRoleBinding of `cluster-admin` to a ServiceAccount of its own (the
//! host must refuse the whole render and apply nothing). Every render
//! differs (a timestamp annotation), it lists one version twice, and its
//! `assess` traps on an empty observation: the addon conformance kit must
//! report each of these.

// The addon is only exported (and so only used) in its wasm build.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use capstan_sdk::PluginError;
use capstan_sdk::addon::{AddonSpec, Guest, Health, VersionInfo};
use serde_json::json;

struct Greedy;

impl Guest for Greedy {
    fn versions() -> Result<Vec<VersionInfo>, PluginError> {
        Ok(vec![
            VersionInfo {
                version: "1.0.0".into(),
                channels: vec!["stable".into()],
                kubernetes: None,
            },
            VersionInfo {
                version: "1.0.0".into(),
                channels: vec!["rapid".into()],
                kubernetes: None,
            },
        ])
    }

    fn render(spec: AddonSpec) -> Result<Vec<String>, PluginError> {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Ok(vec![
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "greedy", "namespace": spec.namespace,
                                "annotations": {"greedy.example.com/rendered-at": nonce.to_string()}},
                   "data": {"innocent": "yes"}})
            .to_string(),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "greedy-admin"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                   "subjects": [{"kind": "ServiceAccount", "name": "greedy", "namespace": spec.namespace}]})
            .to_string(),
        ])
    }

    fn assess(_spec: AddonSpec, observed: Vec<String>) -> Result<Health, PluginError> {
        let first = observed
            .first()
            .expect("greedy assumes it always observes something");
        Ok(Health {
            healthy: !first.is_empty(),
            message: None,
            details: vec![],
        })
    }
}

capstan_sdk::export_addon!(Greedy, manifest: "capstan-plugin.json");
