"""The gateway as an MCP client: lists an MCP server's tools and calls them, over streamable HTTP (the
``mcp`` package), for the runner (gateway/runtime/session_runner.py).

A client names the server, so every request is bounded ([mcp] in config.toml): the host must be one
``allowed_hosts`` names or, with none named, resolve to public addresses only (gateway/runtime/addresses.py's
deny-list, checked here before connecting). The name is resolved once per operation, and the operation's
connections go to the addresses that resolution gave (pinned: a second DNS answer cannot send them
elsewhere), with the server's name kept in the Host header and the TLS handshake; a request to any other
host (a redirect) fails. A listing and a call each have a deadline, connecting included; a response body
or SSE event over ``max_response_bytes`` fails the operation, and a call's output is cut to
``max_output_chars``. Each operation opens its own connection
(one more round trip than a kept session, and nothing to go stale when a server restarts or dies).
Failures never raise past this module's callers' boundary as anything but ``McpFailure``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx2

from gateway.config import McpConfig
from gateway.realtime.outputs import McpError
from gateway.realtime.tools import McpPolicy, McpServer, McpTool
from gateway.runtime.addresses import special_purpose

if TYPE_CHECKING:
    from mcp import Client

CONNECTION_CLOSED = -32000  # JSON-RPC codes of the MCP spec (mcp_types.jsonrpc)
REQUEST_TIMEOUT = -32001


class McpFailure(Exception):
    def __init__(self, error: McpError) -> None:
        super().__init__(error.message)
        self.error = error


def preload() -> None:
    """Import the ``mcp`` package (seconds): at start-up, in a worker thread, not in a session's first call."""
    import mcp  # noqa: F401

    # Its client logs a server's malformed answers as errors with tracebacks; a client names the server, and
    # each failure reaches it as the operation's McpFailure (and a warning here), so they are not ours to log.
    logging.getLogger("mcp.client").setLevel(logging.CRITICAL)


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, limit: int, url: str) -> None:
        self._stream, self._limit, self._url = stream, limit, url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._stream:
            total += len(chunk)
            if total > self._limit:
                raise McpFailure(McpError("protocol_error", f"The MCP server at {self._url} sent a response over "
                                          f"{self._limit} bytes ([mcp] max_response_bytes).", CONNECTION_CLOSED))
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class _PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends every request for ``host`` to ``addresses`` (those the check approved, tried in order), never
    asking DNS again; the Host header and the TLS server name stay ``host``. Every response body read
    through it is cut off (the operation fails) past ``limit`` bytes."""

    def __init__(self, host: str, addresses: list[str], limit: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._host, self._addresses, self._limit = host, addresses, limit
        # The HTTP status of a POST the server refused: the mcp package turns it into a JSON-RPC error.
        self.refused: int | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.host != self._host:
            raise McpFailure(McpError("protocol_error", f"The MCP server at {self._host} sent the gateway to another "
                                      f"host ({url.host}), which it does not follow.", CONNECTION_CLOSED))
        extensions = dict(request.extensions)
        if not _is_ip(self._host):
            extensions["sni_hostname"] = self._host  # the certificate is checked against the name
        for i, address in enumerate(self._addresses):
            pinned = httpx2.Request(request.method, url.copy_with(host=address), headers=request.headers,
                                    stream=request.stream, extensions=extensions)
            try:
                response = await self._inner.handle_async_request(pinned)
            except httpx2.ConnectError:
                if i == len(self._addresses) - 1:
                    raise
                continue  # nothing was sent: the next address the check approved
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _Bounded(response.stream, self._limit, str(url.copy_with(query=None)))
            if request.method == "POST" and response.status_code >= 400:
                self.refused = response.status_code
            return response
        raise AssertionError("no address to connect to")  # _addresses is never empty

    async def aclose(self) -> None:
        await self._inner.aclose()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class McpClient:
    def __init__(self, config: McpConfig) -> None:
        self.config = config
        self.policy = McpPolicy(config.enabled, config.allowed_hosts, config.max_servers)

    async def list_tools(self, server: McpServer) -> list[McpTool]:
        """The tools ``server`` lists that its ``allowed_tools`` allows."""
        limit = self.config.max_tools
        async with self._session(server, self.config.list_timeout_s, "listing its tools") as client:
            tools: list[McpTool] = []
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor)
                for t in page.tools:
                    annotations = t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else None
                    tool = McpTool(t.name, t.input_schema, t.description, annotations)
                    if server.allows(tool):
                        tools.append(tool)
                if len(tools) > limit:
                    raise McpFailure(McpError("protocol_error", f"The server lists more than {limit} tools "
                                              "([mcp] max_tools); name the ones wanted in allowed_tools.", -32600))
                cursor = page.next_cursor
                if not cursor:
                    return tools

    async def call(self, server: McpServer, name: str, arguments: str) -> str:
        """The text output of tool ``name`` called with ``arguments`` (a JSON object)."""
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise McpFailure(McpError("tool_execution_error", f"The arguments are not a JSON object: "
                                      f"{arguments[:200]!r}."))
        async with self._session(server, self.config.call_timeout_s, f"calling '{name}'") as client:
            result = await client.call_tool(name, args)
        output = _text(result.content, result.structured_content)
        if len(output) > self.config.max_output_chars:
            output = output[: self.config.max_output_chars] + " [output cut at [mcp] max_output_chars]"
        if result.is_error:
            raise McpFailure(McpError("tool_execution_error", output or "The tool reported an error."))
        return output

    @asynccontextmanager
    async def _session(self, server: McpServer, timeout_s: float, doing: str) -> AsyncIterator[Client]:
        """A connected MCP client for one operation, with its deadline; every failure becomes McpFailure."""
        from mcp import Client, MCPError  # imported at start-up by preload()
        from mcp.client.streamable_http import streamable_http_client

        url = server.server_url
        where = f"MCP server '{server.server_label}'"
        pinned: _PinnedTransport | None = None
        try:
            async with asyncio.timeout(timeout_s):
                host = httpx2.URL(url).host
                addresses = await self._addresses(host)
                pinned = _PinnedTransport(host, addresses, self.config.max_response_bytes)
                http = httpx2.AsyncClient(headers=dict(server.headers), timeout=timeout_s, transport=pinned)
                transport = streamable_http_client(url, http_client=http,
                                                   max_sse_event_size=self.config.max_response_bytes)
                async with http, Client(transport) as client:
                    yield client
        except TimeoutError:
            raise McpFailure(McpError("protocol_error", f"{where} did not answer within {timeout_s:g} s "
                                      f"while {doing}.", REQUEST_TIMEOUT)) from None
        except Exception as exc:  # refused, dropped, malformed: whatever broke, this operation fails
            if (failure := _find(exc, McpFailure)) is not None:
                raise failure from None
            if pinned is not None and pinned.refused is not None:
                raise McpFailure(McpError("http_error", f"{where} answered HTTP {pinned.refused} while {doing}.",
                                          pinned.refused)) from exc
            if isinstance(exc, MCPError):
                raise McpFailure(McpError("protocol_error", f"{where}: {exc.message}"[:500], exc.code)) from exc
            raise McpFailure(McpError("protocol_error", f"{where} failed while {doing}: {_cause(exc)}"[:500],
                                      CONNECTION_CLOSED)) from exc

    async def _addresses(self, host: str) -> list[str]:
        """The addresses the operation may connect to for ``host``: its one resolution, checked (with no
        ``allowed_hosts``, every address must be public: gateway/runtime/addresses.py)."""
        if self.policy.allowed_hosts and not self.policy.host_listed(host):
            raise McpFailure(McpError("protocol_error", f"MCP server host '{host}' is not allowed ([mcp] "
                                      "allowed_hosts).", CONNECTION_CLOSED))
        if _is_ip(host):
            addresses = [host]
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not self.policy.allowed_hosts:
            for address in addresses:
                if (why := special_purpose(ipaddress.ip_address(address))) is not None:
                    raise McpFailure(McpError("protocol_error", f"MCP server host '{host}' resolves to {address}, "
                                              f"which is not a public address: it is in {why}; an operator may "
                                              "allow the host in [mcp] allowed_hosts.", CONNECTION_CLOSED))
        return addresses


def _text(content: list[Any], structured: Any) -> str:
    """A call's output as text: its text blocks; other blocks named; structured content if that is all."""
    parts = []
    for block in content:
        if block.type == "text":
            parts.append(block.text)
        else:
            parts.append(f"[{block.type}]")
    if not parts and structured is not None:
        return json.dumps(structured)
    return "\n".join(parts)


def _find(exc: BaseException, kind: type[McpFailure]) -> McpFailure | None:
    """An McpFailure raised inside the transport's task groups, wrapped in exception groups or causes."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((f for e in exc.exceptions if (f := _find(e, kind)) is not None), None)
    return _find(exc.__cause__, kind) if exc.__cause__ is not None else None


def _cause(exc: BaseException) -> str:
    """The innermost cause of a failure, unwrapping task groups' exception groups."""
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

