"""The load generator every suite shares: processes of plain clients, each process timing its own lag.

``Pool`` is a set of spawned processes, started before any level (a process starting during a level would
spread that level's burst over its own start), optionally pinned to cores of their own (``--client-cpus``:
as if on another host). Each process runs its share of a level in one asyncio loop with a 10 ms timer in it
(bench/stats.py): how late the timer fires is the process's lag, reported per process beside the figures
(bench/validity.py judges it).

The realtime sessions (``run_sessions``): plain ``websockets`` clients that stream fixture speech in 20 ms
appends on a real-time clock, one scenario per responder, repeated ``cycles`` times:

echo      turn 1 is answered in full; turn 2's echo is interrupted by turn 3 (barge-in); turn 3 answered.
pipeline  turn 1's reply is interrupted by turn 2 (barge-in); turn 2's reply is stopped by response.cancel
          300 ms after its first audio.

Sessions start at the arrivals of a Poisson process spread over ``spread`` seconds (one scenario's length by
default, so turns end at random moments), or all in the same instant (aligned: the worst case). Each connects
CONNECT_LEAD_S ahead of its start; one that is not connected by then is a late start. What each session
measures: speech_stopped → first audio delta, VAD lateness (speech_stopped after the append that completed the
silence was sent), barge-in (speech_started → the interrupted response's done), cancel → last delta, audio
lost or reordered (echo: the reply is the committed audio, byte for byte, in 10 sessions; all: no delta of a
response after its response.done), and how late each append went out on its clock.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import multiprocessing
import os
import random
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import cpu_list, lag_probe, pct

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
CHUNK_MS = 20
DELTA_TYPES = ("response.output_audio.delta", "response.audio.delta")
CONNECT_LEAD_S = 2.0  # a session connects this long before its first audio
# The fake LLM's reply (bench/fake_openai.py): two sentences, so the TTS speaks more than one segment.
REPLY = "Sure. The weather tomorrow looks sunny with a light breeze, and it should stay warm until the evening."


def load_pcm(name: str) -> bytes:
    """A fixture WAV (tests/fixtures) as pcm16 mono 24 kHz."""
    with wave.open(str(FIXTURES / name)) as w:
        return w.readframes(w.getnframes())


def silence(ms: int) -> bytes:
    return bytes(48 * ms)


def scenario(responder: str) -> bytes:
    sentence = load_pcm("one_sentence.wav")
    if responder == "echo":
        return sentence + silence(4000) + sentence + silence(500) + sentence + silence(4000)
    return sentence + silence(1200) + sentence + silence(5000)


def scenario_s(responder: str) -> float:
    return len(scenario(responder)) / 48000


class Pool:
    """`processes` spawned load-generator processes (on `cpus`, "" = any core), started at once."""

    def __init__(self, processes: int, cpus: str = "") -> None:
        self.processes = processes
        pinned: dict[str, Any] = {}
        if cpus:
            pinned = {"initializer": os.sched_setaffinity, "initargs": (0, cpu_list(cpus))}
        # spawn: each starts clean, with no copy of this process's state
        self.executor = concurrent.futures.ProcessPoolExecutor(
            processes, mp_context=multiprocessing.get_context("spawn"), **pinned)
        for started in [self.executor.submit(time.sleep, 0.2) for _ in range(processes)]:
            started.result()

    def map(self, fn: Callable[..., Any], shares: list[tuple[Any, ...]]) -> list[Any]:
        """fn(*share) for each share, one per process, all at once; their results in order."""
        return [f.result() for f in [self.executor.submit(fn, *share) for share in shares]]

    def close(self) -> None:
        self.executor.shutdown(cancel_futures=True)


@dataclass
class Sessions:
    """What a level's sessions measured (one process's, or merged)."""

    first_delta_ms: list[float] = field(default_factory=list)
    barge_in_ms: list[float] = field(default_factory=list)
    cancel_to_last_delta_ms: list[float] = field(default_factory=list)
    audio_errors: list[str] = field(default_factory=list)
    responses: dict[str, str] = field(default_factory=dict)
    stop_late_ms: list[float] = field(default_factory=list)  # speech_stopped after the audio that ended it
    send_late_ms: list[float] = field(default_factory=list)  # each append after its time on the client's clock
    lag_p99_ms: list[float] = field(default_factory=list)  # each load-generator process's
    # bench/live_load.py's, timed from the end of speech in the audio sent
    end_to_audio_ms: list[float] = field(default_factory=list)
    delegation_ms: list[float] = field(default_factory=list)  # Live: delegation.created -> its commentary heard
    vad_end_offset_ms: list[float] = field(default_factory=list)  # Realtime: speech_stopped's audio_end_ms - it
    late_starts: int = 0  # sessions whose connection was not ready at their start time
    # bench/sip_load.py's: why each call that was not answered was not, and each answered call's timings
    unanswered: list[str] = field(default_factory=list)
    sip_calls: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: dict[str, Any]) -> None:
        for f in dataclasses.fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, list):
                mine += other[f.name]
            elif isinstance(mine, dict):
                mine.update(other[f.name])
            else:
                setattr(self, f.name, mine + other[f.name])

    def load(self) -> dict[str, Any]:
        """The load generator's own figures (bench/validity.py reads them)."""
        return {"client_lag_p99_ms": max(self.lag_p99_ms, default=None), "client_processes": len(self.lag_p99_ms),
                "client_send_late_p99_ms": pct(self.send_late_ms, 99), "late_starts": self.late_starts}


