"""Time to first audio and real-time factor of one stream: this engine (eager) beside the official qwen-tts.

Both read the same checkpoint, sample with its generation_config.json and make exactly --frames frames
(EOS is held off, so random weights give a fixed length). This engine is timed through QwenTTSEngine (worker
thread, asyncio, pcm16 packets of 4 frames) from open() to each packet; the official code has no audio
streaming, so its first audio is its whole generate + decode. RTF = wall time / audio time.

The official side needs qwen-tts and transformers 4.57.3, so it runs in a child process with
--official-pythonpath prepended (this engine uses the gateway's transformers 5.x):

    python scripts/make_parity_fixture.py --config real-0.6b --out /tmp/q06 --device cuda   # (oracle env)
    python scripts/bench_engine.py --checkpoint /tmp/q06 --official-pythonpath /tmp/site-oracle
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TEXT = "Hello world, this is a test of the voice gateway. How are you doing today?"
SPEAKER, LANGUAGE = "vivian", "english"
SAMPLE_RATE = 24000


def bench_ours(args: argparse.Namespace) -> dict:
    from engine import checkpoint
    from engine.worker import QwenTTSEngine

    ckpt = checkpoint.load(args.checkpoint, device=args.device, dtype=args.dtype)
    engine = QwenTTSEngine(ckpt, packet_frames=args.packet_frames, max_frames=args.frames,
                           min_frames=args.frames, max_streams=1, seed=0)

    async def once() -> tuple[float, float, float]:
        start = time.perf_counter()
        stream = engine.open(SPEAKER, LANGUAGE)
        stream.feed(TEXT)
        stream.end()
        first, samples = None, 0
        async for chunk in stream:
            if first is None:
                first = time.perf_counter() - start
            samples += len(chunk.pcm) // 2
        assert first is not None
        return first, time.perf_counter() - start, samples / SAMPLE_RATE

    runs = [asyncio.run(once()) for _ in range(args.runs + 1)][1:]  # the first warms up kernels and allocators
    engine.close()
    result = summarise("this engine (eager)", runs, args, str(next(ckpt.model.parameters()).dtype))
    result["stages_ms"] = stages(ckpt, args)
    return result


@torch.no_grad()
def stages(ckpt, args: argparse.Namespace, reps: int = 20) -> dict:
    """Where a frame's time goes: the 15-step code predictor and one packet's codec decode, timed alone;
    the talker step (with sampling and Python overhead) is the rest of a frame."""
    from engine.sampling import SamplingParams

    model = ckpt.model
    model.setup(1, 64)
    gen = model.new_generation(0, SamplingParams.from_generation_config(ckpt.generation), seed=0)
    hidden = torch.randn(1, model.cfg.talker.hidden, device=args.device, dtype=next(model.parameters()).dtype)
    code0 = torch.zeros(1, dtype=torch.long, device=args.device)
    packet = torch.zeros(1, 16, args.packet_frames, dtype=torch.long, device=args.device)
    state = ckpt.codec.new_state(1)

    def timed(fn) -> float:
        fn()
        if args.device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if args.device != "cpu":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1000 / reps

    predictor = timed(lambda: model.predict_codes([gen], [0], hidden, code0))
    codec = timed(lambda: ckpt.codec.decode_step(packet, state)) / args.packet_frames
    return {"predictor_per_frame": round(predictor, 2), "codec_per_frame": round(codec, 2)}


def bench_official(args: argparse.Namespace) -> dict:
    import importlib.machinery
    import types

    for name in ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        try:
            __import__(name)
        except Exception:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            module.__path__ = []
            sys.modules[name] = module
    from qwen_tts import Qwen3TTSModel

    dtype = torch.bfloat16 if args.dtype in ("auto", "bfloat16") and args.device != "cpu" else torch.float32
    tts = Qwen3TTSModel.from_pretrained(args.checkpoint, dtype=dtype, device_map=args.device)
    vocab = tts.model.config.talker_config.vocab_size
    # A stop id that generation bans (the top 1024 ids but EOS are suppressed): no early stop.
    never = vocab - 1

    def once() -> tuple[float, float, float]:
        start = time.perf_counter()
        wavs, rate = tts.generate_custom_voice(text=TEXT, speaker=SPEAKER, language=LANGUAGE,
                                               non_streaming_mode=False, max_new_tokens=args.frames + 1,
                                               eos_token_id=never)
        if args.device != "cpu":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        return wall, wall, len(wavs[0]) / rate

    runs = [once() for _ in range(args.runs + 1)][1:]
    return summarise("official qwen-tts 0.1.1 (eager)", runs, args, str(dtype))


def summarise(name: str, runs: list[tuple[float, float, float]], args: argparse.Namespace, dtype: str) -> dict:
    first = statistics.median(r[0] for r in runs)
    wall = statistics.median(r[1] for r in runs)
    audio = statistics.median(r[2] for r in runs)
    return {"impl": name, "dtype": dtype, "runs": len(runs), "frames": args.frames,
            "first_audio_ms": round(first * 1000, 1), "wall_s": round(wall, 3), "audio_s": round(audio, 3),
            "rtf": round(wall / audio, 3), "ms_per_frame": round(wall * 1000 / args.frames, 2)}


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--impl", choices=("both", "ours", "official"), default="both")
    parser.add_argument("--official-pythonpath", default="", help="site folder holding qwen-tts + transformers 4.57.3")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--frames", type=int, default=125, help="frames per utterance (125 = 10 s of audio)")
    parser.add_argument("--packet-frames", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    if args.impl == "official":
        print(json.dumps(bench_official(args)))
        return
    results = [bench_ours(args)]
    if args.impl == "both":
        env = dict(os.environ)
        if args.official_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.official_pythonpath, env.get("PYTHONPATH")]))
        child = [sys.executable, __file__, "--impl", "official", "--checkpoint", args.checkpoint,
                 "--device", args.device, "--dtype", args.dtype, "--frames", str(args.frames),
                 "--runs", str(args.runs)]
        out = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit("the official benchmark failed")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    report = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "command": " ".join(["python"] + sys.argv), "text": TEXT, "results": results}
    print(f"{report['machine']}; {args.frames} frames ({args.frames * 0.08:.1f} s of audio), median of {args.runs}")
    print(f"| {'implementation':34} | dtype          | first audio ms | RTF   | ms/frame |")
    print(f"| {'-' * 34} | -------------- | -------------- | ----- | -------- |")
    for r in results:
        print(f"| {r['impl']:34} | {r['dtype']:14} | {r['first_audio_ms']:14} | {r['rtf']:5} | {r['ms_per_frame']:8} |")
    if "stages_ms" in results[0]:
        print(f"this engine, per frame: code predictor {results[0]['stages_ms']['predictor_per_frame']} ms, "
              f"codec decode {results[0]['stages_ms']['codec_per_frame']} ms, the rest is the talker step")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
