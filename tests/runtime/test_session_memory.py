"""A session that ends is freed at once, by reference counting: its Session, SessionRunner, conversation and their
audio wait in no reference cycle for the collector. Such garbage, old by the time its session ends, waits for a
full collection, which comes rarely: six 900 s sessions once held some 260 MB until one came.

Sessions on a real gateway over real WebSockets, with minutes of speech pushed as fast as the server takes it,
with the collector off: turns answered and cut short (barge-in), a client that leaves mid-response, responses
whose LLM or STT fails."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import gc
import logging
import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets

from bench.fake_openai import FakeOpenAI
from tests.conftest import Served, load_pcm, silence

MIB = 1024 * 1024
SPEECH_S = 120  # of audio per long session


def rss() -> int:
    """This process's resident memory, once the C allocator has given back what it holds free (glibc's)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) * 1024


def speech(seconds: float) -> bytes:
    """Turns of speech and pause, ``seconds`` of them."""
    turn = load_pcm("one_sentence.wav") + silence(900)
    return (turn * int(seconds * 48_000 / len(turn) + 1))[: int(seconds * 48_000)]


class Watched:
    """Weak references to every session a gateway opens: its runner, session, conversation and items."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[Any]] = []
        self._seen: set[str] = set()

    def look(self, gateway: Served) -> None:
        for runner in list(gateway.sessions):
            session = runner.session
            self._watch(runner, session, session.conversation)
            self._watch(*session.conversation.items())  # Items hold the conversation's audio

    def _watch(self, *objects: Any) -> None:
        for obj in objects:
            key = f"{type(obj).__name__}:{id(obj)}"
            if key not in self._seen:
                self._seen.add(key)
                self.refs.append(weakref.ref(obj))

    def alive(self) -> list[str]:
        return [type(obj).__name__ for ref in self.refs if (obj := ref()) is not None]


async def talk(gateway: Served, watched: Watched, seconds: float, leave_mid_response: bool = False) -> int:
    """A session that sends ``seconds`` of speech at once, in one-second appends, then waits for the answers (or
    leaves at the first audio); the number of responses that ended."""
    done = 0
    async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime", max_size=None) as ws:
        await ws.recv()  # session.created
        pcm = speech(seconds)
        for i in range(0, len(pcm), 48_000):
            audio = base64.b64encode(pcm[i : i + 48_000]).decode()
            await ws.send(orjson.dumps({"type": "input_audio_buffer.append", "audio": audio}).decode())
            watched.look(gateway)
        while True:
            try:
                event = orjson.loads(await asyncio.wait_for(ws.recv(), 1.5))
            except TimeoutError:
                break
            watched.look(gateway)
            done += event["type"] == "response.done"
            if leave_mid_response and event["type"] == "response.output_audio.delta":
                ws.transport.abort()
                break
    for _ in range(100):
        if not gateway.sessions:
            break
        await asyncio.sleep(0.05)
    assert not gateway.sessions
    return done


@contextmanager
def collector_off() -> Iterator[None]:
    """No collection meanwhile, and no warning logged: pytest keeps the records it captures, and a failure's
    record holds the failure, its traceback and frames (a process's log handler lets go of them)."""
    gc.collect()
    gc.disable()
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        gc.enable()


def cycles_of_ours() -> list[str]:
    """The gateway's objects that only the collector frees now (in reference cycles)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                        if type(o).__module__.startswith("gateway.")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read the RSS")
async def test_a_session_that_ends_is_freed_without_the_collector(start_pipeline):
    async with FakeOpenAI(reply="Sure, here is a reply of a few words.") as fake, \
            FakeOpenAI(llm_failure="500") as llm_down, FakeOpenAI(stt_failure="500") as stt_down:
        gateway = await start_pipeline(fake)
        failing = [await start_pipeline(llm_down), await start_pipeline(stt_down)]
        watched = Watched()
        assert await talk(gateway, watched, SPEECH_S) > 5  # warm: the models' and allocator's own memory
        fake.requests.clear()
        start = rss()
        with collector_off():
            watched = Watched()
            answered = []
            for _ in range(2):
                answered.append(await talk(gateway, watched, SPEECH_S))
                fake.requests.clear()  # the fake keeps every request's audio: this process's memory too
            await talk(gateway, watched, 10, leave_mid_response=True)
            failed = [await talk(other, watched, 10) for other in failing]
            alive = watched.alive()
            grown = rss() - start
            print(f"responses {answered} and {failed}; RSS {start / MIB:.0f} MiB, then {grown / MIB:+.1f} MiB")
        assert all(n > 5 for n in answered) and all(n >= 1 for n in failed), (answered, failed)
        assert len(watched.refs) > 50  # five sessions' runners, sessions, conversations and items
        assert alive == [], alive  # freed by reference counting, the collector being off
        assert cycles_of_ours() == []
        # Two long sessions' audio, heard and said, is some 20 MiB: none of it is kept (kept in cycles until a
        # collection, some 12 MiB of it stayed resident).
        assert grown < 8 * MIB


async def test_a_webrtc_call_that_ends_is_freed_without_the_collector(start_gateway):
    """A call's peer connection, playout and runner call back into it: none of them keeps it (its session, its
    audio) alive once it ends."""
    pytest.importorskip("aiortc")
    from gateway.responders.echo import EchoResponder
    from tests.transports.test_webrtc import RtcClient, session_count

    gateway = await start_gateway(EchoResponder(pace=1.5), webrtc__enabled=True)

    async def call(watched: list[weakref.ref[Any]]) -> None:
        client = RtcClient(f"http://127.0.0.1:{gateway.port}")
        try:
            await client.connect()
            await client.until("session.created")
            (opened,) = gateway.webrtc.calls.values()
            # (Not its RTCPeerConnection: aiortc's own objects hold one another.)
            watched += [weakref.ref(o) for o in (opened, opened.runner, opened.session, opened.playout)]
            del opened
            client.mic.say(load_pcm("one_sentence.wav") + silence(600))
            await client.until("output_audio_buffer.started", timeout=20)
            client.mic.say(load_pcm("one_sentence.wav")[: 48 * 1500])  # over the reply: a barge-in
            assert (await client.until("response.done", timeout=20))[-1]["response"]["status"] == "cancelled"
            assert await client.hang_up() == 204
        finally:
            await client.close()
        assert await session_count(gateway, 0) == 0 and not gateway.webrtc.calls

    await call([])  # warm
    with collector_off():
        watched: list[weakref.ref[Any]] = []
        await call(watched)
        await asyncio.sleep(0.5)  # aiortc's own tasks end
        alive = [type(obj).__name__ for ref in watched if (obj := ref()) is not None]
    assert alive == [], alive
    assert cycles_of_ours() == []
