"""Silero VAD v6 (16 kHz) in plain PyTorch, batched, on the engine's device.

The gateway runs the same network in onnxruntime, one process per worker; on a GPU host its engine
processes run every worker's windows here instead, in one batch per turn of their VAD thread
(engine.process). The weights come from ``silero_vad.jit``, the TorchScript model the silero-vad wheel
ships beside its ONNX file, which it matches (the wheel's safetensors file holds other weights). One step
takes a window of 512 new samples after 64 of context (576 in all) and the LSTM's state [2, B, 128] (h, c),
and gives P(speech) and the next state: the ONNX model's interface, so a gateway can move a session's
state between the two at any window.

Every layer is a float32 matmul (a convolution as a matmul over its unfolded input) because torch's
float32 matmuls are full precision by default, where cuDNN's convolutions may use TF32 on a GPU: the
probabilities stay within float rounding of onnxruntime's (tests/engine/test_vad_model.py).

On a GPU a step is one CUDA graph replay (per batch size in GRAPH_ROWS, a batch padded to the next): the
~25 kernels of a step, launched one by one, cost the VAD's thread more CPU than everything else it does, and
the GIL they hold slows the engine's TTS steps. The graphs are captured and replayed on the VAD's own stream:
captured on torch's default capture stream, they shared its cuBLAS workspace with the TTS graphs, and two
of them running at once hung an engine process on an H200 within seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

WINDOW = 512
CONTEXT = 64
SAMPLES = CONTEXT + WINDOW  # one step's input
HIDDEN = 128
N_FFT, HOP, REFLECT = 256, 128, 64
BINS = N_FFT // 2 + 1
# Batch sizes with a CUDA graph of their own; a larger batch runs in pieces of the largest. Streams are
# independent rows, so the padding rows (whatever the last batch left there) change no stream's result.
GRAPH_ROWS = (16, 32, 64, 128, 256, 512, 1024)


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
    """Conv1d with kernel 3 and padding 1 over x [B, T, C_in] -> [B, T', C_out], as one matmul."""
    frames = torch.nn.functional.pad(x, (0, 0, 1, 1)).unfold(1, 3, stride)  # [B, T', C_in, 3]
    return frames.flatten(2) @ weight.flatten(1).T + bias


class SileroNet(torch.nn.Module):
    # this module's weights, by their names in the TorchScript model's 16 kHz branch
    NAMES = {"stft": "stft.forward_basis_buffer",
             "lstm_ih": "decoder.rnn.weight_ih", "lstm_hh": "decoder.rnn.weight_hh",
             "lstm_ih_bias": "decoder.rnn.bias_ih", "lstm_hh_bias": "decoder.rnn.bias_hh",
             "final": "decoder.decoder.2.weight", "final_bias": "decoder.decoder.2.bias",
             **{f"conv{i + 1}{part}": f"encoder.{i}.reparam_conv.{kind}" for i in range(4)
                for part, kind in (("", "weight"), ("_bias", "bias"))}}

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, tensor in weights.items():
            self.register_buffer(name, tensor.detach().float().contiguous())

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.nn.functional.pad(x[:, None], (0, REFLECT), mode="reflect")[:, 0]
        spectrum = x.unfold(1, N_FFT, HOP) @ self.stft[:, 0].T  # [B, 4, 2 * BINS]: real, imaginary
        h = (spectrum[..., :BINS] ** 2 + spectrum[..., BINS:] ** 2).sqrt()
        h = _conv(h, self.conv1, self.conv1_bias, 1).relu()
        h = _conv(h, self.conv2, self.conv2_bias, 2).relu()
        h = _conv(h, self.conv3, self.conv3_bias, 2).relu()
        h = _conv(h, self.conv4, self.conv4_bias, 1).relu()[:, 0]  # [B, 128]: one frame is left
        gates = h @ self.lstm_ih.T + self.lstm_ih_bias + state[0] @ self.lstm_hh.T + self.lstm_hh_bias
        i, f, g, o = gates.chunk(4, dim=1)
        c = f.sigmoid() * state[1] + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        p = (h.relu() @ self.final[:, :, 0].T + self.final_bias).sigmoid()[:, 0]
        return p, torch.stack((h, c))


class _Graph:
    """One batch size's graph, its input and output on the device, and their pinned copies on the host."""

    def __init__(self, net: SileroNet, rows: int, stream: torch.cuda.Stream, pool: tuple[int, int] | None) -> None:
        device = stream.device
        self.x = torch.zeros(rows, SAMPLES, device=device)
        self.state = torch.zeros(2, rows, HIDDEN, device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # cuBLAS's workspace for this stream, allocated before the capture
            net(self.x, self.state)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            p, new_state = net(self.x, self.state)
            self.out = torch.cat((p, new_state.flatten()))
        self.host_x = torch.zeros(self.x.shape, pin_memory=True)
        self.host_state = torch.zeros(self.state.shape, pin_memory=True)
        self.host_out = torch.zeros(self.out.shape, pin_memory=True)
        self.done = torch.cuda.Event(blocking=True)

    def run(self, x: np.ndarray, state: np.ndarray, probs: np.ndarray, new_state: np.ndarray) -> None:
        """Steps ``len(x)`` streams (at most this graph's rows) into ``probs`` and ``new_state``."""
        rows, size = len(x), len(self.x)
        self.host_x.numpy()[:rows] = x
        self.host_state.numpy()[:, :rows] = state
        self.x.copy_(self.host_x, non_blocking=True)
        self.state.copy_(self.host_state, non_blocking=True)
        self.graph.replay()
        self.host_out.copy_(self.out, non_blocking=True)
        # Waited for asleep: a plain .cpu() spins a core until the kernels are done.
        self.done.record()
        self.done.synchronize()
        out = self.host_out.numpy()
        probs[:] = out[:rows]
        new_state[:] = out[size:].reshape(2, size, HIDDEN)[:, :rows]


class VadModel:
    """The network on one device; ``infer`` may run beside the engine's other work (on a GPU, as CUDA graphs
    on a stream of its own)."""

    def __init__(self, net: SileroNet, device: torch.device) -> None:
        self.device = device
        self.net = net.to(device).eval()
        self._graphs: dict[int, _Graph] = {}
        if device.type == "cuda":
            self._stream = torch.cuda.Stream(device)
            self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for rows in sorted(GRAPH_ROWS, reverse=True):  # the largest first: the others fit in its memory
            self._graphs[rows] = graph = _Graph(self.net, rows, self._stream, pool)
            pool = graph.graph.pool()

    @classmethod
    def from_file(cls, path: str | Path, device: str | torch.device = "cpu") -> VadModel:
        """The model in Silero VAD's TorchScript file (silero_vad.jit; ValueError for any other file)."""
        try:
            scripted = torch.jit.load(str(path), map_location="cpu")
            found = {**dict(scripted._model.named_parameters()), **dict(scripted._model.named_buffers())}
        except Exception as exc:  # TorchScript raises its own error kinds for a file that is not one
            raise ValueError(f"cannot read the Silero VAD model {path}: {exc}") from None
        weights = {name: found.get(key) for name, key in SileroNet.NAMES.items()}
        shapes = {"stft": (2 * BINS, 1, N_FFT), "lstm_hh": (4 * HIDDEN, HIDDEN), "final": (1, HIDDEN, 1)}
        if any(w is None for w in weights.values()) or any(
                tuple(weights[k].shape) != shape for k, shape in shapes.items()):
            raise ValueError(f"{path} is not Silero VAD's model")
        return cls(SileroNet(weights), torch.device(device))

    @torch.inference_mode()
    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step for B streams: x [B, 576] float32, state [2, B, 128] -> (P(speech) [B], state)."""
        x, state = np.asarray(x, dtype=np.float32), np.asarray(state, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != SAMPLES or state.shape != (2, len(x), HIDDEN):
            raise ValueError(f"infer takes x [B, {SAMPLES}] and state [2, B, {HIDDEN}], got {x.shape}, {state.shape}")
        if not self._graphs:
            p, new_state = self.net(torch.from_numpy(np.ascontiguousarray(x)),
                                    torch.from_numpy(np.ascontiguousarray(state)))
            return p.numpy(), new_state.numpy()
        probs = np.empty(len(x), dtype=np.float32)
        new_states = np.empty(state.shape, dtype=np.float32)
        largest = GRAPH_ROWS[-1]
        with torch.cuda.stream(self._stream):
            for start in range(0, len(x), largest):
                rows = slice(start, start + largest)
                piece = x[rows]
                graph = self._graphs[next(size for size in GRAPH_ROWS if size >= len(piece))]
                graph.run(piece, state[:, rows], probs[rows], new_states[:, rows])
        return probs, new_states
