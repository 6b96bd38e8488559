"""What a benchmark starts around its load: the gateway (bench/serve.py: `serve`'s code, probed), the fake
OpenAI-compatible backends, and the cores each gets.

``split_cores(client_cpus)`` gives the load side (load generator and fakes) the last ``client_cpus`` cores
and the gateway with its engine processes the others, as if on two hosts; 0 shares them all. The fakes run as
``processes`` processes on one port (SO_REUSEPORT), each reporting its own lag and latencies
(bench/fake_openai.py); ``Fakes.figures`` gives them for a level.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from bench.load import REPLY
from bench.stats import cores, cpu_spec, pct, rounded

ROOT = Path(__file__).resolve().parent.parent
TINY_HOME = ROOT / "tests" / "data"
STT_MS, LLM_MS = 100.0, 80.0  # the fakes' fixed latencies: transcription, and the LLM's first token


def split_cores(client_cpus: int) -> tuple[str, str]:
    """(the gateway's cores, the load side's), as taskset names them; ("", "") when they share every core."""
    mine = cores()
    if not client_cpus:
        return "", ""
    if not 0 < client_cpus < len(mine):
        raise SystemExit(f"--client-cpus {client_cpus}: leave the gateway at least one of the {len(mine)} cores")
    return cpu_spec(mine[:-client_cpus]), cpu_spec(mine[-client_cpus:])


def free_port(*kinds: int) -> int:
    """A loopback port free for every socket kind in ``kinds`` (TCP when none is named): SIP listens on one port
    for both UDP and TCP. The port may still be taken before it is used; callers that start a peer retry."""
    kinds = kinds or (socket.SOCK_STREAM,)
    while True:
        with socket.socket(socket.AF_INET, kinds[0]) as first:
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            try:
                for kind in kinds[1:]:
                    with socket.socket(socket.AF_INET, kind) as other:
                        other.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(process: subprocess.Popen[Any], timeout: float, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class Gateway:
    """The gateway serving on 127.0.0.1:`port` until stop(); started once every serving process is ready."""

    def __init__(self, settings: dict[str, Any], *, workers: int = 1, cpus: str = "", tone: bool = False,
                 time_http: bool = False, start_timeout_s: float = 1200) -> None:
        self.settings = settings
        self.port = int(settings["server.port"])
        self.stats = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
        (self.stats / "settings.json").write_text(json.dumps(settings, indent=1))
        self.log = self.stats / "gateway.log"
        argv = [sys.executable, "-m", "bench.serve", "--settings", str(self.stats / "settings.json"), "--stats-dir",
                str(self.stats), "--workers", str(workers), *(["--cpus", cpus] if cpus else []),
                *(["--tone"] if tone else []), *(["--time-http"] if time_http else [])]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        self.workers = 0
        self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout: float) -> None:
        out: IO[str] = self.process.stdout  # type: ignore[assignment]
        deadline = time.monotonic() + timeout
        first = out.readline().split()
        if first[:1] == ["workers"]:
            self.workers = int(first[1])
            ready = 0
            while ready < self.workers and time.monotonic() < deadline and out.readline().strip() == "ready":
                ready += 1
            if ready == self.workers:
                return
        _stop(self.process, 90)
        tail = _log_tail(self.log)  # before stop() removes the folder that holds the log
        self.stop()
        raise SystemExit(f"the gateway did not start (exit status {self.process.returncode}):\n{tail}")

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def live_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/live/sessions"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self, start: float, end: float) -> dict[int, list[dict[str, Any]]]:
        """Each serving process's probe records (by pid) inside [start, end] (wall time)."""
        out: dict[int, list[dict[str, Any]]] = {}
        for path in sorted(self.stats.glob("gateway-*.jsonl")):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if start <= record["t"] <= end:
                    out.setdefault(record["pid"], []).append(record)
        return out

    def pids(self) -> list[int]:
        """The serving processes (a worker each with --workers N)."""
        return sorted(int(p.stem.split("-")[1]) for p in self.stats.glob("gateway-*.jsonl"))

    def engine_pids(self) -> list[int]:
        """The engine processes, as the probes last saw them (none in thread mode or before the first probe)."""
        for path in sorted(self.stats.glob("gateway-*.jsonl")):
            lines = path.read_text().splitlines()
            if lines and (engines := json.loads(lines[-1]).get("engine")):
                return [e["pid"] for e in engines if e.get("pid")]
        return []

    def http_times(self) -> dict[str, dict[str, Any]]:
        """--time-http's records, every serving process's ("pid"), by request tag."""
        return {r["id"]: {**r, "pid": path.stem} for path in self.stats.glob("http-*.jsonl")
                for r in map(json.loads, path.read_text().splitlines())}

    def stop(self) -> None:
        _stop(self.process, 90)
        shutil.rmtree(self.stats, ignore_errors=True)


