"""Engine processes for a host: one per device, each started again when it dies.

EngineSupervisor runs `python -m engine.process` once per device with the [engine] options, waits until
each says it is ready, then watches each from a thread: one that exits is started again, after a pause
that grows while it keeps dying soon after its start, and meanwhile its clients fail the streams it held
(gateway.responders.engine_client). The endpoints are IPC sockets in a folder only this user can open (a private
temporary one unless [engine] ipc_dir names one). Whoever starts the gateway's processes starts one
supervisor and hands `endpoints` to every gateway process; the engine processes exit by themselves if the
supervisor's process dies. This module imports neither torch nor zmq.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
# A process that lived this long before it died is restarted after the shortest pause.
STABLE_S = 60.0
FIRST_PAUSE_S, LONGEST_PAUSE_S = 1.0, 30.0


class EngineStartError(RuntimeError):
    """An engine process could not start (bad checkpoint, no such device, ...); the message says why."""


@dataclasses.dataclass
class _Engine:
    index: int
    device: str
    endpoint: str
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    restarts: int = 0
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: str | None = None


def gpu_count(python: str = sys.executable) -> int:
    """GPUs torch sees, asked in a child process (the caller stays free of torch and CUDA), or of this process's
    torch when it has loaded it already."""
    torch = sys.modules.get("torch") if python == sys.executable else None
    if torch is not None:
        return int(torch.cuda.device_count())
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True,
                         text=True, check=False)
    return int(out.stdout.strip() or 0) if out.returncode == 0 else 0


def resolve_devices(devices: str, device: str) -> list[str]:
    """[engine] devices: a comma-separated list ("cuda:0,cuda:1", "cpu"), or "auto": every GPU, one engine
    process each, or one on [engine] device when that names a device or there is no GPU."""
    if devices.strip() and devices.strip() != "auto":
        return [d.strip() for d in devices.split(",") if d.strip()]
    if device not in ("auto", "cuda"):
        return [device]
    return [f"cuda:{i}" for i in range(gpu_count())] or ["cpu"]


class EngineSupervisor:
    def __init__(self, options: dict[str, Any], devices: list[str], ipc_dir: str = "", heartbeat_ms: float = 500,
                 python: str = sys.executable) -> None:
        """`options`: the [engine] options (EngineConfig as a dict) each engine process is built from."""
        if not devices:
            raise EngineStartError("[engine] devices: no device to run an engine process on")
        self.options = options
        self.heartbeat_ms = heartbeat_ms
        self.python = python
        self._own_dir = not ipc_dir
        folder = Path(ipc_dir or tempfile.mkdtemp(prefix="voice-gateway-engine-"))  # mkdtemp makes it 0700
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = folder
        self._engines = [_Engine(i, d, f"ipc://{folder}/engine-{i}.sock") for i, d in enumerate(devices)]
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # no process is started once stop() has begun
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_config(cls, config: Any) -> EngineSupervisor:
        """From gateway.config.EngineConfig (duck-typed: the engine does not import the gateway's config)."""
        return cls(dataclasses.asdict(config), resolve_devices(config.devices, config.device), config.ipc_dir,
                   config.heartbeat_ms)

    @property
    def endpoints(self) -> list[str]:
        return [e.endpoint for e in self._engines]

    @property
    def pids(self) -> list[int | None]:
        return [e.proc.pid if e.proc is not None else None for e in self._engines]

    def start(self, timeout: float) -> None:
        """Start every engine process and wait until all are ready; EngineStartError (and everything
        stopped) when one cannot start within `timeout` seconds."""
        for engine in self._engines:
            self._spawn(engine)
            thread = threading.Thread(target=self._watch, args=(engine,), name=f"engine-{engine.index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        deadline = time.monotonic() + timeout
        for engine in self._engines:
            if not engine.ready.wait(max(0.0, deadline - time.monotonic())):
                engine.error = engine.error or f"not ready after {timeout:.0f} s ([engine] start_timeout_s)"
            if engine.error is not None:
                self.stop()
                raise EngineStartError(f"engine process on {engine.device}: {engine.error}")

    def stop(self) -> None:
        """Stop every engine process (SIGTERM, then SIGKILL after 10 s)."""
        with self._lock:
            self._stopping.set()
            procs = [e.proc for e in self._engines if e.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for thread in self._threads:
            thread.join(5)
        if self._own_dir:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _spawn(self, engine: _Engine) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        options = dict(self.options)
        if engine.device.startswith("cuda"):
            # One visible GPU per process: its CUDA graphs, streams and allocations all land on it.
            index = int(engine.device.partition(":")[2] or 0)
            visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
            env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
            options["device"] = "cuda"
        else:
            options["device"] = engine.device
        cmd = [self.python, "-m", "engine.process", "--endpoint", engine.endpoint, "--config", json.dumps(options),
               "--heartbeat-ms", str(self.heartbeat_ms), "--parent", str(os.getpid())]
        engine.ready.clear()
        engine.error = None
        engine.started = time.monotonic()
        engine.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)

    def _watch(self, engine: _Engine) -> None:
        """The engine's thread: wait for its ready line, keep its stdout drained, restart it when it dies."""
        pause = FIRST_PAUSE_S
        while True:
            proc = engine.proc
            assert proc is not None and proc.stdout is not None
            status = _ready_line(proc.stdout)
            if status.get("ready"):
                if engine.restarts:
                    log.info("engine process on %s is ready again (pid %d)", engine.device, proc.pid)
                engine.ready.set()
                for line in proc.stdout:  # the engine logs to stderr; anything else on stdout is passed on
                    sys.stderr.write(line)
            code = proc.wait()
            engine.error = status.get("error") or f"exited with status {code} before it was ready"
            if self._stopping.is_set():
                return
            if not engine.ready.is_set() and engine.restarts == 0:
                engine.ready.set()  # a first start that failed: start() reports it and stops everything
                return
            pause = FIRST_PAUSE_S if time.monotonic() - engine.started > STABLE_S else min(2 * pause, LONGEST_PAUSE_S)
            log.warning("engine process on %s (pid %d) exited with status %s%s; restarting it in %.0f s",
                        engine.device, proc.pid, code, f" ({status['error']})" if "error" in status else "", pause)
            if self._stopping.wait(pause):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                engine.restarts += 1
                self._spawn(engine)


def _ready_line(stdout: IO[str]) -> dict[str, Any]:
    """The engine process's {"ready": ...} or {"error": ...} line; {} when it exits without one."""
    for line in stdout:
        try:
            status = json.loads(line)
        except json.JSONDecodeError:
            status = None
        if isinstance(status, dict) and ("ready" in status or "error" in status):
            return status
        sys.stderr.write(line)
    return {}

