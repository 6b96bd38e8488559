"""The engine's tests: without a GPU, engine.kernels' Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before Triton is first imported, so it is set here, before any test of the
engine imports it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
