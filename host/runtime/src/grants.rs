//! What an admin grants a plugin, and the pure decision of whether one
//! outbound request may leave the sandbox.
//!
//! A request is allowed only when its destination (scheme, host, port — taken
//! from the request URI, never from a `Host` header) matches a destination the
//! plugin's manifest **declares** *and* one the admin **grants**. The
//! credential attached is the one for the slot the matching declaration
//! names, from the admin's grant. See [`decide`].

use capstan_manifest::{Destination, DestinationPattern, HttpCapability};
use std::collections::BTreeMap;
use std::fmt;

/// A secret the host attaches to requests; never shown to the plugin, never
/// printed (its `Debug` is redacted).
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `Authorization: Basic base64(<username>:<password>)`.
    Basic { username: String, password: String },
    /// AWS Signature Version 4 over the whole request (method, path, query,
    /// `host` and `content-type`, body), computed by the host at send time;
    /// the scope (region and service) comes from the admin's grant.
    AwsSigV4 {
        credentials: capstan_sigv4::Credentials,
        scope: capstan_sigv4::Scope,
    },
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credential::Basic { username, .. } => {
                write!(
                    f,
                    "Basic {{ username: {username:?}, password: <redacted> }}"
                )
            }
            Credential::AwsSigV4 { credentials, scope } => {
                write!(f, "AwsSigV4 {{ {credentials:?}, {scope:?} }}")
            }
        }
    }
}

impl Credential {
    /// The `Authorization` header value, for credentials that do not
    /// depend on the request; `None` for a per-request signature.
    pub fn authorization(&self) -> Option<String> {
        match self {
            Credential::Bearer(t) => Some(format!("Bearer {t}")),
            Credential::Basic { username, password } => Some(format!(
                "Basic {}",
                base64(format!("{username}:{password}").as_bytes())
            )),
            Credential::AwsSigV4 { .. } => None,
        }
    }
}

fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What an admin grants one plugin.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Destinations the plugin may reach (intersected with its declarations).
    pub http: Vec<DestinationPattern>,
    /// Credentials by slot name (the slots the manifest declares).
    pub credentials: BTreeMap<String, Credential>,
    /// Per slot, the methods (upper case) a request may carry its
    /// credential with; a slot without an entry: any but `TRACE` and
    /// `CONNECT`, which never carry one.
    pub credential_methods: BTreeMap<String, Vec<String>>,
}

/// The methods a credential may go with at most (`TRACE` echoes the
/// request, `Authorization` included, back to the plugin; `CONNECT`
/// tunnels past the gate).
pub const CREDENTIAL_METHODS: [&str; 7] =
    ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

impl Grants {
    /// The declared capabilities these grants do not cover, one line each
    /// (`http https://api.example.com:443`, `credential slot "cloud" (for …)`).
    /// An optional destination left ungranted is not missing (nor is its
    /// credential slot, unless a granted destination needs it).
    /// Empty means every declaration is granted: the revision may be activated.
    pub fn missing(&self, declared: &[HttpCapability]) -> Vec<String> {
        let mut missing = Vec::new();
        for cap in declared {
            let granted = self.http.iter().any(|g| g.covers(&cap.destination));
            if cap.optional && !granted {
                continue;
            }
            if !granted {
                missing.push(format!("http {}", cap.destination));
            }
            if let Some(slot) = &cap.credential
                && !self.credentials.contains_key(slot)
            {
                let line = format!("credential slot {slot:?}");
                if !missing.contains(&line) {
                    missing.push(line);
                }
            }
        }
        missing
    }
}

/// The verdict on one outbound request.
#[derive(Debug, PartialEq, Eq)]
pub enum HttpDecision<'a> {
    /// Let it through, with this credential attached (if any).
    Allow { credential: Option<&'a Credential> },
    /// Refuse it; the reason names what is missing.
    Deny { reason: String },
}

