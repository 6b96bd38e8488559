"""HTTP requests as the tests send them: through urllib, or as raw bytes (a hostile or hand-made request)."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request

import pytest


async def http(method: str, url: str, body: bytes | None = None, **headers: str) -> tuple[int, dict[str, str], bytes]:
    def call() -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    return await asyncio.get_running_loop().run_in_executor(None, call)


def get(path: str, method: str = "GET", extra: str = "", body: bytes = b"", length: int | None = None) -> bytes:
    """A request; ``length`` declares a body that is never sent (refused before it is read)."""
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{extra}"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode("latin-1") + body


def offer_request(sdp: bytes, content_type: str = "application/sdp") -> bytes:
    return get("/v1/realtime/calls", "POST", f"Content-Type: {content_type}\r\n", sdp)


async def aiortc_offer() -> str:
    """A real offer (aiortc's, as a browser's: a data channel, one audio track), never connected."""
    aiortc = pytest.importorskip("aiortc")
    pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    pc.addTransceiver("audio")
    await pc.setLocalDescription(await pc.createOffer())
    await pc.close()
    return pc.localDescription.sdp


async def seconds_until_closed(port: int, limit_s: float = 20) -> float:
    """How long the server keeps a connection that sends nothing (a TLS handshake never begun) open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with contextlib.suppress(ConnectionError):
        assert await asyncio.wait_for(reader.read(), limit_s) == b""
    writer.close()
    return loop.time() - started
