"""The local models (whisper tiny.en, SmolLM2-135M, piper) on this machine's CPUs, end to end.

A gateway with the package's default configuration (the local responder) and one WebSocket client per session,
each asking QUESTIONS in turn (spoken by espeak-ng at run time, in a different order per session): the question,
then silence until its answer is done and a pause after it, the microphone streaming at real time; session k
starts k x --stagger seconds after the first, so the sessions' turns overlap as they fall.

Per session count, over all turns: the end of the user's speech (the last speech sample sent) to the first
reply audio delta, P50/P95; the same from speech_stopped; and each stage's median from the gateway's trace:
the VAD's silence, STT, the LLM to its first sentence, TTS first audio, and delivery. The clients' own loop lag
is the load side's figure (bench/validity.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.launcher import Gateway, bench_settings, free_port
from bench.load import CHUNK_MS
from bench.stats import lag_probe, pct, rounded
from bench.validity import mark

HELP = "the local models end to end: end of speech to first audio at 1 and 2 sessions"
HOW = """\
    python -m bench local --small                       # 1 session, 2 questions
    python -m bench local --sessions 1,2 --turns 12     # the CPUs to themselves, for figures"""
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "How do I make a good cup of tea?",
    "What is the boiling point of water?",
    "Can you recommend a good book to read this weekend?",
    "What is two plus two?",
    "Tell me a joke about computers.",
    "What time is it in Tokyo right now?",
    "Name three colors of the rainbow.",
    "How far away is the moon?",
    "What should I cook for dinner tonight?",
]
STAGES = ("stt_done", "llm_first_segment", "tts_first_audio", "first_delta")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", help="comma-separated session counts (default 1,2; --small 1)")
    parser.add_argument("--turns", type=int, help="questions per session, at most 12 (default 12; --small 2)")
    parser.add_argument("--stagger", type=float, default=1.5, help="seconds between the sessions' starts")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds of silence after each answer")


def speak(text: str) -> bytes:
    """espeak-ng's voice (en-us, 170 words per minute) as pcm16 24 kHz."""
    from gateway.audio import wav_to_pcm16

    wav = subprocess.run(["espeak-ng", "-v", "en-us", "-s", "170", "--stdout", text], check=True,
                         capture_output=True).stdout
    return wav_to_pcm16(wav)


@dataclass
class Turn:
    session: int
    question: str
    end_of_speech: float | None = None  # when the chunk holding the speech's last sample was sent
    speech_stopped: float | None = None
    first_delta: float | None = None
    response_id: str | None = None
    status: str | None = None
    transcript: str = ""
    reply: str = ""
    trace: dict[str, Any] = field(default_factory=dict)

    def ms(self, start: float | None, end: float | None) -> float:
        return float("nan") if start is None or end is None else (end - start) * 1000


async def run_session(url: str, index: int, questions: list[tuple[str, bytes]], delay: float, pause_s: float,
                      turns: list[Turn]) -> None:
    import orjson
    import websockets

    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    silence = bytes(48 * CHUNK_MS)
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
        sent_ms = 0
        sent_at: dict[int, float] = {}  # audio ms at the end of each chunk -> when it was sent
        done = asyncio.Event()
        turn: Turn | None = None

        async def reader() -> None:
            async for raw in ws:
                now = loop.time()
                event = orjson.loads(raw)
                kind = event["type"]
                if turn is None:
                    continue
                if kind == "input_audio_buffer.speech_stopped" and turn.speech_stopped is None:
                    turn.speech_stopped = now
                    end_ms = event["audio_end_ms"]
                    turn.end_of_speech = sent_at[min(ms for ms in sent_at if ms >= end_ms)]
                elif kind == "conversation.item.input_audio_transcription.completed":
                    turn.transcript = event["transcript"]
                elif kind == "response.created" and turn.response_id is None:
                    turn.response_id = event["response"]["id"]
                elif kind == "response.output_audio.delta" and turn.first_delta is None:
                    turn.first_delta = now
                elif kind == "response.output_audio_transcript.done":
                    turn.reply = event["transcript"]
                elif kind == "response.done" and event["response"]["id"] == turn.response_id:
                    turn.status = event["response"]["status"]
                    done.set()

        async def send(pcm: bytes) -> None:
            nonlocal sent_ms
            for i in range(0, len(pcm), len(silence)):
                due = t0 + sent_ms / 1000
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                await ws.send(orjson.dumps({"type": "input_audio_buffer.append",
                                            "audio": base64.b64encode(pcm[i : i + len(silence)]).decode()}))
                sent_ms += CHUNK_MS
                sent_at[sent_ms] = loop.time()

        read = asyncio.create_task(reader())
        t0 = loop.time()
        for question, pcm in questions:
            turn = Turn(index, question)
            turns.append(turn)
            done.clear()
            await send(pcm)
            while not done.is_set():  # the microphone stays open: silence until the answer is done
                await send(silence)
            await send(silence * int(pause_s * 1000 / CHUNK_MS))
        read.cancel()


