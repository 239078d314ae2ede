//! Conformance checks of the bootstrap world. They need no cluster: a
//! bootstrap plugin only renders.
//!
//! In order: `validate` accepts the given config and rejects each invalid
//! one with `invalid-config`; `render` answers for a sample machine; the
//! data carries the token placeholder (else the host's token never reaches
//! the instance) and nothing the host did not give; it fits the host's
//! 64 KiB; its format's marker is there (`#cloud-config`); the same input
//! renders the same bytes; the machine's Node name is used; a render with
//! an invalid config is `invalid-config`, never a trap; and cloud-config
//! passes the real cloud-init's schema validator (`cloud-init schema`,
//! skipped where cloud-init is not installed), with a token in place of
//! the placeholder as the host puts it.

use crate::{Check, Outcome, Report, brief};
use capstan_runtime::types::{BootstrapData, BootstrapFormat, JoinInfo, Machine};
use capstan_runtime::{BootstrapPlugin, Error};

/// What the host writes where the token goes, and its bound on the data.
use capstan_planner::bootstrap::{
    MAX_BOOTSTRAP_BYTES as MAX_BYTES, TOKEN_PLACEHOLDER as PLACEHOLDER,
};

fn machine(name: &str) -> Machine {
    Machine {
        name: name.into(),
        namespace: "default".into(),
        uid: format!("conformance-{name}"),
        cluster_name: None,
        labels: Vec::new(),
        version: Some("v1.30.0".into()),
        failure_domain: None,
        provider_config: "{}".into(),
        infrastructure_config: None,
        provider_id: None,
    }
}

fn join(node: &str) -> JoinInfo {
    JoinInfo {
        api_server_endpoints: vec!["https://10.0.0.1:6443".into()],
        ca_certificate: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        ca_certificate_hash: format!("sha256:{}", "ab".repeat(32)),
        kubernetes_version: Some("v1.30.0".into()),
        node_name: node.into(),
        node_labels: Vec::new(),
        node_taints: Vec::new(),
        token_placeholder: PLACEHOLDER.into(),
    }
}

fn is_invalid_config<T>(r: &Result<T, Error>) -> Outcome {
    match r {
        Err(e)
            if matches!(
                e.plugin_error(),
                Some(capstan_runtime::types::PluginError::InvalidConfig(_))
            ) =>
        {
            Outcome::Pass
        }
        Err(e) => Outcome::Fail(format!("expected invalid-config, got {}", brief(e))),
        Ok(_) => Outcome::Fail("accepted".into()),
    }
}

