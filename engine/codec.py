"""Qwen3-TTS 12 Hz codec decoder: 16 codebooks x T frames -> 24 kHz waveform, whole or streamed.

A plain-PyTorch re-implementation of the official ``Qwen3TTSTokenizerV2Decoder`` (qwen-tts 0.1.1,
qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py), written against the same weights.

Pipeline per frame: split RVQ dequantizer (1 semantic + 15 acoustic codebooks) -> causal conv ->
8-layer sliding-window transformer -> 2 x (transposed conv x2 + ConvNeXt) -> causal conv ->
4 SnakeBeta decoder blocks (x8, x5, x4, x3) -> SnakeBeta -> conv to 1 channel -> clamp [-1, 1].
1920 samples per frame at 24 kHz.

Weights: ``CodecDecoder.state_dict()`` keys are exactly the keys of speech_tokenizer/model.safetensors
that start with ``decoder.`` (the official decoder layout lives under the ``decoder`` attribute), so a
strict load is::

    sd = safetensors.torch.load_file(f"{root}/speech_tokenizer/model.safetensors")
    codec = CodecDecoder.from_config(json.load(open(f"{root}/speech_tokenizer/config.json")))
    codec.load_state_dict({k: v for k, v in sd.items() if k.startswith("decoder.")})

The ``encoder.*`` keys (Mimi, used only to encode reference audio for voice cloning) are not used.

Streaming: every layer is causal and no layer looks ahead (the causal transposed convs cut their
right overlap, so output block t depends on input frames <= t only). ``decode_step`` therefore emits
exactly n * 1920 final samples for n new frames, with no flush and no algorithmic latency beyond the
frame itself. Left context is carried incrementally in a preallocated ``CodecState``: the input tail
of each causal conv, the last input frame of each causal transposed conv (its spill into the next
frame's samples is computed again from it), and a ring of keys and values per transformer layer (the
window plus a step's frames, written in place). A fresh state holds zeros, which is exactly the official
zero padding, so streaming reproduces ``decode`` up to float rounding. Rows are independent streams with
their own positions: ``CodecState.reset_`` restarts rows, ``copy_rows_`` moves streams between rows,
``narrow`` gives a view of consecutive rows (a smaller batch bucket sharing the same memory).

Layout and kernels: after the quantizer the signal is channels-last, [B, T, C] (the transformer's layout,
and what the convs' kernels read best). On a GPU each dense conv and transposed conv is one
engine.kernels kernel that reads its left context straight from the state, and applies its bias, the
residual add and the SnakeBeta that follows it as it writes its output; on a CPU (and with the kernels off)
the same layers run their PyTorch reference.

Codes must lie in [0, codebook_size): the official ``decode`` maps its -1 padding to 0 before this.
Outputs are float32 whatever the model dtype; SnakeBeta, RMSNorm and the codebook lookup compute in
float32 so a bf16 model stays stable.

Note: the official ``Qwen3TTSTokenizerV2Model.decode`` goes through ``chunked_decode`` (300-frame
chunks re-decoded with 25 frames of left context), which equals ``decoder(codes)`` only up to 300
frames; ``decode`` here is the unchunked forward, i.e. full left context everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine import kernels
from engine.layers import RMSNorm

# Conv caches are keyed by the module that owns them; the transformer KV cache is separate.
ConvCaches = dict[nn.Module, Tensor]
# Frames a streaming step attends to at once, at least: the transformer's KV rings hold the window and these,
# rounded up to 16 slots (the attention kernels' mask alignment); a longer decode_step runs in several passes.
STEP_FRAMES = 8


@dataclass(frozen=True)
class CodecConfig:
    """The ``decoder_config`` section of speech_tokenizer/config.json (defaults: the official class)."""

    codebook_dim: int  # no default in the official class either; 512 in the released checkpoints
    codebook_size: int = 2048
    hidden_size: int = 1024
    latent_dim: int = 1024
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)


# ---------------------------------------------------------------------------------------------------
# Causal convolutions (the only layers with conv state). The decoder's signal is channels-last, [B, T, C].


class Packed(nn.Module):
    """A module that keeps a tensor derived from its weights (the layout a kernel reads, a dequantized table),
    made on first use and again after its weights are loaded or moved."""

    def __init__(self) -> None:
        super().__init__()
        self._packed: Tensor | None = None
        self.register_load_state_dict_post_hook(lambda module, keys: setattr(module, "_packed", None))

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .bfloat16(): the derived tensor follows the weights
        self._packed = None
        return super()._apply(fn, recurse)

    def pack(self) -> Tensor:
        raise NotImplementedError

    @property
    def packed(self) -> Tensor:
        if self._packed is None:
            self._packed = self.pack()
        return self._packed


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (log-scale parameters), in float32.

    Every SnakeBeta of the decoder feeds exactly one conv, so the conv before it applies it as it writes its
    output (engine.kernels.causal_conv's `act`): each layer hands over its output and the activated output.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    @property
    def params(self) -> tuple[Tensor, Tensor]:
        return self.alpha, self.beta


class CausalConv1d(Packed):
    """Stride-1 conv padded on the left only (official ``CausalConvNet``), x [B, T, C].

    Streaming keeps the last ``context`` inputs; zeros at the start match the official padding. Returns
    (y, act(y)) for y = [residual +] conv(x): y only when ``keep``, act(y) only with an ``act``. On a GPU this
    is one engine.kernels.causal_conv kernel (left context read from the cache, bias, residual and activation
    applied in registers), else the PyTorch reference.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size, dilation=dilation)
        self.context = (kernel_size - 1) * dilation

    @property
    def cache_shape(self) -> tuple[int, int] | None:
        return (self.context, self.conv.in_channels) if self.context else None

    def pack(self) -> Tensor:
        return kernels.pack_conv(self.conv.weight)

    def forward(self, x: Tensor, caches: ConvCaches | None = None, *, residual: Tensor | None = None,
                act: SnakeBeta | None = None, keep: bool = True) -> kernels.ConvOut:
        cache = None if caches is None else caches.get(self)
        conv, snake = self.conv, None if act is None else act.params
        if kernels.available(x):
            return kernels.causal_conv(x, self.packed, conv.bias, conv.kernel_size[0], conv.dilation[0], cache,
                                       residual, snake, keep)
        return kernels.causal_conv_reference(x, conv.weight, conv.bias, conv.dilation[0], cache, residual, snake, keep)


