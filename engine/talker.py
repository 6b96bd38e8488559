"""The Qwen3-TTS 12Hz talker and its code predictor, and `decode_step`, which makes one frame.

A frame is 16 codes (80 ms of audio). The talker reads one input embedding per frame and predicts code 0;
the code predictor, with a fresh cache per frame, reads [talker hidden state, embed(code 0)] and predicts
codes 1..15 one at a time. The next talker input is the sum of the 16 code embeddings plus one text-track
embedding (see prompt.py). Module and parameter names match the official checkpoint (prefix `talker.`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import Block, KVCache, RMSNorm, causal_mask, rope_tables
from engine.sampling import SamplingParams, pick, repetition_penalty


class ConfigError(ValueError):
    """config.json does not describe a model this code runs."""


@dataclass(frozen=True)
class StackConfig:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    vocab: int

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> StackConfig:
        try:
            return cls(hidden=d["hidden_size"], intermediate=d["intermediate_size"], layers=d["num_hidden_layers"],
                       heads=d["num_attention_heads"], kv_heads=d["num_key_value_heads"],
                       head_dim=d.get("head_dim", d["hidden_size"] // d["num_attention_heads"]),
                       eps=d.get("rms_norm_eps", 1e-6), theta=d.get("rope_theta", 10000.0), vocab=d["vocab_size"])
        except KeyError as exc:
            raise ConfigError(f"config.json: {where} lacks {exc.args[0]!r}") from None


@dataclass(frozen=True)
class ModelConfig:
    """What the engine reads from a checkpoint's config.json."""

    talker: StackConfig
    predictor: StackConfig
    text_hidden: int
    text_vocab: int
    code_groups: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    languages: dict[str, int] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)
    dialects: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        if d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"config.json: tokenizer_type {d.get('tokenizer_type')!r}; only the 12Hz codec runs here")
        if d.get("tts_model_type", "custom_voice") != "custom_voice":
            raise ConfigError(f"config.json: tts_model_type {d.get('tts_model_type')!r}; only custom_voice "
                              "checkpoints (named speakers) run here")
        t = d.get("talker_config")
        if not isinstance(t, dict) or not isinstance(t.get("code_predictor_config"), dict):
            raise ConfigError("config.json: no talker_config with a code_predictor_config")
        speakers = {}
        for name, value in (t.get("spk_id") or {}).items():
            # Published configs write a speaker id either as an int or as a one-element list.
            ids = value if isinstance(value, list) else [value]
            if len(ids) != 1 or not isinstance(ids[0], int):
                raise ConfigError(f"config.json: spk_id[{name!r}] = {value!r} is not one codec id")
            speakers[name.lower()] = ids[0]
        try:
            cfg = cls(
                talker=StackConfig.from_dict(t, "talker_config"),
                predictor=StackConfig.from_dict(t["code_predictor_config"], "code_predictor_config"),
                text_hidden=t["text_hidden_size"], text_vocab=t["text_vocab_size"],
                code_groups=t["num_code_groups"], codec_pad=t["codec_pad_id"], codec_bos=t["codec_bos_id"],
                codec_eos=t["codec_eos_token_id"], think=t["codec_think_id"], nothink=t["codec_nothink_id"],
                think_bos=t["codec_think_bos_id"], think_eos=t["codec_think_eos_id"],
                tts_pad=d["tts_pad_token_id"], tts_bos=d["tts_bos_token_id"], tts_eos=d["tts_eos_token_id"],
                languages={k.lower(): v for k, v in (t.get("codec_language_id") or {}).items()},
                speakers=speakers,
                dialects={k.lower(): v.lower() for k, v in (t.get("spk_is_dialect") or {}).items() if v},
            )
        except KeyError as exc:
            raise ConfigError(f"config.json lacks {exc.args[0]!r}") from None
        if cfg.code_groups != 16 or t["code_predictor_config"].get("num_code_groups", 16) != 16:
            raise ConfigError("config.json: num_code_groups must be 16 (the 12Hz codec's 16 codebooks)")
        return cfg


