//! Whose rights apply an Addon's objects: the decision, without I/O.
//!
//! An Addon outside Capstan's namespace (a tenant's) is applied, read,
//! pruned and deleted as a ServiceAccount of its own namespace, which
//! Capstan impersonates: the API server's RBAC for that ServiceAccount,
//! not Capstan's own rights, then decides what the tenant's render may
//! write. Which ServiceAccount: `spec.serviceAccountName`, else the
//! controller's default (`--tenant-service-account`), else none, and the
//! Addon is refused before any plugin call. Only a name is taken from the
//! tenant; the namespace is always the Addon's own.

/// Who an Addon's writes are made as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// Capstan's own identity (an Addon in Capstan's namespace that names
    /// no ServiceAccount).
    Capstan,
    /// A ServiceAccount of the Addon's namespace.
    ServiceAccount {
        /// The Addon's namespace.
        namespace: String,
        /// The ServiceAccount's name.
        name: String,
    },
}

impl Actor {
    /// The API server's user name for it (`None`: Capstan's own).
    pub fn user(&self) -> Option<String> {
        match self {
            Actor::Capstan => None,
            Actor::ServiceAccount { namespace, name } => Some(
                capstan_kit::impersonate::service_account_user(namespace, name),
            ),
        }
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Capstan => f.write_str("Capstan's ServiceAccount"),
            Actor::ServiceAccount { namespace, name } => {
                write!(f, "ServiceAccount {namespace}/{name}")
            }
        }
    }
}

/// Who applies an Addon in `namespace` that asks for `requested`
/// (`spec.serviceAccountName`); `tenant`: the namespace is not Capstan's;
/// `default`: the controller's `--tenant-service-account`. The error says
/// which field is wrong and what to do.
pub fn actor(
    namespace: &str,
    requested: Option<&str>,
    tenant: bool,
    default: Option<&str>,
) -> Result<Actor, String> {
    let chosen = match (requested, tenant) {
        (Some(name), _) => {
            check_name(name).map_err(|why| {
                format!("spec.serviceAccountName {name:?} is not a ServiceAccount name: {why}")
            })?;
            name
        }
        (None, false) => return Ok(Actor::Capstan),
        (None, true) => default.ok_or_else(|| {
            format!(
                "spec.serviceAccountName is required for an Addon outside Capstan's namespace: \
                 its objects are applied as a ServiceAccount of namespace {namespace:?}, with that \
                 ServiceAccount's RBAC; name one (and bind it a Role for the objects the addon renders)"
            )
        })?,
    };
    Ok(Actor::ServiceAccount {
        namespace: namespace.to_string(),
        name: chosen.to_string(),
    })
}

/// A DNS-1123 subdomain, as the API server requires of ServiceAccount names.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("it must have 1 to 253 characters");
    }
    if name.split('.').all(capstan_manifest::is_dns_label) {
        Ok(())
    } else {
        Err(
            "use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(namespace: &str, name: &str) -> Actor {
        Actor::ServiceAccount {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_tenant_acts_as_a_service_account_of_its_own_namespace() {
        assert_eq!(
            actor("team-a", Some("deployer"), true, None),
            Ok(sa("team-a", "deployer"))
        );
        assert_eq!(
            actor("team-a", None, true, Some("addons")),
            Ok(sa("team-a", "addons"))
        );
        // The name given wins over the default.
        assert_eq!(
            actor("team-a", Some("deployer"), true, Some("addons")),
            Ok(sa("team-a", "deployer"))
        );
        assert_eq!(
            sa("team-a", "deployer").user().unwrap(),
            "system:serviceaccount:team-a:deployer"
        );
    }

    #[test]
    fn without_a_name_or_a_default_a_tenant_is_refused() {
        let e = actor("team-a", None, true, None).unwrap_err();
        assert!(e.starts_with("spec.serviceAccountName is required"), "{e}");
        assert!(e.contains("\"team-a\""), "{e}");
    }

    #[test]
    fn capstans_own_namespace_uses_capstan_unless_it_names_one() {
        assert_eq!(
            actor("capstan-system", None, false, Some("x")),
            Ok(Actor::Capstan)
        );
        assert_eq!(Actor::Capstan.user(), None);
        assert_eq!(
            actor("capstan-system", Some("installer"), false, None),
            Ok(sa("capstan-system", "installer"))
        );
    }

    #[test]
    fn a_name_cannot_reach_another_namespace_or_identity() {
        // Only a name is the tenant's: a user name, a namespace or a group
        // in it is not a ServiceAccount name.
        for bad in [
            "",
            "kube-system:admin",
            "system:serviceaccount:kube-system:default",
            "../x",
            "Deployer",
            "a b",
            "-x",
            &"x".repeat(254),
        ] {
            let e = actor("team-a", Some(bad), true, None).unwrap_err();
            assert!(e.contains("is not a ServiceAccount name"), "{bad}: {e}");
        }
    }
}
