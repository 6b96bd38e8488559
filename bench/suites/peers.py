"""This engine against the official qwen-tts 0.1.1 in the same run, on the same checkpoint, one stream.

Both read the same checkpoint (real geometry with random weights, or --small's tiny one), sample with its
generation_config.json and make exactly --frames frames (EOS held off). This engine is timed as the engine
suite times it (QwenTTSEngine, the first packet of one frame); the official code, which has no batching and
no audio streaming, through its generate_custom_voice, whose first audio is its whole generate and decode.
The official side needs qwen-tts and transformers 4.57.3 (the gateway has 5.x), so it runs in a child process
with --oracle-site prepended to its PYTHONPATH: a folder holding them (``python -m bench.wheels --oracle``
gathers their wheels for a GPU host; ``pip install --target DIR`` them here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import checkpoints
from bench.suites import engine

HELP = "this engine against the official qwen-tts on the same checkpoint, same run, one stream"
HOW = """\
    python -m bench peers --small --oracle-site /tmp/oracle-site      # the tiny checkpoint, 6 frames
    python -m bench peers --device cuda --model 0.6b --oracle-site /tmp/site-oracle"""
ROOT = Path(__file__).resolve().parent.parent.parent
OFFICIAL = "official qwen-tts 0.1.1 (eager)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a CustomVoice model: 0.6b or 1.7b (--small: tiny)")
    parser.add_argument("--checkpoints", default="", help="where random checkpoints are made and kept")
    parser.add_argument("--oracle-site", default=os.environ.get("BENCH_ORACLE_SITE", ""),
                        help="a folder holding qwen-tts 0.1.1 and transformers 4.57.3 (or BENCH_ORACLE_SITE)")
    parser.add_argument("--frames", type=int, help="frames per utterance (default 125 = 10 s; --small 6)")
    parser.add_argument("--runs", type=int, default=2, help="timed runs of each, after one warm-up")


def official(checkpoint: str, device: str, frames: int, runs: int) -> dict[str, Any]:
    """The official code's generate + decode, one stream, in this (the child's) process."""
    import importlib.machinery
    import types

    import torch

    # modules qwen-tts imports and never uses here, absent from a slim environment
    for name in ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        try:
            __import__(name)
        except Exception:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            module.__path__ = []
            sys.modules[name] = module
    from qwen_tts import Qwen3TTSModel

    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    tts = Qwen3TTSModel.from_pretrained(checkpoint, dtype=dtype, device_map=device)
    never = tts.model.config.talker_config.vocab_size - 1  # a stop id generation bans: no early stop

    def once() -> tuple[float, float]:
        start = time.perf_counter()
        wavs, rate = tts.generate_custom_voice(text=engine.TEXT, speaker="vivian", language=engine.LANGUAGE,
                                               non_streaming_mode=False, max_new_tokens=frames + 1,
                                               eos_token_id=never)
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start, len(wavs[0]) / rate

    timed = [once() for _ in range(runs + 1)][1:]
    wall = statistics.median(w for w, _ in timed)
    audio = statistics.median(a for _, a in timed)
    return {"impl": OFFICIAL, "dtype": str(dtype), "streams": 1, "runs": runs,
            "first_audio_p50_ms": round(wall * 1000, 1), "rtf_p50": round(wall / audio, 4),
            "ms_per_step": round(wall * 1000 / frames, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    frames = args.frames or (6 if args.small else 125)
    if not args.oracle_site:
        raise SystemExit("peers needs --oracle-site: a folder holding qwen-tts 0.1.1 and transformers 4.57.3")
    import torch

    from engine import checkpoint

    model = args.model or ("tiny" if args.small else "0.6b")
    folder = str(checkpoints.folder(model, args.checkpoints))
    ckpt = checkpoint.load(folder, device=args.device, dtype="auto")
    ours = argparse.Namespace(**{**vars(args), "frames": frames, "voices": 1, "runs": args.runs, "staggered": False,
                                 "packet_frames": 4, "first_packet_frames": 1, "reference_s": 10.0,
                                 "deadline": time.perf_counter() + 600})
    rows = [r for r in engine.measure(ours, ckpt, model, [1], ["speaker"]) if r["kind"] == "stream"]
    rows[0]["impl"] = "this engine" + (", CUDA graphs" if torch.cuda.is_available() else ", eager")
    del ckpt
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [args.oracle_site, str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-m", "bench.suites.peers", folder, args.device, str(frames),
                            str(args.runs)], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise SystemExit(f"the official side failed:\n{child.stderr[-3000:]}")
    theirs = json.loads(child.stdout.strip().splitlines()[-1])
    rows.append({**theirs, "model": model, "valid": None, "invalid": []})
    for row in rows:
        print(f"{row['impl']}: first audio P50 {row['first_audio_p50_ms']} ms, RTF {row['rtf_p50']}", flush=True)
    return {"setup": f"{checkpoints.label(model)}, one stream", "settings": {
        "model": model, "checkpoint": folder, "frames": frames, "runs": args.runs, "text": engine.TEXT,
        "speaker": "vivian"}, "levels": rows}


if __name__ == "__main__":  # the official side, in the child process: CHECKPOINT DEVICE FRAMES RUNS
    print(json.dumps(official(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
