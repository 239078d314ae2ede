//! The EC2 provider plugin against a real EC2 API implementation (moto),
//! with every request signed by the host: conformance, a MachineDeployment's
//! whole life, a controller killed between `RunInstances` and the status
//! write, and wrong keys.

use capstan_api::{
    CredentialGrant, CredentialType, MachineDeployment, Plugin, PluginGrants, PluginSpec,
    SecretKeyRef,
};
use capstan_controllers::{Options, Providers};
use capstan_e2e::env::{CAPSTAN_NAMESPACE, Env, sample_deployment};
use capstan_e2e::moto::{Auth, Moto, REGION};
use capstan_e2e::plugin;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Run `capstan plugin conformance` on the EC2 plugin with `config`, granted
/// `endpoint`, signing with `moto`'s key id and `secret`; (passed, stdout).
fn conformance(
    moto: &Moto,
    secret: &str,
    config: &serde_json::Value,
    endpoint: &str,
) -> (bool, String) {
    let out = std::process::Command::new(capstan_e2e::env::capstan_bin().unwrap())
        .args(["plugin", "conformance"])
        .arg(plugin("ec2_provider"))
        .args(["--config", &config.to_string()])
        .args(["--allow-host", endpoint.trim_start_matches("http://")])
        .args(["--aws-sigv4-from-env", &format!("aws={REGION}/ec2")])
        .args(["--timeout", "60s"])
        // What the instance was launched with, from EC2's own API (boto3,
        // as a user would ask with the aws CLI).
        .args(["--user-data-command", &user_data_command(moto)])
        .env("AWS_ACCESS_KEY_ID", &moto.credentials.access_key_id)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .expect("run capstan");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !stdout.contains(&moto.credentials.secret_access_key),
        "the report shows the secret"
    );
    (out.status.success(), stdout)
}

/// A shell command printing the base64 user data of instance
/// `$CAPSTAN_INSTANCE_ID`, asked of moto with boto3 (`DescribeInstanceAttribute`).
fn user_data_command(moto: &Moto) -> String {
    let python = capstan_e2e::moto::venv().join("bin/python");
    format!(
        "{} -c 'import boto3, os; print(boto3.client(\"ec2\", endpoint_url=\"{}\", region_name=\"{REGION}\").describe_instance_attribute(InstanceId=os.environ[\"CAPSTAN_INSTANCE_ID\"], Attribute=\"userData\")[\"UserData\"][\"Value\"])'",
        python.display(),
        moto.url
    )
}

#[test]
fn the_ec2_plugin_passes_conformance_against_moto_with_host_signed_requests() {
    let moto = Moto::start(Auth::Checked).unwrap();
    let config = moto.provider_config("t3.micro");
    let secret = moto.credentials.secret_access_key.clone();
    let (passed, report) = conformance(&moto, &secret, &config, &moto.url);
    assert!(passed, "{report}");
    for check in [
        "PASS  create is idempotent for the same machine uid",
        "PASS  the instance reaches running",
        "PASS  the instance got the bootstrap data create passed",
        "PASS  delete ends in done",
        "PASS  get after delete is not-found",
        "PASS  find-instance finds the instance tagged for the machine under a new uid",
        "PASS  find-instance by provider ID finds it, and get acts on it for the new uid",
        "PASS  find-instance finds nothing for another machine's name",
        "PASS  find-instance skips a deleted instance",
    ] {
        assert!(report.contains(check), "missing {check:?} in:\n{report}");
    }
    // moto's own view: the one conformance instance, terminated.
    let instances = moto.instances().unwrap();
    assert_eq!(instances.len(), 1, "{instances:?}");
    assert_eq!(instances[0].state, "terminated");

    // moto checks signatures: a wrong secret is unauthorized, not a crash.
    let (passed, report) = conformance(&moto, "not-the-secret", &config, &moto.url);
    assert!(!passed, "{report}");
    assert!(
        report.contains("unauthorized: DescribeInstances: AuthFailure"),
        "{report}"
    );
    assert_eq!(moto.instances().unwrap().len(), 1, "nothing launched");
}

