"""GPT-Live sessions under `serve --workers 2` (a real subprocess): they land on both workers and count in the
shared session figures; a sideband reaches its session on the worker holding it, and elsewhere gets the 404
docs/live.md documents (the parent hands connections over without reading them)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from websockets.exceptions import InvalidStatus

from tests.helpers.workers import serve
from tests.live.conftest import LiveClient, sdk

pytestmark = pytest.mark.asyncio


async def test_live_sessions_on_two_workers(tmp_path: Path) -> None:
    async with serve(tmp_path) as gateway, contextlib.AsyncExitStack() as stack:
        where = SimpleNamespace(port=gateway.port)
        opened = []
        for _ in range(6):
            connection = await stack.enter_async_context(sdk(where).live.connect())
            client = LiveClient(connection)
            session_id = (await client.start())["session"]["id"]
            opened.append((session_id, await gateway.worker_of(session_id)))
        assert {worker for _, worker in opened} == {0, 1}
        assert await gateway.metric("gateway_sessions") == 6
        attached = refused = 0
        for session_id, _ in opened:
            try:
                async with sdk(where).live.sideband.connect(session_id=session_id) as connection:
                    started = await LiveClient(connection).recv()
                    assert started["session"]["id"] == session_id
                    attached += 1
            except InvalidStatus as exc:
                assert exc.response.status_code == 404
                refused += 1
        assert attached + refused == 6 and attached > 0
