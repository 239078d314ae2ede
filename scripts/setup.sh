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
# The supply-chain tests run real registries (Debian's docker-registry,
# distribution 2.8) and use htpasswd for the authenticated one.
if ! command -v docker-registry >/dev/null 2>&1 || ! command -v htpasswd >/dev/null 2>&1; then
    echo "==> installing docker-registry and apache2-utils (registry tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry apache2-utils
    # The package may start a registry on :5000; the tests start their own.
    (service docker-registry stop || pkill -x docker-registry || true) >/dev/null 2>&1
fi
# An independent Sigstore implementation for the interoperability tests:
# sigstore-js (@sigstore/sign, @sigstore/verify), cached outside the repo.
SIGSTORE_JS="${CAPSTAN_SIGSTORE_JS:-$HOME/.cache/capstan/sigstore-js}"
if [ ! -d "$SIGSTORE_JS/node_modules/@sigstore/verify" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "==> installing Node.js and npm (sigstore-js interop tests)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
    fi
    echo "==> installing sigstore-js into $SIGSTORE_JS"
    mkdir -p "$SIGSTORE_JS"
    (cd "$SIGSTORE_JS" && { [ -f package.json ] || echo '{"private":true}' > package.json; } \
        && npm install --no-audit --no-fund --silent @sigstore/sign@4 @sigstore/verify@3 @sigstore/bundle@4 @sigstore/core@3)
fi
# Independent crypto (OpenSSL scrypt, libsodium secretbox, pyca/cryptography)
# to cross-check the cosign private-key format, in a venv outside the repo.
CAPSTAN_PY="${CAPSTAN_PYTHON_ENV:-$HOME/.cache/capstan/python}"
if ! "$CAPSTAN_PY/bin/python" -c "import nacl.secret, cryptography" >/dev/null 2>&1; then
    echo "==> installing PyNaCl and cryptography into $CAPSTAN_PY (key-format interop test)"
    if ! python3 -m venv "$CAPSTAN_PY" >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        python3 -m venv "$CAPSTAN_PY"
    fi
    "$CAPSTAN_PY/bin/pip" install -q pynacl cryptography
fi