/// Create the `aws` Secret and an `ec2` Plugin granted `endpoint` with an
/// AwsSigV4 credential from it.
async fn install_ec2_plugin(env: &Env, moto: &Moto, endpoint: &str, wrong_secret: bool) {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), CAPSTAN_NAMESPACE);
    let mut secret = Secret::default();
    secret.metadata.name = Some("aws".into());
    secret.string_data = Some(moto.secret_data(wrong_secret));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let spec = PluginSpec {
        source: format!("file://{}", plugin("ec2_provider").display()),
        verification: None,
        grants: PluginGrants {
            // The required public endpoint, and the optional loopback one
            // the test double listens on.
            http: vec!["https://ec2.*.amazonaws.com".into(), endpoint.to_string()],
            credentials: vec![CredentialGrant {
                slot: "aws".into(),
                secret_ref: SecretKeyRef {
                    namespace: CAPSTAN_NAMESPACE.into(),
                    name: "aws".into(),
                    key: None,
                },
                type_: CredentialType::AwsSigV4,
                region: Some(REGION.into()),
                service: Some("ec2".into()),
                // The EC2 Query API is POST only: nothing else carries the keys.
                methods: vec!["POST".into()],
            }],
            ..Default::default()
        },
        // Where the credential goes is the admin's choice, never a Machine's.
        settings: Some(serde_json::json!({ "endpoint": endpoint })),
        ..Default::default()
    };
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new("ec2", spec))
        .await
        .unwrap();
}

fn pid(m: &capstan_api::Machine) -> Option<String> {
    m.status.as_ref()?.provider_id.clone()
}

/// A Machine's EC2 config: moto's, without the endpoint (the Plugin's
/// `spec.settings` carries it).
fn machine_config(moto: &Moto, instance_type: &str) -> serde_json::Value {
    let mut config = moto.provider_config(instance_type);
    config.as_object_mut().unwrap().remove("endpoint");
    config
}

fn ec2_deployment(name: &str, config: serde_json::Value, replicas: i32) -> MachineDeployment {
    let mut md = sample_deployment(name, "ec2", "unused", replicas, "v1.30.0");
    md.spec.template.spec.provider.config = config;
    md
}

