#!/usr/bin/env bash
# The Python and JavaScript SDKs' own unit tests (part of the README's test
# command), and the Python and JavaScript sample plugins' own: Python on
# CPython against the bindings componentize-py generates for each plugin's
# world, JavaScript on Node with @capstan/plugin/testing's stand-ins for WIT
# imports.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" polyglot
POLYGLOT="${CAPSTAN_POLYGLOT:-$HOME/.cache/capstan/polyglot}"
bindings="$(mktemp -d)"
trap 'rm -rf "$bindings"' EXIT
# Bindings for each world a Python plugin is built for, made when first
# needed: a plugin's tests run against its own world's.
py_tests() { # WORLD DIR [PATTERN]
    [ -d "$bindings/$1" ] ||
        "$POLYGLOT/python/bin/componentize-py" -d wit -w "$1" bindings "$bindings/$1" >/dev/null
    PYTHONPATH="$bindings/$1:sdk/python:$2" PYTHONDONTWRITEBYTECODE=1 \
        "$POLYGLOT/python/bin/python" -m unittest discover -s "$2" -p "${3:-test_*.py}"
}
echo "==> Python SDK unit tests (sdk/python/tests)"
py_tests provider-http-plugin sdk/python/tests test_sdk.py
py_tests addon-plugin sdk/python/tests test_addon.py
py_tests updater-http-plugin sdk/python/tests test_updater.py
for dir in plugins/*-py; do
    [ -n "$(ls "$dir"/test_*.py 2>/dev/null)" ] || continue
    world="$(scripts/plugin-world.sh "$dir" py)"
    echo "==> $dir unit tests ($world)"
    py_tests "$world" "$dir"
done
echo "==> JavaScript SDK unit tests (sdk/js/test)"
node --import ./sdk/js/testing/register.js --test --test-reporter=spec sdk/js/test/
for dir in plugins/*-js; do
    [ -d "$dir/test" ] || continue
    echo "==> $dir unit tests"
    (cd "$dir" && npm install --silent --no-audit --no-fund --no-package-lock && npm test --silent)
done
