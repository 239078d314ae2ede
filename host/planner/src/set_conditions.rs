//! The Cluster API v1beta2 conditions of a MachineSet or MachineDeployment,
//! from a summary of its Machines: `MachinesReady`, `MachinesUpToDate`,
//! `ScalingUp`, `ScalingDown`, `Remediating`, `Deleting`, `Paused` and,
//! for a deployment, `RollingOut` (types and reasons as Cluster API's
//! `machinedeployment_types.go` and `machineset_types.go` name them), so
//! alerts and `kubectl wait --for=condition=…` written for Cluster API work
//! unchanged. `Available` stays with the controllers (it depends on the
//! rollout strategy).

/// What the conditions are derived from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// `spec.replicas`.
    pub desired: i32,
    /// Machines that exist and are not being deleted.
    pub current: i32,
    /// Names of those whose `Ready` is not `True`.
    pub not_ready: Vec<String>,
    /// Names of those whose `UpToDate` is not `True`.
    pub not_up_to_date: Vec<String>,
    /// Names of those a health check marked for remediation
    /// (`OwnerRemediated=False`).
    pub remediating: Vec<String>,
    /// The object is being deleted.
    pub deleting: bool,
    /// The object is paused.
    pub paused: bool,
    /// A deployment (it also has `RollingOut`).
    pub deployment: bool,
}

/// One condition to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    /// Its type.
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: &'static str,
    /// Its reason.
    pub reason: &'static str,
    /// Its message (empty when there is nothing to add).
    pub message: String,
}

/// `Machines a, b and 3 more`.
fn named(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut sorted = names.to_vec();
    sorted.sort();
    let shown = sorted
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match sorted.len() {
        1 => format!("Machine {shown}"),
        n if n > SHOWN => format!("Machines {shown} and {} more", n - SHOWN),
        _ => format!("Machines {shown}"),
    }
}

fn cond(
    type_: &'static str,
    on: bool,
    reasons: (&'static str, &'static str),
    message: String,
) -> Cond {
    Cond {
        type_,
        status: if on { "True" } else { "False" },
        reason: if on { reasons.0 } else { reasons.1 },
        message,
    }
}

/// The conditions, in a fixed order.
pub fn conditions(s: &Summary) -> Vec<Cond> {
    let mut out = vec![];
    let aggregate = |type_: &'static str,
                     (good, bad): (&'static str, &'static str),
                     failing: &[String],
                     what: &str| {
        if s.current == 0 {
            return Cond {
                type_,
                status: "True",
                reason: "NoReplicas",
                message: String::new(),
            };
        }
        if failing.is_empty() {
            Cond {
                type_,
                status: "True",
                reason: good,
                message: String::new(),
            }
        } else {
            let verb = if failing.len() == 1 { "is" } else { "are" };
            Cond {
                type_,
                status: "False",
                reason: bad,
                message: format!("{} {verb} not {what}", named(failing)),
            }
        }
    };
    out.push(aggregate(
        "MachinesReady",
        ("Ready", "NotReady"),
        &s.not_ready,
        "Ready",
    ));
    out.push(aggregate(
        "MachinesUpToDate",
        ("UpToDate", "NotUpToDate"),
        &s.not_up_to_date,
        "up to date",
    ));
    if s.deployment {
        let rolling = !s.not_up_to_date.is_empty();
        let message = if rolling {
            format!("rolling out: {} not up to date", named(&s.not_up_to_date))
        } else {
            String::new()
        };
        out.push(cond(
            "RollingOut",
            rolling,
            ("RollingOut", "NotRollingOut"),
            message,
        ));
    }
    let up = s.current < s.desired;
    out.push(cond(
        "ScalingUp",
        up,
        ("ScalingUp", "NotScalingUp"),
        if up {
            format!("scaling up from {} to {} replicas", s.current, s.desired)
        } else {
            String::new()
        },
    ));
    let down = s.current > s.desired;
    out.push(cond(
        "ScalingDown",
        down,
        ("ScalingDown", "NotScalingDown"),
        if down {
            format!("scaling down from {} to {} replicas", s.current, s.desired)
        } else {
            String::new()
        },
    ));
    let remediating = !s.remediating.is_empty();
    out.push(cond(
        "Remediating",
        remediating,
        ("Remediating", "NotRemediating"),
        if remediating {
            let verb = if s.remediating.len() == 1 {
                "is"
            } else {
                "are"
            };
            format!("{} {verb} being remediated", named(&s.remediating))
        } else {
            String::new()
        },
    ));
    out.push(cond(
        "Deleting",
        s.deleting,
        ("Deleting", "NotDeleting"),
        String::new(),
    ));
    out.push(cond(
        "Paused",
        s.paused,
        ("Paused", "NotPaused"),
        String::new(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(cs: &'a [Cond], t: &str) -> &'a Cond {
        cs.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_steady_deployment_is_ready_up_to_date_and_idle() {
        let cs = conditions(&Summary {
            desired: 2,
            current: 2,
            deployment: true,
            ..Summary::default()
        });
        let shown: Vec<(&str, &str, &str)> =
            cs.iter().map(|c| (c.type_, c.status, c.reason)).collect();
        assert_eq!(
            shown,
            [
                ("MachinesReady", "True", "Ready"),
                ("MachinesUpToDate", "True", "UpToDate"),
                ("RollingOut", "False", "NotRollingOut"),
                ("ScalingUp", "False", "NotScalingUp"),
                ("ScalingDown", "False", "NotScalingDown"),
                ("Remediating", "False", "NotRemediating"),
                ("Deleting", "False", "NotDeleting"),
                ("Paused", "False", "NotPaused"),
            ]
        );
    }

    #[test]
    fn each_condition_says_which_machines_and_how_many() {
        let names = |n: usize| (0..n).map(|i| format!("m{i}")).collect::<Vec<_>>();
        let cs = conditions(&Summary {
            desired: 5,
            current: 3,
            not_ready: names(1),
            not_up_to_date: names(5),
            remediating: names(2),
            deleting: true,
            paused: true,
            deployment: true,
        });
        assert_eq!(
            find(&cs, "MachinesReady").message,
            "Machine m0 is not Ready"
        );
        assert_eq!(
            find(&cs, "MachinesUpToDate").message,
            "Machines m0, m1, m2 and 2 more are not up to date"
        );
        assert_eq!(find(&cs, "RollingOut").status, "True");
        assert_eq!(
            find(&cs, "ScalingUp").message,
            "scaling up from 3 to 5 replicas"
        );
        assert_eq!(find(&cs, "ScalingDown").status, "False");
        assert_eq!(
            find(&cs, "Remediating").message,
            "Machines m0, m1 are being remediated"
        );
        assert_eq!(find(&cs, "Deleting").reason, "Deleting");
        assert_eq!(find(&cs, "Paused").reason, "Paused");
        // A set has no RollingOut; an empty one has no replicas to judge.
        let empty = conditions(&Summary::default());
        assert!(empty.iter().all(|c| c.type_ != "RollingOut"));
        assert_eq!(find(&empty, "MachinesReady").reason, "NoReplicas");
    }
}
