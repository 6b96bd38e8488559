"""Write tests/data/codec_tiny/: a tiny Qwen3-TTS 12 Hz codec decoder decoded by the OFFICIAL code.

The reference for tests/engine/test_codec.py: config.json (speech_tokenizer layout), model.safetensors (the
``decoder.*`` keys, as in speech_tokenizer/model.safetensors), reference.safetensors (codes [2, 16, T]
and the official waveform [2, T * 1920]). Real upsampling rates (1920 samples per frame), tiny widths,
a sliding window shorter than the utterance, grouped KV heads.

Runs in an oracle environment with the official package, never in the project venv:

    python3.11 -m venv /work/oracle-venv-codec && . /work/oracle-venv-codec/bin/activate
    pip install torch==2.13.0 && pip install transformers==4.57.3 accelerate==1.12.0 einops \
        soundfile librosa onnxruntime safetensors && pip install --no-deps qwen-tts==0.1.1
    python -m scripts.make_codec_reference
"""

from __future__ import annotations

import importlib.machinery
import json
import math
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "codec_tiny"
FRAMES = 16
SEED = 1234

TINY_DECODER_CONFIG = {
    "codebook_dim": 32,
    "codebook_size": 64,
    "hidden_size": 32,
    "latent_dim": 32,
    "head_dim": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_bias": False,
    "sliding_window": 6,
    "intermediate_size": 64,
    "hidden_act": "silu",
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "max_position_embeddings": 8000,
    "num_hidden_layers": 2,
    "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 32,
    "attention_dropout": 0.0,
}


def import_official():
    """The official decoder class; `import qwen_tts` also pulls the 25 Hz tokenizer chain, which needs
    sox and torchaudio.compliance.kaldi (absent here): stub them, with specs for importlib.util.find_spec."""
    for name in ["sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"]:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []
        sys.modules[name] = module
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    return Qwen3TTSTokenizerV2DecoderConfig, Qwen3TTSTokenizerV2Decoder


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights that keep activations O(1) through the stack (the official init zeroes the
    codebooks and norms and puts LayerScale near 1e-9, which would make most of the model untested)."""
    gen = torch.Generator().manual_seed(seed)
    transposed = {
        f"{name}.weight": m.kernel_size[0] // m.stride[0]
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.ConvTranspose1d)
    }

    def normal(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "cluster_usage":
            p.copy_(torch.rand(p.shape, generator=gen) * 1.5 + 0.5)
        elif leaf == "embedding_sum":
            normal(p, 1.0)
        elif leaf in ("alpha", "beta"):  # SnakeBeta log-parameters: frequency and 1/magnitude near 1
            normal(p, 0.2)
        elif leaf in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma: residual branches matter
            p.copy_(torch.rand(p.shape, generator=gen) * 0.4 + 0.1)
        elif leaf == "bias":
            normal(p, 0.05)
        elif p.dim() == 1:  # RMSNorm / LayerNorm weights
            normal(p, 0.1, mean=1.0)
        else:
            # Linear [out, in], Conv1d [out, in/groups, k]; a ConvTranspose1d [in, out, k] output
            # sample sums in * k / stride taps. Roughly unit gain either way.
            if name in transposed:
                fan_in = p.shape[0] * transposed[name]
            else:
                fan_in = p.shape[1] * math.prod(p.shape[2:])
            # Residual units add three branches per decoder block: damp them so blocks stay ~unit gain.
            gain = 0.3 if ".conv2." in name else 1.0
            normal(p, gain / math.sqrt(fan_in))
    # The output conv sets the waveform level: keep it mostly inside the [-1, 1] clamp.
    model.decoder[-1].conv.weight.mul_(0.05)


def main() -> None:
    config_cls, decoder_cls = import_official()
    torch.manual_seed(SEED)
    official = decoder_cls(config_cls(**TINY_DECODER_CONFIG)).eval()
    randomize_(official, SEED)

    gen = torch.Generator().manual_seed(SEED + 1)
    codes = torch.randint(0, TINY_DECODER_CONFIG["codebook_size"], (2, 16, FRAMES), generator=gen)
    with torch.no_grad():
        wav = official(codes).squeeze(1)
    assert wav.shape == (2, FRAMES * 1920), wav.shape
    clipped = (wav.abs() >= 1.0).float().mean().item()
    print(f"wav std {wav.std().item():.3f}, clipped fraction {clipped:.4f}")
    # A saturated reference would let a wrong decoder pass.
    assert 0.05 < wav.std().item() < 0.7 and clipped < 0.01

    OUT.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "decoder_config": TINY_DECODER_CONFIG,
    }
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = {f"decoder.{k}": v.contiguous() for k, v in official.state_dict().items()}
    save_file(weights, str(OUT / "model.safetensors"))
    save_file({"codes": codes, "wav": wav.contiguous()}, str(OUT / "reference.safetensors"))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
