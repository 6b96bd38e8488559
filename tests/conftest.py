"""Shared fixtures: a real gateway on a loopback port, and the unmodified openai SDK as its client.

The SDK does not validate what it receives, so every server event is checked here against the
SDK's own server-event union (GA or beta) with pydantic; an invalid event fails the test.

Beta transcription sessions are the one place where the SDK's types and OpenAI differ: the union
lacks transcription_session.created (OpenAI sends it; it is checked here as .updated is), and the
session's client_secret is typed as required, though OpenAI sends it only in the REST answer that
mints one; its absence is the only failure tolerated.
"""

from __future__ import annotations

import os

import torch

# Without a GPU, engine.kernels' Triton kernels run in Triton's interpreter (tests/engine/test_kernels.py); this
# must be set before Triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import asyncio  # noqa: E402
import base64
import gc
import logging
import traceback
import wave
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.beta.realtime import TranscriptionSessionUpdatedEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter, ValidationError

from gateway.config import Config, load_config
from gateway.core.responder import Responder
from gateway.responders.echo import EchoResponder
from gateway.server.serve import GatewayServer
from tests.paths import FIXTURES

GA_EVENTS = TypeAdapter(RealtimeServerEvent)
BETA_EVENTS = TypeAdapter(BetaServerEvent)


# --- no ERROR line and no traceback in any test's log -------------------------------------------------

ERROR_LOGS_EXPECTED = "error_logs_expected"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{ERROR_LOGS_EXPECTED}(why): the test logs ERROR lines or tracebacks on "
                            "purpose (it provokes a bug, or cancels an app that never answers): they are not checked")


