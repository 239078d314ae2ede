#!/usr/bin/env bash
# The README's "test" command: install what is needed, build the plugins
# (including the hostile test fixtures), and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/build-plugins.sh"
export CAPSTAN_PLUGIN_DIR="$PWD/${CARGO_TARGET_DIR:-target}/plugins/wasm32-wasip2/release"
echo "==> running the test suite"
cargo test --workspace --no-fail-fast
