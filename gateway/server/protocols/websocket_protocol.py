"""uvicorn's websockets-sansio WebSocket protocol, with the gateway's two connection limits.

uvicorn already applies back-pressure both ways: it stops reading a connection once a message waits for
the app, and a send waits while the socket's write buffer is above its high-water mark (64 KiB), so a
client that never reads holds that much and no more. Stopping and resuming costs two changes of the event
loop's epoll set, for every message of every client (an audio append every 20 ms): here reading stops only
once MAX_WAITING messages wait, or more bytes than the connection's free allowance below (one large
message). What uvicorn lacks, and this subclass adds:

- A send deadline (``[server] send_timeout_s``): a send that has waited that long for a client that
  does not read aborts the connection. Closing it politely would wait behind the very buffer that is
  stuck (so would uvicorn's keepalive timeout: its ping and close frame queue up behind it); the app
  sees a disconnect with code 1011 and reason "send timeout", and its session is freed.
- A process-wide bound on buffered inbound bytes. Each connection may hold up to
  ``[server] inbound_free_bytes`` (a message being read, those waiting, one being handled); past that
  it needs one of ``inbound_budget_bytes // (2 * max_message_bytes)`` large-message slots and stops
  reading until one is free (and, holding one, after each message). A slot holder can always finish its
  message (its room is reserved), so slots never deadlock; they are given first come, first served.
  Peak memory of inbound messages, the copies made while handling them included: at most
  2 x inbound_budget_bytes + 3 x connections x (inbound_free_bytes + one socket read of 256 KiB).

And for the handshake, which uvicorn's protocol leaves open in three ways:

- A handshake must be answered by its head's deadline (``answer_by``, from the HTTP protocol that hands
  the connection over, with the connection's place in its client's budget, given back once answered);
  one still unanswered then is closed.
- A head the websockets parser refuses (a method other than GET, a body) is answered 400 and closed: uvicorn
  would leave it open and unanswered for good.
- A handshake refused with an HTTP response (401, 403, 503: the ASGI denial-response extension) counts as
  answered: uvicorn logged each as an ERROR ("ASGI callable returned without completing handshake"),
  which let anyone fill the log; the endpoint logs one INFO line instead.

And for the app, the ASGI extension RECEIVE_NOW (gateway/transports/realtime_websocket.py): an app may give a
handler that takes each whole text message as it is read, when nothing waits before it (SessionRunner.receive_now
handles an audio append there, sparing it the queue and the wake of the app's task); one it declines goes through
the queue as before. A read that holds whole masked text frames of at most 64 KiB, as a client's audio appends
are, goes to the handler straight from the frames' headers (``_take_whole_texts``): websockets' parser, a
generator of generators, cost more per 20 ms append than the header, the mask and the decode it does for them.
Anything else (a control frame, a fragment, a larger or partial frame, one the handler declines) is left to
the parser, which never sees the bytes taken before it. The other way, a text message to an open connection is
framed here (``text_frame``), without websockets' frame objects and the payload's two extra copies; anything
else goes through uvicorn and websockets.

It leans on uvicorn's protocol internals (its queue, read_paused, writable, handshake flags) and on the
websockets parser's (its buffer, its generator): pyproject.toml pins both, and tests/transports/test_hostile.py
and test_slow_clients.py exercise these limits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import CloseCode, apply_mask
from websockets.protocol import State
from websockets.streams import StreamReader

from gateway.server.protocols.per_client import Slot
from gateway.server.protocols.refusal import raw_response
from gateway.transports.realtime_websocket import RECEIVE_NOW

log = logging.getLogger(__name__)

SEND_TIMEOUTS = Counter("gateway_send_timeouts_total",
                        "WebSocket connections aborted because the client stopped reading ([server] send_timeout_s)")
INBOUND_WAITS = Counter("gateway_inbound_budget_waits_total",
                        "Times a connection stopped reading to wait for a large-message slot")

# Messages of one connection waiting for the app before it stops reading (within its free bytes).
MAX_WAITING = 16
# Bytes of its last message that websockets' parser may keep referenced until the next (_drop_parsed_frame).
PARSER_KEEPS = 64 * 1024
FIN_TEXT = 0x81  # a frame's first byte: the last of its message, a text frame, no extension bits
AT_FRAME_START = StreamReader.at_eof.__code__  # what websockets' parser waits in between frames


def text_frame(payload: bytes) -> bytes:
    """A server's text message as one frame: unmasked, unfragmented, no extension (RFC 6455 5.2), as websockets'
    ``send_text`` frames it."""
    size = len(payload)
    if size < 126:
        head = bytes((FIN_TEXT, size))
    elif size < 1 << 16:
        head = bytes((FIN_TEXT, 126)) + size.to_bytes(2)
    else:
        head = bytes((FIN_TEXT, 127)) + size.to_bytes(8)
    return head + payload


class InboundBudget:
    """Large-message slots shared by a process's connections, handed out first come, first served."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.holders: set[LimitedWebSocketProtocol] = set()
        self.waiting: deque[LimitedWebSocketProtocol] = deque()

    def take(self, connection: LimitedWebSocketProtocol) -> bool:
        if connection in self.holders:
            return True
        if len(self.holders) < self.slots and not self.waiting:
            self.holders.add(connection)
            return True
        if connection not in self.waiting:
            self.waiting.append(connection)
            INBOUND_WAITS.inc()
        return False

    def give_back(self, connection: LimitedWebSocketProtocol) -> None:
        self.holders.discard(connection)
        if connection in self.waiting:
            self.waiting.remove(connection)
        while self.waiting and len(self.holders) < self.slots:
            waiter = self.waiting.popleft()
            self.holders.add(waiter)
            waiter.slot_granted()


