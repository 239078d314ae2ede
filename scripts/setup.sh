#!/usr/bin/env bash
# Install what building and testing Capstan needs on a fresh Debian 12
# machine. Idempotent: a second run only checks.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed; install Rust with rustup first (https://rustup.rs)" >&2
    exit 1
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "==> installing a C compiler (needed by some dependencies)"
    apt-get update -qq && apt-get install -y -qq build-essential
fi
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    echo "==> adding the wasm32-wasip2 target (plugins are built for it)"
    rustup target add wasm32-wasip2
fi
