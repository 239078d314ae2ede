"""Helpers for addon plugins (the `addon-plugin` world): the version table
`versions` returns, the version `render` was asked for, and health judged
from the observed objects the way the Rust and JavaScript SDKs judge it.

    VERSIONS = [("1.7.0", "stable"), ("1.8.2", "rapid")]
    KUBERNETES = {"1.8.2": ">=1.20.0"}

    class Addon(exports.Addon):
        def versions(self):
            return version_table(VERSIONS, KUBERNETES)
        def render(self, spec):
            version = pick_version(spec, VERSIONS)
            ...
        def assess(self, spec, observed):
            return daemonset_health(find_observed(observed, "DaemonSet", NAME), NAME)
"""

from __future__ import annotations

import json
from typing import Any, Optional

from . import _bindings
from .errors import invalid_config


def version_table(table: list[tuple[str, str]], kubernetes: Optional[dict[str, str]] = None) -> list:
    """`[(version, channel), ...]` as the `versions` export returns it: one
    entry per version, listing its channels, in first-seen order.
    `kubernetes` (optional) maps a version to the Kubernetes versions it
    supports, as a semantic-version requirement such as `">=1.20.0"`: the
    host applies a version only while the cluster's API server and kubelets
    meet it."""
    info = _bindings.addon().VersionInfo
    ranges = kubernetes or {}
    out: dict[str, list[str]] = {}
    for version, channel in table:
        out.setdefault(version, []).append(channel)
    return [info(version, channels, ranges.get(version)) for version, channels in out.items()]


def pick_version(spec: Any, table: list[tuple[str, str]]) -> str:
    """The version the host resolved (`spec.version`), or `invalid-config`
    naming the versions this plugin knows."""
    asked = spec.version or ""
    known = list(dict.fromkeys(v for v, _ in table))
    if asked not in known:
        raise invalid_config(f"version: {json.dumps(asked)} is not one of {', '.join(known)}")
    return asked


def find_observed(observed: list[str], kind: str, name: str) -> Optional[dict]:
    """The observed object of `kind` named `name`, parsed; None when absent
    (text that is not JSON is not the object asked for)."""
    for text in observed:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("kind") == kind and (value.get("metadata") or {}).get("name") == name:
            return value
    return None


def _count(value: Any, *path: str) -> int:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _rolled_out(value: dict) -> bool:
    return _count(value, "status", "observedGeneration") >= _count(value, "metadata", "generation")


def health(healthy: bool, message: Optional[str], details: list[tuple[str, str]]) -> Any:
    """The `health` record `assess` returns."""
    return _bindings.addon().Health(healthy, message, details)


def deployment_health(d: Optional[dict], name: str) -> Any:
    """Healthy when the Deployment's latest spec is rolled out and every
    desired replica is updated and available."""
    if d is None:
        return health(False, f"Deployment {name} is not there", [])
    replicas = (d.get("spec") or {}).get("replicas")
    desired = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1
    updated = _count(d, "status", "updatedReplicas")
    available = _count(d, "status", "availableReplicas")
    details = [
        ("availableReplicas", f"{available}/{desired}"),
        ("updatedReplicas", f"{updated}/{desired}"),
    ]
    if not _rolled_out(d):
        return health(False, f"Deployment {name}: the latest spec is not rolled out yet", details)
    if updated >= desired and available >= desired:
        return health(True, f"Deployment {name}: {available}/{desired} replicas available", details)
    return health(
        False, f"Deployment {name}: {updated}/{desired} updated, {available}/{desired} available", details
    )


def daemonset_health(d: Optional[dict], name: str) -> Any:
    """Healthy when the DaemonSet's latest spec is rolled out and every
    scheduled pod is ready and updated."""
    if d is None:
        return health(False, f"DaemonSet {name} is not there", [])
    desired = _count(d, "status", "desiredNumberScheduled")
    ready = _count(d, "status", "numberReady")
    updated = _count(d, "status", "updatedNumberScheduled")
    details = [
        ("numberReady", f"{ready}/{desired}"),
        ("updatedNumberScheduled", f"{updated}/{desired}"),
    ]
    if not _rolled_out(d):
        return health(False, f"DaemonSet {name}: the latest spec is not rolled out yet", details)
    return health(
        ready >= desired and updated >= desired,
        f"DaemonSet {name}: {ready}/{desired} ready, {updated}/{desired} updated",
        details,
    )
