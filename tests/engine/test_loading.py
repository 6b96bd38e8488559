"""Checkpoint loading: each way a checkpoint can fail to match the code is an error that names the cause."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import checkpoint
from engine.checkpoint import CheckpointError
from tests.paths import DATA, TINY_CHECKPOINT

FIXTURE = TINY_CHECKPOINT
BASE = DATA / "qwen3_tts_tiny_base"
TENSOR = "talker.model.layers.1.self_attn.k_norm.weight"
CODEC_TENSOR = "decoder.pre_conv.conv.weight"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, target)
    return target


def _edit(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_loads_by_path(copy: Path) -> None:
    ckpt = checkpoint.load(str(copy), device="cpu")
    assert ckpt.folder == copy
    assert "vivian" in ckpt.config.speakers


def test_missing_tensor(copy: Path) -> None:
    _edit(copy / "model.safetensors", lambda t: t.pop(TENSOR))
    with pytest.raises(CheckpointError, match=f"missing tensors: {TENSOR}"):
        checkpoint.load(str(copy), device="cpu")


def test_unexpected_tensor(copy: Path) -> None:
    _edit(copy / "model.safetensors", lambda t: t.update({"talker.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected tensors: talker.extra.weight"):
        checkpoint.load(str(copy), device="cpu")


def test_misshapen_tensor(copy: Path) -> None:
    _edit(copy / "model.safetensors", lambda t: t.update({TENSOR: torch.ones(7)}))
    with pytest.raises(CheckpointError, match=rf"misshapen tensors: {TENSOR} \[7\] \(expected \[16\]\)"):
        checkpoint.load(str(copy), device="cpu")


def test_misshapen_codec_tensor(copy: Path) -> None:
    _edit(copy / "speech_tokenizer" / "model.safetensors",
          lambda t: t.update({CODEC_TENSOR: t[CODEC_TENSOR][:, :, :2].contiguous()}))
    with pytest.raises(CheckpointError, match=f"speech_tokenizer.*misshapen tensors: {CODEC_TENSOR}"):
        checkpoint.load(str(copy), device="cpu")


def test_missing_codec_tensor(copy: Path) -> None:
    _edit(copy / "speech_tokenizer" / "model.safetensors", lambda t: t.pop(CODEC_TENSOR))
    with pytest.raises(CheckpointError, match=f"missing tensors: {CODEC_TENSOR}"):
        checkpoint.load(str(copy), device="cpu")


def test_config_that_does_not_match_the_weights(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    config["talker_config"]["num_hidden_layers"] = 3
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing tensors: talker.model.layers.2"):
        checkpoint.load(str(copy), device="cpu")


def test_an_unknown_kind_is_refused(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    config["tts_model_type"] = "voice_conversion"
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'voice_conversion'; the engine runs custom_voice, voice_design, base"):
        checkpoint.load(str(copy), device="cpu")


def test_a_base_checkpoint_needs_its_speaker_encoder(copy: Path) -> None:
    """A CustomVoice talker relabelled Base: no speaker_encoder_config, then no speaker encoder weights."""
    config = json.loads((copy / "config.json").read_text())
    config["tts_model_type"] = "base"
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="base checkpoint without speaker_encoder_config"):
        checkpoint.load(str(copy), device="cpu")
    base = json.loads((BASE / "config.json").read_text())
    config["speaker_encoder_config"] = base["speaker_encoder_config"]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing tensors: speaker_encoder.asp.conv.bias"):
        checkpoint.load(str(copy), device="cpu")


@pytest.fixture
def base_copy(tmp_path: Path) -> Path:
    target = tmp_path / "base"
    shutil.copytree(BASE, target)
    return target


def test_a_base_checkpoint_loads_both_encoders_in_float32(base_copy: Path) -> None:
    ckpt = checkpoint.load(str(base_copy), device="cpu", dtype="bfloat16")
    assert ckpt.config.kind == "base" and ckpt.speaker_encoder is not None and ckpt.encoder is not None
    assert next(ckpt.model.parameters()).dtype == torch.bfloat16
    for module in (ckpt.speaker_encoder, ckpt.encoder):
        assert all(p.dtype == torch.float32 for p in module.state_dict().values() if p.is_floating_point())


def test_a_base_checkpoint_missing_an_encoder_tensor(base_copy: Path) -> None:
    name = "encoder.encoder_transformer.layers.1.mlp.fc1.weight"
    _edit(base_copy / "speech_tokenizer" / "model.safetensors", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=f"speech_tokenizer.*missing tensors: {name}"):
        checkpoint.load(str(base_copy), device="cpu")


def test_a_speaker_encoder_narrower_than_the_talker(base_copy: Path) -> None:
    config = json.loads((base_copy / "config.json").read_text())
    config["speaker_encoder_config"]["enc_dim"] = 32
    (base_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="enc_dim 32 is not the talker's hidden size 64"):
        checkpoint.load(str(base_copy), device="cpu")


def test_missing_folder_names_the_download_command(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="huggingface-cli download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"):
        checkpoint.load(str(tmp_path / "nowhere"), device="cpu")


def test_hub_id_not_in_cache_names_the_download_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match=r"huggingface-cli download Someone/Missing-TTS.*hf download"):
        checkpoint.load("Someone/Missing-TTS", device="cpu")


def test_hub_id_resolves_from_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache layout huggingface_hub reads offline: refs/main names a snapshot folder.
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(FIXTURE, repo / "snapshots" / ("0" * 40))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert checkpoint.resolve("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice") == repo / "snapshots" / ("0" * 40)


def test_missing_weights_file(copy: Path) -> None:
    (copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        checkpoint.load(str(copy), device="cpu")


def test_sharded_weights(copy: Path) -> None:
    tensors = load_file(str(copy / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(copy / file))
    (copy / "model.safetensors").unlink()
    weight_map = {n: file for file, part in halves.items() for n in part}
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ckpt = checkpoint.load(str(copy), device="cpu")
    assert torch.equal(ckpt.model.talker.codec_head.weight, tensors["talker.codec_head.weight"])


def test_speaker_encoder_weights_are_skipped(copy: Path) -> None:
    """A Base-style speaker encoder next to a CustomVoice talker is unused, not a mismatch."""
    _edit(copy / "model.safetensors", lambda t: t.update({"speaker_encoder.fc.weight": torch.zeros(2, 2)}))
    assert checkpoint.load(str(copy), device="cpu").model is not None


def test_predictor_head_dim_defaults_as_official(copy: Path) -> None:
    """Without head_dim the official predictor config uses 128 (the tiny fixture has 8: a misfit)."""
    config = json.loads((copy / "config.json").read_text())
    del config["talker_config"]["code_predictor_config"]["head_dim"]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"q_proj.weight \[32, 32\] \(expected \[512, 32\]\)"):
        checkpoint.load(str(copy), device="cpu")