def append_messages(timeline: bytes) -> list[str]:
    """The timeline as append events, encoded once: every session sends the same audio."""
    step = 48 * CHUNK_MS
    return ['{"type":"input_audio_buffer.append","audio":"' + base64.b64encode(timeline[i : i + step]).decode()
            + '"}' for i in range(0, len(timeline), step)]


async def run_session(url: str, timeline: bytes, messages: list[str], responder: str, cycles: int, start_at: float,
                      check_audio: bool, result: Sessions) -> None:
    """One session: connects CONNECT_LEAD_S before `start_at` (loop time), streams `messages` from then."""
    import orjson  # the load generator's processes only
    import websockets

    loop = asyncio.get_running_loop()
    await asyncio.sleep(start_at - CONNECT_LEAD_S - loop.time())
    expected_responses = (3 if responder == "echo" else 2) * cycles
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
        speech: dict[str, tuple[int, int]] = {}  # item id -> (audio_start_ms, audio_end_ms)
        replies: dict[str, bytearray] = {}
        response_item: dict[str, str] = {}  # response id -> the user item it answers
        last_user_item: str | None = None
        stopped_at: float | None = None
        started_at: float | None = None
        done: dict[str, float] = {}
        first_delta: dict[str, float] = {}
        last_delta: dict[str, float] = {}
        cancel_sent: dict[str, float] = {}
        responses_seen = 0
        silence_ms = 0
        cancels: list[asyncio.Task[None]] = []
        t0 = start_at

        async def cancel_later(rid: str) -> None:
            await asyncio.sleep(0.3)
            cancel_sent[rid] = loop.time()
            await ws.send('{"type":"response.cancel"}')

        async def reader() -> None:
            nonlocal last_user_item, stopped_at, started_at, responses_seen, silence_ms
            async for raw in ws:
                now = loop.time()
                ev = orjson.loads(raw)
                kind = ev["type"]
                if kind == "session.created":
                    silence_ms = ev["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"]
                elif kind == "input_audio_buffer.speech_started":
                    speech[ev["item_id"]] = (ev["audio_start_ms"], -1)
                    started_at = now
                elif kind == "input_audio_buffer.speech_stopped":
                    speech[ev["item_id"]] = (speech[ev["item_id"]][0], ev["audio_end_ms"])
                    last_user_item, stopped_at = ev["item_id"], now
                    # The append that completed the silence was sent on the client's real-time clock.
                    result.stop_late_ms.append((now - t0) * 1000 - ev["audio_end_ms"] - silence_ms)
                elif kind == "response.created":
                    rid = ev["response"]["id"]
                    responses_seen += 1
                    response_item[rid] = last_user_item or ""
                    replies[rid] = bytearray()
                elif kind in DELTA_TYPES:
                    rid = ev["response_id"]
                    if rid in done:
                        result.audio_errors.append(f"delta after response.done of {rid}")
                    if check_audio:
                        replies[rid] += base64.b64decode(ev["delta"])
                    last_delta[rid] = now
                    if rid not in first_delta:
                        first_delta[rid] = now
                        if stopped_at is not None:
                            result.first_delta_ms.append((now - stopped_at) * 1000)
                        if responder == "pipeline" and responses_seen % 2 == 0:
                            cancels.append(asyncio.create_task(cancel_later(rid)))
                elif kind == "response.done":
                    rid = ev["response"]["id"]
                    done[rid] = now
                    result.responses[rid] = ev["response"]["status"]
                    reason = (ev["response"].get("status_details") or {}).get("reason")
                    if reason == "turn_detected" and started_at is not None:
                        result.barge_in_ms.append((now - started_at) * 1000)
                        cancel_sent[rid] = started_at
                    if len(done) == expected_responses:
                        return
                elif kind == "error":
                    result.audio_errors.append(f"error event: {ev['error']['message']}")

        read = asyncio.create_task(reader())
        if loop.time() > start_at:
            result.late_starts += 1
        t0 = max(start_at, loop.time())
        for i, message in enumerate(messages):
            due = t0 + i * CHUNK_MS / 1000
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            result.send_late_ms.append((loop.time() - due) * 1000)
            await ws.send(message)
        try:
            await asyncio.wait_for(read, 15.0)  # the last reply's tail
        except TimeoutError:
            result.audio_errors.append(f"session ended with {len(done)} of {expected_responses} responses")
    for rid, t_cancel in cancel_sent.items():
        result.cancel_to_last_delta_ms.append(max(0.0, (last_delta.get(rid, 0.0) - t_cancel) * 1000))
    if responder == "echo" and check_audio:
        for rid, reply in replies.items():
            start, end = speech.get(response_item.get(rid, ""), (0, -1))
            expected = timeline[start * 48 : end * 48]
            complete = result.responses.get(rid) == "completed"
            if (complete and abs(len(reply) - len(expected)) > 2) or reply != expected[: len(reply)]:
                result.audio_errors.append(f"{rid}: echo differs from the committed audio")


