"""Where a gateway process's CPU goes, by stage: py-spy samples the running process, and each sample is
counted against the stage its stack is in.

    python -m bench.cpu_stages PID [--seconds 15] [--raw out.txt]

A sample's stage is decided by its innermost frame of the gateway's own code (its module says which stage:
the VAD and its batcher, Smart Turn, the backend clients, the responders, the transport, the protocol core
and the session runner), else by the library it is in (openai/aiohttp: backends; websockets/uvicorn/httptools:
transport), else it is the event loop itself or the hand-off of executor results. Samples whose innermost
frame waits (epoll, a condition, a queue) are idle, not CPU. ``python -m bench gateway --profile S`` runs this
on a gateway process during each level and reports CPU seconds per session-minute by stage.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The innermost gateway frame decides, by its module.
GATEWAY_STAGES = (
    ("vad", ("gateway/runtime/silero.py", "gateway/core/vad.py", "gateway/runtime/batcher.py")),
    ("smart_turn", ("gateway/runtime/smart_turn.py", "gateway/core/semantic_vad.py")),
    ("backends", ("gateway/responders/remote.py", "gateway/responders/engine_client.py")),
    ("responder", ("gateway/responders/",)),
    ("transport", ("gateway/server/", "gateway/transports/")),
    ("protocol", ("gateway/realtime/", "gateway/runtime/", "gateway/audio.py")),
)
LIBRARY_STAGES = (
    ("backends", ("openai/", "aiohttp/", "httpx", "zmq/")),
    ("transport", ("websockets/", "uvicorn/", "starlette/", "httptools/")),
)
WAITING = ("EpollSelector.select", "Condition.wait", "Event.wait", "SimpleQueue.get",
           "_worker (concurrent/futures/thread.py:", "Socket.poll (zmq/", "Poller.poll (zmq/")
STAGES = ("vad", "smart_turn", "protocol", "transport", "backends", "responder", "event loop", "executor hand-off")


def stage_of(frames: list[str]) -> str | None:
    """The stage of one sampled stack (innermost frame last); None when it waits."""
    if any(key in frames[-1] for key in WAITING):
        return None
    for table in (GATEWAY_STAGES, LIBRARY_STAGES):
        for frame in reversed(frames):
            for stage, keys in table:
                if any(key in frame for key in keys):
                    return stage
    return "executor hand-off" if any("concurrent/futures/thread.py" in f for f in frames) else "event loop"


def shares(raw: str) -> dict[str, float]:
    """Each stage's share of the busy samples in py-spy's raw (collapsed) output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and (stage := stage_of(stack.split(";"))) is not None:
            counts[stage] += int(n)
    busy = sum(counts.values())
    return {stage: counts[stage] / busy if busy else 0.0 for stage in STAGES}


def thread_shares(raw: str) -> dict[str, float]:
    """Each thread's share (by name) of the busy samples in py-spy's raw output: an engine process's step loop
    (MainThread) beside its VAD's and its sockets' threads."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if stack and not any(key in frames[-1] for key in WAITING):
            counts[frames[0].rpartition(": ")[2] if frames[0].startswith("thread (") else "?"] += int(n)
    busy = sum(counts.values())
    return {name: count / busy for name, count in counts.most_common()} if busy else {}


def record(pid: int, seconds: float, rate: int = 250) -> str | None:
    """py-spy's raw samples of `pid` over `seconds`, every thread; None when py-spy is missing or fails."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "raw.txt"
        done = subprocess.run([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate",
                               str(rate), "--format", "raw", "--nonblocking", "--threads", "--output", str(out)],
                              capture_output=True, text=True, timeout=seconds + 60)
        if done.returncode != 0 or not out.exists():
            print(f"py-spy failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
            return None
        return out.read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pid", type=int)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples here")
    args = parser.parse_args()
    raw = record(args.pid, args.seconds)
    if raw is None:
        return 1
    if args.raw:
        args.raw.write_text(raw)
    for stage, share in shares(raw).items():
        print(f"{stage:18s} {share:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
