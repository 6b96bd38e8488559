"""`python -m gateway serve --workers 2` as a real subprocess on a loopback port, read through its log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import no_error_lines_in
from tests.paths import ROOT

START_TIMEOUT_S = 180  # two workers loading their models on a shared CPU


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for(self, pattern: str, count: int = 1, timeout: float = START_TIMEOUT_S) -> list[re.Match[str]]:
        """The first `count` matches of `pattern` in the log, once there are that many."""
        deadline = time.monotonic() + timeout
        while len(found := list(re.finditer(pattern, self.text(), re.M))) < count:
            assert self.process.poll() is None, f"the gateway exited ({self.process.returncode}):\n{self.text()}"
            assert time.monotonic() < deadline, f"no {count} x {pattern!r} ({self.where()}) in:\n{self.text()}"
            await asyncio.sleep(0.1)
        return found[:count]

    def where(self) -> str:
        """What the parent and its workers are waiting on in the kernel, should a wait time out."""
        pids = [self.process.pid, *self.worker_pids().values()]
        states = []
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                states.append(f"{pid} {stat} {Path(f'/proc/{pid}/wchan').read_text() or '-'}")
            except OSError:
                states.append(f"{pid} gone")
        return "; ".join(states)

    def worker_pids(self) -> dict[int, int]:
        """The latest pid of each worker, from the parent's log."""
        return {int(slot): int(pid) for slot, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", self.text())}

    async def worker_of(self, session_id: str) -> int:
        pattern = rf"worker\[(\d+)\] gateway\.runtime\.gateway: session {session_id} opened"
        return int((await self.wait_for(pattern, timeout=60))[0][1])

    async def healthz(self) -> dict:
        """/healthz over a new connection (so that any worker may answer)."""
        url = f"http://127.0.0.1:{self.port}/healthz"
        return json.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read()))

    async def metric(self, name: str) -> float:
        url = f"http://127.0.0.1:{self.port}/metrics"
        text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())).decode()
        return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def launch(tmp_path: Path, workers: int, **env: str) -> Gateway:
    """`serve --workers N` started and left to the test (no wait for it, no stop): its log in tmp_path."""
    log = tmp_path / "gateway.log"
    environ = {**os.environ, "GATEWAY_WEBRTC_ENABLED": "false", "GATEWAY_LOCAL_STT": "false", "OMP_NUM_THREADS": "1",
               **env}
    environ.pop("GATEWAY_API_KEYS", None)
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--workers", str(workers), "--port", "0"],
                                   cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT)
    return Gateway(process, log)


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, port: int = 0, **env: str) -> AsyncIterator[Gateway]:
    log = tmp_path / "gateway.log"
    environ = {**os.environ, "GATEWAY_WEBRTC_ENABLED": "false", "GATEWAY_LOCAL_STT": "false",
               "GATEWAY_MCP_ENABLED": "false", "OMP_NUM_THREADS": "1", **env}
    environ.pop("GATEWAY_API_KEYS", None)
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--workers", "2", "--port", str(port)],
                                   cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT)
    gateway = Gateway(process, log)
    try:
        ready = await gateway.wait_for(
            r"worker\[\d\] gateway\.server\.serve: gateway \S+ ready: open https?://127\.0\.0\.1:(\d+)/", 2)
        gateway.port = int(ready[0][1])
        yield gateway
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    no_error_lines_in(gateway.text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def engine_processes(parent: int) -> list[int]:
    """Engine processes started by `parent` (their command line names it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if b"engine.process" in args and f"{parent}".encode() in args and not gone(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
    return found