#[tokio::test]
async fn a_machine_deployment_of_ec2_machines_reaches_ready_rolls_and_terminates_on_moto() {
    crate::logs();
    let mut env = Env::start(Default::default()).await.unwrap();
    let moto = Arc::new(Moto::start(Auth::Checked).unwrap());
    let nodes = moto.run_nodes(env.cloud.kubelet().unwrap());
    install_ec2_plugin(&env, &moto, &moto.url, false).await;
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), "default");
    mds.create(
        &PostParams::default(),
        &ec2_deployment("ec2", machine_config(&moto, "t3.micro"), 3),
    )
    .await
    .unwrap();
    env.wait_rolled_out("default", "ec2", Duration::from_secs(90))
        .await;
    // Scale-from-zero capacity, from `DescribeInstanceTypes` (moto's
    // t3.micro: 2 vCPUs, 1 GiB), written for the cluster-autoscaler.
    let capacity = env
        .eventually(
            "capacity annotations",
            Duration::from_secs(60),
            async || {
                let a = mds.get("ec2").await.ok()?.metadata.annotations?;
                let key = |k: &str| format!("capacity.cluster-autoscaler.kubernetes.io/{k}");
                Some((a.get(&key("cpu"))?.clone(), a.get(&key("memory"))?.clone()))
            },
        )
        .await;
    assert_eq!(capacity, ("2".to_string(), "1024Mi".to_string()));

    // A Machine that names its own endpoint (a tenant's listener, which
    // would receive SigV4-signed requests with the admin's key id) is
    // refused before any call, and nothing reaches that endpoint.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut rogue_config = machine_config(&moto, "t3.micro");
    rogue_config["endpoint"] = format!("http://{}", listener.local_addr().unwrap()).into();
    let rogue = ec2_deployment("rogue", rogue_config, 1);
    let mut machine = capstan_api::Machine::new("rogue", rogue.spec.template.spec.clone());
    machine.metadata.namespace = Some("default".into());
    Api::<capstan_api::Machine>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let message = env
        .eventually(
            "the rogue Machine refused",
            Duration::from_secs(60),
            async || {
                let m = env
                    .machines("default")
                    .await
                    .into_iter()
                    .find(|m| m.name_any() == "rogue")?;
                let status = m.status?;
                (status.failure_reason.as_deref() == Some("InvalidConfiguration"))
                    .then_some(status.failure_message.unwrap_or_default())
            },
        )
        .await;
    assert!(
        message.contains("endpoint: set by the Plugin's admin (Plugin spec.settings.endpoint)"),
        "{message}"
    );
    let contacted = tokio::time::timeout(Duration::from_millis(500), listener.accept()).await;
    assert!(contacted.is_err(), "the Machine's endpoint was contacted");
    Api::<capstan_api::Machine>::namespaced(env.client.clone(), "default")
        .delete("rogue", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually(
        "the rogue Machine gone",
        Duration::from_secs(30),
        async || {
            let machines = env.machines("default").await;
            (!machines.iter().any(|m| m.name_any() == "rogue")).then_some(())
        },
    )
    .await;

    let first: Vec<String> = env
        .machines("default")
        .await
        .iter()
        .map(|m| pid(m).unwrap_or_default())
        .collect();
    let live = moto.live_instances().unwrap();
    assert_eq!(live.len(), 3, "{live:?}");
    for pid in &first {
        assert!(pid.starts_with("aws:///us-east-1"), "{pid}");
        assert!(
            live.iter().any(|i| pid.ends_with(&format!("/{}", i.id))),
            "{pid} is not a live moto instance: {live:?}"
        );
    }
    // Tags name the machine and carry the user's.
    assert!(live.iter().all(|i| {
        i.tags.get("env").map(String::as_str) == Some("e2e")
            && i.tags
                .get("capstan.dev/machine")
                .is_some_and(|m| m.starts_with("default/ec2-"))
    }));

    // A rolling update to another instance type replaces every machine.
    let patch = serde_json::json!({"spec": {"template": {"spec": {"provider": {
        "config": machine_config(&moto, "t3.small")
    }}}}});
    mds.patch("ec2", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.eventually(
        "every machine replaced",
        Duration::from_secs(120),
        async || {
            let machines = env.machines("default").await;
            let ready = capstan_controllers::deployment::rolled_out(
                &env.deployment("default", "ec2").await,
            );
            (ready
                && machines.len() == 3
                && machines
                    .iter()
                    .all(|m| pid(m).is_some_and(|p| !first.contains(&p))))
            .then_some(())
        },
    )
    .await;
    let all = moto.instances().unwrap();
    assert_eq!(all.len(), 6, "3 launched, then 3 more: {all:?}");
    env.eventually(
        "the old instances terminated",
        Duration::from_secs(60),
        async || (moto.live_instances().ok()?.len() == 3).then_some(()),
    )
    .await;

    // Deleting the deployment terminates every instance.
    mds.delete("ec2", &DeleteParams::default()).await.unwrap();
    env.eventually("machines gone", Duration::from_secs(90), async || {
        env.machines("default").await.is_empty().then_some(())
    })
    .await;
    let all = moto.instances().unwrap();
    assert_eq!(all.len(), 6);
    assert!(all.iter().all(|i| i.state == "terminated"), "{all:?}");
    nodes.abort();
}

/// What the proxy in front of moto does besides forwarding: the ways EC2
/// is eventually consistent, loses answers and enforces quotas.
#[derive(Default)]
struct Faults {
    /// While set, hold back `RunInstances` answers (after moto launched the
    /// instance) and flag `launched`.
    hold_run_instances: AtomicBool,
    launched: AtomicBool,
    /// Answer every Nth request with EC2's throttling error instead (0: never).
    throttle_every: std::sync::atomic::AtomicUsize,
    seen: std::sync::atomic::AtomicUsize,
    throttled: std::sync::atomic::AtomicUsize,
    /// For this long after a launch, `DescribeInstances` and
    /// `TerminateInstances` by that instance's id answer
    /// `InvalidInstanceID.NotFound` (0: never).
    hide_new_ms: std::sync::atomic::AtomicU64,
    hidden: std::sync::atomic::AtomicUsize,
    launches: std::sync::Mutex<Vec<(String, std::time::Instant)>>,
    /// The next N `RunInstances` launch, but their answer is lost (500).
    lose_run_answers: std::sync::atomic::AtomicUsize,
    /// The next N `RunInstances` launch twice (the second under another
    /// client token, as a retry past the token's validity would).
    duplicate_runs: std::sync::atomic::AtomicUsize,
    /// The next N `RunInstances` launch, then answer
    /// `IdempotentParameterMismatch`.
    mismatch_runs: std::sync::atomic::AtomicUsize,
    /// While set, `RunInstances` is refused with `InstanceLimitExceeded`.
    instance_limit: AtomicBool,
    limited: std::sync::atomic::AtomicUsize,
}

/// Take one from a fault counter, if any are left.
fn take(counter: &std::sync::atomic::AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn ec2_error(
    status: u16,
    code: &str,
) -> (
    axum::http::StatusCode,
    [(&'static str, &'static str); 1],
    String,
) {
    (
        axum::http::StatusCode::from_u16(status).unwrap(),
        [("content-type", "text/xml")],
        format!(
            "<Response><Errors><Error><Code>{code}</Code><Message>{code} (injected by the fault proxy)</Message></Error></Errors><RequestID>fault</RequestID></Response>"
        ),
    )
}

/// Forward a form body to moto; (status, body).
async fn forward(upstream: &str, headers: &axum::http::HeaderMap, body: &[u8]) -> (u16, String) {
    let (upstream, headers, body) = (upstream.to_string(), headers.clone(), body.to_vec());
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.post(format!("{upstream}/"));
        for (k, v) in &headers {
            if k != "host" && k != "content-length" {
                request = request.header(k.as_str(), v.to_str().unwrap_or(""));
            }
        }
        let mut resp = request.send(&body[..]).map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((status, text))
    })
    .await
    .unwrap()
    .unwrap_or((502, "proxy error".into()))
}

