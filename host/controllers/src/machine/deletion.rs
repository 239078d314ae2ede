//! The Machine controller's deletion steps as a pass runs them: one drain
//! round, the look at the Node's attached volumes, the provider's `delete`,
//! the Node object (given up after `nodeDeletionTimeoutSeconds`), and the
//! one Event that says a drain or volume wait was skipped.

use super::node::delete_node;
use super::{CONTROLLER, Pass};
use capstan_kit::provider::{ProviderError, timed_as, to_plugin_machine};
use capstan_kit::write::record_event;
use capstan_kit::{Error, key_of};
use capstan_planner::deletion::give_up_node_deletion;
use capstan_planner::machine::{Drain, Release, Volumes};
use capstan_runtime::types::Deletion;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

impl Pass<'_> {
    /// Say once that the drain was skipped or cut short, and why.
    pub(super) async fn report_skipped_drain(&mut self, why: Option<&String>) {
        let Some(why) = why else { return };
        if std::mem::replace(&mut self.skip_reported, true) {
            return;
        }
        record_event(
            &self.ctx.kube,
            CONTROLLER,
            &self.machine.object_ref(&()),
            EventType::Warning,
            "DrainSkipped",
            why.clone(),
        )
        .await;
    }

    /// One drain round on the machine's Node (cordon, evict, look).
    pub(super) async fn drain(&mut self) -> Result<(), Error> {
        let (ctx, machine) = (self.ctx, self.machine);
        if let Some((_, why)) = self.placement.reach.down() {
            self.view.drain = Some(Drain::Pending {
                message: format!("cannot drain the Node: {why}"),
                blocked: true,
            });
            return Ok(());
        }
        let Some((nodes, node)) = self.found_node() else {
            return Ok(());
        };
        self.draft
            .deletion
            .get_or_insert_with(Default::default)
            .node_drain_start_time
            .get_or_insert_with(|| self.t.clone());
        self.view.drain = Some(
            match crate::nodedrain::drain_round(&nodes, self.evictions(), machine, &node).await? {
                crate::nodedrain::Round::Complete => {
                    record_event(
                        &ctx.kube,
                        CONTROLLER,
                        &machine.object_ref(&()),
                        EventType::Normal,
                        "NodeDrained",
                        format!("drained Node {}", node.name_any()),
                    )
                    .await;
                    Drain::Complete
                }
                crate::nodedrain::Round::Pending { message, blocked } => {
                    Drain::Pending { message, blocked }
                }
            },
        );
        Ok(())
    }

    /// The Node's cluster and the Node this pass found. Without a Node
    /// there is nothing to drain or wait for: the planner acts only on the
    /// Node this pass found.
    fn found_node(&mut self) -> Option<(capstan_kit::Kube, Arc<Node>)> {
        let nodes = self.nodes()?;
        let Some(node) = self.node.clone() else {
            self.view.deletion.node = None;
            return None;
        };
        Some((nodes, node))
    }

    /// Look at the volumes still attached to the machine's Node.
    pub(super) async fn check_volumes(&mut self) -> Result<(), Error> {
        if let Some((_, why)) = self.placement.reach.down() {
            self.view.volumes = Some(Volumes::Attached(format!(
                "cannot see the Node's volumes: {why}"
            )));
            return Ok(());
        }
        let Some((nodes, node)) = self.found_node() else {
            return Ok(());
        };
        let start = self
            .draft
            .deletion
            .get_or_insert_with(Default::default)
            .wait_for_node_volume_detach_start_time
            .get_or_insert_with(|| self.t.clone())
            .clone();
        let attached = crate::nodedrain::attached_volumes(&nodes, self.machine, &node).await?;
        self.view.volumes = Some(if attached.is_empty() {
            Volumes::Detached
        } else {
            let mut shown = attached.clone();
            shown.truncate(5);
            Volumes::Attached(format!(
                "waiting for {} volume(s) to detach from Node {} ({}), since {}",
                attached.len(),
                node.name_any(),
                shown.join(", "),
                start.0
            ))
        });
        Ok(())
    }

    /// Delete the machine's Node object. A delete that keeps failing is
    /// given up after `nodeDeletionTimeoutSeconds` (counted from the
    /// deletion request), with a warning Event, so the finalizer does not
    /// hold the machine forever.
    pub(super) async fn delete_node(&mut self, node: Arc<Node>) -> Result<(), Error> {
        let deleted = match (self.nodes(), self.placement.reach.down()) {
            (Some(nodes), _) => delete_node(&nodes, &node).await,
            (None, why) => Err(Error::Unavailable(format!(
                "cannot delete Node {}: {}",
                node.name_any(),
                why.map(|(_, why)| why).unwrap_or_default()
            ))),
        };
        let Err(error) = deleted else {
            return Ok(());
        };
        let machine = self.machine;
        let deleting_for = machine
            .metadata
            .deletion_timestamp
            .as_ref()
            .map_or(0, |d| self.t.0.as_second() - d.0.as_second());
        let timeout = machine
            .spec
            .deletion
            .as_ref()
            .and_then(|d| d.node_deletion_timeout_seconds)
            .map(|s| i64::from(s.max(0)));
        if !give_up_node_deletion(deleting_for, timeout) {
            return Err(error);
        }
        record_event(
            &self.ctx.kube,
            CONTROLLER,
            &machine.object_ref(&()),
            EventType::Warning,
            "FailedDeleteNode",
            format!("{error}; nodeDeletionTimeoutSeconds passed, going on without deleting it"),
        )
        .await;
        Ok(())
    }

    /// The provider's `delete`.
    pub(super) async fn release(&mut self, plugin_name: &str) {
        let (ctx, machine) = (self.ctx, self.machine);
        let Some(provider) = self.provider() else {
            return;
        };
        let plugin_machine = to_plugin_machine(machine);
        let outcome = timed_as(
            &ctx.kube.metrics,
            (plugin_name, provider.revision()),
            "delete",
            provider.delete(&plugin_machine),
        )
        .await;
        self.view.release = Some(match outcome {
            Ok(Deletion::Done) | Err(ProviderError::NotFound(_)) => Release::Done,
            Ok(Deletion::InProgress(ms)) => Release::InProgress(ms),
            Err(error) => match error.retry() {
                Some((message, retry_after)) => {
                    tracing::debug!(machine = %key_of(machine), %message, "delete will be retried");
                    Release::Retry(retry_after.as_millis() as u64)
                }
                None => Release::Failed(error.to_string()),
            },
        });
    }
}
