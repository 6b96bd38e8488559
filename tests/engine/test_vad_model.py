"""engine.vad_model: Silero VAD in PyTorch against the gateway's onnxruntime model, on the recorded fixtures:
the same probabilities within float rounding, so the same turns to the sample, alone or batched; on a GPU
too, where there is one. Served by an engine process: tests/engine/test_turn_engine.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.vad_model import VadModel
from gateway.core.vad import SpeechStopped, TurnDetector
from gateway.runtime.silero import SileroModel, SileroVAD, process_many
from gateway.shipped import SILERO_TORCHSCRIPT, SMART_TURN_MODEL, silero_file
from tests.conftest import FIXTURES, load_pcm

WAVS = sorted(path.name for path in FIXTURES.glob("*.wav"))
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """Each fixture's probabilities from onnxruntime, one session at a time."""
    model = SileroModel.shared()
    return {name: SileroVAD(model).process(load_pcm(name)) for name in WAVS}


@pytest.mark.parametrize("device", DEVICES)
def test_the_torch_model_finds_onnxruntimes_turns_to_the_sample(device: str, reference: dict) -> None:
    model = VadModel.from_file(silero_file(SILERO_TORCHSCRIPT), device)
    for name in WAVS:
        probs = SileroVAD(model).process(load_pcm(name))
        assert np.abs(probs - reference[name]).max() < 1e-4, name
        assert TurnDetector().feed(probs) == TurnDetector().feed(reference[name]), name
    turns = [e for name in WAVS for e in TurnDetector().feed(reference[name])]
    assert sum(isinstance(e, SpeechStopped) for e in turns) >= 8  # the comparison covers real turns


@pytest.mark.parametrize(("device", "copies"), [("cpu", 3), *[
    pytest.param("cuda", n, marks=DEVICES[1].marks) for n in (1, 17, 456)]])
def test_batches_of_any_size_give_each_stream_its_own_probabilities(device: str, copies: int,
                                                                     reference: dict) -> None:
    """Every fixture `copies` times in shared steps (on a GPU, up to 4104 streams a step)."""
    model = VadModel.from_file(silero_file(SILERO_TORCHSCRIPT), device)
    streams = [name for name in WAVS for _ in range(copies)]
    got = process_many([(SileroVAD(model), load_pcm(name)) for name in streams])
    for name, probs in zip(streams, got, strict=True):
        assert np.abs(probs - reference[name]).max() < 1e-4, name


def test_a_file_that_is_not_silero_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the Silero VAD model"):
        VadModel.from_file(SMART_TURN_MODEL)
    scripted = tmp_path / "other.jit"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), scripted)
    with pytest.raises(ValueError, match="cannot read the Silero VAD model|is not Silero VAD's model"):
        VadModel.from_file(scripted)
