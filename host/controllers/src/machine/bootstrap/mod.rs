//! A machine's bootstrap data and token: the I/O around
//! [`capstan_planner::bootstrap`].
//!
//! [`prepare`] runs before the instance is created. With
//! `spec.bootstrap.dataSecretName` it reads the user's Secret (type
//! `cluster.x-k8s.io/secret`, in the Machine's namespace, not another
//! Machine's). With `spec.bootstrap.plugin` it
//! 1. reuses the machine's data Secret if an earlier pass wrote it;
//! 2. reads what a machine needs to join from `kube-public/cluster-info`
//!    (the API server and the cluster CA, as kubeadm publishes them);
//! 3. has the bootstrap plugin render the data with the token placeholder;
//! 4. mints the machine's bootstrap token (`kube-system/bootstrap-token-<id>`,
//!    the id derived from the Machine's uid, so a retry finds it again;
//!    `token`, which also renews and deletes it);
//! 5. puts the token in place of the placeholder and writes the data
//!    Secret, owned by the Machine (the garbage collector removes it with
//!    the Machine).
//!
//! [`tend_token`] renews the token until the Node has joined and then
//! deletes it; [`release_token`] deletes it when the Machine goes. The
//! token is never logged, put in an Event or condition, or given to a
//! plugin other than the provider that passes it to the instance.

mod token;

pub(crate) use token::token_id;
pub(super) use token::{release_token, tend_token};

use super::Context;
use capstan_api::{Machine, MachineInitialization, MachineStatus};
use capstan_kit::Kube;
use capstan_kit::provider::{ProviderError, to_plugin_machine};
use capstan_planner::bootstrap::{
    self as plan, Source, TOKEN_PLACEHOLDER, check_size, data_secret_name, substitute,
};
use capstan_planner::machine::Bootstrap;
use capstan_runtime::types::{BootstrapData, BootstrapFormat, JoinInfo, Taint};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// The cluster a machine joins: the one its Node lives in (its bootstrap
/// token is minted there and its `cluster-info` read there), and the
/// Cluster's `spec.controlPlaneEndpoint`, if it names one.
pub(super) struct JoinTarget<'a> {
    /// That cluster.
    pub(super) kube: &'a Kube,
    /// Joined instead of `cluster-info`'s server.
    pub(super) endpoint: Option<&'a capstan_api::ApiEndpoint>,
}

/// The Secret type of bootstrap data, as in Cluster API.
pub(crate) const DATA_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The Secret type of a bootstrap token.
pub(super) const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Where bootstrap tokens live.
pub(crate) const TOKEN_NAMESPACE: &str = "kube-system";
/// Label on a bootstrap token: the uid of the Machine it was minted for.
pub(crate) const LABEL_TOKEN_MACHINE_UID: &str = "capstan.dev/machine-uid";

fn retry(reason: &str, message: String, after_ms: u64) -> (Bootstrap, Option<BootstrapData>) {
    (
        Bootstrap::Retry {
            reason: reason.into(),
            message,
            after_ms,
        },
        None,
    )
}

fn failed(reason: &str, message: String) -> (Bootstrap, Option<BootstrapData>) {
    (
        Bootstrap::Failed {
            reason: reason.into(),
            message,
        },
        None,
    )
}

/// A Kubernetes error as a retry (the text carries no Secret content).
fn kube_retry(what: &str, e: &kube::Error) -> (Bootstrap, Option<BootstrapData>) {
    let reason = match e {
        kube::Error::Api(s) if s.code == 403 => "Forbidden",
        _ => "BootstrapRetrying",
    };
    retry(reason, format!("{what}: {e}"), 10_000)
}

/// A Kubernetes error about a Secret in the Machine's namespace as a retry;
/// a 403 says how an admin lets Capstan handle bootstrap data there.
fn secret_retry(
    namespace: &str,
    what: &str,
    e: &kube::Error,
) -> (Bootstrap, Option<BootstrapData>) {
    match e {
        kube::Error::Api(s) if s.code == 403 => retry(
            "BootstrapSecretsForbidden",
            format!(
                "{what}: Capstan may not read or write bootstrap data Secrets in namespace {namespace} (the API server said: {}). \
                 Let it, there only: `capstan install --machine-namespace {namespace}`, or \
                 kubectl -n {namespace} create rolebinding {role} --clusterrole={role} --serviceaccount=CAPSTAN_NAMESPACE:capstan-controller",
                s.message,
                role = crate::MACHINE_NAMESPACE_ROLE
            ),
            30_000,
        ),
        _ => kube_retry(what, e),
    }
}