def session_process(url: str, plan: list[tuple[float, bool]], zero: float, responder: str, cycles: int) -> dict:
    """One load-generator process: its sessions, each (start offset from the wall time `zero`, check audio)."""

    async def run() -> Sessions:
        result = Sessions()
        loop = asyncio.get_running_loop()
        timeline = scenario(responder) * cycles
        messages = append_messages(timeline)
        lags: list[float] = []
        probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
        base = loop.time() - time.time() + zero  # wall time `zero` on this loop's clock
        await asyncio.gather(*(run_session(url, timeline, messages, responder, cycles, base + offset, check,
                                           result) for offset, check in plan))
        probe.cancel()
        result.lag_p99_ms.append(pct(lags, 99))
        return result

    return dataclasses.asdict(asyncio.run(run()))


def arrivals(n: int, spread: float, aligned: bool, rng: random.Random) -> list[float]:
    """Start offsets: one instant for all, or a Poisson process of rate n / spread."""
    if aligned:
        return [0.0] * n
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(n / spread)
    return offsets


def run_sessions(pool: Pool, url: str, n: int, responder: str, cycles: int, spread: float, aligned: bool,
                 seed: int) -> tuple[Sessions, float, float]:
    """n sessions over the pool's processes; what they measured, and the level's start and end (wall time)."""
    offsets = arrivals(n, spread or scenario_s(responder), aligned, random.Random(seed))
    # The client shares the machine with the gateway: it checks the echoed bytes of 10 sessions only.
    plan = [(offset, i < 10) for i, offset in enumerate(offsets)]
    return spread_over(pool, session_process, url, plan, responder, cycles)


def spread_over(pool: Pool, work: Callable[..., Sessions], target: Any, plan: list[Any], responder: str,
                cycles: int) -> tuple[Sessions, float, float]:
    """A level's sessions (``plan``, one entry each) dealt over the pool's processes, each running ``work`` on
    its share; what they measured, and the level's start and end (wall time)."""
    zero = time.time() + CONNECT_LEAD_S + 1.0 + len(plan) * 0.002  # time to connect every session first
    start = time.time()
    shares = [(target, plan[k :: pool.processes], zero, responder, cycles) for k in range(pool.processes)
              if plan[k :: pool.processes]]
    result = Sessions()
    for part in pool.map(work, shares):
        result.merge(part)
    return result, start, time.time()


