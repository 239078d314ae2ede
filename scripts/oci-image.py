#!/usr/bin/env python3
"""Write Capstan's controller image as an OCI image layout, without a
container engine, reproducibly: the same binary, CA bundle, version,
revision and creation time give the same bytes, hence the same digest.

The image is one gzip layer holding a minimal root filesystem:

    /usr/local/bin/capstan            the statically linked binary
    /etc/passwd, /etc/group           root and the non-root user 65532
    /etc/ssl/certs/ca-certificates.crt
    /tmp (1777), /var/cache/capstan and /home/nonroot (owned by 65532)

Its config runs `capstan controller` as 65532:65532 and carries the
org.opencontainers.image.* labels. Called by scripts/build-image.sh; run it
with --help for its flags. Only the Python standard library is used.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile

UID = GID = 65532
BINARY_PATH = "usr/local/bin/capstan"
CA_PATH = "etc/ssl/certs/ca-certificates.crt"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def canonical(value):
    """JSON as the digests are taken over it: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rootfs_tar(binary, ca_bundle, mtime):
    """The layer's uncompressed tar: entries in a fixed order, fixed owners,
    modes and times, so nothing about the build machine leaks in."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name, data=None, mode=0o755, uid=0, gid=0):
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.uid, info.gid = uid, gid
            info.uname = info.gname = ""
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        for d in ["etc", "etc/ssl", "etc/ssl/certs", "home"]:
            add(d)
        add("home/nonroot", mode=0o700, uid=UID, gid=GID)
        add("tmp", mode=0o1777)
        for d in ["usr", "usr/local", "usr/local/bin", "var", "var/cache"]:
            add(d)
        add("var/cache/capstan", uid=UID, gid=GID)
        add(
            "etc/passwd",
            b"root:x:0:0:root:/root:/sbin/nologin\n"
            + f"nonroot:x:{UID}:{GID}:nonroot:/home/nonroot:/sbin/nologin\n".encode(),
            mode=0o644,
        )
        add("etc/group", f"root:x:0:\nnonroot:x:{GID}:\n".encode(), mode=0o644)
        add(CA_PATH, ca_bundle, mode=0o644)
        add(BINARY_PATH, binary, mode=0o755)
    return buf.getvalue()


def gzipped(data):
    """gzip with no name and a zero time in its header (gzip's own default
    would stamp the current time and break reproducibility)."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as z:
        z.write(data)
    return out.getvalue()


def build(args):
    with open(args.binary, "rb") as f:
        binary = f.read()
    if not binary.startswith(b"\x7fELF"):
        sys.exit(f"error: {args.binary} is not an ELF binary (build it with scripts/build-image.sh)")
    with open(args.ca_bundle, "rb") as f:
        ca_bundle = f.read()
    created = datetime.datetime.fromtimestamp(args.created, datetime.timezone.utc)
    created = created.strftime("%Y-%m-%dT%H:%M:%SZ")

    tar = rootfs_tar(binary, ca_bundle, args.created)
    layer = gzipped(tar)
    labels = {
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.description": "Capstan: the Cluster API machine lifecycle with sandboxed WebAssembly providers",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.revision": args.revision,
        "org.opencontainers.image.source": args.source,
        "org.opencontainers.image.title": "capstan",
        "org.opencontainers.image.version": args.version,
    }
    config = canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "config": {
                "User": f"{UID}:{GID}",
                "Entrypoint": ["/" + BINARY_PATH, "controller"],
                "Env": [
                    "PATH=/usr/local/bin",
                    "HOME=/home/nonroot",
                    "SSL_CERT_FILE=/" + CA_PATH,
                ],
                "WorkingDir": "/",
                "Labels": labels,
            },
            "rootfs": {"type": "layers", "diff_ids": [digest(tar)]},
            "history": [{"created": created, "created_by": "scripts/oci-image.py"}],
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": digest(config), "size": len(config)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": digest(layer), "size": len(layer)}],
            "annotations": labels,
        }
    )
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {"org.opencontainers.image.ref.name": args.version},
                }
            ],
        }
    )

    # Written beside the destination and renamed into place: a failed run
    # leaves the previous layout, never half of one.
    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".image-", dir=parent)
    os.chmod(staging, 0o755)
    try:
        blobs = os.path.join(staging, "blobs", "sha256")
        os.makedirs(blobs)
        for data in (layer, config, manifest):
            with open(os.path.join(blobs, hashlib.sha256(data).hexdigest()), "wb") as f:
                f.write(data)
        with open(os.path.join(staging, "oci-layout"), "wb") as f:
            f.write(canonical({"imageLayoutVersion": "1.0.0"}))
        with open(os.path.join(staging, "index.json"), "wb") as f:
            f.write(index)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(json.dumps({
        "layout": out,
        "tag": args.version,
        "digest": digest(manifest),
        "layerBytes": len(layer),
        "uncompressedBytes": len(tar),
    }))


def main():
    parser = argparse.ArgumentParser(
        description="Write the Capstan controller image as an OCI image layout (no container engine needed).")
    parser.add_argument("--binary", required=True, help="the statically linked capstan binary")
    parser.add_argument("--out", required=True, help="the OCI layout directory to (re)write")
    parser.add_argument("--version", required=True, help="image version; also the layout's tag")
    parser.add_argument("--revision", required=True, help="source revision (git commit)")
    parser.add_argument("--source", required=True, help="source repository URL")
    parser.add_argument("--created", required=True, type=int,
                        help="creation time, seconds since the epoch (use the commit's time)")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt",
                        help="CA certificates to include (default: %(default)s)")
    build(parser.parse_args())


if __name__ == "__main__":
    main()
