//! Trust policy: which keys or keyless identities must have signed a
//! plugin, per source prefix.
//!
//! ```yaml
//! apiVersion: capstan.dev/v1alpha1
//! kind: TrustPolicy
//! keys:
//!   - name: publisher
//!     path: publisher.pub          # relative to the policy file, or
//!     # publicKey: |               # the PEM inline
//!     #   -----BEGIN PUBLIC KEY-----
//! identities:                      # keyless (Fulcio) signers
//!   - name: release-ci
//!     issuer: https://token.actions.githubusercontent.com
//!     subject: https://github.com/example/plugins/.github/workflows/release.yml@refs/heads/main
//!     # subjectRegExp: https://github.com/example/.*   (the whole subject must match)
//!     trustedRoot: trusted_root.json   # Sigstore's trusted root, relative to the policy file
//! sources:
//!   - prefix: oci://registry.example.com/capstan/
//!     allOf: [publisher]           # every one of these must have signed
//!     anyOf: [ops-a, release-ci]   # and at least one of these
//! ```
//!
//! Prefixes are parsed and normalised like sources ([`Scope`]): they match
//! on `/` boundaries, after lowercasing the registry and dropping `:443`, and
//! a prefix that could never match is an error when the policy is loaded.
//! `file:///DIR/` prefixes cover local plugins (signed with a Sigstore
//! bundle next to the file). The most specific matching prefix decides; a
//! source no rule covers is refused. [`evaluate`] is the pure decision over
//! the signatures found.

use crate::keyless::{IdentityRule, Subject, TrustedRoot};
use crate::keys::PublicKey;
use crate::signature::Candidate;
use crate::{Error, Scope, Source};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// The policy file as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyFile {
    /// `capstan.dev/v1alpha1`.
    pub api_version: String,
    /// `TrustPolicy`.
    pub kind: String,
    /// Named public keys.
    #[serde(default)]
    pub keys: Vec<KeySpec>,
    /// Named keyless identities.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<IdentitySpec>,
    /// Rules per source prefix.
    #[serde(default)]
    pub sources: Vec<RuleSpec>,
}

/// One named key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeySpec {
    /// How rules refer to it.
    pub name: String,
    /// The PEM, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Or a file, relative to the policy file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// One keyless identity: a Fulcio certificate's subject and OIDC issuer,
/// under a Sigstore trusted root.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdentitySpec {
    /// How rules refer to it.
    pub name: String,
    /// The OIDC issuer, exactly.
    pub issuer: String,
    /// The certificate subject (e-mail or URI), exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Or a regular expression the whole subject must match.
    #[serde(
        default,
        rename = "subjectRegExp",
        skip_serializing_if = "Option::is_none"
    )]
    pub subject_reg_exp: Option<String>,
    /// The trusted root file, relative to the policy file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_root: Option<String>,
    /// Or the trusted root's JSON inline (what an air-gap bundle carries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_root_json: Option<String>,
}

/// One rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// Source prefix, like `oci://registry.example.com/capstan/`.
    #[serde(default)]
    pub prefix: String,
    /// Keys or identities that must all have signed.
    #[serde(default)]
    pub all_of: Vec<String>,
    /// Keys or identities of which at least one must have signed.
    #[serde(default)]
    pub any_of: Vec<String>,
}

/// A loaded, checked policy.
#[derive(Debug, Clone)]
pub struct TrustPolicy {
    keys: BTreeMap<String, PublicKey>,
    identities: BTreeMap<String, IdentityRule>,
    rules: Vec<RuleSpec>,
    scopes: Vec<Scope>,
}

/// One signer a rule asks for: a key, or a keyless identity.
#[derive(Debug, Clone)]
pub enum Requirement {
    /// A signature by this key.
    Key(PublicKey),
    /// A keyless signature by this identity.
    Identity(IdentityRule),
}

impl Requirement {
    /// What it asks for, for messages: a key id, or `SUBJECT from ISSUER`.
    pub fn describe(&self) -> String {
        match self {
            Requirement::Key(key) => key.id(),
            Requirement::Identity(rule) => rule.describe(),
        }
    }
}

