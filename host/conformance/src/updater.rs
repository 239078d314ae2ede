//! The updater-world conformance checks.
//!
//! An updater changes an existing instance, so the kit first creates one
//! with a provider plugin (`--provider`) from the current config and
//! version, then checks the updater against it: `can-update` claims only
//! changed fields its manifest declares, answers the same twice and claims
//! nothing when nothing changed; `update` is re-entrant until `done` with
//! monotonic progress and a retry-after on every `in-progress`; `done` stays
//! `done`; `update` with nothing claimed is `done`; a machine without an
//! instance is a typed error (or `failed`), never a trap. The instance is
//! deleted at the end, also when checks fail.

use crate::{Outcome, Report, Run, brief, delete_until_done, finish, test_machine, wait_running};
use capstan_manifest::FieldPattern;
use capstan_runtime::types::{Machine, UpdateProgress};
use capstan_runtime::{Error, ProviderPlugin, UpdaterPlugin};
use std::time::{Duration, Instant};

/// What to run the updater checks with.
#[derive(Debug, Clone)]
pub struct UpdaterOptions {
    /// The provider config (JSON object text) the test instance is made from.
    pub config: String,
    /// The provider config after the change (default: `config`).
    pub desired_config: Option<String>,
    /// The Kubernetes version the instance is made with.
    pub version: String,
    /// The version after the change.
    pub desired_version: String,
    /// Budget for the whole run.
    pub timeout: Duration,
}

impl UpdaterOptions {
    /// A version change from `v1.30.0` to `v1.31.0` on `config`, 120 s.
    pub fn new(config: impl Into<String>) -> Self {
        UpdaterOptions {
            config: config.into(),
            desired_config: None,
            version: "v1.30.0".into(),
            desired_version: "v1.31.0".into(),
            timeout: Duration::from_secs(120),
        }
    }
}

/// The changed fields between two test machines, as the host computes them.
fn changed(current: &Machine, desired: &Machine) -> Vec<String> {
    let spec = |m: &Machine| {
        serde_json::json!({
            "version": m.version,
            "provider": {
                "plugin": "conformance",
                "config": serde_json::from_str::<serde_json::Value>(&m.provider_config).unwrap_or_default(),
            },
        })
    };
    capstan_planner::inplace::changed_fields(&spec(current), &spec(desired))
}

/// Run every updater check against `updater`, with an instance that
/// `provider` creates on the target `options.config` points to.
pub async fn run_updater(
    updater: &UpdaterPlugin,
    provider: &ProviderPlugin,
    options: &UpdaterOptions,
) -> Report {
    let mut current = test_machine(&options.config, &options.version);
    let mut run = Run {
        provider,
        deadline: Instant::now() + options.timeout,
        checks: Vec::new(),
        transients: Vec::new(),
    };
    let plugin = updater.plugin();
    let created = run
        .retrying("create", || provider.create(&current, None))
        .await;
    match created {
        Ok(status) => current.provider_id = Some(status.provider_id),
        Err(e) => {
            run.record(
                "the provider creates a test instance",
                Outcome::Fail(brief(&e)),
            );
            return finish(
                run,
                plugin,
                &current,
                "without an instance no updater check can run",
            );
        }
    }
    let outcome = wait_running(&mut run, &current).await;
    let running = outcome == Outcome::Pass;
    run.record("the provider's test instance reaches running", outcome);
    if running {
        updater_checks(&mut run, updater, &current, options).await;
    }
    let outcome = delete_until_done(&mut run, &current).await;
    run.record("the test instance is deleted", outcome);
    finish(
        run,
        plugin,
        &current,
        if running {
            ""
        } else {
            "the instance never ran"
        },
    )
}

