"""The session runner: a Session carried out in the event loop with a responder, Silero VAD in its batcher and a
send coroutine, as a transport runs it (no socket)."""

from __future__ import annotations

import asyncio
import base64
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from gateway.core.responder import AudioOut, BackendError
from gateway.core.vad import WINDOW_MS
from gateway.realtime.session import Session
from gateway.responders.echo import EchoResponder
from gateway.runtime.session_runner import SessionRunner
from gateway.runtime.silero import SileroModel, SileroVAD, VadBatcher
from tests.conftest import load_pcm, make_config, silence, types
from tests.helpers.session import SECOND


async def test_a_failed_response_sends_all_its_closing_events_over_a_slow_connection():
    """The response's own task sends its last events when its responder fails: stopping the response must
    not cancel that task while a send waits on a slow connection."""

    class Failing:
        reads_transcripts = False
        voices = None

        async def respond(self, request, transcripts):
            yield AudioOut(SECOND)
            raise BackendError("llm", "stream broken")

    sent: list[dict] = []

    async def slow_send(message: str) -> None:
        await asyncio.sleep(0.002)  # the socket's buffer is full: every send yields to the loop
        sent.append(orjson.loads(message))

    runner = SessionRunner(Session(make_config(vad__enabled=False)), Failing(), None, slow_send)
    await runner.start()
    await runner.receive(orjson.dumps({"type": "response.create"}))
    for _ in range(200):
        if sent and sent[-1]["type"] == "response.done":
            break
        await asyncio.sleep(0.01)
    assert sent[-1]["type"] == "response.done" and sent[-1]["response"]["status"] == "failed"
    await runner.close()


class SlowExecutor(ThreadPoolExecutor):
    """The VAD's thread, 150 ms late with every batch: a GPU box busy with TTS, or a small CPU."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        self.calls += 1

        def late():
            time.sleep(0.15)
            return fn(*args, **kwargs)

        return super().submit(late)


async def run_turn(executor: SlowExecutor | None, commit_early: bool = False,
                   now: bool = False) -> tuple[list[dict], float]:
    """The session runner fed a spoken sentence and silence as 20 ms appends, as fast as it takes them (with
    ``now``, each by receive_now first, as the WebSocket server hands them over).

    Returns the events sent and the seconds the appends took."""
    sent: list[dict] = []

    async def record(message: str) -> None:
        sent.append(orjson.loads(message))

    session = Session(make_config())
    batcher = VadBatcher(executor) if executor else None
    runner = SessionRunner(session, EchoResponder(pace=0), SileroVAD(SileroModel()), record, batcher)
    await runner.start()

    async def receive(message: bytes) -> None:
        if not (now and runner.receive_now(message)):
            await runner.receive(message)

    audio = load_pcm("one_sentence.wav")
    start = time.perf_counter()
    for i in range(0, len(audio), 960):
        await receive(append(audio[i : i + 960]))
    if commit_early:
        await receive(orjson.dumps({"type": "input_audio_buffer.commit"}))
    for _ in range(75):  # 1.5 s
        await receive(append(silence(20)))
    took = time.perf_counter() - start
    # Done once the VAD has judged every whole window of the input (no turn event can come after that) and a
    # turn it ended has been answered.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while session.input.received_ms - session.input.heard_ms >= WINDOW_MS or (
        "input_audio_buffer.speech_stopped" in types(sent) and "response.done" not in types(sent)
    ):
        assert loop.time() < deadline, types(sent)
        await asyncio.sleep(0.01)
    await runner.close()
    if executor:
        executor.shutdown()
    return sent, took


def append(pcm: bytes) -> bytes:
    return orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def turn_times(sent: list[dict]) -> list[tuple[str, int]]:
    return [(e["type"], e.get("audio_start_ms", e.get("audio_end_ms"))) for e in sent
            if e["type"] in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped")]


async def test_a_slow_vad_holds_up_no_append_and_finds_the_same_turn():
    """Appends are taken without waiting for the VAD; audio that arrives during a VAD call goes into the
    next one, so the session catches up, and its turn events carry the same input-audio times."""
    reference, _ = await run_turn(None)
    executor = SlowExecutor()
    sent, took = await run_turn(executor)
    assert turn_times(reference) == turn_times(sent) and len(turn_times(sent)) == 2
    # One call per append would take 115 x 150 ms; these took a handful of calls.
    assert took < 1.0 and executor.calls <= 10


async def test_a_commit_ahead_of_the_vad_takes_the_speech_with_it():
    """Speech the VAD had not reached when the client committed starts no second turn afterwards."""
    sent, _ = await run_turn(SlowExecutor(), commit_early=True)
    assert "input_audio_buffer.committed" in [e["type"] for e in sent]
    assert turn_times(sent) == []


async def test_appends_taken_as_they_arrive_find_the_same_turn_and_answer():
    reference, _ = await run_turn(None)
    sent, _ = await run_turn(SlowExecutor(), now=True)
    assert turn_times(sent) == turn_times(reference) and len(turn_times(sent)) == 2
    assert types(sent) == types(reference)


async def test_a_message_taken_as_it_arrives_keeps_its_place_before_those_that_wait():
    """receive_now carries out an append at once; an event whose effects wait (a send over a slow connection)
    is carried out by a task, and until it is done receive_now takes nothing and receive waits for it."""
    sent: list[dict] = []

    async def slow_send(message: str) -> None:
        await asyncio.sleep(0.05)
        sent.append(orjson.loads(message))

    session = Session(make_config())
    runner = SessionRunner(session, EchoResponder(pace=0), SileroVAD(SileroModel()), slow_send, VadBatcher(None))
    assert runner.receive_now(append(silence(20)))
    assert session.input.received_ms == 20 and sent == []  # fed to the VAD, nothing to send
    update = {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}
    assert runner.receive_now(orjson.dumps(update))
    assert not runner.receive_now(append(silence(20)))  # session.updated is still being sent
    assert session.input.received_ms == 20
    clear = asyncio.create_task(runner.receive(orjson.dumps({"type": "input_audio_buffer.clear"})))
    await asyncio.sleep(0)
    assert not runner.receive_now(append(silence(20)))  # a receive is under way
    await clear
    assert types(sent) == ["session.updated", "input_audio_buffer.cleared"]
    assert runner.receive_now(append(silence(20))) and session.input.received_ms == 40
    await runner.close()
