"""What every part of a benchmark measures the same way: percentiles, an event loop's lag, cores to run on."""

from __future__ import annotations

import asyncio
import math
import os
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

LAG_TICK_S = 0.01


async def lag_probe(record: Callable[[float], None]) -> None:
    """A 10 ms timer in this process's loop: records how late (seconds) it fires, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LAG_TICK_S
        await asyncio.sleep(LAG_TICK_S)
        record(loop.time() - due)


def pct(values: Iterable[float], q: float) -> float:
    """The q-th percentile of the values that are numbers; NaN when there are none."""
    numbers = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.percentile(numbers, q)) if numbers else math.nan


def rounded(value: float, digits: int = 2) -> float | None:
    """A figure as a record keeps it: rounded, and None (JSON's null) for NaN."""
    return None if value is None or math.isnan(value) else round(value, digits)


def core_wait_s() -> float:
    """How long this process's main thread has waited for a core, in all (Linux's /proc/self/schedstat; 0 where
    there is none)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def thread_cpu_s() -> dict[str, float]:
    """This process's CPU time by thread (Linux's /proc/self/task; {} where there is none): Python's threads by
    their name less its number ("vad_0": "vad"), the others (ZeroMQ's I/O threads) by their own."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            name = names.get(int(tid)) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        name = re.sub(r"_\d+$", "", name)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_list(spec: str) -> list[int]:
    """Cores named as taskset names them ("0-11,14"); [] for ""."""
    cores: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores


def cpu_spec(cores: Iterable[int]) -> str:
    """The opposite of cpu_list: "0-11,14"."""
    spans: list[list[int]] = []
    for core in sorted(set(cores)):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def pin(spec: str) -> None:
    """Run this process (and what it starts from now on) on the cores `spec` names; nothing for ""."""
    if spec:
        os.sched_setaffinity(0, cpu_list(spec))


def cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))
