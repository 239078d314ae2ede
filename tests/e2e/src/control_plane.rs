//! A real Kubernetes control plane for tests: Debian's etcd and the
//! kube-apiserver, kube-controller-manager and kube-scheduler built by
//! `scripts/control-plane.sh`, on loopback with free ports and a private
//! data directory. [`ControlPlane::start`] waits until the API server is
//! ready; dropping the value stops every process (also when a test panics)
//! and removes the directory.
//!
//! It is set up as `kubeadm init` sets a cluster up: a cluster CA
//! ([`ControlPlane::ca_pem`]) signs the API server's serving certificate
//! and the client certificates the controller-manager issues; bootstrap
//! token authentication, `Node,RBAC` authorization with NodeRestriction
//! admission, the controller-manager's CSR approving and signing,
//! bootstrap signer and token cleaner, `kube-public/cluster-info` and
//! kubeadm's bootstrapper RBAC ([`KUBEADM_BOOTSTRAP_RBAC`]), so a machine's
//! kubelet can join with a bootstrap token and TLS bootstrapping.
//! Administrators authenticate with static bearer tokens (`system:masters`).
//! A kubeconfig is written next to the data ([`ControlPlane::kubeconfig`]).
//! kube-controller-manager runs the controllers that give workloads their
//! real semantics ([`CONTROLLERS`]: garbage collection, namespaces, service
//! accounts, Deployments, ReplicaSets, DaemonSets, PodDisruptionBudgets, the
//! node lifecycle, pod GC), and kube-scheduler binds pods to Nodes. The
//! node-lifecycle timings are [`ControlPlaneOptions`], short by default so
//! tests see a silent Node go `Ready=Unknown` in seconds.

pub mod reuse;

pub use reuse::Baseline;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where `scripts/control-plane.sh` caches the binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CAPSTAN_K8S_BIN") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("capstan/kubernetes-1.20.2/bin")
}

/// Where `kubelet` and `kubeadm` are, for real nodes: `CAPSTAN_NODE_BIN`,
/// else the cache `scripts/node-parts.sh` fills.
pub fn node_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CAPSTAN_NODE_BIN") {
        return PathBuf::from(dir);
    }
    bin_dir().with_file_name("node-bin")
}

/// The kube-controller-manager controllers the control plane runs.
pub const CONTROLLERS: &str = "clusterrole-aggregation,garbagecollector,namespace,serviceaccount,serviceaccount-token,deployment,replicaset,daemonset,disruption,nodelifecycle,podgc,csrapproving,csrsigning,csrcleaner,bootstrapsigner,tokencleaner";