/// Run every bootstrap check against `plugin` with `config` (JSON object
/// text) and the `invalid` configs.
pub async fn run_bootstrap(plugin: &BootstrapPlugin, config: &str, invalid: &[String]) -> Report {
    let mut checks = Vec::new();
    let mut record = |name: String, outcome: Outcome| checks.push(Check { name, outcome });
    record(
        "validate accepts the given config".into(),
        match plugin.validate(config).await {
            Ok(()) => Outcome::Pass,
            Err(e) => Outcome::Fail(brief(&e)),
        },
    );
    for bad in invalid {
        record(
            format!("validate rejects {bad} with invalid-config"),
            is_invalid_config(&plugin.validate(bad).await),
        );
        record(
            format!("render with config {bad} is invalid-config"),
            is_invalid_config(&plugin.render(&machine("m1"), bad, &join("m1")).await),
        );
    }
    let first = match plugin.render(&machine("m1"), config, &join("m1")).await {
        Ok(data) => data,
        Err(e) => {
            record("render answers".into(), Outcome::Fail(brief(&e)));
            return Report::new(plugin.plugin(), String::new(), checks);
        }
    };
    record("render answers".into(), Outcome::Pass);
    let text = String::from_utf8_lossy(&first.value).into_owned();
    record(
        "the data carries the token placeholder (the host puts the token there)".into(),
        if text.contains(PLACEHOLDER) {
            Outcome::Pass
        } else {
            Outcome::Fail(format!(
                "{PLACEHOLDER} is not in the data: the machine's bootstrap token would never reach the instance"
            ))
        },
    );
    record(
        format!("the data fits the host's {MAX_BYTES} bytes"),
        if first.value.len() <= MAX_BYTES {
            Outcome::Pass
        } else {
            Outcome::Fail(format!("{} bytes", first.value.len()))
        },
    );
    record(
        "the data is marked as its format".into(),
        format_marker(&first),
    );
    if first.format == BootstrapFormat::CloudConfig {
        record(
            "cloud-init's schema validator accepts the cloud-config".into(),
            cloud_init_schema(&text.replace(PLACEHOLDER, "abcdef.0123456789abcdef")),
        );
    }
    record(
        "the same input renders the same bytes".into(),
        match plugin.render(&machine("m1"), config, &join("m1")).await {
            Ok(again) if again == first => Outcome::Pass,
            Ok(_) => Outcome::Fail("the second render differs".into()),
            Err(e) => Outcome::Fail(brief(&e)),
        },
    );
    record(
        "the Node name the host gives is used".into(),
        if text.contains("m1") {
            match plugin
                .render(&machine("m2"), config, &join("other-node"))
                .await
            {
                Ok(other) if String::from_utf8_lossy(&other.value).contains("other-node") => {
                    Outcome::Pass
                }
                Ok(_) => Outcome::Fail("a different node-name renders without it".into()),
                Err(e) => Outcome::Fail(brief(&e)),
            }
        } else {
            Outcome::Fail("the data does not name the Node (join-info node-name)".into())
        },
    );
    Report::new(plugin.plugin(), String::new(), checks)
}

/// What the real cloud-init says of `cloud_config` (`cloud-init schema
/// --config-file`): pass, fail with its words, or skip without cloud-init.
pub fn cloud_init_schema(cloud_config: &str) -> Outcome {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let file = std::env::temp_dir().join(format!(
        "capstan-conformance-{}-{}.yaml",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    if let Err(e) = std::fs::write(&file, cloud_config) {
        return Outcome::Fail(format!("cannot write {}: {e}", file.display()));
    }
    let run = std::process::Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&file)
        .output();
    let _ = std::fs::remove_file(&file);
    let run = match run {
        Ok(run) => run,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Outcome::Skip(
                "cloud-init is not installed (Debian: apt install cloud-init) to check the data against its schema".into(),
            );
        }
        Err(e) => return Outcome::Fail(format!("cannot run cloud-init: {e}")),
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    if run.status.success() && said.contains("Valid cloud-config") {
        Outcome::Pass
    } else {
        let said = said.replace(&file.display().to_string(), "the data");
        Outcome::Fail(format!(
            "cloud-init refuses it (an instance would boot without joining): {}",
            said.trim()
        ))
    }
}

fn format_marker(data: &BootstrapData) -> Outcome {
    let text = String::from_utf8_lossy(&data.value);
    let ok = match data.format {
        BootstrapFormat::CloudConfig => text.starts_with("#cloud-config"),
        BootstrapFormat::Shell => text.starts_with("#!"),
        BootstrapFormat::Ignition => serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|v| v.get("ignition").is_some()),
    };
    if ok {
        Outcome::Pass
    } else {
        Outcome::Fail(format!(
            "{:?} data must start with its marker (#cloud-config, #! or an Ignition JSON document)",
            data.format
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real cloud-init decides (installed by scripts/setup.sh).
    #[test]
    fn cloud_config_that_cloud_init_refuses_fails_the_check_naming_why() {
        let good = "#cloud-config\nruncmd: [\"kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml\"]\n";
        assert_eq!(cloud_init_schema(good), Outcome::Pass);
        let bad = "#cloud-config\nruncmd: 5\nwrite_files: [{path: 7}]\n";
        match cloud_init_schema(bad) {
            Outcome::Fail(why) => assert!(
                why.contains("cloud-init refuses it") && why.contains("runcmd"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
