//! `status.versions` of MachineSets and MachineDeployments: the Kubernetes
//! versions their Machines run, with a count each, as Cluster API v1beta2
//! aggregates them (`internal/util/version`).
//!
//! A Machine's version is its Node's kubelet version when the Node reported
//! one, else its `spec.version`. Versions are listed lowest first by
//! semantic version, build metadata included (numeric identifiers below
//! others, two different non-numeric ones not comparable); versions that
//! do not compare keep the order in which the oldest Machine showed them.
//! Start with [`aggregate`].
//!
//! A kubelet's version is a claim of whoever holds its Node's credentials,
//! so it is bounded here: a version longer than the API's 256 characters
//! is not counted, and the list stops at the API's 100 entries, so a
//! hostile Node can neither make the status write fail nor grow it.

use std::cmp::Ordering;

/// The longest version the API accepts (`StatusVersion.version`).
pub const MAX_VERSION_LEN: usize = 256;
/// The most entries the API accepts in `status.versions`.
pub const MAX_VERSIONS: usize = 100;

/// One Machine, as its version counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineVersion<'a> {
    /// Creation time, in seconds (the oldest Machine names a version first).
    pub created: i64,
    pub name: &'a str,
    /// The Node's kubelet version, if the Node reported one.
    pub kubelet: Option<&'a str>,
    /// The Machine's `spec.version`.
    pub spec: Option<&'a str>,
}

/// A version and how many Machines run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionCount {
    pub version: String,
    pub replicas: i32,
}

/// The versions of `machines`, counted and ordered as Cluster API orders
/// them; empty when no Machine has a version.
pub fn aggregate(mut machines: Vec<MachineVersion<'_>>) -> Vec<VersionCount> {
    machines.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.name.cmp(b.name)));
    let mut counts: Vec<VersionCount> = Vec::new();
    for m in &machines {
        let version = m.kubelet.filter(|k| !k.is_empty()).or(m.spec);
        let Some(version) = version.filter(|v| !v.is_empty() && v.len() <= MAX_VERSION_LEN) else {
            continue;
        };
        match counts.iter_mut().find(|c| c.version == version) {
            Some(c) => c.replicas = c.replicas.saturating_add(1),
            None => counts.push(VersionCount {
                version: version.to_string(),
                replicas: 1,
            }),
        }
    }
    let mut sorted = insertion_sort(counts);
    sorted.truncate(MAX_VERSIONS);
    sorted
}

/// A stable insertion sort by [`less`], which is not a total order (build
/// metadata may not compare): `slice::sort_by` may panic on such an
/// order, this cannot. Entries arrive in first-seen order, so an entry
/// moves only past ones it is [`less`] than.
fn insertion_sort(items: Vec<VersionCount>) -> Vec<VersionCount> {
    let parsed: Vec<(Option<Tolerant>, VersionCount)> = items
        .into_iter()
        .map(|c| (Tolerant::parse(&c.version), c))
        .collect();
    let mut out: Vec<(Option<Tolerant>, VersionCount)> = Vec::with_capacity(parsed.len());
    for item in parsed {
        let mut at = out.len();
        while at > 0 && less(&item, &out[at - 1]) {
            at -= 1;
        }
        out.insert(at, item);
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// Whether `a` goes before `b` (Cluster API's `statusVersionLess`, with
/// the first-seen order standing in for its `order` field: `a` is never
/// earlier than `b` when the two do not compare).
fn less(a: &(Option<Tolerant>, VersionCount), b: &(Option<Tolerant>, VersionCount)) -> bool {
    match (&a.0, &b.0) {
        (Some(va), Some(vb)) => match va.compare(vb) {
            Some(Ordering::Less) => true,
            Some(Ordering::Equal) => a.1.version < b.1.version,
            Some(Ordering::Greater) | None => false,
        },
        // Versions that parse come before ones that do not.
        (Some(_), None) => true,
        (None, Some(_)) => false,
        (None, None) => a.1.version < b.1.version,
    }
}

/// A version parsed as Go's `semver.ParseTolerant` does: surrounding space
/// and a leading `v` dropped, leading zeros dropped, `1.2` read as `1.2.0`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tolerant(semver::Version);

impl Tolerant {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts: Vec<String> = text.splitn(3, '.').map(str::to_string).collect();
        for part in &mut parts {
            if part.len() > 1 {
                let trimmed = part.trim_start_matches('0');
                *part = if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                    trimmed.to_string()
                } else {
                    format!("0{trimmed}")
                };
            }
        }
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
                return None;
            }
            parts.resize(3, "0".to_string());
        }
        semver::Version::parse(&parts.join(".")).ok().map(Tolerant)
    }

    /// Precedence with build metadata (Cluster API's `Compare` with
    /// `WithBuildTags`); `None` when the build metadata differs in
    /// identifiers that cannot be ordered.
    fn compare(&self, other: &Self) -> Option<Ordering> {
        let (a, b) = (&self.0, &other.0);
        let core = (a.major, a.minor, a.patch, &a.pre).cmp(&(b.major, b.minor, b.patch, &b.pre));
        if core != Ordering::Equal {
            return Some(core);
        }
        let ids = |v: &semver::Version| -> Vec<String> {
            if v.build.is_empty() {
                Vec::new()
            } else {
                v.build.as_str().split('.').map(str::to_string).collect()
            }
        };
        let (ia, ib) = (ids(a), ids(b));
        for (x, y) in ia.iter().zip(&ib) {
            match build_identifier_order(x, y) {
                Some(Ordering::Equal) => continue,
                other => return other,
            }
        }
        // Equal so far: the longer build metadata is greater.
        Some(ia.len().cmp(&ib.len()))
    }
}

