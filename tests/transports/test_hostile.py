"""Hostile input at the front door: bad HTTP and SDP, floods of pending calls, a client that stops
reading while the server streams faster than real time, many clients sending the largest messages at
once (the server's peak RSS against the documented bound), clients leaving mid-response. Nothing
crashes, every refusal is the documented code, and the log holds no traceback."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import itertools
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
import websockets
from prometheus_client import REGISTRY
from starlette.routing import Route, WebSocketRoute
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.uri import parse_uri

from gateway.responders.echo import EchoResponder
from gateway.server.protocols.websocket_protocol import text_frame
from tests.conftest import Served, connect, load_pcm, silence
from tests.helpers.http import aiortc_offer, get, offer_request
from tests.paths import ROOT


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    problems = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()
                or "never retrieved" in r.getMessage()]
    assert problems == [], [r.getMessage() for r in problems]


async def raw_http(port: int, request: bytes, source: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as it is (from the loopback address ``source``: another client); the status, headers
    and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(-1), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


async def test_bad_http_gets_a_short_4xx_and_no_traceback(start_gateway, caplog):
    caplog.set_level(logging.INFO)
    gateway = await start_gateway(webrtc__enabled=True)
    port = gateway.port
    cases = [
        (b"GARBAGE\r\n\r\n", 400),
        (get("/", extra="X-Big: " + "a" * 20_000 + "\r\n"), 431),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000, 431),  # a head that does not end
        (get("/" + "a" * 3000), 414),
        (get("/healthz", extra="Host: evil.example\r\n"), 400),  # two Host headers: which site is it?
        (b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", 400),  # HTTP/1.1 without a Host
        # request smuggling: a length and chunks, two lengths
        (get("/healthz", "POST", "Transfer-Encoding: chunked\r\n", b"0\r\n\r\n"), 400),
        (get("/healthz", "POST", "Content-Length: 5\r\n", b"{}"), 400),
        (get("/%00"), 400),
        (get("/" + "a" * 300), 404),
        (get("/nope/../../etc/passwd"), 404),
        (get("/healthz", "POST"), 405),
        (get("/", "DELETE"), 405),
        (get("/speech", "POST", "", b"{}"), 404),  # no such path, whatever the method
        (get("/v1/realtime", "GET"), 426),
        (get("/v1/realtime/client_secrets", "GET"), 405),
        (get("/v1/realtime/calls", "POST", "Content-Type: application/sdp\r\n", length=300_000), 413),
        (get("/v1/realtime/calls", "POST", "Content-Type: application/json\r\n", b"{}"), 415),
        (get("/v1/realtime/client_secrets", "POST", "", length=70_000), 413),
        (get("/v1/realtime/client_secrets", "POST", "", b"[1, 2"), 400),
    ]
    for request, status in cases:
        got, headers, body = await raw_http(port, request)
        assert got == status, (request[:60], body[:200])
        assert "server" not in headers
        assert len(body) < 400
    status, headers, body = await raw_http(port, get("/", "HEAD"))
    assert status == 200 and body == b""
    status, headers, body = await raw_http(port, get("/"))
    assert status == 200 and b"<html" in body
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "server" not in headers
    no_tracebacks(caplog)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_deep_json_is_a_400_on_every_way_in(start_gateway, caplog):
    """The WebSocket's depth limit holds for every HTTP body and form part too: 300 levels of nesting is
    a 400 naming the limit, not a 500 from the encoder that would echo it back."""
    gateway = await start_gateway(webrtc__enabled=True)
    deep = nested(300)
    json_bodies = [
        ("/v1/realtime/client_secrets", f'{{"session": {{"type": "realtime", "tools": {deep}}}}}'),
        ("/v1/realtime/sessions", f'{{"tools": {deep}}}'),
        ("/v1/realtime/transcription_sessions", f'{{"input_audio_transcription": {deep}}}'),
        ("/v1/realtime/client_secrets", f'{{"session": {{"type": "realtime", "metadata": {nested(33)}}}}}'),
    ]
    requests = [get(path, "POST", "Content-Type: application/json\r\n", body.encode()) for path, body in json_bodies]
    form = (f'--b\r\nContent-Disposition: form-data; name="sdp"\r\n\r\nv=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n'
            f'--b\r\nContent-Disposition: form-data; name="session"\r\n\r\n{{"tools": {deep}}}\r\n--b--\r\n')
    requests.append(offer_request(form.encode(), "multipart/form-data; boundary=b"))
    for request in requests:
        status, _, body = await raw_http(gateway.port, request)
        error = orjson.loads(body)["error"]
        assert (status, error["code"]) == (400, "invalid_json"), (request[:60], body)
        assert "nested deeper than 32 levels" in error["message"]
    no_tracebacks(caplog)


# JSON that is neither an object nor an array: it used to crash the depth check (a 500, or server_error).
SCALARS = ("5", "-1.5e3", "true", "false", "null")


async def test_scalar_json_is_a_400_on_every_route_that_reads_a_body(start_gateway, caplog):
    """A bare number, true, false or null where a JSON object belongs gets the 400 a JSON string gets. Every
    route of the app that takes a body is tried (path parameters filled in), so a new one cannot be missed."""
    gateway = await start_gateway(webrtc__enabled=True)
    reading_json = set()
    for route in gateway.app.routes:
        assert isinstance(route, Route | WebSocketRoute), route  # a Mount's routes would need walking here
        for method in sorted((getattr(route, "methods", None) or set()) - {"GET", "HEAD"}):
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            answers = {}
            for body in ('"an object"', *SCALARS):
                request = get(path, method, "Content-Type: application/json\r\n", body.encode())
                status, _, raw = await raw_http(gateway.port, request)
                error = orjson.loads(raw)["error"] if raw else {}
                answers[body] = (status, error.get("code"), error.get("message"))
            status, code, message = answers['"an object"']
            assert status < 500 and set(answers.values()) == {(status, code, message)}, (method, path, answers)
            if message and "must be a JSON object" in message:
                assert (status, code) == (400, "invalid_json"), (method, path, answers)
                reading_json.add(f"{method} {path}")
    call_control = {f"POST {prefix}/realtime/calls/x/{action}" for prefix in ("", "/v1")
                    for action in ("accept", "reject", "refer", "hangup", "dtmf")}
    assert reading_json == {
        "POST /v1/realtime/client_secrets", "POST /v1/realtime/sessions", "POST /v1/realtime/transcription_sessions",
        "POST /v1/audio/speech", "POST /v1/audio/transcriptions", "POST /v1/audio/voice_consents",
        "POST /v1/audio/voice_consents/x",
        "POST /v1/audio/voices", "POST /v1/live/sessions", "POST /live/sessions", *call_control,
    }
    # The WebRTC form's session part is JSON too.
    offer = await aiortc_offer()
    for session in ('"an object"', *SCALARS):
        form = (f'--b\r\nContent-Disposition: form-data; name="sdp"\r\n\r\n{offer}\r\n'
                f'--b\r\nContent-Disposition: form-data; name="session"\r\n\r\n{session}\r\n--b--\r\n')
        status, _, body = await raw_http(gateway.port, offer_request(form.encode(), "multipart/form-data; boundary=b"))
        error = orjson.loads(body)["error"]
        assert status == 400 and error["message"] == "The 'session' part must be a JSON object.", (session, body)
    assert not gateway.webrtc.calls and not gateway.sessions
    no_tracebacks(caplog)


async def test_bad_sdp_is_a_400_naming_the_problem(start_gateway, caplog):
    pytest.importorskip("aiortc")
    gateway = await start_gateway(webrtc__enabled=True)
    form = (b"--b\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\n\xff\xfe\xfd\r\n--b--\r\n")
    cases = [
        (offer_request(b"v=0\r\n\xff\xfe bad bytes\r\nm=audio"), "not UTF-8"),
        (offer_request(b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nnonsense\r\n"), "no DTLS fingerprint"),
        (offer_request(b"<html>hello</html>"), "not an SDP offer"),
        (offer_request(form, "multipart/form-data; boundary=b"), "not an SDP offer"),  # decoded with replacements
        (offer_request(b"--b\r\nbroken", "multipart/form-data; boundary=b"), ""),
        (offer_request(b"sdp=v%3D0", "application/x-www-form-urlencoded"), "no media"),
    ]
    for request, message in cases:
        status, _, body = await raw_http(gateway.port, request)
        assert status == 400, body
        assert message in orjson.loads(body)["error"]["message"]
    assert not gateway.webrtc.calls and not gateway.sessions
    no_tracebacks(caplog)


async def test_a_flood_of_pending_calls_is_limited_and_reaped(start_gateway, caplog):
    aiortc = pytest.importorskip("aiortc")
    gateway = await start_gateway(webrtc__enabled=True, webrtc__max_pending_calls=3, webrtc__connect_timeout_s=1.0,
                                  server__max_sessions=2)

    async def offer() -> bytes:
        pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        await pc.close()  # never connects: the call stays pending on the server
        return pc.localDescription.sdp.encode()

    statuses = [(await raw_http(gateway.port, offer_request(await offer())))[0] for _ in range(6)]
    assert statuses == [201, 201, 201, 503, 503, 503]
    assert gateway.webrtc.pending == 3 and not gateway.sessions
    # Pending calls are not sessions: a WebSocket user still gets in.
    async with connect(gateway) as client:
        assert client.received[0]["type"] == "session.created"
    for _ in range(60):
        if not gateway.webrtc.calls:
            break
        await asyncio.sleep(0.1)
    assert not gateway.webrtc.calls  # reaped after connect_timeout_s
    assert (await raw_http(gateway.port, offer_request(await offer())))[0] == 201
    no_tracebacks(caplog)


def without(sdp: str, prefix: str) -> str:
    return "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith(prefix))


def replaced(sdp: str, prefix: str, line: str) -> str:
    return "\r\n".join(line if old.startswith(prefix) else old for old in sdp.split("\r\n"))


async def test_an_offer_without_what_dtls_and_ice_need_is_a_400(start_gateway, caplog):
    """aiortc takes an offer with no DTLS fingerprint and fails later in a task of its own ("Task exception
    was never retrieved ... AssertionError"): refused before any call exists."""
    gateway = await start_gateway(webrtc__enabled=True)
    offer = await aiortc_offer()
    cases = [
        (without(offer, "a=fingerprint:"), "no DTLS fingerprint"),
        (without(offer, "a=setup:"), "no DTLS fingerprint and role"),
        (replaced(offer, "a=fingerprint:", "a=fingerprint:md5 AB:CD"), "not a sha-256, sha-384, sha-512 hash"),
        (replaced(offer, "a=fingerprint:", "a=fingerprint:sha-256 zz"), "not a sha-256"),
        (without(offer, "a=ice-pwd:"), "ICE password"),
        (replaced(offer, "a=ice-pwd:", "a=ice-pwd:short"), "ICE password"),
        (without(offer, "a=ice-ufrag:"), "ICE username fragment"),
        (replaced(offer, "a=setup:", "a=setup:sideways"), "cannot be used"),
    ]
    for sdp, message in cases:
        status, _, body = await raw_http(gateway.port, offer_request(sdp.encode()))
        assert status == 400, (message, body)
        error = orjson.loads(body)["error"]
        assert error["code"] == "invalid_offer" and message in error["message"], error
    assert not gateway.webrtc.calls and not gateway.sessions
    assert (await raw_http(gateway.port, offer_request(offer.encode())))[0] == 201  # the offer itself is fine
    gc.collect()  # a task whose exception was never retrieved reports it when collected
    await asyncio.sleep(0.5)
    no_tracebacks(caplog)


def offer_prefixes(offer: str) -> list[str]:
    """``offer`` cut at each line boundary, and at each character of its m= and c= lines."""
    lines = offer.split("\r\n")
    cuts = []
    for i, line in enumerate(lines):
        head = "\r\n".join(lines[:i])
        cuts.append(head)
        if line.startswith(("m=", "c=")):
            cuts += [f"{head}\r\n{line[:k]}" for k in range(2, len(line))]
    return cuts


async def refused_offer(port: int, sdp: str, path: str) -> tuple[int, dict]:
    status, headers, body = await raw_http(port, get(path, "POST", "Content-Type: application/sdp\r\n", sdp.encode()))
    if status == 201:  # still an offer aiortc can answer: hang it up
        hang_up = get(headers["location"], "DELETE")
        assert (await raw_http(port, hang_up))[0] == 204
        return status, {}
    return status, orjson.loads(body)["error"]


async def test_every_prefix_of_an_offer_is_answered_or_refused_as_invalid_offer(start_gateway, caplog):
    """aiortc's parser fails on a cut m= or c= line with a bare AssertionError and on an a=fmtp without its
    a=rtpmap with StopIteration (a RuntimeError from the coroutine it escapes): each is a 400 naming the offer."""
    gateway = await start_gateway(webrtc__enabled=True)
    offer = await aiortc_offer()
    fmtp = offer.replace("\r\na=rtpmap:", "\r\na=fmtp:111 minptime=10;useinbandfec=1\r\na=rtpmap:", 1)
    cases = offer_prefixes(offer) + [fmtp]
    assert len(cases) > 100
    answered = 0
    for sdp in cases:
        for path in ("/v1/realtime/calls", "/v1/realtime"):
            status, error = await refused_offer(gateway.port, sdp + "\r\n", path)
            answered += status == 201
            assert status == 201 or (status, error["code"], error["type"]) == (400, "invalid_offer",
                                                                               "invalid_request_error"), (sdp, error)
            assert status == 201 or "The " in error["message"], error
    assert answered <= 4  # the whole offer, and no more than a cut of its last attribute or two
    status, _ = await refused_offer(gateway.port, fmtp, "/v1/realtime/calls")
    assert status == 400
    await asyncio.sleep(0.5)
    assert not gateway.webrtc.calls and not gateway.sessions
    gc.collect()  # a task whose exception was never retrieved reports it when collected
    await asyncio.sleep(0.5)
    no_tracebacks(caplog)


async def test_an_offer_bundling_a_missing_mid_is_refused_before_aiortc_sees_it(start_gateway, caplog):
    gateway = await start_gateway(webrtc__enabled=True)
    offer = await aiortc_offer()
    group = next(line for line in offer.split("\r\n") if line.startswith("a=group:BUNDLE "))
    cases = [
        # aiortc bundles onto the first mid's transport: with no such section, onto None, and the call's
        # close fails with an AttributeError in a task nobody awaits
        replaced(offer, "a=group:BUNDLE ", "a=group:BUNDLE 7 " + group.removeprefix("a=group:BUNDLE ")),
        replaced(offer, "a=group:BUNDLE ", group + " 7"),  # a third section that is not there
        offer.split("\r\nm=application")[0],  # the data channel's section cut off, its mid still bundled
        without(offer, "a=mid:"),  # sections without a mid, bundled by theirs
    ]
    for sdp in cases:
        status, error = await refused_offer(gateway.port, sdp, "/v1/realtime/calls")
        assert (status, error["code"]) == (400, "invalid_offer"), error
        assert "BUNDLE" in error["message"] and "mid" in error["message"], error
    assert not gateway.webrtc.calls and not gateway.sessions
    gc.collect()
    await asyncio.sleep(0.5)
    no_tracebacks(caplog)


@pytest.mark.error_logs_expected("aiortc's own task fails on the offer it is given past the checks")
async def test_a_failing_peer_connection_close_does_not_escape_the_calls_close(start_gateway, caplog):
    """An offer aiortc half sets up (past the signalling's checks, straight to the registry): its answer fails,
    and so does aiortc's close of the peer connection; the call is closed all the same and the answer's own
    error is the one raised."""
    from gateway.realtime.events import Dialect

    gateway = await start_gateway(webrtc__enabled=True)
    offer = await aiortc_offer()
    group = next(line for line in offer.split("\r\n") if line.startswith("a=group:BUNDLE "))
    offer = replaced(offer, "a=group:BUNDLE ", "a=group:BUNDLE 7 " + group.removeprefix("a=group:BUNDLE "))
    session = gateway.gateway.new_session(Dialect.GA, server_playout=True)
    with pytest.raises(AttributeError, match="attribute 'transport'"):
        await gateway.webrtc.answer(session, offer, "127.0.0.1")
    assert not gateway.webrtc.calls
    assert "closing its peer connection failed (AttributeError" in caplog.text
    gc.collect()  # aiortc's failed task reports its exception now, in this test, when collected
    await asyncio.sleep(0.1)


async def test_one_clients_pending_calls_do_not_lock_out_another(start_gateway, caplog):
    gateway = await start_gateway(webrtc__enabled=True, webrtc__max_pending_calls=4,
                                  webrtc__max_pending_calls_per_client=2, webrtc__connect_timeout_s=3.0)
    mine = [await raw_http(gateway.port, offer_request((await aiortc_offer()).encode())) for _ in range(3)]
    assert [status for status, _, _ in mine] == [201, 201, 429]
    status, headers, body = mine[-1]
    assert orjson.loads(body)["error"]["code"] == "too_many_pending_calls"
    assert 1 <= int(headers["retry-after"]) <= 3  # when the first of them is dropped
    # Another client still gets in, up to the total.
    theirs = [await raw_http(gateway.port, offer_request((await aiortc_offer()).encode()), "127.0.0.2")
              for _ in range(2)]
    assert [status for status, _, _ in theirs] == [201, 201]
    status, headers, _ = await raw_http(gateway.port, offer_request((await aiortc_offer()).encode()), "127.0.0.3")
    assert status == 503 and 1 <= int(headers["retry-after"]) <= 3  # the total is full
    await asyncio.sleep(int(headers["retry-after"]) + 0.5)  # Retry-After was right: there is room again
    assert (await raw_http(gateway.port, offer_request((await aiortc_offer()).encode())))[0] == 201
    no_tracebacks(caplog)


class RawWebSocket:
    """A WebSocket client on a plain socket that sends but never reads (websockets' sans-I/O protocol)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/realtime"))
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(1)  # the handshake only: nothing more is read after it
        self.protocol.receive_data(response)
        assert self.protocol.handshake_exc is None, response
        self.protocol.events_received()  # the handshake's response: what follows is frames

    def send(self, event: dict) -> None:
        self.protocol.send_text(orjson.dumps(event))
        self._flush()

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)


async def test_a_client_that_stops_reading_is_cut_off_and_its_session_freed(start_gateway, caplog):
    gateway: Served = await start_gateway(EchoResponder(pace=0), server__send_timeout_s=1.0)
    before = metric("gateway_send_timeouts_total")
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, RawWebSocket, gateway.port)

    def speak() -> None:
        client.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": None}}}})
        second = base64.b64encode(bytes(48_000)).decode()
        for _ in range(300):  # five minutes of audio: its echo, sent as fast as possible, is ~19 MB of events
            client.send({"type": "input_audio_buffer.append", "audio": second})
        client.send({"type": "input_audio_buffer.commit"})
        client.send({"type": "response.create"})

    await loop.run_in_executor(None, speak)
    await asyncio.sleep(0.5)
    # While stalled, the server holds at most its write buffer's high-water mark and one message.
    for connection in gateway._server.server_state.connections:  # noqa: SLF001 - measuring uvicorn's buffer
        assert connection.transport.get_write_buffer_size() <= 64 * 1024 + 16 * 1024
    for _ in range(100):
        if not gateway.sessions:
            break
        await asyncio.sleep(0.05)
    assert not gateway.sessions
    assert metric("gateway_send_timeouts_total") == before + 1
    with pytest.raises(OSError):  # the server aborted the connection
        for _ in range(10_000):
            if not client.sock.recv(65536):
                raise ConnectionResetError
    client.sock.close()
    no_tracebacks(caplog)


async def test_clients_leaving_mid_response_end_cleanly(start_gateway, caplog):
    caplog.set_level(logging.INFO)
    gateway = await start_gateway(EchoResponder(pace=1.0))
    before = metric("gateway_client_disconnects_total", during="response")
    speech = base64.b64encode(load_pcm("one_sentence.wav") + silence(800)).decode()

    async def leave_mid_response() -> None:
        ws = await websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime", max_size=None)
        await ws.send(orjson.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": None}}}}).decode())
        await ws.send(orjson.dumps({"type": "input_audio_buffer.append", "audio": speech}).decode())
        await ws.send('{"type": "input_audio_buffer.commit"}')
        await ws.send('{"type": "response.create"}')
        async for message in ws:
            if orjson.loads(message)["type"] == "response.output_audio.delta":
                break
        ws.transport.abort()  # gone without a close frame, as a crashed client or a dropped network

    await asyncio.gather(*(leave_mid_response() for _ in range(5)))
    for _ in range(100):
        if not gateway.sessions:
            break
        await asyncio.sleep(0.05)
    assert not gateway.sessions
    gc.collect()  # a task whose exception was never retrieved reports it when collected
    await asyncio.sleep(0.1)
    assert metric("gateway_client_disconnects_total", during="response") == before + 5
    no_tracebacks(caplog)


def _rss(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read the server's RSS")
async def test_many_clients_sending_the_largest_messages_stay_within_the_memory_bound():
    """The real command line in its own process, so that its peak RSS is its own."""
    mib = 1024 * 1024
    limits = {"max_message_bytes": 4 * mib, "inbound_free_bytes": mib // 4, "inbound_budget_bytes": 16 * mib}
    clients, messages = 12, 3
    env = {**os.environ, "GATEWAY_WEBRTC_ENABLED": "false", "GATEWAY_RESPONDER_KIND": "echo",
           "GATEWAY_SESSION_MAX_APPEND_BYTES": "65536",
           **{f"GATEWAY_SERVER_{k.upper()}": str(v) for k, v in limits.items()}}
    env.pop("GATEWAY_API_KEYS", None)
    server = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0"], cwd=ROOT, env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        port = None
        while port is None:
            line = server.stderr.readline()
            assert line, "the gateway exited"
            if match := re.search(r"ready: open http://127\.0\.0\.1:(\d+)/", line):
                port = int(match.group(1))
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        # The largest message allowed: an append of base64 audio (over max_append_bytes, so refused once read).
        audio = "A" * (limits["max_message_bytes"] - 100)
        message = '{"type":"input_audio_buffer.append","audio":"' + audio + '"}'
        async with websockets.connect(url) as warm:
            await warm.recv()
        baseline = _rss(server.pid, "VmRSS")

        async def flood() -> int:
            refused = 0
            async with websockets.connect(url, max_size=None) as ws:
                await ws.recv()  # session.created
                for _ in range(messages):
                    await ws.send(message)
                for _ in range(messages):
                    refused += orjson.loads(await asyncio.wait_for(ws.recv(), 60))["error"]["code"] == "audio_too_large"
            return refused

        results = await asyncio.gather(*(flood() for _ in range(clients)))
        peak = _rss(server.pid, "VmHWM") - baseline
    finally:
        server.terminate()
        server.wait(10)
    assert results == [messages] * clients  # every message was read and answered, none lost
    # README, "Limits and memory" (and config.toml): 2 x budget + 3 x connections x (free + one 256 KiB read).
    bound = limits["inbound_budget_bytes"] * 2 + clients * (limits["inbound_free_bytes"] + 256 * 1024) * 3
    print(f"peak RSS growth {peak / mib:.1f} MiB, documented bound {bound / mib:.1f} MiB")
    assert peak <= bound


async def test_a_frame_split_after_its_header_is_read_whole(start_gateway):
    """A TCP read that ends inside a frame's header, right after a message: the server must not lose the
    header it already took (it did: the next bytes were read as a new frame, 1002 "incorrect masking")."""
    gateway: Served = await start_gateway(EchoResponder(pace=0))
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, RawWebSocket, gateway.port)
    frames = []
    for event in ({"type": "input_audio_buffer.append", "audio": base64.b64encode(silence(20)).decode()},
                  {"type": "input_audio_buffer.clear"}):
        client.protocol.send_text(orjson.dumps(event))
        (frame,) = client.protocol.data_to_send()
        frames.append(frame)
    # One read holds a whole message and the next frame's first two bytes; the rest comes later.
    for part in (frames[0] + frames[1][:2], frames[1][2:6], frames[1][6:]):
        await loop.run_in_executor(None, client.sock.sendall, part)
        await asyncio.sleep(0.1)
    client.sock.settimeout(5)
    received = b""
    while b"input_audio_buffer.cleared" not in received:
        data = await loop.run_in_executor(None, client.sock.recv, 65536)
        assert data, f"the server closed the connection: {received[-200:]!r}"
        received += data
    client.sock.close()


async def test_messages_arrive_whole_and_in_order_however_the_reads_cut_them(start_gateway, caplog):
    """A text frame whole in one read goes to the session straight from its header; anything else (a partial
    frame, a fragment, a ping, a frame over 64 KiB) through websockets' parser. One stream of all of them, cut
    into reads of every size: the echo of the committed buffer is every append's audio, in order."""
    gateway: Served = await start_gateway(EchoResponder(pace=0))
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, RawWebSocket, gateway.port)
    rng = np.random.default_rng(7)
    audio = [rng.integers(-3000, 3000, n, dtype=np.int16).tobytes() for n in (480, 48, 2400, 30000, 1) * 4]
    protocol = client.protocol
    protocol.send_text(b'{"type":"session.update","session":{"type":"realtime",'
                       b'"audio":{"input":{"turn_detection":null}}}}')
    for k, pcm in enumerate(audio):
        event = orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        if k % 7 == 3:
            protocol.send_ping(b"still there")
        if k % 5 == 2:
            protocol.send_text(event[:9], fin=False)
            protocol.send_continuation(event[9:], fin=True)
        else:
            protocol.send_text(event)
    protocol.send_text(b'{"type":"input_audio_buffer.commit"}')
    protocol.send_text(b'{"type":"response.create"}')
    stream = b"".join(protocol.data_to_send())
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    at, sizes = 0, itertools.cycle((1, 5, 6, 7, 8, 300, 1400, 1401, 9000, 70000))
    while at < len(stream):
        size = next(sizes)
        await loop.run_in_executor(None, client.sock.sendall, stream[at : at + size])
        at += size
        await asyncio.sleep(0.002)

    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    client.sock.settimeout(10)
    echoed, events = [], []
    while "response.done" not in events:
        data = await loop.run_in_executor(None, client.sock.recv, 65536)
        assert data, f"the server closed the connection after {events}"
        protocol.receive_data(data)
        for frame in protocol.events_received():
            if frame.opcode is Opcode.TEXT:
                event = orjson.loads(frame.data)
                events.append(event["type"])
                assert event["type"] != "error", event
                if event["type"] == "response.output_audio.delta":
                    echoed.append(base64.b64decode(event["delta"]))
    client.sock.close()
    assert events.count("input_audio_buffer.committed") == 1
    assert b"".join(echoed) == b"".join(audio)
    no_tracebacks(caplog)


