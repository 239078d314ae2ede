//! `capstan plugin inspect PATH|oci://…`: what a plugin component is and
//! asks for; a remote reference is described and its signatures checked
//! against the trust policy without downloading the component.

use crate::distribute::reference;
use crate::options::Output;
use crate::supply::{RegistryArgs, TrustArgs};
use anyhow::Context;
use capstan_registry::policy::{Signer, TrustPolicy};
use capstan_runtime::{Grants, Limits};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `capstan plugin inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Path of the plugin component (`.wasm`), or `oci://REGISTRY/REPO:TAG`.
    pub path: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
    #[command(flatten)]
    pub trust: crate::supply::TrustArgs,
    #[command(flatten)]
    pub registry: crate::supply::RegistryArgs,
}

#[derive(Debug, Serialize)]
struct Inspection {
    path: String,
    digest: String,
    size_bytes: usize,
    manifest: capstan_runtime::PluginManifest,
    world: String,
    contract: String,
    host_supports_contract: bool,
    imports: Vec<String>,
    exports: Vec<String>,
    /// The most host memory one call may hold with the default limits
    /// (`spec.quota.hostBytes` must hold `concurrentCalls` of these).
    host_bytes_per_call: u64,
    /// What one call's instance holds.
    core_instances_per_call: usize,
    memories_per_call: usize,
    tables_per_call: usize,
}

