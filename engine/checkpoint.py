"""Loading a Qwen3-TTS 12Hz checkpoint in the Hugging Face layout, by local path or by Hub id found in the
local Hugging Face cache (never downloaded at run time).

Tensors load strictly: every parameter of engine.talker.Qwen3TTS and engine.codec.CodecDecoder must be in
the checkpoint with its exact name and shape, and every checkpoint tensor must be used. A Base checkpoint
(config.json tts_model_type "base") also loads what cloning a voice from reference audio needs, in float32
whatever the engine's dtype (it runs once per voice): its `speaker_encoder.*` (engine.speaker) and the speech
tokenizer's `encoder.*` (engine.encoder). Other kinds never clone, and skip both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.codec import CodecDecoder
from engine.encoder import SpeechEncoder
from engine.speaker import SpeakerEncoder, SpeakerEncoderConfig
from engine.talker import ModelConfig, Qwen3TTS, UnsupportedConfig
from engine.voices import fingerprint

DEFAULT_REPO = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"


class CheckpointError(RuntimeError):
    """The checkpoint is absent, incomplete or does not match the code; the message says what to do."""


def download_hint(repo_id: str) -> str:
    return (f"download it with `huggingface-cli download {repo_id}` (or `hf download {repo_id}`), "
            f"or set [engine] checkpoint to a local folder holding config.json, model.safetensors and "
            f"speech_tokenizer/")


def resolve(checkpoint: str) -> Path:
    """A local folder, or a Hub id resolved offline from the local Hugging Face cache."""
    if not checkpoint:
        raise CheckpointError(f"no checkpoint configured; {download_hint(DEFAULT_REPO)}")
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        folder = path
    elif checkpoint.count("/") == 1 and not checkpoint.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download
            folder = Path(snapshot_download(checkpoint, local_files_only=True))
        except Exception as exc:  # LocalEntryNotFoundError, or a malformed id
            raise CheckpointError(f"checkpoint {checkpoint!r} is not in the local Hugging Face cache "
                                  f"({type(exc).__name__}); {download_hint(checkpoint)}") from None
    else:
        raise CheckpointError(f"checkpoint folder {checkpoint!r} does not exist; {download_hint(DEFAULT_REPO)}")
    for needed in ("config.json", "speech_tokenizer/config.json"):
        if not (folder / needed).is_file():
            raise CheckpointError(f"checkpoint {folder} lacks {needed}; {download_hint(DEFAULT_REPO)}")
    return folder


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / name for name in sorted(set(_read_json(index)["weight_map"].values()))]
    single = folder / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"checkpoint {folder} has no model.safetensors; {download_hint(DEFAULT_REPO)}")
    return [single]


def load_strict(module: torch.nn.Module, files: list[Path], where: str, *, device: torch.device,
                dtype: torch.dtype, prefix: str = "", skip: Callable[[str], bool] = lambda name: False) -> None:
    """Fill `module` (built on the meta device) from the tensors of safetensors files named `prefix` + one
    of its parameter names; any missing, unexpected or misshapen tensor is an error naming it. Tensors
    outside `prefix` are other modules', and `skip(name)` names tensors the module does not use. Floating
    tensors are cast to `dtype`."""
    expected = {prefix + name: tuple(t.shape) for name, t in module.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    unexpected, misshapen = [], []
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if not name.startswith(prefix) or skip(name[len(prefix):]):
                    continue
                if name not in expected:
                    unexpected.append(name)
                    continue
                shape = tuple(f.get_slice(name).get_shape())
                if shape != expected[name]:
                    misshapen.append(f"{name} {list(shape)} (expected {list(expected[name])})")
                    continue
                tensor = f.get_tensor(name)
                state[name[len(prefix):]] = tensor.to(device=device,
                                                      dtype=dtype if tensor.is_floating_point() else None)
    missing = sorted(set(expected) - {prefix + name for name in state} - {m.split(" ")[0] for m in misshapen})
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else ""))
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(sorted(unexpected)[:10])}"
                        + (" ..." if len(unexpected) > 10 else ""))
    if misshapen:
        problems.append(f"misshapen tensors: {', '.join(misshapen[:10])}")
    if problems:
        raise CheckpointError(f"{where} does not match the engine's model: " + "; ".join(problems))
    module.load_state_dict(state, strict=True, assign=True)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise CheckpointError(f"[engine] dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return value


@dataclass
class Checkpoint:
    folder: Path
    config: ModelConfig
    generation: dict[str, Any]
    model: Qwen3TTS
    codec: CodecDecoder
    tokenizer: Any  # a transformers fast tokenizer
    # Base checkpoints only: what turns reference audio into a cloned voice (engine.clone).
    speaker_encoder: SpeakerEncoder | None = None
    encoder: SpeechEncoder | None = None
    fingerprint: str = ""  # engine.clone.fingerprint of its configs: which clones fit it


def load(checkpoint: str, device: str = "auto", dtype: str = "auto") -> Checkpoint:
    folder = resolve(checkpoint)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    speaker_encoder = encoder = None
    try:
        raw = _read_json(folder / "config.json")
        speech = _read_json(folder / "speech_tokenizer" / "config.json")
        prints = fingerprint(raw, speech)
        predictor = (raw.get("talker_config") or {}).get("code_predictor_config")
        if isinstance(predictor, dict):
            # The official predictor config class defaults head_dim to 128 (not hidden / heads).
            predictor.setdefault("head_dim", 128)
        config = ModelConfig.from_dict(raw)
        with torch.device("meta"):
            model = Qwen3TTS(config)
            codec = CodecDecoder.from_config(speech)
            if config.speaker_encoder is not None:
                speaker_encoder = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config.speaker_encoder))
                encoder = SpeechEncoder.from_config(speech)
    except (UnsupportedConfig, KeyError, TypeError, ValueError, NotImplementedError) as exc:
        raise CheckpointError(f"checkpoint {folder}: unsupported config: {exc}") from None
    files, speech_files = _weight_files(folder), _weight_files(folder / "speech_tokenizer")
    load_strict(model, files, f"{folder}/model.safetensors", skip=lambda name: name.startswith("speaker_encoder."),
                device=dev, dtype=dt)
    load_strict(codec, speech_files, f"{folder}/speech_tokenizer/model.safetensors",
                skip=lambda name: name.startswith("encoder."), device=dev, dtype=dt)
    if speaker_encoder is not None and encoder is not None:
        if speaker_encoder.cfg.enc_dim != config.talker.hidden:
            raise CheckpointError(f"checkpoint {folder}: speaker_encoder_config enc_dim {speaker_encoder.cfg.enc_dim} "
                                  f"is not the talker's hidden size {config.talker.hidden}")
        load_strict(speaker_encoder, files, f"{folder}/model.safetensors", prefix="speaker_encoder.", device=dev,
                    dtype=torch.float32)
        load_strict(encoder, speech_files, f"{folder}/speech_tokenizer/model.safetensors", prefix="encoder.",
                    skip=encoder.unused, device=dev, dtype=torch.float32)
        speaker_encoder.eval()
        encoder.eval()
    model.eval()
    codec.eval()
    generation_file = folder / "generation_config.json"
    generation = _read_json(generation_file) if generation_file.is_file() else {}
    return Checkpoint(folder=folder, config=config, generation=generation, model=model, codec=codec,
                      tokenizer=load_tokenizer(folder), speaker_encoder=speaker_encoder, encoder=encoder,
                      fingerprint=prints)


def load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # AutoTokenizer peeks at config.json and warns that model_type qwen3_tts is unknown to it; it is not
    # needed to read a Qwen2 tokenizer.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:
        raise CheckpointError(f"checkpoint {folder}: cannot load its text tokenizer: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if not getattr(tokenizer, "is_fast", False):
        raise CheckpointError(f"checkpoint {folder}: the text tokenizer must load as a fast tokenizer")
    return tokenizer
