//! A whole local Capstan environment: control plane, CRDs, the simulated
//! cloud and its kubelet (Nodes that heartbeat and run pods), the
//! sim-provider plugin as a `Plugin` object with its credential in a Secret,
//! and the controllers running in this process. Used by the end-to-end
//! tests, the quickstart and the scale benchmark.
//!
//! Start with [`Env::start`] (or [`Env::start_with`] for other kubelet or
//! node-lifecycle timings); [`Env::start_controllers`] /
//! [`Env::kill_controllers`] run and abruptly stop the controllers (to test
//! restarts); dropping an `Env` stops everything.

use crate::control_plane::{Baseline, ControlPlane, ControlPlaneOptions};
use crate::sim_cloud::{Faults, KubeletConfig, SimCloud, SimCloudConfig};
use capstan_api::{
    DeploymentRollout, IntOrString, LabelSelector, Machine, MachineDeployment,
    MachineDeploymentSpec, MachineSpec, MachineTemplateSpec, Plugin, PluginGrants, PluginSpec,
    ProviderRef, RollingUpdate, Strategy, TemplateMeta,
};
use capstan_controllers::{Metrics, Options, Providers};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a real node's `kubeadm join` cannot pass in this sandbox, skipped
/// by the Machine's bootstrap configuration (never by the plugin): no
/// `crictl` (Debian does not ship cri-tools), no kernel configuration to
/// read, and bridge netfilter is the host's.
pub const REAL_NODE_IGNORED_PREFLIGHT: [&str; 3] = [
    "FileExisting-crictl",
    "SystemVerification",
    "FileContent--proc-sys-net-bridge-bridge-nf-call-iptables",
];

/// The Kubernetes version real nodes run (kubelet and kubeadm are built
/// from the control plane's source).
pub const REAL_NODE_VERSION: &str = "v1.20.2";

/// Name of the `Plugin` object for the Wasm sim-provider.
pub const SIM_PLUGIN: &str = "sim";
/// Token the simulated cloud requires (from the Secret, attached by the host).
pub const CLOUD_TOKEN: &str = "quickstart-cloud-token";

/// Capstan's own namespace: credential Secrets live here (the only place
/// `capstan controller` reads them from).
pub const CAPSTAN_NAMESPACE: &str = "capstan-system";

/// A running environment. Fields drop in order: the cloud and its kubelet
/// stop before the control plane they talk to.
pub struct Env {
    /// The simulated cloud and its kubelet.
    pub cloud: SimCloud,
    /// The control plane (kubectl, kubeconfig, client).
    pub control_plane: Arc<ControlPlane>,
    /// An admin client that does not retry (a 429 is seen at once); the
    /// controllers get their own, retrying as in production.
    pub client: Client,
    /// Metrics of the current (or last) controllers run.
    pub metrics: Metrics,
    /// Set to `Some` before starting the controllers to record the inputs
    /// of every plugin call they make.
    pub plugin_inputs: Option<Arc<std::sync::Mutex<Vec<capstan_runtime::CallInputs>>>>,
    controllers: Option<Running>,
}

#[derive(Debug)]
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Poll `check` every 100 ms until it returns `Some`, or `None` once
/// `within` has passed.
pub async fn poll_until<T>(
    within: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `check` returns `Some`, polling every 100 ms; panics with
/// `what` after `within`.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    match poll_until(within, check).await {
        Some(value) => value,
        None => panic!("{what}: not reached in {within:?}"),
    }
}

/// How to start an [`Env`].
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// The simulated cloud's faults and latencies.
    pub faults: Faults,
    /// The simulated kubelet's heartbeats and pod start delay.
    pub kubelet: KubeletConfig,
    /// The node-lifecycle timings.
    pub control_plane: ControlPlaneOptions,
    /// Boot every instance as a real node (real cloud-init, `kubeadm
    /// join` and kubelet; `capstan_sim_cloud::realnode`) instead of the
    /// simulated kubelet's.
    pub real_nodes: bool,
}

/// The simulated kubelet's test timings: heartbeats every 2 s (with the
/// control plane's default 10 s grace period, a Node goes `Ready=Unknown`
/// about 10 s after its kubelet stops), pods running 200 ms after they are
/// bound. Instances launched without user data register with the
/// kubelet's shared identity: the areas that are not about joining use
/// Machines without `spec.bootstrap`; the `bootstrap` area joins them for
/// real.
pub fn test_kubelet() -> KubeletConfig {
    KubeletConfig {
        heartbeat_interval_ms: 2_000,
        pod_start_delay_ms: 200,
        shared_identity_without_join_data: true,
        join_timeout_ms: 60_000,
        ..Default::default()
    }
}

