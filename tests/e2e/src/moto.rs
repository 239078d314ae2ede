//! A real EC2 API for the tests: `moto`'s server (PyPI `moto[server]`,
//! installed by `scripts/setup.sh` into a venv outside the repo), started on
//! a free loopback port, plus an agent that gives every running moto instance
//! a Node through the simulated kubelet, as a real instance's kubelet would.
//!
//! With [`Auth::Checked`] moto verifies every request's SigV4 signature
//! against IAM: the harness creates an IAM user with an allow-all policy and
//! an access key through the first three (unauthenticated) actions, and
//! every later request needs that key. [`Auth::Off`] accepts any signature.
//!
//! The harness signs its own requests with `capstan-sigv4` and reads answers
//! with the EC2 plugin's parser (used natively).

use capstan_sim_cloud::kubelet::{Kubelet, NodeSpec};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

pub use ec2_provider::{Instance, UID_TAG};

/// The region the tests use.
pub const REGION: &str = "us-east-1";

/// Whether moto checks signatures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Every request after the bootstrap must carry a valid signature of an
    /// IAM access key.
    Checked,
    /// Any signature is accepted (requests must still be signed: moto finds
    /// the service in the credential scope).
    Off,
}

/// A running moto server; stopped when dropped.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// The IAM access key the harness created (or a dummy one with
    /// [`Auth::Off`]).
    pub credentials: capstan_sigv4::Credentials,
    /// An AMI id moto knows.
    pub image_id: String,
    /// moto's log.
    pub log: PathBuf,
}

/// The venv moto is installed in (`CAPSTAN_MOTO_VENV`, default
/// `~/.cache/capstan/moto`).
pub fn venv() -> PathBuf {
    std::env::var_os("CAPSTAN_MOTO_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/capstan/moto")
        })
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Keep the log only when a test failed, where it is named in the error.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

