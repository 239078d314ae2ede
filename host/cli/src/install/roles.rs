//! Where `install` binds the controllers' rules
//! ([`capstan_controllers::rbac::RULES`]): cluster-wide, in its own
//! namespace, in tenant and Machine namespaces.

use super::*;

pub fn policy_rules(scope: Scope) -> Vec<PolicyRule> {
    rbac::rules(scope).map(policy_rule).collect()
}

/// One of Capstan's rules as RBAC writes it.
pub fn policy_rule(r: &rbac::Rule) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![r.group.to_string()]),
        resources: Some(r.resources.iter().map(|s| s.to_string()).collect()),
        resource_names: (!r.resource_names.is_empty())
            .then(|| r.resource_names.iter().map(|s| s.to_string()).collect()),
        verbs: r.verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// The objects `install` creates; `image` is the controller image (after
/// [`controller_image`]), `policy` the host's trust policy (its keys
/// inline), if any.
/// The namespaces whose Machines may have bootstrap data: Capstan's own,
/// the tenant namespaces and each `--machine-namespace`, each once.
pub(super) fn machine_namespaces(args: &InstallArgs) -> Vec<&str> {
    let mut out: Vec<&str> = vec![args.namespace.as_str()];
    for namespace in args
        .tenant_namespaces
        .iter()
        .chain(&args.machine_namespaces)
    {
        if !out.contains(&namespace.as_str()) {
            out.push(namespace);
        }
    }
    out
}
