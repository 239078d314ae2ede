//! What happened when, across the cloud and its kubelet, for tests that
//! assert an order ("every pod was gone before the instance was deleted").
//! `GET /admin/timeline` returns it.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// One recorded moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Moment {
    /// Order of recording (ties in time are ordered by this).
    pub seq: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// `instance-delete-requested`, `instance-update-started` (subject:
    /// instance id) or `pod-removed`
    /// (subject: `namespace/name`, recorded before the kubelet's DELETE is
    /// sent, so anything reacting to the pod's absence comes after it).
    pub event: String,
    /// What it happened to.
    pub subject: String,
    /// The Node involved, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A shared, append-only record.
#[derive(Debug, Clone, Default)]
pub struct Timeline(Arc<Mutex<Vec<Moment>>>);

impl Timeline {
    /// Record a moment now.
    pub fn record(&self, event: &str, subject: &str, node: Option<&str>) {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut moments = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let seq = moments.len() as u64;
        moments.push(Moment {
            seq,
            at_ms,
            event: event.to_string(),
            subject: subject.to_string(),
            node: node.map(str::to_string),
        });
    }

    /// Everything so far, in order.
    pub fn moments(&self) -> Vec<Moment> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
