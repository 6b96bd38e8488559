"""engine.kernels' fused kernels against the PyTorch code they replace, op by op, at the real 0.6B shapes
(GPU only). Each op is captured 20 times in a CUDA graph and replayed, as the engine runs it, so the
figures are per call without launch gaps; the median of --reps replays. Inputs are random, bf16.

    python scripts/bench_kernels.py [--json out.json]

The projections are timed at 1, 2 and 4 rows through the matrix-vector kernel (whatever engine.kernels'
GEMV_MAX_ROWS) to choose that limit; "torch" is the composition the engine runs without the kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import kernels  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 1024, 16, 8, 128, 3072
CALLS = 20


def timed(fn: Callable[[], object], reps: int) -> float:
    """Microseconds per call of fn, replayed from a CUDA graph of CALLS calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # autotuning and lazy initialisation, outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return round(statistics.median(times), 2)


def both(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(fused, torch) microseconds per call."""
    fused = timed(fn, reps)
    kernels.set_enabled(False)
    try:
        reference = timed(fn, reps)
    finally:
        kernels.set_enabled(True)
    return fused, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev).to(dt)

    rows: list[dict] = []

    def record(op: str, shape: str, fused: float, reference: float) -> None:
        rows.append({"op": op, "shape": shape, "fused_us": fused, "torch_us": reference,
                     "speedup": round(reference / fused, 2)})
        print(f"{op:<28} {shape:<34} fused {fused:8.2f} us   torch {reference:8.2f} us", flush=True)

    norm = (1 + 0.1 * randn(HIDDEN), 1e-6)
    projections = {  # name: (out features, in features, fusion)
        "qkv (norm)": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, "norm"),
        "o_proj (+residual)": (HIDDEN, HEADS * HEAD_DIM, "residual"),
        "gate_up (norm)": (2 * INTERMEDIATE, HIDDEN, "norm"),
        "down (silu, +residual)": (HIDDEN, INTERMEDIATE, "silu"),
        "predictor lm_head (norm)": (2048, HIDDEN, "norm"),
    }
    limit = kernels.GEMV_MAX_ROWS
    kernels.GEMV_MAX_ROWS = 4
    try:
        for name, (n, k, fusion) in projections.items():
            weight = randn(n, k) / k**0.5
            for m in (1, 2, 4):
                x = randn(m, 2 * k if fusion == "silu" else k)
                residual = randn(m, n) if fusion in ("residual", "silu") else None

                def fn(x=x, weight=weight, fusion=fusion, residual=residual):
                    return kernels.linear(x, weight, norm=norm if fusion == "norm" else None,
                                          silu=fusion == "silu", residual=residual)

                record(f"linear {name}", f"M={m} N={n} K={k}", *both(fn, args.reps))
    finally:
        kernels.GEMV_MAX_ROWS = limit

    q_norm, k_norm = 1 + 0.1 * randn(HEAD_DIM), 1 + 0.1 * randn(HEAD_DIM)
    qk_norm = torch.cat([q_norm.expand(HEADS, -1), k_norm.expand(KV_HEADS, -1)])
    for where, max_len in (("talker", 1520), ("predictor", 16)):
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2, device=dev).float() / HEAD_DIM))
        emb = torch.cat([torch.outer(torch.arange(max_len, device=dev).float(), inv_freq)] * 2, -1)
        sign = torch.cat([-torch.ones_like(inv_freq), torch.ones_like(inv_freq)])
        rope = (emb.cos().to(dt), (emb.sin() * sign).to(dt))
        for b in (1, 64, 256):
            cache_k, cache_v = randn(b + 1, KV_HEADS, max_len, HEAD_DIM), randn(b + 1, KV_HEADS, max_len, HEAD_DIM)
            cases = ([("pos 140", 0, torch.full((b,), 140, device=dev)), ("pos 1000", 0, torch.full((b,), 1000,
                                                                                                   device=dev))]
                     if where == "talker" else [("start 0, 2 new", 0, None), ("start 8", 8, None)])
            for label, start, pos in cases:
                t = 2 if label.endswith("2 new") else 1
                qkv = randn(b, t, (HEADS + 2 * KV_HEADS) * HEAD_DIM)

                def fn(qkv=qkv, cache_k=cache_k, cache_v=cache_v, start=start, pos=pos, rope=rope):
                    return kernels.decode_attention(qkv, q_norm, k_norm, qk_norm, 1e-6, rope, cache_k, cache_v,
                                                    start, pos, HEADS)

                record(f"attention {where}", f"B={b} {label} (cache {max_len})", *both(fn, args.reps))

    # The codec decoder's residual units, 4 frames per stream: the dilated conv (cache, SnakeBeta after) and the
    # 1x1 conv (residual add, the next unit's SnakeBeta after), and each block's transposed conv.
    for cin, channels, samples, rate in ((1536, 768, 128, 8), (768, 384, 640, 5), (384, 192, 2560, 4),
                                         (192, 96, 7680, 3)):
        for b in (1, 64):
            x, act = randn(b, samples, channels), (0.2 * randn(channels), 0.2 * randn(channels))
            bias = 0.1 * randn(channels)
            w7, w1 = randn(channels, channels, 7) / (7 * channels) ** 0.5, randn(channels, channels, 1) / channels
            cache = randn(b, 54, channels)
            p7, p1 = kernels.pack_conv(w7), kernels.pack_conv(w1)
            record("codec conv k7 d9 (+snake)", f"B={b} T={samples} C={channels}",
                   timed(lambda x=x, p7=p7, bias=bias, cache=cache, act=act: kernels.causal_conv(
                       x, p7, bias, 7, 9, cache, act=act, keep=False), args.reps),
                   timed(lambda x=x, w7=w7, bias=bias, cache=cache, act=act: kernels.causal_conv_reference(
                       x, w7, bias, 9, cache, act=act, keep=False), args.reps))
            record("codec conv k1 (+res, snake)", f"B={b} T={samples} C={channels}",
                   timed(lambda x=x, p1=p1, bias=bias, act=act: kernels.causal_conv(
                       x, p1, bias, 1, 1, None, x, act), args.reps),
                   timed(lambda x=x, w1=w1, bias=bias, act=act: kernels.causal_conv_reference(
                       x, w1, bias, 1, None, x, act), args.reps))
            frames = samples // rate
            up_x, up_w = randn(b, frames, cin), randn(cin, channels, 2 * rate) / cin**0.5
            up_cache, packed = randn(b, 1, cin), kernels.pack_conv_transpose(up_w, rate)
            record("codec transposed conv (+snake)", f"B={b} T={frames}x{rate} {cin}->{channels}",
                   timed(lambda up_x=up_x, packed=packed, bias=bias, up_cache=up_cache, rate=rate, act=act:
                         kernels.causal_conv_transpose(up_x, packed, bias, rate, up_cache, act), args.reps),
                   timed(lambda up_x=up_x, up_w=up_w, bias=bias, up_cache=up_cache, rate=rate, act=act:
                         kernels.causal_conv_transpose_reference(up_x, up_w, bias, rate, up_cache, act), args.reps))

    from engine.sampling import choose

    for b in (1, 64):
        for vocab in (2048, 3072):
            logits, u = 3 * torch.randn(b, vocab, device=dev), torch.rand(b, device=dev)
            record("sample (top-k 50)", f"B={b} V={vocab}",
                   *both(lambda logits=logits, u=u: choose(logits, True, 50, 1.0, 0.9, u), args.reps))

    tuned = {str(key): str(config) for key, config in kernels._gemv_kernel.cache.items()}
    tuned |= {str(key): str(config) for key, config in kernels._conv_kernel.cache.items()}
    for key, config in tuned.items():
        print(f"autotune {key}: {config}")
    report = {"machine": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "triton": kernels.triton.__version__, "rows": rows, "gemv_configs": tuned}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