class Stack(nn.Module):
    """Decoder layers and the final norm, as `talker.model` and `talker.code_predictor.model` hold them."""

    def __init__(self, c: StackConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Block(c.hidden, c.intermediate, c.heads, c.kv_heads, c.head_dim, c.eps) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)

    def run(self, x: torch.Tensor, caches: list[KVCache], rope: tuple[torch.Tensor, torch.Tensor],
            slots: list[int], input_pos: torch.Tensor) -> torch.Tensor:
        cos, sin = rope
        pos_rope = (cos[input_pos].unsqueeze(1), sin[input_pos].unsqueeze(1))
        mask = causal_mask(input_pos, caches[0].k.shape[2])
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, pos_rope, cache, slots, input_pos, mask)
        return self.norm(x)


class TalkerModel(Stack):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.talker)
        self.codec_embedding = nn.Embedding(cfg.talker.vocab, cfg.talker.hidden)
        self.text_embedding = nn.Embedding(cfg.text_vocab, cfg.text_hidden)


class PredictorModel(Stack):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.predictor)
        # Codes 1..15 are embedded at the talker's width (their sum feeds the talker too).
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.predictor.vocab, cfg.talker.hidden) for _ in range(cfg.code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.model = PredictorModel(cfg)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.predictor.hidden, cfg.predictor.vocab, bias=False) for _ in range(cfg.code_groups - 1))
        # Only where the widths differ (1.7B); 0.6B checkpoints have no such tensor.
        self.small_to_mtp_projection = (
            nn.Linear(cfg.talker.hidden, cfg.predictor.hidden) if cfg.talker.hidden != cfg.predictor.hidden else None)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.small_to_mtp_projection is None else self.small_to_mtp_projection(x)


class TextProjection(nn.Module):
    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden)
        self.linear_fc2 = nn.Linear(text_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden, cfg.talker.hidden)
        self.codec_head = nn.Linear(cfg.talker.hidden, cfg.talker.vocab, bias=False)
        self.code_predictor = CodePredictor(cfg)


@dataclass
class Generation:
    """One stream's decoding state: its cache slot, next position, sampling state."""

    slot: int
    params: SamplingParams
    generator: torch.Generator | None
    seen: torch.Tensor  # [talker vocab] bool: codebook-0 ids generated so far (repetition penalty)
    min_frames: int = 2  # EOS is banned before this many frames (the official min_new_tokens=2)
    pos: int = 0
    frames: int = 0


