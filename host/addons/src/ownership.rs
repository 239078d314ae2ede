//! Whose object is it: an Addon owns only what it created.
//!
//! Before the first write of a reconcile, every rendered object that
//! already exists is matched against the Addon's inventory by uid. An
//! object this Addon did not create is never applied over (no forced
//! take-over, no fight between two Addons rendering the same object),
//! unless the Plugin's `spec.grants.adopt` names it. Prune and delete then
//! act only on the recorded uid, and never on an adopted object.
//!
//! The inventory lives in the Addon's status, which whoever may write
//! `addons/status` can forge. So the object itself must show it is this
//! Addon's before it is deleted or recovered: it carries this Addon's
//! labels *and* this Addon's field manager ([`applied_by`]), which nobody
//! can put on an object they may not write. A create this Addon made but
//! never recorded (the pass ended between the two) is recovered the same
//! way.

use crate::Object;
use capstan_api::{InventoryEntry, LABEL_ADDON_NAME, LABEL_ADDON_NAMESPACE};
use capstan_manifest::ObjectPattern;
use serde_json::Value;

/// What an Addon may do with one rendered object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// It does not exist: create it.
    Create,
    /// It is the very object this Addon created (or adopted) before.
    Owned {
        /// Its uid.
        uid: String,
        /// Whether it was adopted rather than created.
        adopted: bool,
    },
    /// It exists, this Addon did not create it, and a grant lets it take
    /// the object over.
    Adopt {
        /// Its uid.
        uid: String,
    },
    /// It exists and is someone else's: the message says whose and what to do.
    Refuse(String),
}

fn text<'a>(live: &'a Value, pointer: &str) -> Option<&'a str> {
    live.pointer(pointer).and_then(Value::as_str)
}

/// Who manages a live object, from its `managedFields`.
pub fn managers(live: &Value) -> Vec<String> {
    let mut names: Vec<String> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str().map(String::from))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// This Addon: its namespace and name, and its field manager.
#[derive(Debug, Clone, Copy)]
pub struct Me<'a> {
    /// Namespace and name.
    pub addon: (&'a str, &'a str),
    /// The field manager it applies under.
    pub manager: &'a str,
}

/// Whether the live object shows it was applied by this Addon: its labels
/// and its field manager.
pub fn applied_by(live: &Value, me: Me<'_>) -> bool {
    labelled_by(live, me.addon) && managers(live).iter().any(|m| m == me.manager)
}

/// Decide for `object`, given the live object (if any), this Addon's
/// inventory and the Plugin's adopt grants.
pub fn decide(
    object: &Object,
    live: Option<&Value>,
    inventory: &[InventoryEntry],
    me: Me<'_>,
    adopt: &[ObjectPattern],
) -> Ownership {
    let Some(live) = live else {
        return Ownership::Create;
    };
    let uid = text(live, "/metadata/uid").unwrap_or_default().to_string();
    // The object must show this Addon applied it: a forged inventory entry
    // naming someone else's object gives it nothing.
    let proven = applied_by(live, me);
    match inventory.iter().find(|e| object.is(e)) {
        // Inventories written before uids were recorded have only the proof.
        Some(entry) if proven && entry.uid.as_ref().is_none_or(|r| *r == uid) => {
            return Ownership::Owned {
                uid,
                adopted: entry.adopted,
            };
        }
        // Created by this Addon in a pass that ended before it was recorded.
        None if proven => {
            return Ownership::Owned {
                uid,
                adopted: false,
            };
        }
        _ => {}
    }
    if adopt.iter().any(|p| p.matches(&object.key())) {
        return Ownership::Adopt { uid };
    }
    let managers = managers(live);
    let by = if managers.is_empty() {
        String::new()
    } else {
        format!(" (managed by {})", managers.join(", "))
    };
    let mut named = ObjectPattern::for_object(&object.key());
    named.name = Some(object.name.clone());
    Ownership::Refuse(format!(
        "{} already exists{by} and this Addon did not create it; Capstan never takes over an object it did not create: delete or rename the existing object, or have a cluster admin add {named} to the Plugin's spec.grants.adopt",
        object.entry()
    ))
}

/// Whether a live object carries the labels of this Addon.
pub fn labelled_by(live: &Value, (namespace, name): (&str, &str)) -> bool {
    let labels = &live["metadata"]["labels"];
    labels[LABEL_ADDON_NAME] == name && labels[LABEL_ADDON_NAMESPACE] == namespace
}