class DepthwiseCausalConv1d(nn.Module):
    """The ConvNeXt blocks' causal depthwise conv (groups = channels), x [B, T, C] at the frame rate.

    cuDNN runs grouped convs on a slow fallback, so on a GPU it is a multiply-sum over the unfolded input.
    """

    def __init__(self, dim: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel_size, groups=dim)
        self.context = kernel_size - 1

    @property
    def cache_shape(self) -> tuple[int, int]:
        return self.context, self.conv.in_channels

    def forward(self, x: Tensor, caches: ConvCaches | None = None) -> Tensor:
        cache = None if caches is None else caches.get(self)
        if cache is None:
            x = F.pad(x, (0, 0, self.context, 0))
        else:
            x = torch.cat([cache, x], dim=1)
            cache.copy_(x[:, x.shape[1] - self.context :])
        if kernels.available(x):
            return (x.unfold(1, self.context + 1, 1) * self.conv.weight[:, 0]).sum(-1) + self.conv.bias
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class CausalConvTranspose1d(Packed):
    """Transposed conv with its last ``kernel - stride`` outputs cut (official ``CausalTransConvNet``).

    Frame t's ``kernel`` taps land on samples t*stride + j: the first ``stride`` taps form its own
    output block, the other ``overlap`` taps spill into block t+1. So block t mixes frames t and t-1
    only and nothing looks ahead; the cut samples are the last frame's spill, which streaming computes again
    in the next step from the last input frame it keeps. Returns (y, act(y)) as CausalConv1d does.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int):
        super().__init__()
        # With kernel > 2*stride a frame would spill over several output blocks.
        assert stride <= kernel_size <= 2 * stride, (kernel_size, stride)
        self.conv = nn.ConvTranspose1d(cin, cout, kernel_size, stride=stride)
        self.overlap = kernel_size - stride

    @property
    def cache_shape(self) -> tuple[int, int] | None:
        return (1, self.conv.in_channels) if self.overlap else None

    def pack(self) -> Tensor:
        return kernels.pack_conv_transpose(self.conv.weight, self.conv.stride[0])

    def forward(self, x: Tensor, caches: ConvCaches | None = None, act: SnakeBeta | None = None) -> kernels.ConvOut:
        cache = None if caches is None else caches.get(self)
        conv, snake = self.conv, None if act is None else act.params
        if kernels.available(x):
            return kernels.causal_conv_transpose(x, self.packed, conv.bias, conv.stride[0], cache, snake)
        return kernels.causal_conv_transpose_reference(x, conv.weight, conv.bias, conv.stride[0], cache, snake)


# ---------------------------------------------------------------------------------------------------
# Residual vector quantizer (decode side)


class EuclideanCodebook(nn.Module):
    """Codebook stored as EMA statistics: entry = embedding_sum / max(cluster_usage, eps)."""

    def __init__(self, dim: int, size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def entries(self) -> Tensor:
        """The whole table [size, dim], divided as the official does, in float32 so bf16 weights do not
        lose the quotient's precision."""
        return self.embedding_sum.float() / self.cluster_usage.float().clamp(min=self.eps)[:, None]


