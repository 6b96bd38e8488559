"""A worker's place among ``serve --workers N`` for its calls: what the parent gives each worker, and call ids
that name the worker holding the call (gateway.transports.calls.routing passes requests on by them).

Nothing here imports prometheus_client: ``CallWorkers`` crosses to the spawned workers, which unpickle it
before they may import it (gateway.server.workers).
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterable

from gateway.runtime.tally import Array, Seen, Tally, shared_seen, shared_tally

_ID = re.compile(r"^rtc_[0-9a-f]{24}$")


def new_call_id(slot: int = 0) -> str:
    """``rtc_`` and 24 random hex digits, the last four the worker's slot offset by the first four."""
    raw = bytearray(secrets.token_bytes(12))
    raw[10:12] = ((slot + int.from_bytes(raw[0:2], "big")) % 65536).to_bytes(2, "big")
    return "rtc_" + raw.hex()


def slot_of(call_id: str) -> int | None:
    """The worker slot a call id names (None: not an id of ours)."""
    if not _ID.match(call_id):
        return None
    raw = bytes.fromhex(call_id[4:])
    return (int.from_bytes(raw[10:12], "big") - int.from_bytes(raw[0:2], "big")) % 65536


@dataclasses.dataclass
class CallWorkers:
    """What the parent of ``serve --workers N`` gives each worker for its calls: its slot among ``count``, the
    folder of the workers' private sockets, the key and arrays the phone lines' bounds share, and its SIP
    sockets (its own in each SO_REUSEPORT group: gateway.transports.sip.ports)."""

    slot: int
    count: int
    folder: str
    key: bytes
    sip_calls: Array
    pending_calls: Array
    sip_streams: Array
    stream_tokens: Array
    sip_sockets: list[socket.socket] = dataclasses.field(default_factory=list)

    @classmethod
    def make(cls, count: int, folder: str) -> CallWorkers:
        """The parent's: slot 0's, before each worker's slot and sockets are set."""
        return cls(0, count, folder, secrets.token_bytes(32), shared_tally(count), shared_tally(count),
                   shared_tally(count), shared_seen(count))

    def path(self, slot: int) -> str:
        return os.path.join(self.folder, f"worker-{slot}.sock")

    def tally(self, array: Array, held: Callable[[], Iterable[str]]) -> Tally:
        return Tally(held, array, self.count, self.slot, self.key)

    def seen(self) -> Seen:
        return Seen(self.stream_tokens, self.count, self.slot)


def tally(workers: CallWorkers | None, name: str, held: Callable[[], Iterable[str]]) -> Tally:
    """The tally ``name`` (a CallWorkers array) over what ``held`` says this process holds."""
    return Tally(held) if workers is None else workers.tally(getattr(workers, name), held)
