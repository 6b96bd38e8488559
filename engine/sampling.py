"""Token choice as the official generate makes it: repetition penalty on codebook 0, then (when sampling)
temperature, top-k and top-p, each as transformers' logits processors compute them. Everything is batched over
streams, and random draws come from a counter-based generator (seed, frame, codebook), so a stream is
reproducible for a given seed whatever else shares its batch, and the draws run inside a CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine import kernels


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    # The code predictor ("sub-talker"); the official generate applies no repetition penalty there.
    sub_do_sample: bool = True
    sub_top_k: int = 50
    sub_top_p: float = 1.0
    sub_temperature: float = 0.9

    @classmethod
    def from_generation_config(cls, gen: dict[str, Any], greedy: bool = False) -> SamplingParams:
        """generation_config.json values over the official hard defaults; greedy turns both samplers off
        (the repetition penalty still applies, as in the official greedy path)."""
        base = cls()
        params = cls(
            do_sample=bool(gen.get("do_sample", base.do_sample)) and not greedy,
            top_k=int(gen.get("top_k", base.top_k)),
            top_p=float(gen.get("top_p", base.top_p)),
            temperature=float(gen.get("temperature", base.temperature)),
            repetition_penalty=float(gen.get("repetition_penalty", base.repetition_penalty)),
            sub_do_sample=bool(gen.get("subtalker_dosample", base.sub_do_sample)) and not greedy,
            sub_top_k=int(gen.get("subtalker_top_k", base.sub_top_k)),
            sub_top_p=float(gen.get("subtalker_top_p", base.sub_top_p)),
            sub_temperature=float(gen.get("subtalker_temperature", base.sub_temperature)),
        )
        if params.temperature <= 0 or params.sub_temperature <= 0:
            raise ValueError("generation_config.json: temperature must be > 0")
        return params


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Penalise the ids already generated (once each, however often they came); logits and seen [B, V]."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer hash (Mueller's) in int64 arithmetic: every product stays below 2**63, so CPU and
    # GPU give the same bits.
    for _ in range(2):
        x = (((x >> 16) ^ x) * 0x45D9F3B) & MASK32
    return (x >> 16) ^ x


def uniform(seed: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """Counter-based random numbers in [0, 1), float32 [B, n], from per-row seeds and counters [B] (int64):
    draw i of row r is a pure function of (seed[r], counter[r], i), so a stream's draws do not depend on the
    other streams of a batch or on how the step was launched, and a CUDA graph replays them without
    generator state."""
    x = ((counter & MASK32)[:, None] * n + torch.arange(n, device=counter.device)) & MASK32
    x = _mix32(_mix32(x) ^ (seed & MASK32)[:, None])
    return (x >> 8).float() * 2.0**-24


def warp(logits: torch.Tensor, top_k: int, top_p: float, temperature: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p over float32 logits [B, V]; filtered ids get -inf."""
    scores = logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - top_p
        remove[:, -1] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return scores


def choose(logits: torch.Tensor, do_sample: bool, top_k: int, top_p: float, temperature: float,
           u: torch.Tensor | None) -> torch.Tensor:
    """One id per row of logits [B, V]: argmax, or a draw from the warped distribution that inverts its
    CDF at u [B] (the first id whose cumulative probability exceeds u), computed in float32."""
    if not do_sample or u is None:
        return logits.argmax(-1)
    if top_p >= 1.0 and kernels.can_sample(logits):
        return kernels.sample(logits, u, top_k, temperature)
    cdf = warp(logits.float(), top_k, top_p, temperature).softmax(-1).cumsum(-1)
    return (cdf <= u[:, None] * cdf[:, -1:]).sum(-1).clamp(max=logits.shape[-1] - 1)