/// A rule with its keys and identities resolved, ready to evaluate.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The prefix that selected it.
    pub prefix: String,
    /// `(name, signer)` that must all have signed.
    pub all_of: Vec<(String, Requirement)>,
    /// `(name, signer)` of which one must have signed.
    pub any_of: Vec<(String, Requirement)>,
}

impl TrustPolicy {
    /// Read a policy file.
    pub fn load(path: &Path) -> Result<TrustPolicy, Error> {
        let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
        Self::parse(&path.display().to_string(), &text, path.parent())
    }

    /// Parse policy YAML; `base` resolves relative key paths (none: keys
    /// must be inline).
    pub fn parse(what: &str, text: &str, base: Option<&Path>) -> Result<TrustPolicy, Error> {
        let file: PolicyFile = serde_yaml::from_str(text).map_err(|e| Error::config(what, e))?;
        if file.api_version != "capstan.dev/v1alpha1" || file.kind != "TrustPolicy" {
            return Err(Error::config(
                what,
                "expected apiVersion: capstan.dev/v1alpha1 and kind: TrustPolicy",
            ));
        }
        let mut keys = BTreeMap::new();
        for (i, spec) in file.keys.iter().enumerate() {
            let field = format!("{what}: keys[{i}] ({:?})", spec.name);
            let pem = match (&spec.public_key, &spec.path) {
                (Some(pem), None) => pem.clone(),
                (None, Some(path)) => {
                    let Some(base) = base else {
                        return Err(Error::config(
                            field,
                            "path is not allowed here; give publicKey inline",
                        ));
                    };
                    let full = base.join(path);
                    std::fs::read_to_string(&full).map_err(Error::io(full))?
                }
                _ => {
                    return Err(Error::config(
                        field,
                        "give exactly one of publicKey or path",
                    ));
                }
            };
            let key = PublicKey::from_pem(&field, &pem)?;
            if keys.insert(spec.name.clone(), key).is_some() {
                return Err(Error::config(field, "duplicate key name"));
            }
        }
        let mut identities = BTreeMap::new();
        for (i, spec) in file.identities.iter().enumerate() {
            let field = format!("{what}: identities[{i}] ({:?})", spec.name);
            let rule = identity_rule(&field, spec, base)?;
            if keys.contains_key(&spec.name) || identities.insert(spec.name.clone(), rule).is_some()
            {
                return Err(Error::config(
                    field,
                    "duplicate name (keys and identities share one namespace)",
                ));
            }
        }
        let mut policy = TrustPolicy {
            keys,
            identities,
            rules: file.sources,
            scopes: Vec::new(),
        };
        for (i, rule) in policy.rules.iter().enumerate() {
            let field = format!("{what}: sources[{i}]");
            policy.check_rule(&field, rule)?;
            let scope = Scope::parse(&rule.prefix)
                .map_err(|e| Error::config(format!("{field}.prefix"), e))?;
            if policy.scopes.contains(&scope) {
                return Err(Error::config(
                    format!("{field}.prefix"),
                    format!("another rule already covers {scope}; merge them"),
                ));
            }
            policy.scopes.push(scope);
        }
        Ok(policy)
    }

    fn check_rule(&self, field: &str, rule: &RuleSpec) -> Result<(), Error> {
        if rule.all_of.is_empty() && rule.any_of.is_empty() {
            return Err(Error::config(
                field,
                "needs at least one key or identity in allOf or anyOf",
            ));
        }
        for name in rule.all_of.iter().chain(&rule.any_of) {
            if !self.keys.contains_key(name) && !self.identities.contains_key(name) {
                return Err(Error::config(
                    field,
                    format!("names {name:?}, which neither keys nor identities define"),
                ));
            }
        }
        Ok(())
    }

    fn requirement(&self, name: &str) -> Requirement {
        match self.keys.get(name) {
            Some(key) => Requirement::Key(key.clone()),
            None => Requirement::Identity(self.identities[name].clone()),
        }
    }

    /// A one-rule policy covering every source (for `--key` and a `Plugin`'s
    /// own `verification`).
    pub fn single(
        keys: Vec<(String, PublicKey)>,
        all_of: Vec<String>,
        any_of: Vec<String>,
    ) -> Result<TrustPolicy, Error> {
        Self::single_with(keys, Vec::new(), all_of, any_of)
    }

