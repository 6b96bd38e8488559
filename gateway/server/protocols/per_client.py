"""Connections per client address: no one address may hold more than its share of the server's connections.

uvicorn bounds the connections of a process in total (``limit_concurrency``: [server] max_sessions + 256),
past which every new request gets 503; one client holding that many slow connections would lock everyone
out. So each client address (the TCP peer) may hold at most ``[server] max_connections_per_client`` of the
connections that are not sessions yet: HTTP connections (a head or body arriving, a request being
answered, an idle kept-alive connection) and WebSocket handshakes until they are answered. A WebSocket
session, once accepted, leaves the budget: [server] max_sessions bounds those.

A trusted proxy ([server] forwarded_allow_ips) carries many clients over its connections, so its
connections are not counted against its own address; bounding each client's slow heads and bodies is
then the proxy's work (nginx, for one, reads whole heads and bodies before it passes them on).

The budget is a process's: under `serve --workers N` each worker keeps its own.
"""

from __future__ import annotations

from prometheus_client import Counter

REFUSED = Counter("gateway_connections_refused_total",
                  "Connections closed at once because their client address held its share "
                  "([server] max_connections_per_client)")


class ClientBudget:
    """How many connections each client address holds, against ``per_client``."""

    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self.held: dict[str, int] = {}

    def take(self, client: str) -> Slot | None:
        """A slot for one more connection from ``client``, or None when it holds its share already."""
        held = self.held.get(client, 0)
        if held >= self.per_client:
            REFUSED.inc()
            return None
        self.held[client] = held + 1
        return Slot(self, client)


class Slot:
    """One connection's place in its client's budget; ``release`` gives it back (once, however often called)."""

    def __init__(self, budget: ClientBudget, client: str) -> None:
        self._budget: ClientBudget | None = budget
        self.client = client

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is None:
            return
        left = budget.held[self.client] - 1
        if left:
            budget.held[self.client] = left
        else:
            del budget.held[self.client]
