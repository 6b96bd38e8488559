"""engine.codec against the official qwen-tts decoder, and streaming against whole-utterance decoding.

References (written through the official code, see the scripts' docstrings):
- tests/data/codec_tiny/ (scripts/make_codec_reference.py): decoder-only, sliding window 6 < 16 frames,
  grouped KV heads, batch 2.
- tests/data/qwen3_tts_tiny/ (scripts/make_parity_fixture.py): the full tiny checkpoint; its
  `decoder_wav` is the official speech_tokenizer.decode of `decoder_codes`.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from engine import kernels
from engine.codec import CodecDecoder
from tests.paths import DATA

CODEC_TINY = DATA / "codec_tiny"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PARITY_TINY = DATA / "qwen3_tts_tiny"


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    noise = (x.double() - ref.double()).pow(2).sum().clamp_min(1e-30)
    return (10 * torch.log10(ref.double().pow(2).sum() / noise)).item()


def assert_informative(wav: torch.Tensor) -> None:
    """A reference stuck at the clamp (or silent) would let a wrong decoder pass."""
    assert wav.std() > 0.02
    assert (wav.abs() >= 1.0).float().mean() < 0.05


@pytest.fixture(scope="module")
def codec() -> CodecDecoder:
    model = CodecDecoder.from_config(json.loads((CODEC_TINY / "config.json").read_text())).eval()
    weights = load_file(str(CODEC_TINY / "model.safetensors"))
    assert set(model.state_dict()) == set(weights)  # names exactly as the checkpoint has them
    model.load_state_dict(weights, strict=True)
    return model


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(str(CODEC_TINY / "reference.safetensors"))


@pytest.fixture(scope="module")
def whole(codec: CodecDecoder, reference: dict[str, torch.Tensor]) -> torch.Tensor:
    return codec.decode(reference["codes"])


def stream(codec: CodecDecoder, codes: torch.Tensor, packet: int) -> torch.Tensor:
    state = codec.new_state(codes.shape[0])
    chunks = []
    for start in range(0, codes.shape[2], packet):
        part = codes[:, :, start : start + packet]
        audio = codec.decode_step(part, state)
        assert audio.shape == (codes.shape[0], part.shape[2] * codec.samples_per_frame)
        chunks.append(audio)
    return torch.cat(chunks, dim=-1)


def test_whole_decode_matches_official(whole: torch.Tensor, reference: dict[str, torch.Tensor]) -> None:
    assert_informative(reference["wav"])
    assert whole.shape == reference["wav"].shape == (2, 16 * 1920)
    assert rel_error(whole, reference["wav"]) <= 1e-4


@pytest.mark.skipif(not (PARITY_TINY / "references.safetensors").is_file(), reason="parity fixture not written")
def test_whole_decode_matches_official_checkpoint_fixture() -> None:
    from engine.checkpoint import load_strict

    folder = PARITY_TINY / "speech_tokenizer"
    model = CodecDecoder.from_config(json.loads((folder / "config.json").read_text())).eval()
    load_strict(
        model,
        [folder / "model.safetensors"],
        str(folder),
        skip=lambda name: name.startswith("encoder."),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    refs = load_file(str(PARITY_TINY / "references.safetensors"))
    codes, wav = refs["decoder_codes"][None], refs["decoder_wav"][None]
    assert_informative(wav)
    out = model.decode(codes)
    assert rel_error(out, wav) <= 1e-4
    assert snr_db(stream(model, codes, 4), wav) >= 60


@pytest.mark.parametrize("packet", [1, 4, 7, 16])
def test_streaming_equals_whole_decode(
    codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor, packet: int
) -> None:
    assert snr_db(stream(codec, reference["codes"], packet), whole) >= 60


def test_varying_packet_sizes(codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor) -> None:
    codes, state, chunks, start = reference["codes"], codec.new_state(2), [], 0
    for n in (3, 1, 5, 2, 5):
        chunks.append(codec.decode_step(codes[:, :, start : start + n], state))
        start += n
    assert start == codes.shape[2]
    assert snr_db(torch.cat(chunks, dim=-1), whole) >= 60


def test_batch_rows_are_isolated(codec: CodecDecoder, reference: dict[str, torch.Tensor]) -> None:
    codes = reference["codes"]
    alone = stream(codec, codes[:1], 4)
    other = torch.flip(codes[1:], dims=[2])  # a different utterance in row 1
    together = stream(codec, torch.cat([codes[:1], other]), 4)
    assert snr_db(together[:1], alone) >= 60


def test_reset_rows_starts_a_new_stream(
    codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor
) -> None:
    """Row 1 restarts mid-stream (a new utterance in a batch slot) while row 0 carries on."""
    codes = reference["codes"]
    state = codec.new_state(2)
    first = codec.decode_step(codes[:, :, :6], state)
    state.reset_(torch.tensor([1]))
    assert state.pos.tolist() == [6, 0]
    fresh = codes[1:, :, :10]
    rest = codec.decode_step(torch.cat([codes[:1, :, 6:], fresh]), state)
    assert snr_db(torch.cat([first[:1], rest[:1]], dim=-1), whole[:1]) >= 60
    assert snr_db(rest[1:], codec.decode(fresh)) >= 60


def test_bfloat16_streaming_stays_close(
    codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor
) -> None:
    bf16 = CodecDecoder(codec.cfg).eval()
    bf16.load_state_dict(codec.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    audio = stream(bf16, reference["codes"], 4)
    assert audio.dtype == torch.float32
    assert snr_db(audio, whole) >= 20


def test_rejects_malformed_codes(codec: CodecDecoder) -> None:
    with pytest.raises(ValueError):
        codec.decode(torch.zeros(1, 8, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        codec.decode_step(torch.zeros(3, 16, 4, dtype=torch.long), codec.new_state(2))


def test_narrowed_state_and_moved_rows_continue_their_streams(
    codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor
) -> None:
    """A 3-slot state: row 0 decodes through a 1-row view, then moves to slot 2 and finishes there."""
    codes = reference["codes"][:1]
    state = codec.new_state(3)
    first = codec.decode_step(codes[:, :, :7], state.narrow(0, 1))
    assert state.pos.tolist() == [7, 0, 0]
    state.copy_rows_(torch.tensor([2]), torch.tensor([0]))
    state.reset_(torch.tensor([0]))
    rest = codec.decode_step(torch.cat([codes[:, :, 7:]] * 3), state)[2:]
    assert snr_db(torch.cat([first, rest], dim=-1), whole[:1]) >= 60


def test_published_config_builds_the_published_geometry() -> None:
    """speech_tokenizer/config.json as published for the 12 Hz checkpoints (decoder part)."""
    config = {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "decode_upsample_rate": 1920,
        "decoder_config": {
            "codebook_dim": 512,
            "codebook_size": 2048,
            "decoder_dim": 1536,
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 512,
            "intermediate_size": 1024,
            "latent_dim": 1024,
            "layer_scale_initial_scale": 0.01,
            "max_position_embeddings": 8000,
            "num_attention_heads": 16,
            "num_hidden_layers": 8,
            "num_key_value_heads": 16,
            "num_quantizers": 16,
            "num_semantic_quantizers": 1,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000,
            "semantic_codebook_size": 4096,
            "sliding_window": 72,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
        },
    }
    with torch.device("meta"):
        model = CodecDecoder.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert model.samples_per_frame == 1920
    assert shapes["decoder.quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum"] == (2048, 256)
    assert shapes["decoder.quantizer.rvq_first.output_proj.weight"] == (512, 256, 1)
    assert shapes["decoder.pre_conv.conv.weight"] == (1024, 512, 3)
    assert shapes["decoder.pre_transformer.layers.7.self_attn.q_proj.weight"] == (1024, 512)
    assert shapes["decoder.pre_transformer.input_proj.weight"] == (512, 1024)
    assert shapes["decoder.upsample.1.1.pwconv1.weight"] == (4096, 1024)
    assert shapes["decoder.decoder.1.block.1.conv.weight"] == (1536, 768, 16)
    assert shapes["decoder.decoder.4.block.4.conv1.conv.weight"] == (96, 96, 7)
    assert shapes["decoder.decoder.6.conv.weight"] == (1, 96, 7)
    state = model.new_state(3)
    assert state.keys.shape == (8, 3, 16, 80, 64)  # the window (72 - 1), a step's frames (8), 16-aligned


@pytest.fixture
def on_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine.kernels' path, as a GPU runs it (without one, in Triton's interpreter: tests/engine/conftest.py)."""
    if kernels.triton is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setattr(kernels, "available", lambda x: True)


