#!/usr/bin/env bash
# The README's "run" command on a fresh machine: install what is missing
# (wasm target, etcd, the cached kube-apiserver/controller-manager/scheduler/
# kubectl build), build the sample plugins and the host, then run the
# quickstart: a local control plane, the simulated cloud and its kubelet,
# `capstan controller`, the sandboxed sim-provider plugin and a
# MachineDeployment of 3 machines, with live progress until every machine is
# Ready. Ctrl-C stops everything.
# Flags go to capstan-quickstart (--replicas N, --exit-when-ready, --oci,
# --real-nodes, --help). With --real-nodes, scripts/node-parts.sh installs
# a real node's parts and builds kubelet and kubeadm (once, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
parts=(build)
for arg in "$@"; do [ "$arg" = --oci ] && parts+=(registry); done
./scripts/setup.sh "${parts[@]}"
# The control plane's Go build and Capstan's cargo build run side by side:
# each has long single-threaded stretches the other fills.
echo "==> local control plane (etcd + kube-apiserver, controller-manager, scheduler v1.20.2): the first time built in the background while Capstan builds, then cached"
control_plane_out=$(mktemp)
./scripts/control-plane.sh >"$control_plane_out" 2> >(sed -u 's/^/    [control plane] /' >&2) &
control_plane=$!
trap 'kill "$control_plane" 2>/dev/null || true; rm -f "$control_plane_out"' EXIT
# Only the plugins the quickstart runs (build-plugins.sh with no names
# builds the test fixtures too).
./scripts/build-plugins.sh sim-provider kubeadm-bootstrap coredns-addon
echo "==> building the capstan host (the first build takes several minutes on 2 cores; cargo shows its progress)"
# Without the e2e crate's moto fixtures: what the quickstart runs, no more
# (one invocation, so both binaries share one build of every dependency).
cargo build -p capstan -p capstan-e2e --no-default-features --bin capstan --bin capstan-quickstart
if ! wait "$control_plane"; then
    echo "error: the local control plane did not build (its messages are above)" >&2
    exit 1
fi
bin=$(tail -n 1 "$control_plane_out")
trap - EXIT
rm -f "$control_plane_out"
export CAPSTAN_K8S_BIN="$bin"
for arg in "$@"; do
    if [ "$arg" = --real-nodes ]; then
        echo "==> a real node's parts: Debian's containerd, runc, CNI plugins, cloud-init; kubelet and kubeadm v1.20.2 built from the control plane's source (the first time about 3 minutes, then cached)"
        CAPSTAN_NODE_BIN="$(./scripts/node-parts.sh | tail -n 1)"
        export CAPSTAN_NODE_BIN
    fi
done
exec "${CARGO_TARGET_DIR:-target}/debug/capstan-quickstart" "$@"
