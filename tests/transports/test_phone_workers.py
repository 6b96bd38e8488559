"""Phone calls under `python -m gateway serve --workers 2` (a real subprocess): real phones (baresip) call the one
SIP port, each from a port of its own, and the kernel spreads their dialogs over the workers (SO_REUSEPORT);
each caller hears its answer (the fake LLM's sentence spoken by piper, heard by Whisper); the unmodified
openai SDK decides on and steers the calls whichever worker its requests reach; a second gateway cannot
take the port; Twilio's media streams, with a client that follows Twilio's documented protocol, land on
either worker whichever worker minted their token."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import openai
import pytest
import websockets
from openai import AsyncOpenAI
from websockets.exceptions import InvalidStatus

from bench.fake_openai import FakeOpenAI
from bench.launcher import free_port
from gateway.transports.calls.workers import new_call_id, slot_of
from tests.helpers.workers import Gateway, serve
from tests.paths import ROOT
from tests.phones.baresip import BARESIP, Baresip, free_sip_port, phone_wav
from tests.phones.gateway import ANSWER
from tests.phones.hearing import heard, transcribe, words
from tests.phones.twilio import TOKEN, TwilioSide, sign
from tests.phones.webhooks import SECRET, Receiver

pytestmark = [
    pytest.mark.slow,  # `serve --workers 2` in subprocesses
]
phones = [pytest.mark.skipif(BARESIP is None, reason="baresip is not installed (apt-get install baresip)"),
          pytest.mark.skipif(importlib.util.find_spec("piper") is None, reason="the local extra is not installed")]


def free_rtp_range(pairs: int) -> tuple[int, int]:
    """An even-based range of 2 x `pairs` UDP ports below the ephemeral ones, all free now."""
    for _ in range(50):
        low = random.randrange(21000, 32000, 2)
        ports = range(low, low + 2 * pairs)
        if all(udp_free(port) for port in ports):
            return low, low + 2 * pairs - 1
    raise RuntimeError("no free RTP range")


def udp_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.asynccontextmanager
async def phone_gateway(tmp_path: Path, **env: str) -> AsyncIterator[tuple[Gateway, int, tuple[int, int]]]:
    """`serve --workers 2` with SIP on a free port and a small RTP range, answering with the pipeline."""
    sip_port = free_sip_port()
    rtp = free_rtp_range(8)  # 4 calls' ports a worker
    async with FakeOpenAI(reply=ANSWER, transcript="Why is the sky blue?") as fake:
        options = {"GATEWAY_SIP_ENABLED": "true", "GATEWAY_SIP_PORT": str(sip_port),
                   "GATEWAY_SIP_RTP_PORT_MIN": str(rtp[0]), "GATEWAY_SIP_RTP_PORT_MAX": str(rtp[1]),
                   "GATEWAY_RESPONDER_KIND": "pipeline", "GATEWAY_LLM_BASE_URL": fake.base_url,
                   "GATEWAY_STT_BASE_URL": fake.base_url, "GATEWAY_STT_MODEL": "whisper-test",
                   "GATEWAY_TTS_ENGINE": "piper", "GATEWAY_CALLS_NOISE_REDUCTION": ""}
        async with serve(tmp_path, **options | env) as gateway:
            yield gateway, sip_port, rtp


def options_request(sip_port: int, source: int) -> bytes:
    return (f"OPTIONS sip:agent@127.0.0.1:{sip_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{source};branch=z9hG4bK{secrets.token_hex(6)};rport\r\n"
            f"Max-Forwards: 70\r\nFrom: <sip:probe@127.0.0.1>;tag={secrets.token_hex(4)}\r\n"
            f"To: <sip:agent@127.0.0.1>\r\nCall-ID: {secrets.token_hex(8)}\r\nCSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n").encode()


async def ports_by_worker(gateway: Gateway, sip_port: int, each: int) -> dict[int, list[int]]:
    """`each` source ports whose SIP the kernel gives worker 0, and `each` it gives worker 1. A port is a
    worker's when that worker answers an OPTIONS from it while the other is stopped: a loaded worker that
    answers late is never taken for the other, whose silence proves nothing."""
    found: dict[int, list[int]] = {0: [], 1: []}
    while min(len(ports) for ports in found.values()) < each:
        port = free_sip_port()
        for worker in (0, 1):
            if len(found[worker]) < each and await answers_alone(gateway, worker, sip_port, port):
                found[worker].append(port)
                break
    return found


async def answers_alone(gateway: Gateway, worker: int, sip_port: int, source: int) -> bool:
    """Whether `worker` answers an OPTIONS from port `source` within 2 s while the other worker is stopped (an
    answer to an earlier probe from the port, another Call-ID, does not count)."""
    request = options_request(sip_port, source)
    call_id = next(line for line in request.split(b"\r\n") if line.startswith(b"Call-ID:"))
    stopped = gateway.worker_pids()[1 - worker]
    os.kill(stopped, signal.SIGSTOP)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", source))
            probe.sendto(request, ("127.0.0.1", sip_port))
            deadline = time.monotonic() + 2.0
            while (left := deadline - time.monotonic()) > 0:
                probe.settimeout(left)
                try:
                    answer = await asyncio.to_thread(probe.recv, 4096)
                except TimeoutError:
                    break
                if call_id in answer.split(b"\r\n"):
                    assert answer.startswith(b"SIP/2.0 200"), answer
                    return True
            return False
    finally:
        os.kill(stopped, signal.SIGCONT)


def sdk(gateway: Gateway) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="test-key", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                       websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")


async def listed(client: AsyncOpenAI) -> list[dict[str, Any]]:
    return (await client.get("/realtime/calls", cast_to=object))["data"]  # type: ignore[index]


async def until(condition: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.2)


@phones[0]
@phones[1]
async def test_phones_spread_over_two_workers_each_hears_its_answer_and_hanging_up_frees_everything(
        tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as (gateway, sip_port, rtp), contextlib.AsyncExitStack() as stack:
        sources = await ports_by_worker(gateway, sip_port, 2)
        mic = phone_wav(tmp_path, "question_sky.wav")
        phones = {}
        for worker, ports in sources.items():
            for port in ports:
                phone = Baresip(tmp_path / f"phone-{port}", mic, sip_port=port)
                await phone.start()
                stack.push_async_callback(phone.stop)
                phones[phone] = worker
        for phone in phones:
            await phone.command("dial", f"sip:agent@127.0.0.1:{sip_port}")
        for phone in phones:
            await phone.event("CALL_ESTABLISHED")
        client = await stack.enter_async_context(sdk(gateway))
        calls = await listed(client)
        # Each call lives in the worker its phone's SIP reached, and its id names that worker.
        assert sorted(slot_of(c["id"]) for c in calls) == [0, 0, 1, 1], calls
        assert {c["status"] for c in calls} == {"answered"}
        assert (await gateway.healthz())["active_sessions_by_worker"] == [2, 2]
        await asyncio.sleep(9)  # the question, then the answer
        for phone in phones:
            await phone.command("hangup")
        for phone in phones:
            await phone.event("CALL_CLOSED")

        async def freed() -> bool:
            return (await gateway.healthz())["active_sessions"] == 0 and not await listed(client)

        await until(freed)
        assert all(udp_free(port) for port in range(rtp[0], rtp[1] + 1))  # every call's RTP and RTCP closed
        for phone in phones:
            got = words(transcribe(heard(phone.recording)))
            expected = words(ANSWER)
            assert sum(w in got for w in expected) >= len(expected) * 0.7, (phones[phone], got)


@phones[0]
@phones[1]
async def test_the_sdk_decides_on_and_steers_calls_whichever_worker_it_reaches(tmp_path: Path) -> None:
    webhooks = {"GATEWAY_WEBHOOK_SECRET": SECRET}
    async with (Receiver() as receiver,
                phone_gateway(tmp_path, GATEWAY_CALLS_WEBHOOK_URLS=receiver.url, **webhooks) as (gateway, sip_port, _),
                sdk(gateway) as client):
        sources = await ports_by_worker(gateway, sip_port, 1)
        mic = phone_wav(tmp_path, "question_sky.wav", pad_s=30)
        async with contextlib.AsyncExitStack() as stack:
            phones: dict[int, Baresip] = {}
            call_ids: dict[int, str] = {}
            for worker in (0, 1):
                phone = phones[worker] = Baresip(tmp_path / f"phone-{worker}", mic, sip_port=sources[worker][0])
                await phone.start()
                stack.push_async_callback(phone.stop)
                await phone.command("dial", f"sip:agent@127.0.0.1:{sip_port}")
                call_ids[worker] = await receiver.call_id()
                receiver.events.clear()
            assert {slot_of(call_ids[w]): w for w in (0, 1)} == {0: 0, 1: 1}  # the id names its worker
            assert sorted((c["id"], c["status"]) for c in await listed(client)) == sorted(
                (call_id, "pending") for call_id in call_ids.values())

            # One client, one kept-alive connection, so one worker: one of the two calls is another worker's.
            for worker, call_id in call_ids.items():
                await client.realtime.calls.accept(call_id, type="realtime", instructions=f"Worker {worker} speaks.")
                await phones[worker].event("CALL_ESTABLISHED")
            for call_id in call_ids.values():
                with pytest.raises(openai.ConflictError) as second:
                    await client.realtime.calls.accept(call_id, type="realtime")
                assert second.value.code == "decision_already_made"

            for worker, call_id in call_ids.items():
                # The client's connection is on one worker: the parent hands the sideband to the other one.
                await listed(client)
                async with client.realtime.connect(call_id=call_id) as sideband:
                    created = await asyncio.wait_for(sideband.recv(), 10)
                    assert created.type == "session.created"
                    assert created.session.instructions == f"Worker {worker} speaks."  # type: ignore[union-attr]
                    await sideband.session.update(session={"type": "realtime", "instructions": "Be brief."})
                    await phones[worker].command("sndcode", "5")
                    seen: list[Any] = []
                    async with asyncio.timeout(20):
                        while not ({"session.updated", "input_audio_buffer.dtmf_event_received"}
                                   <= {e.type for e in seen}):
                            seen.append(await sideband.recv())
                    updated = next(e for e in seen if e.type == "session.updated")
                    assert updated.session.instructions == "Be brief."  # type: ignore[union-attr]
            assert "sideband of call" in gateway.text() and "passed on to worker" in gateway.text()

            for worker, call_id in call_ids.items():
                await client.realtime.calls.hangup(call_id)
                await phones[worker].event("CALL_CLOSED")

            async def freed() -> bool:
                return (await gateway.healthz())["active_sessions"] == 0 and not await listed(client)

            await until(freed)

        # An id naming no worker of this gateway, and one of a call that is over: 404, over HTTP and the sideband.
        for call_id in (new_call_id(7), call_ids[1]):
            with pytest.raises(openai.NotFoundError) as missing:
                await client.realtime.calls.accept(call_id, type="realtime")
            assert missing.value.code == "call_not_found"
            with pytest.raises(InvalidStatus) as refused:
                async with client.realtime.connect(call_id=call_id) as sideband:
                    await sideband.recv()
            assert refused.value.response.status_code == 404
        # Worker 1 killed: until it is back, a call of its is not found (no error, no wait).
        os.kill(gateway.worker_pids()[1], signal.SIGKILL)
        for _ in range(4):
            with pytest.raises(openai.NotFoundError):
                await client.realtime.calls.hangup(new_call_id(1))

        # A second gateway on the same SIP port, with workers or without: refused at its start, saying why.
        for workers in ("2", "1"):
            second = subprocess.run(
                [sys.executable, "-m", "gateway", "serve", "--workers", workers, "--port", "0"], cwd=ROOT,
                env={**os.environ, "GATEWAY_SIP_ENABLED": "true", "GATEWAY_SIP_PORT": str(sip_port),
                     "GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_WEBRTC_ENABLED": "false",
                     "GATEWAY_LOCAL_STT": "false", "GATEWAY_MCP_ENABLED": "false"},
                capture_output=True, text=True, timeout=120)
            assert second.returncode == 2, second.stderr[-2000:]
            assert f"the SIP endpoint cannot listen on 127.0.0.1:{sip_port}" in second.stderr


async def test_twilio_streams_land_on_either_worker_and_their_control_reaches_them(tmp_path: Path) -> None:
    """Every voice webhook is answered on one worker (one kept-alive connection), the streams are handed to
    both: a token minted on one worker opens its stream on the other, once; a refer over one connection
    reaches each stream's worker, and the <Connect> action, wherever it lands, says what the call does."""
    port = free_port()
    env = {"TWILIO_AUTH_TOKEN": TOKEN, "GATEWAY_TWILIO_ENABLED": "true",
           "GATEWAY_TWILIO_PUBLIC_URL": f"http://127.0.0.1:{port}", "GATEWAY_RESPONDER_KIND": "echo",
           "GATEWAY_CALLS_NOISE_REDUCTION": ""}
    async with (serve(tmp_path, port=port, **env) as gateway, aiohttp.ClientSession() as http,
                contextlib.AsyncExitStack() as stack):
        sides = {f"CA{i}": TwilioSide(gateway) for i in range(4)}
        for call_sid, side in sides.items():
            params = {"CallSid": call_sid, "AccountSid": "AC1", "From": f"+1555000{call_sid}", "To": "+15550002222"}
            url = f"{side.base}/twilio/voice"
            async with http.post(url, data=urlencode(params), headers={
                    "X-Twilio-Signature": sign(url, params),
                    "Content-Type": "application/x-www-form-urlencoded"}) as answer:
                twiml = ET.fromstring(await answer.text())
            connect = twiml.find("Connect")
            assert connect is not None
            side.action = connect.get("action", "")
            side.stream_url = connect.find("Stream").get("url", "")  # type: ignore[union-attr]
        for call_sid, side in sides.items():
            await side.open(call_sid, {"From": f"+1555000{call_sid}"})
        client = await stack.enter_async_context(sdk(gateway))

        async def all_answered() -> bool:
            return len([c for c in await listed(client) if c["status"] == "answered"]) == len(sides)

        await until(all_answered)
        calls = {c["from"]: c["id"] for c in await listed(client)}
        # Both workers hold streams (how many each depends on when each last reported its open connections).
        assert {slot_of(call_id) for call_id in calls.values()} == {0, 1}, calls
        with pytest.raises(websockets.InvalidStatus) as replayed:  # one stream per token, in all the workers
            await websockets.connect(sides["CA0"].stream_url)
        assert replayed.value.response.status_code == 403

        # Over one connection (one worker): each call of the other worker's is passed on to it.
        by_worker = {slot_of(calls[f"+1555000{call_sid}"]): call_sid for call_sid in sides}  # a call of each
        for worker, call_sid in by_worker.items():
            async with http.post(f"{sides[call_sid].base}/v1/realtime/calls/{calls[f'+1555000{call_sid}']}/refer",
                                 json={"target_uri": f"tel:+1555111000{worker}"}) as answer:
                assert answer.status == 200, await answer.text()
            await asyncio.wait_for(sides[call_sid].socket.wait_closed(), 5)
        for worker, call_sid in by_worker.items():
            side = sides[call_sid]
            url, params = side.action, {"CallSid": call_sid}
            async with http.post(url, data=urlencode(params), headers={
                    "X-Twilio-Signature": sign(url, params),
                    "Content-Type": "application/x-www-form-urlencoded"}) as answer:
                assert f"<Dial><Number>+1555111000{worker}</Number></Dial>" in await answer.text()
        for call_sid, side in sides.items():
            if call_sid not in by_worker.values():
                await side.socket.close()

        async def freed() -> bool:
            return (await gateway.healthz())["active_sessions"] == 0 and not await listed(client)

        await until(freed)
