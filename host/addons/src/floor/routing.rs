//! Objects that route traffic: admission webhooks, CRD conversion webhooks
//! and APIServices send the API server's requests (with every object they
//! carry) to a Service, which must be one the render creates; a webhook
//! `url` outside the cluster is refused. A Service may not claim
//! `externalIPs` (it would intercept traffic to those addresses from every
//! pod). A rendered Namespace may not lower the Pod Security level below
//! the grant's through its `pod-security.kubernetes.io/enforce` label.

use super::Render;
use crate::{AddonGrants, Object};
use capstan_api::PodSecurityLevel;
use serde_json::Value;

/// Check one object if it routes traffic or labels a Namespace.
pub(super) fn check(
    object: &Object,
    render: &Render<'_>,
    grants: &AddonGrants,
    refuse: &mut impl FnMut(String),
) {
    let value = &object.value;
    match (object.group(), object.kind.as_str()) {
        (
            "admissionregistration.k8s.io",
            "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration",
        ) => {
            for (i, webhook) in value["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                client(
                    &format!("webhooks[{i}]"),
                    &webhook["clientConfig"],
                    render,
                    refuse,
                );
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            let conversion = &value["spec"]["conversion"];
            if conversion["strategy"] == "Webhook" {
                // v1 nests it under `webhook`; v1beta1 has `webhookClientConfig`.
                let config = match conversion["webhook"]["clientConfig"] {
                    Value::Null => &conversion["webhookClientConfig"],
                    ref config => config,
                };
                client("its conversion webhook", config, render, refuse);
            }
        }
        ("apiregistration.k8s.io", "APIService") => {
            let service = &value["spec"]["service"];
            if !service.is_null() {
                service_in_render("it", service, render, refuse);
            }
        }
        ("", "Service")
            if value["spec"]["externalIPs"]
                .as_array()
                .is_some_and(|ips| !ips.is_empty()) =>
        {
            refuse(
                "sets spec.externalIPs, which would intercept traffic to those addresses from every pod; no addon grant allows it"
                    .into(),
            );
        }
        ("", "Namespace") => {
            let label = "pod-security.kubernetes.io/enforce";
            if let Some(level) = value["metadata"]["labels"][label].as_str() {
                let strictness = [
                    PodSecurityLevel::Privileged,
                    PodSecurityLevel::Baseline,
                    PodSecurityLevel::Restricted,
                ]
                .into_iter()
                .find(|l| l.label_value() == level)
                .map(PodSecurityLevel::strictness);
                let granted = grants.pod_security;
                if strictness.is_none_or(|s| s < granted.strictness()) {
                    refuse(format!(
                        "labels {label}={level}, weaker than Pod Security level {granted:?} (the Plugin's spec.grants.podSecurity)"
                    ));
                }
            }
        }
        _ => {}
    }
}

/// A webhook client config: a Service of the render, never a URL.
fn client(what: &str, config: &Value, render: &Render<'_>, refuse: &mut impl FnMut(String)) {
    if let Some(url) = config["url"].as_str() {
        refuse(format!(
            "{what} sends requests to url {url:?}; webhooks of an addon may only call Services the render creates"
        ));
    } else {
        service_in_render(what, &config["service"], render, refuse);
    }
}

fn service_in_render(
    what: &str,
    service: &Value,
    render: &Render<'_>,
    refuse: &mut impl FnMut(String),
) {
    let namespace = service["namespace"].as_str().unwrap_or_default();
    let name = service["name"].as_str().unwrap_or_default();
    if !render.has("", "Service", Some(namespace), name) {
        refuse(format!(
            "{what} sends requests to Service {namespace}/{name}, which the render does not create"
        ));
    }
}
