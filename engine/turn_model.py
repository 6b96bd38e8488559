"""Smart Turn v3.2 (end of turn) in plain PyTorch, batched, on the engine's device.

The gateway's ONNX model (int8 QDQ: Whisper Tiny's encoder, attention pooling over time and a small
classifier) costs ~100 ms of CPU a turn in onnxruntime; here the same network runs batched on the GPU.
Everything comes from that ONNX file, found by walking its graph: each MatMul/Gemm/Conv's weight traced
back through its DequantizeLinear to the int8 initializer and dequantized once at load, and the
QuantizeLinear/DequantizeLinear pair on each activation, kept as a fake-quantizer (`FakeQuant`). Those
matter: the float network without them is a different model (|dP| 0.26 on average on the fixtures).
With them it follows the graph's QDQ arithmetic, in float32 (a rounding flip cascades through the coarse
8-bit activations, so P is sensitive to the last bit: half precision is out, and no two implementations,
onnxruntime's own optimised and reference paths included, agree to better than a few hundredths).
The features are the Whisper log-mel of gateway.runtime.smart_turn.log_mel, here in torch on the device.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SECONDS = 8
RATE = 16_000
N_SAMPLES = RATE * SECONDS  # 128_000
N_FFT = 400
HOP = 160
N_MELS = 80
N_FRAMES = N_SAMPLES // HOP  # 800
WIDTH = 384  # Whisper Tiny
FFN = 4 * WIDTH
POSITIONS = N_FRAMES // 2  # conv2's stride halves the frames
GRAPH_BATCHES = (1, 2, 4, 8, 16, 32, 64)  # on a GPU: the batch sizes captured as CUDA graphs


def mel_filters() -> torch.Tensor:
    """Slaney-scale, Slaney-normalised triangular filters from 0 to 8 kHz, [N_MELS, N_FFT // 2 + 1] float32:
    the bank Whisper was trained with, computed in float64 as the gateway's numpy version does."""

    def hz_to_mel(f: torch.Tensor) -> torch.Tensor:
        # linear below 1 kHz, logarithmic above
        return torch.where(f < 1000, 3 * f / 200, 15 + torch.log(f.clamp(min=1e-9) / 1000) * 27 / math.log(6.4))

    def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
        return torch.where(m < 15, 200 * m / 3, 1000 * torch.exp((m - 15) * math.log(6.4) / 27))

    f64 = torch.float64
    lo, hi = (float(hz_to_mel(torch.tensor(f, dtype=f64))) for f in (0.0, RATE / 2))
    edges = mel_to_hz(torch.linspace(lo, hi, N_MELS + 2, dtype=f64))
    bins = torch.linspace(0, RATE / 2, N_FFT // 2 + 1, dtype=f64)
    rising = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = torch.minimum(rising, falling).clamp(min=0)
    return (weights * (2 / (edges[2:] - edges[:-2]))[:, None]).float()


class LogMel(nn.Module):
    """Whisper log-mel features of a batch of 8 s at 16 kHz, [B, 128000] -> [B, 80, 800]: each item
    normalised to zero mean and unit variance, a centred 400-point periodic-Hann STFT every 160 samples
    (reflect padding, the last frame dropped), power through the mel bank, log10, floored 8 below the
    item's maximum, (x + 4) / 4. Float32 throughout: the floor and the log need it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(N_FFT, periodic=True), persistent=False)
        self.register_buffer("filters", mel_filters(), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = audio.float()
        x = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + 1e-7)
        spectrum = torch.stft(x, N_FFT, HOP, window=self.window, center=True, pad_mode="reflect",
                              return_complex=True)[..., :N_FRAMES]
        mel = torch.log10((self.filters @ spectrum.abs().square()).clamp(min=1e-10))
        mel = torch.maximum(mel, mel.amax(dim=(1, 2), keepdim=True) - 8.0)
        return (mel + 4.0) / 4.0


class FakeQuant(nn.Module):
    """A QuantizeLinear/DequantizeLinear pair on an activation, as the ONNX graph has it: x / scale rounded
    half to even, clamped to the integer type's range around the zero point, times scale. Without a scale
    (no such pair in the graph) it passes x through."""

    def __init__(self) -> None:
        super().__init__()
        self.scale, self.lo, self.hi = 0.0, 0.0, 0.0

    def set(self, scale: float, zero: int, qmin: int, qmax: int) -> None:
        self.scale, self.lo, self.hi = scale, float(qmin - zero), float(qmax - zero)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.scale:
            return x
        return torch.round(x / self.scale).clamp_(self.lo, self.hi).mul_(self.scale)


def _quants(*names: str) -> nn.ModuleDict:
    return nn.ModuleDict({name: FakeQuant() for name in names})


def _linear(n_in: int, n_out: int) -> tuple[nn.Parameter, nn.Parameter]:
    """A weight [in, out] (the ONNX MatMul layout: x @ w) and its bias."""
    return nn.Parameter(torch.zeros(n_in, n_out)), nn.Parameter(torch.zeros(n_out))


class EncoderLayer(nn.Module):
    """A pre-LN Whisper encoder block: self-attention (k without bias), then a GELU MLP. The activations are
    fake-quantized where the ONNX graph quantizes them: every matrix product's inputs and its raw output
    (MatMul biases are added after their product's quantization, as the graph does)."""

    QUANTS = ("norm1", "q", "k", "v", "q_scaled", "k_scaled", "v_heads", "scores", "probs", "context",
              "context_in", "out", "norm2", "fc1", "gelu", "fc2")

    def __init__(self, heads: int, scale: float, eps: float) -> None:
        super().__init__()
        self.heads, self.scale = heads, scale  # q and k are each multiplied by head_dim ** -0.25
        self.attn_norm = nn.LayerNorm(WIDTH, eps=eps)
        self.wq, self.bq = _linear(WIDTH, WIDTH)
        self.wk = nn.Parameter(torch.zeros(WIDTH, WIDTH))
        self.wv, self.bv = _linear(WIDTH, WIDTH)
        self.wo, self.bo = _linear(WIDTH, WIDTH)
        self.mlp_norm = nn.LayerNorm(WIDTH, eps=eps)
        self.w1, self.b1 = _linear(WIDTH, FFN)
        self.w2, self.b2 = _linear(FFN, WIDTH)
        self.quant = _quants(*self.QUANTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qt = self.quant
        b, t, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, -1).transpose(1, 2)

        h = qt.norm1(self.attn_norm(x))
        q = qt.q_scaled(heads(qt.q(h @ self.wq) + self.bq) * self.scale)
        k = qt.k_scaled(heads(qt.k(h @ self.wk)) * self.scale)
        v = qt.v_heads(heads(qt.v(h @ self.wv) + self.bv))
        probs = qt.probs(torch.softmax(qt.scores(q @ k.transpose(-1, -2)), dim=-1))
        context = qt.context_in(qt.context(probs @ v).transpose(1, 2).reshape(b, t, WIDTH))
        x = x + qt.out(context @ self.wo) + self.bo
        h = qt.norm2(self.mlp_norm(x))
        h = qt.gelu(F.gelu(qt.fc1(h @ self.w1) + self.b1))
        return x + qt.fc2(h @ self.w2) + self.b2


class SmartTurnNet(nn.Module):
    """Log-mel [B, 80, 800] -> P(turn complete) [B]: Whisper Tiny's encoder (two convolutions, learned
    positions, pre-LN blocks, a final norm), attention pooling over time, a three-layer classifier."""

    QUANTS = ("features", "conv1", "gelu1", "conv2", "norm", "pool1", "tanh", "pool2", "pooled", "cls1",
              "gelu2", "cls2", "gelu3", "cls3")

    def __init__(self, layers: int, heads: int, scale: float, eps: float) -> None:
        super().__init__()
        # the convolutions as products over unfolded frames [C * 3, out]: full float32 on a GPU too,
        # where cuDNN would take TF32 by default and blur the quantizers' rounding
        self.conv1_w, self.conv1_b = _linear(N_MELS * 3, WIDTH)
        self.conv2_w, self.conv2_b = _linear(WIDTH * 3, WIDTH)
        self.positions = nn.Parameter(torch.zeros(POSITIONS, WIDTH))
        self.layers = nn.ModuleList(EncoderLayer(heads, scale, eps) for _ in range(layers))
        self.norm = nn.LayerNorm(WIDTH, eps=eps)
        self.pool1_w, self.pool1_b = _linear(WIDTH, 256)
        self.pool2_w, self.pool2_b = _linear(256, 1)
        self.cls1_w, self.cls1_b = _linear(WIDTH, 256)
        self.cls_norm = nn.LayerNorm(256, eps=eps)
        self.cls2_w, self.cls2_b = _linear(256, 64)
        self.cls3_w, self.cls3_b = _linear(64, 1)
        self.quant = _quants(*self.QUANTS)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        qt = self.quant
        x = qt.conv1(_frames(qt.features(mel).transpose(1, 2), stride=1) @ self.conv1_w + self.conv1_b)
        x = qt.gelu1(F.gelu(x))
        x = F.gelu(qt.conv2(_frames(x, stride=2) @ self.conv2_w + self.conv2_b)) + self.positions
        for layer in self.layers:
            x = layer(x)
        x = qt.norm(self.norm(x))
        weights = torch.softmax(qt.pool2(qt.tanh(torch.tanh(qt.pool1(x @ self.pool1_w) + self.pool1_b))
                                         @ self.pool2_w) + self.pool2_b, dim=1)  # [B, T, 1]: which frames matter
        x = qt.cls1(qt.pooled((weights * x).sum(dim=1)) @ self.cls1_w + self.cls1_b)
        x = qt.cls2(qt.gelu2(F.gelu(self.cls_norm(x))) @ self.cls2_w + self.cls2_b)
        x = qt.cls3(qt.gelu3(F.gelu(x)) @ self.cls3_w + self.cls3_b)
        return torch.sigmoid(x)[:, 0]


def _frames(x: torch.Tensor, stride: int) -> torch.Tensor:
    """[B, T, C] -> [B, T / stride, C * 3]: each output step's 3-tap window (zero padding 1), flattened
    channel-major as a Conv1d weight [out, C, 3] flattens."""
    return F.pad(x, (0, 0, 1, 1)).unfold(1, 3, stride).flatten(2)


class TurnModel:
    """Smart Turn v3.2 on one device: P(turn complete) for a batch of turns' last 8 s.

    Float32 throughout, with torch's default full-precision float32 matmuls (TF32 would move the
    quantizers' rounding). A batch holds its attention probabilities [B, 6, 400, 400]: ~4 MB a turn.
    """

    def __init__(self, net: SmartTurnNet, device: torch.device) -> None:
        self.device = device
        self.features = LogMel().to(device)
        self.net = net.to(device).eval()
        # On a GPU, one CUDA graph per batch size in GRAPH_BATCHES (a batch runs padded to the next): the
        # ~400 small kernels of a batch cost one launch, so the engine's thread, which also runs the TTS
        # steps, spends microseconds per batch rather than milliseconds.
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        if device.type == "cuda":
            self._capture()

    def _run(self, audio: torch.Tensor) -> torch.Tensor:
        return self.net(self.features(audio))

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for size in sorted(GRAPH_BATCHES, reverse=True):  # the largest first: the others fit in its memory
            static = torch.zeros(size, N_SAMPLES, device=self.device)
            warmup = torch.cuda.Stream(self.device)  # cuFFT's plan and the allocations made before capture
            warmup.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(warmup):
                self._run(static)
            torch.cuda.current_stream(self.device).wait_stream(warmup)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._run(static)
            pool = graph.pool()
            self._graphs[size] = (graph, static, out)

    @classmethod
    def from_onnx(cls, path: str | Path, device: str | torch.device = "cpu") -> TurnModel:
        """The model in the Smart Turn v3.2 ONNX file at ``path`` (ValueError for any other file)."""
        import onnx  # only to load: the engine runs without it otherwise

        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read the Smart Turn model {path}: {exc.strerror or exc}") from None
        try:
            proto = onnx.load_from_string(data)
        except Exception as exc:  # onnx raises protobuf's DecodeError and others for a file that is not ONNX
            raise ValueError(f"{path} is not an ONNX model: {exc}") from None
        net = _OnnxGraph(proto, path).build()
        return cls(net, torch.device(device))

    @torch.inference_mode()
    def predict(self, audio: np.ndarray) -> np.ndarray:
        """P(turn complete) for a batch of 16 kHz float32 mono audio, [B, 128000] (8 s each, zeros in front
        when shorter, exactly what gateway.runtime.smart_turn.last_seconds gives) -> float32 [B]."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 2 or audio.shape[1] != N_SAMPLES:
            raise ValueError(f"predict takes [B, {N_SAMPLES}] samples (8 s at 16 kHz), got shape {audio.shape}")
        if not len(audio):
            return np.zeros(0, np.float32)
        x = torch.from_numpy(np.require(audio, requirements=["C", "W"]))
        if not self._graphs:
            return self._run(x.to(self.device)).cpu().numpy()
        out = []
        for chunk in x.split(GRAPH_BATCHES[-1]):
            graph, static, result = self._graphs[next(s for s in GRAPH_BATCHES if s >= len(chunk))]
            static[: len(chunk)].copy_(chunk)
            static[len(chunk) :].zero_()  # silence: its rows are computed and dropped
            graph.replay()
            out.append(result[: len(chunk)].cpu().numpy())
        return np.concatenate(out)


Quant = tuple[float, int, int, int]  # scale, zero point, the integer type's min and max


class _OnnxGraph:
    """The Smart Turn network's weights and activation quantizers, found by walking the ONNX graph rather
    than by tensor names (an exporter renames those freely): every MatMul/Gemm/Conv with a constant weight,
    in graph order, with its bias; the LayerNormalization nodes in order; the attention's structure; and
    the QuantizeLinear/DequantizeLinear pair on each activation, every one of which must be accounted for."""

    def __init__(self, proto: Any, path: Path) -> None:
        from onnx import numpy_helper  # only to load, as in TurnModel.from_onnx

        self.path = path
        self.nodes = list(proto.graph.node)
        self.inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        self.producer = {out: node for node in self.nodes for out in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.quantized: set[str] = set()  # the activation QuantizeLinear nodes given to a FakeQuant

    def fail(self, why: str) -> ValueError:
        return ValueError(f"{self.path} is not the Smart Turn v3.2 model: {why}")

    def const(self, name: str) -> np.ndarray | None:
        """The float value of an initializer, or of a DequantizeLinear of one ((q - zero) * scale, per
        channel along the node's axis); None for a computed tensor."""
        if name in self.inits:
            return self.inits[name].astype(np.float32)
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or node.input[0] not in self.inits:
            return None
        q = self.inits[node.input[0]].astype(np.float64)
        scale = self.inits[node.input[1]].astype(np.float64)
        zero = self.inits[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else 0.0
        if np.size(scale) > 1:  # per channel: the scales (and zero points) run along `axis`
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.size(zero) > 1 else zero
        else:
            scale, zero = np.reshape(scale, ()), np.reshape(zero, ())
        return ((q - zero) * scale).astype(np.float32)

    def source(self, name: str) -> str:
        """The float tensor behind a QuantizeLinear/DequantizeLinear pair (or ``name`` itself)."""
        node = self.producer.get(name)
        if node is not None and node.op_type == "DequantizeLinear":
            quant = self.producer.get(node.input[0])
            if quant is not None and quant.op_type == "QuantizeLinear":
                return quant.input[0]
        return name

    def _pair(self, quant: Any) -> Quant:
        scale, zero = self.inits.get(quant.input[1]), self.inits.get(quant.input[2])
        if scale is None or zero is None or scale.size != 1 or zero.dtype not in (np.uint8, np.int8):
            raise self.fail(f"an activation quantizer {quant.name} that is not per-tensor 8-bit")
        self.quantized.add(quant.name)
        info = np.iinfo(zero.dtype)
        return float(scale.reshape(())), int(zero.reshape(())), int(info.min), int(info.max)

    def quant(self, name: str) -> Quant | None:
        """The QuantizeLinear/DequantizeLinear pair on tensor ``name``, if the graph has one."""
        for quant in self.consumers.get(name, []):
            if quant.op_type == "QuantizeLinear" and any(
                    n.op_type == "DequantizeLinear" for n in self.consumers.get(quant.output[0], [])):
                return self._pair(quant)
        return None

    def quant_in(self, node: Any, i: int) -> Quant | None:
        """The pair that quantizes ``node``'s input ``i``, if it is quantized."""
        dequant = self.producer.get(node.input[i])
        quant = self.producer.get(dequant.input[0]) if dequant and dequant.op_type == "DequantizeLinear" else None
        return self._pair(quant) if quant is not None and quant.op_type == "QuantizeLinear" else None

    def ancestors(self, name: str) -> set[str]:
        """The names of every node that ``name`` is computed from."""
        seen: set[str] = set()
        todo = [name]
        while todo:
            node = self.producer.get(todo.pop())
            if node is not None and node.name not in seen:
                seen.add(node.name)
                todo.extend(node.input)
        return seen

    def weight(self, node: Any, w: np.ndarray) -> np.ndarray:
        """The weight as [in, out] (x @ w): MatMul's already is, Gemm's with transB is [out, in], a Conv1d's
        [out, C, k] becomes [C * k, out] for products over unfolded frames."""
        if node.op_type == "Conv":
            return w.reshape(w.shape[0], -1).T
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
            return w.T
        return w

    def bias(self, node: Any) -> np.ndarray | None:
        """The bias: Gemm's and Conv's third input, or the constant added to a MatMul's (quantized) output."""
        if node.op_type in ("Gemm", "Conv"):
            return self.const(node.input[2]) if len(node.input) > 2 else None
        for user in self.nodes:
            if user.op_type == "Add" and node.output[0] in map(self.source, user.input):
                for name in user.input:
                    value = self.const(name)
                    if value is not None and value.ndim == 1:
                        return value
        return None

    def first_after(self, after: Any, op_type: str) -> Any:
        """The first node of ``op_type`` in graph order that is computed from the node ``after``."""
        for node in self.nodes:
            if node.op_type == op_type and after.name in self.ancestors(node.output[0]):
                return node
        raise self.fail(f"no {op_type} after {after.name}")

    def attention(self, norm: Any, projections: list[tuple[Any, np.ndarray]]) -> tuple[dict[str, Any], ...]:
        """The three projections reading ``norm`` by role (q, k, v), and the scores MatMul (q @ k, feeding
        the Softmax), the Softmax and the MatMul that mixes v with it."""
        if any(self.source(node.input[0]) != norm.output[0] for node, _ in projections):
            raise self.fail(f"the three projections after {norm.name} do not all read it")
        softmax = self.first_after(norm, "Softmax")
        scores = self.producer.get(self.source(softmax.input[0]))
        mixing = next((n for n in self.consumers.get(self.source_quantized(softmax.output[0]), [])
                       if n.op_type == "MatMul"), None)
        if scores is None or scores.op_type != "MatMul" or mixing is None:
            raise self.fail(f"no scaled-dot-product attention after {norm.name}")
        roles: dict[str, Any] = {}
        for role, tensor in (("q", scores.input[0]), ("k", scores.input[1]), ("v", mixing.input[1])):
            found = [node for node, _ in projections if node.name in self.ancestors(tensor)]
            if len(found) != 1:
                raise self.fail(f"cannot tell the attention's {role} projection after {norm.name}")
            roles[role] = found[0]
        return roles, {"scores": scores, "softmax": softmax, "mixing": mixing}

    def source_quantized(self, name: str) -> str:
        """What the consumers of tensor ``name`` read: its DequantizeLinear output when it is quantized."""
        for quant in self.consumers.get(name, []):
            if quant.op_type == "QuantizeLinear":
                return next(n.output[0] for n in self.consumers.get(quant.output[0], [])
                            if n.op_type == "DequantizeLinear")
        return name

    def qk_scale(self, scores: Any) -> float:
        """The constant q (and k) is multiplied by before the scores: head_dim ** -0.25."""
        scaling = self.producer.get(self.source(scores.input[0]))
        values = [c for c in map(self.const, scaling.input) if c is not None] if scaling is not None else []
        if scaling is None or scaling.op_type != "Mul" or len(values) != 1 or values[0].size != 1:
            raise self.fail("the attention's queries are not scaled by a constant")
        return float(values[0].reshape(()))

    def positions(self, conv2: Any) -> np.ndarray:
        """The learned positions: the [400, 384] constant added to the convolutions' output."""
        for node in self.nodes:
            if node.op_type == "Add" and conv2.name in self.ancestors(node.output[0]):
                for name in node.input:
                    value = self.const(name)
                    if value is not None and value.shape == (POSITIONS, WIDTH):
                        return value
        raise self.fail(f"no [{POSITIONS}, {WIDTH}] positions after {conv2.name}")

    def build(self) -> SmartTurnNet:
        weighted = [(n, w) for n in self.nodes if n.op_type in ("MatMul", "Gemm", "Conv")
                    for w in [self.const(n.input[1])] if w is not None]
        norms = [n for n in self.nodes if n.op_type == "LayerNormalization"]
        layers, rest = divmod(len(weighted) - 2 - 5, 6)  # 2 convolutions, 6 per block, pooling and classifier
        if rest or layers < 1 or len(norms) != 2 * layers + 2:
            raise self.fail(f"{len(weighted)} weighted layers and {len(norms)} layer norms")
        block = [(WIDTH, WIDTH)] * 4 + [(WIDTH, FFN), (FFN, WIDTH)]  # MatMul weights are [in, out], Gemm's [out, in]
        expected = [(WIDTH, N_MELS, 3), (WIDTH, WIDTH, 3), *block * layers,
                    (WIDTH, 256), (256, 1), (256, WIDTH), (64, 256), (1, 64)]
        for (node, w), shape in zip(weighted, expected, strict=True):
            if w.shape != shape:
                raise self.fail(f"{node.op_type} {node.name} has a weight of shape {w.shape}, expected {shape}")

        state: dict[str, np.ndarray | None] = {}
        quants: dict[str, Quant | None] = {}

        def linear(name: str, node: Any, w: np.ndarray) -> None:
            state[f"{name}_w"], state[f"{name}_b"] = self.weight(node, w), self.bias(node)

        def norm(prefix: str, node: Any) -> None:
            state[f"{prefix}.weight"], state[f"{prefix}.bias"] = map(self.const, node.input[1:3])

        (conv1, _), (conv2, _) = weighted[:2]
        linear("conv1", *weighted[0])
        linear("conv2", *weighted[1])
        state["positions"] = self.positions(conv2)
        quants |= {"quant.features": self.quant_in(conv1, 0), "quant.conv1": self.quant(conv1.output[0]),
                   "quant.gelu1": self.quant_in(conv2, 0), "quant.conv2": self.quant(conv2.output[0])}
        scale = None
        for i in range(layers):
            p = f"layers.{i}."
            projections, (out, wo), (fc1, w1), (fc2, w2) = weighted[2 + 6 * i : 5 + 6 * i], *weighted[5 + 6 * i:][:3]
            attn_norm, mlp_norm = norms[2 * i : 2 * i + 2]
            roles, attn = self.attention(attn_norm, projections)
            if attn["mixing"].name not in self.ancestors(out.input[0]):
                raise self.fail(f"the attention's output projection is not {out.name}")
            weights = {node.name: w for node, w in projections}
            for role, node in roles.items():
                state[f"{p}w{role}"] = weights[node.name]
                state[f"{p}b{role}"] = self.bias(node)
            state[f"{p}wo"], state[f"{p}bo"] = wo, self.bias(out)
            state[f"{p}w1"], state[f"{p}b1"] = w1, self.bias(fc1)
            state[f"{p}w2"], state[f"{p}b2"] = w2, self.bias(fc2)
            norm(f"{p}attn_norm", attn_norm)
            norm(f"{p}mlp_norm", mlp_norm)
            scores, mixing = attn["scores"], attn["mixing"]
            scale = self.qk_scale(scores)
            p += "quant."
            quants |= {
                f"{p}norm1": self.quant(attn_norm.output[0]),
                **{f"{p}{role}": self.quant(node.output[0]) for role, node in roles.items()},
                f"{p}q_scaled": self.quant_in(scores, 0), f"{p}k_scaled": self.quant_in(scores, 1),
                f"{p}v_heads": self.quant_in(mixing, 1), f"{p}scores": self.quant(scores.output[0]),
                f"{p}probs": self.quant_in(mixing, 0), f"{p}context": self.quant(mixing.output[0]),
                f"{p}context_in": self.quant_in(out, 0), f"{p}out": self.quant(out.output[0]),
                f"{p}norm2": self.quant(mlp_norm.output[0]), f"{p}fc1": self.quant(fc1.output[0]),
                f"{p}gelu": self.quant_in(fc2, 0), f"{p}fc2": self.quant(fc2.output[0]),
            }
        head = weighted[2 + 6 * layers :]
        (pool1, _), (pool2, _), (cls1, _), (cls2, _), (cls3, _) = head
        for name, (node, w) in zip(("pool1", "pool2", "cls1", "cls2", "cls3"), head, strict=True):
            linear(name, node, w)
        norm("norm", norms[-2])
        norm("cls_norm", norms[-1])
        quants |= {"quant.norm": self.quant(norms[-2].output[0]), "quant.pool1": self.quant(pool1.output[0]),
                   "quant.tanh": self.quant_in(pool2, 0), "quant.pool2": self.quant(pool2.output[0]),
                   "quant.pooled": self.quant_in(cls1, 0), "quant.cls1": self.quant(cls1.output[0]),
                   "quant.gelu2": self.quant_in(cls2, 0), "quant.cls2": self.quant(cls2.output[0]),
                   "quant.gelu3": self.quant_in(cls3, 0), "quant.cls3": self.quant(cls3.output[0])}
        unknown = {n.name for n in self.nodes if n.op_type == "QuantizeLinear"} - self.quantized
        if unknown:
            raise self.fail(f"activations quantized where this network has no quantizer: {sorted(unknown)[:5]}")

        head_dim = round(scale ** -4)
        if WIDTH % head_dim:
            raise self.fail(f"an attention scale of {scale}")
        net = SmartTurnNet(layers, WIDTH // head_dim, scale, eps=self.epsilon(norms[0]))
        try:
            net.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()
                                 if v is not None})
        except RuntimeError as exc:  # a bias missing or extra, a norm of the wrong width
            raise self.fail(str(exc)) from None
        for name, q in quants.items():
            if q is not None:
                net.get_submodule(name).set(*q)
        return net

    @staticmethod
    def epsilon(norm: Any) -> float:
        return next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
