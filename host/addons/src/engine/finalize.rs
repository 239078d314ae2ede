//! Deleting an Addon: once no Addon that depends on it is left, delete
//! what it created (by uid, never what it adopted) in reverse apply order,
//! wait until that is gone, then drop the finalizer.

use super::cluster::{Deleted, delete_entry, target};
use super::drift::need_watches;
use super::{APPLIED, CONTROLLER, Context, actor_of, event, order, plugin_of};
use capstan_api::{ADDON_FINALIZER, Addon, set_condition, status};
use capstan_kit::write::{apply_status, remove_finalizer};
use capstan_kit::{Error, now};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use std::time::Duration;

/// Delete the inventory in reverse apply order; drop the finalizer once all
/// of it is gone.
pub(super) async fn finalize(addon: &Addon, ctx: &Context) -> Result<Action, Error> {
    if !addon.finalizers().iter().any(|f| f == ADDON_FINALIZER) {
        return Ok(Action::await_change());
    }
    let current = addon.status.clone();
    let mut status = current.clone().unwrap_or_default();
    status.phase = Some("Deleting".into());
    // Dependents go first: what they run may need this one to the end.
    let dependents = order::live_dependents(ctx, addon);
    if !dependents.is_empty() {
        let names: Vec<String> = dependents.iter().map(ToString::to_string).collect();
        let message = format!(
            "deletion waits for the Addons that depend on this one to go first: {}",
            names.join(", ")
        );
        set_condition(
            &mut status.conditions,
            APPLIED,
            status::FALSE,
            "WaitingForDependents",
            message.clone(),
            addon.metadata.generation,
            &now(),
        );
        if apply_status(&ctx.kube, CONTROLLER, addon, current.as_ref(), &status).await? {
            event(
                ctx,
                addon,
                EventType::Normal,
                "WaitingForDependents",
                message,
            )
            .await;
        }
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let inventory = status.inventory.clone();
    let mut remaining = 0;
    let mut problem = None;
    let target = match actor_of(addon, ctx) {
        Ok(actor) => target(addon, ctx, &actor).await,
        Err(f) => Err(f),
    };
    match target {
        Err(f) => {
            problem = Some(format!(
                "{}; the Addon keeps its finalizer until what it applied can be deleted (fix the target, or remove finalizer {ADDON_FINALIZER} to leave the objects behind)",
                f.message
            ))
        }
        Ok(target) => {
            let registered = plugin_of(addon, ctx).ok();
            let grants = registered.as_ref().map(|r| &r.grants);
            for entry in inventory.iter().rev() {
                match delete_entry(ctx, &target, entry, addon, grants).await {
                    Ok(Deleted::Gone) => {}
                    // A Namespace ends only when the namespace controller
                    // has emptied it, which can take long; its deletion
                    // is under way and nothing of the addon is left in it.
                    Ok(Deleted::Going) if entry.kind == "Namespace" => {}
                    Ok(Deleted::Going) => remaining += 1,
                    Err(m) => {
                        remaining += 1;
                        problem = Some(m);
                    }
                }
            }
        }
    }
    if let Some(message) = &problem {
        set_condition(
            &mut status.conditions,
            APPLIED,
            status::FALSE,
            "DeleteFailed",
            message.clone(),
            addon.metadata.generation,
            &now(),
        );
    }
    if remaining > 0 || problem.is_some() {
        apply_status(&ctx.kube, CONTROLLER, addon, current.as_ref(), &status).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    remove_finalizer(&ctx.kube, CONTROLLER, addon, ADDON_FINALIZER).await?;
    need_watches(ctx, addon, Default::default());
    let uid = addon.metadata.uid.clone().unwrap_or_default();
    ctx.state
        .expected
        .lock()
        .expect("expected lock")
        .retain(|(of, _), _| *of != uid);
    tracing::info!(addon = %capstan_kit::key_of(addon), objects = inventory.len(), "addon removed with everything it applied");
    Ok(Action::await_change())
}
