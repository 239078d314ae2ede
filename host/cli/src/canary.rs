//! `capstan plugin promote|abort NAME`: end a Plugin's canary by hand.
//!
//! The command names the canary's digest in the Plugin's
//! `capstan.dev/canary-action` annotation (so it can never act on a later
//! canary) and waits until the controller reports the canary promoted or
//! rolled back. `spec.source` is not touched, so GitOps does not fight it.

use anyhow::{Context as _, bail};
use capstan_api::{ANNOTATION_CANARY_ACTION, CanaryPhase, Plugin};
use kube::api::{Api, Patch, PatchParams};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Flags of `plugin promote` and `plugin abort`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The Plugin whose canary to end.
    pub name: String,
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How long to wait for the controller to act (0: do not wait).
    #[arg(long, default_value = "60s", value_parser = crate::options::parse_duration)]
    pub timeout: Duration,
}

/// `promote` serves the canary to every Machine now; `abort` rolls it back
/// (and never tries that digest again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `capstan plugin promote`.
    Promote,
    /// `capstan plugin abort`.
    Abort,
}

impl Verb {
    fn word(self) -> &'static str {
        match self {
            Verb::Promote => "promote",
            Verb::Abort => "abort",
        }
    }

    fn done(self) -> CanaryPhase {
        match self {
            Verb::Promote => CanaryPhase::Promoted,
            Verb::Abort => CanaryPhase::RolledBack,
        }
    }
}

/// Ask for the action and wait for the controller to report it done.
pub async fn run(verb: Verb, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    let api: Api<Plugin> = Api::all(client);
    let plugin = api
        .get_opt(&args.name)
        .await
        .with_context(|| format!("cannot read plugin {:?}", args.name))?;
    let Some(plugin) = plugin else {
        bail!(
            "plugin {:?} does not exist (kubectl get plugins lists them)",
            args.name
        );
    };
    let Some(canary) = plugin.status.as_ref().and_then(|s| s.canary.clone()) else {
        bail!(
            "plugin {:?} has no canary: spec.rollout.strategy is Canary and a new revision is on trial only after spec.source resolves to another digest",
            args.name
        );
    };
    if !matches!(
        canary.phase,
        CanaryPhase::Shadow | CanaryPhase::Progressing | CanaryPhase::Paused
    ) {
        bail!(
            "the canary of plugin {:?} ({}) is already {:?}; nothing to {}",
            args.name,
            canary.source,
            canary.phase,
            verb.word()
        );
    }
    let value = format!("{} {}", verb.word(), canary.digest);
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_CANARY_ACTION: value}}});
    api.patch(&args.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cannot annotate plugin {:?}", args.name))?;
    eprintln!(
        "asked the controller to {} canary {} ({}) of plugin {:?}",
        verb.word(),
        canary.source,
        canary.digest,
        args.name
    );
    if args.timeout.is_zero() {
        return Ok(ExitCode::SUCCESS);
    }
    let deadline = Instant::now() + args.timeout;
    loop {
        let now = api.get(&args.name).await?;
        let current = now.status.as_ref().and_then(|s| s.canary.clone());
        if let Some(c) = current.filter(|c| c.digest == canary.digest && c.phase == verb.done()) {
            println!(
                "plugin/{} canary {}: {:?}{}",
                args.name,
                c.digest,
                c.phase,
                c.message.map(|m| format!(" ({m})")).unwrap_or_default()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            bail!(
                "the controller did not {} the canary within {:?}; is it running? (kubectl describe plugin {} shows its Events)",
                verb.word(),
                args.timeout,
                args.name
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
