"""Turn detection: semantic_vad (Smart Turn) at each eagerness against server_vad on recorded turns, and the CPU
the audio input path costs (VAD per window, batched VAD, the turn detector, G.711).

The turns are artifacts/turns (``python -m scripts.make_turns``, made here the first time: espeak-ng, and
Festival's voice where it is installed): sentences with pauses inside and complete ones. The detectors are the
gateway's own (gateway.core.vad.TurnDetector, gateway.core.semantic_vad.SemanticTurnDetector with config.toml's
[semantic_vad]) on the real Silero and Smart Turn models, fed window by window; a turn's end is decided at a
point of its audio, so those figures are the same on any machine, and the model's CPU time for the check that
ended a turn is added to its delay.

- premature: turns committed before their true end of speech (the user cut off), of the paused / complete ones;
- delay: from the true end of speech to the commit (P50, P90, max);
- verdicts: the model's P(complete) 200 ms into the pauses inside sentences (should be low) and after their
  ends (should be high);
- CPU: the model per turn, alone and in batches; then the input path, one thread, as on the event loop or the
  VAD's worker thread, and N sessions in real time on one loop with one VAD thread (by one and batched);
- VAD lateness: speech_stopped lateness of N sessions on one loop kept busy by other work (bench/vad_lateness.py).

Figures of CPU time, so the load side is not judged (a busy machine moves them less than wall-clock ones).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import wave
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.load import FIXTURES

HELP = "turn detection on recorded turns (semantic_vad vs server_vad) and the audio input path's CPU"
HOW = """\
    python -m bench turns --small                   # 8 turns, the input path at 10 sessions
    python -m bench turns --recheck-ms 0,500        # every turn of artifacts/turns (made first if missing)"""
ROOT = Path(__file__).resolve().parent.parent.parent
TURNS = ROOT / "artifacts" / "turns"
BYTES_PER_MS = 48
TOLERANCE_MS = 100  # a commit ending this close to the true end is not a cut-off
APPEND_BYTES = 960  # 20 ms of pcm16 24 kHz


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=Path, default=TURNS, help="the recorded turns (made there when missing)")
    parser.add_argument("--server-silence", default="200,500,1000", help="server_vad silence_duration_ms values")
    parser.add_argument("--recheck-ms", default="0,500", help="semantic_vad recheck_ms values")
    parser.add_argument("--sessions", type=int, help="sessions of the input path's real-time load (default 100; "
                        "--small 10)")
    parser.add_argument("--busy-ms", default="0,4,8", help="VAD lateness: the loop kept busy this long every "
                        "--every-ms (comma-separated levels; --small: 0,8)")
    parser.add_argument("--every-ms", type=float, default=10.0)
    parser.add_argument("--lateness-sessions", type=int, help="VAD lateness: sessions (default 40; --small 10)")


@dataclass
class Turn:
    name: str
    voice: str
    kind: str
    pcm: bytes
    start_ms: int
    end_ms: int
    pauses_ms: list[list[int]]
    probs: Any = None


@dataclass
class Outcome:
    commits: list[tuple[int, int]] = field(default_factory=list)  # (audio_end_ms, decided at ms of audio)
    model_ms: float = 0.0  # CPU time of the check that ended the turn, if a verdict did


