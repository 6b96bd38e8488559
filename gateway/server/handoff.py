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

The parent keeps its copy of each connection until the worker says it has adopted it (it sends back the tag
that came with it): a worker killed with connections still in its handoff queue, unread, would take them
with it. When a worker dies, or closes its end, what it had not adopted goes to the others.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import multiprocessing
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

REPORT_S = 0.02  # how often a worker reports its open connections
# Each connection goes with a tag, which the worker sends back once it has adopted the connection.
TAG = struct.Struct("!Q")
ACK_TAGS = 256  # tags a worker sends back in one message at most


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


@dataclass
class _Worker:
    """The parent's side of one worker: its handoff end, its ready flag, and the connections it was handed."""

    slot: int
    end: socket.socket
    ready: Flag
    handed: int = 0  # connections handed to it since it started
    unadopted: dict[int, socket.socket] = field(default_factory=dict)  # the parent's copies, by tag, until adopted


class Dispatcher:
    """The parent's accept loop: each new connection to the least loaded ready worker, kept until adopted."""

    def __init__(self, listener: socket.socket, loads: Loads) -> None:
        self._listener = listener
        self._loads = loads
        self._workers: dict[int, _Worker] = {}
        self._tags = itertools.count()
        self._lock = threading.Lock()
        # The listener and every worker's end (its acknowledgements, and its close when it dies).
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="accept", daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def started(self, slot: int, end: socket.socket, ready: Flag) -> None:
        """Worker `slot` started: once `ready` is set, hand it connections over `end`."""
        # A worker that reads nothing for a while (stopped, or its loop held up) must not stop the accept loop:
        # once its queue is full, connections go to the others.
        end.setblocking(False)
        with self._lock:
            worker = _Worker(slot, end, ready)
            self._workers[slot] = worker
            self._selector.register(end, selectors.EVENT_READ, worker)

    def gone(self, slot: int) -> None:
        """Worker `slot` is dead: hand it nothing more, forget what it reported, and hand the connections it had
        not adopted to the others."""
        with self._lock:
            self._loads.open[slot] = self._loads.adopted[slot] = 0  # its only writer is gone
            worker = self._workers.get(slot)
            if worker is not None:
                self._retire(worker)

    def stop(self) -> None:
        self._stopped = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the loop
        except OSError:
            pass
        self._thread.join(timeout=5)
        with self._lock:
            for worker in self._workers.values():
                for conn in worker.unadopted.values():
                    conn.close()
                worker.unadopted.clear()
        self._selector.close()

    def load(self, slot: int) -> int:
        loads = self._loads
        return loads.open[slot] + max(0, self._workers[slot].handed - loads.adopted[slot])

    def _run(self) -> None:
        while not self._stopped:
            for key, _ in self._selector.select():
                if key.fileobj is self._listener:
                    self._accept()
                    continue
                worker = key.data
                with self._lock:
                    # An end retired meanwhile (by `gone`) is closed: its event is stale.
                    if self._workers.get(worker.slot) is worker and not self._read_acknowledgements(worker):
                        self._retire(worker)  # its end closed: the worker is gone, or going

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            if not self._stopped:
                time.sleep(0.01)  # EMFILE and the like: let the workers close some first
            return
        with self._lock:
            self._hand(conn)

    def _hand(self, conn: socket.socket) -> None:
        """Send `conn` to the least loaded ready worker, keeping the parent's copy until the worker adopts it;
        closed when no worker can take it. Called with the lock held."""
        ready = [worker for worker in self._workers.values() if worker.ready.is_set()]
        for worker in sorted(ready, key=lambda w: self.load(w.slot)):
            tag = next(self._tags)
            try:
                socket.send_fds(worker.end, [TAG.pack(tag)], [conn.fileno()])
            except OSError as exc:  # its queue is full, or it died under us (its watcher forgets it soon)
                log.debug("handoff to worker %d failed: %s", worker.slot, exc)
                continue
            worker.handed += 1
            worker.unadopted[tag] = conn
            return
        conn.close()
        log.warning("no worker can take a connection now; closed")

    def _read_acknowledgements(self, worker: _Worker) -> bool:
        """Let go of the connections `worker` says it adopted; False once its end is closed."""
        while True:
            try:
                data = worker.end.recv(ACK_TAGS * TAG.size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            for (tag,) in TAG.iter_unpack(data):
                conn = worker.unadopted.pop(tag, None)
                if conn is not None:
                    conn.close()

    def _retire(self, worker: _Worker) -> None:
        """Hand `worker` nothing more; what it had not adopted goes to the others. Called with the lock held."""
        self._read_acknowledgements(worker)  # what it adopted before it died stays its own (and is lost with it)
        del self._workers[worker.slot]
        self._selector.unregister(worker.end)
        worker.end.close()
        unadopted = list(worker.unadopted.values())
        worker.unadopted.clear()
        if unadopted:
            log.info("worker %d is gone: %d connection(s) it had not adopted go to the others", worker.slot,
                     len(unadopted))
        for conn in unadopted:
            self._hand(conn)


async def adopt(handoff: Handoff, accept: Callable[[socket.socket], None], open_connections: Callable[[], int]) -> None:
    """In a worker: give every connection that arrives on the handoff socket to `accept`, from the event loop,
    tell the parent it was adopted, and report the worker's load until cancelled."""
    loop = asyncio.get_running_loop()
    end, loads, slot = handoff.end, handoff.loads, handoff.slot
    end.setblocking(False)
    adopted = 0
    unacknowledged: list[bytes] = []  # tags of connections adopted that the parent has not been told of

    def acknowledge() -> None:
        while unacknowledged:
            batch = unacknowledged[:ACK_TAGS]
            try:
                end.send(b"".join(batch))
            except BlockingIOError:
                return  # the parent is busy: told at the next report
            except OSError:  # the parent is gone
                unacknowledged.clear()
                return
            del unacknowledged[:len(batch)]

    def readable() -> None:
        nonlocal adopted
        while True:
            try:
                tag, fds, _, _ = socket.recv_fds(end, TAG.size, 1)
            except BlockingIOError:
                break
            except OSError:  # the parent is gone: the worker notices it and stops
                loop.remove_reader(end.fileno())
                break
            if not tag:  # the parent closed its end
                loop.remove_reader(end.fileno())
                break
            unacknowledged.append(tag)  # adopted, or lost: either way the parent lets go of its copy
            if not fds:
                # The kernel dropped the descriptor: this process has as many open files as it may. The
                # connection is closed with the parent's copy; the next may find room again.
                log.warning("a connection handed over could not be received: this worker is at its open-file "
                            "limit (ulimit -n); it was closed")
                continue
            adopted += 1
            accept(socket.socket(fileno=fds[0]))
        acknowledge()

    loop.add_reader(end.fileno(), readable)
    try:
        while True:
            count = adopted  # first: a connection adopted meanwhile is counted by the parent as handed
            loads.open[slot] = open_connections()
            loads.adopted[slot] = count
            acknowledge()
            await asyncio.sleep(REPORT_S)
    finally:
        loop.remove_reader(end.fileno())
