//! Real instances: the simulated cloud boots a real Kubernetes node per
//! instance, from the instance's user data, without a container engine,
//! as Cluster API's test provider boots real kubelets in containers.
//!
//! Each instance is a process tree in namespaces of its own (`unshare`:
//! PID, mount, UTS and network). Its first process, `boot.sh`, gives it a
//! root of its own (copy-on-write over the host's /etc, /var/lib, /var/log,
//! /root and /usr/local, its own /run and /tmp), an address inside its own
//! network namespace, loopback relays to the API server ([`relay`]),
//! starts Debian's containerd (runc, the CNI bridge inside the namespace)
//! with the local images ([`images`]), and hands the user data to **real
//! cloud-init** as a NoCloud seed. The kubeadm bootstrap plugin's
//! cloud-config then runs **real `kubeadm join`**, which starts the
//! **real kubelet** (built from the control plane's source) through
//! `systemctl` as kubeadm's systemd drop-in does. Nothing is pulled and
//! nothing of the host changes: the kernel settings the kubelet wants are
//! shown to it read-only, and every pod runs in cgroups under the
//! instance's own.
//!
//! Power-off kills the instance's process tree (the PID namespace's first
//! process, so every process of it); termination also removes its
//! cgroups and its directory, so nothing of it is left behind. Start with
//! [`RealNodes::start`]; the simulated cloud calls [`RealNodes::boot`],
//! [`RealNodes::power_off`] and [`RealNodes::terminate`].

mod images;
mod relay;

pub use images::{BUSYBOX, PAUSE};

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How to boot real instances.
#[derive(Debug, Clone)]
pub struct RealNodeConfig {
    /// Where instances' directories, the images and the relays' sockets
    /// go (removed when the cloud stops).
    pub dir: PathBuf,
    /// Where `kubelet` and `kubeadm` are (`scripts/node-parts.sh`).
    pub node_bin: PathBuf,
    /// The API server, `https://127.0.0.1:<port>`.
    pub api_server: String,
    /// The unix socket the API server's egress selector sends its
    /// "cluster" traffic to (`--egress-selector-config-file`).
    pub egress_socket: PathBuf,
}

/// The boot script.
const BOOT: &str = include_str!("boot.sh");

/// What an instance is.
#[derive(Debug)]
struct Instance {
    /// `unshare`, whose child is the instance's first process.
    init: Option<Child>,
    index: u8,
    address: String,
    dir: PathBuf,
    cgroup: String,
}

#[derive(Debug, Default)]
struct State {
    instances: HashMap<String, Instance>,
    used: BTreeSet<u8>,
}

/// The real instances of one simulated cloud.
#[derive(Debug, Clone)]
pub struct RealNodes {
    config: Arc<RealNodeConfig>,
    /// A token unique to this cloud (its cgroups are named after it).
    token: String,
    state: Arc<Mutex<State>>,
    kubelets: relay::Kubelets,
    tasks: Arc<Vec<tokio::task::JoinHandle<()>>>,
}

/// What went wrong with a real instance.
pub type Error = String;

