"""The Qwen3-TTS 12Hz talker and its code predictor, and `Qwen3TTS.step`, which makes one frame for every
running stream at once.

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

from engine import kernels
from engine.layers import Block, Decode, KVCache, KVCaches, Prefill, RMSNorm, fuse_weights, rope_tables
from engine.sampling import ROW_FIELDS, SamplingParams, choose, repetition_penalty, uniform


class UnsupportedConfig(ValueError):
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
            raise UnsupportedConfig(f"config.json: {where} lacks {exc.args[0]!r}") from None


KINDS = ("custom_voice", "voice_design", "base")


@dataclass(frozen=True)
class ModelConfig:
    """What the engine reads from a checkpoint's config.json.

    `kind` is the checkpoint's tts_model_type, as the official loader reads it: custom_voice (named speakers,
    and instructions unless the size is 0.6B), voice_design (a text description of the voice) or base (a
    voice cloned from reference audio, with a speaker encoder whose config is `speaker_encoder`)."""

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
    kind: str = "custom_voice"
    size: str = ""
    languages: dict[str, int] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)
    dialects: dict[str, str] = field(default_factory=dict)
    speaker_encoder: dict[str, Any] | None = None

    @property
    def follows_instructions(self) -> bool:
        """Whether prompts take an instruction: VoiceDesign always (it describes the voice), CustomVoice
        except at 0.6B (the official generate_custom_voice drops it there)."""
        return self.kind == "voice_design" or (self.kind == "custom_voice" and self.size != "0b6")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        if d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise UnsupportedConfig(f"config.json: tokenizer_type {d.get('tokenizer_type')!r}; only the 12Hz codec "
                                    "runs here")
        kind = d.get("tts_model_type", "custom_voice")
        if kind not in KINDS:
            raise UnsupportedConfig(f"config.json: tts_model_type {kind!r}; the engine runs {', '.join(KINDS)}")
        t = d.get("talker_config")
        if not isinstance(t, dict) or not isinstance(t.get("code_predictor_config"), dict):
            raise UnsupportedConfig("config.json: no talker_config with a code_predictor_config")
        speakers = {}
        for name, value in (t.get("spk_id") or {}).items():
            # Published configs write a speaker id either as an int or as a one-element list.
            ids = value if isinstance(value, list) else [value]
            if len(ids) != 1 or not isinstance(ids[0], int):
                raise UnsupportedConfig(f"config.json: spk_id[{name!r}] = {value!r} is not one codec id")
            speakers[name.lower()] = ids[0]
        if kind == "custom_voice" and not speakers:
            raise UnsupportedConfig("config.json: a custom_voice checkpoint without speakers (talker_config.spk_id)")
        speaker_encoder = d.get("speaker_encoder_config") if kind == "base" else None
        if kind == "base" and not isinstance(speaker_encoder, dict):
            raise UnsupportedConfig("config.json: a base checkpoint without speaker_encoder_config")
        try:
            cfg = cls(
                talker=StackConfig.from_dict(t, "talker_config"),
                predictor=StackConfig.from_dict(t["code_predictor_config"], "code_predictor_config"),
                text_hidden=t["text_hidden_size"], text_vocab=t["text_vocab_size"],
                code_groups=t["num_code_groups"], codec_pad=t["codec_pad_id"], codec_bos=t["codec_bos_id"],
                codec_eos=t["codec_eos_token_id"], think=t["codec_think_id"], nothink=t["codec_nothink_id"],
                think_bos=t["codec_think_bos_id"], think_eos=t["codec_think_eos_id"],
                tts_pad=d["tts_pad_token_id"], tts_bos=d["tts_bos_token_id"], tts_eos=d["tts_eos_token_id"],
                kind=kind, size=str(d.get("tts_model_size") or ""),
                languages={k.lower(): v for k, v in (t.get("codec_language_id") or {}).items()},
                speakers=speakers,
                dialects={k.lower(): v.lower() for k, v in (t.get("spk_is_dialect") or {}).items() if v},
                speaker_encoder=speaker_encoder,
            )
        except KeyError as exc:
            raise UnsupportedConfig(f"config.json lacks {exc.args[0]!r}") from None
        if cfg.code_groups != 16 or t["code_predictor_config"].get("num_code_groups", 16) != 16:
            raise UnsupportedConfig("config.json: num_code_groups must be 16 (the 12Hz codec's 16 codebooks)")
        return cfg


class Stack(nn.Module):
    """Decoder layers and the final norm, as `talker.model` and `talker.code_predictor.model` hold them."""

    def __init__(self, c: StackConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Block(c.hidden, c.intermediate, c.heads, c.kv_heads, c.head_dim, c.eps) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)

    def fuse(self) -> None:
        """Fused projection weights (after loading; see engine.layers.fuse_weights)."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def forward(self, x: torch.Tensor, caches: list[KVCache], rope: tuple[torch.Tensor, torch.Tensor],
                how: Decode | Prefill) -> torch.Tensor:
        """The residual stream after the last layer; the caller applies `norm` (fused into what follows)."""
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, rope, cache, how)
        return x


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



