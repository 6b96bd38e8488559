"""The latency the WebRTC path adds: the same echo turn over WebSocket and over WebRTC, on loopback.

The gateway (bench/serve.py: the echo responder at real-time pace, real Silero VAD, prefix padding 0 so the
echo's first audio is the speech itself) in its own process, once per server jitter-buffer prefetch
([webrtc] jitter_prefetch). Each trial speaks tests/fixtures/one_sentence.wav in real-time 20 ms chunks
(WebSocket: input_audio_buffer.append; WebRTC: the project's own client, gateway.clients.webrtc_connection,
its microphone track in Opus), keeps sending silence like an open microphone, and measures from the moment
the chunk holding the last speech sample left the client to

  stopped: input_audio_buffer.speech_stopped arriving (the input path, plus 500 ms of silence),
  reply:   the first 20 ms of reply audio with speech energy arriving (the whole turn).

Both include the same fixed parts, so the WebRTC - WebSocket difference is what the transport adds, split into
its input side (the stopped difference) and its output side (the rest). The client's jitter buffer (standing
in for a browser's) is varied too: 0 hands each packet over as it arrives, n waits for n later ones (aiortc's
buffer). The client's own loop lag is the load side's figure (bench/validity.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import urllib.request
from dataclasses import dataclass
from typing import Any

from bench.launcher import Gateway, bench_settings, free_port
from bench.load import CHUNK_MS, FIXTURES, load_pcm
from bench.stats import lag_probe, pct, rounded
from bench.validity import mark

HELP = "what the WebRTC path adds to a turn, against WebSocket (echo, loopback)"
HOW = """\
    python -m bench webrtc --small                                   # one trial, both jitter buffers off
    python -m bench webrtc --trials 7 --server-prefetch 4,0 --client-prefetch 4,0"""
ENERGY = 300.0  # RMS of a 20 ms piece that counts as reply speech (about -40 dBFS)
WAV = "one_sentence.wav"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, help="trials per row (default 5; --small 1)")
    parser.add_argument("--server-prefetch", help="server jitter-buffer prefetch values (default 4,0; --small 0)")
    parser.add_argument("--client-prefetch", help="client jitter-buffer prefetch values (default 4,0; --small 0)")


@dataclass
class Trial:
    stopped_ms: float
    reply_ms: float
    turn_ms: int  # audio_end_ms - audio_start_ms of the detected turn: what VAD made of the audio


def rms(pcm: bytes) -> float:
    import numpy as np

    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if len(samples) else 0.0


def loud(pcm: bytes) -> bool:
    """Whether any 20 ms of this pcm16 24 kHz audio has speech energy."""
    return any(rms(pcm[i : i + 960]) > ENERGY for i in range(0, len(pcm), 960))


def turn_ms(events: list[dict[str, Any]]) -> int:
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    return stopped["audio_end_ms"] - started["audio_start_ms"]


async def wait_idle(gateway: Gateway) -> None:
    """Until the gateway holds no session (a call ends a moment after its client hangs up)."""
    while True:
        with urllib.request.urlopen(gateway.base + "/healthz", timeout=5) as answer:
            if not json.loads(answer.read()).get("active_sessions"):
                break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def ws_trial(gateway: Gateway, speech: bytes, end_ms: int) -> Trial:
    import orjson
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    step = 48 * CHUNK_MS
    async with connect(gateway.url + "?model=bench", compression=None, max_size=None) as ws:
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
                elif event["type"] == "response.output_audio.delta" and loud(base64.b64decode(event["delta"])):
                    reply = now
                    break
        finally:
            sender.cancel()
    assert stopped is not None and reply is not None
    return Trial((stopped - speech_end) * 1000, (reply - speech_end) * 1000, turn_ms(events))


async def rtc_trial(gateway: Gateway, speech: bytes, end_ms: int, client_prefetch: int) -> Trial:
    from gateway.clients.connection import Endpoint, ReplyAudio
    from gateway.clients.webrtc_connection import open_webrtc
    from gateway.transports.webrtc.media import set_jitter_prefetch

    loop = asyncio.get_running_loop()
    connection = await open_webrtc(Endpoint(gateway.url, "webrtc"))
    for transceiver in connection.pc.getTransceivers():
        set_jitter_prefetch(transceiver.receiver, client_prefetch)  # the client's own buffer, as a browser has one
    events: list[tuple[float, dict[str, Any]]] = []
    heard: list[tuple[float, bytes]] = []
    created, stopped_event = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        async for item in connection:
            now = loop.time()
            if isinstance(item, ReplyAudio):
                heard.append((now, item.pcm))
                continue
            events.append((now, item))
            if item["type"] == "session.created":
                created.set()
            elif item["type"] == "input_audio_buffer.speech_stopped":
                stopped_event.set()

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(created.wait(), 15)
        await asyncio.sleep(0.3)  # media flowing, as with an open microphone
        start_ms = connection.mic.sent_ms + CHUNK_MS  # the next frame carries the first sample
        connection.mic.say(speech)
        speech_end = connection.mic.sent_at(start_ms + (end_ms // CHUNK_MS) * CHUNK_MS)
        assert speech_end is not None
        await asyncio.wait_for(stopped_event.wait(), 15)
        stopped = next(t for t, e in events if e["type"] == "input_audio_buffer.speech_stopped")
        reply = None
        while reply is None:
            await asyncio.sleep(0.02)
            if loop.time() - speech_end > 10:
                raise TimeoutError("no reply audio")
            reply = next((t for t, pcm in heard if t > speech_end and loud(pcm)), None)
    finally:
        reader.cancel()
        await connection.close()
    return Trial((stopped - speech_end) * 1000, (reply - speech_end) * 1000, turn_ms([e for _, e in events]))


def row(path: str, trials: list[Trial], lags: list[float], base: list[Trial] | None = None, **key: Any) -> dict:
    reply = [t.reply_ms for t in trials]
    out = {"path": path, **key, "trials": len(trials), "vad_turn_ms": statistics.median(t.turn_ms for t in trials),
           "stopped_ms": rounded(statistics.median(t.stopped_ms for t in trials), 1),
           "reply_ms": rounded(statistics.median(reply), 1), "reply_min_ms": rounded(min(reply), 1),
           "reply_max_ms": rounded(max(reply), 1), "load": {"client_lag_p99_ms": rounded(pct(lags, 99))}}
    if base is not None:
        added = statistics.median(reply) - statistics.median(t.reply_ms for t in base)
        added_in = statistics.median(t.stopped_ms for t in trials) - statistics.median(t.stopped_ms for t in base)
        out |= {"added_ms": rounded(added, 1), "added_input_ms": rounded(added_in, 1),
                "added_output_ms": rounded(added - added_in, 1)}
    return out


async def trials(n: int, trial: Any, gateway: Gateway, lags: list[float]) -> list[Trial]:
    probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
    try:
        out = []
        for _ in range(n):
            out.append(await trial())
            await wait_idle(gateway)
        return out
    finally:
        probe.cancel()


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.trials or (1 if args.small else 5)
    servers = [int(v) for v in (args.server_prefetch or ("0" if args.small else "4,0")).split(",")]
    clients = [int(v) for v in (args.client_prefetch or ("0" if args.small else "4,0")).split(",")]
    speech = load_pcm(WAV)
    end_ms = json.loads((FIXTURES / "fixtures.json").read_text())[WAV]["speech_ms"][-1][1]
    rows: list[dict[str, Any]] = []
    base: list[Trial] = []
    for server in servers:
        settings = {**bench_settings(free_port()), "webrtc.enabled": True, "webrtc.jitter_prefetch": server,
                    "responder.kind": "echo", "responder.echo_pace": 1.0, "local.stt": False,
                    "vad.prefix_padding_ms": 0}
        gateway = Gateway(settings)
        try:
            async def measure(server: int = server, gateway: Gateway = gateway) -> None:
                # warm-up: codecs, VAD and imports once on each path
                await ws_trial(gateway, speech, end_ms)
                await wait_idle(gateway)
                await rtc_trial(gateway, speech, end_ms, 0)
                await wait_idle(gateway)
                if not base:
                    lags: list[float] = []
                    base.extend(await trials(n, lambda: ws_trial(gateway, speech, end_ms), gateway, lags))
                    rows.append(row("websocket", base, lags))
                for client in clients:
                    lags = []
                    got = await trials(n, lambda c=client: rtc_trial(gateway, speech, end_ms, c), gateway, lags)
                    rows.append(row("webrtc", got, lags, base, server_prefetch=server, client_prefetch=client))
                    print(f"WebRTC, server prefetch {server}, client prefetch {client}: reply {rows[-1]['reply_ms']} "
                          f"ms, {rows[-1]['added_ms']:+} ms against WebSocket", flush=True)

            asyncio.run(measure())
        finally:
            gateway.stop()
    for r in rows:
        mark(r, args.bounds)
    return {"setup": "echo, loopback", "settings": {"trials": n, "server_prefetch": servers,
                                                    "client_prefetch": clients, "wav": WAV},
            "levels": rows}
