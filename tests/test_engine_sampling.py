"""Sampling against transformers' own logits processors, which the official generate runs."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.sampling import SamplingParams, pick, repetition_penalty, warp


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), [(50, 1.0, 0.9), (5, 0.8, 1.3), (0, 0.5, 0.7)])
def test_warp_matches_transformers(top_k: int, top_p: float, temperature: float) -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0)) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(warp(logits[0], top_k, top_p, temperature), expected[0])


def test_repetition_penalty_matches_transformers() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1))
    generated = torch.tensor([[3, 7, 7, 42]])
    seen = torch.zeros(50, dtype=torch.bool)
    seen[generated[0]] = True
    expected = RepetitionPenaltyLogitsProcessor(1.05)(generated, logits.clone())
    assert torch.equal(repetition_penalty(logits[0], seen, 1.05), expected[0])


def test_draws_follow_the_generator() -> None:
    logits = torch.randn(100)
    draws = [pick(logits, True, 50, 1.0, 0.9, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert draws[0] == draws[1]
    assert pick(logits, False, 50, 1.0, 0.9, None) == logits.argmax()


def test_generation_config_and_greedy() -> None:
    params = SamplingParams.from_generation_config({"do_sample": True, "top_k": 20, "subtalker_top_p": 0.9})
    assert params.do_sample and params.top_k == 20 and params.sub_top_p == 0.9
    greedy = SamplingParams.from_generation_config({"do_sample": True}, greedy=True)
    assert not greedy.do_sample and not greedy.sub_do_sample and greedy.repetition_penalty == 1.05
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_generation_config({"temperature": 0})