def test_the_servers_text_frames_are_those_websockets_writes():
    """Text messages are framed without websockets' objects: the same bytes, at each length encoding's bounds."""
    for size in (0, 1, 125, 126, 127, 65535, 65536, 70000):
        payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        assert text_frame(payload) == Frame(Opcode.TEXT, payload).serialize(mask=False, extensions=[]), size


async def test_a_text_message_that_is_not_utf8_closes_the_connection_without_a_traceback(start_gateway, caplog):
    """A client's bad bytes are its mistake: close code 1007 and an INFO line, whole or in fragments."""
    caplog.set_level(logging.INFO, logger="gateway.server.protocols.websocket_protocol")
    gateway: Served = await start_gateway(EchoResponder(pace=0))
    loop = asyncio.get_running_loop()
    for fragmented in (False, True):
        client = await loop.run_in_executor(None, RawWebSocket, gateway.port)
        bad = b'{"type":"input_audio_buffer.clear","event_id":"' + bytes([0xFF, 0xFE]) + b'"}'
        if fragmented:
            client.protocol.send_text(bad[:5], fin=False)
            client.protocol.send_continuation(bad[5:], fin=True)
        else:
            client.protocol.send_text(bad)
        for data in client.protocol.data_to_send():
            await loop.run_in_executor(None, client.sock.sendall, data)
        client.sock.settimeout(5)
        received = b""
        while data := await loop.run_in_executor(None, client.sock.recv, 65536):
            received += data
        client.protocol.receive_data(received)
        closes = [f for f in client.protocol.events_received() if f.opcode is Opcode.CLOSE]
        assert closes and Close.parse(closes[0].data).code == 1007, received[-200:]
        client.sock.close()
    assert any("not UTF-8" in r.getMessage() for r in caplog.records)
    no_tracebacks(caplog)


async def test_a_request_head_that_never_ends_is_cut_off(start_gateway):
    """Slowloris: a head sent a byte at a time is closed at request_head_timeout_s; a kept-alive connection
    that asks again in time is served."""
    gateway: Served = await start_gateway(EchoResponder(pace=0), server__request_head_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
    await asyncio.sleep(0.3)
    sent = 0
    with contextlib.suppress(ConnectionError):
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: yes\r\n" * 20:
            writer.write(bytes([byte]))
            await writer.drain()
            sent += 1
            await asyncio.sleep(0.02)
    rest = b""
    with contextlib.suppress(ConnectionError):
        rest = await asyncio.wait_for(reader.read(), 5)  # the first answer's body, then the close
    assert b"HTTP/1.1" not in rest
    assert sent < 40  # closed some 0.5 s in, long before the head would have ended
    writer.close()
