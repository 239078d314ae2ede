"""Helpers for in-place updater plugins (the `updater-http-plugin` world):
the three answers `update` gives. `update` is re-entrant: the host calls it
again after `retry_after_ms` until it answers `done()` or `failed(...)`,
possibly after a restart, so look at the instance before acting.

    def update(self, current, desired, claimed_fields):
        if already_there: return done()
        start_it(); return in_progress(200, 0, "update started")
"""

from __future__ import annotations

from typing import Any, Optional

from . import _bindings


def done() -> Any:
    """All claimed fields are applied."""
    return _bindings.updater().UpdateProgress_Done()


def in_progress(retry_after_ms: int = 1000, percent: Optional[int] = None, message: Optional[str] = None) -> Any:
    """Still working: the host calls `update` again after `retry_after_ms`
    (at least 1); `percent` (0-100) and `message` show in the Machine's status."""
    u = _bindings.updater()
    if percent is not None:
        percent = min(100, max(0, int(percent)))
    return u.UpdateProgress_InProgress(u.UpdateInProgress(max(1, int(retry_after_ms)), percent, message))


def failed(message: str) -> Any:
    """The update failed; the host reports it (it never rolls back silently)."""
    return _bindings.updater().UpdateProgress_Failed(message)
