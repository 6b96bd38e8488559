"""Latency the WebRTC path adds: the same echo turn over WebSocket and over WebRTC, on loopback.

One gateway in this process (echo responder at real-time pace, real Silero VAD). Each trial speaks
a fixture WAV in real-time 20 ms chunks (WebSocket: input_audio_buffer.append; WebRTC: an aiortc
microphone track), keeps sending silence like an open microphone, and measures from the moment the
chunk holding the last speech sample left the client to

  stopped: the input_audio_buffer.speech_stopped event arriving (input path + 500 ms of silence),
  reply:   the first 20 ms of reply audio with speech energy arriving (whole turn).

The echo reply starts with the turn's ~300 ms prefix padding, so both figures include the same
fixed parts (silence_duration_ms, prefix padding); the WebRTC − WebSocket difference is what the
transport adds. Server jitter-buffer prefetch (aiortc's default 4) and the client's (aiortc standing
in for a browser) are varied.

    python scripts/bench_webrtc.py --trials 5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiortc
import numpy as np
import orjson
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.config import load_config  # noqa: E402
from gateway.responders.echo import EchoResponder  # noqa: E402
from gateway.server.serve import GatewayServer  # noqa: E402
from tests.conftest import FIXTURES, load_pcm  # noqa: E402
from tests.helpers.webrtc import RtcClient, rms  # noqa: E402

CHUNK_MS = 20
ENERGY = 300.0  # RMS of a 20 ms piece that counts as reply speech (about -40 dBFS)


@dataclass
class Trial:
    stopped_ms: float
    reply_ms: float
    turn_ms: int  # audio_end_ms − audio_start_ms of the detected turn: what VAD made of the audio


def turn_ms(events: list[dict]) -> int:
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    return stopped["audio_end_ms"] - started["audio_start_ms"]


async def wait_idle(gateway: GatewayServer) -> None:
    while gateway.gateway.sessions or (gateway.app.state.webrtc is not None and gateway.app.state.webrtc.calls):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def ws_trial(gateway: GatewayServer, speech: bytes, end_ms: int) -> Trial:
    loop = asyncio.get_running_loop()
    step = 48 * CHUNK_MS
    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime?model=bench", compression=None,
                       max_size=None) as ws:
        await ws.recv()  # session.created
        t0 = loop.time()
        speech_end = t0 + (end_ms // CHUNK_MS) * CHUNK_MS / 1000
        stopped = reply = None
        events = []

        async def mic() -> None:
            i = 0
            while True:
                await asyncio.sleep(t0 + i * CHUNK_MS / 1000 - loop.time())
                chunk = speech[i * step : (i + 1) * step] or bytes(step)
                await ws.send(orjson.dumps({"type": "input_audio_buffer.append",
                                            "audio": base64.b64encode(chunk).decode()}).decode())
                i += 1

        sender = asyncio.create_task(mic())
        try:
            async for message in ws:
                now = loop.time()
                event = orjson.loads(message)
                events.append(event)
                if event["type"] == "input_audio_buffer.speech_stopped":
                    stopped = now
                elif event["type"] == "response.output_audio.delta":
                    pcm = np.frombuffer(base64.b64decode(event["delta"]), dtype="<i2")
                    if any(rms(pcm[i : i + 480]) > ENERGY for i in range(0, len(pcm), 480)):
                        reply = now
                        break
        finally:
            sender.cancel()
    assert stopped is not None and reply is not None
    return Trial((stopped - speech_end) * 1000, (reply - speech_end) * 1000, turn_ms(events))


async def rtc_trial(gateway: GatewayServer, speech: bytes, end_ms: int, client_prefetch: int) -> Trial:
    loop = asyncio.get_running_loop()
    client = RtcClient(f"http://127.0.0.1:{gateway.port}", jitter_prefetch=client_prefetch)
    try:
        await client.connect()
        await client.until("session.created")
        await asyncio.sleep(0.3)  # media flowing, as with an open microphone
        start_ms = client.mic.sent_ms + CHUNK_MS  # the next frame carries the first sample
        client.mic.say(speech)
        speech_end = client.mic.sent_at(start_ms + (end_ms // CHUNK_MS) * CHUNK_MS)
        stopped_event = (await client.until("input_audio_buffer.speech_stopped", timeout=15))[-1]
        stopped = next(t for t, e in client.timed if e is stopped_event)
        reply = None
        while reply is None:
            await asyncio.sleep(0.02)
            if loop.time() - speech_end > 10:
                raise TimeoutError("no reply audio")
            reply = next((t for t, f in client.speaker if t > speech_end and rms(f) > ENERGY), None)
        await client.hang_up()
    finally:
        await client.close()
    return Trial((stopped - speech_end) * 1000, (reply - speech_end) * 1000, turn_ms(client.received))


def summary(name: str, trials: list[Trial], base: list[Trial] | None = None) -> str:
    stopped = [t.stopped_ms for t in trials]
    reply = [t.reply_ms for t in trials]
    turn = statistics.median(t.turn_ms for t in trials)
    line = (f"| {name} | {turn:.0f} | {statistics.median(stopped):.0f} | {statistics.median(reply):.0f} "
            f"({min(reply):.0f}–{max(reply):.0f}) |")
    if base is not None:
        added = statistics.median(reply) - statistics.median(t.reply_ms for t in base)
        added_in = statistics.median(stopped) - statistics.median(t.stopped_ms for t in base)
        line += f" {added:+.0f} | {added_in:+.0f} | {added - added_in:+.0f} |"
    else:
        line += " — | — | — |"
    return line


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--wav", default="one_sentence.wav")
    parser.add_argument("--server-prefetch", default="4,1,0", help="server jitter-buffer prefetch values")
    parser.add_argument("--client-prefetch", default="4,0", help="client jitter-buffer prefetch values")
    parser.add_argument("--prefix-padding-ms", type=int, default=0,
                        help="VAD prefix padding; 0 makes the echo start at the speech, so its first audio is loud")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    speech = load_pcm(args.wav)
    end_ms = json.loads((FIXTURES / "fixtures.json").read_text())[args.wav]["speech_ms"][-1][1]
    config = load_config(env={})
    config.server.port = 0
    config.webrtc.enabled = True
    config.vad.prefix_padding_ms = args.prefix_padding_ms
    gateway = GatewayServer(config, EchoResponder(pace=1.0))
    await gateway.start()
    assert gateway.app.state.webrtc is not None, "aiortc is not installed"
    try:
        # Warm up codecs, VAD and imports once on each path.
        await ws_trial(gateway, speech, end_ms)
        await wait_idle(gateway)
        await rtc_trial(gateway, speech, end_ms, 4)
        await wait_idle(gateway)

        rows: list[tuple[str, list[Trial]]] = []
        base: list[Trial] = []
        for _ in range(args.trials):
            base.append(await ws_trial(gateway, speech, end_ms))
            await wait_idle(gateway)
        for sp in (int(v) for v in args.server_prefetch.split(",")):
            config.webrtc.jitter_prefetch = sp  # read at each call's set-up
            for cp in (int(v) for v in args.client_prefetch.split(",")):
                trials = []
                for _ in range(args.trials):
                    trials.append(await rtc_trial(gateway, speech, end_ms, cp))
                    await wait_idle(gateway)
                rows.append((f"WebRTC, server prefetch {sp}, client prefetch {cp}", trials))
                print(f"done: server {sp} client {cp}", file=sys.stderr)
    finally:
        await gateway.stop()

    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}, aiortc {aiortc.__version__}, {args.wav}, {args.trials} trials")
    print("| path | VAD turn, ms | speech end → speech_stopped received, ms (median) "
          "| speech end → reply speech received, ms (median, min–max) "
          "| added vs WebSocket | of it, input side | of it, output side |")
    print("|---|---|---|---|---|---|---|")
    print(summary("WebSocket", base))
    for name, trials in rows:
        print(summary(name, trials, base))


if __name__ == "__main__":
    asyncio.run(main())
