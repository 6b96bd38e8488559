"""Calls across the workers of ``serve --workers N``: a call lives in the worker its line reached (a SIP
dialog in the worker the kernel gave its INVITE, a Twilio stream in the worker its WebSocket was handed to),
and a request about it may arrive at any worker.

A call's id carries its worker's slot (workers.py: it looks like any other ``rtc_`` id and means nothing for
security: the owner checks everything). Each worker also serves its app on a private Unix socket
(CallWorkers.path, in a 0700 folder the parent made); a worker that gets a call-control request, a
sideband, for a call another worker holds passes it on there, headers and all (``CallRouter``), and the
owner answers it as if it had come straight in: its credential is checked again there, one place for the
check. The calls' listing asks every worker. A worker that is dead or restarting holds no call: 404
``call_not_found``, as for any call that is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from gateway.transports.calls.workers import CallWorkers, slot_of
from gateway.transports.rest import HttpError

log = logging.getLogger(__name__)

HOP = "gateway.from_worker"  # in the scope of a request another worker passed on
FORWARD_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 5.0  # a question to every worker (the listing)
CLOSE_WAIT_S = 5.0  # for one side's answer to a close the other side began
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# Headers of the connection, not of the request: each hop has its own.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te",
                         "trailer", "proxy-connection"})
WEBSOCKET_HEADERS = HOP_HEADERS | {"host", "sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol",
                                   "sec-websocket-extensions", "sec-websocket-accept"}
ANSWER_HEADERS = ("content-type", "retry-after", "cache-control")

DenyHandshake = Callable[[int, str, str], Awaitable[None]]


def from_workers(app: ASGIApp) -> ASGIApp:
    """The app as a worker's private socket serves it: its requests marked as passed on by another worker."""

    async def marked(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, HOP: True}, receive, send)

    return marked


def _not_found(call_id: str) -> HttpError:
    return HttpError(404, f"No call '{call_id[:64]}' is in progress.", "call_not_found")


