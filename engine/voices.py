"""Voices made once and kept without their audio: `VoicePrompt`.

A clone (for a Base checkpoint, made by engine.clone.prepare from a reference recording) holds the
reference's x-vector from the checkpoint's speaker encoder and, when the reference's transcript is known
(in-context cloning, "ICL"), the reference's codes from the speech tokenizer's encoder and the transcript;
without a transcript only the x-vector conditions the voice ("x-vector only"). A design (for a VoiceDesign
checkpoint) holds the text that describes the voice. Either is a few kilobytes (an ICL clone of 30 s:
16 x 375 codes), serialised with safetensors (`to_bytes` / `from_bytes`, no pickle), and a clone says what it
was prepared for: it fits the checkpoints whose config fingerprint it names. engine.prompt puts a voice in a
stream's prompt. This module imports no torch: the gateway's processes hold voices and send them to engine
processes as bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

FORMAT = "qwen3-tts-voice/1"
CLONE, DESIGN = "clone", "design"


class VoiceError(ValueError):
    """Reference audio, a transcript or serialised bytes that cannot make a voice; the message says why."""


def fingerprint(config: dict[str, Any], speech_tokenizer: dict[str, Any]) -> str:
    """What a clone must match: the checkpoint's config.json and speech_tokenizer/config.json, hashed."""
    canonical = json.dumps([config, speech_tokenizer], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class VoicePrompt:
    """A voice to speak in: a clone (`speaker`, and `codes` with `text` for ICL) or a design (`text`)."""

    kind: str  # CLONE or DESIGN
    text: str | None = None  # a clone's reference transcript (ICL); a design's description
    speaker: np.ndarray | None = None  # a clone's x-vector, float32 [talker hidden]
    codes: np.ndarray | None = None  # an ICL clone's reference codes, int64 [frames, 16]
    # What a clone was prepared for: {"size": tts_model_size, "hidden": its width, "fingerprint": ...}.
    model: dict[str, str] = field(default_factory=dict)

    @classmethod
    def design(cls, description: str) -> VoicePrompt:
        if not description.strip():
            raise VoiceError("a designed voice needs a description")
        return cls(kind=DESIGN, text=description)

    @property
    def mode(self) -> str:
        """"icl", "x_vector" (clones) or "design"."""
        if self.kind == DESIGN:
            return "design"
        return "icl" if self.codes is not None else "x_vector"

    @property
    def frames(self) -> int:
        """Reference frames an ICL clone puts in the prompt (0 for the others)."""
        return 0 if self.codes is None else int(self.codes.shape[0])

    def to_bytes(self) -> bytes:
        arrays = {name: np.ascontiguousarray(a) for name, a in (("speaker", self.speaker), ("codes", self.codes))
                  if a is not None}
        metadata = {"format": FORMAT, "kind": self.kind, **{f"model.{k}": v for k, v in self.model.items()}}
        if self.text is not None:
            metadata["text"] = self.text
        return save_arrays(arrays, metadata=metadata)

    @classmethod
    def from_bytes(cls, data: bytes) -> VoicePrompt:
        """A VoicePrompt from `to_bytes`; VoiceError for anything else."""
        try:
            arrays = load_arrays(bytes(data))
            header = json.loads(bytes(data[8:8 + int.from_bytes(data[:8], "little")]))
        except Exception as exc:  # safetensors raises its own types for a malformed buffer
            raise VoiceError(f"not a serialised voice ({type(exc).__name__})") from None
        metadata = header.get("__metadata__") or {}
        if metadata.get("format") != FORMAT:
            raise VoiceError(f"not a serialised voice of format {FORMAT}")
        voice = cls(kind=metadata.get("kind", ""), text=metadata.get("text"), speaker=arrays.get("speaker"),
                    codes=arrays.get("codes"),
                    model={k[6:]: v for k, v in metadata.items() if k.startswith("model.")})
        voice.check()
        return voice

    def check(self) -> None:
        """VoiceError unless the fields make one of the three modes."""
        if self.kind == DESIGN:
            if not (self.text or "").strip() or self.speaker is not None or self.codes is not None:
                raise VoiceError("a designed voice holds a description only")
            return
        if self.kind != CLONE:
            raise VoiceError(f"unknown voice kind {self.kind!r}")
        if self.speaker is None or self.speaker.ndim != 1 or self.speaker.dtype != np.float32:
            raise VoiceError("a cloned voice needs its speaker embedding (float32, one dimension)")
        if not np.isfinite(self.speaker).all():
            raise VoiceError("a cloned voice's speaker embedding must be finite")
        if self.codes is not None:
            if (self.codes.ndim != 2 or self.codes.shape[1] != 16 or self.codes.dtype != np.int64
                    or self.codes.shape[0] == 0 or not (self.text or "").strip()):
                raise VoiceError("an in-context cloned voice needs its codes [frames, 16] (int64) and transcript")
            if int(self.codes.min()) < 0:
                raise VoiceError("negative codes")

    @property
    def key(self) -> str:
        """A content hash: the same voice gives the same key, wherever it was serialised."""
        cached = self.__dict__.get("_key")
        if cached is None:
            digest = hashlib.sha256(json.dumps([self.kind, self.text, self.model], sort_keys=True).encode())
            for array in (self.speaker, self.codes):
                digest.update(b"-" if array is None else np.ascontiguousarray(array).tobytes())
            cached = digest.hexdigest()
            object.__setattr__(self, "_key", cached)
        return cached
