"""The batching loop (Batcher): every stream the engine holds, one batched step at a time.

Whoever feeds a stream only appends text and flags under a lock (feed, end, cancel); the loop's one thread
tokenizes (all streams' new text in one batched call), steps the model, decodes audio and hands each packet
to the stream's `deliver`. Each pass of the
loop admits waiting streams into free rows, drops cancelled ones, takes in new text, then runs one
engine.runner step: every runnable stream makes one frame in one batch (continuous batching: streams join
and leave between steps, none waits for another). A stream waiting for its next text token sits the step
out and costs a padding row at most.

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
from collections.abc import Callable
from typing import Any, Self, TypeVar

import torch
from prometheus_client import Gauge, Histogram

from engine import checkpoint, kernels
from engine.api import TTSChunk, TTSError
from engine.checkpoint import Checkpoint, CheckpointError
from engine.config import EngineConfig
from engine.handles import TextInput
from engine.prompt import PromptError, TextTokens, Voice
from engine.runner import Runner, state_bytes
from engine.sampling import SamplingParams
from engine.stream import Packet, Stream

log = logging.getLogger(__name__)

ACTIVE = Gauge("tts_engine_active_streams", "Streams holding an engine row (generating or waiting for text)",
               multiprocess_mode="livesum")
FIRST_AUDIO = Histogram("tts_engine_first_audio_seconds", "From a stream's open() to its first audio packet",
                        buckets=(.01, .015, .02, .025, .03, .04, .05, .075, .1, .15, .2, .3, .5, 1, 2))

# Language names the checkpoint knows, also by their ISO 639-1 codes (what an STT reports).
ISO_LANGUAGES = {"zh": "chinese", "en": "english", "de": "german", "it": "italian", "pt": "portuguese",
                 "es": "spanish", "ja": "japanese", "ko": "korean", "fr": "french", "ru": "russian"}
# Talker positions a streaming prompt takes before its first frame (role 3, control <= 6, first text 1).
PROMPT_POSITIONS = 16


class Utterance(TextInput):
    """One stream in the batching loop: its text input, fed from any thread under the batcher's lock, and,
    on the loop's thread, its engine.stream.Stream. `deliver` hands each of its packets, then None (the end)
    or an exception, to whoever reads the stream; the loop's thread calls it."""

    def __init__(self, batcher: Batcher, voice: Voice,
                 deliver: Callable[[TTSChunk | BaseException | None], None]) -> None:
        super().__init__(batcher.max_text_chars, batcher.cond)
        self.voice = voice
        self.deliver = deliver
        self.incoming: list[str] = []  # text fed since the loop last took it
        self.opened = time.perf_counter()
        # The loop's own:
        self.core: Stream | None = None
        self.heard = False  # a packet was delivered

    def _accept(self, text: str) -> None:
        self.incoming.append(text)


U = TypeVar("U", bound=Utterance)


