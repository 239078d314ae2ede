//! Deleting what an object controls before the object itself goes, as
//! Cluster API's MachineDeployment and MachineSet controllers do (their
//! finalizers `cluster.x-k8s.io/machinedeployment` and
//! `cluster.x-k8s.io/machineset`): a deleted MachineDeployment deletes its
//! MachineSets, a deleted MachineSet its Machines, and each keeps its
//! finalizer until its children are gone.
//!
//! Why not leave it to the garbage collector: kube-controller-manager's
//! collector reads every dependent back from the API server before it
//! deletes it, under its own client rate limit (20 QPS by default), so a
//! fleet of 1,000 machines waits on it for tens of seconds before the first
//! drain starts; the owner's controller deletes them straight from its
//! cache. The owner also stays visible (with its status) until its last
//! machine is gone.
//!
//! `kubectl delete --cascade=orphan` is honoured: the collector's `orphan`
//! finalizer means the children stay, so the owner lets go at once. Only
//! children in the owner's namespace whose controller owner reference
//! carries the owner's uid are deleted: never another owner's objects,
//! whatever their labels say, nor an object elsewhere that names the
//! owner's uid.
//!
//! [`step`] decides (pure, tested here); [`run`] does it; [`start_pass`]
//! puts both finalizers' handling at the start of an owner's reconcile.

use crate::owners::controlled_by;
use crate::write::{add_finalizer, remove_finalizer};
use crate::{Error, Expectations, Kind, Kube, ScopeApi, Seen, key_of, kube_err};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use std::time::Duration;

/// The garbage collector's finalizer for `--cascade=orphan`.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// What a deleting owner does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a, C> {
    /// The owner does not carry `finalizer` (made before Capstan added it,
    /// or already let go): the garbage collector has the children.
    NotOurs,
    /// Remove the finalizer: no child is left, or they are to be orphaned.
    LetGo,
    /// Delete these children (the ones not deleting yet), then wait.
    Delete(Vec<&'a C>),
    /// Every child is deleting; wait until they are gone.
    Wait,
}

/// The next step of a deleting `owner` whose controller holds `finalizer`,
/// given the objects that could be its children (any of them; only those it
/// controls count).
pub fn step<'a, O, C>(
    owner: &O,
    finalizer: &str,
    candidates: impl IntoIterator<Item = &'a C>,
) -> Step<'a, C>
where
    O: ResourceExt,
    C: ResourceExt + 'a,
{
    let finalizers = owner.finalizers();
    if !finalizers.iter().any(|f| f == finalizer) {
        return Step::NotOurs;
    }
    if finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
        return Step::LetGo;
    }
    let uid = owner.uid().unwrap_or_default();
    let namespace = owner.namespace();
    // Owner references never cross namespaces; one that claims to is
    // someone else's object, not this owner's child.
    let children: Vec<&C> = candidates
        .into_iter()
        .filter(|c| !uid.is_empty() && controlled_by(*c, &uid) && c.namespace() == namespace)
        .collect();
    if children.is_empty() {
        return Step::LetGo;
    }
    let to_delete: Vec<&C> = children
        .into_iter()
        .filter(|c| c.meta().deletion_timestamp.is_none())
        .collect();
    if to_delete.is_empty() {
        Step::Wait
    } else {
        Step::Delete(to_delete)
    }
}

/// How long a deleting owner waits before it looks again on its own: its
/// children's watch events wake it sooner as they go.
const RECHECK: Duration = Duration::from_secs(5);

/// The start of an owner's pass: a paused owner waits (deleting or not, as
/// in Cluster API), a deleting one takes its [`run`] step, any other gets
/// `finalizer` (if it lacks it) and goes on with its pass (`None`).
/// `children` is read only when the owner is deleting.
pub async fn start_pass<O, C>(
    kube: &Kube,
    controller: &'static str,
    owner: &O,
    finalizer: &str,
    expectations: &Expectations,
    children: impl FnOnce() -> Vec<std::sync::Arc<C>>,
) -> Result<Option<Action>, Error>
where
    O: Kind,
    C: Kind,
{
    if crate::paused(owner) {
        return Ok(Some(Action::await_change()));
    }
    if owner.meta().deletion_timestamp.is_some() {
        return run(
            kube,
            controller,
            owner,
            finalizer,
            expectations,
            &children(),
        )
        .await
        .map(Some);
    }
    add_finalizer(kube, controller, owner, finalizer).await?;
    Ok(None)
}

/// Take the next step for a deleting `owner`; the action is the reconcile's
/// result (nothing more to do once the owner is let go). Deletions it sent
/// are awaited in `expectations` (the owner's, by uid): a child's event can
/// wake the owner before the cache shows its other children deleting, and
/// they must not be deleted twice.
pub async fn run<O, C>(
    kube: &Kube,
    controller: &'static str,
    owner: &O,
    finalizer: &str,
    expectations: &Expectations,
    candidates: &[std::sync::Arc<C>],
) -> Result<Action, Error>
where
    O: Kind,
    C: Kind,
{
    let key = owner.uid().unwrap_or_default();
    let namespace = owner.namespace();
    let seen = |name: &str| {
        Seen::of(
            candidates
                .iter()
                .find(|c| c.name_any() == name && c.namespace() == namespace)
                .map(|c| c.meta()),
        )
    };
    if !expectations.satisfied(&key, seen) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    match step(owner, finalizer, candidates.iter().map(AsRef::as_ref)) {
        Step::NotOurs => Ok(Action::await_change()),
        Step::LetGo => {
            remove_finalizer(kube, controller, owner, finalizer).await?;
            Ok(Action::await_change())
        }
        Step::Wait => Ok(Action::requeue(RECHECK)),
        Step::Delete(children) => {
            let count = children.len();
            // A few at a time: a set of thousands goes in seconds, within
            // the client's rate limit, without one request per machine in
            // flight at once.
            for chunk in children.chunks(DELETES_IN_FLIGHT) {
                let mut deletes = Vec::with_capacity(chunk.len());
                for child in chunk {
                    deletes.push(delete_child(kube, controller, owner, *child));
                }
                let results = futures::future::join_all(deletes).await;
                // Recorded before an error is returned: what was sent is
                // awaited either way.
                expectations.expect(&key, vec![], chunk.iter().map(|c| c.name_any()).collect());
                for result in results {
                    result?;
                }
            }
            tracing::info!(
                owner = %key_of(owner),
                kind = %O::kind(&()),
                count,
                "deleting what it controls before it goes"
            );
            Ok(Action::requeue(RECHECK))
        }
    }
}

