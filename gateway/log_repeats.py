"""Repeated warnings and errors rate-limited: one line per interval for each origin, with a count of those left out.

Clients can make a server warn (uvicorn's "Exceeded concurrency limit." for every connection past the
limit, "Invalid HTTP request received." for every malformed one), or reach a bug of ours over and over: a
flood of them would fill the log. ``RepeatedWarnings`` is a filter for the process's log handler
(gateway.logs.configure_logging installs it). A record of WARNING or above passes if no record of its kind
passed in the last ``interval_s``; others of its kind are counted and dropped, and the next one to pass
says how many were left out (so a flood that stops is reported when its kind next comes up). INFO and
below always pass, but for the lines a client can repeat at will (a refused handshake), which are logged with
``extra=CLIENT_CAUSED`` and limited likewise.

A kind is where a record comes from: its logger, level, call site and message template, and for a record
with a traceback, the traceback itself (each exception's type and the lines it came through). So one
bug's traceback repeated is held back, but a different one (another exception, or the same raised
elsewhere) always shows, however close behind the first it comes.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

INTERVAL_S = 10.0
CLIENT_CAUSED = {"client_caused": True}  # extra= of an INFO line a client can repeat: limited as warnings are
# Kinds remembered at most: messages formatted before logging (no template) make a new kind each.
MAX_KINDS = 1024
# Exceptions of a chain (__cause__, __context__) told apart by their tracebacks.
MAX_CHAIN = 8


def _traceback_kind(exc_info: Any) -> tuple[Any, ...]:
    """What tells a record's traceback from another's: each exception of the chain, its type and the
    (file, line) of each frame it came through; () for none. Strings and numbers only: no frame is kept."""
    exc = exc_info[1] if exc_info else None
    kind: list[Any] = []
    while exc is not None and len(kind) < MAX_CHAIN:
        frames = tuple((frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__))
        kind.append((type(exc).__module__, type(exc).__qualname__, frames))
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return tuple(kind)


class RepeatedWarnings(logging.Filter):
    """Install on one handler (it rewrites the message of a record that passes after others were left out)."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._kinds: dict[tuple[Any, ...], tuple[float, int]] = {}  # kind -> (when one passed, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not getattr(record, "client_caused", False):
            return True
        kind = (record.name, record.levelno, record.pathname, record.lineno, str(record.msg),
                _traceback_kind(record.exc_info))
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