/// The values of every `InstanceId.N` form field.
fn instance_ids(body: &str) -> Vec<String> {
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("InstanceId."))
        .map(|(_, v)| v.to_string())
        .collect()
}

/// A proxy to `upstream` (moto) with `faults`; returns its URL. It forwards
/// with moto's own Host, so moto must not check signatures ([`Auth::Off`]).
async fn fault_proxy(upstream: String, faults: Arc<Faults>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let (upstream, faults) = (upstream.clone(), faults.clone());
            async move {
                let n = faults.seen.fetch_add(1, Ordering::SeqCst) + 1;
                let every = faults.throttle_every.load(Ordering::SeqCst);
                if every > 0 && n % every == 0 {
                    faults.throttled.fetch_add(1, Ordering::SeqCst);
                    return (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        [("content-type", "text/xml")],
                        "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>throttled</RequestID></Response>".to_string(),
                    );
                }
                let text_body = String::from_utf8_lossy(&body).into_owned();
                let is_run = text_body.starts_with("Action=RunInstances&");
                let by_id = text_body.starts_with("Action=DescribeInstances&")
                    || text_body.starts_with("Action=TerminateInstances&");
                if by_id {
                    let hide = Duration::from_millis(faults.hide_new_ms.load(Ordering::SeqCst));
                    let ids = instance_ids(&text_body);
                    let young = faults.launches.lock().unwrap().iter().any(|(id, at)| {
                        ids.contains(id) && at.elapsed() < hide
                    });
                    if young {
                        faults.hidden.fetch_add(1, Ordering::SeqCst);
                        return ec2_error(400, "InvalidInstanceID.NotFound");
                    }
                }
                if is_run && faults.instance_limit.load(Ordering::SeqCst) {
                    faults.limited.fetch_add(1, Ordering::SeqCst);
                    return ec2_error(400, "InstanceLimitExceeded");
                }
                let (status, text) = forward(&upstream, &headers, &body).await;
                if is_run {
                    if let Ok((launched, _)) = ec2_provider::parse_instances(&text) {
                        let mut launches = faults.launches.lock().unwrap();
                        for i in launched {
                            launches.push((i.id, std::time::Instant::now()));
                        }
                    }
                    if take(&faults.duplicate_runs) {
                        let again = text_body.replace("ClientToken=", "ClientToken=dup-");
                        let (upstream, headers) = (upstream.clone(), headers.clone());
                        tokio::spawn(async move { forward(&upstream, &headers, again.as_bytes()).await });
                    }
                    if take(&faults.lose_run_answers) {
                        return ec2_error(500, "InternalError");
                    }
                    if take(&faults.mismatch_runs) {
                        return ec2_error(400, "IdempotentParameterMismatch");
                    }
                }
                if is_run && faults.hold_run_instances.load(Ordering::SeqCst) {
                    faults.launched.store(true, Ordering::SeqCst);
                    // The caller is killed while waiting; answer late anyway.
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", "text/xml")],
                    text,
                )
            }
        },
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

