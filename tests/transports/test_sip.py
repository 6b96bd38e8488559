"""The SIP endpoint against a real phone: baresip (Debian's) calls the gateway, says a recorded question from
a WAV file, records what it hears; an independent speech recognizer (the local extra's Whisper) hears the
answer. The gateway answers with the pipeline: the fake LLM's fixed sentence spoken by piper."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.phones.baresip import BARESIP, Baresip, phone_wav
from tests.phones.gateway import ANSWER
from tests.phones.hearing import heard, transcribe, words

pytestmark = [
    pytest.mark.skipif(BARESIP is None, reason="baresip is not installed (apt-get install baresip)"),
    pytest.mark.skipif(importlib.util.find_spec("piper") is None or importlib.util.find_spec("faster_whisper") is None,
                       reason='the local extra is not installed (pip install ".[local]")'),
]


async def call(gateway: Any, phone: Baresip, user: str = "agent") -> None:
    await phone.command("dial", f"sip:{user}@127.0.0.1:{gateway.app.state.phones.sip.port}")
    await phone.event("CALL_ESTABLISHED")


async def answered(gateway: Any, timeout: float = 30.0) -> None:
    """Until the one call's turn is done and its audio has left the line's playout; then time for its last
    packets to reach the phone's recording."""
    started = time.monotonic()
    while True:
        runners, lines = list(gateway.sessions), list(gateway.app.state.phones.sip.endpoint.lines.values())
        if len(runners) == len(lines) == 1 and runners[0].trace.records and lines[0].playout.idle:
            break
        assert time.monotonic() - started < timeout, "no answer played to the phone"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


async def test_a_phone_asks_and_hears_the_answer(phone_gateway: Any, tmp_path: Path) -> None:
    """No webhook: the default session answers; the phone hears the fixed sentence, recognizably; its turn's trace
    names the call (the gateway's id and the SIP Call-ID); hanging up frees the session and the RTP port."""
    gateway = await phone_gateway()
    phone = Baresip(tmp_path / "phone", phone_wav(tmp_path, "question_sky.wav"))
    await phone.start()
    try:
        await call(gateway, phone)
        await answered(gateway)
        (runner,) = gateway.sessions
        (line,) = gateway.app.state.phones.sip.endpoint.lines.values()
        (turn,) = runner.trace.records
        assert turn["call_id"].startswith("rtc_") and turn["line_call_id"] == line.call_id != ""
        assert turn["audio_end_ms"] > 0 and 0 < turn["at_ms"] < time.monotonic() * 1000
        await phone.command("hangup")
        await phone.event("CALL_CLOSED")
    finally:
        await phone.stop()
    for _ in range(50):
        if not gateway.sessions:
            break
        await asyncio.sleep(0.1)
    assert not gateway.sessions
    sip = gateway.app.state.phones.sip
    assert not sip.endpoint.ports.in_use and not gateway.app.state.phones.calls.calls
    text = transcribe(heard(phone.recording))
    expected = words(ANSWER)
    got = words(text)
    assert sum(w in got for w in expected) >= len(expected) * 0.7, text


async def test_a_transfer_that_succeeds_ends_the_call_and_frees_its_session(phone_gateway: Any, tmp_path: Path) -> None:
    """The phone follows the REFER to a second phone, which answers; its NOTIFY of that 200 ends our part: the
    gateway says BYE, and the call, its session and its RTP port go (they stayed until an API hang-up)."""
    from openai import AsyncOpenAI

    gateway = await phone_gateway(calls__webhook_urls="")
    caller = Baresip(tmp_path / "caller", phone_wav(tmp_path, "question_sky.wav"))
    desk = Baresip(tmp_path / "desk", phone_wav(tmp_path, "question_sky.wav"), username="desk")
    await caller.start()
    await desk.start()
    try:
        await desk.command("answermode", "auto")
        await call(gateway, caller)
        (phone_call,) = gateway.app.state.phones.calls.calls.values()
        client = AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1")
        await client.realtime.calls.refer(phone_call.id, target_uri=f"sip:desk@127.0.0.1:{desk.sip_port}")
        await desk.event("CALL_ESTABLISHED")
        for _ in range(100):
            if not gateway.sessions and not gateway.app.state.phones.calls.calls:
                break
            await asyncio.sleep(0.1)
    finally:
        await caller.stop()
        await desk.stop()
    assert not gateway.sessions and not gateway.app.state.phones.calls.calls
    assert not gateway.app.state.phones.sip.endpoint.ports.in_use


