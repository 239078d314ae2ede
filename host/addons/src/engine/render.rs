//! Rendering an Addon: resolve its version through the plugin, call
//! `render`, and run this crate's pure steps over the result (parse, label,
//! patch within the grants, rewrite images, check the grants and the
//! host's floor, order). `capstan addon render` shares [`render`].

use crate::fit::ClusterVersions;
use crate::{AddonError, AddonGrants, ImageRewrite, Object};
use capstan_api::Addon;
use capstan_kit::Metrics;
use capstan_runtime::types::AddonSpec as WitSpec;
use kube::ResourceExt;

/// What an Addon renders to, ready to apply.
#[derive(Debug)]
pub struct Rendered {
    /// The version and how it was chosen.
    pub resolved: crate::Resolved,
    /// The channel's newest version, whatever the update policy rendered.
    pub available: Option<String>,
    /// Whether that is newer than the version rendered.
    pub update_available: bool,
    /// What the plugin was asked (also what `assess` is given).
    pub spec: WitSpec,
    /// The objects: labelled, patched, rewritten, granted, in apply order.
    pub objects: Vec<Object>,
    /// The image rewrites made.
    pub rewrites: Vec<capstan_api::ImageRewriteRecord>,
    /// How the rendered version fits the target cluster (`None`: its
    /// versions were not known).
    pub fit: Option<crate::fit::Fit>,
}

/// What the render knows of the cluster it is for.
#[derive(Debug, Clone, Copy)]
pub struct TargetCluster<'a> {
    /// Its Kubernetes versions (`None`: not known; no range is checked).
    pub versions: Option<&'a ClusterVersions>,
    /// Where its aggregating ClusterRoles come from.
    pub aggregation: Aggregation<'a>,
}

/// Where the floor learns which ClusterRoles aggregate others.
#[derive(Clone, Copy)]
pub enum Aggregation<'a> {
    /// Kubernetes' built-in `admin`, `edit` and `view` only (no cluster to
    /// read: `capstan addon render`).
    BuiltIn,
    /// Read from the target cluster when a render needs it.
    Read {
        /// Capstan's client there.
        client: &'a kube::Client,
        /// The cluster, for messages.
        shown: &'a str,
    },
}

impl std::fmt::Debug for Aggregation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Aggregation::BuiltIn => f.write_str("BuiltIn"),
            Aggregation::Read { shown, .. } => write!(f, "Read({shown})"),
        }
    }
}

/// Why an Addon could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A plugin call failed.
    #[error("{error}")]
    Plugin {
        /// `versions` or `render`.
        call: &'static str,
        /// What happened.
        error: capstan_runtime::Error,
    },
    /// The Addon asks for something the render cannot give.
    #[error(transparent)]
    Addon(#[from] AddonError),
}

