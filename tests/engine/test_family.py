"""Every kind of 12Hz checkpoint against the official qwen-tts 0.1.1, on the fixtures scripts/make_parity_fixture.py
recorded through it: Base (a voice cloned from reference audio, in-context and x-vector only), VoiceDesign (a voice
described in text), CustomVoice 1.7B with instructions. The kind comes from config.json alone; greedy float32
codes equal the official ones; the speaker embedding and the speech tokenizer's codes of a reference recording
equal the official ones; a clone's streamed audio is the official waveform.

The same tests run against fixtures made elsewhere, e.g. real-size checkpoints on a GPU (python -m
scripts.make_parity_fixture --config real-0.6b-base ...): QWEN3_TTS_FAMILY=/tmp/f06b,/tmp/f17d QWEN3_TTS_DEVICE=cuda
pytest tests/engine/test_family.py
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from engine import checkpoint
from engine.clone import prepare
from engine.prompt import PromptError, TextTokens, Voice, instruct_text
from engine.runner import synthesize
from engine.sampling import SamplingParams
from engine.voices import VoiceError, VoicePrompt
from gateway.audio import decode_wav
from tests.paths import DATA, ROOT, TINY_CHECKPOINT

COMMITTED = [DATA / "qwen3_tts_tiny_base", DATA / "qwen3_tts_tiny_design", DATA / "qwen3_tts_tiny_instruct"]
FIXTURES = [Path(p) for p in os.environ.get("QWEN3_TTS_FAMILY", "").split(",") if p] or COMMITTED
DEVICE = os.environ.get("QWEN3_TTS_DEVICE", "cpu")
REFS = {f: json.loads((f / "references.json").read_text()) for f in [*FIXTURES, *COMMITTED]}
CASES = [(f, p) for f in FIXTURES for p in REFS[f]["prompts"]]
BASES = [f for f in FIXTURES if "references" in REFS[f]]


_loaded: dict[Path, checkpoint.Checkpoint] = {}


def load(fixture: Path) -> checkpoint.Checkpoint:
    if fixture not in _loaded:
        _loaded[fixture] = checkpoint.load(str(fixture), device=DEVICE, dtype="float32")
    return _loaded[fixture]


def reference(fixture: Path, name: str) -> tuple[np.ndarray, int]:
    entry = REFS[fixture]["references"][name]
    path = fixture / entry["path"] if (fixture / entry["path"]).exists() else ROOT / entry["path"]
    samples, rate = decode_wav(path.read_bytes())
    assert rate == entry["sample_rate"]
    return samples[:, 0], rate


_clones: dict[tuple[Path, str], VoicePrompt] = {}


def cloned(fixture: Path, name: str) -> VoicePrompt:
    """`<ref>.icl` or `<ref>.x_vector`, prepared by the engine from the recording."""
    if (fixture, name) not in _clones:
        ref, mode = name.split(".")
        audio, rate = reference(fixture, ref)
        text = REFS[fixture]["references"][ref]["text"] if mode == "icl" else None
        _clones[fixture, name] = prepare(load(fixture), audio, rate, text)
    return _clones[fixture, name]


def official(fixture: Path, name: str) -> VoicePrompt:
    """`<ref>.icl` or `<ref>.x_vector` as the official code prepared it (its embedding and codes, recorded):
    the prompts' parity does not hang on the encoders' (tested on their own)."""
    ref, mode = name.split(".")
    tensors = load_file(str(fixture / "references.safetensors"))
    ckpt = load(fixture)
    return VoicePrompt(kind="clone", speaker=tensors[f"speaker_embedding.{ref}"].numpy(),
                       codes=tensors[f"ref_codes.{ref}"].numpy() if mode == "icl" else None,
                       text=REFS[fixture]["references"][ref]["text"] if mode == "icl" else None,
                       model={"size": ckpt.config.size, "hidden": str(ckpt.config.talker.hidden),
                              "fingerprint": ckpt.fingerprint})


def conditioning(fixture: Path, prompt: dict) -> dict:
    """synthesize's voice arguments for a recorded prompt."""
    if "clone" in prompt:
        return {"speaker": None, "clone": official(fixture, prompt["clone"])}
    if "speaker" in prompt:
        return {"speaker": prompt["speaker"], "instructions": prompt.get("instruct")}
    design = VoicePrompt.design(prompt["instruct"]) if prompt.get("instruct") else None
    return {"speaker": None, "clone": design}


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_the_kind_comes_from_config_json(fixture: Path, tmp_path: Path) -> None:
    """A folder named like another kind loads as what its config.json says."""
    misnamed = tmp_path / "Qwen3-TTS-12Hz-0.6B-CustomVoice"
    shutil.copytree(fixture, misnamed, copy_function=os.symlink)  # links: a real-size fixture is gigabytes
    config = json.loads((fixture / "config.json").read_text())
    ckpt = checkpoint.load(str(misnamed), device="cpu", dtype="float32")
    assert ckpt.config.kind == config["tts_model_type"]
    assert (ckpt.speaker_encoder is not None) == (ckpt.encoder is not None) == (ckpt.config.kind == "base")
    assert ckpt.config.follows_instructions == (config["tts_model_type"] == "voice_design"
                                                or (config["tts_model_type"] == "custom_voice"
                                                    and config["tts_model_size"] != "0b6"))


