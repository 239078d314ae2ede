#!/usr/bin/env bash
# Build Capstan's controller image without a container engine: a statically
# linked release `capstan` (x86_64 musl) in a minimal root filesystem, written
# as an OCI image layout. Reproducible from the binary: rebuilding a checkout
# gives the same digest.
#
#   build-image.sh [--out DIR] [--no-build] [--push REGISTRY/REPOSITORY[:TAG]] [--insecure]
#
#   --out DIR     the OCI layout to write (default: target/image/capstan)
#   --no-build    use the binary already built (fails if there is none)
#   --push REF    then copy the image to a registry with skopeo, digest
#                 unchanged (default tag: the version)
#   --insecure    the registry speaks plain HTTP or has an untrusted
#                 certificate (a loopback test registry)
#
# CAPSTAN_IMAGE_PROFILE picks the cargo profile (default `release`; the test
# suite uses `image-test`, quicker to build cold).
#
# Prints the image reference pinned by digest last, e.g. for
# `capstan install --image REF@sha256:…`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Called from a test, the environment carries cargo's variables for that
# test's crate (CARGO_MANIFEST_DIR, CARGO_PKG_*…); some build scripts (ring's)
# watch them, so they would make cargo rebuild the whole release binary.
for var in $(compgen -e); do
    case "$var" in
        CARGO_MANIFEST_* | CARGO_PKG_* | CARGO_CRATE_* | CARGO_BIN_* | CARGO_PRIMARY_PACKAGE | CARGO_TARGET_TMPDIR | OUT_DIR) unset "$var" ;;
    esac
done

out="${CARGO_TARGET_DIR:-target}/image/capstan"
build=1
push=""
tls_verify=true
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --push) push="$2"; shift 2 ;;
        --insecure) tls_verify=false; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# One build at a time per target directory: two test processes (or a
# test and a developer) may call this at once, and the layout is rewritten.
mkdir -p "${CARGO_TARGET_DIR:-target}"
exec 9>"${CARGO_TARGET_DIR:-target}/.build-image.lock"
flock 9

target=x86_64-unknown-linux-musl
profile="${CAPSTAN_IMAGE_PROFILE:-release}"
binary="${CARGO_TARGET_DIR:-target}/$target/$profile/capstan"
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
source_url="$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' Cargo.toml)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    revision="$revision-dirty"
fi
# The commit's time, so two builds of one commit are stamped alike.
created="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

if [ "$build" = 1 ]; then
    "$(dirname "$0")/setup.sh" image
    echo "==> building capstan for $target (profile $profile, statically linked; about 10 minutes cold on 2 cores as release)"
    # musl-gcc compiles the C parts (ring, zstd); debug info is stripped, the
    # symbols stay so a panic's backtrace still names functions. Paths are
    # remapped so the checkout's and cargo's own directories do not end up
    # in the binary (two separate checkouts still differ in a few rlibs).
    cargo_home="${CARGO_HOME:-$HOME/.cargo}"
    RUSTFLAGS="${RUSTFLAGS:-} --remap-path-prefix=$PWD=/capstan --remap-path-prefix=$cargo_home=/cargo" \
        CC_x86_64_unknown_linux_musl=musl-gcc CARGO_PROFILE_RELEASE_STRIP=debuginfo \
        CARGO_PROFILE_IMAGE_TEST_STRIP=debuginfo \
        cargo build --profile "$profile" --locked --target "$target" -p capstan
fi
if [ ! -x "$binary" ]; then
    echo "error: $binary is missing; run without --no-build" >&2
    exit 1
fi
if ! file_type="$(head -c 4 "$binary" | od -An -c | tr -d ' ')" || [ "$file_type" != '177ELF' ]; then
    echo "error: $binary is not an ELF binary" >&2
    exit 1
fi

echo "==> writing the OCI image layout $out (capstan $version, $revision)"
summary="$(python3 "$(dirname "$0")/oci-image.py" --binary "$binary" --out "$out" \
    --version "$version" --revision "$revision" --source "$source_url" --created "$created")"
digest="$(printf '%s' "$summary" | python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])')"
layer_bytes="$(printf '%s' "$summary" | python3 -c 'import json,sys; print(json.load(sys.stdin)["layerBytes"])')"
echo "    oci:$out:$version  $digest  ($((layer_bytes / 1024 / 1024)) MiB compressed)"

if [ -n "$push" ]; then
    command -v skopeo >/dev/null 2>&1 || "$(dirname "$0")/setup.sh" image
    ref="${push#docker://}"
    # A tag is the part after the last ':' that holds no '/'.
    last="${ref##*/}"
    case "$last" in *:*) ;; *) ref="$ref:$version" ;; esac
    echo "==> pushing to $ref (skopeo, digests preserved)"
    skopeo copy --quiet --preserve-digests --dest-tls-verify="$tls_verify" \
        "oci:$out:$version" "docker://$ref"
    echo "${ref%:*}@$digest"
else
    echo "oci:$out:$version@$digest"
fi
