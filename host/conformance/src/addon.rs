//! Conformance checks of the addon world. They need no cluster: an addon
//! plugin only renders and judges.
//!
//! In order: `versions` lists each version once and answers the same twice;
//! every version renders valid, distinct Kubernetes objects, the same ones
//! twice, all within the kinds the manifest declares; every channel
//! resolves to a version; a version the plugin does not list is a typed
//! error; `assess` answers (healthy or not, or a typed error) for any
//! input — nothing, the freshly rendered objects, garbage — and never traps.

use crate::{Check, Outcome, Report, brief};
use capstan_runtime::types::AddonSpec;
use capstan_runtime::{AddonPlugin, Error};

/// Run every addon check against `addon` with `config` (JSON object text).
pub async fn run_addon(addon: &AddonPlugin, config: &str) -> Report {
    let mut checks = Vec::new();
    let mut record = |name: String, outcome: Outcome| checks.push(Check { name, outcome });
    let plugin = addon.plugin();
    let declared = plugin.manifest().capabilities.objects.clone();
    let spec = |version: &str| AddonSpec {
        name: "conformance".into(),
        namespace: "default".into(),
        version: Some(version.to_string()),
        channel: None,
        config: config.to_string(),
    };

    let versions = match addon.versions().await {
        Ok(v) => v,
        Err(e) => {
            record("versions answers".into(), Outcome::Fail(brief(&e)));
            return report(addon, checks);
        }
    };
    let known: Vec<(String, Vec<String>)> = versions
        .iter()
        .map(|v| (v.version.clone(), v.channels.clone()))
        .collect();
    let mut names: Vec<&str> = known.iter().map(|(v, _)| v.as_str()).collect();
    names.sort();
    let repeated: Vec<&str> = names
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    record(
        "versions lists at least one version, each once".into(),
        if names.is_empty() {
            Outcome::Fail("no versions".into())
        } else if !repeated.is_empty() {
            Outcome::Fail(format!(
                "listed more than once: {} (put all of a version's channels in one entry)",
                repeated.join(", ")
            ))
        } else {
            Outcome::Pass
        },
    );
    record(
        "versions answers the same twice".into(),
        match addon.versions().await {
            Ok(again) if again == versions => Outcome::Pass,
            Ok(_) => Outcome::Fail("the second answer differs".into()),
            Err(e) => Outcome::Fail(brief(&e)),
        },
    );

    let mut unique: Vec<String> = known.iter().map(|(v, _)| v.clone()).collect();
    unique.dedup();
    let mut sample = Vec::new();
    for version in &unique {
        let first = addon.render(&spec(version)).await;
        let rendered = match first {
            Ok(r) => r,
            Err(e) => {
                record(
                    format!("render {version} succeeds"),
                    Outcome::Fail(brief(&e)),
                );
                continue;
            }
        };
        let (valid, within) = match capstan_addons::parse_render(&rendered) {
            Ok(objects) if objects.is_empty() => (Outcome::Fail("no objects".into()), None),
            Ok(objects) => (
                Outcome::Pass,
                Some(
                    // The declaration, not the floor: the Pod Security
                    // level is the admin's grant to choose.
                    match capstan_addons::check_grants(
                        &objects,
                        &declared,
                        &declared,
                        capstan_addons::PodSecurityLevel::Privileged,
                    ) {
                        Ok(()) => Outcome::Pass,
                        Err(e) => Outcome::Fail(e.to_string()),
                    },
                ),
            ),
            Err(e) => (Outcome::Fail(e.to_string()), None),
        };
        record(
            format!("render {version} returns valid, distinct objects"),
            valid,
        );
        if let Some(within) = within {
            record(
                format!("render {version} stays within the declared kinds"),
                within,
            );
        }
        record(
            format!("render {version} is deterministic"),
            match addon.render(&spec(version)).await {
                Ok(again) if again == rendered => Outcome::Pass,
                Ok(again) => Outcome::Fail(first_difference(&rendered, &again)),
                Err(e) => Outcome::Fail(format!("the second render failed: {}", brief(&e))),
            },
        );
        if sample.is_empty() {
            sample = rendered;
        }
    }

    let mut channels: Vec<String> = known.iter().flat_map(|(_, c)| c.clone()).collect();
    channels.sort();
    channels.dedup();
    let unresolved: Vec<String> = channels
        .iter()
        .filter(|c| capstan_addons::resolve_version(None, Some(c), &known).is_err())
        .cloned()
        .collect();
    record(
        "every channel resolves to a version".into(),
        if unresolved.is_empty() {
            Outcome::Pass
        } else {
            Outcome::Fail(format!("unresolved: {}", unresolved.join(", ")))
        },
    );

    let unknown = "0.0.0-capstan-conformance";
    record(
        "a version it does not list is a typed error".into(),
        match addon.render(&spec(unknown)).await {
            Err(Error::Plugin { .. }) => Outcome::Pass,
            Ok(objects) => Outcome::Fail(format!(
                "rendered {} objects for version {unknown}, which it does not list",
                objects.len()
            )),
            Err(e) => Outcome::Fail(brief(&e)),
        },
    );

    let version = unique.first().cloned().unwrap_or_default();
    let garbage: Vec<String> = ["", "null", "{}", "[1]", "{\"kind\":7}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (what, observed) in [
        ("nothing observed", Vec::new()),
        ("the rendered objects without status", sample.clone()),
        ("garbage", garbage),
    ] {
        record(
            format!("assess answers for {what}"),
            match addon.assess(&spec(&version), &observed).await {
                Ok(_) | Err(Error::Plugin { .. }) => Outcome::Pass,
                Err(e) => Outcome::Fail(brief(&e)),
            },
        );
    }
    report(addon, checks)
}

fn first_difference(a: &[String], b: &[String]) -> String {
    if a.len() != b.len() {
        return format!("{} objects, then {}", a.len(), b.len());
    }
    let (i, (x, y)) = a
        .iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .unwrap_or((0, (&a[0], &b[0])));
    let at = x
        .bytes()
        .zip(y.bytes())
        .position(|(p, q)| p != q)
        .unwrap_or(x.len().min(y.len()));
    let from = at.saturating_sub(40);
    format!(
        "object {i} differs between two renders near …{}…",
        x.get(from..(at + 20).min(x.len())).unwrap_or("")
    )
}

fn report(addon: &AddonPlugin, checks: Vec<Check>) -> Report {
    Report::new(addon.plugin(), String::new(), checks)
}
