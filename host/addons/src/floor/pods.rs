//! Pods: the Pod Security Standards controls, and whose ServiceAccount a
//! pod runs as.
//!
//! The controls follow the upstream `pod-security-admission` list: for
//! `Baseline`, HostProcess, host namespaces, privileged containers,
//! capabilities, hostPath volumes, host ports, AppArmor, SELinux, `/proc`
//! mount type, seccomp and sysctls; `Restricted` adds volume types,
//! privilege escalation, running as non-root (and not as uid 0), a required
//! seccomp profile and dropped capabilities. Every pod-bearing object is
//! checked where its pod spec is: the built-in workload kinds by group and
//! kind, custom kinds where the grant's `podSpecPaths` says.

use super::{Render, service_account_lent};
use crate::{AddonGrants, Object};
use capstan_api::PodSecurityLevel;
use serde_json::Value;

/// Capabilities the Baseline level lets a container add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls the Baseline level allows (namespaced, isolated between pods).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types the Baseline level allows.
const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume sources the Restricted level allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

/// Check one object: its pods (if it bears any) and, for a ServiceAccount
/// token Secret, whose token it asks for.
pub(super) fn check(
    object: &Object,
    render: &Render<'_>,
    grants: &AddonGrants,
    refuse: &mut impl FnMut(String),
) {
    let namespace = object.namespace.as_deref().unwrap_or_default();
    if object.group().is_empty()
        && object.kind == "Secret"
        && object.value["type"] == "kubernetes.io/service-account-token"
    {
        let account = object.value["metadata"]["annotations"]["kubernetes.io/service-account.name"]
            .as_str()
            .unwrap_or_default();
        if !service_account_lent(render, grants, namespace, account) {
            refuse(format!(
                "asks for a token of ServiceAccount {namespace}/{account}, which the render does not create and spec.grants.serviceAccounts does not name"
            ));
        }
        return;
    }
    let Some(spec_pointer) = crate::pod_spec_pointer(object, &grants.pod_spec_paths) else {
        return;
    };
    let Some(spec) = object.value.pointer(&spec_pointer) else {
        return;
    };
    for account in service_accounts(spec) {
        if !service_account_lent(render, grants, namespace, account) {
            refuse(format!(
                "runs as ServiceAccount {namespace}/{account}, which the render does not create and spec.grants.serviceAccounts does not name"
            ));
        }
    }
    let level = grants.pod_security;
    if level == PodSecurityLevel::Privileged {
        return;
    }
    // The pod's metadata sits beside its spec (`…/template/metadata`).
    let annotations = spec_pointer.strip_suffix("/spec").and_then(|parent| {
        object
            .value
            .pointer(&format!("{parent}/metadata/annotations"))
    });
    let mut pod = Pod {
        above: format!("above Pod Security level {level:?} (the Plugin's spec.grants.podSecurity)"),
        refuse,
    };
    pod.baseline(spec, annotations);
    if level == PodSecurityLevel::Restricted {
        pod.restricted(spec);
    }
}

/// The ServiceAccounts a pod spec runs as: `serviceAccountName`, and its
/// deprecated alias `serviceAccount` where it differs; `default` when
/// neither is set.
fn service_accounts(spec: &Value) -> Vec<&str> {
    let named = |field: &str| spec[field].as_str().filter(|s| !s.is_empty());
    let mut accounts: Vec<&str> = [named("serviceAccountName"), named("serviceAccount")]
        .into_iter()
        .flatten()
        .collect();
    accounts.dedup();
    if accounts.is_empty() {
        accounts.push("default");
    }
    accounts
}

/// Every container of a pod spec: regular, init and ephemeral.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    CONTAINER_LISTS
        .into_iter()
        .flat_map(move |list| spec[list].as_array().into_iter().flatten())
}

fn container_name(container: &Value) -> &str {
    container["name"].as_str().unwrap_or("?")
}

struct Pod<'r, F> {
    above: String,
    refuse: &'r mut F,
}

