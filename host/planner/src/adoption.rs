//! Whether a Machine with no recorded instance adopts the one its provider
//! found (`find-instance`), creates one, or is refused.
//!
//! What the provider returns is a claim: an instance, and whom its tags
//! say it was launched for. [`decide`] holds it against the Machine (its
//! namespace, name, cluster and `spec.providerID`), the provider's declared
//! provider-ID prefix, the admin's grant for untagged instances, and the
//! Machines that already record that instance. A restored or re-applied
//! Machine finds the instance tagged with its own namespace and name and
//! adopts it; nothing tagged for another Machine is ever adopted, and an
//! instance launched outside Capstan only by naming it in
//! `spec.providerID` where the Plugin allows it.

/// The Machine asking, and what the host knows around it.
#[derive(Debug, Clone, Default)]
pub struct Asking<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its `spec.clusterName`.
    pub cluster: Option<&'a str>,
    /// Its `spec.providerID`: an instance to adopt by name.
    pub preset: Option<&'a str>,
    /// The provider-ID prefix its provider's manifest declares, if any.
    pub prefix: Option<&'a str>,
    /// Whether the Plugin may adopt untagged instances in its namespace
    /// (`spec.adoptUntaggedIn`).
    pub untagged_allowed: bool,
}

/// What the provider found: an instance and whom its tags name.
#[derive(Debug, Clone, Default)]
pub struct Found<'a> {
    /// Its provider ID.
    pub provider_id: &'a str,
    /// `namespace/name` of the Machine it is tagged for.
    pub machine: Option<&'a str>,
    /// The cluster it is tagged for.
    pub cluster: Option<&'a str>,
    /// Another Machine (`namespace/name`) that already records this
    /// provider ID, if any.
    pub claimed_by: Option<&'a str>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Record the found instance as the Machine's and observe it.
    Adopt,
    /// Nothing to adopt: create an instance.
    Create,
    /// Neither: the condition reason and why.
    Refuse {
        /// `InstanceNotFound` or `AdoptionRefused`.
        reason: &'static str,
        /// What was found, what it says, and what to do.
        message: String,
    },
}

