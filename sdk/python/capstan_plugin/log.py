"""Structured logs into the host's logs, tagged with the plugin and call.

`log.info("created", instance="i-1")`. Volume is limited per call; print()
also works (stdout and stderr are captured), but loses the fields.
"""

from . import _bindings


def _emit(level: str, message: str, fields: dict[str, object]) -> None:
    wit = _bindings.log()
    pairs = [(str(k), str(v)) for k, v in fields.items()]
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
