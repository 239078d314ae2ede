//! The target cluster's Kubernetes versions (its API server's and its
//! kubelets'), which an Addon's version must fit ([`crate::fit`]), and the
//! `Compatible` condition that reports the fit.
//!
//! The API server's version is asked at most once a minute per target. The
//! kubelets' come from the shared Node cache in the cluster Capstan runs
//! in (a Node that brings a new kubelet version wakes that cluster's
//! Addons: [`KubeletVersions::woken`]) and from a list, at most once a
//! minute, in a workload cluster.

use super::{Context, Failure, Rendered, Target, event, fail};
use crate::fit::{ClusterVersions, Fit};
use crate::floor::Aggregators;
use capstan_api::{Addon, AddonStatus, status};
use capstan_kit::Conditions;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Condition: the applied version supports the Kubernetes versions the
/// target cluster runs.
pub const COMPATIBLE: &str = "Compatible";

/// How long a target's versions are reused before they are asked again.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// Versions asked of each target (by target key), with when.
#[derive(Debug, Default)]
pub(super) struct Asked {
    servers: Mutex<HashMap<String, (Instant, String)>>,
    kubelets: Mutex<HashMap<String, (Instant, BTreeSet<String>)>>,
}

/// The aggregating ClusterRoles of `target` ([`crate::floor::Aggregators`]),
/// read now: asked only for a render with an escalation route in a
/// ClusterRole, whose check must hold at the moment it is applied. A list
/// that fails is no error here: the floor then refuses the route, saying
/// why.
pub(super) async fn aggregators(client: &kube::Client, shown: &str) -> Aggregators {
    match Api::<ClusterRole>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(roles) => Aggregators::from_cluster_roles(&roles.items),
        Err(kube::Error::Api(e)) if e.code == 403 => Aggregators::Unknown(format!(
            "Capstan may not list the ClusterRoles of {shown} (let it `list` clusterroles.rbac.authorization.k8s.io there)"
        )),
        Err(e) => Aggregators::Unknown(format!("cannot list the ClusterRoles of {shown}: {e}")),
    }
}

/// The Kubernetes versions `target` runs.
pub(super) async fn cluster_versions(
    ctx: &Context,
    target: &Target,
) -> Result<ClusterVersions, Failure> {
    let server = match fresh(&ctx.asked.servers, &target.key) {
        Some(v) => v,
        None => {
            let info = target.client.apiserver_version().await.map_err(|e| {
                fail(
                    super::APPLIED,
                    "TargetUnavailable",
                    format!(
                        "cannot read the Kubernetes version of {}: {e}",
                        target.shown
                    ),
                )
            })?;
            ctx.asked.servers.lock().expect("versions lock").insert(
                target.key.clone(),
                (Instant::now(), info.git_version.clone()),
            );
            info.git_version
        }
    };
    if target.key == "in-cluster" {
        return Ok(ClusterVersions {
            server,
            kubelets: in_cluster_kubelets(ctx),
        });
    }
    let kubelets = match fresh(&ctx.asked.kubelets, &target.key) {
        Some(v) => v,
        None => {
            let kubelets = match Api::<Node>::all(target.client.clone())
                .list(&ListParams::default())
                .await
            {
                Ok(nodes) => kubelet_versions(nodes.items.iter()),
                // A kubeconfig that may not list Nodes: the API server's
                // version alone is what can be known.
                Err(kube::Error::Api(e)) if e.code == 403 => BTreeSet::new(),
                Err(e) => {
                    return Err(fail(
                        super::APPLIED,
                        "TargetUnavailable",
                        format!("cannot list the Nodes of {}: {e}", target.shown),
                    ));
                }
            };
            ctx.asked
                .kubelets
                .lock()
                .expect("versions lock")
                .insert(target.key.clone(), (Instant::now(), kubelets.clone()));
            kubelets
        }
    };
    Ok(ClusterVersions { server, kubelets })
}

