"""Noise reduction measured: speech mixed with noise at several SNRs, with it off and on.

For each noise (the fixtures' pink noise, tests/fixtures/noise.wav, looped; and babble: four of the demo
questions played backwards at once) and SNR (speech RMS over noise RMS), a level:
  - VAD false starts: turns the gateway's turn detector (Silero + server_vad defaults) starts in 20 s of the
    noise alone, at the level it has in the mix;
  - WER: the local STT's (faster-whisper tiny.en, the local extra) word error rate over the demo questions;
and per reduction kind, CPU: the denoiser's process time per minute of audio fed in 20 ms chunks as a phone
sends it (one session-minute; process time: comparable on a busy machine). Nothing here has a load side.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import FIXTURES
from gateway.audio import SAMPLE_RATE, wav_to_pcm16
from gateway.core.vad import SpeechStarted, TurnDetector
from gateway.runtime.denoise import Denoiser
from gateway.runtime.silero import SileroVAD

HELP = "noise reduction: VAD false starts and the local STT's WER in noise, off and on; its CPU per session-minute"
HOW = """\
    python -m bench noise --small                  # pink and babble at 10 dB, near_field, 3 questions
    python -m bench noise                          # 0, 5 and 10 dB, near_field and far_field, 21 questions"""
NOISE_SECONDS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--snr", help="comma-separated SNRs in dB (default 0,5,10; --small 10)")
    parser.add_argument("--kinds", help="reduction kinds beside off (default near_field,far_field; --small "
                        "near_field)")
    parser.add_argument("--questions", type=int, help="demo questions mixed (default 21; --small 3)")


def load(path: Path) -> np.ndarray:
    return np.frombuffer(wav_to_pcm16(path.read_bytes()), dtype="<i2").astype(np.float32)


def questions(limit: int) -> list[tuple[np.ndarray, str]]:
    table = json.loads((FIXTURES / "demo" / "questions.json").read_text())[:limit]
    return [(load(FIXTURES / "demo" / q["file"]), q["question"]) for q in table]


def noises() -> dict[str, np.ndarray]:
    pink = load(FIXTURES / "noise.wav")
    babble_parts = [load(FIXTURES / "demo" / name)[::-1] for name in ("cow.wav", "earth.wav", "hot.wav", "ice.wav")]
    length = max(len(p) for p in babble_parts)
    babble = sum(np.pad(p, (0, length - len(p)), mode="wrap") for p in babble_parts)
    return {"pink": pink, "babble": babble}


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)) or 1e-9)


def speech_rms(x: np.ndarray) -> float:
    """RMS over the louder half of 20 ms frames: the speech, not the silence around it."""
    frames = x[: len(x) // 480 * 480].reshape(-1, 480)
    energy = np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1))
    return float(np.sqrt(np.mean(np.sort(energy)[len(energy) // 2:] ** 2)))


def at_level(noise: np.ndarray, n: int, level: float, offset: int = 0) -> np.ndarray:
    """``n`` samples of ``noise`` (looped, from ``offset``) at RMS ``level``."""
    looped = np.resize(np.roll(noise, -offset), n)
    return looped * (level / rms(looped))


def to_pcm(x: np.ndarray) -> bytes:
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


def clean(pcm: bytes, kind: str | None) -> bytes:
    if kind is None:
        return pcm
    denoiser = Denoiser(kind)
    out = b"".join(denoiser.process(pcm[i:i + 960]) for i in range(0, len(pcm), 960))
    return out + denoiser.process(bytes(960 * 2))  # the frames still waiting


def false_starts(pcm: bytes) -> int:
    vad, detector = SileroVAD(), TurnDetector()
    return sum(isinstance(e, SpeechStarted) for e in detector.feed(vad.process(pcm)))


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    row = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, hyp in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != hyp))
    return row[-1]


def measure(snrs: Iterable[float] = (0, 5, 10), kinds: Iterable[str | None] = (None, "near_field", "far_field"),
            limit: int = 21) -> list[dict[str, Any]]:
    from gateway.responders.local_stt import LocalStt  # the local extra

    stt = LocalStt.shared()
    speech = questions(limit)
    level = np.mean([speech_rms(x) for x, _ in speech])
    rows: list[dict[str, Any]] = []
    for noise_name, noise in noises().items():
        for snr in snrs:
            noise_level = level / 10 ** (snr / 20)
            alone = to_pcm(at_level(noise, NOISE_SECONDS * SAMPLE_RATE, noise_level))
            mixes = [(to_pcm(x + at_level(noise, len(x), noise_level, offset=i * 7919)), text)
                     for i, (x, text) in enumerate(speech)]
            for kind in kinds:
                errors = total = 0
                for pcm, text in mixes:
                    heard = stt._transcribe_pcm(clean(pcm, kind), None, "en")
                    errors += word_errors(words(text), words(heard))
                    total += len(words(text))
                rows.append({"measure": "noise", "noise": noise_name, "snr_db": snr,
                             "noise_reduction": kind or "off", "vad_false_starts": false_starts(clean(alone, kind)),
                             "false_starts_per": f"{NOISE_SECONDS} s", "wer": round(errors / total, 3),
                             "utterances": len(mixes), "valid": None, "invalid": []})
                print(f"{noise_name:8} {snr:>4g} dB {kind or 'off':>10}: VAD false starts "
                      f"{rows[-1]['vad_false_starts']} / {NOISE_SECONDS} s, WER {rows[-1]['wer']:.1%}", flush=True)
    return rows


def cpu_ms_per_minute(kind: str) -> float:
    """The denoiser's CPU time for one minute of input audio, fed in 20 ms chunks as a phone sends it."""
    pcm = to_pcm(np.random.default_rng(0).normal(0, 3000, 60 * SAMPLE_RATE))
    denoiser = Denoiser(kind)
    start = time.process_time()
    for i in range(0, len(pcm), 960):
        denoiser.process(pcm[i:i + 960])
    return (time.process_time() - start) * 1000


def run(args: argparse.Namespace) -> dict[str, Any]:
    snrs = [float(s) for s in (args.snr or ("10" if args.small else "0,5,10")).split(",")]
    kinds = [k for k in (args.kinds or ("near_field" if args.small else "near_field,far_field")).split(",") if k]
    limit = args.questions or (3 if args.small else 21)
    levels = measure(snrs, [None, *kinds], limit)
    for kind in kinds:
        cpu = cpu_ms_per_minute(kind)
        levels.append({"measure": "cpu", "noise_reduction": kind, "cpu_ms_per_session_min": round(cpu),
                       "valid": None, "invalid": []})
        print(f"CPU, {kind}: {cpu:.0f} ms per session-minute (20 ms chunks)", flush=True)
    return {"setup": f"{limit} questions, local STT", "settings": {"snr_db": snrs, "kinds": kinds, "questions": limit,
                                                                   "noise_seconds": NOISE_SECONDS},
            "levels": levels}
