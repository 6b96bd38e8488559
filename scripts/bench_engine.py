"""Time to first audio and per-stream real-time factor at 1..N concurrent streams: this engine with CUDA
graphs and batching, the same engine eager, and the official qwen-tts (one stream: it has no batching here).

Each kind of checkpoint is timed in its voices (--modes): a CustomVoice checkpoint's named speakers (speaker,
the default) and, at 1.7B, with instructions (instruct); a Base checkpoint's clones (the default both),
in-context (icl: the reference's codes and transcript in the prompt) and x-vector only (xvec); a VoiceDesign
checkpoint's designed voices (design). A wave's streams cycle through --voices different voices of the mode
and two languages (english, auto), so a batch mixes them. Clones are prepared from --reference-s windows of
the test fixtures' speech, and the time to prepare one (speaker embedding and encoder codes, through the
engine's thread) is reported too; the untimed wave of each level meets every voice once first (an
in-context voice's first stream decodes its reference once, kept for its next streams).

All read the same checkpoint, sample with its generation_config.json and make exactly --frames frames per
stream (EOS is held off, so random weights give a fixed length). This engine is timed through QwenTTSEngine
(worker thread, asyncio, pcm16 packets of --packet-frames frames), each stream from open() to its first and
last packet, in two ways per level N:
- at once: a wave opens N streams in the same instant, feeds each the whole text (the worst case for first
  audio: N prompts, N first frames and N first packets in the same steps);
- staggered (--staggered): N clients each open a stream, read it to its end and open the next, starting
  spread over one stream's duration, so that the streams timed (those opened after that ramp, for as long
  again) join a batch that holds N - 1 running streams: the steady state of N concurrent streams.
RTF = wall time / audio time, per stream; a stall is the time a listener playing each stream from its first
packet on would wait for the next packet (no playout buffer). Each level runs one untimed wave first. The
official code has no audio streaming, so its first audio is its whole generate + decode. A level is realtime
when every stream's RTF < 1 and first audio P95 < 200 ms. The largest level's timed wave also records what
the engine's loop did in its first passes (when each began, how long it took, how many streams it
prefilled, how many packets it handed out).

The official side needs qwen-tts and transformers 4.57.3, so it runs in a child process with
--official-pythonpath prepended (this engine uses the gateway's transformers 5.x):

    python scripts/make_parity_fixture.py --config real-0.6b --out /tmp/q06 --device cuda   # (oracle env)
    python scripts/bench_engine.py --checkpoint /tmp/q06 --official-pythonpath /tmp/site-oracle --numerics
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

TEXT = "Hello world, this is a test of the voice gateway. How are you doing today?"
SPEAKER, LANGUAGE = "vivian", "english"
SAMPLE_RATE = 24000
# What the reference windows say (their transcript for in-context cloning): about as many words as 10 s hold.
TRANSCRIPT = ("The quick brown fox jumps over the lazy dog. Could you tell me what the weather will be like "
              "tomorrow? Yes, and please book a table for two at seven.")
INSTRUCTIONS = ["Speak slowly, in a sad and tired voice.", "Sound cheerful and excited.", "Whisper, as if telling "
                "a secret.", "Speak like a news anchor, clearly and evenly."]
DESCRIPTIONS = ["A warm, low female voice, speaking calmly.", "A young man with a bright, fast voice.",
                "An old man with a raspy, slow voice.", "A cheerful child's voice, high and lively."]
# The modes timed when --modes is not given (a CustomVoice 1.7B's instructions only when asked: instruct).
MODES = {"custom_voice": ["speaker"], "base": ["icl", "xvec"], "voice_design": ["design"]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def reference_windows(seconds: float, count: int) -> list[np.ndarray]:
    """`count` different windows of `seconds` of speech at 24 kHz from the test fixtures, one per voice."""
    from gateway.audio import decode_wav

    names = ["two_turns.wav", "one_sentence.wav", "paused_turn.wav", "question_sky.wav", "question_tea.wav",
             "question_spider.wav", "speech_noise.wav"]
    audio = np.concatenate([decode_wav((ROOT / "tests" / "fixtures" / n).read_bytes())[0][:, 0] for n in names])
    length = int(seconds * SAMPLE_RATE)
    while len(audio) < length + count * SAMPLE_RATE:
        audio = np.concatenate([audio, audio])
    step = (len(audio) - length) // max(1, count - 1) if count > 1 else 0
    return [audio[i * step:i * step + length] for i in range(count)]


def voice_pool(engine, ckpt, mode: str, args: argparse.Namespace) -> list[tuple[str, dict]]:
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
    windows = reference_windows(args.reference_s, n)
    return [(f"{mode}{i}", {"prompt": asyncio.run(engine.prepare(w, SAMPLE_RATE, text))})
            for i, w in enumerate(windows)]


def prepare_times(engine, args: argparse.Namespace, runs: int = 5) -> dict:
    """Milliseconds to prepare a clone of one --reference-s clip (speaker embedding, and for ICL the encoder's
    codes) through the engine's thread, the first call (warm-up) left out."""
    (clip,) = reference_windows(args.reference_s, 1)
    out = {}
    for mode, text in (("icl", TRANSCRIPT), ("xvec", None)):
        times = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            asyncio.run(engine.prepare(clip, SAMPLE_RATE, text))
            times.append((time.perf_counter() - start) * 1000)
        times = times[1:]
        out[mode] = {"p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
    return out


def bench_ours(args: argparse.Namespace, ckpt, graphs: bool, levels: list[int], modes: list[str]) -> list[dict]:
    """In each mode's voices (one result per mode), for each N in levels: waves of N streams opened at once (the
    worst case for first audio), then (--staggered) N streams at all times."""
    from engine import kernels
    from engine.threaded import QwenTTSEngine

    name = "this engine, CUDA graphs" if graphs else "this engine, eager"
    if not kernels.available(torch.zeros(0, device=args.device)):
        name += ", no fused kernels"
    start = time.perf_counter()
    engine = QwenTTSEngine(ckpt, packet_frames=args.packet_frames, first_packet_frames=args.first_packet_frames,
                           max_frames=args.frames, min_frames=args.frames, max_streams=max(levels), seed=0,
                           cuda_graphs=graphs, max_reference_s=args.reference_s + 0.5)
    setup_s = time.perf_counter() - start
    log(f"{name}: engine ready in {setup_s:.1f} s (rows {max(levels)})")

    def open_stream(i: int, pool: list[tuple[str, dict]]):
        """Stream i of a wave or a client: voice i of the pool, in one of two languages."""
        voice, kw = pool[i % len(pool)]
        stream = engine.open(voice, LANGUAGE if i % 2 == 0 else "auto", **kw)
        stream.feed(TEXT)
        stream.end()
        return stream

    async def wave(n: int, pool: list[tuple[str, dict]]) -> list[Timing]:
        tasks = []
        for i in range(n):
            opened = time.perf_counter()
            tasks.append(listen(open_stream(i, pool), opened))
        return await asyncio.gather(*tasks)

    async def staggered(n: int, ramp: float, pool: list[tuple[str, dict]]) -> list[Timing]:
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

    results = []
    prep = prepare_times(engine, args) if ckpt.config.kind == "base" else None
    if prep:
        log(f"{name}: preparing a {args.reference_s:g} s reference: {prep}")
    for mode in modes:
        pool = voice_pool(engine, ckpt, mode, args)
        label = f"{name}, {mode}"
        rows = []
        for n in levels:
            if time.perf_counter() > args.deadline:
                log(f"{label}: out of time before {n} streams")
                break
            asyncio.run(wave(n, pool))  # untimed: the allocators, kernels and voices meet this batch size once first
            trace = trace_passes(engine) if n == max(levels) else None
            t0 = time.perf_counter()
            runs = [r for _ in range(args.runs) for r in asyncio.run(wave(n, pool))]
            wall = (time.perf_counter() - t0) / args.runs
            row = {"streams": n, "arrival": "at once", **summary(runs),
                   "ms_per_step": round(wall * 1000 / args.frames, 2)}
            if trace is not None:
                row["passes"] = trace()
            rows.append(row)
            log(f"{label}: {row}")
            if args.staggered and time.perf_counter() < args.deadline:
                ramp = statistics.mean(r.wall for r in runs)
                timed = asyncio.run(staggered(n, ramp, pool))
                if timed:
                    row = {"streams": n, "arrival": "staggered", **summary(timed), "ramp_s": round(ramp, 2)}
                    rows.append(row)
                    log(f"{label}: {row}")
        realtime = {arrival: max((r["streams"] for r in rows if r["realtime"] and r["arrival"] == arrival), default=0)
                    for arrival in ("at once", "staggered")}
        results.append({"impl": label, "mode": mode, "voices": len(pool), "kind": ckpt.config.kind,
                        "dtype": str(next(ckpt.model.parameters()).dtype), "setup_s": round(setup_s, 1),
                        "frames": args.frames, "runs": args.runs, "levels": rows, "max_realtime_streams": realtime})
    if prep:
        results[0]["prepare_ms"] = prep
    if torch.cuda.is_available():  # the weights, the rows' caches, the graphs' memory, the waves' peak
        results[0]["memory_gib"] = {"allocated": round(torch.cuda.memory_allocated() / 2**30, 2),
                                    "peak": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                                    "reserved": round(torch.cuda.memory_reserved() / 2**30, 2)}
    if graphs:
        results[0]["steps_ms"] = step_times(engine.models[0].runner, args)
    engine.close()
    return results


@dataclass
class Timing:
    first: float  # seconds from open() to the first packet
    wall: float  # to the last
    audio: float  # seconds of audio
    stall: float  # seconds a listener would wait for packets after the first (no playout buffer)


async def listen(stream, opened: float) -> Timing:
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
        seconds = len(chunk.pcm) / 2 / SAMPLE_RATE
        playing_until += seconds
        samples += len(chunk.pcm) // 2
    assert first is not None
    return Timing(first, time.perf_counter() - opened, samples / SAMPLE_RATE, stall)


def summary(runs: list[Timing]) -> dict:
    firsts = [r.first for r in runs]
    rtfs = [r.wall / r.audio for r in runs]
    stalls = [r.stall for r in runs]
    row = {"timed": len(runs), "first_audio_p50_ms": round(percentile(firsts, 50) * 1000, 1),
           "first_audio_p95_ms": round(percentile(firsts, 95) * 1000, 1),
           "rtf_p50": round(percentile(rtfs, 50), 4), "rtf_max": round(max(rtfs), 4),
           "stall_p95_ms": round(percentile(stalls, 95) * 1000, 1), "stall_max_ms": round(max(stalls) * 1000, 1)}
    row["realtime"] = row["rtf_max"] < 1 and row["first_audio_p95_ms"] < 200
    return row


def trace_passes(engine, passes: int = 12):
    """Record the engine loop's first `passes` passes from now on (when each began after this call and how
    long it took, the part in the runner's step, streams it prefilled, packets it handed out); the returned
    function stops recording and gives them."""
    origin = time.perf_counter()
    marks: list[dict] = []
    runner = engine.models[0].runner
    run_pass, step = engine.run_pass, runner.step

    def traced_step():
        fresh = sum(not s.started for s in runner.streams if s.runnable)
        begin = time.perf_counter()
        events = step()
        if marks:
            marks[-1].update(step_ms=round((time.perf_counter() - begin) * 1000, 1), prefilled=fresh,
                             packets=sum(packet is not None for _, packet in events))
        return events

    def traced_pass():
        begin = time.perf_counter()
        if len(marks) < passes:
            marks.append({"at_ms": round((begin - origin) * 1000, 1)})
            run_pass()
            marks[-1]["pass_ms"] = round((time.perf_counter() - begin) * 1000, 1)
        else:
            run_pass()

    engine.run_pass, runner.step = traced_pass, traced_step

    def stop() -> list[dict]:
        del engine.run_pass, runner.step  # the instances' own methods again
        return marks

    return stop


@torch.no_grad()
def step_times(runner, args: argparse.Namespace, reps: int = 30) -> dict:
    """One step alone at each captured batch size (graph replay): the prefill (PREFILL_LEN positions per stream;
    each longer captured length at its batch sizes), the frame step (talker + 15-step code predictor), the
    packet step (codec, --packet-frames frames per stream) and a one-frame first packet; and the eager frame
    step at 1."""
    runner.model.step_in.zero_()  # no live row: nothing advances
    runner.decoder.index.fill_(runner.rows)  # every row decodes into the scratch row
    from engine.runner import PREFILL_LEN

    n = args.packet_frames

    def timed(fn) -> float:
        fn()
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return round((time.perf_counter() - start) * 1000 / reps, 3)

    out = {"eager_frame_b1": timed(lambda: runner.model.step(1))}
    if torch.cuda.is_available():
        out["frame_b1_kernels"] = kernel_profile(lambda: runner.model.step(1))
        for b in sorted({1} | ({64, 128, 256} & set(runner.packet_graphs[n].graphs))):
            out[f"packet_b{b}_kernels"] = kernel_profile(lambda b=b: runner.decoder.decode(b, n), top=10)
    runner.model.prompt_meta[0].fill_(runner.rows)  # prefills write the scratch row only
    runner.model.prompt_meta[1].zero_()  # and read their first position (any captured length holds it)
    for length, graphs in runner.prefill_graphs.items():
        if length != PREFILL_LEN:
            for b in sorted(graphs.graphs):
                out[f"prefill_{length}_b{b}"] = timed(lambda g=graphs.graphs[b]: g.replay())
    for b in sorted(runner.frame_graphs.graphs):
        out[f"prefill_b{b}"] = timed(lambda b=b: runner.prefill_graphs[PREFILL_LEN].graphs[b].replay())
        out[f"frame_b{b}"] = timed(lambda b=b: runner.frame_graphs.graphs[b].replay())
        out[f"packet_b{b}"] = timed(lambda b=b: runner.packet_graphs[n].graphs[b].replay())
        if 1 in runner.packet_graphs and n != 1:  # a one-frame first packet
            out[f"first_packet_b{b}"] = timed(lambda b=b: runner.packet_graphs[1].graphs[b].replay())
    return out


def kernel_profile(fn, top: int = 6) -> dict:
    """The GPU kernels one eager call of fn launches: how many, their busy time, and the costliest names."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:60], []).append(e.device_time)
    costliest = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"count": len(kernels), "busy_ms": round(sum(e.device_time for e in kernels) / 1000, 3),
            "top_ms": {name: [len(t), round(sum(t) / 1000, 3)] for name, t in costliest}}


@torch.no_grad()
def numerics(ckpt, args: argparse.Namespace) -> dict:
    """Greedy, in the benchmark dtype, 6 prompts of 48 frames: each prompt alone on the eager path against
    all of them in one batch, eager and with graph replay, and alone without engine.kernels (the same
    arithmetic through other kernels: how far rounding alone moves the codes). Code match rate over all 16
    codebooks, and the waveform SNR against each prompt alone."""
    import math

    from engine import kernels
    from engine.prompt import TextTokens, Voice
    from engine.runner import Runner, synthesize
    from engine.sampling import SamplingParams
    from engine.stream import Stream

    params = SamplingParams.from_generation_config(ckpt.generation, greedy=True)
    prompts = [("vivian", "english", TEXT), ("ryan", "english", "How are you doing today? I am fine, thanks!"),
               ("ryan", "chinese", "今天天气很好，我们去公园散步吧。"),
               ("eric", "chinese", "你好，世界！这是一个测试。"),
               ("dylan", "auto", "我们一起吃饭吧。"),
               ("serena", "english", "The quick brown fox jumps over the lazy dog.")]
    frames = 48
    alone = [synthesize(ckpt, spk, lang, text, params, max_frames=frames) for spk, lang, text in prompts]

    def batched(graphs: bool) -> list[tuple[torch.Tensor, bytes]]:
        runner = Runner(ckpt, len(prompts), frames + 16, params, args.packet_frames, cuda_graphs=graphs)
        tokens = TextTokens(ckpt.tokenizer)
        streams = []
        for spk, lang, text in prompts:
            stream = Stream(ckpt, tokens, Voice.resolve(ckpt.config, spk, lang), 0, args.packet_frames, frames)
            stream.add_text(text, final=True)
            runner.add(stream)
            streams.append(stream)
        packets: dict[int, list] = {i: [] for i in range(len(prompts))}
        while runner.streams or runner.busy:
            for stream, packet in runner.step():
                if packet is not None:
                    packets[streams.index(stream)].append(packet)
        return [(torch.cat([p.codes for p in ps], dim=1).T, b"".join(p.pcm for p in ps)) for ps in packets.values()]

    def compare(got: list[tuple[torch.Tensor, bytes]], ref: list[tuple[torch.Tensor, bytes]]) -> dict:
        same = total = 0
        signal = noise = 0.0
        for (codes, pcm), (ref_codes, ref_pcm) in zip(got, ref, strict=True):
            n = min(len(codes), len(ref_codes))
            same += int((codes[:n] == ref_codes[:n]).sum())
            total += 16 * max(len(codes), len(ref_codes))
            a = torch.frombuffer(bytearray(ref_pcm), dtype=torch.int16).double()
            b = torch.frombuffer(bytearray(pcm), dtype=torch.int16).double()
            m = min(len(a), len(b))
            signal += float((a[:m] ** 2).sum())
            noise += float(((a[:m] - b[:m]) ** 2).sum())
        return {"code_match_rate": round(same / total, 4),
                "snr_db": round(10 * math.log10(signal / noise), 1) if noise else "inf (identical)"}

    ref = [(codes, b"".join(p.pcm for p in packets)) for codes, packets in alone]
    eager, graph = batched(False), batched(True)
    enabled = kernels.available(torch.zeros(0, device=args.device))
    kernels.set_enabled(not enabled)
    other = [synthesize(ckpt, spk, lang, text, params, max_frames=frames) for spk, lang, text in prompts]
    kernels.set_enabled(enabled)
    other_ref = [(codes, b"".join(p.pcm for p in packets)) for codes, packets in other]
    return {"prompts": len(prompts), "frames": frames, "graph_batch_vs_eager_alone": compare(graph, ref),
            "eager_batch_vs_eager_alone": compare(eager, ref), "graph_batch_vs_eager_batch": compare(graph, eager),
            "eager_alone_vs_eager_alone_other_kernels": compare(other_ref, ref)}


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
            "levels": [{"streams": 1, "first_audio_p50_ms": round(first * 1000, 1), "rtf_p50": round(wall / audio, 4),
                        "ms_per_step": round(wall * 1000 / args.frames, 2)}]}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--impl", choices=("all", "ours", "official"), default="all")
    parser.add_argument("--official-pythonpath", default="", help="site folder holding qwen-tts + transformers 4.57.3")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--frames", type=int, default=125, help="frames per utterance (125 = 10 s of audio)")
    parser.add_argument("--packet-frames", type=int, default=4)
    parser.add_argument("--first-packet-frames", type=int, default=1)
    parser.add_argument("--streams", default="1,8,32,64,128,256", help="concurrent streams, CUDA-graph path")
    parser.add_argument("--modes", default="", help="voices to time: speaker, instruct, icl, xvec, design (default: "
                        "a CustomVoice checkpoint's speakers, a Base one's clones, a VoiceDesign one's designs)")
    parser.add_argument("--voices", type=int, default=8, help="different voices per mode in each wave")
    parser.add_argument("--reference-s", type=float, default=10.0, help="seconds of each clone's reference")
    parser.add_argument("--eager-streams", default="1,8,32,64", help="concurrent streams, eager path ('' = none)")
    parser.add_argument("--staggered", action="store_true", help="also N streams at all times, the timed ones "
                        "joining N - 1 running streams (after each level's waves)")
    parser.add_argument("--runs", type=int, default=3, help="waves per level (the first audio and RTF of every "
                        "stream of every wave are pooled)")
    parser.add_argument("--official-runs", type=int, default=1)
    parser.add_argument("--numerics", action="store_true", help="bf16 graph-vs-eager code match rate and SNR")
    parser.add_argument("--no-fused-kernels", action="store_true",
                        help="this engine without engine.kernels (its PyTorch paths), for comparison")
    parser.add_argument("--time-budget", type=float, default=480, help="seconds; later levels are skipped past it")
    parser.add_argument("--host-only", action="store_true", help="every device step (prefill, frame, codec) does "
                        "nothing: the engine loop's host work alone (admission, tokenization, prompts, bookkeeping, "
                        "delivery), e.g. on a CPU")
    parser.add_argument("--engine-root", type=Path, default=ROOT, help="the tree whose engine/ is measured")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    args.deadline = time.perf_counter() + args.time_budget

    sys.path.insert(0, str(args.engine_root.resolve()))  # engine/ is imported from there (lazily, from here on)
    if args.impl == "official":
        args.runs = args.official_runs
        print(json.dumps(bench_official(args)))
        return
    from engine import checkpoint, kernels

    kernels.set_enabled(not args.no_fused_kernels)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s: %(message)s")
    log(f"engine from {Path(kernels.__file__).parent}")
    ckpt = checkpoint.load(args.checkpoint, device=args.device, dtype=args.dtype)
    if args.host_only:
        from engine import runner

        runner.Graphs.run = lambda self, b: None
        ckpt.model.prefill = lambda n, length: None
    levels = [int(n) for n in args.streams.split(",") if n]
    eager_levels = [int(n) for n in args.eager_streams.split(",") if n]
    modes = [m for m in args.modes.split(",") if m] or MODES[ckpt.config.kind]
    results = bench_ours(args, ckpt, graphs=True, levels=levels, modes=modes)
    if eager_levels:
        results += bench_ours(args, ckpt, graphs=False, levels=eager_levels, modes=modes[:1])
    report = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "command": " ".join(["python"] + sys.argv), "text": TEXT, "results": results}
    if kernels.triton is not None and args.device != "cpu":
        report["gemv_configs"] = {str(key[:5]): str(config) for key, config in kernels._gemv_kernel.cache.items()}
        report["conv_configs"] = {str(key): str(config) for key, config in kernels._conv_kernel.cache.items()}
    if args.numerics:
        report["numerics"] = numerics(ckpt, args)
        log(f"numerics: {report['numerics']}")
    if args.impl == "all" and ckpt.config.kind != "custom_voice":
        log("the official baseline times a CustomVoice checkpoint's named speaker only: skipped")
    elif args.impl == "all":
        env = dict(os.environ)
        if args.official_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.official_pythonpath, env.get("PYTHONPATH")]))
        child = [sys.executable, __file__, "--impl", "official", "--checkpoint", args.checkpoint,
                 "--device", args.device, "--dtype", args.dtype, "--frames", str(args.frames),
                 "--official-runs", str(args.official_runs)]
        out = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit("the official benchmark failed")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{report['machine']}; {args.frames} frames ({args.frames * 0.08:.1f} s of audio) per stream; at once: "
          f"{args.runs} waves per level pooled; staggered: N streams at all times, the timed ones joining N - 1")
    print("| implementation | dtype | streams | arrival | first audio P50 ms | P95 ms | RTF P50 | RTF max "
          "| stall P95 ms | ms/step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for row in r["levels"]:
            print(f"| {r['impl']} | {r['dtype']} | {row['streams']} | {row.get('arrival', 'alone')} | "
                  f"{row['first_audio_p50_ms']} | {row.get('first_audio_p95_ms', '')} | {row['rtf_p50']} | "
                  f"{row.get('rtf_max', '')} | {row.get('stall_p95_ms', '')} | {row.get('ms_per_step', '')} |")
    for r in results:
        if "max_realtime_streams" in r:
            print(f"{r['impl']}: at most {r['max_realtime_streams']} concurrent streams all realtime with first "
                  f"audio P95 < 200 ms (of the levels run, by arrival); start-up {r['setup_s']} s")
        for row in r["levels"]:
            if "passes" in row:
                print(f"{r['impl']}, {row['streams']} streams at once, the loop's first passes: {row['passes']}")
    if "prepare_ms" in results[0]:
        print(f"preparing a clone of a {args.reference_s:g} s reference, ms: {results[0]['prepare_ms']}")
    if "steps_ms" in results[0]:
        print(f"one step alone, ms: {results[0]['steps_ms']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