/// What `kubeadm init` sets up for joining nodes (its `bootstrap-token`
/// phase): bootstrap tokens of kubeadm's group may create node client
/// CSRs, which are approved automatically (and so are nodes' renewals),
/// and anyone may read `kube-public/cluster-info`.
pub const KUBEADM_BOOTSTRAP_RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'kubeadm:kubelet-bootstrap'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'system:node-bootstrapper'}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:bootstrappers:kubeadm:default-node-token'}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'kubeadm:node-autoapprove-bootstrap'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'system:certificates.k8s.io:certificatesigningrequests:nodeclient'}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:bootstrappers:kubeadm:default-node-token'}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'kubeadm:node-autoapprove-certificate-rotation'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'system:certificates.k8s.io:certificatesigningrequests:selfnodeclient'}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:nodes'}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: 'kubeadm:bootstrap-signer-clusterinfo', namespace: kube-public}
rules: [{apiGroups: [''], resources: [configmaps], resourceNames: [cluster-info], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'kubeadm:bootstrap-signer-clusterinfo', namespace: kube-public}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: 'kubeadm:bootstrap-signer-clusterinfo'}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: 'system:anonymous'}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: 'kubeadm:nodes-kubeadm-config', namespace: kube-system}
rules: [{apiGroups: [''], resources: [configmaps], resourceNames: [kubeadm-config], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'kubeadm:nodes-kubeadm-config', namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: 'kubeadm:nodes-kubeadm-config'}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:bootstrappers:kubeadm:default-node-token'}
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:nodes'}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: 'kubeadm:kubelet-config-1.20', namespace: kube-system}
rules: [{apiGroups: [''], resources: [configmaps], resourceNames: [kubelet-config-1.20], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'kubeadm:kubelet-config-1.20', namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: 'kubeadm:kubelet-config-1.20'}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:bootstrappers:kubeadm:default-node-token'}
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:nodes'}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: 'kube-proxy', namespace: kube-system}
rules: [{apiGroups: [''], resources: [configmaps], resourceNames: [kube-proxy], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'kube-proxy', namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: 'kube-proxy'}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:bootstrappers:kubeadm:default-node-token'}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: 'kubeadm:get-nodes'}
rules: [{apiGroups: [''], resources: [nodes], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'kubeadm:get-nodes'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kubeadm:get-nodes'}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: 'system:bootstrappers:kubeadm:default-node-token'}]
";

/// The configuration `kubeadm init` uploads for `kubeadm join` to read
/// (kubeadm 1.20: `kubeadm-config`, `kubelet-config-1.20`, `kube-proxy` in
/// kube-system), for a cluster whose API server is `endpoint`. The
/// kubelet's is kubeadm's default but for heartbeats every 2 s (the test
/// control plane's node-monitor grace period is 10 s).
pub fn kubeadm_join_config(endpoint: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata: {{name: kubeadm-config, namespace: kube-system}}
data:
  ClusterConfiguration: |
    apiVersion: kubeadm.k8s.io/v1beta2
    kind: ClusterConfiguration
    kubernetesVersion: v1.20.2
    clusterName: kubernetes
    controlPlaneEndpoint: {endpoint}
    certificatesDir: /etc/kubernetes/pki
    imageRepository: k8s.gcr.io
    networking: {{dnsDomain: cluster.local, serviceSubnet: 10.96.0.0/24, podSubnet: 10.244.0.0/16}}
  ClusterStatus: |
    apiVersion: kubeadm.k8s.io/v1beta2
    kind: ClusterStatus
    apiEndpoints: {{}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: kubelet-config-1.20, namespace: kube-system}}
data:
  kubelet: |
    apiVersion: kubelet.config.k8s.io/v1beta1
    kind: KubeletConfiguration
    authentication:
      anonymous: {{enabled: false}}
      webhook: {{cacheTTL: 0s, enabled: true}}
      x509: {{clientCAFile: /etc/kubernetes/pki/ca.crt}}
    authorization:
      mode: Webhook
      webhook: {{cacheAuthorizedTTL: 0s, cacheUnauthorizedTTL: 0s}}
    cgroupDriver: cgroupfs
    clusterDNS: [10.96.0.10]
    clusterDomain: cluster.local
    healthzBindAddress: 127.0.0.1
    healthzPort: 10248
    rotateCertificates: true
    staticPodPath: /etc/kubernetes/manifests
    resolvConf: /etc/resolv.conf
    nodeLeaseDurationSeconds: 8
    nodeStatusUpdateFrequency: 2s
    nodeStatusReportFrequency: 10s
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: kube-proxy, namespace: kube-system}}
data:
  config.conf: |
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    clusterCIDR: 10.244.0.0/16
    mode: iptables
"
    )
}

/// Timings of the node-lifecycle controller and the API server's default
/// tolerations. Kubernetes' own defaults are 5 s / 40 s / 60 s / 300 s;
/// the defaults here are short so that tests run in seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneOptions {
    /// `--node-monitor-period`: how often Node health is checked.
    pub node_monitor_period: Duration,
    /// `--node-monitor-grace-period`: how long a Node may go without a
    /// heartbeat (Lease renewal or status post) before it is `Ready=Unknown`.
    pub node_monitor_grace_period: Duration,
    /// `--node-startup-grace-period`: the same for a Node never yet Ready.
    pub node_startup_grace_period: Duration,
    /// `--default-not-ready-toleration-seconds` and
    /// `--default-unreachable-toleration-seconds` (API server): how long pods
    /// stay on a not-ready or unreachable Node before eviction.
    pub pod_toleration_seconds: u32,
    /// Only etcd and the API server (no controller manager, no scheduler):
    /// a second cluster that only has to hold objects, such as the workload
    /// cluster an Addon targets.
    pub api_only: bool,
    /// Keep an audit log of every write (`audit_writes`), with who made it
    /// and when the API server received it.
    pub audit: bool,
    /// Send the API server's traffic to kubelets as HTTP CONNECT over this
    /// unix socket (real nodes of the simulated cloud live in network
    /// namespaces of their own; its egress proxy reaches them).
    pub egress_socket: Option<PathBuf>,
    /// Keep objects in another control plane's etcd (its client URL, see
    /// [`ControlPlane::etcd_url`]) under this key prefix instead of an
    /// etcd of its own: many API servers on one etcd, as a scale run of
    /// many workload clusters wants.
    pub shared_etcd: Option<(String, String)>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        ControlPlaneOptions {
            node_monitor_period: Duration::from_secs(1),
            node_monitor_grace_period: Duration::from_secs(10),
            node_startup_grace_period: Duration::from_secs(30),
            pod_toleration_seconds: 30,
            api_only: false,
            audit: false,
            egress_socket: None,
            shared_etcd: None,
        }
    }
}

