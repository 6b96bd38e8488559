"""The one port's front door: API keys, client secrets (the openai SDK's own calls), browser origins and
subprotocols, TLS, and the endpoint mounted in another app."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import ssl
import time
import zlib
from typing import Any

import openai
import orjson
import pytest
import uvicorn
import websockets
from openai import AsyncOpenAI
from openai.types.beta.realtime import SessionCreateResponse, TranscriptionSession
from openai.types.realtime import ClientSecretCreateResponse
from starlette.applications import Starlette

from gateway.config import ConfigError
from gateway.realtime.events import Dialect
from gateway.responders.echo import EchoResponder
from gateway.runtime.auth import Auth, AuthError
from gateway.runtime.gateway import Gateway
from gateway.server.certs import make_certificate
from gateway.server.serve import GatewayServer, listen
from gateway.transports.realtime_websocket import realtime_route
from tests.conftest import BETA_EVENTS, GA_EVENTS, Client, make_config
from tests.helpers.http import http, seconds_until_closed

KEY = "sk-test-" + "k" * 24


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> str:
    """Authentication on: GATEWAY_API_KEYS is read when the gateway is made."""
    monkeypatch.setenv("GATEWAY_API_KEYS", f"{KEY}, sk-other-key")
    monkeypatch.delenv("GATEWAY_SIGNING_KEY", raising=False)
    return KEY


def sdk(gateway: GatewayServer, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{gateway.port}/v1",
                       websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1", max_retries=0)


async def first_event(client: AsyncOpenAI, beta: bool = False) -> dict[str, Any]:
    realtime = client.beta.realtime if beta else client.realtime
    async with realtime.connect(model="gpt-realtime") as connection:
        raw = await asyncio.wait_for(connection.recv_bytes(), 10)
        (BETA_EVENTS if beta else GA_EVENTS).validate_json(raw)
        return orjson.loads(raw)


async def test_a_client_secret_opens_a_session_configured_by_it(keys, start_gateway):
    gateway = await start_gateway()
    created = await sdk(gateway).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 120},
        session={"type": "realtime", "instructions": "Speak like a pirate.", "output_modalities": ["text"]},
    )
    assert isinstance(created, ClientSecretCreateResponse)
    assert created.value.startswith("ek_") and abs(created.expires_at - time.time() - 120) < 5
    assert created.session.type == "realtime" and created.session.instructions == "Speak like a pirate."
    ClientSecretCreateResponse.model_validate(created.model_dump())
    # The browser's way: the secret as the API key of a WebSocket session.
    event = await first_event(sdk(gateway, created.value))
    assert event["type"] == "session.created"
    assert event["session"]["instructions"] == "Speak like a pirate."
    assert event["session"]["output_modalities"] == ["text"]
    # A secret cannot mint secrets, read metrics, or stand in for a key on REST.
    with pytest.raises(openai.AuthenticationError):
        await sdk(gateway, created.value).realtime.client_secrets.create(session={"type": "realtime"})


async def test_a_client_secret_opens_a_webrtc_call(keys, start_gateway):
    aiortc = pytest.importorskip("aiortc")
    gateway = await start_gateway(webrtc__enabled=True)
    secret = (await sdk(gateway).realtime.client_secrets.create(
        session={"type": "realtime", "instructions": "From the secret."})).value
    pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events")
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    channel.on("message", lambda message: events.put_nowait(orjson.loads(message)))
    await pc.setLocalDescription(await pc.createOffer())
    url = f"http://127.0.0.1:{gateway.port}/v1/realtime/calls"
    status, _, _ = await http("POST", url, pc.localDescription.sdp.encode(), **{"Content-Type": "application/sdp"})
    assert status == 401  # no key
    status, headers, answer = await http("POST", url, pc.localDescription.sdp.encode(), **{
        "Content-Type": "application/sdp", "Authorization": f"Bearer {secret}"})
    assert status == 201, answer
    await pc.setRemoteDescription(aiortc.RTCSessionDescription(answer.decode(), "answer"))
    created = await asyncio.wait_for(events.get(), 10)
    assert created["type"] == "session.created" and created["session"]["instructions"] == "From the secret."
    another = (await sdk(gateway).realtime.client_secrets.create(session={"type": "realtime"})).value
    status, _, _ = await http("DELETE", f"http://127.0.0.1:{gateway.port}{headers['location']}",
                              Authorization=f"Bearer {another}")
    assert status == 404  # a secret hangs up its own call only
    status, _, _ = await http("DELETE", f"http://127.0.0.1:{gateway.port}{headers['location']}",
                              Authorization=f"Bearer {secret}")
    assert status == 204
    await pc.close()


async def test_expired_wrong_and_missing_keys_are_refused_before_any_session(keys, start_gateway):
    gateway = await start_gateway()
    expired, _ = gateway.gateway.auth.mint({"type": "realtime"}, Dialect.GA, "realtime", 10, now=time.time() - 60)
    forged = Auth([KEY], b"another gateway's signing key....").mint({}, Dialect.GA, "realtime", 60)[0]
    for key, message in ((expired, "expired"), (forged, "not signed by this gateway"), ("sk-wrong", "Incorrect")):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await first_event(sdk(gateway, key))
        assert refused.value.response.status_code == 401
        error = orjson.loads(refused.value.response.body)["error"]
        assert message in error["message"] and error["type"] == "invalid_request_error"
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime"):
            pass
    assert not gateway.sessions


async def test_no_key_is_refused_on_every_endpoint_but_healthz(keys, start_gateway):
    gateway = await start_gateway()
    base = f"http://127.0.0.1:{gateway.port}"
    with pytest.raises(openai.AuthenticationError) as refused:
        await sdk(gateway, "sk-wrong").realtime.client_secrets.create(session={"type": "realtime"})
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    for method, path in (("GET", "/metrics"), ("POST", "/v1/realtime/client_secrets"), ("POST", "/v1/realtime/calls"),
                         ("GET", "/v1/realtime/sessions/sess_x/turns")):
        status, _, body = await http(method, base + path, b"" if method == "POST" else None)
        assert status == 401, path
        assert "didn't provide an API key" in orjson.loads(body)["error"]["message"]
    assert (await http("GET", base + "/healthz"))[0] == 200
    assert (await http("GET", base + "/metrics", Authorization=f"Bearer {KEY}"))[0] == 200
    assert (await http("GET", base + "/"))[0] == 200  # the page is public: it holds no secret


async def test_websocket_refused_with_no_key_gets_an_http_401(keys, start_gateway):
    gateway = await start_gateway()
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime"):
            pass
    assert refused.value.response.status_code == 401
    assert "didn't provide an API key" in orjson.loads(refused.value.response.body)["error"]["message"]


async def test_a_websocket_to_a_wrong_path_gets_a_404_naming_the_realtime_endpoint(gateway):
    """Not a bare 403, which reads like an authentication failure; a plain GET of the same path gets 404 too."""
    for path in ("/v1/realtimes", "/v1/realtime/calls", "/"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"ws://127.0.0.1:{gateway.port}{path}"):
                pass
        error = orjson.loads(refused.value.response.body)["error"]
        assert refused.value.response.status_code == 404 and error["code"] == "not_found", path
        assert f"No WebSocket endpoint at {path}" in error["message"] and "/v1/realtime." in error["message"]
    assert (await http("GET", f"http://127.0.0.1:{gateway.port}/v1/realtimes"))[0] == 404


async def test_browser_subprotocols_select_realtime_carry_the_key_and_the_beta_shape(keys, start_gateway):
    gateway = await start_gateway()
    offered = ["realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1", "openai-agents-sdk.0.20.0"]
    async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime?model=gpt-realtime",
                                  subprotocols=offered, origin=f"http://127.0.0.1:{gateway.port}") as ws:
        assert ws.subprotocol == "realtime"
        created, conversation = orjson.loads(await ws.recv()), orjson.loads(await ws.recv())
    BETA_EVENTS.validate_python(created)
    assert created["session"]["object"] == "realtime.session" and conversation["type"] == "conversation.created"
    # Unknown subprotocols alone are ignored, not refused.
    async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime", subprotocols=["something-else"],
                                  additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.subprotocol is None
        assert orjson.loads(await ws.recv())["type"] == "session.created"


async def test_cross_origin_pages_are_refused_and_allowed_ones_get_cors(start_gateway):
    gateway = await start_gateway(webrtc__enabled=True)
    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime"
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, origin="https://evil.example"):
            pass
    assert refused.value.response.status_code == 403
    for origin in (f"http://127.0.0.1:{gateway.port}", "http://localhost:5173"):
        async with websockets.connect(url, origin=origin) as ws:
            assert orjson.loads(await ws.recv())["type"] == "session.created"
    calls = f"http://127.0.0.1:{gateway.port}/v1/realtime/calls"
    preflight = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type, x-openai-agents-sdk, openai-beta"}
    status, headers, _ = await http("OPTIONS", calls, **preflight)
    assert status == 204 and headers["access-control-allow-origin"] == "http://localhost:5173"
    allowed = headers["access-control-allow-headers"].lower()
    assert all(h in allowed for h in ("authorization", "content-type", "x-openai-agents-sdk", "openai-beta"))
    assert "Location" in headers["access-control-expose-headers"]
    status, _, body = await http("OPTIONS", calls, **{**preflight, "Origin": "https://evil.example"})
    assert status == 403 and orjson.loads(body)["error"]["code"] == "origin_not_allowed"
    status, _, _ = await http("POST", calls, b"v=0", **{"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert status == 403  # refused outright: a "simple" cross-origin POST needs no preflight
    assert not gateway.sessions


async def test_listed_origins_and_hosts(start_gateway):
    gateway = await start_gateway(server__allowed_origins="https://app.example.com",
                                  server__allowed_hosts="voice.example.com")
    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime"
    async with websockets.connect(url, origin="https://app.example.com") as ws:
        assert orjson.loads(await ws.recv())["type"] == "session.created"
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(url, origin="http://localhost:5173"):  # not listed: localhost is no exception
            pass
    status, _, body = await http("GET", f"http://127.0.0.1:{gateway.port}/healthz", Host="rebound.example")
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_host"
    assert (await http("GET", f"http://127.0.0.1:{gateway.port}/healthz", Host="voice.example.com"))[0] == 200
    # Loopback names besides the list: the container's own health probe (Host 127.0.0.1) is answered.
    for name in ("127.0.0.1", f"localhost:{gateway.port}", "[::1]"):
        assert (await http("GET", f"http://127.0.0.1:{gateway.port}/healthz", Host=name))[0] == 200, name


async def test_a_loopback_gateway_answers_only_to_loopback_names(gateway):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 is not served."""
    status, _, _ = await http("GET", f"http://127.0.0.1:{gateway.port}/healthz", Host=f"evil.example:{gateway.port}")
    assert status == 400
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime",
                                      additional_headers={"Host": "evil.example"}):
            pass
    assert (await http("GET", f"http://127.0.0.1:{gateway.port}/healthz", Host=f"localhost:{gateway.port}"))[0] == 200


