//! What a MachineSet does when the Machines it created or deleted have not
//! shown in its cache within the expectations' timeout: ask the API server
//! whether the cache lags (then wait) or was right (then scale on it).
//! Start at [`settle_overdue`]; the decision is
//! [`capstan_kit::Expectations::settle`].

use super::Context;
use capstan_api::{Machine, MachineSet};
use capstan_kit::{Error, Seen, key_of, kube_err};
use kube::api::Api;
use std::collections::HashMap;
use std::time::Duration;

/// Ask the API server (consistent reads, one Machine at a time) about
/// creates and deletes the cache has not shown within the expectations'
/// timeout. `Some(wait)`: the cache lags what the API server shows, and
/// scaling on it would create or delete twice; `None`: the cache is right
/// (a create that failed, or a Machine gone before the cache saw it).
/// Reads stop at the first Machine that shows the cache lags, so an
/// overloaded API server gets a few GETs, never a list of the whole set
/// (a list of 5,000 Machines timed out at 60 s in a 10,000-machine run).
pub(super) async fn settle_overdue(
    ctx: &Context,
    machines_api: &Api<Machine>,
    set: &MachineSet,
    uid: &str,
    cached: impl Fn(&str) -> Seen,
) -> Result<Option<Duration>, Error> {
    let (created, deleted) = ctx.expectations.unseen(uid);
    let mut live: HashMap<String, Seen> = HashMap::new();
    let asked = created
        .iter()
        .map(|n| (n, Seen::Absent))
        .chain(deleted.iter().map(|n| (n, Seen::Present)));
    for (name, as_cached) in asked {
        let machine = machines_api.get_opt(name).await.map_err(kube_err(format!(
            "read Machine {name} of MachineSet {}",
            key_of(set)
        )))?;
        let seen = Seen::of(machine.as_ref().map(|m| &m.metadata));
        let lags = match as_cached {
            Seen::Absent => seen != Seen::Absent,
            _ => seen != Seen::Present,
        };
        live.insert(name.clone(), seen);
        if lags {
            break;
        }
    }
    let lagging = ctx
        .expectations
        .settle(uid, cached, |n| live.get(n).copied());
    if lagging == 0 {
        return Ok(None);
    }
    tracing::warn!(
        set = %key_of(set),
        lagging,
        "the cache lags the API server: Machines this set created or deleted over a minute ago \
         are not shown yet; scaling waits for them"
    );
    Ok(Some(Duration::from_secs(5)))
}
