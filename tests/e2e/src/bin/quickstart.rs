//! `capstan-quickstart`: everything on one machine, with visible progress.
//!
//! Starts a local control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler), installs the CRDs, starts the simulated cloud (whose
//! kubelet registers Nodes, heartbeats and runs pods), runs `capstan
//! controller` as a separate process, creates the
//! sandboxed sim-provider `Plugin`, applies a MachineDeployment and a
//! MachineHealthCheck with `kubectl`, follows the deployment until every
//! machine is Ready, prints `kubectl get md,ms,ma,nodes`, installs CoreDNS
//! through the coredns addon plugin and follows it until healthy (unless
//! `--no-addon`), and says what to try next. Ctrl-C deletes the deployment (releasing every instance) and
//! stops everything.
//! `scripts/quickstart.sh` builds what it needs and runs it.
//!
//! With `--oci` the plugin travels the supply chain first: a loopback OCI
//! registry, `capstan key generate`, `plugin push`, `plugin sign`, a trust
//! policy, and a `Plugin` whose source is the `oci://` reference; the
//! controller verifies it before it runs (the README's "Distributing and
//! signing plugins", end to end).

use anyhow::{Context, bail};
use capstan_api::Machine;
use capstan_e2e::env::{ControllerProcess, Env, SIM_PLUGIN, capstan_bin, sample_deployment};
use capstan_e2e::registry::{Registry, RegistryOptions};
use capstan_e2e::sim_cloud::Faults;
use kube::api::Api;
use std::io::Write;
use std::time::{Duration, Instant};

/// How long a quickstart Node may be `Ready=Unknown`/`False` before its
/// machine is replaced.
const QUICKSTART_UNHEALTHY_SECONDS: u32 = 5;

const USAGE: &str =
    "usage: capstan-quickstart [--replicas N] [--boot-latency-ms MS] [--exit-when-ready] [--no-addon] [--oci] [--real-nodes] [--workload-cluster]

