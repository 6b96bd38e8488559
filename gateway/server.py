"""The gateway process: one websockets server for the Realtime endpoint, the web page, /healthz, /metrics."""

from __future__ import annotations

import asyncio
import gc
import logging
import mimetypes
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import IO, TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway import __version__, mcp_client
from gateway.config import REPO_ROOT, Config, ConfigError
from gateway.protocol import Dialect
from gateway.responder import Responder, Transcriber
from gateway.runner import Playout, Send, SessionRunner
from gateway.session import Session
from gateway.smart_turn import SmartTurnBatcher, SmartTurnModel, SmartTurnModelError, eagerness_levels
from gateway.trace import ACTIVE_SESSIONS, TurnTrace
from gateway.vad import SileroModel, SileroVAD, VadBatcher

if TYPE_CHECKING:
    from gateway.webrtc import WebRTCServer

log = logging.getLogger(__name__)

REALTIME_PATHS = ("/v1/realtime", "/realtime")
TURNS_PREFIX = "/v1/realtime/sessions/"


def _response(status: HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body))),
                       ("Cache-Control", "no-cache")])
    return Response(status.value, status.phrase, headers, body)


class Gateway:
    def __init__(self, config: Config, responder: Responder | None = None) -> None:
        """``responder``: None builds the configured one; the transcriber is always the configured one."""
        self.config = config
        self.responder = responder
        self.transcriber: Transcriber | None = None
        self.sessions: set[SessionRunner] = set()
        self.ready = False
        self.started_at = time.time()
        self.web_dir = (REPO_ROOT / config.server.web_dir).resolve()
        self._vad_model: SileroModel | None = None
        self._vad_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vad")
        self._vad_batcher = VadBatcher(
            self._vad_executor, config.vad.inline_windows, config.vad.batch_interval_ms
        )
        # Smart Turn (semantic_vad) has a thread of its own: its calls take tens of milliseconds, and the
        # sessions' VAD batches must not queue behind them.
        self._smart_turn_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smart-turn")
        self._smart_turn: SmartTurnBatcher | None = None
        self._trace_sink: IO[str] | None = None
        self._server: Server | None = None
        self.webrtc: WebRTCServer | None = None
        self._backend_check: asyncio.Task[None] | None = None

    async def start(self) -> None:
        eagerness_levels(self.config.semantic_vad)  # a bad [semantic_vad] option fails here, not in a session
        if self.config.trace.jsonl_path:
            self._trace_sink = open(self.config.trace.jsonl_path, "a", buffering=1)  # noqa: SIM115
        cfg = self.config.server
        try:
            self._server = await serve(
                self._handle,
                cfg.host,
                cfg.port,
                process_request=self._process_request,
                compression=None,
                max_size=cfg.max_message_bytes,
                max_queue=cfg.max_queue,
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port} ([server] port, or --port): "
                              f"{exc.strerror or exc}") from None
        await self._load_models()
        if self.config.webrtc.enabled:
            try:
                from gateway.webrtc import start_webrtc  # noqa: PLC0415 - aiortc is an optional extra
            except ImportError:
                log.info("WebRTC off: aiortc is not installed (pip install '.[webrtc]')")
            else:
                rtc = self.config.webrtc
                try:
                    self.webrtc = await start_webrtc(self)
                except OSError as exc:
                    raise ConfigError(f"cannot listen on {rtc.host}:{rtc.port} for WebRTC signalling ([webrtc] "
                                      f"port, or [webrtc] enabled = false): {exc.strerror or exc}") from None
        # Everything loaded so far (openai, pydantic, onnxruntime, torch) lives as long as the process:
        # keep it out of the collector, so full collections stay short and the loop keeps its pace.
        gc.freeze()
        self.ready = True
        log.info("gateway %s listening on ws://%s:%d/v1/realtime (responder: %s)", __version__, cfg.host,
                 self.port, type(self.responder).__name__)
        self._backend_check = asyncio.create_task(self._warn_of_backends())

    async def _load_models(self) -> None:
        """The responder, the transcriber, the VAD and Smart Turn models (and MCP's client stack), loaded
        in worker threads while /healthz answers "starting" (the local models' first start takes ~30 s)."""
        from gateway.pipeline import build_responder, build_transcriber  # noqa: PLC0415 - the model stack

        log.info("loading models; /healthz says starting until they are ready")
        loop = asyncio.get_running_loop()
        loads = [loop.run_in_executor(None, build_transcriber, self.config), loop.run_in_executor(None, SileroModel)]
        if self.responder is None:
            loads.append(loop.run_in_executor(None, build_responder, self.config))
        self.transcriber, self._vad_model, *built = await asyncio.gather(*loads)
        if built:
            self.responder = built[0]
        if self.config.mcp.enabled:
            await loop.run_in_executor(None, mcp_client.preload)
        semantic = self.config.semantic_vad
        try:
            model = await loop.run_in_executor(None, SmartTurnModel, semantic.model_path or None,
                                               semantic.model_sha256 or None)
        except SmartTurnModelError as exc:
            raise ConfigError(str(exc)) from None
        self._smart_turn = SmartTurnBatcher(model, self._smart_turn_executor, semantic.max_batch)

    async def _warn_of_backends(self) -> None:
        """Name a backend that is down now, not at the first user's turn (which it would fail)."""
        problems = []
        if check := getattr(self.responder, "check", None):
            problems += await check()
        if (check := getattr(self.transcriber, "check", None)) and (problem := await check()):
            problems.append(problem)
        for problem in problems:
            log.warning("%s; turns will fail until it answers", problem)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._backend_check is not None:
            self._backend_check.cancel()
        if self.webrtc is not None:
            await self.webrtc.stop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._vad_executor.shutdown(wait=False, cancel_futures=True)
        self._smart_turn_executor.shutdown(wait=False, cancel_futures=True)
        for part in (self.responder, self.transcriber):
            close = getattr(part, "aclose", None)
            if close is not None:
                await close()  # the backends' HTTP connection pools
        gc.unfreeze()  # what start-up kept out of the collector may go now
        if self._trace_sink is not None:
            self._trace_sink.close()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path in REALTIME_PATHS:
            if not self.ready:
                return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"gateway is starting\n", "text/plain")
            if len(self.sessions) >= self.config.server.max_sessions:
                return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"too many sessions\n", "text/plain")
            return None
        if path == "/healthz":
            status = HTTPStatus.OK if self.ready else HTTPStatus.SERVICE_UNAVAILABLE
            body = {"status": "ok" if self.ready else "starting", "version": __version__,
                    "active_sessions": len(self.sessions), "uptime_s": round(time.time() - self.started_at, 1),
                    "webrtc_port": self.webrtc.port if self.webrtc is not None else None}
            return _response(status, orjson.dumps(body), "application/json")
        if path == "/metrics":
            return _response(HTTPStatus.OK, generate_latest(), CONTENT_TYPE_LATEST)
        if path.startswith(TURNS_PREFIX) and path.endswith("/turns"):
            return self._turns(path[len(TURNS_PREFIX) : -len("/turns")])
        return self._static(path)

    def _turns(self, session_id: str) -> Response:
        """A live session's latency trace: its last turns, stage by stage (the page's latency panel)."""
        runner = next((r for r in self.sessions if r.session.settings.id == session_id), None)
        if runner is None:
            return _response(HTTPStatus.NOT_FOUND, b"no such session\n", "text/plain")
        body = {"session_id": session_id, "turns": list(runner.trace.records)}
        return _response(HTTPStatus.OK, orjson.dumps(body), "application/json")

    def _static(self, path: str) -> Response:
        relative = path.lstrip("/") or "index.html"
        file = (self.web_dir / relative).resolve()
        if file.is_dir():
            file = file / "index.html"
        if not file.is_relative_to(self.web_dir) or not file.is_file():
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
        content_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        if file.suffix == ".js":
            content_type = "text/javascript"
        return _response(HTTPStatus.OK, file.read_bytes(), content_type)

    def new_runner(self, session: Session, send: Send, playout: Playout | None = None) -> SessionRunner:
        """A runner for ``session`` on this gateway's responder, VAD model and trace (any transport)."""
        assert self._vad_model is not None and self.responder is not None
        return SessionRunner(
            session,
            self.responder,
            SileroVAD(self._vad_model),
            send,
            vad_batcher=self._vad_batcher,
            trace=TurnTrace(session.settings.id, self._trace_sink),
            playout=playout,
            transcriber=self.transcriber,
            smart_turn=self._smart_turn,
        )

    async def _handle(self, ws: ServerConnection) -> None:
        beta = "realtime=v1" in (ws.request.headers.get("OpenAI-Beta") or "")
        query = parse_qs(urlsplit(ws.request.path).query)
        model = query.get("model", [None])[0]
        kind = "transcription" if query.get("intent") == ["transcription"] else "realtime"
        session = Session(self.config, Dialect.BETA if beta else Dialect.GA, model=model, session_type=kind)
        runner = self.new_runner(session, ws.send)
        self.sessions.add(runner)
        ACTIVE_SESSIONS.set(len(self.sessions))
        log.info("session %s opened (%s shape, %s)", session.settings.id, session.dialect.value,
                 ws.remote_address[0] if ws.remote_address else "?")
        try:
            await runner.start()
            async for message in ws:
                await runner.receive(message)
        except ConnectionClosed:
            pass
        finally:
            await runner.close()
            self.sessions.discard(runner)
            ACTIVE_SESSIONS.set(len(self.sessions))
            log.info("session %s closed", session.settings.id)

