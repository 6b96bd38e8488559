"""Fused GPU kernels (Triton) for the engine's per-frame work, each beside the PyTorch code it replaces.

A frame at batch 1 is over a hundred decoder-layer passes (28 talker layers, then 15 code-predictor steps of
5 layers) that read ~3.3 GB of weights: about 0.75 ms of memory traffic on an H200. Written as PyTorch ops a
layer is ~20 kernels of a few microseconds each, so the step is bound by kernel count, not bytes. Here a
layer is five kernels: the q/k/v projection with its RMSNorm fused in front, one attention kernel (q/k
norms, RoPE, the KV-cache write and the attention itself), the output projection with the residual add
fused behind, the gate/up projection with its RMSNorm, and the down projection with SiLU*up in front and
the residual behind. The projections are matrix-vector kernels at batch 1 (cuBLAS' GEMMs take ~6 us for
1-3 us of weights there); larger batches keep cuBLAS with the norms and SiLU fused into one kernel each.
The samplers' top-k draw is one kernel too, and so is each of the codec decoder's convolutions, with its
streaming context, bias, residual add and the SnakeBeta after it (the codec section below).

Every op has a PyTorch reference, the exact code the model ran before these kernels: it runs on the CPU,
for shapes a kernel does not take, when `set_enabled(False)`, and it is the tests' oracle. The kernels
follow the reference's roundings (a bf16 result rounded where the reference rounds), so they differ only in
summation order. Without a GPU the tests run the kernels in Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: every op takes its PyTorch path
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Autotuning compiles and times every candidate config of a kernel for each new shape (seconds on a first
# call): serving wants the fastest config, a test run wants few compilations. QWEN3_TTS_AUTOTUNE=0 (the tests
# set it) or set_autotune(False) runs each kernel with the first candidate that fits the shape instead.
_autotune = os.environ.get("QWEN3_TTS_AUTOTUNE", "1") != "0"
# Rows up to which a projection runs as the matrix-vector kernel; above it cuBLAS' GEMMs win
# (python -m bench engine --kernels on an H200).
GEMV_MAX_ROWS = 2
_enabled = True


def set_enabled(enabled: bool) -> None:
    """Fused kernels on (the default) or off (every op takes its PyTorch path; for A/B measurements)."""
    global _enabled
    _enabled = enabled


def set_autotune(enabled: bool) -> None:
    """Autotuning on (the default) or off (each kernel's first fitting config: fewer compilations)."""
    global _autotune
    _autotune = enabled


def _launch(kernel, grid, args: tuple, meta: dict, fitting=lambda configs: configs[0]) -> None:
    """Launch an autotuned kernel: autotuned, or with the config `fitting` picks from its candidates. grid(config)
    is the launch grid of a config's meta-parameters."""
    if _autotune:
        kernel[lambda c: grid(c)](*args, **meta)
        return
    config = fitting(kernel.configs)
    kernel.fn[grid(config.kwargs)](*args, **meta, **config.kwargs, num_warps=config.num_warps,
                                   num_stages=config.num_stages)


def available(x: torch.Tensor) -> bool:
    """Whether the kernels run for this tensor: on a GPU, with Triton present."""
    return _enabled and triton is not None and x.is_cuda


def self_test(device: torch.device, dtype: torch.dtype) -> str | None:
    """Run every kernel once on small random inputs against its reference; None when all agree, else what
    failed (a Triton that cannot compile for this GPU, say), so the engine can run without them."""
    if not available(torch.empty(0, device=device)):
        return None
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    x, w, norm = randn(1, 1, 256), randn(128, 256) / 16, (1 + randn(256) / 10, 1e-6)
    cache = randn(2, 2, 32, 64), randn(2, 2, 32, 64)
    angles = torch.outer(torch.arange(32, device=device).float(), torch.rand(32, device=device))
    rope = (torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype))
    qkv, qn, kn, pos = randn(2, 1, 8 * 64), randn(64), randn(64), torch.tensor([3, 9], device=device)
    conv_x, conv_w, conv_b, snake = randn(2, 40, 16), randn(24, 16, 7) / 8, randn(24), (randn(24), randn(24))
    up_x, up_w = randn(2, 5, 16), randn(16, 24, 6) / 8
    checks = {
        "linear": (lambda: linear(x, w, norm=norm), lambda: linear_reference(x, w, norm=norm)),
        "decode_attention": (
            lambda: decode_attention(qkv, qn, kn, torch.cat([qn.expand(4, -1), kn.expand(2, -1)]), 1e-6, rope,
                                     cache[0].clone(), cache[1].clone(), 0, pos, 4),
            lambda: decode_attention_reference(qkv, torch.cat([qn.expand(4, -1), kn.expand(2, -1)]), 1e-6, rope,
                                               cache[0].clone(), cache[1].clone(), 0, pos, 4)),
        "causal_conv": (
            lambda: causal_conv(conv_x, pack_conv(conv_w), conv_b, 7, 3, None, act=snake, keep=False)[1],
            lambda: causal_conv_reference(conv_x, conv_w, conv_b, 3, None, act=snake, keep=False)[1]),
        "causal_conv_transpose": (
            lambda: causal_conv_transpose(up_x, pack_conv_transpose(up_w, 3), conv_b, 3, None)[0],
            lambda: causal_conv_transpose_reference(up_x, up_w, conv_b, 3, None)[0]),
    }
    for name, (fused, reference) in checks.items():
        try:
            got, want = fused().float(), reference().float()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # a compiler or driver error: the caller runs the reference code instead
            return f"{name}: {type(exc).__name__}: {exc}"
        if not torch.allclose(got, want, rtol=0.05, atol=0.05 * float(want.abs().max())):
            return f"{name}: result differs from the PyTorch reference"
    return None


