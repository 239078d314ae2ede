//! Whether a Machine may take a Node as its own.
//!
//! A provider plugin reports its instance's provider ID, and a Node carries
//! one in `spec.providerID`: that the two match is the plugin's claim, not
//! a proof. A hostile or compromised plugin (or a cloud endpoint a tenant
//! controls) can name any Node, and the Node a Machine owns gets its
//! taints and labels, and is cordoned, drained and deleted with it. So a
//! claim holds only when, in this order:
//!
//! 1. no other Machine reports the same provider ID (unless this one took
//!    the Node first: it keeps it);
//! 2. the ID begins with the prefix the Plugin's signed manifest declares
//!    (`aws:///`), when it declares one;
//! 3. the Node has no control-plane role, unless the Plugin is granted
//!    `controlPlaneNodes`;
//! 4. the Node registered after the Machine was created (both times from
//!    the API server's clock): an instance cannot have joined before the
//!    Machine that asked for it existed. An adopted instance's Node did
//!    (`adopted_node`): the Node whose Cluster API annotations already name
//!    this Machine (restored under the same name), or any Node of an
//!    instance adopted by `spec.providerID` where the admin allows it.
//!
//! A refused claim leaves the Node untouched and says which rule refused it.

use std::fmt;

/// The labels that mark a control-plane Node (kubeadm's current and former).
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// What the claim check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The provider ID the Machine's plugin reported (and the Node carries).
    pub provider_id: &'a str,
    /// Another Machine (`namespace/name`) that reports the same provider
    /// ID, unless this Machine took the Node first.
    pub shared_with: Option<String>,
    /// The prefix the Plugin's manifest declares, if any.
    pub declared_prefix: Option<&'a str>,
    /// Whether the Node carries a control-plane role label.
    pub control_plane_node: bool,
    /// Whether the Plugin is granted control-plane Nodes.
    pub control_plane_granted: bool,
    /// The Node's `metadata.creationTimestamp`, in seconds.
    pub node_created: i64,
    /// The Machine's `metadata.creationTimestamp`, in seconds.
    pub machine_created: i64,
    /// The Machine adopted the instance behind the Node, and the Node may
    /// predate it (see the module docs).
    pub adopted_node: bool,
}

/// Why a claim was refused (the Node is named by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Another Machine (named) reports the same provider ID.
    Shared(String),
    /// The ID is outside the manifest's prefix.
    OutsidePrefix(String),
    /// The Node is a control-plane Node and the Plugin is not granted those.
    ControlPlane,
    /// The Node registered this many seconds before the Machine was created.
    RegisteredBefore(i64),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Shared(other) => write!(
                f,
                "Machine {other} reports the same provider ID; a Node is taken only by the one Machine that reports it, or by the one that took it first, so this Machine leaves it alone (one of the two Machines' plugins reports an instance that is not its own)"
            ),
            Refused::OutsidePrefix(prefix) => write!(
                f,
                "its provider ID does not begin with {prefix:?}, the prefix the Plugin's signed manifest declares"
            ),
            Refused::ControlPlane => write!(
                f,
                "it is a control-plane Node and the Plugin's spec.grants.controlPlaneNodes is not set"
            ),
            Refused::RegisteredBefore(seconds) => write!(
                f,
                "it registered {seconds} s before the Machine was created, so no instance of this Machine can be behind it"
            ),
        }
    }
}

/// Whether the claim holds; the first rule that refuses it otherwise.
pub fn check(claim: &Claim<'_>) -> Result<(), Refused> {
    if let Some(other) = &claim.shared_with {
        return Err(Refused::Shared(other.clone()));
    }
    if let Some(prefix) = claim.declared_prefix
        && !claim.provider_id.starts_with(prefix)
    {
        return Err(Refused::OutsidePrefix(prefix.to_string()));
    }
    if claim.control_plane_node && !claim.control_plane_granted {
        return Err(Refused::ControlPlane);
    }
    if claim.node_created < claim.machine_created && !claim.adopted_node {
        return Err(Refused::RegisteredBefore(
            claim.machine_created - claim.node_created,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fair() -> Claim<'static> {
        Claim {
            provider_id: "aws:///us-east-1a/i-0abc",
            shared_with: None,
            declared_prefix: Some("aws:///"),
            control_plane_node: false,
            control_plane_granted: false,
            node_created: 1_000,
            machine_created: 900,
            adopted_node: false,
        }
    }

    #[test]
    fn each_rule_refuses_alone_and_says_why() {
        assert_eq!(check(&fair()), Ok(()));
        let cases: [(Claim<'static>, Refused, &str); 4] = [
            (
                Claim {
                    shared_with: Some("default/other".into()),
                    ..fair()
                },
                Refused::Shared("default/other".into()),
                "Machine default/other reports the same provider ID",
            ),
            (
                Claim {
                    provider_id: "gce://project/zone/vm",
                    ..fair()
                },
                Refused::OutsidePrefix("aws:///".into()),
                "does not begin with \"aws:///\"",
            ),
            (
                Claim {
                    control_plane_node: true,
                    ..fair()
                },
                Refused::ControlPlane,
                "spec.grants.controlPlaneNodes",
            ),
            (
                Claim {
                    node_created: 100,
                    ..fair()
                },
                Refused::RegisteredBefore(800),
                "registered 800 s before the Machine was created",
            ),
        ];
        for (claim, refused, words) in cases {
            assert_eq!(check(&claim), Err(refused.clone()));
            assert!(refused.to_string().contains(words), "{refused}");
        }
    }

    #[test]
    fn grants_and_undeclared_prefixes_lift_only_their_rule() {
        let granted = Claim {
            control_plane_node: true,
            control_plane_granted: true,
            ..fair()
        };
        assert_eq!(check(&granted), Ok(()));
        let undeclared = Claim {
            provider_id: "anything://x",
            declared_prefix: None,
            ..fair()
        };
        assert_eq!(check(&undeclared), Ok(()));
        // Registered in the same second as the Machine: fine.
        let same = Claim {
            node_created: 900,
            ..fair()
        };
        assert_eq!(check(&same), Ok(()));
    }

    proptest! {
        /// A claim holds exactly when no rule refuses it.
        #[test]
        fn holds_iff_every_rule_passes(
            shared: bool,
            in_prefix: bool,
            declared: bool,
            control_plane_node: bool,
            control_plane_granted: bool,
            node_created in 0i64..2_000,
            machine_created in 0i64..2_000,
            adopted_node: bool,
        ) {
            let claim = Claim {
                provider_id: if in_prefix { "aws:///z/i-1" } else { "evil://i-1" },
                shared_with: shared.then(|| "default/other".to_string()),
                declared_prefix: declared.then_some("aws:///"),
                control_plane_node,
                control_plane_granted,
                node_created,
                machine_created,
                adopted_node,
            };
            let expected = !shared
                && (in_prefix || !declared)
                && (!control_plane_node || control_plane_granted)
                && (node_created >= machine_created || adopted_node);
            prop_assert_eq!(check(&claim).is_ok(), expected);
        }
    }
}
