//! Rollout history and rollback of a MachineDeployment (what
//! `capstan rollout history|undo` runs). Each MachineSet the deployment
//! keeps is one revision; undo copies a revision's template back into the
//! deployment, and the controller rolls it out like any template change.

use crate::deployment::{
    automatic_rollback_of, deployment_template_of, set_revision, template_hash,
};
use capstan_api::{ANNOTATION_CHANGE_CAUSE, MachineDeployment, MachineSet};
use capstan_kit::owners::controlled_by;
use capstan_kit::{Error, kube_err};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

/// One revision of a deployment.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// Revision number.
    pub revision: i64,
    /// The MachineSet holding it.
    pub machine_set: String,
    /// Whether the deployment's template is this revision's.
    pub current: bool,
    /// The template's Kubernetes version.
    pub version: Option<String>,
    /// The set's replicas.
    pub replicas: i32,
    /// The `capstan.dev/change-cause` annotation, if any.
    pub change_cause: Option<String>,
    /// The deployment's last automatic rollback left this template
    /// (`spec.rollback`, recorded in `capstan.dev/automatic-rollback`).
    pub rolled_back_from: bool,
}

async fn load(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(MachineDeployment, Vec<(Revision, MachineSet)>), Error> {
    let mds: Api<MachineDeployment> = Api::namespaced(client.clone(), namespace);
    let md = mds
        .get_opt(name)
        .await
        .map_err(kube_err(format!(
            "cannot read MachineDeployment {namespace}/{name}"
        )))?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "MachineDeployment {namespace}/{name} does not exist"
            ))
        })?;
    let uid = md.uid().unwrap_or_default();
    let current = template_hash(&md.spec.template);
    let rolled_back_from = automatic_rollback_of(&md).map(|r| r.from);
    let sets: Api<MachineSet> = Api::namespaced(client.clone(), namespace);
    let mut revisions: Vec<(Revision, MachineSet)> = sets
        .list(&ListParams::default())
        .await
        .map_err(kube_err("cannot list MachineSets"))?
        .items
        .into_iter()
        .filter(|s| controlled_by(s, &uid))
        .map(|set| {
            let template = deployment_template_of(&set);
            let hash = template_hash(&template);
            let revision = Revision {
                revision: set_revision(&set),
                machine_set: set.name_any(),
                current: hash == current,
                rolled_back_from: rolled_back_from.as_ref() == Some(&hash),
                version: template.spec.version.clone(),
                replicas: set.spec.replicas,
                change_cause: set.annotations().get(ANNOTATION_CHANGE_CAUSE).cloned(),
            };
            (revision, set)
        })
        .collect();
    revisions.sort_by_key(|(r, _)| r.revision);
    Ok((md, revisions))
}

/// The revisions of a deployment, oldest first.
pub async fn history(client: &Client, namespace: &str, name: &str) -> Result<Vec<Revision>, Error> {
    let (_, revisions) = load(client, namespace, name).await?;
    Ok(revisions.into_iter().map(|(r, _)| r).collect())
}

/// Roll back to `to_revision` (default: the newest revision before the
/// current one). Returns the revision rolled back to, or `None` when the
/// deployment already runs it.
pub async fn undo(
    client: &Client,
    namespace: &str,
    name: &str,
    to_revision: Option<i64>,
) -> Result<Option<i64>, Error> {
    let (md, revisions) = load(client, namespace, name).await?;
    let current = revisions
        .iter()
        .find(|(r, _)| r.current)
        .map(|(r, _)| r.revision);
    let target = match to_revision {
        Some(n) => revisions.iter().find(|(r, _)| r.revision == n).ok_or_else(|| {
            let known: Vec<String> = revisions.iter().map(|(r, _)| r.revision.to_string()).collect();
            Error::NotFound(format!(
                "revision {n} of md/{name} not found; known revisions: {} (see `capstan rollout history md/{name}`)",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ))
        })?,
        None => revisions
            .iter()
            .rev()
            .find(|(r, _)| !r.current && current.is_none_or(|c| r.revision < c))
            .ok_or_else(|| Error::NotFound(format!("md/{name} has no earlier revision to roll back to")))?,
    };
    if target.0.current {
        return Ok(None);
    }
    // Replace (not merge) so fields the old template lacks go away; the
    // resourceVersion read above guards against a concurrent edit.
    let mut updated = md.clone();
    updated.spec.template = deployment_template_of(&target.1);
    updated.status = None;
    let mds: Api<MachineDeployment> = Api::namespaced(client.clone(), namespace);
    mds.replace(name, &PostParams::default(), &updated)
        .await
        .map_err(kube_err(format!(
            "cannot update the template of md/{name} (if it changed meanwhile, run the command again)"
        )))?;
    Ok(Some(target.0.revision))
}
