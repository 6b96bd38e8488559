"""The batching loop (Batcher): every stream the engine holds, one batched step at a time.

Whoever feeds a stream only appends text and flags under a lock (feed, end, cancel); the loop's one thread
tokenizes (each checkpoint's new text of all its streams in one batched call), steps the model, decodes audio
and hands each packet to the stream's `deliver`. Each pass of the loop runs the jobs queued for it
(preparing a cloned voice), admits waiting streams into free rows, drops cancelled ones, takes in new text,
then runs one engine.runner step per checkpoint: every runnable stream makes one frame in one batch
(continuous batching: streams join and leave between steps, none waits for another). A stream waiting for
its next text token sits the step out and costs a padding row at most.

An engine holds one or more checkpoints (`[engine] checkpoint`, comma-separated), each with its own rows
and CUDA graphs, all in this one loop: a CustomVoice checkpoint speaks its named speakers (and, at 1.7B,
instructions), a Base one voices cloned from reference audio, a VoiceDesign one designed voices. A stream
goes to the checkpoint its voice needs; streams of any voice, conditioning mode and language on one
checkpoint share its batch (a voice changes only a stream's prompt: engine.prompt).

Two front ends share that loop: engine.threaded's QwenTTSEngine runs it in a worker thread of the caller's
process and delivers into an asyncio queue (call_soon_threadsafe); engine.process runs it as the only thread
of an engine process and delivers over IPC.
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import numpy as np
import torch
from prometheus_client import Gauge, Histogram

from engine import checkpoint, clone, kernels
from engine.api import Sampling, TTSChunk, TTSError
from engine.checkpoint import Checkpoint, CheckpointError
from engine.config import EngineConfig
from engine.handles import TextInput
from engine.prompt import PromptError, TextTokens, Voice
from engine.runner import Runner, state_bytes
from engine.sampling import SamplingParams
from engine.stream import Packet, Stream
from engine.voices import VoiceError, VoicePrompt

log = logging.getLogger(__name__)

ACTIVE = Gauge("tts_engine_active_streams", "Streams holding an engine row (generating or waiting for text)",
               multiprocess_mode="livesum")
FIRST_AUDIO = Histogram("tts_engine_first_audio_seconds", "From a stream's open() to its first audio packet",
                        buckets=(.01, .015, .02, .025, .03, .04, .05, .075, .1, .15, .2, .3, .5, 1, 2))

# Language names the checkpoint knows, also by their ISO 639-1 codes (what an STT reports).
ISO_LANGUAGES = {"zh": "chinese", "en": "english", "de": "german", "it": "italian", "pt": "portuguese",
                 "es": "spanish", "ja": "japanese", "ko": "korean", "fr": "french", "ru": "russian"}
# Talker positions a prompt takes before its first frame, beyond an instruction's tokens and a clone's
# reference frames (role 3, control <= 6, first text 1).
PROMPT_POSITIONS = 16
# Characters of a stream's text tokenized at a time. Tokenizing is CPU work on the loop's thread and its
# tokenizer's threads, before the step that needs it: a burst of streams with long texts, tokenized whole,
# delays every stream's first frame by all of it, though a frame reads one token (a few characters).
TEXT_WINDOW = 128


@dataclass
class Model:
    """One checkpoint of the engine: its tokenizer, sampling and rows (a Runner), and the prompt positions
    its rows hold beyond max_frames (`prompt_positions`)."""

    ckpt: Checkpoint
    tokens: TextTokens
    params: SamplingParams
    runner: Runner
    prompt_positions: int
    active: int = 0  # streams holding one of its rows
    noted: bool = False  # the note that it ignores instructions was logged

    @property
    def kind(self) -> str:
        return self.ckpt.config.kind


class Utterance(TextInput):
    """One stream in the batching loop: its text input, fed from any thread under the batcher's lock, and,
    on the loop's thread, its engine.stream.Stream. `deliver` hands each of its packets, then None (the end)
    or an exception, to whoever reads the stream; the loop's thread calls it. `sampling`: its own seed and
    sampling (TTSError when out of range)."""

    def __init__(self, batcher: Batcher, target: tuple[Model, Voice],
                 deliver: Callable[[TTSChunk | BaseException | None], None], sampling: Sampling | None = None) -> None:
        super().__init__(batcher.max_text_chars, batcher.cond)
        if sampling is not None and (problem := sampling.problem()) is not None:
            raise TTSError(problem[1])
        self.model, self.voice = target
        self.sampling = sampling
        self.deliver = deliver
        self.incoming: list[str] = []  # text fed since the loop last took it
        self.opened = time.perf_counter()
        # The loop's own:
        self.core: Stream | None = None
        self.heard = False  # a packet was delivered

    def _accept(self, text: str) -> None:
        self.incoming.append(text)


U = TypeVar("U", bound=Utterance)


# [engine] max_streams = 0 on a GPU: as many streams as the device's free memory at start-up holds caches for in
# this share of it, at most the largest captured batch. The rest is for the steps' working memory (~10 GiB at
# 1024 streams), the VAD and turn models, and whatever else shares the GPU (an LLM server).
AUTO_MEMORY_SHARE = 0.6
AUTO_MAX_STREAMS = 1024
CPU_STREAMS = 4  # max_streams = 0 on a CPU


def auto_streams(ckpts: Sequence[Checkpoint], max_frames: int, max_reference_s: float,
                 max_instructions_tokens: int) -> int:
    """[engine] max_streams = 0 resolved for checkpoints loaded on a GPU (AUTO_MEMORY_SHARE)."""
    positions = [PROMPT_POSITIONS + _room(c, max_reference_s, max_instructions_tokens) for c in ckpts]

    def caches(rows: int) -> int:
        return sum(state_bytes(c, rows, max_frames + p, p) for c, p in zip(ckpts, positions, strict=True))

    per_stream = caches(2) - caches(1)
    free = torch.cuda.mem_get_info(ckpts[0].codec.decoder.pre_conv.conv.weight.device)[0]
    streams = max(1, min(AUTO_MAX_STREAMS, int((free * AUTO_MEMORY_SHARE - caches(1) + per_stream) // per_stream)))
    log.info("[engine] max_streams = 0: %d streams of up to %d frames (%.1f GiB of caches; %.1f GiB free)", streams,
             max_frames, caches(streams) / 2**30, free / 2**30)
    return streams


def _room(ckpt: Checkpoint, max_reference_s: float, max_instructions_tokens: int) -> int:
    """Prompt positions a row of this checkpoint keeps beyond a named speaker's: a reference's codes (Base),
    or instructions (VoiceDesign, CustomVoice 1.7B)."""
    if ckpt.config.kind == "base":
        return clone.reference_frames(max_reference_s) + 1
    return max_instructions_tokens if ckpt.config.follows_instructions else 0


class Batcher:
    """The engine's core over its loaded checkpoints: streams are admitted into free rows of the checkpoint
    their voice needs, take in their text, make a frame each in one batched engine.runner step per
    checkpoint, and get their packets delivered.

    `run_pass` is one pass of that loop and exactly one thread calls it: QwenTTSEngine's worker thread in the
    gateway's process, or the engine process's only thread (engine.process). `admit`, `submit` and the
    utterances' feed/end/cancel may come from any thread. `max_streams` rows per checkpoint. `min_frames`
    bans EOS before that many frames (benchmarks hold EOS off with it; 2 is the official minimum).
    `first_packet_frames` (0 = the same as packet_frames) makes a stream's first packet shorter, so its audio
    starts sooner. A Base checkpoint's rows hold a reference of up to `max_reference_s`, and a checkpoint
    that follows instructions (VoiceDesign, CustomVoice 1.7B) `max_instructions_tokens` of them. A stream
    tokenizes a long text `text_window` characters at a time, as its frames come near them. On a GPU
    the runners capture their CUDA graphs here, before serving (`cuda_graphs`, `graph_max_batch`: see
    engine.runner).
    """

    def __init__(self, ckpts: Checkpoint | Sequence[Checkpoint], *, packet_frames: int = 4, max_frames: int = 1500,
                 max_text_chars: int = 2000, seed: int | None = 0, greedy: bool = False,
                 voices: dict[str, str] | None = None, max_streams: int = 4, min_frames: int = 2,
                 first_packet_frames: int = 0, cuda_graphs: bool = True, graph_max_batch: int = 0,
                 max_reference_s: float = 30.0, max_instructions_tokens: int = 256,
                 text_window: int = TEXT_WINDOW) -> None:
        for name, value in (("packet_frames", packet_frames), ("max_frames", max_frames),
                            ("max_text_chars", max_text_chars), ("max_streams", max_streams),
                            ("max_instructions_tokens", max_instructions_tokens)):
            if value < 1:
                raise CheckpointError(f"[engine] {name} must be >= 1, got {value}")
        if not clone.MIN_REFERENCE_S <= max_reference_s <= 120:
            raise CheckpointError(f"[engine] max_reference_s must be {clone.MIN_REFERENCE_S:g} to 120, "
                                  f"got {max_reference_s}")
        ckpts = [ckpts] if isinstance(ckpts, Checkpoint) else list(ckpts)
        if not ckpts:
            raise CheckpointError("[engine] checkpoint: none given")
        self.packet_frames, self.max_frames, self.max_text_chars = packet_frames, max_frames, max_text_chars
        self.seed, self.min_frames, self.max_streams = seed, min_frames, max_streams
        self.first_packet_frames, self.text_window = first_packet_frames, text_window
        self.max_reference_s, self.max_instructions_tokens = max_reference_s, max_instructions_tokens
        speakers = {s for c in ckpts for s in c.config.speakers}
        self._voice_map = {k.lower(): v.lower() for k, v in (voices or {}).items()} if speakers else {}
        if voices and not speakers:
            log.info("[engine.voices] unused: no CustomVoice checkpoint (sessions name prepared voices)")
        for voice, speaker in self._voice_map.items():
            if speaker not in speakers:
                raise CheckpointError(f"[engine.voices] {voice} = {speaker!r}: the checkpoint has no such speaker "
                                      f"(it has {', '.join(sorted(speakers))})")
        weight = ckpts[0].codec.decoder.pre_conv.conv.weight
        if weight.is_cuda:
            positions = [PROMPT_POSITIONS + _room(c, max_reference_s, max_instructions_tokens) for c in ckpts]
            need = sum(state_bytes(c, max_streams, max_frames + p, p) for c, p in zip(ckpts, positions, strict=True))
            free = torch.cuda.mem_get_info(weight.device)[0]
            if need > free:
                raise CheckpointError(
                    f"[engine] max_streams = {max_streams} streams of up to max_frames = {max_frames} frames need "
                    f"{need / 2**30:.1f} GiB of preallocated caches and {weight.device} has {free / 2**30:.1f} GiB "
                    "free: lower max_streams or max_frames")
            # cuDNN's attention makes an execution plan for each new shape before it runs it, and a prefill's
            # batch and length (and a new voice's reference length, when priming the codec) keep changing;
            # the flash and memory-efficient kernels run any shape at once.
            torch.backends.cuda.enable_cudnn_sdp(False)
        problem = kernels.self_test(weight.device, weight.dtype) if kernels.available(weight) else None
        if problem:
            log.warning("fused kernels off (the engine runs its PyTorch code, slower): %s", problem)
            kernels.set_enabled(False)
        self.models: list[Model] = []
        for ckpt in ckpts:
            positions = PROMPT_POSITIONS + _room(ckpt, max_reference_s, max_instructions_tokens)
            params = SamplingParams.from_generation_config(ckpt.generation, greedy)
            runner = Runner(ckpt, max_streams, max_frames + positions, params, packet_frames, first_packet_frames,
                            cuda_graphs=cuda_graphs, graph_max_batch=graph_max_batch, max_prompt=positions)
            self.models.append(Model(ckpt, TextTokens(ckpt.tokenizer), params, runner, positions))
        _freeze_what_lives()
        self.cond = threading.Condition()
        self._waiting: deque[Utterance] = deque()
        self._active: dict[Stream, Utterance] = {}
        self._jobs: deque[tuple[Callable[[], Any], Callable[[Any], None]]] = deque()
        self._closed = False
        self.opened = 0  # streams admitted since start

    @classmethod
    def from_config(cls, config: EngineConfig) -> Self:
        kernels.set_enabled(config.fused_kernels)
        paths = [c.strip() for c in config.checkpoint.split(",") if c.strip()] or [""]
        ckpts = [checkpoint.load(path, device=config.device, dtype=config.dtype) for path in paths]
        gpu = ckpts[0].codec.decoder.pre_conv.conv.weight.is_cuda
        streams = config.max_streams or (
            auto_streams(ckpts, config.max_frames, config.max_reference_s, config.max_instructions_tokens) if gpu
            else CPU_STREAMS)
        return cls(ckpts, packet_frames=config.packet_frames, max_frames=config.max_frames,
                   max_text_chars=config.max_text_chars, seed=config.seed, greedy=config.greedy,
                   voices=config.voices, max_streams=streams,
                   first_packet_frames=config.first_packet_frames, cuda_graphs=config.cuda_graphs,
                   graph_max_batch=config.graph_max_batch, max_reference_s=config.max_reference_s,
                   max_instructions_tokens=config.max_instructions_tokens)

    @property
    def device(self) -> Any:
        return self.models[0].runner.device

    @property
    def voices(self) -> frozenset[str]:
        """OpenAI voice names mapped in [engine.voices], and the CustomVoice checkpoints' own speakers."""
        return frozenset(self._voice_map) | frozenset(s for m in self.models for s in m.ckpt.config.speakers)

    @property
    def kinds(self) -> list[str]:
        """What the checkpoints are, in order: custom_voice, voice_design, base."""
        return [m.kind for m in self.models]

    @property
    def fingerprints(self) -> list[str]:
        """The Base checkpoints' fingerprints, in order (prepare_voice uses the first): a voice cloned for one
        of them is spoken as it is; one cloned for another checkpoint must be prepared again."""
        return [m.ckpt.fingerprint for m in self.models if m.kind == "base"]

    @property
    def follows_instructions(self) -> bool:
        """Whether a named speaker's stream follows instructions (a CustomVoice 1.7B checkpoint holds it)."""
        return any(m.kind == "custom_voice" and m.ckpt.config.follows_instructions for m in self.models)

    @property
    def languages(self) -> frozenset[str]:
        """What a stream's language may be: auto, the checkpoints' languages, their ISO 639-1 codes."""
        names = {k for m in self.models for k in m.ckpt.config.languages if "dialect" not in k}
        return frozenset({"auto"} | names | {code for code, name in ISO_LANGUAGES.items() if name in names})

    def resolve(self, voice: str, language: str | None, prompt: VoicePrompt | None = None,
                instructions: str | None = None) -> tuple[Model, Voice]:
        """The checkpoint and the conditioning of a stream: a named speaker (an OpenAI voice name from
        [engine.voices], or a speaker) on the CustomVoice checkpoint that has it, or a prepared voice
        (`prompt`; `voice` is then only its name) on the Base checkpoint it was cloned for or a VoiceDesign
        one. TTSError says why a voice cannot be spoken."""
        lang = ISO_LANGUAGES.get((language or "auto").lower(), language)
        model = self._model_for(voice, prompt)
        speaker = None if prompt is not None else self._voice_map.get(voice.lower(), voice)
        try:
            spoken = Voice.resolve(model.ckpt.config, speaker, lang, tokens=model.tokens, clone=prompt,
                                   instructions=instructions)
        except PromptError as exc:
            raise TTSError(str(exc)) from None
        if instructions and not spoken.instruct_ids and not model.noted:
            model.noted = True
            log.info("the %s CustomVoice checkpoint does not follow instructions (as the official code, it "
                     "ignores them)", model.ckpt.config.size or "0.6B")
        positions = spoken.positions(model.ckpt.config)
        if positions > model.prompt_positions:
            what = "reference" if prompt is not None and prompt.mode == "icl" else "instructions"
            limit = ("max_reference_s" if what == "reference" else "max_instructions_tokens")
            raise TTSError(f"the voice's {what} take {positions} prompt positions; this engine holds "
                           f"{model.prompt_positions} ([engine] {limit})")
        return model, spoken

    def _model_for(self, voice: str, prompt: VoicePrompt | None) -> Model:
        if prompt is None:
            speaker = self._voice_map.get(voice.lower(), voice.lower())
            for model in self.models:
                if speaker in model.ckpt.config.speakers:
                    return model
            raise TTSError(f"unknown speaker {voice!r}; the engine has {', '.join(sorted(self.voices)) or 'none'}")
        if prompt.kind == "design":
            for model in self.models:
                if model.kind == "voice_design":
                    return model
            raise TTSError("a designed voice needs a VoiceDesign checkpoint; the engine has none")
        bases = [m for m in self.models if m.kind == "base"]
        for model in bases:
            if model.ckpt.fingerprint == prompt.model.get("fingerprint"):
                return model
        if bases:
            raise TTSError(f"the cloned voice was prepared for another checkpoint (a {prompt.model.get('size', '?')} "
                           f"Base); prepare it again with this engine")
        raise TTSError("a cloned voice needs a Base checkpoint; the engine has none")

    def admit(self, utterance: U) -> U:
        """Queue a new utterance for a free row."""
        with self.cond:
            if self._closed:
                raise TTSError("the engine is closed")
            self._waiting.append(utterance)
            self.cond.notify()
        return utterance

    def submit(self, job: Callable[[], Any], deliver: Callable[[Any], None]) -> None:
        """Run `job` on the loop's thread before its next step (model work that is no stream's, such as
        preparing a voice); `deliver` gets its result, or the exception it raised."""
        with self.cond:
            if self._closed:
                raise TTSError("the engine is closed")
            self._jobs.append((job, deliver))
            self.cond.notify()

    def prepare_voice(self, audio: np.ndarray, sample_rate: int, text: str | None = None) -> VoicePrompt:
        """Clone the voice of a reference recording (float32 mono samples at `sample_rate`, with its
        transcript for in-context cloning) with the engine's (first) Base checkpoint (engine.clone.prepare).
        Runs the encoders: call it on the loop's thread (a job: `submit`). The voice's first stream on this
        engine finds it ready on the device (engine.runner.ClonedVoices)."""
        base = next((m for m in self.models if m.kind == "base"), None)
        if base is None:
            raise TTSError("cloning a voice needs a Base checkpoint; the engine has none")
        try:
            voice = clone.prepare(base.ckpt, audio, sample_rate, text, self.max_reference_s)
        except VoiceError as exc:
            raise TTSError(str(exc)) from None
        base.runner.voices.get(voice)
        return voice

    @property
    def load(self) -> int:
        """Streams holding a row or waiting for one."""
        with self.cond:
            return len(self._active) + len(self._waiting)

    @property
    def free_streams(self) -> int:
        """Rows neither held nor waited for, on every checkpoint (the gateway's readiness and /metrics)."""
        return max(0, self.max_streams * len(self.models) - self.load)

    def counters(self) -> dict[str, Any]:
        """Streams held now, and the runners' counters since start, summed (what the benchmarks read)."""
        with self.cond:
            streams, waiting = len(self._active), len(self._waiting)
        runners = [m.runner for m in self.models]
        gpu = self.device.type == "cuda"
        return {"streams": streams, "waiting": waiting, "rows": self.max_streams * len(runners), "opened": self.opened,
                "steps": sum(r.steps for r in runners), "frames": sum(r.frames for r in runners),
                "step_seconds": round(sum(r.step_seconds for r in runners), 6),
                "gpu_seconds": round(sum(r.gpu_seconds for r in runners), 6) if gpu else None,
                "device": str(self.device), "kinds": self.kinds}

    # -- the loop (one thread) --
    def has_work(self) -> bool:
        with self.cond:
            if self._closed or self._jobs or any(m.runner.busy for m in self.models):
                return True
            if any(s.cancelled or s.model.active < self.max_streams for s in self._waiting):
                return True
            return any(s.cancelled or s.incoming or (s.ended and not core.final) or core.runnable or core.wants_text
                       for core, s in self._active.items())

    def run_pass(self) -> None:
        """Run queued jobs, admit waiting streams, drop cancelled ones, pass on new text, run one step per
        checkpoint, deliver the packets."""
        with self.cond:
            jobs, self._jobs = self._jobs, deque()
        for job, deliver in jobs:
            try:
                result = job()
            except Exception as exc:  # handed to whoever asked, never the loop's problem
                result = exc
            deliver(result)
        with self.cond:
            self._admit()
            work = [(s, s.incoming, s.ended, s.cancelled) for s in self._active.values()]
            for s in self._active.values():
                s.incoming = []
        ready: list[tuple[Utterance, tuple[str, bool]]] = []
        for stream, fragments, ended, cancelled in work:
            if cancelled:
                self._release(stream)
            elif fragments or (ended and not stream.core.final) or stream.core.wants_text:
                self._guard(stream, lambda s=stream, f=fragments, e=ended:
                            ready.append((s, s.core.take_text("".join(f), e))))
        # Each checkpoint's new text in one tokenizer call (1024 streams opened at once: ~10x faster).
        for model in self.models:
            mine = [(s, piece) for s, piece in ready if s.model is model]
            encoded = iter(model.tokens.encode_ready([piece for _, piece in mine if piece[0]]))
            for stream, (text, _) in mine:
                tokens = next(encoded) if text else (0, [], [])
                self._guard(stream, lambda s=stream, t=tokens: s.core.add_tokens(*t))
        for model in self.models:
            if model.active or model.runner.busy:
                self._step(model)

    def _step(self, model: Model) -> None:
        try:
            events = model.runner.step()
        except Exception as exc:  # a failed step fails the streams in it, never the loop
            log.exception("qwen3-tts step failed")
            for stream in [s for s in self._active.values() if s.model is model]:
                stream.deliver(exc)
                self._release(stream)
            return
        for core, packet in events:
            stream = self._active.get(core)
            if stream is None:
                continue  # released (cancelled) while its packet was on its way
            if packet is not None:
                if not stream.heard:
                    stream.heard = True
                    FIRST_AUDIO.observe(time.perf_counter() - stream.opened)
                stream.deliver(_chunk(packet))
            if packet is None or packet.last:
                stream.deliver(None)
                self._release(stream)

    def fail_all(self, error: BaseException) -> None:
        """Close the engine: every stream it holds or queues ends with `error`, and every queued job."""
        with self.cond:
            self._closed = True
            streams = list(self._active.values()) + list(self._waiting)
            jobs, self._jobs = self._jobs, deque()
        for stream in streams:
            stream.deliver(error)
        for _, deliver in jobs:
            deliver(error)

    def _admit(self) -> None:
        kept: deque[Utterance] = deque()
        while self._waiting:
            stream = self._waiting.popleft()
            if stream.cancelled:
                continue
            model = stream.model
            if model.active >= self.max_streams:
                kept.append(stream)
                continue
            own = stream.sampling
            seed = self.seed if own is None or own.seed is None else own.seed
            stream.core = Stream(model.ckpt, model.tokens, stream.voice, seed, self.packet_frames,
                                 self.max_frames, self.min_frames, first_packet_frames=self.first_packet_frames,
                                 params=None if own is None else model.params.with_overrides(own),
                                 text_window=self.text_window)
            model.runner.add(stream.core)
            model.active += 1
            self._active[stream.core] = stream
            self.opened += 1
        self._waiting = kept
        ACTIVE.set(len(self._active))

    def _guard(self, stream: Utterance, action: Callable[[], Any]) -> None:
        try:
            action()
        except PromptError as exc:
            stream.deliver(TTSError(str(exc)))
            self._release(stream)
        except Exception as exc:  # a failing stream must not take the loop (and every other stream) down
            log.exception("qwen3-tts stream failed")
            stream.deliver(exc)
            self._release(stream)

    def _release(self, stream: Utterance) -> None:
        with self.cond:
            core = stream.core
            if core is not None and self._active.pop(core, None) is not None:
                if core.row >= 0:
                    stream.model.runner.remove(core)
                stream.model.active -= 1
                ACTIVE.set(len(self._active))


def _freeze_what_lives() -> None:
    """The loop allocates thousands of small containers a step (codes, packets), so the cyclic collector runs
    often, and a full collection walks every object in the process: the libraries' and the checkpoint's
    (hundreds of thousands) included, a pause of 100 ms and more in the loop. Those all live as long as the
    engine: frozen, the collector leaves them out of its walks (until exit, where they are collected as usual,
    so that extension modules see their objects freed)."""
    gc.collect()
    gc.freeze()


atexit.register(gc.unfreeze)  # what _freeze_what_lives froze is collected at exit


def _chunk(packet: Packet) -> TTSChunk:
    return TTSChunk(pcm=packet.pcm, text=packet.text)