class Qwen3TTS(nn.Module):
    """The talker side of a Qwen3-TTS 12Hz checkpoint, plus its static caches once `setup` ran."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg)
        self.max_len = 0

    @torch.no_grad()
    def setup(self, slots: int, max_len: int) -> None:
        """Preallocate caches for `slots` concurrent streams of up to `max_len` talker positions."""
        p = next(self.parameters())
        t, c = self.cfg.talker, self.cfg.predictor
        self.max_len = max_len
        self.caches = [KVCache(slots, t.kv_heads, max_len, t.head_dim, p.dtype, p.device) for _ in range(t.layers)]
        # The predictor reads 2 + 14 positions per frame and starts over at 0 on the next frame.
        self.predictor_caches = [KVCache(slots, c.kv_heads, self.cfg.code_groups, c.head_dim, p.dtype, p.device)
                                 for _ in range(c.layers)]
        self.rope = rope_tables(t.head_dim, t.theta, max_len, p.device, p.dtype)
        self.predictor_rope = rope_tables(c.head_dim, c.theta, self.cfg.code_groups, p.device, p.dtype)
        vocab = t.vocab
        # The official generate bans the top 1024 ids (control tokens) except EOS.
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=p.device)
        self.suppress[max(0, vocab - 1024):] = True
        self.suppress[self.cfg.codec_eos] = False

    def new_generation(self, slot: int, params: SamplingParams, seed: int | None, min_frames: int = 2) -> Generation:
        device = self.suppress.device
        generator = None
        if params.do_sample or params.sub_do_sample:
            generator = torch.Generator(device=device)
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
        return Generation(slot=slot, params=params, generator=generator, min_frames=max(2, min_frames),
                          seen=torch.zeros(self.cfg.talker.vocab, dtype=torch.bool, device=device))

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text-track embeddings of token ids [..., N] -> [..., N, hidden]."""
        return self.talker.text_projection(self.talker.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.talker.model.codec_embedding(ids)

    def codes_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, 16] codes of a frame -> [B, 1, hidden], the codec part of the next talker input."""
        emb = self.talker.code_predictor.model.codec_embedding
        parts = [self.codec_embed(codes[:, :1])] + [emb[i](codes[:, i + 1:i + 2]) for i in range(len(emb))]
        return torch.cat(parts, dim=1).sum(1, keepdim=True)

    @torch.no_grad()
    def decode_step(self, gens: list[Generation], x: torch.Tensor) -> torch.Tensor:
        """Run the talker over inputs x [B, T, hidden] (T > 1 is a prefill) and make one frame per stream.

        Returns codes [B, 16]; a row whose code 0 is EOS ended that stream (its other codes are unused).
        """
        b, t, _ = x.shape
        device = x.device
        slots = [g.slot for g in gens]
        # Positions are known on the host: no device round trip per step.
        if max(g.pos for g in gens) + t > self.max_len:
            raise RuntimeError(f"talker cache overflow: position {max(g.pos for g in gens) + t} > {self.max_len}")
        input_pos = torch.tensor([[g.pos + i for i in range(t)] for g in gens], device=device)
        hidden = self.talker.model.run(x, self.caches, self.rope, slots, input_pos)[:, -1]
        logits = self.talker.codec_head(hidden).float()
        code0 = torch.empty(b, dtype=torch.long, device=device)
        for i, g in enumerate(gens):
            row = repetition_penalty(logits[i], g.seen, g.params.repetition_penalty)
            row = row.masked_fill(self.suppress, float("-inf"))
            if g.frames < g.min_frames:
                row[self.cfg.codec_eos] = float("-inf")
            code0[i] = pick(row, g.params.do_sample, g.params.top_k, g.params.top_p, g.params.temperature,
                            g.generator)
            g.seen[code0[i]] = True
            g.pos += t
            g.frames += 1
        rest = self.predict_codes(gens, slots, hidden, code0)
        return torch.cat([code0[:, None], rest], dim=1)

    def predict_codes(self, gens: list[Generation], slots: list[int], hidden: torch.Tensor,
                      code0: torch.Tensor) -> torch.Tensor:
        """Codes 1..15 for talker hidden states [B, hidden] and codes 0 [B]: the 15-step predictor loop."""
        cp = self.talker.code_predictor
        b = hidden.shape[0]
        x = torch.stack([hidden, self.codec_embed(code0)], dim=1)
        pos = torch.arange(2, device=hidden.device).expand(b, 2)
        codes = []
        for i in range(self.cfg.code_groups - 1):
            h = cp.model.run(cp.project(x), self.predictor_caches, self.predictor_rope, slots, pos)[:, -1]
            logits = cp.lm_head[i](h).float()
            code = torch.stack([
                pick(logits[j], g.params.sub_do_sample, g.params.sub_top_k, g.params.sub_top_p,
                     g.params.sub_temperature, g.generator) for j, g in enumerate(gens)])
            codes.append(code)
            if i + 1 < self.cfg.code_groups - 1:
                x = cp.model.codec_embedding[i](code)[:, None]
                pos = pos[:, -1:] + 1
        return torch.stack(codes, dim=1)
