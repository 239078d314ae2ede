#!/usr/bin/env bash
# The README's "run" command on a fresh machine: install what is missing
# (wasm target, etcd, the cached kube-apiserver/controller-manager/kubectl
# build), build the sample plugins and the host, then run the quickstart: a
# local control plane, the simulated cloud, `capstan controller`, the
# sandboxed sim-provider plugin and a MachineDeployment of 3 machines, with
# live progress until every machine is Ready. Ctrl-C stops everything.
# Flags go to capstan-quickstart (--replicas N, --exit-when-ready, --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
bin=$(./scripts/control-plane.sh | tail -1)
./scripts/build-plugins.sh
echo "==> building the capstan host (the first build takes a few minutes)"
cargo build -q -p capstan -p capstan-e2e --bin capstan --bin capstan-quickstart
export CAPSTAN_K8S_BIN="$bin"
exec ./target/debug/capstan-quickstart "$@"
