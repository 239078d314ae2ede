//! Update policies (`spec.updatePolicy`), without I/O: which version an
//! Addon renders and which newer one its channel offers.
//!
//! `spec.version` always wins. Otherwise the channel's newest version is
//! *available*; under `Auto` it is also what renders, under `Notify` and
//! `Manual` what is applied stays (a ratchet that only `spec.version`
//! moves), the first install excepted. A kept version the plugin no longer
//! offers is [`AddonError::NoLongerOffered`]: nothing is rendered, so
//! nothing is applied or pruned.
//!
//! Kubernetes fit ([`crate::fit`]): a version that does not fit the target
//! cluster is never newly applied ([`AddonError::Incompatible`]) nor
//! offered as available; the channel's newest that fits is. What is
//! applied already stays when the cluster moves out of its range (the
//! engine reports it), and `Auto` never moves below it for a misfit.

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
/// `spec.channel`, the version applied now (if any), what the plugin
/// offers (`known`: version and its channels) and `misfit`: why a version
/// does not fit the target cluster (`None`: it fits).
pub fn decide(
    policy: UpdatePolicy,
    version: Option<&str>,
    channel: Option<&str>,
    applied: Option<&str>,
    known: &[(String, Vec<String>)],
    misfit: &dyn Fn(&str) -> Option<String>,
) -> Result<Decision, AddonError> {
    let fits = |v: &str| misfit(v).is_none();
    let incompatible = |v: &str| AddonError::Incompatible {
        version: v.to_string(),
        why: misfit(v).unwrap_or_default(),
    };
    // The channel's newest version that fits.
    let newest_fitting = channel.and_then(|c| {
        known
            .iter()
            .filter(|(v, channels)| channels.iter().any(|x| x == c) && fits(v))
            .max_by(|a, b| version_order(&a.0, &b.0))
            .map(|(v, _)| v.clone())
    });
    let available = newest_fitting.clone();
    let is_known = |v: &str| known.iter().any(|(k, _)| k == v);
    if version.is_some() {
        let render = resolve_version(version, channel, known)?;
        // A pinned version that does not fit is refused, unless it is the
        // one applied already (the cluster moved; it stays).
        if !fits(&render.version) && applied != Some(render.version.as_str()) {
            return Err(incompatible(&render.version));
        }
        return Ok(Decision { render, available });
    }
    let render = match (policy, applied) {
        (UpdatePolicy::Notify | UpdatePolicy::Manual, Some(kept)) => {
            if !is_known(kept) {
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
        _ => {
            let newest = resolve_version(None, channel, known)?;
            if fits(&newest.version) {
                newest
            } else {
                let kept = applied.filter(|a| is_known(a));
                match (newest_fitting, kept) {
                    // Never below what is applied for a misfit.
                    (Some(v), Some(a)) if version_order(&v, a).is_lt() => Resolved {
                        version: a.to_string(),
                        channel: newest.channel,
                    },
                    (Some(v), _) => Resolved {
                        version: v,
                        channel: newest.channel,
                    },
                    (None, Some(a)) => Resolved {
                        version: a.to_string(),
                        channel: newest.channel,
                    },
                    (None, None) => return Err(incompatible(&newest.version)),
                }
            }
        }
    };
    Ok(Decision { render, available })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every version fits (no cluster known, or no ranges declared).
    fn any(_: &str) -> Option<String> {
        None
    }

    /// `decide` for an Addon on the `stable` channel.
    fn on_stable(
        policy: UpdatePolicy,
        version: Option<&str>,
        applied: Option<&str>,
        known: &[(String, Vec<String>)],
        misfit: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Decision, AddonError> {
        decide(policy, version, Some("stable"), applied, known, misfit)
    }

    fn offered(versions: &[(&str, &str)]) -> Vec<(String, Vec<String>)> {
        versions
            .iter()
            .map(|(v, c)| (v.to_string(), vec![c.to_string()]))
            .collect()
    }

    #[test]
    fn notify_keeps_what_is_applied_and_reports_the_channel_newest() {
        let known = offered(&[("1.7.0", "stable"), ("1.8.2", "stable")]);
        let d = on_stable(UpdatePolicy::Notify, None, Some("1.7.0"), &known, &any).unwrap();
        assert_eq!(d.render.version, "1.7.0");
        assert_eq!(d.available.as_deref(), Some("1.8.2"));
        assert!(d.update_available());
        // First install: the channel's.
        let d = on_stable(UpdatePolicy::Manual, None, None, &known, &any).unwrap();
        assert_eq!(d.render.version, "1.8.2");
        assert!(!d.update_available());
        // spec.version wins under every policy.
        let d = on_stable(
            UpdatePolicy::Manual,
            Some("1.8.2"),
            Some("1.7.0"),
            &known,
            &any,
        )
        .unwrap();
        assert_eq!(d.render.version, "1.8.2");
    }

    #[test]
    fn a_kept_version_no_longer_offered_renders_nothing() {
        let known = offered(&[("1.8.2", "stable")]);
        let e = on_stable(UpdatePolicy::Notify, None, Some("1.7.0"), &known, &any).unwrap_err();
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

    #[test]
    fn an_incompatible_version_is_refused_unless_applied_and_never_offered() {
        let known = offered(&[
            ("1.7.0", "stable"),
            ("1.8.2", "stable"),
            ("1.9.1", "stable"),
        ]);
        // The cluster fits 1.7.0 and 1.8.2 only.
        let misfit = |v: &str| (v == "1.9.1").then(|| "needs >=1.31".to_string());
        let d = on_stable(UpdatePolicy::Auto, None, None, &known, &misfit).unwrap();
        assert_eq!(d.render.version, "1.8.2");
        assert_eq!(d.available.as_deref(), Some("1.8.2"));
        let e = on_stable(UpdatePolicy::Auto, Some("1.9.1"), None, &known, &misfit).unwrap_err();
        assert_eq!(
            e.to_string(),
            "version 1.9.1 does not fit the target cluster: needs >=1.31; nothing of it was applied; set spec.version to a version that fits, or move the cluster into its range"
        );
        // Applied already, then the cluster moved: it stays.
        let d = on_stable(
            UpdatePolicy::Notify,
            Some("1.9.1"),
            Some("1.9.1"),
            &known,
            &misfit,
        )
        .unwrap();
        assert_eq!(d.render.version, "1.9.1");
        // Nothing fits and nothing is applied: refused, naming the newest.
        let none = |_: &str| Some("no".to_string());
        let e = on_stable(UpdatePolicy::Auto, None, None, &known, &none).unwrap_err();
        assert!(
            matches!(e, AddonError::Incompatible { ref version, .. } if version == "1.9.1"),
            "{e}"
        );
        // Auto keeps 1.8.2 when only 1.7.0 fits: never downwards for a misfit.
        let only_old = |v: &str| (v != "1.7.0").then(|| "no".to_string());
        let d = on_stable(UpdatePolicy::Auto, None, Some("1.8.2"), &known, &only_old).unwrap();
        assert_eq!(d.render.version, "1.8.2");
        assert_eq!(d.available.as_deref(), Some("1.7.0"));
        assert!(!d.update_available());
    }

    proptest! {
        /// With any cluster: nothing that does not fit is newly applied
        /// (only what is applied already may stay); what is offered as
        /// available fits; Auto never goes below what is applied because
        /// the channel's newest does not fit.
        #[test]
        fn an_incompatible_version_is_never_newly_applied(
            known in arb_known(),
            fitting in proptest::bits::u16::ANY,
            applied in proptest::option::of((0u8..4, 0u8..4).prop_map(|(m, p)| format!("1.{m}.{p}"))),
            policy in proptest::sample::select(vec![UpdatePolicy::Auto, UpdatePolicy::Notify, UpdatePolicy::Manual]),
            pinned in proptest::option::of((0u8..4, 0u8..4).prop_map(|(m, p)| format!("1.{m}.{p}"))),
        ) {
            let fits = |v: &str| {
                let n: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
                fitting & (1 << (n[1] * 4 + n[2])) != 0
            };
            let misfit = |v: &str| (!fits(v)).then(|| "outside".to_string());
            let got = decide(policy, pinned.as_deref(), Some("stable"), applied.as_deref(), &known, &misfit);
            if let Ok(d) = &got {
                prop_assert!(fits(&d.render.version) || applied.as_deref() == Some(d.render.version.as_str()));
                if let Some(a) = &d.available {
                    prop_assert!(fits(a));
                }
                let newest = resolve_version(None, Some("stable"), &known).ok().map(|r| r.version);
                let applied_known = applied.as_ref().filter(|a| known.iter().any(|(k, _)| k == *a));
                if let (None, UpdatePolicy::Auto, Some(a), Some(n)) = (&pinned, policy, applied_known, &newest)
                    && !fits(n)
                {
                    prop_assert!(version_order(&d.render.version, a).is_ge());
                }
            }
        }

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
            let got = decide(policy, pinned.as_deref(), Some("stable"), applied.as_deref(), &known, &any);
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