class Qwen3TTS(nn.Module):
    """The talker side of a Qwen3-TTS 12Hz checkpoint, plus, once `setup` ran, the state of `rows` running
    streams: static KV caches, per-row sampling state and the step's input and output buffers.

    A stream holds one row for its life (`move_row_` moves it when the rows are compacted). `prefill` fills
    new rows' caches with their prompts but the last position; `step(b)` then makes one frame for every
    row in [0, b) at once: the talker reads each row's next input at its own position, samples code 0,
    and the code predictor makes codes 1..15. The step reads and writes only preallocated tensors and never
    waits for the host, so one CUDA graph per b replays it; without a GPU the same function runs eagerly.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg)
        self.max_len = 0
        self.fused = False

    @torch.no_grad()
    def setup(self, rows: int, max_len: int, params: SamplingParams, bank_rows: int = 1) -> None:
        """Preallocate `rows` streams of up to `max_len` talker positions; `params` says whether streams sample
        (or take the argmax), and each stream's prefill brings its own temperature, top-k, top-p and penalty.
        `bank_rows`: the rows of `voice_bank`, the codec-track vectors prompts can add (row 0 is zero)."""
        p = next(self.parameters())
        dev, dt = p.device, p.dtype
        if not self.fused:
            self.talker.model.fuse()
            self.talker.code_predictor.model.fuse()
            # The 16 codebooks' embedding tables as one, so a frame's 16 codes are embedded in one lookup.
            tables = [self.talker.model.codec_embedding, *self.talker.code_predictor.model.codec_embedding]
            self.code_table = fuse_weights(*tables)
            self.code_offsets = torch.tensor([0] + [t.num_embeddings for t in tables[:-1]], device=dev).cumsum(0)
            self.fused = True
        t, c = self.cfg.talker, self.cfg.predictor
        # A multiple of 16 keeps the attention mask's rows aligned for the fused GPU attention kernels.
        self.max_len = -(-max_len // 16) * 16
        self.rows, self.params = rows, params
        # Row `rows` is scratch: the padding rows of a batched prefill write there.
        state_rows = rows + 1
        self.kv = KVCaches(t.layers, state_rows, t.kv_heads, self.max_len, t.head_dim, dt, dev)
        self.caches = self.kv.layers
        # The predictor reads 2 + 14 positions per frame and starts over at 0 on the next frame.
        self.predictor_caches = KVCaches(c.layers, rows, c.kv_heads, self.cfg.code_groups, c.head_dim, dt, dev).layers
        self.rope = rope_tables(t.head_dim, t.theta, self.max_len, dev, dt)
        self.predictor_rope = rope_tables(c.head_dim, c.theta, self.cfg.code_groups, dev, dt)
        # The official generate bans the top 1024 ids (control tokens) except EOS.
        self.suppress = torch.zeros(t.vocab, dtype=torch.bool, device=dev)
        self.suppress[max(0, t.vocab - 1024):] = True
        self.suppress[self.cfg.codec_eos] = False
        # Per-row stream state.
        self.seen = torch.zeros(state_rows, t.vocab, dtype=torch.bool, device=dev)  # codebook-0 ids so far
        self.seed = torch.zeros(state_rows, dtype=torch.long, device=dev)
        self.frames = torch.zeros(state_rows, dtype=torch.long, device=dev)  # frames made: the sampler's counter
        self.min_frames = torch.zeros(state_rows, dtype=torch.long, device=dev)  # EOS is banned before this many
        self.sampling = torch.zeros(len(ROW_FIELDS), state_rows, device=dev)  # engine.sampling.ROW_FIELDS
        self.codes_embed = torch.zeros(state_rows, 1, t.hidden, dtype=dt, device=dev)  # codec part of next input
        self.first_input = torch.zeros(state_rows, 1, t.hidden, dtype=dt, device=dev)  # a prompt's last position
        # Prefill inputs, written by the host: per new stream its prompt's text-track ids, codec-track ids and
        # voice_bank rows (right-padded), and its row (default: scratch), last prompt position, seed and
        # EOS-ban length. The bank holds cloned voices' x-vectors and reference frames (engine.runner).
        self.prompt_ids = torch.zeros(3, rows, self.max_len, dtype=torch.long, device=dev)
        self.voice_bank = torch.zeros(bank_rows, t.hidden, dtype=dt, device=dev)
        self.prompt_meta = torch.zeros(4, rows, dtype=torch.long, device=dev)
        self.prompt_meta[0] = rows
        self.prompt_sampling = torch.zeros(len(ROW_FIELDS), rows, device=dev)  # each new stream's sampling
        # Step inputs, written by the host before each step: position, text id, live (0/1), first frame (0/1).
        # A row that is not live (a stream waiting for text, a free row) computes a throwaway frame at its
        # position, which its next live step overwrites; none of its state advances.
        self.step_in = torch.zeros(4, rows, dtype=torch.long, device=dev)
        self.codes = torch.zeros(rows, self.cfg.code_groups, dtype=torch.long, device=dev)  # step output

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text-track embeddings of token ids [..., N] -> [..., N, hidden]."""
        return self.talker.text_projection(self.talker.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.talker.model.codec_embedding(ids)

    def codes_embed_of(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, 16] codes of a frame -> [B, 1, hidden], the codec part of the next talker input: the sum of
        each code's embedding in its codebook's table."""
        return F.embedding(codes + self.code_offsets, self.code_table).sum(1, keepdim=True)

    @torch.no_grad()
    def prefill(self, n: int, length: int) -> None:
        """Start the streams described by the first n rows of `prompt_ids` / `prompt_meta`: embed their
        prompts (`length` positions, right-padded; the codec track adds the voice_bank rows the prompt names:
        a cloned voice's x-vector and reference frames, row 0 (zero) elsewhere), fill their rows' caches,
        keep each prompt's last position as the input of its first step, and reset their sampling state."""
        text, codec, vector = self.prompt_ids[:, :n, :length]
        row, last, seed, min_frames = self.prompt_meta[:, :n]
        sampling = self.prompt_sampling[:, :n]
        x = (self.text_embed(text) + torch.where((codec >= 0)[..., None], self.codec_embed(codec.clamp(min=0)), 0)
             + F.embedding(vector, self.voice_bank))

        def kv(cache: KVCache, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # A new stream attends to its own prompt only. Positions from its last one on hold throwaway
            # entries, which its steps overwrite before any query reads them.
            cache.k[row, :, :length] = k
            cache.v[row, :, :length] = v
            return k, v

        cos, sin = self.rope
        self.talker.model(x, self.caches, (cos[:length, None], sin[:length, None]), Prefill(kv))
        self.first_input.index_copy_(0, row, x.gather(1, last[:, None, None].expand(-1, 1, x.shape[-1])))
        # index_fill_/index_copy_: no host scalar to copy in, so the prefill can be captured in a CUDA graph.
        self.seen.index_fill_(0, row, False)
        self.frames.index_fill_(0, row, 0)
        self.seed.index_copy_(0, row, seed)
        self.min_frames.index_copy_(0, row, min_frames)
        self.sampling.index_copy_(1, row, sampling)

    @torch.no_grad()
    def move_row_(self, src: int, dst: int) -> None:
        """Move the stream in row `src` to row `dst` (the predictor's per-frame caches need no move)."""
        self.kv.move_row_(src, dst)
        for state in (self.seen, self.seed, self.frames, self.min_frames, self.codes_embed, self.first_input):
            state[dst] = state[src]
        self.sampling[:, dst] = self.sampling[:, src]

    @torch.no_grad()
    def step(self, b: int) -> None:
        """One frame for rows [0, b), from `step_in` into `codes` [b, 16]; a row whose code 0 is EOS ended."""
        pos, text, live, first = self.step_in[:, :b]
        x = torch.where(first.bool()[:, None, None], self.first_input[:b],
                        self.codes_embed[:b] + self.text_embed(text[:, None]))
        model = self.talker.model
        hidden = model.norm(model(x, self.caches, self.rope, Decode(pos=pos))[:, -1])
        p = self.params
        temperature, top_k, top_p, penalty, *sub = self.sampling[:, :b]
        logits = repetition_penalty(self.talker.codec_head(hidden).float(), self.seen[:b], penalty)
        logits = logits.masked_fill(self.suppress, float("-inf"))
        eos = self.cfg.codec_eos
        logits[:, eos] = logits[:, eos].masked_fill(self.frames[:b] < self.min_frames[:b], float("-inf"))
        # The frame's 16 draws at once (not made when greedy): column 0 for code 0, i for code i.
        u = uniform(self.seed[:b], self.frames[:b], self.cfg.code_groups) if p.do_sample or p.sub_do_sample else None
        code0 = choose(logits, p.do_sample, top_k, top_p, temperature, None if u is None else u[:, 0])
        self.seen[:b].scatter_(1, code0[:, None], self.seen[:b].gather(1, code0[:, None]) | live.bool()[:, None])
        codes = torch.cat([code0[:, None], self.predict_codes(b, hidden, code0, u, sub)], dim=1)
        self.codes[:b] = codes
        self.codes_embed[:b] = torch.where(live.bool()[:, None, None], self.codes_embed_of(codes),
                                           self.codes_embed[:b])
        self.frames[:b] += live

    def predict_codes(self, b: int, hidden: torch.Tensor, code0: torch.Tensor, u: torch.Tensor | None,
                      sampling: list[torch.Tensor]) -> torch.Tensor:
        """Codes 1..15 for talker hidden states [b, hidden] and codes 0 [b]: the 15-step predictor loop,
        each step at fixed positions (prefill of 2, then one at a time) over a fresh per-frame cache;
        `sampling`: the rows' temperature, top-k and top-p of the predictor."""
        cp = self.talker.code_predictor
        p = self.params
        temperature, top_k, top_p = sampling
        x = torch.stack([hidden, self.codec_embed(code0)], dim=1)
        codes = []
        for i in range(self.cfg.code_groups - 1):
            how = Decode(start=0 if i == 0 else i + 1)
            h = cp.model(cp.project(x), self.predictor_caches, self.predictor_rope, how)
            logits = kernels.linear(h[:, -1], cp.lm_head[i].weight, norm=cp.model.norm.fused)
            code = choose(logits, p.sub_do_sample, top_k, top_p, temperature, None if u is None else u[:, i + 1])
            codes.append(code)
            if i + 1 < self.cfg.code_groups - 1:
                x = cp.model.codec_embedding[i](code)[:, None]
        return torch.stack(codes, dim=1)
