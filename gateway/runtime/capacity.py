"""How many sessions the gateway holds against ``[server] max_sessions``, and whether it is draining.

Admission, ``/readyz`` and ``/metrics`` read this one object. With ``serve --workers N`` every worker
process holds a ``Capacity`` on one shared array (a slot per worker, made by the parent before it starts
them), so the limit is the gateway's, not each worker's, and any worker's ``/readyz`` tells the truth.

The array has no cross-process lock: a worker killed outright (SIGKILL, the OOM killer) while holding one
would leave it held, and every other worker and the parent would wait on it for ever. Instead each slot has
one writer (its worker; the parent only once that worker is dead), and a worker admits optimistically:
count itself in, then look at the total and step back if it went over. Two workers racing for the last
slot may then both step back (that client is told to retry), but the gateway never holds more than its limit.
"""

from __future__ import annotations

import ctypes
import multiprocessing
from collections.abc import MutableSequence

Counts = MutableSequence[int]


def shared_counts(workers: int) -> Counts:
    """The array the parent hands to its ``workers`` (shared memory that crosses to spawned processes)."""
    return multiprocessing.get_context("spawn").RawArray(ctypes.c_int64, workers)


class Capacity:
    def __init__(self, limit: int, counts: Counts | None = None, slot: int = 0) -> None:
        self.limit = limit
        self._counts = counts if counts is not None else (ctypes.c_int64 * 1)()  # one process: nothing to share
        self.slot = slot
        """This process's index among the gateway's workers (0 for a gateway of one process)."""
        self.draining = False

    @property
    def sessions(self) -> int:
        """Sessions open in every worker."""
        return sum(self._counts[:])

    @property
    def by_worker(self) -> list[int]:
        """Sessions open in each worker, by slot (one process: a list of one)."""
        return list(self._counts[:])

    @property
    def free(self) -> int:
        return max(0, self.limit - self.sessions)

    def admit(self) -> bool:
        """Count one more session here if the gateway has room and is not draining."""
        if self.draining:
            return False
        # Only the event loop's thread counts here, between awaits: this slot's read-modify-write is whole.
        self._counts[self.slot] += 1
        if self.sessions <= self.limit:
            return True
        self._counts[self.slot] -= 1
        return False

    def release(self) -> None:
        self._counts[self.slot] -= 1
