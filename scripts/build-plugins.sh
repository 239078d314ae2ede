#!/usr/bin/env bash
# Build the plugins under plugins/ as WebAssembly components
# (wasm32-wasip2, release) into target/plugins/wasm32-wasip2/release/.
# They go to their own target dir so this never waits on a host build.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" build
echo "==> building plugins for wasm32-wasip2"
cargo build --release --target wasm32-wasip2 --target-dir "${CARGO_TARGET_DIR:-target}/plugins" \
    -p sim-provider -p sim-updater -p sim-tagger -p sim-team-tagger -p broken-updater -p hostile-plugin -p ec2-provider -p coredns-addon -p node-exporter-addon -p greedy-addon -p kubeadm-bootstrap -p contract-0-1-provider
ls -l "${CARGO_TARGET_DIR:-target}"/plugins/wasm32-wasip2/release/*.wasm
