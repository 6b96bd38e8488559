"""semantic_vad: Smart Turn's features and verdicts on the real model, its turn state machine, and turns
through a real gateway and the unmodified openai SDK."""

from __future__ import annotations

import asyncio
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soxr
from transformers import WhisperFeatureExtractor

from gateway.config import ConfigError
from gateway.core.semantic_vad import CheckTurn, Eagerness, SemanticTurnDetector
from gateway.core.vad import SpeechStarted, SpeechStopped, TurnDetector
from gateway.realtime.effects import RunSmartTurn, SendEvent
from gateway.realtime.session import Session
from gateway.runtime.smart_turn import (
    MODEL_SHA256,
    N_SAMPLES,
    SmartTurnBatcher,
    SmartTurnModel,
    SmartTurnModelError,
    last_seconds,
    log_mel,
)
from tests.conftest import FIXTURES, connect, load_pcm, make_config, silence

PAUSED = "paused_turn.wav"  # "I want to fly from Boston to ... Denver on Friday."
(_, PAUSE_START), (PAUSE_END, SPEECH_END) = json.loads((FIXTURES / "fixtures.json").read_text())[PAUSED]["speech_ms"]


@pytest.fixture(scope="module")
def model() -> SmartTurnModel:
    return SmartTurnModel.shared()


# --- features and model ---


def test_log_mel_matches_whisper_feature_extractor() -> None:
    reference = WhisperFeatureExtractor(chunk_length=8)
    speech = soxr.resample(np.frombuffer(load_pcm("two_turns.wav"), "<i2").astype(np.float32) / 32768, 24_000, 16_000)
    noise = np.random.default_rng(0).standard_normal(150_000).astype(np.float32) * 0.1
    for audio in (speech[:30_000], speech, noise):  # padded in front, whole, cut to its last 8 s
        x = last_seconds(audio)
        assert len(x) == N_SAMPLES
        expected = reference(x, sampling_rate=16_000, padding="max_length", max_length=N_SAMPLES, truncation=True,
                             do_normalize=True, return_tensors="np").input_features[0]
        np.testing.assert_allclose(log_mel(x), expected, atol=1e-4)


def test_verdicts_on_an_unfinished_and_a_finished_sentence(model: SmartTurnModel) -> None:
    pcm = load_pcm(PAUSED)
    start = 200 * 48  # the speech starts at 500 ms; a turn includes 300 ms of padding
    unfinished = pcm[start : (PAUSE_START + 200) * 48]  # "I want to fly from Boston to", 200 ms into the pause
    finished = pcm[start : (SPEECH_END + 200) * 48]  # "... Denver on Friday."
    p_unfinished, p_finished = model.predict([unfinished, finished])
    assert p_unfinished < 0.3 and p_finished > 0.7
    # A batch gives what single calls give.
    assert model.predict([finished])[0] == pytest.approx(p_finished, abs=1e-4)


async def test_batcher_shares_model_calls_and_answers_each_caller(model: SmartTurnModel) -> None:
    calls = []

    class Counting(SmartTurnModel):
        def __init__(self) -> None:
            self._session = model._session

        def infer(self, feats):
            calls.append(len(feats))
            return super().infer(feats)

    pcm = load_pcm(PAUSED)
    turns = [pcm[: (PAUSE_START + 200) * 48], pcm[: (SPEECH_END + 200) * 48]] * 3
    with ThreadPoolExecutor(1) as executor:
        batcher = SmartTurnBatcher(Counting(), executor, max_batch=4)
        got = await asyncio.gather(*(batcher.predict(t) for t in turns))
    assert calls == [4, 2]  # the first six requests arrived together: batches of at most 4
    assert got == pytest.approx(list(model.predict(turns[:2])) * 3, abs=1e-4)
    assert got[0] < 0.3 < 0.7 < got[1]


def test_missing_or_corrupt_model_is_a_clear_error(tmp_path: Path, model: SmartTurnModel) -> None:
    with pytest.raises(SmartTurnModelError,
                       match=r"cannot read the Smart Turn model .*nowhere.onnx \(\[semantic_vad\] model_path\)"):
        SmartTurnModel(tmp_path / "nowhere.onnx")
    damaged = tmp_path / "damaged.onnx"
    data = model.path.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    with pytest.raises(SmartTurnModelError, match=f"damaged.onnx has SHA-256 .*expected {MODEL_SHA256}"):
        SmartTurnModel(damaged)
    with pytest.raises(SmartTurnModelError, match="damaged.onnx is not a valid ONNX model"):
        SmartTurnModel(damaged, sha256=None)
    shutil.copyfile(model.path, tmp_path / "copy.onnx")  # the right file anywhere is fine
    assert SmartTurnModel(tmp_path / "copy.onnx").path.name == "copy.onnx"