async def test_beta_sessions_and_transcription_sessions_shapes(keys, start_gateway):
    gateway = await start_gateway()
    client = sdk(gateway)
    beta = await client.beta.realtime.sessions.create(
        model="gpt-4o-realtime-preview", instructions="Beta instructions.", voice="verse",
        client_secret={"expires_after": {"anchor": "created_at", "seconds": 60}})
    assert isinstance(beta, SessionCreateResponse)
    assert beta.client_secret.value.startswith("ek_") and beta.instructions == "Beta instructions."
    assert beta.voice == "verse"
    event = await first_event(sdk(gateway, beta.client_secret.value), beta=True)
    assert event["session"]["instructions"] == "Beta instructions." and event["session"]["voice"] == "verse"
    # A secret minted for the beta shape refuses a GA connection, saying why.
    with pytest.raises(websockets.InvalidStatus) as refused:
        await first_event(sdk(gateway, beta.client_secret.value))
    assert refused.value.response.status_code == 400
    assert "beta" in orjson.loads(refused.value.response.body)["error"]["message"]

    transcription = await client.beta.realtime.transcription_sessions.create(
        input_audio_transcription={"model": "whisper-1", "language": "en"}, input_audio_format="pcm16")
    assert isinstance(transcription, TranscriptionSession)
    assert transcription.client_secret.value.startswith("ek_")
    assert transcription.input_audio_transcription.model == "whisper-1"
    carried = gateway.gateway.auth.verify(transcription.client_secret.value)
    assert (carried.kind, carried.dialect) == ("transcription", Dialect.BETA)
    assert carried.session["input_audio_transcription"] == {"model": "whisper-1", "language": "en"}

    async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime", additional_headers={
            "Authorization": f"Bearer {transcription.client_secret.value}", "OpenAI-Beta": "realtime=v1"}) as ws:
        created = orjson.loads(await ws.recv())
    assert created["type"] == "transcription_session.created", created
    assert created["session"]["input_audio_transcription"]["model"] == "whisper-1"

    ga = await client.realtime.client_secrets.create(session={
        "type": "transcription", "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
    assert ga.session.type == "transcription" and ga.value.startswith("ek_")
    assert gateway.gateway.auth.verify(ga.value).kind == "transcription"
    event = await first_event(sdk(gateway, ga.value))
    assert event["session"]["type"] == "transcription"
    assert event["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"


async def test_client_secret_requests_are_checked(keys, start_gateway):
    gateway = await start_gateway()
    client = sdk(gateway)
    for kwargs, param in (
        ({"expires_after": {"anchor": "created_at", "seconds": 7201}}, "expires_after.seconds"),
        ({"session": {"type": "realtime", "output_modalities": ["video"]}}, None),
        ({"session": {"type": "realtime", "instructions": "x" * 30_000 + "".join(map(str, range(9000)))}},
         "session"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.realtime.client_secrets.create(**kwargs)
        if param is not None:
            assert refused.value.param == param
    assert "too large for a client secret" in str(refused.value)
    # A transcription secret is checked as a realtime one is: no secret is minted that opens no session.
    for session in ({"type": "transcription", "include": 5},
                    {"type": "transcription", "audio": {"input": {"format": {"type": "nonsense"}}}},
                    {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 7}}}}):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.realtime.client_secrets.create(session=session)  # type: ignore[arg-type]
        assert refused.value.code == "invalid_session"
    with pytest.raises(openai.BadRequestError):
        await client.beta.realtime.transcription_sessions.create(input_audio_format="nonsense")  # type: ignore[arg-type]


def readable_parts(secret: str) -> list[bytes]:
    """Everything a holder of ``secret`` can read from it without the gateway's key: its bytes, and what
    zlib inflates from any offset of them (a compressed payload need not start at byte 0)."""
    body = secret.removeprefix("ek_")
    raw = b"".join(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)) for part in body.split("."))
    found = [raw]
    for offset in range(len(raw)):
        inflater = zlib.decompressobj()
        with contextlib.suppress(zlib.error):
            found.append(inflater.decompress(raw[offset:]))
    return found


