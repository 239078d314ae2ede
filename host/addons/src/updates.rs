//! Update policies (`spec.updatePolicy`), without I/O: which version an
//! Addon renders and which newer one its channel offers.
//!
//! `spec.version` always wins. Otherwise the channel's newest version is
//! *available*; under `Auto` it is also what renders, under `Notify` and
//! `Manual` what is applied stays (a ratchet that only `spec.version`
//! moves), the first install excepted. A kept version the plugin no longer
//! offers is [`AddonError::NoLongerOffered`]: nothing is rendered, so
//! nothing is applied or pruned.

use crate::{AddonError, Resolved, resolve_version, version_order};
use capstan_api::UpdatePolicy;

/// What an Addon renders, and what its channel offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The version to render.
    pub render: Resolved,
    /// The channel's newest version, when the Addon follows a channel the
    /// plugin knows.
    pub available: Option<String>,
}

impl Decision {
    /// Whether the channel offers a newer version than the one rendered.
    pub fn update_available(&self) -> bool {
        self.available
            .as_deref()
            .is_some_and(|a| version_order(a, &self.render.version) == std::cmp::Ordering::Greater)
    }
}

/// The version to render under `policy`, given `spec.version`,
/// `spec.channel`, the version applied now (if any) and what the plugin
/// offers (`known`: version and its channels).
pub fn decide(
    policy: UpdatePolicy,
    version: Option<&str>,
    channel: Option<&str>,
    applied: Option<&str>,
    known: &[(String, Vec<String>)],
) -> Result<Decision, AddonError> {
    let available = channel
        .and_then(|c| resolve_version(None, Some(c), known).ok())
        .map(|r| r.version);
    if version.is_some() {
        let render = resolve_version(version, channel, known)?;
        return Ok(Decision { render, available });
    }
    let render = match (policy, applied) {
        (UpdatePolicy::Notify | UpdatePolicy::Manual, Some(kept)) => {
            if !known.iter().any(|(v, _)| v == kept) {
                return Err(AddonError::NoLongerOffered {
                    version: kept.to_string(),
                    known: known.iter().map(|(v, _)| v.clone()).collect(),
                });
            }
            Resolved {
                version: kept.to_string(),
                channel: channel.map(str::to_string),
            }
        }
        _ => resolve_version(None, channel, known)?,
    };
    Ok(Decision { render, available })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn offered(versions: &[(&str, &str)]) -> Vec<(String, Vec<String>)> {
        versions
            .iter()
            .map(|(v, c)| (v.to_string(), vec![c.to_string()]))
            .collect()
    }

    #[test]
    fn notify_keeps_what_is_applied_and_reports_the_channel_newest() {
        let known = offered(&[("1.7.0", "stable"), ("1.8.2", "stable")]);
        let d = decide(
            UpdatePolicy::Notify,
            None,
            Some("stable"),
            Some("1.7.0"),
            &known,
        )
        .unwrap();
        assert_eq!(d.render.version, "1.7.0");
        assert_eq!(d.available.as_deref(), Some("1.8.2"));
        assert!(d.update_available());
        // First install: the channel's.
        let d = decide(UpdatePolicy::Manual, None, Some("stable"), None, &known).unwrap();
        assert_eq!(d.render.version, "1.8.2");
        assert!(!d.update_available());
        // spec.version wins under every policy.
        let d = decide(
            UpdatePolicy::Manual,
            Some("1.8.2"),
            Some("stable"),
            Some("1.7.0"),
            &known,
        )
        .unwrap();
        assert_eq!(d.render.version, "1.8.2");
    }

    #[test]
    fn a_kept_version_no_longer_offered_renders_nothing() {
        let known = offered(&[("1.8.2", "stable")]);
        let e = decide(
            UpdatePolicy::Notify,
            None,
            Some("stable"),
            Some("1.7.0"),
            &known,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("version 1.7.0 is applied and kept by spec.updatePolicy"),
            "{e}"
        );
    }

    fn arb_known() -> impl Strategy<Value = Vec<(String, Vec<String>)>> {
        proptest::collection::vec(
            (
                0u8..4,
                0u8..4,
                proptest::sample::select(vec!["stable", "rapid"]),
            ),
            1..6,
        )
        .prop_map(|vs| {
            vs.into_iter()
                .map(|(minor, patch, c)| (format!("1.{minor}.{patch}"), vec![c.to_string()]))
                .collect()
        })
    }

    proptest! {
        /// Under Notify and Manual the rendered version changes only with
        /// spec.version: whatever the channel offers, an applied version
        /// is kept (or nothing renders). Under Auto it is the channel's
        /// newest. The available version is the channel's newest under
        /// every policy.
        #[test]
        fn only_spec_version_moves_a_kept_version(
            known in arb_known(),
            applied in proptest::option::of((0u8..4, 0u8..4).prop_map(|(m, p)| format!("1.{m}.{p}"))),
            policy in proptest::sample::select(vec![UpdatePolicy::Auto, UpdatePolicy::Notify, UpdatePolicy::Manual]),
            pinned in proptest::option::of((0u8..4, 0u8..4).prop_map(|(m, p)| format!("1.{m}.{p}"))),
        ) {
            let newest = resolve_version(None, Some("stable"), &known).ok().map(|r| r.version);
            let got = decide(policy, pinned.as_deref(), Some("stable"), applied.as_deref(), &known);
            if let Ok(d) = &got {
                prop_assert_eq!(&d.available, &newest);
            }
            match (&pinned, policy, &applied) {
                (Some(p), _, _) => match got {
                    Ok(d) => prop_assert_eq!(&d.render.version, p),
                    Err(e) => prop_assert!(matches!(e, AddonError::UnknownVersion { .. }), "{e}"),
                },
                (None, UpdatePolicy::Notify | UpdatePolicy::Manual, Some(a)) => match got {
                    Ok(d) => prop_assert_eq!(&d.render.version, a),
                    Err(e) => prop_assert!(matches!(e, AddonError::NoLongerOffered { .. }), "{e}"),
                },
                (None, _, _) => match got {
                    Ok(d) => prop_assert_eq!(Some(d.render.version), newest),
                    Err(_) => prop_assert!(newest.is_none()),
                },
            }
        }
    }
}
