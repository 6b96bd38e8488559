"""The sideband of a call: ``wss://HOST/v1/realtime?call_id=rtc_...`` attaches to the session of a call that
is already running (a phone call, a WebRTC call), as OpenAI's does.

A sideband connection gets every server event the call's session sends from then on, starting with
``session.created`` (the session as it is now), and its client events go to that session like the
call's own (function tools run there: the application answers ``function_call`` items with
``conversation.item.create``). It needs an API key, not a client secret: it steers a call someone else
made. Each call takes at most MAX_PER_CALL sideband connections; when the call ends, they are closed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import orjson
from starlette.types import Receive, Scope, Send

from gateway.realtime.events import new_id
from gateway.realtime.settings import session_wire
from gateway.runtime.session_runner import SessionRunner

log = logging.getLogger(__name__)

MAX_PER_CALL = 4
CALL_ENDED = 1000  # the close code of a sideband whose call ended

SendText = Callable[[str], Awaitable[None]]
Close = Callable[[], Awaitable[None]]


class Sideband:
    """The sideband connections of one call; the call's session sends its events through ``send``."""

    def __init__(self) -> None:
        self._peers: dict[int, tuple[SendText, Close]] = {}
        self._next = 0

    @property
    def full(self) -> bool:
        return len(self._peers) >= MAX_PER_CALL

    def attach(self, send: SendText, close: Close) -> int:
        self._next += 1
        self._peers[self._next] = (send, close)
        return self._next

    def detach(self, token: int) -> None:
        self._peers.pop(token, None)

    async def send(self, text: str) -> None:
        for send, _ in list(self._peers.values()):
            await send(text)

    async def close(self) -> None:
        """The call ended: close every sideband connection."""
        peers, self._peers = list(self._peers.values()), {}
        for _, close in peers:
            await close()


class SidebandCall(Protocol):
    """A call a sideband can attach to: its session's runner (None until it has one) and its sideband."""

    @property
    def runner(self) -> SessionRunner | None: ...

    sideband: Sideband


Lookup = Callable[[str], SidebandCall | None]
Deny = Callable[[int, str, str], Awaitable[None]]
# Serves a sideband of a call another worker holds (False: no other worker holds it).
Elsewhere = Callable[[Scope, Receive, Send, str, Deny], Awaitable[bool]]


class Sidebands:
    """Finds a call by id among the transports that hold calls (each adds its ``Lookup``) and serves a
    sideband connection to it; one of a call another worker of ``serve --workers N`` holds goes to
    ``elsewhere`` (gateway.transports.calls.routing)."""

    def __init__(self) -> None:
        self.lookups: list[Lookup] = []
        self.elsewhere: Elsewhere | None = None

    def find(self, call_id: str) -> SidebandCall | None:
        return next((call for lookup in self.lookups if (call := lookup(call_id)) is not None), None)

    async def serve(self, scope: Scope, receive: Receive, send: Send, call_id: str, deny: Deny) -> None:
        """The WebSocket ``scope`` (its handshake not yet answered) as a sideband of call ``call_id``;
        ``deny(status, message, code)`` refuses the handshake."""
        call = self.find(call_id)
        if call is None and self.elsewhere is not None and await self.elsewhere(scope, receive, send, call_id, deny):
            return
        runner = call.runner if call is not None else None
        if call is None or runner is None:
            await deny(404, f"No call '{call_id[:64]}' is in progress (a pending call gets its sideband once it "
                       "is accepted).", "call_not_found")
            return
        if call.sideband.full:
            await deny(429, f"This call has {MAX_PER_CALL} sideband connections already.", "too_many_sidebands")
            return
        gone = False

        async def send_text(text: str) -> None:
            nonlocal gone
            if gone:
                return
            try:
                await send({"type": "websocket.send", "text": text})
            except OSError:
                gone = True

        async def close() -> None:
            nonlocal gone
            if not gone:
                gone = True
                with contextlib.suppress(OSError):
                    await send({"type": "websocket.close", "code": CALL_ENDED, "reason": "call ended"})

        await send({"type": "websocket.accept", "subprotocol": None})
        session = runner.session
        created = {"type": "session.created", "event_id": new_id("event"),
                   "session": session_wire(session.settings, session.dialect)}
        await send_text(orjson.dumps(created).decode())
        token = call.sideband.attach(send_text, close)
        log.info("sideband attached to call %s", call_id)
        try:
            while not gone:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    break
                await runner.receive(message.get("text") or message.get("bytes") or b"")
                del message
        finally:
            gone = True
            call.sideband.detach(token)
