"""Repeated warnings rate-limited: one line per interval for each kind, with a count of those left out.

Clients can make a server warn (uvicorn's "Exceeded concurrency limit." for every connection past the
limit, "Invalid HTTP request received." for every malformed one): a flood of them would fill the log.
``RepeatedWarnings`` is a filter for the process's log handler (gateway.logs.configure_logging installs
it). A record of WARNING or above passes if no record of its kind (logger, level and message template)
passed in the last ``interval_s``; others of its kind are counted and dropped, and the next one to pass
says how many were left out (so a flood that stops is reported when its kind next comes up). INFO and
below always pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

INTERVAL_S = 10.0
# Kinds remembered at most: messages formatted before logging (no template) make a new kind each.
MAX_KINDS = 1024


class RepeatedWarnings(logging.Filter):
    """Install on one handler (it rewrites the message of a record that passes after others were left out)."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._kinds: dict[tuple[str, int, str], tuple[float, int]] = {}  # kind -> (when one passed, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        passed = self._kinds.get(kind)
        if passed is not None and now - passed[0] < self.interval_s:
            self._kinds[kind] = (passed[0], passed[1] + 1)
            return False
        if passed is not None and passed[1]:
            # Appended to the template: its % placeholders still take the record's arguments.
            record.msg = f"{record.msg} [{passed[1]} more like this in the last {now - passed[0]:.0f} s not shown]"
        if len(self._kinds) >= MAX_KINDS:
            self._forget(now)
        self._kinds[kind] = (now, 0)
        return True

    def _forget(self, now: float) -> None:
        """Make room: drop the kinds whose interval is over (their counts were zero or will not be told)."""
        self._kinds = {k: v for k, v in self._kinds.items() if now - v[0] < self.interval_s}
        if len(self._kinds) >= MAX_KINDS:
            self._kinds.clear()