class CallRouter:
    """Passes a request about a call to the worker that holds it."""

    def __init__(self, workers: CallWorkers | None) -> None:
        self.workers = workers

    def owner(self, call_id: str, scope: Scope) -> int | None:
        """The other worker a call's id names, or None: this one, one process, or a request passed on already."""
        if self.workers is None or scope.get(HOP):
            return None
        slot = slot_of(call_id)
        return slot if slot is not None and slot != self.workers.slot else None

    def _path(self, slot: int, call_id: str) -> str:
        assert self.workers is not None
        if slot >= self.workers.count:
            raise _not_found(call_id)
        return self.workers.path(slot)

    async def forward(self, request: Request, slot: int, call_id: str) -> Response:
        """The owner's answer to ``request`` (its body already read and bounded here)."""
        path = self._path(slot, call_id)
        try:
            status, headers, content = await self._request(path, request, await request.body(), FORWARD_TIMEOUT_S)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info("call %s: worker %d cannot be reached (%s)", call_id[:64], slot, exc or type(exc).__name__)
            raise _not_found(call_id) from None
        return Response(content, status, headers=headers)

    async def ask_others(self, request: Request) -> list[tuple[int, dict[str, str], bytes]]:
        """``request`` (its body read already) asked of every other worker at once: the answers of those that
        gave one (none when it came from another worker, or in one process)."""
        if self.workers is None or request.scope.get(HOP):
            return []
        body = await request.body()
        others = [s for s in range(self.workers.count) if s != self.workers.slot]
        answers = await asyncio.gather(*(self._request(self.workers.path(s), request, body, ASK_TIMEOUT_S)
                                         for s in others), return_exceptions=True)
        return [answer for answer in answers if isinstance(answer, tuple)]

    async def listing(self, request: Request) -> list[dict[str, Any]]:
        """The calls every other worker lists (one that does not answer lists none)."""
        calls = []
        for status, _, content in await self.ask_others(request):
            if status == 200:
                with contextlib.suppress(orjson.JSONDecodeError, TypeError, KeyError):
                    calls += orjson.loads(content)["data"]
        return calls

    async def _request(self, path: str, request: Request, body: bytes,
                       timeout: float) -> tuple[int, dict[str, str], bytes]:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        connector = aiohttp.UnixConnector(path=path)
        async with (aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout),
                                          skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding")) as session,
                    session.request(request.method, f"http://worker{url}", headers=headers, data=body,
                                    allow_redirects=False, auto_decompress=False) as answer):
            content = await answer.content.read(MAX_ANSWER_BYTES)
            kept = {name: answer.headers[name] for name in ANSWER_HEADERS if name in answer.headers}
            return answer.status, kept, content

    async def sideband(self, scope: Scope, receive: Receive, send: Send, call_id: str, deny: DenyHandshake) -> bool:
        """A sideband of a call another worker holds (False: the id names none), passed on: the handshake, then
        every frame both ways; when either side closes, the other is closed with its code."""
        slot = self.owner(call_id, scope)
        if slot is None:
            return False
        try:
            path = self._path(slot, call_id)
        except HttpError as exc:
            await deny(exc.status, str(exc), exc.code or "call_not_found")
            return True
        headers = Headers(scope=scope)
        query = scope.get("query_string", b"").decode("latin-1")
        uri = f"ws://{headers.get('host') or 'worker'}{scope['path']}" + (f"?{query}" if query else "")
        try:
            upstream = await unix_connect(
                path, uri, additional_headers=[(k, v) for k, v in headers.items() if k not in WEBSOCKET_HEADERS],
                subprotocols=scope.get("subprotocols") or None, compression=None, max_size=None, ping_interval=None,
                user_agent_header=None, open_timeout=FORWARD_TIMEOUT_S)
        except InvalidStatus as exc:  # the owner refused it: its answer, as it gave it
            await _answer(send, exc.response.status_code, exc.response.headers.get("content-type"),
                          exc.response.headers.get("retry-after"), exc.response.body or b"")
            return True
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            log.info("call %s: worker %d cannot be reached (%s)", call_id[:64], slot, exc or type(exc).__name__)
            await deny(404, str(_not_found(call_id)), "call_not_found")
            return True
        log.info("sideband of call %s: passed on to worker %d", call_id[:64], slot)
        try:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            await _pump(upstream, receive, send)
        finally:
            await upstream.close()
        return True


async def _answer(send: Send, status: int, content_type: str | None, retry_after: str | None, body: bytes) -> None:
    headers = [(b"content-type", (content_type or "application/json").encode("latin-1")),
               (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", retry_after.encode("latin-1")))
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


# Close codes a peer may not send (RFC 6455 §7.4.1): what stands for them on the other side.
_CLIENT_WENT = {1005: 1000, 1006: 1001, 1015: 1001}
_OWNER_WENT = {1005: 1000, 1006: 1011, 1015: 1011}


async def _pump(upstream: ClientConnection, receive: Receive, send: Send) -> None:
    async def inward() -> None:  # the client's frames to the owner, then its close
        with contextlib.suppress(ConnectionClosed):
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    code = int(message.get("code") or 1005)
                    await upstream.close(_CLIENT_WENT.get(code, code), str(message.get("reason") or ""))
                    return
                text = message.get("text")
                await upstream.send(text if text is not None else message.get("bytes") or b"")

    async def outward() -> None:  # the owner's frames to the client, then its close
        with contextlib.suppress(OSError):  # the client is gone
            with contextlib.suppress(ConnectionClosed):
                async for data in upstream:
                    await send({"type": "websocket.send", "text" if isinstance(data, str) else "bytes": data})
            code = upstream.close_code or 1006
            await send({"type": "websocket.close", "code": _OWNER_WENT.get(code, code),
                        "reason": upstream.close_reason or ""})

    tasks = {asyncio.ensure_future(inward()), asyncio.ensure_future(outward())}
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if pending:  # the other side's answer to the close
            await asyncio.wait(pending, timeout=CLOSE_WAIT_S)
    finally:
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):
                raise result