@pytest.mark.parametrize(("fixture", "prompt"), CASES, ids=[f"{f.name}-{p['name']}" for f, p in CASES])
def test_prompt_tokens_match_official(fixture: Path, prompt: dict) -> None:
    ckpt = load(fixture)
    tokens = TextTokens(ckpt.tokenizer)
    kw = conditioning(fixture, prompt)
    voice = Voice.resolve(ckpt.config, kw.pop("speaker"), prompt["language"], tokens=tokens, **kw)
    assert list(voice.instruct_ids) == prompt.get("instruct_ids", [])
    assert list(voice.ref_ids) == (prompt["ref_ids"][3:-2] if "ref_ids" in prompt else [])
    ids, _ = tokens.encode(prompt["text"])
    assert tokens.role_ids + ids == prompt["input_ids"][:-5]


@pytest.mark.parametrize(("fixture", "prompt"), CASES, ids=[f"{f.name}-{p['name']}" for f, p in CASES])
def test_greedy_codes_match_official(fixture: Path, prompt: dict) -> None:
    ckpt = load(fixture)
    params = SamplingParams.from_generation_config(ckpt.generation, greedy=True)
    codes, _ = synthesize(ckpt, language=prompt["language"], text=prompt["text"], params=params,
                          max_frames=REFS[fixture]["max_new_tokens"] - 1, non_streaming=prompt["non_streaming_mode"],
                          **conditioning(fixture, prompt))
    assert codes.tolist() == prompt["codes"]


@pytest.mark.parametrize("fixture", BASES, ids=[f.name for f in BASES])
@pytest.mark.parametrize("ref", ["ref_24k", "ref_16k"])
def test_speaker_embedding_and_codes_match_official(fixture: Path, ref: str) -> None:
    """From the recording as stored (16 kHz: resampled to 24 kHz first, as the official code does)."""
    refs = load_file(str(fixture / "references.safetensors"))
    voice = cloned(fixture, f"{ref}.icl")
    expected = refs[f"speaker_embedding.{ref}"].numpy()
    assert voice.speaker.shape == expected.shape and voice.speaker.dtype == np.float32
    # A float32 fixture recorded elsewhere (a GPU) reproduces to float drift only; here to a few ulps.
    assert np.linalg.norm(voice.speaker - expected) / np.linalg.norm(expected) < 1e-4
    codes = refs[f"ref_codes.{ref}"].numpy()
    assert voice.codes.shape == codes.shape
    if fixture in COMMITTED:
        assert voice.codes.tolist() == codes.tolist()
    else:
        # Recorded on another device: a distance within float drift of a tie may pick the other entry, and
        # the residual quantizers after it follow; nearly every code is still the official one.
        assert (voice.codes == codes).mean() > 0.98
    assert voice.text == REFS[fixture]["references"][ref]["text"]
    assert cloned(fixture, f"{ref}.x_vector").codes is None


@pytest.mark.parametrize("fixture", BASES, ids=[f.name for f in BASES])
def test_a_clone_streams_the_official_waveform(fixture: Path) -> None:
    """The official clone decodes the reference's codes and the new ones together and cuts the reference's
    audio off; the engine starts the stream's decoder where the reference's codes leave it."""
    prompt = next(p for p in REFS[fixture]["prompts"] if p["name"] == "icl_en_stream")
    ckpt = load(fixture)
    params = SamplingParams.from_generation_config(ckpt.generation, greedy=True)
    codes, packets = synthesize(ckpt, None, prompt["language"], prompt["text"], params,
                                max_frames=REFS[fixture]["max_new_tokens"] - 1, clone=official(fixture, "ref_24k.icl"))
    assert codes.tolist() == prompt["codes"]
    ref = load_file(str(fixture / "references.safetensors"))["greedy_wav.icl_en_stream"].numpy()
    pcm = np.frombuffer(b"".join(p.pcm for p in packets), dtype=np.int16).astype(np.float64) / 32767
    assert pcm.shape == ref.shape
    # pcm16 rounding (half a step) plus streamed-vs-whole decoding rounding, as for a named speaker.
    assert np.linalg.norm(pcm - ref) / np.linalg.norm(ref) < 1e-3


