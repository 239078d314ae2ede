//! The MachineDeployment controller: one MachineSet per template revision,
//! replica targets from [`capstan_planner::rollout::plan`], history pruned
//! to `revisionHistoryLimit`, and status with `Available` / `Progressing`.
//!
//! The set for the current template is named `<deployment>-<template hash>`,
//! so creating it twice (after a restart, or a stale cache) is harmless.
//! Rollback (`capstan rollout undo`) copies an old set's template back into
//! the deployment; that set then becomes the newest revision.

use crate::machineset::health;
pub use crate::template::template_hash;
use crate::template::{created, int_or_percent, rollout_after, salted_hash};
use capstan_api::{
    ANNOTATION_IN_PLACE_TO, ANNOTATION_REVISION, DeploymentPhase, InPlaceStrategy, IntOrString,
    LABEL_DEPLOYMENT_NAME, LABEL_TEMPLATE_HASH, MACHINEDEPLOYMENT_FINALIZER, Machine,
    MachineDeployment, MachineDeploymentStatus, MachineSet, MachineTemplateSpec, StrategyType,
    selector_mismatch, selector_string,
};
use capstan_kit::cascade::start_pass;
use capstan_kit::controller::Spec;
use capstan_kit::owners::{claim, controlled_by, controller_of};
use capstan_kit::write::apply_status;
use capstan_kit::{Conditions, Error, Kube, now, owner_key};
use capstan_planner::rollback::Decision as RollbackDecision;
use capstan_planner::rollout::{self, SetView, Strategy};
use capstan_planner::{Bound, Bounds, Health};
use futures::StreamExt as _;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use std::sync::Arc;
use std::time::Duration;

mod in_place;
mod rollback;
mod sets;
mod status;

pub(crate) use rollback::record_of as automatic_rollback_of;
use sets::{prune, write_sets};
use status::{RolloutState, derive_status};

use in_place::{Decision, Kind, decide};

const CONTROLLER: &str = "machinedeployment";
/// Default `revisionHistoryLimit`.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// What the MachineDeployment controller works with.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) kube: Kube,
    /// Updaters by Plugin name, to decide which machines update in place.
    pub(crate) updaters: capstan_kit::registry::Updaters,
    /// What the updaters would claim of each machine, cached.
    pub(crate) plans: in_place::PlanCache,
    /// Sets a deleting deployment deleted that the cache has not shown yet.
    pub(crate) expectations: capstan_kit::Expectations,
    /// The scale-from-zero capacity its Plugin says (the autoscaler's).
    pub(crate) capacities: crate::capacity::Capacities,
}

impl AsRef<Kube> for Context {
    fn as_ref(&self) -> &Kube {
        &self.kube
    }
}

pub(crate) async fn controller(
    deployments: ReflectHandle<MachineDeployment>,
    sets: ReflectHandle<MachineSet>,
    deleted_sets: impl futures::Stream<Item = Arc<MachineSet>> + Send + 'static,
    ctx: Arc<Context>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let store = ctx.kube.stores.deployments.clone();
    let deployments_store = store.clone();
    let metrics = ctx.kube.metrics.clone();
    // A set that is gone wakes its deployment at once (shared streams pass
    // on only changes): a deleting deployment is waiting for it.
    let gone = deleted_sets
        .filter_map(|set| futures::future::ready(controller_of::<MachineDeployment>(set.as_ref())));
    let watches = move |controller: Controller<MachineDeployment>| {
        controller
            .reconcile_on(gone)
            .watches_shared_stream(sets, move |set: Arc<MachineSet>| {
                let namespace = set.namespace().unwrap_or_default();
                let Some(key) = owner_key(set.as_ref(), "MachineDeployment") else {
                    // An orphan: the deployments that would adopt it.
                    if set
                        .owner_references()
                        .iter()
                        .any(|o| o.controller == Some(true))
                    {
                        return Vec::new();
                    }
                    return deployments_store
                        .state()
                        .iter()
                        .filter(|d| {
                            d.namespace().as_deref() == Some(namespace.as_str())
                                && capstan_api::selector_matches(&d.spec.selector, set.labels())
                        })
                        .map(|d| ObjectRef::from_obj(d.as_ref()))
                        .collect();
                };
                metrics.enqueued(CONTROLLER, key);
                controller_of(set.as_ref()).into_iter().collect()
            })
    };
    let spec = Spec::new(CONTROLLER, deployments, store, concurrency);
    capstan_kit::controller::run(spec, ctx, shutdown, watches, reconcile).await;
}

