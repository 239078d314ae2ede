//! Flag types shared by subcommands: output format, logging, and the grants
//! and limits an admin gives a plugin on the command line.

use anyhow::{Context, bail};
use capstan_runtime::{Credential, Grants, Limits, Runtime, RuntimeConfig};
use clap::ValueEnum;
use std::path::PathBuf;
use std::time::Duration;

/// The default code cache directory: `$XDG_CACHE_HOME/capstan/code`, else
/// `~/.cache/capstan/code`.
pub fn default_code_cache() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("capstan").join("code")
}

/// A runtime for a one-shot command (`inspect`, `conformance`, `addon
/// render`, `annotate`): few call slots, and the controller's code cache
/// (`$CAPSTAN_CODE_CACHE`, else [`default_code_cache`]), so a plugin that
/// takes seconds to compile (Python, JavaScript) compiles once.
pub fn one_shot_runtime(max_concurrent_calls: u32) -> anyhow::Result<Runtime> {
    let cache_dir = std::env::var_os("CAPSTAN_CODE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(default_code_cache);
    Runtime::new(RuntimeConfig {
        max_concurrent_calls,
        cache_dir: Some(cache_dir),
        ..Default::default()
    })
    .context("cannot start the plugin runtime")
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    Text,
    /// For scripts (one JSON document on stdout).
    Json,
    /// For scripts and people (one YAML document on stdout).
    Yaml,
}

impl Output {
    /// Print `value` as one JSON or YAML document (text output prints
    /// nothing here: each command renders its own).
    pub fn print(self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        match self {
            Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
            Output::Yaml => print!("{}", serde_yaml::to_string(value)?),
            Output::Text => {}
        }
        Ok(())
    }
}

/// How diagnostics are logged on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Log to stderr; `RUST_LOG` filters (default: warnings, plus plugin logs).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,capstan::plugin=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Grant and limit flags, shared by every command that runs a plugin.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// Grant outbound HTTP to HOST:PORT (http and https), or to a full
    /// pattern such as `https://*.example.com:443`. Repeatable. The plugin
    /// must also declare the destination in its manifest.
    #[arg(long = "allow-host", value_name = "HOST:PORT")]
    pub allow_hosts: Vec<String>,
    /// Fill a credential slot with a bearer token read from an environment
    /// variable: `SLOT=ENV_VAR`. Repeatable. Tokens never go on the command line.
    #[arg(long = "bearer-from-env", value_name = "SLOT=ENV_VAR")]
    pub bearer_from_env: Vec<String>,
    /// Fill a credential slot with AWS keys from the environment
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN):
    /// the host signs each request to the slot's destinations with SigV4 for
    /// REGION and SERVICE, e.g. `aws=us-east-1/ec2`. Repeatable.
    #[arg(long = "aws-sigv4-from-env", value_name = "SLOT=REGION/SERVICE")]
    pub aws_sigv4_from_env: Vec<String>,
    /// Most outbound requests in flight at once per call.
    #[arg(long, default_value_t = capstan_runtime::limits::DEFAULT_MAX_REQUESTS_IN_FLIGHT)]
    pub max_requests_in_flight: u32,
    /// Most outbound requests per call.
    #[arg(long, default_value_t = capstan_runtime::limits::DEFAULT_MAX_REQUESTS_PER_CALL)]
    pub max_requests_per_call: u32,
    /// Deadline per plugin call, e.g. `10s`, `500ms`.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub call_timeout: Duration,
    /// Linear memory cap per call, in MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: usize,
}

impl SandboxArgs {
    /// No credential and the default limits: HTTP to `allow_hosts` only
    /// (replayed suites, which need no secret).
    pub fn offline(allow_hosts: Vec<String>) -> Self {
        SandboxArgs {
            allow_hosts,
            bearer_from_env: Vec::new(),
            aws_sigv4_from_env: Vec::new(),
            max_requests_in_flight: capstan_runtime::limits::DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            max_requests_per_call: capstan_runtime::limits::DEFAULT_MAX_REQUESTS_PER_CALL,
            call_timeout: Duration::from_secs(10),
            memory_mib: 64,
        }
    }

