//! Workload-cluster kubeconfigs: inline credentials only.
//!
//! A kubeconfig Secret comes from a namespace user. Left to a general
//! kubeconfig loader it could run a command inside the controller (`exec`,
//! `auth-provider`) or make the controller read and send its own files
//! (`tokenFile`, `client-certificate`, `certificate-authority`), or route
//! its traffic through a proxy. So every field is checked against what a
//! self-contained kubeconfig needs, before anything is loaded.

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
}
