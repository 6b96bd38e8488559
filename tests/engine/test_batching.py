"""Continuous batching (engine.runner) on the tiny checkpoint: streams that share steps, join late, wait
for text, leave early, make the codes each makes alone; on a GPU, CUDA graph replay makes the eager codes.

QWEN3_TTS_FIXTURE / QWEN3_TTS_DEVICE point these at another fixture and device, as in test_engine_parity.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from engine import checkpoint
from engine.batcher import AUTO_MAX_STREAMS, AUTO_MEMORY_SHARE, PROMPT_POSITIONS, auto_streams
from engine.clone import prepare
from engine.prompt import TextTokens, Voice
from engine.runner import Runner, state_bytes, synthesize
from engine.sampling import SamplingParams
from engine.stream import Stream
from engine.voices import VoicePrompt
from gateway.audio import decode_wav
from tests.paths import DATA, ROOT, TINY_CHECKPOINT

FIXTURE = Path(os.environ.get("QWEN3_TTS_FIXTURE", TINY_CHECKPOINT))
DEVICE = os.environ.get("QWEN3_TTS_DEVICE", "cpu")
REFS = json.loads((FIXTURE / "references.json").read_text())
BY_NAME = {p["name"]: p for p in REFS["prompts"]}
# English, Chinese with a dialect speaker (joins late), English fed word by word (waits for text).
PROMPTS = [BY_NAME["vivian_en_stream"], BY_NAME["dylan_auto_dialect_stream"], BY_NAME["ryan_auto_stream"]]
FRAMES = 12


@pytest.fixture(scope="module")
def ckpt() -> checkpoint.Checkpoint:
    return checkpoint.load(str(FIXTURE), device=DEVICE, dtype="float32")


@pytest.fixture(scope="module")
def greedy(ckpt: checkpoint.Checkpoint) -> SamplingParams:
    return SamplingParams.from_generation_config(ckpt.generation, greedy=True)


def alone(ckpt: checkpoint.Checkpoint, params: SamplingParams, prompt: dict, **kw) -> torch.Tensor:
    return synthesize(ckpt, prompt["speaker"], prompt["language"], prompt["text"], params, max_frames=FRAMES,
                      **kw)[0]


def make(ckpt: checkpoint.Checkpoint, prompt: dict) -> Stream:
    voice = Voice.resolve(ckpt.config, prompt["speaker"], prompt["language"])
    return Stream(ckpt, TextTokens(ckpt.tokenizer), voice, 0, 4, FRAMES)


def test_streams_in_one_batch_make_their_solo_codes(ckpt: checkpoint.Checkpoint, greedy: SamplingParams) -> None:
    solo = [alone(ckpt, greedy, p) for p in PROMPTS[:3]]
    runner = Runner(ckpt, 4, FRAMES + 16, greedy, 4, cuda_graphs=False)
    streams = [make(ckpt, p) for p in PROMPTS[:3]]
    codes: dict[int, list[torch.Tensor]] = {i: [] for i in range(3)}
    # Stream 0 starts alone; stream 1 joins after two steps; stream 2 is open from the start but its text
    # (fed in two parts, the first one word long) arrives late: it sits out steps while the others advance.
    runner.add(streams[0])
    runner.add(streams[2])
    streams[0].add_text(PROMPTS[0]["text"], final=True)
    first_word = PROMPTS[2]["text"].split(" ")[0]
    steps = 0
    while any(not s.done for s in streams) or runner.busy:
        if steps == 2:
            runner.add(streams[1])
            streams[1].add_text(PROMPTS[1]["text"], final=True)
        if steps == 3:
            streams[2].add_text(first_word + " ", final=False)
        if steps == 6:
            streams[2].add_text(PROMPTS[2]["text"][len(first_word) + 1:], final=True)
        for stream, packet in runner.step():
            if packet is not None:
                codes[streams.index(stream)].append(packet.codes)
        steps += 1
        assert steps < 100
    assert not runner.streams
    for i in range(3):
        assert torch.equal(torch.cat(codes[i], dim=1).T, solo[i]), PROMPTS[i]["name"]


def test_a_stream_that_leaves_frees_its_row(ckpt: checkpoint.Checkpoint, greedy: SamplingParams) -> None:
    """Removing a stream mid-utterance (a cancel) moves the last row into its place; the moved stream
    carries on exactly."""
    solo = alone(ckpt, greedy, PROMPTS[1])
    runner = Runner(ckpt, 3, FRAMES + 16, greedy, 4, cuda_graphs=False)
    streams = [make(ckpt, PROMPTS[0]), make(ckpt, PROMPTS[0]), make(ckpt, PROMPTS[1])]
    for s, p in zip(streams, (PROMPTS[0], PROMPTS[0], PROMPTS[1]), strict=True):
        runner.add(s)
        s.add_text(p["text"], final=True)
    got = []
    for _ in range(3):
        got += [packet.codes for stream, packet in runner.step() if stream is streams[2] and packet]
    runner.remove(streams[0])
    assert streams[2].row == 0 and runner.streams == [streams[2], streams[1]]
    while not streams[2].done or runner.busy:
        got += [packet.codes for stream, packet in runner.step() if stream is streams[2] and packet]
    assert torch.equal(torch.cat(got, dim=1).T, solo)


def test_sampled_streams_do_not_depend_on_their_batch(ckpt: checkpoint.Checkpoint) -> None:
    params = SamplingParams.from_generation_config(ckpt.generation)
    solo = alone(ckpt, params, PROMPTS[0], seed=5, min_frames=FRAMES)
    runner = Runner(ckpt, 2, FRAMES + 16, params, 4, cuda_graphs=False)
    streams = [make(ckpt, PROMPTS[1]), make(ckpt, PROMPTS[0])]
    streams[1].seed, streams[1].min_frames = 5, FRAMES
    got = []
    for s, p in zip(streams, PROMPTS[1::-1], strict=True):
        runner.add(s)
        s.add_text(p["text"], final=True)
    while not streams[1].done or runner.busy:
        got += [packet.codes for stream, packet in runner.step() if stream is streams[1] and packet]
    assert torch.equal(torch.cat(got, dim=1).T, solo)


def test_a_one_frame_first_packet_is_decoded_with_its_frame(ckpt: checkpoint.Checkpoint,
                                                            greedy: SamplingParams) -> None:
    """first_packet_frames=1: the first packet is decoded as its frame is launched, so the step that takes
    the frame's codes hands it out (a later packet comes a step after its last frame's codes); its audio is
    the codec's decode of that frame, and the stream goes on to make its solo codes."""
    solo = alone(ckpt, greedy, PROMPTS[0])
    runner = Runner(ckpt, 2, FRAMES + 16, greedy, 4, first_packet_frames=1, cuda_graphs=False)
    stream = Stream(ckpt, TextTokens(ckpt.tokenizer), Voice.resolve(ckpt.config, PROMPTS[0]["speaker"],
                                                                     PROMPTS[0]["language"]), 0, 4, FRAMES,
                    first_packet_frames=1)
    stream.add_text(PROMPTS[0]["text"], final=True)
    runner.add(stream)
    assert runner.step() == []  # frame 0 launched, and its packet decoded behind it
    (got, first), = runner.step()  # frame 1 launched, frame 0 taken: the first packet is out
    assert got is stream and first.codes.shape == (16, 1) and torch.equal(first.codes[:, 0], solo[0])
    pcm = torch.frombuffer(bytearray(first.pcm), dtype=torch.int16).double()
    want = (ckpt.codec.decode(solo[:1].T[None].to(DEVICE))[0].cpu().clamp(-1, 1) * 32767).round()
    assert pcm.shape == want.shape and (pcm - want).abs().max() <= 1
    steps, packets = 2, [first]
    while not stream.done or runner.busy:
        events = runner.step()
        steps += 1
        packets += [packet for _, packet in events]
        if steps == 6:  # frames 1-4 were taken by step 6: their packet is handed out by step 7
            assert len(packets) == 1
        if steps == 7:
            assert [p.codes.shape[1] for p in packets] == [1, 4]
    assert torch.equal(torch.cat([p.codes for p in packets], dim=1).T, solo)
    assert packets[-1].last and not any(p.last for p in packets[:-1])