def _precision(dtype: torch.dtype) -> str:
    # float32 products stay float32 (no TF32), as the reference computes them.
    return "ieee" if dtype == torch.float32 else "tf32"


# --- RMSNorm and SiLU*up -------------------------------------------------------------------------------


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # rms_norm computes its statistics in float32 and rounds once to x's dtype; the weight comes after
    # that rounding, as in the official norm.
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    if not available(x) or x.stride(-1) != 1:
        return rms_norm_reference(x, weight, eps)
    rows = x.reshape(-1, n)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, n, rows.stride(0), eps,
                                       BLOCK=triton.next_power_of_2(n))
    return out.view(x.shape)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] on the last dimension."""
    n = gate_up.shape[-1] // 2
    if not available(gate_up) or not gate_up.is_contiguous():
        return silu_mul_reference(gate_up)
    rows = gate_up.view(-1, 2 * n)
    out = torch.empty(rows.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](rows, out, n, BLOCK=block)
    return out.view(*gate_up.shape[:-1], n)


# --- Projections ---------------------------------------------------------------------------------------


def linear_reference(x: torch.Tensor, weight: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None,
                     silu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    if norm is not None:
        x = rms_norm_reference(x, *norm)
    if silu:
        x = silu_mul_reference(x)
    if residual is None:
        return F.linear(x, weight)
    shape = residual.shape
    # One GEMM that accumulates into the residual.
    return torch.addmm(residual.reshape(-1, shape[-1]), x.reshape(-1, x.shape[-1]), weight.t()).view(shape)


def linear(x: torch.Tensor, weight: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None,
           silu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """[residual +] (silu_mul? rms_norm?(x)) @ weight.T for a bias-free linear: `norm` = (weight, eps) puts an
    RMSNorm in front, `silu` takes x = [gate | up] and uses silu(gate) * up."""
    if not available(x):
        return linear_reference(x, weight, norm, silu, residual)
    n, k = weight.shape
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > GEMV_MAX_ROWS or rows.stride(-1) != 1 or not weight.is_contiguous():
        if norm is not None:
            x = rms_norm(x, *norm)
        if silu:
            x = silu_mul(x.contiguous())
        return linear_reference(x, weight, residual=residual)
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res = out if residual is None else residual.reshape(-1, n)
    norm_weight, eps = norm if norm is not None else (weight, 0.0)
    prologue = 1 if norm is not None else 2 if silu else 0
    args = (rows, weight, out, res, norm_weight, m, n, k, rows.stride(0), eps)
    meta = dict(PROLOGUE=prologue, HAS_RESIDUAL=residual is not None, BLOCK_M=triton.next_power_of_2(m))
    if INTERPRET:  # no autotuning there (it times on a GPU); few, large programs (it runs them one by one)
        _gemv_kernel.fn[(triton.cdiv(n, 64),)](*args, **meta, BLOCK_N=64, BLOCK_K=128)
    else:
        _launch(_gemv_kernel, lambda c: (triton.cdiv(n, c["BLOCK_N"]),), args, meta)
    shape = residual.shape if residual is not None else (*x.shape[:-1], n)
    return out.view(shape)


# --- Attention of decode steps ------------------------------------------------------------------------


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x2, x1) = roll(x) * sign: three kernels."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def qk_norm_rope_reference(qkv: torch.Tensor, qk_norm: torch.Tensor, eps: float, cos: torch.Tensor,
                           signed_sin: torch.Tensor) -> torch.Tensor:
    b, t, _ = qkv.shape
    n, d = qk_norm.shape
    return rotate(F.rms_norm(qkv.view(b, t, -1, d)[:, :, :n], (d,), eps=eps) * qk_norm, cos, signed_sin)


def qk_norm_rope(qkv: torch.Tensor, qk_norm: torch.Tensor, eps: float, cos: torch.Tensor,
                 signed_sin: torch.Tensor) -> torch.Tensor:
    """The q and k heads of a prompt's fused projection outputs qkv [b, t, (heads + 2 kv_heads) * d], each
    RMS-normalised with its weight (qk_norm [heads + kv_heads, d]) and rotated to its position (cos and
    signed_sin [t, 1, d], positions 0..t-1): [b, t, heads + kv_heads, d]. One kernel for the reference's four
    passes (norm, weight, and rotate's three)."""
    b, t, _ = qkv.shape
    n, d = qk_norm.shape
    if (not available(qkv) or d & (d - 1) or not qkv.is_contiguous() or not qk_norm.is_contiguous()
            or cos.stride(0) != d or signed_sin.stride(0) != d):
        return qk_norm_rope_reference(qkv, qk_norm, eps, cos, signed_sin)
    out = torch.empty(b, t, n, d, dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope_kernel[(b * t,)](qkv, qk_norm, cos, signed_sin, out, t, qkv.stride(1), eps, N=n, D=d,
                                   BLOCK_N=triton.next_power_of_2(n))
    return out


def decode_attention_reference(qkv: torch.Tensor, qk_norm: torch.Tensor, eps: float,
                               rope: tuple[torch.Tensor, torch.Tensor], cache_k: torch.Tensor,
                               cache_v: torch.Tensor, start: int, pos: torch.Tensor | None,
                               heads: int) -> torch.Tensor:
    b, t, _ = qkv.shape
    g, d = cache_k.shape[1], cache_k.shape[3]
    h = heads
    cos, sin = rope
    if pos is None:
        cos, sin = cos[start:start + t, None], sin[start:start + t, None]
    else:
        cos, sin = cos[pos][:, None, None], sin[pos][:, None, None]
    # q and k heads normalised and rotated together: the same arithmetic as one head at a time.
    qk = qk_norm_rope_reference(qkv, qk_norm, eps, cos, sin)
    qkv = qkv.view(b, t, h + 2 * g, d)
    q, k, v = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2), qkv[:, :, h + g:].transpose(1, 2)
    if pos is None:
        cache_k[:b, :, start:start + t] = k
        cache_v[:b, :, start:start + t] = v
        keys, values = cache_k[:b, :, :start + t], cache_v[:b, :, :start + t]
        mask = torch.ones(t, start + t, dtype=torch.bool, device=qkv.device).tril(start) if t > 1 else None
    else:
        rows = torch.arange(b, device=qkv.device)
        cache_k[rows, :, pos] = k[:, :, 0]
        cache_v[rows, :, pos] = v[:, :, 0]
        keys, values = cache_k[:b], cache_v[:b]
        positions = torch.arange(keys.shape[2], device=qkv.device)
        # Additive, made once for all heads (a boolean mask is converted per call).
        mask = torch.zeros(b, 1, 1, keys.shape[2], dtype=qkv.dtype, device=qkv.device).masked_fill(
            (positions > pos[:, None])[:, None, None], float("-inf"))
    if t == 1:
        # One query per row: the query heads of a kv head become rows of one attention against it, the
        # same arithmetic as grouped-query attention without the kernels' kv-head repeat (a copy).
        out = F.scaled_dot_product_attention(q.reshape(b, g, h // g, d), keys, values, attn_mask=mask)
        out = out.reshape(b, h, 1, d)
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=h != g)
    return out.transpose(1, 2).reshape(b, t, h * d)


def decode_attention(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, qk_norm: torch.Tensor,
                     eps: float, rope: tuple[torch.Tensor, torch.Tensor], cache_k: torch.Tensor,
                     cache_v: torch.Tensor, start: int, pos: torch.Tensor | None, heads: int) -> torch.Tensor:
    """Attention of t new positions per row over rows [0, b) of a KV cache [rows, kv_heads, max_len, head_dim].

    qkv [b, t, (heads + 2 kv_heads) * head_dim] are the fused projection's outputs. Row r's new positions are
    start (+ pos[r]) .. + t - 1: their q and k are RMS-normalised per head (q_norm, k_norm [head_dim];
    qk_norm is the two side by side per head, for the reference) and rotated, k and v are written to the
    cache there, and each query attends causally to the row's cache up to its own position. Returns
    [b, t, heads * head_dim]. The kernel reads each row's cache only up to its position.
    """
    b, t, _ = qkv.shape
    g, d = cache_k.shape[1], cache_k.shape[3]
    if not available(qkv) or d < 16 or d & (d - 1) or not qkv.is_contiguous() or cache_k.stride(3) != 1:
        return decode_attention_reference(qkv, qk_norm, eps, rope, cache_k, cache_v, start, pos, heads)
    out = torch.empty(b, t, heads * d, dtype=qkv.dtype, device=qkv.device)
    cos, sin = rope
    block_q = max(16, triton.next_power_of_2(t * heads // g))
    block_n = 16 if pos is None and start + t <= 16 else 64
    _decode_attention_kernel[(b, g)](
        qkv, q_norm, k_norm, cos, sin, cache_k, cache_v, out, pos if pos is not None else qkv, start,
        qkv.stride(0), qkv.stride(1), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        out.stride(0), out.stride(1), eps, d ** -0.5,
        H=heads, G=g, D=d, T=t, HAS_POS=pos is not None, BLOCK_Q=block_q, BLOCK_N=block_n,
        PRECISION=_precision(qkv.dtype))
    return out


# --- Codec convolutions --------------------------------------------------------------------------------
#
# The codec decoder's signal is channels-last, [B, T, C]. Each of its dense convolutions (the causal convs
# and the causal transposed convs) is one `_conv_kernel`: an implicit GEMM that reads its left context
# from the streaming cache instead of a concatenation, adds the bias and the residual, and applies the
# SnakeBeta that follows it (every SnakeBeta of the decoder feeds exactly one conv, so the layer before it
# hands over both its output and the activated output). cuDNN ran these shapes on slow paths (a non-tensor-
# core kernel for the dilated convs), with a copy per concatenation and a pass per activation and add.


def snake_beta_reference(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """x + sin^2(x * e^alpha) / e^beta per channel, x [..., C]. Float32 whatever x's dtype: in bf16 the sine
    of a large argument is meaningless, and 1/e^beta amplifies it."""
    xf = x.float()
    inv_beta = 1.0 / (beta.float().exp() + 1e-9)
    return (xf + inv_beta * torch.sin(xf * alpha.float().exp()).pow(2)).to(x.dtype)


def shift_cache(cache: torch.Tensor, x: torch.Tensor) -> None:
    """cache [B, context, C] <- the last `context` steps of [cache | x] along time (x [B, T, C]): the left
    context of the next call."""
    context, t = cache.shape[1], x.shape[1]
    if t >= context:
        cache.copy_(x[:, t - context:])
    else:
        cache.copy_(torch.cat([cache[:, t:], x], dim=1))


ConvOut = tuple[torch.Tensor | None, torch.Tensor | None]


def causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int,
                          cache: torch.Tensor | None, residual: torch.Tensor | None = None,
                          act: tuple[torch.Tensor, torch.Tensor] | None = None, keep: bool = True) -> ConvOut:
    """(y, snake(y)) for y = [residual +] conv1d(x, weight, bias, dilation) over x [B, T, C] padded on the left
    by `cache` (updated in place) or zeros; y is None unless `keep`, snake(y) None without `act` (alpha, beta)."""
    context = (weight.shape[-1] - 1) * dilation
    if cache is None:
        x = F.pad(x, (0, 0, context, 0))
    elif context:
        x = torch.cat([cache, x], dim=1)
        cache.copy_(x[:, x.shape[1] - context:])
    y = F.conv1d(x.transpose(1, 2), weight, bias, dilation=dilation).transpose(1, 2)
    if residual is not None:
        y = residual + y
    return y if keep else None, None if act is None else snake_beta_reference(y, *act)


def causal_conv(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor, taps: int, dilation: int,
                cache: torch.Tensor | None, residual: torch.Tensor | None = None,
                act: tuple[torch.Tensor, torch.Tensor] | None = None, keep: bool = True) -> ConvOut:
    """causal_conv_reference in one kernel, for the weight as `pack_conv` lays it out (a GPU tensor)."""
    return _conv(x, packed, bias, taps, dilation, (taps - 1) * dilation, 1, cache, residual, act, keep)


def pack_conv(weight: torch.Tensor) -> torch.Tensor:
    """A Conv1d weight [cout, cin, k] as `_conv_kernel` reads it: [k * cin, cout], row j * cin + ci for tap j."""
    cout, cin, k = weight.shape
    return weight.permute(2, 1, 0).reshape(k * cin, cout).contiguous()


def causal_conv_transpose_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int,
                                    cache: torch.Tensor | None,
                                    act: tuple[torch.Tensor, torch.Tensor] | None = None) -> ConvOut:
    """(y, snake(y)) for y = conv_transpose1d(x, weight, bias, stride) with its last kernel - stride samples
    cut, x [B, frames, cin] -> [B, frames * stride, cout]: one GEMM for every frame's taps, then each output
    block adds the previous frame's spill (`cache` [B, 1, cin] holds the previous call's last input frame).
    Not conv_transpose1d, whose CPU kernel falls back to a slow im2col path for a streaming step's few frames."""
    b, frames, cin = x.shape
    _, cout, k = weight.shape
    overlap = k - stride
    if overlap:
        x = torch.cat([torch.zeros_like(x[:, :1]) if cache is None else cache, x], dim=1)
        if cache is not None:
            cache.copy_(x[:, -1:])
    taps = (x @ weight.reshape(cin, cout * k)).view(b, -1, cout, k)
    blocks = taps[:, -frames:, :, :stride]  # each frame's own output block
    if overlap:  # plus the spill of the frame before
        blocks = torch.cat([blocks[..., :overlap] + taps[:, :-1, :, stride:], blocks[..., overlap:]], dim=-1)
    y = blocks.transpose(2, 3).reshape(b, frames * stride, cout) + bias
    return y, None if act is None else snake_beta_reference(y, *act)


def causal_conv_transpose(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor, stride: int,
                          cache: torch.Tensor | None,
                          act: tuple[torch.Tensor, torch.Tensor] | None = None) -> ConvOut:
    """causal_conv_transpose_reference in one kernel, for the weight as `pack_conv_transpose` lays it out: a
    conv over frames (taps: the previous frame and this one) whose `stride` output phases interleave in time."""
    taps = packed.shape[0] // x.shape[2]
    return _conv(x, packed, bias, taps, 1, taps - 1, stride, cache, None, act, True)


def pack_conv_transpose(weight: torch.Tensor, stride: int) -> torch.Tensor:
    """A ConvTranspose1d weight [cin, cout, k] (stride <= k <= 2 stride) as `_conv_kernel` reads it:
    [taps * cin, stride * cout], row j * cin + ci for the frame taps - 1 - j before the output block, column
    p * cout + co for output phase p: frame t - 1 contributes kernel positions stride + p, frame t position p."""
    cin, cout, k = weight.shape
    taps = -(-k // stride)
    padded = F.pad(weight, (0, taps * stride - k)).view(cin, cout, taps, stride)
    return padded.flip(2).permute(2, 0, 3, 1).reshape(taps * cin, stride * cout).contiguous()


def _conv(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor, taps: int, dilation: int, context: int,
          phases: int, cache: torch.Tensor | None, residual: torch.Tensor | None,
          act: tuple[torch.Tensor, torch.Tensor] | None, keep: bool) -> ConvOut:
    b, t, cin = x.shape
    n = packed.shape[1]
    assert packed.shape[0] == taps * cin, (packed.shape, x.shape)
    x = x if x.stride(2) == 1 else x.contiguous()
    assert cache is None or (cache.shape[1:] == (context, cin) and cache.stride(2) == 1
                             and cache.stride(1) == cin), "cache: [B, context, C], rows contiguous"
    shape = (b, t * phases, n // phases)
    out = torch.empty(shape, dtype=x.dtype, device=x.device) if keep else None
    activated = torch.empty(shape, dtype=x.dtype, device=x.device) if act is not None else None
    some = out if out is not None else activated
    residual = residual.contiguous() if residual is not None else None
    alpha, beta = act if act is not None else (bias, bias)
    args = (x, cache if cache is not None else x, packed, bias, residual if residual is not None else some,
            out if keep else some, activated if act is not None else some, alpha, beta, cin, n, t, b * t, context,
            dilation, phases, x.stride(0), x.stride(1), cache.stride(0) if cache is not None else 0,
            int(b * t * n >= 1 << 23))
    meta = dict(TAPS=taps, HAS_CACHE=cache is not None, HAS_RESIDUAL=residual is not None, KEEP=keep,
                ACT=act is not None, PRECISION=_precision(x.dtype), F32_DOT=INTERPRET)
    if INTERPRET:  # no autotuning there; few, large programs
        block_t, block_n, block_ci = (max(16, min(cap, triton.next_power_of_2(v))) for v, cap in
                                      ((b * t, 4096), (n, 64), (cin, 32)))
        _conv_kernel.fn[(triton.cdiv(b * t, block_t) * triton.cdiv(n, block_n),)](
            *args, **meta, BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_CI=block_ci)
    else:
        _launch(_conv_kernel, lambda c: (triton.cdiv(b * t, c["BLOCK_T"]) * triton.cdiv(n, c["BLOCK_N"]),), args,
                meta, lambda configs: _conv_prune(configs, {"N": n, "CIN": cin})[0])
    if cache is not None:
        shift_cache(cache, x)
    return out, activated


# --- Sampling ------------------------------------------------------------------------------------------


def can_sample(logits: torch.Tensor) -> bool:
    return available(logits) and logits.stride(-1) == 1 and logits.shape[-1] <= 8192


def sample(logits: torch.Tensor, u: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           temperature: torch.Tensor) -> torch.Tensor:
    """engine.sampling.choose (its reference) in one kernel: temperature, top-k, top-p, then the first id
    whose cumulative probability exceeds u [B], over logits [B, V] cast to float32 in registers; each row
    with its own top_k, top_p and temperature (float32 [B]). Only where `can_sample(logits)`."""
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.long, device=logits.device)
    _sample_kernel[(b,)](logits, u, top_k.contiguous(), top_p.contiguous(), temperature.contiguous(), out, v,
                         logits.stride(0), u.stride(0), BLOCK_V=triton.next_power_of_2(v))
    return out


# --- The kernels ---------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n, stride, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x * rstd).to(dt).to(tl.float32) * w
        tl.store(out_ptr + row * n + cols, y.to(dt), mask=mask)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n
        dt = out_ptr.dtype.element_ty
        gate = tl.load(x_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
        silu = (gate * tl.sigmoid(gate)).to(dt).to(tl.float32)
        tl.store(out_ptr + row * n + cols, (silu * up).to(dt), mask=mask)

    def _gemv_configs() -> list:
        # Few rows of W per program and long K blocks: many programs, each streaming its rows once (what
        # autotuning chose on an H200 from a wider space, python -m bench engine --kernels).
        return [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=3)
                for bn in (1, 2, 4) for bk in (1024, 2048) for w in (4, 8)]

    @triton.autotune(configs=_gemv_configs(), key=["M", "N", "K", "PROLOGUE", "HAS_RESIDUAL"])
    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, out_ptr, res_ptr, nw_ptr, M, N, K, stride_x, eps,
                     PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """out = [res +] f(x) @ W.T for the few rows of x [M, K]; f: 0 identity, 1 RMSNorm with weight nw,
        2 silu(gate) * up with x = [gate | up] (2K wide). Each program streams BLOCK_N rows of W once, for
        all rows of x, and reduces over K in float32."""
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.arange(0, BLOCK_M)
        ks = tl.arange(0, BLOCK_K)
        nmask = cols < N
        mmask = (rows < M)[:, None]
        dt = out_ptr.dtype.element_ty
        x_rows = x_ptr + rows[:, None] * stride_x
        if PROLOGUE == 1:
            squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xk = tl.load(x_rows + (k0 + ks)[None, :], mask=mmask & (k0 + ks < K)[None, :], other=0.0)
                squares += xk.to(tl.float32) * xk.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(squares, 1) / K + eps)[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kmask = (k0 + ks < K)[None, :]
            if PROLOGUE == 2:
                gate = tl.load(x_rows + (k0 + ks)[None, :], mask=mmask & kmask, other=0.0).to(tl.float32)
                up = tl.load(x_rows + K + (k0 + ks)[None, :], mask=mmask & kmask, other=0.0).to(tl.float32)
                xk = ((gate * tl.sigmoid(gate)).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
            else:
                xk = tl.load(x_rows + (k0 + ks)[None, :], mask=mmask & kmask, other=0.0).to(tl.float32)
                if PROLOGUE == 1:
                    nw = tl.load(nw_ptr + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)[None, :]
                    xk = ((xk * rstd).to(dt).to(tl.float32) * nw).to(dt).to(tl.float32)
            w = tl.load(w_ptr + cols[:, None] * K + (k0 + ks)[None, :], mask=nmask[:, None] & kmask,
                        other=0.0).to(tl.float32)
            acc += tl.sum(xk[:, None, :] * w[None, :, :], 2)
        offs = rows[:, None] * N + cols[None, :]
        omask = mmask & nmask[None, :]
        if HAS_RESIDUAL:
            acc += tl.load(res_ptr + offs, mask=omask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(dt), mask=omask)

    # A prompt's length varies with every prefill group: not specialised on, so it never compiles on a stream's path.
    @triton.jit(do_not_specialize=["T"])
    def _qk_norm_rope_kernel(qkv_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, T, stride_t, eps, N: tl.constexpr,
                             D: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per prompt position: its N q and k heads normalised, weighted and rotated, rounded where
        the reference rounds (as _decode_attention_kernel does)."""
        i = tl.program_id(0)
        t = i % T
        dt = out_ptr.dtype.element_ty
        r = tl.arange(0, BLOCK_N)[:, None]
        d = tl.arange(0, D)[None, :]
        dr = (d + D // 2) % D  # rotate_half's partner of each lane
        mask = r < N
        row = qkv_ptr + i * stride_t
        x = tl.load(row + r * D + d, mask=mask, other=0.0).to(tl.float32)
        xr = tl.load(row + r * D + dr, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
        w = tl.load(w_ptr + r * D + d, mask=mask, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + r * D + dr, mask=mask, other=0.0).to(tl.float32)
        xn = ((x * rstd).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
        xnr = ((xr * rstd).to(dt).to(tl.float32) * wr).to(dt).to(tl.float32)
        cos = tl.load(cos_ptr + t * D + d).to(tl.float32)
        sin = tl.load(sin_ptr + t * D + d).to(tl.float32)
        y = (xn * cos).to(dt).to(tl.float32) + xnr * sin
        tl.store(out_ptr + i * N * D + r * D + d, y.to(dt), mask=mask)

    @triton.jit
    def _decode_attention_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr, pos_ptr,
                                 start, stride_qb, stride_qt, stride_cb, stride_cg, stride_cl, stride_ob, stride_ot,
                                 eps, scale, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
                                 HAS_POS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                                 PRECISION: tl.constexpr):
        """One program per (row, kv head): its T new keys and values into the cache, then its H/G query heads
        x T positions as rows of one flash-attention pass over the cache up to the row's last position."""
        b = tl.program_id(0)
        g = tl.program_id(1)
        R: tl.constexpr = H // G
        dt = out_ptr.dtype.element_ty
        p0 = start
        if HAS_POS:
            p0 += tl.load(pos_ptr + b).to(tl.int32)
        d = tl.arange(0, D)
        dr = (d + D // 2) % D  # rotate_half's partner of each lane
        row = qkv_ptr + b * stride_qb
        cache = b * stride_cb + g * stride_cg
        kw = tl.load(kw_ptr + d).to(tl.float32)
        kwr = tl.load(kw_ptr + dr).to(tl.float32)
        for t in tl.static_range(T):
            k = tl.load(row + t * stride_qt + (H + g) * D + d).to(tl.float32)
            kr = tl.load(row + t * stride_qt + (H + g) * D + dr).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(k * k, 0) / D + eps)
            kn = ((k * rstd).to(dt).to(tl.float32) * kw).to(dt).to(tl.float32)
            knr = ((kr * rstd).to(dt).to(tl.float32) * kwr).to(dt).to(tl.float32)
            cos = tl.load(cos_ptr + (p0 + t) * D + d).to(tl.float32)
            sin = tl.load(sin_ptr + (p0 + t) * D + d).to(tl.float32)
            k = (kn * cos).to(dt).to(tl.float32) + knr * sin
            tl.store(kc_ptr + cache + (p0 + t) * stride_cl + d, k.to(dt))
            v = tl.load(row + t * stride_qt + (H + G + g) * D + d)
            tl.store(vc_ptr + cache + (p0 + t) * stride_cl + d, v)
        # Query row r is position r // R of head g * R + r % R.
        r = tl.arange(0, BLOCK_Q)
        rt = r // R
        rmask = (r < T * R)[:, None]
        head = (g * R + r % R)[:, None] * D
        q = tl.load(row + rt[:, None] * stride_qt + head + d[None, :], mask=rmask, other=0.0).to(tl.float32)
        qr = tl.load(row + rt[:, None] * stride_qt + head + dr[None, :], mask=rmask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(q * q, 1) / D + eps)[:, None]
        qn = ((q * rstd).to(dt).to(tl.float32) * tl.load(qw_ptr + d).to(tl.float32)[None, :]).to(dt)
        qnr = ((qr * rstd).to(dt).to(tl.float32) * tl.load(qw_ptr + dr).to(tl.float32)[None, :]).to(dt)
        qpos = p0 + rt
        cos = tl.load(cos_ptr + qpos[:, None] * D + d[None, :], mask=rmask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + qpos[:, None] * D + d[None, :], mask=rmask, other=0.0).to(tl.float32)
        q = ((qn.to(tl.float32) * cos).to(dt).to(tl.float32) + qnr.to(tl.float32) * sin).to(dt)
        tl.debug_barrier()  # the new keys and values are in the cache before any lane reads them back
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, D], tl.float32)
        n_keys = p0 + T
        for n0 in range(0, n_keys, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            offs = cache + n[:, None] * stride_cl + d[None, :]
            kmask = (n < n_keys)[:, None]
            keys = tl.load(kc_ptr + offs, mask=kmask, other=0.0)
            s = tl.dot(q, tl.trans(keys), input_precision=PRECISION) * scale
            s = tl.where(n[None, :] <= qpos[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            values = tl.load(vc_ptr + offs, mask=kmask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(dt), values, input_precision=PRECISION)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + b * stride_ob + rt[:, None] * stride_ot + head + d[None, :], out.to(dt), mask=rmask)

    def _conv_configs() -> list:
        # (BLOCK_T, BLOCK_N, BLOCK_CI, warps, stages): tensor-core tiles for the wide layers, a 16-column
        # tile for the waveform conv (one output channel).
        shapes = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 32, 4, 4), (128, 128, 32, 4, 4),
                  (256, 128, 32, 8, 3), (256, 16, 64, 4, 3), (128, 16, 32, 4, 4))
        return [triton.Config({"BLOCK_T": bt, "BLOCK_N": bn, "BLOCK_CI": bc}, num_warps=w, num_stages=s)
                for bt, bn, bc, w, s in shapes]

    def _conv_prune(configs: list, named_args: dict, **kwargs) -> list:
        narrow = named_args["N"] <= 16
        kept = [c for c in configs if (c.kwargs["BLOCK_N"] == 16) == narrow
                and c.kwargs["BLOCK_CI"] <= max(16, triton.next_power_of_2(named_args["CIN"]))]
        return kept or configs[:1]

    @triton.autotune(configs=_conv_configs(), prune_configs_by={"early_config_prune": _conv_prune},
                     key=["CIN", "N", "TAPS", "HAS_CACHE", "HAS_RESIDUAL", "KEEP", "ACT", "MANY"])
    @triton.jit(do_not_specialize=["T", "ROWS", "CONTEXT", "DILATION", "PHASES", "MANY"])
    def _conv_kernel(x_ptr, cache_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, act_ptr, alpha_ptr, beta_ptr,
                     CIN, N, T, ROWS, CONTEXT, DILATION, PHASES, stride_xb, stride_xt, stride_cb, MANY,
                     TAPS: tl.constexpr, HAS_CACHE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, KEEP: tl.constexpr,
                     ACT: tl.constexpr, PRECISION: tl.constexpr, F32_DOT: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_CI: tl.constexpr):
        """A causal conv over channels-last x [B, T, CIN] as an implicit GEMM (MANY: only the autotuning key,
        whether the grid is large). Output row t, column n: bias + sum over taps j and input channels ci of
        W[j * CIN + ci, n] * in[t + j * DILATION - CONTEXT, ci], where `in` is x preceded by the CONTEXT rows
        of the cache (or zeros). Column n is output channel n % COUT of output step t * PHASES + n // COUT
        (PHASES > 1: a transposed conv's interleaved phases), so out [B, T * PHASES, COUT] is [B, T, N].
        Then + residual (stored when KEEP), and SnakeBeta(alpha, beta) of that (stored when ACT).
        The GEMM's rows are the ROWS = B * T (stream, step) pairs, BLOCK_T of them per program: a tile spans
        several streams where T is short (a streaming step's first layers have 1-16 steps), so no tile is
        mostly padding. Programs run through the column tiles of a row tile first, so its input rows are read
        from memory once and from the L2 cache for the other column tiles (the late layers' inputs are
        hundreds of MB at large batches; their weights fit the cache)."""
        n_tiles = tl.cdiv(N, BLOCK_N)
        pid = tl.program_id(0)
        r = (pid // n_tiles) * BLOCK_T + tl.arange(0, BLOCK_T)
        n = (pid % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        ci = tl.arange(0, BLOCK_CI)
        dt = x_ptr.dtype.element_ty
        tmask = r < ROWS
        nmask = n < N
        b = (r // T).to(tl.int64)
        t = r % T
        # Tiles of pointers at tap offset 0 and channel chunk 0; each step of the loop adds a scalar.
        x_tile = x_ptr + b[:, None] * stride_xb + t[:, None] * stride_xt + ci[None, :]
        cache_tile = cache_ptr + b[:, None] * stride_cb + t[:, None] * CIN + ci[None, :]
        w_tile = w_ptr + ci[:, None] * N + n[None, :]
        chunks = tl.cdiv(CIN, BLOCK_CI)
        acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
        for i in range(0, TAPS * chunks):  # one loop over (tap, channel chunk), so it pipelines as a whole
            j = i // chunks
            c0 = (i - j * chunks) * BLOCK_CI
            shift = j * DILATION - CONTEXT
            src = t + shift
            cmask = c0 + ci < CIN
            if HAS_CACHE:  # rows before x come from the cache (its row src + CONTEXT): one load either way
                a = tl.load(tl.where((src >= 0)[:, None], x_tile + (shift * stride_xt + c0),
                                     cache_tile + (j * DILATION * CIN + c0)),
                            mask=tmask[:, None] & cmask[None, :], other=0.0)
            else:
                a = tl.load(x_tile + (shift * stride_xt + c0), mask=(tmask & (src >= 0))[:, None] & cmask[None, :],
                            other=0.0)
            w = tl.load(w_tile + (j * CIN + c0) * N, mask=cmask[:, None] & nmask[None, :], other=0.0)
            if F32_DOT:  # Triton's interpreter multiplies bf16 dot operands as raw bits; bf16 products are exact
                acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc, input_precision=PRECISION)
        channel = n % (N // PHASES)
        y = (acc + tl.load(bias_ptr + channel, mask=nmask, other=0.0).to(tl.float32)[None, :]).to(dt)
        offs = r.to(tl.int64)[:, None] * N + n[None, :]  # out is [B, T, N], contiguous
        mask = tmask[:, None] & nmask[None, :]
        if HAS_RESIDUAL:  # rounded as the reference rounds: the conv's output, then the sum
            y = (y.to(tl.float32) + tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(dt)
        if KEEP:
            tl.store(out_ptr + offs, y, mask=mask)
        if ACT:
            alpha = tl.exp(tl.load(alpha_ptr + channel, mask=nmask, other=0.0).to(tl.float32))
            inv_beta = 1.0 / (tl.exp(tl.load(beta_ptr + channel, mask=nmask, other=0.0).to(tl.float32)) + 1e-9)
            yf = y.to(tl.float32)
            s = tl.sin(yf * alpha[None, :])
            tl.store(act_ptr + offs, (yf + inv_beta[None, :] * (s * s)).to(dt), mask=mask)

    @triton.jit
    def _sample_kernel(logits_ptr, u_ptr, top_k_ptr, top_p_ptr, temperature_ptr, out_ptr, V, stride_l, stride_u,
                       BLOCK_V: tl.constexpr):
        row = tl.program_id(0)
        ids = tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + row * stride_l + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        x = x / tl.load(temperature_ptr + row)
        # Thresholds are found by bisection over an order-preserving integer key of the scores' bits: at most
        # 32 halvings of a reduction each, cheaper than a sort.
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        top_k = tl.load(top_k_ptr + row).to(tl.int32)
        if (top_k > 0) & (top_k < V):
            # The k-th largest score: the largest key with at least k keys at or above it (exact, ties kept as
            # top-k keeps them), or any key with exactly k at or above it.
            lo = tl.min(key, 0)
            hi = tl.max(key, 0) + 1
            while hi - lo > 1:
                mid = lo + (hi - lo) // 2
                above = tl.sum((key >= mid).to(tl.int32), 0)
                lo = tl.where(above >= top_k, mid, lo)
                hi = tl.where(above >= top_k, tl.where(above == top_k, mid + 1, hi), mid)
            x = tl.where(key >= lo, x, float("-inf"))
        top_p = tl.load(top_p_ptr + row)
        if top_p < 1.0:
            # transformers' top-p drops the ids whose ascending cumulative probability stays <= 1 - top_p: keep
            # the keys from the smallest one whose mass at or below it exceeds that (ties at it all kept, where
            # the sort-based reference keeps some of them, in its sort's order).
            p = tl.exp(x - tl.max(x, 0))
            limit = (1.0 - top_p) * tl.sum(p, 0)
            lo = tl.min(key, 0)
            hi = tl.max(key, 0)
            while lo < hi:
                mid = lo + (hi - lo) // 2
                below = tl.sum(tl.where(key <= mid, p, 0.0), 0)
                lo = tl.where(below > limit, lo, mid + 1)
                hi = tl.where(below > limit, mid, hi)
            x = tl.where(key >= lo, x, float("-inf"))
        p = tl.exp(x - tl.max(x, 0))
        cdf = tl.cumsum(p, 0)
        u = tl.load(u_ptr + row * stride_u)
        chosen = tl.sum((cdf <= u * tl.sum(p, 0)).to(tl.int32), 0)
        tl.store(out_ptr + row, tl.minimum(chosen, V - 1).to(tl.int64))
