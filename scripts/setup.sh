#!/usr/bin/env bash
# Install what building, running and testing Capstan needs on a fresh
# Debian 12 machine. Idempotent: a second run only checks.
#
#   setup.sh [PART...]    PART: build | registry | interop | moto | image | polyglot   (default: all)
#
#   build     a C compiler and the wasm32-wasip2 target (everything needs it)
#   registry  Debian's docker-registry and htpasswd (the supply-chain tests,
#             `quickstart.sh --oci`)
#   interop   sigstore-js (with @sigstore/mock) and a Python venv with
#             PyNaCl/cryptography and sigstore-python, cached
#             outside the repo (the interoperability tests only), and
#             cloud-init's schema validator (the kubeadm bootstrap plugin's
#             output is checked with it)
#   moto      moto's EC2 server in a Python venv outside the repo (the EC2
#             provider's tests: a real EC2 API implementation on loopback)
#   image     the musl target and musl-gcc (the controller image's static
#             binary), skopeo, umoci and bubblewrap (pushing, unpacking and
#             running the image without a container engine)
#   polyglot  the Python and JavaScript plugin toolchains, pinned, cached
#             outside the repo: componentize-py in a venv, componentize-js
#             and rolldown from npm (the Python and JavaScript sample plugins)
set -euo pipefail

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(build registry interop moto image polyglot)
want() {
    local p
    for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done
    return 1
}
for p in "${parts[@]}"; do
    case "$p" in
        build | registry | interop | moto | image | polyglot) ;;
        *) echo "error: unknown setup part '$p' (expected build, registry, interop, moto, image or polyglot)" >&2; exit 2 ;;
    esac
done

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed; install Rust with rustup first (https://rustup.rs)" >&2
    exit 1
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "==> installing a C compiler (needed by some dependencies)"
    apt_install build-essential
fi
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    echo "==> adding the wasm32-wasip2 target (plugins are built for it)"
    rustup target add wasm32-wasip2
fi

# The supply-chain tests and `quickstart.sh --oci` run real registries
# (Debian's docker-registry, distribution 2.8) and htpasswd for the
# authenticated one.
if want registry && { ! command -v docker-registry >/dev/null 2>&1 || ! command -v htpasswd >/dev/null 2>&1; }; then
    echo "==> installing docker-registry and apache2-utils (local OCI registries)"
    apt_install docker-registry apache2-utils
    # The package may start a registry on :5000; the tests start their own.
    (service docker-registry stop || pkill -x docker-registry || true) >/dev/null 2>&1
fi

if want interop; then
    # The real cloud-init schema validator (`cloud-init schema`). Its boot
    # services are switched off: this machine is not one to initialise.
    if ! command -v cloud-init >/dev/null 2>&1; then
        echo "==> installing cloud-init (its schema validator checks rendered bootstrap data)"
        apt_install --no-install-recommends cloud-init
        mkdir -p /etc/cloud && touch /etc/cloud/cloud-init.disabled
    fi
    # An independent Sigstore implementation for the interoperability tests:
    # sigstore-js (@sigstore/sign, @sigstore/verify), and its mock Fulcio,
    # Rekor and timestamp authority (@sigstore/mock) for keyless signing,
    # cached outside the repo.
    SIGSTORE_JS="${CAPSTAN_SIGSTORE_JS:-$HOME/.cache/capstan/sigstore-js}"
    if [ ! -d "$SIGSTORE_JS/node_modules/@sigstore/verify" ] || [ ! -d "$SIGSTORE_JS/node_modules/@sigstore/mock" ]; then
        if ! command -v npm >/dev/null 2>&1; then
            echo "==> installing Node.js and npm (sigstore-js interop tests)"
            apt_install nodejs npm
        fi
        echo "==> installing sigstore-js into $SIGSTORE_JS"
        mkdir -p "$SIGSTORE_JS"
        (cd "$SIGSTORE_JS" && { [ -f package.json ] || echo '{"private":true}' > package.json; } \
            && npm install --no-audit --no-fund --silent @sigstore/sign@4 @sigstore/verify@3 @sigstore/bundle@4 @sigstore/core@3 @sigstore/mock@0.13)
    fi
    # Independent crypto (OpenSSL scrypt, libsodium secretbox, pyca/cryptography)
    # to cross-check the cosign private-key format, and the Sigstore Python
    # client (a second verifier for keyless bundles), in a venv outside the repo.
    CAPSTAN_PY="${CAPSTAN_PYTHON_ENV:-$HOME/.cache/capstan/python}"
    SIGSTORE_PY=4.5.1
    if ! "$CAPSTAN_PY/bin/python" -c "import nacl.secret, cryptography" >/dev/null 2>&1 \
        || [ "$("$CAPSTAN_PY/bin/sigstore" --version 2>/dev/null)" != "sigstore $SIGSTORE_PY" ]; then
        echo "==> installing PyNaCl, cryptography and sigstore $SIGSTORE_PY into $CAPSTAN_PY (key-format and keyless interop tests)"
        if ! python3 -m venv "$CAPSTAN_PY" >/dev/null 2>&1; then
            apt_install python3-venv
            python3 -m venv "$CAPSTAN_PY"
        fi
        "$CAPSTAN_PY/bin/pip" install -q pynacl cryptography "sigstore==$SIGSTORE_PY"
    fi
fi

if want moto; then
    # moto's server implements the EC2 Query API (and IAM, to check request
    # signatures); pinned so the tests see the same behaviour everywhere.
    MOTO_VERSION=5.2.5
    MOTO_VENV="${CAPSTAN_MOTO_VENV:-$HOME/.cache/capstan/moto}"
    if ! "$MOTO_VENV/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" >/dev/null 2>&1 \
        || [ ! -x "$MOTO_VENV/bin/moto_server" ]; then
        echo "==> installing moto[server] $MOTO_VERSION into $MOTO_VENV (EC2 provider tests)"
        if ! python3 -m venv "$MOTO_VENV" >/dev/null 2>&1; then
            apt_install python3-venv
            python3 -m venv "$MOTO_VENV"
        fi
        "$MOTO_VENV/bin/pip" install -q "moto[server]==$MOTO_VERSION"
    fi
fi

if want image; then
    if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
        echo "==> adding the x86_64-unknown-linux-musl target (the controller image's static binary)"
        rustup target add x86_64-unknown-linux-musl
    fi
    missing=()
    command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
    command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
    command -v umoci >/dev/null 2>&1 || missing+=(umoci)
    command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
    [ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]} (the controller image: build, push, unpack, run)"
        apt_install "${missing[@]}"
    fi