class VectorQuantization(nn.Module):
    """One codebook; the wrapper exists only so parameter names match the checkpoint."""

    def __init__(self, dim: int, size: int):
        super().__init__()
        self._codebook = EuclideanCodebook(dim, size)


class ResidualVectorQuantizer(Packed):
    """A group of residual codebooks: summed entries, then a 1x1 conv out of codebook space.

    The codebooks' entries are dequantized once into one table (a frame's codes then take one lookup, not
    a lookup and a division per codebook), again after loading weights or moving the module.
    """

    def __init__(self, n_q: int, dim: int, size: int, io_dim: int):
        super().__init__()
        # input_proj belongs to the encoder path; kept so the checkpoint loads strictly.
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = nn.ModuleDict({"layers": nn.ModuleList(VectorQuantization(dim, size) for _ in range(n_q))})
        self.size = size

    def pack(self) -> Tensor:
        return torch.cat([layer._codebook.entries() for layer in self.vq["layers"]])

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, n_q, T] -> float32 [B, T, io_dim]."""
        table = self.packed
        offsets = torch.arange(0, table.shape[0], self.size, device=codes.device)
        summed = F.embedding(codes.transpose(1, 2) + offsets, table).sum(2)
        return F.linear(summed, self.output_proj.weight[..., 0].float())  # the 1x1 conv, channels-last


class SplitResidualVectorQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) have separate output projections."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualVectorQuantizer(1, dim, cfg.codebook_size, cfg.codebook_dim)
        self.rvq_rest = ResidualVectorQuantizer(cfg.num_quantizers - 1, dim, cfg.codebook_size, cfg.codebook_dim)

    def forward(self, codes: Tensor) -> Tensor:
        return self.rvq_first(codes[:, :1]) + self.rvq_rest(codes[:, 1:])


# ---------------------------------------------------------------------------------------------------
# Sliding-window transformer


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        """residual + scale * x, one kernel."""
        return torch.addcmul(residual, self.scale, x)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin [..., head_dim] for integer positions (engine.kernels.rotate), computed in float32
    like the official rotary."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    sign = torch.cat([-torch.ones_like(inv_freq), torch.ones_like(inv_freq)])
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attn_head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, kv: tuple[Tensor, Tensor, Tensor] | None
    ) -> Tensor:
        """x [B, T, hidden]; rope cos/signed sin broadcast to [B, 1, T, head_dim]; mask (bool, True = attend)
        [.., T, S] where S = T, or the ring's slots with ``kv`` = (k, v) rings [B, n_kv, slots, D] and the slots
        [B, T] the new frames take there (written in place; attention reads the whole ring under the mask)."""
        b, t, _ = x.shape
        h, g, d = self.n_heads, self.n_kv, self.head_dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, g, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, g, d).transpose(1, 2)
        q, k = kernels.rotate(q, *rope), kernels.rotate(k, *rope)
        if kv is not None:
            k_ring, v_ring, slots = kv
            index = slots[:, None, :, None].expand(b, g, t, d)
            k = k_ring.scatter_(2, index, k)
            v = v_ring.scatter_(2, index, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=g != h)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, kv: tuple[Tensor, Tensor, Tensor] | None
    ) -> Tensor:
        x = self.self_attn_layer_scale.add_to(x, self.self_attn(self.input_layernorm(x), rope, mask, kv))
        return self.mlp_layer_scale.add_to(x, self.mlp(self.post_attention_layernorm(x)))


class SlidingWindowTransformer(nn.Module):
    """Each frame attends to itself and the previous ``sliding_window - 1`` frames."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: Tensor, state: CodecState | None = None) -> Tensor:
        """x [B, T, latent] -> [B, T, latent]. With ``state``, frames start at ``state.pos`` and the KV
        rings supply the earlier window (T <= ring slots - (window - 1)); the caller advances ``state.pos``."""
        cfg, t = self.cfg, x.shape[1]
        x = self.input_proj(x)
        window = cfg.sliding_window
        if state is None:
            q_pos = torch.arange(t, device=x.device)
            k_pos = q_pos
            cos, sin = rope_cos_sin(q_pos, cfg.attn_head_dim, cfg.rope_theta, x.dtype)
        else:
            # Per-row positions, so streams that started at different times can share a batch. Position p
            # sits in slot p % ring; after this step's writes, slot s holds the latest position congruent to
            # s up to the last new frame (negative: never written, a stream's first frames).
            ring = state.keys.shape[3]
            q_pos = state.pos[:, None] + torch.arange(t, device=x.device)  # [B, T]
            last = q_pos[:, -1:]
            k_pos = last - (last - torch.arange(ring, device=x.device)) % ring  # [B, ring]
            cos, sin = rope_cos_sin(q_pos[:, None], cfg.attn_head_dim, cfg.rope_theta, x.dtype)
        d = q_pos[..., :, None] - k_pos[..., None, :]
        # Slots before the stream start have negative positions and hold no frame.
        mask = (d >= 0) & (d < window) & (k_pos[..., None, :] >= 0)
        if state is not None:
            mask = mask[:, None]  # [B, 1, T, S] broadcasts over heads
        for i, layer in enumerate(self.layers):
            kv = None if state is None else (state.keys[i], state.values[i], q_pos % ring)
            x = layer(x, (cos, sin), mask, kv)
        return self.output_proj(self.norm(x))


