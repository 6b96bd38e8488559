"""The capacity benchmark's phone calls (bench/sip_load.py): the audio a phone sends, what it hears in the gateway's
RTP and what it counts as wrong there, its turns timed from the gateway's trace, an unanswered call making a level
invalid, and the SIP targets kept apart from Realtime's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench import sip_load
from bench.live_load import speech_spans
from bench.load import Sessions, scenario
from bench.targets import evaluate
from bench.validity import Bounds, judge
from gateway.audio import ulaw_encode
from gateway.transports.sip import rtp

GATEWAY = ("127.0.0.1", 20000)


def test_a_phone_sends_the_scenario_as_whole_packets_of_ulaw_at_8_khz_with_its_two_turns():
    pcm = scenario("pipeline")
    ulaw = sip_load.phone_audio(pcm)
    assert len(ulaw) % sip_load.FRAME == 0 and abs(len(ulaw) / 8 - len(pcm) / 48) < 25
    spans = sip_load.spans_of(ulaw)
    assert len(spans) == 2
    assert np.ravel(spans) == pytest.approx(np.ravel(speech_spans(pcm)), abs=5)  # the resampler's 2 ms delay


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def time(self) -> float:
        return self.now


def test_the_phone_hears_runs_of_audible_audio_and_counts_what_is_wrong_with_the_stream():
    clock = Clock()
    media = sip_load.Media(clock)  # type: ignore[arg-type]
    tone = ulaw_encode((8000 * np.sin(np.arange(sip_load.FRAME) * 0.3)).astype(np.int16))
    sequence = 0

    def packet(payload: bytes, addr: tuple[str, int] = GATEWAY, payload_type: int = 0, skip: int = 0) -> None:
        nonlocal sequence
        sequence += 1 + skip
        media.datagram_received(rtp.build(payload_type, sequence, sequence * sip_load.FRAME, 7, payload), addr)
        clock.now += 0.02

    for payload in [sip_load.ULAW_SILENCE] * 5 + [tone] * 10 + [sip_load.ULAW_SILENCE] * 5 + [tone] * 5:
        packet(payload)  # a reply with a 100 ms pause in it: one run
    for _ in range(40):
        packet(sip_load.ULAW_SILENCE)  # 800 ms of silence: the next audio is another run
    packet(tone)
    packet(tone, skip=1)  # a packet lost
    packet(tone, addr=("127.0.0.1", 20002))  # not the gateway's port
    packet(bytes(sip_load.FRAME), payload_type=8)  # PCMA, not what was agreed
    assert [(round(a - 100, 3), round(b - 100, 3)) for a, b in media.runs] == [(0.1, 0.5), (1.3, 1.34)]
    assert (media.broken, media.foreign, media.malformed) == (1, 1, 1)
    assert len(media.errors(GATEWAY)) == 3 and not media.errors(GATEWAY)[0].startswith("RTP from")
    assert media.errors(("127.0.0.1", 20004))[0] == "RTP from 127.0.0.1:20000, not the SDP answer's 127.0.0.1:20004"


def trace(call: str, response: str, at_ms: float, audio_end_ms: float | None, status: str) -> dict[str, Any]:
    record = {"session_id": "sess_" + call, "call_id": "rtc_" + call, "line_call_id": call, "response_id": response,
              "at_ms": at_ms, "status": status}
    return record | ({"audio_end_ms": audio_end_ms} if audio_end_ms is not None else {})


def test_a_calls_turns_are_timed_from_the_gateways_trace():
    result = Sessions()
    spans = [(500.0, 3000.0), (4200.0, 6700.0)]
    # the call's audio started at 10 s on the host's clock; it heard turn 1's reply at 13.7 s and turn 2's at 17.4 s
    result.sip_calls = [{"line_call_id": "a", "t0_ms": 10_000.0, "spans": spans, "heard_ms": {0: 13_700.0,
                                                                                              1: 17_400.0}},
                        {"line_call_id": "lost", "t0_ms": 0.0, "spans": spans, "heard_ms": {}}]
    traces = [trace("a", "r2", 17_220.0, 6690.0, "completed"), trace("a", "r1", 13_515.0, 2990.0, "cancelled"),
              {"session_id": "sess_ws", "response_id": "r9", "at_ms": 1.0, "status": "completed"},  # not a call's
              trace("a", "r3", 18_000.0, None, "completed")]  # a response of no turn: its status only
    sip_load.join(result, traces, silence_ms=500)
    # speech_stopped 13.515 s, the silence complete at 10 + 2.99 + 0.5 s; then 17.22 s against 10 + 6.69 + 0.5 s
    assert result.stop_late_ms == pytest.approx([25.0, 30.0])
    assert result.first_delta_ms == pytest.approx([185.0, 180.0])
    assert result.responses == {"r1": "cancelled", "r2": "completed", "r3": "completed"}
    assert result.audio_errors == ["lost: no turn of the call in the gateway's trace"]


def test_an_unanswered_call_makes_a_level_invalid():
    assert judge({"client_lag_p99_ms": 1.0, "late_starts": 0, "unanswered_calls": 3}, Bounds()) == [
        "3 calls not answered"]
    assert judge({"client_lag_p99_ms": 1.0, "late_starts": 0, "unanswered_calls": 0}, Bounds()) == []


def test_sip_capacity_levels_bear_on_the_sip_targets_only():
    level = {"responder": "pipeline", "tts": "engine", "model": "0.6b", "sessions_per_gpu": 1000,
             "arrivals": "poisson", "first_delta_p95_ms": 260.0, "barge_in_p95_ms": 120.0, "valid": True}
    sip = {t["id"]: t for t in evaluate("gateway", [level | {"protocol": "sip"}] * 2)}
    assert set(sip) == {"gateway.sip.0.6b.1000.first_delta", "gateway.sip.0.6b.1000.barge_in"}
    assert all(t["met"] for t in sip.values())
    realtime = {t["id"] for t in evaluate("gateway", [level | {"protocol": "realtime"}] * 2)}
    assert not any(".sip." in target for target in realtime)
