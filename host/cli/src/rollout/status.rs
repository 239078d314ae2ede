//! `capstan rollout status md/NAME`: wait for a MachineDeployment's rollout
//! the way `kubectl rollout status` waits for a Deployment's. [`judge`] is
//! the pure part (what one observation of the deployment means); [`run`]
//! watches the deployment and prints a line each time that changes.

use super::Target;
use anyhow::bail;
use capstan_api::set_conditions::PROGRESSING;
use capstan_api::{ANNOTATION_AUTOMATIC_ROLLBACK, AutomaticRollbackRecord, MachineDeployment};
use futures::TryStreamExt;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `rollout status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Give up after this long (`90s`, `10m`); 0 waits forever, as kubectl.
    #[arg(long, default_value = "0s", value_parser = crate::options::parse_duration)]
    timeout: Duration,
    /// Wait for the rollout to end (`--watch=false`: print where it stands
    /// once and exit 0 unless it failed).
    #[arg(short, long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    watch: bool,
    /// Wait for this revision instead of the current one; fails if the
    /// deployment moves past it.
    #[arg(long)]
    revision: Option<i64>,
}

/// What one observation of the deployment means for the rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Still going; the progress line.
    Waiting(String),
    /// Every machine wanted is on the current template and available.
    Complete(String),
    /// It cannot complete without someone acting: the reason (a condition
    /// reason or Capstan's word) and what happened.
    Failed { reason: String, message: String },
}

/// Judge one observation. `watched` is the revision the command waits for
/// (fixed once the controller has observed the spec it started with): a
/// deployment that rolls back automatically from it, or moves past an
/// explicit `--revision`, failed for this command.
pub fn judge(md: &MachineDeployment, watched: Option<i64>, explicit: bool) -> Verdict {
    let name = md.name_any();
    let failed = |reason: &str, message: String| Verdict::Failed {
        reason: reason.to_string(),
        message,
    };
    if md.metadata.deletion_timestamp.is_some() {
        return failed(
            "Deleting",
            format!("machinedeployment/{name} is being deleted"),
        );
    }
    let status = md.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < md.metadata.generation.unwrap_or(0) {
        return Verdict::Waiting(format!(
            "Waiting for machinedeployment \"{name}\" spec update to be observed..."
        ));
    }
    if let Some(record) = rollback_record(md)
        && watched == Some(record.from_revision)
    {
        return failed(
            &record.reason,
            format!(
                "machinedeployment/{name} rolled back automatically from revision {} to the template of revision {}: {}",
                record.from_revision, record.to_revision, record.message
            ),
        );
    }
    if explicit
        && let (Some(want), Some(now)) = (watched, status.revision)
        && now != want
    {
        return failed(
            "RevisionChanged",
            format!(
                "machinedeployment/{name} moved from revision {want} to revision {now} before it was rolled out"
            ),
        );
    }
    let progressing = capstan_api::condition(&status.conditions, PROGRESSING);
    if let Some(c) = progressing.filter(|c| c.status == capstan_api::status::FALSE) {
        return failed(&c.reason, c.message.clone());
    }
    let wanted = md.spec.replicas;
    let complete = status.updated_replicas >= wanted
        && status.replicas <= status.updated_replicas
        && status.available_replicas >= status.updated_replicas;
    if md.spec.paused && !complete {
        return failed(
            "DeploymentPaused",
            format!(
                "machinedeployment/{name} is paused with its rollout unfinished ({} of {wanted} machines updated); resume it with `capstan rollout resume md/{name}`",
                status.updated_replicas
            ),
        );
    }
    if status.updated_replicas < wanted {
        return Verdict::Waiting(format!(
            "Waiting for machinedeployment \"{name}\" rollout to finish: {} out of {wanted} new machines have been updated...",
            status.updated_replicas
        ));
    }
    if status.replicas > status.updated_replicas {
        return Verdict::Waiting(format!(
            "Waiting for machinedeployment \"{name}\" rollout to finish: {} old machines are pending termination...",
            status.replicas - status.updated_replicas
        ));
    }
    if status.available_replicas < status.updated_replicas {
        return Verdict::Waiting(format!(
            "Waiting for machinedeployment \"{name}\" rollout to finish: {} of {} updated machines are available...",
            status.available_replicas, status.updated_replicas
        ));
    }
    Verdict::Complete(format!(
        "machinedeployment \"{name}\" successfully rolled out"
    ))
}

/// The deployment's last automatic rollback, if its annotation parses.
fn rollback_record(md: &MachineDeployment) -> Option<AutomaticRollbackRecord> {
    serde_json::from_str(md.annotations().get(ANNOTATION_AUTOMATIC_ROLLBACK)?).ok()
}

/// The revision to wait for: `--revision`, else the current one once the
/// controller has observed the spec (before that, none yet).
fn watched_revision(md: &MachineDeployment, explicit: Option<i64>) -> Option<i64> {
    explicit.or_else(|| {
        let status = md.status.as_ref()?;
        (status.observed_generation.unwrap_or(0) >= md.metadata.generation.unwrap_or(0))
            .then_some(status.revision)
            .flatten()
    })
}

/// `rollout status`.
pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let (name, client, namespace) = args.target.open().await?;
    let api: kube::Api<MachineDeployment> = kube::Api::namespaced(client, &namespace);
    let missing = || anyhow::anyhow!("machinedeployment/{name} not found in namespace {namespace}");
    let first = api.get_opt(&name).await?.ok_or_else(missing)?;
    let mut watched = watched_revision(&first, args.revision);
    if !args.watch {
        return match judge(&first, watched, args.revision.is_some()) {
            Verdict::Waiting(line) | Verdict::Complete(line) => {
                println!("{line}");
                Ok(ExitCode::SUCCESS)
            }
            Verdict::Failed { reason, message } => bail!(
                "{}: {}",
                crate::describe::tree::printable(&reason),
                crate::describe::tree::printable(&message)
            ),
        };
    }
    let deadline = (!args.timeout.is_zero()).then(|| tokio::time::Instant::now() + args.timeout);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let updates = watcher(api.clone(), config)
        .default_backoff()
        .applied_objects();
    let mut updates = std::pin::pin!(updates);
    let mut last = String::new();
    let mut md = first;
    loop {
        watched = watched.or_else(|| watched_revision(&md, args.revision));
        match judge(&md, watched, args.revision.is_some()) {
            Verdict::Complete(line) => {
                println!("{line}");
                return Ok(ExitCode::SUCCESS);
            }
            Verdict::Failed { reason, message } => bail!(
                "{}: {}",
                crate::describe::tree::printable(&reason),
                crate::describe::tree::printable(&message)
            ),
            Verdict::Waiting(line) => {
                if line != last {
                    println!("{line}");
                    last = line;
                }
            }
        }
        let next = updates.try_next();
        let next = match deadline {
            Some(at) => match tokio::time::timeout_at(at, next).await {
                Ok(next) => next,
                Err(_) => bail!(
                    "timed out after {:?} waiting for machinedeployment/{name}: {last}",
                    args.timeout
                ),
            },
            None => next.await,
        };
        md = match next {
            Ok(Some(md)) => md,
            Ok(None) => bail!("the watch on machinedeployment/{name} ended"),
            Err(e) => {
                // The watcher backs off and retries by itself; a lasting
                // failure shows as the timeout.
                tracing::warn!(error = %e, "watching machinedeployment/{name}");
                continue;
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{Condition, MachineDeploymentStatus};

    fn md(replicas: i32, status: MachineDeploymentStatus) -> MachineDeployment {
        let mut md = capstan_api::MachineDeployment::new("pool", Default::default());
        md.spec.replicas = replicas;
        md.metadata.generation = Some(2);
        md.status = Some(MachineDeploymentStatus {
            observed_generation: Some(2),
            revision: Some(3),
            ..status
        });
        md
    }

    fn counts(replicas: i32, updated: i32, available: i32) -> MachineDeploymentStatus {
        MachineDeploymentStatus {
            replicas,
            updated_replicas: updated,
            available_replicas: available,
            ..Default::default()
        }
    }

    fn waiting(v: Verdict) -> String {
        match v {
            Verdict::Waiting(line) => line,
            other => panic!("not waiting: {other:?}"),
        }
    }

    #[test]
    fn progress_lines_follow_kubectl() {
        let line = waiting(judge(&md(5, counts(5, 2, 5)), Some(3), false));
        assert!(
            line.ends_with("2 out of 5 new machines have been updated..."),
            "{line}"
        );
        let line = waiting(judge(&md(5, counts(7, 5, 5)), Some(3), false));
        assert!(
            line.ends_with("2 old machines are pending termination..."),
            "{line}"
        );
        let line = waiting(judge(&md(5, counts(5, 5, 2)), Some(3), false));
        assert!(
            line.ends_with("2 of 5 updated machines are available..."),
            "{line}"
        );
        assert_eq!(
            judge(&md(5, counts(5, 5, 5)), Some(3), false),
            Verdict::Complete("machinedeployment \"pool\" successfully rolled out".into())
        );
        let mut stale = md(5, counts(5, 5, 5));
        stale.metadata.generation = Some(3);
        assert!(waiting(judge(&stale, Some(3), false)).contains("spec update to be observed"));
    }

    #[test]
    fn a_paused_unfinished_rollout_fails_and_says_how_to_resume() {
        let mut paused = md(3, counts(3, 1, 3));
        paused.spec.paused = true;
        let Verdict::Failed { reason, message } = judge(&paused, Some(3), false) else {
            panic!("a paused rollout must fail");
        };
        assert_eq!(reason, "DeploymentPaused");
        assert!(
            message.contains("capstan rollout resume md/pool"),
            "{message}"
        );
        // Paused with nothing left to do is complete.
        let mut done = md(3, counts(3, 3, 3));
        done.spec.paused = true;
        assert!(matches!(judge(&done, Some(3), false), Verdict::Complete(_)));
    }

    #[test]
    fn a_rollback_from_the_watched_revision_fails_naming_the_reason() {
        let mut rolled = md(3, counts(3, 3, 3));
        let record = AutomaticRollbackRecord {
            from: "abc".into(),
            from_revision: 3,
            to: "def".into(),
            to_revision: 4,
            reason: "ProgressDeadlineExceeded".into(),
            message: "no progress for 6s".into(),
        };
        rolled.metadata.annotations = Some(
            [(
                ANNOTATION_AUTOMATIC_ROLLBACK.to_string(),
                serde_json::to_string(&record).unwrap(),
            )]
            .into(),
        );
        let Verdict::Failed { reason, message } = judge(&rolled, Some(3), false) else {
            panic!("a rollback from the watched revision must fail");
        };
        assert_eq!(reason, "ProgressDeadlineExceeded");
        assert!(
            message.contains("rolled back automatically from revision 3"),
            "{message}"
        );
        // An older rollback says nothing about this rollout.
        assert!(matches!(
            judge(&rolled, Some(5), false),
            Verdict::Complete(_)
        ));
    }

    #[test]
    fn progressing_false_fails_with_its_reason_and_an_explicit_revision_must_hold() {
        let mut stuck = md(3, counts(3, 1, 3));
        stuck.status.as_mut().unwrap().conditions = vec![Condition {
            type_: PROGRESSING.into(),
            status: "False".into(),
            reason: "MachineSetConflict".into(),
            message: "two sets".into(),
            observed_generation: None,
            last_transition_time: capstan_api::Time(k8s_openapi::jiff::Timestamp::now()),
        }];
        assert_eq!(
            judge(&stuck, Some(3), false),
            Verdict::Failed {
                reason: "MachineSetConflict".into(),
                message: "two sets".into()
            }
        );
        let moved = md(3, counts(3, 1, 3));
        let Verdict::Failed { reason, .. } = judge(&moved, Some(2), true) else {
            panic!("moving past --revision must fail");
        };
        assert_eq!(reason, "RevisionChanged");
    }
}
