"""Installs PyTorch into this interpreter's environment, the build that fits the machine:

    python scripts/install_torch.py torch==2.13.0 [pip options]
    python scripts/install_torch.py --dry-run torch==2.13.0     # says what it would install, and why

PyPI's Linux wheel of torch is the CUDA build: it requires the nvidia-* wheels of CUDA's libraries (for
2.13.0 on x86-64 about 2.6 GB of downloads, torch's own 0.5 GB among them). A machine without an NVIDIA GPU
has no use for them: PyTorch's CPU index has the CPU build (about 0.2 GB). So:

- no NVIDIA GPU: the CPU index, or PyPI where that index cannot be reached (a network that reaches PyPI
  only), said in a warning: on Linux PyPI's is the CUDA build, unless pip finds a CPU wheel in its
  find-links;
- an NVIDIA GPU (``nvidia-smi -L`` lists one, or the driver's /proc/driver/nvidia/gpus has one): PyPI's
  CUDA build (CUDA 13, which needs a driver of the 580 series or newer);
- ``TORCH_INDEX`` decides instead: ``cpu``, ``cuda``, or the URL of an index to install from and from
  nothing else (another CUDA version's, e.g. https://download.pytorch.org/whl/cu128, or a mirror).

The Makefile's setup, the Dockerfile (its TORCH_INDEX build argument) and tests/test_package.py install torch
through this file. The standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROC_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver drives
REACH_TIMEOUT_S = 10


@dataclass(frozen=True)
class Plan:
    index_url: str | None  # None: pip's own index (PyPI, or what pip is configured with)
    why: str


def plan(override: str, gpu: bool, reachable: Callable[[str], bool]) -> Plan:
    """Where torch comes from: ``override`` (TORCH_INDEX; "" to decide), whether the machine has an NVIDIA
    GPU, and whether the CPU index answers (asked only when it is the choice)."""
    choice = override.strip()
    if choice.startswith(("https://", "http://")):
        return Plan(choice, f"TORCH_INDEX names the index: {choice}")
    choice = choice.lower()
    if choice not in ("", "cpu", "cuda"):
        raise ValueError(f"TORCH_INDEX must be cpu, cuda or an index URL, got {override!r}")
    why = f"TORCH_INDEX={choice}" if choice else ("an NVIDIA GPU" if gpu else "no NVIDIA GPU")
    if choice == "cuda" or (not choice and gpu):
        return Plan(None, f"{why}: PyPI's build (CUDA on Linux)")
    if reachable(CPU_INDEX):
        return Plan(CPU_INDEX, f"{why}: the CPU build from {CPU_INDEX}")
    return Plan(None, f"{why}, but {CPU_INDEX} cannot be reached: PyPI's build instead (on Linux the CUDA one, "
                      "about 2.6 GB with its nvidia-* wheels, unless pip finds a CPU wheel in its find-links)")


def gpus_listed(nvidia_smi_output: str) -> bool:
    """Whether ``nvidia-smi -L`` listed a GPU ("GPU 0: NVIDIA H100 ... (UUID: GPU-...)")."""
    return any(line.startswith("GPU ") for line in nvidia_smi_output.splitlines())


def has_nvidia_gpu(proc_gpus: Path = PROC_GPUS, nvidia_smi: str | None = None) -> bool:
    """The driver's /proc entries (Linux), else ``nvidia-smi -L`` (also where /proc has none: WSL, some
    containers). A driver installed with no GPU is no GPU."""
    if proc_gpus.is_dir() and any(proc_gpus.iterdir()):
        return True
    nvidia_smi = nvidia_smi or shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return False
    try:
        listed = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and gpus_listed(listed.stdout)


def reachable(index_url: str) -> bool:
    """Whether the index answers at all (a failure to resolve, connect or agree on TLS: it does not)."""
    try:
        with urllib.request.urlopen(f"{index_url}/torch/", timeout=REACH_TIMEOUT_S):
            return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    args = [a for a in argv if a != "--dry-run"]
    if not args or not args[0].startswith("torch"):
        print("usage: install_torch.py [--dry-run] torch==VERSION [pip options]", file=sys.stderr)
        return 2
    try:
        chosen = plan(os.environ.get("TORCH_INDEX", ""), has_nvidia_gpu(), reachable)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "pip", "install", *args]
    if chosen.index_url is not None:
        command += ["--index-url", chosen.index_url]
    print(f"torch: {chosen.why}", file=sys.stderr)
    if dry_run:
        print(" ".join(command))
        return 0
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
