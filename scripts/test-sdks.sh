#!/usr/bin/env bash
# The Python and JavaScript SDKs' own unit tests (part of the README's test
# command), and the Python and JavaScript sample plugins' own: Python on
# CPython against the bindings componentize-py generates for the provider
# world, JavaScript on Node with @capstan/plugin/testing's stand-ins for WIT
# imports.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" polyglot
POLYGLOT="${CAPSTAN_POLYGLOT:-$HOME/.cache/capstan/polyglot}"
bindings="$(mktemp -d)"
trap 'rm -rf "$bindings"' EXIT
"$POLYGLOT/python/bin/componentize-py" -d wit -w provider-http-plugin bindings "$bindings" >/dev/null
echo "==> Python SDK unit tests (sdk/python/tests)"
PYTHONPATH="$bindings:sdk/python" PYTHONDONTWRITEBYTECODE=1 "$POLYGLOT/python/bin/python" -m unittest discover -s sdk/python/tests
for dir in plugins/*-py; do
    [ -n "$(ls "$dir"/test_*.py 2>/dev/null)" ] || continue
    echo "==> $dir unit tests"
    PYTHONPATH="$bindings:sdk/python:$dir" PYTHONDONTWRITEBYTECODE=1 "$POLYGLOT/python/bin/python" -m unittest discover -s "$dir"
done
echo "==> JavaScript SDK unit tests (sdk/js/test)"
node --test --test-reporter=spec sdk/js/test/
for dir in plugins/*-js; do
    [ -d "$dir/test" ] || continue
    echo "==> $dir unit tests"
    (cd "$dir" && npm install --silent --no-audit --no-fund --no-package-lock && npm test --silent)
done
