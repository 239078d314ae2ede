//! Capstan's end-to-end tests, as one test binary: every module below runs
//! the real host against real components (kube-apiserver, registries, the
//! simulated cloud, sigstore-js). One binary instead of one per file keeps
//! a fresh build's link time and disk use down; `cargo test -p capstan-e2e
//! supply_chain::` still runs one area.

mod addon_fit;
mod addon_order;
mod addons;
mod autoscaler;
mod bootstrap;
mod canary;
mod controllers;
mod day_two;
mod drain;
mod ec2;
mod healthchecks;
mod http_refusals;
mod image;
mod in_cluster;
mod in_place;
mod interop;
mod join_identity;
mod keyless;
mod node_claims;
mod nodes;
mod oci_plugins;
mod plot;
mod polyglot;
mod quickstart;
mod rbac_floor;
mod ready_instances;
mod real_nodes;
mod restore;
mod rollback;
mod sandbox;
mod status_writes;
mod supply_chain;
mod tape;
mod tenancy;
mod trust;
mod updater;
mod v1beta2;
mod workload_clusters;
mod workloads;

/// Show the in-process controllers' logs (warnings by default, `RUST_LOG`
/// for more) in a failing test's output.
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}
