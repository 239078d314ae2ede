//! Writing an Addon's objects: discovery for every object before anything
//! is written, who owns each object now, and the server-side apply in
//! order, recording what did get applied when an attempt fails.

use super::*;

/// Discovery for every object before anything is written, so a kind the
/// cluster does not serve (or a namespaced object without a namespace)
/// stops the whole render.
pub(super) async fn discover(
    ctx: &Context,
    target: &Target,
    objects: &[Object],
) -> Result<Vec<ApiResource>, Failure> {
    let mut kinds = Vec::with_capacity(objects.len());
    for object in objects {
        let (resource, namespaced) = kind_of(ctx, target, &object.api_version, &object.kind)
            .await
            .map_err(|e| match e {
                cluster::KindError::NotServed(m) => fail(APPLIED, "UnknownKind", m),
                cluster::KindError::Failed(m) => fail(APPLIED, "DiscoveryFailed", m),
            })?;
        if namespaced != object.namespace.is_some() {
            return Err(fail(
                APPLIED,
                "InvalidRender",
                format!(
                    "{} is {} but rendered {} a namespace; the plugin must set metadata.namespace exactly on namespaced objects",
                    object.entry(),
                    if namespaced {
                        "namespaced"
                    } else {
                        "cluster-scoped"
                    },
                    if namespaced { "without" } else { "with" }
                ),
            ));
        }
        kinds.push(resource);
    }
    Ok(kinds)
}

/// A live object (if any) and whose it is.
type Decided = (Option<serde_json::Value>, Ownership);

/// Whose is each object? Read them all and refuse before the first write:
/// an object this Addon did not create is never applied over.
pub(super) async fn ownership_of(
    addon: &Addon,
    registered: &RegisteredAddon,
    status: &AddonStatus,
    target: &Target,
    objects: &[Object],
    kinds: &[ApiResource],
) -> Result<Vec<Decided>, Failure> {
    let (namespace, name) = (addon.namespace().unwrap_or_default(), addon.name_any());
    let manager = field_manager(addon);
    let me = ownership::Me {
        addon: (&namespace, &name),
        manager: &manager,
    };
    let mut decisions = Vec::with_capacity(objects.len());
    let mut refused = Vec::new();
    for (object, resource) in objects.iter().zip(kinds) {
        let live = read_live(target, resource, object).await?;
        let decision = ownership::decide(
            object,
            live.as_ref(),
            &status.inventory,
            me,
            &registered.grants.adopt,
        );
        if let Ownership::Refuse(message) = &decision {
            refused.push(message.clone());
        }
        decisions.push((live, decision));
    }
    if !refused.is_empty() {
        return Err(fail(
            APPLIED,
            "ObjectExists",
            format!(
                "refused the whole render, nothing was applied: {}",
                refused.join("; ")
            ),
        ));
    }
    Ok(decisions)
}

/// What [`apply_all`] applied.
#[derive(Debug)]
pub(super) struct Applied {
    /// The new inventory.
    pub(super) inventory: Vec<InventoryEntry>,
    /// What of each live object `assess` may see.
    pub(super) observed: Vec<String>,
    /// The drift watches the applied objects need.
    pub(super) watching: std::collections::HashSet<WatchKey>,
}

/// Apply each object that drifted, noting the drift watch its kind needs.
/// On a failure,
/// what this attempt did apply stays in the inventory, so a later render
/// that drops it still prunes it.
pub(super) async fn apply_all(
    ctx: &Context,
    addon: &Addon,
    status: &mut AddonStatus,
    target: &Target,
    objects: &[Object],
    kinds: &[ApiResource],
    decisions: Vec<Decided>,
) -> Result<Applied, Failure> {
    let manager = field_manager(addon);
    let mut watching = std::collections::HashSet::new();
    let mut applied: Vec<InventoryEntry> = Vec::with_capacity(objects.len());
    let mut observed = Vec::with_capacity(objects.len());
    for ((object, resource), (live, decision)) in objects.iter().zip(kinds).zip(decisions) {
        let (uid, adopted) = match &decision {
            Ownership::Owned { uid, adopted } => (Some(uid.clone()), *adopted),
            Ownership::Adopt { uid } => (Some(uid.clone()), true),
            Ownership::Create | Ownership::Refuse(_) => (None, false),
        };
        let key = (
            addon.metadata.uid.clone().unwrap_or_default(),
            format!("{}@{}", object.entry(), target.key),
        );
        let live = match (&decision, live) {
            (Ownership::Create, None) => {
                match cluster::create(ctx, target, resource, object, &manager).await {
                    Ok(created) => Some(created),
                    Err(f) => {
                        record_applied(status, applied);
                        return Err(f);
                    }
                }
            }
            (_, live) => live,
        };
        match apply_if_drifted(ctx, target, resource, object, live, &manager, key).await {
            Ok(live) => {
                let uid = uid.or_else(|| {
                    live.pointer("/metadata/uid")
                        .and_then(serde_json::Value::as_str)
                        .map(String::from)
                });
                applied.push(InventoryEntry {
                    uid,
                    adopted,
                    ..object.entry()
                });
                observed.push(crate::assess_view(&object.value, &live).to_string());
            }
            Err(f) => {
                record_applied(status, applied);
                return Err(f);
            }
        }
        let namespace = object.namespace.as_deref();
        watching.insert(watch_kind(ctx, addon, target, resource, namespace));
    }
    Ok(Applied {
        inventory: applied,
        observed,
        watching,
    })
}

/// Keep what a failed attempt did apply in the inventory, so a later render
/// that drops it still prunes it.
fn record_applied(status: &mut AddonStatus, applied: Vec<InventoryEntry>) {
    for done in applied {
        status.inventory.retain(|e| !crate::same_object(e, &done));
        status.inventory.push(done);
    }
}
