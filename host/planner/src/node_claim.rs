//! Whether a Machine may take a Node as its own.
//!
//! A provider plugin reports its instance's provider ID, and a Node carries
//! one in `spec.providerID`: that the two match is the plugin's claim, not
//! a proof. A hostile or compromised plugin (or a cloud endpoint a tenant
//! controls) can name any Node, and the Node a Machine owns gets its
//! taints and labels, and is cordoned, drained and deleted with it.
//!
//! **A bootstrapped Machine owns only the Node its join identity made.**
//! When Capstan rendered the Machine's bootstrap data, it decided the
//! Node's name (the Machine's), approved a `system:node:<that name>`
//! certificate for the Machine's token alone, and NodeRestriction lets only
//! that certificate create Node `<that name>`. So the claim holds only for
//! the Node of that name carrying the recorded instance's provider ID;
//! which Machine reports what, and when the Node registered, no longer
//! matter. For other Machines, the claim holds only when, in this order:
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
//! Rules 2 and 3 hold for both. A refused claim leaves the Node untouched
//! and says which rule refused it.

use std::fmt;

/// The labels that mark a control-plane Node (kubeadm's current and former).
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// What the claim check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The provider ID of the Machine's recorded instance.
    pub provider_id: &'a str,
    /// The Node's name.
    pub node_name: &'a str,
    /// The provider ID the Node carries (`None`: it carries none yet).
    pub node_provider_id: Option<&'a str>,
    /// The Node name the Machine's join identity allows (Capstan rendered
    /// its bootstrap data and approves only `system:node:<this>` for its
    /// token); `None` for a Machine Capstan did not bootstrap.
    pub join_identity: Option<&'a str>,
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
    /// The Node carries another provider ID (or none): another instance's.
    OtherInstance {
        /// What the Node carries.
        carried: Option<String>,
        /// The Machine's instance.
        instance: String,
    },
    /// The Node carries the Machine's provider ID under another name than
    /// its join identity's.
    NotJoinIdentity(String),
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
            Refused::OtherInstance {
                carried: Some(carried),
                instance,
            } => write!(
                f,
                "it carries provider ID {carried:?}, not {instance:?} of this Machine's instance"
            ),
            Refused::OtherInstance {
                carried: None,
                instance,
            } => write!(
                f,
                "it carries no provider ID (yet); this Machine's instance is {instance:?}"
            ),
            Refused::NotJoinIdentity(expected) => write!(
                f,
                "its name is not {expected:?}: Capstan approved a Node certificate for this Machine only as system:node:{expected}, and only that certificate can create Node {expected}, so a Node of another name carrying this Machine's provider ID was registered by someone else"
            ),
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
    if claim.node_provider_id != Some(claim.provider_id) {
        return Err(Refused::OtherInstance {
            carried: claim.node_provider_id.map(str::to_string),
            instance: claim.provider_id.to_string(),
        });
    }
    if let Some(expected) = claim.join_identity
        && claim.node_name != expected
    {
        return Err(Refused::NotJoinIdentity(expected.to_string()));
    }
    let proven = claim.join_identity.is_some();
    if let Some(other) = claim.shared_with.as_ref().filter(|_| !proven) {
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
    if !proven && claim.node_created < claim.machine_created && !claim.adopted_node {
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
            node_name: "ip-10-0-0-1",
            node_provider_id: Some("aws:///us-east-1a/i-0abc"),
            join_identity: None,
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
                    node_provider_id: Some("gce://project/zone/vm"),
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
            node_provider_id: Some("anything://x"),
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

    #[test]
    fn a_bootstrapped_machine_takes_only_the_node_of_its_join_identity() {
        let own = Claim {
            node_name: "pool-1",
            join_identity: Some("pool-1"),
            ..fair()
        };
        // Its name and its instance's ID: taken, whoever else reports the
        // ID and whenever it registered.
        let contested = Claim {
            shared_with: Some("default/thief".into()),
            node_created: 1,
            ..own.clone()
        };
        assert_eq!(check(&contested), Ok(()));
        // The ID under another name: another kubelet's Node.
        let impostor = Claim {
            node_name: "attacker",
            ..own.clone()
        };
        let refused = check(&impostor).unwrap_err();
        assert_eq!(refused, Refused::NotJoinIdentity("pool-1".into()));
        assert!(
            refused.to_string().contains("system:node:pool-1"),
            "{refused}"
        );
        // The name with another ID: another instance's Node.
        let stale = Claim {
            node_provider_id: Some("aws:///us-east-1a/i-0old"),
            ..own.clone()
        };
        assert!(
            check(&stale)
                .unwrap_err()
                .to_string()
                .contains("carries provider ID \"aws:///us-east-1a/i-0old\"")
        );
        let bare = Claim {
            node_provider_id: None,
            ..own.clone()
        };
        assert!(
            check(&bare)
                .unwrap_err()
                .to_string()
                .contains("carries no provider ID")
        );
        // Prefix and control-plane rules still hold.
        let crown = Claim {
            control_plane_node: true,
            ..own
        };
        assert_eq!(check(&crown), Err(Refused::ControlPlane));
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
            bootstrapped: bool,
            named: bool,
            same_instance: bool,
        ) {
            let provider_id = if in_prefix { "aws:///z/i-1" } else { "evil://i-1" };
            let claim = Claim {
                provider_id,
                node_name: if named { "m" } else { "other" },
                node_provider_id: Some(if same_instance { provider_id } else { "aws:///z/i-2" }),
                join_identity: bootstrapped.then_some("m"),
                shared_with: shared.then(|| "default/other".to_string()),
                declared_prefix: declared.then_some("aws:///"),
                control_plane_node,
                control_plane_granted,
                node_created,
                machine_created,
                adopted_node,
            };
            let expected = same_instance
                && (!bootstrapped || named)
                && (in_prefix || !declared)
                && (!control_plane_node || control_plane_granted)
                && (bootstrapped
                    || (!shared && (node_created >= machine_created || adopted_node)));
            prop_assert_eq!(check(&claim).is_ok(), expected);
        }
    }
}
