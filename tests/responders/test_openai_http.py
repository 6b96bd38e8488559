"""The backends' HTTP client (gateway/responders/openai_http.py) against a real aiohttp server on loopback: the
server-sent-event framing servers use, their error answers, the API key, and connections kept for the next call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from gateway.core.responder import BackendError
from gateway.responders.openai_http import MAX_EVENT_BYTES, HttpStatusError, OpenAIServer, StreamError, describe, events
from gateway.responders.remote import LlmClient

Handler = Callable[[web.Request], Any]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Any]]:
    """Start a server whose every POST and GET goes to a handler; returns its base URL and what it saw."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> tuple[str, list[web.Request]]:
        seen: list[web.Request] = []

        async def recorded(request: web.Request) -> Any:
            seen.append(request)
            return await handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", recorded)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1", seen

    yield start
    for runner in runners:
        await runner.cleanup()


def sse(body: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for k in range(0, len(body), 7):  # in small pieces: lines cut anywhere
            await response.write(body[k : k + 7])
        await response.write_eof()
        return response

    return handler


async def test_events_framing(serve) -> None:
    body = (b": a comment\n"
            b"event: message\nid: 1\ndata: {\"a\": 1}\n\n"
            b"data: {\"b\":\ndata: 2}\n\n"  # one event's data over two lines
            b"data:{\"c\": 3}\r\n\r\n"  # no space after the colon, CRLF
            b"retry: 1000\n\n"  # no data: no event
            b"data: {\"d\": 4}")  # the last event, the body ending without its blank line
    url, _ = await serve(sse(body))
    server = OpenAIServer(url, "", 5)
    response = await server.post("chat/completions", body={})
    assert [e async for e in events(response)] == [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]
    response.release()
    await server.aclose()


async def test_events_stop_at_done_and_raise_an_error_event(serve) -> None:
    url, _ = await serve(sse(b"data: {\"a\": 1}\n\ndata: [DONE]\n\ndata: {\"after\": 1}\n\n"))
    server = OpenAIServer(url, "", 5)
    response = await server.post("chat/completions", body={})
    assert [e async for e in events(response)] == [{"a": 1}]
    response.release()
    await server.aclose()

    url, _ = await serve(sse(b"data: {\"a\": 1}\n\ndata: {\"error\": {\"message\": \"overloaded\"}}\n\n"))
    server = OpenAIServer(url, "", 5)
    response = await server.post("chat/completions", body={})
    got = []
    with pytest.raises(StreamError, match="^overloaded$"):
        async for event in events(response):
            got.append(event)
    assert got == [{"a": 1}]
    response.release()
    await server.aclose()


async def test_an_oversized_event_breaks_the_stream_with_a_bounded_cause(serve) -> None:
    """A server streaming one endless line, or an event of many lines past MAX_EVENT_BYTES, fails the
    reply with a short cause."""
    endless_line = b'data: {"x": "' + b"a" * 2_000_000 + b'"}\n\n'
    many_lines = b"".join(b"data: " + b"b" * 100_000 + b"\n" for _ in range(12)) + b"\n"
    for body, why in ((endless_line, "LineTooLong"), (many_lines, f"an event over {MAX_EVENT_BYTES} bytes")):
        url, _ = await serve(sse(body))
        client = LlmClient(url, "m", timeout_s=5)
        with pytest.raises(BackendError) as info:
            async for _ in client.stream_chat([{"role": "user", "content": "hello"}]):
                pass
        assert info.value.cause.startswith("stream broken: ") and why in info.value.cause
        assert len(info.value.cause) <= 220
        await client.aclose()


@pytest.mark.parametrize(("status", "body", "content_type", "cause"), [
    (500, b'{"error": {"message": "The server had an error.", "type": "server_error"}}', "application/json",
     "HTTP 500: The server had an error."),
    (422, b'{"detail": "model not found"}', "application/json", "HTTP 422: model not found"),
    (404, b"no such route\n", "text/plain", "HTTP 404: no such route"),
    (503, b"", "text/plain", "HTTP 503"),
    (400, b"x" * 100_000, "text/plain", "HTTP 400: " + "x" * 190),  # a long answer: its start, bounded
])
async def test_status_errors(serve, status: int, body: bytes, content_type: str, cause: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=content_type)

    url, _ = await serve(handler)
    server = OpenAIServer(url, "", 5)
    with pytest.raises(HttpStatusError) as info:
        await server.post("chat/completions", body={"model": "m"})
    assert info.value.status == status
    assert describe(info.value, 5, server.where) == cause
    await server.aclose()


async def test_api_key_only_when_set_and_connections_kept(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    chunk = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'
    url, seen = await serve(sse(chunk))
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test")
    keyed, plain = LlmClient(url, "m", api_key_env="TEST_LLM_KEY"), LlmClient(url, "m")
    for client in (keyed, keyed, plain):
        assert [piece async for piece in client.stream_chat([{"role": "user", "content": "hello"}])] == ["hi"]
    assert [r.headers.get("Authorization") for r in seen] == ["Bearer sk-test", "Bearer sk-test", None]
    # A stream read to its end leaves its connection for the next call.
    assert seen[0].transport is not None and seen[0].transport is seen[1].transport
    assert seen[0].content_type == "application/json"
    await keyed.aclose()
    await plain.aclose()


async def test_refused_and_check() -> None:
    from bench.launcher import free_port

    server = OpenAIServer(f"http://127.0.0.1:{free_port()}/v1/", "", 0.5)
    assert server.base_url.endswith("/v1/")
    assert await server.check() == "connection refused"
    with pytest.raises(Exception) as info:
        await server.post("chat/completions", body={})
    assert describe(info.value, 0.5, server.where) == f"connection refused by {server.where}"
    await server.aclose()
