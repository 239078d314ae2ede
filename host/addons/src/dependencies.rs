//! Ordering between Addons (`spec.dependsOn`), without I/O: whether a
//! dependency is ready, whether an Addon's reconcile is a *transition*
//! (what the gate holds back) or drift correction (never held back),
//! dependency cycles, and version requirements.
//!
//! The engine reads every Addon from its cache into [`AddonView`]s and
//! asks [`blockers`] what holds an Addon back, [`cycle_through`] whether it
//! sits on a cycle, and [`transition`] whether what it is about to apply
//! changes anything a dependency should gate.

use capstan_api::{Addon, AddonDependency, AddonTarget, AppliedSpec};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// An Addon by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddonKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for AddonKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl AddonKey {
    /// The Addon's own key.
    pub fn of(addon: &Addon) -> Self {
        AddonKey {
            namespace: addon.namespace().unwrap_or_default(),
            name: addon.name_any(),
        }
    }

    /// The key a dependency of an Addon in `namespace` names.
    pub fn of_dependency(dependency: &AddonDependency, namespace: &str) -> Self {
        AddonKey {
            namespace: dependency
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_string()),
            name: dependency.name.clone(),
        }
    }
}

/// What the gate needs to know of one Addon.
#[derive(Debug, Clone, PartialEq)]
pub struct AddonView {
    /// Its key.
    pub key: AddonKey,
    /// Being deleted.
    pub deleting: bool,
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `status.healthy`.
    pub healthy: Option<bool>,
    /// The phase, for messages.
    pub phase: Option<String>,
    /// `status.version`.
    pub version: Option<String>,
    /// `spec.target`.
    pub target: Option<AddonTarget>,
    /// Its dependencies, resolved to keys.
    pub depends_on: Vec<AddonKey>,
}

impl AddonView {
    /// The view of a cached Addon.
    pub fn of(addon: &Addon) -> Self {
        let key = AddonKey::of(addon);
        // Only the few fields the gate reads (not the inventory).
        let status = addon.status.as_ref();
        AddonView {
            depends_on: addon
                .spec
                .depends_on
                .iter()
                .map(|d| AddonKey::of_dependency(d, &key.namespace))
                .collect(),
            key,
            deleting: addon.metadata.deletion_timestamp.is_some(),
            generation: addon.metadata.generation.unwrap_or(0),
            observed_generation: status.and_then(|s| s.observed_generation),
            healthy: status.and_then(|s| s.healthy),
            phase: status.and_then(|s| s.phase.clone()),
            version: status.and_then(|s| s.version.clone()),
            target: addon.spec.target.clone(),
        }
    }
}

/// Why a dependency is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// No such Addon.
    Missing,
    /// It is being deleted.
    Deleting,
    /// Its current generation is not reconciled yet.
    NotReconciled,
    /// Its plugin does not judge it healthy (yet).
    NotHealthy(Option<String>),
    /// Its installed version does not meet the requirement.
    Version {
        /// What it has (none installed yet).
        installed: Option<String>,
        /// The requirement.
        constraint: String,
    },
    /// The requirement is not a valid semantic-version requirement.
    InvalidConstraint(String),
    /// It installs into another cluster.
    OtherCluster,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Missing => f.write_str("does not exist"),
            NotReady::Deleting => f.write_str("is being deleted"),
            NotReady::NotReconciled => f.write_str("has not reconciled its latest spec yet"),
            NotReady::NotHealthy(phase) => match phase {
                Some(p) => write!(f, "is not healthy (phase {p})"),
                None => f.write_str("is not healthy yet"),
            },
            NotReady::Version {
                installed,
                constraint,
            } => match installed {
                Some(v) => write!(f, "has version {v}, which does not meet {constraint:?}"),
                None => write!(f, "has no version installed to meet {constraint:?}"),
            },
            NotReady::InvalidConstraint(why) => f.write_str(why),
            NotReady::OtherCluster => f.write_str("installs into another cluster"),
        }
    }
}

/// Whether two Addons install into the same cluster: both into the one
/// Capstan runs in, or both through the same kubeconfig Secret (of the
/// same namespace, since a Secret is the Addon's namespace's).
pub fn same_cluster(a: (&str, Option<&AddonTarget>), b: (&str, Option<&AddonTarget>)) -> bool {
    match (a.1, b.1) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            a.0 == b.0
                && x.kubeconfig_secret_ref == y.kubeconfig_secret_ref
                && x.cluster_name == y.cluster_name
        }
        _ => false,
    }
}

