"""Continuous batching: every running stream advances one frame per step, in one batch.

A `Runner` owns the model's rows. Streams join (`add`) and leave (`remove`) between steps; the rows in use
stay packed at [0, n) (a leaving stream's row takes the last stream), so a step over n streams is a step
over rows [0, b) for the smallest captured batch size b >= n, and the rows past n are throwaway padding.
A step prefills the streams that start (their prompts batched, right-padded to the next of PREFILL_LENS),
launches one frame for all rows (talker, sampling, the 15-step code predictor), then, while that frame runs
on the device, hands out the packets the previous step decoded, takes the codes of the frame the previous
step launched, and queues the packets now due in one batched codec step per packet size, padding a short
last packet with frames whose samples are cut (the codec is causal, so they change nothing before them).
Streams waiting for text sit it out.

The host waits for the device only for what it hands out, and the device always has the next frame queued
behind it: launching a frame before reading the previous one's codes keeps the device busy through the
host's bookkeeping, and a packet's samples reach the host memory behind the frame after it, so the host
never waits on a packet with the device idle. The price is one frame of latency on each packet, and a
stream that says EOS has made one more frame by then, which is dropped. A stream's first packet, when it
holds one frame (`first_packet_frames` = 1), is decoded straight behind the frame that makes it, from the
codes still on the device: that frame cannot be EOS (EOS is banned before two frames), so nothing waits for
the host to read it, and first audio takes a prefill, a frame and a one-frame codec step. Every device
operation is ordered on one CUDA stream, so row moves, prefills and packet decodes queued after a launched
frame see its results.

On a GPU each of these is captured at start-up as one CUDA graph per batch size (1, 2, 4, ... up to the
rows, or `graph_max_batch`); the longer prompts (an in-context clone's reference, an instruction) are
captured at the small batch sizes only, where launching a prefill's layers one by one would cost more than
running them; a batch with no graph, a prompt longer than any captured one, and everything on a CPU run the
same functions eagerly.

A cloned voice reaches the prompt through the model's voice bank: its x-vector and its reference frames'
summed code embeddings are written there once, on the device, when its first stream starts, and a prompt
names bank rows, so a clone costs a prefill no more host work than a named speaker. An in-context clone's
decoder state after its reference codes is kept beside them (`ClonedVoices`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy
import torch
from prometheus_client import Counter, Histogram

from engine.checkpoint import Checkpoint
from engine.codec import CodecDecoder, CodecState
from engine.prompt import NO_CODEC, Prompt, PromptError, TextTokens, Voice
from engine.sampling import SamplingParams
from engine.stream import Packet, Stream
from engine.talker import Qwen3TTS
from engine.voices import VoicePrompt

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024)
# Prompt positions of a captured prefill: a streaming prompt takes 9 to 11 (role, control tags, first token),
# an in-context clone's 12.5 a second of reference and its transcript, an instructed one its instruction.
PREFILL_LEN = 16
PREFILL_LENS = (PREFILL_LEN, 64, 128, 192, 256, 384, 512)
# The batch sizes the longer prefills are captured at: a larger batch of long prompts is compute-bound, and
# runs eagerly at its own length rather than padded to the next captured one.
LONG_PREFILL_BATCH = 8
# Frames decoded per call when priming the decoder with an in-context clone's reference codes.
PRIME_CHUNK = 64
SPIN_STREAMS = 16  # with more streams running, the runner's waits for the device sleep (see _event)
STEP_SECONDS = Histogram("tts_engine_step_seconds", "Wall time of one engine step (every running stream makes a "
                         "frame; due packets decoded)", buckets=(.002, .004, .006, .008, .01, .015, .02, .03, .04,
                                                                 .06, .08, .1, .15, .25, .5))
BATCH = Histogram("tts_engine_batch_size", "Streams that made a frame in one engine step", buckets=BATCH_SIZES)
STEPS = Counter("tts_engine_steps_total", "Batched steps by stage (prefill: new streams' prompts; frame: talker + "
                "code predictor; packet: codec decode) and path (graph: CUDA graph replay; eager: no graph for "
                "that batch size or prompt length, or no GPU)",
                ["stage", "path"])


@dataclass
class _Launched:
    """A frame on its way: the streams in it with their rows at launch, and its codes once `done`; `first`:
    the streams whose one-frame first packet was decoded behind it, each with its row in `first_pcm`."""

    streams: list[tuple[Stream, int]]
    codes: torch.Tensor  # [b, 16] host memory
    done: torch.cuda.Event | None  # None on a CPU, where the copy is synchronous
    first: dict[Stream, int]
    first_pcm: torch.Tensor | None  # [n, samples] int16 host memory, ready after the first packets' event
    first_done: torch.cuda.Event | None


@dataclass
class _Decoded:
    """Packets on their way: each stream's packet (its pcm filled in once `done`), its row in `pcm` and frames."""

    packets: list[tuple[Stream, Packet, int, int]]
    pcm: torch.Tensor  # [b, samples] int16 host memory
    done: torch.cuda.Event | None