/// The data `create` passes to the instance, prepared as `spec.bootstrap`
/// says; records the data Secret (and the token's expiry) in `draft`.
pub(super) async fn prepare(
    ctx: &Context,
    target: &JoinTarget<'_>,
    machine: &Machine,
    provider_takes_data: bool,
    draft: &mut MachineStatus,
) -> (Bootstrap, Option<BootstrapData>) {
    let Some(spec) = &machine.spec.bootstrap else {
        return (Bootstrap::Ready, None);
    };
    let source = match plan::source(
        spec.data_secret_name.as_deref(),
        spec.plugin.as_deref(),
        spec.config.is_some(),
    ) {
        Ok(source) => source,
        Err(message) => return failed("InvalidBootstrap", message),
    };
    if source != Source::None && !provider_takes_data {
        return failed(
            "ProviderCannotBootstrap",
            format!(
                "provider plugin {:?} implements contract 0.1.0, whose create cannot pass bootstrap data to the instance; use a provider built against contract {} or remove spec.bootstrap",
                machine.spec.provider.plugin,
                capstan_manifest::CONTRACT_VERSION
            ),
        );
    }
    let namespace = machine.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.kube.client.clone(), &namespace);
    let (name, result) = match source {
        Source::None => return (Bootstrap::Ready, None),
        Source::Secret(name) => (name.to_string(), users_data(&secrets, machine, name).await),
        Source::Plugin(plugin) => {
            let name = data_secret_name(&machine.name_any());
            let config = spec
                .config
                .clone()
                .unwrap_or_else(|| serde_json::json!({}))
                .to_string();
            let rendering = (name.as_str(), plugin, config.as_str());
            let result = rendered_data(ctx, target, machine, rendering, draft).await;
            (name, result)
        }
    };
    if let (Bootstrap::Ready, Some(_)) = &result {
        draft.bootstrap_data_secret_name = Some(name);
        draft
            .initialization
            .get_or_insert_with(MachineInitialization::default)
            .bootstrap_data_secret_created = Some(true);
    }
    result
}

/// Data and format from a data Secret; the message names what is wrong.
fn data_of(secret: &Secret) -> Result<BootstrapData, String> {
    let name = secret.name_any();
    let data = secret.data.clone().unwrap_or_default();
    let value = data
        .get("value")
        .ok_or_else(|| format!("Secret {name} has no key `value` (the bootstrap data)"))?;
    let format = match data
        .get("format")
        .map(|f| String::from_utf8_lossy(&f.0).into_owned())
    {
        None => BootstrapFormat::CloudConfig,
        Some(f) => match f.as_str() {
            "cloud-config" => BootstrapFormat::CloudConfig,
            "ignition" => BootstrapFormat::Ignition,
            "shell" => BootstrapFormat::Shell,
            other => {
                return Err(format!(
                    "Secret {name}: format `{other}` is not one of cloud-config, ignition, shell"
                ));
            }
        },
    };
    check_size(value.0.len()).map_err(|m| format!("Secret {name}: {m}"))?;
    Ok(BootstrapData {
        format,
        value: value.0.clone(),
    })
}

fn format_name(format: BootstrapFormat) -> &'static str {
    match format {
        BootstrapFormat::CloudConfig => "cloud-config",
        BootstrapFormat::Ignition => "ignition",
        BootstrapFormat::Shell => "shell",
    }
}

/// The uid of the Machine that owns a Secret, if one does.
fn owning_machine(secret: &Secret) -> Option<&OwnerReference> {
    secret
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine" && o.api_version.starts_with("capstan.dev/"))
}

/// The user's own data Secret: used as is, if it is a bootstrap data Secret
/// and no other Machine's.
async fn users_data(
    secrets: &Api<Secret>,
    machine: &Machine,
    name: &str,
) -> (Bootstrap, Option<BootstrapData>) {
    let namespace = machine.namespace().unwrap_or_default();
    let secret = match secrets.get_opt(name).await {
        Ok(Some(secret)) => secret,
        Ok(None) => {
            return retry(
                "WaitingForBootstrapData",
                format!(
                    "spec.bootstrap.dataSecretName: Secret {name} does not exist in namespace {namespace}; create it (type {DATA_SECRET_TYPE}, key value)"
                ),
                10_000,
            );
        }
        Err(e) => return secret_retry(&namespace, &format!("reading Secret {name}"), &e),
    };
    if secret.type_.as_deref() != Some(DATA_SECRET_TYPE) {
        return failed(
            "InvalidBootstrapDataSecret",
            format!(
                "spec.bootstrap.dataSecretName: Secret {name} has type {:?}; bootstrap data Secrets have type {DATA_SECRET_TYPE}",
                secret.type_.as_deref().unwrap_or("Opaque")
            ),
        );
    }
    if let Some(owner) = owning_machine(&secret)
        && Some(owner.uid.as_str()) != machine.uid().as_deref()
    {
        return failed(
            "InvalidBootstrapDataSecret",
            format!(
                "spec.bootstrap.dataSecretName: Secret {name} holds the bootstrap data of Machine {}; a machine may not boot with another machine's data",
                owner.name
            ),
        );
    }
    match data_of(&secret) {
        Ok(data) => (Bootstrap::Ready, Some(data)),
        Err(message) => failed("InvalidBootstrapDataSecret", message),
    }
}

