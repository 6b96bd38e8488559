"""The gateway as one ASGI app: every route on one port.

  WS     /v1/realtime                       a Realtime session (gateway/transports/realtime_websocket.py)
  POST   /v1/realtime/calls, /v1/realtime   WebRTC signalling (gateway/transports/webrtc/signalling.py)
  POST   /v1/realtime/client_secrets, /v1/realtime/sessions, /v1/realtime/transcription_sessions
                                            ephemeral client secrets (gateway/transports/client_secrets.py)
  WS     /v1/live/sessions                  a GPT-Live session (gateway/transports/live_websocket.py)
  POST   /v1/live/sessions                  a GPT-Live session over WebRTC (gateway/transports/webrtc/live_calls.py)
  WS     /v1/live/sessions/{id}/attach      a GPT-Live session's sideband
  GET    /v1/realtime/sessions/{id}/turns   a live session's latency trace
  POST   /v1/audio/speech                   text to speech (gateway/transports/speech.py)
  /v1/audio/voice_consents, /v1/audio/voices, /v1/audio/capabilities
                                            custom voices and their consents (gateway/transports/voices.py)
  POST   /v1/realtime/calls/{id}/accept|reject|refer|hangup, GET /v1/realtime/calls
                                            phone calls' control (gateway/transports/calls/control.py); their
                                            sideband is /v1/realtime?call_id=...; SIP on its own port
                                            (gateway/transports/sip/), Twilio at /twilio/* (twilio.py)
  GET    /healthz, /readyz, /metrics        liveness, readiness (neither needs a key), Prometheus metrics
  GET    /...                               the browser page (public: it holds no secret)

``create_app(config)`` is the app factory: a worker process builds its app from the config alone.
"""

from __future__ import annotations

import asyncio
import mimetypes
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from gateway import __version__
from gateway.config import Config, ConfigError
from gateway.core.responder import Responder
from gateway.runtime.gateway import Gateway
from gateway.runtime.health import describe_responder
from gateway.runtime.trace import DRAINING, ENGINE_STREAMS_FREE, SESSION_SLOTS_FREE, SESSIONS, metrics_text
from gateway.shipped import WEB_DIR
from gateway.transports.calls.control import CallControl, call_control_routes
from gateway.transports.calls.phone_calls import PhoneCalls
from gateway.transports.calls.routing import CallRouter
from gateway.transports.calls.workers import CallWorkers
from gateway.transports.client_secrets import client_secret_routes
from gateway.transports.guard import FrontDoor, Hosts, Origins
from gateway.transports.live_websocket import live_routes
from gateway.transports.realtime_websocket import RealtimeEndpoint, UnknownPath
from gateway.transports.rest import HttpError, authorize, error_response, http_error_response
from gateway.transports.sip.listener import SipListener
from gateway.transports.sip.signalling import SipEndpoint
from gateway.transports.speech import speech_routes
from gateway.transports.transcriptions import transcription_routes
from gateway.transports.twilio import twilio_routes
from gateway.transports.voices import voice_routes
from gateway.transports.webrtc.signalling import Signalling, signalling_routes

MAX_STATIC_PATH_CHARS = 255


