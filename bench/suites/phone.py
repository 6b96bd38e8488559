"""What a phone call costs beside a WebSocket session: the same turn's latency, and the gateway's CPU per minute.

One gateway (bench/serve.py, its own process) with its SIP endpoint on, answering with the pipeline on the
capacity benchmark's fake backends (bench/fake_openai.py: STT 100 ms, first token 80 ms) and the tone TTS
(first audio 25 ms after a segment, then real time), or with the local demo models (``--local``: `make serve`'s
defaults). Every session has the [session] defaults (server_vad and its silence).

Latency, per trial, in turn over the two paths, the same question (tests/fixtures/question_sky.wav at 8 kHz, as
a phone has it, after 0-200 ms of silence, a new amount each trial, and before several seconds of it):

  SIP:       a real phone (baresip, bench/phones.py) calls over G.711 and RTP. Its sndfile filter records what it
             sent (``enc``: from its first frame, at the answer) and what it decoded (``dec``: from the first
             packet the gateway sent, which then sends one every 20 ms, silence too); the phone's jitter buffer
             is off, so a packet is decoded as it arrives. The two recordings end together, at the hang-up, so
             the difference of their lengths is how much later ``dec`` started (``dump_offsets_ms``: the gateway's
             first packet after the phone's, to a frame); each call's latency is measured on ``enc``'s clock
             with it. Aligned by their starts instead (``start_aligned``), a call would be early by that much.
  WebSocket: a plain client sends the same audio at 24 kHz in 20 ms appends on a real-time clock and notes when
             each went out and when each audio delta arrived.

Each is measured the same way: from the end of the question's sound in what was sent (the last 20 ms frame over
the energy threshold, its end) to the first frame over it in what came back (a delta's frame counted from the
delta's arrival at 20 ms a frame): what a person would time with a stopwatch, the VAD's silence included. P50
and P95 per path; the SIP level's ``added_p95_ms`` is what SIP adds (target: 20 ms at most). The published
figures for phone agents, end of speech to first audio, are 1.09-1.46 s (SignalWire), 1.75 s (a tuned
LiveKit) and 1.85 s (Vapi): ``--local`` puts the local models beside them.

CPU: N calls at once for M seconds, then N WebSocket sessions for M seconds on the same audio (the question
every 8 s, the tone TTS answering): the gateway process's CPU time (/proc, all its threads) over the window
per call-minute, so a machine shared with other work still gives comparable figures. The load side's figure
is this process's loop lag P99 (the WebSocket clients and the phones' control) and the fakes' own
(bench/validity.py); the phones are processes of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shutil
import subprocess
import tempfile
import time
import urllib.request
import wave
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.launcher import Fakes, Gateway, bench_settings, free_port
from bench.load import CHUNK_MS, FIXTURES
from bench.phones import BARESIP, Baresip, free_sip_port, phone_wav
from bench.stats import lag_probe, pct, rounded
from bench.suites.transport import cpu_seconds
from bench.validity import mark

HELP = "a phone call (SIP, G.711) beside a WebSocket session: end of speech to first audio, and CPU per minute"
HOW = """\
    python -m bench phone --small                        # 2 trials a path, 2 calls at once for 10 s
    python -m bench phone --trials 10 --calls 10 --seconds 60
    python -m bench phone --local --trials 10 --calls 0  # the local models, beside the published 1.09-1.85 s"""
WAV = "question_sky.wav"
LOUD = 300.0  # RMS of a 20 ms frame that holds sound (the recordings are otherwise silence or G.711's hiss)
GAP_S = 0.4  # pauses shorter than this inside the question are bridged
CYCLE_S = 8.0  # the CPU levels' caller says the question every CYCLE_S seconds
MAX_OFFSET_MS = 60  # the gateway's first packet is due within a tick or two of the phone's
T = TypeVar("T")
PUBLISHED = "1.09-1.46 s (SignalWire), 1.75 s (a tuned LiveKit), 1.85 s (Vapi)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, help="latency trials per path (default 10; --small 2; 0: the CPU "
                        "levels only)")
    parser.add_argument("--calls", type=int, help="calls (and WebSocket sessions) at once for the CPU levels "
                        "(default 10; --small 2; 0: no CPU levels)")
    parser.add_argument("--seconds", type=float, help="how long the CPU levels' calls last (default 60; --small 10)")
    parser.add_argument("--local", action="store_true", help="the local demo models answer (make serve's defaults), "
                        "not the fake backends and the tone TTS")


