//! MachineHealthCheck decisions: whether one machine is healthy
//! ([`judge`]), whether the short-circuit lets remediation happen
//! ([`remediations_allowed`]), and which unhealthy machines to hand to
//! their owners now ([`to_remediate`]).
//!
//! Times are unix seconds; every answer that depends on time passing also
//! says when to look again, so the controller requeues instead of polling.

use crate::Bound;

/// A condition as observed, with the time it last changed status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedCondition {
    /// Type (`Ready`, …).
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Last transition, unix seconds.
    pub since: i64,
}

/// A condition that makes a machine unhealthy once it held `timeout` seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Condition type.
    pub type_: String,
    /// Unhealthy status.
    pub status: String,
    /// Seconds it must hold.
    pub timeout: i64,
}

/// The checks of one MachineHealthCheck.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checks {
    /// Seconds a machine may exist without a Node; 0 disables.
    pub node_startup_timeout: i64,
    /// Rules on the Node's conditions.
    pub node_rules: Vec<Rule>,
    /// Rules on the Machine's conditions.
    pub machine_rules: Vec<Rule>,
}

/// What the health check sees of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Machine name.
    pub name: String,
    /// Creation, unix seconds.
    pub created: i64,
    /// When its instance was reported provisioned (unix seconds), if it is:
    /// the node-startup timeout counts from the later of this and
    /// `created`, as in Cluster API (a slow cloud is not a dead Node).
    pub infrastructure_ready_at: Option<i64>,
    /// The Node the machine recorded (`status.nodeRef`), if any.
    pub node_ref: Option<String>,
    /// The Node's conditions, or `None` when no such Node exists.
    pub node: Option<Vec<ObservedCondition>>,
    /// The machine's own conditions.
    pub machine_conditions: Vec<ObservedCondition>,
    /// `status.failureReason`: a machine that failed for good (its instance
    /// terminated or stopped out of band, a terminal create error) is
    /// unhealthy at once, as in Cluster API.
    pub failure: Option<String>,
    /// The `cluster.x-k8s.io/remediate-machine` annotation asks for the
    /// machine to be remediated: unhealthy at once, as in Cluster API.
    pub remediation_requested: bool,
    /// The machine's in-place update, while one is under way or has failed.
    pub update: Option<InPlaceUpdate>,
}

/// An in-place update as the health check judges it: against its current
/// step's progress deadline, not the Node's condition timeouts (a Node
/// that restarts its kubelet for an update is not a broken Node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlaceUpdate {
    /// The current step, for messages: `step 1 of 2 (sim-updater)`.
    pub step: String,
    /// Why the update failed, if it did.
    pub failed: Option<String>,
    /// When the current step began, unix seconds.
    pub started: i64,
    /// When the current step last made progress, unix seconds.
    pub progress_since: i64,
    /// Seconds it may go without progress.
    pub deadline: i64,
}

/// However its percent moves, a step may run at most this many progress
/// deadlines in all: an updater cannot hold a machine out of every health
/// check by inching its percent up (1 % per deadline would be 100 of them).
pub const MAX_DEADLINES_PER_STEP: i64 = 10;

/// The verdict on one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Healthy; `recheck_in` seconds from now a pending timeout expires.
    Healthy {
        /// When to look again, if time alone could change the verdict.
        recheck_in: Option<i64>,
    },
    /// Unhealthy, with the condition reason and a message for humans.
    Unhealthy {
        /// `MachineFailed`, `NodeDeleted`, `NodeStartupTimeout`,
        /// `UnhealthyNode`, `UnhealthyMachine`.
        reason: &'static str,
        /// Which condition, since when, against which timeout.
        message: String,
    },
}

impl Verdict {
    /// Whether the verdict is unhealthy.
    pub fn is_unhealthy(&self) -> bool {
        matches!(self, Verdict::Unhealthy { .. })
    }
}