/// Deletes a deleting owner's children this many at a time.
const DELETES_IN_FLIGHT: usize = 16;

async fn delete_child<O: Kind, C: Kind>(
    kube: &Kube,
    controller: &'static str,
    owner: &O,
    child: &C,
) -> Result<(), Error> {
    let api: Api<C> = C::Scope::api(kube.client.clone(), child.namespace().as_deref());
    // Only as the cache saw it: a child replaced under the same name, or
    // changed since (handed to another owner, say), is looked at again on
    // the next pass.
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: child.uid(),
            resource_version: child.resource_version(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&child.name_any(), &params).await {
        Ok(_) => kube.metrics.wrote(controller, "delete"),
        // Gone already, or changed since the cache saw it.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => {
            return Err(kube_err(format!(
                "cannot delete {} {} (its owner {} {} is being deleted)",
                C::kind(&()),
                key_of(child),
                O::kind(&()),
                key_of(owner)
            ))(e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    const FINALIZER: &str = "capstan.dev/test";

    fn owner(finalizers: &[&str]) -> ConfigMap {
        let mut o = ConfigMap::default();
        o.metadata.name = Some("owner".into());
        o.metadata.uid = Some("owner-uid".into());
        o.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        o
    }

    fn child(name: &str, controller_uid: &str, controller: bool, deleting: bool) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.owner_references = Some(vec![OwnerReference {
            uid: controller_uid.into(),
            controller: Some(controller),
            ..Default::default()
        }]);
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        c
    }

    fn names<C: ResourceExt>(step: Step<'_, C>) -> Vec<String> {
        match step {
            Step::Delete(children) => children.iter().map(|c| c.name_any()).collect(),
            _ => vec![],
        }
    }

    #[test]
    fn an_owner_without_the_finalizer_is_left_to_the_garbage_collector() {
        let children = [child("a", "owner-uid", true, false)];
        assert_eq!(step(&owner(&[]), FINALIZER, &children), Step::NotOurs);
        assert_eq!(
            step(&owner(&["someone-else"]), FINALIZER, &children),
            Step::NotOurs
        );
    }

    #[test]
    fn only_the_children_it_controls_and_not_yet_deleting_are_deleted() {
        let children = [
            child("mine", "owner-uid", true, false),
            child("mine-deleting", "owner-uid", true, true),
            child("owned-not-controlled", "owner-uid", false, false),
            child("another-owners", "other-uid", true, false),
        ];
        assert_eq!(
            names(step(&owner(&[FINALIZER]), FINALIZER, &children)),
            ["mine"]
        );
    }

    #[test]
    fn an_object_in_another_namespace_naming_the_owner_is_not_its_child() {
        let mut o = owner(&[FINALIZER]);
        o.metadata.namespace = Some("team-a".into());
        let mut elsewhere = child("elsewhere", "owner-uid", true, false);
        elsewhere.metadata.namespace = Some("team-b".into());
        let mut mine = child("mine", "owner-uid", true, false);
        mine.metadata.namespace = Some("team-a".into());
        assert_eq!(
            names(step(&o, FINALIZER, &[elsewhere.clone(), mine])),
            ["mine"]
        );
        assert_eq!(step(&o, FINALIZER, &[elsewhere]), Step::LetGo);
    }

    #[test]
    fn it_waits_while_children_are_deleting_and_lets_go_when_none_is_left() {
        let deleting = [child("a", "owner-uid", true, true)];
        assert_eq!(step(&owner(&[FINALIZER]), FINALIZER, &deleting), Step::Wait);
        let others = [child("b", "other-uid", true, false)];
        assert_eq!(step(&owner(&[FINALIZER]), FINALIZER, &others), Step::LetGo);
        assert_eq!(
            step::<_, ConfigMap>(&owner(&[FINALIZER]), FINALIZER, &[]),
            Step::LetGo
        );
    }

    #[test]
    fn cascade_orphan_keeps_the_children_and_lets_go() {
        let children = [child("a", "owner-uid", true, false)];
        assert_eq!(
            step(&owner(&[ORPHAN_FINALIZER, FINALIZER]), FINALIZER, &children),
            Step::LetGo
        );
    }

    #[test]
    fn an_owner_without_a_uid_deletes_nothing() {
        let mut o = owner(&[FINALIZER]);
        o.metadata.uid = None;
        let children = [child("a", "", true, false)];
        assert_eq!(step(&o, FINALIZER, &children), Step::LetGo);
    }
}
