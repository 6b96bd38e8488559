"""When a level's figures are a result: the load side, what the benchmark itself runs, kept up.

A benchmark is never the bottleneck. The load generator and the fake backends each report their own lag and
queueing beside the figures (bench/load.py, bench/fake_openai.py), and a level is INVALID, reported with
the reasons and never as a result, when any of these holds:

- a load-generator process's event loop lag P99 is over ``LAG_P99_MS`` (5 ms): it was late at sending the
  audio and at reading what came back, so the latencies it measured hold its own wait;
- a session connected after its start time (``late_starts``): the arrivals were not the ones planned;
- a phone call was not answered (``unanswered_calls``, bench/sip_load.py): the level is not the size it says;
- the fake STT's latency P95, or the fake LLM's first-token P95, each from its request's arrival to its
  answer's first bytes as the fake saw it, is over its fixed value by more than ``FAKE_OVER`` (10%): 110 ms
  for the STT's 100, 88 ms for the first token's 80;
- a fake process's event loop lag P99 is over ``LAG_P99_MS``: requests waited for it before it saw them
  arrive.

The bounds can be tightened or loosened per run (``--max-load-lag-ms``, ``--max-fake-over``); the record keeps
the ones it was judged by.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

LAG_P99_MS = 5.0
FAKE_OVER = 0.10


@dataclass(frozen=True)
class Bounds:
    lag_p99_ms: float = LAG_P99_MS
    fake_over: float = FAKE_OVER

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _over(value: float | None, bound: float) -> bool:
    return value is not None and not math.isnan(value) and value > bound


def judge(load: dict[str, Any], bounds: Bounds) -> list[str]:
    """Why a level's load side did not keep up ([] when it did), from its ``load`` figures."""
    reasons = []
    lag = load.get("client_lag_p99_ms")
    if _over(lag, bounds.lag_p99_ms):
        reasons.append(f"load generator lag P99 {lag:.1f} ms > {bounds.lag_p99_ms:g} ms")
    if load.get("late_starts"):
        reasons.append(f"{load['late_starts']} sessions started late")
    if load.get("unanswered_calls"):
        reasons.append(f"{load['unanswered_calls']} calls not answered")
    fake = load.get("fake") or {}
    for name, key, fixed in (("STT", "stt_p95_ms", "stt_ms"), ("LLM first token", "llm_p95_ms", "llm_ms")):
        bound = fake.get(fixed, 0) * (1 + bounds.fake_over)
        if fake.get(fixed) and _over(fake.get(key), bound):
            reasons.append(f"fake {name} P95 {fake[key]:.1f} ms > {bound:.0f} ms ({fake[fixed]:g} ms fixed)")
    if _over(fake.get("lag_p99_ms"), bounds.lag_p99_ms):
        reasons.append(f"fake backends' lag P99 {fake['lag_p99_ms']:.1f} ms > {bounds.lag_p99_ms:g} ms")
    return reasons


def mark(level: dict[str, Any], bounds: Bounds) -> dict[str, Any]:
    """`level` with ``valid`` and ``invalid`` (the reasons) set from its ``load`` figures."""
    reasons = judge(level.get("load") or {}, bounds)
    level["valid"] = not reasons
    level["invalid"] = reasons
    return level
