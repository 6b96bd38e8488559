"""Phone-side latency: the end of the caller's speech → the first agent audio at the phone, over SIP.

A real phone (baresip, driven by tests/phones/baresip.py) calls a gateway in this process and says a fixture
question; its sndfile filter records what it sent (``enc``) and what it heard (``dec``), both from the call's
start (the two dumps start within one 20 ms frame of each other: baresip's first encoded frame and the first
RTP packet the gateway sends, at its answer). The latency of a call is the first burst of sound in ``dec``
after the end of the question's burst in ``enc``: what a person on the phone would time with a stopwatch,
server_vad's silence_duration_ms included.

The gateway answers with the pipeline on the fake OpenAI-compatible backends (tests/fake_openai.py:
--stt-ms, --ttft-ms, --tokens-per-s, as the capacity benchmark's) and the tone TTS at real time, or the
local demo models (--local). Put the same turn over WebSocket beside it with scripts/bench_webrtc.py's
WebSocket leg (or bench_gateway.py) on the same backends to get what SIP adds.

    PYTHONPATH=. python scripts/bench_phone.py --calls 10 [--local] [--json out.json]

``call_latency(folder)`` measures one call's recordings; ``run()`` returns the records (a bench suite's).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tests.fake_openai import FakeOpenAI

from gateway.config import load_config
from gateway.server.serve import GatewayServer
from tests.paths import FIXTURES
from tests.phones.baresip import Baresip, free_port

FRAME = 160  # 20 ms at 8 kHz
LOUD = 300.0  # RMS of a frame that holds sound (the recordings are otherwise digital silence or line hiss)


def bursts(path: Path, gap_s: float = 0.4) -> list[tuple[float, float]]:
    """(start, end) seconds of the sound in a baresip dump, pauses shorter than ``gap_s`` bridged."""
    with wave.open(str(path)) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, w.getnchannels())[:, 0]
    frames = samples[: len(samples) // FRAME * FRAME].reshape(-1, FRAME).astype(np.float32)
    spans: list[tuple[float, float]] = []
    for i in np.flatnonzero(np.sqrt((frames ** 2).mean(axis=1)) > LOUD):
        t = i * FRAME / 8000
        if spans and t - spans[-1][1] <= gap_s:
            spans[-1] = (spans[-1][0], t + 0.02)
        else:
            spans.append((t, t + 0.02))
    return spans


def call_latency(folder: Path) -> float | None:
    """Seconds from the end of the caller's first utterance to the first agent audio it heard; None if none."""
    enc = sorted(folder.glob("dump-*-enc.wav"))[-1]
    dec = sorted(folder.glob("dump-*-dec.wav"))[-1]
    said = bursts(enc)
    if not said:
        return None
    end = said[0][1]
    heard = [start for start, _ in bursts(dec) if start > end]
    return heard[0] - end if heard else None


def responder(fake: FakeOpenAI, local: bool) -> Any:
    if local:
        return None  # the configured one: [responder] kind "local"
    from gateway.responders.pipeline import BridgeSettings, PipelineResponder  # the pipeline's own extras
    from gateway.responders.remote import LlmClient
    from gateway.responders.tone_tts import ToneEngine

    return PipelineResponder(LlmClient(fake.base_url, "llm-bench", timeout_s=10),
                             ToneEngine(first_audio_ms=25, realtime=True), BridgeSettings(10, 80))


async def run(calls: int, local: bool, stt_ms: float, ttft_ms: float, tokens_per_s: float) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-phone-"))
    mic = folder / "mic.wav"
    subprocess.run(["sox", str(FIXTURES / "question_sky.wav"), "-r", "8000", "-c", "1", "-b", "16", str(mic),
                    "pad", "0", "6"], check=True)
    async with FakeOpenAI(reply="The sky looks blue because air scatters blue light.", stt_ms=stt_ms,
                          ttft_ms=ttft_ms, tokens_per_s=tokens_per_s) as fake:
        config = load_config(env={})
        config.server.port = 0
        config.webrtc.enabled = False
        config.sip.enabled, config.sip.port = True, free_port()
        if local:
            config.responder.kind = "local"
        else:
            config.local.stt = False
            config.stt.base_url, config.stt.model = fake.base_url, "whisper-bench"
        server = GatewayServer(config, responder(fake, local))
        await server.start()
        latencies: list[float] = []
        try:
            for n in range(calls):
                phone = Baresip(folder / f"call-{n}", mic)
                await phone.start()
                try:
                    await phone.command("dial", f"sip:agent@127.0.0.1:{config.sip.port}")
                    await phone.event("CALL_ESTABLISHED")
                    await asyncio.sleep(7)
                    await phone.command("hangup")
                    await phone.event("CALL_CLOSED")
                finally:
                    await phone.stop()
                latency = call_latency(phone.folder)
                if latency is not None:
                    latencies.append(latency)
        finally:
            await server.stop()
    ms = sorted(round(1000 * float(x), 1) for x in latencies)
    backends = f"stt {stt_ms} ms, ttft {ttft_ms} ms, {tokens_per_s or 'unlimited'} tok/s"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"suite": "phone_latency", "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "commit": commit, "command": " ".join(sys.argv),
            "responder": "local demo models" if local else f"pipeline, fake backends ({backends}), tone TTS",
            "calls": calls, "measured": len(ms), "p50_ms": statistics.median(ms) if ms else None,
            "p95_ms": ms[min(len(ms) - 1, int(0.95 * len(ms)))] if ms else None, "latencies_ms": ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--local", action="store_true", help="the local demo models answer")
    parser.add_argument("--stt-ms", type=float, default=100.0)
    parser.add_argument("--ttft-ms", type=float, default=80.0)
    parser.add_argument("--tokens-per-s", type=float, default=50.0)
    parser.add_argument("--json", type=Path, help="also write the record here")
    args = parser.parse_args()
    record = asyncio.run(run(args.calls, args.local, args.stt_ms, args.ttft_ms, args.tokens_per_s))
    print(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        args.json.write_bytes(orjson.dumps(record))


if __name__ == "__main__":
    main()
