#!/usr/bin/env bash
# Build the plugins under plugins/ as WebAssembly components
# (wasm32-wasip2, release) into target/plugins/wasm32-wasip2/release/.
# They go to their own target dir so this never waits on a host build.
# Usage: build-plugins.sh [PACKAGE...] (default: every plugin, the test
# fixtures included; the quickstart names only the ones it runs).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" build
packages=("$@")
if [ ${#packages[@]} -eq 0 ]; then
    packages=(sim-provider sim-updater sim-tagger sim-team-tagger broken-updater hostile-plugin ec2-provider
        coredns-addon node-exporter-addon greedy-addon kubeadm-bootstrap contract-0-1-provider contract-0-1-addon)
fi
echo "==> building plugins for wasm32-wasip2: ${packages[*]}"
cargo build --release --target wasm32-wasip2 --target-dir "${CARGO_TARGET_DIR:-target}/plugins" \
    "${packages[@]/#/--package=}"
ls -l "${CARGO_TARGET_DIR:-target}"/plugins/wasm32-wasip2/release/*.wasm
