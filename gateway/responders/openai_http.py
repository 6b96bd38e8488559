"""An OpenAI-compatible server over plain HTTP (aiohttp): JSON and multipart requests, server-sent-event
streams, and every failure told as one short cause. The pipeline's STT and LLM clients (remote.py) and
GPT-Live's delegation backend (delegation.py) talk to their servers through it.

Why not the ``openai`` package, which these clients used before: per call, its request options, httpx request
models, SSE decoder and response handling cost the event loop more than aiohttp's request itself. On a 2-core
VM (`python -m bench gateway --backends`, records 20261129-064741 and -064744), a transcription of 3 s and a
chat stream cost 0.86 and 1.07 ms of CPU through it, 0.33 and 0.37 ms here. Every turn makes one call of
each, and a session several turns a minute; the gateway needs two endpoints and the SSE framing of the API.

A voice turn cannot wait for retries: nothing is retried, and every failure is raised at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import yarl

# Bytes of an error answer read for its message.
MAX_ERROR_BODY = 4096
# Open connections to one server per process: a session holds at most a transcription and a chat stream at
# once, so this bounds nothing a gateway's max_sessions does not (the openai package's own default).
MAX_CONNECTIONS = 1000
# A server-sent event's data, at most (an LLM's chunk is well under 1 KiB).
MAX_EVENT_BYTES = 1 << 20


class HttpStatusError(Exception):
    """The server answered with a 4xx or 5xx; ``detail`` is its message, when it gave one."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}" + (f": {detail}" if detail else ""))
        self.status = status
        self.detail = detail


class StreamError(Exception):
    """The server sent an error in its stream (an event whose data has "error", as OpenAI's do)."""


class OpenAIServer:
    """One server at ``base_url`` (".../v1"), with its API key and timeout (each connect, and each read of the
    answer: a stream may last longer as long as it keeps coming). Its connections are pooled per event loop."""

    def __init__(self, base_url: str, key: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        url = yarl.URL(self.base_url)
        self.where = f"{url.host}:{url.explicit_port}" if url.explicit_port else str(url.host)
        """host:port, as failures name it."""
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made in the loop that first calls: aiohttp binds a session to its loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout, connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS)
            )
        return self._session

    async def post(self, path: str, *, body: dict[str, Any] | None = None,
                   form: aiohttp.FormData | None = None) -> aiohttp.ClientResponse:
        """POST a JSON ``body`` or a multipart ``form`` to ``path``: the response, its headers read (the caller
        releases it), or HttpStatusError."""
        if body is not None:
            response = await self._client().post(self.base_url + path, data=orjson.dumps(body),
                                                 headers={"Content-Type": "application/json"})
        else:
            response = await self._client().post(self.base_url + path, data=form)
        if response.status >= 400:
            try:
                detail = error_detail(await response.content.read(MAX_ERROR_BODY))
            finally:
                response.release()
            raise HttpStatusError(response.status, detail)
        return response

    async def check(self) -> str | None:
        """GET {base_url}models: None when the server answers (any HTTP status: some transcription servers serve
        no model list), else the cause in a few words, naming no address (/healthz shows it). Run first at
        start-up, it also opens the pool before the first user's turn."""
        timeout_s = min(self.timeout_s, 5.0)
        try:
            response = await self._client().get(self.base_url + "models",
                                                timeout=aiohttp.ClientTimeout(total=timeout_s))
        except Exception as exc:
            return describe(exc, timeout_s)
        response.release()
        return None

    def cause(self, exc: BaseException) -> str:
        """``describe`` for a request to this server: its timeout, and its address named."""
        return describe(exc, self.timeout_s, self.where)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


async def events(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The JSON data of each server-sent event of ``response``, until ``[DONE]`` or the end of the body;
    StreamError for an error event. Other fields (event, id, retry) and comments are skipped."""
    data: list[bytes] = []
    size = 0
    async for line in response.content:
        line = line.rstrip(b"\r\n")
        if line:
            if line.startswith(b"data:"):
                piece = line[5:].removeprefix(b" ")
                size += len(piece)
                if size > MAX_EVENT_BYTES:
                    raise ValueError(f"an event over {MAX_EVENT_BYTES} bytes")
                data.append(piece)
            continue
        if data:
            payload, data, size = b"\n".join(data), [], 0
            if payload.startswith(b"[DONE]"):
                return
            yield _event(payload)
    if data and not data[0].startswith(b"[DONE]"):  # the last event, without the blank line after it
        yield _event(b"\n".join(data))


def _event(payload: bytes) -> Any:
    value = orjson.loads(payload)
    if isinstance(value, dict) and value.get("error"):
        error = value["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise StreamError(message if isinstance(message, str) and message else "an error event in the stream")
    return value


def error_detail(body: bytes) -> str:
    """The message of an error answer: OpenAI's {"error": {"message": ...}}, a "message" or "detail", or the
    text itself (at most 200 characters)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:200]
    if isinstance(data, dict):
        error = data.get("error")
        for value in (error.get("message") if isinstance(error, dict) else error, data.get("message"),
                      data.get("detail")):
            if isinstance(value, str) and value:
                return value[:200]
    return str(data)[:200]


def describe(exc: BaseException, timeout_s: float, where: str = "") -> str:
    """A short, clear cause for a failed request, naming the server's ``where`` (host:port) when given."""
    by, to = (f" by {where}", f" to {where}") if where else ("", "")
    if isinstance(exc, HttpStatusError | StreamError):
        return str(exc)[:200]
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, ConnectionRefusedError):
        return f"connection refused{by}"
    if isinstance(exc, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors too
        return f"timed out after {timeout_s:g} s"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return f"connection{to} failed" + (f": {exc}"[:200] if where else "")
    return f"{type(exc).__name__}: {exc}"[:200]

