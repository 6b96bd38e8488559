"""The engine's tests: without a GPU, engine.kernels' Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before Triton is first imported, so it is set here, before any test of the
engine imports it. On a GPU each kernel runs with one config per shape, not autotuned (autotuning compiles
every candidate for every new shape: minutes over these tests); test_kernels checks every candidate once.
"""

import os

import pytest
import torch

os.environ.setdefault("QWEN3_TTS_AUTOTUNE", "0")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
