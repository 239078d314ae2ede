//! Conformance checks of the addon world. They need no cluster: an addon
//! plugin only renders and judges.
//!
//! In order: `versions` lists each version once and answers the same twice;
//! each Kubernetes range it declares is a semantic-version requirement;
//! every version renders valid, distinct Kubernetes objects, the same ones
//! twice, all within the kinds the manifest declares; no text value of the
//! config is pasted into a longer rendered text; every channel
//! resolves to a version; a version the plugin does not list is a typed
//! error; `assess` answers (healthy or not, or a typed error) for any
//! input — nothing, the freshly rendered objects, garbage — and never traps.

use crate::{Check, Outcome, Report, brief};
use capstan_runtime::types::AddonSpec;
use capstan_runtime::{AddonPlugin, Error};

/// Run every addon check against `addon` with `config` (JSON object text).
pub async fn run_addon(addon: &AddonPlugin, config: &str) -> Report {
    let mut checks = Checks::default();
    let versions = match addon.versions().await {
        Ok(v) => v,
        Err(e) => {
            checks.record("versions answers".into(), Outcome::Fail(brief(&e)));
            return report(addon, checks.0);
        }
    };
    let known: Vec<(String, Vec<String>)> = versions
        .iter()
        .map(|v| (v.version.clone(), v.channels.clone()))
        .collect();
    version_checks(addon, &versions, &known, &mut checks).await;
    let mut unique: Vec<String> = known.iter().map(|(v, _)| v.clone()).collect();
    unique.dedup();
    let sample = render_checks(addon, config, &unique, &mut checks).await;
    if let Some(version) = unique.first() {
        checks.record(
            "config text is checked, never pasted into rendered text".into(),
            injection(addon, config, version).await,
        );
    }
    channel_checks(&known, &mut checks);
    assess_checks(addon, config, &unique, sample, &mut checks).await;
    report(addon, checks.0)
}

/// The checks so far, in order.
#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn record(&mut self, name: String, outcome: Outcome) {
        self.0.push(Check { name, outcome });
    }
}

/// The Addon the checks render and assess, at `version`.
fn spec(config: &str, version: &str) -> AddonSpec {
    AddonSpec {
        name: "conformance".into(),
        namespace: "default".into(),
        version: Some(version.to_string()),
        channel: None,
        config: config.to_string(),
        kubernetes_version: None,
    }
}

/// `versions`: each version once, the same answer twice, and every
/// Kubernetes range a semantic-version requirement.
async fn version_checks(
    addon: &AddonPlugin,
    versions: &[capstan_runtime::types::VersionInfo],
    known: &[(String, Vec<String>)],
    checks: &mut Checks,
) {
    let mut record = |name: String, outcome: Outcome| checks.record(name, outcome);
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

    let invalid: Vec<String> = versions
        .iter()
        .filter_map(|v| {
            let range = v.kubernetes.as_deref()?;
            let any = capstan_addons::fit::ClusterVersions::default();
            match capstan_addons::fit::fit(Some(range), &any) {
                capstan_addons::fit::Fit::Invalid { why, .. } => {
                    Some(format!("{}: {range:?} ({why})", v.version))
                }
                _ => None,
            }
        })
        .collect();
    record(
        "each declared Kubernetes range is a semantic-version requirement".into(),
        if invalid.is_empty() {
            Outcome::Pass
        } else {
            Outcome::Fail(format!(
                "{}; write one such as \">=1.28.0, <1.32.0\"",
                invalid.join("; ")
            ))
        },
    );
}

/// Each version renders valid, distinct objects within the declared
/// kinds, the same twice; returns the first render (for `assess`).
async fn render_checks(
    addon: &AddonPlugin,
    config: &str,
    unique: &[String],
    checks: &mut Checks,
) -> Vec<String> {
    let declared = addon.plugin().manifest().capabilities.objects.clone();
    let mut record = |name: String, outcome: Outcome| checks.record(name, outcome);
    let mut sample = Vec::new();
    for version in unique {
        let first = addon.render(&spec(config, version)).await;
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
                    // The declaration, not the grants or the floor: what
                    // an addon may hand out is the admin's grant to choose.
                    match capstan_addons::undeclared(&objects, &declared).as_slice() {
                        [] => Outcome::Pass,
                        refused => Outcome::Fail(
                            refused
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join("; "),
                        ),
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
            match addon.render(&spec(config, version)).await {
                Ok(again) if again == rendered => Outcome::Pass,
                Ok(again) => Outcome::Fail(first_difference(&rendered, &again)),
                Err(e) => Outcome::Fail(format!("the second render failed: {}", brief(&e))),
            },
        );
        if sample.is_empty() {
            sample = rendered;
        }
    }

    sample
}

