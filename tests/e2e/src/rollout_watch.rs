//! Watching a rollout's bounds: every Machine change in a namespace is
//! recorded, with the most machines and the fewest "good" ones (Ready,
//! available, whatever the test judges) any state had, so a test can assert
//! `maxSurge` / `maxUnavailable` held at every step, not just at the end.

use capstan_api::Machine;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What the watch has seen so far.
#[derive(Debug)]
pub struct Extremes {
    /// The machines as of the last event.
    pub machines: BTreeMap<String, Machine>,
    /// The most machines at once (counting ones being deleted).
    pub max_total: usize,
    /// The fewest machines the judge called good at once.
    pub min_good: usize,
    /// States seen after the first full listing.
    pub states: usize,
    listed: bool,
}

/// Start watching the Machines of `namespace`; `good` judges each machine.
/// Abort the returned task to stop.
pub fn watch(
    client: kube::Client,
    namespace: &str,
    good: fn(&Machine) -> bool,
) -> (Arc<Mutex<Extremes>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Extremes {
        machines: BTreeMap::new(),
        max_total: 0,
        min_good: usize::MAX,
        states: 0,
        listed: false,
    }));
    let api: Api<Machine> = Api::namespaced(client, namespace);
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let mut o = sink.lock().expect("extremes lock");
            match event {
                watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                    o.machines.insert(m.name_any(), m);
                }
                watcher::Event::Delete(m) => {
                    o.machines.remove(&m.name_any());
                }
                watcher::Event::Init => {
                    o.machines.clear();
                    o.listed = false;
                }
                watcher::Event::InitDone => o.listed = true,
            }
            if o.listed {
                let total = o.machines.len();
                let count = o.machines.values().filter(|m| good(m)).count();
                o.max_total = o.max_total.max(total);
                o.min_good = o.min_good.min(count);
                o.states += 1;
            }
        }
    });
    (seen, task)
}
