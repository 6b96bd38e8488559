"""How setup chooses PyTorch's build (scripts/install_torch.py): the decision, not the download. No NVIDIA GPU:
the CPU index, PyPI where that index cannot be reached; a GPU: PyPI's CUDA build; TORCH_INDEX overrides both."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "scripts" / "install_torch.py"
spec = importlib.util.spec_from_file_location("install_torch", SCRIPT)
assert spec is not None and spec.loader is not None
install_torch = sys.modules["install_torch"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_torch)

CPU = "https://download.pytorch.org/whl/cpu"
CU128 = "https://download.pytorch.org/whl/cu128"


class Index:
    """Whether the CPU index answers, and who asked."""

    def __init__(self, up: bool) -> None:
        self.up, self.asked = up, []

    def __call__(self, url: str) -> bool:
        self.asked.append(url)
        return self.up


def test_without_a_gpu_the_cpu_index():
    index = Index(up=True)
    chosen = install_torch.plan("", gpu=False, reachable=index)
    assert chosen.index_url == CPU == install_torch.CPU_INDEX and index.asked == [CPU]
    assert chosen.why.startswith("no NVIDIA GPU: the CPU build")


def test_without_a_gpu_and_no_way_to_the_cpu_index_pypi():
    chosen = install_torch.plan("", gpu=False, reachable=Index(up=False))
    assert chosen.index_url is None  # pip's own index
    assert "cannot be reached" in chosen.why and "CUDA" in chosen.why  # what that may download is said


def test_with_a_gpu_pypis_cuda_build_and_the_cpu_index_is_not_asked():
    index = Index(up=True)
    chosen = install_torch.plan("", gpu=True, reachable=index)
    assert chosen.index_url is None and index.asked == []
    assert chosen.why == "an NVIDIA GPU: PyPI's build (CUDA on Linux)"


@pytest.mark.parametrize(("override", "gpu", "up", "index_url"), [
    ("cpu", True, True, CPU),  # a GPU box that wants the small build
    ("cpu", True, False, None),  # ... and cannot reach the CPU index
    ("cuda", False, True, None),  # a box building for a GPU elsewhere
    (CU128, False, False, CU128),  # a named index, used as named (the Dockerfile's CUDA 12.8 image)
    (f" {CPU} ", True, True, CPU),
    ("CUDA", False, True, None),
])
def test_torch_index_decides_instead(override: str, gpu: bool, up: bool, index_url: str | None):
    chosen = install_torch.plan(override, gpu=gpu, reachable=Index(up))
    assert chosen.index_url == index_url
    assert chosen.why.startswith("TORCH_INDEX")


@pytest.mark.parametrize("override", ["rocm", "gpu", "download.pytorch.org/whl/cpu"])
def test_a_bad_torch_index_is_refused(override: str):
    with pytest.raises(ValueError, match="TORCH_INDEX must be cpu, cuda or an index URL"):
        install_torch.plan(override, gpu=False, reachable=Index(up=True))


def test_the_gpu_is_found_by_the_drivers_proc_entries(tmp_path: Path):
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    no_smi = str(tmp_path / "no-nvidia-smi")  # a path that does not exist: nvidia-smi cannot run
    assert not install_torch.has_nvidia_gpu(gpus, no_smi)  # the driver, no GPU
    (gpus / "0000:01:00.0").mkdir()
    assert install_torch.has_nvidia_gpu(gpus, no_smi)


def test_the_gpu_is_found_in_nvidia_smis_list():
    listed = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c3d3a4e-0b1c-4e0f-9f7e-1a2b3c4d5e6f)\n"
    assert install_torch.gpus_listed(listed)
    assert not install_torch.gpus_listed("No devices were found\n")
    assert not install_torch.gpus_listed("")


def test_this_machine(tmp_path: Path):
    """The script as the Makefile runs it, --dry-run: the pip command for this interpreter, and one line on
    stderr saying why. TORCH_INDEX=cuda needs no network, so the answer does not depend on this one's."""
    env = {**os.environ, "TORCH_INDEX": "cuda"}
    done = subprocess.run([sys.executable, SCRIPT, "--dry-run", "torch==2.13.0", "--quiet"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [sys.executable, "-m", "pip", "install", "torch==2.13.0", "--quiet"]
    assert done.stderr == "torch: TORCH_INDEX=cuda: PyPI's build (CUDA on Linux)\n"
    refused = subprocess.run([sys.executable, SCRIPT, "torch==2.13.0"], capture_output=True, text=True,
                             env={**os.environ, "TORCH_INDEX": "rocm"}, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("error: TORCH_INDEX must be")
