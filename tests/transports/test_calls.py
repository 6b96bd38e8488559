"""Call control as OpenAI's SIP API has it, driven by the unmodified openai SDK: a real phone (baresip) calls,
the gateway's signed webhook reaches a real HTTP receiver that checks it with ``client.webhooks.unwrap``, and
the SDK accepts, rejects, refers and hangs up; the sideband (``realtime.connect(call_id=...)``) sees the
call's events, the caller's keys among them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai import AsyncOpenAI

from gateway.transports.calls.webhooks import signed_headers
from tests.phones.baresip import BARESIP, Baresip, phone_wav
from tests.phones.webhooks import KEY, SECRET, Receiver

pytestmark = pytest.mark.skipif(BARESIP is None, reason="baresip is not installed (apt-get install baresip)")

def sdk(gateway: Any) -> AsyncOpenAI:
    port = gateway.port
    return AsyncOpenAI(api_key="test-key", base_url=f"http://127.0.0.1:{port}/v1",
                       websocket_base_url=f"ws://127.0.0.1:{port}/v1")


@pytest.fixture
def webhook_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_WEBHOOK_SECRET", SECRET)


@contextlib.asynccontextmanager
async def phone(tmp_path: Path, name: str = "phone", **options: Any) -> Any:
    baresip = Baresip(tmp_path / name, phone_wav(tmp_path, "question_sky.wav", pad_s=20), **options)
    await baresip.start()
    try:
        yield baresip
    finally:
        await baresip.stop()


async def dial(gateway: Any, baresip: Baresip) -> None:
    await baresip.command("dial", f"sip:agent@127.0.0.1:{gateway.app.state.phones.sip.port}")


async def test_the_sdk_accepts_watches_and_hangs_up_a_call(phone_gateway: Any, webhook_secret: None,
                                                          tmp_path: Path) -> None:
    async with Receiver() as receiver:
        gateway = await phone_gateway(calls__webhook_urls=receiver.url)
        client = sdk(gateway)
        async with phone(tmp_path) as baresip:
            await dial(gateway, baresip)
            call_id = await receiver.call_id()
            event = receiver.events[0]
            assert event.type == "realtime.call.incoming" and call_id.startswith("rtc_")
            headers = {h.name.lower(): h.value for h in event.data.sip_headers}
            assert "sip:phone@127.0.0.1" in headers["from"] and headers["call-id"]
            listed = (await client.get("/realtime/calls", cast_to=object))["data"]  # type: ignore[index]
            assert [(c["id"], c["status"]) for c in listed] == [(call_id, "pending")]

            await client.realtime.calls.accept(call_id, type="realtime", instructions="You answer the phone.")
            await baresip.event("CALL_ESTABLISHED")
            with pytest.raises(openai.ConflictError) as second:
                await client.realtime.calls.accept(call_id, type="realtime")
            assert second.value.code == "decision_already_made"

            async with client.realtime.connect(call_id=call_id) as sideband:
                created = await asyncio.wait_for(sideband.recv(), 5)
                assert created.type == "session.created"
                assert created.session.instructions == "You answer the phone."  # type: ignore[union-attr]
                await baresip.command("sndcode", "5")
                seen = []
                async with asyncio.timeout(20):
                    while not any(e.type == "input_audio_buffer.dtmf_event_received" for e in seen):
                        seen.append(await sideband.recv())
                dtmf = next(e for e in seen if e.type == "input_audio_buffer.dtmf_event_received")
                assert dtmf.event == "5" and abs(dtmf.received_at - time.time()) < 30  # type: ignore[union-attr]
                await client.realtime.calls.hangup(call_id)
                await baresip.event("CALL_CLOSED")
        assert not gateway.sessions and not gateway.app.state.phones.sip.endpoint.ports.in_use
        with pytest.raises(openai.NotFoundError):
            await client.realtime.calls.accept(call_id, type="realtime")


async def test_a_rejected_call_gets_the_status_and_a_call_with_no_decision_is_rejected(
        phone_gateway: Any, webhook_secret: None, tmp_path: Path) -> None:
    async with Receiver() as receiver:
        gateway = await phone_gateway(calls__webhook_urls=receiver.url, calls__decision_timeout_s=2.0)
        client = sdk(gateway)
        async with phone(tmp_path) as baresip:
            await dial(gateway, baresip)
            call_id = await receiver.call_id()
            await client.realtime.calls.reject(call_id, status_code=486)
            closed = await baresip.event("CALL_CLOSED")
            assert "486" in orjson.dumps(closed).decode() or "486" in baresip.log()
            with pytest.raises(openai.ConflictError):
                await client.realtime.calls.reject(call_id)
            baresip.events.clear()
            await dial(gateway, baresip)
            await receiver.call_id()
            closed = await baresip.event("CALL_CLOSED", timeout=10)
            assert "480" in orjson.dumps(closed).decode() or "480" in baresip.log()
        assert not gateway.app.state.phones.calls.calls and not gateway.sessions


async def test_webhook_signatures_verify_with_the_sdk_and_tampering_or_age_is_caught() -> None:
    client = AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    body = orjson.dumps({"id": "evt_1", "object": "event", "type": "realtime.call.incoming", "created_at": 1,
                         "data": {"call_id": "rtc_1", "sip_headers": []}})
    event = client.webhooks.unwrap(body, signed_headers(KEY, body), secret=SECRET)
    assert event.data.call_id == "rtc_1"  # type: ignore[union-attr]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body.replace(b"rtc_1", b"rtc_2"), signed_headers(KEY, body), secret=SECRET)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body, signed_headers(KEY, body, now=time.time() - 600), secret=SECRET)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body, signed_headers(secrets.token_bytes(32), body), secret=SECRET)


async def test_receivers_that_hang_or_fail_cost_nothing_but_a_line(phone_gateway: Any, webhook_secret: None,
                                                                  tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """One receiver hangs, one answers 500: the call stays pending, any API-key holder may accept it."""
    async with Receiver("hang") as hanging, Receiver("fail") as failing:
        gateway = await phone_gateway(calls__webhook_urls=f"{hanging.url},{failing.url}",
                                      calls__webhook_timeout_s=1.0)
        client = sdk(gateway)
        async with phone(tmp_path) as baresip:
            await dial(gateway, baresip)
            call_id = await failing.call_id()
            assert await hanging.call_id() == call_id
            await asyncio.sleep(1.5)  # past the webhook timeout
            await client.realtime.calls.accept(call_id, type="realtime")
            await baresip.event("CALL_ESTABLISHED")
            await client.realtime.calls.hangup(call_id)
            await baresip.event("CALL_CLOSED")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("did not answer in time" in r.getMessage() for r in caplog.records)
    assert any("HTTP 500" in r.getMessage() for r in caplog.records)