class Pages:
    """The page and /healthz, /readyz, /metrics and a session's turns."""

    def __init__(self, gateway: Gateway, webrtc: bool) -> None:
        self.gateway = gateway
        self.webrtc = webrtc
        self.web_dir = Path(gateway.config.server.web_dir or WEB_DIR).resolve()
        if not (self.web_dir / "index.html").is_file():
            raise ConfigError(f"option server.web_dir: {self.web_dir} has no index.html to serve")
        self.started_at = time.time()

    async def healthz(self, request: Request) -> Response:
        """Liveness (503 only while starting) and what answers: each backend's health, "degraded" while one
        is down (gateway/runtime/health.py)."""
        gateway = self.gateway
        backends = gateway.backends
        status = "starting" if not gateway.ready else "degraded" if backends and backends.unreachable() else "ok"
        # Every worker's sessions, from the counts they share (under `serve --workers N` any worker may answer).
        capacity = gateway.capacity
        body = {"status": status, "version": __version__,
                "active_sessions": capacity.sessions, "active_sessions_by_worker": capacity.by_worker,
                "uptime_s": round(time.time() - self.started_at, 1),
                "webrtc": self.webrtc, "auth_required": gateway.auth.required,
                "responder": describe_responder(gateway.responder, gateway.transcriber),
                "backends": backends.wire() if backends else {}}
        return Response(orjson.dumps(body), 200 if gateway.ready else 503, media_type="application/json",
                        headers={"Cache-Control": "no-cache"})

    async def readyz(self, request: Request) -> Response:
        """Readiness for a balancer: 200 while a new session would be taken, else 503 saying why."""
        gateway, capacity = self.gateway, self.gateway.capacity
        why = gateway.not_ready()
        body = {"status": "ready" if why is None else "not_ready", "reason": why, "sessions": capacity.sessions,
                "session_slots_free": capacity.free, "engine_streams_free": gateway.engine_streams_free(),
                "draining": capacity.draining}
        return Response(orjson.dumps(body), 200 if why is None else 503, media_type="application/json",
                        headers={"Cache-Control": "no-cache"})

    async def metrics(self, request: Request) -> Response:
        authorize(request, self.gateway)
        capacity = self.gateway.capacity
        SESSIONS.set(capacity.sessions)
        SESSION_SLOTS_FREE.set(capacity.free)
        DRAINING.set(int(capacity.draining))
        if (streams := self.gateway.engine_streams_free()) is not None:
            ENGINE_STREAMS_FREE.set(streams)
        # A thread: under `serve --workers N` this reads and adds up every worker's metrics files.
        return Response(await asyncio.to_thread(metrics_text, streams is not None), media_type=CONTENT_TYPE_LATEST)

    async def turns(self, request: Request) -> Response:
        """A live session's latency trace: its last turns, stage by stage (the page's latency panel)."""
        credential = authorize(request, self.gateway, secrets_allowed=True)
        session_id = request.path_params["session_id"]
        runner = self.gateway.runner(session_id)
        if runner is None or not credential.reaches(runner.owner):
            raise HttpError(404, "No such session.", "session_not_found")
        body = {"session_id": session_id, "turns": list(runner.trace.records)}
        return Response(orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-cache"})

    async def upgrade_required(self, request: Request) -> Response:
        raise HttpError(426, "This is the Realtime WebSocket endpoint: connect with a WebSocket.", "upgrade_required")

    def page_file(self, name: str | None) -> Path | None:
        """The page's file a one-segment path names, or None."""
        relative = name or "index.html"
        if len(relative) > MAX_STATIC_PATH_CHARS:
            return None
        file = (self.web_dir / relative).resolve()
        if file.is_dir():
            file = file / "index.html"
        return file if file.is_relative_to(self.web_dir) and file.is_file() else None

    async def static(self, request: Request) -> Response:
        file = self.page_file(request.path_params.get("name"))
        if file is None:
            raise HttpError(404, "Not found.", "not_found")
        content_type = "text/javascript" if file.suffix == ".js" else mimetypes.guess_type(file.name)[0]
        return FileResponse(file, media_type=content_type or "application/octet-stream",
                            headers={"Cache-Control": "no-cache"})


class Phones:
    """The phone lines, when on: the call model (PhoneCalls), the SIP endpoint, the Twilio routes; under
    ``serve --workers N``, this worker's part of them (``workers``) and the way to the others' calls."""

    def __init__(self, gateway: Gateway, workers: CallWorkers | None = None) -> None:
        config = gateway.config
        self.workers = workers
        self.router = CallRouter(workers)
        self.calls = PhoneCalls(gateway, workers) if config.sip.enabled or config.twilio.enabled else None
        self.sip: SipListener | None = None
        if self.calls is not None and config.sip.enabled:
            self.sip = SipListener(SipEndpoint(self.calls, config.sip, workers), config.sip, workers)

    def routes(self, gateway: Gateway) -> list[BaseRoute]:
        table: list[BaseRoute] = []
        if self.calls is not None and gateway.config.twilio.enabled:
            table += twilio_routes(gateway, self.calls, self.workers)
        return table


def routes(gateway: Gateway, signalling: Signalling, phones: Phones) -> list[BaseRoute]:
    pages = Pages(gateway, webrtc=signalling.calls is not None)
    realtime = RealtimeEndpoint(gateway)
    webrtc = signalling.calls
    if webrtc is not None:
        realtime.sidebands.lookups.append(webrtc.sideband_call)
    if phones.calls is not None:
        realtime.sidebands.lookups.append(phones.calls.find)
    realtime.sidebands.elsewhere = phones.router.sideband
    table: list[BaseRoute] = []
    for path in ("/v1/realtime", "/realtime"):
        table += [WebSocketRoute(path, realtime), Route(path, pages.upgrade_required, methods=["GET"])]
    table += live_routes(gateway)
    table += client_secret_routes(gateway)
    table += speech_routes(gateway)
    table += transcription_routes(gateway)
    table += voice_routes(gateway)
    table += signalling_routes(signalling)  # answers 404 while WebRTC is off
    table += call_control_routes(CallControl(gateway, phones.calls, webrtc.hang_up if webrtc is not None else None,
                                             phones.router))
    table += phones.routes(gateway)
    table += [
        Route("/healthz", pages.healthz),
        Route("/readyz", pages.readyz),
        Route("/metrics", pages.metrics),
        Route("/v1/realtime/sessions/{session_id}/turns", pages.turns),
        # The page's folder is served flat: a path of one segment, so that the API's paths never reach it
        # (a wrong method on them is a 405, not a missing file).
        Route("/", pages.static),
        Route("/{name}", pages.static),
        WebSocketRoute("/{path:path}", UnknownPath()),
    ]
    return table


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HttpError)
    return http_error_response(exc)


