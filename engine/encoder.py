"""The 12Hz speech tokenizer's encoder: a 24 kHz waveform -> 16 codebooks x T frames, the codes a cloned
voice's reference recording is written in (the decoder, engine.codec, turns such codes into audio).

A plain-PyTorch re-implementation of the Mimi encoder as the official ``Qwen3TTSTokenizerV2Model.encode``
runs it (qwen-tts 0.1.1 over transformers' MimiModel), written against the same weights (prefix ``encoder.``
of speech_tokenizer/model.safetensors):

    SEANet: causal conv -> per ratio (4, 5, 6, 8): residual unit, ELU, strided causal conv (x2 channels)
      -> ELU -> causal conv to `hidden` (25 frames a second)
    -> transformer (LayerNorm, RoPE attention, GELU MLP, LayerScale on both branches)
    -> strided conv to 12.5 frames a second (replicated-edge padding)
    -> split RVQ: 1 semantic + 15 acoustic codebooks (nearest entry by Euclidean distance, residuals)

The transformer attends causally over the whole clip: the config's sliding window (250) is only honoured by
transformers' flash-attention path, and the official code loads the tokenizer with its default attention,
which ignores it. Quantizers past `encoder_valid_num_quantizers` (16) are not run (the official code drops
their codes). Runs once per cloned voice, in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.api import SAMPLE_RATE

VALID_QUANTIZERS = 16  # the codebooks the talker and the decoder use


@dataclass(frozen=True)
class EncoderConfig:
    """``encoder_config`` of speech_tokenizer/config.json (defaults: transformers' MimiConfig, which are the
    published values)."""

    num_filters: int = 64
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    num_residual_layers: int = 1
    dilation_growth_rate: int = 2
    compress: int = 2
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0  # 0: hidden_size / num_attention_heads
    intermediate_size: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    pad_mode: str = "constant"
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    frame_rate: float = 12.5
    sampling_rate: int = SAMPLE_RATE

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EncoderConfig:
        unsupported = {"audio_channels": 1, "use_causal_conv": True, "use_conv_shortcut": False, "hidden_act": "gelu",
                       "attention_bias": False}
        for key, value in unsupported.items():
            if d.get(key, value) != value:
                raise ValueError(f"speech_tokenizer encoder_config: {key} = {d[key]!r} (this engine runs {value!r})")
        values = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and v is not None}
        if "_frame_rate" in d:
            values["frame_rate"] = d["_frame_rate"]
        if "upsampling_ratios" in values:
            values["upsampling_ratios"] = tuple(values["upsampling_ratios"])
        cfg = cls(**values)
        if cfg.sampling_rate != SAMPLE_RATE or cfg.num_quantizers < VALID_QUANTIZERS:
            raise ValueError(f"speech_tokenizer encoder_config: {SAMPLE_RATE} Hz and >= {VALID_QUANTIZERS} quantizers")
        return cfg

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def seanet_rate(self) -> int:
        """Frames a second after the SEANet (25): the transformer's rate."""
        return math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))


class CausalConv(nn.Module):
    """Mimi's causal conv: the input padded on the left by (effective kernel - stride) and on the right up
    to a whole number of strides, so T samples give ceil(T / stride) outputs."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size, stride, dilation=dilation, bias=bias)
        self.left = (kernel_size - 1) * dilation + 1 - stride
        self.stride, self.pad_mode = stride, pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = -x.shape[-1] % self.stride
        return self.conv(F.pad(x, (self.left, extra), mode=self.pad_mode))


class ResidualUnit(nn.Module):
    def __init__(self, cfg: EncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        # Indices as the checkpoint names them: block.1 and block.3 are the convs, 0 and 2 their ELUs.
        self.block = nn.ModuleList([nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation,
                                                         pad_mode=cfg.pad_mode),
                                    nn.ELU(), CausalConv(hidden, dim, 1, pad_mode=cfg.pad_mode)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return x + y


class SEANet(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(1, cfg.num_filters, cfg.kernel_size, pad_mode=cfg.pad_mode)]
        channels = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            layers += [ResidualUnit(cfg, channels, cfg.dilation_growth_rate ** j)
                       for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalConv(channels, 2 * channels, 2 * ratio, stride=ratio, pad_mode=cfg.pad_mode)]
            channels *= 2
        layers += [nn.ELU(), CausalConv(channels, cfg.hidden_size, cfg.last_kernel_size, pad_mode=cfg.pad_mode)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        d = cfg.attn_head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.theta, self.head_dim = cfg.rope_theta, cfg.attn_head_dim
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=x.device).float() / self.head_dim))
        freqs = torch.outer(torch.arange(x.shape[1], device=x.device, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("embed_sum", torch.zeros(size, dim))
        self.register_buffer("cluster_usage", torch.ones(size))

    @property
    def entries(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVectorQuantizer(nn.Module):
    """The first `n_q` codebooks of a residual quantizer (a checkpoint may hold more: see unused)."""

    def __init__(self, cfg: EncoderConfig, n_q: int) -> None:
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.layers = nn.ModuleList(VectorQuantization(cfg.codebook_size, cfg.codebook_dim) for _ in range(n_q))
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False) if dim != cfg.hidden_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, hidden, T] -> codes [B, used, T]: each codebook's nearest entry to what the ones before left."""
        residual = (x if self.input_proj is None else self.input_proj(x)).transpose(1, 2)
        codes = []
        for layer in self.layers:
            entries = layer.codebook.entries
            index = torch.cdist(residual.reshape(1, -1, residual.shape[-1]).float(), entries[None].float())[0]
            index = index.argmin(-1).view(residual.shape[:-1])
            residual = residual - F.embedding(index, entries)
            codes.append(index)
        return torch.stack(codes, dim=1)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, semantic)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, VALID_QUANTIZERS - semantic)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.semantic_residual_vector_quantizer(x), self.acoustic_residual_vector_quantizer(x)], 1)


class SpeechEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = SEANet(cfg)
        self.encoder_transformer = Transformer(cfg)
        stride = round(cfg.seanet_rate / cfg.frame_rate)
        self.downsample = CausalConv(cfg.hidden_size, cfg.hidden_size, 2 * stride, stride=stride, bias=False,
                                     pad_mode="replicate")
        self.quantizer = SplitResidualVectorQuantizer(cfg)
        self.samples_per_frame = round(cfg.sampling_rate / cfg.frame_rate)

    @classmethod
    def from_config(cls, speech_tokenizer_config: dict[str, Any]) -> SpeechEncoder:
        """From speech_tokenizer/config.json."""
        return cls(EncoderConfig.from_dict(speech_tokenizer_config.get("encoder_config") or {}))

    def unused(self, name: str) -> bool:
        """Checkpoint tensors (names without `encoder.`) that encoding does not read: the quantizers' output
        projections (decoding), their `initialized` flags (training), and the codebooks past the 16 valid ones."""
        if name.endswith((".initialized", ".output_proj.weight")):
            return True
        acoustic = "quantizer.acoustic_residual_vector_quantizer.layers."
        used = VALID_QUANTIZERS - self.cfg.num_semantic_quantizers
        return name.startswith(acoustic) and int(name[len(acoustic):].split(".")[0]) >= used

    @torch.no_grad()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """A 24 kHz waveform [T] (float) -> codes [ceil(T / 1920), 16] (int64)."""
        weight = self.downsample.conv.weight
        x = self.encoder(wav.to(device=weight.device, dtype=weight.dtype)[None, None])
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        codes = self.quantizer(self.downsample(x))[0]
        return codes[:, :-(-wav.shape[-1] // self.samples_per_frame)].T.contiguous()