#[tokio::test]
async fn lost_answers_duplicates_not_found_and_quotas_end_with_one_instance_per_machine() {
    crate::logs();
    let mut env = Env::start(Default::default()).await.unwrap();
    let moto = Arc::new(Moto::start(Auth::Off).unwrap());
    let faults = Arc::new(Faults::default());
    faults.hide_new_ms.store(3_000, Ordering::SeqCst);
    // (Searches by the machine-uid tag stay consistent: the plugin's source
    // of truth. Lookups by id lag, as EC2's do right after a launch.)
    faults.lose_run_answers.store(1, Ordering::SeqCst);
    faults.duplicate_runs.store(1, Ordering::SeqCst);
    faults.mismatch_runs.store(1, Ordering::SeqCst);
    let proxy = fault_proxy(moto.url.clone(), faults.clone()).await;
    let nodes = moto.run_nodes(env.cloud.kubelet().unwrap());
    install_ec2_plugin(&env, &moto, &proxy, false).await;
    // A duplicate launched after its machine became Ready is found by the
    // next instance check: every 5 s here (1 minute by default).
    let options = Options {
        instance_check: Duration::from_secs(5),
        ..Options::default()
    };
    env.start_controllers(Providers::default(), options).await;
    let config = machine_config(&moto, "t3.micro");
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), "default");
    mds.create(&PostParams::default(), &ec2_deployment("flaky", config, 3))
        .await
        .unwrap();
    env.wait_rolled_out("default", "flaky", Duration::from_secs(120))
        .await;
    // Every fault happened, and each machine has exactly its one instance.
    assert_eq!(faults.lose_run_answers.load(Ordering::SeqCst), 0);
    assert_eq!(faults.duplicate_runs.load(Ordering::SeqCst), 0);
    assert_eq!(faults.mismatch_runs.load(Ordering::SeqCst), 0);
    let one_each = async || {
        let machines = env.machines("default").await;
        let live = moto.live_instances().ok()?;
        let ok = live.len() == machines.len()
            && machines.iter().all(|m| {
                let uid = m.metadata.uid.clone().unwrap_or_default();
                live.iter()
                    .filter(|i| i.tags.get(capstan_e2e::moto::UID_TAG) == Some(&uid))
                    .count()
                    == 1
                    && live
                        .iter()
                        .any(|i| pid(m) == Some(ec2_provider::provider_id(i)))
            });
        ok.then_some(live.len())
    };
    env.eventually(
        "one live instance per machine (the duplicate terminated)",
        Duration::from_secs(60),
        one_each,
    )
    .await;
    let launched = moto.instances().unwrap().len();
    assert_eq!(launched, 4, "3 machines and the one injected duplicate");

    // A quota: the launch waits, retried slowly, and comes up once lifted.
    faults.instance_limit.store(true, Ordering::SeqCst);
    mds.patch(
        "flaky",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 4}})),
    )
    .await
    .unwrap();
    let message = env
        .eventually(
            "the launch held by the quota",
            Duration::from_secs(60),
            async || {
                env.machines("default").await.into_iter().find_map(|m| {
                    let c = capstan_api::condition(
                        &m.status?.conditions,
                        capstan_api::machine_conditions::INSTANCE_PROVISIONED,
                    )?
                    .clone();
                    (c.reason == "ProviderRetrying" && c.message.contains("InstanceLimitExceeded"))
                        .then_some(c.message)
                })
            },
        )
        .await;
    assert!(message.contains("retried every 30 s"), "{message}");
    // Retried slowly: at most one more refusal in 10 s (a 2 s retry loop
    // would make about five).
    let before = faults.limited.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let limited = faults.limited.load(Ordering::SeqCst);
    assert!(
        limited - before <= 1,
        "{} launches refused in 10 s: quota errors are not retried every few seconds",
        limited - before
    );
    faults.instance_limit.store(false, Ordering::SeqCst);
    env.wait_rolled_out("default", "flaky", Duration::from_secs(90))
        .await;
    assert_eq!(moto.live_instances().unwrap().len(), 4);

    // A machine deleted seconds after its launch, while EC2 still answers
    // NotFound for its id: the delete goes on until the tag search finds
    // no live instance, and none is left behind. Only the new instance is
    // hidden, until it has answered NotFound (a fixed window can pass
    // before a loaded machine's delete reaches EC2).
    faults.launches.lock().unwrap().clear();
    faults.hide_new_ms.store(600_000, Ordering::SeqCst);
    let hidden_before = faults.hidden.load(Ordering::SeqCst);
    mds.patch(
        "flaky",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    env.eventually(
        "the fifth instance launched",
        Duration::from_secs(60),
        async || (moto.live_instances().ok()?.len() == 5).then_some(()),
    )
    .await;
    mds.delete("flaky", &DeleteParams::default()).await.unwrap();
    // The sets and machines go by the garbage collector of a
    // controller-manager that may have just started (background
    // propagation), so the delete can take a while to reach EC2.
    env.eventually(
        "the young instance's NotFound answered to the delete",
        Duration::from_secs(150),
        async || (faults.hidden.load(Ordering::SeqCst) > hidden_before).then_some(()),
    )
    .await;
    // EC2 catches up: the id is found and terminated.
    faults.hide_new_ms.store(0, Ordering::SeqCst);
    env.eventually("machines gone", Duration::from_secs(90), async || {
        env.machines("default").await.is_empty().then_some(())
    })
    .await;
    let hidden = faults.hidden.load(Ordering::SeqCst);
    eprintln!(
        "ec2 faults: {} launched for 5 machines (1 duplicate), {hidden} NotFound answers for new ids, {limited} launches refused for the quota",
        moto.instances().unwrap().len()
    );
    let left = moto.live_instances().unwrap();
    assert!(left.is_empty(), "instances left behind: {left:?}");
    nodes.abort();
}

