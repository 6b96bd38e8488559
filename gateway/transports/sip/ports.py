"""The SIP endpoint's sockets, bound before anything is served; under ``serve --workers N`` one port shared by
the workers, and each worker's share of the RTP ports.

One process binds its sockets here (a port in use is then an error naming the option, as the HTTP port's).
The parent of ``serve --workers N`` binds, for each worker, a UDP socket and a TCP (and TLS) listening
socket on [sip] port, all with SO_REUSEPORT: the kernel then gives all the datagrams of one source address
and port, and each TCP connection, to one socket of each group, so a dialog's requests reach the worker its
INVITE reached. The parent keeps its copies open for the gateway's life: a worker that dies and starts again
takes the same sockets back, and the groups never change size (a change would send the other workers'
dialogs elsewhere). Before that it binds the ports once without SO_REUSEPORT, so a port another program
(or another gateway) holds is an error naming the option, as with one process; Linux lets only the same
user's sockets join a SO_REUSEPORT group.

Each worker's RTP ports are a slice of [sip] rtp_port_min..rtp_port_max of its own (``rtp_pairs``), so no
two workers ever race for one.

Nothing here imports prometheus_client: the parent runs it (gateway.server.workers).
"""

from __future__ import annotations

import contextlib
import socket
import ssl

from gateway.config import ConfigError, SipConfig

MIN_RTP_PAIRS = 4  # the RTP/RTCP pairs each worker must have of its own, at the least


def rtp_pairs(low: int, high: int, slot: int = 0, count: int = 1) -> list[int]:
    """The even RTP ports (RTCP on the next) of ``low..high`` that worker ``slot`` of ``count`` takes."""
    ports = list(range(low + low % 2, high, 2))
    return ports[slot * len(ports) // count:(slot + 1) * len(ports) // count]


def check_rtp_share(options: SipConfig, count: int) -> None:
    share = len(rtp_pairs(options.rtp_port_min, options.rtp_port_max, 0, count))
    if count > 1 and share < MIN_RTP_PAIRS:
        raise ConfigError(f"option sip.rtp_port_max: {count} workers share rtp_port_min..rtp_port_max "
                          f"({options.rtp_port_min}-{options.rtp_port_max}), {share} calls' RTP ports each; "
                          f"widen the range to at least {MIN_RTP_PAIRS} calls' ports ({2 * MIN_RTP_PAIRS}) a worker")


def _socket(host: str, kind: int, port: int, shared: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, kind)
    try:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


def tls_context(options: SipConfig) -> ssl.SSLContext:
    """The TLS listener's context; ConfigError naming the options when its files cannot be used."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(options.tls_cert, options.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[sip] tls_cert / tls_key cannot be used ({options.tls_cert}, {options.tls_key}): "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    return context


def bind(options: SipConfig, count: int = 1) -> list[list[socket.socket]]:
    """Each of ``count`` workers' SIP sockets: [UDP, TCP (with [sip] tcp), TLS (with tls_port)], bound before
    anything is served, so that a port in use is a ConfigError naming the options; port 0 picks one free port
    for all. With several workers, one SO_REUSEPORT group a transport."""
    host = options.host
    wanted: list[tuple[int, int]] = [(socket.SOCK_DGRAM, options.port)]
    if options.tcp:
        wanted.append((socket.SOCK_STREAM, options.port))
    if options.tls_port:
        tls_context(options)
        wanted.append((socket.SOCK_STREAM, options.tls_port))
    alone: list[socket.socket] = []
    groups: list[list[socket.socket]] = []
    try:
        # First alone (as one process keeps them): a port held by anyone is an error, not a group we would join.
        for kind, port in wanted:
            alone.append(_socket(host, kind, port or (alone[0].getsockname()[1] if alone else 0), False))
        if count == 1:
            return [alone]
        ports = [sock.getsockname()[1] for sock in alone]
        close([alone])
        for _ in range(count):
            groups.append([_socket(host, kind, port, True) for (kind, _), port in zip(wanted, ports, strict=True)])
    except OSError as exc:
        close([alone, *groups])
        raise ConfigError(f"the SIP endpoint cannot listen on {host or '*'}:{options.port} ([sip] host, port, "
                          f"tls_port): {exc.strerror or exc}") from None
    return groups


def close(groups: list[list[socket.socket]]) -> None:
    for sock in (s for group in groups for s in group):
        with contextlib.suppress(OSError):
            sock.close()
