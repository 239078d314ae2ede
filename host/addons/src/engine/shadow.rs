//! A shadowing addon canary (a shadow step of `Plugin.spec.rollout`): the
//! serving revision's side-effect-free calls (`versions` and `render`
//! through the whole render, `assess`) are made by the canary too, at
//! once; its answers are compared with the serving revision's and never
//! used. Each comparison counts one call for the canary's window, and an
//! error when the answers differ ([`capstan_kit::canary::agrees`]).

use super::RegisteredAddon;
use super::render::{Meter, RenderError, Rendered};
use capstan_kit::Metrics;
use capstan_runtime::types::Health;
use std::mem::discriminant;

/// An answer that can be compared with the other revision's.
pub(super) trait Mirrored {
    /// Whether a failure was the host's doing (its quota held the call
    /// back): not counted.
    fn held_back(&self) -> bool;
    /// Whether two failures are the same kind.
    fn same_kind(&self, other: &Self) -> bool;
}

impl Mirrored for capstan_runtime::Error {
    fn held_back(&self) -> bool {
        matches!(
            self,
            capstan_runtime::Error::QuotaExceeded { .. }
                | capstan_runtime::Error::HostCapacity { .. }
        )
    }
    fn same_kind(&self, other: &Self) -> bool {
        discriminant(self) == discriminant(other)
    }
}

impl Mirrored for RenderError {
    fn held_back(&self) -> bool {
        matches!(self, RenderError::Plugin { error, .. } if error.held_back())
    }
    fn same_kind(&self, other: &Self) -> bool {
        match (self, other) {
            (
                RenderError::Plugin { call, error },
                RenderError::Plugin {
                    call: other_call,
                    error: other_error,
                },
            ) => call == other_call && error.same_kind(other_error),
            (RenderError::Addon(a), RenderError::Addon(b)) => discriminant(a) == discriminant(b),
            _ => false,
        }
    }
}

/// Run `stable` (the serving revision's call) and, when `registered`'s
/// canary shadows it, `canary` with the canary's revision at once; count
/// whether they agree (by `same`, failures by kind) for its window. Only
/// the serving revision's answer is returned.
pub(super) async fn mirrored<T, E: Mirrored>(
    registered: &RegisteredAddon,
    stable: impl Future<Output = Result<T, E>>,
    canary: impl AsyncFnOnce(&RegisteredAddon) -> Result<T, E>,
    same: impl Fn(&T, &T) -> bool,
) -> Result<T, E> {
    let Some(shadow) = capstan_kit::canary::shadowing(&registered.canary) else {
        return stable.await;
    };
    let (stable, mirrored) = futures::join!(stable, canary(&shadow.serving));
    if !matches!(&mirrored, Err(e) if e.held_back()) {
        shadow.record_mirrored(capstan_kit::canary::agrees(
            &stable,
            &mirrored,
            same,
            E::same_kind,
        ));
    }
    stable
}

/// Whether two renders agree: the same version, the same newest version
/// offered, the same objects (labelled, patched, rewritten) in the same
/// order.
pub(super) fn same_render(a: &Rendered, b: &Rendered) -> bool {
    a.resolved == b.resolved
        && a.available == b.available
        && a.objects == b.objects
        && a.rewrites == b.rewrites
}

/// Whether two health judgements agree (the message aside).
pub(super) fn same_health(a: &Health, b: &Health) -> bool {
    a.healthy == b.healthy && a.details == b.details
}

impl RegisteredAddon {
    /// How a shadowing canary's calls are measured: in the call metrics
    /// only; its window counts comparisons, not calls.
    pub(super) fn mirror_meter<'a>(&'a self, metrics: &'a Metrics) -> Meter<'a> {
        Meter {
            metrics,
            revision: self.revision,
            counts: None,
        }
    }
}
