"""Files the gateway ships beside its code: the default configuration, the browser page and the Smart Turn model;
and where the silero-vad wheel keeps Silero VAD's.

In the repository they sit at the top level (``config.toml``, ``web/``); the wheel carries them inside the
``gateway`` package (setup.py maps them there at build time). An installed gateway finds its own copies, a
checkout (or an editable install of one) the top-level files.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def shipped(name: str) -> Path:
    """The shipped file or folder ``name``: the package's copy in an installed wheel, else the checkout's."""
    inside = PACKAGE / name
    return inside if inside.exists() else PACKAGE.parent / name


DEFAULT_CONFIG = shipped("config.toml")
WEB_DIR = shipped("web")
SMART_TURN_MODEL = PACKAGE / "models" / "smart-turn-v3.2-cpu.onnx"  # package data in the checkout too


def silero_file(name: str) -> Path:
    """A model file of the silero-vad wheel (a dependency), found without importing the package: its
    ``__init__`` imports torch."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the silero-vad package is not installed")
    return Path(spec.origin).parent / "data" / name


SILERO_TORCHSCRIPT = "silero_vad.jit"  # the model engine processes run (engine/vad_model.py)