def frames_over(samples: np.ndarray, rate: int) -> np.ndarray:
    """Which 20 ms frames of these int16 samples have sound (RMS over LOUD)."""
    n = rate * CHUNK_MS // 1000
    frames = samples[: len(samples) // n * n].reshape(-1, n).astype(np.float64)
    return np.sqrt((frames**2).mean(axis=1)) > LOUD


def bursts(samples: np.ndarray, rate: int) -> list[tuple[float, float]]:
    """(start, end) seconds of the sound in these samples, pauses shorter than GAP_S bridged."""
    spans: list[tuple[float, float]] = []
    for i in np.flatnonzero(frames_over(samples, rate)):
        t = i * CHUNK_MS / 1000
        if spans and t - spans[-1][1] <= GAP_S:
            spans[-1] = (spans[-1][0], t + CHUNK_MS / 1000)
        else:
            spans.append((t, t + CHUNK_MS / 1000))
    return spans


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, w.getnchannels())[:, 0]
        return data, w.getframerate()


def call_latency(folder: Path) -> tuple[float | None, float]:
    """A call's latency in seconds, its recordings aligned by their ends (None if the phone heard no answer after
    the question), and how much longer the phone's ``enc`` recording is than its ``dec`` one (both end at the
    hang-up: how much later ``dec`` started)."""
    sent, rate = read_wav(sorted(folder.glob("dump-*-enc.wav"))[-1])
    heard, heard_rate = read_wav(sorted(folder.glob("dump-*-dec.wav"))[-1])
    offset = len(sent) / rate - len(heard) / heard_rate
    said = bursts(sent, rate)
    if not said:
        return None, offset
    end = said[0][1]
    answer = [start for start, _ in bursts(heard, heard_rate) if start > end]
    return (answer[0] + offset - end if answer else None), offset


async def wait_idle(gateway: Gateway) -> None:
    """Until the gateway holds no session (a call ends a moment after its BYE)."""
    while True:
        with await asyncio.to_thread(urllib.request.urlopen, gateway.base + "/healthz", timeout=5) as answer:
            if not json.loads(answer.read()).get("active_sessions"):
                return
        await asyncio.sleep(0.1)


async def started_phone(folder: Path, mic: Path) -> Baresip:
    """A phone, started: a second or third try, on other free ports, if one was taken before baresip bound it
    (the machine's other programs pick free ports too)."""
    attempt = 0
    while True:
        phone = Baresip(folder / f"phone-{attempt}", mic, jitter_buffer=False)
        try:
            await phone.start()
            return phone
        except RuntimeError:
            attempt += 1
            if attempt == 3:
                raise


async def sip_trial(port: int, folder: Path, mic: Path, listen_s: float) -> tuple[float | None, float]:
    phone = await started_phone(folder, mic)
    try:
        await phone.command("dial", f"sip:agent@127.0.0.1:{port}")
        await phone.event("CALL_ESTABLISHED")
        await asyncio.sleep(listen_s)
        await phone.command("hangup")
        await phone.event("CALL_CLOSED")
    finally:
        await phone.stop()
    return call_latency(phone.folder)