/// `constraint` as a semantic-version requirement (such as `>=1.8.0, <2`);
/// Err: why it is not one, and what to write.
pub fn requirement(constraint: &str) -> Result<semver::VersionReq, String> {
    semver::VersionReq::parse(constraint.trim()).map_err(|e| {
        format!("versionConstraint {constraint:?} is not a semantic-version requirement ({e}); write one such as \">=1.8.0, <2\" or \"^1.8\"")
    })
}

/// Whether `version` meets `constraint` ([`requirement`]); a leading `v`
/// is ignored. Err: why either is not valid.
pub fn meets(version: &str, constraint: &str) -> Result<bool, String> {
    let requirement = requirement(constraint)?;
    let parsed = semver::Version::parse(version.trim().trim_start_matches('v'))
        .map_err(|e| format!("its version {version:?} is not a semantic version ({e})"))?;
    Ok(requirement.matches(&parsed))
}

/// Why the dependency `wanted` (of an Addon in `namespace` with `target`)
/// is not ready, if it is not; `found` is its view, if it exists.
pub fn readiness(
    wanted: &AddonDependency,
    namespace: &str,
    target: Option<&AddonTarget>,
    found: Option<&AddonView>,
) -> Result<(), NotReady> {
    let Some(dep) = found else {
        return Err(NotReady::Missing);
    };
    if dep.deleting {
        return Err(NotReady::Deleting);
    }
    if !same_cluster(
        (&dep.key.namespace, dep.target.as_ref()),
        (namespace, target),
    ) {
        return Err(NotReady::OtherCluster);
    }
    if dep.observed_generation != Some(dep.generation) {
        return Err(NotReady::NotReconciled);
    }
    // Healthy in its latest pass: a stale `healthy` beside a failed
    // apply (phase Failed) or a pause is not ready.
    if dep.healthy != Some(true) || dep.phase.as_deref() != Some("Ready") {
        return Err(NotReady::NotHealthy(dep.phase.clone()));
    }
    if let Some(constraint) = &wanted.version_constraint {
        let fits = match &dep.version {
            Some(v) => meets(v, constraint).map_err(NotReady::InvalidConstraint)?,
            None => false,
        };
        if !fits {
            return Err(NotReady::Version {
                installed: dep.version.clone(),
                constraint: constraint.clone(),
            });
        }
    }
    Ok(())
}

/// Every dependency of `addon` that is not ready, and why, in the order
/// `spec.dependsOn` lists them.
pub fn blockers(addon: &Addon, views: &BTreeMap<AddonKey, AddonView>) -> Vec<(AddonKey, NotReady)> {
    let namespace = addon.namespace().unwrap_or_default();
    addon
        .spec
        .depends_on
        .iter()
        .filter_map(|d| {
            let key = AddonKey::of_dependency(d, &namespace);
            readiness(d, &namespace, addon.spec.target.as_ref(), views.get(&key))
                .err()
                .map(|why| (key, why))
        })
        .collect()
}

/// The message of a `DependenciesReady=False` condition.
pub fn blocked_message(blockers: &[(AddonKey, NotReady)]) -> String {
    let each: Vec<String> = blockers
        .iter()
        .map(|(key, why)| format!("Addon {key} {why}"))
        .collect();
    format!("waiting for {}", each.join("; "))
}

/// A cycle through `start` in the dependency graph (`start`, …, `start`),
/// if there is one. Dependencies that do not exist end a path.
pub fn cycle_through(
    start: &AddonKey,
    graph: &BTreeMap<AddonKey, Vec<AddonKey>>,
) -> Option<Vec<AddonKey>> {
    // Depth-first from start; a path back to start is the cycle.
    let mut seen = BTreeSet::new();
    let mut path = vec![start.clone()];
    fn walk(
        at: &AddonKey,
        start: &AddonKey,
        graph: &BTreeMap<AddonKey, Vec<AddonKey>>,
        seen: &mut BTreeSet<AddonKey>,
        path: &mut Vec<AddonKey>,
    ) -> bool {
        for next in graph.get(at).map(Vec::as_slice).unwrap_or_default() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(next, start, graph, seen, path) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(start, start, graph, &mut seen, &mut path).then_some(path)
}

/// `a/x -> a/y -> a/x`.
pub fn show_cycle(cycle: &[AddonKey]) -> String {
    cycle
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// What an Addon is about to apply, against what is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing is applied yet.
    FirstInstall,
    /// Another version.
    Version {
        /// Applied.
        from: String,
        /// About to apply.
        to: String,
    },
    /// The spec changed (config, patches, target, …).
    Generation,
    /// Another plugin revision renders it.
    PluginRevision,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::FirstInstall => f.write_str("the first install"),
            Change::Version { from, to } => write!(f, "the change from version {from} to {to}"),
            Change::Generation => f.write_str("the new spec"),
            Change::PluginRevision => f.write_str("the new plugin revision"),
        }
    }
}

