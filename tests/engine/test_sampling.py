"""Sampling against transformers' own logits processors, which the official generate runs, and the
counter-based draws that replace a per-stream torch.Generator (they run inside CUDA graphs)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.api import Sampling
from engine.sampling import SamplingParams, choose, repetition_penalty, uniform, warp


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), [(50, 1.0, 0.9), (5, 0.8, 1.3), (0, 0.5, 0.7)])
def test_warp_matches_transformers(top_k: int, top_p: float, temperature: float) -> None:
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(0)) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(warp(logits, top_k, top_p, temperature), expected)


def test_warp_takes_each_rows_own_parameters() -> None:
    """Rows of one batch with their own temperature, top-k and top-p warp as each would alone."""
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(3)) * 3
    rows = [(50, 1.0, 0.9), (5, 0.8, 1.3), (0, 0.5, 0.7), (1, 1.0, 1.0)]
    top_k, top_p, temperature = (torch.tensor(column, dtype=torch.float32) for column in zip(*rows, strict=True))
    together = warp(logits, top_k, top_p, temperature)
    for i, (k, p, t) in enumerate(rows):
        assert torch.equal(together[i:i + 1], warp(logits[i:i + 1], k, p, t))


def test_repetition_penalty_matches_transformers() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1))
    generated = torch.tensor([[3, 7, 7, 42]])
    seen = torch.zeros(1, 50, dtype=torch.bool)
    seen[0, generated[0]] = True
    expected = RepetitionPenaltyLogitsProcessor(1.05)(generated, logits.clone())
    assert torch.equal(repetition_penalty(logits, seen, 1.05), expected)


def test_draws_invert_the_distribution() -> None:
    """Draws at evenly spaced u land on each id in proportion to its warped probability."""
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(2)) * 2
    n = 20000
    u = (torch.arange(n) + 0.5) / n
    ids = choose(logits.expand(n, -1), True, 20, 0.9, 0.8, u)
    probs = warp(logits, 20, 0.9, 0.8).softmax(-1)[0]
    assert torch.allclose(torch.bincount(ids, minlength=100) / n, probs, atol=2 / n)
    assert torch.equal(choose(logits, False, 20, 0.9, 0.8, u[:1]), logits.argmax(-1))


def test_uniform_is_a_function_of_seed_counter_and_index() -> None:
    counter = torch.arange(5000)
    u = uniform(torch.full_like(counter, 7), counter, 16)
    assert u.shape == (5000, 16)
    assert torch.equal(u[1234], uniform(torch.tensor([7]), torch.tensor([1234]), 16)[0])  # whatever the batch
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert (u != uniform(torch.full_like(counter, 8), counter, 16)).float().mean() > 0.99
    assert (u[:, 0] != u[:, 1]).float().mean() > 0.99


def test_a_streams_own_sampling_over_the_checkpoints() -> None:
    params = SamplingParams.from_generation_config({"top_k": 50, "temperature": 0.9})
    own = params.with_overrides(Sampling(seed=7, temperature=0.5, subtalker_top_k=3))
    assert (own.temperature, own.top_k, own.sub_top_k, own.sub_temperature) == (0.5, 50, 3, 0.9)
    assert params.with_overrides(None) is params
    assert own.row() == [0.5, 50.0, 1.0, 1.05, 0.9, 3.0, 1.0]


def test_generation_config_and_greedy() -> None:
    params = SamplingParams.from_generation_config({"do_sample": True, "top_k": 20, "subtalker_top_p": 0.9})
    assert params.do_sample and params.top_k == 20 and params.sub_top_p == 0.9
    greedy = SamplingParams.from_generation_config({"do_sample": True}, greedy=True)
    assert not greedy.do_sample and not greedy.sub_do_sample and greedy.repetition_penalty == 1.05
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_generation_config({"temperature": 0})
