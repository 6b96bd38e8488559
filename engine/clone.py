"""Cloning a voice from a reference recording, as the official ``create_voice_clone_prompt`` does: the
x-vector of the Base checkpoint's speaker encoder (engine.speaker) and, with the reference's transcript,
the reference's codes from the speech tokenizer's encoder (engine.encoder), kept in an engine.voices
VoicePrompt. Both encoders read 24 kHz audio; a reference at another rate is resampled as the official code
does it (librosa's default: soxr at high quality).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import soxr
import torch

from engine.api import SAMPLE_RATE
from engine.voices import CLONE, VoiceError, VoicePrompt

MIN_REFERENCE_S = 1.0  # the official examples use 3 s and more; under a second there is little voice to hear


def prepare(ckpt: Any, audio: np.ndarray, sample_rate: int, text: str | None = None,
            max_seconds: float = 30.0) -> VoicePrompt:
    """Clone the voice of `audio` (float32 mono samples at `sample_rate`) with a Base checkpoint
    (engine.checkpoint.Checkpoint): its x-vector, and with the reference's transcript `text` also its codes
    (ICL). Runs the two encoders: call it on the engine's thread."""
    if ckpt.speaker_encoder is None or ckpt.encoder is None:
        raise VoiceError(f"the checkpoint is a {ckpt.config.kind} checkpoint; cloning a voice needs a Base one")
    samples = np.array(audio, dtype=np.float32)  # a copy: torch needs it writable
    if samples.ndim != 1 or sample_rate < 8000 or not np.isfinite(samples).all():
        raise VoiceError("reference audio must be finite mono samples at 8 kHz or more")
    seconds = len(samples) / sample_rate
    if not MIN_REFERENCE_S <= seconds <= max_seconds:
        raise VoiceError(f"reference audio of {seconds:.1f} s; use {MIN_REFERENCE_S:g} to {max_seconds:g} s")
    text = text if text and text.strip() else None  # tokenized as given, as the official code does
    if sample_rate != SAMPLE_RATE:
        samples = soxr.resample(samples, sample_rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    wav = torch.from_numpy(samples)
    speaker = ckpt.speaker_encoder(wav).cpu().numpy()
    codes = ckpt.encoder(wav).cpu().numpy() if text is not None else None
    cfg = ckpt.config
    voice = VoicePrompt(kind=CLONE, text=text, speaker=speaker, codes=codes,
                        model={"size": cfg.size, "hidden": str(cfg.talker.hidden), "fingerprint": ckpt.fingerprint})
    voice.check()
    return voice


def reference_frames(seconds: float) -> int:
    """Frames (12.5 a second) of a reference clip of `seconds`."""
    return math.ceil(seconds * SAMPLE_RATE / 1920)