    /// [`TrustPolicy::single`] with keyless identities too (`--identity`).
    pub fn single_with(
        keys: Vec<(String, PublicKey)>,
        identities: Vec<(String, IdentityRule)>,
        all_of: Vec<String>,
        any_of: Vec<String>,
    ) -> Result<TrustPolicy, Error> {
        let policy = TrustPolicy {
            keys: keys.into_iter().collect(),
            identities: identities.into_iter().collect(),
            rules: vec![RuleSpec {
                prefix: String::new(),
                all_of,
                any_of,
            }],
            scopes: vec![Scope::Everything],
        };
        policy.check_rule("verification", &policy.rules[0])?;
        Ok(policy)
    }

    /// The rule for `source`: the most specific covering prefix.
    pub fn rule_for(&self, source: &Source) -> Option<Rule> {
        let (spec, _) = self
            .rules
            .iter()
            .zip(&self.scopes)
            .filter(|(_, scope)| scope.covers(source))
            .max_by_key(|(_, scope)| scope.specificity())?;
        let resolve = |names: &[String]| {
            names
                .iter()
                .map(|n| (n.clone(), self.requirement(n)))
                .collect()
        };
        Some(Rule {
            prefix: spec.prefix.clone(),
            all_of: resolve(&spec.all_of),
            any_of: resolve(&spec.any_of),
        })
    }

    /// The policy with every key inline (what a bundle carries).
    pub fn to_yaml(&self) -> String {
        let file = PolicyFile {
            api_version: "capstan.dev/v1alpha1".into(),
            kind: "TrustPolicy".into(),
            keys: self
                .keys
                .iter()
                .map(|(name, key)| KeySpec {
                    name: name.clone(),
                    public_key: Some(key.to_pem()),
                    path: None,
                })
                .collect(),
            identities: self
                .identities
                .iter()
                .map(|(name, rule)| IdentitySpec {
                    name: name.clone(),
                    issuer: rule.issuer.clone(),
                    subject: match &rule.subject {
                        Subject::Exact(s) => Some(s.clone()),
                        Subject::Pattern { .. } => None,
                    },
                    subject_reg_exp: match &rule.subject {
                        Subject::Exact(_) => None,
                        Subject::Pattern { text, .. } => Some(text.clone()),
                    },
                    trusted_root: None,
                    trusted_root_json: Some(rule.root.json().to_string()),
                })
                .collect(),
            sources: self.rules.clone(),
        };
        serde_yaml::to_string(&file).expect("a policy always serializes")
    }

    /// The named keys (for inspect: which key made a signature).
    pub fn keys(&self) -> impl Iterator<Item = (&str, &PublicKey)> {
        self.keys.iter().map(|(n, k)| (n.as_str(), k))
    }

    /// The named keyless identities.
    pub fn identities(&self) -> impl Iterator<Item = (&str, &IdentityRule)> {
        self.identities.iter().map(|(n, r)| (n.as_str(), r))
    }

    /// The distinct trusted roots the identities name.
    pub fn trusted_roots(&self) -> Vec<&TrustedRoot> {
        let mut roots: Vec<&TrustedRoot> = Vec::new();
        for rule in self.identities.values() {
            if !roots.contains(&&rule.root) {
                roots.push(&rule.root);
            }
        }
        roots
    }
}

fn identity_rule(
    field: &str,
    spec: &IdentitySpec,
    base: Option<&Path>,
) -> Result<IdentityRule, Error> {
    IdentityRule::check_issuer(&spec.issuer).map_err(|e| Error::config(field, e))?;
    let subject = Subject::from_fields(spec.subject.as_deref(), spec.subject_reg_exp.as_deref())
        .map_err(|e| Error::config(field, e))?;
    let root = match (&spec.trusted_root, &spec.trusted_root_json) {
        (Some(path), None) => {
            let Some(base) = base else {
                return Err(Error::config(
                    field,
                    "trustedRoot is a file, which is not allowed here; give trustedRootJson inline",
                ));
            };
            TrustedRoot::load(&base.join(path))?
        }
        (None, Some(json)) => TrustedRoot::parse(&format!("{field}.trustedRootJson"), json)?,
        _ => {
            return Err(Error::config(
                field,
                "give the Sigstore trusted root as trustedRoot: FILE (Sigstore's trusted_root.json, or your private instance's)",
            ));
        }
    };
    IdentityRule::new(&spec.issuer, subject, root).map_err(|e| Error::config(field, e))
}