/// Resolve the spec's strategy into the planner's, or say which field is wrong.
pub fn strategy_of(md: &MachineDeployment) -> Result<Strategy, String> {
    let (spec, at) = md.spec.rollout_strategy_at();
    match spec.type_ {
        StrategyType::OnDelete => Ok(Strategy::OnDelete),
        StrategyType::RollingUpdate => {
            let ru = spec.rolling_update.as_ref();
            let bound = |field: &str, value: Option<&IntOrString>, default: Bound| {
                value.map_or(Ok(default), |v| {
                    int_or_percent(v).map_err(|e| format!("{at}.rollingUpdate.{field}: {e}"))
                })
            };
            let surge = bound(
                "maxSurge",
                ru.and_then(|r| r.max_surge.as_ref()),
                Bound::Count(1),
            )?;
            let unavailable = bound(
                "maxUnavailable",
                ru.and_then(|r| r.max_unavailable.as_ref()),
                Bound::Count(0),
            )?;
            Ok(Strategy::RollingUpdate(Bounds::resolve(
                md.spec.replicas,
                surge,
                unavailable,
            )))
        }
    }
}

fn revision_of(set: &MachineSet) -> i64 {
    set.annotations()
        .get(ANNOTATION_REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// One pass over a MachineDeployment, in Cluster API's manner: validate,
/// gather (and adopt) its sets, observe them, decide the rollout, write
/// the sets, prune history, then derive the status and write it once.
async fn reconcile(md: Arc<MachineDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(action) = begin(&md, &ctx).await? {
        return Ok(action);
    }
    let t = now();
    let current = md.status.clone();
    let mut status = current.clone().unwrap_or_default();
    status.observed_generation = md.metadata.generation;
    status.selector = Some(selector_string(&md.spec.selector));
    let strategy = match check_spec(&md, &ctx, &mut status, current.as_ref(), &t).await? {
        Ok(strategy) => strategy,
        Err(action) => return Ok(action),
    };
    let capacity_pending = ctx
        .capacities
        .annotate(&ctx.kube, CONTROLLER, md.as_ref(), &md.spec.template.spec)
        .await?;
    let sets_api: Api<MachineSet> =
        Api::namespaced(ctx.kube.client.clone(), &md.namespace().unwrap_or_default());
    // As a Deployment adopts ReplicaSets: sets orphaned by
    // `--cascade=orphan`, or made by hand.
    let claimed = claim(
        &sets_api,
        &ctx.kube,
        CONTROLLER,
        md.as_ref(),
        &md.spec.selector,
        ctx.kube.stores.machine_sets.state(),
    );
    let Some(sets) = claimed.await? else {
        // An orphan changed while it was adopted: plan again with a fresh view.
        return Ok(Action::requeue(Duration::from_millis(500)));
    };

    // Observe.
    let now_s = t.0.as_second();
    let target = Target::of(&md, now_s);
    let machines = ctx.kube.stores.machines.state();
    let observed = observe(&md, &target, &sets, &machines, now_s);
    let revision = rollout::next_revision(observed.new_view.as_ref(), &observed.old_views);
    let complete = rollout::complete(
        md.spec.replicas,
        observed.new_view.as_ref(),
        &observed.old_views,
    );

    // Decide whether to roll back: before the sets are written, so a
    // rollout that rolls back does not grow its failing set first.
    let rollback = md.spec.rollback.is_some().then(|| {
        rollback::Rollout::observe(&ctx.kube, &md, &target, &observed, &machines, complete, &t)
    });
    let rollback_decision = rollback.as_ref().map(|r| r.decide());
    if let (Some(r), Some(RollbackDecision::RollBack { to, trigger })) =
        (&rollback, &rollback_decision)
    {
        r.roll_back(&ctx, &md, to, trigger, revision).await?;
        // The template change wakes the deployment; this is the fallback.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // Act on the sets.
    let decision =
        in_place_decision(&ctx, &md, strategy, &target, &sets, &observed, revision).await;
    let plan = plan_rollout(&md, strategy, decision.as_ref(), &observed);
    let written = write_sets(
        &ctx,
        &sets_api,
        &md,
        strategy,
        decision.as_ref(),
        &plan,
        &observed,
        &target.set_hash,
        revision,
    )
    .await?;
    if written.stale {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    prune(&ctx, &sets_api, &md, &observed.old_views).await?;

    // Status.
    let rollback_held = match (&rollback, &rollback_decision) {
        (Some(r), Some(RollbackDecision::Held { trigger, held })) => {
            Some((trigger.reason(), r.held_message(trigger, *held)))
        }
        _ => None,
    };
    let rollout = RolloutState {
        strategy,
        observed: &observed,
        decision: decision.as_ref(),
        conflict: written.conflict.as_deref(),
        revision,
        complete,
        rollback_held,
    };
    derive_status(&mut status, &md, &rollout, &t);
    rollback_status(&mut status, &md, rollback.as_ref(), &t);
    apply_status(
        &ctx.kube,
        CONTROLLER,
        md.as_ref(),
        current.as_ref(),
        &status,
    )
    .await?;
    let deadline = rollback.as_ref().and_then(|r| r.until_deadline());
    let next = next_pass(
        &ctx,
        written.conflict.is_some(),
        complete,
        capacity_pending,
        deadline,
    );
    Ok(Action::requeue(target.requeue(next, now_s)))
}

/// What `spec.rollback` adds to the status: the rollout's progress and
/// `RolledBack` (dropped without `spec.rollback`).
fn rollback_status(
    status: &mut capstan_api::MachineDeploymentStatus,
    md: &MachineDeployment,
    rollback: Option<&rollback::Rollout>,
    t: &capstan_api::Time,
) {
    status.rollout = rollback.map(|r| r.progress.clone());
    match rollback {
        Some(r) => r.rolled_back_condition(status, md.metadata.generation, t),
        None => status
            .conditions
            .retain(|c| c.type_ != capstan_api::set_conditions::ROLLED_BACK),
    }
}

/// With `spec.rollout.strategy.inPlace` (and unless machines made before
/// `rollout.after` are being recycled): what the in-place rollout does.
async fn in_place_decision(
    ctx: &Context,
    md: &MachineDeployment,
    strategy: Strategy,
    target: &Target,
    sets: &[Arc<MachineSet>],
    observed: &Observed,
    revision: i64,
) -> Option<Decision> {
    let policy = in_place_policy(md, strategy).filter(|_| !target.recycling(observed))?;
    let owned: Vec<&Arc<MachineSet>> = sets.iter().collect();
    let new_set = observed.new_set.as_deref();
    Some(decide(ctx, md, policy, &target.hash, revision, &owned, new_set).await)
}

/// The pass's first writes: conditions held back from the last pass, and
/// the finalizer (or the deletion, which ends the pass).
async fn begin(md: &Arc<MachineDeployment>, ctx: &Context) -> Result<Option<Action>, Error> {
    // A paused Cluster holds its objects; its unpausing is seen within
    // this wait.
    let namespace = md.namespace().unwrap_or_default();
    if capstan_kit::objects::cluster_paused(
        &ctx.kube.stores,
        &namespace,
        md.spec.cluster_name.as_deref(),
    ) {
        return Ok(Some(Action::requeue(std::time::Duration::from_secs(5))));
    }
    crate::set_conditions::write_held(
        &ctx.kube,
        CONTROLLER,
        md.as_ref(),
        md.status.as_ref(),
        |s: &mut capstan_api::MachineDeploymentStatus| &mut s.conditions,
    )
    .await?;
    start_pass(
        &ctx.kube,
        CONTROLLER,
        md.as_ref(),
        MACHINEDEPLOYMENT_FINALIZER,
        &ctx.expectations,
        || ctx.kube.stores.machine_sets.state(),
    )
    .await
}

/// The strategy, once the spec passes the checks the schema cannot make
/// (`ValidSpec`, with a warning Event for each v1beta1 name still used);
/// a spec that fails them ends the pass with its status written.
async fn check_spec(
    md: &Arc<MachineDeployment>,
    ctx: &Context,
    status: &mut capstan_api::MachineDeploymentStatus,
    current: Option<&capstan_api::MachineDeploymentStatus>,
    t: &capstan_api::Time,
) -> Result<Result<Strategy, Action>, Error> {
    let generation = md.metadata.generation;
    let strategy = match validate(md, &ctx.kube) {
        Ok(strategy) => strategy,
        Err((reason, message)) => {
            Conditions::new(&mut status.conditions, generation, t)
                .valid_spec(Some((reason, message.as_str())));
            status.phase = Some(DeploymentPhase::Failed);
            apply_status(&ctx.kube, CONTROLLER, md.as_ref(), current, status).await?;
            return Ok(Err(Action::await_change()));
        }
    };
    let renamed = md.spec.renamed_fields().unwrap_or_default();
    Conditions::new(&mut status.conditions, generation, t).valid_spec_renamed(&renamed);
    let before = current.map(|s| s.conditions.as_slice());
    crate::set_conditions::warn_renamed(
        &ctx.kube,
        CONTROLLER,
        md.as_ref(),
        before.unwrap_or_default(),
        &status.conditions,
    )
    .await;
    Ok(Ok(strategy))
}

/// When to look again: soon while a rollout runs (for `minReadySeconds`;
/// set and machine changes trigger passes anyway), at the resync once it
/// is complete, later after a conflict; sooner for a capacity annotation
/// still pending or a progress deadline still running (`deadline`
/// seconds away).
fn next_pass(
    ctx: &Context,
    conflict: bool,
    complete: bool,
    capacity_pending: bool,
    deadline: Option<u64>,
) -> Duration {
    let next = if conflict {
        Duration::from_secs(30)
    } else if complete {
        ctx.kube.resync
    } else {
        Duration::from_secs(5)
    };
    let next = if capacity_pending {
        next.min(crate::capacity::RETRY_NOT_LOADED)
    } else {
        next
    };
    match deadline {
        Some(s) => next.min(Duration::from_secs(s + 1)),
        None => next,
    }
}

/// What the deployment wants its new set to be now.
struct Target {
    /// The template's hash.
    hash: String,
    /// The hash a set made now is named and labelled with: once
    /// `rollout.after` has passed, not the one of sets made before it.
    set_hash: String,
    /// `spec.rollout.after`, unix seconds.
    after: Option<i64>,
    /// The same, once it has passed.
    after_reached: Option<i64>,
}

impl Target {
    fn of(md: &MachineDeployment, now_s: i64) -> Target {
        let hash = template_hash(&md.spec.template);
        let after = rollout_after(md);
        let after_reached = after.filter(|a| *a <= now_s);
        let set_hash = after_reached.map_or_else(|| hash.clone(), |a| salted_hash(&hash, a));
        Target {
            hash,
            set_hash,
            after,
            after_reached,
        }
    }

    /// Whether `set` is of the template now: the same template and, once
    /// `rollout.after` has passed, made at or after it.
    fn current(&self, set: &MachineSet) -> bool {
        crate::template::is_current(set, &self.hash, self.after_reached)
    }

    /// Whether machines made before `rollout.after` are left: they are
    /// replaced, not updated in place (nothing in their spec changed).
    fn recycling(&self, observed: &Observed) -> bool {
        self.after_reached.is_some_and(|a| {
            observed
                .old_sets
                .iter()
                .any(|s| s.spec.replicas > 0 && created(s) < a)
        })
    }

    /// `next`, or sooner when a `rollout.after` still ahead is due.
    fn requeue(&self, next: Duration, now_s: i64) -> Duration {
        let until_after = self
            .after
            .map(|a| a - now_s)
            .filter(|s| *s >= 0)
            .map(|s| Duration::from_secs(s as u64 + 1));
        until_after.map_or(next, |u| u.min(next))
    }
}

/// The rollout strategy, or why the spec cannot be acted on (reason,
/// message): a name too long for its sets, a selector that does not match
/// the template, a Plugin the namespace may not use, a bad strategy.
fn validate(md: &MachineDeployment, kube: &Kube) -> Result<Strategy, (&'static str, String)> {
    let namespace = md.namespace().unwrap_or_default();
    let plugin = &md.spec.template.spec.provider.plugin;
    let too_long = capstan_api::name_too_long(
        "MachineDeployment",
        &md.name_any(),
        capstan_api::MAX_DEPLOYMENT_NAME,
        "its MachineSets are named NAME-<10-character hash>, a label value of at most 63",
    );
    if let Some(message) = too_long {
        return Err(("NameTooLong", message));
    }
    if let Some(message) = selector_mismatch(&md.spec.selector, &md.spec.template, "deployment") {
        return Err(("InvalidSpec", message));
    }
    if let Some(message) = crate::template::template_provider_id(&md.spec.template.spec) {
        return Err(("InvalidSpec", message));
    }
    crate::template::cluster_of(md.spec.cluster_name.as_deref(), &md.spec.template.spec)
        .map_err(|m| ("InvalidSpec", m))?;
    if let Some(message) = capstan_kit::registry::not_allowed(kube, plugin, &namespace) {
        return Err(("PluginNotAllowed", message));
    }
    capstan_planner::taints::check(&crate::template::wanted_taints(&md.spec.template.spec))
        .map_err(|e| ("InvalidSpec", format!("spec.template.spec.{e}")))?;
    if let Some(value) = md
        .spec
        .remediation
        .as_ref()
        .and_then(|r| r.max_in_flight.as_ref())
    {
        int_or_percent(value)
            .map_err(|e| ("InvalidSpec", format!("spec.remediation.maxInFlight: {e}")))?;
    }
    md.spec.renamed_fields().map_err(|m| ("InvalidSpec", m))?;
    strategy_of(md).map_err(|m| ("InvalidSpec", m))
}

/// What a pass observed of the deployment's sets and their machines.
#[derive(Debug, Default)]
struct Observed {
    /// The set of the current template, if it exists.
    new_set: Option<Arc<MachineSet>>,
    new_view: Option<SetView>,
    /// Sets of earlier templates.
    old_sets: Vec<Arc<MachineSet>>,
    old_views: Vec<SetView>,
    /// Machine counts across all sets.
    totals: Totals,
}

/// The sets as the rollout planner sees them, and the machine counts.
fn observe(
    md: &MachineDeployment,
    target: &Target,
    sets: &[Arc<MachineSet>],
    machines: &[Arc<Machine>],
    now_s: i64,
) -> Observed {
    let mut observed = Observed::default();
    let new = new_set_of(target, sets);
    for set in sets {
        let is_new = new.is_some_and(|n| Arc::ptr_eq(n, set));
        let view = set_view(md, set, is_new, machines, now_s, &mut observed.totals);
        if is_new {
            observed.new_set = Some(set.clone());
            observed.new_view = Some(view);
        } else {
            observed.old_sets.push(set.clone());
            observed.old_views.push(view);
        }
    }
    observed
}

/// The set of the current template, as Cluster API finds it: one whose
/// template hashes to `hash` now (a set made before a label-only change,
/// or before labels left the hash, is the same template) and, once
/// `rollout.after` has passed, made at or after it; of several, the one
/// with the most replicas (the least churn), then the one labelled
/// `set_hash`, then the latest revision.
fn new_set_of<'a>(target: &Target, sets: &'a [Arc<MachineSet>]) -> Option<&'a Arc<MachineSet>> {
    let labelled = |s: &MachineSet| {
        s.labels().get(LABEL_TEMPLATE_HASH).map(String::as_str) == Some(target.set_hash.as_str())
    };
    sets.iter()
        .filter(|s| target.current(s))
        .max_by_key(|s| (s.spec.replicas, labelled(s), revision_of(s)))
}

/// One set as the rollout planner sees it; its machines are added to
/// `totals`.
fn set_view(
    md: &MachineDeployment,
    set: &MachineSet,
    is_new: bool,
    machines: &[Arc<Machine>],
    now_s: i64,
    totals: &mut Totals,
) -> SetView {
    let set_uid = set.uid().unwrap_or_default();
    let mut v = SetView {
        name: set.name_any(),
        revision: revision_of(set),
        replicas: set.spec.replicas,
        machines: 0,
        deleting: 0,
        available: 0,
        updating: 0,
        handing_over: set.annotations().contains_key(ANNOTATION_IN_PLACE_TO),
    };
    for m in machines
        .iter()
        .filter(|m| controlled_by(m.as_ref(), &set_uid))
    {
        v.machines += 1;
        let deleting = m.metadata.deletion_timestamp.is_some();
        totals.machines.add(m, deleting);
        if deleting {
            v.deleting += 1;
            continue;
        }
        totals.replicas += 1;
        if crate::inplace::updating_in_place(m) {
            v.updating += 1;
        } else if is_new {
            totals.updated += 1;
        }
        match health(m, md.spec.min_ready_seconds, now_s).0 {
            Health::Available => {
                v.available += 1;
                totals.ready += 1;
                totals.available += 1;
            }
            Health::Ready => totals.ready += 1,
            Health::Failed => totals.failed += 1,
            Health::NotReady => {}
        }
    }
    // Machines above the set's target are about to go (the set deletes
    // unavailable ones first); counting them would let two reconciles in a
    // row spend the same availability twice.
    v.available = v.available.min(set.spec.replicas);
    v
}

/// The in-place policy that applies: only rolling updates update in place
/// (OnDelete never does).
fn in_place_policy(md: &MachineDeployment, strategy: Strategy) -> Option<&InPlaceStrategy> {
    match strategy {
        Strategy::RollingUpdate(_) => md.spec.rollout_strategy().in_place.as_ref(),
        Strategy::OnDelete => None,
    }
}

/// The replica targets (and hand-overs) of this pass.
fn plan_rollout(
    md: &MachineDeployment,
    strategy: Strategy,
    decision: Option<&Decision>,
    observed: &Observed,
) -> rollout::Plan {
    let (new_view, old_views) = (observed.new_view.as_ref(), &observed.old_views);
    match (decision, strategy) {
        _ if md.spec.paused => rollout::plan(md.spec.replicas, strategy, true, new_view, old_views),
        (Some(d), Strategy::RollingUpdate(bounds)) if d.kind == Kind::InPlace => {
            rollout::plan_in_place(md.spec.replicas, bounds, new_view, old_views)
        }
        // Nothing moves until the user (or a human looking at a failed
        // update) decides.
        (Some(d), _) if matches!(d.kind, Kind::Blocked { .. }) => rollout::Plan {
            new_replicas: new_view.map_or(0, |v| v.replicas),
            ..rollout::Plan::default()
        },
        _ => rollout::plan(md.spec.replicas, strategy, false, new_view, old_views),
    }
}

#[derive(Debug, Default)]
struct Totals {
    /// Its machines, for the v1beta2 conditions.
    machines: crate::set_conditions::Tally,
    replicas: i32,
    updated: i32,
    ready: i32,
    available: i32,
    failed: i32,
}

/// The template a MachineSet was made from, as a deployment template (the
/// labels the deployment adds removed), for rollback.
pub fn deployment_template_of(set: &MachineSet) -> MachineTemplateSpec {
    let mut template = set.spec.template.clone();
    template.metadata.labels.remove(LABEL_TEMPLATE_HASH);
    template.metadata.labels.remove(LABEL_DEPLOYMENT_NAME);
    template
}

/// The rollout revision recorded on a MachineSet.
pub fn set_revision(set: &MachineSet) -> i64 {
    revision_of(set)
}

/// Whether the status describes a rollout that finished.
pub fn rolled_out(md: &MachineDeployment) -> bool {
    let status: MachineDeploymentStatus = md.status.clone().unwrap_or_default();
    status.observed_generation == md.metadata.generation
        && status.updated_replicas == md.spec.replicas
        && status.available_replicas == md.spec.replicas
        && status.replicas == md.spec.replicas
}

#[cfg(test)]
mod tests;
