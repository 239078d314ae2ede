#!/usr/bin/env bash
# Build the Python and JavaScript plugins (plugins/*-py, plugins/*-js) from
# source with the pinned toolchains (setup.sh polyglot), next to the Rust
# ones in target/plugins/wasm32-wasip2/release/, and package the SDKs they
# use as a user would install them: sdk/python as a wheel, sdk/js with
# `npm pack` (both in target/polyglot/dist/).
#
# Each plugin is built for the contract world its capstan-plugin.json names
# (Python providers and updaters for the worlds that add wasi:http), then
# `capstan plugin annotate` embeds that manifest.
#
# Componentizing is the slow part (minutes on 2 cores), so each component
# is kept outside the repo (CAPSTAN_POLYGLOT_BUILDS, default
# ~/.cache/capstan/polyglot-builds) under a hash of everything it is built
# from: the plugin's folder, the SDK's, wit/, this script, the world and
# the toolchains' versions. A change to any of them builds it anew; the
# three newest builds of each plugin are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" build polyglot
POLYGLOT="${CAPSTAN_POLYGLOT:-$HOME/.cache/capstan/polyglot}"
target="${CARGO_TARGET_DIR:-target}"
out="$PWD/$target/plugins/wasm32-wasip2/release"
work="$PWD/$target/polyglot"
mkdir -p "$out" "$work/dist"
builds="${CAPSTAN_POLYGLOT_BUILDS:-$HOME/.cache/capstan/polyglot-builds}"
mkdir -p "$builds"
toolchains="$("$POLYGLOT/python/bin/componentize-py" --version) $(cat "$POLYGLOT/js/package.json") node $(node --version)"

# The key of a build: a hash of the files under the given paths (caches
# and installed modules aside), of this script, of the toolchains and of
# the extra words given after `--`.
build_key() {
    local paths=() words=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do paths+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    words=("$@")
    {
        find "${paths[@]}" -type f -not -path '*/node_modules/*' -not -path '*/__pycache__/*' \
            -not -path '*/.pytest_cache/*' -not -path '*/build/*' -not -path '*.egg-info/*' -print0 \
            | LC_ALL=C sort -z | xargs -0 sha256sum
        sha256sum scripts/build-polyglot-plugins.sh
        echo "$toolchains ${words[*]}"
    } | sha256sum | cut -c1-32
}

# Copy a kept build of STEM with KEY to DEST; false if there is none.
take_kept() {
    local kept="$builds/$1-$2.component.wasm"
    [ -f "$kept" ] || return 1
    touch "$kept"
    cp "$kept" "$3"
}

# Keep DEST as the build of STEM with KEY; drop all but its three newest.
keep() {
    cp "$3" "$builds/.$1-$2.partial" && mv "$builds/.$1-$2.partial" "$builds/$1-$2.component.wasm"
    ls -t "$builds/$1"-*.component.wasm | tail -n +4 | xargs -r rm -f
}

echo "==> building the capstan CLI (plugin annotate)"
cargo build --quiet -p capstan --bin capstan
capstan="$PWD/$target/debug/capstan"

echo "==> packaging the SDKs: sdk/python (wheel), sdk/js (npm pack)"
rm -f "$work"/dist/*
"$POLYGLOT/python/bin/pip" wheel --quiet --no-deps sdk/python -w "$work/dist"
rm -rf sdk/python/build sdk/python/*.egg-info
rm -rf "$work/python-sdk"
"$POLYGLOT/python/bin/pip" install --quiet --no-deps --target "$work/python-sdk" "$work"/dist/capstan_plugin-*.whl
(cd sdk/js && npm pack --silent --pack-destination "$work/dist" >/dev/null)
ls "$work/dist"

for dir in plugins/*-py; do
    [ -f "$dir/app.py" ] || continue
    stem="$(basename "$dir" | tr - _)"
    world="$(scripts/plugin-world.sh "$dir" py)"
    key="$(build_key "$dir" sdk/python wit -- "$world")"
    if take_kept "$stem" "$key" "$work/$stem.component.wasm"; then
        echo "==> $dir: kept build $key ($world)"
    else
        echo "==> $dir: componentize-py ($world)"
        "$POLYGLOT/python/bin/componentize-py" -d wit -w "$world" componentize app \
            -p "$dir" -p "$work/python-sdk" -o "$work/$stem.component.wasm" >/dev/null
        keep "$stem" "$key" "$work/$stem.component.wasm"
    fi
    "$capstan" plugin annotate "$work/$stem.component.wasm" -m "$dir/capstan-plugin.json" -o "$out/$stem.wasm" \
        | sed -n '1,4p'
done

# Bundle the JavaScript plugin in DIR (with the packed SDK, as a user's
# `npm install` gets it) and componentize it as STEM for WORLD from ENTRY.
componentize_js() {
    local dir="$1" stem="$2" world="$3" entry="$4"
    local build="$work/$(basename "$dir")"
    rm -rf "$build" && mkdir -p "$build"
    cp -r "$dir"/*.js "$build/"
    echo '{"private":true,"type":"module"}' > "$build/package.json"
    (cd "$build" && npm install --silent --no-audit --no-fund --no-save "$work"/dist/capstan-plugin-*.tgz)
    # WIT imports (`capstan:plugin/log@0.1.0`) stay imports; the rest is bundled.
    cat > "$build/rolldown.config.mjs" <<CONFIG
export default {
  input: '$entry',
  external: (id) => /^[a-z][a-z0-9-]*:[a-z][a-z0-9-]*\//.test(id),
  output: { file: 'bundle.js', format: 'esm' },
};
CONFIG
    (cd "$build" && "$POLYGLOT/js/node_modules/.bin/rolldown" -c rolldown.config.mjs >/dev/null)
    "$POLYGLOT/js/node_modules/.bin/componentize-js" "$build/bundle.js" --wit wit --world-name "$world" \
        -o "$work/$stem.component.wasm" >/dev/null
}

for dir in plugins/*-js; do
    [ -f "$dir/package.json" ] || continue
    stem="$(basename "$dir" | tr - _)"
    world="$(scripts/plugin-world.sh "$dir" js)"
    entry="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("main","index.js"))' "$dir/package.json")"
    key="$(build_key "$dir" sdk/js wit -- "$world" "$entry")"
    if take_kept "$stem" "$key" "$work/$stem.component.wasm"; then
        echo "==> $dir: kept build $key ($world)"
    else
        echo "==> $dir: rolldown + componentize-js ($world)"
        componentize_js "$dir" "$stem" "$world" "$entry"
        keep "$stem" "$key" "$work/$stem.component.wasm"
    fi
    "$capstan" plugin annotate "$work/$stem.component.wasm" -m "$dir/capstan-plugin.json" -o "$out/$stem.wasm" \
        | sed -n '1,4p'
done
