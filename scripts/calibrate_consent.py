"""Calibrate the consent check's speaker similarity ([voices] similarity_threshold) on voices made here.

Speakers: espeak-ng's English voice with its variants (m1..m7, f1..f5, klatt, ...: different pitch and formants,
the nearest it has to different people) and piper's en_US "joe" (the local extra's voice). Each speaks several
sentences at several rates. Pairs of one speaker (other sentence, other rate) are "same"; pairs of two are
"different". Each recording's speaker embedding comes from a Qwen3-TTS Base checkpoint's speaker encoder, as
the gateway computes it (engine.clone.prepare, x-vector only); the cosine similarities of both sets of pairs
give the threshold at equal error rate and the margins on either side.

    python -m scripts.calibrate_consent --checkpoint tests/data/qwen3_tts_tiny_base [--json out.json]

Needs espeak-ng (apt-get install espeak-ng) and the local extra (piper). On the random-weight tiny checkpoint
the figures pin the CI threshold, not a real speaker encoder's: run it with the real Base checkpoint to set a
deployment's threshold.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import platform
import shutil
import subprocess
import time
from pathlib import Path

import av
import numpy as np
import torch

from engine import checkpoint, clone
from gateway.runtime.consent import similarity

SENTENCES = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the gate.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A rainbow is a division of white light into many beautiful colors after the rain.",
    "We will meet again next Tuesday at half past nine, right outside the old library.",
    "Numbers like forty two and seventeen are easy to say, but hard to remember later.",
]
# A variant (m1..m7, f1..f5, klatt, Andy: pitch, formants, voicing) is a speaker; the accents spread them over
# several English voices. Each variant once: the same variant with another accent is the same synthetic
# speaker. (espeak-ng ignores a variant after some names, "en-gb+m2" is "en-gb": the recordings are checked
# to differ.)
ESPEAK_VOICES = ["en-us", "en-us+m3", "en-us+m5", "en-us+m7", "en-us+f1", "en-us+f2", "en-us+f4", "en+m2",
                 "en+f3", "en-us+klatt", "en-gb-x-rp+m6", "en-us+Andy", "en-gb-scotland+f5", "en-029+m4"]
ESPEAK_RATES = [140, 175]
PIPER_SCALES = [0.85, 1.15]  # piper's length_scale: faster and slower speech


def espeak(voice: str, rate: int, text: str) -> np.ndarray:
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", text], capture_output=True,
                         check=True).stdout
    with av.open(io.BytesIO(wav)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=24000)
        frames = [f.to_ndarray()[0] for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        frames += [f.to_ndarray()[0] for f in resampler.resample(None)]
    return np.concatenate(frames)


def recordings() -> dict[str, list[np.ndarray]]:
    """Per speaker, its recordings (24 kHz float32)."""
    from gateway.responders.piper_tts import PiperEngine  # the local extra, only when calibrating

    speakers: dict[str, list[np.ndarray]] = {}
    for voice in ESPEAK_VOICES:
        speakers[f"espeak {voice}"] = [espeak(voice, rate, text) for rate in ESPEAK_RATES for text in SENTENCES]
    piper = PiperEngine.shared()
    from piper.config import SynthesisConfig  # noqa: PLC0415 - the local extra

    joe = []
    for scale in PIPER_SCALES:
        piper.synthesis = SynthesisConfig(normalize_audio=False, length_scale=scale)
        joe += [np.frombuffer(piper.synthesize(text), "<i2").astype(np.float32) / 32768 for text in SENTENCES]
    speakers["piper joe"] = joe
    firsts = [audios[0].tobytes() for audios in speakers.values()]
    if len(set(firsts)) != len(firsts):
        raise SystemExit("two of the voices speak alike, byte for byte: they are not different speakers")
    return speakers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a Qwen3-TTS Base checkpoint (HF layout)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        parser.error("espeak-ng is not installed (apt-get install espeak-ng)")
    torch.set_num_threads(1)
    ckpt = checkpoint.load(args.checkpoint, device=args.device, dtype="float32")
    started = time.perf_counter()
    speakers = recordings()
    embeddings = {name: [clone.prepare(ckpt, audio, 24000).speaker for audio in audios]
                  for name, audios in speakers.items()}
    same = [similarity(a, b) for emb in embeddings.values() for a, b in itertools.combinations(emb, 2)]
    different = [similarity(a, b) for (_, ea), (_, eb) in itertools.combinations(embeddings.items(), 2)
                 for a in ea for b in eb]
    # The threshold at equal error rate: the smallest t where refused same-speaker pairs >= accepted others.
    candidates = sorted(set(same) | set(different))
    frr = [sum(s < t for s in same) / len(same) for t in candidates]
    far = [sum(d >= t for d in different) / len(different) for t in candidates]
    i = min(range(len(candidates)), key=lambda k: max(frr[k], far[k]))
    by_speaker = {name: round(min(similarity(a, b) for a, b in itertools.combinations(emb, 2)), 4)
                  for name, emb in embeddings.items()}
    figures = {
        "checkpoint": args.checkpoint, "kind": ckpt.config.kind, "size": ckpt.config.size,
        "speakers": len(speakers), "recordings": sum(map(len, speakers.values())),
        "same_pairs": len(same), "different_pairs": len(different),
        "same": {"min": round(min(same), 4), "p05": round(float(np.percentile(same, 5)), 4),
                 "mean": round(float(np.mean(same)), 4)},
        "different": {"max": round(max(different), 4), "p95": round(float(np.percentile(different, 95)), 4),
                      "mean": round(float(np.mean(different)), 4)},
        "eer_threshold": round(candidates[i], 4), "eer": round(max(frr[i], far[i]), 4),
        "separated": min(same) > max(different),
        "midpoint": round((min(same) + max(different)) / 2, 4) if min(same) > max(different) else None,
        "min_same_by_speaker": by_speaker,
        # The tests' pair (tests/transports/test_voices.py): joe's consent against joe's or espeak-ng's sample.
        "piper_joe": {"same_min": by_speaker["piper joe"],
                      "vs_espeak_max": round(max(similarity(a, b) for a in embeddings["piper joe"]
                                                 for name, emb in embeddings.items() if name != "piper joe"
                                                 for b in emb), 4)},
        "seconds": round(time.perf_counter() - started, 1), "machine": platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
