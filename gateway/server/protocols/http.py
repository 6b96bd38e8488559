"""uvicorn's h11 HTTP protocol with a deadline for each request's head.

uvicorn bounds a request head's size but not the time it takes to arrive, and every open connection
counts against ``limit_concurrency``: a client that opens connections and sends their heads a byte at a
time (slowloris) would hold them for ever and lock everyone out with 503s. Here a connection whose
request line and headers are not complete ``[server] request_head_timeout_s`` after it opened (or after
its previous response, on a kept-alive connection) is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeadDeadlineProtocol(H11Protocol):
    """Set by ``protocol_class``: the seconds a request head may take."""

    head_timeout_s: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._armed_scope: object = None  # the last request's scope when the deadline was set

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.scope is not self._armed_scope or self.transport.is_closing():
            self._disarm()  # a new request's head is complete (or the connection was upgraded or closed)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # kept alive: the next request's head gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._armed_scope = self.scope
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _too_slow(self) -> None:
        self._head_deadline = None
        if self.scope is self._armed_scope and not self.transport.is_closing():
            self.transport.close()


def protocol_class(head_timeout_s: float) -> type[HeadDeadlineProtocol]:
    return type("GatewayHttpProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": head_timeout_s})
