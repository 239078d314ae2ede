//! What `capstan describe` shows, as data, and how it is printed: a tree of
//! rows (a deployment, its sets, their Machines; or an Addon), each with its
//! Ready/Available/UpToDate, phase, age and the first condition that is not
//! True; identical Machines grouped as `clusterctl describe` groups them.
//! Pure: the objects come in, a [`Description`] and its text come out.

use capstan_api::{Addon, Condition, Machine, MachineDeployment, MachineSet, status};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

/// One object in the tree (or a group of identical Machines).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// `MachineDeployment/pool`, or `3 Machines...` for a group.
    pub name: String,
    pub ready: String,
    pub available: String,
    pub up_to_date: String,
    /// The object's phase, where it has one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// Seconds since the object was made.
    pub age_seconds: i64,
    /// The first condition that is False (else Unknown): its type and
    /// reason, and its message.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Lines under the row: the Node, the provider ID, the serving plugin
    /// revision and its signer, a set's revision.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// Every condition (printed with `--show-conditions all`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Machines a group stands for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Row>,
}

/// An Event of an object in the tree, as `kubectl describe` lists them.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventLine {
    pub age_seconds: i64,
    pub type_: String,
    pub reason: String,
    pub object: String,
    pub message: String,
}

/// What `describe` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Description {
    pub tree: Row,
    pub events: Vec<EventLine>,
}

/// How the text is printed.
#[derive(Debug, Clone, Default)]
pub struct Style {
    /// The kinds (lower case, or `all`) whose rows list every condition,
    /// not just the first that is not True.
    pub show_conditions: Vec<String>,
    /// ANSI colours (only on a terminal).
    pub color: bool,
}

impl Style {
    fn all_conditions(&self, row: &Row) -> bool {
        let kind = row
            .name
            .split('/')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        self.show_conditions.iter().any(|k| {
            k == "all" || *k == kind || row.name.ends_with("Machines...") && k == "machine"
        })
    }
}

/// The conditions read first when looking for what is wrong, before the
/// rest in the order the object lists them.
const FIRST: [&str; 4] = ["Ready", "Available", "UpToDate", "Progressing"];

/// Conditions whose `True` is the news (Cluster API v1beta2's negative
/// polarity): a deployment `RollingOut`, a Machine `Deleting`, an Addon
/// with an update available.
const NEGATIVE: [&str; 9] = [
    "RollingOut",
    "ScalingUp",
    "ScalingDown",
    "Remediating",
    "Deleting",
    "Paused",
    "Updating",
    "UpdateAvailable",
    "RolledBack",
];

/// The first condition that says something is not as wanted (`False`, or
/// `True` for a negative one), else the first `Unknown`: (`Type: Reason`,
/// message).
fn first_not_true(conditions: &[Condition]) -> (String, String) {
    let ordered = FIRST
        .iter()
        .filter_map(|t| conditions.iter().find(|c| c.type_ == *t))
        .chain(
            conditions
                .iter()
                .filter(|c| !FIRST.contains(&c.type_.as_str())),
        );
    let ordered: Vec<&Condition> = ordered.collect();
    let off = |c: &&&Condition| {
        let bad = if NEGATIVE.contains(&c.type_.as_str()) {
            status::TRUE
        } else {
            status::FALSE
        };
        c.status == bad
    };
    ordered
        .iter()
        .find(off)
        .or_else(|| ordered.iter().find(|c| c.status == status::UNKNOWN))
        .map(|c| (format!("{}: {}", c.type_, c.reason), c.message.clone()))
        .unwrap_or_default()
}

pub(super) fn state(conditions: &[Condition], type_: &str) -> String {
    capstan_api::condition(conditions, type_)
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "-".into())
}

fn age(meta: &kube::api::ObjectMeta, now: Timestamp) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map_or(0, |t| (now.as_second() - t.0.as_second()).max(0))
}

pub(super) fn row(
    name: String,
    conditions: &[Condition],
    meta: &kube::api::ObjectMeta,
    now: Timestamp,
) -> Row {
    let (reason, message) = first_not_true(conditions);
    Row {
        name,
        ready: String::new(),
        available: String::new(),
        up_to_date: String::new(),
        phase: String::new(),
        age_seconds: age(meta, now),
        reason,
        message,
        details: vec![],
        conditions: conditions.to_vec(),
        members: vec![],
        children: vec![],
    }
}

