"""What a rogue peer may send the SIP endpoint: each gets a clear answer or is dropped within the documented
bounds ([sip] in config.toml), costs no ERROR line or traceback, and leaves other calls alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import socket
from typing import Any

import numpy as np
import openai
import pytest
from prometheus_client import REGISTRY

from bench.launcher import free_port
from gateway.audio import alaw_decode, alaw_encode
from gateway.responders.echo import EchoResponder
from gateway.transports.sip import listener, rtp
from tests.conftest import load_pcm, silence
from tests.phones.baresip import free_sip_port
from tests.phones.webhooks import SECRET, Receiver


def dropped(counter: str, reason: str) -> float:
    return REGISTRY.get_sample_value(f"{counter}_total", {"reason": reason}) or 0.0


class RawPhone:
    """A hand-made SIP peer on a UDP socket (of any loopback address), for what a real phone never sends."""

    def __init__(self, gateway_port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.host, self.port = self.sock.getsockname()
        self.media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.media.bind((host, 0))
        self.media.setblocking(False)
        self.target = ("127.0.0.1", gateway_port)
        self.call_id = secrets.token_hex(8)

    def invite(self, sdp: str | None = None, call_id: str | None = None, extra: str = "") -> bytes:
        body = sdp if sdp is not None else (
            f"v=0\r\no=raw 1 1 IN IP4 {self.host}\r\ns=-\r\nc=IN IP4 {self.host}\r\nt=0 0\r\n"
            f"m=audio {self.media.getsockname()[1]} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\n")
        return self.request("INVITE", body, call_id=call_id, extra=extra + "Content-Type: application/sdp\r\n")

    def request(self, method: str, body: str = "", call_id: str | None = None, to_tag: str = "",
                extra: str = "", cseq: int = 1) -> bytes:
        tag = f";tag={to_tag}" if to_tag else ""
        return (f"{method} sip:agent@127.0.0.1:{self.target[1]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP {self.host}:{self.port};branch=z9hG4bK{secrets.token_hex(6)};rport\r\n"
                f"From: <sip:raw@{self.host}>;tag=raw1\r\nTo: <sip:agent@127.0.0.1>{tag}\r\n"
                f"Call-ID: {call_id or self.call_id}\r\nCSeq: {cseq} {method}\r\nMax-Forwards: 70\r\n"
                f"Contact: <sip:raw@{self.host}:{self.port}>\r\n{extra}Content-Length: {len(body.encode())}\r\n\r\n"
                f"{body}").encode()

    def send(self, data: bytes) -> None:
        self.sock.sendto(data, self.target)

    async def answers(self, seconds: float = 1.0) -> list[str]:
        loop = asyncio.get_running_loop()
        out: list[str] = []
        end = loop.time() + seconds
        while loop.time() < end:
            try:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), end - loop.time())
            except TimeoutError:
                break
            out.append(data.decode(errors="replace"))
        return out

    def close(self) -> None:
        self.sock.close()
        self.media.close()


def status(answer: str) -> int:
    return int(answer.split(" ", 2)[1])


def to_tag(answer: str) -> str:
    return re.search(r"^To:.*;tag=([^;\r\n]+)", answer, re.MULTILINE | re.IGNORECASE)[1]  # type: ignore[index]


def rtp_port(answer: str) -> int:
    return int(re.search(r"^m=audio (\d+)", answer, re.MULTILINE)[1])  # type: ignore[index]


async def call_answered(raw: RawPhone, sdp: str | None = None) -> str:
    """A call from ``raw``: its INVITE sent, the gateway's 200 OK (returned) ACKed."""
    raw.send(raw.invite(sdp=sdp))
    ok = next(a for a in await raw.answers(1.5) if status(a) == 200)
    raw.send(raw.request("ACK", to_tag=to_tag(ok)))
    return ok


@pytest.fixture
async def sip_gateway(start_gateway: Any) -> Any:
    async def start(**overrides: Any) -> Any:
        options = {"sip__enabled": True, "sip__port": free_sip_port(), "calls__noise_reduction": ""}
        return await start_gateway(EchoResponder(pace=1), **options | overrides)
    return start


