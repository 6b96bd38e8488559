"""The engine's tests: without a GPU, engine.kernels' Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before Triton is first imported, so it is set here, before any test of the
engine imports it. On a GPU each kernel runs with one config per shape, not autotuned (autotuning compiles
every candidate for every new shape: minutes over these tests); test_kernels checks every candidate once.
"""

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from engine.config import EngineConfig
from engine.supervisor import EngineSupervisor


def interpret_without_overflow_checks() -> None:
    """Triton's interpreter checks every int32 add, sub and mul for overflow (a GPU checks none outside its debug
    mode): much of the kernel tests' time, and no test's tensors come near 2**31 elements."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = interpreter.interpreter_builder  # the one every interpreted launch uses, made as Triton is imported
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


os.environ.setdefault("QWEN3_TTS_AUTOTUNE", "0")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    interpret_without_overflow_checks()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The tiny models are all per-op overhead: two intra-op threads on a shared 2-core box are ~20x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # Parity is checked in float32; TF32 convolutions (cuDNN's default) would blur it on a GPU.
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_num_threads(threads)
    torch.backends.cudnn.allow_tf32 = tf32


@contextmanager
def supervised(config: EngineConfig, devices: list[str], timeout: float = 120) -> Iterator[EngineSupervisor]:
    """Engine processes on `devices` with `config`, started, and stopped when done (for module fixtures)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the tiny model is all per-op overhead (see test_engine_worker.py)
        engines = EngineSupervisor(dataclasses.asdict(config), devices, heartbeat_ms=config.heartbeat_ms)
        engines.start(timeout=timeout)
        yield engines
        engines.stop()
