"""The codec decoder alone on a GPU, at the real 12 Hz geometry with seeded random weights: its streaming step
(`decode_step` of --frames frames for B streams at once, what the engine runs per due packet) captured as a CUDA
graph per batch size and replayed; the device memory each batch size takes; a per-kernel profile of one step
(torch.profiler: kernels grouped by kind, the costliest by name); and the fused kernels' waveform against the
PyTorch ops on the same weights (bfloat16 and float32).

Only engine.codec's public API is used, so --engine-root can point at another engine/ tree, e.g. main's before a
change (`git archive COMMIT engine | tar -x -C DIR`): one call measures before and after, each run adding its
entry (--label) to the same --json file.

    python scripts/bench_codec.py --label after --json codec.json
    python scripts/bench_codec.py --engine-root .before-codec --label before --batches 64,256 --json codec.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from make_codec_reference import randomize_

ROOT = Path(__file__).resolve().parent.parent
# speech_tokenizer/config.json of the released 12 Hz checkpoints (the decoder's part).
CONFIG = {
    "decode_upsample_rate": 1920,
    "decoder_config": {
        "codebook_dim": 512, "codebook_size": 2048, "decoder_dim": 1536, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 512, "intermediate_size": 1024, "latent_dim": 1024, "num_attention_heads": 16,
        "num_hidden_layers": 8, "num_key_value_heads": 16, "num_quantizers": 16, "rms_norm_eps": 1e-5,
        "rope_theta": 10000, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
    },
}
# Kernel kinds of a profile, by substrings of the kernel's name (the first match wins).
KINDS = (
    ("conv kernel (Triton)", ("_conv_kernel",)),
    ("cuDNN convolution", ("convolve", "fprop", "cudnn", "conv2d", "conv1d")),
    ("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "matmul")),
    ("attention", ("fmha", "attention", "flash")),
    ("concatenation", ("CatArrayBatchedCopy",)),
    ("other Triton", ("_kernel_", "_kernel")),
    ("elementwise, copy, index", ("elementwise", "copy", "Memcpy", "Memset", "index", "scatter", "gather",
                                  "reduce", "vectorized")),
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build(codec_cls: type, config: dict, dtype: torch.dtype, device: str) -> torch.nn.Module:
    model = codec_cls.from_config(config).eval()
    with torch.no_grad():
        randomize_(model.decoder, seed=0)  # the official layout: CodecDecoder.decoder
    return model.to(device, dtype)


def codes_for(model: torch.nn.Module, b: int, frames: int, seed: int = 0) -> torch.Tensor:
    weight = next(model.parameters())
    gen = torch.Generator(device=weight.device).manual_seed(seed)
    return torch.randint(0, model.cfg.codebook_size, (b, 16, frames), generator=gen, device=weight.device)


@torch.no_grad()
def time_step(model: torch.nn.Module, b: int, frames: int, reps: int) -> dict:
    """decode_step over b streams, captured once and replayed: ms per step, and the memory it took (its
    state, the graph's working memory). Without a GPU (a rehearsal), eager calls."""
    if not next(model.parameters()).is_cuda:
        state, codes = model.new_state(b), codes_for(model, b, frames)
        start = time.perf_counter()
        for _ in range(reps):
            model.decode_step(codes, state)
        return {"ms": round((time.perf_counter() - start) * 1000 / reps, 3), "eager_cpu": True}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    state, codes = model.new_state(b), codes_for(model, b, frames)
    start = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model.decode_step(codes, state)  # compilation, autotuning, lazy initialisation: outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.decode_step(codes, state)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() - base
    del graph, state
    return {"ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "first_call_s": round(first_s, 2), "memory_mib": round(peak / 2**20)}


@torch.no_grad()
def profile(model: torch.nn.Module, b: int, frames: int, top: int = 14) -> dict:
    """The GPU kernels of one eager step (the graph replays the same ones): count, busy time, by kind and by
    name (names cut at 90 characters)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    state, codes = model.new_state(b), codes_for(model, b, frames)
    model.decode_step(codes, state)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.decode_step(codes, state)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = {}
    by_kind: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name[:90], []).append(e.device_time)
        kind = next((k for k, keys in KINDS if any(key in e.name for key in keys)), "other")
        by_kind.setdefault(kind, []).append(e.device_time)

    def summary(groups: dict[str, list[float]], n: int) -> dict:
        ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:n]
        return {name: [len(t), round(sum(t) / 1000, 3)] for name, t in ranked}

    return {"kernels": len(events), "busy_ms": round(sum(e.device_time for e in events) / 1000, 3),
            "by_kind": summary(by_kind, len(by_kind)), "top": summary(by_name, top)}


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    noise = (x.double() - ref.double()).pow(2).sum().clamp_min(1e-30)
    return round((10 * torch.log10(ref.double().pow(2).sum() / noise)).item(), 1)


@torch.no_grad()
def numerics(codec_cls: type, config: dict, device: str, kernels, b: int = 8, frames: int = 12) -> dict:
    """The same streams, decoded in packets of 4 frames, through the kernels and through the PyTorch ops: in
    bfloat16 each against float32 (TF32 off), and in float32 against each other. The kernels run untuned
    (one config per shape, where the engine tree has the switch): autotuning the float32 shapes, which
    serving never runs, took minutes."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if hasattr(kernels, "set_autotune"):
        kernels.set_autotune(False)

    def stream(model: torch.nn.Module, fused: bool) -> torch.Tensor:
        kernels.set_enabled(fused)
        try:
            state, codes = model.new_state(b), codes_for(model, b, frames, seed=1)
            return torch.cat([model.decode_step(part, state) for part in codes.split(4, dim=2)], dim=-1).float()
        finally:
            kernels.set_enabled(True)

    f32 = build(codec_cls, config, torch.float32, device)
    ref = stream(f32, fused=False)
    fused_f32 = stream(f32, fused=True)
    del f32
    bf16 = build(codec_cls, config, torch.bfloat16, device)
    out = {"rms": round(ref.pow(2).mean().sqrt().item(), 4),
           "float32_fused_vs_torch_rel": float(f"{((fused_f32 - ref).norm() / ref.norm()).item():.2e}"),
           "bfloat16_fused_vs_float32_snr_db": snr_db(stream(bf16, fused=True), ref),
           "bfloat16_torch_vs_float32_snr_db": snr_db(stream(bf16, fused=False), ref)}
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # torch's defaults
    if hasattr(kernels, "set_autotune"):
        kernels.set_autotune(True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-root", type=Path, default=ROOT, help="the tree whose engine/ is measured")
    parser.add_argument("--label", default="after")
    parser.add_argument("--batches", default="1,64,128,256,1024", help="streams per step")
    parser.add_argument("--frames", default="4,1", help="frames per stream per step (4: a packet; 1: a first one)")
    parser.add_argument("--profile", default="64,256", help="batches whose step is profiled (4 frames)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-numerics", action="store_true")
    parser.add_argument("--time-budget", type=float, default=120, help="seconds; later batches are skipped past it")
    parser.add_argument("--json", type=Path, help="add this run to that file, under --label")
    parser.add_argument("--device", default="cuda", help="cpu: eager calls, no profile (the CPU path; a rehearsal)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--config", type=Path, help="a speech_tokenizer/config.json (default: the released one)")
    args = parser.parse_args()
    deadline = time.perf_counter() + args.time_budget

    # The engine is imported from --engine-root, which only the command line names.
    sys.path.insert(0, str(args.engine_root.resolve()))
    kernels = importlib.import_module("engine.kernels")
    codec_cls = importlib.import_module("engine.codec").CodecDecoder
    log(f"{args.label}: engine from {Path(kernels.__file__).parent}")

    config = json.loads(args.config.read_text()) if args.config else CONFIG
    gpu = args.device != "cpu"
    machine = torch.cuda.get_device_name(0) if gpu else "CPU"
    result: dict = {"machine": f"{machine}, torch {torch.__version__}", "command": " ".join(["python"] + sys.argv),
                    "dtype": args.dtype, "steps": {}, "profiles": {}}
    model = build(codec_cls, config, getattr(torch, args.dtype), args.device)
    batches = [int(b) for b in args.batches.split(",") if b]
    for frames in [int(f) for f in args.frames.split(",") if f]:
        for b in batches:
            if time.perf_counter() > deadline:
                log(f"{args.label}: out of time before batch {b}, {frames} frames")
                break
            row = time_step(model, b, frames, args.reps)
            result["steps"][f"b{b}_f{frames}"] = row
            log(f"{args.label}: batch {b}, {frames} frames: {row}")
    for b in [int(b) for b in args.profile.split(",") if b and gpu]:
        result["profiles"][f"b{b}_f4"] = prof = profile(model, b, 4)
        log(f"{args.label}: profile batch {b}: {json.dumps(prof)}")
    if gpu and hasattr(kernels, "_conv_kernel"):  # what autotuning chose, per layer shape
        result["conv_configs"] = {str(key): str(config) for key, config in kernels._conv_kernel.cache.items()}
    del model
    if gpu:
        torch.cuda.empty_cache()
    print(f"{args.label}: codec step, ms per step (graph replay, median of {args.reps}):")
    for key, row in result["steps"].items():
        print(f"  {key}: {row['ms']} ms ({row.get('memory_mib', '-')} MiB)", flush=True)
    save(args, result)  # the steps, whatever becomes of the numerics
    if not args.no_numerics:
        result["numerics"] = numerics(codec_cls, config, args.device, kernels)
        log(f"{args.label}: numerics {result['numerics']}")
        save(args, result)


def save(args: argparse.Namespace, result: dict) -> None:
    """This run's result under --label in the --json file (other labels' kept)."""
    if args.json:
        report = json.loads(args.json.read_text()) if args.json.exists() else {}
        report[args.label] = result
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