impl Rule {
    /// A stable fingerprint of what this rule demands (cache key part).
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        for (tag, entries) in [("all", &self.all_of), ("any", &self.any_of)] {
            h.update(tag);
            for (name, requirement) in entries {
                h.update(name);
                match requirement {
                    Requirement::Key(key) => h.update(key.to_der()),
                    Requirement::Identity(rule) => {
                        h.update(&rule.issuer);
                        h.update(rule.subject.to_string());
                        h.update(rule.root.fingerprint());
                    }
                }
            }
        }
        hex::encode(&h.finalize()[..8])
    }
}

/// Which keys or identities signed, by name (what status shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signer {
    /// The key's or identity's name in the policy.
    pub name: String,
    /// The key id; for a keyless signature, who signed:
    /// `SUBJECT from ISSUER`, as the verified certificate says.
    pub key_id: String,
    /// Where the signature was found.
    pub origin: String,
    /// The Rekor log index of a keyless signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_index: Option<u64>,
}

/// Decide whether `candidates` satisfy `rule`. `Ok` lists the signers that
/// counted; `Err` says which requirement failed and what each signature was.
pub fn evaluate(rule: &Rule, candidates: &[Candidate]) -> Result<Vec<Signer>, String> {
    if candidates.is_empty() {
        return Err("no signatures found: the artifact is unsigned (no cosign .sig tag and no Sigstore bundle referrer); sign it with `capstan plugin sign`".into());
    }
    let mut signers = Vec::new();
    let mut missing = Vec::new();
    for (name, requirement) in &rule.all_of {
        match signed_by(name, requirement, candidates) {
            Ok(s) => signers.push(s),
            Err(why) => missing.push(format!(
                "allOf {} {name:?} ({}) has no valid signature{why}",
                kind(requirement),
                requirement.describe()
            )),
        }
    }
    if !rule.any_of.is_empty() {
        let mut any = Vec::new();
        let mut why_not = Vec::new();
        for (name, requirement) in &rule.any_of {
            match signed_by(name, requirement, candidates) {
                Ok(s) => any.push(s),
                Err(why) if !why.is_empty() => why_not.push(format!("{name:?}{why}")),
                Err(_) => {}
            }
        }
        if any.is_empty() {
            let names: Vec<&str> = rule.any_of.iter().map(|(n, _)| n.as_str()).collect();
            let why = if why_not.is_empty() {
                String::new()
            } else {
                format!(" ({})", why_not.join("; "))
            };
            missing.push(format!(
                "none of the anyOf keys or identities {names:?} has a valid signature{why}"
            ));
        }
        for s in any {
            if !signers.iter().any(|x| x.name == s.name) {
                signers.push(s);
            }
        }
    }
    if missing.is_empty() {
        return Ok(signers);
    }
    let requirements: Vec<&Requirement> = rule
        .all_of
        .iter()
        .chain(&rule.any_of)
        .map(|(_, r)| r)
        .collect();
    let found: Vec<String> = candidates
        .iter()
        .map(|c| describe_candidate(c, &requirements))
        .collect();
    Err(format!(
        "{}; found {} signature(s): {}",
        missing.join("; "),
        found.len(),
        found.join("; ")
    ))
}

fn kind(requirement: &Requirement) -> &'static str {
    match requirement {
        Requirement::Key(_) => "key",
        Requirement::Identity(_) => "identity",
    }
}