/// Resolve the version with the plugin (under the Addon's update policy,
/// against the version its status says is applied), render, and run the pure steps
/// (label, patch within the patch grants — only those granted to tenants
/// when `tenant` —, rewrite images, check the objects against the kinds the
/// plugin's manifest declares, the grants (a tenant's within its namespace)
/// and the host's floor, order). With the target `cluster`'s versions, a
/// version outside the Kubernetes range its plugin declares is not newly
/// rendered ([`crate::fit`]), and the plugin is told the API server's
/// version. `cluster.aggregation` says where the target cluster's aggregating
/// ClusterRoles come from (the floor judges a rendered ClusterRole they
/// select as bound to all their holders); they are read only when a
/// rendered ClusterRole carries an escalation route. The controller
/// applies what this returns; `capstan addon render` prints it.
pub async fn render(
    plugin: &capstan_runtime::AddonPlugin,
    addon: &Addon,
    grants: &AddonGrants,
    tenant: bool,
    rewrites: &[ImageRewrite],
    meter: Option<Meter<'_>>,
    cluster: TargetCluster<'_>,
) -> Result<Rendered, RenderError> {
    let TargetCluster {
        versions: cluster,
        aggregation,
    } = cluster;
    let offered = counted_call(meter, addon, "versions", plugin.versions())
        .await
        .map_err(|error| RenderError::Plugin {
            call: "versions",
            error,
        })?;
    let fit_of = |version: &str| {
        let range = offered
            .iter()
            .find(|v| v.version == version)
            .and_then(|v| v.kubernetes.as_deref());
        cluster.map(|c| crate::fit::fit(range, c))
    };
    let misfit = |version: &str| cluster.and_then(|c| fit_of(version).and_then(|f| f.misfit(c)));
    let known: Vec<(String, Vec<String>)> = offered
        .iter()
        .map(|v| (v.version.clone(), v.channels.clone()))
        .collect();
    // What is applied now: the version an update policy keeps.
    let applied = addon.status.as_ref().and_then(|s| {
        s.last_applied
            .as_ref()
            .map(|a| a.version.clone())
            .or_else(|| s.version.clone())
    });
    let decision = crate::updates::decide(
        addon.spec.update_policy,
        addon.spec.version.as_deref(),
        addon.spec.channel.as_deref(),
        applied.as_deref(),
        &known,
        &misfit,
    )?;
    let update_available = decision.update_available();
    let (resolved, available) = (decision.render, decision.available);
    let spec = WitSpec {
        name: addon.name_any(),
        namespace: addon.namespace().unwrap_or_default(),
        version: Some(resolved.version.clone()),
        channel: addon.spec.channel.clone(),
        config: addon
            .spec
            .config
            .as_ref()
            .map_or_else(|| "{}".to_string(), ToString::to_string),
        kubernetes_version: cluster.map(|c| c.server.clone()),
    };
    let texts = counted_call(meter, addon, "render", plugin.render(&spec))
        .await
        .map_err(|error| RenderError::Plugin {
            call: "render",
            error,
        })?;
    let mut objects = crate::parse_render(&texts)?;
    crate::label(&mut objects, &spec.namespace, &spec.name);
    crate::apply_patches(
        &mut objects,
        &addon.spec.patches,
        &grants.patch_rules(tenant),
        tenant,
    )?;
    let rewrites = crate::rewrite_images(&mut objects, rewrites);
    crate::note_replicas(&mut objects);
    let declared = &plugin.plugin().manifest().capabilities.objects;
    // On the objects as they will be applied: patched and rewritten.
    let tenant_namespace = tenant.then_some(spec.namespace.as_str());
    let aggregators = match aggregation {
        Aggregation::Read { client, shown } if crate::floor::aggregation_matters(&objects) => {
            super::kubernetes::aggregators(client, shown).await
        }
        _ => crate::floor::Aggregators::built_in(),
    };
    crate::check_grants(&objects, declared, grants, tenant_namespace, &aggregators)?;
    crate::apply_order(&mut objects);
    let fit = fit_of(&resolved.version);
    Ok(Rendered {
        fit,
        resolved,
        available,
        update_available,
        spec,
        objects,
        rewrites,
    })
}

/// How an Addon's plugin calls are measured: the call metrics (under the
/// Plugin's name and the revision's label) and the revision's counts for
/// its canary windows.
#[derive(Debug, Clone, Copy)]
pub struct Meter<'a> {
    /// Where call durations go.
    pub metrics: &'a Metrics,
    /// `stable` or `canary`.
    pub revision: &'a str,
    /// The revision's calls, for canary windows.
    pub counts: Option<&'a capstan_kit::canary::CallCounts>,
}

/// Run one call of an Addon's plugin, measured by `meter` (when given)
/// under the Plugin's name, as provider calls are. A call the host's quota
/// held back is not the revision's doing and is not counted.
pub(super) async fn counted_call<T>(
    meter: Option<Meter<'_>>,
    addon: &Addon,
    function: &'static str,
    call: impl Future<Output = Result<T, capstan_runtime::Error>>,
) -> Result<T, capstan_runtime::Error> {
    let started = std::time::Instant::now();
    let result = call.await;
    if let Some(meter) = meter {
        let outcome = if result.is_ok() { "ok" } else { "error" };
        meter.metrics.plugin_call(
            (&addon.spec.plugin, meter.revision),
            function,
            outcome,
            started.elapsed(),
        );
        let held_back = matches!(
            &result,
            Err(capstan_runtime::Error::QuotaExceeded { .. }
                | capstan_runtime::Error::HostCapacity { .. })
        );
        if let Some(counts) = meter.counts.filter(|_| !held_back) {
            counts.record_outcome(function, result.is_err());
        }
    }
    result
}