impl RealNodes {
    /// Check the parts (kubelet, kubeadm, containerd, cloud-init, socat,
    /// unshare), write the images and start the relays.
    pub async fn start(config: RealNodeConfig) -> Result<RealNodes, Error> {
        for (tool, hint) in [
            (config.node_bin.join("kubelet"), "scripts/node-parts.sh"),
            (config.node_bin.join("kubeadm"), "scripts/node-parts.sh"),
        ] {
            if !tool.exists() {
                return Err(format!("{} is missing: run {hint}", tool.display()));
            }
        }
        for tool in [
            "containerd",
            "ctr",
            "runc",
            "cloud-init",
            "socat",
            "unshare",
            "ip",
        ] {
            if which(tool).is_none() {
                return Err(format!(
                    "{tool} is not installed: run scripts/node-parts.sh"
                ));
            }
        }
        let images = config.dir.join("images");
        std::fs::create_dir_all(&images).map_err(|e| e.to_string())?;
        images::write(&images).map_err(|e| format!("cannot write the node images: {e}"))?;
        let api = config
            .api_server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let kubelets = relay::Kubelets::default();
        let tasks = vec![
            relay::api_server(&config.dir.join("api.sock"), api)
                .map_err(|e| format!("cannot start the API server relay: {e}"))?,
            relay::egress(&config.egress_socket, kubelets.clone())
                .map_err(|e| format!("cannot start the egress proxy: {e}"))?,
        ];
        let token = format!(
            "{:x}",
            sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(
                config.dir.display().to_string()
            ))
        )[..8]
            .to_string();
        Ok(RealNodes {
            config: Arc::new(config),
            token,
            state: Arc::default(),
            kubelets,
            tasks: Arc::new(tasks),
        })
    }

    /// Boot instance `id` from its user data (cloud-config, for cloud-init).
    pub fn boot(&self, id: &str, user_data: &[u8]) -> Result<(), Error> {
        let mut state = self.state.lock().map_err(|e| e.to_string())?;
        if state.instances.contains_key(id) {
            return Ok(());
        }
        let index = (0u8..250)
            .find(|i| !state.used.contains(i))
            .ok_or("250 real instances at once is the most this cloud boots")?;
        let dir = self.config.dir.join(id);
        let address = format!("10.200.0.{}", u16::from(index) + 2);
        let cgroup = format!("capstan-node-{}-{id}", self.token);
        self.prepare(id, &dir, index, &address, &cgroup, user_data)
            .map_err(|e| format!("cannot prepare instance {id}: {e}"))?;
        let console = std::fs::File::create(self.console(id)).map_err(|e| e.to_string())?;
        let port = self
            .config
            .api_server
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_string();
        let init = Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount",
                "--uts",
                "--net",
                "--propagation",
                "private",
                "--mount-proc",
                "bash",
            ])
            .arg(dir.join("image/boot.sh"))
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .env("NODE_DIR", &dir)
            .env("NODE_ID", id)
            .env("NODE_IP", &address)
            .env("NODE_INDEX", index.to_string())
            .env("NODE_CGROUP", &cgroup)
            .env("NODE_BIN", &self.config.node_bin)
            .env("API_PORT", port)
            .env("CLOUD_DIR", &self.config.dir)
            .stdin(Stdio::null())
            .stdout(console.try_clone().map_err(|e| e.to_string())?)
            .stderr(console)
            .spawn()
            .map_err(|e| format!("cannot start instance {id}: {e}"))?;
        state.used.insert(index);
        self.kubelets
            .lock()
            .map_err(|e| e.to_string())?
            .insert(address.clone(), dir.join("kubelet.sock"));
        state.instances.insert(
            id.to_string(),
            Instance {
                init: Some(init),
                index,
                address,
                dir,
                cgroup,
            },
        );
        Ok(())
    }

    /// The instance's directory: its seed, the files its image ships, the
    /// copy-on-write layers.
    fn prepare(
        &self,
        id: &str,
        dir: &Path,
        index: u8,
        address: &str,
        cgroup: &str,
        user_data: &[u8],
    ) -> std::io::Result<()> {
        let seed = dir.join("seed");
        let image = dir.join("image");
        std::fs::create_dir_all(&seed)?;
        std::fs::create_dir_all(&image)?;
        std::fs::write(seed.join("user-data"), user_data)?;
        std::fs::write(
            seed.join("meta-data"),
            format!("instance-id: {id}\nlocal-hostname: {id}\n"),
        )?;
        std::fs::write(image.join("boot.sh"), BOOT)?;
        for (name, text) in image_files(id, index, address, cgroup) {
            std::fs::write(image.join(name), text)?;
        }
        Ok(())
    }

    fn console(&self, id: &str) -> PathBuf {
        self.config.dir.join(format!("{id}.console.log"))
    }

    /// The instance's Node address, if it is live.
    pub fn address(&self, id: &str) -> Option<String> {
        let state = self.state.lock().ok()?;
        state.instances.get(id).map(|i| i.address.clone())
    }

    /// Power the instance off: every process of it is killed at once (its
    /// disk stays until [`RealNodes::terminate`]).
    pub fn power_off(&self, id: &str) {
        let init = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            state.instances.get_mut(id).and_then(|i| i.init.take())
        };
        if let Some(mut init) = init {
            let _ = init.kill();
            let _ = init.wait();
        }
    }

    /// Power off, then remove everything of the instance: its cgroups
    /// (once their processes are gone) and its directory.
    pub fn terminate(&self, id: &str) {
        self.power_off(id);
        let Some(instance) = self.state.lock().ok().and_then(|mut s| {
            let i = s.instances.remove(id)?;
            s.used.remove(&i.index);
            Some(i)
        }) else {
            return;
        };
        if let Ok(mut kubelets) = self.kubelets.lock() {
            kubelets.remove(&instance.address);
        }
        remove_cgroups(&instance.cgroup);
        let _ = std::fs::remove_dir_all(&instance.dir);
    }

    /// Send `signal` (`STOP`, `CONT`, `KILL`) to the instance's kubelet.
    pub fn signal_kubelet(&self, id: &str, signal: &str) -> Result<(), Error> {
        let cgroup = {
            let state = self.state.lock().map_err(|e| e.to_string())?;
            state
                .instances
                .get(id)
                .map(|i| i.cgroup.clone())
                .ok_or_else(|| format!("no real instance {id}"))?
        };
        let pids = processes(&cgroup);
        let kubelets: Vec<u32> = pids
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "kubelet")
            })
            .collect();
        if kubelets.is_empty() {
            return Err(format!("instance {id} runs no kubelet"));
        }
        for pid in kubelets {
            let status = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string())
                .status()
                .map_err(|e| e.to_string())?;
            if !status.success() {
                return Err(format!("kill -{signal} {pid} failed"));
            }
        }
        Ok(())
    }

    /// The processes of the instance (every pid in its cgroups), for tests
    /// that check nothing is left.
    pub fn processes(&self, id: &str) -> Vec<u32> {
        let cgroup = self
            .state
            .lock()
            .ok()
            .and_then(|s| s.instances.get(id).map(|i| i.cgroup.clone()))
            .unwrap_or_else(|| format!("capstan-node-{}-{id}", self.token));
        processes(&cgroup)
    }

    /// The cgroup name prefix of this cloud's instances.
    pub fn cgroup_prefix(&self) -> String {
        format!("capstan-node-{}-", self.token)
    }

    /// The end of the instance's console, containerd and kubelet logs, for
    /// a failing test's output.
    pub fn log_tail(&self, id: &str) -> String {
        let dir = self.config.dir.join(id);
        let mut out = String::new();
        for (name, path) in [
            ("console", self.console(id)),
            (
                "cloud-init",
                dir.join("upper/var/log/cloud-init-output.log"),
            ),
            ("kubelet", dir.join("upper/var/log/kubelet.log")),
            ("containerd", dir.join("upper/var/log/containerd.log")),
        ] {
            if let Ok(text) = std::fs::read_to_string(&path) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(25)..].join("\n");
                out.push_str(&format!("--- {id} {name} ---\n{tail}\n"));
            }
        }
        out
    }

    /// The live instances' ids.
    pub fn ids(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.instances.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Terminate every instance, stop the relays and remove the directory.
    pub fn shutdown(&self) {
        for id in self.ids() {
            self.terminate(&id);
        }
        for task in self.tasks.iter() {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&self.config.dir);
    }
}

