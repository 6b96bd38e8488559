"""How many sessions the gateway holds against ``[server] max_sessions``, and whether it is draining.

Admission, ``/readyz`` and ``/metrics`` read this one object. With ``serve --workers N`` every worker
process holds a ``Capacity`` on one shared array (a slot per worker, made by the parent before it starts
them), so the limit is the gateway's, not each worker's, and any worker's ``/readyz`` tells the truth.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.sharedctypes import SynchronizedArray


def shared_counts(workers: int) -> SynchronizedArray:
    """The array the parent hands to its ``workers`` (a spawn context's, so it crosses to them)."""
    return multiprocessing.get_context("spawn").Array("q", workers)


class Capacity:
    def __init__(self, limit: int, counts: SynchronizedArray | None = None, slot: int = 0) -> None:
        self.limit = limit
        # One process: the fork context's array, whose lock is anonymous, so no resource-tracker process
        # starts with every gateway (the spawn context's named lock starts one).
        self._counts = counts if counts is not None else multiprocessing.get_context("fork").Array("q", 1)
        self._slot = slot
        self.draining = False

    @property
    def sessions(self) -> int:
        """Sessions open in every worker."""
        return sum(self._counts[:])

    @property
    def free(self) -> int:
        return max(0, self.limit - self.sessions)

    def admit(self) -> bool:
        """Count one more session here if the gateway has room and is not draining."""
        with self._counts.get_lock():  # two workers must not both take the last slot
            if self.draining or self.sessions >= self.limit:
                return False
            self._counts[self._slot] += 1
        return True

    def release(self) -> None:
        with self._counts.get_lock():
            self._counts[self._slot] -= 1