/// Whether deleting the Addon (or pruning `entry`) may delete the live
/// object: it is the object recorded (by uid; inventories without uids
/// never a Namespace), it was created rather than adopted, and the object
/// itself shows this Addon applied it ([`applied_by`]), whatever the
/// inventory says.
pub fn may_delete(entry: &InventoryEntry, live: &Value, me: Me<'_>) -> bool {
    if entry.adopted || !applied_by(live, me) {
        return false;
    }
    match &entry.uid {
        Some(uid) => text(live, "/metadata/uid") == Some(uid.as_str()),
        None => entry.kind != "Namespace",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ADDON: Me<'static> = Me {
        addon: ("team-a", "exporter"),
        manager: "capstan-addon/team-a/exporter",
    };

    fn namespace() -> Object {
        Object::from_value(
            0,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}),
        )
        .unwrap()
    }

    fn live(uid: &str, labelled: bool) -> Value {
        let mut v = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "monitoring", "uid": uid,
            "managedFields": [{"manager": "kubectl-create"}, {"manager": "capstan-addon/team-b/x"}]}});
        if labelled {
            v["metadata"]["labels"] =
                json!({LABEL_ADDON_NAME: "exporter", LABEL_ADDON_NAMESPACE: "team-a"});
        }
        v
    }

    /// `live`, applied by this Addon: its labels and its field manager.
    fn ours(uid: &str) -> Value {
        let mut v = live(uid, true);
        v["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(json!({"manager": ADDON.manager, "operation": "Apply"}));
        v
    }

    fn entry(uid: Option<&str>, adopted: bool) -> InventoryEntry {
        InventoryEntry {
            uid: uid.map(String::from),
            adopted,
            ..namespace().entry()
        }
    }

    #[test]
    fn what_does_not_exist_is_created_and_what_this_addon_created_is_its_own() {
        let ns = namespace();
        assert_eq!(decide(&ns, None, &[], ADDON, &[]), Ownership::Create);
        let owned = decide(
            &ns,
            Some(&ours("u1")),
            &[entry(Some("u1"), false)],
            ADDON,
            &[],
        );
        assert_eq!(
            owned,
            Ownership::Owned {
                uid: "u1".into(),
                adopted: false
            }
        );
    }

    #[test]
    fn an_existing_object_is_never_taken_over_without_an_adopt_grant() {
        let ns = namespace();
        let Ownership::Refuse(message) = decide(&ns, Some(&live("u1", false)), &[], ADDON, &[])
        else {
            panic!("refused")
        };
        assert!(message.starts_with("Namespace monitoring already exists (managed by capstan-addon/team-b/x, kubectl-create)"), "{message}");
        assert!(message.contains("spec.grants.adopt"), "{message}");
        // Labels are not ownership: anyone can write them.
        assert!(matches!(
            decide(&ns, Some(&live("u1", true)), &[], ADDON, &[]),
            Ownership::Refuse(_)
        ));
        // Deleted and recreated by someone else under the same name.
        assert!(matches!(
            decide(
                &ns,
                Some(&live("u2", true)),
                &[entry(Some("u1"), false)],
                ADDON,
                &[]
            ),
            Ownership::Refuse(_)
        ));
        let adopt: Vec<ObjectPattern> = vec!["Namespace/monitoring".parse().unwrap()];
        assert_eq!(
            decide(&ns, Some(&live("u1", false)), &[], ADDON, &adopt),
            Ownership::Adopt { uid: "u1".into() }
        );
        let other: Vec<ObjectPattern> = vec!["Namespace/other".parse().unwrap()];
        assert!(matches!(
            decide(&ns, Some(&live("u1", false)), &[], ADDON, &other),
            Ownership::Refuse(_)
        ));
    }

    #[test]
    fn only_created_objects_with_the_recorded_uid_are_deleted() {
        let object = ours("u1");
        assert!(may_delete(&entry(Some("u1"), false), &object, ADDON));
        assert!(!may_delete(&entry(Some("u0"), false), &object, ADDON));
        assert!(
            !may_delete(&entry(Some("u1"), true), &object, ADDON),
            "adopted"
        );
        // Inventories without uids: never a Namespace, other kinds by labels.
        assert!(!may_delete(&entry(None, false), &object, ADDON));
        let mut cm = entry(None, false);
        cm.kind = "ConfigMap".into();
        assert!(may_delete(&cm, &object, ADDON));
        assert!(!may_delete(&cm, &live("u1", false), ADDON));
    }

    #[test]
    fn a_forged_inventory_entry_deletes_nothing() {
        // Someone who may write this Addon's status records another
        // object's uid: the object does not show this Addon applied it.
        let theirs = live("victim", false);
        assert!(!may_delete(&entry(Some("victim"), false), &theirs, ADDON));
        // Even with this Addon's labels copied on, without its manager.
        assert!(!may_delete(
            &entry(Some("u1"), false),
            &live("u1", true),
            ADDON
        ));
        let other = Me {
            addon: ("team-b", "x"),
            manager: "capstan-addon/team-b/x",
        };
        assert!(!may_delete(&entry(Some("u1"), false), &ours("u1"), other));
    }

    #[test]
    fn a_forged_inventory_entry_takes_nothing_over() {
        // The entry names another Addon's object by its uid.
        let theirs = live("victim", true);
        assert!(matches!(
            decide(
                &namespace(),
                Some(&theirs),
                &[entry(Some("victim"), false)],
                ADDON,
                &[]
            ),
            Ownership::Refuse(_)
        ));
    }

    #[test]
    fn a_create_that_was_never_recorded_is_recovered() {
        let ns = namespace();
        assert_eq!(
            decide(&ns, Some(&ours("u7")), &[], ADDON, &[]),
            Ownership::Owned {
                uid: "u7".into(),
                adopted: false
            }
        );
        // Recorded with another uid: replaced by someone, not recovered.
        assert!(matches!(
            decide(
                &ns,
                Some(&ours("u7")),
                &[entry(Some("u1"), false)],
                ADDON,
                &[]
            ),
            Ownership::Refuse(_)
        ));
    }
}