Runs Capstan locally: control plane, simulated cloud, controller, the sim-provider
plugin and a MachineDeployment of N machines (default 3), until Ctrl-C.
  --replicas N          machines in the sample MachineDeployment (default 3)
  --boot-latency-ms MS  simulated instance boot time (default 2000)
  --exit-when-ready     clean up and exit once every machine is Ready and the addon healthy (for CI)
  --no-addon            skip the addon step (CoreDNS installed by the coredns addon plugin
                        onto the machines' Nodes, until healthy)
  --oci                 serve the plugin from a local OCI registry, signed, and have the
                        controller verify it against a trust policy before loading it
  --real-nodes          boot every instance as a real node: real cloud-init reads the
                        machine's cloud-config, real `kubeadm join` and a real kubelet
                        v1.20.2 join it, pods run in containerd (scripts/node-parts.sh
                        installs and builds the parts; implies --no-addon: nothing is
                        pulled, and the addon's image is not on the nodes)
  --workload-cluster    a second control plane as a workload cluster: a Cluster object
                        names it, its kubeconfig Secret holds a user with only the rules
                        `capstan install --workload-cluster` binds, and the machines'
                        Nodes join it, not the management cluster (implies --no-addon)";

struct Args {
    replicas: i32,
    boot_latency_ms: u64,
    exit_when_ready: bool,
    oci: bool,
    addon: bool,
    real_nodes: bool,
    workload_cluster: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        replicas: 3,
        boot_latency_ms: 2000,
        exit_when_ready: false,
        oci: false,
        addon: true,
        real_nodes: false,
        workload_cluster: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--replicas" => {
                let v = it.next().context("--replicas needs a number")?;
                args.replicas = v
                    .parse()
                    .with_context(|| format!("--replicas {v:?} is not a number"))?;
            }
            "--boot-latency-ms" => {
                let v = it.next().context("--boot-latency-ms needs a number")?;
                args.boot_latency_ms = v
                    .parse()
                    .with_context(|| format!("--boot-latency-ms {v:?} is not a number"))?;
            }
            "--exit-when-ready" => args.exit_when_ready = true,
            "--oci" => args.oci = true,
            "--no-addon" => args.addon = false,
            "--real-nodes" => {
                args.real_nodes = true;
                args.addon = false;
            }
            "--workload-cluster" => {
                args.workload_cluster = true;
                args.addon = false;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if args.real_nodes && args.workload_cluster {
        bail!("--real-nodes and --workload-cluster do not go together (yet): choose one\n{USAGE}");
    }
    Ok(args)
}

/// The workload cluster's name (its Cluster object, in namespace default).
const WORKLOAD_CLUSTER: &str = "quickstart";

/// A second control plane as a workload cluster: its admin binds what
/// Capstan needs there with `capstan install --workload-cluster`, and the
/// management cluster gets its kubeconfig Secret (that user only) and a
/// Cluster object; returns once the Cluster is Available.
async fn start_workload_cluster(
    env: &Env,
    capstan: &std::path::Path,
) -> anyhow::Result<capstan_e2e::control_plane::ControlPlane> {
    step("starting a second control plane on loopback: the workload cluster `quickstart`");
    let plane = tokio::task::spawn_blocking(capstan_e2e::control_plane::ControlPlane::start)
        .await?
        .map_err(anyhow::Error::msg)
        .context("the workload cluster's control plane did not start")?;
    println!(
        "    API server {} (kubeconfig {})",
        plane.url,
        plane.kubeconfig().display()
    );
    step(
        "binding, in the workload cluster, only what Capstan needs there (Nodes, drains, tokens, CSRs)",
    );
    let workload_kubeconfig = plane.kubeconfig().display().to_string();
    run(
        capstan,
        &[
            "install",
            "--workload-cluster",
            "--workload-user",
            capstan_e2e::control_plane::MINIMAL_USER,
            "--apply",
            "--kubeconfig",
            &workload_kubeconfig,
        ],
        None,
    )?;
    let objects = format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: {WORKLOAD_CLUSTER}-kubeconfig, namespace: default}}
stringData:
  value: {kubeconfig}
---
apiVersion: capstan.dev/v1alpha1
kind: Cluster
metadata: {{name: {WORKLOAD_CLUSTER}, namespace: default}}
spec: {{}}
",
        kubeconfig = serde_json::to_string(&plane.minimal_kubeconfig_inline())?,
    );
    step(&format!(
        "in the management cluster: Secret {WORKLOAD_CLUSTER}-kubeconfig (as {}) and Cluster/{WORKLOAD_CLUSTER}",
        capstan_e2e::control_plane::MINIMAL_USER
    ));
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&objects))
            .map_err(anyhow::Error::msg)?
    );
    let clusters: Api<capstan_api::Cluster> = Api::namespaced(env.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let cluster = clusters.get(WORKLOAD_CLUSTER).await?;
        let conditions = cluster.status.unwrap_or_default().conditions;
        if capstan_api::is_true(&conditions, "Available") {
            step(&format!(
                "Cluster/{WORKLOAD_CLUSTER} Available: its API server answers the probes"
            ));
            return Ok(plane);
        }
        if Instant::now() > deadline {
            bail!("Cluster/{WORKLOAD_CLUSTER} not Available after 60s: {conditions:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn step(text: &str) {
    println!("==> {text}");
}

/// Run one `capstan` command the way a user would, showing it (and that a
/// password is set, never the password).
fn run(capstan: &std::path::Path, args: &[&str], password: Option<&str>) -> anyhow::Result<String> {
    let mut command = std::process::Command::new(capstan);
    command.args(args);
    match password {
        Some(p) => {
            println!("    $ CAPSTAN_PASSWORD=… capstan {}", args.join(" "));
            command.env("CAPSTAN_PASSWORD", p);
        }
        None => println!("    $ capstan {}", args.join(" ")),
    }
    let out = command.output()?;
    if !out.status.success() {
        bail!(
            "capstan {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in stdout.lines() {
        println!("      {line}");
    }
    Ok(stdout)
}

/// Publish the sim-provider to a loopback registry, signed, and create a
/// Plugin from it; returns the registry and the controller's extra flags.
async fn publish(env: &Env, capstan: &std::path::Path) -> anyhow::Result<(Registry, Vec<String>)> {
    let registry = Registry::start(RegistryOptions::default()).map_err(anyhow::Error::msg)?;
    step(&format!(
        "started an OCI registry (docker-registry) at {}",
        registry.host
    ));
    let dir = registry.scratch().to_path_buf();
    // A throwaway password for a throwaway key; a real publisher types one.
    let prefix = dir.join("publisher");
    let source = format!("oci://{}/capstan/sim-provider:v1", registry.host);
    let component = capstan_e2e::plugin("sim_provider");
    let with_password = |args: &[&str]| run(capstan, args, Some("quickstart-only"));
    with_password(&[
        "key",
        "generate",
        "--output-prefix",
        prefix.to_str().unwrap_or_default(),
    ])?;
    run(
        capstan,
        &[
            "plugin",
            "push",
            component.to_str().unwrap_or_default(),
            &source,
        ],
        None,
    )?;
    let key = prefix.with_extension("key");
    with_password(&[
        "plugin",
        "sign",
        &source,
        "--key",
        key.to_str().unwrap_or_default(),
    ])?;
    let public = prefix.with_extension("pub");
    run(
        capstan,
        &[
            "plugin",
            "verify",
            &source,
            "--key",
            public.to_str().unwrap_or_default(),
        ],
        None,
    )?;
    let policy = dir.join("trust-policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: publisher\n    path: publisher.pub\nsources:\n  - prefix: oci://{}/capstan/\n    allOf: [publisher]\n",
            registry.host
        ),
    )?;
    step(&format!("wrote the trust policy {}", policy.display()));
    let plugin = capstan_api::Plugin::new("sim-oci", capstan_e2e::env::sim_plugin_spec(&source));
    let yaml = serde_yaml::to_string(&plugin)?;
    step("kubectl apply -f - <<EOF (Plugin sim-oci from the registry)");
    print!("{yaml}");
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&yaml))
            .map_err(anyhow::Error::msg)?
    );
    let flags = vec![
        format!("--trust-policy={}", policy.display()),
        format!("--oci-cache={}", dir.join("oci-cache").display()),
    ];
    Ok((registry, flags))
}

