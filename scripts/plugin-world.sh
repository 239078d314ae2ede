#!/usr/bin/env bash
# plugin-world.sh DIR py|js: the contract world a Python or JavaScript
# plugin in DIR is built for, from its capstan-plugin.json's `world`.
# Python providers and updaters need the worlds that name wasi:http
# (componentize-py binds only what a world names); componentize-js adds
# wasi:http for `fetch` itself.
set -euo pipefail
role="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["world"])' "$1/capstan-plugin.json")"
case "$role:$2" in
    provider:py) echo provider-http-plugin ;;
    updater:py) echo updater-http-plugin ;;
    *) echo "$role-plugin" ;;
esac
