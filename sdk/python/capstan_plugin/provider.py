"""A base for provider plugins whose configuration is a dataclass.

Subclass it, set `Config`, and implement `check`, `create_instance`,
`get_instance`, `delete_instance` (and `list`, `adoptable` and
`instance_capacity`, optionally: without `adoptable` a restored Machine
launches a second instance; without `instance_capacity` a user writes the
autoscaler's capacity annotations); the raw exports the world asks for
(`validate`, `create`, `get`, `delete`, `list_instances`,
`find_instance`, `capacity`) parse
`machine.provider_config` into `Config` first, so a bad field becomes
`invalid-config` naming it before your code runs. The host instantiates
the plugin afresh for every call: keep no state.

    class Provider(ConfigProvider, exports.Provider):
        Config = SimConfig
        def create_instance(self, machine, config, bootstrap): ...
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .config import describe_schema, parse_config


class ConfigProvider:
    #: The dataclass a Machine's `spec.provider.config` parses into.
    Config: type = type(None)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Runs when the plugin is built: the schema is read into the snapshot.
        super().__init_subclass__(**kwargs)
        if dataclasses.is_dataclass(cls.Config):
            describe_schema(cls.Config)

    def parse(self, text: str) -> Any:
        return parse_config(text, self.Config, "provider config")

    # Yours to implement.
    def check(self, config: Any) -> None:
        """Check a parsed configuration; raise `invalid_config` naming the field."""

    def create_instance(self, machine: Any, config: Any, bootstrap: Optional[Any]) -> Any:
        raise NotImplementedError

    def get_instance(self, machine: Any, config: Any) -> Any:
        raise NotImplementedError

    def delete_instance(self, machine: Any, config: Any) -> Any:
        raise NotImplementedError

    def list(self, config: Any) -> Optional[list]:
        """The instances this configuration can see; None when not supported."""
        return None

    def adoptable(self, machine: Any, config: Any) -> Optional[Any]:
        """The instance a machine the host has recorded none for should adopt
        (after a restore, a re-apply or a move), as a `FoundInstance`: the one
        `machine.provider_id` names when set, else the live instance tagged
        for the machine's namespace/name. None: nothing (then a restored
        Machine launches a second instance)."""
        return None

    def instance_capacity(self, config: Any) -> Optional[Any]:
        """What one instance of `config` offers, as an `InstanceCapacity`
        (cpu_millis, memory_mib, and the optional disk, pods and GPUs), for
        the cluster-autoscaler's scale from zero. None: not known."""
        return None

    # The world's exports.
    def validate(self, config: str) -> None:
        self.check(self.parse(config))

    def create(self, machine: Any, bootstrap: Optional[Any]) -> Any:
        config = self.parse(machine.provider_config)
        self.check(config)
        return self.create_instance(machine, config, bootstrap)

    def get(self, machine: Any) -> Any:
        return self.get_instance(machine, self.parse(machine.provider_config))

    def delete(self, machine: Any) -> Any:
        return self.delete_instance(machine, self.parse(machine.provider_config))

    def list_instances(self, config: str) -> Optional[list]:
        return self.list(self.parse(config))

    def find_instance(self, machine: Any) -> Optional[Any]:
        return self.adoptable(machine, self.parse(machine.provider_config))

    def capacity(self, config: str) -> Optional[Any]:
        parsed = self.parse(config)
        self.check(parsed)
        return self.instance_capacity(parsed)
