"""The bindings componentize-py generated for the plugin's world.

componentize-py names a WIT interface's module after the interface, adding
the package when two share a name: the contract's `types` is
`capstan_plugin_types` in the provider worlds (which also use
`bootstrap-types`) and `types` in the others.

Everything is imported when this module is: componentize-py runs the
plugin's imports once at build time and snapshots them, and the sandbox has
no filesystem, so a module first imported during a call is not found. On
CPython without bindings (the SDK's own tests of pure logic) the names are
None and only the parts that need them fail, saying why.
"""

import importlib
from types import ModuleType
from typing import Optional


def _first(*names: str) -> Optional[ModuleType]:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


TYPES = _first("wit_world.imports.capstan_plugin_types", "wit_world.imports.types")
LOG = _first("wit_world.imports.log")
RESULTS = _first("componentize_py_types")
# `capstan:plugin/http` (contract 0.3.0): in every 0.3.0 world; absent when
# the plugin is built for a 0.2.0 world (`-w capstan:plugin/WORLD@0.2.0`),
# and then `http.send` uses wasi:http.
CAPSTAN_HTTP = _first("wit_world.imports.http")
# Only in the worlds that name wasi:http (provider-http-plugin, updater-http-plugin).
HTTP_TYPES = _first("wit_world.imports.wasi_http_types")
OUTGOING_HANDLER = _first("wit_world.imports.outgoing_handler")
STREAMS = _first("wit_world.imports.streams")
# The exported interface's records: only in its own world.
ADDON = _first("wit_world.exports.addon")
UPDATER = _first("wit_world.exports.updater")

MISSING = (
    "no componentize-py bindings for {what}: build the plugin for a contract world "
    "(`componentize-py -d wit -w WORLD componentize app`), or generate them for tests "
    "(`componentize-py -d wit -w WORLD bindings DIR`)"
)


def need(module: Optional[ModuleType], what: str) -> ModuleType:
    if module is None:
        raise ImportError(MISSING.format(what=what))
    return module


def types() -> ModuleType:
    """The contract's `types` interface (PluginError, Machine, ...)."""
    return need(TYPES, "the contract's types")


def log() -> ModuleType:
    """The contract's `log` interface."""
    return need(LOG, "capstan:plugin/log")


def addon() -> ModuleType:
    """The addon interface's records (AddonSpec, VersionInfo, Health)."""
    return need(ADDON, "the addon world (addon-plugin)")


def updater() -> ModuleType:
    """The updater interface's records (UpdateProgress_*)."""
    return need(UPDATER, "an updater world (updater-http-plugin)")


def err(value: object) -> Exception:
    """`componentize_py_types.Err(value)`: raising it returns a contract error."""
    return need(RESULTS, "componentize_py_types").Err(value)
