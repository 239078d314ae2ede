//! Cluster API v1beta2 conditions on MachineSets and MachineDeployments
//! (`MachinesReady`, `MachinesUpToDate`, `RollingOut`, `ScalingUp`,
//! `ScalingDown`, `Remediating`, `Deleting`, `Paused`): the Machines are
//! tallied here, the conditions decided by
//! `capstan_planner::set_conditions`. A paused or deleting object's pass
//! stops early, so [`held`] marks those two before it does. The tally
//! also gives `status.versions` (`capstan_planner::versions`).

use capstan_api::Machine;
use capstan_api::machine_conditions::{OWNER_REMEDIATED, READY, UP_TO_DATE};
use capstan_kit::Conditions;
use capstan_planner::set_conditions::{Summary, conditions as conditions_of};
use capstan_planner::versions::{self, MachineVersion};
use kube::ResourceExt;

/// The Machines of a set or deployment, as the conditions need them.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    current: i32,
    not_ready: Vec<String>,
    not_up_to_date: Vec<String>,
    remediating: Vec<String>,
    /// Every Machine's version, for `status.versions` (creation in
    /// seconds, name, the Node's kubelet version, `spec.version`).
    versions: Vec<(i64, String, Option<String>, Option<String>)>,
}

impl Tally {
    /// Count a Machine. One being deleted counts only while a health
    /// check's remediation of it is under way (as in Cluster API, until
    /// it is gone).
    pub(crate) fn add(&mut self, m: &Machine, deleting: bool) {
        let conds = m
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let name = m.name_any();
        // Counted also while being deleted, as Cluster API counts them.
        self.versions.push((
            m.metadata
                .creation_timestamp
                .as_ref()
                .map_or(i64::MIN, |t| t.0.as_second()),
            name.clone(),
            m.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|n| n.kubelet_version.clone()),
            m.spec.version.clone(),
        ));
        if capstan_api::condition(conds, OWNER_REMEDIATED).is_some_and(|c| c.status == "False") {
            self.remediating.push(name.clone());
        }
        if deleting {
            return;
        }
        self.current += 1;
        if !capstan_api::is_true(conds, READY) {
            self.not_ready.push(name.clone());
        }
        if !capstan_api::is_true(conds, UP_TO_DATE) {
            self.not_up_to_date.push(name);
        }
    }

    /// Machines counted whose `UpToDate` is `True`.
    pub(crate) fn up_to_date(&self) -> i32 {
        self.current - self.not_up_to_date.len() as i32
    }

    /// The versions of the Machines counted (`status.versions`).
    pub(crate) fn versions(&self) -> Vec<capstan_api::StatusVersion> {
        let machines = self
            .versions
            .iter()
            .map(|(created, name, kubelet, spec)| MachineVersion {
                created: *created,
                name,
                kubelet: kubelet.as_deref(),
                spec: spec.as_deref(),
            })
            .collect();
        versions::aggregate(machines)
            .into_iter()
            .map(|c| capstan_api::StatusVersion {
                version: c.version,
                replicas: c.replicas,
            })
            .collect()
    }

    /// Set the conditions for an object that wants `desired` replicas (and
    /// is neither paused nor deleting: its pass ran).
    pub(crate) fn apply(&self, list: &mut Conditions<'_>, desired: i32, deployment: bool) {
        let summary = Summary {
            desired,
            current: self.current,
            not_ready: self.not_ready.clone(),
            not_up_to_date: self.not_up_to_date.clone(),
            remediating: self.remediating.clone(),
            deleting: false,
            paused: false,
            deployment,
        };
        for c in conditions_of(&summary) {
            list.set(c.type_, c.status, c.reason, c.message);
        }
    }
}

/// For a set or deployment whose pass stops early (paused, or deleting):
/// write its `Paused` and `Deleting` conditions (only those two change;
/// `conditions` picks the list out of its status). Nothing otherwise.
pub(crate) async fn write_held<K, S>(
    kube: &capstan_kit::Kube,
    controller: &'static str,
    obj: &K,
    current: Option<&S>,
    conditions: impl FnOnce(&mut S) -> &mut Vec<capstan_api::Condition>,
) -> Result<(), capstan_kit::Error>
where
    K: capstan_kit::Kind,
    S: Clone + Default + serde::Serialize + PartialEq,
{
    let (paused, deleting) = (
        capstan_kit::paused(obj),
        obj.meta().deletion_timestamp.is_some(),
    );
    if !(paused || deleting) {
        return Ok(());
    }
    let mut held = current.cloned().unwrap_or_default();
    let t = capstan_kit::now();
    let mut list = Conditions::new(conditions(&mut held), obj.meta().generation, &t);
    for c in conditions_of(&Summary {
        paused,
        deleting,
        ..Summary::default()
    }) {
        if matches!(c.type_, "Paused" | "Deleting") {
            list.set(c.type_, c.status, c.reason, c.message);
        }
    }
    capstan_kit::write::apply_status(kube, controller, obj, current, &held).await?;
    Ok(())
}

/// A Warning Event `DeprecatedFields` when this pass's `ValidSpec` newly
/// names v1beta1 fields (once per change of the message, not per pass).
pub(crate) async fn warn_renamed<K>(
    kube: &capstan_kit::Kube,
    controller: &'static str,
    object: &K,
    before: &[capstan_api::Condition],
    after: &[capstan_api::Condition],
) where
    K: kube::Resource<DynamicType = ()>,
{
    use capstan_api::set_conditions::VALID_SPEC;
    use capstan_kit::conditions::DEPRECATED_FIELDS;
    let Some(now) =
        capstan_api::condition(after, VALID_SPEC).filter(|c| c.reason == DEPRECATED_FIELDS)
    else {
        return;
    };
    let was = capstan_api::condition(before, VALID_SPEC);
    if was.is_some_and(|c| c.reason == now.reason && c.message == now.message) {
        return;
    }
    capstan_kit::write::record_event(
        kube,
        controller,
        &object.object_ref(&()),
        kube::runtime::events::EventType::Warning,
        DEPRECATED_FIELDS,
        now.message.clone(),
    )
    .await;
}
