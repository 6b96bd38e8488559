"""Noise reduction measured: speech mixed with noise at several SNRs, with it off and on.

For each noise (the fixtures' pink noise, tests/fixtures/noise.wav, looped; and babble: four of the demo
questions played backwards at once) and SNR (speech RMS over noise RMS), it reports:
  - VAD false starts: turns the gateway's turn detector (Silero + server_vad defaults) starts in 20 s of the
    noise alone, at the level it has in the mix;
  - WER: the local STT's (faster-whisper tiny.en, the local extra) word error rate over the demo questions;
  - CPU: the denoiser's process time per minute of audio (one session-minute).

    python scripts/bench_noise.py [--snr 0,5,10] [--kinds near_field,far_field] [--questions 21]

``measure()`` returns the rows as dicts (a bench suite's records); ``main()`` prints them as a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from gateway.audio import SAMPLE_RATE, wav_to_pcm16
from gateway.core.vad import SpeechStarted, TurnDetector
from gateway.runtime.denoise import Denoiser
from gateway.runtime.silero import SileroVAD

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
NOISE_SECONDS = 20


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
            limit: int = 21) -> list[dict[str, object]]:
    from gateway.responders.local_stt import LocalStt  # the local extra

    stt = LocalStt.shared()
    speech = questions(limit)
    level = np.mean([speech_rms(x) for x, _ in speech])
    rows: list[dict[str, object]] = []
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
                rows.append({"noise": noise_name, "snr_db": snr, "noise_reduction": kind or "off",
                             "vad_false_starts": false_starts(clean(alone, kind)),
                             "false_starts_per": f"{NOISE_SECONDS} s", "wer": round(errors / total, 3),
                             "utterances": len(mixes)})
    return rows


def cpu_ms_per_minute(kind: str) -> float:
    """The denoiser's CPU time for one minute of input audio, fed in 20 ms chunks as a phone sends it."""
    pcm = to_pcm(np.random.default_rng(0).normal(0, 3000, 60 * SAMPLE_RATE))
    denoiser = Denoiser(kind)
    start = time.process_time()
    for i in range(0, len(pcm), 960):
        denoiser.process(pcm[i:i + 960])
    return (time.process_time() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snr", default="0,5,10")
    parser.add_argument("--kinds", default="near_field,far_field")
    parser.add_argument("--questions", type=int, default=21)
    args = parser.parse_args()
    kinds = [None, *[k for k in args.kinds.split(",") if k]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"machine {platform.node()} ({platform.processor() or platform.machine()}), {time.strftime('%Y-%m-%d')}, "
          f"commit {commit}: python {' '.join(sys.argv)}")
    rows = measure([float(s) for s in args.snr.split(",")], kinds, args.questions)
    print(f"{'noise':8} {'SNR dB':>6} {'reduction':>10} {'VAD false starts':>17} {'WER':>6}")
    for row in rows:
        print(f"{row['noise']:8} {row['snr_db']:>6g} {row['noise_reduction']:>10} "
              f"{row['vad_false_starts']:>10} / {NOISE_SECONDS} s {row['wer']:>6.1%}")
    for kind in kinds[1:]:
        assert kind is not None
        print(f"CPU, {kind}: {cpu_ms_per_minute(kind):.0f} ms per session-minute (20 ms chunks, this machine)")


if __name__ == "__main__":
    main()
