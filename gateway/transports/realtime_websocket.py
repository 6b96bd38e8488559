"""The Realtime WebSocket endpoint (``/v1/realtime``) as a plain ASGI endpoint.

Every check happens before the handshake is accepted, so a refused client gets an HTTP answer with an
OpenAI-shaped error body and no session is ever made: a browser's Origin ([server] allowed_origins),
the API key or client secret (``Authorization: Bearer``, or the subprotocol
``openai-insecure-api-key.<key>`` that browsers must use), room for another session, and the client
secret's session configuration; a refusal for room (503, ``session_limit_reached``, or
``server_shutting_down`` while draining) carries Retry-After. ``realtime`` is selected when offered
(browsers fail a handshake that selects none of the offered subprotocols); ``openai-beta.realtime-v1``
selects the beta shape like the ``OpenAI-Beta: realtime=v1`` header; other subprotocols are ignored.
``?call_id=rtc_...`` makes the connection a sideband of that call's session (gateway/transports/sideband.py).

To serve the endpoint from your own Starlette or FastAPI app::

    gateway = Gateway(load_config())
    app = Starlette(routes=[realtime_route(gateway)], lifespan=gateway.lifespan)
"""

from __future__ import annotations

import contextlib
import logging
from urllib.parse import parse_qs

from starlette.datastructures import Headers
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send

from gateway.log_repeats import CLIENT_CAUSED
from gateway.realtime.events import Dialect
from gateway.runtime.auth import KEY_SUBPROTOCOL, AuthError, bearer, error_body
from gateway.runtime.gateway import Gateway, SessionRefused
from gateway.transports.guard import Origins
from gateway.transports.sideband import Sidebands

log = logging.getLogger(__name__)

# An ASGI extension a server may offer in the scope: a callable that takes a function of a text message,
# called as each arrives, that returns whether it handled it (else it comes through ``receive`` as usual).
# The gateway's own server offers it (gateway/server/protocols/websocket_protocol.py): see
# SessionRunner.receive_now.
RECEIVE_NOW = "gateway.receive_now"

SUBPROTOCOL = "realtime"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
GOING_AWAY = 1001  # the close code of a session ended by a draining gateway


def credential_of(headers: Headers, subprotocols: list[str]) -> str | None:
    """The key a client sent: ``Authorization: Bearer``, else the ``openai-insecure-api-key.`` subprotocol."""
    token = bearer(headers.get("authorization"))
    if token is None:
        token = next((p[len(KEY_SUBPROTOCOL):] for p in subprotocols if p.startswith(KEY_SUBPROTOCOL)), None)
    return token


class RealtimeEndpoint:
    """An ASGI app for WebSocket scopes: one Realtime session per connection."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.origins = Origins(gateway.config.server.allowed_origins)
        self.sidebands = Sidebands()  # the transports that hold calls add their lookups

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "websocket"
        await receive()  # websocket.connect
        headers = Headers(scope=scope)
        offered: list[str] = scope.get("subprotocols") or []
        gateway = self.gateway
        origin = headers.get("origin")
        if origin is not None and not self.origins.allows(origin, headers.get("host")):
            await deny_handshake(scope, send, 403, "This origin may not open a session ([server] allowed_origins).",
                        "origin_not_allowed")
            return
        try:
            credential = gateway.auth.check(credential_of(headers, offered))
        except AuthError as exc:
            await deny_handshake(scope, send, 401, str(exc), "invalid_api_key")
            return
        query = parse_qs(scope["query_string"].decode("latin-1"))
        if "call_id" in query:  # a sideband: attach to a call's running session (gateway/transports/sideband.py)
            if credential.secret is not None:
                await deny_handshake(scope, send, 401, "A sideband needs an API key, not a client secret.",
                                     "invalid_api_key")
                return
            await self.sidebands.serve(scope, receive, send, query["call_id"][0],
                                       lambda status, message, code: deny_handshake(scope, send, status, message, code))
            return
        if (held := gateway.secret_refusal(credential.owner)) is not None:
            await deny_handshake(scope, send, 429, held, "too_many_sessions", "rate_limit_error")
            return
        if (refusal := gateway.admit()) is not None:
            await deny_handshake(scope, send, 503, refusal.message, refusal.code, "server_error", refusal.retry_after_s)
            return
        beta = "realtime=v1" in (headers.get("openai-beta") or "") or BETA_SUBPROTOCOL in offered
        kind = "transcription" if query.get("intent") == ["transcription"] else "realtime"
        try:
            session = gateway.new_session(Dialect.BETA if beta else Dialect.GA, model=query.get("model", [None])[0],
                                          session_type=kind, secret=credential.secret)
        except SessionRefused as exc:
            gateway.capacity.release()
            await deny_handshake(scope, send, 400, str(exc), "invalid_session")
            return
        gone = False  # the client's side ended the connection
        ended = False  # the server's side closed it

        async def send_text(text: str) -> None:
            # A session's tasks may still be sending after the connection ended: drop it, raise nothing.
            nonlocal gone
            if gone or ended:
                return
            try:
                await send({"type": "websocket.send", "text": text})
            except OSError:  # uvicorn's ClientDisconnected, also after a send timeout
                gone = True

        async def end() -> None:
            # The receive loop below then gets the client's answer to the close, a disconnect.
            nonlocal ended
            if not (gone or ended):
                ended = True
                with contextlib.suppress(OSError):
                    await send({"type": "websocket.close", "code": GOING_AWAY, "reason": "server shutting down"})

        runner = gateway.new_runner(session, send_text)
        runner.owner = credential.owner
        client = scope.get("client")
        gateway.opened(runner, f"WebSocket, {client[0] if client else '?'}", end)
        receive_now = scope.get("extensions", {}).get(RECEIVE_NOW)
        try:
            await send({"type": "websocket.accept", "subprotocol": SUBPROTOCOL if SUBPROTOCOL in offered else None})
            await runner.start()
            if receive_now is not None:
                receive_now(runner.receive_now)
            while not gone:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    gone = True
                    break
                await runner.receive(message.get("text") or message.get("bytes") or b"")
                # Not held while waiting for the next one: the inbound budget counts it as handled now.
                del message
        finally:
            if receive_now is not None:
                receive_now(None)
            await gateway.close_session(runner, client_gone=gone and not ended)


async def deny_handshake(scope: Scope, send: Send, status: int, message: str, code: str,
                kind: str = "invalid_request_error", retry_after_s: int | None = None) -> None:
    """Refuse the handshake with an HTTP response (where the server supports it), else a bare 403."""
    # A client can repeat this at will: one line per status a while (gateway.log_repeats), with a count.
    log.info(f"WebSocket refused ({status}): %s", message, extra=CLIENT_CAUSED)
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    body = error_body(message, code, kind)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


class UnknownPath:
    """An ASGI app for a WebSocket to any other path: 404 with a body naming the Realtime endpoint (a bare
    refusal reads like an authentication failure)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # websocket.connect
        await deny_handshake(scope, send, 404, f"No WebSocket endpoint at {scope['path'][:200]}: GPT-Live is at "
                             "/v1/live/sessions, the Realtime API at /v1/realtime.", "not_found")


def realtime_route(gateway: Gateway, path: str = "/v1/realtime") -> WebSocketRoute:
    """The Realtime endpoint as a Starlette route, to mount in any Starlette or FastAPI app; run
    ``gateway.lifespan`` with that app (it loads the models and frees them)."""
    return WebSocketRoute(path, RealtimeEndpoint(gateway))