/// A Machine's row: its conditions, phase, Node and serving plugin.
pub fn machine_row(m: &Machine, now: Timestamp) -> Row {
    let s = m.status.clone().unwrap_or_default();
    let mut r = row(
        format!("Machine/{}", m.name_any()),
        &s.conditions,
        &m.metadata,
        now,
    );
    r.ready = state(&s.conditions, "Ready");
    r.available = state(&s.conditions, "Available");
    r.up_to_date = state(&s.conditions, "UpToDate");
    r.phase = s.phase.map(|p| format!("{p:?}")).unwrap_or_default();
    if m.metadata.deletion_timestamp.is_some() {
        r.phase = "Deleting".into();
    }
    let mut where_ = vec![];
    match &s.node_ref {
        Some(node) => where_.push(format!("node {}", node.name)),
        None => where_.push("no Node yet".into()),
    }
    if let Some(id) = s.provider_id.as_ref().or(m.spec.provider_id.as_ref()) {
        where_.push(format!("providerID {id}"));
    }
    r.details.push(where_.join(", "));
    r.details.push(plugin_line(
        m.instance_plugin(),
        s.plugin_digest.as_deref(),
        s.plugin_signer.as_deref(),
    ));
    r
}

/// `plugin NAME@sha256:0123456789ab, signed by SIGNER`.
fn plugin_line(plugin: &str, digest: Option<&str>, signer: Option<&str>) -> String {
    let digest = digest.map_or_else(String::new, |d| format!("@{}", d.get(..19).unwrap_or(d)));
    let signer = match (signer, digest.is_empty()) {
        (_, true) => String::new(),
        (Some(s), false) => format!(", signed by {s}"),
        (None, false) => ", unsigned".into(),
    };
    format!("plugin {plugin}{digest}{signer}")
}

pub(super) fn count(have: i32, want: i32) -> String {
    format!("{have}/{want}")
}

/// A MachineSet's row, with its Machines (grouped when `grouping`).
pub fn set_row(ms: &MachineSet, machines: &[Machine], grouping: bool, now: Timestamp) -> Row {
    let s = ms.status.clone().unwrap_or_default();
    let mut r = row(
        format!("MachineSet/{}", ms.name_any()),
        &s.conditions,
        &ms.metadata,
        now,
    );
    let want = ms.spec.replicas;
    r.ready = count(s.ready_replicas, want);
    r.available = count(s.available_replicas, want);
    r.up_to_date = count(s.up_to_date_replicas, want);
    if let Some(rev) = ms.annotations().get(capstan_api::ANNOTATION_REVISION) {
        r.details.push(format!("revision {rev}"));
    }
    let mut own: Vec<&Machine> = machines
        .iter()
        .filter(|m| owned_by(&m.metadata, ms.uid().as_deref()))
        .collect();
    own.sort_by_key(|m| m.name_any());
    let rows = own.into_iter().map(|m| machine_row(m, now)).collect();
    r.children = if grouping { group(rows) } else { rows };
    r
}

/// A MachineDeployment's row, with its sets (newest revision first).
pub fn deployment_row(
    md: &MachineDeployment,
    sets: &[MachineSet],
    machines: &[Machine],
    grouping: bool,
    now: Timestamp,
) -> Row {
    let s = md.status.clone().unwrap_or_default();
    let mut r = row(
        format!("MachineDeployment/{}", md.name_any()),
        &s.conditions,
        &md.metadata,
        now,
    );
    let want = md.spec.replicas;
    r.ready = count(s.ready_replicas, want);
    r.available = count(s.available_replicas, want);
    r.up_to_date = count(s.up_to_date_replicas, want);
    r.phase = s.phase.map(|p| format!("{p:?}")).unwrap_or_default();
    if md.spec.paused {
        r.details
            .push("paused: rollouts wait for `capstan rollout resume`".into());
    }
    if let Some(rev) = s.revision {
        r.details.push(format!("revision {rev}"));
    }
    let mut own: Vec<&MachineSet> = sets
        .iter()
        .filter(|ms| owned_by(&ms.metadata, md.uid().as_deref()))
        .collect();
    own.sort_by_key(|ms| std::cmp::Reverse(revision(ms)));
    r.children = own
        .into_iter()
        .map(|ms| set_row(ms, machines, grouping, now))
        .collect();
    r
}

/// An Addon's row: Applied, Healthy and UpToDate, the version and target,
/// and the serving plugin.
pub fn addon_row(addon: &Addon, now: Timestamp) -> Row {
    let s = addon.status.clone().unwrap_or_default();
    let mut r = row(
        format!("Addon/{}", addon.name_any()),
        &s.conditions,
        &addon.metadata,
        now,
    );
    r.ready = state(&s.conditions, "Applied");
    r.available = state(&s.conditions, "Healthy");
    r.up_to_date = state(&s.conditions, "UpToDate");
    r.phase = s.phase.clone().unwrap_or_default();
    let version = s.version.as_deref().unwrap_or("none yet");
    let target = s.target.as_deref().unwrap_or("this cluster");
    r.details.push(format!(
        "version {version}, target {target}, {} objects applied",
        s.inventory.len()
    ));
    r.details.push(plugin_line(
        &addon.spec.plugin,
        s.plugin_digest.as_deref(),
        s.plugin_signer.as_deref(),
    ));
    r
}

