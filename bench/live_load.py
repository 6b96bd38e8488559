"""The load side of GPT-Live sessions (/v1/live/sessions), and of Realtime sessions timed the same way.

One rule aligns both protocols. A client streams its audio in 20 ms appends on a real-time clock from t0 (the
first append's due time): audio position p ms is due at t0 + p / 1000. The user's speech is read from that audio
itself (``speech_spans``: samples above SILENT, stretches apart by more than GAP_MS of silence), never from a
server's event: Live sends none (no speech_started or speech_stopped), and Realtime's speech_stopped comes after
its detector's wait. Our speech is heard from the arrival of the first output delta with a sample above SILENT,
plus that sample's place in the delta (``audible``): on Live, in the continuous 100 ms
session.output_audio.delta stream (silence included); on Realtime, in a reply's response.output_audio.delta
events. Audio heard answers the turn whose speech ended last before it (``turn_of``), once per turn.

- end of speech → first audio (``end_to_audio_ms``): heard − (t0 + the end of the turn's speech);
- barge-in (Live, ``barge_in_ms``): the user's speech starting while ours is heard → the last audible sample of
  ours (speech stops at the gateway's next tick, and no event says so);
- delegation round trip (Live, client mode, ``delegation_ms``): session.delegation.created's arrival → the first
  audible audio after it; the client appends its commentary at once, and the voice model (the fakes'
  ``--delegate``) delegates without a word, so that audio is the commentary's, whose words must come back in the
  output transcript.

Scenarios (``timeline``): "capacity" is the gateway suite's pipeline scenario (turn 1's reply cut by turn 2, turn
2 answered); "turns" a sentence and TURN_GAP_MS of silence, each turn answered in full; "delegation" the same with
DELEGATION_GAP_MS, each turn delegated. Realtime sessions run the same audio with semantic_vad at "high", the
detector Live's ``[live] eagerness`` gives its sessions.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from bench.load import CONNECT_LEAD_S, REPLY, Pool, Sessions, arrivals, load_pcm, scenario, silence
from bench.stats import lag_probe, pct

SILENT = 64  # |sample| at or under this is silence (-54 dBFS): the fixtures' speech and the TTS are far louder
GAP_MS = 500  # silence that separates two stretches of speech (the fixture's words are closer)
TURN_GAP_MS = 2000
DELEGATION_GAP_MS = 3000
APPEND_MS = 20
LIVE_DELTA_BYTES = 4800  # 100 ms of pcm16 24 kHz, the session format the clients ask for
# Most of a Live session's deltas are silence, each the same string: known without decoding it (the load side
# reads ten deltas a second per session).
SILENT_DELTA = base64.b64encode(bytes(LIVE_DELTA_BYTES)).decode()
SHORT_REPLY = "Sure, it looks sunny tomorrow."  # the "turns" scenario's reply: done well before the next turn
COMMENTARY = "The staging status is green and every check passed."
END_WAIT_S = 15.0  # after the last append: the last reply's tail (Realtime), the last ticks (Live)


def timeline(name: str, repeats: int) -> bytes:
    if name == "capacity":
        return scenario("pipeline") * repeats
    gap = {"turns": TURN_GAP_MS, "delegation": DELEGATION_GAP_MS}[name]
    return (load_pcm("one_sentence.wav") + silence(gap)) * repeats


def reply_text(name: str) -> str:
    """What the fake LLM says in a scenario."""
    return REPLY if name == "capacity" else SHORT_REPLY


def speech_spans(pcm: bytes, level: int = SILENT, gap_ms: int = GAP_MS, rate: int = 24000,
                 ) -> list[tuple[float, float]]:
    """(start, end) in ms of each stretch of speech in ``pcm`` (pcm16 mono at ``rate``): its first and past its last
    sample above ``level``, stretches apart by more than ``gap_ms`` of quieter samples."""
    per_ms = rate / 1000
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, np.int16).astype(np.int32)) > level)
    if not len(loud):
        return []
    breaks = np.flatnonzero(np.diff(loud) > gap_ms * per_ms)
    starts = np.r_[loud[0], loud[breaks + 1]]
    ends = np.r_[loud[breaks], loud[-1]] + 1
    return [(float(s) / per_ms, float(e) / per_ms) for s, e in zip(starts, ends, strict=True)]


def audible(pcm: bytes, level: int = SILENT, rate: int = 24000) -> tuple[float, float] | None:
    """(first, past the last) ms of ``pcm`` (pcm16 at ``rate``) above ``level``; None for silence."""
    per_ms = rate / 1000
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, np.int16).astype(np.int32)) > level)
    return None if not len(loud) else (float(loud[0]) / per_ms, float(loud[-1] + 1) / per_ms)


def delta_span(delta: str, result: Sessions) -> tuple[float, float] | None:
    """``audible`` of a Live delta, noting one that is not 100 ms long as an audio error."""
    audio = base64.b64decode(delta)
    if len(audio) != LIVE_DELTA_BYTES:
        result.audio_errors.append(f"a delta of {len(audio)} bytes, not 100 ms")
    return audible(audio)


def turn_of(spans: list[tuple[float, float]], position_ms: float) -> int | None:
    """The turn that output heard at ``position_ms`` (of the client's audio) answers: the last one whose speech
    ended at or before it; None before the first."""
    ended = [k for k, (_, end) in enumerate(spans) if end <= position_ms]
    return ended[-1] if ended else None


def turn_ends(pcm: bytes) -> list[float]:
    """Where each turn of ``pcm`` can end at the earliest (ms of the audio): where the gateway's own VAD
    (gateway.core.vad on Silero, [vad] and [semantic_vad] as configured) puts the end of its speech, plus the
    pause that must follow before Smart Turn is asked ([semantic_vad] pause_ms). Realtime's VAD lateness is
    measured from the same point (audio_end_ms + silence); turns depend on the audio alone, so this is exact."""
    from gateway.config import load_config
    from gateway.core.vad import SpeechStopped, TurnDetector
    from gateway.runtime.silero import SileroModel, SileroVAD

    config = load_config(env={})
    vad, pause_ms = config.vad, config.semantic_vad.pause_ms
    detector = TurnDetector(vad.threshold, vad.prefix_padding_ms, pause_ms, vad.min_speech_ms)
    stops = [ev.audio_end_ms for ev in detector.feed(SileroVAD(SileroModel.shared()).process(pcm))
             if isinstance(ev, SpeechStopped)]
    out = []
    for start, end in speech_spans(pcm):
        mine = [stop for stop in stops if start < stop <= end + GAP_MS]
        out.append((max(mine) if mine else end) + pause_ms)
    return out


def nearest(spans: list[tuple[float, float]], end_ms: float) -> int:
    """The turn whose speech ends nearest ``end_ms`` (a speech_stopped's audio_end_ms)."""
    return min(range(len(spans)), key=lambda k: abs(spans[k][1] - end_ms))


def runs(deltas: list[tuple[float, tuple[float, float] | None]]) -> list[tuple[float, float]]:
    """(first, last) heard of each run of our speech in a Live session's delta stream, deltas given as (arrival,
    ``audible``'s span or None): a silent delta ends a run."""
    out: list[tuple[float, float]] = []
    talking = False
    for at, span in deltas:
        if span is None:
            talking = False
        elif talking:
            out[-1] = (out[-1][0], at + span[1] / 1000)
        else:
            out.append((at + span[0] / 1000, at + span[1] / 1000))
            talking = True
    return out


def answers(spans: list[tuple[float, float]], t0: float, heard: list[float]) -> dict[int, float]:
    """End of speech → first audio (ms) per turn answered, from the moments our speech was first heard (wall
    time, a reply's or a run's start)."""
    out: dict[int, float] = {}
    for at in sorted(heard):
        k = turn_of(spans, (at - t0) * 1000)
        if k is not None and k not in out:
            out[k] = (at - t0) * 1000 - spans[k][1]
    return out


def barge_ins(spans: list[tuple[float, float]], t0: float, heard: list[tuple[float, float]]) -> list[float]:
    """For each turn but the first that starts while our speech is heard: its start → our last audible sample
    (ms)."""
    out = []
    for start, _ in spans[1:]:
        at = t0 + start / 1000
        out += [(last - at) * 1000 for first, last in heard if first < at < last]
    return out


def append_messages(pcm: bytes, protocol: str) -> list[str]:
    kind = "session.input_audio.append" if protocol == "live" else "input_audio_buffer.append"
    step = 48 * APPEND_MS
    return [f'{{"type":"{kind}","audio":"' + base64.b64encode(pcm[i : i + step]).decode() + '"}'
            for i in range(0, len(pcm), step)]


async def stream(ws: Any, messages: list[str], start_at: float, result: Sessions) -> float:
    """Send the appends on a real-time clock from ``start_at`` (loop time); returns t0, the first one's due time."""
    loop = asyncio.get_running_loop()
    if loop.time() > start_at:
        result.late_starts += 1
    t0 = max(start_at, loop.time())
    for i, message in enumerate(messages):
        due = t0 + i * APPEND_MS / 1000
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)
        result.send_late_ms.append((loop.time() - due) * 1000)
        await ws.send(message)
    return t0


async def live_session(url: str, name: str, pcm: bytes, messages: list[str], start_at: float, result: Sessions,
                       ends: list[float] | None = None) -> None:
    """One Live session: session.start CONNECT_LEAD_S before ``start_at`` (loop time), the audio from then, then
    session.close once the timeline's ticks are in. With ``ends`` (``turn_ends``), each turn's first audio is
    also timed from there (``first_delta_ms``: the gateway suite's turn end → first audio)."""
    import orjson  # the load generator's processes only
    import websockets

    loop = asyncio.get_running_loop()
    await asyncio.sleep(start_at - CONNECT_LEAD_S - loop.time())
    spans = speech_spans(pcm)
    deltas: list[tuple[float, tuple[float, float] | None]] = []
    created: float | None = None  # a delegation waiting for its commentary to be heard
    delegated = 0
    transcript: list[str] = []
    ticks = len(pcm) // 48 // 100
    ticked = asyncio.Event()
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
        await ws.send(orjson.dumps({"type": "session.start", "session": {
            "model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 24000}}}}).decode())
        started = loop.create_future()

        async def reader() -> None:
            nonlocal created, delegated
            async for raw in ws:
                now = loop.time()
                ev = orjson.loads(raw)
                kind = ev["type"]
                if kind == "session.output_audio.delta":
                    span = None if ev["delta"] == SILENT_DELTA else delta_span(ev["delta"], result)
                    deltas.append((now, span))
                    if span is not None and created is not None:
                        result.delegation_ms.append((now + span[0] / 1000 - created) * 1000)
                        created, delegated = None, delegated + 1
                    if len(deltas) >= ticks:
                        ticked.set()
                elif kind == "session.started":
                    started.set_result(None)
                elif kind == "session.delegation.created":
                    created = now
                    await ws.send(orjson.dumps({"type": "session.commentary.append", "content": COMMENTARY,
                                                "delegation_id": ev["delegation"]["id"]}).decode())
                elif kind == "session.output_transcript.delta":
                    transcript.append(ev["delta"])
                elif kind == "session.closed":
                    return
                elif kind == "error":
                    result.audio_errors.append(f"error event: {ev['error']['message']}")

        read = asyncio.create_task(reader())
        await asyncio.wait_for(started, CONNECT_LEAD_S + 30)
        t0 = await stream(ws, messages, start_at, result)
        try:
            await asyncio.wait_for(ticked.wait(), END_WAIT_S)
        except TimeoutError:
            result.audio_errors.append(f"{len(deltas)} of {ticks} output ticks")
        await ws.send('{"type":"session.close"}')
        try:
            await asyncio.wait_for(read, 5.0)
        except TimeoutError:
            result.audio_errors.append("no session.closed")
    heard = runs(deltas)
    if name == "delegation":
        if delegated < len(spans):
            result.audio_errors.append(f"{delegated} of {len(spans)} delegations' commentaries heard")
        if delegated and not set(COMMENTARY.split()) <= set("".join(transcript).split()):
            result.audio_errors.append("the commentary's words are not in the output transcript")
        return
    answered = answers(spans, t0, [first for first, _ in heard])
    result.end_to_audio_ms += answered.values()
    if ends is not None:
        result.first_delta_ms += [spans[k][1] + ms - ends[k] for k, ms in answered.items()]
    result.barge_in_ms += barge_ins(spans, t0, heard)
    if len(answered) < len(spans):
        result.audio_errors.append(f"{len(answered)} of {len(spans)} turns answered")


async def realtime_session(url: str, pcm: bytes, messages: list[str], start_at: float, result: Sessions) -> None:
    """One Realtime session of the same audio on semantic_vad at "high", each reply timed as Live's are; also
    speech_stopped → first audio, and where speech_stopped put the end of speech against ``speech_spans``."""
    import orjson  # the load generator's processes only
    import websockets

    loop = asyncio.get_running_loop()
    await asyncio.sleep(start_at - CONNECT_LEAD_S - loop.time())
    spans = speech_spans(pcm)
    first: dict[str, float] = {}  # response id -> its first audible audio, heard
    stopped: list[tuple[float, float]] = []  # (arrival, audio_end_ms)
    done = asyncio.Event()
    finished = 0
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
        await ws.send(orjson.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}}).decode())
        updated = loop.create_future()

        async def reader() -> None:
            nonlocal finished
            async for raw in ws:
                now = loop.time()
                ev = orjson.loads(raw)
                kind = ev["type"]
                if kind == "response.output_audio.delta":
                    if ev["response_id"] not in first and (span := audible(base64.b64decode(ev["delta"]))):
                        first[ev["response_id"]] = now + span[0] / 1000
                elif kind == "input_audio_buffer.speech_stopped":
                    stopped.append((now, ev["audio_end_ms"]))
                elif kind == "response.done":
                    finished += 1
                    if finished == len(spans):
                        done.set()
                elif kind == "session.updated" and not updated.done():
                    updated.set_result(None)
                elif kind == "error":
                    result.audio_errors.append(f"error event: {ev['error']['message']}")

        read = asyncio.create_task(reader())
        await asyncio.wait_for(updated, CONNECT_LEAD_S + 30)
        t0 = await stream(ws, messages, start_at, result)
        try:
            await asyncio.wait_for(done.wait(), END_WAIT_S)
        except TimeoutError:
            result.audio_errors.append(f"{finished} of {len(spans)} responses done")
        read.cancel()
    answered = answers(spans, t0, list(first.values()))
    result.end_to_audio_ms += answered.values()
    if len(answered) < len(spans):
        result.audio_errors.append(f"{len(answered)} of {len(spans)} turns answered")
    for k, ms in answered.items():
        heard = t0 + (spans[k][1] + ms) / 1000
        stops = [(at, end) for at, end in stopped if at <= heard and nearest(spans, end) == k]
        if stops:
            result.first_delta_ms.append((heard - stops[-1][0]) * 1000)
            result.vad_end_offset_ms.append(stops[-1][1] - spans[k][1])


def session_process(url: str, protocol: str, name: str, repeats: int, plan: list[float], zero: float,
                    ends: list[float] | None) -> dict:
    """One load-generator process: its sessions, each starting at an offset (s) from the wall time ``zero``."""

    async def run() -> Sessions:
        result = Sessions()
        loop = asyncio.get_running_loop()
        pcm = timeline(name, repeats)
        messages = append_messages(pcm, protocol)
        lags: list[float] = []
        probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
        base = loop.time() - time.time() + zero
        if protocol == "live":
            sessions = [live_session(url, name, pcm, messages, base + offset, result, ends) for offset in plan]
        else:
            sessions = [realtime_session(url, pcm, messages, base + offset, result) for offset in plan]
        await asyncio.gather(*sessions)
        probe.cancel()
        result.lag_p99_ms.append(pct(lags, 99))
        return result

    return asdict(asyncio.run(run()))


def run_sessions(pool: Pool, url: str, protocol: str, name: str, n: int, repeats: int, spread: float,
                 aligned: bool, seed: int, timed_from_turn_end: bool = False) -> tuple[Sessions, float, float]:
    """n sessions of scenario ``name`` over the pool's processes; what they measured, and the level's start and
    end (wall time). Poisson arrivals over ``spread`` seconds (0: one scenario's length), or all at once.
    ``timed_from_turn_end``: Live's first audio also from ``turn_ends``."""
    pcm = timeline(name, repeats)
    ends = turn_ends(pcm) if timed_from_turn_end else None
    length_s = len(pcm) / 48000
    offsets = arrivals(n, spread or length_s, aligned, random.Random(seed))
    zero = time.time() + CONNECT_LEAD_S + 1.0 + n * 0.002
    start = time.time()
    shares = [(url, protocol, name, repeats, offsets[k :: pool.processes], zero, ends) for k in range(pool.processes)
              if offsets[k :: pool.processes]]
    result = Sessions()
    for part in pool.map(session_process, shares):
        result.merge(part)
    return result, start, time.time()
