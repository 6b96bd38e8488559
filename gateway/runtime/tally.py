"""Counts that hold for the whole gateway under ``serve --workers N``: things held by source, and tokens used once.

``Tally`` counts one kind of thing the phone lines hold (SIP calls, pending calls, SIP TCP connections) in
total and by source. Each worker knows what it holds (``held``: the source of each); it publishes that in
its own row of an array the parent made before starting the workers, which every worker reads (one writer
a row, no lock, as gateway.runtime.capacity's counts, for the same reason). A source's count in the other
workers is its bucket's: sources are hashed into BUCKETS with the gateway's key, so two sources that share
a bucket in different workers count against each other, a stricter bound, never a looser one. Admission is
optimistic, as Capacity's: count the new one in, read the totals, step back if over.

``Seen`` remembers tokens used once (Twilio's stream tokens) in every worker: a token is refused when this
worker or any other used it.

Nothing here imports prometheus_client: the parent of ``serve --workers N`` makes these arrays, and a worker
unpickles them before it may import it (gateway.server.workers).
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, MutableSequence
from dataclasses import dataclass

import numpy as np

BUCKETS = 4096
SEEN_PER_WORKER = 4096  # the tokens a worker remembers for the others (its own: all, until they expire)

Array = MutableSequence[int]


def shared_tally(workers: int) -> Array:
    """A tally's array for ``workers`` workers: a row each, its total then its buckets."""
    return multiprocessing.get_context("spawn").RawArray(ctypes.c_int32, workers * (1 + BUCKETS))


def shared_seen(workers: int) -> Array:
    """Seen's array: a ring of (expiry, digest) pairs per worker."""
    return multiprocessing.get_context("spawn").RawArray(ctypes.c_int64, workers * 2 * SEEN_PER_WORKER)


def clear_row(array: Array, slot: int) -> None:
    """A worker is gone, and what it held with it (its parent writes its row now: the row's writer is dead)."""
    width = 1 + BUCKETS
    array[slot * width:(slot + 1) * width] = [0] * width


@dataclass
class Full:
    """Which bounds refuse one more: the total, the source's share."""

    total: bool
    source: bool


class Tally:
    def __init__(self, held: Callable[[], Iterable[str]], array: Array | None = None, workers: int = 1,
                 slot: int = 0, key: bytes = b"") -> None:
        self._held = held
        self._array = array if workers > 1 else None  # one process: what it holds is all there is
        self._workers, self._slot, self._key = workers, slot, key
        self._row: dict[int, int] = {}  # this worker's published buckets that are not zero

    def _bucket(self, source: str) -> int:
        digest = hashlib.blake2b(source.encode(), key=self._key[:64], digest_size=4).digest()
        return int.from_bytes(digest, "little") % BUCKETS

    def refresh(self) -> None:
        """Publish what this worker holds now (once something it held is gone)."""
        self._publish(Counter(self._held()))

    def admit(self, source: str, limit: int, per_source: int) -> Full | None:
        """Count one more from ``source`` if the gateway has room: None, or the bounds that refuse it. Once
        admitted, the caller holds it at once (or calls ``refresh``)."""
        mine = Counter(self._held())
        mine[source] += 1
        self._publish(mine)
        total, of_source = mine.total(), mine[source]
        if self._array is not None:
            width, bucket = 1 + BUCKETS, 1 + self._bucket(source)
            others = [w for w in range(self._workers) if w != self._slot]
            total += sum(self._array[w * width] for w in others)
            of_source += sum(self._array[w * width + bucket] for w in others)
        if total <= limit and of_source <= per_source:
            return None
        mine[source] -= 1
        self._publish(mine)
        return Full(total > limit, of_source > per_source)

    def _publish(self, held: Counter[str]) -> None:
        if self._array is None:
            return
        row: Counter[int] = Counter()
        for source, count in held.items():
            if count > 0:
                row[self._bucket(source)] += count
        base = self._slot * (1 + BUCKETS)
        for bucket in self._row.keys() - row.keys():
            self._array[base + 1 + bucket] = 0
        for bucket, count in row.items():
            if self._row.get(bucket) != count:
                self._array[base + 1 + bucket] = count
        self._array[base] = held.total()
        self._row = dict(row)


class Seen:
    """Tokens used once, for every worker: ``use`` says whether a token is new (and marks it used)."""

    def __init__(self, array: Array | None = None, workers: int = 1, slot: int = 0) -> None:
        self._rings = (np.frombuffer(array, dtype=np.int64).reshape(workers, SEEN_PER_WORKER, 2)  # type: ignore[call-overload]
                       if array is not None and workers > 1 else None)
        self._slot = slot
        self._next = 0
        self._mine: OrderedDict[bytes, float] = OrderedDict()  # this worker's, until they expire

    def use(self, token: bytes, expires: float) -> bool:
        now = time.time()
        while self._mine and next(iter(self._mine.values())) < now:
            self._mine.popitem(last=False)
        if token in self._mine:
            return False
        self._mine[token] = expires
        if self._rings is None:
            return True
        digest = int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "little", signed=True)
        # Written before the others are read: two workers taking one token at once both refuse it.
        self._rings[self._slot, self._next] = (int(expires), digest)
        self._next = (self._next + 1) % SEEN_PER_WORKER
        others = np.delete(self._rings, self._slot, axis=0)
        return not bool(np.any((others[:, :, 1] == digest) & (others[:, :, 0] >= now)))
