#!/usr/bin/env bash
# The README's "run" command on a fresh machine: install what is missing
# (wasm target, etcd, the cached kube-apiserver/controller-manager/scheduler/
# kubectl build), build the sample plugins and the host, then run the
# quickstart: a local control plane, the simulated cloud and its kubelet,
# `capstan controller`, the sandboxed sim-provider plugin and a
# MachineDeployment of 3 machines, with live progress until every machine is
# Ready. Ctrl-C stops everything.
# Flags go to capstan-quickstart (--replicas N, --exit-when-ready, --oci, --help).
set -euo pipefail
cd "$(dirname "$0")/.."
parts=(build)
for arg in "$@"; do [ "$arg" = --oci ] && parts+=(registry); done
./scripts/setup.sh "${parts[@]}"
echo "==> local control plane (etcd + kube-apiserver, controller-manager, scheduler v1.20.2; built once, about 11 minutes with its Go toolchain, then cached)"
bin=$(./scripts/control-plane.sh | tail -n 1)
./scripts/build-plugins.sh
echo "==> building the capstan host (the first build takes several minutes on 2 cores; cargo shows its progress)"
cargo build -p capstan -p capstan-e2e --bin capstan --bin capstan-quickstart
export CAPSTAN_K8S_BIN="$bin"
exec "${CARGO_TARGET_DIR:-target}/debug/capstan-quickstart" "$@"