async def sessions(url: str, n: int, spoken: list[tuple[str, bytes]], stagger: float, pause: float,
                   turns: list[Turn], lags: list[float]) -> None:
    probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
    try:
        await asyncio.gather(*(run_session(url, k, spoken[k:] + spoken[:k] if k else spoken, k * stagger, pause,
                                           turns) for k in range(n)))
    finally:
        probe.cancel()


def summarise(n: int, turns: list[Turn], load: tuple[float, float], lags: list[float]) -> dict[str, Any]:
    e2e = [t.ms(t.end_of_speech, t.first_delta) for t in turns]
    from_stop = [t.ms(t.speech_stopped, t.first_delta) for t in turns]
    vad = [t.ms(t.end_of_speech, t.speech_stopped) for t in turns]
    marks = {s: [t.trace.get(f"{s}_ms", float("nan")) for t in turns] for s in STAGES}
    llm = [b - a for a, b in zip(marks["stt_done"], marks["llm_first_segment"], strict=True)]
    tts = [b - a for a, b in zip(marks["llm_first_segment"], marks["tts_first_audio"], strict=True)]
    delivery = [c - (s + b) for c, s, b in zip(e2e, vad, marks["tts_first_audio"], strict=True)]
    stages = {"vad_silence": vad, "stt": marks["stt_done"], "llm_first_segment": llm, "tts_first_audio": tts,
              "delivery": delivery}
    row = {"sessions": n, "turns": len(turns), "completed": sum(t.status == "completed" for t in turns),
           "load_average_before": round(load[0], 2), "load_average_after": round(load[1], 2),
           "end_of_speech_to_first_delta_p50_ms": rounded(pct(e2e, 50), 0),
           "end_of_speech_to_first_delta_p95_ms": rounded(pct(e2e, 95), 0),
           "speech_stopped_to_first_delta_p50_ms": rounded(pct(from_stop, 50), 0),
           "speech_stopped_to_first_delta_p95_ms": rounded(pct(from_stop, 95), 0),
           "stages_median_ms": {name: rounded(pct(values, 50), 0) for name, values in stages.items()},
           "turn_log": [{"session": t.session, "question": t.question, "heard": t.transcript, "reply": t.reply,
                         "status": t.status, "ms": rounded(t.ms(t.end_of_speech, t.first_delta), 0)} for t in turns],
           "load": {"client_lag_p99_ms": rounded(pct(lags, 99))}}
    print(f"{n} session(s), {len(turns)} turns: end of speech -> first audio P50 "
          f"{row['end_of_speech_to_first_delta_p50_ms']} ms, P95 {row['end_of_speech_to_first_delta_p95_ms']} ms; "
          f"stages {row['stages_median_ms']}; load average {load[0]:.2f} -> {load[1]:.2f}", flush=True)
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(n) for n in (args.sessions or ("1" if args.small else "1,2")).split(",")]
    spoken = [(q, speak(q)) for q in QUESTIONS[: args.turns or (2 if args.small else 12)]]
    trace = Path(tempfile.mkdtemp(prefix="bench-local-")) / "trace.jsonl"
    gateway = Gateway({**bench_settings(free_port()), "trace.jsonl_path": str(trace)})
    rows = []
    try:
        for n in counts:
            turns: list[Turn] = []
            lags: list[float] = []
            before = os.getloadavg()[0]
            asyncio.run(sessions(gateway.url, n, spoken, args.stagger, args.pause, turns, lags))
            time.sleep(0.5)  # the trace's last line
            records = {r["response_id"]: r for r in map(json.loads, trace.read_text().splitlines())}
            for turn in turns:
                turn.trace = records.get(turn.response_id or "", {})
            rows.append(mark(summarise(n, turns, (before, os.getloadavg()[0]), lags), args.bounds))
    finally:
        gateway.stop()
        shutil.rmtree(trace.parent, ignore_errors=True)
    return {"setup": "local models", "settings": {"sessions": counts, "turns": len(spoken), "stagger_s": args.stagger,
                                                  "pause_s": args.pause}, "levels": rows}
