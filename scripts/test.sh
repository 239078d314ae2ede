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
echo "==> local control plane (etcd + kube-apiserver, controller-manager, scheduler v1.20.2; built once, about 10 minutes with its Go toolchain, then cached)"
CAPSTAN_K8S_BIN="$("$(dirname "$0")/control-plane.sh" | tail -n 1)"
export CAPSTAN_K8S_BIN
echo "==> a real node's parts (containerd, runc, CNI plugins, cloud-init from Debian; kubelet and kubeadm v1.20.2 from the control plane's source; built once, about 3 minutes, then cached)"
CAPSTAN_NODE_BIN="$("$(dirname "$0")/node-parts.sh" | tail -n 1)"
export CAPSTAN_NODE_BIN
export CAPSTAN_PLUGIN_DIR="$PWD/${CARGO_TARGET_DIR:-target}/plugins/wasm32-wasip2/release"
# The controller image (with the quicker `image-test` profile), built in
# the background beside the test build and the first tests: the end-to-end
# tests leave a quarter of the cores idle. The image tests' own
# build-image.sh call sees the same variable and waits for this build
# (build-image.sh takes a lock).
export CAPSTAN_IMAGE_PROFILE="${CAPSTAN_IMAGE_PROFILE:-image-test}"
image_log="${CARGO_TARGET_DIR:-target}/build-image.log"
echo "==> the controller image, built in the background (log: $image_log; the image tests wait for it)"
"$(dirname "$0")/build-image.sh" > "$image_log" 2>&1 &
image_build=$!
trap 'kill "$image_build" 2>/dev/null || true' EXIT
echo "==> running the test suite"
# Three tests at a time: with control planes reused, the end-to-end tests
# leave the cores idle a third of the time at two (2 cores).
status=0
RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}" cargo test --workspace --no-fail-fast || status=$?
if ! wait "$image_build"; then
    echo "error: the controller image did not build; its log ($image_log):" >&2
    tail -n 40 "$image_log" >&2
    status=1
fi
trap - EXIT
[ "$status" = 0 ] || exit "$status"
# The docs' `capstan` commands against the binary the tests built.
echo "==> docs: every capstan command shown is one the binary takes (tested blocks run)"
python3 scripts/check-doc-commands.py "${CARGO_TARGET_DIR:-target}/debug/capstan"