@pytest.fixture
def no_errors(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.DEBUG)
    yield
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def test_malformed_messages_are_dropped_or_answered_400(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    before = dropped("gateway_sip_dropped", "malformed")
    for junk in (b"\x00\xff" * 50, b"INVITE\r\n\r\n", b"SIP/2.0 banana\r\n\r\n", b"\r\n\r\n",
                 b"OPTIONS sip:x SIP/2.0\r\nCSeq: x y z\r\n\r\n"):
        raw.send(junk)
    raw.send(raw.request("OPTIONS").replace(b"From: ", b"X-From: "))  # no From: 400, as it can be routed
    raw.send(raw.request("OPTIONS"))
    answers = await raw.answers(1.0)
    assert sorted(status(a) for a in answers) == [200, 400]
    assert dropped("gateway_sip_dropped", "malformed") >= before + 2
    raw.send(raw.request("BYE", to_tag="nope"))  # a BYE for a dialog nobody holds
    raw.send(raw.request("SUBSCRIBE"))
    assert sorted(status(a) for a in await raw.answers(1.0)) == [405, 481]
    raw.close()


async def test_an_invite_flood_is_dropped_past_its_rate_and_a_real_caller_still_gets_in(
        sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway(sip__invites_per_second_per_source=5.0, calls__max_pending_calls_per_source=3,
                                calls__webhook_urls="")
    port = gateway.app.state.phones.sip.port
    flood = RawPhone(port, host="127.0.0.2")
    before = dropped("gateway_sip_dropped", "invite_rate")
    for i in range(200):
        flood.send(flood.invite(call_id=f"flood-{i}"))
    answers = await flood.answers(2.0)
    finals = [a for a in answers if status(a) >= 200]
    assert len({re.search(r"Call-ID: (\S+)", a)[1] for a in finals}) <= 6  # type: ignore[index]
    assert dropped("gateway_sip_dropped", "invite_rate") >= before + 100  # (the kernel may drop some first)
    caller = RawPhone(port)
    caller.send(caller.invite())
    assert 200 in [status(a) for a in await caller.answers(3.0)]
    flood.close()
    caller.close()


async def test_a_call_that_never_acks_is_ended_and_frees_its_port(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway(sip__ack_timeout_s=2.0)
    raw = RawPhone(gateway.app.state.phones.sip.port)
    raw.send(raw.invite())
    answers = await raw.answers(1.5)
    oks = [a for a in answers if status(a) == 200]
    assert len(oks) >= 2  # the 200 OK is repeated while no ACK comes
    assert gateway.app.state.phones.sip.endpoint.ports.in_use and len(gateway.sessions) == 1
    answers = await raw.answers(2.5)
    assert any(a.startswith("BYE ") for a in answers)
    assert not gateway.sessions and not gateway.app.state.phones.sip.endpoint.ports.in_use
    raw.close()


async def test_oversize_and_unusable_offers(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway(sip__max_message_bytes=4096)
    sip = gateway.app.state.phones.sip
    raw = RawPhone(sip.port)
    big = "v=0\r\n" + "a=x:" + "y" * 8000 + "\r\n"
    raw.send(raw.invite(sdp=big))
    many = "v=0\r\nc=IN IP4 127.0.0.1\r\n" + "a=x\r\n" * 300 + "m=audio 4000 RTP/AVP 0\r\n"
    raw.send(raw.invite(sdp=many, call_id="many"))
    srtp = "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/SAVP 0\r\n"
    raw.send(raw.invite(sdp=srtp, call_id="srtp"))
    opus = "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n"
    raw.send(raw.invite(sdp=opus, call_id="opus"))
    finals = sorted(status(a) for a in await raw.answers(1.5) if status(a) >= 200)
    assert finals == [400, 488, 488]  # the oversize one is dropped unanswered
    assert not gateway.app.state.phones.calls.calls
    # Over TCP an oversize message closes the connection.
    reader, writer = await asyncio.open_connection("127.0.0.1", sip.port)
    writer.write(b"INVITE sip:a SIP/2.0\r\nContent-Length: 100000\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    raw.close()


async def test_carriers_bodies_are_read_and_extensions_we_lack_refused(sip_gateway: Any, no_errors: None) -> None:
    """An offer with a charset parameter, or inside multipart/mixed beside ISUP (SIP-I), is answered; a Require
    of an extension this endpoint lacks gets 420 naming it; a live Call-ID from another peer takes no dialog."""
    gateway = await sip_gateway()
    sip = gateway.app.state.phones.sip
    raw = RawPhone(sip.port)
    offer = raw.invite().decode().split("\r\n\r\n", 1)[1]
    raw.send(raw.invite(call_id="charset").replace(b"Content-Type: application/sdp",
                                                   b"Content-Type: application/sdp; charset=UTF-8"))
    multipart = (f"--b1\r\nContent-Type: application/sdp\r\n\r\n{offer}\r\n--b1\r\nContent-Type: "
                 f"application/isup;version=itu-t92+\r\n\r\n\x01\x00\x49\r\n--b1--\r\n")
    raw.send(raw.request("INVITE", multipart, call_id="sip-i",
                         extra='Content-Type: multipart/mixed;boundary="b1"\r\n'))
    raw.send(raw.invite(call_id="rel", extra="Require: 100rel, timer\r\n"))
    answers = await raw.answers(1.5)
    finals = {re.search(r"^Call-ID: (\S+)", a, re.MULTILINE)[1]: (status(a), a)  # type: ignore[index]
              for a in answers if status(a) >= 200}
    assert finals["charset"][0] == 200 and finals["sip-i"][0] == 200
    assert finals["rel"][0] == 420 and "Unsupported: 100rel, timer" in finals["rel"][1]
    other = RawPhone(sip.port, host="127.0.0.2")
    other.send(other.invite(call_id="charset"))
    (taken,) = [a for a in await other.answers(1.0) if status(a) >= 200]
    assert status(taken) == 400 and "in use" in taken
    assert len(gateway.app.state.phones.calls.calls) == 2
    raw.close()
    other.close()


async def test_a_bye_before_the_answer_gets_487_and_a_decided_call_gets_409(
        sip_gateway: Any, monkeypatch: pytest.MonkeyPatch, no_errors: None) -> None:
    monkeypatch.setenv("GATEWAY_WEBHOOK_SECRET", SECRET)
    async with Receiver() as receiver:
        gateway = await sip_gateway(calls__webhook_urls=receiver.url)
        client = openai.AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1")
        raw = RawPhone(gateway.app.state.phones.sip.port)
        raw.send(raw.invite())
        ringing = next(a for a in await raw.answers(0.5) if status(a) == 180)
        await receiver.call_id()
        raw.send(raw.request("BYE", to_tag=to_tag(ringing), cseq=2))  # the caller gives up while it rings
        assert sorted(status(a) for a in await raw.answers(1.0) if status(a) >= 200) == [200, 487]
        assert not gateway.app.state.phones.calls.calls
        raw.send(raw.invite(call_id="decided"))
        while len(receiver.events) < 2:
            await asyncio.sleep(0.05)
        call_id = await receiver.call_id()
        await client.realtime.calls.reject(call_id, status_code=486)
        for decide in (lambda: client.realtime.calls.reject(call_id),
                       lambda: client.realtime.calls.accept(call_id, type="realtime"),
                       lambda: client.realtime.calls.refer(call_id, target_uri="tel:+15550003333")):
            with pytest.raises(openai.ConflictError) as again:
                await decide()
            assert again.value.code == "decision_already_made"
        raw.close()


async def test_a_hold_a_refresh_and_options_in_the_dialog_are_answered(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    ok = await call_answered(raw)
    tag = to_tag(ok)
    origin = re.search(r"^o=voice-gateway (\d+) 1 ", ok, re.MULTILINE)
    assert origin is not None
    hold = raw.invite().decode().split("\r\n\r\n", 1)[1] + "a=sendonly\r\n"
    raw.send(raw.request("INVITE", hold, to_tag=tag, cseq=2, extra="Content-Type: application/sdp\r\n"))
    (held,) = [a for a in await raw.answers(1.0) if status(a) == 200]
    assert "\r\nContact: " in held and "a=recvonly" in held
    assert f"o=voice-gateway {origin[1]} 2 " in held  # the same session, its next version
    raw.send(raw.request("OPTIONS", to_tag=tag, cseq=3))
    raw.send(raw.request("UPDATE", to_tag=tag, cseq=4))  # a session timer's refresh: no offer, no answer
    answers = [a for a in await raw.answers(1.0) if status(a) == 200]
    assert len(answers) == 2 and not any("m=audio" in a for a in answers)
    assert len(gateway.app.state.phones.calls.calls) == 1
    # On hold we answered recvonly, so no media may come (RFC 3264 §6.1); resumed, it flows again.
    assert await media_packets(raw, 0.5) == 0
    resume = raw.invite().decode().split("\r\n\r\n", 1)[1]
    raw.send(raw.request("INVITE", resume, to_tag=tag, cseq=5, extra="Content-Type: application/sdp\r\n"))
    (resumed,) = [a for a in await raw.answers(0.5) if status(a) == 200]
    assert "a=sendrecv" in resumed
    assert await media_packets(raw, 0.5) >= 10  # 25 due: some slack for a busy machine
    raw.close()


async def media_packets(raw: RawPhone, seconds: float) -> int:
    """RTP packets that reach ``raw``'s media port in the next ``seconds``, after those already there."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(BlockingIOError):
        while True:
            raw.media.recv(2048)
    count, end = 0, loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            await asyncio.wait_for(loop.sock_recv(raw.media, 2048), left)
        except TimeoutError:
            break
        count += 1
    return count


async def test_a_tcp_message_left_half_sent_frees_its_connection(sip_gateway: Any, monkeypatch: pytest.MonkeyPatch,
                                                              no_errors: None) -> None:
    """Between messages a connection may idle (a call's dialog); keep-alive CRLFs are skipped; a message begun and
    never finished closes the connection after STREAM_MESSAGE_S, so half-sent messages cannot hold them all."""
    monkeypatch.setattr(listener, "STREAM_MESSAGE_S", 0.5)
    gateway = await sip_gateway()
    port = gateway.app.state.phones.sip.port
    raw = RawPhone(port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    options = raw.request("OPTIONS").replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")
    writer.write(b"\r\n\r\n" + options)
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"SIP/2.0 200")
    await asyncio.sleep(1.0)  # idle between messages: still open
    writer.write(options[:40])
    started = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert asyncio.get_running_loop().time() - started < 2.0
    writer.close()
    raw.close()


async def test_keys_to_a_caller_that_offered_no_telephone_event_are_refused(sip_gateway: Any,
                                                                           no_errors: None) -> None:
    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    await call_answered(raw, sdp=f"v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio {raw.media.getsockname()[1]} RTP/AVP 0\r\n")
    (call,) = gateway.app.state.phones.calls.calls.values()
    client = openai.AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.post(f"/realtime/calls/{call.id}/dtmf", body={"digits": "1"}, cast_to=object)
    assert refused.value.code == "dtmf_unsupported"
    raw.close()


async def test_rtp_from_a_stranger_or_of_another_payload_type_is_dropped(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    ok = await call_answered(raw)
    target = ("127.0.0.1", rtp_port(ok))
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.3", 0))
    sources = dropped("gateway_rtp_dropped", "wrong_source")
    types = dropped("gateway_rtp_dropped", "wrong_payload_type")
    for i in range(10):
        raw.media.sendto(rtp.build(0, i, i * 160, 1234, b"\xff" * 160), target)  # the caller: taken
        raw.media.sendto(rtp.build(96, 100 + i, i * 160, 1234, b"\x00" * 160), target)
        stranger.sendto(rtp.build(0, i, i * 160, 99, b"\x00" * 160), target)
        raw.media.sendto(b"\x01\x02", target)
    await asyncio.sleep(0.5)
    assert dropped("gateway_rtp_dropped", "wrong_source") >= sources + 10
    assert dropped("gateway_rtp_dropped", "wrong_payload_type") >= types + 10
    assert len(gateway.sessions) == 1
    raw.send(raw.request("BYE", to_tag=to_tag(ok), cseq=2))
    assert 200 in [status(a) for a in await raw.answers(1.0)]
    await asyncio.sleep(0.2)
    assert not gateway.sessions and not gateway.app.state.phones.sip.endpoint.ports.in_use
    stranger.close()
    raw.close()


async def test_digest_authentication(sip_gateway: Any, monkeypatch: pytest.MonkeyPatch, no_errors: None) -> None:
    monkeypatch.setenv("GATEWAY_SIP_PASSWORD", "s3cret-pass")
    gateway = await sip_gateway(sip__username="trunk")
    raw = RawPhone(gateway.app.state.phones.sip.port)
    raw.send(raw.invite())
    (challenge,) = await raw.answers(1.0)
    assert status(challenge) == 401 and 'algorithm=SHA-256' in challenge and "algorithm=MD5" in challenge
    raw.send(raw.invite(extra='Authorization: Digest username="trunk", realm="voice-gateway", nonce="1.x", '
                              'uri="sip:agent@127.0.0.1", response="00"\r\n'))
    assert [status(a) for a in await raw.answers(1.0)] == [401]
    assert not gateway.app.state.phones.calls.calls
    raw.close()


async def test_keys_are_played_to_the_caller_as_rfc_4733_events(sip_gateway: Any, no_errors: None) -> None:
    import aiohttp

    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    await call_answered(raw)
    (call,) = gateway.app.state.phones.calls.calls.values()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{gateway.port}/v1/realtime/calls/{call.id}/dtmf",
                             json={"digits": "4#"}) as answer:
            assert answer.status == 200
        async with http.post(f"http://127.0.0.1:{gateway.port}/v1/realtime/calls/{call.id}/dtmf",
                             json={"digits": "x"}) as answer:
            assert answer.status == 400
    loop = asyncio.get_running_loop()
    keys: list[tuple[str, bool]] = []
    async with asyncio.timeout(5):
        while sum(end for _, end in keys) < 6:  # three end packets per key
            packet = rtp.parse(await loop.sock_recv(raw.media, 2048))
            if packet is not None and packet.payload_type == 101:
                event = rtp.dtmf_event(packet.payload)
                assert event is not None
                keys.append(event)
    assert [k for k, _ in keys if _][::3] == ["4", "#"]
    raw.close()


async def test_calls_per_source_are_bounded(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway(sip__max_calls_per_source=2)
    raw = RawPhone(gateway.app.state.phones.sip.port)
    for i in range(3):
        raw.send(raw.invite(call_id=f"c{i}"))
        await asyncio.sleep(0.3)
    finals = [status(a) for a in await raw.answers(1.5) if status(a) >= 200]
    assert finals.count(486) >= 1 and len(gateway.sessions) == 2
    raw.close()


async def test_sip_over_tls(sip_gateway: Any, tmp_path: Any, no_errors: None) -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "sip.pem"))
    tls_port = free_port()
    gateway = await sip_gateway(sip__tls_port=tls_port, sip__tls_cert=str(tmp_path / "sip.pem"),
                                sip__tls_key=str(tmp_path / "sip.pem"))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_port, ssl=context)
    raw = RawPhone(gateway.app.state.phones.sip.port)
    writer.write(raw.request("OPTIONS").replace(b"SIP/2.0/UDP", b"SIP/2.0/TLS"))
    await writer.drain()
    answer = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
    assert status(answer) == 200 and "INVITE" in answer
    writer.close()
    raw.close()


async def test_a_drain_turns_pending_calls_away_and_hangs_up_answered_ones(
        sip_gateway: Any, monkeypatch: pytest.MonkeyPatch, no_errors: None) -> None:
    import base64

    import aiohttp

    monkeypatch.setenv("GATEWAY_WEBHOOK_SECRET", "whsec_" + base64.b64encode(bytes(32)).decode())
    gateway = await sip_gateway(calls__webhook_urls="http://127.0.0.1:9/nobody", calls__decision_timeout_s=30.0)
    port = gateway.app.state.phones.sip.port
    answered, pending = RawPhone(port), RawPhone(port, host="127.0.0.2")
    answered.send(answered.invite())
    pending.send(pending.invite())
    await asyncio.sleep(0.5)
    calls = gateway.app.state.phones.calls.calls.values()
    first = next(c for c in calls if c.line.source == "127.0.0.1")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{gateway.port}/v1/realtime/calls/{first.id}/accept",
                             json={"type": "realtime"}) as answer:
            assert answer.status == 200
    ok = next(a for a in await answered.answers(1.0) if status(a) == 200)
    answered.send(answered.request("ACK", to_tag=to_tag(ok)))
    drain = asyncio.create_task(gateway.gateway.drain(3.0, 0.5))
    assert 503 in [status(a) for a in await pending.answers(0.5)]  # not answered yet: turned away at once
    assert len(gateway.sessions) == 1  # the answered call runs on until the drain's end
    assert any(a.startswith("BYE ") for a in await answered.answers(4.0))
    await drain
    assert not gateway.sessions and not gateway.app.state.phones.calls.calls
    answered.close()
    pending.close()


async def test_only_the_trunks_addresses_may_call(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway(sip__allowed_sources="127.0.0.2/32")
    port = gateway.app.state.phones.sip.port
    stranger, trunk = RawPhone(port), RawPhone(port, host="127.0.0.2")
    stranger.send(stranger.invite())
    assert [status(a) for a in await stranger.answers(1.0)] == [403]
    trunk.send(trunk.invite())
    assert 200 in [status(a) for a in await trunk.answers(1.5)]
    stranger.close()
    trunk.close()


async def test_a_call_without_an_offer_gets_ours_and_is_heard_in_the_codec_its_ack_answers(
        sip_gateway: Any, no_errors: None) -> None:
    """A delayed offer (RFC 3261 §13.2.1, the default of some PBX trunks): the INVITE has no SDP, our offer goes
    in the 200 OK, and the caller's answer in its ACK picks the codec (PCMA here) and where the media goes."""
    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    raw.send(raw.request("INVITE"))
    ok = next(a for a in await raw.answers(1.5) if status(a) == 200)
    assert "m=audio " in ok and " RTP/AVP 0 8 101\r\n" in ok and "a=rtpmap:8 PCMA/8000" in ok
    assert await media_packets(raw, 0.3) == 0  # nowhere to send yet
    answer = (f"v=0\r\no=raw 1 1 IN IP4 {raw.host}\r\ns=-\r\nc=IN IP4 {raw.host}\r\nt=0 0\r\n"
              f"m=audio {raw.media.getsockname()[1]} RTP/AVP 8 101\r\na=rtpmap:8 PCMA/8000\r\n"
              "a=rtpmap:101 telephone-event/8000\r\n")
    raw.send(raw.request("ACK", answer, to_tag=to_tag(ok), extra="Content-Type: application/sdp\r\n"))
    speech = np.frombuffer(load_pcm("one_sentence.wav") + silence(1500), dtype=np.int16)[::3]  # 8 kHz
    target = ("127.0.0.1", rtp_port(ok))
    for i in range(len(speech) // 160):
        raw.media.sendto(rtp.build(8, i, i * 160, 4321, alaw_encode(speech[i * 160:(i + 1) * 160])), target)
        await asyncio.sleep(0.004)
    heard = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while heard < 25 and loop.time() < end:  # the echo of the sentence, half a second of it
        with contextlib.suppress(TimeoutError):
            packet = rtp.parse(await asyncio.wait_for(loop.sock_recv(raw.media, 2048), end - loop.time()))
            assert packet is not None and packet.payload_type == 8
            heard += np.abs(alaw_decode(packet.payload).astype(np.int32)).max() > 500
    assert heard >= 25
    raw.close()


async def test_an_ack_without_the_answer_to_our_offer_ends_the_call(sip_gateway: Any, no_errors: None) -> None:
    gateway = await sip_gateway()
    raw = RawPhone(gateway.app.state.phones.sip.port)
    raw.send(raw.request("INVITE"))
    ok = next(a for a in await raw.answers(1.5) if status(a) == 200)
    raw.send(raw.request("ACK", to_tag=to_tag(ok)))
    assert any(a.startswith("BYE ") for a in await raw.answers(1.0))
    await asyncio.sleep(0.2)
    assert not gateway.sessions and not gateway.app.state.phones.sip.endpoint.ports.in_use
    raw.close()