def on_device(codec: CodecDecoder, dtype: torch.dtype = torch.float32) -> CodecDecoder:
    model = CodecDecoder(codec.cfg).eval()
    model.load_state_dict(codec.state_dict())
    return model.to(DEVICE, dtype)


def test_kernels_decode_whole_and_streamed_like_the_reference(
    codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor, on_kernels: None
) -> None:
    """The fused convs (cache read in place, bias, residual and SnakeBeta in the epilogue) give the reference's
    waveform, whole and in packets of varying size (a 1-frame packet is shorter than the dilated convs' context)."""
    model, codes = on_device(codec), reference["codes"].to(DEVICE)
    assert rel_error(model.decode(codes).cpu(), whole) <= 1e-5
    state, chunks, start = model.new_state(2), [], 0
    for n in (1, 4, 3, 8):
        chunks.append(model.decode_step(codes[:, :, start : start + n], state).cpu())
        start += n
    assert snr_db(torch.cat(chunks, dim=-1), whole) >= 60


def test_kernels_bfloat16_streaming_stays_close(
    codec: CodecDecoder, reference: dict[str, torch.Tensor], whole: torch.Tensor, on_kernels: None
) -> None:
    """As close to float32 as the PyTorch ops in bfloat16 (29 dB here). Triton's interpreter rounds to bfloat16
    by truncation, a bias that builds up over the decoder's layers: 19 dB there."""
    audio = stream(on_device(codec, torch.bfloat16), reference["codes"][:, :, :8].to(DEVICE), 4).cpu()
    assert audio.dtype == torch.float32
    assert snr_db(audio, whole[:, : 8 * 1920]) >= (25 if DEVICE == "cuda" else 15)


def test_depthwise_conv_gpu_path_equals_the_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the ConvNeXt's depthwise conv is a multiply-sum over the unfolded input, not cuDNN's."""
    from engine.codec import DepthwiseCausalConv1d

    conv = DepthwiseCausalConv1d(8, 7)
    x = torch.randn(2, 40, 8)
    want = conv(x)
    monkeypatch.setattr(kernels, "available", lambda x: True)
    assert rel_error(conv(x), want) < 1e-6
