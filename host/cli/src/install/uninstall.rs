//! `capstan uninstall`: delete what `install` created, the shared objects
//! only with the last controller Deployment, refusing while Machines still
//! hold finalizers unless `--force`.

use super::*;

/// Flags of `capstan uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Namespace Capstan was installed in.
    #[arg(long, default_value = crate::controller::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Remove only the shard installed with this `--watch-filter` (its
    /// Deployment; its Machines must be gone first). The shared objects go
    /// with the last controller Deployment in the namespace.
    #[arg(long, value_name = "VALUE", value_parser = parse_watch_filter)]
    pub watch_filter: Option<String>,
    /// Remove the Machines' finalizers and go on although Machines remain:
    /// their cloud instances are left behind.
    #[arg(long)]
    pub force: bool,
    /// Kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

async fn delete<K>(api: Api<K>, name: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let kind = K::kind(&()).to_lowercase();
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => println!("{kind}/{name} deleted"),
        Err(kube::Error::Api(e)) if e.code == 404 => println!("{kind}/{name} not found"),
        Err(e) => return Err(e).with_context(|| format!("cannot delete {kind}/{name}")),
    }
    Ok(())
}

/// Remove `finalizer` (the controller's own, and only it) from every object
/// of `api` that carries it. A missing CRD means there is nothing to release.
async fn release_finalizers<K>(api: Api<K>, finalizer: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let kind = K::kind(&()).to_lowercase();
    let items = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {kind}s")),
    };
    for obj in items {
        // Tested first, so a list someone else changed meanwhile is not
        // overwritten (the next uninstall tries again).
        let change = capstan_kit::write::FinalizerChange::Remove;
        let Some(patch) = capstan_kit::write::finalizer_patch(obj.finalizers(), finalizer, change)
        else {
            continue;
        };
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        Api::<K>::namespaced(api.clone().into_client(), &ns)
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .with_context(|| {
                format!("cannot remove the finalizer {finalizer} of {kind} {ns}/{name}")
            })?;
        println!("{kind}/{name} ({ns}): finalizer {finalizer} removed");
    }
    Ok(())
}

/// The Machines this uninstall would leave without a controller that
/// still hold finalizers: refused (their instances would leak), or with
/// `--force` released, each with a warning.
async fn release_held(
    client: &kube::Client,
    args: &UninstallArgs,
    others: &[String],
) -> anyhow::Result<()> {
    let filter = args.watch_filter.as_deref();
    let ours_to_hold = |m: &Machine| {
        let label = m.labels().get(capstan_controllers::LABEL_WATCH_FILTER);
        match filter {
            Some(value) => label.map(String::as_str) == Some(value),
            None => others.is_empty() || label.is_none(),
        }
    };
    let machines: Api<Machine> = Api::all(client.clone());
    let held: Vec<Machine> = match machines.list(&Default::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|m| !m.finalizers().is_empty() && ours_to_hold(m))
            .collect(),
        // No Machine CRD: nothing can be held.
        Err(kube::Error::Api(e)) if e.code == 404 => vec![],
        Err(e) => return Err(e).context("cannot list Machines"),
    };
    if !held.is_empty() {
        let names: Vec<String> = held
            .iter()
            .take(10)
            .map(|m| format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any()))
            .collect();
        if !args.force {
            anyhow::bail!(
                "{} Machine(s) still hold finalizers ({}{}): their instances would leak. \
                 Delete their MachineDeployments and MachineSets and wait until the Machines are gone, \
                 or pass --force to drop the finalizers and leave the instances behind",
                held.len(),
                names.join(", "),
                if held.len() > names.len() {
                    ", …"
                } else {
                    ""
                }
            );
        }
        for m in &held {
            let api: Api<Machine> =
                Api::namespaced(client.clone(), &m.namespace().unwrap_or_default());
            api.patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } })),
            )
            .await
            .with_context(|| format!("cannot remove the finalizers of Machine {}", m.name_any()))?;
            eprintln!(
                "warning: removed the finalizers of Machine {}/{}; its instance is left behind",
                m.namespace().unwrap_or_default(),
                m.name_any()
            );
        }
    }
    Ok(())
}