/// What was asked of `key` less than [`FRESH_FOR`] ago.
fn fresh<T: Clone>(asked: &Mutex<HashMap<String, (Instant, T)>>, key: &str) -> Option<T> {
    asked
        .lock()
        .expect("versions lock")
        .get(key)
        .filter(|(at, _)| at.elapsed() < FRESH_FOR)
        .map(|(_, v)| v.clone())
}

fn in_cluster_kubelets(ctx: &Context) -> BTreeSet<String> {
    kubelet_versions(ctx.kube.stores.nodes.state().iter().map(|n| n.as_ref()))
}

fn kubelet_versions<'a>(nodes: impl Iterator<Item = &'a Node>) -> BTreeSet<String> {
    nodes
        .filter_map(|n| {
            Some(
                n.status
                    .as_ref()?
                    .node_info
                    .as_ref()?
                    .kubelet_version
                    .clone(),
            )
        })
        .filter(|v| !v.is_empty())
        .collect()
}

/// The kubelet versions of the cluster Capstan runs in, as last seen, to
/// wake its Addons when they change.
#[derive(Debug, Default)]
pub(super) struct KubeletVersions(Mutex<Option<BTreeSet<String>>>);

impl KubeletVersions {
    /// After a Node changed or went: every Addon that targets this cluster
    /// when the set of kubelet versions changed (not on the first look:
    /// every Addon is reconciled at start anyway).
    pub(super) fn woken(&self, ctx: &Context) -> Vec<ObjectRef<Addon>> {
        let now = in_cluster_kubelets(ctx);
        let mut seen = self.0.lock().expect("kubelet versions lock");
        let changed = seen.as_ref().is_some_and(|before| *before != now);
        *seen = Some(now);
        if !changed {
            return Vec::new();
        }
        ctx.kube
            .stores
            .addons
            .state()
            .iter()
            .filter(|a| a.spec.target.is_none())
            .map(|a| ObjectRef::from_obj(a.as_ref()))
            .collect()
    }
}

/// Set `Compatible` from how the rendered version fits `cluster`, with a
/// Warning Event when it stops fitting. Under a misfit the version stays
/// applied (it was applied when it fitted); the message names the newest
/// version of the channel that fits, if any.
pub(super) async fn report_fit(
    ctx: &Context,
    addon: &Addon,
    status: &mut AddonStatus,
    rendered: &Rendered,
    cluster: &ClusterVersions,
    generation: i64,
    t: &capstan_api::Time,
) {
    let Some(fit) = &rendered.fit else {
        return;
    };
    let version = &rendered.resolved.version;
    let was_false = status
        .conditions
        .iter()
        .any(|c| c.type_ == COMPATIBLE && c.status == status::FALSE);
    let mut conditions = Conditions::new(&mut status.conditions, Some(generation), t);
    let message = match fit {
        Fit::Any => {
            conditions.set(
                COMPATIBLE,
                status::TRUE,
                "AnyVersion",
                format!(
                    "version {version} declares no Kubernetes range; the cluster runs {cluster}"
                ),
            );
            return;
        }
        Fit::Within { range } => {
            conditions.set(
                COMPATIBLE,
                status::TRUE,
                "Compatible",
                format!(
                    "version {version} supports Kubernetes {range:?}; the cluster runs {cluster}"
                ),
            );
            return;
        }
        Fit::Outside { .. } | Fit::Invalid { .. } => {
            let why = fit.misfit(cluster).unwrap_or_default();
            let next = match rendered.available.as_deref() {
                Some(v) if v != version => format!(
                    "; version {v} is the newest of the channel that fits: set spec.version to {v} to apply it"
                ),
                _ => "; no version of the channel fits".to_string(),
            };
            format!("version {version} stays applied, but {why}{next}")
        }
    };
    conditions.set(COMPATIBLE, status::FALSE, "Incompatible", message.clone());
    if !was_false {
        event(ctx, addon, EventType::Warning, "Incompatible", message).await;
    }
}