class Fakes:
    """The fake STT and LLM (bench/fake_openai.py) as `processes` processes on one port; ``delegate``: the LLM is a
    GPT-Live voice model that delegates each user turn (fake_openai.delegating)."""

    def __init__(self, processes: int, cpus: str = "", stt_ms: float = STT_MS, llm_ms: float = LLM_MS,
                 reply: str = REPLY, delegate: bool = False) -> None:
        self.processes, self.stt_ms, self.llm_ms = processes, stt_ms, llm_ms
        self.port = free_port()
        self.stats = Path(tempfile.mkdtemp(prefix="bench-fakes-"))
        self.log = self.stats / "fakes.log"
        self._procs: list[subprocess.Popen[str]] = []
        with self.log.open("w") as log:
            for k in range(processes):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.fake_openai", "--port", str(self.port), "--reuse-port",
                     "--stt-ms", f"{stt_ms:g}", "--ttft-ms", f"{llm_ms:g}", "--reply", reply,
                     "--stats", str(self.stats / f"fake-{k}.jsonl"), *(["--cpus", cpus] if cpus else []),
                     *(["--delegate"] if delegate else [])],
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True))
        for proc in self._procs:
            if not (proc.stdout and proc.stdout.readline().startswith("listening")):
                self.stop()
                raise SystemExit(f"the fake backends did not start:\n{_log_tail(self.log)}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def figures(self, start: float, end: float) -> dict[str, Any]:
        """What the fakes saw of themselves over [start, end]: their latencies against the fixed ones, their
        loop lag (the worst process's P99) and the most requests a process held at once."""
        stt: list[float] = []
        llm: list[float] = []
        lag_p99: list[float] = []
        held = 0
        for path in self.stats.glob("fake-*.jsonl"):
            lags: list[float] = []
            for record in map(json.loads, path.read_text().splitlines()):
                if start <= record["t"] <= end + 1.0:
                    stt += record["stt_ms"]
                    llm += record["llm_ms"]
                    lags += record["lags_ms"]
                    held = max(held, record["in_flight_max"])
            if lags:
                lag_p99.append(pct(lags, 99))
        return {"processes": self.processes, "stt_ms": self.stt_ms, "llm_ms": self.llm_ms,
                "stt_p50_ms": rounded(pct(stt, 50)), "stt_p95_ms": rounded(pct(stt, 95)),
                "llm_p50_ms": rounded(pct(llm, 50)), "llm_p95_ms": rounded(pct(llm, 95)),
                "lag_p99_ms": rounded(max(lag_p99, default=float("nan"))), "in_flight_max": held,
                "requests": len(stt) + len(llm)}

    def stop(self) -> None:
        for proc in self._procs:
            _stop(proc, 10)
        shutil.rmtree(self.stats, ignore_errors=True)


def engine_settings(checkpoints: list[Path], device: str, gpus: int, *, max_streams: int, max_frames: int,
                    mode: str = "process") -> dict[str, Any]:
    """The [engine] options of a run: its checkpoints, and one engine process per GPU (``gpus`` of them,
    [engine] devices). The one place a run's GPU count reaches the gateway's configuration. The tiny
    checkpoints of a rehearsal have five speakers: the OpenAI voice the sessions use maps to one of them."""
    devices = ",".join(f"cuda:{i}" for i in range(gpus)) if device == "cuda" else "cpu"
    settings = {"tts.engine": "qwen3", "engine.checkpoint": ",".join(str(c) for c in checkpoints),
                "engine.mode": mode, "engine.device": "cuda" if device == "cuda" else "cpu", "engine.devices": devices,
                "engine.max_streams": max_streams, "engine.max_frames": max_frames}
    if any(Path(c).parent == TINY_HOME for c in checkpoints):
        settings["engine.voices"] = {"alloy": "vivian"}
    return settings


def bench_settings(port: int) -> dict[str, Any]:
    """What every benchmark's gateway sets: its port on loopback, no WebRTC or MCP (no session here calls a tool),
    no drain to wait for at the end (its sessions have ended), and no per-client share of connections (every
    session comes from this one address, all handshaking at once when aligned)."""
    return {"server.host": "127.0.0.1", "server.port": port, "server.drain_seconds": 0.0,
            "server.max_connections_per_client": 1_000_000, "webrtc.enabled": False, "mcp.enabled": False}
