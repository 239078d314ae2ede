//! A machine's bootstrap, decided without I/O: which source its data comes
//! from ([`source`]), what the data Secret is called ([`data_secret_name`]),
//! how the token goes into the rendered data ([`substitute`]) and what
//! becomes of the bootstrap token as time passes and the Node joins
//! ([`token_action`]). The Machine controller's `bootstrap` module does the
//! I/O (Secrets, the bootstrap plugin's `render`).
//!
//! A bootstrap plugin never sees the token: it renders
//! [`TOKEN_PLACEHOLDER`], and the host substitutes the token afterwards.

/// What a bootstrap plugin writes where the token goes.
pub const TOKEN_PLACEHOLDER: &str = "@@CAPSTAN_BOOTSTRAP_TOKEN@@";

/// Bootstrap data larger than this (after the token is in place) is
/// refused: user-data fields are small everywhere (EC2: 16 KiB).
pub const MAX_BOOTSTRAP_BYTES: usize = 64 * 1024;

/// Where a machine's bootstrap data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source<'a> {
    /// No `spec.bootstrap`: the instance gets no data.
    None,
    /// The user's own Secret, used as is.
    Secret(&'a str),
    /// A bootstrap Plugin renders it.
    Plugin(&'a str),
}

/// The source `spec.bootstrap` names, or why it names none usably (the
/// message names the field).
pub fn source<'a>(
    data_secret_name: Option<&'a str>,
    plugin: Option<&'a str>,
    has_config: bool,
) -> Result<Source<'a>, String> {
    match (data_secret_name, plugin) {
        (Some(_), Some(_)) => Err(
            "spec.bootstrap: set dataSecretName (your own data) or plugin (rendered data), not both"
                .into(),
        ),
        (Some(name), None) if has_config => Err(format!(
            "spec.bootstrap.config: only a bootstrap plugin takes a config; the Secret {name} is used as is"
        )),
        (Some(name), None) => Ok(Source::Secret(name)),
        (None, Some(plugin)) => Ok(Source::Plugin(plugin)),
        (None, None) => Err(
            "spec.bootstrap: set dataSecretName or plugin (or remove spec.bootstrap)".into(),
        ),
    }
}

