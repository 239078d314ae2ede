"""`hostile-py`: a deliberately misbehaving Python provider, a test fixture
proving that a Python plugin is held by the same limits as a Rust one.
Never deploy it.

Its manifest names contract 0.2.0, so it is built for the frozen 0.2.0 world
(scripts/plugin-world.sh): it proves a plugin for older hosts still loads and
that the Python SDK's `send` then goes through `wasi:http`.

The provider config's `attack` picks what `create` does:

| attack | what it does | what the host must report |
|---|---|---|
| `infinite-loop` | spins forever | deadline exceeded |
| `memory-bomb` | allocates until it cannot | memory limit |
| `stdout-flood` | prints without end | output limit (stdout) |
| `exception` | raises ValueError with a message | a trap quoting the exception |
| `escape` | opens `/etc/passwd`, lists `/`, reads the environment, connects a socket to `target` | all four find nothing |
| `request` | GETs `url` with the SDK's `send` and reports the answer | the host's rules, as for a Rust plugin |
| `none` | behaves | nothing |
"""

import os
import socket
from dataclasses import dataclass
from typing import Optional

from capstan_plugin import ConfigProvider, HttpError, Request, send, terminal
from wit_world import exports
from wit_world.exports import provider
from wit_world.imports import capstan_plugin_types as types


@dataclass
class Config:
    attack: str = "none"
    target: Optional[str] = None
    url: Optional[str] = None


def escape(target: Optional[str]) -> str:
    found = []
    try:
        with open("/etc/passwd") as f:
            found.append(f"open: read {len(f.read())} bytes")
    except OSError as e:
        found.append(f"open: denied ({e.__class__.__name__})")
    try:
        found.append(f"listdir: {len(os.listdir('/'))} entries")
    except OSError as e:
        found.append(f"listdir: denied ({e.__class__.__name__})")
    found.append(f"env: {len(os.environ)} variables")
    host, _, port = (target or "127.0.0.1:1").rpartition(":")
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2)
        sock.connect((host, int(port)))
        sock.close()
        found.append("net: connected")
    except Exception as e:  # noqa: BLE001 - any refusal will do
        found.append(f"net: denied ({e.__class__.__name__})")
    return "; ".join(found)


class Provider(ConfigProvider, exports.Provider):
    Config = Config

    def create_instance(self, machine, config: Config, bootstrap):
        attack = config.attack
        if attack == "infinite-loop":
            n = 0
            while True:
                n += 1
        if attack == "memory-bomb":
            hoard = []
            while True:
                hoard.append(bytearray(8 * 1024 * 1024))
        if attack == "stdout-flood":
            while True:
                print("flood " * 200)
        if attack == "exception":
            raise ValueError(f"hostile-py could not create {machine.name}: on purpose")
        if attack == "escape":
            raise terminal(escape(config.target))
        if attack == "request":
            try:
                answer = send(Request.get(config.url or ""))
            except HttpError as e:
                raise terminal(f"request outcome: {e.kind}: {e}") from None
            raise terminal(f"request outcome: HTTP {answer.status}")
        return types.MachineStatus(f"hostile://{machine.uid}", types.InstanceState.RUNNING, [], None, None, None)

    def get_instance(self, machine, config: Config):
        return types.MachineStatus(f"hostile://{machine.uid}", types.InstanceState.RUNNING, [], None, None, None)

    def delete_instance(self, machine, config: Config):
        return provider.Deletion_Done()
