#!/usr/bin/env bash
# The README's "test" command: install what is needed (including the local
# Kubernetes control plane, built once and cached), build the plugins
# (including the hostile test fixtures) and the controller image, and run
# the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh"
"$(dirname "$0")/build-plugins.sh"
# The Python and JavaScript plugins, from source with pinned toolchains.
"$(dirname "$0")/build-polyglot-plugins.sh"
"$(dirname "$0")/test-sdks.sh"
# The image tests unpack and run it; built here, before the tests compete
# for the cores (with the quicker `image-test` profile; the tests' own
# build-image.sh call sees the same variable and finds it built).
export CAPSTAN_IMAGE_PROFILE="${CAPSTAN_IMAGE_PROFILE:-image-test}"
"$(dirname "$0")/build-image.sh"
echo "==> local control plane (etcd + kube-apiserver, controller-manager, scheduler v1.20.2; built once, about 10 minutes with its Go toolchain, then cached)"
CAPSTAN_K8S_BIN="$("$(dirname "$0")/control-plane.sh" | tail -n 1)"
export CAPSTAN_K8S_BIN
echo "==> a real node's parts (containerd, runc, CNI plugins, cloud-init from Debian; kubelet and kubeadm v1.20.2 from the control plane's source; built once, about 3 minutes, then cached)"
CAPSTAN_NODE_BIN="$("$(dirname "$0")/node-parts.sh" | tail -n 1)"
export CAPSTAN_NODE_BIN
export CAPSTAN_PLUGIN_DIR="$PWD/${CARGO_TARGET_DIR:-target}/plugins/wasm32-wasip2/release"
echo "==> running the test suite"
# Two tests at a time (libtest's default on two cores). Tried and measured
# slower: three at a time with the image built in the background (a cold
# run took 50.6 minutes against 41.2): the end-to-end tests are CPU-bound
# in a fresh clone (the scaffolded plugins compile there), and more at once
# only added CPU.
cargo test --workspace --no-fail-fast
# The docs' `capstan` commands against the binary the tests built.
echo "==> docs: every capstan command shown is one the binary takes (tested blocks run)"
python3 scripts/check-doc-commands.py "${CARGO_TARGET_DIR:-target}/debug/capstan"