/// Whether applying `version` of the Addon at `generation`, rendered by
/// the plugin revision `digest`, is a transition from what is applied
/// (`applied`, rendered by `applied_digest`); `None`: it only re-applies
/// what is there (drift correction), which no dependency holds back.
pub fn transition(
    applied: Option<&AppliedSpec>,
    applied_digest: Option<&str>,
    generation: i64,
    version: &str,
    digest: &str,
) -> Option<Change> {
    let Some(applied) = applied else {
        return Some(Change::FirstInstall);
    };
    if applied.version != version {
        return Some(Change::Version {
            from: applied.version.clone(),
            to: version.to_string(),
        });
    }
    if applied.generation != generation {
        return Some(Change::Generation);
    }
    if applied_digest.is_some_and(|d| d != digest) {
        return Some(Change::PluginRevision);
    }
    None
}

/// The spec to render while held back: what is applied, so drift is
/// corrected without a transition (the plugin revision that rendered it
/// being the one loaded: [`gate`] checks).
fn held_spec(addon: &Addon, applied: &AppliedSpec) -> capstan_api::AddonSpec {
    capstan_api::AddonSpec {
        version: Some(applied.version.clone()),
        channel: None,
        config: applied.config.clone(),
        patches: applied.patches.clone(),
        target: applied.target.clone(),
        ..addon.spec.clone()
    }
}

/// What a reconcile applies, given what it is about to apply (`change`
/// against what is applied) and whether a dependency holds it back.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// The spec as it is (nothing to hold back, or nothing holds it).
    Current,
    /// What is applied, rendered again: drift is corrected, `change` waits.
    Held {
        /// The spec that renders what is applied.
        spec: Box<capstan_api::AddonSpec>,
        /// What waits.
        change: Change,
    },
    /// Nothing is applied: `change` waits and what is applied cannot be
    /// rendered again (nothing is, or only another plugin revision is
    /// loaded).
    Wait(Change),
}

/// The gate's decision: a transition waits while `blocked`; re-applying
/// what is there (drift correction) never does. `new_revision`: the loaded
/// plugin revision is not the one that rendered what is applied (which then
/// cannot be rendered again).
pub fn gate(
    addon: &Addon,
    applied: Option<&AppliedSpec>,
    change: Option<Change>,
    new_revision: bool,
    blocked: bool,
) -> Gate {
    match change {
        None => Gate::Current,
        Some(_) if !blocked => Gate::Current,
        Some(change) if new_revision => Gate::Wait(change),
        Some(change) => match applied {
            Some(applied) => Gate::Held {
                spec: Box::new(held_spec(addon, applied)),
                change,
            },
            None => Gate::Wait(change),
        },
    }
}

/// What is applied when `spec` renders `version` at `generation`.
pub fn applied_spec(spec: &capstan_api::AddonSpec, generation: i64, version: &str) -> AppliedSpec {
    AppliedSpec {
        generation,
        version: version.to_string(),
        config: spec.config.clone(),
        patches: spec.patches.clone(),
        target: spec.target.clone(),
    }
}

/// The dependency graph of every cached Addon.
pub fn graph(views: &BTreeMap<AddonKey, AddonView>) -> BTreeMap<AddonKey, Vec<AddonKey>> {
    views
        .iter()
        .map(|(k, v)| (k.clone(), v.depends_on.clone()))
        .collect()
}

/// The Addons that depend on `key` and still exist: an Addon being
/// deleted waits for them. Those on a dependency cycle with it do not
/// count (a cycle is refused, and would otherwise never let go).
pub fn dependents(key: &AddonKey, views: &BTreeMap<AddonKey, AddonView>) -> Vec<AddonKey> {
    let graph = graph(views);
    let on_cycle: BTreeSet<AddonKey> = cycle_through(key, &graph)
        .map(|c| c.into_iter().collect())
        .unwrap_or_default();
    views
        .values()
        .filter(|v| &v.key != key && v.depends_on.contains(key) && !on_cycle.contains(&v.key))
        .map(|v| v.key.clone())
        .collect()
}

#[cfg(test)]
mod tests;
