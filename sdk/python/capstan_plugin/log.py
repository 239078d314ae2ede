"""Structured logs into the host's logs, tagged with the plugin and call.

`log.info("created", instance="i-1")`. Volume is limited per call; print()
also works (stdout and stderr are captured), but loses the fields.
"""

from typing import Optional

from . import _bindings

#: Where lines go instead of the host while a test captures them
#: (`capstan_plugin.testing.captured_logs`): (level, message, fields).
_captured: Optional[list[tuple[str, str, list[tuple[str, str]]]]] = None


def _emit(level: str, message: str, fields: dict[str, object]) -> None:
    pairs = [(str(k), str(v)) for k, v in fields.items()]
    if _captured is not None:
        _captured.append((level.lower(), message, pairs))
        return
    wit = _bindings.log()
    wit.log(getattr(wit.Level, level), message, pairs)


def trace(message: str, **fields: object) -> None:
    _emit("TRACE", message, fields)


def debug(message: str, **fields: object) -> None:
    _emit("DEBUG", message, fields)


def info(message: str, **fields: object) -> None:
    _emit("INFO", message, fields)


def warn(message: str, **fields: object) -> None:
    _emit("WARN", message, fields)


def error(message: str, **fields: object) -> None:
    _emit("ERROR", message, fields)
