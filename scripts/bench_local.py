"""Latency of the local models (whisper tiny.en, SmolLM2-135M, piper) on this machine's CPUs, end to end.

A real gateway process (``python -m gateway serve`` with the repository's config: the local responder)
and real WebSocket clients, one per session, each asking QUESTIONS in turn (spoken by espeak-ng at run
time, in a different order per session). Every session streams its microphone at real time: the
question, then silence until its answer is done and a pause after it; session k starts k x
--stagger seconds after the first, so the sessions' turns overlap as they fall.

Per session count it reports, over all turns: end of the user's speech (the last speech sample sent,
as the gateway's speech_stopped says) to the first reply audio delta, P50/P95; the same from
speech_stopped; and each stage's median, from the gateway's trace (gateway/runtime/trace.py): the VAD's
silence (end of speech -> speech_stopped), STT (-> stt_done), LLM to its first sentence
(-> llm_first_segment), TTS first audio (-> tts_first_audio), and delivery (-> the client's first delta).

    flock /work/wt/bench.lock .venv/bin/python scripts/bench_local.py --sessions 1,2 --turns 12

Needs espeak-ng and the local models (make setup installs them). The CPUs are shared: the load average
before and after each run is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import websockets

from gateway.audio import wav_to_pcm16

ROOT = Path(__file__).resolve().parent.parent
CHUNK_MS = 20
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
# The trace's stages (gateway/runtime/trace.py) in the order a turn reaches them.
STAGES = ("stt_done", "llm_first_segment", "tts_first_audio", "first_delta")


def speak(text: str) -> bytes:
    """espeak-ng's voice (en-us, 170 words per minute) as pcm16 24 kHz."""
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
    trace: dict = field(default_factory=dict)

    def ms(self, start: float | None, end: float | None) -> float:
        return float("nan") if start is None or end is None else (end - start) * 1000


async def run_session(url: str, index: int, questions: list[tuple[str, bytes]], delay: float,
                      pause_s: float, turns: list[Turn]) -> None:
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    silence = bytes(48 * CHUNK_MS)
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
        sent_ms = 0  # input audio sent so far
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


def healthz(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return orjson.loads(answer.read())["status"]
    except urllib.error.HTTPError as error:
        return orjson.loads(error.read())["status"]
    except OSError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    values = [v for v in values if not np.isnan(v)]
    return float(np.percentile(values, q)) if values else float("nan")


def report(n: int, turns: list[Turn], load: tuple[float, float]) -> dict:
    e2e = [t.ms(t.end_of_speech, t.first_delta) for t in turns]
    from_stop = [t.ms(t.speech_stopped, t.first_delta) for t in turns]
    vad = [t.ms(t.end_of_speech, t.speech_stopped) for t in turns]
    marks = {s: [t.trace.get(f"{s}_ms", float("nan")) for t in turns] for s in STAGES}
    stt = marks["stt_done"]
    llm = [b - a for a, b in zip(marks["stt_done"], marks["llm_first_segment"], strict=True)]
    tts = [b - a for a, b in zip(marks["llm_first_segment"], marks["tts_first_audio"], strict=True)]
    delivery = [c - (s + b) for c, s, b in zip(e2e, vad, marks["tts_first_audio"], strict=True)]
    stages = {"VAD silence": vad, "STT": stt, "LLM to first sentence": llm, "TTS first audio": tts,
              "delivery": delivery}
    total = pct(e2e, 50)
    print(f"\n{n} session(s), {len(turns)} turns ({sum(t.status == 'completed' for t in turns)} completed); "
          f"load average before / after: {load[0]:.2f} / {load[1]:.2f}")
    print(f"  end of speech -> first audio delta: P50 {total:.0f} ms, P95 {pct(e2e, 95):.0f} ms")
    print(f"  speech_stopped -> first audio delta: P50 {pct(from_stop, 50):.0f} ms, P95 {pct(from_stop, 95):.0f} ms")
    for name, values in stages.items():
        print(f"  {name:<22} median {pct(values, 50):6.0f} ms  P95 {pct(values, 95):6.0f} ms  "
              f"({pct(values, 50) / total:.0%} of the P50)")
    return {
        "sessions": n, "turns": len(turns), "load_before": load[0], "load_after": load[1],
        "end_of_speech_to_first_delta_ms": {"p50": total, "p95": pct(e2e, 95)},
        "speech_stopped_to_first_delta_ms": {"p50": pct(from_stop, 50), "p95": pct(from_stop, 95)},
        "stages_median_ms": {name: pct(values, 50) for name, values in stages.items()},
        "turn_log": [{"session": t.session, "question": t.question, "heard": t.transcript, "reply": t.reply,
                      "status": t.status, "end_of_speech_to_first_delta_ms": round(t.ms(t.end_of_speech,
                                                                                        t.first_delta))}
                     for t in turns],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,2", help="comma-separated session counts")
    parser.add_argument("--turns", type=int, default=12, help="questions per session (at most %(default)s)")
    parser.add_argument("--stagger", type=float, default=1.5, help="seconds between the sessions' starts")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds of silence after each answer")
    parser.add_argument("--json", type=Path, help="write the figures and every turn here")
    args = parser.parse_args()

    spoken = [(q, speak(q)) for q in QUESTIONS[: args.turns]]
    port = free_port()
    trace = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    env = {**os.environ, "GATEWAY_SERVER_PORT": str(port), "GATEWAY_WEBRTC_ENABLED": "false",
           "GATEWAY_TRACE_JSONL_PATH": str(trace)}
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    results = []
    try:
        started = time.monotonic()
        while healthz(port) != "ok":
            if server.poll() is not None or time.monotonic() - started > 600:
                print(log.read_text()[-3000:], file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"gateway ready in {time.monotonic() - started:.1f} s ({platform.node()}, {os.cpu_count()} cores)")
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        for n in (int(n) for n in args.sessions.split(",")):
            turns: list[Turn] = []
            load_before = os.getloadavg()[0]
            asyncio.run(_run(url, n, spoken, args.stagger, args.pause, turns))
            time.sleep(0.5)  # the trace's last line
            records = {r["response_id"]: r for r in map(json.loads, trace.read_text().splitlines())}
            for turn in turns:
                turn.trace = records.get(turn.response_id, {})
            results.append(report(n, turns, (load_before, os.getloadavg()[0])))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
        trace.unlink()
        log.unlink()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


async def _run(url: str, n: int, spoken: list[tuple[str, bytes]], stagger: float, pause: float,
               turns: list[Turn]) -> None:
    await asyncio.gather(*(
        run_session(url, k, spoken[k:] + spoken[:k] if k else spoken, k * stagger, pause, turns) for k in range(n)
    ))


if __name__ == "__main__":
    sys.exit(main())
