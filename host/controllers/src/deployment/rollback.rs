//! Automatic rollback (`spec.rollback`, beyond Cluster API): the
//! deployment's pass tracks the rollout of its current template
//! (`status.rollout`: when it started, the new set's remediation count
//! then, whether it completed), asks [`capstan_planner::rollback::decide`],
//! and on a trigger writes the previous revision's template back, the way
//! `capstan rollout undo` does, together with the record that keeps it
//! from happening twice (`capstan.dev/automatic-rollback`) in one
//! request guarded by the resourceVersion the decision was made on.
//!
//! Who asked: the deployment's own `spec.rollback`, and the template
//! restored is one the deployment ran before (a set it owns). Does it still
//! hold: a revision whose Plugin the namespace may no longer use is not
//! restored (the rollback is held, and `Progressing` says why); a restored
//! template is validated again on the next pass like any edit.

use super::{CONTROLLER, Context, Observed, Target, deployment_template_of, revision_of};
use capstan_api::machine_conditions::AVAILABLE;
use capstan_api::set_conditions::{PROGRESSING, ROLLED_BACK};
use capstan_api::{
    ANNOTATION_AUTOMATIC_ROLLBACK, AutomaticRollbackRecord, Machine, MachineDeployment,
    MachineDeploymentStatus, MachineSet, RolloutProgress, status as cond,
};
use capstan_kit::owners::controlled_by;
use capstan_kit::write::record_event;
use capstan_kit::{Conditions, Error, key_of, kube_err};
use capstan_planner::rollback::{self, Decision, Policy, Record};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// What this pass knows of the rollout, for the decision and the status.
pub(super) struct Rollout {
    /// `status.rollout` as this pass leaves it.
    pub(super) progress: RolloutProgress,
    /// The last automatic rollback, if the annotation holds one.
    record: Option<AutomaticRollbackRecord>,
    policy: Policy,
    paused: bool,
    seconds_without_progress: i64,
    remediated: i32,
    /// Earlier templates, newest first, with the set holding each.
    earlier: Vec<(String, Arc<MachineSet>)>,
    /// Earlier templates the deployment may no longer run, and why.
    refused: Vec<(String, String)>,
    current: String,
}

impl Rollout {
    /// Track the rollout of the current template from the last status.
    pub(super) fn observe(
        kube: &capstan_kit::Kube,
        md: &MachineDeployment,
        target: &Target,
        observed: &Observed,
        machines: &[Arc<Machine>],
        complete: bool,
        t: &capstan_api::Time,
    ) -> Rollout {
        let status = md.status.clone().unwrap_or_default();
        let remediated_now = observed
            .new_set
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .map_or(0, |s| s.remediated_replicas);
        let mut progress = match status.rollout {
            Some(p) if p.template == target.hash => p,
            _ => RolloutProgress {
                template: target.hash.clone(),
                start_time: t.clone(),
                remediated_before: remediated_now,
                complete: false,
            },
        };
        progress.complete |= complete;
        let now_s = t.0.as_second();
        // Progress: the rollout started, it was resumed (Progressing back
        // to True), or a machine of the new revision became available.
        let resumed = capstan_api::condition(&status.conditions, PROGRESSING)
            .filter(|c| c.status == cond::TRUE)
            .map(|c| c.last_transition_time.0.as_second());
        let last_available = observed.new_set.as_ref().and_then(|set| {
            let uid = set.uid().unwrap_or_default();
            machines
                .iter()
                .filter(|m| controlled_by(m.as_ref(), &uid))
                .filter(|m| m.metadata.deletion_timestamp.is_none())
                .filter_map(|m| {
                    let c = capstan_api::condition(&m.status.as_ref()?.conditions, AVAILABLE)?;
                    (c.status == cond::TRUE).then(|| c.last_transition_time.0.as_second())
                })
                .max()
        });
        let last_progress = [
            Some(progress.start_time.0.as_second()),
            resumed,
            last_available,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(now_s);
        let mut earlier: Vec<&Arc<MachineSet>> = observed.old_sets.iter().collect();
        earlier.sort_by_key(|s| std::cmp::Reverse(revision_of(s)));
        let earlier: Vec<(String, Arc<MachineSet>)> = earlier
            .into_iter()
            .map(|s| (super::template_hash(&s.spec.template), s.clone()))
            .filter(|(hash, _)| *hash != target.hash)
            .collect();
        // Does it still hold now: a revision whose Plugin was allowed when
        // it ran may have been taken off the namespace since.
        let namespace = md.namespace().unwrap_or_default();
        let refused = earlier
            .iter()
            .filter_map(|(hash, set)| {
                let plugin = &set.spec.template.spec.provider.plugin;
                let why = capstan_kit::registry::not_allowed(kube, plugin, &namespace)?;
                Some((
                    hash.clone(),
                    format!("revision {}: {why}", revision_of(set)),
                ))
            })
            .collect();
        let spec = md.spec.rollback.clone().unwrap_or_default();
        Rollout {
            policy: Policy {
                progress_deadline_seconds: spec.progress_deadline_seconds.map(i64::from),
                remediated_machines: spec.remediated_machines,
            },
            record: record_of(md),
            paused: md.spec.paused,
            seconds_without_progress: (now_s - last_progress).max(0),
            remediated: (remediated_now - progress.remediated_before).max(0),
            earlier,
            refused,
            current: target.hash.clone(),
            progress,
        }
    }

    fn view(&self) -> rollback::View<'_> {
        rollback::View {
            policy: self.policy,
            current: &self.current,
            earlier: self.earlier.iter().map(|(h, _)| h.as_str()).collect(),
            record: self.record.as_ref().map(|r| Record {
                from: &r.from,
                to: &r.to,
            }),
            completed: self.progress.complete,
            paused: self.paused,
            seconds_without_progress: self.seconds_without_progress,
            remediated: self.remediated,
            refused: self.refused.iter().map(|(h, _)| h.as_str()).collect(),
        }
    }

