"""The gateway's shared state: its sessions, the VAD models, the responder, the trace, auth and capacity.

One ``Gateway`` serves one event loop. The transports (gateway/transports/) open sessions through it, so
every transport starts, runs, drains and ends a session the same way; it knows no transport itself. A
transport that holds connections beside its sessions (WebRTC calls still connecting) hands the gateway
its ``HeldConnections``, which a drain and a stop then reach. The models are the configured ones
(gateway/responders/build.py chooses them), loaded by ``start``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol

import orjson
from prometheus_client import Counter

from gateway.config import Config, ConfigError, check
from gateway.core.responder import Responder, Transcriber
from gateway.live.session import LiveSession
from gateway.realtime.effects import Fault, SendEvent
from gateway.realtime.events import Dialect, error_event
from gateway.realtime.session import Session
from gateway.responders.build import build_responder, build_transcriber
from gateway.responders.delegation import DelegationBackend
from gateway.responders.engine_client import EngineClient
from gateway.runtime import mcp_client
from gateway.runtime.auth import Auth, ClientSecret
from gateway.runtime.capacity import Capacity
from gateway.runtime.core_runner import Send, log_fault
from gateway.runtime.health import Backends
from gateway.runtime.live_runner import LiveRunner
from gateway.runtime.session_runner import Playout, SessionRunner
from gateway.runtime.silero import SWITCH_INTERVAL_S, EngineVad, SileroModel, SileroVAD, StepModel, VadBatcher
from gateway.runtime.smart_turn import (
    EngineSmartTurn,
    SmartTurn,
    SmartTurnBatcher,
    SmartTurnModel,
    SmartTurnModelError,
    read_model,
)
from gateway.runtime.speech import SpeechService
from gateway.runtime.trace import ACTIVE_SESSIONS, TurnTrace
from gateway.runtime.voices.library import SessionVoices, VoiceLibrary
from gateway.shipped import SMART_TURN_MODEL

log = logging.getLogger(__name__)

# How long the sessions ended at a drain's end get to finish closing (a close handshake, a hang-up).
DRAIN_CLOSE_S = 5.0

DISCONNECTS = Counter("gateway_client_disconnects_total",
                      "Sessions whose client went away, by what the session was doing", ["during"])


# Ends a session from the server's side (a WebSocket closes with 1001, a WebRTC call hangs up).
End = Callable[[], Awaitable[None]]


class SessionRefused(Exception):
    """A session cannot start as asked (a bad configuration); the message says why."""


class Refusal(NamedTuple):
    """Why no new session starts now: an HTTP ``status`` (503: the gateway's room) with this error code,
    message and Retry-After."""

    code: str
    message: str
    retry_after_s: int = 1
    status: int = 503


STARTING = Refusal("server_starting", "The gateway is starting.", 5)
FULL = Refusal("session_limit_reached", "This gateway holds as many sessions as it may ([server] max_sessions); "
               "try again later or another one.")
DRAINING = Refusal("server_shutting_down", "This gateway is shutting down; start the session on another one.")


class HeldConnections(Protocol):
    """Connections a transport holds beside its sessions (WebRTC calls not yet connected)."""

    async def close_pending(self) -> None:
        """Hang up those that hold no conversation yet (a drain begins)."""

    async def stop(self) -> None:
        """Close them all (the gateway stops)."""


def drain_notice(seconds: float) -> dict[str, Any]:
    """The one event a draining session gets ``seconds`` before the gateway closes it (the page shows it)."""
    return error_event("server_shutting_down", f"This server is shutting down: the session closes in "
                       f"{round(seconds)} s. Start a new session to continue.", error_type="server_error")


class Gateway:
    def __init__(self, config: Config, responder: Responder | None = None, auth: Auth | None = None,
                 capacity: Capacity | None = None) -> None:
        """``responder``: None builds the configured one; the transcriber is always the configured one.
        ``capacity``: this process's share of the gateway's sessions (default: its own, of max_sessions)."""
        self.config = config
        self.responder = responder
        self.transcriber: Transcriber | None = None
        self.auth = auth if auth is not None else Auth.from_env(os.environ)
        self.capacity = capacity if capacity is not None else Capacity(config.server.session_limit)
        self.sessions: set[SessionRunner | LiveRunner] = set()
        self._ends: dict[SessionRunner | LiveRunner, End] = {}
        self._emptied = asyncio.Event()  # set whenever the last session of this process ends
        self._hurry = asyncio.Event()  # a second signal: the drain closes what is left at once
        self.ready = False
        self._vad_model: StepModel | None = None
        # The VAD's own thread: its batches never wait for the event loop (onnxruntime releases the GIL).
        self._vad_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vad")
        self._vad_batcher = VadBatcher(self._vad_executor, config.vad.batch_interval_ms)
        # Smart Turn (semantic_vad) has a thread of its own: its calls take tens of milliseconds, and the
        # sessions' VAD batches must not queue behind them.
        self._smart_turn_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smart-turn")
        self._smart_turn: SmartTurn | None = None
        self._trace_sink: IO[str] | None = None
        self._held: list[HeldConnections] = []
        self.backends: Backends | None = None  # their health, once started
        self._backend_check: asyncio.Task[None] | None = None
        self._started = False
        self._switch_interval = sys.getswitchinterval()
        self.speech = SpeechService(config)  # /v1/audio/speech: its engine and its share of it
        self.voices = VoiceLibrary(config.voices)  # the deployment's custom voices ([voices] dir)
        self.delegation: DelegationBackend | None = None  # GPT-Live's Responses delegation backend, once started

    async def start(self) -> None:
        """Load the models and open what the sessions share, in worker threads (the local models' first
        start takes ~30 s; /healthz says "starting" meanwhile); a second call does nothing."""
        if self._started:
            return
        self._started = True
        check(self.config)  # a bad option fails here, not in a session
        loop = asyncio.get_running_loop()
        loads = [loop.run_in_executor(None, build_transcriber, self.config), loop.run_in_executor(None, SileroModel)]
        if self.responder is None:
            loads.append(loop.run_in_executor(None, build_responder, self.config))
        self.transcriber, local_vad, *built = await asyncio.gather(*loads)
        if built:
            self.responder = built[0]
        if (prepare := getattr(self.responder, "prepare", None)) is not None:
            await prepare()  # the configured voices ([voices.NAME]), made by the TTS engine
        voices = getattr(self.responder, "voices", None)
        if voices is not None and self.config.session.voice.lower() not in voices:
            log.warning("[session] voice %r is none of the TTS engine's voices (%s): sessions that keep it "
                        "cannot speak", self.config.session.voice, ", ".join(sorted(voices)) or "none")
        await self.speech.start(getattr(self.responder, "tts_engine", None))
        self._vad_model = self._start_vad(local_vad)
        await self.voices.start()
        if hasattr(self.responder, "voice_source"):
            self.responder.voice_source = self.voices.prompt_for  # sessions speak in the custom voices too
        if self.config.mcp.enabled:
            await loop.run_in_executor(None, mcp_client.preload)
        self._smart_turn = await self._start_smart_turn()
        self.delegation = DelegationBackend.from_config(self.config)
        if path := self.config.trace.jsonl_path:
            try:
                self._trace_sink = open(path, "a", buffering=1)  # noqa: SIM115 - open as long as the gateway
            except OSError as exc:
                raise ConfigError(f"option trace.jsonl_path: cannot write {path!r} ({exc.strerror})") from None
        # Everything loaded so far (openai, pydantic, onnxruntime, torch) lives as long as the process:
        # keep it out of the collector, so full collections stay short and the loop keeps its pace.
        gc.freeze()
        # The VAD's thread gets the GIL at once when it asks, not after the loop's next 5 ms of Python.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        self.ready = True
        # A backend that is down is named now, not at the first user's turn (which it would fail).
        self.backends = Backends(self.responder, self.transcriber, self.config.server.backend_check_s)
        self._backend_check = asyncio.create_task(self.backends.run())

    def _start_vad(self, local: SileroModel) -> StepModel:
        """Silero where [vad] device puts it: the engine processes that run it (they were given the model:
        gateway.responders.build.give_engine_models), falling back on ``local``; else ``local``."""
        engine = self.speech.loaded
        if self.config.vad.device != "cpu" and isinstance(engine, EngineClient) and engine.has_vad:
            endpoint = engine.vad_endpoint(self.capacity.slot)
            log.info("Silero VAD runs in the engine process at %s (this process's model if it does not answer)",
                     endpoint)
            return EngineVad(endpoint, local)
        if self.config.vad.device == "engine":
            raise ConfigError('option vad.device = "engine" needs the Qwen3-TTS engine in engine processes that run '
                              'the VAD ([engine] mode = "process", or endpoints of engine processes started with '
                              "[engine] vad_model)")
        return local

    async def _start_smart_turn(self) -> SmartTurn:
        """Smart Turn where [semantic_vad] device puts it: the engine processes that run it (they were given
        the model: gateway.responders.build.give_engine_models), else onnxruntime here."""
        semantic, loop = self.config.semantic_vad, asyncio.get_running_loop()
        path = Path(semantic.model_path) if semantic.model_path else SMART_TURN_MODEL
        engine = self.speech.loaded  # the responder's TTS engine, or the Qwen3-TTS engine loaded for the speech API
        try:
            if semantic.device != "cpu" and isinstance(engine, EngineClient) and engine.has_turn_model:
                await loop.run_in_executor(None, read_model, path, semantic.model_sha256 or None)
                return EngineSmartTurn(engine, self._smart_turn_executor)
            if semantic.device == "engine":
                raise ConfigError('option semantic_vad.device = "engine" needs the Qwen3-TTS engine in engine '
                                  'processes that run the model ([engine] mode = "process", or endpoints of engine '
                                  "processes started with [engine] turn_model)")
            model = await loop.run_in_executor(None, SmartTurnModel, path, semantic.model_sha256 or None)
        except SmartTurnModelError as exc:
            raise ConfigError(str(exc)) from None
        return SmartTurnBatcher(model, self._smart_turn_executor, semantic.max_batch)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = self.ready = False
        if self._backend_check is not None:
            self._backend_check.cancel()
        for held in self._held:
            await held.stop()
        if isinstance(self._vad_model, EngineVad):
            self._vad_executor.submit(self._vad_model.close)  # in the thread that uses its socket, after its batch
        self._vad_executor.shutdown(wait=False, cancel_futures=True)
        self._smart_turn_executor.shutdown(wait=False, cancel_futures=True)
        await self.speech.aclose()
        for part in (self.responder, self.transcriber, self.delegation):
            close = getattr(part, "aclose", None)
            if close is not None:
                await close()  # the backends' HTTP connection pools
        gc.unfreeze()  # what start-up kept out of the collector may go now
        sys.setswitchinterval(self._switch_interval)
        if self._trace_sink is not None:
            self._trace_sink.close()

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """Start and stop with an ASGI app (Starlette's and FastAPI's ``lifespan=``)."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    def hold(self, connections: HeldConnections) -> None:
        """A transport's connections beside its sessions, for a drain and a stop to reach."""
        self._held.append(connections)

    # --- sessions, for every transport ------------------------------------------------------------

    def unavailable(self) -> Refusal | None:
        """Why no session can start now (HTTP 503), or None; takes no slot (see ``admit``)."""
        if not self.ready:
            return STARTING
        if self.capacity.draining:
            return DRAINING
        if self.capacity.free <= 0:
            return FULL
        return None

    def admit(self) -> Refusal | None:
        """Take a session slot, or say why not; a slot taken is given back by ``close_session`` once the
        session is ``opened``, else by ``capacity.release()``."""
        if (refusal := self.unavailable()) is not None:
            return refusal
        return None if self.capacity.admit() else self.unavailable() or FULL

    def secret_refusal(self, owner: str | None, pending: int = 0) -> str | None:
        """Why the client secret ``owner`` (a credential's; None for an API key, which is not held to it) may
        open no more sessions here ([server] max_sessions_per_secret), or None; ``pending``: its WebRTC calls
        still connecting, which count too."""
        if owner is None:
            return None
        limit = self.config.server.max_sessions_per_secret
        if sum(runner.owner == owner for runner in self.sessions) + pending < limit:
            return None
        return (f"This client secret already holds {limit} sessions, as many as one may ([server] "
                "max_sessions_per_secret); end one, or mint another secret.")

    def engine_streams_free(self) -> int | None:
        """Streams the TTS engine can still take (its rows less those held), or None when it has no such cap
        (the tone and piper engines, the echo responder)."""
        engine = getattr(self.responder, "tts_engine", None)
        return getattr(engine, "free_streams", None)

    def not_ready(self) -> str | None:
        """Why a balancer should send no new session here now (``/readyz``): starting, draining, full, or
        no engine streams (new ones would wait for a row), or None."""
        if (refusal := self.unavailable()) is not None:
            return {STARTING: "starting", DRAINING: "draining"}.get(refusal, "full")
        if self.engine_streams_free() == 0:
            return "no engine streams"
        if self.config.server.ready_requires_backends and self.backends and (down := self.backends.unreachable()):
            return f"backend unreachable: {', '.join(down)}"
        return None

    def new_session(self, dialect: Dialect, *, model: str | None = None, server_playout: bool = False,
                    session_type: str = "realtime", secret: ClientSecret | None = None) -> Session:
        """A session for a new connection (``session_type`` "transcription": ?intent=transcription); one
        opened with a client secret is of the secret's type and starts from its configuration.
        SessionRefused if that configuration is refused."""
        if secret is not None:
            session_type = secret.kind
        session = Session(self.config, dialect, server_playout=server_playout, model=model,
                          session_type=session_type)
        if secret is not None:
            if secret.dialect is not dialect:
                shape = "beta (connect with the 'OpenAI-Beta: realtime=v1' header or the 'openai-beta.realtime-v1' " \
                        "subprotocol)" if secret.dialect is Dialect.BETA else "GA (connect without OpenAI-Beta)"
                raise SessionRefused(f"This client secret was minted for the {shape} protocol.")
            configure(session, secret.session, secret.kind)
        return session

    def new_runner(self, session: Session, send: Send, playout: Playout | None = None,
                   trace_tags: dict[str, str] | None = None) -> SessionRunner:
        """A runner for ``session`` on this gateway's responder, VAD model and trace (any transport);
        ``trace_tags``: fields each of its trace records carries (gateway.runtime.trace)."""
        assert self._vad_model is not None and self.responder is not None
        runner = SessionRunner(
            session,
            self.responder,
            SileroVAD(self._vad_model),
            send,
            vad_batcher=self._vad_batcher,
            trace=TurnTrace(session.settings.id, self._trace_sink, trace_tags),
            playout=playout,
            transcriber=self.transcriber,
            smart_turn=self._smart_turn,
            on_backend_error=self.backends.failed if self.backends is not None else None,
        )
        if session.voices is not None and getattr(self.responder, "voice_source", None) is not None:
            session.voices = SessionVoices(frozenset(session.voices), self.voices.store)
        return runner

    def new_live_session(self, webrtc: bool = False) -> LiveSession:
        """A GPT-Live session for a new connection (started by its session.start, or by a WebRTC create)."""
        voices = self.responder.voices if self.responder is not None else None
        if voices is not None and getattr(self.responder, "voice_source", None) is not None:
            voices = SessionVoices(frozenset(voices), self.voices.store)
        return LiveSession(self.config, webrtc=webrtc, voices=voices, now_s=time.time(),
                           backend=self.delegation is not None)

    def new_live_runner(self, session: LiveSession, send: Send) -> LiveRunner:
        """A runner for a GPT-Live session on this gateway's responder, VAD model, trace and delegation backend."""
        assert self._vad_model is not None and self.responder is not None
        return LiveRunner(
            session, self.responder, SileroVAD(self._vad_model), send, self.delegation,
            vad_batcher=self._vad_batcher, trace=TurnTrace(session.id, self._trace_sink),
            transcriber=self.transcriber, smart_turn=self._smart_turn,
            on_backend_error=self.backends.failed if self.backends is not None else None,
        )

    def runner(self, session_id: str) -> SessionRunner | LiveRunner | None:
        """This process's running session of that id."""
        return next((r for r in self.sessions if r.trace.session_id == session_id), None)

    def opened(self, runner: SessionRunner | LiveRunner, how: str, end: End) -> None:
        """A session admitted (its slot taken) is running; ``end`` closes it from the server's side."""
        self.sessions.add(runner)
        self._ends[runner] = end
        self._emptied.clear()
        ACTIVE_SESSIONS.set(len(self.sessions))
        log.info("session %s opened (%s, %s)", runner.trace.session_id, runner.shape, how)

    async def close_session(self, runner: SessionRunner | LiveRunner, client_gone: bool) -> None:
        """End a session's tasks and forget it; ``client_gone``: the client's side ended it."""
        if client_gone and runner in self.sessions:
            DISCONNECTS.labels("response" if runner.responding else "idle").inc()
        await runner.close()
        if runner in self.sessions:
            self.sessions.discard(runner)
            del self._ends[runner]
            self.capacity.release()
            ACTIVE_SESSIONS.set(len(self.sessions))
            log.info("session %s closed", runner.trace.session_id)
            if not self.sessions:
                self._emptied.set()

    # --- draining --------------------------------------------------------------------------------

    async def drain(self, seconds: float, notice_seconds: float) -> None:
        """Stop taking sessions; let this process's sessions run for up to ``seconds``, send each the notice
        ``notice_seconds`` before that end, then end what is left (1001). Returns once none is left; after
        ``hurry()`` it ends them at once."""
        self.capacity.draining = True
        if self._hurry.is_set():  # SIGINT: no time is given
            log.info("stopping: ending the %d session(s) here now", len(self.sessions))
        else:
            log.info("draining: %d session(s) here may run for up to %g s", len(self.sessions), seconds)
        for held in self._held:
            await held.close_pending()  # not connected yet: no conversation to keep
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        if not await self._wait_sessions(end - notice_seconds) and not self._hurry.is_set():
            left = max(0.0, end - loop.time())
            await asyncio.gather(*(runner.send_event(drain_notice(left)) for runner in list(self.sessions)))
            await self._wait_sessions(end)
        if self.sessions:
            log.info("drain: ending the %d session(s) left", len(self.sessions))
            await asyncio.gather(*(end_session() for end_session in list(self._ends.values())),
                                 return_exceptions=True)
            await self._wait_sessions(loop.time() + DRAIN_CLOSE_S, hurried_too=False)
        log.info("drained: %d session(s) left", len(self.sessions))

    def hurry(self) -> None:
        """A draining gateway ends its sessions now (the second SIGTERM or SIGINT)."""
        self._hurry.set()

    async def _wait_sessions(self, until: float, hurried_too: bool = True) -> bool:
        """Wait until no session is left (True), ``until`` (loop time) or ``hurry()``."""
        if not self.sessions:
            return True
        waits = [asyncio.ensure_future(self._emptied.wait())]
        if hurried_too:
            waits.append(asyncio.ensure_future(self._hurry.wait()))
        timeout = max(0.0, until - asyncio.get_running_loop().time())
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        return not self.sessions

def configure(session: Session, config: dict[str, Any], kind: str = "realtime") -> None:
    """Apply a session configuration before session.created, as the client's first event would be
    (a client secret's, a WebRTC offer's ``session`` part); SessionRefused with the session's reason."""
    event = "session.update"
    if kind == "transcription" and session.dialect is Dialect.BETA:
        event = "transcription_session.update"
    for effect in session.handle(orjson.dumps({"type": event, "session": config})):
        match effect:
            case Fault():
                log_fault(session.settings.id, effect)
            case SendEvent({"type": "error", "error": error}):
                raise SessionRefused(str(error["message"]))