#[tokio::test]
async fn throttling_from_ec2_is_transient_with_retry_after_and_conformance_still_passes() {
    let moto = Moto::start(Auth::Off).unwrap();
    let faults = Arc::new(Faults::default());
    faults.throttle_every.store(4, Ordering::SeqCst);
    let proxy = fault_proxy(moto.url.clone(), faults.clone()).await;
    let mut config = moto.provider_config("t3.micro");
    config["endpoint"] = proxy.clone().into();
    let (passed, report) = tokio::task::spawn_blocking(move || {
        conformance(
            &moto,
            &moto.credentials.secret_access_key.clone(),
            &config,
            &proxy,
        )
    })
    .await
    .unwrap();
    assert!(passed, "{report}");
    assert!(
        report.contains("PASS  transient errors carry retry-after"),
        "{report}"
    );
    assert!(faults.throttled.load(Ordering::SeqCst) > 0);
}

#[tokio::test]
async fn a_controller_killed_between_run_instances_and_the_status_write_launches_no_second_instance()
 {
    crate::logs();
    let mut env = Env::start(Default::default()).await.unwrap();
    // No signature checks here: the proxy changes the Host the host signed.
    let moto = Arc::new(Moto::start(Auth::Off).unwrap());
    let faults = Arc::new(Faults::default());
    faults.hold_run_instances.store(true, Ordering::SeqCst);
    let proxy = fault_proxy(moto.url.clone(), faults.clone()).await;
    let nodes = moto.run_nodes(env.cloud.kubelet().unwrap());
    install_ec2_plugin(&env, &moto, &proxy, false).await;
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let config = machine_config(&moto, "t3.micro");
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &ec2_deployment("crash", config, 1))
        .await
        .unwrap();
    env.eventually(
        "RunInstances done in moto",
        Duration::from_secs(60),
        async || faults.launched.load(Ordering::SeqCst).then_some(()),
    )
    .await;
    assert_eq!(moto.instances().unwrap().len(), 1);
    let machines = env.machines("default").await;
    assert_eq!(machines.len(), 1);
    assert!(
        pid(&machines[0]).is_none(),
        "the status write has not happened yet: {:?}",
        pid(&machines[0])
    );

    env.kill_controllers().await;
    faults.hold_run_instances.store(false, Ordering::SeqCst);
    env.start_controllers(Providers::default(), Options::default())
        .await;
    env.wait_rolled_out("default", "crash", Duration::from_secs(90))
        .await;
    let instances = moto.instances().unwrap();
    assert_eq!(
        instances.len(),
        1,
        "a second instance was launched: {instances:?}"
    );
    let machine = &env.machines("default").await[0];
    assert_eq!(
        pid(machine).as_deref(),
        Some(ec2_provider::provider_id(&instances[0]).as_str())
    );
    nodes.abort();
}

