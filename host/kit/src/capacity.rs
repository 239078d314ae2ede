//! What a provider says one instance of a configuration offers, as the
//! cluster-autoscaler's scale-from-zero annotations
//! (`capacity.cluster-autoscaler.kubernetes.io/*`, read from a
//! MachineDeployment or a MachineSet no deployment owns). The plugin's
//! answer is a claim: [`annotations`] bounds every number and formats it
//! itself, so no text of the plugin's reaches an annotation but a checked
//! GPU type. Start with [`annotations`], then [`plan`] (which keys the host
//! may write on one object).

use capstan_runtime::types::InstanceCapacity;
use std::collections::BTreeMap;

/// The autoscaler's annotation keys (its `clusterapi_utils.go`).
pub const CPU: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
/// Memory.
pub const MEMORY: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";
/// Local disk.
pub const EPHEMERAL_DISK: &str = "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk";
/// Pods per Node.
pub const MAX_PODS: &str = "capacity.cluster-autoscaler.kubernetes.io/maxPods";
/// GPUs per Node.
pub const GPU_COUNT: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-count";
/// Their type.
pub const GPU_TYPE: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-type";
/// Which capacity keys the host wrote (comma-separated, with the Plugin):
/// those it keeps current; any other is the user's and never touched.
pub const WRITTEN_BY_HOST: &str = "capstan.dev/capacity-from";

/// Bounds far above any instance type, so a plugin cannot make the
/// autoscaler believe in an absurd machine.
const MAX_CPU_MILLIS: u32 = 4_096_000;
const MAX_MEMORY_MIB: u64 = 64 * 1024 * 1024;
const MAX_DISK_MIB: u64 = 1024 * 1024 * 1024;
const MAX_PODS_BOUND: u32 = 10_000;
const MAX_GPUS: u32 = 1_024;

/// The annotations `capacity` stands for, or what is out of bounds.
pub fn annotations(capacity: &InstanceCapacity) -> Result<BTreeMap<&'static str, String>, String> {
    fn within<T: PartialOrd + std::fmt::Display>(
        field: &str,
        value: T,
        low: T,
        high: T,
    ) -> Result<T, String> {
        if value < low || value > high {
            return Err(format!(
                "{field} {value} is outside {low}..={high}; the plugin's capacity is not written"
            ));
        }
        Ok(value)
    }
    let mut out = BTreeMap::new();
    let cpu = within("cpu-millis", capacity.cpu_millis, 1, MAX_CPU_MILLIS)?;
    out.insert(
        CPU,
        if cpu % 1000 == 0 {
            (cpu / 1000).to_string()
        } else {
            format!("{cpu}m")
        },
    );
    let memory = within("memory-mib", capacity.memory_mib, 1, MAX_MEMORY_MIB)?;
    out.insert(MEMORY, format!("{memory}Mi"));
    if let Some(disk) = capacity.ephemeral_disk_mib {
        let disk = within("ephemeral-disk-mib", disk, 1, MAX_DISK_MIB)?;
        out.insert(EPHEMERAL_DISK, format!("{disk}Mi"));
    }
    if let Some(pods) = capacity.max_pods {
        let pods = within("max-pods", pods, 1, MAX_PODS_BOUND)?;
        out.insert(MAX_PODS, pods.to_string());
    }
    if let Some(gpus) = capacity.gpu_count.filter(|g| *g > 0) {
        let gpus = within("gpu-count", gpus, 1, MAX_GPUS)?;
        out.insert(GPU_COUNT, gpus.to_string());
        if let Some(kind) = &capacity.gpu_type {
            // A resource name such as `nvidia.com/gpu`: a qualified name.
            let ok = !kind.is_empty()
                && kind.len() <= 253
                && kind
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._/".contains(c));
            if !ok {
                return Err(format!(
                    "gpu-type {:?} is not a resource name (such as nvidia.com/gpu); the plugin's capacity is not written",
                    capstan_api::bounded(kind, 64)
                ));
            }
            out.insert(GPU_TYPE, kind.clone());
        }
    }
    Ok(out)
}