/// Every channel resolves to a version.
fn channel_checks(known: &[(String, Vec<String>)], checks: &mut Checks) {
    let mut channels: Vec<String> = known.iter().flat_map(|(_, c)| c.clone()).collect();
    channels.sort();
    channels.dedup();
    let unresolved: Vec<String> = channels
        .iter()
        .filter(|c| capstan_addons::resolve_version(None, Some(c), known).is_err())
        .cloned()
        .collect();
    checks.record(
        "every channel resolves to a version".into(),
        if unresolved.is_empty() {
            Outcome::Pass
        } else {
            Outcome::Fail(format!("unresolved: {}", unresolved.join(", ")))
        },
    );
}

/// A version it does not list is a typed error, and `assess` answers for
/// nothing, the rendered objects and garbage.
async fn assess_checks(
    addon: &AddonPlugin,
    config: &str,
    unique: &[String],
    sample: Vec<String>,
    checks: &mut Checks,
) {
    let mut record = |name: String, outcome: Outcome| checks.record(name, outcome);
    let unknown = "0.0.0-capstan-conformance";
    record(
        "a version it does not list is a typed error".into(),
        match addon.render(&spec(config, unknown)).await {
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
            match addon.assess(&spec(config, &version), &observed).await {
                Ok(_) | Err(Error::Plugin { .. }) => Outcome::Pass,
                Err(e) => Outcome::Fail(brief(&e)),
            },
        );
    }
}

/// A config value with newlines, braces and quotes: a plugin that pastes
/// it into a larger text (a Corefile, a script, a config file) lets
/// whoever writes the Addon add directives of their own.
const HOSTILE_TEXT: &str = "capstan\n}\n\"'{ injected";

/// Each string in `config`, in turn replaced by [`HOSTILE_TEXT`]: the
/// plugin must refuse the config (a typed error), or render the value only
/// as a whole field of its own, never inside a longer text.
async fn injection(addon: &AddonPlugin, config: &str, version: &str) -> Outcome {
    let Ok(config) = serde_json::from_str::<serde_json::Value>(config) else {
        return Outcome::Skip("the config is not JSON".into());
    };
    let mut pointers = Vec::new();
    string_pointers(&config, String::new(), &mut pointers);
    if pointers.is_empty() {
        return Outcome::Skip(
            "the config has no text values to try; pass --config with the plugin's text fields"
                .into(),
        );
    }
    let mut pasted = Vec::new();
    for pointer in &pointers {
        let mut hostile = config.clone();
        if let Some(value) = hostile.pointer_mut(pointer) {
            *value = HOSTILE_TEXT.into();
        }
        let spec = AddonSpec {
            name: "conformance".into(),
            namespace: "default".into(),
            version: Some(version.to_string()),
            channel: None,
            config: hostile.to_string(),
            kubernetes_version: None,
        };
        match addon.render(&spec).await {
            Err(Error::Plugin { .. }) => {}
            Err(e) => return Outcome::Fail(format!("config {pointer}: {}", brief(&e))),
            Ok(objects) => {
                let inside = objects.iter().position(|text| {
                    serde_json::from_str::<serde_json::Value>(text)
                        .is_ok_and(|object| pasted_into_text(&object))
                });
                if let Some(i) = inside {
                    pasted.push(format!("config {pointer} is pasted into object {i}"));
                }
            }
        }
    }
    if pasted.is_empty() {
        Outcome::Pass
    } else {
        Outcome::Fail(format!(
            "{}; check the value against its grammar (or escape it) before rendering",
            pasted.join(", ")
        ))
    }
}

fn string_pointers(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(_) => out.push(at),
        serde_json::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                string_pointers(item, format!("{at}/{i}"), out);
            }
        }
        serde_json::Value::Object(map) => {
            for (key, item) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                string_pointers(item, format!("{at}/{key}"), out);
            }
        }
        _ => {}
    }
}

/// Whether some text field of `value` holds [`HOSTILE_TEXT`] inside a
/// longer text.
fn pasted_into_text(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s != HOSTILE_TEXT && s.contains(HOSTILE_TEXT),
        serde_json::Value::Array(items) => items.iter().any(pasted_into_text),
        serde_json::Value::Object(map) => map.values().any(pasted_into_text),
        _ => false,
    }
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