#[tokio::test]
async fn wrong_keys_are_unauthorized_on_the_machine_retried_slowly_and_a_fixed_secret_recovers() {
    crate::logs();
    let mut env = Env::start(Default::default()).await.unwrap();
    let moto = Arc::new(Moto::start(Auth::Checked).unwrap());
    let nodes = moto.run_nodes(env.cloud.kubelet().unwrap());
    install_ec2_plugin(&env, &moto, &moto.url, true).await;
    // A short resync, so the Plugin notices the rotated Secret quickly.
    let options = Options {
        resync: Duration::from_secs(2),
        ..Options::default()
    };
    env.start_controllers(Providers::default(), options).await;
    Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
        .create(
            &PostParams::default(),
            &ec2_deployment("denied", machine_config(&moto, "t3.micro"), 1),
        )
        .await
        .unwrap();
    let message = env
        .eventually(
            "the machine says unauthorized",
            Duration::from_secs(60),
            async || {
                let m = env.machines("default").await.pop()?;
                let c = capstan_api::condition(
                    &m.status?.conditions,
                    capstan_api::machine_conditions::INSTANCE_PROVISIONED,
                )?
                .clone();
                (c.reason == "Unauthorized").then_some(c.message)
            },
        )
        .await;
    assert!(
        message.contains("AuthFailure") && message.contains("DescribeInstances"),
        "{message}"
    );
    assert!(!message.contains(&moto.credentials.secret_access_key));
    // The Plugin's first orphan scan (`list-instances`) is refused too; it
    // is retried only after `--orphan-scan-interval`. Wait for it, so the
    // window below measures only the Machine's back-off.
    let plugins: Api<Plugin> = Api::all(env.client.clone());
    let scan = env
        .eventually(
            "the orphan scan says it failed",
            Duration::from_secs(60),
            async || plugins.get("ec2").await.ok()?.status?.orphans?.message,
        )
        .await;
    assert!(scan.contains("list-instances failed"), "{scan}");
    assert!(!scan.contains(&moto.credentials.secret_access_key));
    // Backed off, not a crash loop: no more requests for a while.
    let denied = || {
        std::fs::read_to_string(&moto.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" 401 "))
            .count()
    };
    // The condition's own status write triggers one more reconcile (one
    // more 401), and moto logs a request after answering it: let both land
    // before counting, so the window measures only the back-off.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = denied();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        denied() <= before + 1,
        "{} denied requests in 5 s",
        denied() - before
    );
    assert!(moto.instances().unwrap().is_empty());
    let shown = env
        .control_plane
        .kubectl(&["get", "machines", "-n", "default"], None)
        .unwrap();
    assert!(shown.contains("denied-"), "{shown}");

    // The admin fixes the key: the plugin reloads with it and the machine's
    // next attempt (30 s after the refusal) succeeds.
    let fixed = serde_json::json!({"stringData": moto.secret_data(false)});
    Api::<Secret>::namespaced(env.client.clone(), CAPSTAN_NAMESPACE)
        .patch("aws", &PatchParams::default(), &Patch::Merge(&fixed))
        .await
        .unwrap();
    env.wait_rolled_out("default", "denied", Duration::from_secs(90))
        .await;
    assert_eq!(moto.live_instances().unwrap().len(), 1);
    nodes.abort();
}

/// The kubeadm bootstrap plugin as a Plugin granted nothing, serving
/// `default`.
async fn install_kubeadm_plugin(env: &Env) {
    let spec = PluginSpec {
        source: format!("file://{}", plugin("kubeadm_bootstrap").display()),
        allowed_namespaces: Some(capstan_api::AllowedNamespaces {
            names: vec!["default".into()],
            selector: None,
        }),
        ..Default::default()
    };
    Api::<Plugin>::all(env.client.clone())
        .create(&PostParams::default(), &Plugin::new("kubeadm", spec))
        .await
        .unwrap();
}

