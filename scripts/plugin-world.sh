#!/usr/bin/env bash
# plugin-world.sh DIR py|js: the contract world a Python or JavaScript
# plugin in DIR is built for, from its capstan-plugin.json's `world` and
# `contract`. Python providers and updaters need the worlds that name
# wasi:http (componentize-py binds only what a world names); componentize-js
# adds wasi:http for `fetch` itself. A manifest naming an older contract than
# wit/'s gets that contract's frozen world (wit/deps/), so the component
# imports nothing the older host lacks (the SDKs then use wasi:http).
set -euo pipefail
cd "$(dirname "$0")/.."
read -r role contract < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["world"], m["contract"])' "$1/capstan-plugin.json")
current="$(sed -n 's/^package capstan:plugin@\([0-9.]*\);$/\1/p' wit/capstan-plugin.wit)"
case "$role:$2" in
    provider:py) world=provider-http-plugin ;;
    updater:py) world=updater-http-plugin ;;
    *) world="$role-plugin" ;;
esac
if [ "$contract" = "$current" ]; then
    echo "$world"
else
    echo "capstan:plugin/$world@$contract"
fi
