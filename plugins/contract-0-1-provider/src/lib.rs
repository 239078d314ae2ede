//! Test fixture: a provider component built against contract 0.1.0 as a
//! plugin of that release was, with wit-bindgen on the frozen 0.1.0 package
//! (`create(machine)`, no bootstrap data). Its instances exist only in the
//! answers: `create` and `get` report `legacy://<uid>` running, `delete` is
//! done. The host must keep loading and calling it, and refuse to create a
//! machine with bootstrap data through it.

#![allow(unsafe_code)] // the generated export glue

wit_bindgen::generate!({
    path: "../../wit/deps/capstan-plugin-0.1.0",
    world: "capstan:plugin/provider-plugin@0.1.0",
});

use capstan::plugin::types::{InstanceState, Machine, MachineStatus, PluginError};
use exports::capstan::plugin::provider::{Deletion, Guest};

capstan_sdk::plugin_manifest!("capstan-plugin.json");

struct Legacy;

fn running(machine: &Machine) -> MachineStatus {
    MachineStatus {
        provider_id: format!("legacy://{}", machine.uid),
        state: InstanceState::Running,
        addresses: Vec::new(),
        failure_domain: machine.failure_domain.clone(),
        version: machine.version.clone(),
        message: None,
    }
}

impl Guest for Legacy {
    fn validate(config: String) -> Result<(), PluginError> {
        if config.trim_start().starts_with('{') {
            Ok(())
        } else {
            Err(PluginError::InvalidConfig(
                "config: must be a JSON object".into(),
            ))
        }
    }
    fn create(machine: Machine) -> Result<MachineStatus, PluginError> {
        Ok(running(&machine))
    }
    fn get(machine: Machine) -> Result<MachineStatus, PluginError> {
        Ok(running(&machine))
    }
    fn delete(_machine: Machine) -> Result<Deletion, PluginError> {
        Ok(Deletion::Done)
    }
    fn list_instances(_config: String) -> Result<Option<Vec<MachineStatus>>, PluginError> {
        Ok(None)
    }
}

export!(Legacy);
