"""Which IP addresses a client may make the gateway connect to (MCP servers), checked against an explicit
deny-list: IANA's IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and its updates), multicast
and the reserved blocks, and, for IPv6, everything outside global unicast (2000::/3).

Why a list of our own instead of ``ipaddress``'s ``is_global``: that property changes with the Python
release that runs the gateway (before the CVE-2024-4032 fix, in 3.11.7 for one, it called 192.0.0.8 and the
6to4 form of 169.254.169.254 global). Every range here is refused, whether IANA marks it globally
reachable or not (AS112, AMT, the TURN and PCP anycast addresses): no MCP server lives there.

The IPv6 forms that carry an IPv4 address (IPv4-mapped and -compatible, NAT64, 6to4, Teredo) are refused
whole: a client cannot reach a private IPv4 host through a translator, and the message names the IPv4
address inside so an operator sees what was attempted.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4 = [
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata services live here)"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.31.196.0/24", "AS112-v4"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("192.175.48.0/24", "direct delegation AS112 service"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and the limited broadcast address)"),
]

_V6 = [
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b::/96", "NAT64 well-known prefix"),
    ("64:ff9b:1::/48", "NAT64 local-use prefix"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy prefix"),
    ("2001::/32", "Teredo"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "direct delegation AS112 service"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing (SRv6) SIDs"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
]

_RANGES: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = [
    (ipaddress.ip_network(net), name) for net, name in _V4 + _V6
]
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 translation or tunnelling form carries, if it is one."""
    packed = address.packed
    if address in ipaddress.IPv6Network("2002::/16"):
        return ipaddress.IPv4Address(packed[2:6])
    if address in ipaddress.IPv6Network("2001::/32"):  # Teredo: the client's address, inverted
        return ipaddress.IPv4Address(bytes(b ^ 0xFF for b in packed[12:16]))
    for prefix in ("::ffff:0:0/96", "::/96", "64:ff9b::/96"):
        if address in ipaddress.IPv6Network(prefix):
            return ipaddress.IPv4Address(packed[12:16])
    if address in ipaddress.IPv6Network("64:ff9b:1::/48"):
        return None  # local-use NAT64 may embed at several prefix lengths (RFC 6052): refused whole anyway
    return None


def special_purpose(address: IPAddress) -> str | None:
    """Why the gateway must not connect to ``address`` on a client's say-so (a range and its use), or None
    for an ordinary public unicast address."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        address = ipaddress.IPv6Address(address.packed)  # fe80::1%eth0: the zone does not change the range
    for network, name in _RANGES:
        if address.version == network.version and address in network:
            why = f"{network} ({name})"
            if isinstance(address, ipaddress.IPv6Address) and (inner := embedded_ipv4(address)) is not None:
                why += f", carrying the IPv4 address {inner}"
            return why
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST_V6:
        return "outside 2000::/3 (not allocated for global unicast)"
    return None
