//! HTTP destinations: what a request resolves to ([`Destination`]) and the
//! patterns manifests declare and admins grant ([`DestinationPattern`]),
//! where `*` stands for exactly one label.

use crate::ManifestError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A concrete destination: what a request resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

impl Destination {
    /// The destination of an absolute `http`/`https` URI's scheme and
    /// authority (the authority may carry a port; userinfo is refused).
    pub fn new(scheme: &str, authority: &str) -> Result<Self, String> {
        let scheme = scheme.to_ascii_lowercase();
        let default_port = default_port(&scheme)
            .ok_or_else(|| format!("scheme `{scheme}` is not http or https"))?;
        if authority.contains('@') {
            return Err("credentials in the URL are not allowed".into());
        }
        let (host, port) = split_host_port(authority)?;
        Ok(Destination {
            scheme,
            host: host.to_ascii_lowercase(),
            port: port.unwrap_or(default_port),
        })
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), String> {
    // Bracketed IPv6 literal: [::1]:8080
    if let Some(rest) = authority.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| format!("`{authority}` has an unclosed IPv6 bracket"))?;
        let host = &authority[..end + 2];
        let after = &rest[end + 1..];
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, Some(parse_port(p)?))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(format!("`{authority}` has trailing characters")),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Ok((host, Some(parse_port(port)?))),
        None => Ok((authority, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, String> {
    p.parse::<u16>()
        .map_err(|_| format!("`{p}` is not a port number"))
}

/// A destination pattern, as declared in a manifest or granted by an admin:
/// `scheme://host[:port]`. `host` may be `*.example.com` (any subdomain, not
/// the apex); `port` may be `*`; a missing port means the scheme's default.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DestinationPattern {
    scheme: String,
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HostPattern {
    Exact(String),
    /// Labels, some of them `*`: each `*` stands for exactly one label
    /// (`*.example.com` matches `a.example.com`, not `a.b.example.com`), so
    /// a grant never reaches deeper names it did not spell out (an API
    /// Gateway under `*.execute-api.REGION.amazonaws.com` is not EC2).
    Labels(Vec<String>),
}

impl HostPattern {
    fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Labels(labels) => {
                let parts: Vec<&str> = host.split('.').collect();
                parts.len() == labels.len()
                    && labels
                        .iter()
                        .zip(&parts)
                        .all(|(l, p)| !p.is_empty() && (l == "*" || l == p))
            }
        }
    }

    /// Whether every host `other` matches, this one matches too.
    fn covers(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (_, HostPattern::Exact(host)) => self.matches(host),
            (HostPattern::Exact(_), HostPattern::Labels(_)) => false,
            (HostPattern::Labels(mine), HostPattern::Labels(theirs)) => {
                mine.len() == theirs.len()
                    && mine.iter().zip(theirs).all(|(m, t)| m == "*" || m == t)
            }
        }
    }
}

impl DestinationPattern {
    /// Whether `dest` is covered by this pattern.
    pub fn matches(&self, dest: &Destination) -> bool {
        if self.scheme != dest.scheme {
            return false;
        }
        if let Some(port) = self.port
            && port != dest.port
        {
            return false;
        }
        self.host.matches(&dest.host)
    }
}

impl DestinationPattern {
    /// Whether some destination matches both patterns.
    pub fn overlaps(&self, other: &DestinationPattern) -> bool {
        if self.scheme != other.scheme {
            return false;
        }
        if let (Some(a), Some(b)) = (self.port, other.port)
            && a != b
        {
            return false;
        }
        let labels = |h: &HostPattern| match h {
            HostPattern::Exact(host) => host.split('.').map(str::to_string).collect(),
            HostPattern::Labels(labels) => labels.clone(),
        };
        match (&self.host, &other.host) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
            (a, b) => {
                let (a, b): (Vec<String>, Vec<String>) = (labels(a), labels(b));
                a.len() == b.len()
                    && a.iter()
                        .zip(&b)
                        .all(|(x, y)| x == "*" || y == "*" || x == y)
            }
        }
    }

    /// Whether every destination `other` matches is also matched by this
    /// pattern (a grant covering a declaration).
    pub fn covers(&self, other: &DestinationPattern) -> bool {
        if self.scheme != other.scheme {
            return false;
        }
        if let Some(port) = self.port
            && other.port != Some(port)
        {
            return false;
        }
        self.host.covers(&other.host)
    }
}

impl FromStr for DestinationPattern {
    type Err = ManifestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| ManifestError::Invalid {
            field: "destination".into(),
            reason: format!("`{s}`: {reason}"),
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            invalid(
                "expected scheme://host[:port], e.g. https://ec2.us-east-1.amazonaws.com".into(),
            )
        })?;
        let scheme = scheme.to_ascii_lowercase();
        let default = default_port(&scheme)
            .ok_or_else(|| invalid(format!("scheme `{scheme}` is not http or https")))?;
        if rest.contains(['/', '?', '#', '@']) {
            return Err(invalid(
                "only scheme, host and port are allowed (no path, query or user)".into(),
            ));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, "*")) if !rest.starts_with('[') || h.ends_with(']') => (h, None),
            _ => {
                let (h, p) = split_host_port(rest).map_err(invalid)?;
                (h, Some(p.unwrap_or(default)))
            }
        };
        let host = host.to_ascii_lowercase();
        if host.is_empty() {
            return Err(invalid("the host is empty".into()));
        }
        let host = if host.contains('*') {
            let labels: Vec<String> = host.split('.').map(str::to_string).collect();
            let whole = labels
                .iter()
                .all(|l| l == "*" || !(l.is_empty() || l.contains('*')));
            let named_domain =
                labels.len() >= 3 && labels[labels.len() - 2..].iter().all(|l| l != "*");
            if !whole || !named_domain {
                return Err(invalid(
                    "`*` stands for exactly one whole label, below a domain spelled out: *.example.com or ec2.*.amazonaws.com (it never matches deeper names)".into(),
                ));
            }
            HostPattern::Labels(labels)
        } else {
            HostPattern::Exact(host)
        };
        Ok(DestinationPattern { scheme, host, port })
    }
}