    /// Why a triggered rollback is held, in words (with the refusal, when
    /// the revision to return to may no longer run).
    pub(super) fn held_message(&self, trigger: &rollback::Trigger, held: rollback::Held) -> String {
        let refusal = (held == rollback::Held::EarlierRevisionRefused)
            .then(|| {
                let view = self.view();
                let to = rollback::candidate(&view)?;
                self.refused.iter().find(|(h, _)| h == to)
            })
            .flatten()
            .map(|(_, why)| format!(" ({why})"))
            .unwrap_or_default();
        format!("{}; {}{refusal}", trigger.message(), held.message())
    }

    /// The decision of this pass.
    pub(super) fn decide(&self) -> Decision {
        rollback::decide(&self.view())
    }

    /// Seconds until the progress deadline passes, if one is running.
    pub(super) fn until_deadline(&self) -> Option<u64> {
        rollback::until_deadline(&self.view()).map(|s| s.unsigned_abs())
    }

    /// `RolledBack` while the deployment runs the template a rollback
    /// restored (a held rollback is in `Progressing`).
    pub(super) fn rolled_back_condition(
        &self,
        status: &mut MachineDeploymentStatus,
        generation: Option<i64>,
        t: &capstan_api::Time,
    ) {
        match self.record.as_ref().filter(|r| r.to == self.current) {
            Some(r) => {
                Conditions::new(&mut status.conditions, generation, t).set(
                    ROLLED_BACK,
                    cond::TRUE,
                    &r.reason,
                    describe(r),
                );
            }
            None => status.conditions.retain(|c| c.type_ != ROLLED_BACK),
        }
    }

    /// Restore the template `to` with the record, in one request that fails
    /// if the deployment changed since this pass read it; then an Event.
    pub(super) async fn roll_back(
        &self,
        ctx: &Context,
        md: &MachineDeployment,
        to: &str,
        trigger: &rollback::Trigger,
        revision: i64,
    ) -> Result<(), Error> {
        let Some((_, set)) = self.earlier.iter().find(|(h, _)| h == to) else {
            return Ok(());
        };
        let record = AutomaticRollbackRecord {
            from: self.current.clone(),
            from_revision: revision,
            to: to.to_string(),
            to_revision: revision_of(set),
            reason: trigger.reason().to_string(),
            message: trigger.message(),
        };
        let value = serde_json::to_string(&record).expect("a record serializes");
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": md.resource_version()}),
            json!({"op": "replace", "path": "/spec/template", "value": deployment_template_of(set)}),
        ];
        if md.metadata.annotations.is_none() {
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        }
        let key = ANNOTATION_AUTOMATIC_ROLLBACK
            .replace('~', "~0")
            .replace('/', "~1");
        ops.push(
            json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": value}),
        );
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::Value::Array(ops)).expect("well-formed JSON patch");
        let api: Api<MachineDeployment> =
            Api::namespaced(ctx.kube.client.clone(), &md.namespace().unwrap_or_default());
        match api
            .patch(
                &md.name_any(),
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => {}
            // Changed since this pass read it (a user's edit wins): the
            // next pass decides again on what is there now.
            Err(kube::Error::Api(e)) if [404, 409, 422].contains(&e.code) => return Ok(()),
            Err(e) => {
                return Err(kube_err(format!(
                    "cannot roll back MachineDeployment {}",
                    key_of(md)
                ))(e));
            }
        }
        ctx.kube.metrics.wrote(CONTROLLER, "rollback");
        let message = describe(&record);
        tracing::warn!(deployment = %key_of(md), %message, "rolled back");
        record_event(
            &ctx.kube,
            CONTROLLER,
            &md.object_ref(&()),
            EventType::Warning,
            "RolledBack",
            message,
        )
        .await;
        Ok(())
    }
}

/// The record, read from the deployment's annotation. One that does not
/// parse (edited by hand) counts as none, with a warning: only the
/// deployment's own editors can write it.
pub(crate) fn record_of(md: &MachineDeployment) -> Option<AutomaticRollbackRecord> {
    let value = md.annotations().get(ANNOTATION_AUTOMATIC_ROLLBACK)?;
    match serde_json::from_str(value) {
        Ok(record) => Some(record),
        Err(error) => {
            tracing::warn!(deployment = %key_of(md), %error, "{ANNOTATION_AUTOMATIC_ROLLBACK} does not parse; ignored");
            None
        }
    }
}

/// A rollback, in words.
fn describe(r: &AutomaticRollbackRecord) -> String {
    format!(
        "rolled back automatically from revision {} (template {}) to the template of revision {} ({}): {}",
        r.from_revision, r.from, r.to_revision, r.to, r.message
    )
}
