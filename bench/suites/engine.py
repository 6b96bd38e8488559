"""The Qwen3-TTS engine alone: time to first audio, real-time factor and stalls at 1..N concurrent streams.

The engine runs in this process as the gateway's thread mode runs it (engine.threaded.QwenTTSEngine: its
worker thread, asyncio, pcm16 packets of --packet-frames frames, the first of --first-packet-frames), on a
checkpoint of real geometry with random weights (bench/checkpoints.py) or the tiny one (--small). Every stream
makes exactly --frames frames (EOS held off). Each level N runs one untimed wave, then:

- at once: --runs waves each opening N streams in the same instant, every stream fed the whole text (the worst
  case for first audio), their streams pooled;
- staggered (--staggered, the default): N clients each reading a stream to its end and opening the next,
  started over one stream's duration; the streams opened after that ramp join a batch of N - 1 running ones:
  the steady state of N concurrent streams.

RTF = a stream's wall time from open() to its last packet over its audio; a stall is what a listener playing
from the first packet with no buffer would wait. A level is realtime when every stream's RTF < 1 and first
audio P95 < 200 ms. The largest level's first wave also records the engine loop's first passes. With CUDA
graphs, each step alone at every captured batch size (prefill, frame, codec packet, one-frame first packet)
and the kernels of the frame and of the codec packet (torch.profiler). The asyncio loop the packets are
delivered to reports its lag beside the figures, not judged: it is the engine's consumer, as a gateway
process's loop is, so its wait is part of what first audio means here.

Each checkpoint kind is timed in its voices (--modes): a CustomVoice checkpoint's named speakers (speaker) and,
at 1.7B, with instructions (instruct); a Base checkpoint's clones, in-context (icl) and x-vector only (xvec),
with the time to prepare one; a VoiceDesign checkpoint's designed voices (design). A wave's streams cycle
through --voices voices of the mode and two languages.

--kernels times engine.kernels' fused kernels against the PyTorch code they replace, op by op at the 0.6B
shapes, each captured 20 times in a CUDA graph (GPU only).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from bench import checkpoints
from bench.load import FIXTURES
from bench.stats import lag_probe, pct, rounded

HELP = "the Qwen3-TTS engine alone: first audio, RTF, stalls at 1..N streams, step times"
HOW = """\
    python -m bench engine --small                                        # tiny checkpoint, 1 and 2 streams
    python -m bench engine --device cuda --model 0.6b --streams 1,1024    # at once and staggered
    python -m bench engine --device cuda --model 1.7b --streams 1,256,512
    python -m bench engine --device cuda --model 0.6b-base --streams 1,24,64,256 --runs 2 --no-staggered
    python -m bench engine --device cuda --kernels                        # fused kernels against PyTorch, per op"""
TEXT = "Hello world, this is a test of the voice gateway. How are you doing today?"
LANGUAGE = "english"
SAMPLE_RATE = 24000
# What the reference windows say (their transcript for in-context cloning): about as many words as 10 s hold.
TRANSCRIPT = ("The quick brown fox jumps over the lazy dog. Could you tell me what the weather will be like "
              "tomorrow? Yes, and please book a table for two at seven.")
INSTRUCTIONS = ["Speak slowly, in a sad and tired voice.", "Sound cheerful and excited.", "Whisper, as if telling "
                "a secret.", "Speak like a news anchor, clearly and evenly."]
DESCRIPTIONS = ["A warm, low female voice, speaking calmly.", "A young man with a bright, fast voice.",
                "An old man with a raspy, slow voice.", "A cheerful child's voice, high and lively."]