/// The name of the data Secret the host writes for a machine:
/// `<machine>-bootstrap`, shortened with a hash suffix when that would pass
/// the 253 characters a Secret name may have.
pub fn data_secret_name(machine: &str) -> String {
    const SUFFIX: &str = "-bootstrap";
    if machine.len() + SUFFIX.len() <= 253 {
        return format!("{machine}{SUFFIX}");
    }
    let hash = fnv1a(machine.as_bytes());
    let keep = 253 - SUFFIX.len() - 9;
    let head = machine[..keep].trim_end_matches(['-', '.']);
    format!("{head}-{:08x}{SUFFIX}", hash as u32)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The rendered data with every placeholder replaced by `token`.
pub fn substitute(rendered: &[u8], token: &str) -> Vec<u8> {
    let needle = TOKEN_PLACEHOLDER.as_bytes();
    let mut out = Vec::with_capacity(rendered.len() + token.len());
    let mut rest = rendered;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(token.as_bytes());
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Why bootstrap data cannot be used as it is, if so (the message gives
/// the size and the limit).
pub fn check_size(len: usize) -> Result<(), String> {
    if len > MAX_BOOTSTRAP_BYTES {
        return Err(format!(
            "the bootstrap data is {len} bytes; at most {MAX_BOOTSTRAP_BYTES} are allowed (shorten the bootstrap configuration: files, commands)"
        ));
    }
    Ok(())
}

/// What becomes of a machine's bootstrap token this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenAction {
    /// Nothing to do.
    Keep,
    /// Push the expiration to now + TTL: the machine has not joined yet.
    Renew,
    /// Delete it: the Node joined, so the token has done its work.
    Delete,
}

/// The token's fate: deleted once the Node has joined; renewed while it
/// has not and less than half its lifetime is left (as Cluster API's
/// kubeadm bootstrap provider refreshes it); else left alone.
/// `expires_in_s`: seconds until it expires (negative when past).
pub fn token_action(joined: bool, expires_in_s: i64, ttl_s: i64) -> TokenAction {
    if joined {
        TokenAction::Delete
    } else if expires_in_s < ttl_s / 2 {
        TokenAction::Renew
    } else {
        TokenAction::Keep
    }
}

/// Whether a label may go into the Node's registration: the kubelet may set
/// it under NodeRestriction (no `kubernetes.io` / `k8s.io` domain other
/// than the kubelet's and node's own prefixes). Others are carried by the
/// controller once the Node has joined.
pub fn kubelet_may_set(label: &str) -> bool {
    let Some((prefix, _)) = label.split_once('/') else {
        return true;
    };
    let restricted = |domain: &str| prefix == domain || prefix.ends_with(&format!(".{domain}"));
    if !(restricted("kubernetes.io") || restricted("k8s.io")) {
        return true;
    }
    matches!(prefix, "kubelet.kubernetes.io" | "node.kubernetes.io")
        || prefix.ends_with(".kubelet.kubernetes.io")
        || prefix.ends_with(".node.kubernetes.io")
}

/// The signer of kubelets' client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// What becomes of a certificate signing request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrDecision {
    /// A Machine's token asks for that Machine's Node identity: approve.
    Approve,
    /// A Machine's token asks for something else: deny, saying why.
    Deny(String),
    /// Not a request Capstan answers (another signer, a Node renewing its
    /// own certificate, a token that is not a Machine's).
    Ignore,
}

/// Whether a kubelet client CSR made with a bootstrap token is approved:
/// only when the token is a Machine's (`token_machine`: the name of the
/// Machine whose token the requester `system:bootstrap:<id>` is) and the
/// request is exactly for that Machine's Node — subject
/// `CN=system:node:<machine>, O=system:nodes` and client usages only. One
/// machine's token can then never become another Node.
pub fn node_csr(
    signer: &str,
    requester: &str,
    token_machine: Option<&str>,
    common_name: Option<&str>,
    organizations: &[String],
    usages: &[String],
) -> CsrDecision {
    if signer != KUBELET_CLIENT_SIGNER || !requester.starts_with("system:bootstrap:") {
        return CsrDecision::Ignore;
    }
    let Some(machine) = token_machine else {
        return CsrDecision::Ignore;
    };
    let wanted = format!("system:node:{machine}");
    if common_name != Some(wanted.as_str()) {
        return CsrDecision::Deny(format!(
            "the bootstrap token of Machine {machine} may ask only for {wanted}, not {}",
            common_name.unwrap_or("(no common name)")
        ));
    }
    if organizations != ["system:nodes"] {
        return CsrDecision::Deny(format!(
            "a Node certificate's organization is exactly system:nodes, not {organizations:?}"
        ));
    }
    const ALLOWED: [&str; 3] = ["digital signature", "key encipherment", "client auth"];
    if !usages.iter().any(|u| u == "client auth")
        || usages.iter().any(|u| !ALLOWED.contains(&u.as_str()))
    {
        return CsrDecision::Deny(format!(
            "a Node client certificate has the usages client auth, digital signature and key encipherment only, not {usages:?}"
        ));
    }
    CsrDecision::Approve
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_machines_token_becomes_that_machines_node_and_no_other() {
        let orgs = vec!["system:nodes".to_string()];
        let usages: Vec<String> = ["digital signature", "key encipherment", "client auth"]
            .map(String::from)
            .to_vec();
        let decide = |cn: &str, machine: Option<&str>| {
            node_csr(
                KUBELET_CLIENT_SIGNER,
                "system:bootstrap:abcdef",
                machine,
                Some(cn),
                &orgs,
                &usages,
            )
        };
        assert_eq!(
            decide("system:node:pool-1", Some("pool-1")),
            CsrDecision::Approve
        );
        let denied = decide("system:node:victim", Some("pool-1"));
        assert!(
            matches!(&denied, CsrDecision::Deny(m) if m.contains("only for system:node:pool-1")),
            "{denied:?}"
        );
        // Not a Machine's token, another signer, a Node renewing: not ours.
        assert_eq!(decide("system:node:pool-1", None), CsrDecision::Ignore);
        assert_eq!(
            node_csr(
                "kubernetes.io/kube-apiserver-client",
                "system:bootstrap:abcdef",
                Some("pool-1"),
                Some("system:node:pool-1"),
                &orgs,
                &usages
            ),
            CsrDecision::Ignore
        );
        assert_eq!(
            node_csr(
                KUBELET_CLIENT_SIGNER,
                "system:node:pool-1",
                Some("pool-1"),
                Some("system:node:pool-1"),
                &orgs,
                &usages
            ),
            CsrDecision::Ignore
        );
        // The right name with extra organizations or usages is denied.
        let pool_1_asks_for = |orgs: &[String], usages: &[String]| {
            node_csr(
                KUBELET_CLIENT_SIGNER,
                "system:bootstrap:abcdef",
                Some("pool-1"),
                Some("system:node:pool-1"),
                orgs,
                usages,
            )
        };
        let masters = vec!["system:nodes".to_string(), "system:masters".to_string()];
        let server = vec!["server auth".to_string()];
        for (orgs, usages) in [(&masters, &usages), (&orgs, &server)] {
            let decision = pool_1_asks_for(orgs, usages);
            assert!(matches!(decision, CsrDecision::Deny(_)), "{decision:?}");
        }
    }

    #[test]
    fn exactly_one_source() {
        assert_eq!(source(Some("d"), None, false), Ok(Source::Secret("d")));
        assert_eq!(
            source(None, Some("kubeadm"), true),
            Ok(Source::Plugin("kubeadm"))
        );
        assert!(
            source(Some("d"), Some("k"), false)
                .unwrap_err()
                .contains("not both")
        );
        assert!(
            source(None, None, false)
                .unwrap_err()
                .contains("dataSecretName or plugin")
        );
        assert!(
            source(Some("d"), None, true)
                .unwrap_err()
                .contains("spec.bootstrap.config")
        );
    }

    #[test]
    fn data_secret_names_fit() {
        assert_eq!(data_secret_name("workers-x1"), "workers-x1-bootstrap");
        let long = "a".repeat(253);
        let name = data_secret_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with("-bootstrap"));
        assert_ne!(data_secret_name(&long), data_secret_name(&"b".repeat(253)));
    }

    #[test]
    fn tokens_are_renewed_until_the_node_joins_then_deleted() {
        let ttl = 900;
        assert_eq!(token_action(false, 800, ttl), TokenAction::Keep);
        assert_eq!(token_action(false, 400, ttl), TokenAction::Renew);
        assert_eq!(token_action(false, -5, ttl), TokenAction::Renew);
        assert_eq!(token_action(true, 800, ttl), TokenAction::Delete);
    }

    #[test]
    fn registration_labels_follow_node_restriction() {
        assert!(kubelet_may_set("team"));
        assert!(kubelet_may_set("example.com/pool"));
        assert!(kubelet_may_set("node.kubernetes.io/instance-type"));
        assert!(!kubelet_may_set("node-role.kubernetes.io/worker"));
        assert!(!kubelet_may_set("node-restriction.kubernetes.io/x"));
        assert!(!kubelet_may_set("kubernetes.io/hostname2"));
        assert!(!kubelet_may_set("x.k8s.io/y"));
    }

    proptest! {
        #[test]
        fn substitution_leaves_no_placeholder_and_nothing_else_changes(
            parts in proptest::collection::vec("[a-z \n:#]{0,20}", 1..6),
        ) {
            let rendered = parts.join(TOKEN_PLACEHOLDER);
            let out = substitute(rendered.as_bytes(), "abcdef.0123456789abcdef");
            let text = String::from_utf8(out).unwrap();
            prop_assert!(!text.contains(TOKEN_PLACEHOLDER));
            prop_assert_eq!(text, parts.join("abcdef.0123456789abcdef"));
        }
    }
}
