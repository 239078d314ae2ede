use super::*;
use capstan_runtime::types::InstanceState;

/// A provider whose every call answers the same (a failure when
/// `fails`), reporting `instance` as the instance's provider ID.
#[derive(Debug)]
struct Fixed {
    digest: &'static str,
    instance: &'static str,
    fails: bool,
}

impl Fixed {
    fn answer(&self) -> Result<MachineStatus, ProviderError> {
        if self.fails {
            return Err(ProviderError::Fault("trapped".into()));
        }
        Ok(MachineStatus {
            provider_id: self.instance.into(),
            state: InstanceState::Running,
            addresses: vec![],
            failure_domain: None,
            version: None,
            message: Some(format!("answered by {}", self.digest)),
        })
    }
}

impl MachineProvider for Fixed {
    fn digest(&self) -> &str {
        self.digest
    }
    fn validate<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.answer().map(|_| ()) })
    }
    fn create<'a>(
        &'a self,
        _: &'a PluginMachine,
        _: Option<&'a BootstrapData>,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        Box::pin(async move { self.answer() })
    }
    fn get<'a>(
        &'a self,
        _: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<MachineStatus, ProviderError>> {
        Box::pin(async move { self.answer() })
    }
    fn delete<'a>(
        &'a self,
        _: &'a PluginMachine,
    ) -> BoxFuture<'a, Result<Deletion, ProviderError>> {
        Box::pin(async move { self.answer().map(|_| Deletion::Done) })
    }
}

fn fixed(digest: &'static str, instance: &'static str, fails: bool) -> Arc<dyn MachineProvider> {
    Arc::new(Fixed {
        digest,
        instance,
        fails,
    })
}

fn plugin_machine() -> PluginMachine {
    PluginMachine {
        name: "m".into(),
        namespace: "default".into(),
        uid: "uid-m".into(),
        cluster_name: None,
        labels: vec![],
        version: None,
        failure_domain: None,
        provider_config: "{}".into(),
        infrastructure_config: None,
        provider_id: Some("sim://i-1".into()),
    }
}

#[tokio::test]
async fn machines_go_to_the_revision_that_serves_them_and_are_counted_there() {
    let mut registered = Registered::new(fixed("sha256:stable", "sim://i-1", false), Some(1));
    let canary = Arc::new(Canary::new(fixed("sha256:canary", "sim://i-1", true)));
    canary.assign(["a".to_string()], ["a".to_string(), "b".to_string()]);
    registered.canary = Some(canary.clone());
    let m = plugin_machine();

    let a = registered.for_machine("a", None, false).unwrap();
    assert_eq!((a.digest(), a.revision()), ("sha256:canary", "canary"));
    assert!(a.get(&m).await.is_err());
    let b = registered.for_machine("b", None, true).unwrap();
    assert_eq!((b.digest(), b.revision()), ("sha256:stable", "stable"));
    b.get(&m).await.unwrap();
    // Served by the canary before (its status says so): still its.
    let c = registered
        .for_machine("c", Some("sha256:canary"), false)
        .unwrap();
    assert_eq!(c.digest(), "sha256:canary");
    // A Machine to create that the Plugin controller has not placed
    // yet waits; one already created is the stable revision's.
    assert!(registered.for_machine("d", None, true).is_none());
    assert_eq!(
        registered.for_machine("d", None, false).unwrap().digest(),
        "sha256:stable"
    );
    let (canary_calls, stable_calls) = (canary.counts.take(), registered.counts.take());
    assert_eq!((canary_calls.calls, canary_calls.errors), (1, 1));
    assert_eq!((stable_calls.calls, stable_calls.errors), (1, 0));
}

#[tokio::test]
async fn a_shadow_is_asked_too_but_never_answers() {
    let mut registered = Registered::new(fixed("sha256:stable", "sim://i-1", false), Some(1));
    let canary = Arc::new(Canary::new(fixed("sha256:canary", "sim://i-2", false)));
    canary.set_shadow(true);
    registered.canary = Some(canary.clone());
    let m = plugin_machine();
    let served = registered.for_machine("a", None, true).unwrap();
    assert_eq!(served.digest(), "sha256:stable");
    // Another instance than the stable revision's: a difference.
    let answer = served.get(&m).await.unwrap();
    assert_eq!(answer.provider_id, "sim://i-1");
    served.validate("{}").await.unwrap();
    served.create(&m, None).await.unwrap();
    let compared = canary.counts.take();
    assert_eq!(
        (compared.calls, compared.errors),
        (2, 1),
        "get differed, validate agreed; create is never mirrored"
    );
    assert_eq!(registered.counts.take().calls, 3);
}

#[test]
fn settings_are_the_admins_and_a_machine_cannot_set_them() {
    let declared = vec!["endpoint".to_string()];
    let admin = checked_settings(
        Some(&serde_json::json!({"endpoint": "https://vpce.example.com"})),
        &declared,
    )
    .unwrap();
    let merged = with_settings(
        r#"{"region": "eu-west-1"}"#,
        &declared,
        &admin,
        MachineSets::Refused,
    )
    .unwrap();
    let merged: serde_json::Value = serde_json::from_str(&merged).unwrap();
    assert_eq!(
        merged,
        serde_json::json!({"region": "eu-west-1", "endpoint": "https://vpce.example.com"})
    );
    // A tenant's endpoint is refused, even when the admin set none; a
    // Machine made before keeps being observed and deleted, with the
    // admin's value.
    let evil = r#"{"endpoint": "https://evil.example"}"#;
    let replaced = with_settings(evil, &declared, &admin, MachineSets::Replaced).unwrap();
    assert_eq!(replaced, r#"{"endpoint":"https://vpce.example.com"}"#);
    for admin in [admin, Default::default()] {
        let e = with_settings(evil, &declared, &admin, MachineSets::Refused).unwrap_err();
        assert!(
            e.to_string()
                .contains("endpoint: set by the Plugin's admin"),
            "{e}"
        );
    }
    let none = with_settings(evil, &declared, &Default::default(), MachineSets::Replaced);
    assert_eq!(none.unwrap(), "{}");
    // Undeclared settings are refused; nothing declared: config as is.
    let e = checked_settings(Some(&serde_json::json!({"region": "x"})), &declared).unwrap_err();
    assert!(
        e.starts_with("spec.settings.region: the plugin's manifest declares no such setting"),
        "{e}"
    );
    assert_eq!(
        with_settings(
            r#"{"endpoint": 1}"#,
            &[],
            &Default::default(),
            MachineSets::Refused
        )
        .unwrap(),
        r#"{"endpoint": 1}"#
    );
}