async def test_a_client_secret_does_not_show_the_mcp_credentials_it_carries(keys, start_gateway):
    gateway = await start_gateway()
    mcp = {"type": "mcp", "server_label": "notes", "server_url": "https://mcp.example.com/mcp",
           "authorization": "TOPSECRET-token", "headers": {"X-Api-Key": "HEADER-SECRET"}}
    created = await sdk(gateway).realtime.client_secrets.create(session={"type": "realtime", "tools": [mcp]})
    for part in readable_parts(created.value):
        assert b"TOPSECRET" not in part and b"HEADER-SECRET" not in part and b"mcp.example.com" not in part
    assert "TOPSECRET" not in created.model_dump_json()  # nor does the answer that shows the session
    # The gateway still reads them: a session opened with the secret calls the server with them.
    carried = gateway.gateway.auth.verify(created.value).session["tools"][0]
    assert (carried["authorization"], carried["headers"]) == ("TOPSECRET-token", {"X-Api-Key": "HEADER-SECRET"})
    # Changing any byte of it is caught before anything of it is read.
    value = created.value
    for i in (3, len(value) // 2, len(value) - 2):  # the last character may hold only padding bits
        altered = value[:i] + ("A" if value[i] != "A" else "B") + value[i + 1:]
        with pytest.raises(AuthError):
            gateway.gateway.auth.verify(altered)


def test_the_signing_key_is_shared_by_gateways_that_share_a_key():
    shared = {"GATEWAY_SIGNING_KEY": "s" * 40}
    secret, _ = Auth.from_env(shared).mint({"instructions": "hi"}, Dialect.GA, "realtime", 60)
    assert Auth.from_env({"GATEWAY_SIGNING_KEY": "s" * 40}).verify(secret).session == {"instructions": "hi"}
    derived, _ = Auth.from_env({"GATEWAY_API_KEYS": "a,b"}).mint({}, Dialect.GA, "realtime", 60)
    assert Auth.from_env({"GATEWAY_API_KEYS": "b, a"}).verify(derived).kind == "realtime"
    with pytest.raises(AuthError):
        Auth.from_env({"GATEWAY_API_KEYS": "c"}).verify(derived)
    with pytest.raises(AuthError):  # no key anywhere: each process signs with its own random key
        Auth.from_env({}).verify(Auth.from_env({}).mint({}, Dialect.GA, "realtime", 60)[0])
    with pytest.raises(ConfigError, match="GATEWAY_SIGNING_KEY is too short"):
        Auth.from_env({"GATEWAY_SIGNING_KEY": "short"})


async def test_a_public_address_needs_keys_or_an_explicit_opt_out(monkeypatch, caplog):
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    server = GatewayServer(make_config(server__host="0.0.0.0"), EchoResponder())
    with pytest.raises(ConfigError, match="GATEWAY_API_KEYS.*--insecure-no-auth"):
        await server.start()
    await server.stop()
    server = GatewayServer(make_config(server__host="0.0.0.0"), EchoResponder(), insecure_no_auth=True)
    await server.start()
    try:
        assert "NO authentication" in caplog.text
    finally:
        await server.stop()


async def test_tls_with_the_gateways_own_certificate(tmp_path, start_gateway):
    ca, cert, key = make_certificate(tmp_path / "tls")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    gateway = await start_gateway(server__tls_cert=str(cert), server__tls_key=str(key))
    trust = ssl.create_default_context(cafile=str(ca))
    async with websockets.connect(f"wss://localhost:{gateway.port}/v1/realtime", ssl=trust) as ws:
        assert orjson.loads(await ws.recv())["type"] == "session.created"
    with pytest.raises(ssl.SSLCertVerificationError):
        async with websockets.connect(f"wss://localhost:{gateway.port}/v1/realtime", ssl=ssl.create_default_context()):
            pass


async def test_a_silent_tls_connection_is_closed_after_the_head_deadline(tmp_path, start_gateway):
    """A TLS handshake gets [server] request_head_timeout_s, not asyncio's 60 s: connections that never start one
    do not hold file descriptors for a minute before the per-client budget can see them."""
    _, cert, key = make_certificate(tmp_path / "tls")
    gateway = await start_gateway(server__tls_cert=str(cert), server__tls_key=str(key),
                                  server__request_head_timeout_s=1.0)
    assert await seconds_until_closed(gateway.port) < 10


async def test_unusable_tls_files_are_named(tmp_path):
    server = GatewayServer(make_config(server__tls_cert=str(tmp_path / "missing.pem"), server__tls_key="k.pem"),
                           EchoResponder())
    with pytest.raises(ConfigError, match=r"\[server\] tls_cert / tls_key cannot be used"):
        await server.start()
    await server.stop()


async def test_the_endpoint_mounted_in_another_app():
    gateway = Gateway(make_config(), EchoResponder(pace=0))
    app = Starlette(routes=[realtime_route(gateway, "/voice/realtime")], lifespan=gateway.lifespan)
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, ws="websockets-sansio", lifespan="on", log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        client = AsyncOpenAI(api_key="unused", base_url=f"http://127.0.0.1:{port}/voice",
                             websocket_base_url=f"ws://127.0.0.1:{port}/voice")
        async with client.realtime.connect(model="gpt-realtime") as connection:
            checked = Client(connection, beta=False)
            assert (await checked.recv())["type"] == "session.created"
            await checked.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}})
            await checked.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
            done = (await checked.until("response.done"))[-1]
        assert done["response"]["status"] == "completed"
    finally:
        server.should_exit = True
        await task
    assert not gateway.ready  # the lifespan stopped it
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


