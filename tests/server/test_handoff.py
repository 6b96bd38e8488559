"""The parent's dispatcher of `serve --workers N` on real sockets: each connection goes to the ready worker
with the fewest open connections (counting those handed to it since it last reported), none to a worker that
is not ready, and a connection no worker can take is closed."""

from __future__ import annotations

import socket
import threading

from gateway.server.handoff import Dispatcher, Loads, handoff_pair
from gateway.server.serve import listen


def received(end: socket.socket, timeout: float = 5.0) -> socket.socket:
    end.settimeout(timeout)
    _, fds, _, _ = socket.recv_fds(end, 1, 1)
    return socket.socket(fileno=fds[0])


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
