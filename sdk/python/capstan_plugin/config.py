"""Parse a JSON configuration into your own dataclass, with errors that
name the field.

    @dataclass
    class Config:
        endpoint: str
        instance_type: Optional[str] = None
        tags: dict[str, str] = field(default_factory=dict)

    config = parse_config(machine.provider_config, Config)

JSON keys are the camelCase of the field names (`instanceType`). Unknown
keys, missing required fields and wrong types raise `invalid-config` naming
the field (`tags.team: expected a string, got a number`), like the Rust SDK's
`deny_unknown_fields`.
"""

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

from .errors import invalid_config

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that does not fit its schema; `str()` names the field."""


def camel(name: str) -> str:
    """`instance_type` -> `instanceType`."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def check_config(value: Any, schema: type[T], path: str = "") -> T:
    """Build `schema` from decoded JSON; raises ConfigError naming the field."""
    return _build(schema, value, path)


def parse_config(text: str, schema: type[T], what: str = "config") -> T:
    """Parse JSON object text into `schema`; raises `invalid-config`."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise invalid_config(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    try:
        return check_config(value, schema)
    except ConfigError as e:
        raise invalid_config(f"{what} is invalid: {e}") from None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# Per schema: its fields by JSON key, and their resolved types. Reading
# type hints costs more than parsing a small config, so it is done once per
# schema; a schema known when the plugin is built (`ConfigProvider.Config`)
# is read then, and componentize-py's snapshot keeps the result, so calls
# (each in a fresh instance) start with it.
_SCHEMAS: dict[type, tuple[dict[str, Any], dict[str, Any]]] = {}


def describe_schema(schema: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(fields by camelCase key, type hints)` of a dataclass, cached."""
    known = _SCHEMAS.get(schema)
    if known is None:
        fields = {camel(f.name): f for f in dataclasses.fields(schema)}
        known = (fields, typing.get_type_hints(schema))
        _SCHEMAS[schema] = known
        for hint in known[1].values():
            for inner in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                    describe_schema(inner)
    return known


def _build(schema: type, value: Any, path: str) -> Any:
    where = path or "config"
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected an object, got {_kind(value)}")
    fields, hints = describe_schema(schema)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ConfigError(
            f"{path}{unknown[0]}: unknown field; expected one of {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for key, f in fields.items():
        if key not in value:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                raise ConfigError(f"{path}{key}: missing (it is required)")
            continue
        kwargs[f.name] = _coerce(hints[f.name], value[key], f"{path}{key}")
    return schema(**kwargs)


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(inner[0], value, path)
        raise ConfigError(f"{path}: unions other than Optional are not supported")
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, f"{path}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected an array, got {_kind(value)}")
        return [_coerce(args[0] if args else Any, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected an object, got {_kind(value)}")
        inner = args[1] if len(args) == 2 else Any
        return {k: _coerce(inner, v, f"{path}.{k}") for k, v in value.items()}
    expected = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    if hint in expected:
        ok = (
            isinstance(value, hint) and not (hint is int and isinstance(value, bool))
            or (hint is float and isinstance(value, int) and not isinstance(value, bool))
        )
        if not ok:
            raise ConfigError(f"{path}: expected {expected[hint]}, got {_kind(value)}")
        return float(value) if hint is float else value
    raise ConfigError(f"{path}: the schema's type {hint!r} is not supported")