async def test_gateway_does_not_start_without_its_model(start_gateway, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere.onnx"):
        await start_gateway(semantic_vad__model_path=str(tmp_path / "nowhere.onnx"))
    with pytest.raises(ConfigError, match="semantic_vad.medium_threshold"):
        await start_gateway(semantic_vad__medium_threshold=1.5)


# --- the turn state machine (probabilities in, no model) ---

SPEECH, QUIET = 0.9, 0.05
EAGER = Eagerness(threshold=0.5, max_wait_ms=2000)


def windows(ms: int, p: float) -> list[float]:
    return [p] * (ms // 32)


def detector(**kw) -> SemanticTurnDetector:
    return SemanticTurnDetector(TurnDetector(prefix_padding_ms=0), EAGER, pause_ms=200, **kw)


def test_a_complete_verdict_ends_the_turn_at_the_end_of_speech() -> None:
    d = detector()
    events = d.feed(windows(320, QUIET) + windows(960, SPEECH) + windows(640, QUIET))
    started, check = events
    assert isinstance(started, SpeechStarted) and started.audio_start_ms == 320
    # The check covers the turn up to 224 ms (7 windows) into the pause; later windows wait for its verdict.
    assert isinstance(check, CheckTurn) and (check.start_ms, check.end_ms) == (320, 1280 + 224)
    assert d.verdict(check.seq, 0.9) == [SpeechStopped(audio_end_ms=1280)]
    assert not d.in_speech


def test_an_incomplete_verdict_keeps_the_turn_open_through_the_pause() -> None:
    d = detector()
    (_, check) = d.feed(windows(320, QUIET) + windows(960, SPEECH) + windows(640, QUIET))
    assert d.verdict(check.seq, 0.1) == []
    # The user goes on after a 1.5 s pause: the same turn (no second speech_started); its next pause
    # is checked on the whole turn.
    events = d.feed(windows(864, QUIET) + windows(640, SPEECH) + windows(320, QUIET))
    (again,) = events
    assert isinstance(again, CheckTurn) and again.start_ms == 320 and again.seq != check.seq
    assert d.verdict(again.seq, 0.8) == [SpeechStopped(audio_end_ms=1280 + 1504 + 640)]


def test_silence_ends_an_incomplete_turn_after_the_longest_wait() -> None:
    d = detector()
    (_, check) = d.feed(windows(320, QUIET) + windows(960, SPEECH) + windows(1920, QUIET))
    assert d.verdict(check.seq, 0.1) == []
    assert d.feed(windows(64, QUIET)) == []  # 1984 ms of silence
    assert d.feed(windows(32, QUIET)) == [SpeechStopped(audio_end_ms=1280)]  # 2016 ms ≥ 2000
    assert d.verdict(check.seq, 0.9) == []  # a late or repeated verdict changes nothing


def test_turns_do_not_depend_on_when_verdicts_arrive() -> None:
    """Windows fed while a check is out are judged after its verdict, at the audio they cover."""
    probs = windows(320, QUIET) + (windows(640, SPEECH) + windows(1216, QUIET)) * 3 + windows(3000, QUIET)
    outcomes = []
    for chunk in (1, 7, len(probs)):  # verdicts after every window, every 7, or once all audio is in
        answers = iter([0.9, 0.1, 0.2])
        d, events, pending = detector(), [], []
        for i in range(0, len(probs), chunk):
            pending += d.feed(probs[i : i + chunk])
            while pending:
                ev = pending.pop(0)
                if isinstance(ev, CheckTurn):
                    pending += d.verdict(ev.seq, next(answers))
                else:
                    events.append(ev)
        outcomes.append(events)
    assert outcomes[0] == outcomes[1] == outcomes[2]
    # Turn 1 ends at its pause ("complete"); turn 2 goes on through an "incomplete" pause and ends once
    # its second pause has lasted the longest wait.
    assert outcomes[0] == [SpeechStarted(320), SpeechStopped(960), SpeechStarted(2176), SpeechStopped(4672)]


def test_rechecks_ask_again_as_the_silence_grows() -> None:
    d = detector(recheck_ms=500)
    (_, first) = d.feed(windows(320, QUIET) + windows(960, SPEECH) + windows(256, QUIET))
    assert d.verdict(first.seq, 0.1) == []
    (second,) = d.feed(windows(512, QUIET))
    assert second.end_ms - first.end_ms == 512 and second.start_ms == first.start_ms
    assert d.verdict(second.seq, 0.6) == [SpeechStopped(audio_end_ms=1280)]


def test_reset_drops_the_turn_and_its_check() -> None:
    d = detector()
    (_, check) = d.feed(windows(320, QUIET) + windows(960, SPEECH) + windows(640, QUIET))
    d.feed(windows(320, SPEECH))  # held: the check is out
    d.reset(until_ms=2240)  # a commit took the audio so far
    assert d.verdict(check.seq, 0.9) == []
    assert d.position_ms == 2240  # the held windows were counted
    assert d.feed(windows(320, SPEECH))[0] == SpeechStarted(2240)


def test_session_asks_for_the_model_and_commits_on_its_verdict() -> None:
    session = Session(make_config())
    session.handle(json.dumps(td_update(False, type="semantic_vad")))
    session.input_audio(bytes(48 * 4000))
    effects = session.vad_result(windows(320, QUIET) + windows(960, SPEECH) + windows(640, QUIET))
    (check,) = [e for e in effects if isinstance(e, RunSmartTurn)]
    assert len(check.pcm) == (1280 + 224 - 20) * 48  # the turn so far, with its 300 ms of prefix padding
    assert session.vad_result(windows(320, QUIET)) == []  # held until the verdict
    done = session.smart_turn_result(check.seq, 0.9)
    assert [e.event["type"] for e in done if isinstance(e, SendEvent)] == [
        "input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added",
        "conversation.item.done"]
    assert session.input.heard_ms == 320 + 960 + 960


def test_session_switching_to_server_vad_mid_check_drops_the_turn_and_keeps_the_clock() -> None:
    session = Session(make_config())
    session.handle(json.dumps(td_update(False, type="semantic_vad")))
    session.input_audio(bytes(48 * 4000))
    effects = session.vad_result(windows(320, QUIET) + windows(960, SPEECH) + windows(640, QUIET))
    (check,) = [e for e in effects if isinstance(e, RunSmartTurn)]
    session.vad_result(windows(640, QUIET))  # held: the check is out
    session.handle(json.dumps(td_update(False, type="server_vad")))
    assert session.smart_turn_result(check.seq, 0.9) == []
    assert session.input.heard_ms == 320 + 960 + 640 + 640 and session.input.speech is None


# --- through the gateway ---


def td_update(beta: bool, **td) -> dict:
    td = {**td, "create_response": False}
    if beta:
        return {"type": "session.update", "session": {"turn_detection": td}}
    return {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": td}}}}


async def turn_ends(gateway, audio: bytes, last_end_ms: int, beta: bool = False, **td) -> tuple[list[int], dict]:
    """Stream ``audio`` with these turn detection settings; the audio_end_ms of every speech_stopped up to the
    one at ``last_end_ms``, and the turn_detection session.updated reported."""
    async with connect(gateway, beta) as client:
        await client.send(td_update(beta, **td))
        updated = (await client.until("session.updated"))[-1]["session"]
        await client.append(audio, chunk_ms=100)
        ends: list[int] = []
        while not ends or ends[-1] < last_end_ms - 150:
            ends.append((await client.until("input_audio_buffer.speech_stopped", timeout=30))[-1]["audio_end_ms"])
    reported = updated["turn_detection"] if beta else updated["audio"]["input"]["turn_detection"]
    return ends, reported


async def test_semantic_vad_keeps_a_sentence_with_a_pause_whole(gateway) -> None:
    audio = load_pcm(PAUSED)  # a 0.7 s pause after "Boston to"
    ends, _ = await turn_ends(gateway, audio, SPEECH_END, type="server_vad", silence_duration_ms=500)
    assert len(ends) == 2 and abs(ends[0] - PAUSE_START) <= 150  # server VAD cuts the sentence at the pause
    ends, reported = await turn_ends(gateway, audio, SPEECH_END, type="semantic_vad")
    assert len(ends) == 1 and abs(ends[0] - SPEECH_END) <= 150
    assert reported == {"type": "semantic_vad", "eagerness": "auto", "create_response": False,
                        "interrupt_response": True}


async def test_eagerness_levels_wait_for_a_paused_sentence_as_long_as_they_say(gateway) -> None:
    """The sentence twice, paused after "Boston to" for ~3.2 s, then for ~6.2 s: high (waits 2 s) cuts it at
    both pauses, medium (4 s) at the long one, low (8 s) at neither; all end it where it ends."""
    pcm = load_pcm(PAUSED)
    before, after = pcm[: (PAUSE_START + 100) * 48], pcm[(PAUSE_END - 100) * 48 :]
    before_ms, after_speech_ms = PAUSE_START + 100, SPEECH_END - PAUSE_END + 100
    first = before + silence(3000) + after
    audio = first + before + silence(6000) + after
    first_ms = len(first) // 48
    first_end, second_pause = before_ms + 3000 + after_speech_ms, first_ms + PAUSE_START
    last_end = first_ms + before_ms + 6000 + after_speech_ms
    expected = {
        "high": [PAUSE_START, first_end, second_pause, last_end],
        "medium": [first_end, second_pause, last_end],
        "low": [first_end, last_end],
    }
    for eagerness, beta in (("high", True), ("medium", False), ("low", False)):
        ends, reported = await turn_ends(gateway, audio, last_end, beta, type="semantic_vad", eagerness=eagerness)
        assert reported["eagerness"] == eagerness
        assert len(ends) == len(expected[eagerness]), (eagerness, ends)
        assert all(abs(e - t) <= 150 for e, t in zip(ends, expected[eagerness], strict=True)), (eagerness, ends)