impl<F: FnMut(String)> Pod<'_, F> {
    fn no(&mut self, what: String) {
        let above = &self.above;
        (self.refuse)(format!("{what}, {above}"));
    }

    /// The Baseline controls (pod-security-admission's `baseline` list).
    fn baseline(&mut self, spec: &Value, annotations: Option<&Value>) {
        let pod_security = &spec["securityContext"];
        for field in ["hostPID", "hostIPC", "hostNetwork"] {
            if spec[field] == true {
                self.no(format!("sets {field}: true"));
            }
        }
        if pod_security["windowsOptions"]["hostProcess"] == true {
            self.no("sets securityContext.windowsOptions.hostProcess: true".into());
        }
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            if volume.get("hostPath").is_some() {
                self.no(format!(
                    "mounts hostPath volume {}",
                    volume["name"].as_str().unwrap_or("?")
                ));
            }
        }
        self.security_context("the pod", pod_security);
        for sysctl in pod_security["sysctls"].as_array().into_iter().flatten() {
            let name = sysctl["name"].as_str().unwrap_or_default();
            if !SAFE_SYSCTLS.contains(&name) {
                self.no(format!("sets sysctl {name:?}, which is not a safe sysctl"));
            }
        }
        for (key, value) in annotations.and_then(Value::as_object).into_iter().flatten() {
            let value = value.as_str().unwrap_or_default();
            if key.starts_with("container.apparmor.security.beta.kubernetes.io/")
                && value != "runtime/default"
                && !value.starts_with("localhost/")
            {
                self.no(format!("annotation {key}: {value:?} overrides AppArmor"));
            }
            if (key == "seccomp.security.alpha.kubernetes.io/pod"
                || key.starts_with("container.seccomp.security.alpha.kubernetes.io/"))
                && value == "unconfined"
            {
                self.no(format!("annotation {key}: unconfined disables seccomp"));
            }
        }
        for container in containers(spec) {
            let name = container_name(container);
            let security = &container["securityContext"];
            let who = format!("container {name}");
            if security["privileged"] == true {
                self.no(format!("container {name} is privileged"));
            }
            if security["windowsOptions"]["hostProcess"] == true {
                self.no(format!(
                    "container {name} is a Windows HostProcess container"
                ));
            }
            for cap in added_capabilities(security) {
                let bare = cap.trim_start_matches("CAP_");
                if !BASELINE_CAPABILITIES.contains(&bare) {
                    self.no(format!("container {name} adds capability {cap}"));
                }
            }
            for port in container["ports"].as_array().into_iter().flatten() {
                if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
                    self.no(format!(
                        "container {name} uses hostPort {}",
                        port["hostPort"]
                    ));
                }
            }
            if let Some(mount) = security["procMount"].as_str()
                && !mount.is_empty()
                && mount != "Default"
            {
                self.no(format!("container {name} sets procMount: {mount}"));
            }
            self.security_context(&who, security);
        }
    }

    /// AppArmor, SELinux and seccomp, which a pod and each container set alike.
    fn security_context(&mut self, who: &str, security: &Value) {
        if let Some(kind) = security["appArmorProfile"]["type"].as_str()
            && kind != "RuntimeDefault"
            && kind != "Localhost"
        {
            self.no(format!("{who} sets appArmorProfile.type: {kind}"));
        }
        let selinux = &security["seLinuxOptions"];
        if let Some(kind) = selinux["type"].as_str()
            && !SELINUX_TYPES.contains(&kind)
        {
            self.no(format!("{who} sets seLinuxOptions.type: {kind}"));
        }
        for field in ["user", "role"] {
            if let Some(value) = selinux[field].as_str()
                && !value.is_empty()
            {
                self.no(format!("{who} sets seLinuxOptions.{field}: {value}"));
            }
        }
        if security["seccompProfile"]["type"] == "Unconfined" {
            self.no(format!("{who} sets seccompProfile.type: Unconfined"));
        }
    }

    /// The Restricted controls, on top of Baseline's.
    fn restricted(&mut self, spec: &Value) {
        let pod_security = &spec["securityContext"];
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().unwrap_or("?");
            for source in volume.as_object().into_iter().flatten().map(|(k, _)| k) {
                // hostPath is Baseline's, refused already.
                if source != "name"
                    && source != "hostPath"
                    && !RESTRICTED_VOLUMES.contains(&source.as_str())
                {
                    self.no(format!("volume {name} is of type {source}"));
                }
            }
        }
        let pod_non_root = pod_security["runAsNonRoot"].as_bool();
        if pod_non_root == Some(false) {
            self.no("the pod sets runAsNonRoot: false".into());
        }
        if pod_security["runAsUser"] == 0 {
            self.no("the pod sets runAsUser: 0".into());
        }
        let pod_seccomp = confined(pod_security);
        for container in containers(spec) {
            let name = container_name(container);
            let security = &container["securityContext"];
            if security["allowPrivilegeEscalation"] != false {
                self.no(format!(
                    "container {name} does not set allowPrivilegeEscalation: false"
                ));
            }
            match security["runAsNonRoot"].as_bool() {
                Some(false) => self.no(format!("container {name} sets runAsNonRoot: false")),
                None if pod_non_root != Some(true) => self.no(format!(
                    "container {name} does not set runAsNonRoot: true (nor does the pod)"
                )),
                _ => {}
            }
            if security["runAsUser"] == 0 {
                self.no(format!("container {name} sets runAsUser: 0"));
            }
            if !pod_seccomp && !confined(security) {
                self.no(format!(
                    "container {name} sets no seccompProfile.type RuntimeDefault or Localhost (nor does the pod)"
                ));
            }
            let drops_all = security["capabilities"]["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|c| c == "ALL"));
            if !drops_all {
                self.no(format!("container {name} does not drop capability ALL"));
            }
            for cap in added_capabilities(security) {
                let bare = cap.trim_start_matches("CAP_");
                // Those beyond Baseline's list are refused already.
                if bare != "NET_BIND_SERVICE" && BASELINE_CAPABILITIES.contains(&bare) {
                    self.no(format!("container {name} adds capability {cap}"));
                }
            }
        }
    }
}

fn added_capabilities(security: &Value) -> impl Iterator<Item = &str> {
    security["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn confined(security: &Value) -> bool {
    matches!(
        security["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault" | "Localhost")
    )
}