def test_a_cancelled_stream_gets_no_packet_on_its_way(ckpt: checkpoint.Checkpoint, greedy: SamplingParams) -> None:
    """A stream removed while its decoded packet waits to be handed out gets nothing more; the other stream's
    packets and codes are untouched."""
    solo = alone(ckpt, greedy, PROMPTS[1])
    runner = Runner(ckpt, 2, FRAMES + 16, greedy, 4, cuda_graphs=False)
    streams = [make(ckpt, PROMPTS[0]), make(ckpt, PROMPTS[1])]
    for s, p in zip(streams, PROMPTS[:2], strict=True):
        runner.add(s)
        s.add_text(p["text"], final=True)
    got = []
    for _ in range(5):  # frames 0-3 taken by step 5: both streams' first packets decoded, not handed out
        got += runner.step()
    assert got == [] and runner.busy
    runner.remove(streams[0])
    while not streams[1].done or runner.busy:
        got += runner.step()
    assert all(s is streams[1] for s, _ in got)
    assert torch.equal(torch.cat([p.codes for _, p in got], dim=1).T, solo)


@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("prompt", REFS["prompts"], ids=[p["name"] for p in REFS["prompts"]])
def test_graph_replay_makes_the_eager_greedy_codes(ckpt: checkpoint.Checkpoint, greedy: SamplingParams,
                                                   prompt: dict) -> None:
    frames = len(prompt["codes"])
    kw = {"max_frames": frames, "non_streaming": prompt["non_streaming_mode"]}
    eager = synthesize(ckpt, prompt["speaker"], prompt["language"], prompt["text"], greedy, **kw)[0]
    graph = synthesize(ckpt, prompt["speaker"], prompt["language"], prompt["text"], greedy, cuda_graphs=True,
                       **kw)[0]
    assert torch.equal(graph, eager)
    assert graph.tolist() == prompt["codes"]