/// Run the command.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let text = args.path.display().to_string();
    if text.starts_with("oci://") {
        return tokio::task::spawn_blocking(move || {
            inspect_remote(&text, &args.trust, &args.registry, args.output)
        })
        .await?;
    }
    let bytes = std::fs::read(&args.path)
        .with_context(|| format!("cannot read {}", args.path.display()))?;
    // Loading compiles and links the component, so inspect also proves it
    // would run in this host.
    let runtime = crate::options::one_shot_runtime(1)?;
    let plugin = runtime.load(
        &args.path.display().to_string(),
        &bytes,
        Limits::default(),
        Grants::default(),
    )?;
    let manifest = plugin.manifest().clone();
    let inspection = Inspection {
        path: args.path.display().to_string(),
        digest: plugin.digest().to_string(),
        size_bytes: bytes.len(),
        world: manifest.world.to_string(),
        contract: manifest.contract.clone(),
        host_supports_contract: capstan_runtime::PluginManifest::validate(&manifest).is_ok(),
        imports: plugin.imports(),
        exports: plugin.exports(),
        host_bytes_per_call: Limits::default().host_bytes_per_call(),
        core_instances_per_call: plugin.footprint().core_instances,
        memories_per_call: plugin.footprint().memories,
        tables_per_call: plugin.footprint().tables,
        manifest,
    };
    match args.output {
        format @ (Output::Json | Output::Yaml) => format.print(&inspection)?,
        Output::Text => print!("{}", render(&inspection)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The `Per call:` line: what one call instantiates.
pub(crate) fn render_per_call(core_instances: usize, memories: usize, tables: usize) -> String {
    format!("Per call:   {core_instances} core instances, {memories} memories, {tables} tables\n")
}

fn render(i: &Inspection) -> String {
    let m = &i.manifest;
    let mut out = format!(
        "Plugin:     {} {}\nPath:       {} ({} bytes)\nDigest:     {}\nWorld:      {} (exports capstan:plugin/{}@{})\nContract:   {}{}\n",
        m.name,
        m.version,
        i.path,
        i.size_bytes,
        i.digest,
        i.world,
        i.world,
        i.contract,
        i.contract,
        if i.host_supports_contract {
            " (supported by this host)"
        } else {
            " (NOT supported by this host)"
        },
    );
    out.push_str(&render_capabilities(m));
    out.push_str(&format!(
        "Host bytes per call: {} ({:.1} MiB with the default limits; spec.quota.hostBytes must hold concurrentCalls of these)\n",
        i.host_bytes_per_call,
        i.host_bytes_per_call as f64 / (1024.0 * 1024.0),
    ));
    out.push_str(&render_per_call(
        i.core_instances_per_call,
        i.memories_per_call,
        i.tables_per_call,
    ));
    out.push_str("Exports:\n");
    for e in &i.exports {
        out.push_str(&format!("  {e}\n"));
    }
    out.push_str("Imports:\n");
    for e in &i.imports {
        out.push_str(&format!("  {e}\n"));
    }
    out
}

/// The `Capabilities:` block of a manifest (local and remote inspect).
pub(crate) fn render_capabilities(m: &capstan_runtime::PluginManifest) -> String {
    let mut out = String::from("Capabilities:\n");
    if m.capabilities.http.is_empty() {
        out.push_str("  (none: no outbound HTTP)\n");
    }
    for cap in &m.capabilities.http {
        let mut line = format!("  http  {}", cap.destination);
        if let Some(slot) = &cap.credential {
            line.push_str(&format!("  credential slot `{slot}`"));
        }
        if cap.optional {
            line.push_str("  (optional: may stay ungranted)");
        }
        out.push_str(&line);
        out.push('\n');
    }
    for pattern in &m.capabilities.objects {
        out.push_str(&format!("  objects  {pattern}\n"));
    }
    out
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SignatureReport {
    origin: String,
    /// The policy key or identity that made it, if any.
    signed_by: Option<String>,
    /// Why it does not count, if it does not.
    problem: Option<String>,
    /// A keyless signature's signer as its certificate names it
    /// (`SUBJECT from ISSUER`; verified only if `signedBy` is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    identity: Option<String>,
    /// A keyless signature's Rekor log index.
    #[serde(skip_serializing_if = "Option::is_none")]
    log_index: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RemoteInspection {
    reference: String,
    digest: String,
    manifest: capstan_registry::oci::Manifest,
    plugin: capstan_manifest::PluginManifest,
    signatures: Vec<SignatureReport>,
    /// `None` without --key/--policy.
    policy: Option<Verdict>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Verdict {
    satisfied: bool,
    signers: Vec<Signer>,
    /// What failed, when not satisfied.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// `capstan plugin inspect oci://…`: the manifest, capabilities and every
/// signature, without downloading the component.
pub fn inspect_remote(
    text: &str,
    trust: &TrustArgs,
    registry: &RegistryArgs,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let source = reference(text)?;
    let mut puller = registry.puller()?;
    puller.cache = None;
    let described = puller.describe(&source)?;
    let candidates = puller.signatures(&source, &described, &[])?;
    let policy = trust.policy()?;
    let keys: Vec<(String, capstan_registry::keys::PublicKey)> = policy
        .as_ref()
        .map(|p: &TrustPolicy| p.keys().map(|(n, k)| (n.to_string(), k.clone())).collect())
        .unwrap_or_default();
    let identities: Vec<(String, capstan_registry::keyless::IdentityRule)> = policy
        .as_ref()
        .map(|p: &TrustPolicy| {
            p.identities()
                .map(|(n, r)| (n.to_string(), r.clone()))
                .collect()
        })
        .unwrap_or_default();
    let signatures = candidates
        .iter()
        .map(|c| report(c, policy.is_some(), &keys, &identities))
        .collect();
    let verdict = policy.as_ref().map(|p| {
        capstan_registry::verify::rule_for(p, &source)
            .map_err(|e| e.to_string())
            .and_then(|rule| capstan_registry::policy::evaluate(&rule, &candidates))
    });
    let inspection = RemoteInspection {
        reference: source.pinned(&described.digest).to_string(),
        digest: described.digest.to_string(),
        manifest: described.manifest.clone(),
        plugin: described.plugin.clone(),
        signatures,
        policy: verdict.map(|v| match v {
            Ok(signers) => Verdict {
                satisfied: true,
                signers,
                reason: None,
            },
            Err(reason) => Verdict {
                satisfied: false,
                signers: Vec::new(),
                reason: Some(reason),
            },
        }),
    };
    match output {
        format @ (Output::Json | Output::Yaml) => format.print(&inspection)?,
        Output::Text => print!("{}", render_remote(&inspection)),
    }
    Ok(ExitCode::SUCCESS)
}

/// One signature as inspect shows it: which of the policy's keys or
/// identities made it, or why none did.
fn report(
    c: &capstan_registry::signature::Candidate,
    judged: bool,
    keys: &[(String, capstan_registry::keys::PublicKey)],
    identities: &[(String, capstan_registry::keyless::IdentityRule)],
) -> SignatureReport {
    let claimed = c.keyless.as_ref().and_then(|k| k.claimed());
    let mut signed_by = keys
        .iter()
        .find(|(_, k)| c.verified_by(k))
        .map(|(n, _)| n.clone());
    let mut refusals = Vec::new();
    if let (Ok(()), Some(keyless), None) = (&c.claim, &c.keyless, &signed_by) {
        for (name, rule) in identities {
            match rule.check(keyless) {
                Ok(_) => {
                    signed_by = Some(name.clone());
                    break;
                }
                Err(reason) => refusals.push(format!("{name}: {reason}")),
            }
        }
    }
    let problem = match &c.claim {
        Err(reason) => Some(reason.clone()),
        Ok(()) if judged && signed_by.is_none() => Some(if refusals.is_empty() {
            "not made by any key or identity of the policy".into()
        } else {
            refusals.join("; ")
        }),
        Ok(()) => None,
    };
    SignatureReport {
        origin: c.origin.clone(),
        signed_by,
        problem,
        identity: claimed
            .as_ref()
            .map(|s| format!("{} from {}", s.subject, s.issuer)),
        log_index: claimed.and_then(|s| s.log_index),
    }
}

fn render_remote(i: &RemoteInspection) -> String {
    let m = &i.plugin;
    let layer = &i.manifest.layers[0];
    let mut out = format!(
        "Plugin:     {} {}\nReference:  {}\nDigest:     {}\nComponent:  {} ({} bytes)\nWorld:      {}-plugin\nContract:   {}\n",
        m.name, m.version, i.reference, i.digest, layer.digest, layer.size, m.world, m.contract
    );
    out.push_str(&render_capabilities(m));
    out.push_str("Signatures:\n");
    if i.signatures.is_empty() {
        out.push_str("  (none: unsigned)\n");
    }
    for s in &i.signatures {
        let status = match (&s.signed_by, &s.problem) {
            (Some(name), _) if s.identity.is_some() => format!("verifies as identity {name}"),
            (Some(name), _) => format!("verifies with key {name}"),
            (None, Some(problem)) => format!("does not count: {problem}"),
            (None, None) => "not checked (no --key, --identity or --policy)".to_string(),
        };
        out.push_str(&format!("  {}: {status}\n", s.origin));
        if let Some(identity) = &s.identity {
            let logged = s
                .log_index
                .map(|i| format!(", Rekor log index {i}"))
                .unwrap_or_default();
            out.push_str(&format!("    keyless: {identity}{logged}\n"));
        }
    }
    match &i.policy {
        None => out.push_str("Policy:     none given (--key PUB or --policy FILE)\n"),
        Some(v) if v.satisfied => {
            let names: Vec<&str> = v.signers.iter().map(|s| s.name.as_str()).collect();
            out.push_str(&format!(
                "Policy:     satisfied (signed by {})\n",
                names.join(", ")
            ));
        }
        Some(v) => out.push_str(&format!(
            "Policy:     NOT satisfied: {}\n",
            v.reason.as_deref().unwrap_or_default()
        )),
    }
    out
}
