use super::*;
use capstan_sdk::Taint;

const PLACEHOLDER: &str = "@@CAPSTAN_BOOTSTRAP_TOKEN@@";

fn join(version: Option<&str>) -> JoinInfo {
    JoinInfo {
        api_server_endpoints: vec!["https://10.0.0.1:6443".into()],
        ca_certificate: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        ca_certificate_hash: format!("sha256:{}", "ab".repeat(32)),
        kubernetes_version: version.map(String::from),
        node_name: "workers-abc12".into(),
        node_labels: vec![("node-role.kubernetes.io/worker".into(), "".into())],
        node_taints: vec![Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
        }],
        token_placeholder: PLACEHOLDER.into(),
    }
}

fn config(json: serde_json::Value) -> Config {
    serde_json::from_value(json).expect("a valid config")
}

/// The three configurations the schema check covers: minimal, a typical
/// worker (files, commands, kubelet flags), and users with SSH keys and NTP.
fn configurations() -> Vec<(&'static str, Config)> {
    vec![
        ("minimal", Config::default()),
        (
            "worker",
            config(serde_json::json!({
                "files": [{"path": "/etc/sysctl.d/99-k8s.conf", "content": "net.ipv4.ip_forward = 1\n", "permissions": "0644"}],
                "preKubeadmCommands": ["sysctl --system", "swapoff -a"],
                "postKubeadmCommands": ["echo joined > /var/log/joined"],
                "kubeletExtraArgs": {"max-pods": "58", "cloud-provider": "external"},
                "ignorePreflightErrors": ["Swap"],
                "criSocket": "unix:///run/containerd/containerd.sock"
            })),
        ),
        (
            "users-and-ntp",
            config(serde_json::json!({
                "users": [{"name": "ops", "groups": "sudo", "shell": "/bin/bash", "sudo": "ALL=(ALL) NOPASSWD:ALL",
                           "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample ops@example"], "lockPassword": true}],
                "ntp": {"enabled": true, "servers": ["0.pool.ntp.org", "1.pool.ntp.org"]}
            })),
        ),
    ]
}

fn text(data: &BootstrapData) -> String {
    String::from_utf8(data.value.clone()).expect("utf-8")
}

#[test]
fn the_join_configuration_carries_the_placeholder_pin_and_node() {
    let data = render(&Config::default(), &join(Some("v1.30.2"))).unwrap();
    assert_eq!(data.format, BootstrapFormat::CloudConfig);
    let out = text(&data);
    assert!(out.starts_with("#cloud-config\n"), "{out}");
    let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
    let content = doc["write_files"][0]["content"].as_str().unwrap();
    let jc: serde_yaml::Value = serde_yaml::from_str(content).unwrap();
    assert_eq!(jc["apiVersion"], "kubeadm.k8s.io/v1beta3");
    assert_eq!(jc["kind"], "JoinConfiguration");
    let token = &jc["discovery"]["bootstrapToken"];
    assert_eq!(token["token"], PLACEHOLDER);
    assert_eq!(token["apiServerEndpoint"], "10.0.0.1:6443");
    assert_eq!(
        token["caCertHashes"][0],
        serde_yaml::Value::from(format!("sha256:{}", "ab".repeat(32)))
    );
    assert_eq!(jc["nodeRegistration"]["name"], "workers-abc12");
    assert_eq!(
        jc["nodeRegistration"]["kubeletExtraArgs"]["node-labels"],
        "node-role.kubernetes.io/worker="
    );
    assert_eq!(jc["nodeRegistration"]["taints"][0]["key"], "dedicated");
    assert_eq!(
        doc["runcmd"][0],
        serde_yaml::Value::from(format!("kubeadm join --config {JOIN_CONFIG_PATH}"))
    );
}

#[test]
fn the_kubeadm_api_follows_the_kubernetes_version() {
    assert_eq!(kubeadm_api(Some("v1.20.2")), "kubeadm.k8s.io/v1beta2");
    assert_eq!(kubeadm_api(Some("1.30.0")), "kubeadm.k8s.io/v1beta3");
    assert_eq!(kubeadm_api(Some("v1.31.0")), "kubeadm.k8s.io/v1beta4");
    assert_eq!(kubeadm_api(None), "kubeadm.k8s.io/v1beta4");
    // v1beta4 takes kubelet flags as a list of name/value pairs.
    let c = config(serde_json::json!({"kubeletExtraArgs": {"max-pods": "58"}}));
    let jc: serde_yaml::Value =
        serde_yaml::from_str(&join_configuration(&c, &join(Some("v1.33.0"))).unwrap()).unwrap();
    let args = jc["nodeRegistration"]["kubeletExtraArgs"]
        .as_sequence()
        .unwrap();
    assert!(
        args.iter()
            .any(|a| a["name"] == "max-pods" && a["value"] == "58"),
        "{args:?}"
    );
}

#[test]
fn commands_run_around_the_join_in_order() {
    let (_, worker) = &configurations()[1];
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text(&render(worker, &join(None)).unwrap())).unwrap();
    let commands: Vec<&str> = doc["runcmd"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(
        commands,
        [
            "sysctl --system",
            "swapoff -a",
            "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml",
            "echo joined > /var/log/joined"
        ]
    );
}

#[test]
fn rendering_is_deterministic() {
    for (name, c) in configurations() {
        assert_eq!(
            render(&c, &join(None)).unwrap().value,
            render(&c, &join(None)).unwrap().value,
            "{name}"
        );
    }
}

#[test]
fn bad_configurations_name_the_field() {
    let cases = [
        (
            serde_json::json!({"files": [{"path": "etc/x", "content": ""}]}),
            "files[0].path",
        ),
        (
            serde_json::json!({"files": [{"path": JOIN_CONFIG_PATH, "content": ""}]}),
            "written by this plugin",
        ),
        (
            serde_json::json!({"files": [{"path": "/a", "content": ""}, {"path": "/a", "content": ""}]}),
            "listed twice",
        ),
        (
            serde_json::json!({"files": [{"path": "/a", "content": "", "permissions": "rw"}]}),
            "files[0].permissions",
        ),
        (
            serde_json::json!({"users": [{"name": "Root!"}]}),
            "users[0].name",
        ),
        (
            serde_json::json!({"preKubeadmCommands": ["echo a\necho b"]}),
            "preKubeadmCommands[0]",
        ),
        (
            serde_json::json!({"kubeletExtraArgs": {"node-labels": "a=b"}}),
            "kubeletExtraArgs.node-labels",
        ),
    ];
    for (json, field) in cases {
        let err = validate(&config(json.clone())).unwrap_err();
        assert!(err.to_string().contains(field), "{json}: {err}");
    }
    let err =
        capstan_sdk::parse_config::<Config>("bootstrap config", r#"{"file": []}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `file`"), "{err}");
}

/// The rendered data passes the real cloud-init schema validator
/// (`cloud-init schema`, installed by `scripts/setup.sh`), with the
/// placeholder replaced by a token as the host does.
#[test]
fn rendered_cloud_config_passes_cloud_init_schema() {
    let dir = std::env::temp_dir().join(format!("kubeadm-bootstrap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, c) in configurations() {
        let out = text(&render(&c, &join(Some("v1.30.2"))).unwrap())
            .replace(PLACEHOLDER, "abcdef.0123456789abcdef");
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, &out).unwrap();
        let run = std::process::Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(&file)
            .output()
            .expect("cloud-init is installed (scripts/setup.sh interop)");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(run.status.success(), "{name}: {said}\n{out}");
        assert!(said.contains("Valid cloud-config"), "{name}: {said}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
