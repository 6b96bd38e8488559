"""The parent's dispatcher of `serve --workers N` on real sockets: each connection goes to the ready worker
with the fewest open connections (counting those handed to it since it last reported), none to a worker that
is not ready, and a connection no worker can take is closed; one a worker had not adopted when it died goes
to another."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gateway.server.handoff import TAG, Dispatcher, Loads, handoff_pair
from gateway.server.serve import listen


def received(end: socket.socket, timeout: float = 5.0, adopt: bool = True) -> socket.socket:
    """A connection handed over `end`, adopted as a worker does (its tag sent back) unless `adopt` is False."""
    end.settimeout(timeout)
    tag, fds, _, _ = socket.recv_fds(end, TAG.size, 1)
    if adopt:
        end.send(tag)
    return socket.socket(fileno=fds[0])


@dataclass
class Dispatching:
    """A dispatcher on a loopback listener, its workers' handoff ends (``ends[slot][1]`` is the worker's), and
    the clients a test opens (``connect``); all closed at the end."""

    listener: socket.socket
    loads: Loads
    ends: list[tuple[socket.socket, socket.socket]]
    dispatcher: Dispatcher
    clients: list[socket.socket] = field(default_factory=list)

    def connect(self) -> socket.socket:
        self.clients.append(socket.create_connection(("127.0.0.1", self.listener.getsockname()[1])))
        return self.clients[-1]


@contextlib.contextmanager
def dispatching(loads: Loads) -> Iterator[Dispatching]:
    """Its workers (one a slot of ``loads``) all started and ready."""
    listener = listen("127.0.0.1", 0)
    ends = [handoff_pair() for _ in range(len(loads.open))]
    dispatcher = Dispatcher(listener, loads)
    for slot, (ours, _) in enumerate(ends):
        ready = threading.Event()
        ready.set()
        dispatcher.started(slot, ours, ready)
    dispatcher.start()
    running = Dispatching(listener, loads, ends, dispatcher)
    try:
        yield running
    finally:
        dispatcher.stop()
        listener.close()
        for sock in running.clients + [end for pair in ends for end in pair]:
            sock.close()


def test_connections_go_to_the_ready_worker_with_the_fewest_open_connections() -> None:
    listener = listen("127.0.0.1", 0)
    loads = Loads.shared(3)
    loads.open[:] = [3, 0, 1]  # as the workers last reported, with none handed since
    flags = [threading.Event() for _ in range(3)]
    ends = [handoff_pair() for _ in range(3)]
    dispatcher = Dispatcher(listener, loads)
    for slot, ((ours, _), flag) in enumerate(zip(ends, flags, strict=True)):
        dispatcher.started(slot, ours, flag)
    flags[0].set()
    flags[2].set()  # worker 1 has no session but is still loading: it gets none
    dispatcher.start()
    port = listener.getsockname()[1]
    clients = []
    try:
        clients.append(socket.create_connection(("127.0.0.1", port)))
        with received(ends[2][1]) as conn:  # worker 2: 1 open against worker 0's 3
            clients[0].sendall(b"ping")
            assert conn.recv(4) == b"ping"  # the worker holds the very connection the client opened
        clients.append(socket.create_connection(("127.0.0.1", port)))
        received(ends[2][1]).close()  # 1 open + 1 handed since its report: still under 3
        assert dispatcher.load(2) == 3  # and now as loaded as worker 0
        loads.open[2], loads.adopted[2] = 2, 2  # it reports: the first closed, the second is open
        flags[1].set()
        clients.append(socket.create_connection(("127.0.0.1", port)))
        received(ends[1][1]).close()  # ready now, and the least loaded
        dispatcher.gone(1)
        dispatcher.gone(2)
        assert (loads.open[2], loads.adopted[2]) == (0, 0)  # a dead worker's report is forgotten
        clients.append(socket.create_connection(("127.0.0.1", port)))
        received(ends[0][1]).close()
        dispatcher.gone(0)
        clients.append(socket.create_connection(("127.0.0.1", port)))
        clients[-1].settimeout(5)
        assert clients[-1].recv(1) == b""  # no worker: the parent closes it
    finally:
        dispatcher.stop()
        listener.close()
        for sock in clients + [end for pair in ends for end in pair]:
            sock.close()


def test_a_connection_a_dead_worker_had_not_adopted_goes_to_another() -> None:
    loads = Loads.shared(2)
    with dispatching(loads) as running:
        ends, dispatcher = running.ends, running.dispatcher
        # Worker 0 adopts one connection, then another arrives in its queue and it dies before reading it.
        first = running.connect()
        adopted = received(ends[0][1])
        loads.open[0], loads.adopted[0] = 1, 1
        running.connect()
        with received(ends[1][1]):  # the least loaded, worker 1 takes the second
            pass
        loads.open[1], loads.adopted[1] = 1, 1
        third = running.connect()
        time.sleep(0.2)  # handed to worker 0 (tied, first), which never reads it
        ends[0][1].close()  # killed: its end closes with the connection unread in its queue
        dispatcher.gone(0)
        with received(ends[1][1]) as conn:  # the parent kept its copy: worker 1 gets the very connection
            third.sendall(b"ping")
            assert conn.recv(4) == b"ping"
        # The one worker 0 had adopted is its own: lost with it, not handed on twice.
        adopted.close()
        first.settimeout(5)
        assert first.recv(1) == b""
        ends[1][1].settimeout(0.5)
        with pytest.raises(TimeoutError):
            socket.recv_fds(ends[1][1], TAG.size, 1)


def test_a_worker_that_closes_its_end_hands_back_what_it_had_not_adopted() -> None:
    """Its watcher has not reaped it yet: the closed end is enough."""
    listener = listen("127.0.0.1", 0)
    loads = Loads.shared(2)
    flags = [threading.Event(), threading.Event()]
    ends = [handoff_pair() for _ in range(2)]
    dispatcher = Dispatcher(listener, loads)
    dispatcher.started(0, ends[0][0], flags[0])
    flags[0].set()
    dispatcher.start()
    clients = []
    try:
        clients.append(socket.create_connection(("127.0.0.1", listener.getsockname()[1])))
        time.sleep(0.2)  # in worker 0's queue, unread
        dispatcher.started(1, ends[1][0], flags[1])
        flags[1].set()
        ends[0][1].close()
        with received(ends[1][1]) as conn:
            clients[0].sendall(b"ping")
            assert conn.recv(4) == b"ping"
    finally:
        dispatcher.stop()
        listener.close()
        for sock in clients + [end for pair in ends for end in pair]:
            sock.close()


def test_a_worker_that_reads_nothing_does_not_stop_the_others_getting_connections() -> None:
    """A worker whose loop is held up (or stopped) fills its handoff queue; the parent then hands the next
    connections to the others instead of waiting on it, which would stop every worker's share."""
    loads = Loads.shared(2)
    loads.open[1] = 10**6  # worker 0 is always the least loaded: every connection goes there while it can
    with dispatching(loads) as running:
        for _ in range(400):  # more than a handoff queue holds (278 on Linux's defaults)
            running.connect()
        with received(running.ends[1][1], timeout=10) as conn:  # the deaf worker's queue is full: this one's turn
            assert conn.fileno() >= 0