/// The data a bootstrap plugin renders, with the machine's token in place.
/// `(name, plugin, config)`: the data Secret's name, the bootstrap Plugin
/// and its config.
async fn rendered_data(
    ctx: &Context,
    target: &JoinTarget<'_>,
    machine: &Machine,
    (name, plugin, config): (&str, &str, &str),
    draft: &mut MachineStatus,
) -> (Bootstrap, Option<BootstrapData>) {
    let uid = machine.uid().unwrap_or_default();
    let namespace = machine.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.kube.client.clone(), &namespace);
    // An earlier pass wrote it: the same data, the same token. Read first,
    // so a namespace Capstan may not write to mints no token.
    match secrets.get_opt(name).await {
        Ok(Some(secret)) => return existing(&secret, &uid, name),
        Ok(None) => {}
        Err(e) => return secret_retry(&namespace, &format!("reading Secret {name}"), &e),
    }
    let Some(bootstrap) = ctx.bootstraps.get(plugin) else {
        return retry(
            "BootstrapPluginNotReady",
            format!(
                "bootstrap plugin {plugin:?} is not loaded (yet); `kubectl get plugin {plugin}` says why"
            ),
            5_000,
        );
    };
    let Some(bootstrap) = bootstrap.for_machine(&uid) else {
        return retry(
            "BootstrapPluginNotReady",
            format!("a canary of bootstrap plugin {plugin:?} is choosing the Machines it serves"),
            1_000,
        );
    };
    let join = match join_info(target, machine).await {
        Ok(join) => join,
        Err(message) => return retry("JoinInfoUnavailable", message, 15_000),
    };
    let plugin_machine = to_plugin_machine(machine);
    let render_with = async |revision: &capstan_kit::registry::RegisteredBootstrap| {
        let labels = (plugin, revision.revision);
        let rendering = revision.plugin.render(&plugin_machine, config, &join);
        capstan_kit::provider::timed_as(&ctx.kube.metrics, labels, "render", async {
            rendering.await.map_err(ProviderError::from)
        })
        .await
    };
    // A shadowing canary renders the same Machine at once; its data is
    // compared and never used.
    let shadow = capstan_kit::canary::shadowing(&bootstrap.canary);
    let mirrored = async {
        match &shadow {
            Some(s) => Some(render_with(&s.serving).await),
            None => None,
        }
    };
    let (rendered, mirrored) = futures::join!(render_with(&bootstrap), mirrored);
    if let (Some(shadow), Some(mirrored)) = (&shadow, &mirrored) {
        shadow.compare(&rendered, mirrored, |a, b| a == b);
    }
    bootstrap.counts.record("render", &rendered);
    let rendered = match rendered {
        Ok(data) => data,
        Err(e) => return render_failed(e),
    };
    if let Err(message) = check_size(rendered.value.len()) {
        return failed("BootstrapDataTooLarge", message);
    }
    let token = match token::ensure_token(ctx, target.kube, machine, draft).await {
        Ok(token) => token,
        Err(failure) => return failure,
    };
    let value = substitute(&rendered.value, &token);
    if let Err(message) = check_size(value.len()) {
        return failed("BootstrapDataTooLarge", message);
    }
    let data = BootstrapData {
        format: rendered.format,
        value,
    };
    let secret = data_secret(machine, name, &data);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            ctx.kube.metrics.wrote("machine", "bootstrap_data");
            (Bootstrap::Ready, Some(data))
        }
        // Another pass (or a restart) wrote it first: use what it wrote.
        Err(kube::Error::Api(s)) if s.code == 409 => match secrets.get_opt(name).await {
            Ok(Some(secret)) => existing(&secret, &uid, name),
            Ok(None) => retry(
                "BootstrapRetrying",
                format!("Secret {name} vanished"),
                1_000,
            ),
            Err(e) => secret_retry(&namespace, &format!("reading Secret {name}"), &e),
        },
        Err(e) => secret_retry(&namespace, &format!("creating Secret {name}"), &e),
    }
}

