"""A benchmark run as a record: one JSON file under bench/runs/ per run.

A record holds what ran and where, so that a figure can be traced and compared:

- ``suite``, ``setup`` (a short label of what was measured: a model, a number of GPUs), ``settings`` (every
  option the suite ran with) and ``command`` (the exact command line);
- ``date`` (UTC), ``commit`` (``git rev-parse HEAD``, or BENCH_COMMIT where the checkout's own .git is not the
  tree that ran, as on a device host) and ``dirty`` (uncommitted changes outside bench/runs/);
- ``machine``: the CPU model, its cores and the cores the run was given, memory, the GPUs (model, memory, count:
  nvidia-smi, else torch), the host kind when told (``--host-kind``, BENCH_HOST_KIND), Python and torch;
- ``levels``: each level's figures, and its load side's: what the load generator and the fake backends saw of
  themselves, ``valid`` and, when not, ``invalid`` (why: bench/validity.py);
- ``targets``: each target the levels bear on (bench/targets.py), with its bound and whether it was met;
- ``small``: a --small rehearsal (its records go to bench/runs/small/, which git ignores: not results);
- ``imported``: where a record was turned from a figure measured before the tool existed (its levels' load side
  was not checked: ``valid`` is null).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "bench" / "runs"


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``python -m bench`` and its arguments."""
    return shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])


def commit() -> tuple[str, bool]:
    """(the commit that ran, whether the tree had changes beside it)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"], False
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!bench/runs"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return head, bool(status.strip())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def gpus() -> list[dict[str, Any]]:
    """The host's GPUs (name, memory GiB): nvidia-smi's, else torch's when torch is already imported."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            return [{"name": name.strip(), "memory_gib": round(float(mib) / 1024, 1)}
                    for name, mib in (line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line)]
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return [{"name": torch.cuda.get_device_name(i),
                 "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                for i in range(torch.cuda.device_count())]
    return []


def machine(host_kind: str = "", cores_used: list[int] | None = None) -> dict[str, Any]:
    torch = sys.modules.get("torch")
    found = gpus()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_used": len(cores_used) if cores_used is not None else len(os.sched_getaffinity(0)),
        "memory_gib": _memory_gib(),
        "gpus": found,
        "gpu_count": len(found),
        "host_kind": host_kind or None,
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "kernel": platform.release(),
    }


def card(record: dict[str, Any]) -> str:
    """The machine in a few words, as the page names it: "1 x NVIDIA H200, 16 cores" or "AMD EPYC, 2 cores"."""
    m = record["machine"]
    cores = f"{m['cores_used']} cores" if m.get("cores_used") else f"{m.get('cores')} cores"
    if m.get("gpus"):
        names = sorted({g["name"] for g in m["gpus"]})
        return f"{m['gpu_count']} x {', '.join(names)}, {cores}"
    return f"{m.get('cpu') or 'CPU'}, {cores}"


def file_name(record: dict[str, Any]) -> str:
    stamp = record["date"].replace("-", "").replace(":", "").replace("T", "-").rstrip("Z")
    slug = re.sub(r"[^a-z0-9]+", "-", record["setup"].lower()).strip("-")[:60]
    return f"{stamp}-{record['suite']}-{slug}.json"


def write(record: dict[str, Any], folder: Path) -> Path:
    """The record as bench/runs/NAME.json (a --small rehearsal's in bench/runs/small/)."""
    target = folder / "small" if record.get("small") else folder
    target.mkdir(parents=True, exist_ok=True)
    path = target / file_name(record)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def load(folder: Path = RUNS) -> list[dict[str, Any]]:
    """Every result record in `folder` (rehearsals aside), each with its file's name as ``file``."""
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        record["file"] = path.name
        records.append(record)
    return records