/// Numeric identifiers compare as numbers and come before others; two
/// different non-numeric ones (a commit hash, say) do not compare.
fn build_identifier_order(x: &str, y: &str) -> Option<Ordering> {
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match (numeric(x), numeric(y)) {
        (true, false) => Some(Ordering::Less),
        (false, true) => Some(Ordering::Greater),
        (true, true) => {
            // As Go's ParseUint: an out-of-range number reads as the largest.
            let n = |s: &str| s.parse::<u64>().unwrap_or(u64::MAX);
            Some(n(x).cmp(&n(y)))
        }
        (false, false) if x == y => Some(Ordering::Equal),
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine<'a>(created: i64, name: &'a str, spec: &'a str) -> MachineVersion<'a> {
        MachineVersion {
            created,
            name,
            kubelet: None,
            spec: Some(spec),
        }
    }

    fn listed(counts: &[VersionCount]) -> Vec<(&str, i32)> {
        counts
            .iter()
            .map(|c| (c.version.as_str(), c.replicas))
            .collect()
    }

    #[test]
    fn versions_are_counted_and_listed_lowest_first() {
        let got = aggregate(vec![
            machine(3, "c", "v1.31.0"),
            machine(1, "a", "v1.30.2"),
            machine(2, "b", "v1.31.0"),
            machine(4, "d", "v1.30.10"),
        ]);
        assert_eq!(
            listed(&got),
            [("v1.30.2", 1), ("v1.30.10", 1), ("v1.31.0", 2)]
        );
    }

    #[test]
    fn the_nodes_kubelet_version_outranks_the_spec() {
        let mut m = machine(1, "a", "v1.31.0");
        m.kubelet = Some("v1.30.2");
        let mut empty = machine(2, "b", "v1.31.0");
        empty.kubelet = Some("");
        let got = aggregate(vec![m, empty]);
        assert_eq!(listed(&got), [("v1.30.2", 1), ("v1.31.0", 1)]);
    }

    #[test]
    fn machines_without_a_version_are_not_listed() {
        let none = MachineVersion {
            created: 1,
            name: "a",
            kubelet: None,
            spec: None,
        };
        assert!(aggregate(vec![none, machine(2, "b", "")]).is_empty());
        assert!(aggregate(Vec::new()).is_empty());
    }

    #[test]
    fn build_metadata_orders_numbers_first_and_leaves_hashes_in_creation_order() {
        // Cluster API's examples: `+1` before `+2`, numbers before words,
        // two different words in the order the oldest Machines showed them.
        let got = aggregate(vec![
            machine(1, "a", "v1.31.0+def"),
            machine(2, "b", "v1.31.0+abc"),
            machine(3, "c", "v1.31.0+2"),
            machine(4, "d", "v1.31.0+1"),
            machine(5, "e", "v1.31.0"),
        ]);
        assert_eq!(
            listed(&got),
            [
                ("v1.31.0", 1),
                ("v1.31.0+1", 1),
                ("v1.31.0+2", 1),
                ("v1.31.0+def", 1),
                ("v1.31.0+abc", 1),
            ]
        );
    }

    #[test]
    fn equal_versions_written_differently_order_by_text_and_unparsed_ones_go_last() {
        let got = aggregate(vec![
            machine(1, "a", "not-a-version"),
            machine(2, "b", "v1.31.0"),
            machine(3, "c", "1.31"),
            machine(4, "d", "another"),
        ]);
        assert_eq!(
            listed(&got),
            [
                ("1.31", 1),
                ("v1.31.0", 1),
                ("another", 1),
                ("not-a-version", 1)
            ]
        );
    }

    #[test]
    fn pre_releases_come_before_their_release() {
        let got = aggregate(vec![
            machine(1, "a", "v1.31.0"),
            machine(2, "b", "v1.31.0-rc.1"),
            machine(3, "c", "v1.31.0-alpha.2"),
        ]);
        assert_eq!(
            listed(&got),
            [("v1.31.0-alpha.2", 1), ("v1.31.0-rc.1", 1), ("v1.31.0", 1)]
        );
    }

    #[test]
    fn a_hostile_nodes_versions_are_bounded() {
        let long = format!("v1.31.0+{}", "a".repeat(MAX_VERSION_LEN));
        let names: Vec<String> = (0..150).map(|i| format!("m{i:03}")).collect();
        let versions: Vec<String> = (0..150).map(|i| format!("v1.{i}.0")).collect();
        let mut machines: Vec<MachineVersion<'_>> = names
            .iter()
            .zip(&versions)
            .enumerate()
            .map(|(i, (n, v))| machine(i as i64, n, v))
            .collect();
        let mut hostile = machine(0, "hostile", "v1.0.0");
        hostile.kubelet = Some(&long);
        machines.push(hostile);
        let got = aggregate(machines);
        assert_eq!(got.len(), MAX_VERSIONS);
        assert!(got.iter().all(|c| c.version.len() <= MAX_VERSION_LEN));
        assert_eq!(got[0].version, "v1.0.0");
        assert_eq!(got[99].version, "v1.99.0");
    }

    #[test]
    fn tolerant_parsing_reads_what_go_reads() {
        let v = |s: &str| Tolerant::parse(s).map(|t| t.0.to_string());
        assert_eq!(v(" v1.31 ").as_deref(), Some("1.31.0"));
        assert_eq!(v("v01.02.03").as_deref(), Some("1.2.3"));
        assert_eq!(v("1").as_deref(), Some("1.0.0"));
        assert_eq!(v("v1.31+k3s1"), None);
        assert_eq!(v("v1.31.2+k3s1").as_deref(), Some("1.31.2+k3s1"));
        assert_eq!(v("latest"), None);
    }

    proptest::proptest! {
        /// Any versions at all, as a hostile kubelet might report: no
        /// panic, every Machine with a short enough version counted once.
        #[test]
        fn any_versions_are_counted_without_panicking(
            versions in proptest::collection::vec("(v?[0-9]{1,2}(\\.[0-9]{1,2}){0,2}(-[a-z0-9.]{1,4})?(\\+[a-z0-9.]{1,4})?|[a-z]{0,3})", 0..40)
        ) {
            let names: Vec<String> = (0..versions.len()).map(|i| format!("m{i}")).collect();
            let machines = versions
                .iter()
                .zip(&names)
                .map(|(v, n)| machine(0, n, v))
                .collect();
            let got = aggregate(machines);
            let counted: i32 = got.iter().map(|c| c.replicas).sum();
            let expected = versions.iter().filter(|v| !v.is_empty()).count() as i32;
            proptest::prop_assert_eq!(counted, expected);
        }
    }
}
