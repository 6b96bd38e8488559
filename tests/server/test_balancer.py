"""Two real gateways behind Debian's nginx (deploy/nginx/gateway.conf) on loopback: sessions spread over
both, one gateway drained by SIGTERM mid-load (its sessions finish or are told, then closed with 1001; new
sessions go to the other; it exits once its last session has ended), a client secret minted by one gateway
opens a session on the other, and the page through nginx. The clients are the openai SDK's."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest
import websockets
from openai import AsyncOpenAI

from bench.nginx import API_KEY, Gateway, Nginx, holds, metric, nginx_missing
from tests.conftest import Client, load_pcm, no_error_lines_in, silence

pytestmark = [pytest.mark.slow,  # two gateway processes behind nginx
              pytest.mark.skipif(nginx_missing() is not None, reason=nginx_missing() or "")]

DRAIN_S, NOTICE_S = 4.0, 2.0
SPEECH = load_pcm("one_sentence.wav")[: 48_000] + silence(800)  # 1 s of speech, then the end of the turn


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Gateway, Nginx]]:
    drain = {"server_drain_seconds": DRAIN_S, "server_drain_notice_seconds": NOTICE_S}
    first, second = Gateway("a", **drain), Gateway("b", **drain)
    nginx = None
    try:
        first.wait_started()
        second.wait_started()
        nginx = Nginx([first.port, second.port], tmp_path_factory.mktemp("nginx"))
        yield first, second, nginx
    finally:
        if nginx is not None:
            nginx.stop()
        first.stop()
        second.stop()
    for gateway in (first, second):
        no_error_lines_in("".join(gateway.log))


def sdk(url: str, key: str = API_KEY) -> AsyncOpenAI:
    ws = url.replace("http://", "ws://")
    return AsyncOpenAI(api_key=key, base_url=f"{url}/v1", websocket_base_url=f"{ws}/v1", max_retries=0)


@contextlib.asynccontextmanager
async def session(url: str, key: str = API_KEY) -> AsyncIterator[tuple[Client, str]]:
    """A Realtime session through ``url`` and its id (from session.created)."""
    async with sdk(url, key).realtime.connect(model="gpt-realtime") as connection:
        client = Client(connection, beta=False)
        created = await client.recv()
        assert created["type"] == "session.created"
        yield client, created["session"]["id"]


async def get(url: str) -> tuple[int, bytes]:
    def call() -> tuple[int, bytes]:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()

    return await asyncio.to_thread(call)


async def sessions_of(gateway: Gateway) -> int:
    return int(await asyncio.to_thread(metric, gateway.url, "gateway_sessions"))


async def test_the_page_and_a_client_secret_across_gateways(cluster):
    first, second, nginx = cluster
    status, page = await get(f"{nginx.url}/")
    assert status == 200 and b"<html" in page
    # Minted by one gateway, used on the other: both hold the same signing key.
    async with sdk(first.url) as minting:  # closed here, on this test's loop
        secret = await minting.realtime.client_secrets.create(
            session={"type": "realtime", "instructions": "Speak like a pirate."})
    async with session(second.url, secret.value) as (client, _):
        assert client.received[0]["session"]["instructions"] == "Speak like a pirate."
    async with session(nginx.url, secret.value) as (client, _):  # and through nginx, wherever it lands
        await client.append(SPEECH, chunk_ms=100)
        await client.until("response.done")


async def test_sessions_spread_and_a_drained_gateway_loses_none(cluster):
    first, second, nginx = cluster
    async with contextlib.AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(session(nginx.url)) for _ in range(6)]
        on_first = [await asyncio.to_thread(holds, first.url, sid) for _, sid in opened]
        # least_conn: six sessions opened one after another land three on each.
        assert (await sessions_of(first), await sessions_of(second)) == (3, 3)
        assert sum(on_first) == 3

        drained = [client for (client, _), here in zip(opened, on_first, strict=True) if here]
        staying = [client for (client, _), here in zip(opened, on_first, strict=True) if not here]
        for client in opened:  # mid-load: every session is in a turn when the SIGTERM comes
            await client[0].append(SPEECH, chunk_ms=100)
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        first.terminate()
        await asyncio.sleep(0.3)

        # New sessions go to the other gateway (a refusal by the draining one is retried there by nginx).
        newcomers = [await stack.enter_async_context(session(nginx.url)) for _ in range(3)]
        assert [await asyncio.to_thread(holds, second.url, sid) for _, sid in newcomers] == [True] * 3

        async def finishes(client: Client) -> str:
            """A session that ends its turn and leaves before the drain's end: a normal close."""
            await client.until("response.done", timeout=DRAIN_S)
            await client.connection.close()
            return "finished"

        async def is_told(client: Client) -> str:
            """A session that stays: its turn is answered, it gets the notice, then 1001."""
            events = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    events.append(await client.recv(DRAIN_S + 2))
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
            kinds = [e["type"] for e in events]
            assert "response.done" in kinds  # what it had sent was answered
            assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["server_shutting_down"]
            return "told, then 1001"

        outcomes = await asyncio.gather(finishes(drained[0]), *(is_told(c) for c in drained[1:]))
        assert outcomes == ["finished"] + ["told, then 1001"] * (len(drained) - 1)
        # The drained gateway exits once its last session is gone (at the drain's end here, not later).
        code = await asyncio.to_thread(first.proc.wait, DRAIN_S + 10)
        assert code == 0 and loop.time() - signalled < DRAIN_S + 5
        assert any("draining: 3 session(s)" in line for line in first.log)

        # The other gateway's sessions never noticed: each answers its turn, and no error came.
        for client in staying:
            assert "error" not in [e["type"] for e in await client.until("response.done", timeout=10)]
        for client, _ in newcomers:
            await client.append(SPEECH, chunk_ms=100)
            assert "error" not in [e["type"] for e in await client.until("response.done", timeout=10)]
        assert await sessions_of(second) == 6
    status, _ = await get(f"{nginx.url}/readyz")  # nginx now sends everything to the one left
    assert status == 200


async def test_an_upload_of_megabytes_reaches_a_gateway_through_nginx(cluster):
    """nginx takes bodies of 1 MiB by default; the audio APIs' uploads go to 25 MiB, and the gateway is the one
    to judge them (these gateways have no speech-to-text: their 501, not nginx's 413)."""
    import openai

    from gateway.audio import wav_bytes

    _, _, nginx = cluster
    with pytest.raises(openai.APIStatusError) as answered:
        await sdk(nginx.url).audio.transcriptions.create(model="whisper-1",
                                                         file=("long.wav", wav_bytes(silence(60_000))))
    assert answered.value.status_code == 501 and answered.value.code == "stt_unavailable"
