//! What the machine fleet should look like next: the pure decision logic of
//! Capstan's MachineSet and MachineDeployment controllers, free of I/O so it
//! can be tested exhaustively without a cluster.
//!
//! Start with [`rollout::plan`], which turns a deployment's MachineSets into
//! replica targets under `maxSurge` / `maxUnavailable`, and
//! [`machineset::plan_scale`], which says how many machines a set creates and
//! which ones it deletes; [`healthcheck`] judges machines and holds the
//! remediation short-circuit; [`machine::next_step`] says what a Machine
//! does next, alive or deleting; [`deletion`] says which step a deleting
//! machine is at and which pods its drain evicts; [`inplace`] says which
//! updater applies which changed field, and [`rollout::plan_in_place`] paces
//! an in-place rollout; [`rollback::decide`] says whether a failing rollout
//! returns to the previous revision by itself; [`taints::carry`] keeps a
//! Machine's taints on its Node; [`node_claim::check`] says whether a
//! Machine may take the Node its plugin names; [`bootstrap`] decides a
//! machine's bootstrap data and token; [`canary`] judges a plugin
//! canary's windows and picks the Machines it serves; [`versions`]
//! counts the Kubernetes versions a set's Machines run. The controllers
//! (`capstan-controllers`) observe the cluster, call these, and write the
//! result.

#![forbid(unsafe_code)]

pub mod adoption;
pub mod bootstrap;
pub mod canary;
pub mod cluster;
pub mod deletion;
pub mod healthcheck;
pub mod inplace;
pub mod machine;
pub mod machineset;
pub mod metadata;
pub mod node_claim;
pub mod rollback;
pub mod rollout;
pub mod set_conditions;
pub mod taints;
pub mod versions;

/// A rollout bound as written in a spec: a machine count or a percentage of
/// the desired replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// An absolute number of machines.
    Count(i32),
    /// A percentage of `replicas`.
    Percent(i32),
}

impl Bound {
    /// Parse `3` or `"25%"`; the error says what was wrong.
    pub fn parse(text: &str) -> Result<Bound, String> {
        let text = text.trim();
        let (number, percent) = match text.strip_suffix('%') {
            Some(n) => (n, true),
            None => (text, false),
        };
        let value: i32 = number.parse().map_err(|_| {
            format!("{text:?} is neither a whole number nor a percentage like \"25%\"")
        })?;
        if value < 0 {
            return Err(format!("{text:?} is negative"));
        }
        Ok(if percent {
            Bound::Percent(value)
        } else {
            Bound::Count(value)
        })
    }

    /// The number of machines this bound allows for `replicas` desired:
    /// percentages round up for surge and down for unavailability, as in
    /// Kubernetes Deployments.
    pub fn resolve(self, replicas: i32, round_up: bool) -> i32 {
        match self {
            Bound::Count(n) => n,
            Bound::Percent(p) => {
                let scaled = i64::from(replicas) * i64::from(p);
                let value = if round_up {
                    (scaled + 99) / 100
                } else {
                    scaled / 100
                };
                i32::try_from(value).unwrap_or(i32::MAX)
            }
        }
    }
}

/// Resolved `maxSurge` / `maxUnavailable` for a rolling update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Machines allowed above `replicas`.
    pub max_surge: i32,
    /// Machines allowed to be unavailable below `replicas`.
    pub max_unavailable: i32,
}

impl Bounds {
    /// Resolve both bounds for `replicas`. When both come out as zero the
    /// rollout could never move, so one machine may be unavailable
    /// (Kubernetes does the same).
    pub fn resolve(replicas: i32, max_surge: Bound, max_unavailable: Bound) -> Bounds {
        let max_surge = max_surge.resolve(replicas, true);
        let mut max_unavailable = max_unavailable.resolve(replicas, false).min(replicas);
        if max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        Bounds {
            max_surge,
            max_unavailable,
        }
    }
}

/// How healthy one machine is, from the controller's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Health {
    /// Terminally failed (`failureReason` set).
    Failed,
    /// Not (yet) Ready.
    NotReady,
    /// Ready, but not for `minReadySeconds` yet.
    Ready,
    /// Ready for at least `minReadySeconds`.
    Available,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse_and_round_like_kubernetes() {
        assert_eq!(Bound::parse("3"), Ok(Bound::Count(3)));
        assert_eq!(Bound::parse("25%"), Ok(Bound::Percent(25)));
        assert!(Bound::parse("-1").unwrap_err().contains("negative"));
        assert!(Bound::parse("lots").unwrap_err().contains("percentage"));
        assert_eq!(Bound::Percent(25).resolve(10, true), 3);
        assert_eq!(Bound::Percent(25).resolve(10, false), 2);
        assert_eq!(
            Bounds::resolve(10, Bound::Count(0), Bound::Percent(5)),
            Bounds {
                max_surge: 0,
                max_unavailable: 1
            }
        );
        assert_eq!(
            Bounds::resolve(3, Bound::Count(1), Bound::Count(5)).max_unavailable,
            3
        );
    }
}
