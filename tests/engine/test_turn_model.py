"""engine.turn_model: Smart Turn v3.2 in torch against onnxruntime on the same ONNX file.

The reference is onnxruntime running the file's QuantizeLinear/DequantizeLinear nodes as written (graph
optimisations off). The gateway's optimised session fuses them into integer kernels instead: that is a
different arithmetic again, and the 8-bit activations make P sensitive to the last bit (the two
onnxruntime paths differ by 0.15 on average here), so only the reference can be matched this closely.
"""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
import onnx
import onnxruntime
import pytest
import soxr
import torch

from engine.turn_model import N_SAMPLES, FakeQuant, TurnModel
from gateway.runtime.smart_turn import MODEL_FILE, last_seconds, log_mel
from tests.conftest import FIXTURES, load_pcm

SPEECH = [name for name, fixture in json.loads((FIXTURES / "fixtures.json").read_text()).items()
          if fixture["speech_ms"]]


def turns_at_pauses() -> np.ndarray:
    """Where the gateway asks: each fixture's turn (from 300 ms before its speech) 200 and 600 ms into each
    pause after speech, at 16 kHz, 8 s each ([18, 128000])."""
    fixtures = json.loads((FIXTURES / "fixtures.json").read_text())
    turns = []
    for name in SPEECH:
        pcm = np.frombuffer(load_pcm(name), "<i2").astype(np.float32) / 32768
        segments = fixtures[name]["speech_ms"]
        for start, end in segments:
            start = segments[0][0] if name == "paused_turn.wav" else start  # one turn with a pause inside
            for after in (200, 600):
                if (end + after) * 24 <= len(pcm):
                    turn = pcm[(start - 300) * 24 : (end + after) * 24]
                    turns.append(last_seconds(soxr.resample(turn, 24_000, 16_000, quality="HQ")))
    return np.stack(turns)


@pytest.fixture(scope="module")
def model() -> TurnModel:
    return TurnModel.from_onnx(MODEL_FILE)


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return turns_at_pauses()


def reference_session(outputs: list[str] = ()) -> onnxruntime.InferenceSession:
    proto = onnx.load(str(MODEL_FILE))
    proto.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UINT8, None)
                              for name in outputs)
    opts = onnxruntime.SessionOptions()
    opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return onnxruntime.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def assert_same_verdicts(p: np.ndarray, expected: np.ndarray) -> None:
    """The same model by its averages and most of its decisions. Not point by point: a float difference in
    the last bit can flip an 8-bit rounding and the flip cascades, so a point can move by half a unit
    between any two implementations (onnxruntime's own two paths disagree on 12 of 62 cut points; this
    model against the reference moved 0.17 at most on the 2-core VM, 0.53 on a Xeon host, 2026-11-28).
    The 8-bit activations themselves are checked value for value in test_layers_and_quantizers_are_the_graphs."""
    assert np.abs(p - expected).mean() < 0.1, (p, expected)
    clear = np.abs(expected - 0.5) > 0.15  # nearer 0.5, the last bit decides for any implementation
    assert ((p > 0.5) == (expected > 0.5))[clear].mean() >= 0.9, (p, expected)


def test_features_match_the_gateways(model: TurnModel, audio: np.ndarray) -> None:
    noise = last_seconds(np.random.default_rng(0).standard_normal(150_000).astype(np.float32) * 0.1)
    x = np.concatenate([audio[:4], noise[None], np.zeros((1, N_SAMPLES), np.float32)])
    with torch.inference_mode():
        got = model.features(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, np.stack([log_mel(a) for a in x]), atol=1e-4)


def test_verdicts_match_onnxruntime_at_pauses(model: TurnModel, audio: np.ndarray) -> None:
    feats = np.stack([log_mel(a) for a in audio])
    (expected,) = reference_session().run(None, {"input_features": feats})
    assert_same_verdicts(model.predict(audio), expected[:, 0])