class ErrorLines(logging.Handler):
    """What a test logged at ERROR or above, or with a traceback, from any logger: a client-caused event is never
    one (WARNING at most, and no traceback), so each is a bug of ours. Kept as text: a record holds its failure,
    the failure its frames."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR and not record.exc_info:
            return
        line = f"{record.levelname} {record.name} ({record.pathname}:{record.lineno}): {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            line += "\n" + "".join(traceback.format_exception(record.exc_info[1])).rstrip()
        self.lines.append(line)


@pytest.fixture(scope="session")
def error_lines() -> Iterator[ErrorLines]:
    handler = ErrorLines()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


@pytest.fixture(autouse=True)
def no_error_lines(request: pytest.FixtureRequest, error_lines: ErrorLines) -> Iterator[None]:
    """Fails a test whose log (its fixtures' teardown included) has an ERROR line or a traceback, unless it is
    marked ``error_logs_expected``. Set up before the test's other fixtures, so torn down after them."""
    error_lines.lines.clear()
    yield
    found, error_lines.lines = error_lines.lines, []
    if found and request.node.get_closest_marker(ERROR_LOGS_EXPECTED) is None:
        pytest.fail("logged an ERROR line or a traceback (a client-caused event must not; a bug of ours did):\n"
                    + "\n".join(found), pytrace=False)


def no_error_lines_in(log: str) -> None:
    """The check above, for the log of a gateway a test ran as a process of its own."""
    found = [line for line in log.splitlines() if " ERROR " in line or line.startswith("Traceback")]
    assert not found, "the gateway logged an ERROR line or a traceback:\n" + log[-4000:]


def load_pcm(name: str) -> bytes:
    """A fixture WAV as pcm16 mono 24 kHz bytes."""
    with wave.open(str(FIXTURES / name)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.readframes(w.getnframes())


def silence(ms: int) -> bytes:
    return bytes(48 * ms)


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    """``data`` in pieces of the given sizes, cycling through them (to test chunking invariance)."""
    out, i, k = [], 0, 0
    while i < len(data):
        out.append(data[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
    return out


def make_config(**overrides: Any) -> Config:
    """The repository's defaults with ``section__key=value`` overrides, on a free port."""
    config = load_config(env={})
    config.server.port = 0
    config.webrtc.enabled = False  # tests that want it turn it on
    config.local.stt = False  # likewise the local whisper: "no STT" stays what it was for the echo responder
    for name, value in overrides.items():
        section, key = name.split("__")
        setattr(getattr(config, section), key, value)
    return config


class Served(GatewayServer):
    """A gateway served on a loopback port, with its sessions and calls at hand for the tests."""

    @property
    def sessions(self) -> set[Any]:
        return self.gateway.sessions

    @property
    def webrtc(self) -> Any:
        return self.app.state.webrtc


StartGateway = Callable[..., Awaitable[Served]]


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """For modules that run the tiny checkpoints in this process: they are all per-op overhead, and more
    intra-op threads on a shared 2-core box only slow them (`pytest.mark.usefixtures("one_torch_thread")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    started: list[Served] = []

    async def start(responder: Responder | None = None, **overrides: Any) -> Served:
        served = Served(make_config(**overrides), responder or EchoResponder(pace=0))
        started.append(served)
        await served.start()
        return served

    yield start
    # A client the test left open (the openai SDK's, in a reference cycle) is closed by the SDK when it is
    # collected, on the loop running then: collected now, it closes on this test's loop, not failing on a later's.
    gc.collect()
    await asyncio.sleep(0.05)
    for served in started:
        await served.stop()


@pytest.fixture
async def gateway(start_gateway: StartGateway) -> Served:
    return await start_gateway()


@pytest.fixture
async def start_pipeline(start_gateway: StartGateway) -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    """Starts gateways whose responder is the pipeline on a fake OpenAI server, with the tone engine as fast
    as it goes: ``await start_pipeline(fake, **config_overrides)``."""
    from gateway.responders.pipeline import BridgeSettings, PipelineResponder
    from gateway.responders.remote import LlmClient
    from gateway.responders.tone_tts import ToneEngine

    responders: list[PipelineResponder] = []

    async def start(fake: Any, **overrides: Any) -> Served:
        responders.append(PipelineResponder(
            LlmClient(fake.base_url, "llm-test", timeout_s=5),
            ToneEngine(first_audio_ms=0), BridgeSettings(starter_chars=10, max_segment_chars=80),
        ))
        stt = {"stt__base_url": fake.base_url, "stt__model": "whisper-test", "stt__timeout_s": 5.0}
        return await start_gateway(responders[-1], **stt | overrides)

    yield start
    for responder in responders:
        await responder.aclose()


class Client:
    """A Realtime connection of the openai SDK, with strict checks on every event received."""

    def __init__(self, connection: Any, beta: bool) -> None:
        self.connection = connection
        self.adapter = BETA_EVENTS if beta else GA_EVENTS
        self.received: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(event)

    async def send_raw(self, text: str) -> None:
        await self.connection.send_raw(text)

    async def append(self, pcm: bytes, chunk_ms: int = 20) -> None:
        step = 48 * chunk_ms
        for i in range(0, len(pcm), step):
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + step]).decode()})

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.connection.recv_bytes(), timeout)
        event = orjson.loads(raw)
        if event["type"].startswith("transcription_session."):
            check_beta_transcription_session(event)
        else:
            self.adapter.validate_json(raw)  # raises on any field the SDK's types do not allow
        self.received.append(event)
        return event

    async def until(self, kind: str, timeout: float = 10.0, **match: Any) -> list[dict[str, Any]]:
        """Events up to and including the first of type ``kind`` whose fields equal ``match``."""
        events = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = await self.recv(max(0.01, deadline - loop.time()))
            events.append(event)
            if event["type"] == kind and all(event.get(k) == v for k, v in match.items()):
                return events

    async def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Everything that arrives within ``seconds``."""
        events = []
        try:
            while True:
                events.append(await self.recv(seconds))
        except TimeoutError:
            return events


def check_beta_transcription_session(event: dict[str, Any]) -> None:
    """transcription_session.created/.updated against the SDK's type (see the module's docstring)."""
    assert event["type"] in ("transcription_session.created", "transcription_session.updated"), event["type"]
    try:
        TranscriptionSessionUpdatedEvent.model_validate({**event, "type": "transcription_session.updated"})
    except ValidationError as exc:
        problems = [e for e in exc.errors() if e["loc"] != ("session", "client_secret") or e["type"] != "missing"]
        if problems:
            raise


@asynccontextmanager
async def connect(gateway: GatewayServer, beta: bool = False, transcription: bool = False) -> AsyncIterator[Client]:
    """A connection as the SDK opens it; ``transcription``: with ?intent=transcription (no model)."""
    port = gateway.port
    openai = AsyncOpenAI(
        api_key="test-key", base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1"
    )
    realtime = openai.beta.realtime if beta else openai.realtime
    options: dict[str, Any] = {"model": "gpt-realtime"}
    if transcription:  # the beta SDK needs a model, the GA one takes none with an intent
        options = {"extra_query": {"intent": "transcription"}, **({"model": "gpt-4o-transcribe"} if beta else {})}
    async with realtime.connect(**options) as connection:
        client = Client(connection, beta)
        created = await client.recv()
        assert created["type"] == ("transcription_session.created" if beta and transcription else "session.created")
        yield client


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def audio_of(events: list[dict[str, Any]], response_id: str | None = None) -> bytes:
    return b"".join(
        base64.b64decode(e["delta"])
        for e in events
        if e["type"] in ("response.output_audio.delta", "response.audio.delta")
        and (response_id is None or e["response_id"] == response_id)
    )
