//! `spec.dependsOn` in the engine: the I/O around the decisions of
//! [`crate::dependencies`]. Views of every Addon come from the cache; a
//! tenant's dependency in another namespace is read as the tenant's
//! ServiceAccount first; an index of dependents (filled as each Addon is
//! reconciled) wakes them when a dependency changes; an Addon being
//! deleted waits for its dependents; [`render_gated`] renders what the
//! gate lets through.

use super::{Context, Failure, RegisteredAddon, Rendered, fail, render, render_failure};
use crate::dependencies::{self, AddonKey, AddonView, Change, Gate, NotReady};
use crate::identity::Actor;
use capstan_api::{Addon, AddonStatus, status};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

/// Condition: every dependency is ready (only on Addons that have some).
pub const DEPENDENCIES_READY: &str = "DependenciesReady";
/// Condition: the spec can be acted on (no dependency cycle, valid
/// version requirements).
pub const VALID_SPEC: &str = capstan_api::set_conditions::VALID_SPEC;

/// Which Addons depend on which: dependency -> its dependents.
#[derive(Debug, Default)]
pub(super) struct Dependents {
    by_dependency: Mutex<HashMap<AddonKey, BTreeSet<AddonKey>>>,
}

impl Dependents {
    /// Record what `addon` depends on now (replacing what it did).
    pub(super) fn record(&self, addon: &Addon) {
        let me = AddonKey::of(addon);
        let namespace = me.namespace.clone();
        let mut index = self.by_dependency.lock().expect("dependents lock");
        for dependents in index.values_mut() {
            dependents.remove(&me);
        }
        for dependency in &addon.spec.depends_on {
            index
                .entry(AddonKey::of_dependency(dependency, &namespace))
                .or_default()
                .insert(me.clone());
        }
        index.retain(|_, dependents| !dependents.is_empty());
    }

    /// Forget an Addon that is gone.
    pub(super) fn forget(&self, key: &AddonKey) {
        let mut index = self.by_dependency.lock().expect("dependents lock");
        for dependents in index.values_mut() {
            dependents.remove(key);
        }
        index.retain(|_, dependents| !dependents.is_empty());
    }

    /// The Addons to look at again when `changed` changed: its dependents
    /// (it may be ready now, or gone) and, while any of its dependencies is
    /// being deleted, that dependency (it waits for its dependents).
    pub(super) fn to_wake(&self, changed: &Addon, ctx: &Context) -> Vec<ObjectRef<Addon>> {
        let me = AddonKey::of(changed);
        let mut wake: Vec<ObjectRef<Addon>> = self
            .by_dependency
            .lock()
            .expect("dependents lock")
            .get(&me)
            .into_iter()
            .flatten()
            .map(|k| ObjectRef::new(&k.name).within(&k.namespace))
            .collect();
        for dependency in &changed.spec.depends_on {
            let key = AddonKey::of_dependency(dependency, &me.namespace);
            let r = ObjectRef::new(&key.name).within(&key.namespace);
            if ctx
                .kube
                .stores
                .addons
                .get(&r)
                .is_some_and(|d| d.metadata.deletion_timestamp.is_some())
            {
                wake.push(r);
            }
        }
        wake
    }
}

/// Every cached Addon as the gate sees it, `addon` as this reconcile has it.
pub(super) fn views(ctx: &Context, addon: &Addon) -> BTreeMap<AddonKey, AddonView> {
    let mut views: BTreeMap<AddonKey, AddonView> = ctx
        .kube
        .stores
        .addons
        .state()
        .iter()
        .map(|a| (AddonKey::of(a), AddonView::of(a)))
        .collect();
    views.insert(AddonKey::of(addon), AddonView::of(addon));
    views
}

/// What holds `addon` back, after refusing a cycle or an invalid
/// requirement (nothing is applied then) and, for a tenant, a dependency
/// in another namespace its ServiceAccount may not read. Sets or clears
/// `DependenciesReady` and `ValidSpec`. Reads every cached Addon only when
/// this one has dependencies (a cycle needs the whole graph).
pub(super) async fn blockers(
    ctx: &Context,
    addon: &Addon,
    actor: &Actor,
    conditions: &mut capstan_kit::Conditions<'_>,
) -> Result<Vec<(AddonKey, NotReady)>, Failure> {
    if addon.spec.depends_on.is_empty() {
        // Only dependencies set these; without any they say nothing.
        conditions.remove(DEPENDENCIES_READY).remove(VALID_SPEC);
        return Ok(vec![]);
    }
    let views = views(ctx, addon);
    let me = AddonKey::of(addon);
    if let Some(cycle) = dependencies::cycle_through(&me, &dependencies::graph(&views)) {
        return Err(fail(
            VALID_SPEC,
            "DependencyCycle",
            format!(
                "spec.dependsOn makes a cycle: {}; remove one of these dependencies (nothing is applied until then)",
                dependencies::show_cycle(&cycle)
            ),
        ));
    }
    for (i, dependency) in addon.spec.depends_on.iter().enumerate() {
        if let Some(constraint) = &dependency.version_constraint
            && let Err(why) = dependencies::requirement(constraint)
        {
            return Err(fail(
                VALID_SPEC,
                "InvalidVersionConstraint",
                format!("spec.dependsOn[{i}].{why}"),
            ));
        }
    }
    conditions.valid_spec(None);
    if let Actor::ServiceAccount { namespace, name } = actor {
        for dependency in &addon.spec.depends_on {
            let key = AddonKey::of_dependency(dependency, &me.namespace);
            if key.namespace == me.namespace {
                continue;
            }
            may_read(ctx, actor, &key).await.map_err(|why| {
                fail(
                    DEPENDENCIES_READY,
                    "DependencyNotReadable",
                    format!(
                        "ServiceAccount {namespace}/{name} (whose rights apply this Addon) may not read Addon {key}: {why}; grant it `get` on addons.capstan.dev in {}, or drop the dependency",
                        key.namespace
                    ),
                )
            })?;
        }
    }
    let blockers = dependencies::blockers(addon, &views);
    if blockers.is_empty() {
        conditions.set(
            DEPENDENCIES_READY,
            status::TRUE,
            "Ready",
            format!("{} dependencies ready", addon.spec.depends_on.len()),
        );
    } else {
        conditions.set(
            DEPENDENCIES_READY,
            status::FALSE,
            "WaitingForDependencies",
            dependencies::blocked_message(&blockers),
        );
    }
    Ok(blockers)
}

