//! Kubernetes version fit, without I/O: whether an addon version may be
//! applied to a cluster, given the Kubernetes range its plugin declares for
//! it (`version-info.kubernetes`, contract 0.2.0) and the versions the
//! cluster runs — its API server's and every Node's kubelet's, since an
//! addon uses the one's APIs and runs beside the other.
//!
//! Start with [`fit`]; [`updates::decide`](crate::updates::decide) uses it
//! to refuse an incompatible version before anything is applied and to
//! offer only compatible updates.

use std::collections::BTreeSet;

/// The Kubernetes versions a cluster runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterVersions {
    /// The API server's (`/version`'s `gitVersion`, such as `v1.30.2`).
    pub server: String,
    /// Every Node's kubelet's, each once.
    pub kubelets: BTreeSet<String>,
}

impl ClusterVersions {
    /// A cluster whose API server runs `server` and whose Nodes' kubelets
    /// run `kubelets`.
    pub fn new(server: impl Into<String>, kubelets: impl IntoIterator<Item = String>) -> Self {
        ClusterVersions {
            server: server.into(),
            kubelets: kubelets.into_iter().collect(),
        }
    }

    /// Every version with what runs it: the API server first.
    fn components(&self) -> impl Iterator<Item = (&str, &'static str)> {
        std::iter::once((self.server.as_str(), "API server"))
            .chain(self.kubelets.iter().map(|k| (k.as_str(), "kubelet")))
    }
}

impl std::fmt::Display for ClusterVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (API server)", self.server)?;
        if !self.kubelets.is_empty() {
            let kubelets: Vec<&str> = self.kubelets.iter().map(String::as_str).collect();
            write!(f, ", {} (kubelets)", kubelets.join(", "))?;
        }
        Ok(())
    }
}

/// How one addon version fits a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// The version declares no Kubernetes range: it fits every cluster.
    Any,
    /// Every version the cluster runs meets `range`.
    Within {
        /// The declared range.
        range: String,
    },
    /// Some versions the cluster runs do not meet `range`.
    Outside {
        /// The declared range.
        range: String,
        /// Those versions, each with what runs it (`v1.30.0 (kubelet)`).
        outside: Vec<String>,
    },
    /// The plugin declared a range that is not a semantic-version
    /// requirement: nothing can be said to fit it.
    Invalid {
        /// The declared text.
        range: String,
        /// Why it is not a requirement.
        why: String,
    },
}

impl Fit {
    /// Whether the version may be applied to the cluster.
    pub fn fits(&self) -> bool {
        matches!(self, Fit::Any | Fit::Within { .. })
    }

    /// Why not, naming the range and the cluster; `None` when it fits.
    pub fn misfit(&self, cluster: &ClusterVersions) -> Option<String> {
        match self {
            Fit::Any | Fit::Within { .. } => None,
            Fit::Outside { range, outside } => Some(format!(
                "it supports Kubernetes {range:?}, and the cluster runs {cluster}: {} outside it",
                outside.join(", ")
            )),
            Fit::Invalid { range, why } => Some(format!(
                "its plugin declares the Kubernetes range {range:?}, which is not a semantic-version requirement ({why}); the plugin's publisher must fix it"
            )),
        }
    }
}

/// A Kubernetes version as a semantic version: a leading `v`, pre-release
/// and build parts (`-eks-4f4795d`, `+k3s1`) are dropped, and a missing
/// patch is 0 — the range is about Kubernetes releases, not distributions.
pub fn kubernetes_version(version: &str) -> Result<semver::Version, String> {
    let core = version
        .trim()
        .trim_start_matches('v')
        .split(['-', '+'])
        .next()
        .unwrap_or_default();
    let mut parts = core.split('.').map(str::parse::<u64>);
    let mut next = |required: bool| match parts.next() {
        Some(Ok(n)) => Ok(n),
        None if !required => Ok(0),
        _ => Err(format!("{version:?} is not a Kubernetes version")),
    };
    let (major, minor, patch) = (next(true)?, next(true)?, next(false)?);
    if parts.next().is_some() {
        return Err(format!("{version:?} is not a Kubernetes version"));
    }
    Ok(semver::Version::new(major, minor, patch))
}

