"""The contract's errors, as exceptions to raise from an export.

An export that returns `result<_, plugin-error>` returns the error when
you `raise` one of these; any other exception is a trap (a bug in the
plugin), which the host reports with the exception's message.
"""

from . import _bindings


def invalid_config(message: str) -> Exception:
    """The configuration is wrong; name the field and what is wrong with it."""
    return _bindings.err(_bindings.types().PluginError_InvalidConfig(message))


def not_found(message: str) -> Exception:
    """The thing asked about does not exist."""
    return _bindings.err(_bindings.types().PluginError_NotFound(message))


def transient(message: str, retry_after_ms: int = 1000) -> Exception:
    """Retry later (throttling, a 5xx, capacity); the host waits `retry_after_ms`."""
    t = _bindings.types()
    return _bindings.err(t.PluginError_Transient(t.TransientError(message, max(1, int(retry_after_ms)))))


def unauthorized(message: str) -> Exception:
    """The plugin's credentials were refused."""
    return _bindings.err(_bindings.types().PluginError_Unauthorized(message))


def terminal(message: str) -> Exception:
    """A failure retrying will not fix; a human must look."""
    return _bindings.err(_bindings.types().PluginError_Terminal(message))


def describe(error: Exception) -> str:
    """`invalid-config: port: ...` for a contract error; `repr` for others."""
    value = getattr(error, "value", None)
    kind = type(value).__name__.removeprefix("PluginError_")
    inner = getattr(value, "value", value)
    text = getattr(inner, "message", inner)
    return f"{kind}: {text}" if value is not None else repr(error)
