//! The Machine controller's adoption step: a Machine with no recorded
//! instance asks its provider (`find-instance`) for one launched for it
//! before (a Velero restore, a GitOps re-apply after its objects were
//! deleted, a move to another management cluster) or named in its
//! `spec.providerID`, and adopts it when `capstan_planner::adoption` says
//! so. Only then is an instance created.

use super::{CONTROLLER, Pass};
use capstan_api::AdoptedBy;
use capstan_kit::provider::{timed_as, to_plugin_machine};
use capstan_kit::write::record_event;
use capstan_planner::adoption::{Asking, Decision, Found, decide};
use capstan_planner::machine::{Adoption, Call};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

impl Pass<'_> {
    /// Ask the provider for an instance to adopt, and adopt it, refuse it,
    /// or let the Machine create one.
    pub(super) async fn find_instance(&mut self, plugin_name: &str) {
        let (ctx, machine) = (self.ctx, self.machine);
        let Some(provider) = self.provider() else {
            return;
        };
        let mut asked = to_plugin_machine(machine);
        asked.provider_id = machine.spec.provider_id.clone();
        let labels = (plugin_name, provider.revision());
        let found = timed_as(
            &ctx.kube.metrics,
            labels,
            "find-instance",
            provider.find_instance(&asked),
        )
        .await;
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                // Never create while the lookup fails: it may have missed
                // the instance.
                self.view.call_error = Some((Call::FindInstance, super::call_error(e)));
                return;
            }
        };
        let namespace = machine.namespace().unwrap_or_default();
        let owner = format!("{namespace}/{}", machine.name_any());
        let claimed_by = found.as_ref().and_then(|f| {
            ctx.kube
                .stores
                .machine_ids
                .machines(&f.status.provider_id)
                .into_iter()
                .map(|(ns, name)| format!("{ns}/{name}"))
                .find(|other| *other != owner)
        });
        let untagged_allowed = ctx
            .kube
            .stores
            .plugins
            .get(&ObjectRef::new(plugin_name))
            .is_some_and(|plugin| {
                let labels = ctx
                    .kube
                    .stores
                    .namespaces
                    .get(&ObjectRef::new(&namespace))
                    .map(|n| n.metadata.labels.clone().unwrap_or_default());
                plugin.adopts_untagged_in(&namespace, labels.as_ref())
            });
        let asking = Asking {
            namespace: &namespace,
            name: &machine.name_any(),
            cluster: machine.spec.cluster_name.as_deref(),
            preset: machine.spec.provider_id.as_deref(),
            prefix: provider.provider_id_prefix(),
            untagged_allowed,
        };
        let claim = found.as_ref().map(|f| Found {
            provider_id: &f.status.provider_id,
            machine: f.machine.as_deref(),
            cluster: f.cluster.as_deref(),
            claimed_by: claimed_by.as_deref(),
        });
        let (kind, reason, note) = match decide(&asking, claim.as_ref()) {
            Decision::Create => {
                self.view.adoption = Adoption::NothingFound;
                ctx.instance_here(machine, Some(super::InstanceHere::NothingToAdopt));
                return;
            }
            Decision::Adopt => {
                let found = found.expect("adopted what was found");
                let id = found.status.provider_id.clone();
                // Recorded now so this pass's status write persists it; the
                // planner observes it with `get` next.
                self.draft.provider_id = Some(id.clone());
                self.draft.provider_plugin = Some(plugin_name.to_string());
                // Its tags name this Machine (whether or not spec.providerID
                // named it too): its Node must already be this Machine's to
                // be taken. Untagged, it was adopted under the admin's grant.
                self.draft.adopted = Some(match found.machine {
                    Some(_) => AdoptedBy::Tags,
                    None => AdoptedBy::ProviderID,
                });
                self.view.provider_id = Some(id.clone());
                self.view.adoption = Adoption::Adopted;
                let tagged = match (&found.machine, &found.cluster) {
                    (Some(m), Some(c)) => format!("tagged for {m} in cluster {c}"),
                    (Some(m), None) => format!("tagged for {m}"),
                    (None, _) => "launched outside Capstan, named by spec.providerID".into(),
                };
                let note = format!(
                    "adopted the existing instance {id} ({tagged}) instead of creating one"
                );
                (EventType::Normal, "InstanceAdopted", note)
            }
            Decision::Refuse { reason, message } => {
                self.view.adoption = Adoption::Refused {
                    reason: reason.to_string(),
                    message: message.clone(),
                };
                (EventType::Warning, reason, message)
            }
        };
        record_event(
            &ctx.kube,
            CONTROLLER,
            &machine.object_ref(&()),
            kind,
            reason,
            note,
        )
        .await;
    }
}

/// Keep `spec.providerID` naming the recorded instance, as Cluster API's
/// Machine controller sets it (the autoscaler and other tools read it
/// there). Unset: written. Another value (written after the instance was
/// recorded) is a claim the recorded instance outranks: set back, with a
/// Warning Event. `latest` is the resourceVersion the pass's own writes
/// left the Machine at, if it wrote. Returns the patched Machine, `None`
/// when nothing changed.
pub(super) async fn write_provider_id(
    ctx: &super::Context,
    machine: &capstan_api::Machine,
    latest: Option<&str>,
    id: &str,
) -> Result<Option<capstan_api::Machine>, capstan_kit::Error> {
    let written = machine.spec.provider_id.as_deref();
    if written == Some(id) {
        return Ok(None);
    }
    let api: kube::Api<capstan_api::Machine> = kube::Api::namespaced(
        ctx.kube.client.clone(),
        &machine.namespace().unwrap_or_default(),
    );
    // The resourceVersion makes a stale view fail rather than overwrite a
    // newer spec; the next pass looks again.
    let version = latest.map(str::to_string).or(machine.resource_version());
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": version},
        "spec": {"providerID": id},
    });
    let params = kube::api::PatchParams::default();
    let patched = match api
        .patch(
            &machine.name_any(),
            &params,
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(patched) => patched,
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(None),
        Err(e) => {
            return Err(capstan_kit::kube_err(format!(
                "cannot record spec.providerID of Machine {}",
                machine.name_any()
            ))(e));
        }
    };
    ctx.kube.metrics.wrote(CONTROLLER, "patch");
    if let Some(claimed) = written {
        let note = format!(
            "spec.providerID {claimed} is not the instance this Machine recorded; set back to {id} (a Machine's instance does not change: delete the Machine to release it)"
        );
        record_event(
            &ctx.kube,
            CONTROLLER,
            &machine.object_ref(&()),
            EventType::Warning,
            "ProviderIDRestored",
            note,
        )
        .await;
    }
    Ok(Some(patched))
}
