//! The Node certificate approver: a machine's bootstrap token may become
//! that machine's Node and no other.
//!
//! kubeadm's approver signs a node client certificate for *any* Node name
//! asked with any bootstrap token of its group. Capstan's tokens are in a
//! group of their own (`--bootstrap-token-group`, default
//! `system:bootstrappers:capstan:machines`), which kubeadm does not
//! approve; this watch answers their CSRs instead: the requester
//! `system:bootstrap:<id>` is mapped to the Machine whose token it is (the
//! id derives from the Machine's uid), and the request is approved only if
//! it asks exactly for `system:node:<that Machine's name>`
//! ([`capstan_planner::bootstrap::node_csr`]); otherwise it is denied,
//! saying why. CSRs of other signers, of Nodes renewing their own
//! certificate and of tokens that are no Machine's are left alone.

use capstan_api::Machine;
use capstan_kit::Kube;
use capstan_kit::workload::ClusterKey;
use capstan_planner::bootstrap::{CsrDecision, node_csr};
use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};

/// Where CSRs are answered: the cluster Capstan runs in, or a workload
/// cluster (whose CSRs only its own Machines' tokens may have approved).
#[derive(Clone)]
pub(crate) struct Answering {
    /// The management cluster: Machines are read here.
    pub(crate) management: Kube,
    /// The workload cluster and its view (CSRs and Nodes are there).
    pub(crate) workload: Option<(ClusterKey, Kube)>,
}

impl Answering {
    /// The cluster Capstan runs in.
    pub(crate) fn here(kube: &Kube) -> Self {
        Answering {
            management: kube.clone(),
            workload: None,
        }
    }

    /// The cluster CSRs and Nodes are in.
    fn nodes(&self) -> &Kube {
        self.workload
            .as_ref()
            .map_or(&self.management, |(_, kube)| kube)
    }

    /// Whether `machine`'s Node lives in this cluster.
    fn holds(&self, machine: &Machine) -> bool {
        match &self.workload {
            None => machine.spec.cluster_name.is_none(),
            Some((key, _)) => {
                machine.spec.cluster_name.as_deref() == Some(key.name.as_str())
                    && machine.namespace().as_deref() == Some(key.namespace.as_str())
            }
        }
    }
}

/// Answer Machines' node client CSRs until `shutdown`.
pub(crate) async fn approver(at: Answering, shutdown: impl Future<Output = ()> + Send + 'static) {
    let api: Api<CertificateSigningRequest> = Api::all(at.nodes().client.clone());
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let answer = stream.for_each(|event| {
        let (at, api) = (at.clone(), api.clone());
        async move {
            match event {
                Ok(csr) => answer(&at, &api, &csr).await,
                Err(error) => tracing::debug!(%error, "CSR watch error; retrying"),
            }
        }
    });
    tokio::select! {
        () = answer => {}
        () = shutdown => {}
    }
}