impl EnvOptions {
    /// Test timings ([`test_kubelet`], [`ControlPlaneOptions::default`]).
    pub fn new(faults: Faults) -> EnvOptions {
        EnvOptions {
            faults,
            kubelet: test_kubelet(),
            control_plane: ControlPlaneOptions::default(),
            real_nodes: false,
        }
    }
}

impl Env {
    /// [`Env::start_with`] test timings ([`EnvOptions::new`]).
    pub async fn start(faults: Faults) -> Result<Env, String> {
        Env::start_with(EnvOptions::new(faults)).await
    }

    /// Start the control plane, install the CRDs, start the cloud and its
    /// kubelet, and create the `sim` Plugin. Controllers are not started yet.
    pub async fn start_with(options: EnvOptions) -> Result<Env, String> {
        let mut plane_options = options.control_plane.clone();
        // Real nodes: their directory, and the socket the API server's
        // egress reaches their kubelets through.
        let real_dir = options.real_nodes.then(|| {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            std::env::temp_dir().join(format!(
                "capstan-realnodes-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ))
        });
        if let Some(dir) = &real_dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            plane_options.egress_socket = Some(dir.join("egress.sock"));
        }
        // A plane a test before left with the CRDs installed, else a new
        // one (see `control_plane::reuse`).
        let control_plane = Arc::new(
            tokio::task::spawn_blocking(move || {
                match ControlPlane::take_idle(&plane_options, Baseline::CapstanCrds)? {
                    Some(plane) => Ok(plane),
                    None => ControlPlane::start_with(plane_options),
                }
            })
            .await
            .map_err(|e| e.to_string())??,
        );
        let client = control_plane.client_without_retries().await?;
        install_crds(&client).await?;
        let plane = control_plane.clone();
        tokio::task::spawn_blocking(move || plane.keep_as_baseline(Baseline::CapstanCrds))
            .await
            .map_err(|e| e.to_string())??;
        let real_nodes = real_dir.map(|dir| crate::sim_cloud::realnode::RealNodeConfig {
            egress_socket: dir.join("egress.sock"),
            dir,
            node_bin: crate::control_plane::node_bin_dir(),
            api_server: control_plane.url.clone(),
        });
        let cloud = SimCloud::start(SimCloudConfig {
            token: Some(CLOUD_TOKEN.into()),
            faults: options.faults,
            // Real nodes have real kubelets: no simulated one.
            kube: real_nodes.is_none().then(|| control_plane.kube_target()),
            kubelet: options.kubelet,
            real_nodes,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot start the simulated cloud: {e}"))?;
        let env = Env {
            control_plane,
            cloud,
            client,
            metrics: Metrics::new(),
            plugin_inputs: None,
            controllers: None,
        };
        env.create_plugin(SIM_PLUGIN, &crate::plugin("sim_provider"))
            .await?;
        Ok(env)
    }

    /// An environment with the controllers running and a MachineDeployment
    /// `pool` (labels `capstan.dev/pool: pool`) of `replicas` sim machines
    /// in `default`, rolled out: Nodes Ready, ready for workloads.
    pub async fn start_with_pool(faults: Faults, replicas: i32) -> Result<Env, String> {
        Self::start_with_pool_and(faults, replicas, Options::default()).await
    }

    /// The same with the controllers' `options`.
    pub async fn start_with_pool_and(
        faults: Faults,
        replicas: i32,
        options: Options,
    ) -> Result<Env, String> {
        let mut env = Env::start(faults).await?;
        env.start_controllers(Providers::default(), options).await;
        let md = sample_deployment("pool", SIM_PLUGIN, &env.cloud.url(), replicas, "v1.30.0");
        Api::<MachineDeployment>::namespaced(env.client.clone(), "default")
            .create(&Default::default(), &md)
            .await
            .map_err(|e| format!("cannot create md/pool: {e}"))?;
        env.wait_rolled_out("default", "pool", Duration::from_secs(90))
            .await;
        Ok(env)
    }

    /// A restore into a fresh API server, with the controllers stopped:
    /// the control plane restarts on an empty etcd with its PKI kept
    /// ([`ControlPlane::restart_empty`]), then what a cluster restore
    /// brings back before the user's objects is put back: the CRDs and the
    /// `sim` Plugin with its Secret.
    pub async fn restore_into_fresh_control_plane(&self) -> Result<(), String> {
        assert!(self.controllers.is_none(), "stop the controllers first");
        let plane = self.control_plane.clone();
        tokio::task::spawn_blocking(move || plane.restart_empty())
            .await
            .map_err(|e| e.to_string())??;
        // The client's pooled connections died with the old API server.
        let mut attempts = 0;
        while let Err(e) = install_crds(&self.client).await {
            attempts += 1;
            if attempts == 5 {
                return Err(format!("cannot install the CRDs after the restore: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.create_plugin(SIM_PLUGIN, &crate::plugin("sim_provider"))
            .await
    }

    /// Create the Secret holding the cloud token and a `Plugin` for the
    /// component at `path`, granted the loopback cloud.
    pub async fn create_plugin(&self, name: &str, path: &std::path::Path) -> Result<(), String> {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let namespace = k8s_openapi::api::core::v1::Namespace {
            metadata: ObjectMeta {
                name: Some(CAPSTAN_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(format!("cannot create namespace {CAPSTAN_NAMESPACE}: {e}")),
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), CAPSTAN_NAMESPACE);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("sim-cloud".into()),
                ..Default::default()
            },
            string_data: Some(BTreeMap::from([("token".into(), CLOUD_TOKEN.into())])),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(format!("cannot create the cloud Secret: {e}")),
        }
        let plugins: Api<Plugin> = Api::all(self.client.clone());
        let plugin = Plugin::new(name, sim_plugin_spec(&format!("file://{}", path.display())));
        plugins
            .create(&PostParams::default(), &plugin)
            .await
            .map_err(|e| format!("cannot create Plugin {name}: {e}"))?;
        Ok(())
    }

    /// Run the controllers in this process with fresh metrics and their own
    /// API connections, as a new controller process would.
    pub async fn start_controllers(&mut self, providers: Providers, options: Options) {
        let config = self.control_plane.config().await.expect("a kubeconfig");
        self.start_controllers_as(config, providers, options).await;
    }

    /// The same, connected with `config` (for example as the ServiceAccount
    /// `capstan install` generates: [`crate::install::controller_config`]).
    pub async fn start_controllers_as(
        &mut self,
        config: kube::Config,
        providers: Providers,
        options: Options,
    ) {
        assert!(self.controllers.is_none(), "controllers already running");
        let mut options = options;
        options.unsigned_plugin_dirs.push(
            capstan_registry::Scope::parse(&format!("file://{}/", crate::plugin_dir().display()))
                .expect("the plugin directory is an absolute path"),
        );
        let runtime = capstan_runtime::Runtime::new(capstan_runtime::RuntimeConfig {
            cache_dir: Some(crate::plugin_target_dir().join("code-cache")),
            ..Default::default()
        })
        .expect("the plugin runtime starts");
        if let Some(log) = self.plugin_inputs.clone() {
            runtime.record_inputs(move |call| log.lock().expect("not poisoned").push(call));
        }
        self.metrics = Metrics::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics = self.metrics.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = capstan_controllers::run(
                config,
                Some(runtime),
                providers,
                metrics,
                options,
                shutdown,
            )
            .await
            {
                panic!("controllers failed: {e}");
            }
        });
        self.controllers = Some(Running { stop, task });
    }

    /// Stop the controllers gracefully (in-flight reconciles finish).
    pub async fn stop_controllers(&mut self) {
        if let Some(running) = self.controllers.take() {
            let _ = running.stop.send(());
            let _ = running.task.await;
        }
    }

    /// Stop the controllers abruptly, mid-reconcile, as a crash would.
    pub async fn kill_controllers(&mut self) {
        if let Some(running) = self.controllers.take() {
            running.task.abort();
            let _ = running.task.await;
        }
    }

    /// Launch `count` instances straight in the simulated cloud (no
    /// Machines) and wait until their Nodes are Ready and schedulable (the
    /// node-lifecycle controller has lifted the `not-ready` taint). Returns
    /// the Node names.
    pub async fn add_nodes(&self, count: usize) -> Result<Vec<String>, String> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let url = format!("{}/v1/instances", self.cloud.url());
        let mut names = Vec::new();
        for _ in 0..count {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let body = serde_json::json!({ "clientToken": format!("extra-node-{n}"), "name": format!("worker-{n}") });
            let (code, answer) = self.cloud_call("POST", &url, Some(body)).await?;
            let id = answer["id"]
                .as_str()
                .ok_or_else(|| format!("the cloud answered {code} {answer}"))?;
            names.push(crate::sim_cloud::node_name(id));
        }
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        for name in &names {
            poll_until(Duration::from_secs(60), async || {
                let node = nodes.get(name).await.ok()?;
                let ready = node
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| !t.is_empty());
                (ready && !tainted).then_some(())
            })
            .await
            .ok_or_else(|| format!("Node {name} not Ready and untainted in 60 s"))?;
        }
        Ok(names)
    }

    /// Call the simulated cloud's API (with its token): (status, JSON body
    /// or null). `url` may be a path (`/admin/nodes`).
    pub async fn cloud_call(
        &self,
        method: &str,
        url: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), String> {
        let url = if url.starts_with('/') {
            format!("{}{url}", self.cloud.url())
        } else {
            url.to_string()
        };
        let method = method.to_string();
        tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into();
            let request = ureq::http::Request::builder()
                .method(method.as_str())
                .uri(&url)
                .header("authorization", format!("Bearer {CLOUD_TOKEN}"))
                .header("content-type", "application/json")
                .body(body.map(|b| b.to_string()).unwrap_or_default())
                .map_err(|e| e.to_string())?;
            let mut resp = agent
                .run(request)
                .map_err(|e| format!("{method} {url}: {e}"))?;
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            Ok((
                resp.status().as_u16(),
                serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
            ))
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// The simulated cloud's timeline (`GET /admin/timeline`): what
    /// happened to instances and pods, in order.
    pub async fn timeline(&self) -> Vec<crate::sim_cloud::Moment> {
        let (_, body) = self
            .cloud_call("GET", "/admin/timeline", None)
            .await
            .expect("the cloud answers");
        serde_json::from_value(body["moments"].clone()).expect("a timeline")
    }

    /// Whether the cloud still has this instance (`sim://ID` or `ID`), in
    /// any state but gone.
    pub async fn instance_exists(&self, provider_id: &str) -> bool {
        let id = provider_id.trim_start_matches("sim://");
        let (code, _) = self
            .cloud_call("GET", &format!("/v1/instances/{id}"), None)
            .await
            .expect("the cloud answers");
        code == 200
    }

    /// The reasons of every Event in a namespace, space-separated (what
    /// `kubectl get events` shows in its REASON column).
    pub fn event_reasons(&self, namespace: &str) -> String {
        self.control_plane
            .kubectl(
                &[
                    "get",
                    "events",
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.items[*].reason}",
                ],
                None,
            )
            .expect("kubectl get events")
    }

    /// The (reason, message) of every Event about the object `name` in
    /// `namespace`.
    pub async fn events_for(&self, namespace: &str, name: &str) -> Vec<(String, String)> {
        let api: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), namespace);
        let params =
            kube::api::ListParams::default().fields(&format!("involvedObject.name={name}"));
        api.list(&params)
            .await
            .expect("events list")
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// The Machines in a namespace.
    pub async fn machines(&self, namespace: &str) -> Vec<Machine> {
        Api::<Machine>::namespaced(self.client.clone(), namespace)
            .list(&Default::default())
            .await
            .expect("list machines")
            .items
    }

    /// A MachineDeployment.
    pub async fn deployment(&self, namespace: &str, name: &str) -> MachineDeployment {
        Api::<MachineDeployment>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .expect("get machinedeployment")
    }

    /// Wait until a deployment reports `replicas` machines, all updated and
    /// available, and its cloud has exactly that many instances.
    pub async fn wait_rolled_out(&self, namespace: &str, name: &str, within: Duration) {
        self.eventually(&format!("md/{name} rolled out"), within, async || {
            let md = self.deployment(namespace, name).await;
            let mine = self
                .machines(namespace)
                .await
                .iter()
                .filter(|m| {
                    m.labels()
                        .get(capstan_api::LABEL_DEPLOYMENT_NAME)
                        .map(String::as_str)
                        == Some(name)
                })
                .count();
            (capstan_controllers::deployment::rolled_out(&md) && mine as i32 == md.spec.replicas)
                .then_some(())
        })
        .await;
    }

    /// Like [`eventually`], but the panic shows the environment's state.
    pub async fn eventually<T>(
        &self,
        what: &str,
        within: Duration,
        check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        match poll_until(within, check).await {
            Some(value) => value,
            None => panic!(
                "{what}: not reached in {within:?}\n{}",
                self.describe("default").await
            ),
        }
    }

    /// The value, or a panic with the error and the environment's state.
    pub async fn or_describe<T>(&self, result: Result<T, String>) -> T {
        match result {
            Ok(value) => value,
            Err(e) => panic!("{e}\n{}", self.describe("default").await),
        }
    }

    /// Everything Capstan owns, as YAML-ish text, for failure messages.
    pub async fn describe(&self, namespace: &str) -> String {
        let kubectl = |args: &[&str]| self.control_plane.kubectl(args, None).unwrap_or_else(|e| e);
        format!(
            "{}\n{}\n--- machine status ---\n{}\n--- cloud ---\n{:?}\n--- metrics ---\n{}",
            kubectl(&[
                "get",
                "plugins,md,ms,ma,mhc,nodes,deploy,ds,pods",
                "-n",
                namespace,
                "-o",
                "wide"
            ]),
            kubectl(&["get", "plugins", "-o", "jsonpath={.items[*].status}"]),
            kubectl(&[
                "get",
                "ma,md,mhc",
                "-n",
                namespace,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status}{\"\\n\"}{end}"
            ]),
            self.cloud.stats(),
            self.metrics
                .encode()
                .lines()
                .filter(|l| l.contains("writes") || l.contains("errors") || l.contains("result"))
                .filter(|l| l.contains("_count") || l.contains("_total"))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("api", &self.control_plane.url)
            .field("cloud", &self.cloud.url())
            .finish_non_exhaustive()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(running) = self.controllers.take() {
            running.task.abort();
        }
    }
}

/// The name of the Node a machine's status points at (panics if it has none
/// yet: call it on machines that are Ready).
pub fn node_of(m: &Machine) -> String {
    m.status
        .as_ref()
        .unwrap()
        .node_ref
        .as_ref()
        .unwrap()
        .name
        .clone()
}

/// The spec of a sim-provider Plugin at `source`: it grants everything the
/// sim plugins declare (loopback HTTP, the `sim-cloud` credential from the
/// `capstan-system/sim-cloud` Secret, the sim updaters' fields) and serves
/// the `default` namespace.
pub fn sim_plugin_spec(source: &str) -> PluginSpec {
    PluginSpec {
        source: source.to_string(),
        verification: None,
        grants: PluginGrants {
            http: vec!["http://127.0.0.1:*".into(), "http://localhost:*".into()],
            credentials: vec![capstan_api::CredentialGrant {
                slot: "sim-cloud".into(),
                secret_ref: capstan_api::SecretKeyRef {
                    namespace: CAPSTAN_NAMESPACE.into(),
                    name: "sim-cloud".into(),
                    key: Some("token".into()),
                },
                type_: Default::default(),
                region: None,
                service: None,
                methods: Vec::new(),
            }],
            // What the sim updaters declare.
            update_fields: vec!["version".into(), "provider.config.tags.*".into()],
            ..Default::default()
        },
        limits: Default::default(),
        quota: None,
        // The sample machines live in `default`, outside Capstan's namespace.
        allowed_namespaces: Some(capstan_api::AllowedNamespaces {
            names: vec!["default".into()],
            selector: None,
        }),
        update_order: None,
        progress_deadline_seconds: None,
        settings: None,
        adopt_untagged_in: None,
        rollout: None,
    }
}

/// Create the CRDs (idempotently) and wait until they are established.
pub async fn install_crds(client: &Client) -> Result<(), String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in capstan_api::crds() {
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(format!("cannot create CRD {}: {e}", crd.name_any())),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for crd in capstan_api::crds() {
        loop {
            let current = crds.get(&crd.name_any()).await.map_err(|e| e.to_string())?;
            let established = current
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("CRD {} not established in 30 s", crd.name_any()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// A MachineDeployment of `replicas` sim machines at `version`, rolling
/// with `max_surge` / `max_unavailable`.
pub fn sample_deployment(
    name: &str,
    plugin: &str,
    cloud_url: &str,
    replicas: i32,
    version: &str,
) -> MachineDeployment {
    let labels = BTreeMap::from([("capstan.dev/pool".to_string(), name.to_string())]);
    let mut md = MachineDeployment::new(
        name,
        MachineDeploymentSpec {
            replicas,
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: MachineTemplateSpec {
                metadata: TemplateMeta {
                    labels,
                    annotations: BTreeMap::new(),
                },
                spec: MachineSpec {
                    version: Some(version.into()),
                    provider: ProviderRef {
                        plugin: plugin.into(),
                        config: serde_json::json!({ "endpoint": cloud_url, "instanceType": "small" }),
                    },
                    ..Default::default()
                },
            },
            rollout: Some(DeploymentRollout {
                after: None,
                strategy: Some(Strategy {
                    type_: Default::default(),
                    rolling_update: Some(RollingUpdate {
                        max_surge: Some(IntOrString::Int(1)),
                        max_unavailable: Some(IntOrString::Int(0)),
                    }),
                    in_place: None,
                }),
            }),
            ..Default::default()
        },
    );
    md.metadata.namespace = Some("default".into());
    md
}

/// `capstan controller` running as its own process against an [`Env`]'s
/// control plane; stopped with SIGTERM (then SIGKILL) when dropped.
#[derive(Debug)]
pub struct ControllerProcess {
    child: std::process::Child,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_url: String,
    /// The process's log file.
    pub log: std::path::PathBuf,
}

/// The `capstan` binary next to the running program (same target directory).
pub fn capstan_bin() -> Result<std::path::PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = me.parent().ok_or("no parent directory")?;
    // Test binaries live in target/<profile>/deps.
    for candidate in [dir.join("capstan"), dir.join("../capstan")] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "the capstan binary is not next to {}: build it first (`cargo build -p capstan`)",
        me.display()
    ))
}

impl ControllerProcess {
    /// Start `capstan controller` as the cluster admin with `extra` flags
    /// and environment.
    pub fn start(
        env: &Env,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Result<ControllerProcess, String> {
        let kubeconfig = env.control_plane.kubeconfig();
        Self::start_program(&capstan_bin()?, &["controller"], &kubeconfig, extra, vars)
    }

    /// Start `program` with `command` (for example `capstan controller`,
    /// or a benchmark's controller) on `kubeconfig`, with `extra` flags and
    /// environment; it serves metrics and health on a free loopback port.
    pub fn start_program(
        program: &std::path::Path,
        command: &[&str],
        kubeconfig: &std::path::Path,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Result<ControllerProcess, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let log = kubeconfig.with_file_name(format!("capstan-controller-{port}.log"));
        let mut cmd = std::process::Command::new(program);
        cmd.args(command)
            .arg(format!("--namespace={CAPSTAN_NAMESPACE}"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            .arg(format!("--health-addr=127.0.0.1:{port}"))
            .args(extra)
            .env("RUST_LOG", "info,kube=warn")
            // The test plugins are built here, unsigned: trusted as a
            // development directory (a test about trust passes its own).
            .env("CAPSTAN_ALLOW_UNSIGNED_DIRS", crate::plugin_dir());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        Self::spawn(cmd, port, log)
    }

    /// Start a prepared command (which must serve metrics and health on
    /// `127.0.0.1:port`) with its output going to `log`.
    pub fn spawn(
        mut cmd: std::process::Command,
        port: u16,
        log: std::path::PathBuf,
    ) -> Result<ControllerProcess, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| e.to_string())?;
        crate::detached(&mut cmd)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        Ok(ControllerProcess {
            child,
            metrics_url: format!("http://127.0.0.1:{port}"),
            log,
        })
    }

    /// The last `lines` lines of its log, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET path` on the metrics server: (status, body).
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut resp = agent
            .get(format!("{}{path}", self.metrics_url))
            .call()
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        Ok((status, body))
    }

    /// Wait until `/readyz` answers 200.
    pub fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                return Err(format!("capstan controller exited with {status}:\n{log}"));
            }
            if matches!(self.get("/readyz"), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("capstan controller not ready after {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sum of a metric family's samples (for example `capstan_api_writes_total`).
    pub fn metric_sum(&self, name: &str) -> Result<f64, String> {
        Ok(self.metric_samples(name)?.iter().map(|(_, v)| v).sum())
    }

    /// Every sample of a metric family as (labels, value), for example
    /// (`controller="machine",verb="patch_status"`, 1000).
    pub fn metric_samples(&self, name: &str) -> Result<Vec<(String, f64)>, String> {
        let (_, body) = self.get("/metrics")?;
        Ok(body
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                if !rest.starts_with(['{', ' ']) {
                    return None;
                }
                let (labels, value) = rest.rsplit_once(' ')?;
                let labels = labels.trim().trim_start_matches('{').trim_end_matches('}');
                Some((labels.to_string(), value.parse().ok()?))
            })
            .collect())
    }

    /// Kill with SIGKILL, as a crash or an evicted node would, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Send SIGTERM and return at once (see [`ControllerProcess::stop`]).
    pub fn terminate(&self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// The exit status, once the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stop with SIGTERM (graceful), then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
