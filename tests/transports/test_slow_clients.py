"""Connection-level abuse on a real gateway over loopback sockets: slow request heads and bodies from one
client address (another address must still get in), WebSocket upgrade heads the handshake parser cannot
take, a handshake never answered, X-Forwarded-For believed from trusted proxies only. The counts are
scaled down from an attack's (hundreds, not thousands) while still passing the server's connection limit
(max_sessions + 256) where that is the point."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import openai
import orjson
import pytest
import uvicorn

from gateway.server.serve import listen, uvicorn_config
from tests.conftest import make_config
from tests.helpers.http import aiortc_offer, offer_request

HEALTHZ_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


async def request(port: int, data: bytes, source: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, bytes]:
    """Send ``data`` whole from ``source``; the status and body of the answer (0: closed with no answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(-1), timeout)
    finally:
        writer.close()
    if not answer:
        return 0, b""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def closed_after(reader: asyncio.StreamReader, limit: float) -> float:
    """Seconds until the server closes the connection (reading whatever it says first)."""
    started = time.monotonic()
    with contextlib.suppress(ConnectionError):
        await asyncio.wait_for(reader.read(-1), limit)
    return time.monotonic() - started


def upgrade(path: str = "/v1/realtime", method: str = "GET", extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode()


async def slowloris(port: int, stop: asyncio.Event, refused: list[int]) -> None:
    """One attacker's connection, again and again: a head that never ends, a byte every 0.3 s."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HEALTHZ_HEAD)
            while not stop.is_set():
                try:
                    answer = await asyncio.wait_for(reader.read(100), 0.3)
                except TimeoutError:
                    writer.write(b"X")
                    continue
                if answer.startswith(b"HTTP/1.1 429"):
                    refused.append(1)
                break  # closed (or refused): connect again
            writer.close()
        except ConnectionError:
            await asyncio.sleep(0.05)


async def test_slow_heads_from_one_client_do_not_lock_out_another(start_gateway):
    """300 never-ending heads from one address, more than the server's 260 connections: it holds its share
    (16) and no more; another address's health checks, readiness and REST calls are answered meanwhile."""
    gateway = await start_gateway(server__max_sessions=4, server__max_connections_per_client=16,
                                  server__request_head_timeout_s=2.0, server__request_idle_timeout_s=1.0)
    stop, refused = asyncio.Event(), []
    attack = [asyncio.create_task(slowloris(gateway.port, stop, refused)) for _ in range(300)]
    try:
        await asyncio.sleep(1.5)
        budget = gateway._server.server_state.connections  # noqa: SLF001 - measuring what uvicorn holds
        held = sum(1 for c in budget if getattr(c, "client", None) and c.client[0] == "127.0.0.1")
        assert held <= 16
        for _ in range(3):
            for path in ("/healthz", "/readyz"):
                status, body = await request(gateway.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                             f"Connection: close\r\n\r\n".encode(), "127.0.0.2")
                assert status == 200, (path, body)
            status, body = await request(gateway.port, b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: 127.0.0.1"
                                         b"\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", "127.0.0.2")
            assert status == 200, body
            await asyncio.sleep(0.5)
        assert refused  # the attacker's connections past its share were answered 429 at once
    finally:
        stop.set()
        await asyncio.gather(*attack, return_exceptions=True)


async def test_a_client_over_its_share_reads_the_429_even_with_its_request_sent(start_gateway):
    """The unmodified openai SDK (no retries) sends its whole request before any answer; a refusal that closed
    at once, with those bytes unread, reset the connection under the 429 and the SDK saw a dropped connection."""
    gateway = await start_gateway(server__max_connections_per_client=4, server__request_head_timeout_s=30.0,
                                  server__request_idle_timeout_s=30.0)
    held = [await asyncio.open_connection("127.0.0.1", gateway.port) for _ in range(4)]  # the whole share
    await asyncio.sleep(0.2)
    client = openai.AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1", max_retries=0)
    body = {"session": {"type": "realtime", "instructions": "x" * 200_000}}  # more than a socket buffer
    outcomes = await asyncio.gather(*(client.realtime.client_secrets.create(extra_body=body) for _ in range(12)),
                                    return_exceptions=True)
    assert all(isinstance(o, openai.RateLimitError) and o.body["code"] == "too_many_connections" for o in outcomes), \
        [type(o).__name__ for o in outcomes]
    for _, writer in held:
        writer.close()
    await asyncio.sleep(0.2)
    assert (await client.realtime.client_secrets.create()).value  # its share back once it closed them


async def test_slow_bodies_are_cut_at_their_total_and_idle_deadlines(start_gateway):
    gateway = await start_gateway(webrtc__enabled=True, server__request_body_timeout_s=1.5,
                                  server__request_idle_timeout_s=0.6)
    head = (b"POST /v1/realtime/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\n"
            b"Content-Length: 60000\r\n\r\n")

    async def trickle() -> float:
        """A byte every 0.2 s: never idle, never done."""
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(head)

        async def drip() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    await asyncio.sleep(0.2)
                    writer.write(b"v")
                    await writer.drain()

        dripping = asyncio.create_task(drip())
        try:
            return await closed_after(reader, 10)
        finally:
            dripping.cancel()
            writer.close()

    async def stall(data: bytes) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(data)
        try:
            return await closed_after(reader, 10)
        finally:
            writer.close()

    trickled = await asyncio.gather(*(trickle() for _ in range(20)))
    assert all(1.3 < t < 3.0 for t in trickled), trickled  # the body's total deadline
    stalled_body, stalled_head = await asyncio.gather(stall(head + b"v=0\r\n"), stall(HEALTHZ_HEAD))
    assert 0.4 < stalled_body < 1.3 and 0.4 < stalled_head < 1.3  # the idle deadline, in a body and in a head
    status, _ = await request(gateway.port, HEALTHZ_HEAD + b"Connection: close\r\n\r\n", "127.0.0.2")
    assert status == 200


async def test_a_head_growing_past_its_bound_in_pieces_is_refused_and_pipelined_requests_are_answered(
        start_gateway):
    """A head that keeps coming in pieces is answered 431 once past 16 KiB, not held until its deadline; a
    head of 12 KiB in pieces is served. Requests pipelined on one connection are answered in order, and the
    connection is kept to its head deadline afterwards, not cut while they run."""
    gateway = await start_gateway(server__request_head_timeout_s=30.0, server__request_idle_timeout_s=5.0)

    async def in_pieces(header_bytes: int) -> tuple[int, int]:
        """Header lines of 1000 bytes, 20 ms apart, until the server answers or they reach `header_bytes`; the
        answer's status and the header bytes sent by then."""
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(HEALTHZ_HEAD)
        answer = b""
        try:
            for n in range(0, header_bytes, 1000):
                writer.write(f"X-Piece-{n}: {'a' * 980}\r\n".encode())
                with contextlib.suppress(TimeoutError):
                    answer = await asyncio.wait_for(reader.read(65536), 0.02)
                    break  # answered before the head ended: stop sending (more would be reset)
            else:
                writer.write(b"Connection: close\r\n\r\n")
                answer = await asyncio.wait_for(reader.read(65536), 10)
        finally:
            writer.close()
        return int(answer.split()[1]), n + 1000

    assert (await in_pieces(12_000))[0] == 200
    status, sent = await in_pieces(40_000)
    assert status == 431 and sent <= 18_000  # refused as it passed 16 KiB, before the head ended

    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 2
                     + b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}")
        answers = b""
        while answers.count(b"HTTP/1.1 200") < 3:
            answers += await asyncio.wait_for(reader.read(65536), 5)
        assert answers.count(b"HTTP/1.1 200") == 3 and b"expires_at" in answers.split(b"HTTP/1.1 200")[3]
        writer.write(HEALTHZ_HEAD + b"Connection: close\r\n\r\n")  # kept alive: a fourth request is served
        assert (await asyncio.wait_for(reader.read(-1), 5)).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