impl ControlPlaneOptions {
    /// For runs whose Nodes never heartbeat (scale benchmarks with the
    /// simulated kubelet's heartbeats off): Nodes stay as registered.
    pub fn without_heartbeats() -> Self {
        let hour = Duration::from_secs(3600);
        ControlPlaneOptions {
            node_monitor_grace_period: hour,
            node_startup_grace_period: hour,
            ..Default::default()
        }
    }
}

/// The user name of [`ControlPlane::second_admin_kubeconfig`].
pub const SECOND_ADMIN: &str = "capstan-admin-2";
/// A user only workload-cluster kubeconfigs use
/// ([`ControlPlane::workload_kubeconfig_inline`]), so the writes a controller
/// makes through one can be told apart in the audit log.
pub const WORKLOAD_USER: &str = "capstan-workload";
/// A user of no group ([`ControlPlane::minimal_kubeconfig_inline`]): what
/// it may do is what RBAC bound to it says, nothing more.
pub const MINIMAL_USER: &str = "capstan-minimal";

/// The API server's audit flags: writes, and lists of pods and
/// VolumeAttachments (how often a deleting machine reads its Node's), at
/// metadata level, to `audit.log` in `dir`.
fn audit_args(dir: &std::path::Path, on: bool) -> Result<Vec<String>, String> {
    if !on {
        return Ok(vec![]);
    }
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n- level: Metadata\n  verbs: [list]\n  resources: [{group: \"\", resources: [pods]}, {group: storage.k8s.io, resources: [volumeattachments]}]\n- level: None\n",
    )
    .map_err(|e| e.to_string())?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", dir.join("audit.log").display()),
    ])
}

/// A running etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
#[derive(Debug)]
pub struct ControlPlane {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Bearer token of a cluster admin.
    pub token: String,
    /// PEM of the cluster CA: it signed the API server's serving
    /// certificate and signs nodes' client certificates.
    pub ca_pem: Vec<u8>,
    /// The timings it runs with.
    pub options: ControlPlaneOptions,
    dir: PathBuf,
    ports: Ports,
    children: Mutex<Vec<(&'static str, Child)>>,
    /// What a reset puts back when it is dropped ([`reuse`]); `None` stops it.
    baseline: Mutex<Option<(reuse::Snapshot, Baseline)>>,
}

/// The loopback ports it listens on, kept across [`ControlPlane::restart_empty`].
#[derive(Debug, Clone, Copy)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    secure: u16,
}