class Verdicts:
    """The model's answers, computed once per distinct audio span and timed."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: dict[tuple[str, int, int], tuple[float, float]] = {}

    def __call__(self, turn: Turn, check: Any) -> tuple[float, float]:
        key = (turn.name, check.start_ms, check.end_ms)
        if key not in self.cache:
            pcm = turn.pcm[check.start_ms * BYTES_PER_MS : check.end_ms * BYTES_PER_MS]
            t = time.thread_time()
            p = float(self.model.predict([pcm])[0])
            self.cache[key] = (p, (time.thread_time() - t) * 1000)
        return self.cache[key]


def run_server_vad(turn: Turn, silence_ms: int) -> Outcome:
    from gateway.core.vad import SpeechStopped, TurnDetector

    detector = TurnDetector(silence_duration_ms=silence_ms)
    outcome = Outcome()
    for p in turn.probs:
        for ev in detector.feed((p,)):
            if isinstance(ev, SpeechStopped):
                outcome.commits.append((ev.audio_end_ms, detector.position_ms))
    return outcome


def run_semantic(turn: Turn, eagerness: Any, pause_ms: int, recheck_ms: int, verdicts: Verdicts) -> Outcome:
    from gateway.core.semantic_vad import CheckTurn, SemanticTurnDetector
    from gateway.core.vad import SpeechStopped, TurnDetector

    detector = SemanticTurnDetector(TurnDetector(), eagerness, pause_ms, recheck_ms)
    outcome = Outcome()
    events: list[Any] = []
    for p in turn.probs:
        events += detector.feed((p,))
        while events:
            ev = events.pop(0)
            if isinstance(ev, CheckTurn):
                prob, cpu_ms = verdicts(turn, ev)
                after = detector.verdict(ev.seq, prob)
                if after and isinstance(after[0], SpeechStopped):
                    outcome.model_ms = cpu_ms  # this verdict ended the turn
                events += after
            elif isinstance(ev, SpeechStopped):
                outcome.commits.append((ev.audio_end_ms, detector.position_ms))
    return outcome


def summarize(voice: str, detector: str, turns: list[Turn], outcomes: list[Outcome]) -> dict[str, Any]:
    import numpy as np

    cut = {"paused": 0, "complete": 0}
    delays = []
    for turn, outcome in zip(turns, outcomes, strict=True):
        if any(end < turn.end_ms - TOLERANCE_MS for end, _ in outcome.commits):
            cut[turn.kind] += 1
        final = [at for end, at in outcome.commits if end >= turn.end_ms - TOLERANCE_MS]
        if final:
            delays.append(final[0] - turn.end_ms + outcome.model_ms)
    d = np.array(delays or [np.nan])
    row = {"kind": "detector", "voice": voice, "detector": detector, "paused_cut": cut["paused"],
           "paused": sum(t.kind == "paused" for t in turns), "complete_cut": cut["complete"],
           "complete": sum(t.kind == "complete" for t in turns), "delay_p50_ms": round(float(np.median(d))),
           "delay_p90_ms": round(float(np.percentile(d, 90))), "delay_max_ms": round(float(d.max())),
           "never_committed": len(turns) - len(delays), "valid": None, "invalid": []}
    print(f"{voice} | {detector} | cut {row['paused_cut']} / {row['paused']} paused, {row['complete_cut']} / "
          f"{row['complete']} complete | delay P50 {row['delay_p50_ms']} P90 {row['delay_p90_ms']} max "
          f"{row['delay_max_ms']} ms", flush=True)
    return row


def load_turns(folder: Path) -> list[Turn]:
    manifest = json.loads((folder / "turns.json").read_text())
    turns = []
    for name, record in manifest.items():
        with wave.open(str(folder / name)) as w:
            pcm = w.readframes(w.getnframes())
        turns.append(Turn(name, record["voice"], record["kind"], pcm, *record["speech_ms"], record["pauses_ms"]))
    return turns


def detectors(args: argparse.Namespace) -> list[dict[str, Any]]:
    import numpy as np

    from gateway.config import load_config
    from gateway.core.semantic_vad import eagerness_levels
    from gateway.runtime.silero import SileroModel, SileroVAD
    from gateway.runtime.smart_turn import SmartTurnModel, features

    if not (args.turns / "turns.json").exists():
        subprocess.run([sys.executable, "-m", "scripts.make_turns", "--out", str(args.turns)], cwd=ROOT, check=True)
    cfg = load_config().semantic_vad
    levels = eagerness_levels(cfg)
    turns = load_turns(args.turns)
    if args.small:  # four of each kind
        turns = [t for t in turns if t.kind == "paused"][:4] + [t for t in turns if t.kind == "complete"][:4]
    silero = SileroModel()
    for turn in turns:
        turn.probs = SileroVAD(silero).process(turn.pcm)
    model = SmartTurnModel(cfg.model_path or None, cfg.model_sha256 or None)
    verdicts = Verdicts(model)
    rows = []
    for voice in dict.fromkeys(t.voice for t in turns):
        group = [t for t in turns if t.voice == voice]
        for silence in map(int, args.server_silence.split(",")):
            rows.append(summarize(voice, f"server_vad, silence {silence} ms", group,
                                  [run_server_vad(t, silence) for t in group]))
        for recheck in map(int, args.recheck_ms.split(",")):
            for level in ("high", "medium", "low"):
                outcomes = [run_semantic(t, levels[level], cfg.pause_ms, recheck, verdicts) for t in group]
                label = f"semantic_vad, {level}" + (f", recheck {recheck} ms" if recheck else "")
                rows.append(summarize(voice, label, group, outcomes))

        def p_complete(turn: Turn, end_ms: int) -> float:
            start = turn.start_ms - 300  # as the detector takes it: prefix_padding_ms before the speech
            return float(model.predict([turn.pcm[start * BYTES_PER_MS : (end_ms + cfg.pause_ms) * BYTES_PER_MS]])[0])

        inside = np.array([p_complete(t, a) for t in group for a, _ in t.pauses_ms])
        ends = np.array([p_complete(t, t.end_ms) for t in group])
        rows.append({"kind": "verdicts", "voice": voice, "pause_ms": cfg.pause_ms,
                     "inside_p_complete_median": round(float(np.median(inside)), 2) if len(inside) else None,
                     "inside_judged_incomplete": int(np.sum(inside < 0.5)), "inside": len(inside),
                     "end_p_complete_median": round(float(np.median(ends)), 2),
                     "end_judged_complete": int(np.sum(ends >= 0.5)), "ends": len(ends), "valid": None, "invalid": []})
    pcm = turns[0].pcm[: turns[0].end_ms * BYTES_PER_MS]
    model.predict([pcm])  # warm-up
    rows.append({"kind": "cpu", "what": "Smart Turn features (resample + log-mel), one turn",
                 "median_ms": round(float(np.median(_thread_times(lambda: features(pcm), 10))) * 1000, 1),
                 "valid": None, "invalid": []})
    for batch in (1, 2, 4, 8, 16):
        feats = np.stack([features(pcm)] * batch)
        per_call = float(np.median(_thread_times(lambda feats=feats: model.infer(feats), 5)))
        rows.append({"kind": "cpu", "what": f"Smart Turn model, batch {batch}", "batch": batch,
                     "median_ms_per_turn": round(per_call * 1000 / batch, 1), "valid": None, "invalid": []})
    return rows


def _thread_times(fn: Callable[[], object], repeat: int) -> list[float]:
    """Per-call CPU seconds of this thread (onnxruntime runs in it with one intra-op thread): other processes
    on the machine do not count."""
    out = []
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        out.append(time.thread_time() - t)
    return out


async def realtime_load(n: int, seconds: float, appends: list[bytes], model: Any, batched: bool,
                        inline_windows: int) -> tuple[float, Any]:
    """n sessions appending 20 ms every 20 ms of wall time: (cores used, result latencies µs)."""
    import numpy as np

    from gateway.runtime.silero import SileroVAD, VadBatcher

    with ThreadPoolExecutor(1) as executor:
        loop = asyncio.get_running_loop()
        batcher = VadBatcher(executor)
        latencies: list[float] = []

        def unbatched(vad: Any, pcm: bytes) -> Awaitable[Any]:
            # what a runner without the batcher does: few windows inline, many in the worker
            if vad.windows_pending(len(pcm)) <= inline_windows:
                future = loop.create_future()
                future.set_result(vad.process(pcm))
                return future
            return loop.run_in_executor(executor, vad.process, pcm)

        async def session(k: int) -> None:
            vad = SileroVAD(model)
            start = t0 + 0.02 * k / n  # the sessions' phases spread over a 20 ms period
            for step in range(int(seconds * 50)):
                due = start + 0.02 * step  # when this append "arrives": latency counts from here
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                pcm = appends[(step + k) % len(appends)]
                await (batcher.process(vad, pcm) if batched else unbatched(vad, pcm))
                latencies.append((time.perf_counter() - due) * 1e6)

        cpu = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(session(k) for k in range(n)))
        return (time.process_time() - cpu) / (time.perf_counter() - t0), np.array(latencies)


def input_path(args: argparse.Namespace) -> list[dict[str, Any]]:
    import numpy as np

    from gateway.audio import InputDecoder, OutputEncoder, alaw_encode, bytes_to_int16, ulaw_encode
    from gateway.core.vad import WINDOW_MS, TurnDetector
    from gateway.runtime.silero import SileroModel, SileroVAD, process_many

    sessions = args.sessions or (10 if args.small else 100)
    seconds = 1.0 if args.small else 2.0
    with wave.open(str(FIXTURES / "two_turns.wav")) as w:
        pcm = w.readframes(w.getnframes())
    appends = [pcm[i : i + APPEND_BYTES] for i in range(0, len(pcm), APPEND_BYTES)]
    model = SileroModel.shared()
    rows: list[dict[str, Any]] = []

    def cost(what: str, seconds_each: list[float] | Any, per: str = "call") -> None:
        us = np.asarray(seconds_each) * 1e6
        rows.append({"kind": "cpu", "what": what, "per": per, "median_us": round(float(np.median(us)), 1),
                     "p99_us": round(float(np.percentile(us, 99)), 1), "valid": None, "invalid": []})

    vad = SileroVAD(model)
    calls, windows = [], []
    for chunk in appends:
        t = time.thread_time()
        windows.append(len(vad.process(chunk)))
        calls.append(time.thread_time() - t)
    calls_a, windows_a = np.array(calls), np.array(windows)
    cost("SileroVAD.process, 20 ms append", calls_a)
    cost("SileroVAD.process, a 20 ms append completing one window", calls_a[windows_a == 1], "window")
    big = SileroVAD(model)
    cost("SileroVAD.process, 2 s append", np.array(_thread_times(lambda: big.process(pcm[:96_000]), 5))
         / (2000 // WINDOW_MS), "window")
    for batch in (8, 32, sessions):
        vads = [SileroVAD(model) for _ in range(batch)]
        times = _thread_times(lambda vads=vads: process_many([(v, pcm[:48_000]) for v in vads]), 3)
        cost(f"process_many, {batch} sessions x 1 s", np.array(times) / (batch * 31), "window")
    probs = SileroVAD(model).process(pcm)
    cost("TurnDetector.feed", np.array(_thread_times(lambda: TurnDetector().feed(probs), 20)) / len(probs), "window")
    x20 = bytes_to_int16(appends[50])
    for fmt, encode in (("g711_ulaw", ulaw_encode), ("g711_alaw", alaw_encode)):
        dec, enc = InputDecoder(fmt), OutputEncoder(fmt)
        payload = encode(x20[::3])
        cost(f"InputDecoder({fmt}).decode, 20 ms", _thread_times(lambda d=dec, p=payload: d.decode(p), 2000))
        cost(f"OutputEncoder({fmt}).encode, 20 ms", _thread_times(lambda e=enc: e.encode(appends[50]), 2000))
    for batched in (False, True):
        cores, latency = asyncio.run(realtime_load(sessions, seconds, appends, model, batched, 4))
        rows.append({"kind": "load", "what": f"{sessions} real-time sessions, "
                     f"{'VadBatcher' if batched else 'one by one'}", "sessions": sessions, "batched": batched,
                     "cores": round(cores, 3), "latency_p50_us": round(float(np.median(latency))),
                     "latency_p99_us": round(float(np.percentile(latency, 99))), "valid": None, "invalid": []})
    for r in rows:
        print(f"{r['what']}: " + ", ".join(f"{k} {v}" for k, v in r.items() if k.endswith(("_us", "cores"))))
    return rows


def lateness(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.vad_lateness import vad_lateness

    sessions = args.lateness_sessions or (10 if args.small else 40)
    seconds = 8.0 if args.small else 20.0
    levels = "0,8" if args.small else args.busy_ms
    rows = []
    for busy in (float(b) for b in levels.split(",")):
        r = asyncio.run(vad_lateness(sessions, seconds, busy, args.every_ms))
        rows.append({"kind": "lateness", "what": f"{sessions} sessions, the loop busy {busy:g} ms every "
                     f"{args.every_ms:g} ms", **r, "valid": None, "invalid": []})
        print(f"VAD late with the loop busy {busy:g}/{args.every_ms:g} ms: P50 {r['late_p50_ms']:.1f}, "
              f"P95 {r['late_p95_ms']:.1f} ms; {r['cpu_s_per_session_min']:.3f} CPU s per session-minute", flush=True)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = detectors(args) + input_path(args) + lateness(args)
    return {"setup": "recorded turns, the input path", "settings": {
        "turns": str(args.turns), "server_silence": args.server_silence, "recheck_ms": args.recheck_ms,
        "small": args.small}, "levels": rows}