/// Whether `actor` may read the Addon `key` (a `get` as it).
async fn may_read(ctx: &Context, actor: &Actor, key: &AddonKey) -> Result<(), String> {
    let Some(user) = actor.user() else {
        return Ok(());
    };
    let client =
        super::cluster::impersonated(ctx, &ctx.kube.client, &user).map_err(|f| f.message)?;
    let api: Api<Addon> = Api::namespaced(client, &key.namespace);
    match api.get_opt(&key.name).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 403 => Err("forbidden".into()),
        Err(e) => Err(format!("cannot check ({e})")),
    }
}

/// The Addons that must go before `addon` (being deleted) may.
pub(super) fn live_dependents(ctx: &Context, addon: &Addon) -> Vec<AddonKey> {
    dependencies::dependents(&AddonKey::of(addon), &views(ctx, addon))
}

/// Render the Addon as the gate decides ([`dependencies::gate`]): as its
/// spec asks, or — while a dependency holds a transition back — what is
/// applied, again (`Some(change)`: what waits), so drift is still
/// corrected; with nothing to render again, the transition waits as a
/// failure. Records what the channel offers on the way. `cluster` is the
/// target and its versions.
pub(super) async fn render_gated(
    ctx: &Context,
    addon: &Addon,
    registered: &RegisteredAddon,
    status: &mut AddonStatus,
    blockers: &[(AddonKey, NotReady)],
    cluster: (&crate::fit::ClusterVersions, &super::Target),
    t: &capstan_api::Time,
) -> Result<(Rendered, Option<Change>), Failure> {
    let (versions, target) = cluster;
    let aggregation = super::Aggregation::Read {
        client: &target.client,
        shown: &target.shown,
    };
    let generation = addon.metadata.generation.unwrap_or(0);
    let tenant = super::is_tenant(ctx, addon);
    // What `revision` renders for `addon`, measured by `meter`.
    let render_by = async |revision: &RegisteredAddon, meter: super::Meter<'_>, addon: &Addon| {
        render(
            &revision.plugin,
            addon,
            &revision.grants,
            tenant,
            &ctx.image_rewrites,
            Some(meter),
            super::TargetCluster {
                versions: Some(versions),
                aggregation,
            },
        )
        .await
    };
    let metrics = &ctx.kube.metrics;
    // A shadowing canary renders the same at once; compared, never used.
    let rendered = super::shadow::mirrored(
        registered,
        render_by(registered, registered.meter(metrics), addon),
        async |canary: &RegisteredAddon| {
            render_by(canary, canary.mirror_meter(metrics), addon).await
        },
        super::shadow::same_render,
    )
    .await
    .map_err(render_failure)?;
    let digest = registered.plugin.plugin().digest();
    super::available::report_available(ctx, addon, status, &rendered, digest, generation, t).await;
    let applied = status.last_applied.clone();
    let change = dependencies::transition(
        applied.as_ref(),
        status.plugin_digest.as_deref(),
        generation,
        &rendered.resolved.version,
        digest,
    );
    let new_revision = status.plugin_digest.as_deref().is_some_and(|d| d != digest);
    match dependencies::gate(
        addon,
        applied.as_ref(),
        change,
        new_revision,
        !blockers.is_empty(),
    ) {
        Gate::Current => Ok((rendered, None)),
        Gate::Held { spec, change } => {
            let mut held = addon.clone();
            held.spec = *spec;
            let rendered = render_by(registered, registered.meter(metrics), &held)
                .await
                .map_err(render_failure)?;
            Ok((rendered, Some(change)))
        }
        Gate::Wait(change) => Err(Failure {
            waiting: true,
            ..fail(
                super::UP_TO_DATE,
                "WaitingForDependencies",
                format!(
                    "{change} waits: {}",
                    dependencies::blocked_message(blockers)
                ),
            )
        }),
    }
}
