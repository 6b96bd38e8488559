"""engine.kernels' fused kernels against their PyTorch references (the code the model runs without them).

On a GPU the kernels run there; without one they run in Triton's interpreter (conftest sets
TRITON_INTERPRET=1 before Triton is imported), so every test here runs in CI too. Inputs are random and
drawn afresh per case; outputs are poisoned first, so a lane a kernel fails to write shows up.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine import checkpoint, kernels
from engine.runner import synthesize
from engine.sampling import SamplingParams, choose
from tests.paths import TINY_CHECKPOINT

pytestmark = pytest.mark.skipif(kernels.triton is None, reason="Triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIXTURE = TINY_CHECKPOINT


@pytest.fixture(autouse=True)
def on_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op takes its kernel path, also for CPU tensors (in the interpreter)."""
    monkeypatch.setattr(kernels, "available", lambda x: kernels.triton is not None)


@pytest.fixture(autouse=True)
def exact_float32_references():
    """float32 references in float32 on a GPU: cuDNN's convolutions default to TF32 (a 1x1 conv is a TF32
    GEMM there), 10 mantissa bits against the kernels' full float32 products."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def reference(fn, *args, **kwargs):
    """fn's PyTorch path."""
    kernels.set_enabled(False)
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(kernels, "available", lambda x: False)
            return fn(*args, **kwargs)
    finally:
        kernels.set_enabled(True)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


# Relative error allowed: float32 differs by summation order only; bfloat16 by an ulp where a rounding flips
# (more in Triton's interpreter, whose bf16 conversion does not round to nearest).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2 if DEVICE == "cuda" else 3e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])