/// The ServiceAccount's rules and bindings, everywhere `install` made
/// them: its namespace, the cluster, the fixed system namespaces, the
/// bootstrappers' binding, and the tenant and Machine namespaces.
async fn delete_rbac(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    delete(Api::<RoleBinding>::namespaced(client.clone(), ns), NAME).await?;
    delete(Api::<Role>::namespaced(client.clone(), ns), NAME).await?;
    delete(Api::<ClusterRoleBinding>::all(client.clone()), NAME).await?;
    delete(Api::<ClusterRole>::all(client.clone()), NAME).await?;
    for fixed in rbac::fixed_namespaces() {
        delete(Api::<RoleBinding>::namespaced(client.clone(), fixed), NAME).await?;
        delete(Api::<Role>::namespaced(client.clone(), fixed), NAME).await?;
    }
    delete(
        Api::<ClusterRoleBinding>::all(client.clone()),
        MACHINE_BOOTSTRAPPERS_BINDING,
    )
    .await?;
    // The tenant and machine namespaces' bindings, wherever they were made.
    for (binding, role) in [
        (TENANT_BINDING, capstan_addons::engine::TENANT_ROLE),
        (MACHINE_NAMESPACE_ROLE, MACHINE_NAMESPACE_ROLE),
    ] {
        let bindings = Api::<RoleBinding>::all(client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={binding}")))
            .await
            .with_context(|| format!("cannot list the RoleBindings {binding}"))?;
        for found in bindings.items {
            let namespace = found.namespace().unwrap_or_default();
            delete(
                Api::<RoleBinding>::namespaced(client.clone(), &namespace),
                binding,
            )
            .await?;
        }
        delete(Api::<ClusterRole>::all(client.clone()), role).await?;
    }
    Ok(())
}

/// `capstan uninstall`.
pub async fn uninstall(args: UninstallArgs) -> anyhow::Result<ExitCode> {
    let client = crate::controller::client(args.kubeconfig.as_ref()).await?;
    let ns = args.namespace.as_str();
    let ours = deployment_name(args.watch_filter.as_deref());
    // Other controller Deployments (shards) in the namespace keep the
    // shared objects, and their Machines are theirs to hold.
    let others: Vec<String> = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=capstan"))
        .await
        .with_context(|| format!("cannot list the controller Deployments in namespace {ns}"))?
        .items
        .into_iter()
        .map(|d| d.name_any())
        .filter(|name| *name != ours)
        .collect();
    release_held(&client, &args, &others).await?;
    delete(Api::<Deployment>::namespaced(client.clone(), ns), &ours).await?;
    if !others.is_empty() {
        println!(
            "kept the namespace {ns}, its ServiceAccount and RBAC, and the CRDs: \
             other controller Deployments use them ({}); uninstall those to remove everything",
            others.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    delete_rbac(&client, ns).await?;
    delete(Api::<ServiceAccount>::namespaced(client.clone(), ns), NAME).await?;
    // No Machine is held any more (checked above), so the sets' and
    // deployments' finalizers guard nothing; with the controller and its
    // rights gone, nobody would remove them and the CRDs would never go.
    let finalizer = capstan_api::MACHINESET_FINALIZER;
    let sets = Api::<capstan_api::MachineSet>::all(client.clone());
    release_finalizers(sets, finalizer).await?;
    let finalizer = capstan_api::MACHINEDEPLOYMENT_FINALIZER;
    let deployments = Api::<capstan_api::MachineDeployment>::all(client.clone());
    release_finalizers(deployments, finalizer).await?;
    for crd in capstan_api::crds() {
        delete(
            Api::<CustomResourceDefinition>::all(client.clone()),
            &crd.name_any(),
        )
        .await?;
    }
    delete(Api::<Namespace>::all(client), ns).await?;
    Ok(ExitCode::SUCCESS)
}