class Graphs:
    """fn(b) captured as one CUDA graph per batch size in `sizes` (fn reads and writes only preallocated
    tensors); `run(n)` replays the smallest captured size >= n, or runs fn(n) eagerly when there is none."""

    def __init__(self, stage: str, fn: Callable[[int], None], sizes: list[int], pool: tuple | None) -> None:
        self.stage, self.fn = stage, fn
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        for b in sorted(sizes, reverse=True):  # the largest first: the smaller ones reuse its memory pool
            start = time.perf_counter()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(b)  # lazy initialisation (cuBLAS handles and workspaces) must happen outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                fn(b)
            self.graphs[b] = graph
            log.info("captured the %s step for batch %d in %.2f s", stage, b, time.perf_counter() - start)

    def size(self, n: int) -> int:
        return min((b for b in self.graphs if b >= n), default=n)

    def run(self, b: int) -> None:
        graph = self.graphs.get(b)
        if graph is None:
            self.fn(b)
        else:
            graph.replay()
        STEPS.labels(self.stage, "eager" if graph is None else "graph").inc()


def state_bytes(ckpt: Checkpoint, rows: int, max_len: int, max_prompt: int = 0) -> int:
    """Device memory of what a Runner preallocates for `rows` streams of up to `max_len` talker positions, and
    of prompts of up to `max_prompt` (0: max_len): the talker's KV caches (a row more for scratch; positions
    rounded up to 16 as Qwen3TTS.setup does), the code predictor's, the codec's streaming state (twice: the
    streams' rows and a scratch row, and a batch gathered from them), and on a Base checkpoint what it keeps
    of as many cloned voices as rows (ClonedVoices: bank slots, primed decoder states).
    The talker's caches dominate: 112 KiB a position for both released sizes (28 layers x 8 KV heads x 128)."""
    itemsize = next(ckpt.model.parameters()).element_size()
    talker, predictor = ckpt.config.talker, ckpt.config.predictor
    positions = (rows + 1) * talker.layers * -(-max_len // 16) * 16 * talker.kv_heads * talker.head_dim
    positions += rows * predictor.layers * ckpt.config.code_groups * predictor.kv_heads * predictor.head_dim
    one = ckpt.codec.new_state(1)
    codec = sum(t.nbytes for t in (one.memory, one.keys, one.values, one.pos))
    total = 2 * positions * itemsize + (2 * rows + 1) * codec
    if ckpt.config.kind == "base":
        total += (1 + rows * (max_prompt or max_len)) * talker.hidden * itemsize + rows * codec
    return total


class PacketDecoder:
    """Codec steps over the streams whose packet is due: their rows of one streaming state are gathered
    into a batch, decoded `frames` frames each (one buffer per packet size), and written back; pcm16
    comes out on the device, and is copied to host memory behind the step (`host`; `first_host`, two of
    them, for the first packets decoded as a frame is launched)."""

    def __init__(self, codec: CodecDecoder, rows: int, sizes: list[int]) -> None:
        self.codec, self.rows = codec, rows
        self.state = codec.new_state(rows + 1)  # row `rows` takes what the padding rows of a batch write
        self.stage = codec.new_state(rows)
        dev = self.state.pos.device
        self.index = torch.full((rows,), rows, dtype=torch.long, device=dev)
        q, spf = codec.cfg.num_quantizers, codec.samples_per_frame
        self.codes = {n: torch.zeros(rows, q, n, dtype=torch.long, device=dev) for n in sizes}
        self.pcm = {n: torch.zeros(rows, n * spf, dtype=torch.int16, device=dev) for n in sizes}
        pinned = dev.type == "cuda"
        self.host = {n: torch.zeros(rows, n * spf, dtype=torch.int16, pin_memory=pinned) for n in sizes}
        self.first_host = [torch.zeros(rows, spf, dtype=torch.int16, pin_memory=pinned) for _ in range(2)]

    @torch.no_grad()
    def primed(self, codes: torch.Tensor) -> CodecState:
        """The one-stream state that decoding an in-context clone's reference codes [frames, 16] leaves: the
        official code decodes reference and new codes together and cuts the reference's audio off. Decoded
        PRIME_CHUNK frames a call (bounded activations) on rings that wide, then moved to this decoder's."""
        wide = self.codec.new_state(1, frames=PRIME_CHUNK)
        self.codec.decode_step(codes.T[None], wide)
        return wide.resized(self.state.keys.shape[3], codes.shape[0])

    @torch.no_grad()
    def decode(self, b: int, frames: int) -> None:
        index, stage = self.index[:b], self.stage.narrow(0, b)
        stage.load_rows_(self.state, index)
        wav = self.codec.decode_step(self.codes[frames][:b], stage)
        stage.store_rows_(self.state, index)
        self.pcm[frames][:b] = (wav.clamp(-1, 1) * 32767).round().to(torch.int16)

    def set_rows(self, rows: list[int], b: int) -> None:
        """The state rows of a batch of b: `rows`, then the scratch row for the padding."""
        self.index[:b].copy_(torch.tensor(rows + [self.rows] * (b - len(rows))), non_blocking=True)

    def first_frames_of(self, codes: torch.Tensor, b: int) -> None:
        """The one-frame packets of the batch's rows (set_rows) from the model's codes [rows, 16], on the device."""
        self.codes[1][:b, :, 0] = codes.index_select(0, self.index[:b].clamp(max=self.rows - 1))


class ClonedVoices:
    """What a runner keeps of each cloned voice its streams speak in, most recent last, up to `capacity`
    voices (its rows: every running stream may speak in its own, and none is dropped while a prefill names
    it): a slot of `slot_rows` rows in the model's voice bank (the x-vector, then an in-context clone's
    reference frames as summed code embeddings) and an in-context clone's primed decoder state. Both are made
    on the device when the voice's first stream starts, without waiting for it."""

    def __init__(self, model: Qwen3TTS, decoder: PacketDecoder, capacity: int, slot_rows: int) -> None:
        self.model, self.decoder = model, decoder
        self.capacity, self.slot_rows = capacity, slot_rows
        self.kept: OrderedDict[str, tuple[int, CodecState | None]] = OrderedDict()

    @torch.no_grad()
    def get(self, clone: VoicePrompt) -> tuple[int, CodecState | None]:
        """The voice's first bank row (its x-vector; its reference frames follow) and its primed decoder state
        (None for an x-vector clone)."""
        kept = self.kept.pop(clone.key, None)
        if kept is None:
            if clone.frames + 1 > self.slot_rows:
                raise PromptError(f"the voice's reference of {clone.frames} frames is longer than this runner's "
                                  f"prompts hold ({self.slot_rows} positions)")
            if len(self.kept) < self.capacity:
                row = 1 + len(self.kept) * self.slot_rows
            else:
                row = self.kept.popitem(last=False)[1][0]
            bank = self.model.voice_bank
            primed = None
            if clone.speaker is not None:
                bank[row] = torch.from_numpy(clone.speaker).to(bank.device, non_blocking=True)
            if clone.codes is not None:
                codes = torch.from_numpy(clone.codes).to(bank.device, non_blocking=True)
                bank[row + 1:row + 1 + len(codes)] = self.model.codes_embed_of(codes)[:, 0]
                primed = self.decoder.primed(codes)
            kept = row, primed
        self.kept[clone.key] = kept
        return kept


class Runner:
    """Up to `rows` streams of up to `max_len` talker positions, with prompts of up to `max_prompt` (0:
    max_len), sampled with `params` unless a stream brings its own (Stream.params)."""

    def __init__(self, ckpt: Checkpoint, rows: int, max_len: int, params: SamplingParams, packet_frames: int,
                 first_packet_frames: int = 0, cuda_graphs: bool = True, graph_max_batch: int = 0,
                 max_prompt: int = 0) -> None:
        self.model, self.rows, self.params = ckpt.model, rows, params
        max_prompt = min(max_prompt or max_len, max_len)
        clones = rows if ckpt.config.kind == "base" else 0
        self.model.setup(rows, max_len, params, bank_rows=1 + clones * max_prompt)
        # Packets hold packet_frames frames; a stream's first may hold fewer (sooner audio); a last packet
        # is padded up to the next of these sizes.
        self.packet_sizes = sorted({first_packet_frames or packet_frames, packet_frames})
        self.decoder = PacketDecoder(ckpt.codec, rows, self.packet_sizes)
        self.voices = ClonedVoices(self.model, self.decoder, clones, max_prompt)
        self.samples_per_frame = ckpt.codec.samples_per_frame
        self.streams: list[Stream] = []  # streams[i] holds row i
        self.device = self.model.seed.device
        # Host copies of launched frames' codes: two, one for the frame in flight and one being taken.
        pinned = self.device.type == "cuda"
        self._codes_host = [torch.zeros(rows, self.model.codes.shape[1], dtype=torch.long, pin_memory=pinned)
                            for _ in range(2)]
        self._launches = 0
        self._launched: _Launched | None = None
        self._decoded: list[_Decoded] = []  # packets queued by the last step, handed out by the next
        # Counters since start (the engine's stats): steps that launched a frame, stream-frames launched, wall
        # time inside step(), and on a GPU the device time each step's work spans (CUDA events, read once done).
        self.steps = self.frames = 0
        self.step_seconds = self.gpu_seconds = 0.0
        self._spans: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        sizes: list[int] = []
        pool = None
        if cuda_graphs and self.device.type == "cuda":
            limit = min(graph_max_batch or rows, rows)
            sizes = sorted({b for b in BATCH_SIZES if b < limit} | {limit})
            pool = torch.cuda.graph_pool_handle()
        # The prefill lengths captured: the streaming prompt's, and the longer ones up to the first that holds
        # the longest prompt.
        lengths = [PREFILL_LEN]
        for n in PREFILL_LENS[1:]:
            if lengths[-1] < max_prompt and n <= self.model.max_len:
                lengths.append(n)
        start = time.perf_counter()
        try:
            self._capture(sizes, lengths, pool)
        except RuntimeError:  # a failed capture costs speed, never a session
            log.exception("CUDA graph capture failed; every step runs eagerly")
            sizes = []
            self._capture([], [PREFILL_LEN], None)
        if sizes:
            count = sum(len(g.graphs) for g in [*self.prefill_graphs.values(), self.frame_graphs,
                                                *self.packet_graphs.values()])
            log.info("captured %d CUDA graphs (batch sizes %s, prefill lengths %s) in %.1f s", count, sizes,
                     lengths, time.perf_counter() - start)

    def _capture(self, sizes: list[int], lengths: list[int], pool: tuple | None) -> None:
        small = [b for b in sizes if b <= LONG_PREFILL_BATCH]
        self.prefill_graphs = {n: Graphs("prefill", partial(self.model.prefill, length=n),
                                         sizes if n == PREFILL_LEN else small, pool) for n in lengths}
        self.frame_graphs = Graphs("frame", self.model.step, sizes, pool)
        self.packet_graphs = {n: Graphs("packet", partial(self.decoder.decode, frames=n), sizes, pool)
                              for n in self.packet_sizes}

    def add(self, stream: Stream) -> None:
        if len(self.streams) >= self.rows:
            raise RuntimeError("no free row")
        stream.row = len(self.streams)
        self.streams.append(stream)

    def remove(self, stream: Stream) -> None:
        """The stream leaves its row (it ended, or it was cancelled: then a packet of it still on its way is
        dropped)."""
        row, last = stream.row, len(self.streams) - 1
        if row != last:
            moved = self.streams[last]
            # Python ints index the rows: a device tensor made from a host value would wait for the device.
            self.model.move_row_(last, row)
            self.decoder.state.copy_rows_(row, last)
            moved.row = row
            self.streams[row] = moved
        self.streams.pop()
        stream.row = -1

    @property
    def busy(self) -> bool:
        """A launched frame's codes are still to be taken, or decoded packets to be handed out: the next step
        has work even if no stream runs."""
        return self._launched is not None or bool(self._decoded)

    @torch.no_grad()
    def step(self) -> list[tuple[Stream, Packet | None]]:
        """Launch the next frame of every runnable stream, hand out the packets the previous step decoded,
        then take the codes of the frame launched by the previous step and queue the packets now due.
        Returns the packets handed out, and (stream, None) for a stream that ended without one, each stream's
        in order; a stream whose last event this is has left the runner."""
        start = time.perf_counter()
        span = self._span_start()
        previous, self._launched = self._launched, self._launch()
        events = self._hand_out()
        if previous is not None:
            events += self._take(previous)
        elapsed = time.perf_counter() - start
        self.step_seconds += elapsed
        if span is not None:
            span[1].record()
            self._spans.append(span)
            while self._spans and self._spans[0][1].query():
                begin, end = self._spans.popleft()
                self.gpu_seconds += begin.elapsed_time(end) / 1000
        if self._launched is not None:
            self.steps += 1
            self.frames += len(self._launched.streams)
            STEP_SECONDS.observe(elapsed)
            BATCH.observe(len(self._launched.streams))
        return events

    def _span_start(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        if self.device.type != "cuda":
            return None
        span = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        span[0].record()
        return span

    def _event(self) -> torch.cuda.Event | None:
        """An event recorded behind the work queued so far (None on a CPU, where nothing is asynchronous). Past
        SPIN_STREAMS streams it is waited for asleep: a spinning wait keeps a core busy for as long as the device
        computes, which under load is most of the time; below, spinning saves the wake-up on the way to first
        audio."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event(blocking=len(self.streams) > SPIN_STREAMS)
        event.record()
        return event

    def _launch(self) -> _Launched | None:
        live = [s for s in self.streams if s.runnable]
        if not live:
            return None
        fresh = [s for s in live if not s.started]
        if fresh:
            self._prefill(fresh)
        b = self.frame_graphs.size(len(self.streams))
        pos, text, on, first = [0] * b, [0] * b, [0] * b, [0] * b
        for s in self.streams:
            pos[s.row] = s.pos
        for s in live:
            pos[s.row], text[s.row], first[s.row] = s.launch()
            on[s.row] = 1
        self.model.step_in[:, :b].copy_(torch.tensor([pos, text, on, first]), non_blocking=True)
        self.frame_graphs.run(b)
        # The codes go to host memory behind the frame, so the next frame may overwrite them on the device.
        parity = self._launches % 2
        self._launches += 1
        codes = self._codes_host[parity][:b]
        codes.copy_(self.model.codes[:b], non_blocking=True)
        done = self._event()
        quick = [s for s in fresh if s.first_packet_frames == 1] if 1 in self.packet_sizes else []
        if not quick:
            return _Launched([(s, s.row) for s in live], codes, done, {}, None, None)
        # Their first frame, still on the device, is their first packet: decoded now, read with the codes.
        graphs = self.packet_graphs[1]
        n = graphs.size(len(quick))
        self.decoder.set_rows([s.row for s in quick], n)
        self.decoder.first_frames_of(self.model.codes, n)
        graphs.run(n)
        pcm = self.decoder.first_host[parity][:len(quick)]
        pcm.copy_(self.decoder.pcm[1][:len(quick)], non_blocking=True)
        return _Launched([(s, s.row) for s in live], codes, done, {s: i for i, s in enumerate(quick)}, pcm,
                         self._event())

    def _hand_out(self) -> list[tuple[Stream, Packet]]:
        """The packets the previous step queued, their samples read from host memory once they are there."""
        events: list[tuple[Stream, Packet]] = []
        for decoded in self._decoded:
            if decoded.done is not None:
                decoded.done.synchronize()
            pcm = decoded.pcm.numpy()
            for s, packet, i, frames in decoded.packets:
                if s.row >= 0 or s.done:  # not cancelled meanwhile
                    packet.pcm = pcm[i, :frames * self.samples_per_frame].tobytes()
                    events.append((s, packet))
        self._decoded = []
        return events

    def _take(self, frame: _Launched) -> list[tuple[Stream, Packet | None]]:
        if frame.done is not None:
            frame.done.synchronize()
        codes = frame.codes.tolist()
        events: list[tuple[Stream, Packet | None]] = []
        due, quick, ended = [], [], []
        for s, row in frame.streams:
            if s.done or s.row < 0:
                continue  # it ended (EOS in the frame before) or left after this frame was launched
            if s.take(codes[row]):
                (quick if s in frame.first else due).append(s)
            elif s.done:
                events.append((s, None))
            if s.done:
                ended.append(s)
        if quick:
            if frame.first_done is not None:
                frame.first_done.synchronize()
            pcm = frame.first_pcm.numpy()
            first = torch.from_numpy(numpy.array([s.pending for s in quick], dtype=numpy.int64)).transpose(1, 2)
            for s, frames in zip(quick, first, strict=True):  # frames [16, 1]
                events.append((s, s.packet(pcm[frame.first[s], :self.samples_per_frame].tobytes(), frames)))
        for size in self.packet_sizes:
            batch = [s for s in due if len(s.pending) <= size]
            due = [s for s in due if len(s.pending) > size]
            if batch:
                self._decoded.append(self._packets(batch, size))
        for s in ended:  # its packets are on their way: their decode has read its row already
            self.remove(s)
        return events

    def _prefill(self, fresh: list[Stream]) -> None:
        """Prefill the new streams' prompts, those of one captured length together, then start their decoder
        rows: at zero, or where an in-context clone's reference codes leave the decoder."""
        prompts = [s.start() for s in fresh]
        # Each cloned voice of these streams: its bank row and primed decoder state, made on its first use.
        voices = {p.voice.clone.key: self.voices.get(p.voice.clone) for p in prompts
                  if p.voice.clone is not None and p.voice.clone.kind == "clone"}
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(next((n for n in self.prefill_graphs if n >= len(p)), 0), []).append(i)
        for length, members in groups.items():
            graphs = self.prefill_graphs.get(length)
            if length != PREFILL_LEN and len(members) > LONG_PREFILL_BATCH:
                graphs = None  # compute-bound: eager, at its own length
            self._prefill_batch([fresh[i] for i in members], [prompts[i] for i in members], graphs, length, voices)
        rows = numpy.array([s.row for s in fresh], dtype=numpy.int64)
        self.decoder.state.reset_(torch.from_numpy(rows).to(self.device, non_blocking=True))
        icl: dict[str, list[int]] = {}  # each in-context voice's rows
        for s in fresh:
            if s.voice.icl and s.voice.clone is not None:
                icl.setdefault(s.voice.clone.key, []).append(s.row)
        for key, icl_rows in icl.items():
            if (state := voices[key][1]) is not None:
                state.fill_rows_(self.decoder.state, torch.tensor(icl_rows).to(self.device, non_blocking=True))

    def _prefill_batch(self, fresh: list[Stream], prompts: list[Prompt], graphs: Graphs | None, length: int,
                       voices: dict[str, tuple[int, CodecState | None]]) -> None:
        """One prefill: replayed from `graphs` (its prompts right-padded to `length`), or eager at the
        longest prompt's length; `voices`: the bank rows of its cloned voices (by key)."""
        if graphs is not None:
            b = graphs.size(len(fresh))
        else:
            b, length = len(fresh), max(len(p) for p in prompts)
        ids = numpy.zeros((3, b, length), dtype=numpy.int64)
        ids[1] = NO_CODEC
        for i, p in enumerate(prompts):
            ids[0, i, :len(p)] = p.text
            ids[1, i, :len(p)] = p.codec
            clone = p.voice.clone
            if clone is not None and (p.speaker_at >= 0 or p.codes_at >= 0):
                row = voices[clone.key][0]
                if p.speaker_at >= 0:
                    ids[2, i, p.speaker_at] = row
                if p.codes_at >= 0:
                    ids[2, i, p.codes_at:p.codes_at + clone.frames] = numpy.arange(row + 1, row + 1 + clone.frames)
        meta = numpy.zeros((4, b), dtype=numpy.int64)
        meta[0] = self.rows
        meta[:, :len(fresh)] = [[s.row for s in fresh], [len(p) - 1 for p in prompts], [s.seed for s in fresh],
                                [s.min_frames for s in fresh]]
        sampling = numpy.array([(s.params or self.params).row() for s in fresh]
                               + [self.params.row()] * (b - len(fresh)), dtype=numpy.float32)
        self.model.prompt_ids[:, :b, :length].copy_(torch.from_numpy(ids), non_blocking=True)
        self.model.prompt_meta[:, :b].copy_(torch.from_numpy(meta), non_blocking=True)
        self.model.prompt_sampling[:, :b].copy_(torch.from_numpy(sampling.T), non_blocking=True)
        if graphs is not None:
            graphs.run(b)
        else:
            self.model.prefill(b, length)
            STEPS.labels("prefill", "eager").inc()

    def _packets(self, due: list[Stream], n: int) -> _Decoded:
        graphs = self.packet_graphs[n]
        b = graphs.size(len(due))
        silence = [0] * self.decoder.codes[n].shape[1]
        # Frames [b, n, 16]: each stream's pending frames, then zero frames (the padding of a short last
        # packet, and the rows past the streams). numpy reads the lists 3x faster than torch.tensor (~3 ms
        # for 1024 streams' packets).
        rows = [s.pending + [silence] * (n - len(s.pending)) for s in due] + [[silence] * n] * (b - len(due))
        codes = torch.from_numpy(numpy.array(rows, dtype=numpy.int64)).transpose(1, 2)
        frames = [len(s.pending) for s in due]
        self.decoder.codes[n][:b].copy_(codes, non_blocking=True)
        self.decoder.set_rows([s.row for s in due], b)
        graphs.run(b)
        pcm = self.decoder.host[n][:len(due)]
        pcm.copy_(self.decoder.pcm[n][:len(due)], non_blocking=True)
        packets = [(s, s.packet(b"", codes[i, :, :k]), i, k) for i, (s, k) in enumerate(zip(due, frames, strict=True))]
        return _Decoded(packets, pcm, self._event())


def synthesize(ckpt: Checkpoint, speaker: str | None, language: str | None, text: str, params: SamplingParams,
               max_frames: int, seed: int | None = 0, non_streaming: bool = False, packet_frames: int = 4,
               min_frames: int = 2, cuda_graphs: bool = False, first_packet_frames: int = 0, *,
               clone: VoicePrompt | None = None, instructions: str | None = None) -> tuple[torch.Tensor, list[Packet]]:
    """A whole utterance on the calling thread (tests, benchmarks): codes [T, 16] and its packets."""
    tokens = TextTokens(ckpt.tokenizer)
    voice = Voice.resolve(ckpt.config, speaker, language, tokens=tokens, clone=clone, instructions=instructions)
    stream = Stream(ckpt, tokens, voice, seed, packet_frames, max_frames, min_frames, non_streaming,
                    first_packet_frames)
    stream.add_text(text, final=True)
    positions = voice.positions(ckpt.config, len(stream.ids), non_streaming)
    runner = Runner(ckpt, 1, max_frames + positions + 1, params, packet_frames, first_packet_frames,
                    cuda_graphs=cuda_graphs, max_prompt=positions)
    runner.add(stream)
    packets = []
    while not stream.done or runner.busy:
        packets += [packet for _, packet in runner.step() if packet is not None]
    codes = torch.cat([p.codes for p in packets], dim=1).T if packets else torch.zeros(0, 16, dtype=torch.long)
    return codes, packets