/// A free loopback port (free now; a race with other processes is possible but rare).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn spawn(
    name: &'static str,
    cmd: &mut Command,
    log: &Path,
) -> Result<(&'static str, Child), String> {
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    crate::detached(cmd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map(|c| (name, c))
        .map_err(|e| format!("cannot start {name}: {e}"))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// A cluster CA (`ca.crt`, `ca.key`) and an API server serving certificate
/// it signed (`apiserver.crt`, `apiserver.key`, for loopback and the
/// in-cluster names), in `certs`, as `kubeadm init` makes them (ECDSA P-256
/// keys, quick to make); returns the CA's PEM.
fn cluster_ca(certs: &Path) -> Result<Vec<u8>, String> {
    let file = |name: &str| certs.join(name);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(Command::new("openssl")
        .args(["req", "-x509"])
        .args(ec)
        .arg("-keyout")
        .arg(file("ca.key"))
        .arg("-out")
        .arg(file("ca.crt"))
        .args(["-days", "3650", "-subj", "/CN=kubernetes"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args([
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ]))?;
    run(Command::new("openssl")
        .arg("req")
        .args(ec)
        .arg("-keyout")
        .arg(file("apiserver.key"))
        .arg("-out")
        .arg(file("apiserver.csr"))
        .args(["-subj", "/CN=kube-apiserver"]))?;
    std::fs::write(
        file("apiserver.ext"),
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    .map_err(|e| e.to_string())?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-in"])
        .arg(file("apiserver.csr"))
        .arg("-CA")
        .arg(file("ca.crt"))
        .arg("-CAkey")
        .arg(file("ca.key"))
        .args(["-CAcreateserial", "-days", "365", "-extfile"])
        .arg(file("apiserver.ext"))
        .arg("-out")
        .arg(file("apiserver.crt")))?;
    // The API server's client certificate for kubelets (logs, exec), as
    // kubeadm makes it: a cluster admin's.
    run(Command::new("openssl")
        .arg("req")
        .args(ec)
        .arg("-keyout")
        .arg(file("apiserver-kubelet-client.key"))
        .arg("-out")
        .arg(file("apiserver-kubelet-client.csr"))
        .args([
            "-subj",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
        ]))?;
    std::fs::write(
        file("apiserver-kubelet-client.ext"),
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    .map_err(|e| e.to_string())?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-in"])
        .arg(file("apiserver-kubelet-client.csr"))
        .arg("-CA")
        .arg(file("ca.crt"))
        .arg("-CAkey")
        .arg(file("ca.key"))
        .args(["-CAcreateserial", "-days", "365", "-extfile"])
        .arg(file("apiserver-kubelet-client.ext"))
        .arg("-out")
        .arg(file("apiserver-kubelet-client.crt")))?;
    std::fs::read(file("ca.crt")).map_err(|e| format!("cannot read the cluster CA: {e}"))
}

/// The API server's egress selector: its traffic to the cluster (kubelets:
/// logs, exec) as HTTP CONNECT over `socket`, where the simulated cloud
/// reaches real instances inside their own network namespaces.
fn egress_args(dir: &std::path::Path, socket: Option<&Path>) -> Result<Vec<String>, String> {
    let Some(socket) = socket else {
        return Ok(vec![]);
    };
    let config = dir.join("egress-selector.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
            socket.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    Ok(vec![format!(
        "--egress-selector-config-file={}",
        config.display()
    )])
}

/// A Go duration flag value.
fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl ControlPlane {
    /// [`ControlPlane::start_with`] the default (test) timings.
    pub fn start() -> Result<ControlPlane, String> {
        ControlPlane::start_with(ControlPlaneOptions::default())
    }

    /// Start etcd and kube-apiserver, wait (up to 60 s) until it is ready,
    /// then start kube-controller-manager and kube-scheduler.
    ///
    /// Ports are picked free, then released for the process to bind; a test
    /// running in parallel can take one in between, so a start that fails
    /// with "address already in use" is tried again with new ports.
    ///
    /// An idle control plane a test before left with the same options is
    /// taken instead, if there is one ([`reuse`]).
    pub fn start_with(options: ControlPlaneOptions) -> Result<ControlPlane, String> {
        if let Some(plane) = ControlPlane::take_idle(&options, Baseline::Bare)? {
            return Ok(plane);
        }
        let mut attempt = 1;
        loop {
            match ControlPlane::try_start(options.clone()) {
                Err(e) if e.contains("address already in use") && attempt < 3 => attempt += 1,
                result => return result,
            }
        }
    }

    fn try_start(options: ControlPlaneOptions) -> Result<ControlPlane, String> {
        let bin = bin_dir();
        for tool in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
        ] {
            if !bin.join(tool).exists() {
                return Err(format!(
                    "{} is missing: run scripts/control-plane.sh first (it builds and caches it)",
                    bin.join(tool).display()
                ));
            }
        }
        let dir = std::env::temp_dir().join(format!(
            "capstan-control-plane-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(dir.join("certs")).map_err(|e| e.to_string())?;
        let mut plane = ControlPlane {
            url: String::new(),
            token: format!("capstan-test-{:x}", std::process::id()),
            ca_pem: Vec::new(),
            options,
            dir: dir.clone(),
            ports: Ports {
                etcd_client: free_port(),
                etcd_peer: free_port(),
                secure: free_port(),
            },
            children: Mutex::new(Vec::new()),
            baseline: Mutex::new(None),
        };
        plane.url = format!("https://127.0.0.1:{}", plane.ports.secure);

        let key = dir.join("sa.key");
        let public = dir.join("sa.pub");
        run(Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048"))?;
        run(Command::new("openssl")
            .arg("rsa")
            .arg("-in")
            .arg(&key)
            .arg("-pubout")
            .arg("-out")
            .arg(&public))?;
        plane.ca_pem = cluster_ca(&dir.join("certs"))?;
        std::fs::write(
            dir.join("tokens.csv"),
            format!(
                "{0},capstan-admin,capstan-admin,system:masters\n{0}-2,{SECOND_ADMIN},{SECOND_ADMIN},system:masters\n{0}-3,{WORKLOAD_USER},{WORKLOAD_USER},system:masters\n{0}-4,{MINIMAL_USER},{MINIMAL_USER}\n",
                plane.token
            ),
        )
        .map_err(|e| e.to_string())?;
        plane.run_processes()?;
        Ok(plane)
    }

    /// A restore into a fresh API server: every process stopped, etcd's
    /// data removed, and the control plane started again on the same
    /// endpoint with the same CA, keys and admin tokens (as a control
    /// plane rebuilt from its PKI backup), so kubelets' certificates and
    /// kubeconfigs still work and only the stored objects are gone.
    pub fn restart_empty(&self) -> Result<(), String> {
        self.stop_processes();
        std::fs::remove_dir_all(self.dir.join("etcd")).map_err(|e| e.to_string())?;
        self.run_processes()
    }

    fn stop_processes(&self) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        for (_, child) in children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        children.clear();
    }

    /// Start etcd and the API server, wait until it is ready, publish what
    /// joining needs, then start the controller-manager and scheduler.
    fn run_processes(&self) -> Result<(), String> {
        let bin = bin_dir();
        let apiserver = bin.join("kube-apiserver");
        let (dir, options) = (&self.dir, &self.options);
        let push = |child| {
            self.children
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(child)
        };
        let Ports {
            etcd_client: client,
            etcd_peer: peer,
            secure,
        } = self.ports;
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let (etcd_url, etcd_prefix) = match &options.shared_etcd {
            Some((url, prefix)) => (url.clone(), prefix.clone()),
            None => (etcd_url, "/registry".to_string()),
        };
        if options.shared_etcd.is_none() {
            push(spawn(
                "etcd",
                Command::new("etcd")
                    .arg("--name=capstan")
                    .arg(format!("--data-dir={}", dir.join("etcd").display()))
                    .arg(format!("--listen-client-urls={etcd_url}"))
                    .arg(format!("--advertise-client-urls={etcd_url}"))
                    .arg(format!("--listen-peer-urls={peer_url}"))
                    .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                    .arg(format!("--initial-cluster=capstan={peer_url}")),
                &dir.join("etcd.log"),
            )?);
        }
        let (key, public) = (dir.join("sa.key"), dir.join("sa.pub"));
        let certs = dir.join("certs");
        let tokens = dir.join("tokens.csv");
        push(spawn(
            "kube-apiserver",
            Command::new(&apiserver)
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg(format!("--etcd-prefix={etcd_prefix}"))
                .arg("--bind-address=127.0.0.1")
                .arg("--advertise-address=127.0.0.1")
                .arg(format!("--secure-port={secure}"))
                .arg(format!("--cert-dir={}", certs.display()))
                .arg(format!(
                    "--tls-cert-file={}",
                    certs.join("apiserver.crt").display()
                ))
                .arg(format!(
                    "--tls-private-key-file={}",
                    certs.join("apiserver.key").display()
                ))
                .arg(format!(
                    "--client-ca-file={}",
                    certs.join("ca.crt").display()
                ))
                .arg("--enable-bootstrap-token-auth=true")
                .arg(format!("--token-auth-file={}", tokens.display()))
                .args(audit_args(dir, options.audit)?)
                .args(egress_args(dir, options.egress_socket.as_deref())?)
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    certs.join("apiserver-kubelet-client.crt").display()
                ))
                .arg(format!(
                    "--kubelet-client-key={}",
                    certs.join("apiserver-kubelet-client.key").display()
                ))
                .arg("--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname")
                .arg("--authorization-mode=Node,RBAC")
                .arg("--enable-admission-plugins=NodeRestriction")
                .arg("--service-cluster-ip-range=10.96.0.0/24")
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!("--service-account-key-file={}", public.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    key.display()
                ))
                .arg(format!(
                    "--default-not-ready-toleration-seconds={}",
                    options.pod_toleration_seconds
                ))
                .arg(format!(
                    "--default-unreachable-toleration-seconds={}",
                    options.pod_toleration_seconds
                ))
                .arg("--enable-priority-and-fairness=false"),
            &dir.join("kube-apiserver.log"),
        )?);
        self.wait_ready(Duration::from_secs(60))?;
        self.write_kubeconfig()?;
        self.publish_cluster_info()?;
        let baseline = if reuse::reusable(options) {
            Some((reuse::snapshot(&self.etcd_url())?, Baseline::Bare))
        } else {
            None
        };
        *self.baseline.lock().unwrap_or_else(|p| p.into_inner()) = baseline;
        self.start_controllers()
    }

    /// Start kube-controller-manager and kube-scheduler (unless `api_only`).
    fn start_controllers(&self) -> Result<(), String> {
        let (dir, options) = (&self.dir, &self.options);
        if options.api_only {
            return Ok(());
        }
        let bin = bin_dir();
        let certs = dir.join("certs");
        let key = dir.join("sa.key");
        let push = |child| {
            self.children
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(child)
        };
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig().display());
        push(spawn(
            "kube-controller-manager",
            Command::new(bin.join("kube-controller-manager"))
                .arg(&kubeconfig)
                .arg(format!("--controllers={CONTROLLERS}"))
                // Signs nodes' client certificates (TLS bootstrapping).
                .arg(format!(
                    "--cluster-signing-cert-file={}",
                    certs.join("ca.crt").display()
                ))
                .arg(format!(
                    "--cluster-signing-key-file={}",
                    certs.join("ca.key").display()
                ))
                // Signs the service-account token Secrets that pods mount.
                .arg(format!(
                    "--service-account-private-key-file={}",
                    key.display()
                ))
                .arg(format!(
                    "--node-monitor-period={}",
                    go_duration(options.node_monitor_period)
                ))
                .arg(format!(
                    "--node-monitor-grace-period={}",
                    go_duration(options.node_monitor_grace_period)
                ))
                .arg(format!(
                    "--node-startup-grace-period={}",
                    go_duration(options.node_startup_grace_period)
                ))
                .arg("--leader-elect=false")
                .arg("--port=0")
                .arg("--secure-port=0")
                .arg("--kube-api-qps=100")
                .arg("--kube-api-burst=200")
                .arg("--concurrent-gc-syncs=5"),
            &dir.join("kube-controller-manager.log"),
        )?);
        push(spawn(
            "kube-scheduler",
            Command::new(bin.join("kube-scheduler"))
                .arg(&kubeconfig)
                .arg("--leader-elect=false")
                .arg("--port=0")
                .arg("--secure-port=0")
                .arg("--kube-api-qps=100")
                .arg("--kube-api-burst=200"),
            &dir.join("kube-scheduler.log"),
        )?);
        Ok(())
    }

    /// Its etcd's client URL (for [`ControlPlaneOptions::shared_etcd`]).
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }

    /// The process id of one of its processes (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`), for CPU and memory figures.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| c.id())
    }

    fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let exited = self
                .children
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter_mut()
                .find_map(|(name, child)| Some((*name, child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                return Err(format!("{name} exited with {status}{}", self.log_tails()));
            }
            if matches!(self.get("/readyz"), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let probe = self.get("/readyz").err().unwrap_or_default();
                return Err(format!(
                    "kube-apiserver not ready after {within:?} (last probe: {probe}){}",
                    self.log_tails()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of each process's log, for error messages (the
    /// directory is removed when the control plane is dropped).
    fn log_tails(&self) -> String {
        let mut out = String::new();
        for log in [
            "etcd.log",
            "kube-apiserver.log",
            "kube-controller-manager.log",
            "kube-scheduler.log",
        ] {
            let text = std::fs::read_to_string(self.dir.join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            out.push_str(&format!("\n--- {log} (last lines) ---\n{tail}"));
        }
        out
    }

    /// Path of a kubeconfig for the admin (kubectl, kube-rs, `capstan`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// Path of a kubeconfig for a second admin user ([`SECOND_ADMIN`]), so
    /// that two processes' requests can be told apart in the audit log.
    pub fn second_admin_kubeconfig(&self) -> Result<PathBuf, String> {
        let path = self.dir.join("kubeconfig-2");
        let text = std::fs::read_to_string(self.kubeconfig()).map_err(|e| e.to_string())?;
        std::fs::write(
            &path,
            text.replace(&self.token, &format!("{}-2", self.token)),
        )
        .map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// Every write the API server audited (with `audit` on): one JSON
    /// object per request (`verb`, `user.username`, `objectRef`,
    /// `requestReceivedTimestamp`, `responseStatus.code`).
    pub fn audit_writes(&self) -> Result<Vec<serde_json::Value>, String> {
        const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
        Ok(self
            .audit_entries()?
            .into_iter()
            .filter(|e| e["verb"].as_str().is_some_and(|v| WRITES.contains(&v)))
            .collect())
    }

    /// The audit log's lists of `resource` (`pods` or `volumeattachments`,
    /// with `audit: true`), each with its `requestURI` (the field selector)
    /// and `user`.
    pub fn audit_lists(&self, resource: &str) -> Result<Vec<serde_json::Value>, String> {
        Ok(self
            .audit_entries()?
            .into_iter()
            .filter(|e| e["verb"] == "list" && e["objectRef"]["resource"] == resource)
            .collect())
    }

    fn audit_entries(&self) -> Result<Vec<serde_json::Value>, String> {
        let text = std::fs::read_to_string(self.dir.join("audit.log"))
            .map_err(|e| format!("no audit log (start with audit: true): {e}"))?;
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    }

    fn write_kubeconfig(&self) -> Result<(), String> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: capstan\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {}\ncontexts:\n- name: capstan\n  context:\n    cluster: capstan\n    user: admin\ncurrent-context: capstan\n",
            self.url,
            self.dir.join("certs/ca.crt").display(),
            self.token
        );
        std::fs::write(self.kubeconfig(), text)
            .map_err(|e| format!("cannot write the kubeconfig: {e}"))
    }

    /// `kube-public/cluster-info` as `kubeadm init` publishes it (the API
    /// server and the cluster CA, which the bootstrap signer signs with each
    /// bootstrap token), and kubeadm's bootstrapper RBAC.
    fn publish_cluster_info(&self) -> Result<(), String> {
        use base64::Engine;
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts: null\ncurrent-context: \"\"\npreferences: {{}}\nusers: null\n",
            self.url,
            base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
        );
        let config_map = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": kubeconfig},
        });
        self.kubectl(&["apply", "-f", "-"], Some(&config_map.to_string()))?;
        self.kubectl(&["apply", "-f", "-"], Some(KUBEADM_BOOTSTRAP_RBAC))?;
        let endpoint = self.url.trim_start_matches("https://");
        self.kubectl(&["apply", "-f", "-"], Some(&kubeadm_join_config(endpoint)))?;
        // Discovered before any CRD exists: forget it.
        let _ = std::fs::remove_dir_all(self.dir.join("kubectl-cache"));
        Ok(())
    }

    /// A self-contained kubeconfig for the admin (the CA inline), as Cluster
    /// API keeps in a cluster's `<cluster>-kubeconfig` Secret.
    pub fn kubeconfig_inline(&self) -> String {
        use base64::Engine;
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: workload\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    token: {}\ncontexts:\n- name: workload\n  context:\n    cluster: workload\n    user: admin\ncurrent-context: workload\n",
            self.url,
            base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
            self.token
        )
    }

    /// [`Self::kubeconfig_inline`] as [`WORKLOAD_USER`]: this cluster as a
    /// workload cluster whose writes the audit log tells apart.
    pub fn workload_kubeconfig_inline(&self) -> String {
        self.kubeconfig_inline()
            .replace(&self.token, &format!("{}-3", self.token))
    }

    /// [`Self::kubeconfig_inline`] as [`MINIMAL_USER`], a user with no
    /// rights but those bound to it.
    pub fn minimal_kubeconfig_inline(&self) -> String {
        self.kubeconfig_inline()
            .replace(&self.token, &format!("{}-4", self.token))
    }

    /// Where the simulated kubelet reaches this API server (as the admin).
    pub fn kube_target(&self) -> capstan_sim_cloud::KubeTarget {
        capstan_sim_cloud::KubeTarget {
            url: self.url.clone(),
            token: self.token.clone(),
            ca_pem: self.ca_pem.clone(),
        }
    }

    /// A kube-rs client for the admin, configured as `capstan controller`'s
    /// is (kube-rs retries 429, 503 and 504 answers, up to 15 times over
    /// about five minutes).
    pub async fn client(&self) -> Result<kube::Client, String> {
        self.client_with(true).await
    }

    /// A kube-rs client for the admin that reports 429, 503 and 504 answers
    /// at once: what a test needs to see an eviction refused by a
    /// disruption budget.
    pub async fn client_without_retries(&self) -> Result<kube::Client, String> {
        self.client_with(false).await
    }

    async fn client_with(&self, retries: bool) -> Result<kube::Client, String> {
        let mut config = self.config().await?;
        config.default_retry = retries;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    }

    /// How to reach this control plane as the admin (what the controllers get).
    pub async fn config(&self) -> Result<kube::Config, String> {
        let kc =
            kube::config::Kubeconfig::read_from(self.kubeconfig()).map_err(|e| e.to_string())?;
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())
    }

    /// Run the cached `kubectl` against this control plane; returns stdout,
    /// or stderr as the error.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        // Its own discovery cache: one shared with another control plane
        // that had the same port, or filled before the CRDs were installed,
        // would not know `md` or `ma`.
        let mut child = Command::new(bin_dir().join("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig().display()))
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kubectl-cache").display()
            ))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(input.as_bytes())
                .map_err(|e| e.to_string())?;
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// An HTTPS client trusting the API server. Its certificate file holds
    /// the serving certificate and the CA that signed it: trust them all.
    pub fn agent(&self) -> Result<ureq::Agent, String> {
        capstan_sim_cloud::agent_trusting(&self.ca_pem)
    }

    /// `GET path` as the admin: (status, body as JSON or null).
    pub fn get(&self, path: &str) -> Result<(u16, serde_json::Value), String> {
        let (status, text) = self.get_text(path)?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        ))
    }

    /// `GET path` as the admin: (status, body as text).
    pub fn get_text(&self, path: &str) -> Result<(u16, String), String> {
        let mut resp = self
            .agent()?
            .get(format!("{}{path}", self.url))
            .header("authorization", format!("Bearer {}", self.token))
            .call()
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        Ok((status, text))
    }

    /// Requests the API server answered with 403 Forbidden so far (its
    /// `apiserver_request_total` metric).
    pub fn forbidden_requests(&self) -> Result<f64, String> {
        let (_, text) = self.get_text("/metrics")?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("code=\"403\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

impl ControlPlane {
    /// An idle control plane with these options that was reset to
    /// `baseline`, with new controllers; `None` if no test left one.
    pub fn take_idle(
        options: &ControlPlaneOptions,
        baseline: Baseline,
    ) -> Result<Option<ControlPlane>, String> {
        let Some(idle) = reuse::take(options, baseline) else {
            return Ok(None);
        };
        let plane = ControlPlane {
            url: idle.url,
            token: idle.token,
            ca_pem: idle.ca_pem,
            options: idle.options,
            dir: idle.dir,
            ports: idle.ports,
            children: Mutex::new(idle.children),
            baseline: Mutex::new(Some((idle.snapshot, idle.baseline))),
        };
        plane.start_controllers()?;
        Ok(Some(plane))
    }

    /// What the control plane holds now becomes what a reset puts back
    /// ([`reuse`]), taken again as `baseline` (a plane already there
    /// keeps its snapshot).
    pub fn keep_as_baseline(&self, baseline: Baseline) -> Result<(), String> {
        let mut kept = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        match kept.as_ref() {
            Some((_, now)) if *now == baseline => Ok(()),
            Some(_) => {
                *kept = Some((reuse::snapshot(&self.etcd_url())?, baseline));
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let kept = self
            .baseline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((snapshot, baseline)) = kept {
            let children =
                std::mem::take(&mut *self.children.lock().unwrap_or_else(|p| p.into_inner()));
            reuse::put_back_later(reuse::Idle {
                url: std::mem::take(&mut self.url),
                token: std::mem::take(&mut self.token),
                ca_pem: std::mem::take(&mut self.ca_pem),
                options: self.options.clone(),
                dir: std::mem::take(&mut self.dir),
                ports: self.ports,
                children,
                snapshot,
                baseline,
            });
            return;
        }
        self.stop_processes();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
