"""The gateway's side of the engine processes (engine.process): engine.api.TTSEngine over ZeroMQ.

EngineClient holds one DEALER socket per engine process (one per GPU) and places each new stream on the
one that is up with the smallest share of its rows in use (the streams it reported at its last heartbeat,
all gateway processes together, plus those opened here since, over its rows). Streams behave as the
in-process engine's do: feed, end and cancel return at once (the message is queued on the socket), packets
arrive in an asyncio queue, and a cancelled stream's iteration ends at once; a packet that arrives for a
stream this side no longer knows is answered with a cancel. A prepared voice travels as bytes with each
stream that speaks in it, so every engine process speaks it; `prepare` clones one from reference audio in
an engine process.

An engine process that stops (its connection drops), goes silent for protocol.MISSED_HEARTBEATS
heartbeats, or comes back as a new instance fails every stream it held with a BackendError("tts"): that
response fails, the session goes on, and new streams go to engines that are up (the supervisor restarts the
one that died; it is used again once it answers). The handshake at construction is blocking (the gateway
builds its engine in a worker thread at start-up); the sockets of the event loop open at the first use.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import weakref
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine import ipc
from engine.api import Sampling, TTSChunk, TTSError
from engine.config import EngineConfig
from engine.handles import QueuedStream
from engine.supervisor import EngineSupervisor
from engine.voices import VoicePrompt
from gateway.config import ConfigError
from gateway.core.responder import BackendError

T = TypeVar("T")

log = logging.getLogger(__name__)


class RemoteStream(QueuedStream):
    """One utterance in an engine process; the engine.api.TTSStream protocol.

    Its OPEN leaves at the end of the loop's current pass, with the text fed and the end given by then: a
    speech request's whole input is one message, not three (each message wakes ZeroMQ's I/O thread, a cost
    that queues up when hundreds of requests come at once). Text fed later goes as FEED and END."""

    def __init__(self, link: EngineLink, sid: bytes, max_chars: int, opening: ipc.Open) -> None:
        super().__init__(max_chars)
        self._link, self.sid = link, sid
        self._opening: ipc.Open | None = opening
        self._early = ""  # text fed before the OPEN left
        asyncio.get_running_loop().call_soon(self._send_open)

    def _send_open(self) -> None:
        opening, self._opening = self._opening, None
        if opening is None or self.sid not in self._link.streams:
            return  # cancelled, failed, or refused here before it left
        self._link.send(ipc.open_frames(self.sid, opening, self._early, self.ended))

    def feed(self, text: str) -> None:
        if super().feed(text):
            if self._opening is not None:
                self._early += text
            else:
                self._link.send([ipc.FEED, self.sid, text.encode()])

    def end(self) -> None:
        try:
            if super().end() and self._opening is None:
                self._link.send([ipc.END, self.sid])
        except TTSError:
            self._stop()
            raise

    def cancel(self) -> None:
        if super().cancel():
            self._stop()

    def _stop(self) -> None:
        # Only a stream the engine may still hold is cancelled there: not one that has not left yet, nor
        # one the engine finished (DONE or ERROR) or this side failed.
        if self._link.streams.pop(self.sid, None) is not None and self._opening is None:
            self._link.send([ipc.CANCEL, self.sid])
        self._opening = None
        self.put(None)


class EngineLink:
    """One engine process as this gateway process sees it."""

    def __init__(self, endpoint: str, hello: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.hello = hello
        self.instance: str = hello["instance"]
        self.up = True
        self.load = 0  # streams the engine held at its last PONG (every gateway process's)
        self.opened = 0  # streams opened here since that PONG
        self.heard = 0.0  # loop time of its last message
        self.streams: dict[bytes, RemoteStream] = {}
        self.socket: zmq.asyncio.Socket | None = None

    def send(self, frames: list[bytes], *, down_too: bool = False) -> None:
        """Queue a message for the engine without blocking; a full queue means the engine is stuck."""
        if self.socket is None or not (self.up or down_too):
            return
        sent = self.socket.send_multipart(frames, flags=zmq.DONTWAIT)
        if sent.exception() is not None and self.up:
            self.fail(f"does not take messages ({sent.exception()!r})")

    def fail(self, why: str) -> None:
        """Mark the engine down and fail every stream it held."""
        if self.up:
            log.warning("TTS engine process at %s %s; failing its %d streams", self.endpoint, why, len(self.streams))
        self.up = False
        self.fail_streams(f"the TTS engine process {why}")

    def fail_streams(self, message: str) -> None:
        """Fail every stream held there; each is cancelled there too, in case the engine still runs it (one
        taken for gone that was only slow), or comes back with it queued."""
        streams, self.streams = self.streams, {}
        for sid, stream in streams.items():
            stream.put(BackendError("tts", message))
            self.send([ipc.CANCEL, sid], down_too=True)

    def heard_from(self, instance: str, now: float) -> None:
        self.heard = now
        if instance != self.instance:
            self.fail_streams("the TTS engine process restarted")
            self.instance = instance
        if not self.up:
            log.info("TTS engine process at %s is up again", self.endpoint)
        self.up = True


class EngineClient:
    """engine.api.TTSEngine over engine processes at `endpoints` (started by `supervisor`, stopped with this
    client, when given)."""

    incremental = True
    model_name = "Qwen3-TTS"

    def __init__(self, endpoints: Iterable[str], heartbeat_s: float = 0.5, *,
                 supervisor: EngineSupervisor | None = None, connect_timeout_s: float = 30.0) -> None:
        self.heartbeat_s = heartbeat_s
        self.supervisor = supervisor
        self.links = [EngineLink(ep, _handshake(ep, connect_timeout_s)) for ep in endpoints]
        if not self.links:
            raise ConfigError("[engine] endpoints: no engine process to connect to")
        first = self.links[0].hello
        self.voices: frozenset[str] = frozenset(first["voices"])
        self.kinds: list[str] = list(first.get("kinds", []))
        self.fingerprints: list[str] = list(first.get("fingerprints", []))
        self.follows_instructions = bool(first.get("follows_instructions"))
        self._languages = frozenset(first["languages"])
        self._max_chars = int(first["max_text_chars"])
        self._ids = itertools.count(1)
        self._context: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stats: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self._voices: dict[bytes, asyncio.Future[VoicePrompt]] = {}
        self._turns: dict[bytes, asyncio.Future[float]] = {}
        # Each voice's wire form, made once: a clone's OPEN carries its prompt, and a burst of requests for one
        # voice would serialise it again for each.
        self._prompt_bytes: weakref.WeakKeyDictionary[VoicePrompt, bytes] = weakref.WeakKeyDictionary()

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineClient:
        """Connect to [engine] endpoints, or start the engine processes here (one per device) and connect."""
        endpoints = [e.strip() for e in config.endpoints.split(",") if e.strip()]
        supervisor = None
        if not endpoints:
            supervisor = EngineSupervisor.from_config(config)
            supervisor.start(config.start_timeout_s)
            endpoints = supervisor.endpoints
        try:
            return cls(endpoints, config.heartbeat_ms / 1000, supervisor=supervisor,
                       connect_timeout_s=config.start_timeout_s)
        except BaseException:
            if supervisor is not None:
                supervisor.stop()
            raise

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None, sampling: Sampling | None = None) -> RemoteStream:
        """A stream in an engine process (engine.threaded.QwenTTSEngine.open says what the engine takes);
        what only the engine can check (a prepared voice it cannot speak) fails the stream's iteration."""
        self._start()
        if prompt is None and voice.lower() not in self.voices:
            raise TTSError(f"unknown voice {voice!r}; the engine has {', '.join(sorted(self.voices))}")
        lang = (language or "auto").lower()
        if lang not in self._languages:
            raise TTSError(f"unknown language {language!r}; use {', '.join(sorted(self._languages))}")
        if sampling is not None and (problem := sampling.problem()) is not None:
            raise TTSError(problem[1])
        link = self._pick()
        link.opened += 1
        sid = ipc.sid_bytes(next(self._ids))
        stream = RemoteStream(link, sid, self._max_chars,
                              ipc.Open(voice, None if lang == "auto" else lang,
                                       b"" if prompt is None else self._wire(prompt), instructions, sampling))
        link.streams[sid] = stream
        return stream

    async def connect(self) -> None:
        """Open the links to the engine processes now, not at the first stream: until a link heartbeats,
        this process's free streams are the hello's, blind to what the other gateway processes hold there."""
        self._start()

    def _wire(self, prompt: VoicePrompt) -> bytes:
        data = self._prompt_bytes.get(prompt)
        if data is None:
            data = self._prompt_bytes[prompt] = prompt.to_bytes()
        return data

    async def prepare(self, audio: np.ndarray, sample_rate: int, text: str | None = None,
                      timeout: float = 60.0) -> VoicePrompt:
        """Clone a voice from reference audio (float32 mono samples at `sample_rate`, and its transcript for
        in-context cloning) in an engine process; TTSError when the engine cannot (no Base checkpoint, audio
        too long or short), BackendError when no engine answers in `timeout` seconds."""
        payload = [np.ascontiguousarray(audio, dtype="<f4").tobytes(), str(sample_rate).encode(), (text or "").encode()]
        late = BackendError("tts", f"the TTS engine process did not prepare the voice in {timeout:g} s")
        return await self._ask(self._voices, ipc.PREPARE, payload, timeout, late)

    @property
    def has_turn_model(self) -> bool:
        """Whether the engine processes run the end-of-turn model (started with [engine] turn_model)."""
        return all(link.hello.get("turns") for link in self.links)

    @property
    def has_vad(self) -> bool:
        """Whether the engine processes run Silero VAD (started with [engine] vad_model)."""
        return all(link.hello.get("vad") for link in self.links)

    def vad_endpoint(self, slot: int) -> str:
        """The VAD of the engine process that gateway process ``slot`` (its index among [server] workers) uses:
        the workers take the engine processes in turn, so that each VAD serves as many of them whatever pids
        the host gave them."""
        return ipc.vad_endpoint(self.links[slot % len(self.links)].endpoint)

    async def turn(self, audio: np.ndarray, timeout: float = 5.0) -> float:
        """P(the turn is complete) from the engine's end-of-turn model, for a turn's last 8 s at most of
        float32 mono 16 kHz audio (engine.turn_model); BackendError when no engine answers in `timeout` s."""
        late = BackendError("turn", f"the engine process did not judge the turn in {timeout:g} s")
        return await self._ask(self._turns, ipc.TURN, [np.ascontiguousarray(audio, dtype="<f4").tobytes()], timeout,
                               late)

    async def _ask(self, waiting: dict[bytes, asyncio.Future[T]], kind: bytes, payload: list[bytes], timeout: float,
                   late: BackendError) -> T:
        """One request to the least loaded engine process, answered by a message naming its token (_handle
        settles the future in `waiting`); `late` when no answer comes in `timeout` seconds."""
        self._start()
        link = self._pick()
        token = os.urandom(8)
        done = waiting[token] = asyncio.get_running_loop().create_future()
        link.send([kind, token, *payload])
        try:
            return await asyncio.wait_for(done, timeout)
        except TimeoutError:
            raise late from None
        finally:
            waiting.pop(token, None)

    def _pick(self) -> EngineLink:
        """The engine process that is up with the smallest share of its rows in use (GPUs of one kind have as
        many rows each: the fewest streams)."""
        up = [link for link in self.links if link.up]
        if not up:
            raise BackendError("tts", "no TTS engine process is up (a restarted one answers once it has loaded)")
        return min(up, key=lambda li: (li.load + li.opened) / max(1, int(li.hello["rows"])))

    @property
    def where(self) -> str:
        return ", ".join(link.endpoint for link in self.links)

    async def check(self) -> str | None:
        """None while an engine process is up (heartbeats answered), else the cause."""
        if any(link.up for link in self.links):
            return None
        return "no engine process is up (a restarted one answers once it has loaded)"

    @property
    def free_streams(self) -> int:
        """Rows the engines that are up have left, as of their last heartbeat: each one's cap (``rows`` in its
        hello) less the streams it reported (every gateway process's) and those opened here since."""
        return sum(max(0, int(link.hello["rows"]) - link.load - link.opened) for link in self.links if link.up)

    async def stats(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Each engine process's counters (engine.batcher.Batcher.counters, plus its instance, pid, clients and
        uptime), from the engines that answer within `timeout`."""
        self._start()
        loop = asyncio.get_running_loop()
        asks = []
        for link in self.links:
            if not link.up:
                continue
            token = os.urandom(8)
            self._stats[token] = loop.create_future()
            asks.append((link, token))
            link.send([ipc.STATS, token])
        out = []
        for link, token in asks:
            try:
                out.append({"endpoint": link.endpoint, **await asyncio.wait_for(self._stats[token], timeout)})
            except TimeoutError:
                pass
            finally:
                self._stats.pop(token, None)
        return out

    async def aclose(self) -> None:
        for link in self.links:
            link.send([ipc.BYE], down_too=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._context is not None:
            self._context.destroy(linger=200)
        if self.supervisor is not None:
            await asyncio.to_thread(self.supervisor.stop)

    # -- the event loop's side --
    def _start(self) -> None:
        if self._context is not None:
            return
        loop = asyncio.get_running_loop()
        self._context = zmq.asyncio.Context()
        for link in self.links:
            link.socket = self._context.socket(zmq.DEALER)
            link.socket.setsockopt(zmq.SNDHWM, ipc.QUEUE_LIMIT)
            link.socket.setsockopt(zmq.RCVHWM, ipc.QUEUE_LIMIT)
            link.socket.connect(link.endpoint)
            link.heard = loop.time()
            monitor = link.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            self._tasks += [loop.create_task(self._receive(link)), loop.create_task(self._watch(link, monitor))]
        self._tasks.append(loop.create_task(self._heartbeat()))

    async def _receive(self, link: EngineLink) -> None:
        assert link.socket is not None
        loop = asyncio.get_running_loop()
        # Once awake, every message already queued is read through a plain socket on the same ZeroMQ socket,
        # not each through a future and a pass of the loop: with hundreds of streams the engine sends
        # thousands of packets a second, and a burst of them costs a third as much this way.
        queued = zmq.Socket.shadow(link.socket.underlying)
        while True:
            frames = await link.socket.recv_multipart()
            now = loop.time()
            while True:
                try:
                    self._handle(link, frames, now)
                except (IndexError, ValueError) as exc:  # an engine of this protocol never sends one
                    log.warning("bad message from the TTS engine process at %s: %s", link.endpoint, exc)
                if not queued.get(zmq.EVENTS) & zmq.POLLIN:
                    break
                frames = queued.recv_multipart(zmq.NOBLOCK)

    def _handle(self, link: EngineLink, frames: list[bytes], now: float) -> None:
        kind = frames[0]
        if kind == ipc.PACKET:
            stream = link.streams.get(frames[1])
            if stream is None:
                link.send([ipc.CANCEL, frames[1]])  # a stream failed or forgotten here: stop it there
            else:
                stream.put(TTSChunk(pcm=frames[3], text=frames[2].decode()))
        elif kind in (ipc.DONE, ipc.ERROR):
            stream = link.streams.pop(frames[1], None)
            if stream is not None:
                stream.put(None if kind == ipc.DONE else _error(frames[2], frames[3].decode()))
        elif kind == ipc.PONG:
            link.heard_from(frames[1].decode(), now)
            link.load, link.opened = int(frames[2]), 0
        elif kind == ipc.HELLO:
            link.heard_from(json.loads(frames[1])["instance"], now)
        elif kind == ipc.RESET:
            link.heard = now
            link.fail_streams(f"the TTS engine process dropped this gateway's streams ({frames[1].decode()})")
        elif kind == ipc.STATS and frames[1] in self._stats and not self._stats[frames[1]].done():
            self._stats[frames[1]].set_result(json.loads(frames[2]))
        elif kind == ipc.TURN and frames[1] in self._turns and not self._turns[frames[1]].done():
            if frames[2] == ipc.OK:
                self._turns[frames[1]].set_result(float(frames[3]))
            else:
                self._turns[frames[1]].set_exception(BackendError("turn", f"engine process: {frames[3].decode()}"))
        elif kind == ipc.VOICE and frames[1] in self._voices and not self._voices[frames[1]].done():
            if frames[2] == ipc.OK:
                self._voices[frames[1]].set_result(VoicePrompt.from_bytes(frames[3]))
            else:
                self._voices[frames[1]].set_exception(_error(frames[2], frames[3].decode()))

    async def _watch(self, link: EngineLink, monitor: zmq.asyncio.Socket) -> None:
        """The connection's events: a dropped connection is a dead engine (IPC: its process exited)."""
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    link.fail("stopped")
                elif event == zmq.EVENT_CONNECTED and not link.up:
                    link.send([ipc.HELLO, b"{}"], down_too=True)
        finally:
            monitor.close(linger=0)

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heartbeat_s)
            silent = loop.time() - ipc.MISSED_HEARTBEATS * self.heartbeat_s
            for link in self.links:
                if link.up and link.heard < silent:
                    link.fail(f"did not answer for {loop.time() - link.heard:.1f} s")
                # An engine that is down is asked again until it answers (a restarted one, or a hung one back).
                link.send([ipc.PING] if link.up else [ipc.HELLO, b"{}"], down_too=True)


def _error(cause: bytes, message: str) -> Exception:
    return TTSError(message) if cause == ipc.INPUT else BackendError("tts", f"TTS engine process: {message}")


def _handshake(endpoint: str, timeout: float) -> dict[str, Any]:
    """HELLO and its answer on a blocking socket: what the engine serves, and that it is there."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        socket.connect(endpoint)
        socket.send_multipart([ipc.HELLO, json.dumps({"pid": os.getpid()}).encode()])
        if not socket.poll(int(timeout * 1000), zmq.POLLIN):
            raise ConfigError(f"no TTS engine process answers at {endpoint} ([engine] endpoints)")
        kind, payload = socket.recv_multipart()[:2]
        if kind != ipc.HELLO:
            raise ConfigError(f"{endpoint} does not speak the engine protocol")
        socket.send_multipart([ipc.BYE])
        return json.loads(payload)
    finally:
        socket.close(linger=100)
        context.term()
