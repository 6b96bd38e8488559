"""The Qwen3-TTS checkpoints a benchmark loads, by model name.

Real geometry with seeded random weights, made on the host the first time (scripts/make_random_checkpoint.py,
the engine's own modules: ~15 s for the 0.6B, ~35 s for the 1.7B on a GPU host's CPU) into
/tmp/bench-checkpoints/ (``--checkpoints`` or BENCH_CHECKPOINTS elsewhere): speed, memory and capacity depend on
the geometry, not the weights. --small rehearsals load the tiny checkpoints of tests/data instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# model name -> scripts/make_random_checkpoint.py's --config
REAL = {"0.6b": "real-0.6b", "1.7b": "real-1.7b", "0.6b-base": "real-0.6b-base", "1.7b-base": "real-1.7b-base",
        "1.7b-design": "real-1.7b-design"}
TINY = {"tiny": DATA / "qwen3_tts_tiny", "tiny-base": DATA / "qwen3_tts_tiny_base",
        "tiny-design": DATA / "qwen3_tts_tiny_design", "tiny-instruct": DATA / "qwen3_tts_tiny_instruct"}
MODELS = (*REAL, *TINY)


def base_of(model: str) -> str:
    """The Base checkpoint (clones) of a model's size: 0.6b -> 0.6b-base, tiny -> tiny-base."""
    return model if model.endswith("-base") else model.split("-")[0] + "-base"


def folder(model: str, where: str = "") -> Path:
    """The checkpoint of `model`, made first when it is a real geometry not made yet."""
    if model in TINY:
        return TINY[model]
    if model not in REAL:
        raise SystemExit(f"unknown model {model!r}: one of {', '.join(MODELS)}")
    out = Path(where or os.environ.get("BENCH_CHECKPOINTS", "/tmp/bench-checkpoints")) / REAL[model]
    if not (out / "model.safetensors").exists():
        start = time.monotonic()
        print(f"making a random {REAL[model]} checkpoint in {out}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "scripts.make_random_checkpoint", "--config", REAL[model], "--out",
                        str(out)], cwd=ROOT, check=True)
        print(f"made in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return out


def label(model: str) -> str:
    """A model as the records' setups name it: 0.6b -> 0.6B, 1.7b-base -> 1.7B Base, tiny-base -> tiny Base."""
    size, _, kind = model.partition("-")
    kinds = {"base": "Base", "design": "VoiceDesign", "instruct": "CustomVoice (instructions)"}
    return " ".join(filter(None, [size.upper() if size[0].isdigit() else size, kinds.get(kind, kind)]))