/// The first candidate `requirement` accepts, as a [`Signer`]; `Err` holds
/// why the keyless candidates did not count (empty for a key: the list of
/// signatures found says it).
fn signed_by(
    name: &str,
    requirement: &Requirement,
    candidates: &[Candidate],
) -> Result<Signer, String> {
    match requirement {
        Requirement::Key(key) => candidates
            .iter()
            .find(|c| c.verified_by(key))
            .map(|c| Signer {
                name: name.to_string(),
                key_id: key.id(),
                origin: c.origin.clone(),
                log_index: None,
            })
            .ok_or_else(String::new),
        Requirement::Identity(rule) => {
            let mut reasons = Vec::new();
            for c in candidates {
                let Some(keyless) = &c.keyless else {
                    continue;
                };
                if let Err(reason) = &c.claim {
                    reasons.push(format!("{}: {reason}", c.origin));
                    continue;
                }
                match rule.check(keyless) {
                    Ok(signed) => {
                        return Ok(Signer {
                            name: name.to_string(),
                            key_id: format!("{} from {}", signed.subject, signed.issuer),
                            origin: c.origin.clone(),
                            log_index: signed.log_index,
                        });
                    }
                    Err(reason) => reasons.push(format!("{}: {reason}", c.origin)),
                }
            }
            Err(if reasons.is_empty() {
                ": no keyless signature was found".into()
            } else {
                format!(": {}", reasons.join("; "))
            })
        }
    }
}

