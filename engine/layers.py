"""Qwen3 decoder blocks with a static KV cache (gpt-fast style).

Every cache is preallocated as [rows, kv_heads, max_len, head_dim], one row per running stream. A step
writes its keys and values in place and attends under a mask, so tensor shapes never change between steps
and a step over rows [0, B) can be captured once per B in a CUDA graph. How a step writes and reads the
cache is the caller's (`kv`): decode steps write each row at its own position and read the whole cache, a
prefill reads only the positions it writes. Parameter names follow the official checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# (cache, k, v) -> the keys and values to attend over, after writing k, v [B, kv_heads, T, D] into cache.
KVAccess = Callable[["KVCache", torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # rms_norm computes its statistics in float32 and rounds once to x's dtype; the weight comes after
        # that rounding, as in the official norm (two kernels where the official takes four).
        return self.weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps)


def rope_tables(head_dim: int, theta: float, max_len: int, device: torch.device,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [max_len, head_dim] for positions 0..max_len-1, computed in float32 and cast to
    the model dtype as the official rotary embedding does per step. The sin's first half is negated, so
    that `rotate` needs no negation of its own. The talker's interleaved multimodal RoPE gets the same
    position on all three axes, which makes it plain 1-D RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    sign = torch.cat((-torch.ones_like(inv_freq), torch.ones_like(inv_freq)))
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x2, x1) = roll(x) * sign: three kernels."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class KVCache:
    """One layer's keys and values for `rows` sequences of up to `max_len` positions."""

    def __init__(self, rows: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (rows, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def move_row_(self, src: int, dst: int) -> None:
        self.k[dst] = self.k[src]
        self.v[dst] = self.v[src]


def fuse_linears(*linears: nn.Linear) -> torch.Tensor:
    """One weight for several bias-free linears of the same input (one GEMM instead of several): the
    linears' weights become views of it, so the checkpoint's names and memory stay as they were."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


def add_linear(residual: torch.Tensor, x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """residual + linear(x) as one GEMM that accumulates into the residual (bias-free linear)."""
    shape = residual.shape
    return torch.addmm(residual.reshape(-1, shape[-1]), x.reshape(-1, x.shape[-1]), linear.weight.t()).view(shape)


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
        self.qkv_weight = fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        self.qk_norm_weight = torch.cat([self.q_norm.weight.detach().expand(self.heads, -1),
                                         self.k_norm.weight.detach().expand(self.kv_heads, -1)])

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache, kv: KVAccess,
                mask: torch.Tensor | None, residual: torch.Tensor) -> torch.Tensor:
        """residual + attention(x), x and residual [B, T, hidden]; rope cos/sin broadcast to
        [B, T, heads, head_dim]."""
        b, t, _ = x.shape
        h, g, d = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(x, self.qkv_weight).view(b, t, h + 2 * g, d)
        # q and k heads normalised and rotated together: the same arithmetic as one head at a time.
        qk = F.rms_norm(qkv[:, :, :h + g], (d,), eps=self.q_norm.eps) * self.qk_norm_weight
        qk = rotate(qk, *rope)
        q, k = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2)
        k, v = kv(cache, k, qkv[:, :, h + g:].transpose(1, 2))
        if t == 1:
            # One query per row: the query heads of a kv head become rows of one attention against it, the
            # same arithmetic as grouped-query attention without the kernels' kv-head repeat (a copy).
            out = F.scaled_dot_product_attention(q.reshape(b, g, h // g, d), k, v, attn_mask=mask)
            out = out.reshape(b, h, 1, d)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=h != g)
        return add_linear(residual, out.transpose(1, 2).reshape(b, t, h * d), self.o_proj)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def fuse(self) -> None:
        self.gate_up_weight = fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + mlp(x)."""
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return add_linear(residual, F.silu(gate) * up, self.down_proj)


class Block(nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps)
        self.mlp = MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache, kv: KVAccess,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = self.self_attn(self.input_layernorm(x), rope, cache, kv, mask, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)
