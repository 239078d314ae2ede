//! What a channel offers beyond what is applied (`spec.updatePolicy`):
//! `status.availableVersion` under every policy, and under `Notify` the
//! `UpdateAvailable` condition and one Event per newly offered version. The
//! decision of which version renders is [`crate::updates`].

use super::{Context, Rendered, event};
use capstan_api::{Addon, AddonStatus, status};
use capstan_kit::Conditions;
use kube::runtime::events::EventType;

/// Condition (`Notify` only): the channel offers a newer version than the
/// one applied.
pub const UPDATE_AVAILABLE: &str = "UpdateAvailable";

/// Record what the channel offers (`status.availableVersion`, under every
/// policy); under `Notify`, the `UpdateAvailable` condition and one Event
/// per newly offered version.
pub(super) async fn report_available(
    ctx: &Context,
    addon: &Addon,
    status: &mut AddonStatus,
    rendered: &Rendered,
    digest: &str,
    generation: i64,
    t: &capstan_api::Time,
) {
    let before = status.available_version.clone();
    status.available_version = rendered.available.clone();
    status.available_from = rendered.available.as_ref().map(|_| digest.to_string());
    let mut conditions = Conditions::new(&mut status.conditions, Some(generation), t);
    if addon.spec.update_policy != capstan_api::UpdatePolicy::Notify {
        conditions.remove(UPDATE_AVAILABLE);
        return;
    }
    let (available, version) = (
        rendered.available.as_deref().unwrap_or_default(),
        &rendered.resolved.version,
    );
    if !rendered.update_available {
        conditions.set(
            UPDATE_AVAILABLE,
            status::FALSE,
            "Current",
            format!("version {version} is the newest the channel offers"),
        );
        return;
    }
    let message = format!(
        "version {available} is available in channel {} (offered by plugin revision {digest}); version {version} stays applied under updatePolicy Notify; set spec.version to {available} to apply it",
        addon.spec.channel.as_deref().unwrap_or_default()
    );
    conditions.set(
        UPDATE_AVAILABLE,
        status::TRUE,
        "UpdateAvailable",
        message.clone(),
    );
    if before.as_deref() != Some(available) {
        event(ctx, addon, EventType::Normal, "UpdateAvailable", message).await;
    }
}