impl fmt::Display for DestinationPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        match &self.host {
            HostPattern::Exact(h) => f.write_str(h)?,
            HostPattern::Labels(labels) => f.write_str(&labels.join("."))?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => f.write_str(":*"),
        }
    }
}

impl Serialize for DestinationPattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DestinationPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(s: &str, a: &str) -> Destination {
        Destination::new(s, a).unwrap()
    }

    #[test]
    fn a_pattern_covers_narrower_patterns_only() {
        let p = |s: &str| s.parse::<DestinationPattern>().unwrap();
        assert!(p("https://*.example.com:*").covers(&p("https://api.example.com")));
        // One label per `*`: deeper names are not covered.
        assert!(!p("https://*.example.com:*").covers(&p("https://*.eu.example.com:8443")));
        assert!(!p("https://*.example.com:*").covers(&p("https://a.eu.example.com")));
        assert!(p("https://*.*.example.com:*").covers(&p("https://*.eu.example.com:8443")));
        assert!(p("https://ec2.*.amazonaws.com").covers(&p("https://ec2.us-east-1.amazonaws.com")));
        assert!(!p("https://ec2.*.amazonaws.com").covers(&p("https://*.*.amazonaws.com")));
        assert!(!p("https://*.example.com:*").covers(&p("https://example.com")));
        assert!(!p("https://*.example.com:443").covers(&p("https://a.example.com:*")));
        assert!(!p("https://api.example.com").covers(&p("https://*.example.com")));
        assert!(!p("http://127.0.0.1:*").covers(&p("https://127.0.0.1:443")));
        assert!(p("http://127.0.0.1:*").covers(&p("http://127.0.0.1:*")));
        assert!(!p("http://127.0.0.1:9000").covers(&p("http://127.0.0.1:*")));
    }

    #[test]
    fn exact_pattern_matches_only_its_destination() {
        let p: DestinationPattern = "http://127.0.0.1:8080".parse().unwrap();
        assert!(p.matches(&dest("http", "127.0.0.1:8080")));
        assert!(!p.matches(&dest("http", "127.0.0.1:8081")));
        assert!(!p.matches(&dest("https", "127.0.0.1:8080")));
        assert!(!p.matches(&dest("http", "127.0.0.2:8080")));
    }

    #[test]
    fn missing_port_means_scheme_default() {
        let p: DestinationPattern = "https://api.example.com".parse().unwrap();
        assert!(p.matches(&dest("https", "api.example.com")));
        assert!(p.matches(&dest("https", "API.example.com:443")));
        assert!(!p.matches(&dest("https", "api.example.com:8443")));
        assert_eq!(p.to_string(), "https://api.example.com:443");
    }

    #[test]
    fn wildcards_cover_subdomains_and_ports_only() {
        let p: DestinationPattern = "https://ec2.*.amazonaws.com:*".parse().unwrap();
        assert!(p.matches(&dest("https", "ec2.us-east-1.amazonaws.com:444")));
        assert!(!p.matches(&dest("https", "amazonaws.com")));
        assert!(!p.matches(&dest("https", "ec2.amazonaws.com")));
        assert!(!p.matches(&dest("https", "evilamazonaws.com")));
        // A tenant's API Gateway is deeper than one label: never EC2's grant.
        let one: DestinationPattern = "https://*.amazonaws.com".parse().unwrap();
        assert!(one.matches(&dest("https", "sts.amazonaws.com")));
        assert!(!one.matches(&dest("https", "abc123.execute-api.us-east-1.amazonaws.com")));
        assert!(!one.matches(&dest("https", "ec2.us-east-1.amazonaws.com")));
        assert!(!one.matches(&dest("https", ".amazonaws.com")));
        for bad in [
            "https://*.com",
            "https://ec2.*",
            "https://a*.example.com",
            "https://*",
            "https://**.example.com",
        ] {
            let e = bad.parse::<DestinationPattern>().unwrap_err().to_string();
            assert!(e.contains("exactly one whole label"), "{bad}: {e}");
        }
        let any_port: DestinationPattern = "http://127.0.0.1:*".parse().unwrap();
        assert!(any_port.matches(&dest("http", "127.0.0.1:1")));
        assert!(!any_port.matches(&dest("http", "localhost:1")));
    }

    #[test]
    fn ipv6_literals_parse() {
        let p: DestinationPattern = "http://[::1]:9000".parse().unwrap();
        assert!(p.matches(&dest("http", "[::1]:9000")));
        let any: DestinationPattern = "http://[::1]:*".parse().unwrap();
        assert!(any.matches(&dest("http", "[::1]:1")));
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (bad, needle) in [
            ("127.0.0.1:80", "scheme://"),
            ("ftp://x", "not http or https"),
            ("http://x/path", "no path"),
            ("http://user@x", "no path, query or user"),
            ("http://a.*.com", "below a domain spelled out"),
            ("http://*com", "exactly one whole label"),
            ("http://x:99999", "port"),
        ] {
            let err = bad.parse::<DestinationPattern>().unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn destination_refuses_userinfo_and_odd_schemes() {
        assert!(Destination::new("http", "u:p@host").is_err());
        assert!(Destination::new("file", "host").is_err());
    }
}
