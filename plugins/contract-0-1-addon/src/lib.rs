//! Test fixture: an addon component built against contract 0.1.0 as a
//! plugin of that release was, with wit-bindgen on the frozen 0.1.0 package
//! (`addon-spec` without the cluster's Kubernetes version, `version-info`
//! without a Kubernetes range). It offers `1.0.0` on `stable` and renders
//! one ConfigMap naming the version; it is healthy when that ConfigMap is
//! observed. The host must keep loading and calling it, and treat its
//! versions as fitting every cluster.

#![allow(unsafe_code)] // the generated export glue

wit_bindgen::generate!({
    path: "../../wit/deps/capstan-plugin-0.1.0",
    world: "capstan:plugin/addon-plugin@0.1.0",
});

use capstan::plugin::types::PluginError;
use exports::capstan::plugin::addon::{AddonSpec, Guest, Health, VersionInfo};

capstan_sdk::plugin_manifest!("capstan-plugin.json");

struct Legacy;

impl Guest for Legacy {
    fn versions() -> Result<Vec<VersionInfo>, PluginError> {
        Ok(vec![VersionInfo {
            version: "1.0.0".into(),
            channels: vec!["stable".into()],
        }])
    }
    fn render(spec: AddonSpec) -> Result<Vec<String>, PluginError> {
        let version = spec.version.unwrap_or_default();
        Ok(vec![format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"legacy","namespace":"{}"}},"data":{{"version":"{version}"}}}}"#,
            spec.namespace
        )])
    }
    fn assess(_spec: AddonSpec, observed: Vec<String>) -> Result<Health, PluginError> {
        let healthy = observed.iter().any(|o| o.contains(r#""name":"legacy""#));
        Ok(Health {
            healthy,
            message: (!healthy).then(|| "ConfigMap legacy is not there".into()),
            details: Vec::new(),
        })
    }
}

export!(Legacy);