/// Where `tool` is on the PATH (sbin included: tests run as root).
fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
}

/// The cgroup v1 hierarchies (`/sys/fs/cgroup/<controller>`).
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Every pid in `cgroup` and below, in any hierarchy.
fn processes(cgroup: &str) -> Vec<u32> {
    let mut pids = BTreeSet::new();
    for hierarchy in hierarchies() {
        let mut stack = vec![hierarchy.join(cgroup)];
        while let Some(dir) = stack.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .filter_map(|e| e.ok())
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
    }
    pids.into_iter().collect()
}

/// Remove `cgroup` and everything below it, in every hierarchy, once its
/// processes are gone (killed processes leave within moments).
fn remove_cgroups(cgroup: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes(cgroup).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for hierarchy in hierarchies() {
        let root = hierarchy.join(cgroup);
        // Deepest first: a cgroup with children cannot be removed.
        let mut dirs = Vec::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .filter_map(|e| e.ok())
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
            if dir.exists() {
                dirs.push(dir);
            }
        }
        for dir in dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The files the instance's image ships, written per instance.
fn image_files(id: &str, index: u8, address: &str, cgroup: &str) -> Vec<(&'static str, String)> {
    vec![
        ("systemctl", SYSTEMCTL.to_string()),
        ("kubelet-service", KUBELET_SERVICE.to_string()),
        ("containerd.toml", CONTAINERD.replace("@PAUSE@", PAUSE)),
        ("cni.conflist", CNI.replace("@INDEX@", &index.to_string())),
        (
            "kubelet.default",
            format!(
                "KUBELET_EXTRA_ARGS=\"--node-ip={address} --provider-id=sim://{id} --cgroup-root=/{cgroup} --pod-infra-container-image={PAUSE} --fail-swap-on=false --oom-score-adj=0\"\n"
            ),
        ),
        ("cloud.cfg", CLOUD_CFG.to_string()),
    ]
}

/// `systemctl`, as kubeadm uses it for the kubelet (status, is-enabled,
/// is-active, daemon-reload, start, restart, stop), in place of systemd.
const SYSTEMCTL: &str = r#"#!/bin/sh
# systemctl for the kubelet service only, as kubeadm drives it.
pidfile=/run/kubelet-service.pid
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
stop() {
    if running; then kill -TERM -- "-$(cat "$pidfile")" 2>/dev/null || true; fi
    rm -f "$pidfile"
}
start() {
    running && return 0
    setsid /usr/local/lib/capstan/kubelet-service </dev/null >/dev/null 2>&1 &
    echo $! > "$pidfile"
}
unit=${2%.service}
case "$1" in
    daemon-reload|enable|disable|reset-failed) exit 0 ;;