/// The annotation changes (key, `None` to remove) that bring `current`
/// to `wanted` (the plugin's, as [`annotations`] made them, from Plugin
/// `plugin`), touching only keys the host wrote before or that are unset:
/// a key the user set stays theirs. `wanted` `None` (the plugin said
/// nothing, or the object is gone from its Plugin) removes what the host
/// wrote. Empty: nothing to write.
pub fn plan(
    current: &BTreeMap<String, String>,
    wanted: Option<&BTreeMap<&'static str, String>>,
    plugin: &str,
) -> Vec<(String, Option<String>)> {
    let ours: Vec<&str> = current
        .get(WRITTEN_BY_HOST)
        .and_then(|v| v.split_once(':'))
        .map(|(_, keys)| keys.split(',').filter(|k| !k.is_empty()).collect())
        .unwrap_or_default();
    let mut changes = Vec::new();
    let mut written = Vec::new();
    for key in [CPU, MEMORY, EPHEMERAL_DISK, MAX_PODS, GPU_COUNT, GPU_TYPE] {
        let mine = ours.contains(&key);
        let have = current.get(key);
        if have.is_some() && !mine {
            continue;
        }
        let want = wanted.and_then(|w| w.get(key));
        if want.is_some() {
            written.push(key);
        }
        if have != want {
            changes.push((key.to_string(), want.cloned()));
        }
    }
    let record = (!written.is_empty()).then(|| format!("{plugin}:{}", written.join(",")));
    if current.get(WRITTEN_BY_HOST) != record.as_ref() {
        changes.push((WRITTEN_BY_HOST.to_string(), record));
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(cpu: u32, memory: u64) -> InstanceCapacity {
        InstanceCapacity {
            cpu_millis: cpu,
            memory_mib: memory,
            ephemeral_disk_mib: None,
            max_pods: None,
            gpu_count: None,
            gpu_type: None,
        }
    }

    #[test]
    fn numbers_are_formatted_by_the_host_and_bounded() {
        let a = annotations(&capacity(2000, 4096)).unwrap();
        assert_eq!(a[CPU], "2");
        assert_eq!(a[MEMORY], "4096Mi");
        assert_eq!(annotations(&capacity(1500, 1)).unwrap()[CPU], "1500m");
        let mut gpu = capacity(8000, 1024);
        gpu.gpu_count = Some(2);
        gpu.gpu_type = Some("nvidia.com/gpu".into());
        gpu.max_pods = Some(58);
        gpu.ephemeral_disk_mib = Some(20480);
        let a = annotations(&gpu).unwrap();
        assert_eq!(
            (
                a[GPU_COUNT].as_str(),
                a[GPU_TYPE].as_str(),
                a[MAX_PODS].as_str()
            ),
            ("2", "nvidia.com/gpu", "58")
        );
        assert_eq!(a[EPHEMERAL_DISK], "20480Mi");
        // Claims out of bounds, or text that is no resource name, are refused.
        assert!(
            annotations(&capacity(0, 1))
                .unwrap_err()
                .contains("cpu-millis 0")
        );
        assert!(annotations(&capacity(1000, u64::MAX)).is_err());
        gpu.gpu_type = Some("x\ny: z".into());
        assert!(annotations(&gpu).unwrap_err().contains("gpu-type"));
    }

    #[test]
    fn the_host_writes_only_unset_keys_and_keeps_them_current() {
        let wanted = annotations(&capacity(2000, 4096)).unwrap();
        // Nothing set: both written, and recorded as the host's.
        let changes = plan(&BTreeMap::new(), Some(&wanted), "sim");
        assert!(changes.contains(&(CPU.into(), Some("2".into()))));
        assert!(changes.contains(&(WRITTEN_BY_HOST.into(), Some(format!("sim:{CPU},{MEMORY}")))));
        // Applied, then planned again: nothing to do.
        let mut current: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in changes {
            current.insert(k, v.unwrap());
        }
        assert!(plan(&current, Some(&wanted), "sim").is_empty());
        // The instance type changed: the host's keys follow.
        let bigger = annotations(&capacity(4000, 8192)).unwrap();
        let changes = plan(&current, Some(&bigger), "sim");
        assert!(changes.contains(&(CPU.into(), Some("4".into()))));
        // The user's memory is never overwritten nor counted as the host's.
        let mut user = BTreeMap::from([(MEMORY.to_string(), "128G".to_string())]);
        let changes = plan(&user, Some(&wanted), "sim");
        assert!(!changes.iter().any(|(k, _)| k == MEMORY));
        for (k, v) in changes {
            user.insert(k, v.unwrap());
        }
        assert_eq!(user[WRITTEN_BY_HOST], format!("sim:{CPU}"));
        // The plugin says nothing any more: only the host's keys go.
        let changes = plan(&user, None, "sim");
        assert_eq!(
            changes,
            [(CPU.to_string(), None), (WRITTEN_BY_HOST.to_string(), None)]
        );
    }
}
