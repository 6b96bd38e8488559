"""An application's webhook endpoint for the call-control tests: each delivery checked by the openai SDK."""

from __future__ import annotations

import asyncio
import base64
import secrets
from typing import Any

from aiohttp import web
from openai import AsyncOpenAI

from bench.launcher import free_port

KEY = secrets.token_bytes(32)
SECRET = "whsec_" + base64.b64encode(KEY).decode()


class Receiver:
    """An application's webhook endpoint: verifies each delivery with the SDK and keeps the events."""

    def __init__(self, behaviour: str = "ok") -> None:
        self.behaviour = behaviour  # "ok", "fail" (HTTP 500) or "hang"
        self.events: list[Any] = []
        self.arrived = asyncio.Event()
        self.client = AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.events.append(self.client.webhooks.unwrap(body, dict(request.headers), secret=SECRET))
        self.arrived.set()
        if self.behaviour == "hang":
            await asyncio.sleep(60)
        return web.Response(status=500 if self.behaviour == "fail" else 200)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def call_id(self, timeout: float = 15.0) -> str:
        async with asyncio.timeout(timeout):
            while not self.events:
                self.arrived.clear()
                await self.arrived.wait()
        return str(self.events[-1].data.call_id)
