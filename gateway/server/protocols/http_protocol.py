"""uvicorn's HTTP protocol (httptools: llhttp's parser) with the limits it lacks, so that slow or malformed
requests cannot hold the server's connections.

uvicorn bounds neither the time a request head or body takes to arrive nor, with httptools, a head's size,
and every open connection counts against ``limit_concurrency`` (past it, 503s for everyone). Here:

- A head's size. A head (request line and headers) still incomplete after 16 KiB is answered 431
  and the connection closed (counted from the read that started it: a head that starts in the middle of a
  read, after a pipelined request, is counted from the next one). llhttp keeps no head in memory, but
  httptools holds a header line until it ends, and uvicorn every header. The front door
  (gateway/transports/guard.py) bounds a complete head's headers, lines and target.
- Deadlines. A head must be complete ``[server] request_head_timeout_s`` after the connection opened (or
  after its previous response, on a kept-alive connection), a body ``request_body_timeout_s`` after its
  head, and neither may pause longer than ``request_idle_timeout_s`` between two reads. A connection past a
  deadline is closed (an app reading the body sees the client gone). A WebSocket handshake must be answered
  by its head's deadline (gateway/server/protocols/websocket_protocol.py).
- Header bounds on the WebSocket path. uvicorn hands an upgrade's head to the websockets library's parser,
  which fails a head of more than 128 headers or with a line over 8 KiB silently: the connection then
  stayed open and unanswered for good. Such a head (over ``max_request_headers`` or
  ``max_header_line_bytes``, or a target over the front door's limit) is answered 431 (414) here, before
  the hand-over. Plain HTTP requests get the same bounds from the front door.
- A budget per client address (gateway/server/protocols/per_client.py): a connection from an address that holds
  its share already is answered 429 and closed at once, before anything of it is parsed.
- A refusal made here (429, 431, 414) is a lingering close: the answer, our half of the connection shut, and
  whatever the client still sends read and dropped (at most ``LINGER_BYTES``, for ``LINGER_S``). Closing a
  socket with unread bytes in it resets the connection, and the reset often reaches the client before it
  has read the answer: it would see a dropped connection, not a 429 to retry after.

Why httptools rather than h11: in a burst of requests, each gateway process parses its share one after
another, and h11 (pure Python) cost the gateway 80 to 100 µs more CPU per request and response
(python -m bench transport). httptools also takes what h11 refused itself: two Host
headers and an HTTP/1.1 request without one are the front door's 400s. This leans on uvicorn's httptools
protocol internals (its parser callbacks, scope, cycle, flow control and upgrade hand-over): pyproject.toml
pins uvicorn's minor version, and tests/transports/test_slow_clients.py exercises each limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.protocols.per_client import ClientBudget, Slot
from gateway.server.protocols.refusal import raw_response
from gateway.server.protocols.websocket_protocol import LimitedWebSocketProtocol
from gateway.transports.guard import MAX_HEADER_BYTES, head_problem

log = logging.getLogger(__name__)

CUT = Counter("gateway_slow_requests_cut_total",
              "Connections closed because a request head or body missed its deadline", ["part", "deadline"])
TOO_MANY = raw_response(429, "This client address holds as many connections as it may ([server] "
                        "max_connections_per_client); close some, or try again later.", "too_many_connections",
                        (("retry-after", "1"),))
LINGER_S = 2.0
LINGER_BYTES = 256 * 1024
# A head still incomplete past the front door's bound on a complete head's headers is refused.
HEAD_TOO_LARGE = raw_response(431, f"The request head is too large (at most {MAX_HEADER_BYTES} bytes).",
                              "headers_too_large")


@dataclass(frozen=True)
class HttpLimits:
    """The ``[server]`` options this protocol applies."""

    head_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_headers: int
    max_header_line_bytes: int


class GatewayHttpProtocol(HttpToolsProtocol):
    """Set by ``protocol_class``: the limits, the process's client budget, and which peers are proxies
    whose connections carry many clients (not counted against their own address)."""

    limits: HttpLimits
    budget: ClientBudget
    is_proxy: Callable[[str], bool]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot: Slot | None = None
        self._part: str | None = None  # "head" or "body" while one is arriving under a deadline
        self._deadline = 0.0  # loop time by which that part must be complete
        self._head_deadline = 0.0  # the last head's (a WebSocket handshake must be answered by then too)
        self._in_head = True  # the parser is between requests or in a head: what comes is a head's
        self._head_bytes = 0  # read since that head began
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._dropped: int | None = None  # bytes read and dropped since a refusal (None: not refused)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else ""
        if not self.is_proxy(peer):
            self._slot = self.budget.take(peer)
            if self._slot is None:
                log.warning("refusing connections from %s: it holds %d already ([server] max_connections_per_client)",
                            peer, self.budget.per_client)
                self.connections.discard(self)  # nor does it count against the server's connections meanwhile
                self._refuse(TOO_MANY)
                return
        self._expect("head", self.limits.head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        if self._slot is not None:
            self._slot.release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._dropped is not None:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self.transport.close()
            return
        self._last_read = self.loop.time()
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            self._stop()  # closed, or handed over to the WebSocket protocol
        elif self._in_head and self._head_bytes > MAX_HEADER_BYTES:
            self._refuse(HEAD_TOO_LARGE)
        elif self._part is not None and self._timer is None:
            self._schedule()  # a part still arriving after this read

    # --- the parser's callbacks: where a request's parts begin and end ---------------------------------

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        # The body's deadline, armed after the read unless the body came whole with its head.
        self._expect("body", self.limits.body_timeout_s, arm=False)

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()
        self._stop()  # the app's turn

    def on_response_complete(self) -> None:
        if not self.transport.is_closing() and not self.pipeline:
            # Kept alive with no pipelined request waiting: the next head gets the same time.
            self._expect("head", self.limits.head_timeout_s)
        super().on_response_complete()

    def handle_websocket_upgrade(self) -> None:
        limits = self.limits
        problem = head_problem(self.headers, self.url, limits.max_headers, limits.max_header_line_bytes)
        if problem is not None:
            self._refuse(raw_response(*problem))
            return
        self._stop()
        slot, self._slot = self._slot, None
        super().handle_websocket_upgrade()
        protocol = self.transport.get_protocol()
        assert isinstance(protocol, LimitedWebSocketProtocol)
        protocol.answer_by(self._head_deadline, slot)
        # Done with: the parser and this protocol hold each other (its callbacks), and uvicorn lets go of the
        # parser only when the connection is lost, which this protocol no longer hears of.
        self.parser = None  # type: ignore[assignment]

    def _refuse(self, response: bytes) -> None:
        """Answer and close, with the lingering close the module's docstring explains."""
        self._stop()
        self._dropped = 0
        self.transport.write(response)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    # --- deadlines ---------------------------------------------------------------------------------

    def _expect(self, part: str, seconds: float, *, arm: bool = True) -> None:
        now = self.loop.time()
        self._part, self._deadline, self._last_read = part, now + seconds, now
        if part == "head":
            self._head_deadline = self._deadline
        if arm:
            self._schedule()
        elif self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stop(self) -> None:
        self._part = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(min(self._deadline, self._last_read + self.limits.idle_timeout_s), self._check)

    def _check(self) -> None:
        self._timer = None
        if self._part is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:
            self._last_read = now  # the server stopped reading (the app has not taken the body yet), not the client
        if now >= self._deadline:
            missed = "total"
        elif now >= self._last_read + self.limits.idle_timeout_s:
            missed = "idle"
        else:
            self._schedule()
            return
        CUT.labels(self._part, missed).inc()
        self._stop()
        self.transport.close()


def protocol_class(limits: HttpLimits, budget: ClientBudget,
                   is_proxy: Callable[[str], bool]) -> type[GatewayHttpProtocol]:
    """The protocol class to give uvicorn (``http=``) for one process."""
    return type("GatewayHttpProtocol", (GatewayHttpProtocol,),
                {"limits": limits, "budget": budget, "is_proxy": staticmethod(is_proxy)})