class Batcher:
    """The engine's core over one loaded checkpoint: streams are admitted into free rows, take in their text,
    make a frame each in one batched engine.runner step, and get their packets delivered.

    `run_pass` is one pass of that loop and exactly one thread calls it: QwenTTSEngine's worker thread in the
    gateway's process, or the engine process's only thread (engine.process). `admit` and the utterances'
    feed/end/cancel may come from any thread. `min_frames` bans EOS before that many frames (benchmarks hold
    EOS off with it; 2 is the official minimum). `first_packet_frames` (0 = the same as packet_frames)
    makes a stream's first packet shorter, so its audio starts sooner. On a GPU the runner captures its CUDA
    graphs here, before serving (`cuda_graphs`, `graph_max_batch`: see engine.runner).
    """

    def __init__(self, ckpt: Checkpoint, *, packet_frames: int = 4, max_frames: int = 1500,
                 max_text_chars: int = 2000, seed: int | None = 0, greedy: bool = False,
                 voices: dict[str, str] | None = None, max_streams: int = 4, min_frames: int = 2,
                 first_packet_frames: int = 0, cuda_graphs: bool = True, graph_max_batch: int = 0) -> None:
        for name, value in (("packet_frames", packet_frames), ("max_frames", max_frames),
                            ("max_text_chars", max_text_chars), ("max_streams", max_streams)):
            if value < 1:
                raise CheckpointError(f"[engine] {name} must be >= 1, got {value}")
        self.ckpt = ckpt
        self.tokens = TextTokens(ckpt.tokenizer)
        self.params = SamplingParams.from_generation_config(ckpt.generation, greedy)
        self.packet_frames, self.max_frames, self.max_text_chars = packet_frames, max_frames, max_text_chars
        self.seed, self.min_frames, self.max_streams = seed, min_frames, max_streams
        self.first_packet_frames = first_packet_frames
        self._voice_map = {k.lower(): v.lower() for k, v in (voices or {}).items()}
        for voice, speaker in self._voice_map.items():
            if speaker not in ckpt.config.speakers:
                raise CheckpointError(f"[engine.voices] {voice} = {speaker!r}: the checkpoint has no such speaker "
                                      f"(it has {', '.join(sorted(ckpt.config.speakers))})")
        weight = ckpt.codec.decoder.pre_conv.conv.weight
        if weight.is_cuda:
            need = state_bytes(ckpt, max_streams, max_frames + PROMPT_POSITIONS)
            free = torch.cuda.mem_get_info(weight.device)[0]
            if need > free:
                raise CheckpointError(
                    f"[engine] max_streams = {max_streams} streams of up to max_frames = {max_frames} frames need "
                    f"{need / 2**30:.1f} GiB of preallocated caches and {weight.device} has {free / 2**30:.1f} GiB "
                    "free: lower max_streams or max_frames")
        problem = kernels.self_test(weight.device, weight.dtype) if kernels.available(weight) else None
        if problem:
            log.warning("fused kernels off (the engine runs its PyTorch code, slower): %s", problem)
            kernels.set_enabled(False)
        self.runner = Runner(ckpt, max_streams, max_frames + PROMPT_POSITIONS, self.params, packet_frames,
                             first_packet_frames, cuda_graphs=cuda_graphs, graph_max_batch=graph_max_batch)
        _freeze_what_lives()
        self.cond = threading.Condition()
        self._waiting: deque[Utterance] = deque()
        self._active: dict[Stream, Utterance] = {}
        self._closed = False
        self.opened = 0  # streams admitted since start

    @classmethod
    def from_config(cls, config: EngineConfig) -> Self:
        kernels.set_enabled(config.fused_kernels)
        ckpt = checkpoint.load(config.checkpoint, device=config.device, dtype=config.dtype)
        gpu = ckpt.codec.decoder.pre_conv.conv.weight.is_cuda
        return cls(ckpt, packet_frames=config.packet_frames, max_frames=config.max_frames,
                   max_text_chars=config.max_text_chars, seed=config.seed, greedy=config.greedy,
                   voices=config.voices, max_streams=config.max_streams or (64 if gpu else 4),
                   first_packet_frames=config.first_packet_frames, cuda_graphs=config.cuda_graphs,
                   graph_max_batch=config.graph_max_batch)

    @property
    def voices(self) -> frozenset[str]:
        """OpenAI voice names mapped in [engine.voices], and the checkpoint's own speakers."""
        return frozenset(self._voice_map) | frozenset(self.ckpt.config.speakers)

    @property
    def languages(self) -> frozenset[str]:
        """What a stream's language may be: auto, the checkpoint's languages, their ISO 639-1 codes."""
        names = {k for k in self.ckpt.config.languages if "dialect" not in k}
        return frozenset({"auto"} | names | {code for code, name in ISO_LANGUAGES.items() if name in names})

    def resolve(self, voice: str, language: str | None) -> Voice:
        """The checkpoint's speaker and language for an OpenAI voice name (or a speaker) and a language."""
        speaker = self._voice_map.get(voice.lower(), voice)
        lang = ISO_LANGUAGES.get((language or "auto").lower(), language)
        try:
            return Voice.resolve(self.ckpt.config, speaker, lang)
        except PromptError as exc:
            raise TTSError(str(exc)) from None

    def admit(self, utterance: U) -> U:
        """Queue a new utterance for a free row."""
        with self.cond:
            if self._closed:
                raise TTSError("the engine is closed")
            self._waiting.append(utterance)
            self.cond.notify()
        return utterance

    @property
    def load(self) -> int:
        """Streams holding a row or waiting for one."""
        with self.cond:
            return len(self._active) + len(self._waiting)

    @property
    def free_streams(self) -> int:
        """Rows neither held nor waited for (the gateway's readiness and /metrics read it)."""
        return max(0, self.max_streams - self.load)

    def counters(self) -> dict[str, Any]:
        """Streams held now, and the runner's counters since start (what the benchmarks read)."""
        with self.cond:
            streams, waiting = len(self._active), len(self._waiting)
        runner = self.runner
        return {"streams": streams, "waiting": waiting, "rows": self.max_streams, "opened": self.opened,
                "steps": runner.steps, "frames": runner.frames, "step_seconds": round(runner.step_seconds, 6),
                "gpu_seconds": round(runner.gpu_seconds, 6) if runner.device.type == "cuda" else None,
                "device": str(runner.device)}

    # -- the loop (one thread) --
    def has_work(self) -> bool:
        with self.cond:
            if self._closed or self.runner.busy:
                return True
            if self._waiting and (len(self._active) < self.max_streams or any(s.cancelled for s in self._waiting)):
                return True
            return any(s.cancelled or s.incoming or (s.ended and not core.final) or core.runnable
                       for core, s in self._active.items())

    def run_pass(self) -> None:
        """Admit waiting streams, drop cancelled ones, pass on new text, run one step, deliver its packets."""
        with self.cond:
            self._admit()
            work = [(s, s.incoming, s.ended, s.cancelled) for s in self._active.values()]
            for s in self._active.values():
                s.incoming = []
        ready: list[tuple[Utterance, str]] = []
        for stream, fragments, ended, cancelled in work:
            if cancelled:
                self._release(stream)
            elif fragments or (ended and not stream.core.final):
                self._guard(stream, lambda s=stream, f=fragments, e=ended:
                            ready.append((s, s.core.take_text("".join(f), e))))
        # The new text of every stream in one tokenizer call (1024 streams opened at once: ~10x faster).
        texts = [text for _, text in ready if text]
        encoded = iter(self.tokens.encode_many(texts) if texts else [])
        for stream, text in ready:
            ids, spans = next(encoded) if text else ([], [])
            self._guard(stream, lambda s=stream, t=text, i=ids, p=spans: s.core.add_tokens(t, i, p))
        try:
            events = self.runner.step()
        except Exception as exc:  # a failed step fails the streams in it, never the loop
            log.exception("qwen3-tts step failed")
            for stream in list(self._active.values()):
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
        """Close the engine: every stream it holds or queues ends with `error`."""
        with self.cond:
            self._closed = True
            streams = list(self._active.values()) + list(self._waiting)
        for stream in streams:
            stream.deliver(error)

    def _admit(self) -> None:
        kept: deque[Utterance] = deque()
        while self._waiting:
            stream = self._waiting.popleft()
            if stream.cancelled:
                continue
            if len(self._active) >= self.max_streams:
                kept.append(stream)
                continue
            stream.core = Stream(self.ckpt, self.tokens, stream.voice, self.seed, self.packet_frames,
                                 self.max_frames, self.min_frames, first_packet_frames=self.first_packet_frames)
            self.runner.add(stream.core)
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
                    self.runner.remove(core)
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