async def test_events_go_out_at_once(gateway):
    """asyncio sets TCP_NODELAY only on sockets made as TCP: without it, an event sent right after another
    waited for the client's delayed ACK (10-20 ms per burst of events, measured)."""
    async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime") as ws:
        await ws.recv()
        connections = gateway._server.server_state.connections  # noqa: SLF001 - uvicorn's live connections
        assert connections
        for connection in connections:
            assert connection.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


async def test_one_client_secret_holds_a_few_sessions_not_every_slot(keys, start_gateway):
    """The holder of one secret (a browser page) gets [server] max_sessions_per_secret sessions at once, then 429;
    an ended one frees its place, and API keys are not held to it."""
    gateway = await start_gateway(server__max_sessions_per_secret=2)
    secret = (await sdk(gateway).realtime.client_secrets.create(session={"type": "realtime"})).value
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(2):
            connection = await stack.enter_async_context(sdk(gateway, secret).realtime.connect(model="gpt-realtime"))
            await asyncio.wait_for(connection.recv_bytes(), 10)
        with pytest.raises(websockets.InvalidStatus) as refused:
            await first_event(sdk(gateway, secret))
        assert refused.value.response.status_code == 429
        assert orjson.loads(refused.value.response.body)["error"]["code"] == "too_many_sessions"
        assert (await first_event(sdk(gateway)))["type"] == "session.created"  # a key
    while gateway.sessions:
        await asyncio.sleep(0.01)
    assert (await first_event(sdk(gateway, secret)))["type"] == "session.created"