MODES = {"custom_voice": ["speaker"], "base": ["icl", "xvec"], "voice_design": ["design"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="0.6b, 1.7b, 0.6b-base, 1.7b-base, 1.7b-design (--small: tiny, tiny-base)")
    parser.add_argument("--checkpoint", default="", help="a checkpoint folder instead of the model's random one")
    parser.add_argument("--checkpoints", default="", help="where random checkpoints are made and kept")
    parser.add_argument("--streams", help="concurrent streams per level (default 1,1024; --small 1,2)")
    parser.add_argument("--staggered", action=argparse.BooleanOptionalAction, default=True,
                        help="also N streams at all times, after each level's waves")
    parser.add_argument("--runs", type=int, default=1, help="timed waves per level, their streams pooled")
    parser.add_argument("--frames", type=int, help="frames per stream (default 125 = 10 s; --small 6)")
    parser.add_argument("--modes", default="", help="speaker, instruct, icl, xvec, design (default: the kind's)")
    parser.add_argument("--voices", type=int, help="voices per mode in a wave (default 8; --small 2)")
    parser.add_argument("--reference-s", type=float, default=10.0, help="seconds of each clone's reference")
    parser.add_argument("--packet-frames", type=int, default=4)
    parser.add_argument("--first-packet-frames", type=int, default=1)
    parser.add_argument("--time-budget", type=float, default=480, help="seconds: no level starts past it")
    parser.add_argument("--no-fused-kernels", action="store_true", help="the PyTorch ops instead of engine.kernels")
    parser.add_argument("--host-only", action="store_true", help="every device step does nothing: the engine "
                        "loop's host work alone (admission, tokenizing, prompts, bookkeeping, delivery)")
    parser.add_argument("--kernels", action="store_true", help="the fused kernels against PyTorch, per op (GPU)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # the engine suite's own process runs the model

    from engine import checkpoint, kernels

    if args.kernels:
        return kernel_ops(args)
    small = args.small
    model = args.model or ("tiny" if small else "0.6b")
    folder = args.checkpoint or checkpoints.folder(model, args.checkpoints)
    args.frames = args.frames or (6 if small else 125)
    args.voices = args.voices or (2 if small else 8)
    args.deadline = time.perf_counter() + args.time_budget
    levels = [int(n) for n in (args.streams or ("1,2" if small else "1,1024")).split(",") if n]
    kernels.set_enabled(not args.no_fused_kernels)
    logging.basicConfig(level=logging.WARNING)
    ckpt = checkpoint.load(str(folder), device=args.device, dtype="auto")
    if args.host_only:
        from engine import runner

        runner.Graphs.run = lambda self, b: None
        ckpt.model.prefill = lambda n, length: None
    modes = [m for m in args.modes.split(",") if m] or MODES[ckpt.config.kind]
    rows = measure(args, ckpt, model, levels, modes)
    for row in rows:
        row.setdefault("valid", None)
        row.setdefault("invalid", [])
    dtype = str(next(ckpt.model.parameters()).dtype)
    return {"setup": f"{checkpoints.label(model)}, {', '.join(modes)}", "settings": {
        "model": model, "checkpoint": str(folder), "kind": ckpt.config.kind, "dtype": dtype, "modes": modes,
        "streams": levels, "staggered": args.staggered, "runs": args.runs, "frames": args.frames,
        "voices": args.voices, "packet_frames": args.packet_frames, "first_packet_frames": args.first_packet_frames,
        "fused_kernels": kernels.available(torch.zeros(0, device=args.device)), "host_only": args.host_only,
        "text": TEXT}, "levels": rows}


@dataclass
class Timing:
    first: float  # seconds from open() to the first packet
    wall: float  # to the last
    audio: float  # seconds of audio
    stall: float  # seconds a listener would wait for packets after the first (no playout buffer)


async def listen(stream: Any, opened: float) -> Timing:
    first = playing_until = None
    samples = 0
    stall = 0.0
    async for chunk in stream:
        now = time.perf_counter()
        if first is None:
            first, playing_until = now - opened, now
        elif now > playing_until:
            stall += now - playing_until
            playing_until = now
        playing_until += len(chunk.pcm) / 2 / SAMPLE_RATE
        samples += len(chunk.pcm) // 2
    assert first is not None
    return Timing(first, time.perf_counter() - opened, samples / SAMPLE_RATE, stall)


def summary(runs: list[Timing], lags: list[float]) -> dict[str, Any]:
    firsts = [r.first * 1000 for r in runs]
    rtfs = [r.wall / r.audio for r in runs]
    stalls = [r.stall * 1000 for r in runs]
    row = {"timed": len(runs), "first_audio_p50_ms": rounded(pct(firsts, 50), 1),
           "first_audio_p95_ms": rounded(pct(firsts, 95), 1), "rtf_p50": rounded(pct(rtfs, 50), 4),
           "rtf_max": rounded(max(rtfs), 4), "stall_p95_ms": rounded(pct(stalls, 95), 1),
           "stall_max_ms": rounded(max(stalls), 1)}
    row["realtime"] = row["rtf_max"] < 1 and row["first_audio_p95_ms"] < 200
    row["loop_lag_p99_ms"] = rounded(pct(lags, 99))
    return row


def probed(work: Awaitable[Any], lags: list[float]) -> Any:
    """asyncio.run(work) with a lag probe in the loop, its samples (ms) appended to `lags`."""

    async def go() -> Any:
        probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
        try:
            return await work
        finally:
            probe.cancel()

    return asyncio.run(go())


def reference_windows(seconds: float, count: int) -> list[Any]:
    """`count` different windows of `seconds` of speech at 24 kHz from the test fixtures, one per voice."""
    import numpy as np

    from gateway.audio import decode_wav

    names = ["two_turns.wav", "one_sentence.wav", "paused_turn.wav", "question_sky.wav", "question_tea.wav",
             "question_spider.wav", "speech_noise.wav"]
    audio = np.concatenate([decode_wav((FIXTURES / n).read_bytes())[0][:, 0] for n in names])
    length = int(seconds * SAMPLE_RATE)
    while len(audio) < length + count * SAMPLE_RATE:
        audio = np.concatenate([audio, audio])
    step = (len(audio) - length) // max(1, count - 1) if count > 1 else 0
    return [audio[i * step:i * step + length] for i in range(count)]


def voice_pool(engine: Any, ckpt: Any, mode: str, args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(voice name, open() keywords) for `mode`: --voices of them."""
    from engine.voices import VoicePrompt

    n = args.voices
    if mode in ("speaker", "instruct"):
        speakers = sorted(ckpt.config.speakers)
        extra = [{"instructions": INSTRUCTIONS[i % len(INSTRUCTIONS)]} if mode == "instruct" else {} for i in range(n)]
        return [(speakers[i % len(speakers)], extra[i]) for i in range(n)]
    if mode == "design":
        described = [DESCRIPTIONS[i % len(DESCRIPTIONS)] + (f" Voice {i}." if i >= len(DESCRIPTIONS) else "")
                     for i in range(n)]
        return [(f"design{i}", {"prompt": VoicePrompt.design(d)}) for i, d in enumerate(described)]
    text = TRANSCRIPT if mode == "icl" else None
    return [(f"{mode}{i}", {"prompt": asyncio.run(engine.prepare(w, SAMPLE_RATE, text))})
            for i, w in enumerate(reference_windows(args.reference_s, n))]


def prepare_times(engine: Any, model: str, args: argparse.Namespace, runs: int = 5) -> list[dict[str, Any]]:
    """Milliseconds to prepare a clone of one --reference-s clip through the engine's thread, the first call
    (warm-up) left out."""
    (clip,) = reference_windows(args.reference_s, 1)
    out = []
    for mode, text in (("icl", TRANSCRIPT), ("xvec", None)):
        times = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            asyncio.run(engine.prepare(clip, SAMPLE_RATE, text))
            times.append((time.perf_counter() - start) * 1000)
        out.append({"kind": "prepare", "model": model, "mode": mode, "reference_s": args.reference_s,
                    "p50_ms": round(statistics.median(times[1:]), 1), "max_ms": round(max(times[1:]), 1)})
    return out


def measure(args: argparse.Namespace, ckpt: Any, model: str, levels: list[int], modes: list[str]) -> list[dict]:
    """In each mode's voices, for each N of `levels`: waves of N streams at once, then N at all times."""
    import torch

    from engine.threaded import QwenTTSEngine

    start = time.perf_counter()
    engine = QwenTTSEngine(ckpt, packet_frames=args.packet_frames, first_packet_frames=args.first_packet_frames,
                           max_frames=args.frames, min_frames=args.frames, max_streams=max(levels), seed=0,
                           max_reference_s=args.reference_s + 0.5)
    setup_s = time.perf_counter() - start
    log(f"engine ready in {setup_s:.1f} s (rows {max(levels)})")

    def open_stream(i: int, pool: list[tuple[str, dict[str, Any]]]) -> Any:
        """Stream i of a wave or a client: voice i of the pool, in one of two languages."""
        voice, kw = pool[i % len(pool)]
        stream = engine.open(voice, LANGUAGE if i % 2 == 0 else "auto", **kw)
        stream.feed(TEXT)
        stream.end()
        return stream

    async def wave(n: int, pool: list[tuple[str, dict[str, Any]]]) -> list[Timing]:
        tasks = []
        for i in range(n):
            opened = time.perf_counter()
            tasks.append(listen(open_stream(i, pool), opened))
        return await asyncio.gather(*tasks)

    async def staggered(n: int, ramp: float, pool: list[tuple[str, dict[str, Any]]]) -> list[Timing]:
        """n clients, each opening its next stream as soon as its last one ended, the first ones spread over
        `ramp` seconds; the timings of the streams opened in the next `ramp` seconds (2 s at least)."""
        t0 = time.perf_counter()
        timed: list[Timing] = []

        async def client(i: int) -> None:
            await asyncio.sleep(ramp * i / n)
            while (opened := time.perf_counter()) < t0 + ramp + max(ramp, 2.0):
                timing = await listen(open_stream(i, pool), opened)
                if opened >= t0 + ramp:
                    timed.append(timing)

        await asyncio.gather(*(client(i) for i in range(n)))
        return timed

    rows: list[dict[str, Any]] = []
    if ckpt.config.kind == "base":
        rows += prepare_times(engine, model, args)
        log(f"preparing a {args.reference_s:g} s reference: {rows}")
    for mode in modes:
        pool = voice_pool(engine, ckpt, mode, args)
        for n in levels:
            if time.perf_counter() > args.deadline:
                log(f"{mode}: out of time before {n} streams")
                break
            asyncio.run(wave(n, pool))  # untimed: the allocators, kernels and voices meet this batch size once first
            trace = trace_passes(engine) if n == max(levels) else None
            lags: list[float] = []
            t0 = time.perf_counter()
            runs = [r for _ in range(args.runs) for r in probed(wave(n, pool), lags)]
            wall = (time.perf_counter() - t0) / args.runs
            key = {"kind": "stream", "model": model, "mode": mode, "voices": len(pool), "streams": n}
            row = {**key, "arrival": "at once", **summary(runs, lags),
                   "ms_per_step": round(wall * 1000 / args.frames, 2)}
            if trace is not None:
                row["passes"] = trace()
            rows.append(row)
            log(brief(row))
            if args.staggered and time.perf_counter() < args.deadline:
                lags = []
                ramp = statistics.mean(r.wall for r in runs)
                timed = probed(staggered(n, ramp, pool), lags)
                if timed:
                    row = {**key, "arrival": "staggered", **summary(timed, lags), "ramp_s": round(ramp, 2)}
                    rows.append(row)
                    log(brief(row))
    rows.append({"kind": "engine", "model": model, "setup_s": round(setup_s, 1), **memory(torch)})
    if torch.cuda.is_available() and engine.models[0].runner.frame_graphs.graphs:
        rows += step_times(engine.models[0].runner, model, args)
    engine.close()
    return rows


def memory(torch: Any) -> dict[str, Any]:
    """The GPU memory in GiB: allocated (weights, the rows' caches, the graphs), and the waves' peak."""
    if not torch.cuda.is_available():
        return {}
    return {"memory_allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2),
            "memory_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "memory_reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2)}


def trace_passes(engine: Any, passes: int = 12) -> Any:
    """Record the engine loop's first `passes` passes from now on (when each began after this call and how
    long it took, the part in the runner's step, streams it prefilled, packets it handed out); the returned
    function stops recording and gives them."""
    origin = time.perf_counter()
    marks: list[dict[str, Any]] = []
    runner = engine.models[0].runner
    run_pass, step = engine.run_pass, runner.step

    def traced_step() -> Any:
        fresh = sum(not s.started for s in runner.streams if s.runnable)
        begin = time.perf_counter()
        events = step()
        if marks:
            marks[-1].update(step_ms=round((time.perf_counter() - begin) * 1000, 1), prefilled=fresh,
                             packets=sum(packet is not None for _, packet in events))
        return events

    def traced_pass() -> None:
        begin = time.perf_counter()
        if len(marks) < passes:
            marks.append({"at_ms": round((begin - origin) * 1000, 1)})
            run_pass()
            marks[-1]["pass_ms"] = round((time.perf_counter() - begin) * 1000, 1)
        else:
            run_pass()

    engine.run_pass, runner.step = traced_pass, traced_step

    def stop() -> list[dict[str, Any]]:
        del engine.run_pass, runner.step  # the instances' own methods again
        return marks

    return stop


def step_times(runner: Any, model: str, args: argparse.Namespace, reps: int = 30) -> list[dict[str, Any]]:
    """One step alone at each captured batch size (graph replay): the prefill (PREFILL_LEN positions a stream;
    each longer captured length at its batch sizes), the frame (talker + 15-step code predictor), the codec
    packet (--packet-frames frames a stream) and a one-frame first packet; the eager frame at 1; the kernels of
    the frame at 1 and of the packet at 1, 64, 128 and 256."""
    import torch

    from engine.runner import PREFILL_LEN

    rows: list[dict[str, Any]] = []
    n = args.packet_frames
    with torch.no_grad():
        runner.model.step_in.zero_()  # no live row: nothing advances
        runner.decoder.index.fill_(runner.rows)  # every row decodes into the scratch row

        def timed(fn: Any) -> float:
            fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            return round((time.perf_counter() - start) * 1000 / reps, 3)

        def step(name: str, batch: int, ms: float) -> None:
            rows.append({"kind": "step", "model": model, "step": name, "batch": batch, "ms": ms})

        step("eager frame", 1, timed(lambda: runner.model.step(1)))
        rows.append({"kind": "profile", "model": model, "step": "frame", "batch": 1,
                     **kernel_profile(lambda: runner.model.step(1))})
        for b in sorted({1} | ({64, 128, 256} & set(runner.packet_graphs[n].graphs))):
            rows.append({"kind": "profile", "model": model, "step": "packet", "batch": b,
                         **kernel_profile(lambda b=b: runner.decoder.decode(b, n), top=10)})
        runner.model.prompt_meta[0].fill_(runner.rows)  # prefills write the scratch row only
        runner.model.prompt_meta[1].zero_()  # and read their first position (any captured length holds it)
        for length, graphs in runner.prefill_graphs.items():
            if length != PREFILL_LEN:
                for b in sorted(graphs.graphs):
                    step(f"prefill {length}", b, timed(lambda g=graphs.graphs[b]: g.replay()))
        for b in sorted(runner.frame_graphs.graphs):
            step("prefill", b, timed(lambda b=b: runner.prefill_graphs[PREFILL_LEN].graphs[b].replay()))
            step("frame", b, timed(lambda b=b: runner.frame_graphs.graphs[b].replay()))
            step("packet", b, timed(lambda b=b: runner.packet_graphs[n].graphs[b].replay()))
            if 1 in runner.packet_graphs and n != 1:  # a one-frame first packet
                step("first packet", b, timed(lambda b=b: runner.packet_graphs[1].graphs[b].replay()))
    for row in rows:
        row |= {"valid": None, "invalid": []}
    return rows


def kernel_profile(fn: Any, top: int = 6) -> dict[str, Any]:
    """The GPU kernels one eager call of fn launches: how many, their busy time, and the costliest names."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:60], []).append(e.device_time)
    costliest = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"kernels": len(kernels), "busy_ms": round(sum(e.device_time for e in kernels) / 1000, 3),
            "top_ms": {name: [len(t), round(sum(t) / 1000, 3)] for name, t in costliest}}


def kernel_ops(args: argparse.Namespace) -> dict[str, Any]:
    """engine.kernels against the PyTorch code each replaces, at the real 0.6B shapes: microseconds per call,
    captured 20 calls a CUDA graph and replayed (the median of 50 replays), inputs random, bf16."""
    import torch

    from engine import kernels
    from engine.sampling import choose

    if args.device != "cuda":
        raise SystemExit("--kernels needs a GPU (--device cuda)")
    hidden, heads, kv_heads, head_dim, intermediate, calls, reps = 1024, 16, 8, 128, 3072, 20, 50
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=dev).to(dt)

    def timed(fn: Any) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # autotuning and lazy initialisation, outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / calls)
        return round(statistics.median(times), 2)

    rows: list[dict[str, Any]] = []

    def both(op: str, shape: str, fn: Any) -> None:
        fused = timed(fn)
        kernels.set_enabled(False)
        try:
            reference = timed(fn)
        finally:
            kernels.set_enabled(True)
        rows.append({"kind": "op", "op": op, "shape": shape, "fused_us": fused, "torch_us": reference,
                     "speedup": round(reference / fused, 2), "valid": None, "invalid": []})
        log(f"{op:<28} {shape:<34} fused {fused:8.2f} us   torch {reference:8.2f} us")

    norm = (1 + 0.1 * randn(hidden), 1e-6)
    limit, kernels.GEMV_MAX_ROWS = kernels.GEMV_MAX_ROWS, 4
    try:
        for name, (n, k, fusion) in {"qkv (norm)": ((heads + 2 * kv_heads) * head_dim, hidden, "norm"),
                                     "o_proj (+residual)": (hidden, heads * head_dim, "residual"),
                                     "gate_up (norm)": (2 * intermediate, hidden, "norm"),
                                     "down (silu, +residual)": (hidden, intermediate, "silu"),
                                     "predictor lm_head (norm)": (2048, hidden, "norm")}.items():
            weight = randn(n, k) / k**0.5
            for m in (1, 2, 4):
                x = randn(m, 2 * k if fusion == "silu" else k)
                residual = randn(m, n) if fusion in ("residual", "silu") else None
                both(f"linear {name}", f"M={m} N={n} K={k}",
                     lambda x=x, weight=weight, fusion=fusion, residual=residual: kernels.linear(
                         x, weight, norm=norm if fusion == "norm" else None, silu=fusion == "silu",
                         residual=residual))
    finally:
        kernels.GEMV_MAX_ROWS = limit
    q_norm, k_norm = 1 + 0.1 * randn(head_dim), 1 + 0.1 * randn(head_dim)
    qk_norm = torch.cat([q_norm.expand(heads, -1), k_norm.expand(kv_heads, -1)])
    for where, max_len in (("talker", 1520), ("predictor", 16)):
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
        emb = torch.cat([torch.outer(torch.arange(max_len, device=dev).float(), inv_freq)] * 2, -1)
        sign = torch.cat([-torch.ones_like(inv_freq), torch.ones_like(inv_freq)])
        rope = (emb.cos().to(dt), (emb.sin() * sign).to(dt))
        for b in (1, 64, 256):
            cache_k, cache_v = randn(b + 1, kv_heads, max_len, head_dim), randn(b + 1, kv_heads, max_len, head_dim)
            cases = ([("pos 140", 0, torch.full((b,), 140, device=dev)),
                      ("pos 1000", 0, torch.full((b,), 1000, device=dev))]
                     if where == "talker" else [("start 0, 2 new", 0, None), ("start 8", 8, None)])
            for label, start, pos in cases:
                qkv = randn(b, 2 if label.endswith("2 new") else 1, (heads + 2 * kv_heads) * head_dim)
                both(f"attention {where}", f"B={b} {label} (cache {max_len})",
                     lambda qkv=qkv, cache_k=cache_k, cache_v=cache_v, start=start, pos=pos, rope=rope:
                     kernels.decode_attention(qkv, q_norm, k_norm, qk_norm, 1e-6, rope, cache_k, cache_v, start,
                                              pos, heads))
    for b in (1, 64):
        for vocab in (2048, 3072):
            logits, u = 3 * torch.randn(b, vocab, device=dev), torch.rand(b, device=dev)
            both("sample (top-k 50)", f"B={b} V={vocab}",
                 lambda logits=logits, u=u: choose(logits, True, 50, 1.0, 0.9, u))
    tuned = {str(key): str(config) for key, config in kernels._gemv_kernel.cache.items()}
    return {"setup": "fused kernels, per op", "settings": {"gemv_configs": tuned, "reps": reps, "calls": calls},
            "levels": rows}


def brief(row: dict[str, Any]) -> str:
    return (f"{row['mode']}, {row['streams']} {row['arrival']}: first audio P50/P95 {row['first_audio_p50_ms']} / "
            f"{row['first_audio_p95_ms']} ms, RTF P50/max {row['rtf_p50']} / {row['rtf_max']}, stall P95 "
            f"{row['stall_p95_ms']} ms; the delivery loop's lag P99 {row['loop_lag_p99_ms']} ms")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