# ---------------------------------------------------------------------------------------------------
# Upsampler and waveform decoder


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = DepthwiseCausalConv1d(dim, 7)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, caches: ConvCaches | None) -> Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x, caches)))))
        return torch.addcmul(x, self.gamma, h)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor, x_act: Tensor, caches: ConvCaches | None, act: SnakeBeta,
                keep: bool = True) -> kernels.ConvOut:
        """y = x + conv2(act2(conv1(act1(x)))), given x and act1(x): (y, act(y)), y only when ``keep``."""
        _, h = self.conv1(x_act, caches, act=self.act2, keep=False)
        return self.conv2(h, caches, residual=x, act=act, keep=keep)


class DecoderBlock(nn.Module):
    """SnakeBeta, x``rate`` causal transposed conv, residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x_act: Tensor, caches: ConvCaches | None, act: SnakeBeta) -> Tensor:
        """The block's input after its SnakeBeta (block[0], applied by the layer before) -> act(output)."""
        units = self.block[2:]
        x, x_act = self.block[1](x_act, caches, act=units[0].act1)
        for i, unit in enumerate(units):
            last = i == len(units) - 1
            x, x_act = unit(x, x_act, caches, act if last else units[i + 1].act1, keep=not last)
        return x_act


class Code2Wav(nn.Module):
    """The official ``Qwen3TTSTokenizerV2Decoder`` layout (same submodule and parameter names)."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.quantizer = SplitResidualVectorQuantizer(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = SlidingWindowTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )

    def forward(self, codes: Tensor, state: CodecState | None) -> Tensor:
        """codes [B, num_quantizers, T] -> float32 waveform [B, T * samples_per_frame]."""
        caches = None if state is None else state.convs
        dtype = self.pre_conv.conv.weight.dtype
        x, _ = self.pre_conv(self.quantizer(codes).to(dtype), caches)
        x = self.pre_transformer(x, state)
        for trans_conv, convnext in self.upsample:
            x = convnext(trans_conv(x, caches)[0], caches)
        first, *blocks, act, last = self.decoder
        # Each SnakeBeta is applied by the conv before it: the decoder blocks start with one.
        _, x = first(x, caches, act=blocks[0].block[0], keep=False)
        for block, after in zip(blocks, [b.block[0] for b in blocks[1:]] + [act], strict=True):
            x = block(x, caches, after)
        wav, _ = last(x, caches)
        return wav.squeeze(-1).clamp(-1.0, 1.0).float()


# ---------------------------------------------------------------------------------------------------
# Public API


@dataclass
class CodecState:
    """Left context of B independent streams; all tensors preallocated, updated in place.

    convs: per stateful conv, [B, context, C]: the last inputs of a causal conv (after its activation), the
    last input frame of a transposed conv; views of one `memory` [B, sum of context * C], so that moving rows
    is one copy for all of them.
    keys/values: [layers, B, n_kv_heads, slots, head_dim], rings of window - 1 + STEP_FRAMES slots or a few
    more (a multiple of 16): frame p in slot p % slots.
    pos: [B] int64, frames decoded so far per stream (RoPE position of the next frame).
    """

    convs: ConvCaches
    memory: Tensor
    keys: Tensor
    values: Tensor
    pos: Tensor

    @property
    def batch_size(self) -> int:
        return self.pos.shape[0]

    def narrow(self, start: int, length: int) -> CodecState:
        """Rows [start, start + length) as views of this state's memory: stepping the view advances
        these rows here (e.g. a CUDA graph captured for a smaller batch bucket over the first rows)."""
        return CodecState(
            convs={m: c.narrow(0, start, length) for m, c in self.convs.items()},
            memory=self.memory.narrow(0, start, length),
            keys=self.keys.narrow(1, start, length),
            values=self.values.narrow(1, start, length),
            pos=self.pos.narrow(0, start, length),
        )

    def copy_rows_(self, dst: int | Tensor, src: int | Tensor) -> None:
        """Move streams between rows in place (rows ``src`` -> rows ``dst``), e.g. to compact a batch."""
        self.memory[dst] = self.memory[src]
        self.keys[:, dst] = self.keys[:, src]
        self.values[:, dst] = self.values[:, src]
        self.pos[dst] = self.pos[src]

    def load_rows_(self, src: CodecState, rows: Tensor) -> None:
        """This state's rows become rows ``rows`` of ``src`` (a gather, e.g. the streams whose packet is
        due into a batch); ``store_rows_`` writes them back after the step."""
        self.memory.copy_(src.memory.index_select(0, rows))
        self.keys.copy_(src.keys.index_select(1, rows))
        self.values.copy_(src.values.index_select(1, rows))
        self.pos.copy_(src.pos.index_select(0, rows))

    def store_rows_(self, dst: CodecState, rows: Tensor) -> None:
        """Rows ``rows`` of ``dst`` become this state's rows (the inverse of ``load_rows_``)."""
        dst.memory.index_copy_(0, rows, self.memory)
        dst.keys.index_copy_(1, rows, self.keys)
        dst.values.index_copy_(1, rows, self.values)
        dst.pos.index_copy_(0, rows, self.pos)

    def fill_rows_(self, dst: CodecState, rows: Tensor) -> None:
        """Rows ``rows`` of ``dst`` become copies of this one-stream state (streams that start from the same
        decoded context), in place. The rings must be the same size (``resized``)."""
        n = rows.shape[0]
        dst.memory.index_copy_(0, rows, self.memory.expand(n, -1))
        dst.keys.index_copy_(1, rows, self.keys.expand(-1, n, -1, -1, -1))
        dst.values.index_copy_(1, rows, self.values.expand(-1, n, -1, -1, -1))
        dst.pos.index_copy_(0, rows, self.pos.expand(n))

    def resized(self, slots: int, frames: int) -> CodecState:
        """These streams, each `frames` frames in, with KV rings of `slots` slots: the keys and values of the
        last min(frames, slots) frames move to their slots in the new ring (frame p in slot p % slots); the
        conv caches and positions are shared with this state."""
        ring = self.keys.shape[3]
        kept = torch.arange(max(0, frames - slots), frames, device=self.pos.device)
        shape = (*self.keys.shape[:3], slots, self.keys.shape[4])
        keys, values = self.keys.new_zeros(shape), self.values.new_zeros(shape)
        keys[:, :, :, kept % slots] = self.keys[:, :, :, kept % ring]
        values[:, :, :, kept % slots] = self.values[:, :, :, kept % ring]
        return CodecState(convs=self.convs, memory=self.memory, keys=keys, values=values, pos=self.pos)

    def reset_(self, rows: Tensor | None = None) -> None:
        """Start new streams in ``rows`` (indices; all rows if None), in place, without waiting for the device
        (an indexed assignment of a number, ``memory[rows] = 0``, does: the number becomes a host tensor)."""
        if rows is None:
            rows = torch.arange(self.batch_size, device=self.pos.device)
        self.memory.index_fill_(0, rows, 0)
        self.keys.index_fill_(1, rows, 0)
        self.values.index_fill_(1, rows, 0)
        self.pos.index_fill_(0, rows, 0)


