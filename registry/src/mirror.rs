//! Mirror configuration: rewrite where plugins are fetched from, by prefix,
//! without changing what they are called. Signatures still have to name the
//! original repository, so a mirror can serve bytes but cannot vouch for them.
//!
//! ```yaml
//! mirrors:
//!   - source: oci://registry.example.com/capstan/
//!     mirror: oci://127.0.0.1:5001/mirror/capstan/
//! ```

use crate::{Error, Reference, Scope};
use serde::Deserialize;
use std::path::Path;

/// Prefix rewrites, most specific source prefix first. Prefixes are parsed
/// like trust policy prefixes ([`Scope`]): normalised, on `/` boundaries.
#[derive(Debug, Clone, Default)]
pub struct Mirrors {
    rules: Vec<(Scope, Scope)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    mirrors: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    source: String,
    mirror: String,
}

impl Mirrors {
    /// Read a mirror configuration file.
    pub fn load(path: &Path) -> Result<Mirrors, Error> {
        let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Parse mirror YAML.
    pub fn parse(what: &str, text: &str) -> Result<Mirrors, Error> {
        let file: File = serde_yaml::from_str(text).map_err(|e| Error::config(what, e))?;
        let mut rules = Vec::new();
        for (i, entry) in file.mirrors.into_iter().enumerate() {
            let mut scopes = Vec::new();
            for (field, value) in [("source", &entry.source), ("mirror", &entry.mirror)] {
                let field = format!("{what}: mirrors[{i}].{field}");
                match Scope::parse(value) {
                    Ok(scope @ Scope::Oci { .. }) => scopes.push(scope),
                    Ok(_) => {
                        return Err(Error::config(
                            field,
                            format!("{value:?} must look like oci://REGISTRY/PREFIX/"),
                        ));
                    }
                    Err(e) => return Err(Error::config(field, e)),
                }
            }
            let mirror = scopes.pop().expect("two scopes");
            rules.push((scopes.pop().expect("two scopes"), mirror));
        }
        rules.sort_by_key(|(source, _)| std::cmp::Reverse(source.specificity()));
        Ok(Mirrors { rules })
    }

    /// Where to fetch `source` from (itself when no rule matches).
    pub fn location(&self, source: &Reference) -> Result<Reference, Error> {
        for (from, to) in &self.rules {
            if let Some(rest) = from.remainder(source) {
                let mut located = source.clone();
                let Scope::Oci { registry, path } = to else {
                    unreachable!("mirrors are oci:// scopes")
                };
                located.registry.clone_from(registry);
                located.repository = path
                    .iter()
                    .map(String::as_str)
                    .chain(rest)
                    .collect::<Vec<_>>()
                    .join("/");
                return Reference::parse(&located.to_string());
            }
        }
        Ok(source.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_by_longest_prefix() {
        let m = Mirrors::parse(
            "m.yaml",
            "mirrors:\n  - source: oci://a:5000/\n    mirror: oci://b:5001/mirror/\n  - source: oci://a:5000/special/\n    mirror: oci://c.io/\n",
        )
        .unwrap();
        let r = Reference::parse("oci://a:5000/capstan/sim:v1").unwrap();
        assert_eq!(
            m.location(&r).unwrap().to_string(),
            "oci://b:5001/mirror/capstan/sim:v1"
        );
        let r = Reference::parse("oci://a:5000/special/x:v1").unwrap();
        assert_eq!(m.location(&r).unwrap().to_string(), "oci://c.io/x:v1");
        let r = Reference::parse("oci://a:5000/specialist/x:v1").unwrap();
        assert_eq!(
            m.location(&r).unwrap().to_string(),
            "oci://b:5001/mirror/specialist/x:v1"
        );
        let r = Reference::parse("oci://z.io/x:v1").unwrap();
        assert_eq!(m.location(&r).unwrap(), r);
        let err = Mirrors::parse("m.yaml", "mirrors:\n  - source: a\n    mirror: oci://b/\n")
            .unwrap_err();
        assert!(err.to_string().contains("mirrors[0].source"), "{err}");
    }
}