async def test_upgrade_heads_the_handshake_parser_cannot_take_are_answered_and_closed(start_gateway):
    """websockets' parser, which uvicorn hands an upgrade's head to, refuses more than 128 headers, an 8 KiB
    line, a method other than GET: such a connection was left open and unanswered for good."""
    gateway = await start_gateway(server__request_head_timeout_s=1.0)
    many = "".join(f"X-{i}: a\r\n" for i in range(130))
    cases = [
        (upgrade(extra=many), 431, "too many headers"),
        (upgrade(extra="X-Big: " + "a" * 9000 + "\r\n"), 431, "header line is too long"),
        (upgrade(extra="X-Big: " + "a" * 60_000 + "\r\n"), 431, "header line is too long"),
        (upgrade("/nowhere", extra=many), 431, "too many headers"),  # any path, before any other check
        (upgrade("/" + "a" * 3000), 414, "target is too long"),
        (upgrade(method="POST", extra="Content-Length: 0\r\n"), 400, "not a WebSocket handshake"),
    ]
    for data, status, message in cases:
        answers = await asyncio.gather(*(request(gateway.port, data, timeout=3) for _ in range(20)))
        for got, body in answers:
            assert got == status, (data[:80], got, body[:200])
            assert message in orjson.loads(body)["error"]["message"]
    # A header block that never ends on the upgrade path is closed at the head deadline.
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(upgrade()[:-2])

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for i in range(100):
                writer.write(f"X-{i}: a\r\n".encode())
                await writer.drain()
                await asyncio.sleep(0.1)

    dripping = asyncio.create_task(drip())
    assert await closed_after(reader, 5) < 1.6
    dripping.cancel()
    writer.close()
    connections = gateway._server.server_state.connections  # noqa: SLF001 - what uvicorn holds open
    for _ in range(50):
        if not connections:
            break
        await asyncio.sleep(0.02)
    assert not connections  # nothing was left open
    status, _ = await request(gateway.port, HEALTHZ_HEAD + b"Connection: close\r\n\r\n")
    assert status == 200