esac
if [ "$unit" != kubelet ]; then
    echo "Unit $unit.service could not be found."
    echo "   Loaded: not-found"
    exit 4
fi
case "$1" in
    status)
        echo "* kubelet.service - kubelet: The Kubernetes Node Agent"
        echo "   Loaded: loaded (/lib/systemd/system/kubelet.service; enabled)"
        if running; then echo "   Active: active (running)"; exit 0; fi
        echo "   Active: inactive (dead)"; exit 3 ;;
    is-enabled) echo enabled ;;
    is-active) if running; then echo active; else echo inactive; exit 3; fi ;;
    start) start ;;
    restart) stop; sleep 0.2; start ;;
    stop) stop ;;
    *) echo "systemctl $1: not supported here" >&2; exit 1 ;;
esac
"#;

/// kubeadm's kubelet drop-in (`10-kubeadm.conf`), restarted like
/// `Restart=always`.
const KUBELET_SERVICE: &str = r#"#!/bin/bash
KUBELET_KUBECONFIG_ARGS="--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
KUBELET_CONFIG_ARGS="--config=/var/lib/kubelet/config.yaml"
trap 'kill -TERM $child 2>/dev/null; exit 0' TERM
while :; do
    KUBELET_KUBEADM_ARGS="" KUBELET_EXTRA_ARGS=""
    [ -f /var/lib/kubelet/kubeadm-flags.env ] && . /var/lib/kubelet/kubeadm-flags.env
    [ -f /etc/default/kubelet ] && . /etc/default/kubelet
    # shellcheck disable=SC2086
    /usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS >>/var/log/kubelet.log 2>&1 &
    child=$!
    wait $child
    sleep 2
done
"#;

/// containerd: CRI with runc (cgroupfs) and the CNI plugins Debian ships.
const CONTAINERD: &str = r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "@PAUSE@"
  # Sandboxes get oom_score_adj -998, which only CAP_SYS_RESOURCE may set;
  # the machines this runs on may not grant it: keep it at containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
"#;

/// The pod network: a bridge inside the instance's network namespace.
const CNI: &str = r#"{
  "cniVersion": "0.4.0",
  "name": "capstan",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.@INDEX@.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

/// cloud-init's configuration on the instance: the NoCloud seed, and the
/// modules a bootstrap cloud-config uses (files, users, commands) and
/// nothing that would touch the host (disks, network, hostname, packages).
const CLOUD_CFG: &str = r#"datasource_list: [NoCloud]
network: {config: disabled}
preserve_hostname: true
manage_etc_hosts: false
users: []
disable_root: false
cloud_init_modules: [write_files, users_groups]
cloud_config_modules: [runcmd]
cloud_final_modules: [scripts_user, final_message]
system_info:
  distro: debian
  paths: {cloud_dir: /var/lib/cloud/, templates_dir: /etc/cloud/templates/}
"#;
