"""`serve --workers N`: the parent accepts each connection and hands it to the worker with the fewest open
connections.

When every worker accepts on the one listening socket, whoever calls accept first wins: the kernel gives
connections to whichever worker's loop happens to wake first, and on a 16-core host three workers of twelve
ran 3-5x the loop lag of the rest (the gateway benchmark, before this hand-off). Here only the parent
accepts, in a thread of its own, and passes the connection's file descriptor over a Unix socket (SCM_RIGHTS)
to the ready worker with the fewest open connections; the worker adopts it into its uvicorn server as if it
had accepted it, so nothing else changes and the parent never reads a byte of it.

A worker's load is what it last reported in the shared ``Loads`` (its open connections, sessions included,
and how many connections it had been handed by then) plus what the parent handed it since: exact, also
when a burst arrives faster than the workers report. A worker that is not ready (loading its models, or
being started again) gets none; a connection no worker can take is closed, as a full accept queue drops it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import socket
import threading
import time
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

REPORT_S = 0.02  # how often a worker reports its open connections


@dataclass
class Loads:
    """Shared with the workers, a slot each, written only by that worker (and by the parent once it is dead)."""

    open: MutableSequence[int]  # the worker's open connections
    adopted: MutableSequence[int]  # connections it had been handed when it counted them

    @classmethod
    def shared(cls, workers: int) -> Loads:
        context = multiprocessing.get_context("spawn")
        return cls(context.RawArray(ctypes.c_int64, workers), context.RawArray(ctypes.c_int64, workers))


@dataclass
class Handoff:
    """A worker's side: its end of the handoff socket, and its slot of the shared loads."""

    end: socket.socket
    loads: Loads
    slot: int


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """The parent's end and the worker's end of a worker's handoff socket."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Flag(Protocol):
    def is_set(self) -> bool: ...


class Dispatcher:
    """The parent's accept loop: each new connection to the least loaded ready worker."""

    def __init__(self, listener: socket.socket, loads: Loads) -> None:
        self._listener = listener
        self._loads = loads
        self._ends: dict[int, tuple[socket.socket, Flag]] = {}  # each worker's handoff end, and its ready flag
        self._handed: dict[int, int] = {}  # connections handed to each worker since it started
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="accept", daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def started(self, slot: int, end: socket.socket, ready: Flag) -> None:
        """Worker `slot` started: once `ready` is set, hand it connections over `end`."""
        with self._lock:
            self._ends[slot] = (end, ready)
            self._handed[slot] = 0

    def gone(self, slot: int) -> None:
        """Worker `slot` is dead: hand it nothing more, and forget what it reported."""
        with self._lock:
            end = self._ends.pop(slot, None)
            self._loads.open[slot] = self._loads.adopted[slot] = 0  # its only writer is gone
        if end is not None:
            end[0].close()

    def stop(self) -> None:
        self._stopped = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._thread.join(timeout=5)

    def load(self, slot: int) -> int:
        loads = self._loads
        return loads.open[slot] + max(0, self._handed[slot] - loads.adopted[slot])

    def _run(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stopped:
                    return
                time.sleep(0.01)  # EMFILE and the like: let the workers close some first
                continue
            with conn:
                self._hand(conn)

    def _hand(self, conn: socket.socket) -> None:
        with self._lock:
            ready = [slot for slot, (_, flag) in self._ends.items() if flag.is_set()]
            for slot in sorted(ready, key=self.load):
                try:
                    socket.send_fds(self._ends[slot][0], [b"c"], [conn.fileno()])
                except OSError as exc:  # the worker died under us: its watcher forgets it soon
                    log.debug("handoff to worker %d failed: %s", slot, exc)
                    continue
                self._handed[slot] += 1
                return
        log.warning("no worker can take a connection now; closed")


async def adopt(handoff: Handoff, accept: Callable[[socket.socket], None], open_connections: Callable[[], int]) -> None:
    """In a worker: give every connection that arrives on the handoff socket to `accept`, from the event loop,
    and report the worker's load until cancelled."""
    loop = asyncio.get_running_loop()
    end, loads, slot = handoff.end, handoff.loads, handoff.slot
    end.setblocking(False)
    adopted = 0

    def readable() -> None:
        nonlocal adopted
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(end, 1, 16)
            except BlockingIOError:
                return
            except OSError:  # the parent is gone: the worker notices it and stops
                loop.remove_reader(end.fileno())
                return
            if not fds:
                loop.remove_reader(end.fileno())
                return
            for fd in fds:
                adopted += 1
                accept(socket.socket(fileno=fd))

    loop.add_reader(end.fileno(), readable)
    try:
        while True:
            count = adopted  # first: a connection adopted meanwhile is counted by the parent as handed
            loads.open[slot] = open_connections()
            loads.adopted[slot] = count
            await asyncio.sleep(REPORT_S)
    finally:
        loop.remove_reader(end.fileno())