impl Moto {
    /// Start moto and, with [`Auth::Checked`], create the IAM access key.
    pub fn start(auth: Auth) -> Result<Moto, String> {
        let server = venv().join("bin/moto_server");
        if !server.exists() {
            return Err(format!(
                "{} is missing: run scripts/setup.sh moto (or set CAPSTAN_MOTO_VENV)",
                server.display()
            ));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let log = std::env::temp_dir().join(format!("capstan-moto-{port}.log"));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&server);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file);
        if auth == Auth::Checked {
            // CreateUser, PutUserPolicy, CreateAccessKey.
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "3");
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", server.display()))?;
        let mut moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
            credentials: capstan_sigv4::Credentials {
                access_key_id: "AKIDBOOTSTRAP".into(),
                secret_access_key: "unchecked-moto-secret".into(),
                session_token: None,
            },
            image_id: String::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "moto did not listen within 30 s; see {}",
                    moto.log.display()
                ));
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!(
                    "moto exited with {status}; see {}",
                    moto.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if auth == Auth::Checked {
            let user = [("UserName", "capstan")];
            moto.call("iam", "CreateUser", "2010-05-08", &user)?;
            moto.call(
                "iam",
                "PutUserPolicy",
                "2010-05-08",
                &[
                    ("UserName", "capstan"),
                    ("PolicyName", "all"),
                    (
                        "PolicyDocument",
                        r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}"#,
                    ),
                ],
            )?;
            let xml = moto.call("iam", "CreateAccessKey", "2010-05-08", &user)?;
            moto.credentials = capstan_sigv4::Credentials {
                access_key_id: xml_text(&xml, "AccessKeyId")?,
                secret_access_key: xml_text(&xml, "SecretAccessKey")?,
                session_token: None,
            };
        }
        let images = moto.ec2("DescribeImages", &[])?;
        moto.image_id = xml_text(&images, "imageId")?;
        Ok(moto)
    }

    /// Call `action` of `service`, signed with [`Moto::credentials`].
    pub fn call(
        &self,
        service: &str,
        action: &str,
        version: &str,
        params: &[(&str, &str)],
    ) -> Result<String, String> {
        let mut body = format!("Action={action}&Version={version}");
        for (k, v) in params {
            body.push_str(&format!(
                "&{}={}",
                capstan_sigv4::encode(k.as_bytes()),
                capstan_sigv4::encode(v.as_bytes())
            ));
        }
        let host = self.url.trim_start_matches("http://").to_string();
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let signed = capstan_sigv4::sign(
            &capstan_sigv4::Request {
                method: "POST",
                path_and_query: "/",
                headers: &[("host", &host), ("content-type", content_type)],
                payload: body.as_bytes(),
            },
            &self.credentials,
            &capstan_sigv4::Scope {
                region: REGION.into(),
                service: service.into(),
            },
            SystemTime::now(),
        );
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent
            .post(format!("{}/", self.url))
            .header("content-type", content_type);
        for (name, value) in &signed.headers {
            request = request.header(*name, value);
        }
        let mut resp = request
            .send(body.as_bytes())
            .map_err(|e| format!("{action}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("{action}: {e}"))?;
        if status >= 300 {
            return Err(format!("{action}: HTTP {status}: {text}"));
        }
        Ok(text)
    }

    /// Call an EC2 action.
    pub fn ec2(&self, action: &str, params: &[(&str, &str)]) -> Result<String, String> {
        self.call("ec2", action, ec2_provider::API_VERSION, params)
    }

    /// Every instance launched for a machine (any state), from moto's own
    /// `DescribeInstances`.
    pub fn instances(&self) -> Result<Vec<Instance>, String> {
        let xml = self.ec2(
            "DescribeInstances",
            &[("Filter.1.Name", "tag-key"), ("Filter.1.Value.1", UID_TAG)],
        )?;
        ec2_provider::parse_instances(&xml)
            .map(|(instances, _)| instances)
            .map_err(|e| format!("{e:?}"))
    }

    /// Instances that are not terminated (or shutting down).
    pub fn live_instances(&self) -> Result<Vec<Instance>, String> {
        Ok(self
            .instances()?
            .into_iter()
            .filter(|i| i.state != "terminated" && i.state != "shutting-down")
            .collect())
    }

    /// A Secret's `stringData` for an `AwsSigV4` credential grant with this
    /// key (`secret_access_key` replaced when `wrong_secret`).
    pub fn secret_data(&self, wrong_secret: bool) -> std::collections::BTreeMap<String, String> {
        let secret = if wrong_secret {
            "not-the-secret".to_string()
        } else {
            self.credentials.secret_access_key.clone()
        };
        std::collections::BTreeMap::from([
            (
                "accessKeyId".to_string(),
                self.credentials.access_key_id.clone(),
            ),
            ("secretAccessKey".to_string(), secret),
        ])
    }

    /// The EC2 plugin config for this server.
    pub fn provider_config(&self, instance_type: &str) -> serde_json::Value {
        serde_json::json!({
            "region": REGION,
            "endpoint": self.url,
            "instanceType": instance_type,
            "imageId": self.image_id,
            "tags": {"env": "e2e"},
        })
    }

    /// Give every running instance a Node (through `kubelet`) and remove the
    /// Nodes of instances that are going, polling every 300 ms, until the
    /// returned task is aborted.
    pub fn run_nodes(self: &std::sync::Arc<Self>, kubelet: Kubelet) -> tokio::task::JoinHandle<()> {
        let moto = self.clone();
        tokio::spawn(async move {
            let mut registered: BTreeSet<String> = BTreeSet::new();
            loop {
                let m = moto.clone();
                if let Ok(Ok(instances)) = tokio::task::spawn_blocking(move || m.instances()).await
                {
                    for i in instances {
                        let Some(name) = i.private_dns.clone().filter(|n| !n.is_empty()) else {
                            continue;
                        };
                        let live = i.state == "running" || i.state == "pending";
                        if live && !registered.contains(&name) {
                            let spec = NodeSpec {
                                name: name.clone(),
                                provider_id: ec2_provider::provider_id(&i),
                                internal_ip: i.private_ip.clone().unwrap_or_default(),
                                hostname: name.clone(),
                                zone: i.zone.clone().unwrap_or_default(),
                                version: None,
                                ..Default::default()
                            };
                            if kubelet.register(spec).await.is_ok() {
                                registered.insert(name);
                            }
                        } else if !live
                            && registered.contains(&name)
                            && kubelet.unregister(&name).await.is_ok()
                        {
                            registered.remove(&name);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    }
}

/// The text of the first element named `name`.
fn xml_text(xml: &str, name: &str) -> Result<String, String> {
    let open = format!("<{name}>");
    let start = xml
        .find(&open)
        .ok_or_else(|| format!("no <{name}> in {}", &xml[..xml.len().min(300)]))?
        + open.len();
    let end = xml[start..]
        .find('<')
        .ok_or_else(|| format!("unterminated <{name}>"))?;
    Ok(xml[start..start + end].to_string())
}
