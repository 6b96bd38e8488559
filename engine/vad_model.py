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

No CUDA graphs: a step is ~25 kernels, launched by the VAD's thread on a stream of its own while the TTS
steps replay theirs. Replaying graphs of its own there hung an engine process on an H200 within seconds:
every graph torch captures on its default capture stream shares that stream's cuBLAS workspace, and two of
them ran at once.
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


class VadModel:
    """The network on one device; ``infer`` may run beside the engine's other work (on a GPU, on a CUDA stream
    of its own)."""

    def __init__(self, net: SileroNet, device: torch.device) -> None:
        self.device = device
        self.net = net.to(device).eval()
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

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
        xs, states = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(state))
        if self._stream is None:
            p, new_state = self.net(xs, states)
            return p.numpy(), new_state.numpy()
        with torch.cuda.stream(self._stream):
            p, new_state = self.net(xs.to(self.device), states.to(self.device))
            # One copy back, waited for asleep: a plain .cpu() spins a core until the kernels are done.
            out = torch.cat((p, new_state.flatten()))
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            done = torch.cuda.Event(blocking=True)
            done.record()
            done.synchronize()
            result = host.numpy()
            return result[: len(x)], result[len(x) :].reshape(state.shape)
