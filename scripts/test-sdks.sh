#!/usr/bin/env bash
# The Python and JavaScript SDKs' own unit tests (part of the README's test
# command): the Python SDK on CPython against the bindings componentize-py
# generates for the provider world, the JavaScript SDK on Node.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" polyglot
POLYGLOT="${CAPSTAN_POLYGLOT:-$HOME/.cache/capstan/polyglot}"
bindings="$(mktemp -d)"
trap 'rm -rf "$bindings"' EXIT
"$POLYGLOT/python/bin/componentize-py" -d wit -w provider-http-plugin bindings "$bindings" >/dev/null
echo "==> Python SDK unit tests (sdk/python/tests)"
PYTHONPATH="$bindings:sdk/python" PYTHONDONTWRITEBYTECODE=1 "$POLYGLOT/python/bin/python" -m unittest discover -s sdk/python/tests
echo "==> JavaScript SDK unit tests (sdk/js/test)"
node --test --test-reporter=spec sdk/js/test/
