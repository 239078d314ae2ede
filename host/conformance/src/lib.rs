//! The conformance kit: runs the contract's checks against a provider or an
//! updater plugin and a live target, and reports each check.
//!
//! The provider checks (in order): `validate` accepts the given config and rejects
//! invalid ones with `invalid-config`; `create` with an invalid config is
//! `invalid-config`; `create` returns a provider ID and is idempotent for the
//! same machine uid; `get` after `create` finds the same instance; the instance
//! reaches `running`; `delete` ends in `done`, is idempotent, and is followed
//! by `not-found`; `find-instance` (0.2.0) finds the instance for the
//! machine under a new uid by its tags and by provider ID, `get` then acts
//! on it, another machine's name finds nothing, and a deleted instance is
//! not found; `list-instances` (when supported) no longer shows it; every
//! transient error carries a retry-after. Transient errors are retried as the
//! plugin asks, within the time budget. A provider of contract 0.2.0 gets
//! bootstrap data with `create`, and with a [`UserDataProbe`] (the cloud's
//! own view of the instance) the kit checks that the instance got exactly
//! that data.
//!
//! Start with [`run_provider`] (or [`run_updater`] for the updater world,
//! in [`updater`], and [`run_addon`] for the addon world, in [`addon`]); render the [`Report`] with [`Report::render_text`] or
//! serialize it.

#![forbid(unsafe_code)]

pub mod addon;
pub mod bootstrap;
pub mod updater;

pub use addon::run_addon;
pub use bootstrap::run_bootstrap;
pub use updater::{UpdaterOptions, run_updater};

use capstan_runtime::types::{
    BootstrapData, BootstrapFormat, Deletion, InstanceState, Machine, PluginError,
};
use capstan_runtime::{Error, ProviderPlugin, describe};
use serde::Serialize;
use std::future::Future;
use std::time::{Duration, Instant};

/// What to run the checks with.
#[derive(Debug, Clone)]
pub struct Options {
    /// A valid provider config (JSON object text) for the live target.
    pub config: String,
    /// Configs the plugin must reject with `invalid-config`.
    pub invalid_configs: Vec<String>,
    /// Kubernetes version to put on the test machine.
    pub version: String,
    /// Budget for the whole run (waiting for running, for deletion, retries).
    pub timeout: Duration,
    /// Reads back the user data the cloud launched an instance with.
    pub user_data_probe: Option<UserDataProbe>,
}

/// Reads the user data an instance was launched with, by provider ID, from
/// the cloud's own API (not through the plugin): the bytes, or their base64.
/// It may block; the kit calls it off the async runtime.
#[derive(Clone)]
pub struct UserDataProbe(pub std::sync::Arc<ProbeFn>);

/// The function a [`UserDataProbe`] calls.
pub type ProbeFn = dyn Fn(&str) -> Result<Vec<u8>, String> + Send + Sync + 'static;

impl std::fmt::Debug for UserDataProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserDataProbe")
    }
}