class Answers(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection of the load generator, one request at a time, its answers parsed by
    httptools (uvicorn's parser). Not aiohttp: its own work on each answer, with 64 answers starting at once in
    one process, queued up and was measured as the gateway's outbound end. Here an answer's first body byte is
    timed in the read that brings it, before anything else of it."""

    def __init__(self) -> None:
        import httptools  # the load generator's processes only

        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[dict[str, Any]] | None = None
        self.row: dict[str, Any] = {}
        self.error = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def ask(self, head: bytes, body: bytes, tag: str) -> asyncio.Future[dict[str, Any]]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.row, self.error = {"id": tag, "first": None, "bytes": 0}, bytearray()
        self.transport.write(head + body)
        self.row["sent"] = time.perf_counter()  # written to the socket: the client's own work before is not HTTP's
        return self.answer

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools.HttpParserError: the answer cannot be read
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionError("the gateway closed the connection"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"server-timing":
            timing = dict(p.strip().split(";dur=") for p in value.decode().split(",") if p)
            self.row["audio_ms"] = float(timing.get("audio", "nan"))
            self.row["queue_ms"] = float(timing.get("queue", "nan"))

    def on_headers_complete(self) -> None:
        self.row["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.row["status"] != 200:
            self.error += body[:200]
        elif self.row["first"] is None:
            self.row["first"] = time.perf_counter()
        self.row["bytes"] += len(body)

    def on_message_complete(self) -> None:
        self.row["end"] = time.perf_counter()
        if self.row["status"] != 200:
            self.row = {"id": self.row["id"], "status": self.row["status"],
                        "error": self.error.decode(errors="replace")[:200]}
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            if exc is None:
                answer.set_result(self.row)
            else:
                answer.set_exception(exc)


def speech_process(url: str, body: dict[str, Any], clients: int, requests: int,
                   seed: int) -> tuple[list[dict[str, Any]], float]:
    """One load-generator process of POST `url` (the speech API): `clients` clients, each making `requests`
    requests of `body` (its own seed each) back to back on a kept-alive connection, opened and answering one
    GET /healthz first (a connection's set-up is not the HTTP path's: a connection is the gateway's once a worker
    has it). Each request is tagged X-Bench-Id (gateway-side times, bench/serve.py --time-http). The rows, and
    this process's own lag P99 (ms: how late it was at reading what the gateway sent)."""
    import json
    from urllib.parse import urlsplit

    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None

    async def run() -> tuple[list[dict[str, Any]], float]:
        loop = asyncio.get_running_loop()
        rng = random.Random(seed)
        lags: list[float] = []

        async def client(k: int, connection: Answers) -> list[dict[str, Any]]:
            rows = []
            for n in range(requests):
                payload = json.dumps({**body, "seed": rng.randrange(2**32)}).encode()
                tag = f"{seed}-{k}-{n}"
                head = (f"POST {address.path} HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json"
                        f"\r\nContent-Length: {len(payload)}\r\nX-Bench-Id: {tag}\r\n\r\n").encode()
                rows.append(await asyncio.wait_for(connection.ask(head, payload, tag), 900))
            return rows

        connections = [c for _, c in await asyncio.gather(
            *(loop.create_connection(Answers, address.hostname, address.port) for _ in range(clients)))]
        ready = f"GET /healthz HTTP/1.1\r\nHost: {address.netloc}\r\n\r\n".encode()
        await asyncio.gather(*(c.ask(ready, b"", "ready") for c in connections))
        probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
        try:
            rows = [r for rs in await asyncio.gather(*(client(k, c) for k, c in enumerate(connections))) for r in rs]
        finally:
            probe.cancel()
            for connection in connections:
                if connection.transport is not None:
                    connection.transport.close()
        return rows, pct(lags, 99)

    return asyncio.run(run())
