"""GPT-Live over WebSocket: the primary connection (``/v1/live/sessions``) and the sideband (``.../{id}/attach``).

Both are checked before the handshake is accepted, as the Realtime endpoint is: a browser's Origin, the API key
(``Authorization: Bearer``; our ``ek_`` client secrets are accepted too, as an extra: OpenAI defines none for
Live), and for the primary, room for another session (503 with Retry-After). The primary's first event must be
``session.start``; its session ends with ``session.close`` (→ ``session.closed``, then close code 1000), at its
``expires_at``, after ``[live] no_audio_timeout_s`` without input audio, or when the connection goes.

A sideband joins a running session of this process (under ``serve --workers N`` only the worker holding it has
it: a sideband that reaches another worker gets 404, see docs/live.md). It gets ``session.started`` at once, then
every event of the session, the input and output audio reflected as pcm16 24 kHz with their times, and may send
every client event but ``session.start`` and audio. A session has at most MAX_SIDEBANDS at a time.
"""

from __future__ import annotations

import contextlib
import itertools
import logging

from starlette.datastructures import Headers
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send

from gateway.runtime.auth import AuthError, Credential
from gateway.runtime.gateway import Gateway
from gateway.runtime.live_runner import LiveRunner
from gateway.transports.guard import Origins
from gateway.transports.realtime_websocket import GOING_AWAY, credential_of, deny_handshake

log = logging.getLogger(__name__)

MAX_SIDEBANDS = 4
_SIDEBAND_KEYS = itertools.count(1)


class _Connection:
    """One accepted WebSocket's sending side: a send after either side ended it is dropped."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.gone = False  # the client's side ended it
        self.ended = False  # ours did

    async def text(self, text: str) -> None:
        if self.gone or self.ended:
            return
        try:
            await self._send({"type": "websocket.send", "text": text})
        except OSError:  # uvicorn's ClientDisconnected, also after a send timeout
            self.gone = True

    async def close(self, code: int = 1000) -> None:
        if not (self.gone or self.ended):
            self.ended = True
            with contextlib.suppress(OSError):
                await self._send({"type": "websocket.close", "code": code})


class LiveEndpoint:
    """An ASGI app for WebSocket scopes: a Live session per connection, or a sideband of one."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.origins = Origins(gateway.config.server.allowed_origins)

    async def _checked(self, scope: Scope, send: Send) -> Credential | None:
        """The handshake's credential, or None once it is refused."""
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None and not self.origins.allows(origin, headers.get("host")):
            await deny_handshake(scope, send, 403, "This origin may not open a session ([server] allowed_origins).",
                                 "origin_not_allowed")
            return None
        try:
            return self.gateway.auth.check(credential_of(headers, scope.get("subprotocols") or []))
        except AuthError as exc:
            await deny_handshake(scope, send, 401, str(exc), "invalid_api_key")
            return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "websocket"
        await receive()  # websocket.connect
        if "session_id" in scope.get("path_params", {}):
            await self._sideband(scope, receive, send, scope["path_params"]["session_id"])
            return
        if (credential := await self._checked(scope, send)) is None:
            return
        gateway = self.gateway
        if (held := gateway.secret_refusal(credential.owner)) is not None:
            await deny_handshake(scope, send, 429, held, "too_many_sessions", "rate_limit_error")
            return
        if (refusal := gateway.admit()) is not None:
            await deny_handshake(scope, send, 503, refusal.message, refusal.code, "server_error",
                                 refusal.retry_after_s)
            return
        connection = _Connection(send)
        runner = gateway.new_live_runner(gateway.new_live_session(), connection.text)
        runner.end_primary = connection.close
        runner.owner = credential.owner
        client = scope.get("client")

        async def going_away() -> None:  # a draining gateway's end
            await connection.close(GOING_AWAY)
            for _, end in list(runner.sidebands.values()):
                await end(GOING_AWAY)

        gateway.opened(runner, f"Live WebSocket, {client[0] if client else '?'}", going_away)
        try:
            # Browsers authenticate with subprotocols (the Realtime page's scheme) and fail a handshake that
            # selects none of those offered; OpenAI's Live clients offer none.
            offered = scope.get("subprotocols") or []
            await send({"type": "websocket.accept", "subprotocol": "realtime" if "realtime" in offered else None})
            await runner.start()
            while not connection.gone:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    connection.gone = True
                    break
                await runner.receive(message.get("text") or message.get("bytes") or b"")
                del message  # not held while waiting for the next one (the inbound budget counts it handled)
        finally:
            if not runner.session.closed:
                await runner.lost()
            await gateway.close_session(runner, client_gone=connection.gone and not connection.ended)

    async def _sideband(self, scope: Scope, receive: Receive, send: Send, session_id: str) -> None:
        if (credential := await self._checked(scope, send)) is None:
            return
        if credential.secret is not None:  # a server's control channel, as OpenAI's: a secret is a browser's
            await deny_handshake(scope, send, 401, "A sideband needs an API key, not a client secret.",
                                 "invalid_api_key")
            return
        runner = self.gateway.runner(session_id)
        if not isinstance(runner, LiveRunner) or runner.session.closed:
            await deny_handshake(scope, send, 404, f"No Live session '{session_id[:100]}' here (under serve "
                                 "--workers N, only the worker holding the session has it).", "session_not_found")
            return
        if len(runner.sidebands) >= MAX_SIDEBANDS:
            await deny_handshake(scope, send, 429, f"This session has {MAX_SIDEBANDS} sidebands already.",
                                 "too_many_sidebands", "rate_limit_error")
            return
        connection = _Connection(send)
        key = next(_SIDEBAND_KEYS)
        await send({"type": "websocket.accept"})
        log.info("session %s: sideband attached", session_id)
        try:
            await runner.attach(key, connection.text, connection.close)
            while not connection.gone and not runner.session.closed:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    connection.gone = True
                    break
                await runner.receive(message.get("text") or message.get("bytes") or b"", sideband=key)
                del message
        finally:
            runner.detach(key)
            await connection.close()


def live_routes(gateway: Gateway) -> list[WebSocketRoute]:
    endpoint = LiveEndpoint(gateway)
    routes = []
    for prefix in ("/v1", ""):
        routes += [WebSocketRoute(prefix + "/live/sessions", endpoint),
                   WebSocketRoute(prefix + "/live/sessions/{session_id}/attach", endpoint)]
    return routes
