"""The product's targets, each a bound on one figure of the levels it names.

A target applies to the levels of a record whose fields equal its ``where``; its figure is the worst of them
(the highest: every bound here is an upper one), and it is met when at least ``runs`` of them are valid
(bench/validity.py) and every valid one is within the bound. Invalid levels are not results: a target whose
levels are all invalid is reported as such, with no figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    id: str
    suite: str
    what: str
    figure: str  # the level's key
    bound: float
    unit: str
    where: dict[str, Any] = field(default_factory=dict)
    strict: bool = False  # figure < bound (else <=)
    runs: int = 1  # valid levels needed: the capacity targets hold in two runs in a row

    @property
    def bound_text(self) -> str:
        return f"{'<' if self.strict else '≤'} {self.bound:g}{' ' + self.unit if self.unit else ''}"

    def within(self, value: float) -> bool:
        return value < self.bound if self.strict else value <= self.bound


def _capacity(model: str, per_gpu: int, cpu: bool) -> list[Target]:
    where = {"protocol": "realtime", "responder": "pipeline", "tts": "engine", "model": model,
             "sessions_per_gpu": per_gpu, "arrivals": "poisson"}
    label = f"{model.upper()}, {per_gpu} sessions per GPU, Poisson, two runs"
    prefix = f"gateway.{model}.{per_gpu}"
    targets = [
        Target(f"{prefix}.first_delta", "gateway", f"stop → first delta P95 ({label})", "first_delta_p95_ms", 250,
               "ms", where, runs=2),
        Target(f"{prefix}.vad_late", "gateway", f"VAD late P95 ({label})", "vad_late_p95_ms", 40, "ms", where,
               runs=2),
        Target(f"{prefix}.worker_lag", "gateway", f"worst worker loop lag P99 ({label})", "worker_lag_p99_ms", 20,
               "ms", where, runs=2),
        Target(f"{prefix}.barge_in", "gateway", f"barge-in P95 ({label})", "barge_in_p95_ms", 5, "ms", where,
               runs=2),
        Target(f"{prefix}.audio_errors", "gateway", f"audio errors ({label})", "audio_errors", 0, "", where, runs=2),
    ]
    if cpu:
        # The whole product's: the workers' and the engine processes' (which run every worker's VAD).
        targets.append(Target(f"{prefix}.product_cpu", "gateway",
                              f"CPU per session-minute, workers + engines ({label})", "product_cpu_s_per_session_min",
                              0.20, "s", where, runs=2))
    return targets


def _live_capacity(model: str, per_gpu: int) -> list[Target]:
    """The capacity targets mapped to GPT-Live sessions (bench/suites/gateway.py's docstring says how): no
    speech_stopped, so the turn is timed from the end of speech in the audio and its pause, its VAD lateness and
    the output clock's tick (up to 100 ms) inside the figure; barge-in is the user's speech start to our speech's
    last audible sample (the VAD's min_speech_ms 64, a window of 32, its batch interval of 10, a tick of 100 and
    the 40 of VAD lateness)."""
    where = {"protocol": "live", "responder": "pipeline", "tts": "engine", "model": model,
             "sessions_per_gpu": per_gpu, "arrivals": "poisson"}
    label = f"GPT-Live, {model.upper()}, {per_gpu} sessions per GPU, Poisson, two runs"
    prefix = f"gateway.live.{model}.{per_gpu}"
    return [
        Target(f"{prefix}.first_delta", "gateway", f"turn end → first audio P95 ({label})", "first_delta_p95_ms",
               390, "ms", where, runs=2),
        Target(f"{prefix}.worker_lag", "gateway", f"worst worker loop lag P99 ({label})", "worker_lag_p99_ms", 20,
               "ms", where, runs=2),
        Target(f"{prefix}.barge_in", "gateway", f"barge-in, speech start → our speech silent, P95 ({label})",
               "barge_in_p95_ms", 250, "ms", where, runs=2),
        Target(f"{prefix}.audio_errors", "gateway", f"audio errors ({label})", "audio_errors", 0, "", where, runs=2),
    ]


def _sip_capacity(model: str, per_gpu: int) -> list[Target]:
    """The capacity targets mapped to phone calls (bench/sip_load.py says how each is timed): VAD late as Realtime's,
    from the gateway's trace; stop → first audio heard, which holds the wait for the media clock's next 20 ms tick;
    barge-in as the phone hears it, the caller's speech start to the agent's last audible sample (no event says
    when the gateway heard the caller: the VAD's min_speech_ms 64, a window of 32, its batch interval of 10, a tick
    of 20 and the 40 of VAD lateness)."""
    where = {"protocol": "sip", "responder": "pipeline", "tts": "engine", "model": model,
             "sessions_per_gpu": per_gpu, "arrivals": "poisson"}
    label = f"SIP calls, {model.upper()}, {per_gpu} calls per GPU, Poisson, two runs"
    prefix = f"gateway.sip.{model}.{per_gpu}"
    return [
        Target(f"{prefix}.first_delta", "gateway", f"stop → first audio heard P95 ({label})", "first_delta_p95_ms",
               270, "ms", where, runs=2),
        Target(f"{prefix}.vad_late", "gateway", f"VAD late P95 ({label})", "vad_late_p95_ms", 40, "ms", where,
               runs=2),
        Target(f"{prefix}.worker_lag", "gateway", f"worst worker loop lag P99 ({label})", "worker_lag_p99_ms", 20,
               "ms", where, runs=2),
        Target(f"{prefix}.barge_in", "gateway", f"barge-in, speech start → the agent's audio stops, P95 ({label})",
               "barge_in_p95_ms", 170, "ms", where, runs=2),
        Target(f"{prefix}.audio_errors", "gateway", f"audio errors ({label})", "audio_errors", 0, "", where, runs=2),
    ]


def _one_process(responder: str, sessions: int, **more: Any) -> dict[str, Any]:
    """Realtime sessions on one gateway process."""
    return {"protocol": "realtime", "responder": responder, **more, "workers": 1, "sessions": sessions}


def _stream(model: str, mode: str, streams: int, arrival: str = "at once") -> dict[str, Any]:
    return {"kind": "stream", "model": model, "mode": mode, "streams": streams, "arrival": arrival}


TARGETS: tuple[Target, ...] = (
    *_capacity("0.6b", 1000, cpu=True),
    *_capacity("1.7b", 800, cpu=False),
    *_live_capacity("0.6b", 1000),
    *_live_capacity("1.7b", 800),
    *_sip_capacity("0.6b", 1000),
    Target("gateway.echo.100.lag", "gateway", "loop lag P99, one process, echo, 100 sessions", "worker_lag_p99_ms", 20,
           "ms", _one_process("echo", 100)),
    Target("gateway.echo.100.barge_in", "gateway", "barge-in P95, one process, echo, 100 sessions",
           "barge_in_p95_ms", 5, "ms", _one_process("echo", 100)),
    Target("gateway.tone.1.first_delta", "gateway", "stop → first delta P95, one process, tone TTS, 1 session",
           "first_delta_p95_ms", 250, "ms", _one_process("pipeline", 1, tts="tone")),
    Target("gateway.tone.50.first_delta", "gateway", "stop → first delta P95, one process, tone TTS, 50 sessions",
           "first_delta_p95_ms", 250, "ms", _one_process("pipeline", 50, tts="tone")),
    Target("gateway.tone.50.cancel", "gateway", "cancel → last delta P95, one process, tone TTS, 50 sessions",
           "cancel_to_last_delta_p95_ms", 5, "ms", _one_process("pipeline", 50, tts="tone")),
    Target("engine.0.6b.1.first_audio", "engine", "first audio P95, 0.6B, 1 stream", "first_audio_p95_ms", 8.3, "ms",
           _stream("0.6b", "speaker", 1)),
    Target("engine.0.6b.1.rtf", "engine", "RTF, 0.6B, 1 stream", "rtf_max", 0.05, "", _stream("0.6b", "speaker", 1)),
    Target("engine.0.6b.64.first_audio", "engine", "first audio P95, 0.6B, 64 streams at once", "first_audio_p95_ms",
           100, "ms", _stream("0.6b", "speaker", 64)),
    Target("engine.0.6b.64.rtf", "engine", "RTF max, 0.6B, 64 streams at once", "rtf_max", 0.15, "",
           _stream("0.6b", "speaker", 64)),
    Target("engine.0.6b.1024.first_audio", "engine", "first audio P95, 0.6B, 1024 streams at once",
           "first_audio_p95_ms", 200, "ms", _stream("0.6b", "speaker", 1024), strict=True),
    Target("engine.0.6b.1024.rtf", "engine", "RTF max, 0.6B, 1024 streams at once", "rtf_max", 1, "",
           _stream("0.6b", "speaker", 1024), strict=True),
    Target("engine.0.6b.1024s.first_audio", "engine", "first audio P95, 0.6B, 1024 streams at all times (staggered)",
           "first_audio_p95_ms", 200, "ms", _stream("0.6b", "speaker", 1024, "staggered"), strict=True),
    Target("engine.0.6b.1024s.rtf", "engine", "RTF max, 0.6B, 1024 streams at all times (staggered)", "rtf_max", 1,
           "", _stream("0.6b", "speaker", 1024, "staggered"), strict=True),
    Target("engine.1.7b.512.first_audio", "engine", "first audio P95, 1.7B, 512 streams at once", "first_audio_p95_ms",
           200, "ms", _stream("1.7b", "speaker", 512), strict=True),
    Target("engine.1.7b.512.rtf", "engine", "RTF max, 1.7B, 512 streams at once", "rtf_max", 1, "",
           _stream("1.7b", "speaker", 512), strict=True),
    Target("engine.0.6b-base.icl.1", "engine", "first audio P95, 0.6B Base in-context clone, 1 stream",
           "first_audio_p95_ms", 20, "ms", _stream("0.6b-base", "icl", 1)),
    Target("engine.0.6b-base.icl.256", "engine", "first audio P95, 0.6B Base in-context clones, 256 at once",
           "first_audio_p95_ms", 200, "ms", _stream("0.6b-base", "icl", 256)),
    Target("engine.0.6b-base.icl.256.rtf", "engine", "RTF max, 0.6B Base in-context clones, 256 at once", "rtf_max",
           1, "", _stream("0.6b-base", "icl", 256), strict=True),
    Target("engine.0.6b-base.prepare", "engine", "preparing an in-context clone of 10 s, 0.6B Base (max of 5)",
           "max_ms", 60, "ms", {"kind": "prepare", "model": "0.6b-base", "mode": "icl"}),
    Target("engine.codec.256", "engine", "codec packet step (4 frames) at batch 256", "ms", 30, "ms",
           {"kind": "step", "step": "packet", "batch": 256}),
    *(Target(f"speech.http.{c}", "speech", f"HTTP added to the first audio P95, {c} at once", "http_p95_ms",
             5, "ms", {"concurrency": c, "sessions": 0}) for c in (1, 24, 64, 256)),
    Target("speech.http.24.sessions", "speech", "HTTP added P95, 24 requests beside 200 realtime sessions",
           "http_p95_ms", 5, "ms", {"concurrency": 24, "sessions": 200}),
    Target("local.1", "local", "end of speech → first audio P50, local models, 1 session",
           "end_of_speech_to_first_delta_p50_ms", 1500, "ms", {"sessions": 1}),
    Target("phone.sip.added", "phone", "what SIP adds to end of speech → first audio P95, against WebSocket (fake "
           "backends, tone TTS)", "added_p95_ms", 20, "ms", {"measure": "latency", "path": "sip",
                                                            "responder": "pipeline"}),
    Target("balancer.drain", "balancer", "sessions lost when a gateway behind nginx drains", "sessions_lost", 0, "",
           {"measure": "drain"}),
)


# What a level written before a field existed had: the gateway suite ran Realtime sessions only.
_BEFORE = {"protocol": "realtime"}


def _matches(level: dict[str, Any], where: dict[str, Any]) -> bool:
    return all(level.get(key, _BEFORE.get(key)) == value for key, value in where.items())


def evaluate(suite: str, levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of the suite's targets that the levels bear on: its figure (the worst valid one), bound and verdict."""
    out = []
    for target in (t for t in TARGETS if t.suite == suite):
        matching = [lv for lv in levels if _matches(lv, target.where) and lv.get(target.figure) is not None]
        if not matching:
            continue
        # valid None: a level imported from before the tool, whose load side was not checked
        valid = [lv for lv in matching if lv.get("valid") is not False]
        values = [float(lv[target.figure]) for lv in valid if not math.isnan(float(lv[target.figure]))]
        worst = max(values) if values else None
        if worst is None:
            status = "invalid"
        elif len(values) < target.runs:
            status = f"{len(values)} of {target.runs} runs"
        else:
            status = "met" if all(target.within(v) for v in values) else "not met"
        out.append({"id": target.id, "what": target.what, "figure": worst, "bound": target.bound_text,
                    "unit": target.unit, "runs": len(values), "invalid_runs": len(matching) - len(valid),
                    "status": status, "met": status == "met",
                    "load_checked": all(lv.get("valid") is not None for lv in valid)})
    return out


def by_id() -> dict[str, Target]:
    return {t.id: t for t in TARGETS}
