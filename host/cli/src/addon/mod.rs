//! `capstan addon render ADDON.yaml --plugin PATH`: print exactly what the
//! addon controller would apply for an Addon — version resolved, patches
//! applied, images rewritten, object grants checked, in apply order — with
//! no cluster and nothing applied. `capstan addon updates` ([`updates`])
//! lists what Addons' channels offer beyond what is applied.

use anyhow::{Context, bail};
use capstan_addons::AddonGrants;
use capstan_api::{Addon, Plugin};
use capstan_runtime::{Grants, Limits};
use std::path::PathBuf;
use std::process::ExitCode;

mod updates;

pub use updates::{UpdatesArgs, updates};

/// `capstan addon …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print what an Addon would apply (a dry run: no cluster needed).
    Render(RenderArgs),
    /// List the newer versions Addons' channels offer and what is applied.
    Updates(UpdatesArgs),
}

/// Arguments of `capstan addon render`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
    capstan addon render coredns.yaml --plugin coredns_addon.wasm \\\n    \
    --grant 'ServiceAccount@kube-system' --grant 'ConfigMap@kube-system' ... \\\n    \
    --image-rewrite registry.k8s.io/=mirror.local/\n\n\
    Without --grant or --grants-from the render is checked against the kinds the plugin\n\
    declares only (the controller also checks the Plugin's spec.grants.objects), at Pod\n\
    Security level Baseline, and spec.patches may change nothing. --grants-from PLUGIN.yaml\n\
    checks with exactly that Plugin's spec.grants (objects, podSecurity, serviceAccounts, rbac,\n\
    patches, tenantObjects, podSpecPaths), as for an Addon in Capstan's own namespace;\n\
    --tenant checks as for an Addon in another namespace (a tenant's): only patch grants\n\
    marked for tenants, and only objects in the Addon's namespace or spec.grants.tenantObjects.")]
pub struct RenderArgs {
    /// The Addon (YAML or JSON; `-` for standard input).
    pub addon: PathBuf,
    /// The addon plugin component (`.wasm`).
    #[arg(long)]
    pub plugin: PathBuf,
    /// An object grant as on the Plugin (`[group/]Kind[@namespace|@*]`);
    /// repeatable. When given, the render is checked against these too.
    #[arg(long = "grant", value_name = "PATTERN")]
    pub grants: Vec<String>,
    /// A Plugin object (YAML) whose `spec.grants` to check with, as the
    /// controller would.
    #[arg(long = "grants-from", value_name = "PLUGIN.yaml")]
    pub grants_from: Option<PathBuf>,
    /// Check as for an Addon outside Capstan's namespace (a tenant's):
    /// only objects in the Addon's own namespace (`metadata.namespace`,
    /// default `default`) or covered by `spec.grants.tenantObjects`, and
    /// only patch grants marked `tenants: true`.
    #[arg(long)]
    pub tenant: bool,
    /// An image rewrite rule FROM=TO, as the controller's `--image-rewrite`.
    #[arg(long = "image-rewrite", value_name = "FROM=TO")]
    pub image_rewrites: Vec<capstan_addons::ImageRewrite>,
    /// The target cluster's Kubernetes version (as `kubectl version` shows
    /// the server's, such as `v1.30.2`): the plugin is told it, and a
    /// version outside the Kubernetes range its plugin declares is refused
    /// as the controller would. Unset: no range is checked.
    #[arg(long, value_name = "VERSION")]
    pub kubernetes_version: Option<String>,
    /// Output: `yaml` (a multi-document stream for `kubectl apply -f -`) or `json`.
    #[arg(long, short, default_value = "yaml", value_parser = ["yaml", "json"])]
    pub output: String,
}

/// Run `capstan addon render`.
pub async fn render(args: RenderArgs) -> anyhow::Result<ExitCode> {
    let text = if args.addon.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read the Addon from stdin")?
    } else {
        std::fs::read_to_string(&args.addon)
            .with_context(|| format!("cannot read {}", args.addon.display()))?
    };
    let addon: Addon = serde_yaml::from_str(&text).with_context(|| {
        format!(
            "{} is not an Addon (apiVersion capstan.dev/v1alpha1, kind Addon, spec.plugin, spec.version or spec.channel)",
            args.addon.display()
        )
    })?;
    if addon.metadata.name.is_none() {
        bail!("{}: metadata.name is missing", args.addon.display());
    }
    let mut addon = addon;
    if addon.metadata.namespace.is_none() {
        addon.metadata.namespace = Some("default".into());
    }
    let mut grants = match &args.grants_from {
        None => AddonGrants::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let plugin: Plugin = serde_yaml::from_str(&text).with_context(|| {
                format!(
                    "{} is not a Plugin (apiVersion capstan.dev/v1alpha1, kind Plugin)",
                    path.display()
                )
            })?;
            AddonGrants::from_spec(&plugin.spec.grants)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
    };
    for g in &args.grants {
        grants.objects.push(
            g.parse()
                .map_err(|e: String| anyhow::anyhow!("--grant {e}"))?,
        );
    }
    let runtime = crate::options::one_shot_runtime(2)?;
    let plugin = runtime
        .load_file(&args.plugin, Limits::default(), Grants::default())
        .with_context(|| format!("cannot load {}", args.plugin.display()))?
        .addon()?;
    // Without object grants, the render is checked against the declaration alone.
    if grants.objects.is_empty() {
        grants.objects = plugin.plugin().manifest().capabilities.objects.clone();
    }
    let cluster = match &args.kubernetes_version {
        Some(v) => {
            capstan_addons::fit::kubernetes_version(v).map_err(|e| {
                anyhow::anyhow!("--kubernetes-version: {e}; write one such as v1.30.2")
            })?;
            Some(capstan_addons::fit::ClusterVersions::new(v.clone(), []))
        }
        None => None,
    };
    let capstan_addons::engine::Rendered {
        resolved,
        objects,
        rewrites,
        ..
    } = capstan_addons::engine::render(
        &plugin,
        &addon,
        &grants,
        args.tenant,
        &args.image_rewrites,
        None,
        capstan_addons::engine::TargetCluster {
            versions: cluster.as_ref(),
            // No cluster to read: Kubernetes' own aggregating roles only.
            aggregation: capstan_addons::engine::Aggregation::BuiltIn,
        },
    )
    .await?;
    let channel = resolved
        .channel
        .map(|c| format!(" (channel {c})"))
        .unwrap_or_default();
    eprintln!(
        "# {} {}{channel}: {} objects, in apply order",
        plugin.plugin().name(),
        resolved.version,
        objects.len()
    );
    for r in &rewrites {
        eprintln!("# image {} -> {}", r.from, r.to);
    }
    if args.output == "json" {
        let list: Vec<&serde_json::Value> = objects.iter().map(|o| &o.value).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        let docs: Vec<String> = objects
            .iter()
            .map(|o| serde_yaml::to_string(&o.value))
            .collect::<Result<_, _>>()?;
        print!("{}", docs.join("---\n"));
    }
    Ok(ExitCode::SUCCESS)
}
