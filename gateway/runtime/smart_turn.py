"""Semantic end-of-turn detection (``semantic_vad``) with the Smart Turn v3.2 model.

- ``log_mel`` and ``SmartTurnModel``: Whisper-style log-mel features in numpy and the int8 ONNX model
  (Whisper Tiny's encoder and a classifier, ~8 M parameters), loaded once per process. Given the last
  8 s of a turn, it returns P(the speaker has finished).
- ``SmartTurnBatcher``: the sessions' requests in shared batched model calls, in a worker thread (a turn
  costs ~100 ms of CPU on a 2-core VM: never on the event loop).
- ``EngineSmartTurn``: the same model on the engine processes' GPUs ([semantic_vad] device), batched there
  with every worker's turns (engine.turn_model): here only the resampling, a millisecond a turn.

The sans-I/O detector that asks for the model at each pause is the core's (gateway/core/semantic_vad.py).

The model file is the package's own data (gateway/models/smart-turn-v3.2-cpu.onnx, the file the pipecat-ai
1.14.0 wheel ships; BSD 2-Clause License, Copyright (c) 2024-2026, Daily: the notice is in
LICENSES/smart-turn.txt, in the wheel too), checked by its SHA-256 when loaded.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime
import soxr

from gateway.audio import SAMPLE_RATE, Float32Array, bytes_to_int16, int16_to_float32
from gateway.config import SemanticVadConfig
from gateway.core.semantic_vad import SECONDS
from gateway.runtime.batcher import MicroBatcher
from gateway.shipped import SMART_TURN_MODEL

MODEL_FILE = SMART_TURN_MODEL
MODEL_SHA256 = SemanticVadConfig.model_sha256
"""SHA-256 of smart-turn-v3.2-cpu.onnx (the [semantic_vad] model_sha256 default; the file in pipecat-ai==1.14.0)."""

RATE = 16_000
N_SAMPLES = RATE * SECONDS
N_FFT = 400
HOP = 160
N_MELS = 80
N_FRAMES = N_SAMPLES // HOP  # 800


class SmartTurnModelError(RuntimeError):
    """The Smart Turn model file is missing or is not the one this code was validated with."""


# --- features --------------------------------------------------------------------------------------


def _mel_filters() -> Float32Array:
    """Slaney-scale, Slaney-normalised triangular filters from 0 to 8 kHz, [N_MELS, N_FFT // 2 + 1]:
    the bank Whisper (and so Smart Turn) was trained with."""

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        # linear below 1 kHz, logarithmic above
        return np.where(f < 1000, 3 * f / 200, 15 + np.log(np.maximum(f, 1e-9) / 1000) * 27 / np.log(6.4))

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m < 15, 200 * m / 3, 1000 * np.exp((m - 15) * np.log(6.4) / 27))

    edges = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(RATE / 2)), N_MELS + 2))
    bins = np.linspace(0, RATE / 2, N_FFT // 2 + 1)
    rising = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = np.maximum(0, np.minimum(rising, falling))
    return (weights * (2 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


MEL_FILTERS = _mel_filters()
WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)  # periodic Hann


def last_seconds(audio: Float32Array) -> Float32Array:
    """The last 8 s of 16 kHz audio, zeros in front when shorter: the speech always ends the input."""
    audio = np.asarray(audio, dtype=np.float32)[-N_SAMPLES:]
    return np.pad(audio, (N_SAMPLES - len(audio), 0))


def log_mel(audio: Float32Array) -> Float32Array:
    """Whisper log-mel features of exactly 8 s of 16 kHz audio, [80, 800] float32.

    What Smart Turn was trained on: ``WhisperFeatureExtractor(chunk_length=8)(audio, do_normalize=True)``
    on the already padded audio (checked against transformers in tests/runtime/test_smart_turn.py): the
    waveform normalised to zero mean and unit variance, a centred 400-point STFT every 160 samples,
    power through the mel bank, log10, floored 8 below the maximum, scaled by (x + 4) / 4.
    """
    x = np.asarray(audio, dtype=np.float32)
    if x.shape != (N_SAMPLES,):
        raise ValueError(f"log_mel takes {N_SAMPLES} samples (8 s at 16 kHz), got shape {x.shape}")
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:N_FRAMES]  # the last frame is dropped
    spectrum = np.fft.rfft(frames * WINDOW, axis=-1)
    power = spectrum.real**2 + spectrum.imag**2
    mel = np.log10(np.maximum(MEL_FILTERS @ power.T, 1e-10))
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def resampled_tail(pcm24k: bytes) -> Float32Array:
    """A turn's pcm16 24 kHz audio as the model hears it: its last 8 s (or less), float32 at 16 kHz."""
    tail = pcm24k[-(SECONDS * SAMPLE_RATE * 2 + 2) :]  # a little over 8 s, whole samples
    tail = tail[len(tail) & 1 :]
    audio = soxr.resample(int16_to_float32(bytes_to_int16(tail)), SAMPLE_RATE, RATE, quality="HQ")
    return np.asarray(audio[-N_SAMPLES:], dtype=np.float32)


def features(pcm24k: bytes) -> Float32Array:
    """The model's input for a turn's pcm16 24 kHz audio (its last 8 s): [80, 800]."""
    return log_mel(last_seconds(resampled_tail(pcm24k)))


# --- the model -------------------------------------------------------------------------------------


def read_model(path: Path, sha256: str | None = MODEL_SHA256) -> bytes:
    """The model file's bytes, checked against `sha256` (None or "": not checked); SmartTurnModelError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SmartTurnModelError(f"cannot read the Smart Turn model {path} ([semantic_vad] model_path): "
                                  f"{exc.strerror or exc}") from None
    if sha256:
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256.lower():
            raise SmartTurnModelError(
                f"Smart Turn model {path} has SHA-256 {actual}, expected {sha256.lower()}: a damaged "
                "or different file; reinstall the gateway, or set [semantic_vad] model_path for a model of "
                "your own"
            )
    return data


class SmartTurnModel:
    """The Smart Turn v3.2 ONNX model: one InferenceSession for the whole process.

    One intra-op thread, as for Silero: the gateway's parallelism comes from its sessions, and a batch
    of several turns keeps one core busy (python -m bench turns measures the cost per turn).
    """

    _shared: SmartTurnModel | None = None
    _shared_lock = threading.Lock()

    def __init__(self, path: str | Path | None = None, sha256: str | None = MODEL_SHA256) -> None:
        self.path = Path(path) if path else MODEL_FILE
        data = read_model(self.path, sha256)
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for a file it cannot parse
            raise SmartTurnModelError(f"Smart Turn model {self.path} is not a valid ONNX model: {exc}") from None

    @classmethod
    def shared(cls) -> SmartTurnModel:
        """The process-wide instance of the bundled model, loaded on first use."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def infer(self, feats: Float32Array) -> Float32Array:
        """P(turn complete) for a batch of features [B, 80, 800] → [B]."""
        (out,) = self._session.run(None, {"input_features": feats})
        return out[:, 0]

    def predict(self, turns: Sequence[bytes]) -> Float32Array:
        """P(turn complete) for each turn's pcm16 24 kHz audio, in one batched model call."""
        if not turns:
            return np.zeros(0, dtype=np.float32)
        return self.infer(np.stack([features(pcm) for pcm in turns]))


class SmartTurnBatcher:
    """Many sessions' Smart Turn requests in shared batched model calls (gateway.runtime.batcher), from one
    event loop: up to ``max_batch`` turns a call, always in ``executor``, never on the loop (per turn ~10 ms
    of features and ~80-100 ms of model on a 2-core VM, batched or not: python -m bench turns).
    """

    def __init__(self, model: SmartTurnModel, executor: Executor, max_batch: int = 1) -> None:
        self.model = model
        self._batcher: MicroBatcher[bytes, float] = MicroBatcher(
            lambda turns: [float(p) for p in model.predict(turns)], executor, max_batch=max(1, max_batch))

    async def predict(self, pcm24k: bytes) -> float:
        """P(turn complete) for this turn's audio, batched with whatever other sessions are asking for."""
        return await self._batcher.submit(pcm24k)


class TurnEngine(Protocol):
    """What EngineSmartTurn needs of the engine processes (gateway.responders.engine_client.EngineClient)."""

    async def turn(self, audio: Float32Array) -> float: ...


class EngineSmartTurn:
    """Smart Turn in the engine processes, on their devices (engine.turn_model: the same ONNX file's weights,
    the features computed there too): each turn's audio is resampled in `executor` and sent; the engine runs
    the turns that reach it together as one batch. On a GPU a batch costs a few milliseconds, against
    ~100 ms of a CPU core per turn here."""

    def __init__(self, engine: TurnEngine, executor: Executor) -> None:
        self._engine = engine
        self._executor = executor

    async def predict(self, pcm24k: bytes) -> float:
        audio = await asyncio.get_running_loop().run_in_executor(self._executor, resampled_tail, pcm24k)
        return await self._engine.turn(audio)


SmartTurn = SmartTurnBatcher | EngineSmartTurn
"""Where a session's Smart Turn checks go: ``await predict(pcm24k)`` gives P(turn complete)."""