@pytest.mark.error_logs_expected("its stand-in app never answers and is cancelled at the end: uvicorn logs that")
async def test_a_handshake_the_app_never_answers_is_closed_at_the_head_deadline():
    """The server's protocols in front of an app that never answers a handshake (none of ours does that;
    the deadline holds whatever the app)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await receive()
        await asyncio.sleep(3600)

    config = make_config(server__request_head_timeout_s=1.0)
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(app, config))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        writer.write(upgrade())
        assert 0.5 < await closed_after(reader, 5) < 1.6
        writer.close()
    finally:
        server.should_exit = True
        server.force_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(serving, 10)
        sock.close()


@pytest.mark.parametrize(("trusted", "host"), [(False, "127.0.0.1"), (True, "127.0.0.1"), (True, "::")])
async def test_x_forwarded_for_is_believed_from_trusted_proxies_only(start_gateway, monkeypatch, trusted: bool,
                                                                     host: str):
    """The client address of the per-client limits (here: WebRTC's pending calls, answered 429 past the
    client's share) comes from X-Forwarded-For only when the peer is a proxy named in forwarded_allow_ips; on a
    dual-stack socket ("::") an IPv4 proxy's address comes IPv6-mapped, and is still the one named."""
    pytest.importorskip("aiortc")
    key = "sk-proxied-0123456789abcdef"
    monkeypatch.setenv("GATEWAY_API_KEYS", key)  # every address: it needs keys
    gateway = await start_gateway(webrtc__enabled=True, webrtc__max_pending_calls_per_client=1, server__host=host,
                                  server__forwarded_allow_ips="127.0.0.1" if trusted else "")
    statuses = []
    for client in ("198.51.100.7", "198.51.100.8"):  # two clients behind one proxy (or one client lying)
        sdp = (await aiortc_offer()).encode()
        data = offer_request(sdp).replace(
            b"\r\n\r\n", f"\r\nX-Forwarded-For: {client}\r\nAuthorization: Bearer {key}\r\n\r\n".encode(), 1)
        statuses.append((await request(gateway.port, data))[0])
    assert statuses == ([201, 201] if trusted else [201, 429])


def test_a_socket_from_another_loopback_address_is_another_client():
    """The tests above stand for two clients with 127.0.0.1 and 127.0.0.2 (Linux routes all of 127/8 to lo)."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.bind(("127.0.0.2", 0))
        client.connect(server.getsockname())
        peer, _ = server.accept()
        with peer:
            assert peer.getpeername()[0] == "127.0.0.2"
