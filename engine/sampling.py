"""Token choice as the official generate makes it: repetition penalty on codebook 0, then (when sampling)
temperature, top-k and top-p, each as transformers' logits processors compute them. Everything is batched over
streams, each row with its own temperature, top-k, top-p and penalty (a stream's engine.api.Sampling over the
checkpoint's), and random draws come from a counter-based generator (seed, frame, codebook), so a stream is
reproducible for a given seed whatever else shares its batch, and the draws run inside a CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from engine import kernels
from engine.api import Sampling

# What a row of the batch holds of its stream's sampling (engine.talker keeps them as one float tensor).
ROW_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "sub_temperature", "sub_top_k", "sub_top_p")
# engine.api.Sampling's names of the code predictor's fields.
_API_NAMES = {"subtalker_temperature": "sub_temperature", "subtalker_top_k": "sub_top_k",
              "subtalker_top_p": "sub_top_p"}


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

    def with_overrides(self, sampling: Sampling | None) -> SamplingParams:
        """These parameters with a stream's own (its seed aside, which the stream keeps)."""
        if sampling is None:
            return self
        given = {_API_NAMES.get(k, k): v for k, v in vars(sampling).items() if v is not None and k != "seed"}
        return replace(self, **given)

    def row(self) -> list[float]:
        """The values of ROW_FIELDS, as a row of the batch holds them."""
        return [float(getattr(self, name)) for name in ROW_FIELDS]


Rows = torch.Tensor | float


def _per_row(value: Rows, logits: torch.Tensor) -> torch.Tensor:
    """A per-row parameter as float32 [B] (a number applies to every row)."""
    if isinstance(value, torch.Tensor):
        return value.to(device=logits.device, dtype=torch.float32)
    return torch.full((logits.shape[0],), float(value), device=logits.device)


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: Rows) -> torch.Tensor:
    """Penalise the ids already generated (once each, however often they came); logits and seen [B, V],
    penalty per row (1: none)."""
    p = _per_row(penalty, logits)[:, None]
    penalised = torch.where(logits < 0, logits * p, logits / p)
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


def warp(logits: torch.Tensor, top_k: Rows, top_p: Rows, temperature: Rows) -> torch.Tensor:
    """Temperature, then top-k (0: none), then top-p over float32 logits [B, V], each per row; filtered ids
    get -inf. The same tensor operations whatever the values (no branch on them: a CUDA graph replays this);
    a row with top_p 1 loses only ids of probability 0, which no draw picks."""
    scores = logits / _per_row(temperature, logits)[:, None]
    vocab = scores.shape[-1]
    k = _per_row(top_k, logits).long()
    k = torch.where((k > 0) & (k < vocab), k, vocab)
    kth = torch.sort(scores, descending=True).values.gather(1, (k - 1)[:, None])
    scores = scores.masked_fill(scores < kth, float("-inf"))
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(-1).cumsum(-1)
    remove = cumulative <= 1 - _per_row(top_p, logits)[:, None]
    remove[:, -1] = False
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


def choose(logits: torch.Tensor, do_sample: bool, top_k: Rows, top_p: Rows, temperature: Rows,
           u: torch.Tensor | None) -> torch.Tensor:
    """One id per row of logits [B, V]: argmax, or a draw from the warped distribution that inverts its
    CDF at u [B] (the first id whose cumulative probability exceeds u), computed in float32."""
    if not do_sample or u is None:
        return logits.argmax(-1)
    if kernels.can_sample(logits):
        return kernels.sample(logits, u, _per_row(top_k, logits), _per_row(top_p, logits),
                              _per_row(temperature, logits))
    cdf = warp(logits.float(), top_k, top_p, temperature).softmax(-1).cumsum(-1)
    return (cdf <= u[:, None] * cdf[:, -1:]).sum(-1).clamp(max=logits.shape[-1] - 1)
