"""Where a client may make the gateway connect (MCP servers): the deny-list of special-purpose addresses, as
pure checks and through the MCP client, and one resolution per operation whose addresses its connections
are pinned to (a real MCP server on loopback, through the allow-list)."""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.config import McpConfig
from gateway.realtime.tools import McpServer
from gateway.runtime.addresses import special_purpose
from gateway.runtime.mcp_client import McpClient, McpFailure
from tests.mcp_server import McpTestServer

# (address, what the refusal must name): the ranges of IANA's registries, and the spellings that hide one
# inside another (Python 3.11.7's is_global calls the first two global).
SPECIAL = [
    ("192.0.0.8", "192.0.0.0/24"),
    ("2002:a9fe:a9fe::", "169.254.169.254"),  # 6to4 of the cloud metadata address
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64
    ("64:ff9b:1::a9fe:a9fe", "64:ff9b:1::/48"),  # local-use NAT64
    ("::ffff:127.0.0.1", "127.0.0.1"),  # IPv4-mapped
    ("::7f00:1", "127.0.0.1"),  # IPv4-compatible
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),  # Teredo, client address inverted
    ("2001:2::1", "2001::/23"),
    ("2001:db8::1", "2001:db8::/32"),
    ("3fff::1", "3fff::/20"),
    ("100::1", "100::/64"),
    ("5f00::1", "5f00::/16"),
    ("fc00::1", "fc00::/7"),
    ("fd12:3456::1", "fc00::/7"),
    ("fe80::1%eth0", "fe80::/10"),
    ("fec0::1", "fec0::/10"),
    ("ff02::1", "ff00::/8"),
    ("::", "::/128"),
    ("::1", "::1/128"),
    ("4000::1", "2000::/3"),  # unallocated
    ("0.0.0.0", "0.0.0.0/8"),
    ("10.1.2.3", "10.0.0.0/8"),
    ("100.64.0.1", "100.64.0.0/10"),
    ("127.0.0.2", "127.0.0.0/8"),
    ("169.254.169.254", "169.254.0.0/16"),
    ("172.31.255.255", "172.16.0.0/12"),
    ("192.0.0.9", "192.0.0.0/24"),
    ("192.0.0.170", "192.0.0.0/24"),
    ("192.0.2.1", "192.0.2.0/24"),
    ("192.31.196.1", "192.31.196.0/24"),
    ("192.52.193.1", "192.52.193.0/24"),
    ("192.88.99.1", "192.88.99.0/24"),
    ("192.168.1.1", "192.168.0.0/16"),
    ("192.175.48.1", "192.175.48.0/24"),
    ("198.18.0.1", "198.18.0.0/15"),
    ("198.51.100.1", "198.51.100.0/24"),
    ("203.0.113.1", "203.0.113.0/24"),
    ("224.0.0.1", "224.0.0.0/4"),
    ("240.0.0.1", "240.0.0.0/4"),
    ("255.255.255.255", "240.0.0.0/4"),
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "192.0.1.1", "192.0.3.1", "100.128.0.1", "172.32.0.1",
          "2606:4700:4700::1111", "2a00:1450:4001::1", "2001:4860:4860::8888", "2003::1"]


@pytest.mark.parametrize(("address", "named"), SPECIAL)
def test_special_purpose_addresses_are_refused_naming_their_range(address: str, named: str):
    why = special_purpose(ipaddress.ip_address(address))
    assert why is not None and named in why


@pytest.mark.parametrize("address", PUBLIC)
def test_public_unicast_addresses_pass(address: str):
    assert special_purpose(ipaddress.ip_address(address)) is None


async def test_the_client_refuses_a_special_address_before_connecting():
    """Through the MCP client, public-only: each literal is refused by the check, so no connection is even
    tried (a refused connection, or the deadline, would say something else)."""
    client = McpClient(McpConfig(list_timeout_s=2.0))
    for address in ("192.0.0.8", "[2002:a9fe:a9fe::]", "[64:ff9b::a9fe:a9fe]", "[::ffff:7f00:1]", "[fe80::1]"):
        started = time.monotonic()
        with pytest.raises(McpFailure) as failed:
            await client.list_tools(McpServer("x", f"http://{address}:9/mcp"))
        assert "not a public address" in failed.value.error.message, failed.value.error.message
        assert time.monotonic() - started < 1.0


@pytest.fixture
def rebinding(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """'localhost' resolves to 127.0.0.1 the first time and to 127.0.0.2 ever after (a name whose owner
    changes its answer between two lookups); the lookups are counted."""
    lookups: list[Any] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("localhost", b"localhost"):
            lookups.append(host)
            return real("127.0.0.1" if len(lookups) == 1 else "127.0.0.2", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield lookups


async def test_an_operation_connects_to_the_address_it_resolved_once(rebinding: list[Any]):
    with McpTestServer("127.0.0.1") as checked, McpTestServer("127.0.0.2", checked.port) as rebound:
        client = McpClient(McpConfig(allowed_hosts="localhost"))
        server = McpServer("weather", f"http://localhost:{checked.port}/mcp")
        tools = await client.list_tools(server)
        assert [t.name for t in tools] == ["get_weather", "delete_forecast", "slow_report"]
        assert len(rebinding) == 1  # one resolution for the whole operation, however many connections
        assert checked.app.hosts and not rebound.app.hosts  # every request went where that resolution said
        assert set(checked.app.hosts) == {f"localhost:{checked.port}"}  # with the server's name as its Host
        # The next operation resolves again (a DNS change is followed between operations, never within one).
        assert await client.call(server, "get_weather", '{"city": "Oslo"}') == "sunny and 21 degrees in Oslo"
        assert len(rebinding) == 2 and rebound.app.hosts


async def test_a_name_rebound_after_the_check_is_not_followed(monkeypatch: pytest.MonkeyPatch):
    """Public-only: 'rebind.test' first answers a public address (the check passes), then 127.0.0.1, where
    an MCP server listens. The connection goes to the address checked; none reaches loopback. Connections
    to that public address are refused here, in the socket layer, so the test sends nothing off this host."""
    public = "93.184.216.34"
    lookups: list[Any] = []
    attempts: list[Any] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("rebind.test", b"rebind.test"):
            lookups.append(host)
            return real_getaddrinfo(public if len(lookups) == 1 else "127.0.0.1", port, *args, **kwargs)
        return real_getaddrinfo(host, port, *args, **kwargs)

    def connect(sock: socket.socket, address: Any) -> None:
        if address[0] == public:
            attempts.append(address)
            raise ConnectionRefusedError(111, "refused by the test")
        real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    with McpTestServer("127.0.0.1") as loopback:
        client = McpClient(McpConfig(list_timeout_s=5.0))
        with pytest.raises(McpFailure):
            await client.list_tools(McpServer("x", f"http://rebind.test:{loopback.port}/mcp"))
        assert loopback.app.hosts == []  # nothing reached the address of the second answer
        assert len(lookups) == 1 and attempts == [(public, loopback.port)]