/// Approve or deny one CSR, if it is a pending one Capstan answers.
async fn answer(
    at: &Answering,
    api: &Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
) {
    let decided = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| !c.is_empty());
    if decided {
        return;
    }
    let requester = csr.spec.username.clone().unwrap_or_default();
    let machine = requester
        .strip_prefix("system:bootstrap:")
        .and_then(|id| machine_of_token(at, id));
    let token_machine = machine.as_ref().map(|m| m.name_any());
    let decision = match crate::x509::request_subject(&csr.spec.request.0) {
        Ok(subject) => node_csr(
            &csr.spec.signer_name,
            &requester,
            token_machine.as_deref(),
            Some(&subject.common_name),
            &subject.organizations,
            csr.spec.usages.as_deref().unwrap_or_default(),
        ),
        // A Machine's token sent a request that cannot be read: denied,
        // saying why; anyone else's is not Capstan's to answer.
        Err(why) => match node_csr(
            &csr.spec.signer_name,
            &requester,
            token_machine.as_deref(),
            None,
            &[],
            &[],
        ) {
            CsrDecision::Ignore => CsrDecision::Ignore,
            _ => CsrDecision::Deny(why),
        },
    };
    // The Node name must be this Machine's alone, now: a certificate for
    // it is the Node's identity cluster-wide.
    let decision = match (decision, &machine) {
        (CsrDecision::Approve, Some(machine)) => match unique_identity(at, machine).await {
            Ok(None) => CsrDecision::Approve,
            Ok(Some(why)) => CsrDecision::Deny(why),
            Err(error) => {
                // Not answered: the kubelet's request stays pending (it
                // asks again), nothing is decided on a guess.
                tracing::warn!(csr = %csr.name_any(), %error, "node client CSR left pending");
                return;
            }
        },
        (decision, _) => decision,
    };
    let (type_, reason, message) = match decision {
        CsrDecision::Ignore => return,
        CsrDecision::Approve => (
            "Approved",
            "MachineBootstrapToken",
            format!(
                "approved by Capstan: the bootstrap token of Machine {} asks for its own Node",
                token_machine.unwrap_or_default()
            ),
        ),
        CsrDecision::Deny(why) => ("Denied", "NotTheMachinesNode", why),
    };
    let patch = serde_json::json!({
        "status": {"conditions": [{
            "type": type_, "status": "True", "reason": reason, "message": message,
        }]}
    });
    let name = csr.name_any();
    match api
        .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            at.management.metrics.wrote("csr", "approval");
            tracing::info!(csr = %name, decision = type_, %message, "node client CSR answered");
        }
        Err(error) => tracing::warn!(csr = %name, %error, "node client CSR not answered"),
    }
}

/// The Machine whose bootstrap token has this id, if one has.
fn machine_of_token(at: &Answering, id: &str) -> Option<std::sync::Arc<Machine>> {
    at.management
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| has_bootstrap_plugin(m) && at.holds(m))
        .find(|m| crate::machine::token_id(&m.uid().unwrap_or_default()) == id)
}

/// Whether `system:node:<machine's name>` is this Machine's alone, asked of
/// the API server (every namespace, every shard): no other Machine has its
/// name (Node names are cluster-wide; a namesake's token would become the
/// same Node), and no Node of that name is another instance's. `Ok(Some)`
/// says why not; `Err` when the API server could not be asked.
async fn unique_identity(at: &Answering, machine: &Machine) -> Result<Option<String>, String> {
    let name = machine.name_any();
    let namespace = machine.namespace().unwrap_or_default();
    let kube = &at.management;
    let mut asked = Api::<Machine>::all(kube.client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await;
    for _ in 0..2 {
        if asked.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        asked = Api::<Machine>::all(kube.client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await;
    }
    let namesakes =
        asked.map_err(|e| format!("cannot ask which Machines are named {name}: {e}"))?;
    // Node names are unique per cluster: only namesakes whose Nodes live
    // in the same cluster share the identity.
    if let Some(other) = namesakes
        .items
        .iter()
        .find(|m| m.namespace().unwrap_or_default() != namespace && at.holds(m))
    {
        return Ok(Some(format!(
            "Machines {namespace}/{name} and {}/{name} share a name, and a Node name is cluster-wide: no bootstrap token gets a certificate for system:node:{name} while both exist; rename one",
            other.namespace().unwrap_or_default()
        )));
    }
    let instance = machine
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref());
    if let Some(node) = at.nodes().stores.nodes.get(&ObjectRef::new(&name)) {
        let carried = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        if carried.is_some() && carried != instance {
            return Ok(Some(format!(
                "Node {name} exists and carries provider ID {}, not this Machine's instance {}: a certificate for system:node:{name} would let this instance act as that Node; delete the stale Node if its instance is gone",
                carried.unwrap_or_default(),
                instance.unwrap_or("(none recorded yet)")
            )));
        }
    }
    Ok(None)
}

fn has_bootstrap_plugin(m: &Machine) -> bool {
    m.spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.plugin.is_some())
}
