"""How a response leaves the HTTP protocol (gateway/server/protocols/http.py): its head with its first body
bytes in one write, a head alone by the end of the loop's pass, and pipelined answers in order."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.server import ServerState

from gateway.server.protocols.http import HeadWithBody
from gateway.server.serve import uvicorn_config
from tests.conftest import make_config


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.protocol: asyncio.BaseProtocol | None = None

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("sockname", "peername") else default

    def get_protocol(self) -> asyncio.BaseProtocol | None:
        return self.protocol

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_a_head_leaves_with_the_first_body_bytes_in_one_write() -> None:
    transport = Recording()
    response = HeadWithBody(transport, asyncio.get_running_loop())
    response.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.writes == []
    response.write(b"4\r\naudi\r\n")
    response.write(b"0\r\n\r\n")
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n4\r\naudi\r\n", b"0\r\n\r\n"]


async def test_the_server_protocol_sends_an_answers_head_and_first_body_bytes_as_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"audio/pcm")]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    config = uvicorn_config(app, make_config())
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={},  # type: ignore[call-arg]
                                          _loop=asyncio.get_running_loop())
    transport = Recording()
    transport.protocol = protocol
    protocol.connection_made(transport)
    protocol.data_received(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
    await asyncio.sleep(0.05)
    assert len(transport.writes) == 2
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b"5\r\nfirst\r\n"
    assert transport.writes[1] == b"0\r\n\r\n"
    protocol.connection_lost(None)


async def test_a_head_with_no_body_after_it_leaves_by_the_end_of_the_pass_or_at_close() -> None:
    loop = asyncio.get_running_loop()
    transport = Recording()
    HeadWithBody(transport, loop).write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")  # a HEAD request's
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"]

    transport = Recording()
    response = HeadWithBody(transport, loop)
    response.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    response.close()  # what uvicorn does when the app fails after starting its answer
    assert transport.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"] and transport.closed
    await asyncio.sleep(0)
    assert len(transport.writes) == 1


async def test_pipelined_head_and_get_requests_are_answered_whole_and_in_order(gateway) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                     b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answers = await asyncio.wait_for(reader.read(-1), 5)
    finally:
        writer.close()
    first, second, third = answers.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first.endswith(b"\r\n\r\n") and b'"status"' not in first  # a HEAD answer: its head alone
    assert b'"status":"ok"' in second.partition(b"\r\n\r\n")[2]
    assert third.endswith(b"\r\n\r\n") and b'"status"' not in third

