//! [`Conditions`]: sets an object's conditions at one generation and one
//! time, so a status is built with `set(type, status, reason, message)`
//! instead of seven arguments per condition.

use capstan_api::{Condition, Time, status};

/// The conditions of one status being built.
#[derive(Debug)]
pub struct Conditions<'a> {
    list: &'a mut Vec<Condition>,
    generation: Option<i64>,
    now: &'a Time,
}

impl<'a> Conditions<'a> {
    /// Set conditions in `list` as observed at `generation`, `now`.
    pub fn new(list: &'a mut Vec<Condition>, generation: Option<i64>, now: &'a Time) -> Self {
        Conditions {
            list,
            generation,
            now,
        }
    }

    /// Set one condition (its transition time changes only with its status).
    pub fn set(
        &mut self,
        type_: &str,
        status: &str,
        reason: &str,
        message: impl Into<String>,
    ) -> &mut Self {
        capstan_api::set_condition(
            self.list,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
        self
    }

    /// Drop a condition that no longer applies.
    pub fn remove(&mut self, type_: &str) -> &mut Self {
        self.list.retain(|c| c.type_ != type_);
        self
    }

    /// Set `ValidSpec`: `problem` is `Some((reason, message))` when the spec
    /// cannot be acted on, `None` when it is valid.
    pub fn valid_spec(&mut self, problem: Option<(&str, &str)>) -> &mut Self {
        let (state, reason, message) = match problem {
            Some((reason, message)) => (status::FALSE, reason, message),
            None => (status::TRUE, "Valid", ""),
        };
        self.set(
            capstan_api::set_conditions::VALID_SPEC,
            state,
            reason,
            message,
        )
    }

    /// Set `ValidSpec` of a spec that can be acted on: `True`, with reason
    /// `DeprecatedFields` naming the moves when it still uses v1beta1 names.
    pub fn valid_spec_renamed(&mut self, renamed: &[capstan_api::Renamed]) -> &mut Self {
        if renamed.is_empty() {
            return self.valid_spec(None);
        }
        self.set(
            capstan_api::set_conditions::VALID_SPEC,
            status::TRUE,
            DEPRECATED_FIELDS,
            capstan_api::Renamed::message(renamed),
        )
    }
}

/// `ValidSpec`'s reason for a spec that still uses v1beta1 names.
pub const DEPRECATED_FIELDS: &str = "DeprecatedFields";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(200).unwrap());
        let mut list = Vec::new();
        Conditions::new(&mut list, Some(1), &t0).set("Ready", status::FALSE, "Booting", "");
        Conditions::new(&mut list, Some(2), &t1).set("Ready", status::FALSE, "Still", "m");
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, t0);
        assert_eq!(
            (list[0].reason.as_str(), list[0].observed_generation),
            ("Still", Some(2))
        );
        Conditions::new(&mut list, Some(2), &t1)
            .valid_spec(None)
            .set("Ready", status::TRUE, "Up", "");
        assert_eq!(list[0].last_transition_time, t1);
        assert_eq!(list.len(), 2);
    }
}