@DTYPES
@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 96)])
def test_rms_norm(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w = randn(*shape, dtype=dtype), (1 + 0.1 * randn(shape[-1])).to(dtype)
    assert rel(kernels.rms_norm(x, w, 1e-6), kernels.rms_norm_reference(x, w, 1e-6)) < TOLERANCE[dtype]


@DTYPES
def test_silu_mul(dtype: torch.dtype) -> None:
    x = randn(2, 3, 2 * 80, dtype=dtype)
    assert rel(kernels.silu_mul(x), kernels.silu_mul_reference(x)) < TOLERANCE[dtype]


@pytest.mark.parametrize("rows", [1, 3])  # the matrix-vector kernel, and cuBLAS with fused norm and SiLU kernels
@pytest.mark.parametrize("fusion", ["plain", "norm", "silu", "residual", "norm+residual"])
@DTYPES
def test_linear(rows: int, fusion: str, dtype: torch.dtype) -> None:
    k, n = 96, 40
    weight = (randn(n, k) / k**0.5).to(dtype)
    x = randn(rows, 1, 2 * k if "silu" in fusion else k, dtype=dtype)
    norm = ((1 + 0.1 * randn(k)).to(dtype), 1e-6) if "norm" in fusion else None
    residual = randn(rows, 1, n, dtype=dtype) if "residual" in fusion else None
    got = kernels.linear(x, weight, norm=norm, silu="silu" in fusion, residual=residual)
    want = kernels.linear_reference(x, weight, norm=norm, silu="silu" in fusion, residual=residual)
    assert got.shape == want.shape
    assert rel(got, want) < TOLERANCE[dtype]


def test_linear_reads_a_strided_row() -> None:
    """The code predictor projects the last of two positions: rows with a stride of two positions."""
    x, weight = randn(2, 2, 64), randn(32, 64)
    norm = (1 + 0.1 * randn(64), 1e-6)
    kernels.GEMV_MAX_ROWS, limit = 2, kernels.GEMV_MAX_ROWS
    try:
        got = kernels.linear(x[:, -1], weight, norm=norm)
    finally:
        kernels.GEMV_MAX_ROWS = limit
    assert rel(got, kernels.linear_reference(x[:, -1], weight, norm=norm)) < 1e-5


def attention_case(b: int, t: int, start: int, with_pos: bool, dtype: torch.dtype, heads: int = 4,
                   kv_heads: int = 2, d: int = 16, max_len: int = 40):
    """A cache holding random history, and the fused projection's output for t new positions per row."""
    qkv = randn(b, t, (heads + 2 * kv_heads) * d, dtype=dtype)
    cache = (randn(b + 1, kv_heads, max_len, d, dtype=dtype), randn(b + 1, kv_heads, max_len, d, dtype=dtype))
    q_norm, k_norm = (1 + 0.1 * randn(d)).to(dtype), (1 + 0.1 * randn(d)).to(dtype)
    qk_norm = torch.cat([q_norm.expand(heads, -1), k_norm.expand(kv_heads, -1)])
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
    angles = torch.outer(torch.arange(max_len, device=DEVICE).float(), inv_freq)
    emb = torch.cat([angles, angles], -1)
    sign = torch.cat([-torch.ones_like(inv_freq), torch.ones_like(inv_freq)])
    rope = (emb.cos().to(dtype), (emb.sin() * sign).to(dtype))
    pos = torch.randint(0, max_len - t, (b,), device=DEVICE) if with_pos else None
    return qkv, q_norm, k_norm, qk_norm, rope, cache, pos


@DTYPES
@pytest.mark.parametrize("b,t,start,with_pos", [(3, 1, 0, True), (2, 2, 0, False), (2, 1, 7, False),
                                                (1, 1, 0, True)])
def test_decode_attention(b: int, t: int, start: int, with_pos: bool, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("Triton's interpreter multiplies bf16 tl.dot operands as raw bits (checked on a GPU)")
    qkv, q_norm, k_norm, qk_norm, rope, (k, v), pos = attention_case(b, t, start, with_pos, dtype)
    k_ref, v_ref = k.clone(), v.clone()
    got = kernels.decode_attention(qkv, q_norm, k_norm, qk_norm, 1e-6, rope, k, v, start, pos, 4)
    want = kernels.decode_attention_reference(qkv, qk_norm, 1e-6, rope, k_ref, v_ref, start, pos, 4)
    # bfloat16: the kernel rounds the attention weights to bf16 for the second product, as flash kernels do.
    assert rel(got, want) < 2 * TOLERANCE[dtype]
    # The new keys and values landed where the reference put them, and nothing else moved.
    assert rel(k, k_ref) < TOLERANCE[dtype] and torch.equal(v, v_ref)


@DTYPES
@pytest.mark.parametrize("b,t", [(1, 1), (3, 5), (2, 16)])
def test_qk_norm_rope(b: int, t: int, dtype: torch.dtype) -> None:
    """A prompt's q and k heads normalised and rotated in one kernel, as the reference's passes round them."""
    qkv, _, _, qk_norm, (cos, sin), _, _ = attention_case(b, t, 0, False, dtype)
    got = kernels.qk_norm_rope(qkv, qk_norm, 1e-6, cos[:t, None], sin[:t, None])
    want = kernels.qk_norm_rope_reference(qkv, qk_norm, 1e-6, cos[:t, None], sin[:t, None])
    assert got.shape == want.shape == (b, t, qk_norm.shape[0], qk_norm.shape[1])
    assert rel(got, want) < TOLERANCE[dtype]


def conv_case(b: int, t: int, cin: int, cout: int, k: int, dtype: torch.dtype, stride: int = 0):
    """Input [b, t, cin], a conv's (stride 0) or a transposed conv's weight with a bias, and SnakeBeta's."""
    shape = (cin, cout, k) if stride else (cout, cin, k)
    weight = (randn(*shape) / (cin * k) ** 0.5).to(dtype)
    act = ((0.3 * randn(cout)).to(dtype), (0.3 * randn(cout)).to(dtype))
    return 3 * randn(b, t, cin, dtype=dtype), weight, (0.1 * randn(cout)).to(dtype), act


def poisoned_cache(b: int, context: int, cin: int, dtype: torch.dtype, rows: int = 3) -> torch.Tensor:
    """A cache that is a view of a wider buffer (as engine.codec's CodecState holds them), random history."""
    memory = torch.full((b + 1, rows * context * cin + 8), float("nan"), device=DEVICE).to(dtype)
    cache = memory[:b, 8 : 8 + context * cin].view(b, context, cin)
    cache.copy_(randn(b, context, cin, dtype=dtype))
    return cache


@DTYPES
@pytest.mark.parametrize("k,dilation", [(7, 3), (3, 1), (1, 1)])
@pytest.mark.parametrize("t,cached", [(40, False), (40, True), (5, True)], ids=["padded", "cached", "short"])
@pytest.mark.parametrize("fusion", ["plain", "act", "residual+act, not kept"])
def test_causal_conv(k: int, dilation: int, t: int, cached: bool, fusion: str, dtype: torch.dtype) -> None:
    """One kernel: the left context read from the cache (or zeros; 'short': fewer new steps than the
    context), bias, residual and SnakeBeta in the epilogue; the cache then holds the last inputs."""
    x, weight, bias, act = conv_case(2, t, 24, 40 if "residual" not in fusion else 24, k, dtype)
    context = (k - 1) * dilation
    cache = poisoned_cache(2, context, 24, dtype) if cached and context else None
    cache_ref = None if cache is None else cache.clone()
    residual = randn(2, t, 24, dtype=dtype) if "residual" in fusion else None
    snake = act if "act" in fusion else None
    keep = "not kept" not in fusion
    out, activated = kernels.causal_conv(x, kernels.pack_conv(weight), bias, k, dilation, cache, residual, snake, keep)
    want, want_activated = kernels.causal_conv_reference(x, weight, bias, dilation, cache_ref, residual, snake, keep)
    assert (out is None) == (want is None) and (activated is None) == (want_activated is None)
    if out is not None:
        assert out.shape == want.shape and rel(out, want) < TOLERANCE[dtype]
    if activated is not None:
        assert rel(activated, want_activated) < TOLERANCE[dtype]
    if cache is not None:
        assert torch.equal(cache, cache_ref)


@DTYPES
@pytest.mark.parametrize("k,stride", [(16, 8), (6, 3), (2, 2), (5, 3)])
@pytest.mark.parametrize("cached", [False, True])
def test_causal_conv_transpose(k: int, stride: int, cached: bool, dtype: torch.dtype) -> None:
    """Each frame's taps and the previous frame's spill in one GEMM, the output phases interleaved."""
    x, weight, bias, act = conv_case(2, 6, 24, 20, k, dtype, stride=stride)
    cache = poisoned_cache(2, 1, 24, dtype) if cached and k > stride else None
    cache_ref = None if cache is None else cache.clone()
    out, activated = kernels.causal_conv_transpose(x, kernels.pack_conv_transpose(weight, stride), bias, stride,
                                                   cache, act)
    want, want_activated = kernels.causal_conv_transpose_reference(x, weight, bias, stride, cache_ref, act)
    assert out.shape == want.shape == (2, 6 * stride, 20)
    assert rel(out, want) < TOLERANCE[dtype] and rel(activated, want_activated) < TOLERANCE[dtype]
    if cache is not None:
        assert torch.equal(cache, cache_ref)


GPU_ONLY = pytest.mark.skipif(DEVICE == "cpu", reason="configs apply to compiled kernels (the interpreter runs "
                              "its own large blocks)")


@GPU_ONLY
@pytest.mark.parametrize("config", range(len(kernels._conv_configs())) if kernels.triton else [])
def test_every_conv_config(config: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each autotuning candidate of the conv kernel gives the reference's result (the tests above run one
    config per shape): streams shorter than a tile (a tile spans several) and a cache longer than the input,
    then a transposed conv."""
    monkeypatch.setattr(kernels._conv_kernel, "configs", [kernels._conv_configs()[config]])
    dtype = torch.bfloat16
    x, weight, bias, act = conv_case(5, 3, 24, 24, 7, dtype)
    cache = poisoned_cache(5, 18, 24, dtype)
    cache_ref, residual = cache.clone(), randn(5, 3, 24, dtype=dtype)
    out, activated = kernels.causal_conv(x, kernels.pack_conv(weight), bias, 7, 3, cache, residual, act)
    want, want_activated = kernels.causal_conv_reference(x, weight, bias, 3, cache_ref, residual, act)
    assert rel(out, want) < TOLERANCE[dtype] and rel(activated, want_activated) < TOLERANCE[dtype]
    assert torch.equal(cache, cache_ref)
    x, weight, bias, act = conv_case(3, 2, 24, 20, 16, dtype, stride=8)
    out, activated = kernels.causal_conv_transpose(x, kernels.pack_conv_transpose(weight, 8), bias, 8, None, act)
    want, want_activated = kernels.causal_conv_transpose_reference(x, weight, bias, 8, None, act)
    assert rel(out, want) < TOLERANCE[dtype] and rel(activated, want_activated) < TOLERANCE[dtype]


@GPU_ONLY
@pytest.mark.parametrize("config", range(len(kernels._gemv_configs())) if kernels.triton else [])
def test_every_gemv_config(config: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each autotuning candidate of the matrix-vector kernel, with its RMSNorm prologue and residual."""
    monkeypatch.setattr(kernels._gemv_kernel, "configs", [kernels._gemv_configs()[config]])
    dtype = torch.bfloat16
    weight, x, residual = (randn(40, 2500) / 50).to(dtype), randn(2, 1, 2500, dtype=dtype), randn(2, 1, 40, dtype=dtype)
    norm = ((1 + 0.1 * randn(2500)).to(dtype), 1e-6)
    got = kernels.linear(x, weight, norm=norm, residual=residual)
    assert rel(got, kernels.linear_reference(x, weight, norm=norm, residual=residual)) < TOLERANCE[dtype]


def test_causal_conv_matches_the_official_padding() -> None:
    """The reference itself: zeros on the left, then torch's conv (the official CausalConvNet)."""
    x, weight, bias, _ = conv_case(2, 30, 8, 5, 7, torch.float32)
    want = torch.nn.functional.conv1d(torch.nn.functional.pad(x.transpose(1, 2), (18, 0)), weight, bias, dilation=3)
    out, _ = kernels.causal_conv_reference(x, weight, bias, 3, None)
    assert rel(out.transpose(1, 2), want) < 1e-6
    x, weight, bias, _ = conv_case(2, 6, 8, 5, 16, torch.float32, stride=8)
    want = torch.nn.functional.conv_transpose1d(x.transpose(1, 2), weight, bias, stride=8)[..., :-8]
    out, _ = kernels.causal_conv_transpose_reference(x, weight, bias, 8, None)
    assert rel(out.transpose(1, 2), want) < 1e-6


@pytest.mark.parametrize(("top_k", "top_p", "ties"), [(0, 1.0, False), (5, 1.0, False), (0, 1.0, True),
                                                     (5, 1.0, True), (0, 0.7, False), (20, 0.9, False)])
def test_sample_matches_choose(top_k: int, top_p: float, ties: bool) -> None:
    """Ties at the k-th score stay in, as torch.topk's threshold keeps them; -inf scores (suppressed ids)
    are never drawn. (Ties at top-p's boundary stay in too, where the reference drops some of them in its
    sort's arbitrary order: not compared.)"""
    logits = torch.randint(-3, 4, (16, 100), device=DEVICE).float() if ties else 3 * randn(16, 100)
    logits[:, 90:] = float("-inf")
    u = torch.rand(16, device=DEVICE)
    got = choose(logits, True, top_k, top_p, 0.9, u)
    want = reference(choose, logits, True, top_k, top_p, 0.9, u)
    # The inverse-CDF draw may land on the other side of a boundary by rounding: rare, never wholesale.
    assert (got == want).float().mean() >= 0.9
    assert (got < 90).all()


def test_sample_takes_each_rows_own_parameters() -> None:
    """One batch, every row with its own temperature, top-k and top-p (streams of several requests): the
    same ids as each row sampled alone through the PyTorch code."""
    logits = 3 * randn(12, 300)
    u = torch.rand(12, device=DEVICE)
    top_k = torch.tensor([0, 1, 5, 50, 0, 300, 7, 0, 2, 40, 0, 10], device=DEVICE).float()
    top_p = torch.tensor([1.0, 1.0, 0.5, 0.9, 0.3, 1.0, 0.99, 0.05, 1.0, 0.8, 0.6, 1.0], device=DEVICE)
    temperature = torch.tensor([0.9, 1.0, 0.5, 1.3, 0.7, 2.0, 0.2, 1.0, 0.9, 0.6, 1.1, 0.8], device=DEVICE)
    got = choose(logits, True, top_k, top_p, temperature, u)
    alone = [reference(choose, logits[i:i + 1], True, int(top_k[i]), float(top_p[i]), float(temperature[i]),
                       u[i:i + 1]).item() for i in range(12)]
    assert got.tolist() == alone
    assert got[1] == logits[1].argmax()  # top-k 1 is greedy


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_codes_through_the_kernels_equal_the_official() -> None:
    """The whole frame step (projections, attention, norms, SiLU) through the kernels, on the tiny parity
    checkpoint: the official greedy codes, frame for frame."""
    ckpt = checkpoint.load(str(FIXTURE), device=DEVICE, dtype="float32")
    prompt = json.loads((FIXTURE / "references.json").read_text())["prompts"][0]
    params = SamplingParams.from_generation_config(ckpt.generation, greedy=True)
    codes, _ = synthesize(ckpt, prompt["speaker"], prompt["language"], prompt["text"], params,
                          max_frames=4)  # the first frame, and three through the KV cache
    assert codes.tolist() == prompt["codes"][:4]


def test_self_test_passes_and_names_a_broken_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine checks the kernels at start-up and runs its PyTorch code if one fails."""
    assert kernels.self_test(torch.device(DEVICE), torch.float32) is None

    def broken(*args, **kwargs):
        raise RuntimeError("no such GPU")

    monkeypatch.setattr(kernels, "causal_conv", broken)
    assert kernels.self_test(torch.device(DEVICE), torch.float32).startswith("causal_conv: RuntimeError")
