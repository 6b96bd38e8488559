"""A real MCP server (the ``mcp`` package's own MCPServer, streamable HTTP) on loopback, for the MCP tests.

In a test: ``with McpTestServer() as server: server.url`` runs it in a thread with its own event loop.
Standalone (so that a test can kill it mid-call): ``python -m tests.mcp_server --port N`` prints
``listening on <url>`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from bench.launcher import free_port


def build() -> MCPServer:
    server = MCPServer("weather-station")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny and 21 degrees in {city}"

    @server.tool()
    def delete_forecast(city: str) -> str:
        """Delete a city's stored forecast."""
        return f"deleted the forecast of {city}"

    @server.tool()
    async def slow_report(seconds: float) -> str:
        """A report that takes a while."""
        await asyncio.sleep(seconds)
        return "the report"

    return server


class HeaderLog:
    """ASGI middleware keeping the Authorization and Host headers of every request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.authorization: list[str | None] = []
        self.hosts: list[str | None] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            value = headers.get(b"authorization")
            self.authorization.append(value.decode() if value else None)
            self.hosts.append(headers[b"host"].decode() if b"host" in headers else None)
        await self.app(scope, receive, send)


class McpTestServer:
    """The server in a thread of its own, so that it keeps serving while a test's loop waits on it."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port()
        self.app = HeaderLog(build().streamable_http_app())
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=self.port, log_level="error",
                                                     lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    def __enter__(self) -> McpTestServer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            threading.Event().wait(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = uvicorn.Server(uvicorn.Config(build().streamable_http_app(), host="127.0.0.1", port=args.port,
                                           log_level="error", lifespan="on"))

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        print(f"listening on http://127.0.0.1:{args.port}/mcp", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
