//! Trust policy: which keys must have signed a plugin, per source prefix.
//!
//! ```yaml
//! apiVersion: capstan.dev/v1alpha1
//! kind: TrustPolicy
//! keys:
//!   - name: publisher
//!     path: publisher.pub          # relative to the policy file, or
//!     # publicKey: |               # the PEM inline
//!     #   -----BEGIN PUBLIC KEY-----
//! sources:
//!   - prefix: oci://registry.example.com/capstan/
//!     allOf: [publisher]           # every one of these must have signed
//!     anyOf: [ops-a, ops-b]        # and at least one of these
//! ```
//!
//! Prefixes are parsed and normalised like sources ([`Scope`]): they match
//! on `/` boundaries, after lowercasing the registry and dropping `:443`, and
//! a prefix that could never match is an error when the policy is loaded.
//! `file:///DIR/` prefixes cover local plugins (signed with a Sigstore
//! bundle next to the file). The most specific matching prefix decides; a
//! source no rule covers is refused. [`evaluate`] is the pure decision over
//! the signatures found.

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

/// One rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// Source prefix, like `oci://registry.example.com/capstan/`.
    #[serde(default)]
    pub prefix: String,
    /// Keys that must all have signed.
    #[serde(default)]
    pub all_of: Vec<String>,
    /// Keys of which at least one must have signed.
    #[serde(default)]
    pub any_of: Vec<String>,
}

/// A loaded, checked policy.
#[derive(Debug, Clone)]
pub struct TrustPolicy {
    keys: BTreeMap<String, PublicKey>,
    rules: Vec<RuleSpec>,
    scopes: Vec<Scope>,
}

/// A rule with its keys resolved, ready to evaluate.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The prefix that selected it.
    pub prefix: String,
    /// `(name, key)` that must all have signed.
    pub all_of: Vec<(String, PublicKey)>,
    /// `(name, key)` of which one must have signed.
    pub any_of: Vec<(String, PublicKey)>,
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
        let mut policy = TrustPolicy {
            keys,
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
                "needs at least one key in allOf or anyOf",
            ));
        }
        for name in rule.all_of.iter().chain(&rule.any_of) {
            if !self.keys.contains_key(name) {
                return Err(Error::config(
                    field,
                    format!("names key {name:?}, which keys does not define"),
                ));
            }
        }
        Ok(())
    }

    /// A one-rule policy covering every source (for `--key` and a `Plugin`'s
    /// own `verification`).
    pub fn single(
        keys: Vec<(String, PublicKey)>,
        all_of: Vec<String>,
        any_of: Vec<String>,
    ) -> Result<TrustPolicy, Error> {
        let policy = TrustPolicy {
            keys: keys.into_iter().collect(),
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
                .map(|n| (n.clone(), self.keys[n].clone()))
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
            sources: self.rules.clone(),
        };
        serde_yaml::to_string(&file).expect("a policy always serializes")
    }

    /// The named keys (for inspect: which key made a signature).
    pub fn keys(&self) -> impl Iterator<Item = (&str, &PublicKey)> {
        self.keys.iter().map(|(n, k)| (n.as_str(), k))
    }
}

impl Rule {
    /// A stable fingerprint of what this rule demands (cache key part).
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        for (tag, keys) in [("all", &self.all_of), ("any", &self.any_of)] {
            h.update(tag);
            for (name, key) in keys {
                h.update(name);
                h.update(key.to_der());
            }
        }
        hex::encode(&h.finalize()[..8])
    }
}

/// Which keys signed, by name (what status shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signer {
    /// The key's name in the policy.
    pub name: String,
    /// The key id.
    pub key_id: String,
    /// Where the signature was found.
    pub origin: String,
}

/// Decide whether `candidates` satisfy `rule`. `Ok` lists the signers that
/// counted; `Err` says which requirement failed and what each signature was.
pub fn evaluate(rule: &Rule, candidates: &[Candidate]) -> Result<Vec<Signer>, String> {
    if candidates.is_empty() {
        return Err("no signatures found: the artifact is unsigned (no cosign .sig tag and no Sigstore bundle referrer); sign it with `capstan plugin sign`".into());
    }
    let signer = |(name, key): &(String, PublicKey)| {
        candidates
            .iter()
            .find(|c| c.verified_by(key))
            .map(|c| Signer {
                name: name.clone(),
                key_id: key.id(),
                origin: c.origin.clone(),
            })
    };
    let mut signers = Vec::new();
    let mut missing = Vec::new();
    for entry in &rule.all_of {
        match signer(entry) {
            Some(s) => signers.push(s),
            None => missing.push(format!(
                "allOf key {:?} ({}) has no valid signature",
                entry.0,
                entry.1.id()
            )),
        }
    }
    if !rule.any_of.is_empty() {
        let any: Vec<Signer> = rule.any_of.iter().filter_map(signer).collect();
        if any.is_empty() {
            let names: Vec<&str> = rule.any_of.iter().map(|(n, _)| n.as_str()).collect();
            missing.push(format!(
                "none of the anyOf keys {names:?} has a valid signature"
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
    let keys: Vec<&PublicKey> = rule
        .all_of
        .iter()
        .chain(&rule.any_of)
        .map(|(_, k)| k)
        .collect();
    let found: Vec<String> = candidates
        .iter()
        .map(|c| match &c.claim {
            Err(reason) => format!("{}: {reason}", c.origin),
            Ok(()) if keys.iter().any(|k| c.verified_by(k)) => format!("{}: valid", c.origin),
            Ok(()) => format!("{}: not made by any key this rule names (wrong key, or the signature does not match its payload)", c.origin),
        })
        .collect();
    Err(format!(
        "{}; found {} signature(s): {}",
        missing.join("; "),
        found.len(),
        found.join("; ")
    ))
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
            err.contains("none of the anyOf keys [\"b\", \"c\"]"),
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
            err.contains("p.yaml: sources[0]: names key \"zz\""),
            "{err}"
        );
        let err = TrustPolicy::parse("p.yaml", "apiVersion: v1\nkind: X\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("kind: TrustPolicy"), "{err}");
    }
}
