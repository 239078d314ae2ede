//! Field paths an in-place updater declares it may change.
//!
//! A path names a field of a Machine's spec with dotted segments, the way
//! the host reports changes: `version`, `failureDomain`,
//! `provider.config.instanceType`, `provider.config.tags.team`. A declared
//! pattern may end in `*`, which stands for one or more further segments:
//! `provider.config.tags.*` covers every tag but not `provider.config.tags`
//! itself. Declarations are checked against each other when an updater is
//! activated ([`FieldPattern::overlaps`]) and every claim an updater makes is
//! checked against its own declaration ([`FieldPattern::matches`]).
//!
//! A declaration takes effect only as far as the admin grants it on the
//! Plugin ([`granted_fields`]). A key that holds a `.` (a label such as
//! `example.com/team`) is written with the dot escaped: `tags.example\.com/team`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A declared field path, possibly ending in `*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPattern {
    /// The segments before a trailing `*`.
    segments: Vec<String>,
    /// Whether the pattern ends in `*`.
    wildcard: bool,
}

impl FieldPattern {
    /// Whether the concrete `path` is covered by this pattern.
    pub fn matches(&self, path: &str) -> bool {
        let parts = split_path(path);
        if self.wildcard {
            parts.len() > self.segments.len()
                && self.segments.iter().zip(&parts).all(|(a, b)| a == b)
        } else {
            parts.len() == self.segments.len()
                && self.segments.iter().zip(&parts).all(|(a, b)| a == b)
        }
    }

    /// Whether every path this pattern covers, `other` covers too.
    pub fn within(&self, other: &FieldPattern) -> bool {
        let prefix = self.segments.len() >= other.segments.len()
            && self.segments[..other.segments.len()] == other.segments[..];
        match (self.wildcard, other.wildcard) {
            (_, true) => prefix && (self.segments.len() > other.segments.len() || self.wildcard),
            (false, false) => self.segments == other.segments,
            (true, false) => false,
        }
    }

    /// Whether some path is covered by both patterns.
    pub fn overlaps(&self, other: &FieldPattern) -> bool {
        let common = self.segments.len().min(other.segments.len());
        if self.segments[..common] != other.segments[..common] {
            return false;
        }
        match (self.wildcard, other.wildcard) {
            (false, false) => self.segments.len() == other.segments.len(),
            // `a.*` covers `a.b...`: a concrete path overlaps when it is longer.
            (true, false) => other.segments.len() > self.segments.len(),
            (false, true) => self.segments.len() > other.segments.len(),
            (true, true) => true,
        }
    }
}

impl FromStr for FieldPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut segments: Vec<String> = split_path(s).into_iter().map(str::to_string).collect();
        let wildcard = segments.last().is_some_and(|l| l == "*");
        if wildcard {
            segments.pop();
        }
        if segments.is_empty() {
            return Err(format!(
                "`{s}` must name a field (for example `version` or `provider.config.tags.*`)"
            ));
        }
        if let Some(bad) = segments.iter().find(|p| p.is_empty() || p.contains('*')) {
            return Err(format!(
                "`{s}` has an empty segment or a `*` inside (`{bad}`); `*` may only be the whole last segment"
            ));
        }
        Ok(FieldPattern { segments, wildcard })
    }
}

impl fmt::Display for FieldPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.segments.join("."))?;
        if self.wildcard {
            f.write_str(".*")?;
        }
        Ok(())
    }
}

impl Serialize for FieldPattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FieldPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Split a dotted path on the dots that are not escaped (`\.`); segments
/// keep their escapes, so paths and patterns compare as written.
pub fn split_path(path: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in path.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '.' => {
                parts.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&path[start..]);
    parts
}

/// A key as a path segment: dots and backslashes escaped.
pub fn path_segment(key: &str) -> String {
    key.replace('\\', "\\\\").replace('.', "\\.")
}

/// What an updater may change: its declared patterns as far as `granted`
/// covers them (a declared `provider.config.*` granted only
/// `provider.config.tags.*` becomes `provider.config.tags.*`).
pub fn granted_fields(declared: &[FieldPattern], granted: &[FieldPattern]) -> Vec<FieldPattern> {
    let mut effective: Vec<FieldPattern> = Vec::new();
    for d in declared {
        for g in granted.iter().filter(|g| g.overlaps(d)) {
            let narrower = if d.within(g) { d } else { g };
            if !effective.contains(narrower) {
                effective.push(narrower.clone());
            }
        }
    }
    effective
}

/// Pairs `(mine, theirs)` of patterns that overlap between two declarations.
pub fn overlapping(mine: &[FieldPattern], theirs: &[FieldPattern]) -> Vec<(String, String)> {
    let mut found = vec![];
    for a in mine {
        for b in theirs {
            if a.overlaps(b) {
                found.push((a.to_string(), b.to_string()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> FieldPattern {
        s.parse().unwrap()
    }

    #[test]
    fn declarations_take_effect_as_far_as_granted() {
        let declared = vec![p("provider.config.*"), p("version"), p("failureDomain")];
        let granted = vec![p("provider.config.tags.*"), p("version")];
        let effective: Vec<String> = granted_fields(&declared, &granted)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(effective, ["provider.config.tags.*", "version"]);
        assert!(granted_fields(&declared, &[]).is_empty());
        assert!(p("a.b.c").within(&p("a.*")));
        assert!(p("a.b.*").within(&p("a.*")));
        assert!(!p("a.*").within(&p("a.b.*")));
        assert!(!p("a").within(&p("a.*")));
    }

    #[test]
    fn keys_with_dots_are_escaped_segments() {
        let team = format!("provider.config.tags.{}", path_segment("example.com/team"));
        assert_eq!(team, "provider.config.tags.example\\.com/team");
        assert!(p("provider.config.tags.*").matches(&team));
        assert!(p("provider.config.tags.example\\.com/team").matches(&team));
        assert!(!p("provider.config.tags.example").matches(&team));
        assert!(!p("provider.config.tags.example.*").matches(&team));
    }

    #[test]
    fn patterns_match_exact_paths_and_trailing_wildcards() {
        assert!(p("version").matches("version"));
        assert!(!p("version").matches("version.x"));
        assert!(p("provider.config.tags.*").matches("provider.config.tags.team"));
        assert!(p("provider.config.tags.*").matches("provider.config.tags.a.b"));
        assert!(!p("provider.config.tags.*").matches("provider.config.tags"));
        assert!(!p("provider.config.tags.*").matches("provider.config.instanceType"));
    }

    #[test]
    fn overlap_is_symmetric_and_exact() {
        let cases = [
            ("version", "version", true),
            ("version", "failureDomain", false),
            ("provider.config.tags.*", "provider.config.tags.team", true),
            ("provider.config.tags.*", "provider.config.tags", false),
            ("provider.config.*", "provider.config.tags.*", true),
            ("provider.config.tags.*", "provider.config.labels.*", false),
            ("provider.*", "version", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(p(a).overlaps(&p(b)), want, "{a} vs {b}");
            assert_eq!(p(b).overlaps(&p(a)), want, "{b} vs {a}");
        }
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for bad in ["", "*", "a..b", "a.*.b", "a.b*"] {
            let error = bad.parse::<FieldPattern>().unwrap_err();
            assert!(error.contains(&format!("`{bad}`")), "{error}");
        }
        assert_eq!(
            p("provider.config.tags.*").to_string(),
            "provider.config.tags.*"
        );
    }
}