@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_of_a_long_prompt_makes_the_eager_codes() -> None:
    """An in-context clone's prompt (its reference's frames and transcript) replays a captured longer prefill."""
    base = checkpoint.load(str(DATA / "qwen3_tts_tiny_base"), device=DEVICE, dtype="float32")
    params = SamplingParams.from_generation_config(base.generation, greedy=True)
    icl = reference_clone(base, 0)
    kw = {"max_frames": FRAMES, "clone": icl}
    eager = synthesize(base, None, "english", "Hello world, this is a test.", params, **kw)
    graph = synthesize(base, None, "english", "Hello world, this is a test.", params, cuda_graphs=True, **kw)
    assert torch.equal(graph[0], eager[0])
    assert b"".join(p.pcm for p in graph[1]) == b"".join(p.pcm for p in eager[1])


def reference_clone(base: checkpoint.Checkpoint, start: float) -> VoicePrompt:
    """An in-context clone of tests/fixtures/one_sentence.wav from `start` (a share of it) on."""
    audio, rate = decode_wav((ROOT / "tests" / "fixtures" / "one_sentence.wav").read_bytes())
    return prepare(base, audio[int(len(audio) * start):, 0], rate, "The quick brown fox jumps over the lazy dog.")


def test_cloned_voices_past_the_rows_are_made_again() -> None:
    """A runner keeps as many cloned voices as it has rows. One row, one stream at a time in voices A, B, A:
    B's voice-bank slot and primed decoder state replace A's, A's are made again, and every stream makes the
    codes and audio it makes alone."""
    base = checkpoint.load(str(DATA / "qwen3_tts_tiny_base"), device=DEVICE, dtype="float32")
    params = SamplingParams.from_generation_config(base.generation, greedy=True)
    a, b = reference_clone(base, 0), reference_clone(base, 0.4)
    text = "How are you doing today?"
    solo = {c.key: synthesize(base, None, "english", text, params, max_frames=FRAMES, clone=c) for c in (a, b)}
    tokens = TextTokens(base.tokenizer)
    runner = Runner(base, 1, FRAMES + 400, params, 4, cuda_graphs=False)  # after them: it owns the model's rows
    for clone in (a, b, a):
        solo_codes, solo_packets = solo[clone.key]
        stream = Stream(base, tokens, Voice.resolve(base.config, None, "english", tokens=tokens, clone=clone), 0, 4,
                        FRAMES)
        stream.add_text(text, final=True)
        runner.add(stream)
        packets = []
        while not stream.done or runner.busy:
            packets += [packet for _, packet in runner.step() if packet is not None]
        assert torch.equal(torch.cat([p.codes for p in packets], dim=1).T, solo_codes)
        assert b"".join(p.pcm for p in packets) == b"".join(p.pcm for p in solo_packets)
        assert list(runner.voices.kept) == [clone.key]


def test_engine_metrics(ckpt: checkpoint.Checkpoint, greedy: SamplingParams) -> None:
    """The engine's step counters and step-time histogram land in prometheus_client's default registry,
    which the gateway's /metrics serves."""
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    path = "graph" if DEVICE == "cuda" else "eager"
    before = [value("tts_engine_steps_total", {"stage": stage, "path": path}) for stage in ("frame", "packet")]
    steps = value("tts_engine_step_seconds_count")
    codes = alone(ckpt, greedy, PROMPTS[2], cuda_graphs=DEVICE == "cuda")
    after = [value("tts_engine_steps_total", {"stage": stage, "path": path}) for stage in ("frame", "packet")]
    # One frame step per frame; when the stream ends on EOS, that frame and the one launched before its codes
    # were read (engine.runner launches a frame ahead). One step time each.
    assert after[0] - before[0] in (len(codes), len(codes) + 2) and after[1] > before[1]
    assert value("tts_engine_step_seconds_count") - steps == after[0] - before[0]
    assert value("tts_engine_batch_size_count") > 0