impl Options {
    /// Defaults for everything but the config: the invalid config `[]` (a
    /// provider config is always a JSON object), version `v1.30.0`, 120 s.
    pub fn new(config: impl Into<String>) -> Self {
        Options {
            config: config.into(),
            invalid_configs: vec!["[]".into()],
            version: "v1.30.0".into(),
            timeout: Duration::from_secs(120),
            user_data_probe: None,
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase", tag = "result", content = "detail")]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// One named check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// The conformance report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub plugin: String,
    pub version: String,
    pub digest: String,
    pub world: String,
    pub contract: String,
    pub machine_uid: String,
    pub checks: Vec<Check>,
}

impl Report {
    /// A report on `plugin`'s checks; `machine_uid` is empty for worlds
    /// that need no test machine.
    pub fn new(plugin: &capstan_runtime::Plugin, machine_uid: String, checks: Vec<Check>) -> Self {
        let manifest = plugin.manifest();
        Report {
            plugin: manifest.name.clone(),
            version: manifest.version.clone(),
            digest: plugin.digest().to_string(),
            world: manifest.world.to_string(),
            contract: manifest.contract.clone(),
            machine_uid,
            checks,
        }
    }

    /// Whether every check passed (or was skipped).
    pub fn passed(&self) -> bool {
        !self
            .checks
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Fail(_)))
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Fail(_)))
    }

    /// A human-readable report, one line per check.
    pub fn render_text(&self) -> String {
        let machine = if self.machine_uid.is_empty() {
            String::new()
        } else {
            format!(", test machine uid {}", self.machine_uid)
        };
        let mut out = format!(
            "Conformance of plugin {} {} ({})\nworld {}, contract {}{machine}\n\n",
            self.plugin, self.version, self.digest, self.world, self.contract
        );
        for check in &self.checks {
            let (tag, detail) = match &check.outcome {
                Outcome::Pass => ("PASS", None),
                Outcome::Fail(d) => ("FAIL", Some(d)),
                Outcome::Skip(d) => ("SKIP", Some(d)),
            };
            out.push_str(&format!("  {tag}  {}\n", check.name));
            if let Some(d) = detail {
                out.push_str(&format!("        {d}\n"));
            }
        }
        let failed = self.failures().count();
        let skipped = self
            .checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Skip(_)))
            .count();
        out.push_str(&format!(
            "\n{} checks: {} passed, {failed} failed, {skipped} skipped\n",
            self.checks.len(),
            self.checks.len() - failed - skipped
        ));
        out
    }
}

struct Run<'a> {
    provider: &'a ProviderPlugin,
    deadline: Instant,
    checks: Vec<Check>,
    /// Transient errors seen, to check their retry-after.
    transients: Vec<(String, u64)>,
}

impl Run<'_> {
    fn record(&mut self, name: &str, outcome: Outcome) {
        self.checks.push(Check {
            name: name.to_string(),
            outcome,
        });
    }

    /// Call until the result is not a transient error (sleeping as the plugin
    /// asks, capped at 2 s) or the budget runs out.
    async fn retrying<T, F, Fut>(&mut self, what: &str, mut call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        loop {
            match call().await {
                Err(Error::Plugin {
                    error: PluginError::Transient(t),
                    plugin,
                    call,
                }) => {
                    tracing::info!(call = what, retry_after_ms = t.retry_after_ms, message = %t.message, "transient error, retrying");
                    self.transients
                        .push((format!("{what}: {}", t.message), t.retry_after_ms));
                    if Instant::now() >= self.deadline {
                        return Err(Error::Plugin {
                            plugin,
                            call,
                            error: PluginError::Transient(t),
                        });
                    }
                    let wait = Duration::from_millis(t.retry_after_ms.clamp(10, 2_000));
                    tokio::time::sleep(wait).await;
                }
                other => return other,
            }
        }
    }
}

fn is_invalid_config(r: &Result<impl Sized, Error>) -> Outcome {
    match r {
        Err(Error::Plugin {
            error: PluginError::InvalidConfig(_),
            ..
        }) => Outcome::Pass,
        Err(e) => Outcome::Fail(format!("expected invalid-config, got: {}", brief(e))),
        Ok(_) => Outcome::Fail("expected invalid-config, but the call succeeded".into()),
    }
}

fn brief(e: &Error) -> String {
    match e {
        Error::Plugin { error, .. } => describe(error),
        other => other.to_string(),
    }
}

/// A machine with a fresh uid (so runs never collide), labelled as a
/// conformance test.
fn test_machine(config: &str, version: &str) -> Machine {
    let suffix = format!("{:016x}", rand::random::<u64>());
    Machine {
        name: format!("conformance-{}", &suffix[..8]),
        namespace: "capstan-conformance".into(),
        uid: format!("capstan-conformance-{suffix}"),
        cluster_name: None,
        labels: vec![("capstan.dev/conformance".into(), "true".into())],
        version: Some(version.to_string()),
        failure_domain: None,
        provider_config: config.to_string(),
        infrastructure_config: None,
        provider_id: None,
    }
}