/// Judge one machine at `now`.
pub fn judge(target: &Target, checks: &Checks, now: i64) -> Verdict {
    if target.remediation_requested {
        return Verdict::Unhealthy {
            reason: "HasRemediateAnnotation",
            message: "marked for remediation via the cluster.x-k8s.io/remediate-machine annotation"
                .into(),
        };
    }
    if let Some(reason) = &target.failure {
        return Verdict::Unhealthy {
            reason: "MachineFailed",
            message: format!("the Machine failed ({reason})"),
        };
    }
    let mut recheck: Option<i64> = None;
    let mut soonest = |wait: i64| recheck = Some(recheck.map_or(wait, |r: i64| r.min(wait)));
    if let Some(update) = &target.update {
        if let Some(why) = &update.failed {
            return Verdict::Unhealthy {
                reason: "InPlaceUpdateFailed",
                message: format!("the in-place update failed: {why}"),
            };
        }
        let stalled = (now - update.progress_since).max(0);
        if stalled >= update.deadline {
            return Verdict::Unhealthy {
                reason: "InPlaceUpdateStalled",
                message: format!(
                    "the in-place update's {} made no progress for {stalled}s (its updater's progressDeadlineSeconds is {})",
                    update.step, update.deadline
                ),
            };
        }
        let ran = (now - update.started).max(0);
        let limit = update.deadline.saturating_mul(MAX_DEADLINES_PER_STEP);
        if ran >= limit {
            return Verdict::Unhealthy {
                reason: "InPlaceUpdateStalled",
                message: format!(
                    "the in-place update's {} has run for {ran}s, {MAX_DEADLINES_PER_STEP} times its updater's progressDeadlineSeconds ({})",
                    update.step, update.deadline
                ),
            };
        }
        soonest((update.deadline - stalled).min(limit - ran));
    }
    // While an update makes progress, the Node's conditions are the
    // updater's business: judged again once it is done.
    let node = if target.update.is_some() {
        NodeSeen::NotJudged
    } else {
        match &target.node {
            None => NodeSeen::Missing,
            Some(conditions) => NodeSeen::Conditions(conditions),
        }
    };
    match node {
        NodeSeen::NotJudged => {}
        NodeSeen::Missing => {
            if let Some(node) = &target.node_ref {
                return Verdict::Unhealthy {
                    reason: "NodeDeleted",
                    message: format!("Node {node} has been deleted"),
                };
            }
            if checks.node_startup_timeout > 0 {
                let started = target
                    .infrastructure_ready_at
                    .map_or(target.created, |ready| ready.max(target.created));
                let waited = now - started;
                if waited >= checks.node_startup_timeout {
                    return Verdict::Unhealthy {
                        reason: "NodeStartupTimeout",
                        message: format!(
                            "no Node joined within {}s of the machine's creation (nodeStartupTimeoutSeconds)",
                            checks.node_startup_timeout
                        ),
                    };
                }
                soonest(checks.node_startup_timeout - waited);
            }
        }
        NodeSeen::Conditions(conditions) => {
            let node = target.node_ref.as_deref().unwrap_or("the Node");
            if let Some(message) = first_expired(conditions, &checks.node_rules, now, &mut soonest)
            {
                return Verdict::Unhealthy {
                    reason: "UnhealthyNode",
                    message: format!("Node {node}: {message}"),
                };
            }
        }
    }
    if let Some(message) = first_expired(
        &target.machine_conditions,
        &checks.machine_rules,
        now,
        &mut soonest,
    ) {
        return Verdict::Unhealthy {
            reason: "UnhealthyMachine",
            message: format!("Machine: {message}"),
        };
    }
    Verdict::Healthy {
        recheck_in: recheck,
    }
}

/// What [`judge`] looks at of the Node.
enum NodeSeen<'a> {
    /// Nothing: an in-place update is under way.
    NotJudged,
    /// No Node.
    Missing,
    /// The Node's conditions.
    Conditions(&'a [ObservedCondition]),
}

/// The first rule whose condition has held past its timeout, described; the
/// rules still counting down report how long they have left.
fn first_expired(
    conditions: &[ObservedCondition],
    rules: &[Rule],
    now: i64,
    soonest: &mut impl FnMut(i64),
) -> Option<String> {
    for rule in rules {
        let Some(c) = conditions
            .iter()
            .find(|c| c.type_ == rule.type_ && c.status == rule.status)
        else {
            continue;
        };
        let held = (now - c.since).max(0);
        if held >= rule.timeout {
            return Some(format!(
                "condition {}={} for {held}s (timeout {}s)",
                rule.type_, rule.status, rule.timeout
            ));
        }
        soonest(rule.timeout - held);
    }
    None
}