class ReceiveNow:
    """The RECEIVE_NOW extension in a connection's scope: the app calls it with its handler of text messages,
    and with None when done. It refers to no protocol, so the scope that holds it makes no reference cycle."""

    __slots__ = ("handler",)

    def __init__(self) -> None:
        self.handler: Callable[[str], bool] | None = None

    def __call__(self, handler: Callable[[str], bool] | None) -> None:
        self.handler = handler


class LimitedWebSocketProtocol(WebSocketsSansIOProtocol):
    """Set by ``protocol_class``: the deadline, the free allowance and the shared budget."""

    send_timeout_s: float
    free_bytes: int
    budget: InboundBudget

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queued: deque[int] = deque()  # sizes of the messages waiting for the app
        self._queued_bytes = 0  # their sum
        self._app_holds = 0  # size of the message the app is handling (until it asks for the next)
        self._parser_holds = 0  # size of the last message, still referenced by websockets' parser
        self._waiting_slot = False
        self._client_slot: Slot | None = None  # its place in its client's budget, until the handshake is answered
        self._answer_deadline: asyncio.TimerHandle | None = None
        self._receive_now = ReceiveNow()

    # --- the handshake ------------------------------------------------------------------------------

    def answer_by(self, deadline: float, slot: Slot | None) -> None:
        """The handshake must be answered by loop time ``deadline`` (its head's); ``slot`` is given back then."""
        self._client_slot = slot
        if self.handshake_complete:
            self._answered()
        else:
            self._answer_deadline = self.loop.call_at(deadline, self._too_late)

    def _too_late(self) -> None:
        self._answer_deadline = None
        if not self.handshake_complete and not self.transport.is_closing():
            peer = self.client[0] if self.client else "a client"
            log.info("closing %s: its WebSocket handshake was not answered by the head deadline", peer)
            self.transport.close()

    def _answered(self) -> None:
        if self._answer_deadline is not None:
            self._answer_deadline.cancel()
            self._answer_deadline = None
        if self._client_slot is not None:
            self._client_slot.release()
            self._client_slot = None

    # --- send deadline ------------------------------------------------------------------------------

    async def send(self, message: Any) -> None:
        if not self.writable.is_set() and not self.disconnected:
            try:
                await asyncio.wait_for(self.writable.wait(), self.send_timeout_s)
            except TimeoutError:
                self._abort(f"the client read nothing for {self.send_timeout_s:g} s while the server had "
                            "messages to send")
                raise ClientDisconnected from None
        text = message.get("text") if message["type"] == "websocket.send" else None
        if (text is not None and message.get("bytes") is None and self.handshake_complete and not self.close_sent
                and self.initial_response is None and not self.disconnected and self.conn.state is State.OPEN
                and not self.conn.extensions):
            self.transport.write(text_frame(text.encode()))
            return
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # refused with a whole HTTP response: answered
        if self.handshake_complete:
            self._answered()

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()
        self._abort_if_stuck()

    def shutdown(self) -> None:
        super().shutdown()
        # A client that reads gets its close frame; one that does not is cut off after the send deadline.
        self.loop.call_later(self.send_timeout_s, self._abort_if_stuck)

    def _abort_if_stuck(self) -> None:
        """A close that waits behind unsent data never completes when the client does not read."""
        if not self.disconnected and self.transport.get_write_buffer_size() > 0:
            self.transport.abort()

    @property
    def _peer(self) -> str:
        """The client's address and port, for the log."""
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"

    def _abort(self, why: str) -> None:
        SEND_TIMEOUTS.inc()
        log.info("closing %s: %s (send timeout)", self._peer, why)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1011, "reason": "send timeout"})
        self.transport.abort()

    # --- inbound bound ------------------------------------------------------------------------------

    def _held(self) -> int:
        held = len(self.conn.reader.buffer) + self._queued_bytes + self._app_holds + self._parser_holds
        return held + sum(map(len, self.frames)) if self.frames else held  # frames: a fragmented message's

    def data_received(self, data: bytes) -> None:
        if self._receive_now.handler is not None:
            data = self._take_whole_texts(data)
            if not data:
                return
        super().data_received(data)
        if self.conn.handshake_exc is not None and not self.handshake_initiated:
            if not self.transport.is_closing():  # the parser refused the head: uvicorn would never answer
                why = self.conn.handshake_exc.__cause__ or self.conn.handshake_exc
                self.transport.write(raw_response(400, f"This is not a WebSocket handshake the server can take: "
                                                       f"{why}.", "invalid_handshake"))
                self.transport.close()
            return
        self._drop_parsed_frame()
        self._check_held()

    # --- a message to the app: its handler at once (RECEIVE_NOW), else the queue ----------------------

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        if self.handshake_initiated and not self.handshake_complete:  # the app's task has its scope, not started
            self.scope["extensions"][RECEIVE_NOW] = self._receive_now

    def _take_whole_texts(self, data: bytes) -> bytes:
        """The whole text frames at the start of ``data`` handed to the app's handler, while it takes them and
        nothing waits before them; the rest is left for websockets' parser (returned). One read may hold
        hundreds of frames: each is read where it lies, and only the rest is copied, once."""
        if self.frames or not self._at_frame_start():  # the parser is inside a message or a frame: its bytes
            return data
        conn, at = self.conn, 0
        while (len(data) - at >= 6 and data[at] == FIN_TEXT and data[at + 1] & 0x80 and not self.close_sent
               and self.queue.empty()):
            size, start = data[at + 1] & 0x7F, at + 6
            if size == 126:
                size, start = int.from_bytes(data[at + 2 : at + 4]), at + 8
            elif size == 127:
                break
            end = start + size
            if end > len(data) or (conn.max_size is not None and size > conn.max_size):
                break
            try:
                text = apply_mask(data[start:end], data[start - 4 : start]).decode()
            except UnicodeDecodeError:
                break
            if not self._hand(text):
                break
            at = end
            if self.transport.is_closing():
                return b""
        return data[at:] if at else data

    def _at_frame_start(self) -> bool:
        """Whether websockets' parser waits for a new frame with nothing buffered (a read that ended inside a
        frame's header leaves the buffer empty too, with that header already taken), on an open connection."""
        conn = self.conn
        if conn.reader.buffer or conn.cur_size is not None or conn.state is not State.OPEN:
            return False
        waiting = conn.parser  # the server's parse, in the frames' parse, in what that waits in
        while (inner := waiting.gi_yieldfrom) is not None:
            waiting = inner
        return waiting.gi_code is AT_FRAME_START

    def _hand(self, text: str) -> bool:
        """``text`` to the app's handler; whether it took it."""
        assert self._receive_now.handler is not None
        try:
            return self._receive_now.handler(text)
        except Exception:  # as an app that raises would, the connection ends; the server goes on
            log.exception("handling a WebSocket message failed")
            self.transport.close()
            return True

    # --- inbound bound: what the queue, the app and the parser hold ----------------------------------

    def send_receive_event_to_app(self) -> None:
        """uvicorn's, with three changes: the app's handler takes a text message first where nothing waits before
        it; reading pauses on the queue's and the bytes' bounds, not after every message; a text message that
        is not UTF-8 closes the connection (1007) with an INFO line, where uvicorn logged a client's mistake as
        an error with its traceback."""
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        self._parser_holds = len(data)
        if self.close_sent:  # the app is past websocket.close: dropped, as uvicorn does
            return
        if self.curr_msg_data_type == "text":
            try:
                text = data.decode()
            except UnicodeDecodeError as exc:
                log.info("closing %s: a text message that is not UTF-8 (%s)", self._peer, exc.reason)
                self.conn.send_close(CloseCode.INVALID_DATA, "a text message that is not UTF-8")
                self.handle_parser_exception()
                return
            if self._receive_now.handler is not None and self.queue.empty() and self._hand(text):
                return
            self.queue.put_nowait({"type": "websocket.receive", "text": text})
        else:
            self.queue.put_nowait({"type": "websocket.receive", "bytes": data})
        self._queued.append(len(data))
        self._queued_bytes += len(data)
        if not self.read_paused and (self.queue.qsize() >= MAX_WAITING or self._held() > self.free_bytes):
            self.read_paused = True
            self.transport.pause_reading()

    def _drop_parsed_frame(self) -> None:
        """websockets' parser keeps its last frame referenced (a local of its generator) until the next one
        is parsed: between messages, with nothing buffered, a fresh parser lets a large message's bytes go
        once handled, instead of when (if ever) the next message arrives (only at a frame's start: a fresh
        parser would misread the rest of a frame). A message of at most PARSER_KEEPS bytes
        (and within the connection's free allowance, where they are counted meanwhile) stays: a fresh
        parser for every 20 ms audio append cost more than the rest of its framing."""
        if self._parser_holds <= min(PARSER_KEEPS, self.free_bytes):
            return
        if self._at_frame_start():
            self.conn.parser = self.conn.parse()
            next(self.conn.parser)
            self._parser_holds = 0

    async def receive(self) -> Any:
        self._app_holds = 0  # the app is done with the last message
        self._check_held()
        message = await self.queue.get()
        if message["type"] == "websocket.receive" and self._queued:
            self._app_holds = self._queued.popleft()
            self._queued_bytes -= self._app_holds
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            if not self._waiting_slot:
                self.transport.resume_reading()
        return message

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._answered()
        self._waiting_slot = False
        self.budget.give_back(self)

    def _check_held(self) -> None:
        if self.disconnected:
            return
        if self._held() <= self.free_bytes:
            if self in self.budget.holders or self._waiting_slot:
                self._waiting_slot = False
                self.budget.give_back(self)
                if not self.read_paused:
                    self.transport.resume_reading()
            return
        if not self.budget.take(self) and not self._waiting_slot:
            self._waiting_slot = True
            self.transport.pause_reading()

    def slot_granted(self) -> None:
        self._waiting_slot = False
        if not self.read_paused and not self.disconnected:
            self.transport.resume_reading()


def protocol_class(send_timeout_s: float, free_bytes: int, budget_bytes: int,
                   max_message_bytes: int) -> type[LimitedWebSocketProtocol]:
    """The protocol class to give uvicorn (``ws=``) for one process, with its own budget."""
    budget = InboundBudget(max(1, budget_bytes // (2 * max_message_bytes)))
    return type("GatewayWebSocketProtocol", (LimitedWebSocketProtocol,),
                {"send_timeout_s": send_timeout_s, "free_bytes": free_bytes, "budget": budget})
