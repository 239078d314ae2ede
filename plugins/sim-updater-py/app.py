"""`sim-updater-py`: the sim cloud's in-place updater (plugins/sim-updater)
in Python.

It claims one field, `version`, and applies it with the cloud's in-place
update API. `update` is re-entrant: every call looks at the instance first,
so calling it again (also after a host restart) continues or confirms the
same update instead of starting a new one. Built with componentize-py for
the `updater-http-plugin` world and annotated with capstan-plugin.json
(scripts/build-polyglot-plugins.sh).
"""

from dataclasses import dataclass
from typing import Any, Optional

from capstan_plugin import HttpError, Request, api_error, invalid_config, parse_config, send, terminal, to_plugin_error, transient
from capstan_plugin.updater import done, failed, in_progress
from wit_world import exports

#: The field this updater changes in place.
VERSION_FIELD = "version"
PROVIDER_ID_PREFIX = "sim://"


@dataclass
class SimConfig:
    """The part of the provider config this updater needs (the rest is the provider's)."""

    endpoint: str
    instance_type: Optional[str] = None
    tags: Optional[dict[str, str]] = None


def instance_id(provider_id: Optional[str]) -> str:
    pid = provider_id or ""
    rest = pid[len(PROVIDER_ID_PREFIX) :] if pid.startswith(PROVIDER_ID_PREFIX) else ""
    if not rest or any(c in rest for c in "/?#"):
        raise terminal(f"the machine has no {PROVIDER_ID_PREFIX} provider ID yet (it has `{provider_id or ''}`)")
    return rest


def progress(instance: dict, target: str) -> Optional[Any]:
    """What `update` answers from the instance alone, or None when the
    update must be started."""
    if instance.get("state") == "terminating":
        return failed("the instance is being deleted")
    under_way = instance.get("update")
    if under_way and under_way.get("targetVersion") == target:
        return in_progress(200, under_way.get("percent"), f"updating to {target}")
    if not under_way and instance.get("version") == target:
        return done()
    return None


def call(request: Request):
    try:
        return send(request)
    except HttpError as e:
        raise to_plugin_error(e) from None


class Updater(exports.Updater):
    def can_update(self, current, desired, changed_fields: list[str]) -> list[str]:
        return [f for f in changed_fields if f == VERSION_FIELD]

    def update(self, current, desired, claimed_fields: list[str]):
        if VERSION_FIELD not in claimed_fields:
            return done()
        config = parse_config(desired.provider_config, SimConfig, "provider config")
        if not desired.version:
            raise invalid_config("version: the desired machine has no version")
        target = desired.version
        url = f"{config.endpoint.rstrip('/')}/v1/instances/{instance_id(current.provider_id)}"
        resp = call(Request.get(url))
        if resp.status != 200:
            raise api_error(resp, "describing the instance")
        try:
            instance = resp.json()
        except ValueError as e:
            raise transient(f"the cloud's answer is not JSON: {e}", 1000) from None
        answer = progress(instance, target)
        if answer is not None:
            return answer
        resp = call(Request.json("POST", f"{url}/update", {"version": target}))
        if resp.status == 202:
            return in_progress(200, 0, f"update to {target} started")
        if resp.status == 409:
            return failed(f"the cloud refused the update: {resp.text()}")
        raise api_error(resp, "starting the update")