/// How an addon version whose plugin declares `range` (`None`: none) fits
/// `cluster`. A cluster version that cannot be read never meets a range.
pub fn fit(range: Option<&str>, cluster: &ClusterVersions) -> Fit {
    let Some(range) = range else {
        return Fit::Any;
    };
    let requirement = match semver::VersionReq::parse(range.trim()) {
        Ok(r) => r,
        Err(e) => {
            return Fit::Invalid {
                range: range.to_string(),
                why: e.to_string(),
            };
        }
    };
    let outside: Vec<String> = cluster
        .components()
        .filter(|(version, _)| !kubernetes_version(version).is_ok_and(|v| requirement.matches(&v)))
        .map(|(version, what)| format!("{version} ({what})"))
        .collect();
    if outside.is_empty() {
        Fit::Within {
            range: range.to_string(),
        }
    } else {
        Fit::Outside {
            range: range.to_string(),
            outside,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cluster(server: &str, kubelets: &[&str]) -> ClusterVersions {
        ClusterVersions::new(server, kubelets.iter().map(|k| k.to_string()))
    }

    #[test]
    fn distribution_suffixes_and_a_leading_v_are_ignored() {
        for (text, want) in [
            ("v1.28.3-eks-4f4795d", "1.28.3"),
            ("v1.30.0+k3s1", "1.30.0"),
            ("1.29", "1.29.0"),
            (" v1.20.2 ", "1.20.2"),
        ] {
            assert_eq!(kubernetes_version(text).unwrap().to_string(), want);
        }
        for bad in ["", "v1", "latest", "v1.2.3.4", "vX.Y"] {
            assert!(kubernetes_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_component_must_meet_the_range_and_the_misfit_names_both() {
        let c = cluster("v1.20.2", &["v1.20.2", "v1.30.0"]);
        assert_eq!(fit(None, &c), Fit::Any);
        assert!(fit(Some(">=1.20.0"), &c).fits());
        let f = fit(Some("<1.30.0"), &c);
        assert_eq!(
            f,
            Fit::Outside {
                range: "<1.30.0".into(),
                outside: vec!["v1.30.0 (kubelet)".into()],
            }
        );
        assert_eq!(
            f.misfit(&c).unwrap(),
            "it supports Kubernetes \"<1.30.0\", and the cluster runs v1.20.2 (API server), v1.20.2, v1.30.0 (kubelets): v1.30.0 (kubelet) outside it"
        );
        let f = fit(Some(">=1.29.0"), &cluster("v1.20.2", &[]));
        assert_eq!(
            f.misfit(&cluster("v1.20.2", &[])).unwrap(),
            "it supports Kubernetes \">=1.29.0\", and the cluster runs v1.20.2 (API server): v1.20.2 (API server) outside it"
        );
        // A cluster version nobody can read meets no range.
        assert!(!fit(Some(">=1.0.0"), &cluster("latest", &[])).fits());
    }

    #[test]
    fn an_invalid_range_fits_nothing_and_says_whose_fault_it_is() {
        let c = cluster("v1.30.0", &[]);
        let f = fit(Some("one point thirty"), &c);
        assert!(!f.fits());
        assert!(
            f.misfit(&c)
                .unwrap()
                .contains("the plugin's publisher must fix it")
        );
    }

    proptest! {
        /// Adding a kubelet never makes a version fit that did not:
        /// a cluster only narrows what fits as it grows.
        #[test]
        fn more_versions_never_widen_what_fits(
            server in (18u64..32).prop_map(|m| format!("v1.{m}.0")),
            kubelets in proptest::collection::vec((18u64..32).prop_map(|m| format!("v1.{m}.1")), 0..4),
            extra in (18u64..32).prop_map(|m| format!("v1.{m}.2")),
            low in 18u64..32,
            span in 0u64..8,
        ) {
            let range = format!(">=1.{low}.0, <1.{}.0", low + span);
            let before = ClusterVersions::new(server.clone(), kubelets.clone());
            let after = ClusterVersions::new(server, kubelets.into_iter().chain([extra]));
            if fit(Some(&range), &after).fits() {
                prop_assert!(fit(Some(&range), &before).fits());
            }
        }
    }
}