def test_layers_and_quantizers_are_the_graphs(model: TurnModel, audio: np.ndarray) -> None:
    """Before rounding flips accumulate, the 8-bit activations are onnxruntime's, value for value: the
    convolutions exactly, the first block's q/k scores, v and output almost all (a flip needs a float
    tie). A weight in the wrong place, or a quantizer, would show here at once."""
    points = {"conv2": model.net.quant.conv2, **{name: model.net.layers[0].quant[name]
                                                for name in ("scores", "v_heads", "out")}}
    proto = onnx.load(str(MODEL_FILE))
    scales = {float(onnx.numpy_helper.to_array(i)): i.name for i in proto.graph.initializer if i.dims == []}
    quantizers = {n.input[1]: n.output[0] for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    names = {point: quantizers[scales[q.scale]] for point, q in points.items()}
    got: dict[str, np.ndarray] = {}

    def record(point: str, q: FakeQuant, out: torch.Tensor) -> None:
        got[point] = (torch.round(out / q.scale) - q.lo).to(torch.int64).numpy()  # the uint8 values

    hooks = [q.register_forward_hook(lambda m, args, out, point=point: record(point, m, out))
             for point, q in points.items()]
    feats = log_mel(audio[0])[None]
    with torch.inference_mode():
        model.net(torch.from_numpy(feats))
    for hook in hooks:
        hook.remove()
    outputs = reference_session(list(names.values())).run(list(names.values()), {"input_features": feats})
    expected = dict(zip(points, outputs, strict=True))
    np.testing.assert_array_equal(got["conv2"], expected["conv2"].transpose(0, 2, 1))
    for point in ("scores", "v_heads", "out"):
        assert got[point].shape == expected[point].shape
        assert (got[point] == expected[point]).mean() > 0.99, point


def test_a_batch_gives_each_turns_own_result(model: TurnModel, audio: np.ndarray) -> None:
    batch = model.predict(audio[:5])
    assert batch.dtype == np.float32 and batch.shape == (5,)
    np.testing.assert_allclose(batch, [model.predict(a[None])[0] for a in audio[:5]], atol=1e-5)
    assert model.predict(np.zeros((0, N_SAMPLES), np.float32)).shape == (0,)


def test_input_of_the_wrong_shape_is_a_clear_error(model: TurnModel) -> None:
    with pytest.raises(ValueError, match=r"predict takes \[B, 128000\] samples .* got shape \(2, 16000\)"):
        model.predict(np.zeros((2, 16_000), np.float32))


def test_a_different_file_is_a_clear_error(tmp_path) -> None:
    silero = files("silero_vad.data") / "silero_vad.onnx"
    with pytest.raises(ValueError, match="silero_vad.onnx is not the Smart Turn v3.2 model: "):
        TurnModel.from_onnx(str(silero))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match="junk.onnx is not an ONNX model"):
        TurnModel.from_onnx(junk)
    with pytest.raises(ValueError, match="cannot read the Smart Turn model .*nowhere.onnx: No such file"):
        TurnModel.from_onnx(tmp_path / "nowhere.onnx")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_gives_the_cpus_verdicts(model: TurnModel, audio: np.ndarray) -> None:
    gpu = TurnModel.from_onnx(MODEL_FILE, device="cuda")
    with torch.inference_mode():
        feats = gpu.features(torch.from_numpy(audio).cuda()).cpu().numpy()
    np.testing.assert_allclose(feats, np.stack([log_mel(a) for a in audio]), atol=1e-4)
    # float32 on both; the GPU's summation order differs, which the 8-bit activations amplify
    assert_same_verdicts(gpu.predict(audio), model.predict(audio))
    # A batch runs as the CUDA graph of its padded size: each turn's verdict, whatever shares its batch.
    assert_same_verdicts(gpu.predict(audio[:3]), np.array([gpu.predict(a[None])[0] for a in audio[:3]]))
    assert len(gpu.predict(np.concatenate([audio] * 4))) == 4 * len(audio)  # over the largest graph: in parts
