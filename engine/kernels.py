"""Fused GPU kernels (Triton) for the engine's per-frame work, each beside the PyTorch code it replaces.

A frame at batch 1 is over a hundred decoder-layer passes (28 talker layers, then 15 code-predictor steps of
5 layers) that read ~3.3 GB of weights: about 0.75 ms of memory traffic on an H200. Written as PyTorch ops a
layer is ~20 kernels of a few microseconds each, so the step is bound by kernel count, not bytes. Here a
layer is five kernels: the q/k/v projection with its RMSNorm fused in front, one attention kernel (q/k
norms, RoPE, the KV-cache write and the attention itself), the output projection with the residual add
fused behind, the gate/up projection with its RMSNorm, and the down projection with SiLU*up in front and
the residual behind. The projections are matrix-vector kernels at batch 1 (cuBLAS' GEMMs take ~6 us for
1-3 us of weights there); larger batches keep cuBLAS with the norms and SiLU fused into one kernel each.
The codec decoder's SnakeBeta and the samplers' top-k draw are one kernel each too.

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
# Rows up to which a projection runs as the matrix-vector kernel; above it cuBLAS' GEMMs win
# (scripts/bench_kernels.py on an H200).
GEMV_MAX_ROWS = 2
_enabled = True


def set_enabled(enabled: bool) -> None:
    """Fused kernels on (the default) or off (every op takes its PyTorch path; for A/B measurements)."""
    global _enabled
    _enabled = enabled


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
    waveform = randn(2, 8, 300), randn(1, 8, 7), randn(1)
    checks = {
        "linear": (lambda: linear(x, w, norm=norm), lambda: linear_reference(x, w, norm=norm)),
        "decode_attention": (
            lambda: decode_attention(qkv, qn, kn, torch.cat([qn.expand(4, -1), kn.expand(2, -1)]), 1e-6, rope,
                                     cache[0].clone(), cache[1].clone(), 0, pos, 4),
            lambda: decode_attention_reference(qkv, torch.cat([qn.expand(4, -1), kn.expand(2, -1)]), 1e-6, rope,
                                               cache[0].clone(), cache[1].clone(), 0, pos, 4)),
        "snake_beta": (lambda: snake_beta(waveform[0], qn[:8], kn[:8]),
                       lambda: snake_beta_reference(waveform[0], qn[:8], kn[:8])),
        "conv1d_to_one": (lambda: conv1d_to_one(*waveform), lambda: F.conv1d(*waveform)),
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
        _gemv_kernel[lambda c: (triton.cdiv(n, c["BLOCK_N"]),)](*args, **meta)
    shape = residual.shape if residual is not None else (*x.shape[:-1], n)
    return out.view(shape)


# --- Attention of decode steps ------------------------------------------------------------------------


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x2, x1) = roll(x) * sign: three kernels."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def decode_attention_reference(qkv: torch.Tensor, qk_norm: torch.Tensor, eps: float,
                               rope: tuple[torch.Tensor, torch.Tensor], cache_k: torch.Tensor,
                               cache_v: torch.Tensor, start: int, pos: torch.Tensor | None,
                               heads: int) -> torch.Tensor:
    b, t, _ = qkv.shape
    g, d = cache_k.shape[1], cache_k.shape[3]
    h = heads
    qkv = qkv.view(b, t, h + 2 * g, d)
    cos, sin = rope
    if pos is None:
        cos, sin = cos[start:start + t, None], sin[start:start + t, None]
    else:
        cos, sin = cos[pos][:, None, None], sin[pos][:, None, None]
    # q and k heads normalised and rotated together: the same arithmetic as one head at a time.
    qk = rotate(F.rms_norm(qkv[:, :, :h + g], (d,), eps=eps) * qk_norm, cos, sin)
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


# --- Codec and sampling --------------------------------------------------------------------------------


def snake_beta_reference(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    # float32 whatever x's dtype: in bf16 the sine of a large argument is meaningless, and 1/e^beta amplifies it.
    xf = x.float()
    inv_beta = 1.0 / (beta.float().exp()[:, None] + 1e-9)
    return (xf + inv_beta * torch.sin(xf * alpha.float().exp()[:, None]).pow(2)).to(x.dtype)


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """x + sin^2(x * e^alpha) / e^beta per channel, x [B, C, T]: one pass in float32 registers."""
    if not available(x) or not x.is_contiguous():
        return snake_beta_reference(x, alpha, beta)
    out = torch.empty_like(x)
    n, block = x.numel(), 1024
    _snake_beta_kernel[(triton.cdiv(n, block),)](x, alpha, beta, out, n, x.shape[1], x.shape[2], BLOCK=block)
    return out


def conv1d_to_one(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """F.conv1d(x, weight, bias) for one output channel (the codec's last layer, C -> waveform): x [B, C, L],
    weight [1, C, K] -> [B, 1, L - K + 1]. cuDNN runs this shape on a slow fallback (~3 ms for 64 streams'
    packets); here each output sample is one dot product over C x K inputs that stay in cache."""
    b, c, length = x.shape
    k = weight.shape[-1]
    if not available(x) or not x.is_contiguous():
        return F.conv1d(x, weight, bias)
    out = torch.empty(b, 1, length - k + 1, dtype=x.dtype, device=x.device)
    block = 256
    _conv1d_to_one_kernel[(b, triton.cdiv(length - k + 1, block))](x, weight.contiguous(), bias, out, c, length,
                                                                   K=k, BLOCK=block)
    return out


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
        # autotuning chose on an H200 from a wider space, scripts/bench_kernels.py).
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

    @triton.jit
    def _snake_beta_kernel(x_ptr, alpha_ptr, beta_ptr, out_ptr, n, C, T, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        c = (offs // T) % C
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        alpha = tl.exp(tl.load(alpha_ptr + c, mask=mask, other=0.0).to(tl.float32))
        inv_beta = 1.0 / (tl.exp(tl.load(beta_ptr + c, mask=mask, other=0.0).to(tl.float32)) + 1e-9)
        s = tl.sin(x * alpha)
        tl.store(out_ptr + offs, (x + inv_beta * (s * s)).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _conv1d_to_one_kernel(x_ptr, w_ptr, b_ptr, out_ptr, C, L, K: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        n = L - K + 1
        acc = tl.zeros([BLOCK], tl.float32)
        for c in range(0, C):
            x_c = x_ptr + (row * C + c) * L
            for k in tl.static_range(K):
                w = tl.load(w_ptr + c * K + k).to(tl.float32)
                acc += w * tl.load(x_c + t + k, mask=t < n, other=0.0).to(tl.float32)
        acc += tl.load(b_ptr).to(tl.float32)
        tl.store(out_ptr + row * n + t, acc.to(out_ptr.dtype.element_ty), mask=t < n)

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
