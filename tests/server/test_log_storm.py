"""What a storm of refusals writes to the log of a real `python -m gateway serve` (its own process, its own
logging set up as in production): a refused WebSocket handshake is an INFO line, never an ERROR; those and
the warnings a client can repeat (a connection limit, malformed requests) come once per interval with a count."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import websockets

from gateway.log_repeats import RepeatedWarnings
from tests.paths import ROOT

KEY = "sk-storm-" + "k" * 24


async def status_of(port: int, data: bytes, source: str = "127.0.0.1") -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(-1), 10)
    finally:
        writer.close()
    return int(answer.split()[1]) if answer else 0


async def refused(url: str, **kwargs: object) -> int:
    try:
        async with websockets.connect(url, **kwargs):
            return 101
    except websockets.InvalidStatus as exc:
        return exc.response.status_code


@pytest.mark.slow  # a real `python -m gateway serve` process
async def test_a_storm_of_refusals_writes_no_error_and_few_warnings(tmp_path: Path):
    log = tmp_path / "gateway.log"
    env = {**os.environ, "GATEWAY_API_KEYS": KEY, "GATEWAY_WEBRTC_ENABLED": "false", "GATEWAY_RESPONDER_KIND": "echo",
           "GATEWAY_LOCAL_STT": "false", "GATEWAY_MCP_ENABLED": "false", "GATEWAY_SERVER_MAX_SESSIONS": "1",
           "GATEWAY_SERVER_MAX_CONNECTIONS_PER_CLIENT": "1000", "GATEWAY_SERVER_REQUEST_HEAD_TIMEOUT_S": "60",
           "GATEWAY_SERVER_REQUEST_IDLE_TIMEOUT_S": "60"}
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT)
    held: list[asyncio.StreamWriter] = []
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"ready: open http://127\.0\.0\.1:(\d+)/", log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        port = int(found[1])
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        key = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}
        storm = 60
        async with websockets.connect(url, **key):  # the one session there is room for
            statuses = await asyncio.gather(
                *(refused(url, additional_headers={"Authorization": "Bearer sk-wrong"}) for _ in range(storm)),
                *(refused(url, origin="https://evil.example", **key) for _ in range(storm)),
                *(refused(url, **key) for _ in range(storm)),  # full
            )
        assert sorted(set(statuses)) == [401, 403, 503]
        garbage = await asyncio.gather(*(status_of(port, b"GARBAGE\r\n\r\n") for _ in range(storm)))
        assert set(garbage) == {400}
        # Connections up to the server's limit (max_sessions + 256), then requests past it: 503 each.
        for _ in range(257):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            held.append(writer)
        await asyncio.sleep(0.5)
        full = await asyncio.gather(*(status_of(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "127.0.0.2")
                                      for _ in range(storm)))
        assert set(full) == {503}
    finally:
        for writer in held:
            writer.close()
        server.terminate()
        server.wait(20)
    lines = log.read_text().splitlines()
    assert not [line for line in lines if " ERROR " in line or "Traceback" in line], log.read_text()[-3000:]
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) <= 4, warnings  # one per kind: the concurrency limit, the malformed requests
    refusals = [line for line in lines if " INFO " in line and "WebSocket refused" in line]
    assert 3 <= len(refusals) <= 6, refusals  # a line per status a while, not one per refusal
    assert all(any(f"refused ({status})" in line for line in refusals) for status in (401, 403, 503))


def test_repeated_warnings_pass_once_per_interval_with_a_count():
    now = [0.0]
    limiter = RepeatedWarnings(interval_s=10, clock=lambda: now[0])

    def record(msg: str, level: int = logging.WARNING, name: str = "uvicorn.error") -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, ("x",), None)

    assert limiter.filter(record("Exceeded concurrency limit. %s"))
    assert not any(limiter.filter(record("Exceeded concurrency limit. %s")) for _ in range(999))
    assert limiter.filter(record("Invalid HTTP request received. %s"))  # another kind
    assert limiter.filter(record("Exceeded concurrency limit. %s", logging.INFO))  # INFO is never held back
    now[0] = 10.5
    summary = record("Exceeded concurrency limit. %s")
    assert limiter.filter(summary)
    assert summary.getMessage() == "Exceeded concurrency limit. x [999 more like this in the last 10 s not shown]"
    assert limiter.filter(record("Exceeded concurrency limit. %s", name="another.logger"))


def test_records_of_different_origins_or_tracebacks_are_never_held_back_for_each_other():
    """The kind is the origin: logger, call site and template, and a record's traceback (its exception types
    and the lines they came through). Eight different 500s are eight tracebacks; the same one again is held."""
    now = [0.0]
    limiter = RepeatedWarnings(interval_s=10, clock=lambda: now[0])

    def failure(kind: type[Exception]) -> logging.LogRecord:
        try:
            if kind is KeyError:
                {}["missing"]
            else:
                len(5)  # type: ignore[arg-type]
        except Exception:
            exc_info = sys.exc_info()
        return logging.LogRecord("uvicorn.error", logging.ERROR, "httptools_impl.py", 427,
                                 "Exception in ASGI application\n", (), exc_info)

    assert limiter.filter(failure(KeyError))
    assert limiter.filter(failure(TypeError))  # another bug behind the first: shown
    assert not limiter.filter(failure(KeyError))  # the first again, within the interval: held back
    # The same exception type raised elsewhere is another traceback.
    try:
        raise KeyError("elsewhere")
    except KeyError:
        elsewhere = logging.LogRecord("uvicorn.error", logging.ERROR, "httptools_impl.py", 427,
                                      "Exception in ASGI application\n", (), sys.exc_info())
    assert limiter.filter(elsewhere)
    # One template logged from two call sites: two origins.
    first = logging.LogRecord("gateway.x", logging.WARNING, "a.py", 10, "%s", ("one failure",), None)
    second = logging.LogRecord("gateway.x", logging.WARNING, "b.py", 20, "%s", ("another",), None)
    assert limiter.filter(first) and limiter.filter(second)
