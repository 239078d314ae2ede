"""Helpers for a plugin's own tests on CPython (see test.sh in a project
`capstan plugin new` made): run a function and say which contract error it
raised; capture what the plugin logs, which on CPython has no host to go to."""

import contextlib
from typing import Any, Callable, Iterator

from . import _bindings, log
from .errors import describe


def contract_error(fn: Callable[[], Any]) -> str:
    """`Kind: message` of the contract error `fn` raises; AssertionError if
    it raises none (any other exception propagates, as a trap would)."""
    err = _bindings.need(_bindings.RESULTS, "componentize_py_types").Err
    try:
        fn()
    except err as e:
        return describe(e)
    raise AssertionError("expected a contract error, but the call returned")


@contextlib.contextmanager
def captured_logs() -> Iterator[list[tuple[str, str, list[tuple[str, str]]]]]:
    """Within the block, `log.info(...)` and friends append
    `(level, message, [(key, value), ...])` to the list yielded."""
    lines: list[tuple[str, str, list[tuple[str, str]]]] = []
    log._captured = lines
    try:
        yield lines
    finally:
        log._captured = None
