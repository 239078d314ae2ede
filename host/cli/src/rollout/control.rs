//! `capstan rollout pause|resume|restart md/NAME`: the three writes a
//! kubectl or clusterctl user makes to steer a rollout. Pause and resume set
//! `spec.paused`; restart sets `spec.rollout.after` to now (Cluster API's
//! field: every machine made before it is replaced once). Each is one merge
//! patch, idempotent, and says what it did.

use super::Target;
use anyhow::bail;
use capstan_api::MachineDeployment;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::process::ExitCode;

/// What to do to the rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Pause,
    Resume,
    Restart,
}

/// The patch a verb makes to `md`, or `None` with the reason when there is
/// nothing to do; an error when it must not be done.
pub fn patch_for(
    verb: Verb,
    md: &MachineDeployment,
    now: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<Result<serde_json::Value, String>> {
    let name = md.metadata.name.as_deref().unwrap_or_default();
    if md.metadata.deletion_timestamp.is_some() {
        bail!("machinedeployment/{name} is being deleted; its rollout cannot be changed");
    }
    Ok(match verb {
        Verb::Pause if md.spec.paused => Err(format!("machinedeployment/{name} already paused")),
        Verb::Resume if !md.spec.paused => Err(format!("machinedeployment/{name} is not paused")),
        Verb::Pause | Verb::Resume => Ok(json!({ "spec": { "paused": verb == Verb::Pause } })),
        // As clusterctl: a paused deployment would not act on it, and the
        // user would wait for a restart that never comes.
        Verb::Restart if md.spec.paused => bail!(
            "machinedeployment/{name} is paused; resume it first (`capstan rollout resume md/{name}`)"
        ),
        Verb::Restart => {
            // Seconds, as the API server stores it: a restart twice in
            // one second is one restart.
            let after = k8s_openapi::jiff::Timestamp::from_second(now.as_second())
                .expect("now is a valid timestamp");
            Ok(json!({ "spec": { "rollout": { "after": capstan_api::Time(after) } } }))
        }
    })
}

/// `rollout pause|resume|restart`.
pub async fn run(verb: Verb, target: Target) -> anyhow::Result<ExitCode> {
    let (name, client, namespace) = target.open().await?;
    let api: kube::Api<MachineDeployment> = kube::Api::namespaced(client, &namespace);
    let md = api.get_opt(&name).await?.ok_or_else(|| {
        anyhow::anyhow!("machinedeployment/{name} not found in namespace {namespace}")
    })?;
    match patch_for(verb, &md, k8s_openapi::jiff::Timestamp::now())? {
        Err(nothing_to_do) => println!("{nothing_to_do}"),
        Ok(patch) => {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let done = match verb {
                Verb::Pause => "paused",
                Verb::Resume => "resumed",
                Verb::Restart => "restarted",
            };
            println!("machinedeployment/{name} {done}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(paused: bool) -> MachineDeployment {
        let mut md = MachineDeployment::new("pool", Default::default());
        md.spec.paused = paused;
        md
    }

    #[test]
    fn pause_and_resume_are_idempotent() {
        let now = k8s_openapi::jiff::Timestamp::now();
        assert_eq!(
            patch_for(Verb::Pause, &md(false), now).unwrap(),
            Ok(json!({"spec": {"paused": true}}))
        );
        assert!(patch_for(Verb::Pause, &md(true), now).unwrap().is_err());
        assert_eq!(
            patch_for(Verb::Resume, &md(true), now).unwrap(),
            Ok(json!({"spec": {"paused": false}}))
        );
        assert!(patch_for(Verb::Resume, &md(false), now).unwrap().is_err());
    }

    #[test]
    fn restart_sets_rollout_after_to_the_second_and_refuses_a_paused_deployment() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-29T10:00:00.750Z".parse().unwrap();
        assert_eq!(
            patch_for(Verb::Restart, &md(false), now).unwrap(),
            Ok(json!({"spec": {"rollout": {"after": "2026-11-29T10:00:00Z"}}}))
        );
        let e = patch_for(Verb::Restart, &md(true), now).unwrap_err();
        assert!(
            e.to_string().contains("capstan rollout resume md/pool"),
            "{e}"
        );
    }
}
