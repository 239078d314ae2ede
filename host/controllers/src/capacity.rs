//! Scale-from-zero capacity on MachineDeployments and on MachineSets no
//! deployment owns: the provider Plugin of the template says what an
//! instance of its config offers (`capacity`, contract 0.2.0), and the
//! host writes it as the cluster-autoscaler's
//! `capacity.cluster-autoscaler.kubernetes.io/*` annotations, keeping
//! current only the keys it wrote (`capstan.dev/capacity-from`); a key the
//! user set is theirs. The pure part is `capstan_kit::capacity`.

use capstan_api::MachineSpec;
use capstan_kit::capacity::{annotations, plan};
use capstan_kit::provider::{Providers, timed_as};
use capstan_kit::{Error, Kube, kube_err};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Answers kept per (code digest, config); a new revision asks again.
const MAX_CACHED: usize = 1024;
/// A failed `capacity` call is asked again after this long, not every pass.
const RETRY_FAILED: Duration = Duration::from_secs(60);
/// How soon an object whose Plugin is not loaded yet is looked at again
/// (a set at zero replicas gets no other event to wake it).
pub(crate) const RETRY_NOT_LOADED: Duration = Duration::from_secs(3);

/// The annotations one answer stands for (`None`: nothing to write).
type Said = Option<BTreeMap<&'static str, String>>;

/// What one revision said of one config.
#[derive(Debug, Clone)]
enum Answer {
    Said(Said),
    Failed(Instant),
}

/// What a pass knows of an object's capacity.
enum Known {
    Said(Said),
    /// Not now (a recent failure): nothing is changed.
    Unknown,
    /// The Plugin is not loaded yet: nothing is changed, look again soon.
    NotLoaded,
}

/// The providers, and what each revision said of each config.
#[derive(Debug, Default)]
pub(crate) struct Capacities {
    pub(crate) providers: Providers,
    said: Mutex<HashMap<(String, String), Answer>>,
}

impl Capacities {
    pub(crate) fn new(providers: Providers) -> Self {
        Capacities {
            providers,
            said: Mutex::default(),
        }
    }

    /// What the template's Plugin says, asked once per revision and config
    /// (`Said(None)`: nothing, or refused as out of bounds). When it is not
    /// known now (the Plugin is not loaded yet, or the call failed) nothing
    /// is changed: a restart does not take the annotations away.
    async fn wanted(&self, kube: &Kube, spec: &MachineSpec) -> Known {
        let name = &spec.provider.plugin;
        let Some(registered) = self.providers.get(name) else {
            return Known::NotLoaded;
        };
        let provider = &registered.provider;
        let config = spec.provider.config.to_string();
        let key = (provider.digest().to_string(), config.clone());
        match self.said.lock().expect("capacity lock").get(&key) {
            Some(Answer::Said(said)) => return Known::Said(said.clone()),
            Some(Answer::Failed(at)) if at.elapsed() < RETRY_FAILED => return Known::Unknown,
            _ => {}
        }
        let labels = (name.as_str(), provider.revision());
        let answer = timed_as(
            &kube.metrics,
            labels,
            "capacity",
            provider.capacity(&config),
        )
        .await;
        let said = match answer {
            Ok(Some(capacity)) => match annotations(&capacity) {
                Ok(a) => Some(a),
                Err(why) => {
                    tracing::warn!(plugin = %name, "capacity refused: {why}");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(plugin = %name, "capacity: {e}");
                self.remember(key, Answer::Failed(Instant::now()));
                return Known::Unknown;
            }
        };
        self.remember(key, Answer::Said(said.clone()));
        Known::Said(said)
    }

    fn remember(&self, key: (String, String), answer: Answer) {
        let mut cache = self.said.lock().expect("capacity lock");
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(key, answer);
    }

    /// Bring `object`'s capacity annotations to what its template's
    /// Plugin says (one merge patch, only when something changes). `true`:
    /// its Plugin is not loaded yet, so look again soon.
    pub(crate) async fn annotate<K>(
        &self,
        kube: &Kube,
        controller: &'static str,
        object: &K,
        spec: &MachineSpec,
    ) -> Result<bool, Error>
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let wanted = match self.wanted(kube, spec).await {
            Known::Said(said) => said,
            Known::Unknown => return Ok(false),
            Known::NotLoaded => return Ok(true),
        };
        let changes = plan(object.annotations(), wanted.as_ref(), &spec.provider.plugin);
        if changes.is_empty() {
            return Ok(false);
        }
        let annotations: serde_json::Map<String, serde_json::Value> = changes
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    v.map_or(serde_json::Value::Null, serde_json::Value::String),
                )
            })
            .collect();
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        let api: Api<K> =
            Api::namespaced(kube.client.clone(), &object.namespace().unwrap_or_default());
        api.patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(kube_err(format!(
            "cannot write the capacity annotations of {}",
            object.name_any()
        )))?;
        kube.metrics.wrote(controller, "patch");
        Ok(false)
    }
}