/// Adopt, create or refuse (see the module docs). Checked in order: no
/// instance (create, unless `spec.providerID` named one); a provider ID
/// that is empty, lacks the declared prefix, or is not the one asked for;
/// tags naming another Machine or cluster; an untagged instance found by
/// tag (a lookup that ignored its own tags) or without the grant; another
/// Machine recording it.
pub fn decide(asking: &Asking<'_>, found: Option<&Found<'_>>) -> Decision {
    let refuse = |message: String| Decision::Refuse {
        reason: "AdoptionRefused",
        message,
    };
    let owner = format!("{}/{}", asking.namespace, asking.name);
    let Some(found) = found else {
        return match asking.preset {
            Some(id) => Decision::Refuse {
                reason: "InstanceNotFound",
                message: format!(
                    "spec.providerID {id} names no live instance the provider can see; fix it, or remove it to create a new instance"
                ),
            },
            None => Decision::Create,
        };
    };
    let id = found.provider_id;
    if id.is_empty() {
        return refuse("the provider found an instance with an empty provider ID".into());
    }
    if let Some(prefix) = asking.prefix
        && !id.starts_with(prefix)
    {
        return refuse(format!(
            "the provider found {id}, which does not begin with {prefix:?} as its manifest declares"
        ));
    }
    if let Some(preset) = asking.preset
        && preset != id
    {
        return refuse(format!(
            "spec.providerID is {preset}, but the provider found {id}"
        ));
    }
    match found.machine {
        Some(tagged) if tagged != owner => {
            return refuse(format!(
                "instance {id} is tagged for Machine {tagged}, not {owner}: a Machine adopts only an instance launched for itself"
            ));
        }
        Some(_) => {}
        None if asking.preset.is_none() => {
            return refuse(format!(
                "the provider found {id} for {owner} by its tags, but it carries no machine tag"
            ));
        }
        None if !asking.untagged_allowed => {
            return refuse(format!(
                "instance {id} was not launched by Capstan (it carries no machine tag); its Plugin adopts such instances only in the namespaces its spec.adoptUntaggedIn allows, and {} is not one",
                asking.namespace
            ));
        }
        None => {}
    }
    if let Some(cluster) = found.cluster
        && asking.cluster != Some(cluster)
    {
        return refuse(format!(
            "instance {id} is tagged for cluster {cluster}, and this Machine's spec.clusterName is {}",
            asking.cluster.unwrap_or("unset")
        ));
    }
    if let Some(other) = found.claimed_by
        && other != owner
    {
        return refuse(format!(
            "instance {id} is already Machine {other}'s (its status records it)"
        ));
    }
    Decision::Adopt
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn asking() -> Asking<'static> {
        Asking {
            namespace: "team-a",
            name: "pool-x",
            cluster: Some("prod"),
            prefix: Some("sim://"),
            ..Asking::default()
        }
    }

    fn tagged(machine: &'static str) -> Found<'static> {
        Found {
            provider_id: "sim://i-1",
            machine: Some(machine),
            cluster: Some("prod"),
            claimed_by: None,
        }
    }

    #[test]
    fn a_restored_machine_adopts_the_instance_tagged_for_it_and_nothing_else() {
        assert_eq!(decide(&asking(), None), Decision::Create);
        assert_eq!(
            decide(&asking(), Some(&tagged("team-a/pool-x"))),
            Decision::Adopt
        );
        let Decision::Refuse { reason, message } =
            decide(&asking(), Some(&tagged("team-b/pool-x")))
        else {
            panic!("another namespace's instance adopted")
        };
        assert_eq!(reason, "AdoptionRefused");
        assert!(
            message.contains("tagged for Machine team-b/pool-x"),
            "{message}"
        );
        let other_cluster = Found {
            cluster: Some("staging"),
            ..tagged("team-a/pool-x")
        };
        assert!(matches!(
            decide(&asking(), Some(&other_cluster)),
            Decision::Refuse { .. }
        ));
        let claimed = Found {
            claimed_by: Some("team-a/pool-y"),
            ..tagged("team-a/pool-x")
        };
        assert!(matches!(
            decide(&asking(), Some(&claimed)),
            Decision::Refuse { .. }
        ));
        let foreign_prefix = Found {
            provider_id: "aws:///z/i-1",
            ..tagged("team-a/pool-x")
        };
        assert!(matches!(
            decide(&asking(), Some(&foreign_prefix)),
            Decision::Refuse { .. }
        ));
    }

    #[test]
    fn an_untagged_instance_is_adopted_only_by_name_and_where_granted() {
        let untagged = Found {
            machine: None,
            cluster: None,
            ..tagged("")
        };
        // Found by tag yet untagged: the lookup is not to be believed.
        assert!(matches!(
            decide(&asking(), Some(&untagged)),
            Decision::Refuse { .. }
        ));
        let by_name = Asking {
            preset: Some("sim://i-1"),
            ..asking()
        };
        let Decision::Refuse { message, .. } = decide(&by_name, Some(&untagged)) else {
            panic!("adopted without the grant")
        };
        assert!(message.contains("spec.adoptUntaggedIn"), "{message}");
        let granted = Asking {
            untagged_allowed: true,
            ..by_name.clone()
        };
        assert_eq!(decide(&granted, Some(&untagged)), Decision::Adopt);
        // The provider answering another instance than the one named.
        let elsewhere = Found {
            provider_id: "sim://i-2",
            ..untagged.clone()
        };
        assert!(matches!(
            decide(&granted, Some(&elsewhere)),
            Decision::Refuse { .. }
        ));
        assert!(matches!(
            decide(&granted, None),
            Decision::Refuse {
                reason: "InstanceNotFound",
                ..
            }
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Whatever the provider claims, an instance tagged for another
        /// Machine, or recorded by another, is never adopted.
        #[test]
        fn nothing_of_another_machine_is_ever_adopted(
            namespace in "[a-c]", name in "[x-z]", tag_ns in "[a-c]", tag_name in "[x-z]",
            claimed in proptest::option::of("[a-c]/[x-z]"),
            preset in any::<bool>(), granted in any::<bool>(), untagged in any::<bool>(),
        ) {
            let tag = format!("{tag_ns}/{tag_name}");
            let asking = Asking {
                namespace: &namespace,
                name: &name,
                preset: preset.then_some("sim://i-1"),
                untagged_allowed: granted,
                ..Asking::default()
            };
            let found = Found {
                provider_id: "sim://i-1",
                machine: (!untagged).then_some(tag.as_str()),
                cluster: None,
                claimed_by: claimed.as_deref(),
            };
            let owner = format!("{namespace}/{name}");
            if decide(&asking, Some(&found)) == Decision::Adopt {
                prop_assert!(untagged || tag == owner);
                prop_assert!(claimed.as_deref().is_none_or(|c| c == owner));
                prop_assert!(!untagged || (preset && granted));
            }
        }
    }
}