/// Run every provider check against `provider` and the live target its
/// config points to. Instances created along the way are deleted at the end,
/// also when checks fail.
pub async fn run_provider(provider: &ProviderPlugin, options: &Options) -> Report {
    let plugin = provider.plugin();
    let mut machine = test_machine(&options.config, &options.version);
    let mut run = Run {
        provider,
        deadline: Instant::now() + options.timeout,
        checks: Vec::new(),
        transients: Vec::new(),
    };
    let mut created: Vec<String> = Vec::new();

    check_config(&mut run, options, &machine).await;

    // create, twice, for the same uid (with bootstrap data where the
    // contract carries it).
    let bootstrap = provider
        .takes_bootstrap_data()
        .then(|| conformance_bootstrap_data(&machine));
    let Some(first_id) = create_checks(&mut run, &machine, bootstrap.as_ref(), &mut created).await
    else {
        return finish(
            run,
            plugin,
            &machine,
            "create failed, so the remaining checks cannot run",
        );
    };

    // get, by provider ID, until running.
    machine.provider_id = Some(first_id.clone());
    let got = run.retrying("get", || provider.get(&machine)).await;
    let outcome = match &got {
        Ok(s) if s.provider_id == first_id => Outcome::Pass,
        Ok(s) => Outcome::Fail(format!(
            "get returned provider ID {}, create returned {first_id}",
            s.provider_id
        )),
        Err(e) => Outcome::Fail(brief(e)),
    };
    run.record("get after create returns the same instance", outcome);
    let outcome = wait_running(&mut run, &machine).await;
    run.record("the instance reaches running", outcome);
    let outcome = user_data_arrived(options, &first_id, bootstrap.as_ref()).await;
    run.record("the instance got the bootstrap data create passed", outcome);
    find_checks(&mut run, &machine, &first_id).await;

    // delete until done, then again, then get is not-found.
    let outcome = delete_until_done(&mut run, &machine).await;
    run.record("delete ends in done", outcome);
    let again = run
        .retrying("delete (repeat)", || provider.delete(&machine))
        .await;
    let outcome = match again {
        Ok(Deletion::Done) => Outcome::Pass,
        Ok(Deletion::InProgress(_)) => {
            Outcome::Fail("a second delete after done returned in-progress".into())
        }
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record("delete is idempotent", outcome);
    gone_checks(&mut run, &machine, &first_id, options).await;
    capacity_check(&mut run, options).await;

    // Clean up anything a failing plugin left behind (e.g. a duplicate).
    for id in created.iter().filter(|id| **id != first_id) {
        let mut extra = machine.clone();
        extra.provider_id = Some(id.clone());
        let _ = delete_until_done(&mut run, &extra).await;
    }
    finish(run, plugin, &machine, "")
}

/// `create` returns a provider ID, and the same one for the same machine
/// uid again (a second instance is recorded in `created`, to be cleaned
/// up). `None` when the first create failed.
async fn create_checks(
    run: &mut Run<'_>,
    machine: &Machine,
    bootstrap: Option<&BootstrapData>,
    created: &mut Vec<String>,
) -> Option<String> {
    let provider = run.provider;
    let first = run
        .retrying("create", || provider.create(machine, bootstrap))
        .await;
    let first_id = match first {
        Ok(status) if !status.provider_id.is_empty() => {
            run.record("create returns a provider ID", Outcome::Pass);
            created.push(status.provider_id.clone());
            Some(status.provider_id)
        }
        Ok(_) => {
            run.record(
                "create returns a provider ID",
                Outcome::Fail("the provider ID is empty".into()),
            );
            None
        }
        Err(e) => {
            run.record("create returns a provider ID", Outcome::Fail(brief(&e)));
            None
        }
    };
    let first_id = first_id?;

    let second = run
        .retrying("create (repeat)", || provider.create(machine, bootstrap))
        .await;
    let outcome = match &second {
        Ok(s) if s.provider_id == first_id => Outcome::Pass,
        Ok(s) => {
            created.push(s.provider_id.clone());
            Outcome::Fail(format!(
                "create is not idempotent: the second create for machine uid {} returned provider ID {}, the first returned {} (two instances now exist for one machine)",
                machine.uid, s.provider_id, first_id
            ))
        }
        Err(e) => Outcome::Fail(format!("the repeated create failed: {}", brief(e))),
    };
    run.record("create is idempotent for the same machine uid", outcome);
    Some(first_id)
}

/// After `delete`: `get` is not-found, `find-instance` skips the instance
/// and `list-instances` no longer shows it.
async fn gone_checks(run: &mut Run<'_>, machine: &Machine, first_id: &str, options: &Options) {
    let provider = run.provider;
    let after = run
        .retrying("get after delete", || provider.get(machine))
        .await;
    let outcome = match after {
        Err(Error::Plugin {
            error: PluginError::NotFound(_),
            ..
        }) => Outcome::Pass,
        Ok(s) => Outcome::Fail(format!(
            "get after delete still returns {} in state {:?}",
            s.provider_id, s.state
        )),
        Err(e) => Outcome::Fail(format!("expected not-found, got: {}", brief(&e))),
    };
    run.record("get after delete is not-found", outcome);
    let restored = Machine {
        uid: format!("{}-restored", machine.uid),
        provider_id: None,
        ..machine.clone()
    };
    let gone = run
        .retrying("find-instance after delete", || {
            provider.find_instance(&restored)
        })
        .await;
    let outcome = match gone {
        _ if !provider.takes_bootstrap_data() => {
            Outcome::Skip("contract 0.1.0 has no find-instance".into())
        }
        Ok(Some(f)) if f.status.provider_id == first_id => Outcome::Fail(format!(
            "find-instance still finds deleted instance {first_id} (a restored Machine would adopt an instance being terminated)"
        )),
        Ok(_) => Outcome::Pass,
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record("find-instance skips a deleted instance", outcome);

    let listed = run
        .retrying("list-instances", || provider.list(&options.config))
        .await;
    let outcome = match listed {
        Ok(None) => Outcome::Skip("the plugin does not support listing".into()),
        Ok(Some(all)) if all.iter().any(|s| s.provider_id == first_id) => Outcome::Fail(format!(
            "list-instances still shows deleted instance {first_id}"
        )),
        Ok(Some(_)) => Outcome::Pass,
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record(
        "list-instances no longer shows the deleted instance",
        outcome,
    );
}

/// What the cluster-autoscaler is told of a group at zero: some CPU and
/// memory, or nothing.
async fn capacity_check(run: &mut Run<'_>, options: &Options) {
    let provider = run.provider;
    let capacity = run
        .retrying("capacity", || provider.capacity(&options.config))
        .await;
    let outcome = match capacity {
        _ if !provider.takes_bootstrap_data() => {
            Outcome::Skip("contract 0.1.0 has no capacity".into())
        }
        Ok(None) => Outcome::Skip("the plugin does not say (users set the annotations)".into()),
        Ok(Some(c)) if c.cpu_millis == 0 || c.memory_mib == 0 => Outcome::Fail(format!(
            "capacity says {} millicores and {} MiB: an instance with none cannot run a pod",
            c.cpu_millis, c.memory_mib
        )),
        Ok(Some(_)) => Outcome::Pass,
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record(
        "capacity of the config is some CPU and memory, or none",
        outcome,
    );
}

/// The lookup a restored Machine relies on (`find-instance`, contract
/// 0.2.0): the machine under a new uid finds its instance by its tags, and
/// by provider ID, and `get` then acts on it; another machine's name finds
/// not this one.
async fn find_checks(run: &mut Run<'_>, machine: &Machine, first_id: &str) {
    const BY_TAG: &str = "find-instance finds the instance tagged for the machine under a new uid";
    const BY_ID: &str = "find-instance by provider ID finds it, and get acts on it for the new uid";
    const OTHER: &str = "find-instance finds nothing for another machine's name";
    let provider = run.provider;
    if !provider.takes_bootstrap_data() {
        for check in [BY_TAG, BY_ID, OTHER] {
            run.record(
                check,
                Outcome::Skip("contract 0.1.0 has no find-instance".into()),
            );
        }
        return;
    }
    let owner = format!("{}/{}", machine.namespace, machine.name);
    let restored = Machine {
        uid: format!("{}-restored", machine.uid),
        provider_id: None,
        ..machine.clone()
    };
    let found = run
        .retrying("find-instance", || provider.find_instance(&restored))
        .await;
    let outcome = match found {
        Ok(Some(f)) if f.status.provider_id == first_id && f.machine.as_deref() == Some(&owner) => {
            Outcome::Pass
        }
        Ok(Some(f)) if f.status.provider_id == first_id => Outcome::Fail(format!(
            "found {first_id}, tagged for {:?} instead of {owner:?}: tag instances with the machine's namespace/name at create",
            f.machine
        )),
        Ok(Some(f)) => Outcome::Fail(format!(
            "found {}, not the machine's instance {first_id}",
            f.status.provider_id
        )),
        Ok(None) => Outcome::Fail(format!(
            "found nothing: a Machine restored under a new uid would launch a second instance beside {first_id}"
        )),
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record(BY_TAG, outcome);

    let adopted = Machine {
        provider_id: Some(first_id.to_string()),
        ..restored
    };
    let by_id = run
        .retrying("find-instance by provider ID", || {
            provider.find_instance(&adopted)
        })
        .await;
    let outcome = match by_id {
        Ok(Some(f)) if f.status.provider_id == first_id => {
            match run
                .retrying("get (adopted)", || provider.get(&adopted))
                .await
            {
                Ok(s) if s.provider_id == first_id => Outcome::Pass,
                Ok(s) => Outcome::Fail(format!(
                    "get for the adopting machine returned {}, not {first_id}",
                    s.provider_id
                )),
                Err(e) => Outcome::Fail(format!(
                    "get for the adopting machine (new uid, provider ID {first_id}): {}",
                    brief(&e)
                )),
            }
        }
        Ok(other) => Outcome::Fail(format!(
            "find-instance by provider ID {first_id} returned {:?}",
            other.map(|f| f.status.provider_id)
        )),
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record(BY_ID, outcome);

    let stranger = Machine {
        name: format!("{}-other", machine.name),
        uid: format!("{}-other", machine.uid),
        provider_id: None,
        ..machine.clone()
    };
    let other = run
        .retrying("find-instance (another machine)", || {
            provider.find_instance(&stranger)
        })
        .await;
    let outcome = match other {
        Ok(Some(f)) if f.status.provider_id == first_id => Outcome::Fail(format!(
            "another machine's name found {first_id}: it would be adopted by the wrong Machine"
        )),
        Ok(_) => Outcome::Pass,
        Err(e) => Outcome::Fail(brief(&e)),
    };
    run.record(OTHER, outcome);
}

/// Harmless cloud-config naming the test machine: what a real image's
/// cloud-init would run without effect.
fn conformance_bootstrap_data(machine: &Machine) -> BootstrapData {
    BootstrapData {
        format: BootstrapFormat::CloudConfig,
        value: format!(
            "#cloud-config\n# capstan plugin conformance, machine uid {}\n",
            machine.uid
        )
        .into_bytes(),
    }
}

/// Whether the cloud, asked by `options.user_data_probe`, launched the
/// instance with exactly the data `create` passed (or its base64).
async fn user_data_arrived(
    options: &Options,
    provider_id: &str,
    sent: Option<&BootstrapData>,
) -> Outcome {
    let Some(sent) = sent else {
        return Outcome::Skip(
            "the plugin implements contract 0.1.0, whose create passes no bootstrap data".into(),
        );
    };
    let Some(probe) = options.user_data_probe.clone() else {
        return Outcome::Skip(
            "no user data probe: pass --user-data-command to read the instance's user data back from the cloud".into(),
        );
    };
    let id = provider_id.to_string();
    let got = match tokio::task::spawn_blocking(move || (probe.0)(&id)).await {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => return Outcome::Fail(format!("reading the instance's user data: {e}")),
        Err(e) => return Outcome::Fail(format!("the user data probe panicked: {e}")),
    };
    if same_user_data(&got, &sent.value) {
        return Outcome::Pass;
    }
    let shown: String = String::from_utf8_lossy(&got).chars().take(200).collect();
    Outcome::Fail(format!(
        "the instance's user data ({} bytes) is not the {} bytes create passed; it begins {shown:?}",
        got.len(),
        sent.value.len()
    ))
}

/// The data itself, or its base64, either with trailing whitespace (what a
/// command's output adds).
fn same_user_data(got: &[u8], sent: &[u8]) -> bool {
    let trimmed = got.trim_ascii_end();
    if got == sent || trimmed == sent.trim_ascii_end() {
        return true;
    }
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(trimmed.trim_ascii())
        .is_ok_and(|decoded| decoded == sent)
}

async fn check_config(run: &mut Run<'_>, options: &Options, machine: &Machine) {
    let provider = run.provider;
    let valid = run
        .retrying("validate", || provider.validate(&options.config))
        .await;
    let outcome = match valid {
        Ok(()) => Outcome::Pass,
        Err(e) => Outcome::Fail(format!(
            "the config given with --config was rejected: {}",
            brief(&e)
        )),
    };
    run.record("validate accepts the given config", outcome);
    for invalid in &options.invalid_configs {
        let r = provider.validate(invalid).await;
        run.record(
            &format!("validate rejects {invalid} with invalid-config"),
            is_invalid_config(&r),
        );
        let mut bad = machine.clone();
        bad.uid = format!("{}-invalid", machine.uid);
        bad.provider_config = invalid.clone();
        let r = provider.create(&bad, None).await;
        run.record(
            &format!("create with config {invalid} is invalid-config"),
            is_invalid_config(&r),
        );
    }
}

async fn wait_running(run: &mut Run<'_>, machine: &Machine) -> Outcome {
    let provider = run.provider;
    loop {
        match run
            .retrying("get (waiting for running)", || provider.get(machine))
            .await
        {
            Ok(s) if s.state == InstanceState::Running => return Outcome::Pass,
            Ok(s) if Instant::now() >= run.deadline => {
                return Outcome::Fail(format!("still {:?} when the time budget ran out", s.state));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => return Outcome::Fail(brief(&e)),
        }
    }
}

async fn delete_until_done(run: &mut Run<'_>, machine: &Machine) -> Outcome {
    let provider = run.provider;
    loop {
        match run.retrying("delete", || provider.delete(machine)).await {
            Ok(Deletion::Done) => return Outcome::Pass,
            Ok(Deletion::InProgress(_)) if Instant::now() >= run.deadline => {
                return Outcome::Fail("still in progress when the time budget ran out".into());
            }
            Ok(Deletion::InProgress(ms)) => {
                tokio::time::sleep(Duration::from_millis(ms.clamp(10, 2_000))).await;
            }
            Err(e) => return Outcome::Fail(brief(&e)),
        }
    }
}

fn finish(
    mut run: Run<'_>,
    plugin: &capstan_runtime::Plugin,
    machine: &Machine,
    aborted: &str,
) -> Report {
    if !aborted.is_empty() {
        run.record("remaining checks", Outcome::Skip(aborted.into()));
    }
    let bad: Vec<String> = run
        .transients
        .iter()
        .filter(|(_, ms)| *ms == 0)
        .map(|(what, _)| what.clone())
        .collect();
    let outcome = if !bad.is_empty() {
        Outcome::Fail(format!(
            "transient errors without retry-after: {}",
            bad.join("; ")
        ))
    } else if run.transients.is_empty() {
        Outcome::Skip(
            "no transient errors occurred (add faults to the target to exercise this)".into(),
        )
    } else {
        Outcome::Pass
    };
    run.record(
        &format!(
            "transient errors carry retry-after ({} observed)",
            run.transients.len()
        ),
        outcome,
    );
    Report::new(plugin, machine.uid.clone(), run.checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_matches_as_bytes_or_base64_but_not_otherwise() {
        let sent = b"#cloud-config\n# x\n";
        assert!(same_user_data(sent, sent));
        assert!(same_user_data(b"#cloud-config\n# x\n\n", sent));
        assert!(same_user_data(b"I2Nsb3VkLWNvbmZpZwojIHgK\n", sent));
        assert!(!same_user_data(b"#cloud-config\n# y\n", sent));
        assert!(!same_user_data(b"", sent));
        assert!(!same_user_data(b"I2Nsb3VkLWNvbmZpZwojIHkK", sent));
    }
}