def test_state_bytes_counts_what_the_runner_allocates(ckpt: checkpoint.Checkpoint, greedy: SamplingParams) -> None:
    """The engine checks at start-up that max_streams x max_frames fit the GPU with this count."""
    runner = Runner(ckpt, 3, 40, greedy, 4, cuda_graphs=False)
    model, decoder = runner.model, runner.decoder
    caches = [t for c in model.caches + model.predictor_caches for t in (c.k, c.v)]
    codec = [t for s in (decoder.state, decoder.stage) for t in (s.memory, s.keys, s.values, s.pos)]
    assert state_bytes(ckpt, 3, 40) == sum(t.nbytes for t in caches + codec)


@pytest.mark.parametrize("free_gib", [0.001, 1, 4, 10_000])
def test_max_streams_auto_fills_its_share_of_the_gpus_free_memory(ckpt: checkpoint.Checkpoint, free_gib: float,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """[engine] max_streams = 0 on a GPU: the most streams whose caches fit AUTO_MEMORY_SHARE of the free memory
    (at least one: the engine's start-up check then says what does not fit), at most AUTO_MAX_STREAMS."""
    free = int(free_gib * 2**30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    streams = auto_streams([ckpt], 1500, 30.0, 256)
    budget = free * AUTO_MEMORY_SHARE

    def caches(rows: int) -> int:
        return state_bytes(ckpt, rows, 1500 + PROMPT_POSITIONS, PROMPT_POSITIONS)

    if caches(1) > budget:
        assert streams == 1
    elif caches(AUTO_MAX_STREAMS) <= budget:
        assert streams == AUTO_MAX_STREAMS
    else:
        assert caches(streams) <= budget < caches(streams + 1)


def test_voices_and_modes_share_a_batch() -> None:
    """On a Base checkpoint, in-context and x-vector clones in different languages, one joining late and one
    fed word by word; on a CustomVoice 1.7B one, a speaker with and without an instruction: one batch each,
    and every stream makes the codes it makes alone (a voice changes only a stream's prompt)."""
    base = checkpoint.load(str(DATA / "qwen3_tts_tiny_base"), device=DEVICE, dtype="float32")
    instruct = checkpoint.load(str(DATA / "qwen3_tts_tiny_instruct"), device=DEVICE, dtype="float32")
    audio, rate = decode_wav((ROOT / "tests" / "fixtures" / "one_sentence.wav").read_bytes())
    icl = prepare(base, audio[:, 0], rate, "The quick brown fox jumps over the lazy dog.")
    xvec = prepare(base, audio[:, 0], rate)
    long = "Numbers like 42 and 2026 are read digit by digit, while speech synthesis streams audio."
    cases = [
        (base, [("Hello world, this is a test.", "english", {"clone": icl}),
               ("How are you doing today?", "auto", {"clone": xvec}),
               (long, "english", {"clone": icl}),  # joins late, its text read past the reference's frames
               ("今天天气很好，我们去公园散步吧。", "chinese", {"clone": xvec})]),  # fed word by word
        (instruct, [("Hello world, this is a test.", "english", {"speaker": "vivian", "instructions": "Whisper."}),
                   ("Hello world, this is a test.", "english", {"speaker": "vivian"}),
                   ("How are you doing today?", "auto", {"speaker": "ryan", "instructions": "Shout it."})]),
    ]
    for ckpt, prompts in cases:
        params = SamplingParams.from_generation_config(ckpt.generation, greedy=True)
        solo = [synthesize(ckpt, kw.get("speaker"), lang, text, params, max_frames=FRAMES,
                           clone=kw.get("clone"), instructions=kw.get("instructions"))[0] for text, lang, kw in prompts]
        tokens = TextTokens(ckpt.tokenizer)
        runner = Runner(ckpt, len(prompts), FRAMES + 400, params, 4, cuda_graphs=False)
        streams = [Stream(ckpt, tokens, Voice.resolve(ckpt.config, kw.get("speaker"), lang, tokens=tokens,
                                                      clone=kw.get("clone"), instructions=kw.get("instructions")),
                          0, 4, FRAMES) for _, lang, kw in prompts]
        late, fed = (2, 3) if ckpt is base else (2, -1)
        words = prompts[fed][0].split("，") if fed >= 0 else []
        for i, s in enumerate(streams):
            if i != late:
                runner.add(s)
            if i not in (late, fed):
                s.add_text(prompts[i][0], final=True)
        codes: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(prompts))}
        steps = 0
        while any(not s.done for s in streams) or runner.busy:
            if steps == 2:
                runner.add(streams[late])
                streams[late].add_text(prompts[late][0], final=True)
            if fed >= 0 and steps % 2 == 0 and words:
                word = words.pop(0)
                streams[fed].add_text(word + ("，" if words else ""), final=not words)
            for stream, packet in runner.step():
                if packet is not None:
                    codes[streams.index(stream)].append(packet.codes)
            steps += 1
            assert steps < 100
        for i in range(len(prompts)):
            assert torch.equal(torch.cat(codes[i], dim=1).T, solo[i]), (ckpt.config.kind, i)