async def test_a_call_through_kamailio_is_transferred_by_refer_and_hung_up_by_the_gateway(
        phone_gateway: Any, tmp_path: Path) -> None:
    """Kamailio is the trunk's proxy: the call comes through it, and the REFER the gateway sends (the SDK's
    refer) and its BYE go back through it by the dialog's route set."""
    from openai import AsyncOpenAI

    from tests.phones.kamailio import KAMAILIO, Kamailio

    if KAMAILIO is None:
        pytest.skip("kamailio is not installed (apt-get install kamailio)")
    gateway = await phone_gateway(calls__webhook_urls="")
    proxy = Kamailio(tmp_path / "kamailio", gateway.app.state.phones.sip.port)
    await proxy.start()
    phone = Baresip(tmp_path / "phone", phone_wav(tmp_path, "question_sky.wav"))
    await phone.start()
    client = AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1")
    try:
        await phone.command("dial", f"sip:agent@127.0.0.1:{proxy.port}")
        await phone.event("CALL_ESTABLISHED")
        for _ in range(50):  # the phone says so as it sends its ACK: the proxy's log line may come just after
            if proxy.saw("ACK"):
                break
            await asyncio.sleep(0.1)
        assert proxy.saw("INVITE") and proxy.saw("ACK")
        (call,) = gateway.app.state.phones.calls.calls.values()
        await client.realtime.calls.refer(call.id, target_uri=f"sip:desk@127.0.0.1:{proxy.port}")
        for _ in range(50):
            if proxy.saw("REFER") and proxy.saw("NOTIFY"):
                break
            await asyncio.sleep(0.1)
        refer = proxy.saw("REFER")
        assert refer and "from 127.0.0.1:" in refer[0]
        # baresip follows the REFER: it calls the target, through the proxy (which has nobody by that name).
        for _ in range(50):
            if any("sip:desk@" in line for line in proxy.saw("INVITE")):
                break
            await asyncio.sleep(0.1)
        assert any("sip:desk@" in line for line in proxy.saw("INVITE"))
        await client.realtime.calls.hangup(call.id)
        await phone.event("CALL_CLOSED")
        for _ in range(50):  # kamailio logs what it relayed a moment after the phone has it
            if proxy.saw("BYE"):
                break
            await asyncio.sleep(0.1)
        assert proxy.saw("BYE")
    finally:
        await phone.stop()
        await proxy.stop()
    assert not gateway.sessions and not gateway.app.state.phones.sip.endpoint.ports.in_use


