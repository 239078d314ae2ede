//! The steps of a pass that act on the machine's Node side, in the cluster
//! its Node lives in (this one, or a workload cluster; see `cluster`):
//! preparing the join data, the in-place update's next step, keeping the
//! Node's annotations, labels and taints, and the last step, which
//! deletes the bootstrap token there before the finalizer goes.

use super::node::{annotate_node, carry_labels_to_node, carry_taints_to_node, claimed_node};
use super::update::{self, Advance};
use super::{CONTROLLER, Pass, bootstrap};
use capstan_api::{MACHINE_FINALIZER, Machine};
use capstan_kit::unseen::UnseenWrites;
use capstan_kit::write::remove_finalizer;
use capstan_kit::{Error, Kube, key_of, kube_err};
use capstan_planner::machine::InPlace;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;

impl Pass<'_> {
    /// The cluster of the machine's Node, when it can be reached.
    pub(super) fn nodes(&self) -> Option<Kube> {
        self.placement.reach.kube(&self.ctx.kube).cloned()
    }

    /// The Eviction API of that cluster.
    pub(super) fn evictions(&self) -> &crate::nodedrain::Evictions {
        self.workload_evictions
            .as_ref()
            .unwrap_or(&self.ctx.evictions)
    }

    /// The data `create` passes to the instance: the join data of the
    /// machine's cluster (its token minted there, its `cluster-info` or
    /// the Cluster's `spec.controlPlaneEndpoint`).
    pub(super) async fn prepare_bootstrap(&mut self) {
        let (ctx, machine) = (self.ctx, self.machine);
        let takes_data = self
            .provider
            .as_ref()
            .is_some_and(|p| p.takes_bootstrap_data());
        // The planner prepares only for a cluster that answers.
        let Some(nodes) = self.nodes() else {
            return;
        };
        let cluster = machine.spec.cluster_name.as_deref().and_then(|name| {
            ctx.kube
                .stores
                .clusters
                .get(&ObjectRef::new(name).within(&machine.namespace().unwrap_or_default()))
        });
        let target = bootstrap::JoinTarget {
            kube: &nodes,
            endpoint: cluster
                .as_ref()
                .and_then(|c| c.spec.control_plane_endpoint.as_ref()),
        };
        let (state, data) =
            bootstrap::prepare(ctx, &target, machine, takes_data, &mut self.draft).await;
        self.view.bootstrap = state;
        self.bootstrap_data = data;
    }

    /// The in-place update's next step (its drains in the Node's cluster).
    pub(super) async fn advance_in_place(&mut self) {
        let (ctx, machine) = (self.ctx, self.machine);
        // An update that may drain waits for the Node's cluster.
        let Some(nodes) = self.nodes() else {
            self.view.in_place = Some(InPlace::Wait(10_000));
            return;
        };
        let node = match (self.node.clone(), self.draft.provider_id.as_deref()) {
            (Some(node), _) => Some(node),
            (None, Some(id)) => {
                let prefix = self.provider.as_ref().and_then(|p| p.provider_id_prefix());
                claimed_node(&nodes, machine, prefix, id, &ctx.node_writes)
                    .await
                    .ok()
                    .flatten()
            }
            (None, None) => None,
        };
        let drain = update::Drainer {
            kube: &nodes,
            evictions: self.workload_evictions.as_ref().unwrap_or(&ctx.evictions),
            node,
        };
        let advance = update::advance(
            &ctx.kube,
            &ctx.updaters,
            &drain,
            machine,
            &mut self.draft,
            &self.t,
        )
        .await;
        self.view.in_place = Some(match advance {
            Advance::Wait(wait) => InPlace::Wait(wait.as_millis() as u64),
            Advance::Failed => InPlace::Failed,
            Advance::Done => InPlace::Done,
        });
    }

    /// Find the machine's Node in `nodes` (if the claim holds) and keep
    /// Cluster API's annotations, the granted labels and the taints on it.
    pub(super) async fn tend_node(
        &mut self,
        nodes: &Kube,
        prefix: Option<&str>,
        provider_id: &str,
    ) {
        let (machine, written) = (self.machine, &self.ctx.node_writes);
        let claimed = claimed_node(nodes, machine, prefix, provider_id, written).await;
        (self.node, self.refused) = match claimed {
            Ok(node) => (node, None),
            Err(refused) => (None, Some(refused)),
        };
        let Some(node) = &self.node else {
            return;
        };
        // Annotations, labels and taints worked out from a Node older than
        // this Machine's own last write to it would be written again. (The
        // Node may be the one the claim just wrote, not the cache's: only
        // asked, the wait is not ended by it.)
        if written.superseded_for(machine, node.as_ref()) {
            return;
        }
        // The next pass tries again; the instance is what this pass is about.
        let mut node = node.clone();
        let annotated = annotate_node(nodes, machine, &node).await;
        tend_result(machine, written, &mut node, annotated, "node not annotated");
        let labels = carry_labels_to_node(nodes, machine, &node).await;
        tend_result(
            machine,
            written,
            &mut node,
            labels,
            "node labels not carried",
        );
        let taints = carry_taints_to_node(nodes, machine, &node).await;
        tend_result(
            machine,
            written,
            &mut node,
            taints,
            "node taints not carried",
        );
        self.node = Some(node);
    }

    /// The last step: the bootstrap token goes, then the finalizer.
    pub(super) async fn remove_finalizer(&mut self) -> Result<(), Error> {
        let (ctx, machine) = (self.ctx, self.machine);
        // No token outlives its machine, joined or not (one in a cluster
        // being deleted goes with it).
        match (self.nodes(), self.placement.reach.down()) {
            (Some(nodes), _) => bootstrap::release_token(&nodes, machine)
                .await
                .map_err(kube_err("deleting the machine's bootstrap token"))?,
            (None, Some((_, why))) if !self.placement.cluster_gone => {
                return Err(Error::Unavailable(format!(
                    "the machine's bootstrap token cannot be deleted yet: {why}"
                )));
            }
            (None, _) => {}
        }
        remove_finalizer(&ctx.kube, CONTROLLER, machine, MACHINE_FINALIZER).await?;
        ctx.unseen_writes.forget(machine);
        ctx.instance_here(machine, None);
        self.view.has_finalizer = false;
        Ok(())
    }
}

/// Go on from the Node as `result` wrote it, remembering that `machine`
/// wrote it from the version it had (the cache may still show that one);
/// a failed write is logged and left to the next pass.
fn tend_result(
    machine: &Machine,
    written: &UnseenWrites,
    node: &mut Arc<Node>,
    result: Result<Option<Node>, Error>,
    failed: &str,
) {
    match result {
        Ok(Some(after)) => {
            written.wrote_for(machine, node.as_ref());
            *node = Arc::new(after);
        }
        Ok(None) => {}
        Err(error) => tracing::warn!(machine = %key_of(machine), %error, "{failed}"),
    }
}