fn describe_candidate(c: &Candidate, requirements: &[&Requirement]) -> String {
    let accepted = requirements.iter().any(|r| match r {
        Requirement::Key(k) => c.verified_by(k),
        Requirement::Identity(rule) => c.keyless.as_ref().is_some_and(|k| rule.check(k).is_ok()),
    });
    match (&c.claim, &c.keyless) {
        (Err(reason), _) => format!("{}: {reason}", c.origin),
        (Ok(()), _) if accepted => format!("{}: valid", c.origin),
        (Ok(()), Some(keyless)) => match keyless.claimed() {
            Some(who) => format!(
                "{}: keyless, certificate for {:?} from {:?}, not an identity this rule accepts",
                c.origin, who.subject, who.issuer
            ),
            None => format!("{}: keyless, with no readable identity", c.origin),
        },
        (Ok(()), None) => format!(
            "{}: not made by any key this rule names (wrong key, or the signature does not match its payload)",
            c.origin
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Digest;
    use crate::keys::PrivateKey;
    use crate::signature::{check_simple_signing, simple_signing_payload};

    fn candidate(key: &PrivateKey, repo: &str, digest: &Digest, expected_repo: &str) -> Candidate {
        let payload = simple_signing_payload(repo, digest);
        Candidate {
            origin: "cosign signature 1".into(),
            signature: key.sign(&payload),
            claim: check_simple_signing(&payload, expected_repo, digest),
            message: payload,
            keyless: None,
        }
    }

    fn src(text: &str) -> Source {
        Source::parse(text).unwrap()
    }

    #[test]
    fn all_of_and_any_of() {
        let (a, b, c) = (
            PrivateKey::generate(),
            PrivateKey::generate(),
            PrivateKey::generate(),
        );
        let d = Digest::of(b"m");
        let keys = vec![
            ("a".into(), a.public()),
            ("b".into(), b.public()),
            ("c".into(), c.public()),
        ];
        let policy =
            TrustPolicy::single(keys.clone(), vec!["a".into()], vec!["b".into(), "c".into()])
                .unwrap();
        let rule = policy.rule_for(&src("oci://r.io/x")).unwrap();
        let sig_a = candidate(&a, "r.io/x", &d, "r.io/x");
        let sig_c = candidate(&c, "r.io/x", &d, "r.io/x");
        let ok = evaluate(&rule, &[sig_a.clone(), sig_c.clone()]).unwrap();
        assert_eq!(
            ok.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a", "c"]
        );
        let err = evaluate(&rule, std::slice::from_ref(&sig_a)).unwrap_err();
        assert!(
            err.contains("none of the anyOf keys or identities [\"b\", \"c\"]"),
            "{err}"
        );
        let err = evaluate(&rule, &[sig_c]).unwrap_err();
        assert!(err.contains("allOf key \"a\""), "{err}");
        assert!(evaluate(&rule, &[]).unwrap_err().contains("unsigned"));
        let foreign = candidate(&a, "r.io/other", &d, "r.io/x");
        let err = evaluate(&rule, &[foreign]).unwrap_err();
        assert!(err.contains("names repository \"r.io/other\""), "{err}");
        assert!(TrustPolicy::single(keys, vec![], vec![]).is_err());
    }

    #[test]
    fn policy_files_pick_the_longest_prefix_and_name_bad_fields() {
        let a = PrivateKey::generate().public();
        let pem = a.to_pem().replace('\n', "\n      ");
        let text = format!(
            "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nkeys:\n  - name: a\n    publicKey: |\n      {pem}\nsources:\n  - prefix: oci://r.io/\n    allOf: [a]\n  - prefix: oci://R.io:443/team\n    anyOf: [a]\n"
        );
        let policy = TrustPolicy::parse("p.yaml", &text, None).unwrap();
        assert_eq!(
            policy.rule_for(&src("oci://r.io/team/x:1")).unwrap().prefix,
            "oci://R.io:443/team"
        );
        assert_eq!(
            policy
                .rule_for(&src("oci://r.io/team-evil/x:1"))
                .unwrap()
                .prefix,
            "oci://r.io/"
        );
        assert_eq!(
            policy.rule_for(&src("oci://r.io/x")).unwrap().prefix,
            "oci://r.io/"
        );
        assert!(policy.rule_for(&src("oci://elsewhere.io/x")).is_none());
        assert!(policy.rule_for(&src("file:///r.io/x.wasm")).is_none());
        let back = TrustPolicy::parse("again", &policy.to_yaml(), None).unwrap();
        assert_eq!(
            back.rule_for(&src("oci://r.io/x")).unwrap().fingerprint(),
            policy.rule_for(&src("oci://r.io/x")).unwrap().fingerprint()
        );
        for never in ["oci://r.io/Team/", "r.io/team/", "oci://r.io/team:v1"] {
            let bad = text.replace("oci://R.io:443/team", never);
            let err = TrustPolicy::parse("p.yaml", &bad, None)
                .unwrap_err()
                .to_string();
            assert!(err.contains("p.yaml: sources[1].prefix"), "{never}: {err}");
        }
        let bad = text.replace("allOf: [a]", "allOf: [zz]");
        let err = TrustPolicy::parse("p.yaml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "p.yaml: sources[0]: names \"zz\", which neither keys nor identities define"
            ),
            "{err}"
        );
        let err = TrustPolicy::parse("p.yaml", "apiVersion: v1\nkind: X\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("kind: TrustPolicy"), "{err}");
    }

    #[test]
    fn identity_entries_name_what_is_wrong() {
        let policy = |identity: &str| {
            format!(
                "apiVersion: capstan.dev/v1alpha1\nkind: TrustPolicy\nidentities:\n  - name: ci\n{identity}\nsources:\n  - prefix: oci://r.io/\n    anyOf: [ci]\n"
            )
        };
        let cases = [
            (
                "    issuer: ''\n    subject: a@b\n    trustedRoot: root.json",
                "identities[0] (\"ci\"): issuer is empty",
            ),
            (
                "    issuer: https://i\n    subject: a@b\n    subjectRegExp: a.*\n    trustedRoot: root.json",
                "give exactly one of subject or subjectRegExp",
            ),
            (
                "    issuer: https://i\n    subjectRegExp: '('\n    trustedRoot: root.json",
                "is not a regular expression",
            ),
            (
                "    issuer: https://i\n    subject: a@b",
                "give the Sigstore trusted root as trustedRoot: FILE",
            ),
            (
                "    issuer: https://i\n    subject: a@b\n    trustedRoot: root.json",
                "trustedRoot is a file, which is not allowed here",
            ),
            (
                "    issuer: https://i\n    subject: a@b\n    trustedRootJson: '{}'",
                "not a Sigstore trusted root",
            ),
        ];
        for (identity, expected) in cases {
            let err = TrustPolicy::parse("p.yaml", &policy(identity), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{identity}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let err = TrustPolicy::parse(
            "p.yaml",
            &policy("    issuer: https://i\n    subject: a@b\n    trustedRoot: missing.json"),
            Some(dir.path()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("missing.json"), "{err}");
    }
}
