"""Helpers for a plugin's own tests on CPython (see test.sh in a project
`capstan plugin new` made): run a function and say which contract error it
raised."""

from typing import Any, Callable

from . import _bindings
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