/// The addon step: the coredns addon plugin as a Plugin granted exactly
/// what it renders, an Addon on the `stable` channel, followed until the
/// plugin judges CoreDNS healthy (its pods run on the machines' Nodes).
async fn install_addon(
    env: &Env,
    controller: &ControllerProcess,
    started: Instant,
) -> anyhow::Result<()> {
    let component = capstan_e2e::plugin("coredns_addon");
    let yaml = format!(
        "apiVersion: capstan.dev/v1alpha1
kind: Plugin
metadata: {{name: coredns}}
spec:
  source: file://{}
  grants:
    objects:
    - ServiceAccount@kube-system
    - ConfigMap@kube-system
    - Service@kube-system
    - apps/Deployment@kube-system
    - rbac.authorization.k8s.io/ClusterRole/system:coredns
    - rbac.authorization.k8s.io/ClusterRoleBinding/system:coredns
---
apiVersion: capstan.dev/v1alpha1
kind: Addon
metadata: {{name: dns, namespace: capstan-system}}
spec:
  plugin: coredns
  channel: stable
  config: {{replicas: 2}}
",
        component.display()
    );
    step(
        "addon: the coredns addon plugin, granted the kinds it renders, and an Addon on channel stable",
    );
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&yaml))
            .map_err(anyhow::Error::msg)?
    );
    let addons: Api<capstan_api::Addon> =
        Api::namespaced(env.client.clone(), capstan_e2e::env::CAPSTAN_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    loop {
        let status = addons.get("dns").await?.status.unwrap_or_default();
        let line = format!(
            "    addon dns: phase {}, version {}, {} objects applied, healthy {} ({})",
            status.phase.as_deref().unwrap_or("-"),
            status.version.as_deref().unwrap_or("-"),
            status.inventory.len(),
            status.healthy.map_or("-".to_string(), |h| h.to_string()),
            status.health_details.join(", ")
        );
        if line != last {
            println!("{line}  [{:.1}s]", started.elapsed().as_secs_f64());
            last = line;
        }
        if status.healthy == Some(true) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the addon is not healthy after 2 minutes; the controller log is {}; its status: {status:#?}",
                controller.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    step("CoreDNS healthy; kubectl get addons");
    print!(
        "{}",
        env.control_plane
            .kubectl(
                &["get", "addons", "-n", capstan_e2e::env::CAPSTAN_NAMESPACE],
                None
            )
            .map_err(anyhow::Error::msg)?
    );
    Ok(())
}

/// The kubeadm bootstrap Plugin's name.
const BOOTSTRAP_PLUGIN: &str = "kubeadm-bootstrap";

/// The kubeadm bootstrap plugin as a Plugin granted nothing (it asks for
/// nothing: it renders cloud-config and never sees the token).
fn create_bootstrap_plugin(env: &Env) -> anyhow::Result<()> {
    let yaml = format!(
        "apiVersion: capstan.dev/v1alpha1
kind: Plugin
metadata: {{name: {BOOTSTRAP_PLUGIN}}}
spec:
  source: file://{}
  allowedNamespaces: {{names: [default]}}
",
        capstan_e2e::plugin("kubeadm_bootstrap").display()
    );
    step(&format!(
        "created Plugin/{BOOTSTRAP_PLUGIN}: the sandboxed kubeadm bootstrap plugin, granted nothing; Capstan mints each machine a bootstrap token and puts it into the rendered cloud-config itself"
    ));
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&yaml))
            .map_err(anyhow::Error::msg)?
    );
    step(
        "let machines' bootstrap tokens request their Nodes' certificates (the ClusterRoleBinding `capstan install` makes; Capstan approves each for its own Node only)",
    );
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "List",
        "items": capstan_e2e::install::machine_bootstrappers_docs(),
    });
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&binding.to_string()))
            .map_err(anyhow::Error::msg)?
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    // One run, its own control planes: nothing to hand on.
    capstan_e2e::control_plane::reuse::disable();
    // Ctrl-C in a terminal signals the whole foreground group: only this
    // process may get it, so it can release every instance first.
    capstan_e2e::children_in_own_process_groups();
    let started = Instant::now();
    step("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback");
    let mut options = capstan_e2e::env::EnvOptions::new(Faults {
        boot_latency_ms: args.boot_latency_ms,
        delete_latency_ms: 500,
        ..Default::default()
    });
    // Instances join as real ones do: from their user data, or not at all.
    options.kubelet.shared_identity_without_join_data = false;
    options.real_nodes = args.real_nodes;
    let env = Env::start_with(options)
        .await
        .map_err(anyhow::Error::msg)
        .context("the local environment did not start")?;
    if args.real_nodes {
        // What an admin binds on a kubeadm cluster for Capstan's tokens.
        capstan_e2e::install::kubectl_apply(&env, &capstan_e2e::install::kubeadm_join_bindings());
    }
    let kubeconfig = env.control_plane.kubeconfig();
    let kubectl = capstan_e2e::control_plane::bin_dir().join("kubectl");
    println!(
        "    API server {} (kubeconfig {})",
        env.control_plane.url,
        kubeconfig.display()
    );
    step(
        "installed the CRDs (Plugin, Machine, MachineSet, MachineDeployment, MachineHealthCheck, Addon)",
    );
    println!(
        "    set up as kubeadm init sets a cluster up: a cluster CA, bootstrap tokens, Node authorization, CSR approval and signing, kube-public/cluster-info"
    );
    if args.real_nodes {
        println!(
            "    simulated cloud at {}; each instance is a real node in namespaces of its own: real cloud-init reads its user data, real `kubeadm join` (token discovery, a CSR for its own client certificate) starts a real kubelet {} that runs pods in containerd",
            env.cloud.url(),
            capstan_e2e::env::REAL_NODE_VERSION
        );
    } else {
        println!(
            "    simulated cloud at {}; each instance boots from its user data as kubeadm join does (token discovery, a CSR for its own client certificate), then its kubelet registers the Node, renews its Lease and runs the pods bound to it",
            env.cloud.url()
        );
    }
    let capstan = capstan_bin().map_err(anyhow::Error::msg)?;
    let (_registry, plugin_name, extra) = if args.oci {
        let (registry, flags) = publish(&env, &capstan).await?;
        (Some(registry), "sim-oci", flags)
    } else {
        step(&format!(
            "created Plugin/{SIM_PLUGIN}: the sandboxed sim-provider ({}), granted http://127.0.0.1:*, http://localhost:* and the cloud token from Secret capstan-system/sim-cloud",
            capstan_e2e::plugin("sim_provider").display()
        ));
        (None, SIM_PLUGIN, Vec::new())
    };
    // The sample plugins are built on this machine and unsigned: their
    // directory is trusted for development (`--allow-unsigned-dir`); the
    // --oci path shows the signed supply chain.
    let mut flags = vec![
        "--poll-interval=500ms".to_string(),
        format!(
            "--allow-unsigned-dir={}",
            capstan_e2e::plugin_dir().display()
        ),
    ];
    flags.extend(extra);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut controller = ControllerProcess::start(&env, &flags, &[]).map_err(anyhow::Error::msg)?;
    step(&format!(
        "started `capstan controller {}` (metrics {}/metrics, log {})",
        flags.join(" "),
        controller.metrics_url,
        controller.log.display()
    ));
    controller
        .wait_ready(Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;

    if args.oci {
        let plugins: Api<capstan_api::Plugin> = Api::all(env.client.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let p = plugins.get(plugin_name).await?;
            let status = p.status.unwrap_or_default();
            if capstan_api::is_true(&status.conditions, "Ready") {
                step(&format!(
                    "Plugin/{plugin_name} verified and loaded: {} signed by {}",
                    status.resolved_source.unwrap_or_default(),
                    status.signers.join(", ")
                ));
                break;
            }
            if Instant::now() > deadline {
                bail!("Plugin/{plugin_name} not Ready: {:?}", status.conditions);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    create_bootstrap_plugin(&env)?;
    let workload = if args.workload_cluster {
        Some(start_workload_cluster(&env, &capstan).await?)
    } else {
        None
    };
    let version = if args.real_nodes {
        capstan_e2e::env::REAL_NODE_VERSION
    } else {
        "v1.30.0"
    };
    let mut md = sample_deployment(
        "quickstart",
        plugin_name,
        &env.cloud.url(),
        args.replicas,
        version,
    );
    let mut bootstrap = serde_json::json!({"kubeletExtraArgs": {"max-pods": "110"}});
    if args.real_nodes {
        bootstrap["ignorePreflightErrors"] =
            serde_json::json!(capstan_e2e::env::REAL_NODE_IGNORED_PREFLIGHT);
    }
    md.spec.template.spec.bootstrap = Some(capstan_api::MachineBootstrap {
        plugin: Some(BOOTSTRAP_PLUGIN.into()),
        config: Some(bootstrap),
        data_secret_name: None,
    });
    if workload.is_some() {
        md.spec.cluster_name = Some(WORKLOAD_CLUSTER.into());
    }
    let yaml = serde_yaml::to_string(&md)?;
    let manifest = kubeconfig.with_file_name("quickstart.yaml");
    std::fs::write(&manifest, &yaml)?;
    step(&format!("kubectl apply -f {}", manifest.display()));
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&yaml))
            .map_err(anyhow::Error::msg)?
    );

    // A health check, so a Node that goes silent is drained and replaced
    // (the "Try next" list says how to make one go silent).
    let check = format!(
        "apiVersion: capstan.dev/v1alpha1
kind: MachineHealthCheck
metadata: {{name: quickstart, namespace: default}}
spec:
  selector: {{matchLabels: {{capstan.dev/pool: quickstart}}}}
  checks:
    unhealthyNodeConditions:
    - {{type: Ready, status: Unknown, timeoutSeconds: {QUICKSTART_UNHEALTHY_SECONDS}}}
    - {{type: Ready, status: \"False\", timeoutSeconds: {QUICKSTART_UNHEALTHY_SECONDS}}}
  remediation: {{maxInFlight: 1}}
"
    );
    print!(
        "{}",
        env.control_plane
            .kubectl(&["apply", "-f", "-"], Some(&check))
            .map_err(anyhow::Error::msg)?
    );

    step(&format!(
        "waiting for {} machines to be Ready",
        args.replicas
    ));
    let machines: Api<Machine> = Api::namespaced(env.client.clone(), "default");
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let list = machines.list(&Default::default()).await?.items;
        let with_id = list
            .iter()
            .filter(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| s.provider_id.as_ref())
                    .is_some()
            })
            .count();
        let ready = list
            .iter()
            .filter(|m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| capstan_api::is_true(&s.conditions, "Ready"))
            })
            .count();
        let line = format!(
            "    machines {}/{} created, {with_id} with an instance, {ready} Ready; cloud instances {}",
            list.len(),
            args.replicas,
            env.cloud.instances().len()
        );
        if line != last {
            println!("{line}  [{:.1}s]", started.elapsed().as_secs_f64());
            last = line;
        }
        if ready as i32 == args.replicas && list.len() as i32 == args.replicas {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "machines not Ready after 5 minutes; the controller log is {}\n{}",
                controller.log.display(),
                env.describe("default").await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    env.wait_rolled_out("default", "quickstart", Duration::from_secs(60))
        .await;
    step(&format!(
        "all {} machines Ready in {:.1}s; kubectl get md,ms,ma,nodes",
        args.replicas,
        started.elapsed().as_secs_f64()
    ));
    print!(
        "{}",
        env.control_plane
            .kubectl(&["get", "md,ms,nodes"], None)
            .map_err(anyhow::Error::msg)?
    );
    // Wide: the PROVIDER ID column, as Cluster API prints it.
    print!(
        "{}",
        env.control_plane
            .kubectl(&["get", "ma", "-o", "wide"], None)
            .map_err(anyhow::Error::msg)?
    );
    // Where the Nodes are: the management cluster's, or the workload's.
    let nodes_plane = workload.as_ref().unwrap_or(&env.control_plane);
    if let Some(plane) = &workload {
        step(&format!(
            "the Nodes joined the workload cluster, not this one; kubectl --kubeconfig {} get nodes,csr",
            plane.kubeconfig().display()
        ));
        print!(
            "{}",
            plane
                .kubectl(&["get", "nodes"], None)
                .map_err(anyhow::Error::msg)?
        );
        let kc = env.control_plane.kubeconfig().display().to_string();
        run(
            &capstan,
            &[
                "describe",
                &format!("cluster/{WORKLOAD_CLUSTER}"),
                "--kubeconfig",
                &kc,
            ],
            None,
        )?;
    } else {
        step("the Nodes joined with their own certificates; kubectl get csr");
    }
    print!(
        "{}",
        nodes_plane
            .kubectl(&["get", "csr"], None)
            .map_err(anyhow::Error::msg)?
    );

    if args.addon {
        install_addon(&env, &controller, started).await?;
    }

    if !args.exit_when_ready {
        // Listening before "Press Ctrl-C" is printed: a Ctrl-C right after
        // it must reach this handler, not end the process.
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let k = format!(
            "{} --kubeconfig {}",
            kubectl.display(),
            kubeconfig.display()
        );
        if let Some(plane) = &workload {
            println!(
                "\nThe machines' Nodes are in the workload cluster:
  {kubectl} --kubeconfig {wl} get nodes       # Node side: claims, labels, drains happen here
  {capstan} describe cluster/{WORKLOAD_CLUSTER} --kubeconfig {kc}   # the Cluster, its deployments, sets, Machines
  {kubectl} --kubeconfig {kc} get clusters -o wide
  kill -STOP {pid}            # stop the workload API server: RemoteConnectionProbe=False,
                              # the Machines NodeHealthy=Unknown, nothing remediated; kill -CONT {pid}",
                kubectl = kubectl.display(),
                wl = plane.kubeconfig().display(),
                capstan = capstan.display(),
                kc = kubeconfig.display(),
                pid = plane.pid("kube-apiserver").unwrap_or_default(),
            );
        }
        if args.real_nodes {
            println!(
                "\nTry next, in another terminal (the Nodes are real kubelets):
  {k} get nodes -o wide       # kubelet v1.20.2, containerd, each Node's address in its own namespace
  {k} create deployment hello --image={image} -- /bin/sh -c 'echo hello from $(hostname); exec sleep 3600'
  {k} patch deploy/hello --type json -p '[{{\"op\":\"add\",\"path\":\"/spec/template/spec/containers/0/imagePullPolicy\",\"value\":\"Never\"}}]'
  {k} logs deploy/hello; {k} exec deploy/hello -- cat /etc/passwd
  {k} scale md/quickstart --replicas=3
  {capstan} describe md/quickstart --kubeconfig {kc}   # the tree: sets, Machines, Nodes, Events
  {k} get csr                 # each Node's client certificate, requested with its machine's token
  {k} delete md/quickstart

Press Ctrl-C to stop: the deployment is deleted (every instance released), then the
controller, the cloud and the control plane stop and their data is removed.",
                image = capstan_e2e::sim_cloud::realnode::BUSYBOX,
                capstan = capstan.display(),
                kc = kubeconfig.display(),
            );
        } else {
            println!(
            "\nTry next, in another terminal:
  {k} scale md/quickstart --replicas=5
  {k} patch md/quickstart --type merge -p '{{\"spec\":{{\"template\":{{\"spec\":{{\"version\":\"v1.31.0\"}}}}}}}}'
  {capstan} rollout status md/quickstart --kubeconfig {kc}     # waits, as kubectl rollout status
  {capstan} describe md/quickstart --kubeconfig {kc}           # sets, Machines, Nodes, what is wrong, Events
  {capstan} rollout pause md/quickstart --kubeconfig {kc}      # also: resume, restart (replace every machine)
  {k} get md,ms,ma -w
  {k} get csr                 # each Node's client certificate, requested with its machine's token
  {k} get secrets             # the machines' bootstrap data (cloud-config), owned by each Machine
  curl -s {cloud}/admin/joins  # how each instance joined (or why it did not)
  {k} create deployment web --image=registry.k8s.io/pause:3.2 --replicas=3
  {k} get pods -o wide        # scheduled onto the machines' Nodes and Running
  curl -X PUT {cloud}/admin/nodes/NODE/heartbeats -H 'Content-Type: application/json' -d '{{\"enabled\":false}}'
                              # NODE's kubelet stops: Unknown after 10 s, the health check
                              # marks it {QUICKSTART_UNHEALTHY_SECONDS} s later, it is drained and replaced
  {k} get mhc,ma,nodes -w
  {k} -n capstan-system get addons; {k} -n kube-system get deploy,pods
  {k} -n capstan-system patch addon/dns --type merge -p '{{\"spec\":{{\"version\":\"1.11.3\"}}}}'
                              # upgrade CoreDNS; its metrics Service is pruned
  {capstan} rollout history md/quickstart --kubeconfig {kc}
  {capstan} rollout undo md/quickstart --kubeconfig {kc}
  {k} delete md/quickstart
  curl -s {metrics}/metrics | grep capstan_

Press Ctrl-C to stop: the deployment is deleted (every instance released), then the
controller, the cloud and the control plane stop and their data is removed.",
            capstan = capstan.display(),
            kc = kubeconfig.display(),
            metrics = controller.metrics_url,
            cloud = env.cloud.url(),
        );
        }
        interrupt.recv().await;
        println!();
    }
    step("deleting the MachineDeployment; waiting for every instance to be released");
    let _ = env
        .control_plane
        .kubectl(&["delete", "md/quickstart", "--wait=false"], None);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !env.cloud.instances().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let left = env.cloud.instances().len();
    step(&format!("stopped; cloud instances left: {left}"));
    std::io::stdout().flush()?;
    if left > 0 {
        bail!("{left} instances were not released");
    }
    Ok(())
}