/// The short-circuit of `remediation.triggerIf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trigger {
    /// `unhealthyLessThanOrEqualTo`.
    pub max_unhealthy: Option<Bound>,
    /// `unhealthyInRange`, inclusive.
    pub range: Option<(i32, i32)>,
}

/// Parse `unhealthyInRange` (`[min-max]`); the error says what was wrong.
pub fn parse_range(text: &str) -> Result<(i32, i32), String> {
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("{text:?} is not of the form [min-max], e.g. [1-3]"))?;
    let (min, max) = inner
        .split_once('-')
        .ok_or_else(|| format!("{text:?} is not of the form [min-max], e.g. [1-3]"))?;
    let parse = |n: &str| {
        n.trim()
            .parse::<i32>()
            .map_err(|_| format!("{text:?}: {n:?} is not a whole number"))
    };
    let (min, max) = (parse(min)?, parse(max)?);
    if min > max {
        return Err(format!(
            "{text:?}: the minimum {min} is above the maximum {max}"
        ));
    }
    Ok((min, max))
}

/// Whether a machine counts as healthy for the short-circuit and
/// `currentHealthy`, as in Cluster API: it is not being deleted, its Node is
/// there, and no timer is still running on it (no Node yet within the
/// startup timeout, or a condition whose timeout has not expired). Every
/// other target counts against `unhealthyLessThanOrEqualTo` /
/// `unhealthyInRange`: `unhealthy = expected - healthy`, so machines being
/// remediated, still booting or about to time out hold the breaker.
pub fn counts_healthy(verdict: &Verdict, has_node: bool, deleting: bool) -> bool {
    !deleting && has_node && matches!(verdict, Verdict::Healthy { recheck_in: None })
}

/// How many more machines may be remediated, or why none may: with
/// `unhealthy` of `expected` machines unhealthy. Percentages round down,
/// as in Cluster API.
pub fn remediations_allowed(
    expected: i32,
    unhealthy: i32,
    trigger: &Trigger,
) -> Result<i32, String> {
    if let Some((min, max)) = trigger.range {
        if unhealthy < min || unhealthy > max {
            return Err(format!(
                "{unhealthy} of {expected} machines are unhealthy, outside unhealthyInRange [{min}-{max}]: remediation is off until that changes"
            ));
        }
        return Ok(max - unhealthy);
    }
    let max = trigger
        .max_unhealthy
        .map_or(expected, |b| b.resolve(expected, false));
    if unhealthy > max {
        return Err(format!(
            "{unhealthy} of {expected} machines are unhealthy, more than unhealthyLessThanOrEqualTo allows ({max}): remediation is off until that changes"
        ));
    }
    Ok(max - unhealthy)
}

/// One unhealthy machine as the remediation choice sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    /// Machine name.
    pub name: String,
    /// Unhealthy since (unix seconds; the longest broken go first).
    pub since: i64,
    /// Already handed to its owner (`OwnerRemediated=False` set).
    pub requested: bool,
}

/// Which unhealthy machines to hand to their owners now: none when the
/// short-circuit holds; otherwise the longest-unhealthy first, while the
/// machines already in remediation (`in_flight`, including those being
/// deleted) stay within `max_in_flight`.
pub fn to_remediate(
    unhealthy: &[Unhealthy],
    in_flight: usize,
    max_in_flight: Option<usize>,
    allowed: bool,
) -> Vec<String> {
    if !allowed {
        return vec![];
    }
    let room = max_in_flight.map_or(usize::MAX, |m| m.saturating_sub(in_flight));
    let mut waiting: Vec<&Unhealthy> = unhealthy.iter().filter(|u| !u.requested).collect();
    waiting.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.name.cmp(&b.name)));
    waiting
        .into_iter()
        .take(room)
        .map(|u| u.name.clone())
        .collect()
}

#[cfg(test)]
mod tests;
