"""WebRTC behind a balancer: the answer names the node that carries the media.

An aiortc client POSTs real offers to a served gateway: the answer's host candidates carry
``[webrtc] advertised_host``, the Location header ``[webrtc] advertised_url``, and the gateway's peer
connections get ``ice_servers`` as aiortc itself reads them (and a real coturn gives them a relay candidate).
With the defaults a call still connects.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiortc")

import aiohttp  # noqa: E402
from aiortc import RTCConfiguration, RTCPeerConnection  # noqa: E402

from gateway.transports.webrtc.calls import advertise  # noqa: E402
from tests.conftest import StartGateway  # noqa: E402
from tests.helpers.webrtc import RtcClient, session_count  # noqa: E402

HOST_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) (\d+) typ host", re.MULTILINE)
RELAY_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ udp \d+ (\S+) (\d+) typ relay", re.MULTILINE)
TURN_USER, TURN_PASSWORD = "gateway", "s3cret-from-env"


@pytest.fixture
def coturn(tmp_path: Path) -> Iterator[int]:
    """A real TURN server (Debian's coturn) on a loopback port, one long-term user; yields its port."""
    if shutil.which("turnserver") is None:
        pytest.skip("coturn is not installed (apt-get install coturn; .ci/run installs it)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "turnserver.log"
    process = subprocess.Popen(
        ["turnserver", "-n", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", f"--listening-port={port}",
         "--lt-cred-mech", f"--user={TURN_USER}:{TURN_PASSWORD}", "--realm=voice-gateway.test", "--no-tls",
         "--no-dtls", "--no-tcp", "--no-cli", f"--pidfile={tmp_path / 'turnserver.pid'}",
         f"--userdb={tmp_path / 'turndb'}", f"--log-file={log}", "--simple-log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while "Total General servers" not in (log.read_text() if log.exists() else ""):
            assert process.poll() is None and time.monotonic() < deadline, "turnserver did not start"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(5)


async def post_offer(base_url: str) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of one offer with audio and a data channel, as a browser sends it."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        async with aiohttp.ClientSession() as http, http.post(
            base_url + "/v1/realtime/calls", data=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}
        ) as response:
            return response.status, await response.text(), dict(response.headers)
    finally:
        await pc.close()


async def test_the_answer_names_the_advertised_host_and_the_node(start_gateway: StartGateway):
    gateway = await start_gateway(webrtc__enabled=True, webrtc__advertised_host="203.0.113.7",
                                  webrtc__advertised_url="https://gw-7.example.com/")
    base = f"http://127.0.0.1:{gateway.port}"
    status, answer, headers = await post_offer(base)
    assert status == 201, answer

    (call,) = gateway.webrtc.calls.values()
    own = [(c.ip, c.port) for c in call.pc.getTransceivers()[0].sender.transport.transport.iceGatherer
           .getLocalCandidates() if c.type == "host" and ":" not in c.ip]
    assert own, "aiortc gathered no IPv4 host candidate"
    advertised = {(host, int(port)) for host, port in HOST_CANDIDATE.findall(answer) if ":" not in host}
    # Every IPv4 host candidate (listed in each media section) carries the advertised address, on the port
    # the gateway really bound.
    assert advertised == {("203.0.113.7", port) for _, port in own}
    assert not any(ip in answer for ip, _ in own)

    location = headers["Location"]
    assert location == f"https://gw-7.example.com/v1/realtime/calls/{call.id}"
    # The path of that URL hangs up on this node.
    async with aiohttp.ClientSession() as http, http.delete(base + location.removeprefix("https://gw-7.example.com")) \
            as response:
        assert response.status == 204
    assert not gateway.webrtc.calls


async def test_an_advertised_name_is_resolved_and_a_dead_one_refuses_the_call(start_gateway: StartGateway):
    gateway = await start_gateway(webrtc__enabled=True, webrtc__advertised_host="localhost")
    status, answer, headers = await post_offer(f"http://127.0.0.1:{gateway.port}")
    assert status == 201, answer
    hosts = {host for host, _ in HOST_CANDIDATE.findall(answer) if ":" not in host}
    assert hosts == {"127.0.0.1"}
    assert headers["Location"].startswith("/v1/realtime/calls/rtc_")  # no advertised_url: relative

    gateway = await start_gateway(webrtc__enabled=True, webrtc__advertised_host="gw.invalid")
    status, body, _ = await post_offer(f"http://127.0.0.1:{gateway.port}")
    assert status == 503
    assert "advertised_host 'gw.invalid' does not resolve" in body
    assert not gateway.webrtc.calls and not gateway.sessions


def test_advertise_leaves_relay_reflexive_and_other_family_candidates_alone():
    sdp = "\r\n".join([
        "v=0", "m=audio 40000 UDP/TLS/RTP/SAVPF 111", "c=IN IP4 10.0.0.5",
        "a=candidate:1 1 udp 2130706431 10.0.0.5 40000 typ host",
        "a=candidate:2 1 udp 2130706431 fd00::5 40001 typ host",
        "a=candidate:3 1 udp 1694498815 198.51.100.9 40000 typ srflx raddr 10.0.0.5 rport 40000",
        "a=candidate:4 1 udp 16777215 198.51.100.1 50000 typ relay raddr 10.0.0.5 rport 40002", "",
    ])
    out = advertise(sdp, "203.0.113.7").split("\r\n")
    assert out[2] == "c=IN IP4 203.0.113.7"
    assert out[3] == "a=candidate:1 1 udp 2130706431 203.0.113.7 40000 typ host"
    assert out[4:] == sdp.split("\r\n")[4:]


async def test_ice_servers_reach_the_gateways_peer_connection(start_gateway: StartGateway, monkeypatch):
    monkeypatch.setenv("TEST_TURN_CREDENTIAL", "s3cret-from-env")
    # A TURN server on a closed loopback port: the relay allocation is refused at once, the call goes on.
    # (A STUN server here would hold the answer until its gathering times out.)
    gateway = await start_gateway(
        webrtc__enabled=True, webrtc__ice_servers="turn:127.0.0.1:9?transport=tcp",
        webrtc__turn_username="gateway", webrtc__turn_credential_env="TEST_TURN_CREDENTIAL",
    )
    status, answer, _ = await post_offer(f"http://127.0.0.1:{gateway.port}")
    assert status == 201, answer
    (call,) = gateway.webrtc.calls.values()
    # The aioice connection under the call's own ICE gatherer: where its relay candidates would come from.
    ice = call.pc.getTransceivers()[0].sender.transport.transport.iceGatherer._connection
    assert (ice.turn_server, ice.turn_transport, ice.turn_ssl) == (("127.0.0.1", 9), "tcp", False)
    assert (ice.turn_username, ice.turn_password) == ("gateway", "s3cret-from-env")
    assert ice.stun_server is None


@pytest.mark.parametrize("password", [TURN_PASSWORD, "wrong"])
async def test_the_gateway_gathers_a_relay_candidate_from_a_real_turn_server(
    coturn: int, start_gateway: StartGateway, monkeypatch, password: str
):
    # coturn first: it then outlives the gateway, whose calls release their allocations as they close.
    monkeypatch.setenv("TURN_CREDENTIAL", password)
    gateway = await start_gateway(webrtc__enabled=True, webrtc__ice_servers=f"turn:127.0.0.1:{coturn}",
                                  webrtc__turn_username=TURN_USER, webrtc__advertised_host="203.0.113.7")
    status, answer, _ = await post_offer(f"http://127.0.0.1:{gateway.port}")
    assert status == 201, answer
    relays = {host for host, _ in RELAY_CANDIDATE.findall(answer)}
    # The relay's address (coturn's relay-ip) is left as it is; a wrong credential gets no allocation.
    assert relays == ({"127.0.0.1"} if password == TURN_PASSWORD else set())
    assert {host for host, _ in HOST_CANDIDATE.findall(answer) if ":" not in host} == {"203.0.113.7"}


async def test_a_call_connects_on_loopback_with_the_defaults(start_gateway: StartGateway):
    gateway = await start_gateway(webrtc__enabled=True)
    client = RtcClient(f"http://127.0.0.1:{gateway.port}")
    try:
        await client.connect()
        await client.until("session.created")
        assert await session_count(gateway, 1) == 1
        assert client.location is not None and client.location.startswith("/v1/realtime/calls/rtc_")
        assert await client.hang_up() == 204
        assert await session_count(gateway, 0) == 0
    finally:
        await client.close()
