//! The container images a real instance ships with, made here from
//! Debian's `busybox-static` as OCI image archives (`ctr images import`
//! reads them): nothing is ever pulled.
//!
//! - [`PAUSE`]: the pod sandbox, a shell that waits until it is told to stop;
//! - [`BUSYBOX`]: busybox with its applets, for the pods of the tests.
//!
//! Each image is one uncompressed layer (`/bin/busybox` and a link per
//! applet the tests use); the same binary gives the same bytes.

use sha2::{Digest, Sha256};
use std::io::Write as _;
use std::path::Path;

/// The sandbox image (containerd's `sandbox_image`, the kubelet's
/// `--pod-infra-container-image`).
pub const PAUSE: &str = "capstan.local/pause:3.2";
/// The image test pods run.
pub const BUSYBOX: &str = "capstan.local/busybox:1.35";

/// Where Debian's `busybox-static` puts the binary.
const BUSYBOX_BINARY: &str = "/bin/busybox";
/// The applets linked in `/bin` (and what `sh -c` scripts of the tests use).
const APPLETS: [&str; 14] = [
    "sh", "sleep", "echo", "cat", "ls", "hostname", "httpd", "wget", "date", "env", "ps", "true",
    "false", "nc",
];

/// Write `pause.tar` and `busybox.tar` into `dir` (once: kept when there).
pub fn write(dir: &Path) -> std::io::Result<()> {
    let busybox = std::fs::read(BUSYBOX_BINARY).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "{BUSYBOX_BINARY}: {e} (install Debian's busybox-static: scripts/node-parts.sh)"
            ),
        )
    })?;
    let layer = layer(&busybox)?;
    let pause_cmd = [
        "/bin/sh",
        "-c",
        "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
    ];
    for (file, name, cmd) in [
        ("pause.tar", PAUSE, &pause_cmd[..]),
        ("busybox.tar", BUSYBOX, &["/bin/sh"][..]),
    ] {
        let path = dir.join(file);
        if !path.exists() {
            let archive = archive(name, &layer, cmd)?;
            let partial = dir.join(format!("{file}.partial"));
            std::fs::write(&partial, archive)?;
            std::fs::rename(partial, path)?;
        }
    }
    Ok(())
}

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The layer: `/bin/busybox`, its applet links, `/tmp`, `/etc/passwd`.
fn layer(busybox: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h
    };
    for dir in ["bin", "etc", "tmp"] {
        let mut h = header(
            tar::EntryType::Directory,
            if dir == "tmp" { 0o1777 } else { 0o755 },
            0,
        );
        tar.append_data(&mut h, format!("{dir}/"), std::io::empty())?;
    }
    let mut h = header(tar::EntryType::Regular, 0o755, busybox.len() as u64);
    tar.append_data(&mut h, "bin/busybox", busybox)?;
    for applet in APPLETS {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
    }
    let passwd = b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n";
    let mut h = header(tar::EntryType::Regular, 0o644, passwd.len() as u64);
    tar.append_data(&mut h, "etc/passwd", &passwd[..])?;
    tar.into_inner()
}

/// An OCI image layout, as one tar, holding one image `name` of `layer`
/// that runs `cmd`.
fn archive(name: &str, layer: &[u8], cmd: &[&str]) -> std::io::Result<Vec<u8>> {
    let layer_digest = digest(layer);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let config = serde_json::to_vec(&config)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
    });
    let manifest = serde_json::to_vec(&manifest)?;
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: String, data: &[u8]| -> std::io::Result<()> {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        tar.append_data(&mut h, path, data)
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json".into(), &serde_json::to_vec(&index)?)?;
    for blob in [layer, &config[..], &manifest[..]] {
        let d = digest(blob);
        add(format!("blobs/sha256/{}", &d["sha256:".len()..]), blob)?;
    }
    let mut out = tar.into_inner()?;
    out.flush()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_is_an_oci_layout_whose_blobs_match_their_digests() {
        let layer = layer(b"#!binary").unwrap();
        let bytes = archive(BUSYBOX, &layer, &["/bin/sh"]).unwrap();
        let mut entries = std::collections::BTreeMap::new();
        for entry in tar::Archive::new(&bytes[..]).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            entries.insert(path, data);
        }
        for (path, data) in &entries {
            if let Some(hash) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(digest(data), format!("sha256:{hash}"));
            }
        }
        let index: serde_json::Value = serde_json::from_slice(&entries["index.json"]).unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            BUSYBOX
        );
        // The same input, the same bytes.
        assert_eq!(archive(BUSYBOX, &layer, &["/bin/sh"]).unwrap(), bytes);
    }
}