    /// The grants these flags describe.
    pub fn grants(&self) -> anyhow::Result<Grants> {
        let mut grants = Grants::default();
        for host in &self.allow_hosts {
            if host.contains("://") {
                grants.http.push(
                    host.parse()
                        .with_context(|| format!("--allow-host {host}"))?,
                );
            } else {
                if !host.contains(':') {
                    bail!(
                        "--allow-host {host}: expected HOST:PORT (e.g. 127.0.0.1:8787) or scheme://host:port"
                    );
                }
                for scheme in ["http", "https"] {
                    grants.http.push(
                        format!("{scheme}://{host}")
                            .parse()
                            .with_context(|| format!("--allow-host {host}"))?,
                    );
                }
            }
        }
        for spec in &self.bearer_from_env {
            let (slot, var) = spec
                .split_once('=')
                .with_context(|| format!("--bearer-from-env {spec}: expected SLOT=ENV_VAR"))?;
            let token = std::env::var(var).with_context(|| {
                format!("--bearer-from-env {spec}: environment variable {var} is not set")
            })?;
            grants
                .credentials
                .insert(slot.to_string(), Credential::Bearer(token));
        }
        for spec in &self.aws_sigv4_from_env {
            let parsed = spec.split_once('=').and_then(|(slot, scope)| {
                let (region, service) = scope.split_once('/')?;
                (!slot.is_empty() && !region.is_empty() && !service.is_empty())
                    .then_some((slot, region, service))
            });
            let Some((slot, region, service)) = parsed else {
                bail!(
                    "--aws-sigv4-from-env {spec}: expected SLOT=REGION/SERVICE, e.g. aws=us-east-1/ec2"
                );
            };
            let var = |name: &str| {
                std::env::var(name).with_context(|| {
                    format!("--aws-sigv4-from-env {spec}: environment variable {name} is not set")
                })
            };
            grants.credentials.insert(
                slot.to_string(),
                Credential::AwsSigV4 {
                    credentials: capstan_runtime::AwsCredentials {
                        access_key_id: var("AWS_ACCESS_KEY_ID")?,
                        secret_access_key: var("AWS_SECRET_ACCESS_KEY")?,
                        session_token: std::env::var("AWS_SESSION_TOKEN").ok(),
                    },
                    scope: capstan_runtime::AwsScope {
                        region: region.to_string(),
                        service: service.to_string(),
                    },
                },
            );
        }
        Ok(grants)
    }

    /// The limits these flags describe.
    pub fn limits(&self) -> Limits {
        Limits {
            call_timeout: self.call_timeout,
            memory_bytes: self.memory_mib * 1024 * 1024,
            max_requests_in_flight: self.max_requests_in_flight,
            max_requests_per_call: self.max_requests_per_call,
            ..Limits::default()
        }
    }
}

/// Parse `500ms`, `10s`, `2m`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 500ms, 10s or 2m"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s or m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3h").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn allow_host_grants_both_schemes_and_rejects_bare_hosts() {
        let args = SandboxArgs {
            allow_hosts: vec!["127.0.0.1:8787".into()],
            bearer_from_env: vec![],
            aws_sigv4_from_env: vec![],
            call_timeout: Duration::from_secs(1),
            memory_mib: 1,
            max_requests_in_flight: 2,
            max_requests_per_call: 3,
        };
        let g = args.grants().unwrap();
        assert_eq!(g.http.len(), 2);
        assert_eq!(args.limits().max_requests_per_call, 3);
        let bad = SandboxArgs {
            allow_hosts: vec!["example.com".into()],
            ..args.clone()
        };
        assert!(bad.grants().unwrap_err().to_string().contains("HOST:PORT"));
        for spec in ["aws", "aws=us-east-1", "=us-east-1/ec2", "aws=/ec2"] {
            let bad = SandboxArgs {
                aws_sigv4_from_env: vec![spec.into()],
                ..args.clone()
            };
            let err = bad.grants().unwrap_err().to_string();
            assert!(err.contains("SLOT=REGION/SERVICE"), "{spec}: {err}");
        }
    }
}