/// A Machine's bootstrap data reaches its EC2 instance as `UserData`: what
/// moto stored is exactly the data Secret, with the machine's real token
/// in place of the placeholder the plugin rendered. Data over EC2's 16 KiB
/// limit is refused before `RunInstances`, naming the size.
#[tokio::test]
async fn bootstrap_data_reaches_the_instance_as_user_data_within_ec2s_limit() {
    crate::logs();
    let mut env = Env::start(Default::default()).await.unwrap();
    let moto = Arc::new(Moto::start(Auth::Checked).unwrap());
    install_ec2_plugin(&env, &moto, &moto.url, false).await;
    install_kubeadm_plugin(&env).await;
    env.plugin_inputs = Some(Default::default());
    env.start_controllers(Providers::default(), Options::default())
        .await;
    let machines: Api<capstan_api::Machine> = Api::namespaced(env.client.clone(), "default");
    let spec = |config: serde_json::Value| {
        let mut spec = ec2_deployment("x", machine_config(&moto, "t3.micro"), 1)
            .spec
            .template
            .spec;
        spec.bootstrap = Some(capstan_api::MachineBootstrap {
            plugin: Some("kubeadm".into()),
            config: Some(config),
            data_secret_name: None,
        });
        spec
    };
    let mut joined = capstan_api::Machine::new("joins", spec(serde_json::json!({})));
    joined.metadata.namespace = Some("default".into());
    // 20 KiB of file content: under Capstan's 64 KiB, over EC2's 16 KiB.
    let mut large = capstan_api::Machine::new(
        "too-large",
        spec(
            serde_json::json!({"files": [{"path": "/etc/big", "content": "x".repeat(20 * 1024)}]}),
        ),
    );
    large.metadata.namespace = Some("default".into());
    for m in [&joined, &large] {
        machines.create(&PostParams::default(), m).await.unwrap();
    }
    let instance = env
        .eventually(
            "the instance launched",
            Duration::from_secs(60),
            async || {
                let m = machines.get("joins").await.ok()?;
                pid(&m)?;
                Some(m)
            },
        )
        .await;
    let id = pid(&instance)
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let xml = moto
        .ec2(
            "DescribeInstanceAttribute",
            &[("InstanceId", id.as_str()), ("Attribute", "userData")],
        )
        .unwrap();
    let b64 = xml
        .split("<userData>")
        .nth(1)
        .and_then(|rest| rest.split("<value>").nth(1))
        .and_then(|rest| rest.split("</value>").next())
        .unwrap_or_else(|| panic!("no userData in {xml}"));
    use base64::Engine;
    let user_data = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .unwrap();
    let secret_name = instance
        .status
        .as_ref()
        .and_then(|s| s.bootstrap_data_secret_name.clone())
        .unwrap();
    let secret = Api::<Secret>::namespaced(env.client.clone(), "default")
        .get(&secret_name)
        .await
        .unwrap();
    assert_eq!(user_data, secret.data.unwrap()["value"].0);
    let text = String::from_utf8(user_data).unwrap();
    assert!(!text.contains("@@CAPSTAN_BOOTSTRAP_TOKEN@@"));
    let token =
        capstan_e2e::sim_cloud::kubelet::join::join_configuration("cloud-config", text.as_bytes())
            .expect("a JoinConfiguration")
            .token;
    // The token is the one Capstan minted for this machine in kube-system.
    let tokens = Api::<Secret>::namespaced(env.client.clone(), "kube-system")
        .list(&kube::api::ListParams::default().labels(&format!(
            "capstan.dev/machine-uid={}",
            instance.uid().unwrap()
        )))
        .await
        .unwrap()
        .items;
    assert_eq!(tokens.len(), 1);
    let data = tokens[0].data.clone().unwrap();
    let minted = format!(
        "{}.{}",
        String::from_utf8_lossy(&data["token-id"].0),
        String::from_utf8_lossy(&data["token-secret"].0)
    );
    assert_eq!(token, minted);
    // What the plugins were given: the bootstrap plugin rendered with the
    // placeholder and never saw the token (nor its secret half); the token
    // went only to EC2's create, inside the bootstrap data.
    let secret_half = token.split('.').nth(1).unwrap().to_string();
    let calls = env.plugin_inputs.as_ref().unwrap().lock().unwrap().clone();
    let renders: Vec<_> = calls
        .iter()
        .filter(|c| c.plugin == "kubeadm-bootstrap" && c.call == "render")
        .collect();
    assert!(!renders.is_empty(), "the bootstrap plugin rendered");
    for call in &calls {
        let text = call.inputs.join(" ");
        assert!(
            !text.contains(&secret_half),
            "{} {} was given the token: {text}",
            call.plugin,
            call.call
        );
    }
    assert!(
        renders
            .iter()
            .all(|c| c.inputs[2].contains("@@CAPSTAN_BOOTSTRAP_TOKEN@@")),
        "{renders:?}"
    );
    let with_data = |c: &&capstan_runtime::CallInputs| {
        c.plugin == "ec2-provider" && c.call == "create" && c.inputs[1].starts_with("Some(")
    };
    assert!(
        calls.iter().any(|c| with_data(&c)),
        "EC2's create got the data"
    );

    let message = env
        .eventually(
            "the large data refused",
            Duration::from_secs(60),
            async || {
                let status = machines.get("too-large").await.ok()?.status?;
                status.failure_message
            },
        )
        .await;
    assert!(
        message.contains("over EC2's user data limit of 16384 bytes"),
        "{message}"
    );
    assert_eq!(
        moto.instances().unwrap().len(),
        1,
        "only the first launched"
    );
    env.stop_controllers().await;
}
