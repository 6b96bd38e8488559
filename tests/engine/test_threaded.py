"""QwenTTSEngine through the gateway's TTS interface, on the tiny checkpoint: packets, text attribution,
live text feeds, cancel, several streams, bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY

from engine import checkpoint
from engine.api import Sampling, TTSChunk, TTSError
from engine.config import EngineConfig
from engine.runner import synthesize
from engine.sampling import SamplingParams
from engine.threaded import QwenTTSEngine
from engine.voices import VoicePrompt
from gateway.audio import decode_wav
from gateway.responders.tts import SegmentedStream
from tests.paths import DATA, ROOT, TINY_CHECKPOINT

FIXTURE = TINY_CHECKPOINT
REFS = json.loads((FIXTURE / "references.json").read_text())
TEXT = REFS["prompts"][0]["text"]  # vivian, english: 21 frames, then the frame cap of the references
BYTES_PER_FRAME = 1920 * 2


@pytest.fixture(scope="module")
def ckpt() -> checkpoint.Checkpoint:
    return checkpoint.load(str(FIXTURE), device="cpu")


@pytest.fixture
def engine(ckpt: checkpoint.Checkpoint):
    eng = QwenTTSEngine(ckpt, packet_frames=4, max_frames=REFS["max_new_tokens"] - 1, greedy=True,
                        voices={"alloy": "vivian", "ash": "ryan", "verse": "eric"}, max_streams=2)
    yield eng
    eng.close()


async def collect(stream, timeout: float = 60) -> list[TTSChunk]:
    async with asyncio.timeout(timeout):
        return [chunk async for chunk in stream]


async def test_stream_yields_the_official_greedy_audio(engine: QwenTTSEngine, ckpt: checkpoint.Checkpoint) -> None:
    stream = engine.open("alloy", "english")
    stream.feed(TEXT)
    stream.end()
    chunks = await collect(stream)
    assert engine.incremental
    assert [len(c.pcm) for c in chunks] == [4 * BYTES_PER_FRAME] * 5 + [BYTES_PER_FRAME]
    assert "".join(c.text for c in chunks) == TEXT
    # 4 frames (320 ms) speak about "Hello", though the model has read 4 tokens ("Hello w") by then.
    assert [c.text for c in chunks][:3] == ["Hello", " world", ", th"]
    params = SamplingParams.from_generation_config(ckpt.generation, greedy=True)
    _, packets = synthesize(ckpt, "vivian", "english", TEXT, params, max_frames=REFS["max_new_tokens"] - 1)
    assert b"".join(c.pcm for c in chunks) == b"".join(p.pcm for p in packets)


async def test_live_feed_waits_for_text(engine: QwenTTSEngine) -> None:
    """Fragments cut mid-word, with pauses longer than a step: the same audio as the text fed whole."""
    whole = engine.open("alloy", "english")
    whole.feed(TEXT)
    whole.end()
    expected = await collect(whole)

    stream = engine.open("alloy", "english")
    chunks: list[TTSChunk] = []

    async def read() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    reader = asyncio.create_task(read())
    for fragment in ("Hel", "lo wor", "ld, this", " is a t", "est."):
        stream.feed(fragment)
        await asyncio.sleep(0.05)
    stream.end()
    async with asyncio.timeout(60):
        await reader
    assert b"".join(c.pcm for c in chunks) == b"".join(c.pcm for c in expected)
    assert "".join(c.text for c in chunks) == TEXT


async def test_two_streams_interleave(engine: QwenTTSEngine) -> None:
    first = engine.open("ash")  # ryan, language auto
    second = engine.open("verse", "chinese")  # eric: the sichuan dialect tag
    first.feed("How are you doing today?")
    second.feed("你好，世界！这是一个测试。")
    first.end()
    second.end()
    a, b = await asyncio.gather(collect(first), collect(second))
    # The references hold what each makes alone: 12 and 2 frames.
    assert sum(len(c.pcm) for c in a) == 12 * BYTES_PER_FRAME
    assert sum(len(c.pcm) for c in b) == 2 * BYTES_PER_FRAME
    assert "".join(c.text for c in b) == "你好，世界！这是一个测试。"


async def test_more_streams_than_slots_wait(engine: QwenTTSEngine) -> None:
    streams = [engine.open("alloy", "english") for _ in range(3)]
    for s in streams:
        s.feed("How are you?")
        s.end()
    results = await asyncio.gather(*(collect(s) for s in streams))
    # Two streams run as one batch, the third alone once a row is free: the same codes, and the same audio
    # up to float rounding (a batch of 2 takes other GEMM kernels than a batch of 1 in the codec).
    waves = [np.frombuffer(b"".join(c.pcm for c in r), dtype=np.int16).astype(np.float64) for r in results]
    assert waves[0].size and all(w.shape == waves[0].shape for w in waves)
    assert all(np.linalg.norm(w - waves[0]) / np.linalg.norm(waves[0]) < 1e-3 for w in waves)
    assert all([c.text for c in r] == [c.text for c in results[0]] for r in results)


async def test_free_streams_count_the_rows_held(engine: QwenTTSEngine) -> None:
    assert engine.free_streams == engine.max_streams
    stream = engine.open("alloy", "english")
    # No text yet: it holds its row, waiting for some.
    assert engine.free_streams == engine.max_streams - 1
    stream.cancel()
    for _ in range(200):
        if engine.free_streams == engine.max_streams:
            break
        await asyncio.sleep(0.01)
    assert engine.free_streams == engine.max_streams


async def test_cancel_ends_iteration_and_frees_the_slot(engine: QwenTTSEngine) -> None:
    stream = engine.open("alloy", "english")
    stream.feed(TEXT)
    stream.end()
    got = []
    async with asyncio.timeout(60):
        async for chunk in stream:
            got.append(chunk)
            stream.cancel()
    assert len(got) == 1
    # Both slots are usable afterwards: two more streams complete.
    others = [engine.open("ash", "english") for _ in range(2)]
    for s in others:
        s.feed("How are you doing today?")
        s.end()
    assert all(await asyncio.gather(*(collect(s) for s in others)))


async def test_cancel_while_waiting_for_text(engine: QwenTTSEngine) -> None:
    stream = engine.open("alloy", "english")
    stream.feed("Hello")  # one unfinished word: not runnable yet
    await asyncio.sleep(0.05)
    stream.cancel()
    assert await collect(stream, timeout=5) == []


async def test_bad_input(engine: QwenTTSEngine) -> None:
    with pytest.raises(TTSError, match="unknown speaker"):
        engine.open("nova", "english")
    with pytest.raises(TTSError, match="unknown language"):
        engine.open("alloy", "klingon")
    stream = engine.open("alloy", "en")  # ISO codes are accepted
    stream.feed("  ")
    with pytest.raises(TTSError, match="empty text"):
        stream.end()
    assert await collect(stream, timeout=5) == []
    with pytest.raises(TTSError, match="feed after end"):
        stream.feed("more")
    long = engine.open("alloy")
    with pytest.raises(TTSError, match="longer than 2000"):
        long.feed("a" * 2001)
    long.cancel()


async def test_eos_ends_the_stream(ckpt: checkpoint.Checkpoint) -> None:
    """A model that says EOS as soon as it may (after the official minimum of 2 frames)."""
    head = ckpt.model.talker.codec_head
    bias = torch.zeros(head.out_features)
    bias[ckpt.config.codec_eos] = 1e4
    head.bias = torch.nn.Parameter(bias)
    try:
        engine = QwenTTSEngine(ckpt, greedy=True, max_streams=1)
        stream = engine.open("vivian", "english")
        stream.feed(TEXT)
        stream.end()
        chunks = await collect(stream)
        engine.close()
    finally:
        head.bias = None
    assert sum(len(c.pcm) for c in chunks) == 2 * BYTES_PER_FRAME
    assert "".join(c.text for c in chunks) == TEXT  # the last packet claims the text never spoken


def test_from_config(tmp_path: Path) -> None:
    config = EngineConfig(checkpoint=str(FIXTURE), device="cpu", max_frames=10, voices={"alloy": "vivian"})
    engine = QwenTTSEngine.from_config(config)
    try:
        # The mapped OpenAI names and the checkpoint's own speakers: what a session may ask for.
        assert engine.voices == {"alloy", *engine.models[0].ckpt.config.speakers}
    finally:
        engine.close()
    with pytest.raises(checkpoint.CheckpointError, match="no such speaker"):
        QwenTTSEngine.from_config(EngineConfig(checkpoint=str(FIXTURE), voices={"alloy": "nobody"}))
    with pytest.raises(checkpoint.CheckpointError, match="huggingface-cli download"):
        QwenTTSEngine.from_config(EngineConfig(checkpoint=str(tmp_path / "absent")))


def test_gateway_builds_this_engine() -> None:
    from gateway.config import Config
    from gateway.responders.build import build_tts_engine

    config = Config()
    config.engine = EngineConfig(checkpoint=str(FIXTURE), device="cpu", max_frames=10)
    engine = build_tts_engine(config)
    try:
        assert isinstance(engine, QwenTTSEngine)
    finally:
        engine.close()


async def test_a_short_first_packet(ckpt: checkpoint.Checkpoint, engine: QwenTTSEngine) -> None:
    """first_packet_frames=1: the first 80 ms go out after one frame; the audio is the same."""
    whole = engine.open("alloy", "english")
    whole.feed(TEXT)
    whole.end()
    expected = await collect(whole)
    quick = QwenTTSEngine(ckpt, packet_frames=4, first_packet_frames=1, max_frames=REFS["max_new_tokens"] - 1,
                          greedy=True, max_streams=1)
    heard = REGISTRY.get_sample_value("tts_engine_first_audio_seconds_count") or 0
    try:
        stream = quick.open("vivian", "english")
        stream.feed(TEXT)
        stream.end()
        chunks = await collect(stream)
    finally:
        quick.close()
    # The engine metrics the gateway's /metrics serves: one more first audio, no stream left.
    assert REGISTRY.get_sample_value("tts_engine_first_audio_seconds_count") == heard + 1
    assert REGISTRY.get_sample_value("tts_engine_active_streams") == 0
    # 1 + 5 x 4 frames, then EOS with no frame pending: a last packet with the text left and no audio.
    assert [len(c.pcm) for c in chunks] == [BYTES_PER_FRAME] + [4 * BYTES_PER_FRAME] * 5 + [0]
    assert chunks[-1].text and "".join(c.text for c in chunks) == TEXT
    a, b = (np.frombuffer(b"".join(c.pcm for c in r), dtype=np.int16).astype(np.float64) for r in (chunks, expected))
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-3  # other packet sizes: other float rounding


async def test_a_long_text_taken_a_window_at_a_time(ckpt: checkpoint.Checkpoint, engine: QwenTTSEngine) -> None:
    """A stream tokenizes its text a window at a time as its frames near it (a burst of long inputs would
    otherwise wait for all of their tokenizing): with windows of 4 characters, each packet's audio and text
    are those of the text taken whole, for text with spaces and without, a word longer than windows, whole and
    in fragments."""
    narrow = QwenTTSEngine(ckpt, packet_frames=4, max_frames=REFS["max_new_tokens"] - 1, greedy=True,
                           voices={"alloy": "vivian"}, max_streams=2, text_window=4)
    try:
        for text, language in ((TEXT, "english"), ("So " + "abcdefghij" * 3 + ", ok.", "english"),
                               ("今天天气很好我们去公园散步吧，好吗？", "chinese")):
            got = []
            for eng, fragments in ((engine, [text]), (narrow, [text]), (narrow, [text[:9], text[9:]])):
                stream = eng.open("alloy", language)
                for fragment in fragments:
                    stream.feed(fragment)
                stream.end()
                got.append([(c.pcm, c.text) for c in await collect(stream)])
            assert got[0] and got[1] == got[0] and got[2] == got[0], text
    finally:
        narrow.close()


@pytest.fixture(scope="module")
def family() -> QwenTTSEngine:
    """One engine holding a CustomVoice 1.7B, a Base and a VoiceDesign checkpoint ([engine] checkpoint lists them)."""
    paths = ",".join(str(DATA / f"qwen3_tts_tiny_{kind}") for kind in ("instruct", "base", "design"))
    eng = QwenTTSEngine.from_config(EngineConfig(checkpoint=paths, device="cpu", max_frames=FAMILY_FRAMES,
                                                 greedy=True, max_streams=2, voices={"alloy": "vivian"}))
    yield eng
    eng.close()


FAMILY_FRAMES = 12


async def speak(engine: QwenTTSEngine, text: str, voice: str = "", language: str = "english", **kw) -> bytes:
    stream = engine.open(voice, language, **kw)
    stream.feed(text)
    stream.end()
    return b"".join(c.pcm for c in await collect(stream))


def reference_audio() -> tuple[np.ndarray, int]:
    samples, rate = decode_wav((ROOT / "tests" / "fixtures" / "one_sentence.wav").read_bytes())
    return samples[:, 0], rate


async def test_every_kind_in_one_engine(family: QwenTTSEngine) -> None:
    """Named speakers with and without instructions, a clone prepared on the engine's thread, a designed
    voice: each speaks what the same checkpoint makes alone."""
    assert family.kinds == ["custom_voice", "base", "voice_design"] and family.follows_instructions
    audio, rate = reference_audio()
    icl = await family.prepare(audio, rate, "The quick brown fox jumps over the lazy dog.")
    xvec = await family.prepare(audio, rate)
    assert (icl.mode, xvec.mode) == ("icl", "x_vector")
    assert list(family.models[1].runner.voices.kept) == [icl.key, xvec.key]  # ready for their first streams
    design = VoicePrompt.design("A warm, low female voice, speaking calmly.")
    text = "Hello world, this is a test."
    got = await asyncio.gather(speak(family, text, "alloy"), speak(family, text, "vivian", instructions="Whisper."),
                               speak(family, text, "icl", prompt=icl), speak(family, text, "xvec", prompt=xvec),
                               speak(family, text, "calm", prompt=design))
    # Checkpoints of their own: a runner sets up the model it runs (the engine's are in use).
    custom, base, designer = (checkpoint.load(str(m.ckpt.folder), device="cpu") for m in family.models)
    params = SamplingParams.from_generation_config(custom.generation, greedy=True)

    def alone(ckpt: checkpoint.Checkpoint, speaker: str | None, **kw) -> bytes:
        _, packets = synthesize(ckpt, speaker, "english", text, params, max_frames=FAMILY_FRAMES, **kw)
        return b"".join(p.pcm for p in packets)

    expected = [alone(custom, "vivian"), alone(custom, "vivian", instructions="Whisper."),
                alone(base, None, clone=icl), alone(base, None, clone=xvec), alone(designer, None, clone=design)]
    for a, b in zip(got, expected, strict=True):
        x, y = (np.frombuffer(v, dtype=np.int16).astype(np.float64) for v in (a, b))
        assert x.shape == y.shape and x.size
        assert np.linalg.norm(x - y) / np.linalg.norm(y) < 1e-3  # a batch of 2 rounds differently in the codec
    assert got[0] != got[1]  # the instruction changed the speech


async def test_voices_the_engine_cannot_speak(family: QwenTTSEngine, engine: QwenTTSEngine) -> None:
    audio, rate = reference_audio()
    with pytest.raises(TTSError, match="needs a Base checkpoint"):
        await engine.prepare(audio, rate)
    with pytest.raises(TTSError, match="reference audio of 0.5 s"):
        await family.prepare(audio[:rate // 2], rate)
    clone = await family.prepare(audio, rate)
    with pytest.raises(TTSError, match="a cloned voice needs a Base checkpoint"):
        engine.open("mine", prompt=clone)
    with pytest.raises(TTSError, match="a designed voice needs a VoiceDesign checkpoint"):
        engine.open("calm", prompt=VoicePrompt.design("Calm."))
    other = VoicePrompt(kind="clone", speaker=clone.speaker, model={**clone.model, "fingerprint": "0" * 16})
    with pytest.raises(TTSError, match="prepared for another checkpoint"):
        family.open("mine", prompt=other)
    with pytest.raises(TTSError, match="takes no separate instructions"):
        family.open("calm", prompt=VoicePrompt.design("Calm."), instructions="Whisper.")
    with pytest.raises(TTSError, match="max_instructions_tokens"):
        family.open("alloy", instructions="very " * 300)
    # A 0.6B CustomVoice checkpoint ignores instructions, as the official code does.
    assert await speak(engine, TEXT, "alloy", instructions="Whisper.") == await speak(engine, TEXT, "alloy")


async def test_an_in_context_clone_waits_for_enough_text(family: QwenTTSEngine) -> None:
    """Its prompt holds as many text tokens as the reference has frames: fed word by word, the stream
    starts once the text is final (or that long) and makes what the whole text makes."""
    audio, rate = reference_audio()
    icl = await family.prepare(audio, rate, "The quick brown fox jumps over the lazy dog.")
    text = "Hello world, this is a test."
    whole = await speak(family, text, "icl", prompt=icl)
    stream = family.open("icl", "english", prompt=icl)
    reader = asyncio.create_task(collect(stream))
    for word in text.split(" "):
        stream.feed(word + " ")
        await asyncio.sleep(0.02)
    assert not reader.done()
    stream.end()
    assert b"".join(c.pcm for c in await reader) == whole


async def test_each_stream_samples_with_its_own_seed_and_parameters(ckpt: checkpoint.Checkpoint) -> None:
    """Streams sharing a batch, each with its own seed, temperature, top-k and top-p (the speech API's extra
    fields): a stream's audio depends on its own parameters only, not on what shares its batch, and its seed
    reproduces it."""
    engine = QwenTTSEngine(ckpt, packet_frames=4, max_frames=24, max_streams=3, voices={"alloy": "vivian"})
    try:
        async def say(*samplings: Sampling | None) -> list[bytes]:
            streams = [engine.open("alloy", "english", sampling=s) for s in samplings]
            for stream in streams:
                stream.feed(TEXT)
                stream.end()
            return [b"".join(c.pcm for c in chunks) for chunks in await asyncio.gather(*map(collect, streams))]

        def same(a: bytes, b: bytes) -> bool:
            # The same codes; the codec's batched decode may round a sample differently by one step.
            x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
            return len(x) == len(y) and np.abs(x - y).max() <= 1

        own = Sampling(seed=11, temperature=0.6, top_k=5, top_p=0.8, subtalker_top_k=3)
        alone, = await say(own)
        shared = await say(Sampling(seed=11), own, None)
        assert same(shared[1], alone)  # whatever shares the batch
        assert not same(shared[0], alone) and not same(shared[2], alone)  # the parameters, the seed change it
        assert not same((await say(Sampling(seed=12, temperature=0.6, top_k=5, top_p=0.8, subtalker_top_k=3)))[0],
                        alone)
        with pytest.raises(TTSError, match="'top_p' must be above 0"):
            engine.open("alloy", "english", sampling=Sampling(top_p=0.0))
    finally:
        engine.close()


async def test_a_segmented_clone_speaks_its_first_segment_at_once(family: QwenTTSEngine) -> None:
    """What the pipeline does for an in-context clone: each segment its own utterance, so the first
    segment's speech comes while the reply is still being written (the stream is not ended)."""
    audio, rate = reference_audio()
    icl = await family.prepare(audio, rate, "The quick brown fox jumps over the lazy dog.")
    stream = SegmentedStream(family, voice="icl", language="english", prompt=icl)
    chunks = aiter(stream)
    stream.feed("Hello world,")
    async with asyncio.timeout(60):
        first = await anext(chunks)
    assert first.text == "Hello world," and first.pcm
    stream.feed("this is a test.")
    stream.end()
    async with asyncio.timeout(60):
        rest = [chunk async for chunk in chunks]
    assert [c.text for c in rest if c.text] == ["this is a test."]
    second = rest[next(i for i, c in enumerate(rest) if c.text):]
    assert b"".join(c.pcm for c in second) == await speak(family, "this is a test.", "icl", prompt=icl)