class CodecDecoder(nn.Module):
    """Qwen3-TTS 12 Hz codec decoder; see the module docstring for weights and streaming."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise NotImplementedError(f"hidden_act {cfg.hidden_act!r}")
        self.cfg = cfg
        self.decoder = Code2Wav(cfg)

    @classmethod
    def from_config(cls, config: dict) -> CodecDecoder:
        """From the parsed speech_tokenizer/config.json (reads its ``decoder_config`` section)."""
        section = config["decoder_config"]
        if (section.get("rope_scaling") or {}).get("rope_type", "default") != "default":
            raise NotImplementedError(f"rope_scaling {section['rope_scaling']}")
        kwargs = {f.name: section[f.name] for f in fields(CodecConfig) if f.name in section}
        for key in ("upsample_rates", "upsampling_ratios"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        cfg = CodecConfig(**kwargs)
        declared = config.get("decode_upsample_rate", cfg.samples_per_frame)
        if declared != cfg.samples_per_frame:
            raise ValueError(f"decode_upsample_rate {declared} != upsampling product {cfg.samples_per_frame}")
        return cls(cfg)

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.samples_per_frame

    def _check_codes(self, codes: Tensor) -> None:
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """Whole utterance: codes [B, 16, T] (int64) -> float32 waveform [B, T * 1920] in [-1, 1]."""
        self._check_codes(codes)
        return self.decoder(codes, None)

    def new_state(self, batch_size: int, frames: int = STEP_FRAMES) -> CodecState:
        """Zeroed streaming state for ``batch_size`` streams, on the module's device and dtype, whose KV rings
        take steps of up to ``frames`` frames (``decode_step`` splits longer ones)."""
        weight = self.decoder.pre_conv.conv.weight
        dtype, device = weight.dtype, weight.device
        shapes = {module: module.cache_shape for module in self.modules()
                  if isinstance(module, CausalConv1d | DepthwiseCausalConv1d | CausalConvTranspose1d)
                  and module.cache_shape is not None}
        memory = torch.zeros(batch_size, sum(r * c for r, c in shapes.values()), dtype=dtype, device=device)
        convs: ConvCaches = {}
        start = 0
        for module, (rows, channels) in shapes.items():
            convs[module] = memory[:, start : start + rows * channels].view(batch_size, rows, channels)
            start += rows * channels
        cfg = self.cfg
        kv_shape = (
            cfg.num_hidden_layers,
            batch_size,
            cfg.num_key_value_heads,
            -(-(cfg.sliding_window - 1 + frames) // 16) * 16,
            cfg.attn_head_dim,
        )
        return CodecState(
            convs=convs,
            memory=memory,
            keys=torch.zeros(kv_shape, dtype=dtype, device=device),
            values=torch.zeros(kv_shape, dtype=dtype, device=device),
            pos=torch.zeros(batch_size, dtype=torch.int64, device=device),
        )

    @torch.no_grad()
    def decode_step(self, codes: Tensor, state: CodecState) -> Tensor:
        """Next n frames of each stream: codes [B, 16, n] -> float32 waveform [B, n * 1920], final samples.

        Concatenating the outputs of successive calls equals ``decode`` of all frames at once (any
        packet sizes). Host-sync free, so a fixed (B, n) step can be captured in a CUDA graph.
        """
        self._check_codes(codes)
        if codes.shape[0] != state.batch_size:
            raise ValueError(f"codes batch {codes.shape[0]} != state batch {state.batch_size}")
        wavs = []
        for part in codes.split(state.keys.shape[3] - (self.cfg.sliding_window - 1), dim=2):  # the rings' spare slots
            wavs.append(self.decoder(part, state))
            state.pos += part.shape[2]
        return wavs[0] if len(wavs) == 1 else torch.cat(wavs, dim=-1)
