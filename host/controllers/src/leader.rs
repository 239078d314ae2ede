//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several
//! replicas only one reconciles.
//!
//! Start with [`Elector::acquire`], which returns once this replica holds
//! the Lease; then run the controllers next to [`Elector::hold`], which
//! renews it and returns only when it is lost; [`Elector::release`] hands it
//! over on shutdown. The timing follows client-go and controller-runtime:
//! a holder renews every retry period and gives up once it could not renew
//! for the renew deadline, which is shorter than the lease duration, so it
//! stops before any other replica may take over. Expiry is judged by how
//! long the Lease has stayed unchanged as seen by this replica (its own
//! clock), never by comparing clocks across machines. [`decide`] is the
//! pure part, tested without a cluster.

use crate::{Error, Metrics, kube_err};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Timing and identity of the election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Namespace of the Lease (Capstan's own).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (unique per process).
    pub identity: String,
    /// How long a Lease stays valid without renewal (default 15 s).
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up (10 s).
    pub renew_deadline: Duration,
    /// How often candidates retry and the holder renews (2 s).
    pub retry_period: Duration,
}

/// The parts of a Lease that decide who may hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Holder identity (`None` or empty: released).
    pub holder: Option<String>,
    /// Lease duration the holder announced.
    pub duration: Duration,
}

/// What a replica does with the Lease it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create,
    /// Released, expired or already ours: write ourselves in as holder.
    Take,
    /// Another replica holds it: look again after this long at most.
    Wait(Duration),
}

/// What to do with `record`, which has stayed unchanged for `unchanged_for`
/// as this replica observed it.
pub fn decide(record: Option<&Record>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(record) = record else {
        return Decision::Create;
    };
    match record.holder.as_deref() {
        None | Some("") => Decision::Take,
        Some(holder) if holder == me => Decision::Take,
        Some(_) if unchanged_for >= record.duration => Decision::Take,
        Some(_) => Decision::Wait(record.duration - unchanged_for),
    }
}

fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity,
        duration: Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        ),
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    metrics: Metrics,
    changed: Arc<Notify>,
    watch: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Elector {
    /// An elector for `config`; it reports through `metrics` (standby until
    /// it leads). It watches the Lease so that a released one is taken at
    /// once rather than at the next retry.
    pub fn new(client: Client, config: ElectionConfig, metrics: Metrics) -> Elector {
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let stream = watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", config.name)),
        );
        let watch = tokio::spawn(async move {
            stream
                .for_each(|_| async {
                    notify.notify_one();
                })
                .await;
        });
        metrics.set_leading(false);
        Elector {
            api,
            config,
            metrics,
            changed,
            watch,
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Wait until this replica holds the Lease. API errors are logged and
    /// retried (a candidate has nothing to lose by waiting).
    pub async fn acquire(&self) {
        let mut seen: Option<(Option<String>, Instant)> = None;
        loop {
            let wait = match self.try_acquire(&mut seen).await {
                Ok(None) => {
                    self.metrics.set_leading(true);
                    tracing::info!(identity = %self.config.identity, lease = %self.lease_name(), "leading");
                    return;
                }
                Ok(Some(wait)) => wait.min(self.config.retry_period),
                Err(error) => {
                    tracing::warn!(%error, "leader election: cannot read or write the Lease; retrying");
                    self.config.retry_period
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.changed.notified() => {}
            }
        }
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    /// One attempt: `Ok(None)` when this replica now holds the Lease,
    /// `Ok(Some(wait))` when another does.
    async fn try_acquire(
        &self,
        seen: &mut Option<(Option<String>, Instant)>,
    ) -> Result<Option<Duration>, Error> {
        let current = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(kube_err(format!("cannot read Lease {}", self.lease_name())))?;
        // Every write (a renewal too) changes the resourceVersion: the time
        // since it last changed is how long the holder has been silent.
        let version = current.as_ref().and_then(|l| l.resource_version());
        let unchanged_for = match seen {
            Some((v, since)) if *v == version => since.elapsed(),
            _ => {
                *seen = Some((version, Instant::now()));
                Duration::ZERO
            }
        };
        let record = current.as_ref().map(record_of);
        match (
            decide(record.as_ref(), &self.config.identity, unchanged_for),
            current,
        ) {
            (Decision::Wait(d), _) => Ok(Some(d)),
            (Decision::Create, _) | (Decision::Take, None) => self.create().await,
            (Decision::Take, Some(lease)) => {
                let transitions = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_transitions)
                    .unwrap_or(0);
                let ours = record.and_then(|r| r.holder).as_deref() == Some(&self.config.identity);
                let mut taken = lease.clone();
                taken.spec = Some(self.spec(if ours { transitions } else { transitions + 1 }));
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &taken)
                    .await
                {
                    Ok(_) => Ok(None),
                    // Another candidate wrote first.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(Duration::ZERO)),
                    Err(e) => Err(kube_err(format!("cannot take Lease {}", self.lease_name()))(e)),
                }
            }
        }
    }

    async fn create(&self) -> Result<Option<Duration>, Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(self.spec(0)),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(Duration::ZERO)),
            Err(e) => Err(kube_err(format!(
                "cannot create Lease {}",
                self.lease_name()
            ))(e)),
        }
    }

    fn spec(&self, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(now()),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Renew the Lease every retry period; return when it is lost: another
    /// replica holds it, or no renewal succeeded for the renew deadline.
    /// The caller must stop reconciling at once when this returns.
    pub async fn hold(&self) -> String {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            match self.renew().await {
                Ok(()) => last_renewed = Instant::now(),
                Err(Lost(why)) => {
                    self.metrics.set_leading(false);
                    return why;
                }
                Err(Retry(error)) => {
                    tracing::warn!(%error, "leader election: renewal failed; retrying");
                    if last_renewed.elapsed() + self.config.retry_period
                        > self.config.renew_deadline
                    {
                        self.metrics.set_leading(false);
                        return format!(
                            "could not renew Lease {} for {:?} (renew deadline): {error}",
                            self.lease_name(),
                            self.config.renew_deadline
                        );
                    }
                }
            }
        }
    }

    async fn renew(&self) -> Result<(), RenewError> {
        let lease = tokio::time::timeout(self.config.retry_period, self.api.get(&self.config.name))
            .await
            .map_err(|_| Retry("reading the Lease timed out".into()))?
            .map_err(|e| match e {
                kube::Error::Api(ref a) if a.code == 404 => {
                    Lost(format!("Lease {} was deleted", self.lease_name()))
                }
                e => Retry(e.to_string()),
            })?;
        let holder = record_of(&lease).holder;
        if holder.as_deref() != Some(&self.config.identity) {
            return Err(Lost(format!(
                "Lease {} is now held by {}",
                self.lease_name(),
                holder.unwrap_or_else(|| "nobody".into())
            )));
        }
        let mut renewed = lease;
        if let Some(spec) = renewed.spec.as_mut() {
            spec.renew_time = Some(now());
        }
        tokio::time::timeout(
            self.config.retry_period,
            self.api
                .replace(&self.config.name, &PostParams::default(), &renewed),
        )
        .await
        .map_err(|_| Retry("renewing the Lease timed out".into()))?
        .map(drop)
        .map_err(|e| Retry(e.to_string()))
    }

    /// Hand the Lease over: clear the holder so a standby takes it at once
    /// instead of waiting for it to expire. Best effort.
    pub async fn release(&self) {
        self.metrics.set_leading(false);
        let result = async {
            let mut lease = self.api.get(&self.config.name).await?;
            if record_of(&lease).holder.as_deref() != Some(&self.config.identity) {
                return Ok(());
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(now());
            }
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
                .map(drop)
        }
        .await;
        match result {
            Ok(()) => tracing::info!(lease = %self.lease_name(), "released the leader Lease"),
            Err(error) => {
                tracing::warn!(%error, "cannot release the leader Lease; it expires on its own")
            }
        }
    }
}

enum RenewError {
    Lost(String),
    Retry(String),
}
use RenewError::{Lost, Retry};

/// A process-unique identity: the host (or pod) name and a random suffix,
/// as client-go does, so a restarted replica is a new candidate.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "capstan".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{:x}{nanos:08x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, secs: u64) -> Record {
        Record {
            holder: Some(by.into()),
            duration: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_missing_lease_is_created() {
        assert_eq!(decide(None, "a", Duration::ZERO), Decision::Create);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        for holder in [None, Some(String::new())] {
            let r = Record {
                holder,
                duration: Duration::from_secs(1),
            };
            assert_eq!(decide(Some(&r), "a", Duration::ZERO), Decision::Take);
        }
    }

    #[test]
    fn a_live_lease_of_another_is_waited_for_until_it_expires() {
        let r = held("b", 15);
        assert_eq!(
            decide(Some(&r), "a", Duration::from_secs(4)),
            Decision::Wait(Duration::from_secs(11))
        );
        assert_eq!(
            decide(Some(&r), "a", Duration::from_secs(15)),
            Decision::Take
        );
        assert_eq!(
            decide(Some(&r), "a", Duration::from_secs(40)),
            Decision::Take
        );
    }

    #[test]
    fn our_own_lease_is_ours() {
        assert_eq!(
            decide(Some(&held("a", 15)), "a", Duration::ZERO),
            Decision::Take
        );
    }

    #[test]
    fn identities_differ_between_processes_on_one_host() {
        let a = default_identity();
        std::thread::sleep(Duration::from_millis(1));
        assert_ne!(a, default_identity());
    }
}
