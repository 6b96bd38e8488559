"""Qwen3 decoder blocks with a static KV cache (gpt-fast style).

Every cache is preallocated as [rows, kv_heads, max_len, head_dim], one row per running stream. A step
writes its keys and values in place, so tensor shapes never change between steps and a step over rows
[0, B) can be captured once per B in a CUDA graph. A block runs in one of two ways: `Decode` (the frame
steps: a few new positions per row, attended over each row's cache up to them, by engine.kernels'
fused attention on a GPU) or `Prefill` (prompts, attended causally: the caller says how keys and values are
written and read). Parameter names follow the official checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine import kernels

# (cache, k, v) -> the keys and values to attend over, after writing k, v [B, kv_heads, T, D] into cache.
KVAccess = Callable[["KVCache", torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Decode:
    """Rows [0, B) of the caches; row r's new positions are start (+ pos[r]) onwards."""

    start: int = 0
    pos: torch.Tensor | None = None


@dataclass(frozen=True)
class Prefill:
    """A prompt's positions, attended causally; `kv` writes their keys and values."""

    kv: KVAccess


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)

    @property
    def fused(self) -> tuple[torch.Tensor, float]:
        """(weight, eps), for an engine.kernels.linear that applies this norm to its input."""
        return self.weight, self.eps


def rope_tables(head_dim: int, theta: float, max_len: int, device: torch.device,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [max_len, head_dim] for positions 0..max_len-1, computed in float32 and cast to
    the model dtype as the official rotary embedding does per step. The sin's first half is negated, so
    that `engine.kernels.rotate` needs no negation of its own. The talker's interleaved multimodal RoPE gets
    the same position on all three axes, which makes it plain 1-D RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    sign = torch.cat((-torch.ones_like(inv_freq), torch.ones_like(inv_freq)))
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


class KVCache:
    """One layer's keys and values [rows, kv_heads, max_len, head_dim]: views of its KVCaches'."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v


class KVCaches:
    """Every layer's keys and values for `rows` sequences of up to `max_len` positions, in one tensor each
    (layer first), so that moving a sequence to another row is one copy for all layers."""

    def __init__(self, layers: int, rows: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (layers, rows, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = [KVCache(k, v) for k, v in zip(self.k, self.v, strict=True)]

    def move_row_(self, src: int, dst: int) -> None:
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


def fuse_weights(*modules: nn.Linear | nn.Embedding) -> torch.Tensor:
    """One weight, stacked on the first dimension, for several bias-free linears of the same input (one GEMM
    instead of several) or several embedding tables (one lookup): the modules' weights become views of it,
    so the checkpoint's names and memory stay as they were."""
    fused = torch.cat([module.weight.detach() for module in modules])
    start = 0
    for module in modules:
        rows = module.weight.shape[0]
        module.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def fuse(self) -> None:
        """After loading: one q/k/v projection, and the q and k norm weights side by side per head."""
        self.qkv_weight = fuse_weights(self.q_proj, self.k_proj, self.v_proj)
        self.qk_norm_weight = torch.cat([self.q_norm.weight.detach().expand(self.heads, -1),
                                         self.k_norm.weight.detach().expand(self.kv_heads, -1)])

    def forward(self, qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache,
                how: Decode | Prefill) -> torch.Tensor:
        """qkv [B, T, (heads + 2 kv_heads) * head_dim] -> attention output [B, T, heads * head_dim]; rope is
        the cos/sin tables (Decode) or their rows for the T positions (Prefill)."""
        if isinstance(how, Decode):
            return kernels.decode_attention(qkv, self.q_norm.weight, self.k_norm.weight, self.qk_norm_weight,
                                            self.q_norm.eps, rope, cache.k, cache.v, how.start, how.pos, self.heads)
        b, t, _ = qkv.shape
        h, g, d = self.heads, self.kv_heads, self.head_dim
        qk = kernels.qk_norm_rope(qkv, self.qk_norm_weight, self.q_norm.eps, *rope)
        v = qkv.view(b, t, h + 2 * g, d)[:, :, h + g:]
        k, v = how.kv(cache, qk[:, :, h:].transpose(1, 2), v.transpose(1, 2))
        out = F.scaled_dot_product_attention(qk[:, :, :h].transpose(1, 2), k, v, is_causal=True,
                                             enable_gqa=h != g)
        return out.transpose(1, 2).reshape(b, t, h * d)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def fuse(self) -> None:
        self.gate_up_weight = fuse_weights(self.gate_proj, self.up_proj)


class Block(nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps)
        self.mlp = MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache,
                how: Decode | Prefill) -> torch.Tensor:
        """x + attention, then + mlp: five kernels on a GPU (see engine.kernels), norms and residual adds
        fused into the projections."""
        attn, mlp = self.self_attn, self.mlp
        qkv = kernels.linear(x, attn.qkv_weight, norm=self.input_layernorm.fused)
        x = kernels.linear(attn(qkv, rope, cache, how), attn.o_proj.weight, residual=x)
        gate_up = kernels.linear(x, mlp.gate_up_weight, norm=self.post_attention_layernorm.fused)
        return kernels.linear(gate_up, mlp.down_proj.weight, silu=True, residual=x)
