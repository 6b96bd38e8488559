"""gateway.runtime.silero: Silero wrapper against the reference, turn detection on real speech, and chunking."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest
import soxr

from gateway.audio import InputDecoder, OutputEncoder
from gateway.core.vad import SpeechStarted, SpeechStopped, TurnDetector
from gateway.realtime.session import Session
from gateway.responders.echo import EchoResponder
from gateway.runtime.session_runner import SessionRunner
from gateway.runtime.silero import (
    MODEL_SHA256,
    WINDOW,
    WINDOW_BYTES,
    ModelChecksumError,
    SileroModel,
    SileroVAD,
    VadBatcher,
    process_many,
)
from tests.conftest import FIXTURES, load_pcm, make_config, silence, split

MANIFEST = json.loads((FIXTURES / "fixtures.json").read_text())



@pytest.fixture(scope="module")
def model() -> SileroModel:
    return SileroModel.shared()


@pytest.fixture(scope="module")
def fixture_probs(model: SileroModel) -> dict[str, np.ndarray]:
    return {name: SileroVAD(model).process(load_pcm(name)) for name in MANIFEST}


# --- SileroModel ---


def test_model_checksum_mismatch_names_file_and_hashes(tmp_path: Path) -> None:
    with pytest.raises(ModelChecksumError) as err:
        SileroModel(sha256="0" * 64)
    message = str(err.value)
    assert "silero_vad.onnx" in message and MODEL_SHA256 in message and "0" * 64 in message
    tampered = tmp_path / "tampered.onnx"
    shutil.copyfile(SileroModel.shared().path, tampered)
    with tampered.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ModelChecksumError, match="tampered.onnx"):
        SileroModel(tampered)


# --- SileroVAD ---


def test_probabilities_equal_reference_onnx_wrapper(model: SileroModel) -> None:
    torch = pytest.importorskip("torch")
    from silero_vad.utils_vad import OnnxWrapper

    pcm = np.frombuffer(load_pcm("two_turns.wav"), dtype="<i2").astype(np.float32) / 32768
    audio16k = soxr.resample(pcm, 24_000, 16_000).astype(np.float32)
    reference = OnnxWrapper(str(model.path), force_onnx_cpu=True)
    n = len(audio16k) // WINDOW
    expected = np.array(
        [reference(torch.from_numpy(audio16k[i * WINDOW : (i + 1) * WINDOW]), 16_000).item() for i in range(n)]
    )
    vad = SileroVAD(model)
    # Uneven pieces: partial windows must be buffered and the context carried exactly as the reference.
    got = np.concatenate([vad.process_16k(c) for c in np.array_split(audio16k, 97)])
    assert len(got) == n == vad.windows
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert (expected > 0.5).sum() > n // 3  # the comparison covers real speech, not only silence


def test_chunking_gives_identical_probabilities(model: SileroModel, fixture_probs: dict) -> None:
    pcm = load_pcm("two_turns.wav")
    whole = fixture_probs["two_turns.wav"]
    for sizes in ([960], [1, 4801, 333], [7, 65536]):
        vad = SileroVAD(model)
        got = np.concatenate([vad.process(c) for c in split(pcm, sizes)])
        assert np.array_equal(got, whole)


def test_process_many_matches_one_by_one(model: SileroModel, fixture_probs: dict) -> None:
    """Bit for bit, whatever else shares the batch: a session's turns must not depend on the others' (a
    probability a hair off the threshold would move a turn's boundary, and so its audio and transcript)."""
    names = list(MANIFEST)
    vads = [SileroVAD(model) for _ in names]
    # A different chunk size per session (some odd), so sessions bring different window counts per call.
    chunks = [split(load_pcm(name), [9600 + 2 * k + k % 2]) for k, name in enumerate(names)]
    got: list[list[np.ndarray]] = [[] for _ in names]
    for step in range(max(len(c) for c in chunks)):
        batch = [(vad, c[step] if step < len(c) else b"") for vad, c in zip(vads, chunks, strict=True)]
        for k, probs in enumerate(process_many(batch)):
            got[k].append(probs)
    for k, name in enumerate(names):
        assert np.array_equal(np.concatenate(got[k]), fixture_probs[name]), name
        assert vads[k].windows == len(fixture_probs[name])
    with pytest.raises(ValueError):
        process_many([(vads[0], b""), (vads[0], b"")])


async def test_batcher_batches_sessions_and_keeps_each_in_order(
    model: SileroModel, fixture_probs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_sizes: list[int] = []
    infer = model.infer

    def counting_infer(x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        batch_sizes.append(len(x))
        return infer(x, state)

    monkeypatch.setattr(model, "infer", counting_infer)
    names = [name for name in MANIFEST if MANIFEST[name]["speech_ms"]] * 3  # 9 sessions

    async def session(batcher: VadBatcher, name: str) -> np.ndarray:
        vad = SileroVAD(model)
        out = []
        for chunk in split(load_pcm(name), [4800]):  # 100 ms appends, as fast as results come
            out.append(await batcher.process(vad, chunk))
        return np.concatenate(out)

    with ThreadPoolExecutor(1) as executor:
        for batcher in (VadBatcher(executor), VadBatcher()):
            results = await asyncio.gather(*(session(batcher, name) for name in names))
            for name, probs in zip(names, results, strict=True):
                np.testing.assert_allclose(probs, fixture_probs[name], atol=1e-5)
    assert max(batch_sizes) >= 6


WAVS = sorted(path.name for path in FIXTURES.glob("*.wav"))


async def test_batched_vad_finds_the_per_session_turns_to_the_sample(model: SileroModel) -> None:
    """Every recorded fixture streamed at once through one VadBatcher in its thread, each in appends of its own
    size, the batches mixed by the appends' timing: each session gets the per-session VAD's probabilities bit
    for bit, so its turns start and stop at the same sample."""
    reference = {name: SileroVAD(model).process(load_pcm(name)) for name in WAVS}
    vads = {name: SileroVAD(model) for name in WAVS}
    got: dict[str, list[np.ndarray]] = {name: [] for name in WAVS}
    # 20 ms appends, and others that bring several windows at once or none (odd sizes split samples).
    chunks = {name: split(load_pcm(name), [960 + 1441 * (k % 3) + k % 2]) for k, name in enumerate(WAVS)}
    with ThreadPoolExecutor(1, thread_name_prefix="vad") as executor:
        batcher = VadBatcher(executor, interval_ms=5)
        for step in range(max(map(len, chunks.values()))):
            for name in WAVS:
                if step < len(chunks[name]):
                    batcher.feed(vads[name], chunks[name][step], got[name].append)
            await asyncio.sleep(0.003 * (step % 3))
        for _ in range(500):
            if not any(vad.queued for vad in vads.values()):
                break
            await asyncio.sleep(0.01)
    assert max(map(len, reference.values())) > 100
    for name in WAVS:
        probs = np.concatenate(got[name])
        assert np.array_equal(probs, reference[name]), name
        assert TurnDetector().feed(probs) == TurnDetector().feed(reference[name]), name
    turns = [e for name in WAVS for e in TurnDetector().feed(reference[name])]
    assert sum(isinstance(e, SpeechStopped) for e in turns) >= 8  # the comparison covers real turns


async def test_sessions_on_the_batched_vad_send_the_per_session_turn_times(model: SileroModel) -> None:
    """Through the session runner: sessions sharing the batched VAD send speech_started and speech_stopped
    at the same input-audio times as sessions with a VAD of their own."""

    async def turns(batcher: VadBatcher | None) -> dict[str, list[tuple[str, int]]]:
        sent: dict[str, list[dict]] = {name: [] for name in WAVS}
        runners = {}
        for name in WAVS:
            async def record(message: str, events: list[dict] = sent[name]) -> None:
                events.append(orjson.loads(message))
            session = Session(make_config(vad__create_response=False))
            runners[name] = SessionRunner(session, EchoResponder(pace=0), SileroVAD(model), record, batcher)
            await runners[name].start()
        chunks = {name: split(load_pcm(name) + silence(600), [960]) for name in WAVS}
        for step in range(max(map(len, chunks.values()))):
            for name in WAVS:
                if step < len(chunks[name]):
                    await runners[name].receive(orjson.dumps({"type": "input_audio_buffer.append", "audio":
                                                              base64.b64encode(chunks[name][step]).decode()}))
            await asyncio.sleep(0.002 * (step % 2))
        for _ in range(500):
            if not any(runner.vad.queued for runner in runners.values()):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the last events carried out
        for runner in runners.values():
            await runner.close()
        return {name: [(e["type"], e.get("audio_start_ms", e.get("audio_end_ms"))) for e in events
                       if e["type"].startswith("input_audio_buffer.speech_")] for name, events in sent.items()}

    alone = await turns(None)
    with ThreadPoolExecutor(1, thread_name_prefix="vad") as executor:
        batched = await turns(VadBatcher(executor, interval_ms=10))
    assert batched == alone
    assert sum(len(t) for t in alone.values()) >= 16


def test_each_window_is_ready_with_its_own_input(model: SileroModel) -> None:
    """No hold-back: the append that completes a window's 32 ms of input gets its probability, so speech_stopped
    never waits for the next append."""
    vad, sent = SileroVAD(model), 0
    for chunk in split(load_pcm("one_sentence.wav"), [960, 9600, 1, 1535, 30000]):
        before, pending = vad.windows, vad.windows_pending(len(chunk))
        sent += len(chunk)
        assert len(vad.process(chunk)) == pending == sent // WINDOW_BYTES - before
    vad.reset()
    assert vad.windows == 0 and len(vad.process(bytes(WINDOW_BYTES - 2))) == 0


def test_window_times_follow_input_audio(model: SileroModel, fixture_probs: dict) -> None:
    # 320 ms (10 windows) of leading silence must shift every event by 320 ms: windows are placed
    # in input time, with no drift or offset from the resampler.
    pcm = load_pcm("one_sentence.wav")
    base = TurnDetector().feed(fixture_probs["one_sentence.wav"])
    shifted = TurnDetector().feed(SileroVAD(model).process(bytes(320 * 48) + pcm))
    assert len(base) == len(shifted) == 2
    start, stop = shifted
    assert isinstance(start, SpeechStarted) and isinstance(stop, SpeechStopped)
    assert start.audio_start_ms == base[0].audio_start_ms + 320  # type: ignore[union-attr]
    assert abs(stop.audio_end_ms - base[1].audio_end_ms - 320) <= 32  # type: ignore[union-attr]


def test_g711_input_path_keeps_event_times(model: SileroModel, fixture_probs: dict) -> None:
    # A telephony client: the fixture as mu-law 8 kHz, decoded back to 24 kHz in 20 ms packets. The
    # decoder's resampler is delay-compensated too, so the events land where they do for pcm16.
    encoder = OutputEncoder("g711_ulaw")
    ulaw = encoder.encode(load_pcm("two_turns.wav")) + encoder.flush()
    decoder, vad = InputDecoder("g711_ulaw"), SileroVAD(model)
    probs = np.concatenate([vad.process(decoder.decode(packet)) for packet in split(ulaw, [160])])
    events = TurnDetector().feed(probs)
    expected = TurnDetector().feed(fixture_probs["two_turns.wav"])
    assert [type(e) for e in events] == [type(e) for e in expected]
    for got, want in zip(events, expected, strict=True):
        assert abs(event_ms(got) - event_ms(want)) <= 32


def event_ms(event: SpeechStarted | SpeechStopped) -> int:
    return event.audio_start_ms if isinstance(event, SpeechStarted) else event.audio_end_ms


# --- TurnDetector on real audio ---


@pytest.mark.parametrize("name", ["one_sentence.wav", "two_turns.wav", "speech_noise.wav"])
def test_speech_fixtures_give_turns_at_the_speech(name: str, fixture_probs: dict) -> None:
    detector = TurnDetector(prefix_padding_ms=0)
    events = detector.feed(fixture_probs[name])
    segments = MANIFEST[name]["speech_ms"]
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * len(segments)
    for (start, stop), (speech_start, speech_end) in zip(
        zip(events[::2], events[1::2], strict=True), segments, strict=True
    ):
        assert speech_start - 32 <= start.audio_start_ms <= speech_start + 100
        assert speech_end - 100 <= stop.audio_end_ms <= speech_end + 150
    assert not detector.in_speech


@pytest.mark.parametrize("name", ["silence.wav", "noise.wav"])
def test_silence_and_noise_give_no_turns(name: str, fixture_probs: dict) -> None:
    assert fixture_probs[name].max() < 0.1
    assert TurnDetector(threshold=0.3).feed(fixture_probs[name]) == []


def test_events_do_not_depend_on_how_probabilities_are_fed(fixture_probs: dict) -> None:
    probs = fixture_probs["two_turns.wav"]
    whole = TurnDetector().feed(probs)
    one_by_one = TurnDetector()
    assert [e for p in probs for e in one_by_one.feed([p])] == whole


# --- TurnDetector state machine ---


def windows(*runs: tuple[float, int]) -> list[float]:
    """Probabilities from (value, count) runs."""
    return [value for value, count in runs for _ in range(count)]


def test_start_padding_and_stop_times() -> None:
    d = TurnDetector(threshold=0.5, prefix_padding_ms=100, silence_duration_ms=200, min_speech_ms=64)
    # Onset at window 10 (320 ms); confirmed after two windows.
    assert d.feed(windows((0.0, 10), (0.9, 1))) == []
    assert d.feed([0.9]) == [SpeechStarted(audio_start_ms=220)]
    assert d.in_speech
    # Speech ends after window 19 (640 ms); 7 silent windows = 224 ms >= 200 ms.
    assert d.feed(windows((0.9, 8), (0.0, 6))) == []
    assert d.feed([0.0]) == [SpeechStopped(audio_end_ms=640)]
    assert not d.in_speech and d.position_ms == 864 and d.floor_ms == 864


def test_short_spikes_are_ignored() -> None:
    d = TurnDetector(min_speech_ms=64)
    assert d.feed(windows((0.0, 2), (0.95, 1), (0.0, 2), (0.95, 1), (0.2, 1))) == []
    assert d.feed(windows((0.95, 2))) == [SpeechStarted(audio_start_ms=0)]  # padding clamped at 0


def test_hysteresis() -> None:
    d = TurnDetector(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=96, min_speech_ms=32)
    assert d.feed([0.45] * 5) == []  # below threshold never starts
    assert d.feed([0.6]) == [SpeechStarted(audio_start_ms=160)]
    # Between the thresholds (0.35..0.5) speech continues indefinitely.
    assert d.feed([0.4] * 20) == []
    # A silence run starts below 0.35; in-between values do not cancel it, >= threshold does.
    assert d.feed([0.3, 0.4]) == []
    assert d.feed([0.55, 0.3, 0.3]) == []
    assert d.feed([0.4]) == [SpeechStopped(audio_end_ms=(6 + 20 + 3) * 32)]


def test_parameters_change_between_feeds_and_timeline_offset() -> None:
    d = TurnDetector(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500, start_ms=1000)
    assert d.feed(windows((0.0, 20), (0.4, 3))) == []
    d.threshold = 0.3  # session.update
    d.prefix_padding_ms = 0
    # Onset at the first window judged with the new threshold (window 23), not at the earlier 0.4s.
    assert d.feed(windows((0.4, 2))) == [SpeechStarted(audio_start_ms=1000 + 23 * 32)]
    d.silence_duration_ms = 64
    assert d.feed(windows((0.0, 2))) == [SpeechStopped(audio_end_ms=1000 + 25 * 32)]
    # Padding never reaches back past the previous stop's detection point.
    d.prefix_padding_ms = 1000
    assert d.feed(windows((0.9, 2))) == [SpeechStarted(audio_start_ms=1000 + 27 * 32)]


def test_reset_skips_audio_already_taken() -> None:
    """A commit or clear takes audio the VAD may not have seen yet: speech in it starts no turn."""
    d = TurnDetector(threshold=0.5, prefix_padding_ms=300, min_speech_ms=64)
    assert d.feed(windows((0.9, 1))) == []  # an onset at 0, not yet confirmed
    d.reset(until_ms=320)  # committed up to 320 ms, of which the VAD has seen 32
    assert d.feed(windows((0.9, 9))) == []  # the windows ending by 320 ms
    assert d.feed(windows((0.9, 2))) == [SpeechStarted(audio_start_ms=320)]  # padding stops at the commit