async def ws_trial(url: str, pcm: bytes, end_frame: int, timeout_s: float) -> float | None:
    """One turn over WebSocket: seconds from the end of the sent question's last loud frame (``end_frame``, 20 ms
    frames) to the first loud frame of the reply as it arrived; None if none came within ``timeout_s``."""
    import orjson
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    step = 48 * CHUNK_MS
    sent_at: dict[int, float] = {}
    async with connect(url + "?model=bench", compression=None, max_size=None) as ws:
        await ws.recv()  # session.created

        async def microphone() -> None:
            t0 = loop.time()
            for i in range(len(pcm) // step):
                await asyncio.sleep(t0 + i * CHUNK_MS / 1000 - loop.time())
                await ws.send(orjson.dumps({"type": "input_audio_buffer.append",
                                            "audio": base64.b64encode(pcm[i * step:(i + 1) * step]).decode()}).decode())
                sent_at[i] = loop.time()

        sender = asyncio.create_task(microphone())
        try:
            async with asyncio.timeout(timeout_s):
                async for message in ws:
                    now = loop.time()
                    event = orjson.loads(message)
                    if event["type"] != "response.output_audio.delta" or end_frame not in sent_at:
                        continue
                    loud = np.flatnonzero(frames_over(np.frombuffer(base64.b64decode(event["delta"]), "<i2"), 24000))
                    if len(loud):
                        return now + loud[0] * CHUNK_MS / 1000 - (sent_at[end_frame] + CHUNK_MS / 1000)
        except TimeoutError:
            return None
        finally:
            sender.cancel()
    return None


def trial_audio(folder: Path, lead_s: float, tail_s: float) -> tuple[Path, bytes, int]:
    """The question at 8 kHz after ``lead_s`` of silence and before ``tail_s`` of it, as the phone's microphone
    file; the same audio as pcm16 24 kHz for the WebSocket client; the 20 ms frame of it where the question's
    sound ends."""
    mic = folder / f"mic-{lead_s * 1000:.0f}.wav"
    subprocess.run(["sox", str(FIXTURES / WAV), "-r", "8000", "-c", "1", "-b", "16", str(mic), "pad", f"{lead_s:.4f}",
                    str(tail_s)], check=True)
    pcm24 = upsampled(mic, folder)
    end_s = bursts(np.frombuffer(pcm24, "<i2"), 24000)[0][1]
    return mic, pcm24, round(end_s * 1000 / CHUNK_MS) - 1


async def latency_levels(gateway: Gateway, sip_port: int, folder: Path, trials: int, timeout_s: float,
                         ) -> tuple[list[float], ...]:
    sip: list[float] = []
    ws: list[float] = []
    offsets: list[float] = []
    start_aligned: list[float] = []
    sip_lags: list[float] = []
    ws_lags: list[float] = []
    leads = random.Random(trials)
    for n in range(-1, trials):  # trial -1: a warm-up on each path (imports, codecs, the VAD's first run)
        # The question starts after 0-200 ms of silence, a new amount each trial: a caller's speech ends at any
        # moment of the gateway's clocks (its 20 ms media clock, the VAD's windows, the runner's tick).
        mic, pcm24, end_frame = trial_audio(folder, leads.uniform(0, 0.2), timeout_s)
        latency, offset = await lagged(sip_trial(sip_port, folder / f"call-{n + 1}", mic, timeout_s),
                                       sip_lags if n >= 0 else [])
        await wait_idle(gateway)
        over_ws = await lagged(ws_trial(gateway.url, pcm24, end_frame, timeout_s), ws_lags if n >= 0 else [])
        await wait_idle(gateway)
        if n < 0:
            continue
        offsets.append(offset * 1000)
        if latency is not None:
            sip.append(latency * 1000)
            start_aligned.append((latency - offset) * 1000)
        if over_ws is not None:
            ws.append(over_ws * 1000)
        print(f"trial {n + 1}: SIP {fmt(latency)}, WebSocket {fmt(over_ws)} (dump offset {offset * 1000:.0f} ms)",
              flush=True)
    return sip, ws, offsets, start_aligned, sip_lags, ws_lags


async def lagged(work: Awaitable[T], lags: list[float]) -> T:
    """`work`'s result, this process's loop lag (ms) while it ran appended to `lags`."""
    probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
    try:
        return await work
    finally:
        probe.cancel()


def fmt(seconds: float | None) -> str:
    return "no answer" if seconds is None else f"{seconds * 1000:.0f} ms"


def upsampled(mic: Path, folder: Path) -> bytes:
    """The phone's microphone audio (8 kHz) as pcm16 24 kHz: the same audio for the WebSocket client."""
    out = folder / "mic-24k.wav"
    subprocess.run(["sox", str(mic), "-r", "24000", str(out)], check=True)
    with wave.open(str(out)) as w:
        return w.readframes(w.getnframes())


def latency_row(path: str, values: list[float], trials: int, lags: list[float]) -> dict[str, Any]:
    return {"measure": "latency", "path": path, "trials": trials, "answered": len(values),
            "end_of_speech_to_first_audio_p50_ms": rounded(pct(values, 50), 1),
            "end_of_speech_to_first_audio_p95_ms": rounded(pct(values, 95), 1),
            "latencies_ms": [round(v, 1) for v in values], "load": {"client_lag_p99_ms": rounded(pct(lags, 99))}}


async def cpu_level(gateway: Gateway, sip_port: int | None, folder: Path, calls: int, seconds: float,
                    lags: list[float]) -> float:
    """The gateway's CPU seconds while `calls` calls (SIP when `sip_port`, else WebSocket sessions) talk for
    `seconds`, from the moment all are connected."""
    repeats = int((seconds + 10) // CYCLE_S) + 1
    folder = folder / f"cpu-{'sip' if sip_port else 'websocket'}"
    folder.mkdir()
    mic = folder / "mic-cycles.wav"
    subprocess.run(["sox", str(phone_wav(folder, WAV, pad_s=CYCLE_S)), str(mic), "trim", "0", str(CYCLE_S),
                    "repeat", str(repeats)], check=True)
    if sip_port is not None:
        return await lagged(sip_calls(gateway, sip_port, folder, mic, calls, seconds), lags)
    return await lagged(ws_sessions(gateway, upsampled(mic, folder), calls, seconds), lags)


async def sip_calls(gateway: Gateway, port: int, folder: Path, mic: Path, calls: int, seconds: float) -> float:
    phones: list[Baresip] = []
    try:
        for k in range(calls):
            phones.append(await started_phone(folder / f"call-{k}", mic))
        for phone in phones:
            await phone.command("dial", f"sip:agent@127.0.0.1:{port}")
            await asyncio.sleep(0.25)  # within [sip] invites_per_second_per_source
        await asyncio.gather(*(phone.event("CALL_ESTABLISHED") for phone in phones))
        before = cpu_seconds(gateway.process.pid)
        await asyncio.sleep(seconds)
        used = cpu_seconds(gateway.process.pid) - before
        for phone in phones:
            await phone.command("hangup")
        await asyncio.gather(*(phone.event("CALL_CLOSED") for phone in phones))
    finally:
        await asyncio.gather(*(phone.stop() for phone in phones))
    await wait_idle(gateway)
    return used


async def ws_sessions(gateway: Gateway, pcm: bytes, calls: int, seconds: float) -> float:
    import orjson
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    step = 48 * CHUNK_MS
    go = asyncio.Event()

    async def session() -> None:
        async with connect(gateway.url + "?model=bench", compression=None, max_size=None) as ws:
            await ws.recv()
            reader = asyncio.create_task(drain(ws))
            await go.wait()
            t0 = loop.time()
            try:
                for i in range(int(seconds * 1000 / CHUNK_MS) + 25):
                    await asyncio.sleep(t0 + i * CHUNK_MS / 1000 - loop.time())
                    chunk = pcm[(i * step) % len(pcm):][:step]
                    await ws.send(orjson.dumps({"type": "input_audio_buffer.append",
                                                "audio": base64.b64encode(chunk).decode()}).decode())
            finally:
                reader.cancel()

    async def drain(ws: Any) -> None:
        async for _ in ws:
            pass

    tasks = [asyncio.create_task(session()) for _ in range(calls)]
    await asyncio.sleep(1.0)  # every session connected
    go.set()
    before = cpu_seconds(gateway.process.pid)
    await asyncio.sleep(seconds)
    used = cpu_seconds(gateway.process.pid) - before
    await asyncio.gather(*tasks)
    await wait_idle(gateway)
    return used


def run(args: argparse.Namespace) -> dict[str, Any]:
    if BARESIP is None:
        raise SystemExit("phone: baresip is not installed (apt-get install baresip)")
    trials = args.trials if args.trials is not None else (2 if args.small else 10)
    calls = args.calls if args.calls is not None else (2 if args.small else 10)
    seconds = args.seconds or (10.0 if args.small else 60.0)
    sip_port = free_sip_port()
    settings: dict[str, Any] = {**bench_settings(free_port()), "sip.enabled": True, "sip.port": sip_port,
                                "sip.max_calls_per_source": max(10, calls)}
    folder = Path(tempfile.mkdtemp(prefix="bench-phone-"))
    fakes = gateway = None
    levels: list[dict[str, Any]] = []
    try:
        if not args.local:
            fakes = Fakes(1)
            settings |= {"responder.kind": "pipeline", "stt.base_url": fakes.url, "llm.base_url": fakes.url,
                         "local.stt": False}
        gateway = Gateway(settings, tone=not args.local)
        start = time.time()
        sip, ws, offsets, start_aligned, sip_lags, ws_lags = asyncio.run(
            latency_levels(gateway, sip_port, folder, trials, 12.0 if args.local else 7.0))
        if trials:  # 0: the CPU levels only, after the warm-up call on each path
            fake = {"fake": fakes.figures(start, time.time())} if fakes else {}
            over_ws = latency_row("websocket", ws, trials, ws_lags)
            over_ws["load"] |= fake
            over_sip = latency_row("sip", sip, trials, sip_lags)
            over_sip["load"] |= fake
            over_sip |= {"dump_offsets_ms": [round(v) for v in offsets],
                         "start_aligned_p50_ms": rounded(pct(start_aligned, 50), 1),
                         "start_aligned_p95_ms": rounded(pct(start_aligned, 95), 1),
                         "added_p50_ms": rounded(pct(sip, 50) - pct(ws, 50), 1),
                         "added_p95_ms": rounded(pct(sip, 95) - pct(ws, 95), 1)}
            if args.local:
                over_sip["published"] = PUBLISHED
            levels += [over_ws, over_sip]
            print(f"end of speech -> first audio: SIP P50 {over_sip['end_of_speech_to_first_audio_p50_ms']} ms, P95 "
                  f"{over_sip['end_of_speech_to_first_audio_p95_ms']} ms; WebSocket P50 "
                  f"{over_ws['end_of_speech_to_first_audio_p50_ms']} ms, P95 "
                  f"{over_ws['end_of_speech_to_first_audio_p95_ms']} ms; SIP adds {over_sip['added_p95_ms']} ms at "
                  "P95", flush=True)
        if calls:
            for path, port in (("sip", sip_port), ("websocket", None)):
                lags: list[float] = []
                start = time.time()
                used = asyncio.run(cpu_level(gateway, port, folder, calls, seconds, lags))
                row = {"measure": "cpu", "path": path, "calls": calls, "seconds": seconds, "cpu_s": round(used, 3),
                       "cpu_s_per_call_min": round(used / (calls * seconds / 60), 3),
                       "load": {"client_lag_p99_ms": rounded(pct(lags, 99)),
                                **({"fake": fakes.figures(start, time.time())} if fakes else {})}}
                levels.append(row)
                print(f"CPU, {path}: {row['cpu_s_per_call_min']} s per call-minute ({calls} at once, {seconds:g} s)",
                      flush=True)
    finally:
        for part in (gateway, fakes):
            if part is not None:
                part.stop()
        shutil.rmtree(folder, ignore_errors=True)
    responder = "local models" if args.local else "tone TTS"
    for level in levels:
        level["responder"] = "local" if args.local else "pipeline"
        mark(level, args.bounds)
        apart = max(level.get("dump_offsets_ms") or [0], key=abs)
        if abs(apart) > MAX_OFFSET_MS:  # a jitter buffer or lost packets: the recordings' clocks are not the calls'
            level["valid"] = False
            level["invalid"].append(f"the phone's recordings started {apart} ms apart (> {MAX_OFFSET_MS} ms)")
    return {"setup": f"{responder}, SIP and WebSocket", "settings": {
        "trials": trials, "calls": calls, "seconds": seconds, "wav": WAV, "local": args.local,
        "fake_stt_ms": None if args.local else fakes and fakes.stt_ms,
        "fake_llm_ms": None if args.local else fakes and fakes.llm_ms, "gateway": settings}, "levels": levels}
