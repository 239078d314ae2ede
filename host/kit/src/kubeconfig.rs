//! Workload-cluster kubeconfigs: inline credentials only.
//!
//! A kubeconfig Secret comes from a namespace user. Left to a general
//! kubeconfig loader it could run a command inside the controller (`exec`,
//! `auth-provider`) or make the controller read and send its own files
//! (`tokenFile`, `client-certificate`, `certificate-authority`), or route
//! its traffic through a proxy. So every field is checked against what a
//! self-contained kubeconfig needs, before anything is loaded. The server
//! must be `https://` with verification on (the token never travels in
//! clear, and only a server holding a certificate of the kubeconfig's CA
//! answers: nothing of Capstan's own, such as its plain-HTTP metrics
//! port, does), and not a link-local, unspecified or multicast address
//! (the cloud's metadata service at 169.254.169.254).

use serde_json::Value;

/// Cluster fields a kubeconfig may use.
const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority-data",
    "tls-server-name",
    "insecure-skip-tls-verify",
    "disable-compression",
    "extensions",
];

/// User fields a kubeconfig may use: inline credentials.
const USER_FIELDS: &[&str] = &[
    "token",
    "client-certificate-data",
    "client-key-data",
    "username",
    "password",
    "extensions",
];

/// Refuse a kubeconfig whose clusters or users use anything but inline
/// data; the error names the field (`users[0].user.exec`).
pub fn check_kubeconfig(text: &str) -> Result<(), String> {
    let doc: Value =
        serde_yaml::from_str(text).map_err(|e| format!("not a YAML kubeconfig: {e}"))?;
    for (list, inner, allowed) in [
        ("clusters", "cluster", CLUSTER_FIELDS),
        ("users", "user", USER_FIELDS),
    ] {
        for (i, item) in doc[list].as_array().into_iter().flatten().enumerate() {
            let Some(fields) = item[inner].as_object() else {
                continue;
            };
            if inner == "cluster" {
                check_server(fields).map_err(|why| format!("{list}[{i}].{inner}.{why}"))?;
            }
            if let Some(field) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
                return Err(format!(
                    "{list}[{i}].{inner}.{field} is not allowed: a workload-cluster kubeconfig must carry its credentials inline ({}); Capstan runs no command and reads no file named in it",
                    allowed
                        .iter()
                        .filter(|f| **f != "extensions")
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The cluster's `server` and TLS settings; the error starts with the field.
fn check_server(fields: &serde_json::Map<String, Value>) -> Result<(), String> {
    if fields.get("insecure-skip-tls-verify") == Some(&Value::Bool(true)) {
        return Err("insecure-skip-tls-verify: true is not allowed: the credential would go to whoever answers; give certificate-authority-data".into());
    }
    let server = fields
        .get("server")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(rest) = server.strip_prefix("https://") else {
        return Err(format!(
            "server: {server:?} must be an https:// URL (the credential never travels in clear)"
        ));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        let internal = match ip {
            std::net::IpAddr::V4(v4) => {
                v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()
            }
            std::net::IpAddr::V6(v6) => {
                v6.is_unicast_link_local() || v6.is_unspecified() || v6.is_multicast()
            }
        };
        if internal {
            return Err(format!(
                "server: {server:?} is a link-local, unspecified or multicast address, not a cluster's API server"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INLINE: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: w\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: Zm9v\nusers:\n- name: a\n  user:\n    token: abc\ncontexts:\n- name: w\n  context: {cluster: w, user: a}\ncurrent-context: w\n";

    #[test]
    fn inline_credentials_pass() {
        check_kubeconfig(INLINE).unwrap();
    }

    #[test]
    fn commands_files_and_proxies_are_refused_naming_the_field() {
        for (from, to, field) in [
            (
                "    token: abc\n",
                "    exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}\n",
                "users[0].user.exec",
            ),
            (
                "    token: abc\n",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "users[0].user.tokenFile",
            ),
            (
                "    token: abc\n",
                "    auth-provider: {name: gcp}\n",
                "users[0].user.auth-provider",
            ),
            (
                "    token: abc\n",
                "    client-key: /etc/key.pem\n",
                "users[0].user.client-key",
            ),
            (
                "    certificate-authority-data: Zm9v\n",
                "    certificate-authority: /etc/ca.pem\n",
                "clusters[0].cluster.certificate-authority",
            ),
            (
                "    certificate-authority-data: Zm9v\n",
                "    proxy-url: http://127.0.0.1:1\n",
                "clusters[0].cluster.proxy-url",
            ),
        ] {
            let text = INLINE.replace(from, to);
            let e = check_kubeconfig(&text).unwrap_err();
            assert!(e.starts_with(&format!("{field} is not allowed")), "{e}");
        }
        assert!(check_kubeconfig(": [").is_err());
    }

    #[test]
    fn the_server_is_https_verified_and_not_a_metadata_address() {
        for (from, to, needle) in [
            (
                "    certificate-authority-data: Zm9v\n",
                "    insecure-skip-tls-verify: true\n",
                "clusters[0].cluster.insecure-skip-tls-verify: true is not allowed",
            ),
            (
                "https://127.0.0.1:6443",
                "http://127.0.0.1:9090",
                "clusters[0].cluster.server: \"http://127.0.0.1:9090\" must be an https:// URL",
            ),
            (
                "https://127.0.0.1:6443",
                "https://169.254.169.254",
                "is a link-local, unspecified or multicast address",
            ),
            (
                "https://127.0.0.1:6443",
                "https://[fe80::1]:6443",
                "is a link-local, unspecified or multicast address",
            ),
            (
                "https://127.0.0.1:6443",
                "https://0.0.0.0:6443",
                "is a link-local, unspecified or multicast address",
            ),
        ] {
            let e = check_kubeconfig(&INLINE.replace(from, to)).unwrap_err();
            assert!(e.contains(needle), "{to}: {e}");
        }
        // A named or private server with its CA is fine.
        check_kubeconfig(&INLINE.replace(
            "https://127.0.0.1:6443",
            "https://api.workload.example:6443/",
        ))
        .unwrap();
        check_kubeconfig(&INLINE.replace("https://127.0.0.1:6443", "https://10.0.0.1")).unwrap();
    }
}