def test_a_voice_round_trips_as_bytes() -> None:
    fixture = BASES[0] if BASES else COMMITTED[0]
    voices = [cloned(fixture, "ref_24k.icl"), cloned(fixture, "ref_24k.x_vector"), VoicePrompt.design("A calm voice")]
    for voice in voices:
        again = VoicePrompt.from_bytes(voice.to_bytes())
        assert (again.kind, again.mode, again.text, again.model) == (voice.kind, voice.mode, voice.text, voice.model)
        for name in ("speaker", "codes"):
            a, b = getattr(voice, name), getattr(again, name)
            assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype)
        assert again.key == voice.key
    assert len(cloned(fixture, "ref_24k.icl").to_bytes()) < 16 * 1024  # a 4 s reference: a few kilobytes
    with pytest.raises(VoiceError):
        VoicePrompt.from_bytes(b"\x00" * 40)
    with pytest.raises(VoiceError):
        VoicePrompt.design("  ")


def test_reference_audio_is_checked() -> None:
    ckpt = load(COMMITTED[0])
    with pytest.raises(VoiceError, match="0.5 s"):
        prepare(ckpt, np.zeros(12000, dtype=np.float32), 24000)
    with pytest.raises(VoiceError, match="40.0 s"):
        prepare(ckpt, np.zeros(40 * 16000, dtype=np.float32), 16000)
    with pytest.raises(VoiceError, match="finite"):
        prepare(ckpt, np.full(48000, np.nan, dtype=np.float32), 24000)
    with pytest.raises(VoiceError, match="Base"):
        prepare(checkpoint.load(str(TINY_CHECKPOINT), device="cpu"), np.zeros(48000, dtype=np.float32), 24000)


def test_a_voice_the_checkpoint_cannot_speak() -> None:
    base, design, instruct = (load(f) for f in COMMITTED)
    tokens = TextTokens(base.tokenizer)
    clone = cloned(COMMITTED[0], "ref_24k.x_vector")
    with pytest.raises(PromptError, match="Base checkpoint speaks cloned voices"):
        Voice.resolve(base.config, "vivian", "english", tokens=tokens)
    with pytest.raises(PromptError, match="takes no instructions"):
        Voice.resolve(base.config, None, "english", tokens=tokens, clone=clone, instructions="Whisper.")
    with pytest.raises(PromptError, match="speaks its own speakers"):
        Voice.resolve(instruct.config, "vivian", "english", tokens=tokens, clone=clone)
    with pytest.raises(PromptError, match="not cloned ones"):
        Voice.resolve(design.config, None, "english", tokens=tokens, clone=clone)
    with pytest.raises(PromptError, match="unknown language"):
        Voice.resolve(base.config, None, "sichuan_dialect", tokens=tokens, clone=clone)
    icl = cloned(COMMITTED[0], "ref_24k.icl")
    broken = VoicePrompt(kind="clone", speaker=icl.speaker, codes=icl.codes + base.config.predictor.vocab,
                         text=icl.text, model=icl.model)
    with pytest.raises(PromptError, match="exceed the codebooks"):
        Voice.resolve(base.config, None, "english", tokens=tokens, clone=broken)


def test_the_06b_custom_voice_ignores_instructions() -> None:
    """As the official generate_custom_voice: 0.6B CustomVoice drops them; 1.7B reads them."""
    small, large = checkpoint.load(str(TINY_CHECKPOINT), device=DEVICE, dtype="float32"), load(COMMITTED[2])
    tokens = TextTokens(small.tokenizer)
    assert Voice.resolve(small.config, "vivian", "english", tokens=tokens, instructions="Whisper.").instruct_ids == ()
    assert Voice.resolve(large.config, "vivian", "english", tokens=tokens, instructions="Whisper.").instruct_ids \
        == tuple(tokens.encode(instruct_text("Whisper."))[0])
