"""`sim-provider-py`: the sim cloud's provider, in Python.

The same behaviour as the Rust `sim-provider` (plugins/sim-provider): one
instance per Machine, created idempotently with the Machine's uid as the
client token, tagged with the Machine and cluster; `get` finds it by
provider ID or by client token; `delete` is done once the cloud has no
instance. Built with componentize-py for the `provider-http-plugin` world
and annotated with `capstan-plugin.json` (see scripts/build-plugins.sh).
"""

import base64
from dataclasses import dataclass, field
from typing import Optional

from capstan_plugin import (
    ConfigProvider,
    HttpError,
    Request,
    api_error,
    invalid_config,
    not_found,
    send,
    terminal,
    to_plugin_error,
    transient,
)
from wit_world import exports
from wit_world.exports import provider
from wit_world.imports import bootstrap_types
from wit_world.imports import capstan_plugin_types as types

INSTANCE_TYPES = ("small", "medium", "large")
PROVIDER_ID_PREFIX = "sim://"
MACHINE_TAG = "capstan.dev/machine"
CLUSTER_TAG = "capstan.dev/cluster"
STATES = {
    "pending": types.InstanceState.PENDING,
    "running": types.InstanceState.RUNNING,
    "updating": types.InstanceState.UPDATING,
    "terminating": types.InstanceState.STOPPING,
    "stopped": types.InstanceState.STOPPED,
}
FORMATS = {
    bootstrap_types.BootstrapFormat.CLOUD_CONFIG: "cloud-config",
    bootstrap_types.BootstrapFormat.IGNITION: "ignition",
    bootstrap_types.BootstrapFormat.SHELL: "shell",
}


@dataclass
class SimConfig:
    endpoint: str
    instance_type: Optional[str] = None
    tags: dict[str, str] = field(default_factory=dict)


def instance_id(provider_id: str) -> str:
    rest = provider_id[len(PROVIDER_ID_PREFIX):] if provider_id.startswith(PROVIDER_ID_PREFIX) else ""
    if not rest or any(c in rest for c in "/?#"):
        raise terminal(f"provider ID `{provider_id}` is not a {PROVIDER_ID_PREFIX}<instance-id> ID")
    return rest


def status(instance: dict) -> types.MachineStatus:
    addresses = []
    if instance.get("privateIp"):
        addresses.append(types.MachineAddress(types.AddressKind.INTERNAL_IP, instance["privateIp"]))
    if instance.get("hostname"):
        addresses.append(types.MachineAddress(types.AddressKind.HOSTNAME, instance["hostname"]))
    update = instance.get("update")
    message = f"updating to {update['targetVersion']} ({update['percent']}%)" if update else None
    return types.MachineStatus(
        provider_id=PROVIDER_ID_PREFIX + instance["id"],
        state=STATES.get(instance.get("state"), types.InstanceState.UNKNOWN),
        addresses=addresses,
        failure_domain=instance.get("failureDomain"),
        version=instance.get("version"),
        message=message,
    )


def call(request: Request):
    try:
        return send(request)
    except HttpError as e:
        raise to_plugin_error(e) from None


def body(response) -> dict:
    try:
        return response.json()
    except ValueError as e:
        raise transient(f"the cloud's answer is not JSON: {e}", 2000) from None


