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
use capstan_planner::bootstrap::{CsrDecision, node_csr};
use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};

/// Answer Machines' node client CSRs until `shutdown`.
pub(crate) async fn approver(kube: Kube, shutdown: impl Future<Output = ()> + Send + 'static) {
    let api: Api<CertificateSigningRequest> = Api::all(kube.client.clone());
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let answer = stream.for_each(|event| {
        let (kube, api) = (kube.clone(), api.clone());
        async move {
            match event {
                Ok(csr) => answer(&kube, &api, &csr).await,
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
    kube: &Kube,
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
    let token_machine = requester
        .strip_prefix("system:bootstrap:")
        .and_then(|id| machine_of_token(kube, id));
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
            kube.metrics.wrote("csr", "approval");
            tracing::info!(csr = %name, decision = type_, %message, "node client CSR answered");
        }
        Err(error) => tracing::warn!(csr = %name, %error, "node client CSR not answered"),
    }
}

/// The name (`namespace/name` is not needed: the Node name is the Machine's
/// name) of the Machine whose bootstrap token has this id, if one has.
fn machine_of_token(kube: &Kube, id: &str) -> Option<String> {
    kube.stores
        .machines
        .state()
        .iter()
        .filter(|m| has_bootstrap_plugin(m))
        .find(|m| crate::machine::token_id(&m.uid().unwrap_or_default()) == id)
        .map(|m| m.name_any())
}

fn has_bootstrap_plugin(m: &Machine) -> bool {
    m.spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.plugin.is_some())
}