fn revision(ms: &MachineSet) -> i64 {
    ms.annotations()
        .get(capstan_api::ANNOTATION_REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub(super) fn owned_by(meta: &kube::api::ObjectMeta, owner: Option<&str>) -> bool {
    owner.is_some_and(|uid| meta.owner_references.iter().flatten().any(|o| o.uid == uid))
}

/// Machines alike in every column (states, phase, what is wrong, the
/// plugin revision serving them) become one row, as clusterctl groups them;
/// a Machine unlike its siblings keeps its own row.
pub fn group(rows: Vec<Row>) -> Vec<Row> {
    let key = |r: &Row| {
        (
            r.ready.clone(),
            r.available.clone(),
            r.up_to_date.clone(),
            r.phase.clone(),
            r.reason.clone(),
            r.message.clone(),
            r.details.get(1).cloned(),
        )
    };
    let mut groups: Vec<(_, Vec<Row>)> = vec![];
    for r in rows {
        let k = key(&r);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(r),
            None => groups.push((k, vec![r])),
        }
    }
    groups
        .into_iter()
        .map(|(_, mut members)| {
            if members.len() == 1 {
                return members.remove(0);
            }
            let first = &members[0];
            Row {
                name: format!("{} Machines...", members.len()),
                age_seconds: members.iter().map(|m| m.age_seconds).min().unwrap_or(0),
                details: first.details.get(1).cloned().into_iter().collect(),
                conditions: vec![],
                members: members
                    .iter()
                    .map(|m| m.name.trim_start_matches("Machine/").to_string())
                    .collect(),
                children: vec![],
                ..first.clone()
            }
        })
        .collect()
}

/// `5s`, `3m`, `2h`, `4d`, as kubectl prints ages.
pub fn age_text(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn paint(text: &str, cell: &str, color: bool) -> String {
    let code = match cell {
        "True" => "32",
        "False" => "31",
        "Unknown" => "33",
        _ => return text.to_string(),
    };
    if color {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// `text` with every control character shown escaped (`\u{1b}`).
pub(crate) fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn printable_row(r: &Row) -> Row {
    let all = |items: &[String]| items.iter().map(|t| printable(t)).collect();
    Row {
        name: printable(&r.name),
        ready: printable(&r.ready),
        available: printable(&r.available),
        up_to_date: printable(&r.up_to_date),
        phase: printable(&r.phase),
        age_seconds: r.age_seconds,
        reason: printable(&r.reason),
        message: printable(&r.message),
        details: all(&r.details),
        conditions: r
            .conditions
            .iter()
            .map(|c| Condition {
                type_: printable(&c.type_),
                status: printable(&c.status),
                reason: printable(&c.reason),
                message: printable(&c.message),
                ..c.clone()
            })
            .collect(),
        members: all(&r.members),
        children: r.children.iter().map(printable_row).collect(),
    }
}

fn printable_description(d: &Description) -> Description {
    Description {
        tree: printable_row(&d.tree),
        events: d
            .events
            .iter()
            .map(|e| EventLine {
                age_seconds: e.age_seconds,
                type_: printable(&e.type_),
                reason: printable(&e.reason),
                object: printable(&e.object),
                message: printable(&e.message),
            })
            .collect(),
    }
}

/// The tree and the Events as text.
pub fn render(d: &Description, style: &Style) -> String {
    // Names, reasons, messages and Events are written by plugins, tenants
    // and kubelets: their control characters (a terminal's escape
    // sequences, newlines that would break the tree) are shown, not sent.
    let d = &printable_description(d);
    let mut lines: Vec<[String; 7]> = vec![];
    let mut extra: Vec<(usize, Vec<String>)> = vec![];
    walk(&d.tree, "", "", style, &mut lines, &mut extra);
    let header = [
        "NAME",
        "READY",
        "AVAILABLE",
        "UP-TO-DATE",
        "PHASE",
        "AGE",
        "REASON",
    ];
    let widths: Vec<usize> = (0..7)
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let cell = |i: usize, text: &str| {
        let pad = widths[i].saturating_sub(text.chars().count());
        let painted = if (1..=3).contains(&i) {
            paint(text, text, style.color)
        } else {
            text.to_string()
        };
        format!("{painted}{}", " ".repeat(pad))
    };
    let mut out = String::new();
    let head: Vec<String> = (0..7).map(|i| cell(i, header[i])).collect();
    out.push_str(head.join("  ").trim_end());
    out.push('\n');
    for (n, l) in lines.iter().enumerate() {
        let cols: Vec<String> = (0..7).map(|i| cell(i, &l[i])).collect();
        out.push_str(cols.join("  ").trim_end());
        out.push('\n');
        for (_, more) in extra.iter().filter(|(at, _)| *at == n) {
            for m in more {
                out.push_str(m);
                out.push('\n');
            }
        }
    }
    out.push_str("\nEvents:");
    if d.events.is_empty() {
        out.push_str(" <none>\n");
        return out;
    }
    out.push('\n');
    for e in &d.events {
        out.push_str(&format!(
            "  {:<6} {:<8} {:<28} {:<40} {}\n",
            age_text(e.age_seconds),
            e.type_,
            e.reason,
            e.object,
            e.message
        ));
    }
    out
}

/// Longest message shown in the tree (the whole message is in
/// `--output json`, and under the row with `--show-conditions all`).
const MESSAGE_WIDTH: usize = 160;

fn walk(
    r: &Row,
    first: &str,
    rest: &str,
    style: &Style,
    lines: &mut Vec<[String; 7]>,
    extra: &mut Vec<(usize, Vec<String>)>,
) {
    let at = lines.len();
    lines.push([
        format!("{first}{}", r.name),
        r.ready.clone(),
        r.available.clone(),
        r.up_to_date.clone(),
        r.phase.clone(),
        age_text(r.age_seconds),
        r.reason.clone(),
    ]);
    let bar = if r.children.is_empty() { "  " } else { "│ " };
    let mut more: Vec<String> = r
        .details
        .iter()
        .map(|d| format!("{rest}{bar}  {d}"))
        .collect();
    if !r.members.is_empty() {
        more.push(format!("{rest}{bar}  see {}", r.members.join(", ")));
    }
    if !r.message.is_empty() {
        let message: String = r.message.chars().take(MESSAGE_WIDTH).collect();
        let cut = if r.message.chars().count() > MESSAGE_WIDTH {
            "…"
        } else {
            ""
        };
        more.push(format!("{rest}{bar}  {message}{cut}"));
    }
    if style.all_conditions(r) {
        for c in &r.conditions {
            // Green is fine and red is not, whichever way a condition reads.
            let fine = match (NEGATIVE.contains(&c.type_.as_str()), c.status.as_str()) {
                (true, "True") => status::FALSE,
                (true, "False") => status::TRUE,
                (_, other) => other,
            };
            let status = paint(&c.status, fine, style.color);
            let message = if c.message.is_empty() {
                String::new()
            } else {
                format!(": {}", c.message)
            };
            more.push(format!(
                "{rest}{bar}  · {} {status} {}{message}",
                c.type_, c.reason
            ));
        }
    }
    extra.push((at, more));
    for (i, child) in r.children.iter().enumerate() {
        let last = i + 1 == r.children.len();
        let (branch, next) = if last {
            ("└─", "  ")
        } else {
            ("├─", "│ ")
        };
        walk(
            child,
            &format!("{rest}{branch}"),
            &format!("{rest}{next}"),
            style,
            lines,
            extra,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{MachinePhase, MachineStatus, NodeRef};

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
            last_transition_time: capstan_api::Time(Timestamp::UNIX_EPOCH),
        }
    }

    fn machine(name: &str, ready: &str, node: Option<&str>) -> Machine {
        let mut m = Machine::new(name, Default::default());
        m.metadata.uid = Some(format!("uid-{name}"));
        m.status = Some(MachineStatus {
            phase: Some(MachinePhase::Running),
            node_ref: node.map(|n| NodeRef {
                name: n.into(),
                uid: None,
            }),
            plugin_digest: Some(format!("sha256:{}", "ab".repeat(32))),
            plugin_signer: Some("publisher".into()),
            conditions: vec![
                condition(
                    "Ready",
                    ready,
                    if ready == "True" {
                        "Ready"
                    } else {
                        "NodeNotReady"
                    },
                    if ready == "True" {
                        ""
                    } else {
                        "kubelet stopped posting"
                    },
                ),
                condition("Available", ready, "x", ""),
                condition("UpToDate", "True", "UpToDate", ""),
            ],
            ..Default::default()
        });
        m
    }

    #[test]
    fn a_negative_condition_speaks_when_true() {
        let conditions = vec![
            condition("ScalingUp", "False", "NotScalingUp", ""),
            condition("RollingOut", "True", "RollingOut", "2 machines to go"),
        ];
        assert_eq!(
            first_not_true(&conditions),
            ("RollingOut: RollingOut".into(), "2 machines to go".into())
        );
        assert_eq!(
            first_not_true(&conditions[..1]),
            (String::new(), String::new())
        );
    }

    #[test]
    fn the_first_false_condition_wins_over_an_unknown_one_and_ready_comes_first() {
        let conditions = vec![
            condition("InstanceProvisioned", "Unknown", "Waiting", "w"),
            condition("NodeHealthy", "False", "Unhealthy", "u"),
            condition("Ready", "False", "NodeNotReady", "n"),
        ];
        assert_eq!(
            first_not_true(&conditions),
            ("Ready: NodeNotReady".into(), "n".into())
        );
        assert_eq!(
            first_not_true(&conditions[..1]),
            ("InstanceProvisioned: Waiting".into(), "w".into())
        );
        assert_eq!(first_not_true(&[]), (String::new(), String::new()));
    }

    #[test]
    fn alike_machines_are_grouped_and_the_odd_one_keeps_its_row() {
        let now = Timestamp::UNIX_EPOCH;
        let rows = vec![
            machine_row(&machine("a", "True", Some("a")), now),
            machine_row(&machine("b", "False", Some("b")), now),
            machine_row(&machine("c", "True", Some("c")), now),
        ];
        let grouped = group(rows);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].name, "2 Machines...");
        assert_eq!(grouped[0].members, ["a", "c"]);
        assert_eq!(grouped[1].name, "Machine/b");
        assert_eq!(grouped[1].reason, "Ready: NodeNotReady");
        assert_eq!(grouped[1].details[0], "node b");
        assert!(
            grouped[1].details[1].ends_with("@sha256:abababababab, signed by publisher"),
            "{:?}",
            grouped[1].details
        );
    }

    #[test]
    fn the_text_is_a_tree_with_colour_only_when_asked_and_conditions_when_asked() {
        let now = Timestamp::UNIX_EPOCH;
        let mut set = row("MachineSet/pool-1".into(), &[], &Default::default(), now);
        set.children = group(vec![
            machine_row(&machine("a", "True", Some("a")), now),
            machine_row(&machine("b", "False", None), now),
        ]);
        let mut top = row(
            "MachineDeployment/pool".into(),
            &[],
            &Default::default(),
            now,
        );
        top.children = vec![set];
        let d = Description {
            tree: top,
            events: vec![],
        };
        let plain = render(&d, &Style::default());
        let names: Vec<&str> = plain
            .lines()
            .filter(|l| !l.starts_with(' ') && !l.starts_with('│') && !l.is_empty())
            .map(|l| l.split_whitespace().next().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            [
                "NAME",
                "MachineDeployment/pool",
                "└─MachineSet/pool-1",
                "Events:"
            ],
            "{plain}"
        );
        assert!(plain.contains("  ├─Machine/a"), "{plain}");
        assert!(plain.contains("  └─Machine/b"), "{plain}");
        assert!(plain.contains("no Node yet"), "{plain}");
        assert!(plain.contains("kubelet stopped posting"), "{plain}");
        assert!(!plain.contains('\x1b'), "{plain}");
        assert!(!plain.contains("· UpToDate"), "{plain}");
        let colored = render(
            &d,
            &Style {
                show_conditions: vec!["machine".into()],
                color: true,
            },
        );
        assert!(colored.contains("\x1b[31mFalse\x1b[0m"), "{colored}");
        assert!(colored.contains("· UpToDate"), "{colored}");
    }

    #[test]
    fn control_characters_from_the_cluster_reach_no_terminal() {
        let now = Timestamp::UNIX_EPOCH;
        let mut m = machine("a", "False", Some("a"));
        m.status.as_mut().unwrap().conditions[0].message =
            "\x1b]0;owned\x07\x1b[2J\nfake row".into();
        let d = Description {
            tree: machine_row(&m, now),
            events: vec![EventLine {
                age_seconds: 1,
                type_: "Warning".into(),
                reason: "X\x1b[31m".into(),
                object: "Machine/a".into(),
                message: "\r\u{9b}".into(),
            }],
        };
        let text = render(
            &d,
            &Style {
                show_conditions: vec!["all".into()],
                color: false,
            },
        );
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}[2J\\u{a}fake row"), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("fake row")), "{text}");
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        assert_eq!(age_text(5), "5s");
        assert_eq!(age_text(300), "5m");
        assert_eq!(age_text(3 * 3600), "3h");
        assert_eq!(age_text(5 * 86_400), "5d");
    }
}
