#!/usr/bin/env bash
# The README's "run" command: build the sample plugin and the host, then run
# the demo (a simulated cloud on loopback, the sandboxed sim-provider plugin
# creating machines, following them until running, and deleting them).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/build-plugins.sh"
echo "==> building the capstan host (first build takes a few minutes)"
cargo build -p capstan
exec ./target/debug/capstan demo "$@"