/// Why a render failed, as the machine's bootstrap state: a bad config
/// fails the machine; the plugin's transient errors, faults and the
/// host's quota are retried.
fn render_failed(error: ProviderError) -> (Bootstrap, Option<BootstrapData>) {
    match error {
        ProviderError::InvalidConfig(m) => failed(
            "InvalidBootstrapConfig",
            format!("spec.bootstrap.config: {m}"),
        ),
        ProviderError::Transient {
            message,
            retry_after,
        } => retry("BootstrapRetrying", message, retry_after.as_millis() as u64),
        ProviderError::Fault(m) => retry("BootstrapPluginFault", m, 30_000),
        ProviderError::Quota {
            message,
            retry_after,
        } => retry(
            "PluginQuotaExceeded",
            message,
            retry_after.as_millis() as u64,
        ),
        other => failed("BootstrapFailed", other.to_string()),
    }
}

/// The machine's data Secret `name`: owned by the Machine, labelled with
/// its cluster, holding the data and its format.
fn data_secret(machine: &Machine, name: &str, data: &BootstrapData) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: machine.namespace(),
            labels: machine
                .spec
                .cluster_name
                .as_ref()
                .map(|c| BTreeMap::from([("cluster.x-k8s.io/cluster-name".into(), c.clone())])),
            owner_references: machine.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some(DATA_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([
            ("value".to_string(), ByteString(data.value.clone())),
            (
                "format".to_string(),
                ByteString(format_name(data.format).as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

/// A data Secret already there: this machine's (use it) or not (refuse).
fn existing(secret: &Secret, uid: &str, name: &str) -> (Bootstrap, Option<BootstrapData>) {
    match owning_machine(secret) {
        Some(owner) if owner.uid == uid => match data_of(secret) {
            Ok(data) => (Bootstrap::Ready, Some(data)),
            Err(message) => failed("InvalidBootstrapDataSecret", message),
        },
        _ => failed(
            "BootstrapDataSecretConflict",
            format!(
                "Secret {name} exists and is not this Machine's; the host writes the rendered data there: delete or rename that Secret"
            ),
        ),
    }
}

/// What the instance needs to join: the API server and the cluster CA from
/// `kube-public/cluster-info` (as `kubeadm init` publishes it), the Node
/// name (the Machine's), its registration labels and taints.
async fn join_info(target: &JoinTarget<'_>, machine: &Machine) -> Result<JoinInfo, String> {
    let maps: Api<ConfigMap> = Api::namespaced(target.kube.client.clone(), "kube-public");
    let info = maps
        .get_opt("cluster-info")
        .await
        .map_err(|e| format!("reading kube-public/cluster-info: {e}"))?
        .ok_or_else(|| {
            "kube-public/cluster-info does not exist; a kubeadm cluster has it (kubeadm init phase bootstrap-token), other clusters need it created with the API server and CA machines join"
                .to_string()
        })?;
    let kubeconfig = info
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .ok_or("kube-public/cluster-info has no `kubeconfig` key")?;
    let (published, ca_pem) = cluster_of(kubeconfig)?;
    // The Cluster's `spec.controlPlaneEndpoint`, when it names one, is
    // what machines join (a load balancer before the API servers).
    let server = match target.endpoint {
        Some(endpoint) => format!("https://{}:{}", endpoint.host, endpoint.port),
        None => published,
    };
    let ca_hash = crate::x509::ca_pin(&ca_pem)?;
    let labels = capstan_planner::metadata::node_managed_labels(
        &machine.labels().clone().into_iter().collect(),
    )
    .into_iter()
    .filter(|(k, _)| plan::kubelet_may_set(k))
    .collect();
    let taints = machine
        .spec
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.as_str().to_string(),
        })
        .collect();
    Ok(JoinInfo {
        api_server_endpoints: vec![server],
        ca_certificate: String::from_utf8_lossy(&ca_pem).into_owned(),
        ca_certificate_hash: ca_hash,
        kubernetes_version: machine.spec.version.clone(),
        node_name: machine.name_any(),
        node_labels: labels,
        node_taints: taints,
        token_placeholder: TOKEN_PLACEHOLDER.into(),
    })
}

/// The first cluster of a kubeconfig: its server and CA (PEM).
fn cluster_of(kubeconfig: &str) -> Result<(String, Vec<u8>), String> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| format!("kube-public/cluster-info: the kubeconfig does not parse: {e}"))?;
    let cluster = parsed
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .ok_or("kube-public/cluster-info: the kubeconfig names no cluster")?;
    let server = cluster
        .server
        .clone()
        .ok_or("kube-public/cluster-info: the cluster has no server")?;
    let ca = cluster
        .certificate_authority_data
        .as_deref()
        .ok_or("kube-public/cluster-info: the cluster has no certificate-authority-data")?;
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca.trim())
        .map_err(|e| format!("kube-public/cluster-info: certificate-authority-data: {e}"))?;
    Ok((server, pem))
}