/// `can-update`: it claims only changed fields it declares, the same
/// twice, and nothing when nothing changed. Returns what it claimed.
async fn can_update_checks(
    run: &mut Run<'_>,
    updater: &UpdaterPlugin,
    current: &Machine,
    desired: &Machine,
    changed: &[String],
) -> Vec<String> {
    let declared: Vec<FieldPattern> = updater.plugin().manifest().update_fields.clone();
    let first = run
        .retrying("can-update", || {
            updater.can_update(current, desired, changed)
        })
        .await;
    let claimed = match &first {
        Ok(claimed) => {
            let outside: Vec<&String> = claimed
                .iter()
                .filter(|f| !changed.contains(f) || !declared.iter().any(|p| p.matches(f)))
                .collect();
            let outcome = if outside.is_empty() {
                Outcome::Pass
            } else {
                Outcome::Fail(format!(
                    "claimed {outside:?}, which are not among the changed fields {changed:?} or not declared in updateFields {:?}",
                    declared.iter().map(ToString::to_string).collect::<Vec<_>>()
                ))
            };
            run.record("can-update claims only changed fields it declares", outcome);
            claimed.clone()
        }
        Err(e) => {
            run.record(
                "can-update claims only changed fields it declares",
                Outcome::Fail(brief(e)),
            );
            Vec::new()
        }
    };
    let second = run
        .retrying("can-update (repeat)", || {
            updater.can_update(current, desired, changed)
        })
        .await;
    let outcome = match (&first, &second) {
        (Ok(a), Ok(b)) if a == b => Outcome::Pass,
        (Ok(a), Ok(b)) => Outcome::Fail(format!("first claimed {a:?}, then {b:?}")),
        (_, Err(e)) => Outcome::Fail(brief(e)),
        (Err(_), Ok(_)) => Outcome::Skip("the first can-update failed".into()),
    };
    run.record("can-update answers the same twice", outcome);
    let none = run
        .retrying("can-update (nothing changed)", || {
            updater.can_update(current, current, &[])
        })
        .await;
    let outcome = match none {
        Ok(c) if c.is_empty() => Outcome::Pass,
        Ok(c) => Outcome::Fail(format!("claimed {c:?} although nothing changed")),
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record("can-update claims nothing when nothing changed", outcome);
    claimed
}

/// After `done`, `update` answers `done` again, twice (re-entrant and
/// idempotent).
async fn done_stays_done(
    run: &mut Run<'_>,
    updater: &UpdaterPlugin,
    current: &Machine,
    desired: &Machine,
    claimed: &[String],
) -> Outcome {
    let mut outcome = Outcome::Pass;
    for i in 0..2 {
        match run
            .retrying("update (after done)", || {
                updater.update(current, desired, claimed)
            })
            .await
        {
            Ok(UpdateProgress::Done) => {}
            Ok(other) => {
                outcome = Outcome::Fail(format!(
                    "call {} after done returned {other:?}: done must stay done (re-entrant, idempotent)",
                    i + 1
                ));
                break;
            }
            Err(e) => {
                outcome = Outcome::Fail(brief(&e));
                break;
            }
        }
    }
    outcome
}

async fn updater_checks(
    run: &mut Run<'_>,
    updater: &UpdaterPlugin,
    current: &Machine,
    options: &UpdaterOptions,
) {
    let mut desired = current.clone();
    desired.version = Some(options.desired_version.clone());
    if let Some(config) = &options.desired_config {
        desired.provider_config = config.clone();
    }
    let changed = changed(current, &desired);

    let claimed = can_update_checks(run, updater, current, &desired, &changed).await;

    // update with nothing claimed changes nothing.
    let outcome = match run
        .retrying("update (nothing claimed)", || {
            updater.update(current, &desired, &[])
        })
        .await
    {
        Ok(UpdateProgress::Done) => Outcome::Pass,
        Ok(other) => Outcome::Fail(format!("expected done, got {other:?}")),
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record("update with nothing claimed is done", outcome);

    if claimed.is_empty() {
        run.record(
            "update reaches done with monotonic progress",
            Outcome::Skip(format!(
                "the updater claimed none of {changed:?}; pass --desired-config or --desired-version with a change it applies"
            )),
        );
    } else {
        let (outcome, done) = update_until_done(run, updater, current, &desired, &claimed).await;
        run.record("update reaches done with monotonic progress", outcome);
        if done {
            let outcome = done_stays_done(run, updater, current, &desired, &claimed).await;
            run.record("done is stable when called again", outcome);
        }
    }

    // A machine without an instance: a typed answer, never a trap.
    let mut orphan = current.clone();
    orphan.provider_id = None;
    let fields = if claimed.is_empty() {
        changed.clone()
    } else {
        claimed
    };
    let outcome = match updater.update(&orphan, &desired, &fields).await {
        Ok(UpdateProgress::Failed(_)) | Err(Error::Plugin { .. }) => Outcome::Pass,
        Ok(other) => Outcome::Fail(format!(
            "a machine without a provider ID got {other:?}; expected failed or a plugin error"
        )),
        Err(e) => Outcome::Fail(format!("not a typed error: {e}")),
    };
    run.record(
        "update of a machine without an instance is a typed error",
        outcome,
    );
}

/// Call `update` until `done` (or `failed`, an error, the budget). A
/// progress violation fails the check but the calls go on, so the checks
/// after it still run against an updated instance. The flag says whether
/// `done` was reached.
async fn update_until_done(
    run: &mut Run<'_>,
    updater: &UpdaterPlugin,
    current: &Machine,
    desired: &Machine,
    claimed: &[String],
) -> (Outcome, bool) {
    let mut last_percent: Option<u8> = None;
    let mut violation: Option<String> = None;
    let verdict = |violation: Option<String>| violation.map_or(Outcome::Pass, Outcome::Fail);
    loop {
        match run
            .retrying("update", || updater.update(current, desired, claimed))
            .await
        {
            Ok(UpdateProgress::Done) => return (verdict(violation), true),
            Ok(UpdateProgress::Failed(m)) => {
                return (Outcome::Fail(format!("update failed: {m}")), false);
            }
            Ok(UpdateProgress::InProgress(p)) => {
                if p.retry_after_ms == 0 {
                    violation.get_or_insert("in-progress with retry-after 0".into());
                }
                if let Some(percent) = p.percent {
                    if percent > 100 {
                        violation.get_or_insert(format!("percent {percent} is above 100"));
                    }
                    if let Some(last) = last_percent.filter(|last| percent < *last) {
                        violation.get_or_insert(format!(
                            "progress went backwards: {last}% then {percent}%"
                        ));
                    }
                    last_percent = Some(percent);
                }
                if Instant::now() >= run.deadline {
                    let mut message = "still in progress when the time budget ran out".to_string();
                    if let Some(v) = violation {
                        message = format!("{v}; {message}");
                    }
                    return (Outcome::Fail(message), false);
                }
                tokio::time::sleep(Duration::from_millis(p.retry_after_ms.clamp(10, 2_000))).await;
            }
            Err(e) => return (Outcome::Fail(brief(&e)), false),
        }
    }
}