fi

if want polyglot; then
    # Pinned: a plugin's bytes (and so its digest and signature) depend on
    # the toolchain that built it.
    COMPONENTIZE_PY_VERSION=0.25.1
    COMPONENTIZE_JS_VERSION=0.23.0
    ROLLDOWN_VERSION=1.3.2
    POLYGLOT="${CAPSTAN_POLYGLOT:-$HOME/.cache/capstan/polyglot}"
    if ! "$POLYGLOT/python/bin/componentize-py" --version 2>/dev/null | grep -qx "componentize-py $COMPONENTIZE_PY_VERSION"; then
        echo "==> installing componentize-py $COMPONENTIZE_PY_VERSION into $POLYGLOT/python (Python plugins)"
        if ! python3 -m venv "$POLYGLOT/python" >/dev/null 2>&1; then
            apt_install python3-venv
            python3 -m venv "$POLYGLOT/python"
        fi
        "$POLYGLOT/python/bin/pip" install -q "componentize-py==$COMPONENTIZE_PY_VERSION"
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "==> installing Node.js and npm (JavaScript plugins)"
        apt_install nodejs npm
    fi
    js_pinned() {
        local dir="$POLYGLOT/js/node_modules"
        grep -q "\"version\": \"$COMPONENTIZE_JS_VERSION\"" "$dir/@bytecodealliance/componentize-js/package.json" 2>/dev/null \
            && grep -q "\"version\": \"$ROLLDOWN_VERSION\"" "$dir/rolldown/package.json" 2>/dev/null
    }
    if ! js_pinned; then
        echo "==> installing componentize-js $COMPONENTIZE_JS_VERSION and rolldown $ROLLDOWN_VERSION into $POLYGLOT/js (JavaScript plugins)"
        mkdir -p "$POLYGLOT/js"
        (cd "$POLYGLOT/js" && { [ -f package.json ] || echo '{"private":true}' > package.json; } \
            && npm install --no-audit --no-fund --silent --save-exact \
                "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION" "rolldown@$ROLLDOWN_VERSION")
    fi
fi
