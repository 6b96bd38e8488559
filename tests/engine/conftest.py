"""The engine's tests: without a GPU, engine.kernels' Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before Triton is first imported, so it is set here, before any test of the
engine imports it. On a GPU each kernel runs with one config per shape, not autotuned (autotuning compiles
every candidate for every new shape: minutes over these tests); test_kernels checks every candidate once.
"""

import os

import torch

os.environ.setdefault("QWEN3_TTS_AUTOTUNE", "0")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
