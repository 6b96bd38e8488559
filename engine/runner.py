"""Continuous batching: every running stream advances one frame per step, in one batch.

A `Runner` owns the model's rows. Streams join (`add`) and leave (`remove`) between steps; the rows in use
stay packed at [0, n) (a leaving stream's row takes the last stream), so a step over n streams is a step
over rows [0, b) for the smallest captured batch size b >= n, and the rows past n are throwaway padding.
A step prefills the streams that start (their prompts batched, right-padded to PREFILL_LEN positions; a
longer prompt, such as an in-context clone's or an instructed one, runs eagerly), launches one frame for all
rows (talker, sampling, the 15-step code predictor), then, while that frame runs on the device, hands out
the packets the previous step decoded, takes the codes of the frame the previous step launched, and queues
the packets now due in one batched codec step per packet size, padding a short last packet with frames
whose samples are cut (the codec is causal, so they change nothing before them). Streams waiting for text
sit it out.

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
rows, or `graph_max_batch`); a batch with no graph, a longer (non-streaming) prompt, and everything on a
CPU run the same functions eagerly.
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
from engine.prompt import NO_CODEC, Prompt, TextTokens, Voice
from engine.sampling import SamplingParams
from engine.stream import Packet, Stream
from engine.voices import VoicePrompt

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024)
# Prompt positions of a captured prefill: a streaming prompt takes 9 to 11 (role, control tags, first token).
PREFILL_LEN = 16
# In-context voices whose decoder state after their reference codes is kept (about 2.5 MB each at bf16), and
# the frames decoded per call when making one.
PRIMED_VOICES, PRIME_CHUNK = 32, 64
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


def state_bytes(ckpt: Checkpoint, rows: int, max_len: int) -> int:
    """Device memory of what a Runner preallocates for `rows` streams of up to `max_len` talker positions: the
    talker's KV caches (a row more for scratch; positions rounded up to 16 as Qwen3TTS.setup does), the code
    predictor's, and the codec's streaming state (twice: the streams' rows and a scratch row, and a batch
    gathered from them).
    The talker's caches dominate: 112 KiB a position for both released sizes (28 layers x 8 KV heads x 128)."""
    itemsize = next(ckpt.model.parameters()).element_size()
    talker, predictor = ckpt.config.talker, ckpt.config.predictor
    positions = (rows + 1) * talker.layers * -(-max_len // 16) * 16 * talker.kv_heads * talker.head_dim
    positions += rows * predictor.layers * ckpt.config.code_groups * predictor.kv_heads * predictor.head_dim
    one = ckpt.codec.new_state(1)
    codec = sum(t.nbytes for t in (one.memory, one.keys, one.values, one.pos))
    return 2 * positions * itemsize + (2 * rows + 1) * codec


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
        self.primed: OrderedDict[str, CodecState] = OrderedDict()  # per in-context voice, most recent last

    @torch.no_grad()
    def prime(self, row: int, clone: VoicePrompt) -> None:
        """Start `row` where decoding an in-context clone's reference codes leaves the decoder: the official
        code decodes reference and new codes together and cuts the reference's audio off. The state is
        kept for the voice's next streams (PRIMED_VOICES voices)."""
        state = self.primed.pop(clone.key, None)
        if state is None:
            state = self.codec.new_state(1)
            codes = torch.from_numpy(clone.codes).T[None].to(self.index.device)  # [1, 16, frames]
            for part in codes.split(PRIME_CHUNK, dim=2):  # bounded activations, same result as one call
                self.codec.decode_step(part, state)
        self.primed[clone.key] = state
        while len(self.primed) > PRIMED_VOICES:
            self.primed.popitem(last=False)
        state.store_rows_(self.state, torch.tensor([row], device=self.index.device))

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


class Runner:
    """Up to `rows` streams of up to `max_len` talker positions, sampled with `params` unless a stream
    brings its own (Stream.params)."""

    def __init__(self, ckpt: Checkpoint, rows: int, max_len: int, params: SamplingParams, packet_frames: int,
                 first_packet_frames: int = 0, cuda_graphs: bool = True, graph_max_batch: int = 0) -> None:
        self.model, self.rows, self.params = ckpt.model, rows, params
        self.model.setup(rows, max_len, params)
        # Packets hold packet_frames frames; a stream's first may hold fewer (sooner audio); a last packet
        # is padded up to the next of these sizes.
        self.packet_sizes = sorted({first_packet_frames or packet_frames, packet_frames})
        self.decoder = PacketDecoder(ckpt.codec, rows, self.packet_sizes)
        # The captured prefill's codec-track vectors (engine.talker.Qwen3TTS.prefill), zero but for clones.
        self.vectors = self.model.first_input.new_zeros(rows, PREFILL_LEN, self.model.cfg.talker.hidden)
        self._vectors_dirty = False
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
        start = time.perf_counter()
        prefill = partial(self.model.prefill, length=PREFILL_LEN, vectors=self.vectors)
        try:
            self.prefill_graphs = Graphs("prefill", prefill, sizes, pool)
            self.frame_graphs = Graphs("frame", self.model.step, sizes, pool)
            self.packet_graphs = {n: Graphs("packet", partial(self.decoder.decode, frames=n), sizes, pool)
                                  for n in self.packet_sizes}
        except RuntimeError:  # a failed capture costs speed, never a session
            log.exception("CUDA graph capture failed; every step runs eagerly")
            sizes = []
            self.prefill_graphs = Graphs("prefill", prefill, [], None)
            self.frame_graphs = Graphs("frame", self.model.step, [], None)
            self.packet_graphs = {n: Graphs("packet", partial(self.decoder.decode, frames=n), [], None)
                                  for n in self.packet_sizes}
        if sizes:
            log.info("captured %d CUDA graphs (batch sizes %s) in %.1f s", (2 + len(self.packet_sizes)) * len(sizes),
                     sizes, time.perf_counter() - start)

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
            self.model.move_row_(last, row)
            self.decoder.state.copy_rows_(torch.tensor([row], device=self.device),
                                          torch.tensor([last], device=self.device))
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
        """An event recorded behind the work queued so far (None on a CPU, where nothing is asynchronous)."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
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
        prompts = [s.start() for s in fresh]
        length = max(len(p) for p in prompts)
        graphed = length <= PREFILL_LEN  # streaming prompts; longer ones run eagerly
        b, length = (self.prefill_graphs.size(len(fresh)), PREFILL_LEN) if graphed else (len(fresh), length)
        ids = numpy.zeros((2, b, length), dtype=numpy.int64)
        ids[1] = NO_CODEC
        for i, p in enumerate(prompts):
            ids[0, i, :len(p)] = p.text
            ids[1, i, :len(p)] = p.codec
        meta = numpy.zeros((4, b), dtype=numpy.int64)
        meta[0] = self.rows
        meta[:, :len(fresh)] = [[s.row for s in fresh], [len(p) - 1 for p in prompts], [s.seed for s in fresh],
                                [s.min_frames for s in fresh]]
        sampling = numpy.array([(s.params or self.params).row() for s in fresh]
                               + [self.params.row()] * (b - len(fresh)), dtype=numpy.float32)
        self.model.prompt_ids[:, :b, :length].copy_(torch.from_numpy(ids), non_blocking=True)
        self.model.prompt_meta[:, :b].copy_(torch.from_numpy(meta), non_blocking=True)
        self.model.prompt_sampling[:, :b].copy_(torch.from_numpy(sampling.T), non_blocking=True)
        vectors = self.vectors if graphed else self.vectors.new_zeros(b, length, self.vectors.shape[-1])
        self._write_vectors(vectors, prompts, graphed)
        if graphed:
            self.prefill_graphs.run(b)
        else:
            self.model.prefill(b, length, vectors)
            STEPS.labels("prefill", "eager").inc()
        self.decoder.state.reset_(torch.from_numpy(meta[0, :len(fresh)]).to(self.device))
        for s in fresh:
            if s.voice.icl and s.voice.clone is not None:
                self.decoder.prime(s.row, s.voice.clone)

    def _write_vectors(self, vectors: torch.Tensor, prompts: list[Prompt], reused: bool) -> None:
        """The prompts' codec-track vectors (a clone's x-vector, an ICL clone's reference frames) into
        `vectors` [b, length, hidden], zero elsewhere (`reused`: it holds the last prefill's)."""
        cloned = [(i, p) for i, p in enumerate(prompts) if p.speaker_at >= 0 or p.codes_at >= 0]
        if reused:
            if self._vectors_dirty:
                vectors.zero_()
            self._vectors_dirty = bool(cloned)
        for i, p in cloned:
            clone = p.voice.clone
            assert clone is not None
            if p.speaker_at >= 0 and clone.speaker is not None:
                vectors[i, p.speaker_at] = torch.from_numpy(clone.speaker).to(vectors)
            if p.codes_at >= 0 and clone.codes is not None:
                codes = torch.from_numpy(clone.codes).to(self.device)
                vectors[i, p.codes_at:p.codes_at + len(codes)] = self.model.codes_embed_of(codes)[:, 0]

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
                    cuda_graphs=cuda_graphs)
    runner.add(stream)
    packets = []
    while not stream.done or runner.busy:
        packets += [packet for _, packet in runner.step() if packet is not None]
    codes = torch.cat([p.codes for p in packets], dim=1).T if packets else torch.zeros(0, 16, dtype=torch.long)
    return codes, packets