/// Decide whether a request to `dest` may leave the sandbox.
pub fn decide<'a>(
    declared: &[HttpCapability],
    grants: &'a Grants,
    dest: &Destination,
    method: &str,
) -> HttpDecision<'a> {
    let Some(declaration) = declared.iter().find(|c| c.destination.matches(dest)) else {
        return HttpDecision::Deny {
            reason: format!("{dest} is not declared in the plugin manifest"),
        };
    };
    if !grants.http.iter().any(|g| g.matches(dest)) {
        return HttpDecision::Deny {
            reason: format!("{dest} is declared by the plugin but not granted by the admin"),
        };
    }
    let Some((slot, credential)) = declaration
        .credential
        .as_deref()
        .and_then(|slot| Some((slot, grants.credentials.get(slot)?)))
    else {
        return HttpDecision::Allow { credential: None };
    };
    let allowed = match grants.credential_methods.get(slot) {
        Some(methods) => methods.iter().any(|m| m == method),
        None => CREDENTIAL_METHODS.contains(&method),
    };
    if !allowed {
        return HttpDecision::Deny {
            reason: format!(
                "{method} requests to {dest} never carry credential slot {slot:?} (the grant allows {})",
                grants
                    .credential_methods
                    .get(slot)
                    .map_or_else(|| CREDENTIAL_METHODS.join(", "), |m| m.join(", "))
            ),
        };
    }
    HttpDecision::Allow {
        credential: Some(credential),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(d: &str, slot: Option<&str>) -> HttpCapability {
        HttpCapability {
            destination: d.parse().unwrap(),
            credential: slot.map(String::from),
            optional: false,
        }
    }

    /// Loopback declared with credential slot `cloud`; port 9000 granted
    /// with a bearer `token` in that slot.
    fn loopback_with_credential(token: &str) -> ([HttpCapability; 1], Grants) {
        let declared = [cap("http://127.0.0.1:*", Some("cloud"))];
        let mut grants = Grants {
            http: vec!["http://127.0.0.1:9000".parse().unwrap()],
            ..Default::default()
        };
        grants
            .credentials
            .insert("cloud".into(), Credential::Bearer(token.into()));
        (declared, grants)
    }

    #[test]
    fn needs_both_declaration_and_grant() {
        let (declared, grants) = loopback_with_credential("s3cret");

        let ok = Destination::new("http", "127.0.0.1:9000").unwrap();
        assert_eq!(
            decide(&declared, &grants, &ok, "GET"),
            HttpDecision::Allow {
                credential: Some(&Credential::Bearer("s3cret".into()))
            }
        );
        let not_granted = Destination::new("http", "127.0.0.1:9001").unwrap();
        assert!(matches!(decide(&declared, &grants, &not_granted, "GET"),
            HttpDecision::Deny { reason } if reason.contains("not granted")));
        let not_declared = Destination::new("http", "10.0.0.1:9000").unwrap();
        assert!(matches!(decide(&declared, &grants, &not_declared, "GET"),
            HttpDecision::Deny { reason } if reason.contains("not declared")));
    }

    #[test]
    fn a_grant_never_widens_the_declaration() {
        let declared = [cap("https://api.example.com", None)];
        let grants = Grants {
            http: vec!["https://*.example.com:*".parse().unwrap()],
            ..Default::default()
        };
        let other = Destination::new("https", "admin.example.com").unwrap();
        assert!(matches!(
            decide(&declared, &grants, &other, "GET"),
            HttpDecision::Deny { .. }
        ));
    }

    #[test]
    fn a_credential_goes_only_with_the_methods_its_grant_allows() {
        let (declared, mut grants) = loopback_with_credential("t");
        let dest = Destination::new("http", "127.0.0.1:9000").unwrap();
        let carries = |grants: &Grants, method: &str| {
            matches!(
                decide(&declared, grants, &dest, method),
                HttpDecision::Allow {
                    credential: Some(_)
                }
            )
        };
        assert!(carries(&grants, "POST"));
        for never in ["TRACE", "CONNECT", "PROPFIND"] {
            assert!(!carries(&grants, never), "{never}");
        }
        grants
            .credential_methods
            .insert("cloud".into(), vec!["GET".into()]);
        assert!(carries(&grants, "GET"));
        match decide(&declared, &grants, &dest, "DELETE") {
            HttpDecision::Deny { reason } => assert!(
                reason.contains("DELETE requests to") && reason.contains("the grant allows GET"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_lists_exactly_the_ungranted_declarations() {
        let declared = [
            cap("http://127.0.0.1:*", Some("cloud")),
            cap("https://api.example.com", None),
            cap("https://*.svc.example.com:8443", Some("cloud")),
        ];
        let mut grants = Grants {
            http: vec![
                "http://127.0.0.1:*".parse().unwrap(),
                "https://*.example.com:*".parse().unwrap(),
                "https://*.svc.example.com:*".parse().unwrap(),
            ],
            ..Default::default()
        };
        assert_eq!(grants.missing(&declared), ["credential slot \"cloud\""]);
        grants
            .credentials
            .insert("cloud".into(), Credential::Bearer("t".into()));
        assert!(grants.missing(&declared).is_empty());
        grants.http = vec!["http://127.0.0.1:9000".parse().unwrap()];
        assert_eq!(
            grants.missing(&declared),
            [
                "http http://127.0.0.1:*",
                "http https://api.example.com:443",
                "http https://*.svc.example.com:8443"
            ]
        );
    }

    #[test]
    fn an_optional_destination_need_not_be_granted_and_stays_denied() {
        let mut test_double = cap("http://127.0.0.1:*", Some("aws"));
        test_double.optional = true;
        let declared = [cap("https://ec2.*.amazonaws.com", Some("aws")), test_double];
        let mut grants = Grants {
            http: vec!["https://ec2.us-east-1.amazonaws.com".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(
            grants.missing(&declared),
            [
                "http https://ec2.*.amazonaws.com:443",
                "credential slot \"aws\""
            ]
        );
        // A one-label wildcard does not reach `ec2.REGION.amazonaws.com`.
        grants.http = vec!["https://*.amazonaws.com".parse().unwrap()];
        assert_eq!(grants.missing(&declared).len(), 2);
        grants.http = vec!["https://ec2.*.amazonaws.com".parse().unwrap()];
        grants
            .credentials
            .insert("aws".into(), Credential::Bearer("t".into()));
        assert!(grants.missing(&declared).is_empty());
        let local = Destination::new("http", "127.0.0.1:5000").unwrap();
        assert!(matches!(decide(&declared, &grants, &local, "GET"),
            HttpDecision::Deny { reason } if reason.contains("not granted")));
    }

    #[test]
    fn credentials_render_and_never_print() {
        let basic = Credential::Basic {
            username: "Aladdin".into(),
            password: "open sesame".into(),
        };
        assert_eq!(
            basic.authorization().as_deref(),
            Some("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
        let aws = Credential::AwsSigV4 {
            credentials: capstan_sigv4::Credentials {
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI".into(),
                session_token: Some("FwoGZXIvYXdz".into()),
            },
            scope: capstan_sigv4::Scope {
                region: "us-east-1".into(),
                service: "ec2".into(),
            },
        };
        let shown = format!("{aws:?}");
        assert!(shown.contains("AKIDEXAMPLE") && shown.contains("us-east-1"));
        assert!(
            !shown.contains("wJalr") && !shown.contains("FwoGZ"),
            "{shown}"
        );
        assert!(!format!("{basic:?}").contains("sesame"));
        assert!(!format!("{:?}", Credential::Bearer("tok".into())).contains("tok"));
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
    }
}
