"""Hostile and broken GPT-Live clients against a real gateway: each gets its error (OpenAI's Live shape, with its
``client_event_id``), the session goes on where it can, and nothing leaks, logs a traceback or an ERROR line."""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import time
from typing import Any

import orjson
import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from tests.conftest import StartGateway
from tests.live.conftest import FRAME, LiveClient, live, sdk

pytestmark = pytest.mark.asyncio


def no_errors(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def error_of(client: LiveClient, event: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(event, str):
        await client.send_raw(event)
    else:
        await client.send(event)
    received = (await client.until("error"))[-1]
    assert received["error"].get("client_event_id") == received.get("client_event_id")
    return received["error"]


async def audio(client: LiveClient, ms: int) -> None:
    for _ in range(ms // 100):
        await client.send({"type": "session.input_audio.append", "audio": base64.b64encode(bytes(FRAME)).decode()})


async def test_events_before_the_start_and_a_second_start(start_gateway: StartGateway, caplog: Any) -> None:
    gateway = await start_gateway()
    async with sdk(gateway).live.connect() as connection:
        client = LiveClient(connection)
        for event in ({"type": "session.input_audio.append", "event_id": "a", "audio": ""},
                      {"type": "session.commentary.append", "event_id": "b", "delegation_id": None, "content": "x"},
                      {"type": "session.close", "event_id": "c"}):
            error = await error_of(client, event)
            assert error["code"] == "session_not_started" and error["client_event_id"] == event["event_id"]
        error = await error_of(client, {"type": "session.start", "event_id": "s0", "session": {
            "model": "gpt-live-1", "voice": "marin"}})
        assert (error["code"], error["param"]) == ("unknown_parameter", "session.voice")
        error = await error_of(client, {"type": "session.start", "session": {"model": "gpt-4o-realtime"}})
        assert error["code"] == "model_not_found" and "'gpt-live-1'" in error["message"]
        await client.start(model="openai/gpt-live-1.1")  # a router's prefix is fine
        error = await error_of(client, {"type": "session.start", "event_id": "s2", "session": {"model": "gpt-live-1"}})
        assert error["code"] == "session_already_started"
        error = await error_of(client, '{"type": "session.close", "event_id": "x", "reason": "bye"}')
        assert (error["code"], error["param"], error["client_event_id"]) == ("unknown_parameter", "reason", "x")
        await client.send({"type": "session.close"})
        await client.until("session.closed")
    await wait_freed(gateway)
    no_errors(caplog)


async def wait_freed(gateway: Any) -> None:
    for _ in range(100):
        if not gateway.sessions:
            return
        await asyncio.sleep(0.05)
    assert not gateway.sessions


async def test_appends_refused_and_bounded(start_gateway: StartGateway, caplog: Any) -> None:
    gateway = await start_gateway(live__max_pending_appends=8)
    async with live(gateway) as client:
        error = await error_of(client, {"type": "session.commentary.append", "event_id": "big", "delegation_id": None,
                                        "content": "word " * 501})
        assert (error["code"], error["param"]) == ("string_above_max_length", "content")
        error = await error_of(client, {"type": "session.thinking.append", "event_id": "who",
                                        "delegation_id": "item_nope", "content": "x"})
        assert (error["code"], error["param"]) == ("delegation_not_found", "delegation_id")
        error = await error_of(client, {"type": "session.thinking.append", "content": "x"})
        assert (error["code"], error["param"]) == ("missing_required_parameter", "delegation_id")
        error = await error_of(client, {"type": "response.create", "event_id": "r"})
        assert error["message"] == "response.create requires Responses delegation."
        # A stray byte would shift every later pcm16 sample: the append is refused, the stream stays aligned.
        error = await error_of(client, {"type": "session.input_audio.append", "event_id": "odd",
                                        "audio": base64.b64encode(bytes(FRAME) + b"\x01").decode()})
        assert (error["code"], error["param"], error["client_event_id"]) == ("invalid_value", "audio", "odd")
        assert next(iter(gateway.sessions)).session.input_samples == 0
        # A flood of appends with the timeline stopped: the first ones wait, the rest are refused.
        codes = []
        for n in range(12):
            await client.send({"type": "session.instructions.append", "event_id": f"f{n}", "delegation_id": None,
                               "content": "Be brief."})
        await client.send({"type": "session.close", "event_id": "close"})
        events = await client.until("session.closed")
        codes = [(e["error"]["code"], e["client_event_id"]) for e in events if e["type"] == "error"]
        assert codes[:4] == [("too_many_pending_appends", f"f{n}") for n in range(8, 12)]
        assert codes[4:] == [("context_injection_incomplete", f"f{n}") for n in range(8)]
        assert not [e for e in events if e["type"].endswith(".appended")]  # no audio: the timeline never got there
    await wait_freed(gateway)
    no_errors(caplog)


async def test_a_client_that_stops_sending_audio(start_gateway: StartGateway, caplog: Any) -> None:
    """The timeline stops with the audio: no more output, no acknowledgement; the session closes "expired" after
    [live] no_audio_timeout_s, and the socket with it."""
    gateway = await start_gateway(live__no_audio_timeout_s=2.0)
    async with live(gateway) as client:
        await audio(client, 1000)
        await client.send({"type": "session.thinking.append", "event_id": "t", "delegation_id": None,
                           "content": "Waiting."})
        started = time.monotonic()
        events = await client.until("session.closed", timeout=10)
        waited = time.monotonic() - started
        assert 1.5 <= waited <= 5
        deltas = [e for e in events if e["type"] == "session.output_audio.delta"]
        assert len(deltas) == 10  # one per 100 ms of the second of audio, then none
        closed = events[-1]
        assert closed["reason"] == "expired" and closed["usage"] == {"seconds": 1}
        assert events[-2]["error"]["code"] == "context_injection_incomplete"
        with pytest.raises(Exception):  # noqa: B017 - the server closed the connection: the SDK raises its error
            await client.recv(timeout=5)
    await wait_freed(gateway)
    no_errors(caplog)


async def test_refused_configurations(start_gateway: StartGateway, caplog: Any) -> None:
    gateway = await start_gateway()  # no backend server configured
    async with sdk(gateway).live.connect() as connection:
        client = LiveClient(connection)
        error = await error_of(client, {"type": "session.start", "session": {
            "model": "gpt-live-1", "delegation": {"type": "responses", "responses": {"model": "gpt-5.6-terra"}}}})
        assert (error["code"], error["param"]) == ("unsupported_parameter", "session.delegation.type")
        gateway.gateway.delegation = object()  # as if a backend were configured: web_search is still refused
        error = await error_of(client, {"type": "session.start", "session": {
            "model": "gpt-live-1", "delegation": {"type": "responses", "responses": {
                "model": "gpt-5.6-terra", "tools": [{"type": "web_search"}]}}}})
        assert error["code"] == "unsupported_parameter"
        assert error["param"] == "session.delegation.responses.tools[0].type"
        assert "web_search" in error["message"]
        error = await error_of(client, {"type": "session.start", "session": {
            "model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}}})
        assert error["param"] == "session.audio.format.rate"
        error = await error_of(client, {"type": "session.start", "session": {
            "model": "gpt-live-1", "audio": {"output": {"voice": "nobody"}}}})
        assert error["param"] == "session.audio.output.voice"
        gateway.gateway.delegation = None
    no_errors(caplog)


class NeverReads:
    """A Live client on a plain socket that sends but never reads (websockets' sans-I/O protocol)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # Small segments: with loopback's 64 KiB ones the server's send buffer grows to megabytes, which the
        # session's output took 40 s to fill.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        self.sock.connect(("127.0.0.1", port))
        self.protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/live/sessions"))
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(1)
        self.protocol.receive_data(response)
        assert self.protocol.handshake_exc is None, response

    def send(self, event: dict[str, Any]) -> None:
        self.protocol.send_text(orjson.dumps(event))
        self._flush()

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)


async def test_a_client_that_never_reads(start_gateway: StartGateway, caplog: Any) -> None:
    """Its output piles up in the socket until a send times out ([server] send_timeout_s): the connection is
    cut and the session freed."""
    gateway = await start_gateway(server__send_timeout_s=1.0)
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, NeverReads, gateway.port)
    frame = base64.b64encode(bytes(FRAME)).decode()

    def stream() -> None:
        client.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        try:
            for _ in range(3000):  # five minutes of audio at ten times real time
                client.send({"type": "session.input_audio.append", "audio": frame})
                time.sleep(0.01)
        except OSError:
            return  # cut off

    sender = loop.run_in_executor(None, stream)
    for _ in range(600):
        if not gateway.sessions and sender.done():
            break
        await asyncio.sleep(0.1)
    assert not gateway.sessions
    await sender
    client.sock.close()
    no_errors(caplog)