async def _starlette_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (404, 405) in the same shape as ours."""
    assert isinstance(exc, HTTPException)
    pages = getattr(request.scope.get("endpoint"), "__self__", None)
    if isinstance(pages, Pages) and pages.page_file(request.path_params.get("name")) is None:
        # A POST to a one-segment path reaches only the page's GET route: no such file is a 404.
        return error_response(404, "Not found.", "not_found")
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error_response(exc.status_code, str(exc.detail), code, headers=exc.headers)


def create_app(config: Config, responder: Responder | None = None, gateway: Gateway | None = None,
               workers: CallWorkers | None = None) -> Starlette:
    """The app factory: the whole gateway as an ASGI app, its models loaded by the app's lifespan; ``workers``:
    this worker's place among ``serve --workers N`` for its calls (gateway.transports.calls.routing)."""
    gateway = gateway if gateway is not None else Gateway(config, responder)
    server = config.server
    front_door = Middleware(FrontDoor, origins=Origins(server.allowed_origins),
                            hosts=Hosts(server.allowed_hosts, server.host), max_headers=server.max_request_headers,
                            max_header_line_bytes=server.max_header_line_bytes)
    signalling = Signalling(gateway)
    phones = Phones(gateway, workers)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with gateway.lifespan(app):
            if phones.sip is not None:
                await phones.sip.start()
            try:
                yield
            finally:
                if phones.sip is not None:
                    await phones.sip.endpoint.stop()
                    await phones.sip.stop()

    app = Starlette(routes=routes(gateway, signalling, phones), middleware=[front_door], lifespan=lifespan,
                    exception_handlers={HttpError: _http_error, HTTPException: _starlette_error})
    app.state.gateway = gateway
    app.state.webrtc = signalling.calls  # the WebRTC calls (None: off)
    app.state.phones = phones  # the phone calls and the SIP endpoint (None: off)
    return app
