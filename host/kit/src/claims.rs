//! Machines by the provider ID their status records: an index kept from
//! the shared Machine watch, so that "which machines report this ID" is a
//! lookup, not a scan of every Machine. The Machine controller asks it
//! whether a provider ID is unique before it takes a Node as a Machine's
//! (`capstan_planner::node_claim`), and every Node event finds its
//! machines through it.
//!
//! With a watch filter (sharding) the index holds this shard's Machines
//! only, as the cache does.

use capstan_api::Machine;
use kube::ResourceExt;
use kube::runtime::watcher;
use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

/// A Machine by namespace and name.
pub type MachineKey = (String, String);

/// The index: provider ID → machines, kept current by [`ProviderIds::observe`].
#[derive(Debug, Default)]
pub struct ProviderIds {
    inner: RwLock<Index>,
}

#[derive(Debug, Default)]
struct Index {
    by_id: HashMap<String, BTreeSet<MachineKey>>,
    by_machine: HashMap<MachineKey, String>,
    /// The index being rebuilt while the watch relists.
    relisting: Option<Box<Index>>,
}

impl Index {
    fn put(&mut self, machine: &Machine) {
        let key = key(machine);
        self.remove(&key);
        if let Some(id) = machine.status.as_ref().and_then(|s| s.provider_id.clone()) {
            self.by_id
                .entry(id.clone())
                .or_default()
                .insert(key.clone());
            self.by_machine.insert(key, id);
        }
    }

    fn remove(&mut self, key: &MachineKey) {
        if let Some(id) = self.by_machine.remove(key)
            && let Some(machines) = self.by_id.get_mut(&id)
        {
            machines.remove(key);
            if machines.is_empty() {
                self.by_id.remove(&id);
            }
        }
    }
}

fn key(machine: &Machine) -> MachineKey {
    (machine.namespace().unwrap_or_default(), machine.name_any())
}

impl ProviderIds {
    /// Follow one event of the Machine watch.
    pub fn observe(&self, event: &watcher::Event<Machine>) {
        let mut index = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            watcher::Event::Apply(m) => index.put(m),
            watcher::Event::Delete(m) => index.remove(&key(m)),
            watcher::Event::Init => index.relisting = Some(Box::default()),
            watcher::Event::InitApply(m) => {
                if let Some(fresh) = index.relisting.as_mut() {
                    fresh.put(m);
                }
            }
            watcher::Event::InitDone => {
                if let Some(fresh) = index.relisting.take() {
                    *index = *fresh;
                }
            }
        }
    }

    /// The machines that report `provider_id`.
    pub fn machines(&self, provider_id: &str) -> Vec<MachineKey> {
        let index = self.inner.read().unwrap_or_else(|p| p.into_inner());
        index
            .by_id
            .get(provider_id)
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A machine other than `machine` that reports `provider_id`, if any.
    pub fn another_claimant(&self, provider_id: &str, machine: &Machine) -> Option<MachineKey> {
        let me = key(machine);
        self.machines(provider_id).into_iter().find(|m| *m != me)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{MachineSpec, MachineStatus};

    fn machine(name: &str, id: Option<&str>) -> Machine {
        let mut m = Machine::new(name, MachineSpec::default());
        m.metadata.namespace = Some("default".into());
        m.status = Some(MachineStatus {
            provider_id: id.map(Into::into),
            ..Default::default()
        });
        m
    }

    #[test]
    fn follows_applies_deletions_and_relists() {
        let ids = ProviderIds::default();
        let a = machine("a", Some("sim://1"));
        ids.observe(&watcher::Event::Apply(a.clone()));
        assert_eq!(ids.machines("sim://1").len(), 1);
        assert_eq!(ids.another_claimant("sim://1", &a), None);
        let b = machine("b", Some("sim://1"));
        ids.observe(&watcher::Event::Apply(b.clone()));
        assert_eq!(
            ids.another_claimant("sim://1", &a),
            Some(("default".into(), "b".into()))
        );
        assert!(
            ids.another_claimant("sim://1", &machine("c", None))
                .is_some()
        );
        // b's ID changes: the old entry goes.
        ids.observe(&watcher::Event::Apply(machine("b", Some("sim://2"))));
        assert_eq!(ids.another_claimant("sim://1", &a), None);
        ids.observe(&watcher::Event::Delete(a.clone()));
        assert!(ids.machines("sim://1").is_empty());
        // A relist replaces everything at its end, not before.
        ids.observe(&watcher::Event::Init);
        ids.observe(&watcher::Event::InitApply(machine("d", Some("sim://4"))));
        assert_eq!(ids.machines("sim://2").len(), 1, "still the old view");
        ids.observe(&watcher::Event::InitDone);
        assert!(ids.machines("sim://2").is_empty());
        assert_eq!(
            ids.machines("sim://4"),
            vec![("default".into(), "d".into())]
        );
    }
}