def bursts(samples: np.ndarray, threshold: float = 300.0, gap_s: float = 0.4) -> list[tuple[float, float]]:
    """(start, end) seconds of the sound in a recording at 8 kHz, pauses shorter than ``gap_s`` bridged."""
    frames = samples[: len(samples) // 160 * 160].reshape(-1, 160).astype(np.float32)
    loud = np.sqrt((frames ** 2).mean(axis=1)) > threshold
    spans: list[tuple[float, float]] = []
    for i in np.flatnonzero(loud):
        t = i * 0.02
        if spans and t - spans[-1][1] <= gap_s:
            spans[-1] = (spans[-1][0], t + 0.02)
        else:
            spans.append((t, t + 0.02))
    return spans


async def test_talking_over_the_agent_stops_its_audio(phone_gateway: Any, tmp_path: Path) -> None:
    """The caller asks, then speaks again while the answer plays: the gateway clears its playout (the sideband
    sees output_audio_buffer.cleared and the cancelled response) and the phone hears the answer stop there."""
    from openai import AsyncOpenAI

    gateway = await phone_gateway(calls__webhook_urls="")
    mic = tmp_path / "barge.wav"
    first = phone_wav(tmp_path, "question_sky.wav", pad_s=1.0)
    second = phone_wav(tmp_path, "question_spider.wav", pad_s=8)
    subprocess.run(["sox", str(first), str(second), str(mic)], check=True)
    phone = Baresip(tmp_path / "phone", mic)
    await phone.start()
    client = AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                         websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    events: list[Any] = []
    try:
        await call(gateway, phone)
        (line,) = gateway.app.state.phones.calls.calls.values()
        async with client.realtime.connect(call_id=line.id) as sideband:
            async with asyncio.timeout(25):
                while not any(e.type == "output_audio_buffer.cleared" for e in events):
                    events.append(await sideband.recv())
                cleared = len(events) - 1
                while not any(e.type == "output_audio_buffer.stopped" for e in events[cleared:]):  # heard whole
                    events.append(await sideband.recv())
        await phone.command("hangup")
        await phone.event("CALL_CLOSED")
    finally:
        await phone.stop()
    kinds = [e.type for e in events]
    assert "output_audio_buffer.started" in kinds[:cleared]
    # The first answer is cancelled if its text and speech were still being made when the caller spoke, else
    # it was done already and only its playout is cut: either way the item is truncated where it was heard.
    first = next(e for e in events if e.type == "response.done")
    assert first.response.status == "completed" or (
        first.response.status == "cancelled" and first.response.status_details.reason == "turn_detected")
    truncated = next(e for e in events if e.type == "conversation.item.truncated")
    full_ms = len(ANSWER) * 60  # piper speaks this sentence in well over 3 s
    assert truncated.audio_end_ms < full_ms / 2
    # What the phone heard: the first answer stops about where the gateway says it was cut, then the second plays.
    spans = [s for s in bursts(heard(phone.recording)) if s[1] - s[0] > 0.3]
    assert len(spans) >= 2, spans
    assert abs((spans[0][1] - spans[0][0]) - truncated.audio_end_ms / 1000) < 0.5, (spans, truncated.audio_end_ms)


async def test_a_phone_calls_over_tcp_and_presses_keys(phone_gateway: Any, tmp_path: Path) -> None:
    from openai import AsyncOpenAI

    gateway = await phone_gateway(calls__webhook_urls="")
    phone = Baresip(tmp_path / "phone", phone_wav(tmp_path, "question_sky.wav"), transport="tcp")
    await phone.start()
    client = AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                         websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    try:
        await phone.command("dial", f"sip:agent@127.0.0.1:{gateway.app.state.phones.sip.port};transport=tcp")
        await phone.event("CALL_ESTABLISHED")
        (call,) = gateway.app.state.phones.calls.calls.values()
        assert call.line.peer.transport == "TCP"
        async with client.realtime.connect(call_id=call.id) as sideband:
            await asyncio.wait_for(sideband.recv(), 5)
            for key in "7#":
                await phone.command("sndcode", key)
                await asyncio.sleep(0.3)
            keys = []
            async with asyncio.timeout(10):
                while len(keys) < 2:
                    event = await sideband.recv()
                    if event.type == "input_audio_buffer.dtmf_event_received":
                        keys.append(event.event)
        assert keys == ["7", "#"]
        await phone.command("hangup")
        await phone.event("CALL_CLOSED")
    finally:
        await phone.stop()
    for _ in range(50):
        if not gateway.sessions:
            break
        await asyncio.sleep(0.1)
    assert not gateway.sessions and not gateway.app.state.phones.sip.endpoint.ports.in_use
