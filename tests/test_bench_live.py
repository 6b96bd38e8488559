"""The GPT-Live benchmark's load side: where the user's speech ends in the audio sent, when our speech is heard in
the delta streams of both protocols and which turn it answers, barge-ins, the fake voice model that delegates,
and the Live capacity targets kept apart from Realtime's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.fake_openai import Script, delegating
from bench.live_load import COMMENTARY, answers, audible, barge_ins, runs, speech_spans, timeline, turn_ends
from bench.load import load_pcm
from bench.targets import evaluate


def pcm(*parts: tuple[str, int]) -> bytes:
    """pcm16 24 kHz: ("tone", ms) at -12 dBFS or ("quiet", ms) of digital silence."""
    out = []
    for kind, ms in parts:
        n = ms * 24
        out.append(8000 * np.sin(np.arange(1, n + 1) * 0.3) if kind == "tone" else np.zeros(n))
    return np.concatenate(out).astype(np.int16).tobytes()


def flat(pairs: list[tuple[float, float]]) -> list[float]:
    return [x for pair in pairs for x in pair]


def test_speech_spans_split_at_silences_longer_than_a_pause_only():
    audio = pcm(("quiet", 200), ("tone", 300), ("quiet", 300), ("tone", 200), ("quiet", 800), ("tone", 100),
                ("quiet", 50))
    spans = speech_spans(audio)
    assert [(round(a), round(b)) for a, b in spans] == [(200, 1000), (1800, 1900)]
    assert speech_spans(pcm(("quiet", 500))) == []


def test_the_scenarios_turns_are_the_fixture_sentence_each_time():
    sentence = speech_spans(load_pcm("one_sentence.wav"))
    assert len(sentence) == 1
    start, end = sentence[0]
    turn_ms = len(load_pcm("one_sentence.wav")) / 48 + 2000
    spans = speech_spans(timeline("turns", 3))
    assert flat(spans) == pytest.approx(flat([(start + k * turn_ms, end + k * turn_ms) for k in range(3)]), abs=0.05)
    assert len(speech_spans(timeline("capacity", 1))) == 2  # the gateway suite's pipeline scenario


def test_audible_is_the_span_of_what_is_above_silence():
    assert audible(pcm(("quiet", 100))) is None
    assert audible(pcm(("quiet", 30), ("tone", 40), ("quiet", 30))) == pytest.approx((30, 70), abs=0.1)


def test_live_replies_are_timed_from_the_end_of_speech_once_per_turn_and_barge_in_to_the_last_audible_sample():
    t0 = 100.0
    spans = [(500.0, 3000.0), (4000.0, 6000.0)]
    full, tail = (0.0, 100.0), (0.0, 50.0)
    deltas: list[tuple[float, tuple[float, float] | None]] = [(t0 + k / 10, None) for k in range(1, 36)]
    # turn 1's reply: heard from 3.6 s + 20 ms, a silent tick between its segments, cut 150 ms into turn 2
    deltas += [(t0 + 3.6, (20.0, 100.0)), (t0 + 3.7, full), (t0 + 3.8, None), (t0 + 3.9, full), (t0 + 4.0, full),
               (t0 + 4.1, tail), (t0 + 4.2, None)]
    deltas += [(t0 + k / 10, None) for k in range(43, 65)]
    deltas += [(t0 + 6.5, full), (t0 + 6.6, tail), (t0 + 6.7, None)]  # turn 2's reply
    heard = runs(deltas)
    assert flat(heard) == pytest.approx([t0 + 3.62, t0 + 3.8, t0 + 3.9, t0 + 4.15, t0 + 6.5, t0 + 6.65])
    assert answers(spans, t0, [first for first, _ in heard]) == pytest.approx({0: 620.0, 1: 500.0})
    assert barge_ins(spans, t0, heard) == pytest.approx([150.0])
    # a reply that ends before the user speaks again is no barge-in
    assert barge_ins(spans, t0, [(t0 + 3.62, t0 + 3.9)]) == []


def test_realtime_replies_are_timed_from_their_first_audible_audio_the_same_way():
    spans = [(500.0, 3000.0), (4000.0, 6000.0)]
    # a reply heard before the first turn ended answers nothing; the second reply of one turn counts once
    assert answers(spans, 0.0, [2.9, 3.45, 3.7, 6.38]) == pytest.approx({0: 450.0, 1: 380.0})


def body(last: dict[str, Any], delegate: bool = True) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": "delegate", "parameters": {}}}] if delegate else []
    return {"messages": [{"role": "system", "content": "Be brief."}, last], "tools": tools}


def test_the_fake_voice_model_delegates_a_user_turn_silently_and_speaks_what_it_is_told():
    voice = delegating("Sure.")
    script = voice(body({"role": "user", "content": "What is the status?"}))
    assert isinstance(script, Script) and script.text == ""
    assert [(c.name, c.arguments) for c in script.calls] == [("delegate", {"task": "check the staging status"})]
    told = {"role": "system", "content": f"Tell the user this now, briefly and in your own words: {COMMENTARY}"}
    assert voice(body(told)) == COMMENTARY
    assert voice(body({"role": "user", "content": "Hi"}, delegate=False)) == "Sure."  # a Realtime turn


def test_live_capacity_levels_meet_live_targets_and_never_realtime_ones():
    def level(protocol: str | None, first_delta: float) -> dict[str, Any]:
        row = {"responder": "pipeline", "tts": "engine", "model": "0.6b", "sessions_per_gpu": 1000,
               "arrivals": "poisson", "first_delta_p95_ms": first_delta, "valid": True}
        return row if protocol is None else {**row, "protocol": protocol}

    def ids(levels: list[dict[str, Any]]) -> dict[str, str]:
        return {t["id"]: t["status"] for t in evaluate("gateway", levels) if t["id"].endswith("first_delta")}

    assert ids([level("live", 300), level("live", 380)]) == {"gateway.live.0.6b.1000.first_delta": "met"}
    assert ids([level("realtime", 200), level("realtime", 240)]) == {"gateway.0.6b.1000.first_delta": "met"}
    # a record from before the field: Realtime's
    assert ids([level(None, 200), level(None, 240)]) == {"gateway.0.6b.1000.first_delta": "met"}


def test_a_turn_ends_at_the_gateways_own_end_of_speech_and_pause():
    audio = timeline("capacity", 1)
    ends = turn_ends(audio)
    for (_, end), turn_end in zip(speech_spans(audio), ends, strict=True):
        # Silero's end of speech lies on its 32 ms windows at or a little after the last loud sample
        assert end + 200 <= turn_end <= end + 200 + 96
