//! Capstan's end-to-end tests, as one test binary: every module below runs
//! the real host against real components (kube-apiserver, registries, the
//! simulated cloud, sigstore-js). One binary instead of one per file keeps
//! a fresh build's link time and disk use down; `cargo test -p capstan-e2e
//! supply_chain::` still runs one area.

mod controllers;
mod interop;
mod nodes;
mod oci_plugins;
mod quickstart;
mod sandbox;
mod supply_chain;
mod updater;
