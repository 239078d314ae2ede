//! Registry credentials from a docker `config.json`, and the
//! `WWW-Authenticate` challenge a registry answers 401 with.

use crate::Error;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A username and password (or identity token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Credentials {{ username: {:?}, password: <redacted> }}",
            self.username
        )
    }
}

impl Credentials {
    pub fn basic(&self) -> String {
        format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{}", self.username, self.password))
        )
    }
}

#[derive(serde::Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(serde::Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// Credentials per registry host, read once from a docker `config.json`.
#[derive(Default, Clone, PartialEq, Eq)]
pub(crate) struct CredentialStore {
    by_registry: BTreeMap<String, Credentials>,
}

impl fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.by_registry.keys()).finish()
    }
}

impl CredentialStore {
    /// The file to read: the explicit one, else `$DOCKER_CONFIG/config.json`,
    /// else `~/.docker/config.json`; a missing default file means anonymous.
    pub fn load(explicit: Option<&Path>) -> Result<CredentialStore, Error> {
        let (path, required) = match explicit {
            Some(p) => (p.to_path_buf(), true),
            None => match std::env::var_os("DOCKER_CONFIG") {
                Some(dir) => (PathBuf::from(dir).join("config.json"), false),
                None => match std::env::var_os("HOME") {
                    Some(home) => (PathBuf::from(home).join(".docker/config.json"), false),
                    None => return Ok(CredentialStore::default()),
                },
            },
        };
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(CredentialStore::default());
            }
            Err(e) => return Err(Error::io(&path)(e)),
        };
        Self::parse(&path.display().to_string(), &text)
    }

    pub fn parse(what: &str, text: &[u8]) -> Result<CredentialStore, Error> {
        let config: DockerConfig = serde_json::from_slice(text)
            .map_err(|e| Error::config(what, format!("not a docker config.json: {e}")))?;
        let mut by_registry = BTreeMap::new();
        for (key, entry) in config.auths {
            let host = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let credentials = if let Some(auth) = entry.auth.filter(|a| !a.is_empty()) {
                let decoded = STANDARD.decode(auth.trim()).map_err(|_| {
                    Error::config(what, format!("auths[{key:?}].auth is not base64"))
                })?;
                let decoded = String::from_utf8(decoded).map_err(|_| {
                    Error::config(what, format!("auths[{key:?}].auth is not UTF-8"))
                })?;
                let Some((username, password)) = decoded.split_once(':') else {
                    return Err(Error::config(
                        what,
                        format!("auths[{key:?}].auth must encode username:password"),
                    ));
                };
                Credentials {
                    username: username.to_string(),
                    password: password.to_string(),
                }
            } else if let Some(token) = entry.identitytoken {
                Credentials {
                    username: "<token>".to_string(),
                    password: token,
                }
            } else if let (Some(username), Some(password)) = (entry.username, entry.password) {
                Credentials { username, password }
            } else {
                continue;
            };
            by_registry.insert(host, credentials);
        }
        Ok(CredentialStore { by_registry })
    }

    pub fn get(&self, registry: &str) -> Option<&Credentials> {
        self.by_registry.get(registry)
    }
}

/// A parsed `WWW-Authenticate` header.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    pub fn parse(header: &str) -> Option<Challenge> {
        let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let mut realm = None;
        let mut service = None;
        let mut scope = None;
        let mut rest = params;
        while let Some((key, after)) = rest.split_once('=') {
            let key = key.trim().trim_start_matches(',').trim();
            let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            } else {
                let end = after.find(',').unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            match key {
                "realm" => realm = Some(value.to_string()),
                "service" => service = Some(value.to_string()),
                "scope" => scope = Some(value.to_string()),
                _ => {}
            }
            rest = after;
        }
        Some(Challenge::Bearer {
            realm: realm?,
            service,
            scope,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_docker_config_forms() {
        let text = br#"{"auths":{
            "https://reg.example.com/v1/":{"auth":"dXNlcjpwYTpzcw=="},
            "127.0.0.1:5000":{"username":"u","password":"p"},
            "helper.example.com":{}
        },"credsStore":"desktop"}"#;
        let store = CredentialStore::parse("config.json", text).unwrap();
        let c = store.get("reg.example.com").unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "pa:ss")
        );
        assert_eq!(store.get("127.0.0.1:5000").unwrap().basic(), "Basic dTpw");
        assert!(store.get("helper.example.com").is_none());
        assert!(!format!("{c:?}").contains("pa:ss"));
        let err = CredentialStore::parse("c.json", br#"{"auths":{"x":{"auth":"!!"}}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("auths[\"x\"].auth is not base64"), "{err}");
    }

    #[test]
    fn parses_challenges() {
        assert_eq!(
            Challenge::parse("Basic realm=\"Registry\""),
            Some(Challenge::Basic)
        );
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example.com/token".into(),
                service: Some("registry.example.com".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(Challenge::parse("Negotiate"), None);
    }
}