class Provider(ConfigProvider, exports.Provider):
    Config = SimConfig

    def url(self, config: SimConfig, path: str) -> str:
        return config.endpoint.rstrip("/") + path

    def check(self, config: SimConfig) -> None:
        if not config.endpoint.startswith(("http://", "https://")):
            raise invalid_config(f"endpoint: `{config.endpoint}` must be an http:// or https:// URL")
        reserved = [k for k in config.tags if k.startswith("capstan.dev/")]
        if reserved:
            raise invalid_config(
                f"tags: `{reserved[0]}` is reserved (keys under capstan.dev/ are set by the provider)"
            )
        if config.instance_type is not None and config.instance_type not in INSTANCE_TYPES:
            raise invalid_config(
                f"instanceType: `{config.instance_type}` is not one of {', '.join(INSTANCE_TYPES)}"
            )

    def find(self, machine, config: SimConfig) -> Optional[dict]:
        if machine.provider_id:
            ident = instance_id(machine.provider_id)
            resp = call(Request.get(self.url(config, f"/v1/instances/{ident}")))
            if resp.status == 200:
                return body(resp)
            if resp.status == 404:
                return None
            raise api_error(resp, "describing the instance")
        resp = call(Request.get(self.url(config, f"/v1/instances?clientToken={machine.uid}")))
        if resp.status == 200:
            instances = body(resp).get("instances", [])
            return instances[0] if instances else None
        raise api_error(resp, "looking up the instance by machine uid")

    def create_instance(self, machine, config: SimConfig, bootstrap) -> types.MachineStatus:
        tags = dict(config.tags)
        tags[MACHINE_TAG] = f"{machine.namespace}/{machine.name}"
        if machine.cluster_name:
            tags[CLUSTER_TAG] = machine.cluster_name
        request = {
            "clientToken": machine.uid,
            "name": machine.name,
            "version": machine.version,
            "instanceType": config.instance_type,
            "failureDomain": machine.failure_domain,
            "tags": dict(sorted(tags.items())),
        }
        if bootstrap is not None:
            request["userData"] = {
                "format": FORMATS[bootstrap.format],
                "value": base64.b64encode(bootstrap.value).decode(),
            }
        resp = call(Request.json("POST", self.url(config, "/v1/instances"), request))
        if resp.status in (200, 201):
            return status(body(resp))
        raise api_error(resp, "creating the instance")

    def get_instance(self, machine, config: SimConfig) -> types.MachineStatus:
        instance = self.find(machine, config)
        if instance is None:
            raise not_found(f"no instance for machine {machine.namespace}/{machine.name} (uid {machine.uid})")
        return status(instance)

    def delete_instance(self, machine, config: SimConfig):
        instance = self.find(machine, config)
        if instance is None:
            return provider.Deletion_Done()
        resp = call(Request.delete(self.url(config, f"/v1/instances/{instance['id']}")))
        if resp.status == 404:
            return provider.Deletion_Done()
        if resp.status in (200, 202):
            return provider.Deletion_InProgress(250)
        raise api_error(resp, "deleting the instance")

    def adoptable(self, machine, config: SimConfig):
        if machine.provider_id:
            instance = self.find(machine, config)
        else:
            owner = f"{machine.namespace}/{machine.name}"
            resp = call(Request.get(self.url(
                config, f"/v1/instances?tagKey={MACHINE_TAG}&tagValue={owner}"
            )))
            if resp.status != 200:
                raise api_error(resp, "looking up instances by machine tag")
            tagged = [i for i in body(resp).get("instances", []) if i.get("tags", {}).get(MACHINE_TAG) == owner]
            instance = next((i for i in tagged if i.get("state") != "terminating"), None)
        if instance is None or instance.get("state") == "terminating":
            return None
        tags = instance.get("tags", {})
        return provider.FoundInstance(status(instance), tags.get(MACHINE_TAG), tags.get(CLUSTER_TAG))

    def instance_capacity(self, config: SimConfig):
        name = config.instance_type or "small"
        resp = call(Request.get(self.url(config, f"/v1/instance-types/{name}")))
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise api_error(resp, "describing the instance type")
        t = body(resp)
        return provider.InstanceCapacity(
            int(t["cpus"]) * 1000, int(t["memoryMiB"]), t.get("ephemeralDiskMiB"), t.get("maxPods"), None, None
        )

    def list(self, config: SimConfig):
        resp = call(Request.get(self.url(config, "/v1/instances")))
        if resp.status == 200:
            return [status(i) for i in body(resp).get("instances", [])]
        raise api_error(resp, "listing instances")
