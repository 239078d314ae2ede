//! How a day-two command reaches the API server, with kubectl's flags:
//! `--kubeconfig` (else `$KUBECONFIG`, else `~/.kube/config`, else the
//! in-cluster account), `--context`, and `-n/--namespace` (else the
//! context's namespace, else `default`).

use anyhow::Context as _;
use std::path::PathBuf;

/// The flags, flattened into each command that talks to a cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, else `default`).
    #[arg(short, long)]
    pub namespace: Option<String>,
}

impl Connection {
    /// A client, and the namespace commands act in.
    pub async fn connect(&self) -> anyhow::Result<(kube::Client, String)> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .with_context(|| match &self.context {
                        Some(c) => {
                            format!("kubeconfig {}: context {c:?} is not usable", path.display())
                        }
                        None => format!("kubeconfig {} is not usable", path.display()),
                    })?
            }
            (None, Some(context)) => kube::Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("kubeconfig context {context:?} is not usable"))?,
            (None, None) => crate::controller::config(None).await?,
        };
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
        Ok((client, namespace))
    }
}

/// The kinds day-two commands name, as kubectl spells them (`md/NAME`,
/// `machinedeployment/NAME`, `machinedeployments/NAME`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    MachineDeployment,
    MachineSet,
    Machine,
    Addon,
    Cluster,
}

impl Kind {
    /// Every spelling accepted, for error messages.
    const SPELLINGS: [(&'static str, Kind); 14] = [
        ("md", Kind::MachineDeployment),
        ("machinedeployment", Kind::MachineDeployment),
        ("machinedeployments", Kind::MachineDeployment),
        ("ms", Kind::MachineSet),
        ("machineset", Kind::MachineSet),
        ("machinesets", Kind::MachineSet),
        ("ma", Kind::Machine),
        ("machine", Kind::Machine),
        ("machines", Kind::Machine),
        ("addon", Kind::Addon),
        ("addons", Kind::Addon),
        ("cl", Kind::Cluster),
        ("cluster", Kind::Cluster),
        ("clusters", Kind::Cluster),
    ];

    /// The lower-case singular name kubectl prints (`machinedeployment`).
    pub fn noun(self) -> &'static str {
        match self {
            Kind::MachineDeployment => "machinedeployment",
            Kind::MachineSet => "machineset",
            Kind::Machine => "machine",
            Kind::Addon => "addon",
            Kind::Cluster => "cluster",
        }
    }
}

/// Parse `KIND/NAME` (or a bare `NAME` of `default_kind`) into one of
/// `allowed` kinds; the error says what to write instead.
pub fn parse_reference(
    reference: &str,
    default_kind: Option<Kind>,
    allowed: &[Kind],
) -> anyhow::Result<(Kind, String)> {
    // The short spelling of each kind (the table lists it first).
    let spellings = || {
        let mut seen = vec![];
        for (s, k) in Kind::SPELLINGS {
            if allowed.contains(&k) && !seen.iter().any(|(_, seen_kind)| *seen_kind == k) {
                seen.push((s, k));
            }
        }
        seen.iter()
            .map(|(s, _)| format!("{s}/NAME"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (kind, name) = match (reference.split_once('/'), default_kind) {
        (Some((kind, name)), _) => {
            let kind = kind.to_ascii_lowercase();
            let kind = Kind::SPELLINGS
                .iter()
                .find(|(s, k)| *s == kind && allowed.contains(k))
                .map(|(_, k)| *k)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{reference:?}: unknown kind {kind:?}; write {}",
                        spellings()
                    )
                })?;
            (kind, name)
        }
        (None, Some(kind)) => (kind, reference),
        (None, None) => anyhow::bail!("{reference:?}: say which kind; write {}", spellings()),
    };
    if name.is_empty() || name.contains('/') {
        anyhow::bail!(
            "{reference:?}: the name is missing or has a '/'; write {}",
            spellings()
        );
    }
    Ok((kind, name.to_string()))
}

/// Clap's check of a deployment reference (`md/NAME` or `NAME`), so a
/// wrong one is a usage error (exit 2) like any other bad argument.
pub fn deployment_reference(reference: &str) -> Result<String, String> {
    parse_reference(
        reference,
        Some(Kind::MachineDeployment),
        &[Kind::MachineDeployment],
    )
    .map(|_| reference.to_string())
    .map_err(|e| e.to_string())
}

/// Clap's check of what `describe` names.
pub fn describable_reference(reference: &str) -> Result<String, String> {
    parse_reference(reference, None, &DESCRIBABLE)
        .map(|_| reference.to_string())
        .map_err(|e| e.to_string())
}

/// The kinds `describe` shows.
pub const DESCRIBABLE: [Kind; 5] = [
    Kind::MachineDeployment,
    Kind::MachineSet,
    Kind::Machine,
    Kind::Addon,
    Kind::Cluster,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_read_as_kubectl_reads_them() {
        let all = [
            Kind::MachineDeployment,
            Kind::MachineSet,
            Kind::Machine,
            Kind::Addon,
        ];
        assert_eq!(
            parse_reference("md/pool", None, &all).unwrap(),
            (Kind::MachineDeployment, "pool".into())
        );
        assert_eq!(
            parse_reference("MachineSets/a-1", None, &all).unwrap(),
            (Kind::MachineSet, "a-1".into())
        );
        assert_eq!(
            parse_reference("pool", Some(Kind::MachineDeployment), &all).unwrap(),
            (Kind::MachineDeployment, "pool".into())
        );
        let e = parse_reference("ms/a", None, &[Kind::MachineDeployment]).unwrap_err();
        assert!(e.to_string().contains("write md/NAME"), "{e}");
        let e = parse_reference("pool", None, &all).unwrap_err();
        assert!(e.to_string().contains("say which kind"), "{e}");
        assert!(parse_reference("md/", None, &all).is_err());
        assert!(parse_reference("md/a/b", None, &all).is_err());
    }
}
