"""Regenerate the speech fixtures in tests/fixtures/ (the WAVs are committed; tests never run this).

Needs espeak-ng (``apt-get install espeak-ng``; made with eSpeak NG 1.51 from Debian 12, voice en-us,
170 words per minute) and the project's virtualenv (numpy, soxr). Usage::

    python -m scripts.make_fixtures [--out tests/fixtures]

Every file is pcm16 mono 24 kHz. espeak-ng's 22.05 kHz output is resampled with soxr (HQ), trimmed
to its audible part, and scaled to -20 dBFS RMS; noise comes from a seeded generator, so the output
is identical from run to run with the same espeak-ng. ``fixtures.json`` records, for each file, the
true speech segments in milliseconds (where the trimmed speech was placed), for the tests to check
VAD events against.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
import soxr

RATE = 24_000
SPEECH_RMS_DBFS = -20.0
NOISE_RMS_DBFS = -50.0  # "low noise": 30 dB below the speech, like a quiet room through a cheap mic

SENTENCE_1 = "The quick brown fox jumps over the lazy dog."
SENTENCE_2 = "Could you tell me what the weather will be like tomorrow?"
SENTENCE_3 = "Yes, and please book a table for two at seven."
# Questions for the local models (tests/responders/test_local.py): words that whisper tiny.en hears back from espeak-ng.
QUESTIONS = {
    "question_spider.wav": "How many legs does a spider have?",
    "question_sky.wav": "Why is the sky blue?",
    "question_tea.wav": "How do I make a good cup of tea?",
}
# A hesitation inside a sentence (semantic_vad's tests): one utterance, so the words before the pause keep
# the sentence's running intonation.
PAUSED_SENTENCE = 'I want to fly from Boston to <break time="700ms"/> Denver on Friday.'


def speak(text: str, ssml: bool = False, rate_wpm: int = 170, voice: str = "en-us") -> np.ndarray:
    """espeak-ng → float64 mono at 24 kHz, trimmed to the audible part, at SPEECH_RMS_DBFS.

    ``ssml``: ``text`` is SSML (e.g. ``<break time="800ms"/>`` for a pause inside a sentence); ``voice``:
    espeak-ng's voice, with a variant after "+" ("en-gb-scotland+f3")."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        args = ["-m", f"<speak>{text}</speak>"] if ssml else [text]
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate_wpm), "-w", str(path), *args], check=True)
        with wave.open(str(path), "rb") as w:
            assert w.getnchannels() == 1 and w.getsampwidth() == 2
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    return level(soxr.resample(x, rate, RATE, quality="HQ"))


def level(x: np.ndarray) -> np.ndarray:
    """Speech ``x`` trimmed to its audible part, at SPEECH_RMS_DBFS."""
    loud = np.nonzero(np.abs(x) > 0.01 * np.abs(x).max())[0]
    x = x[loud[0] : loud[-1] + 1]
    return x * (10 ** (SPEECH_RMS_DBFS / 20) / np.sqrt(np.mean(x**2)))


def noise(n: int, seed: int) -> np.ndarray:
    """Pink-ish noise (white through a one-pole low-pass) at NOISE_RMS_DBFS."""
    white = np.random.default_rng(seed).standard_normal(n)
    pink = np.empty(n)
    acc = 0.0
    for i, v in enumerate(white):  # a few seconds only; clarity beats speed here
        acc = 0.95 * acc + v
        pink[i] = acc
    return pink * (10 ** (NOISE_RMS_DBFS / 20) / np.sqrt(np.mean(pink**2)))


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000)


def gaps(x: np.ndarray, min_ms: int) -> list[list[int]]:
    """Silent gaps of at least ``min_ms`` inside trimmed speech, [start, end] in ms (10 ms frames below 1%
    of the peak)."""
    hop = RATE // 100
    loud = np.array([np.abs(x[i : i + hop]).max() for i in range(0, len(x), hop)]) > 0.01 * np.abs(x).max()
    out, start = [], None
    for i, is_loud in enumerate(loud):
        if not is_loud and start is None:
            start = i
        elif is_loud and start is not None:
            if (i - start) * 10 >= min_ms:
                out.append([start * 10, i * 10])
            start = None
    return out


def split_at_gaps(x: np.ndarray, segment: list[int], min_ms: int) -> list[list[int]]:
    """A sentence's [start, end] in ms as the speech segments between its gaps of at least ``min_ms``."""
    edges = [segment[0], *(segment[0] + t for gap in gaps(x, min_ms) for t in gap), segment[1]]
    return [edges[i : i + 2] for i in range(0, len(edges), 2)]


def assemble(parts: list[np.ndarray | str]) -> tuple[np.ndarray, list[list[int]]]:
    """Concatenate silences and sentences; return the signal and each sentence's [start, end] in ms."""
    chunks: list[np.ndarray] = []
    segments: list[list[int]] = []
    pos = 0
    for part in parts:
        x = speak(part) if isinstance(part, str) else part
        if isinstance(part, str):
            segments.append([round(pos * 1000 / RATE), round((pos + len(x)) * 1000 / RATE)])
        chunks.append(x)
        pos += len(x)
    return np.concatenate(chunks), segments


def write_wav(path: Path, x: np.ndarray) -> None:
    pcm = np.clip(np.rint(x * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_out = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
    parser.add_argument("--out", type=Path, default=default_out)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    one, one_segs = assemble([silence(500), SENTENCE_1, silence(800)])
    two, two_segs = assemble([silence(500), SENTENCE_2, silence(1500), SENTENCE_3, silence(800)])
    noisy_speech, noisy_segs = assemble([silence(600), SENTENCE_3, silence(800)])
    noisy_speech = noisy_speech + noise(len(noisy_speech), seed=1)
    sentence = speak(PAUSED_SENTENCE, ssml=True)
    paused = np.concatenate([silence(500), sentence, silence(800)])
    paused_segs = split_at_gaps(sentence, [500, 500 + round(len(sentence) * 1000 / RATE)], 400)
    files = {
        "one_sentence.wav": (one, one_segs, f"{SENTENCE_1!r}, 0.5 s silence before, 0.8 s after"),
        "two_turns.wav": (two, two_segs, f"{SENTENCE_2!r}, 1.5 s silence, {SENTENCE_3!r}"),
        "speech_noise.wav": (
            noisy_speech,
            noisy_segs,
            f"{SENTENCE_3!r} over pink noise at {NOISE_RMS_DBFS:g} dBFS (speech {SPEECH_RMS_DBFS:g} dBFS)",
        ),
        "paused_turn.wav": (paused, paused_segs, f"{PAUSED_SENTENCE!r} (espeak-ng SSML), 0.5 s silence before, 0.8 s "
                            "after"),
        "silence.wav": (silence(1000), [], "1 s of digital silence"),
        "noise.wav": (noise(RATE * 2, seed=2), [], f"2 s of pink noise at {NOISE_RMS_DBFS:g} dBFS"),
    }
    for name, question in QUESTIONS.items():
        x, segments = assemble([silence(500), question, silence(800)])
        files[name] = (x, segments, f"{question!r}, 0.5 s silence before, 0.8 s after")
    manifest = {}
    for name, (x, segments, description) in files.items():
        write_wav(out / name, x)
        manifest[name] = {
            "description": description,
            "duration_ms": round(len(x) * 1000 / RATE),
            "speech_ms": segments,
        }
        print(f"{name}: {len(x) / RATE:.2f} s, speech {segments}")
    (out / "fixtures.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
