"""The SIP endpoint's sockets: UDP, TCP and (with a certificate) TLS, and the bounds on each connection.

A datagram is one message; over TCP and TLS messages are framed by Content-Length (RFC 3261 §18.3). A
message over ``[sip] max_message_bytes`` is dropped (a stream's connection is closed); so is a stream that
sends nothing within STREAM_FIRST_MESSAGE_S of connecting, one whose message, once begun, is not whole within
STREAM_MESSAGE_S, or any past ``max_tcp_connections`` in all or
``max_tcp_connections_per_source`` from one address. Nothing a peer sends is logged above DEBUG: the
counters (gateway_sip_dropped_total) tell how much was dropped and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import Counter as Tally

from gateway.config import ConfigError, SipConfig
from gateway.transports.calls.workers import CallWorkers, tally
from gateway.transports.sip.ports import tls_context
from gateway.transports.sip.signalling import CONTENT_LENGTH, DROPPED, Peer, SipEndpoint

log = logging.getLogger(__name__)

STREAM_FIRST_MESSAGE_S = 10.0
STREAM_MESSAGE_S = 10.0


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, listener: SipListener) -> None:
        self.listener = listener
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        if len(data) > self.listener.options.max_message_bytes:
            DROPPED.labels("too_large").inc()
            return
        transport = self.transport
        assert transport is not None
        address = (str(addr[0]), int(addr[1]))
        self.listener.endpoint.received(data, Peer("UDP", address, lambda out: transport.sendto(out, address)))

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP for a datagram we sent to a peer that went away


class SipListener:
    """The endpoint's sockets: those bound before the app started (gateway.transports.sip.ports: ``use``; under
    ``serve --workers N`` this worker's of the SO_REUSEPORT groups its parent bound, ``workers.sip_sockets``),
    else bound here when the app starts."""

    def __init__(self, endpoint: SipEndpoint, options: SipConfig, workers: CallWorkers | None = None) -> None:
        self.endpoint = endpoint
        self.options = options
        self._inherited = list(workers.sip_sockets) if workers is not None else []
        self._udp: asyncio.DatagramTransport | None = None
        self._servers: list[asyncio.Server] = []
        self._streams: Tally[str] = Tally()
        # The connections held, by source, against the bounds the workers share.
        self._held = tally(workers, "sip_streams", self._streams.elements)
        self._writers: set[asyncio.StreamWriter] = set()

    def use(self, sockets: list[socket.socket]) -> None:
        """Serve these sockets, bound already: UDP, TCP (with [sip] tcp), TLS (with tls_port)."""
        self._inherited = sockets

    async def start(self) -> None:
        options, loop = self.options, asyncio.get_running_loop()
        inherited = iter(self._inherited)
        try:
            if self._inherited:
                self._udp, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self), sock=next(inherited))
            else:
                self._udp, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self),
                                                                   local_addr=(options.host, options.port))
            port = self._udp.get_extra_info("sockname")[1]
            self.endpoint.ports_by_transport["UDP"] = port
            if options.tcp:
                where = {"sock": next(inherited)} if self._inherited else {"host": options.host, "port": port}
                server = await asyncio.start_server(lambda r, w: self._stream(r, w, "TCP"), **where,
                                                    limit=options.max_message_bytes)
                self._servers.append(server)
                self.endpoint.ports_by_transport["TCP"] = port
            if options.tls_port:
                context = tls_context(options)
                where = ({"sock": next(inherited)} if self._inherited
                         else {"host": options.host, "port": options.tls_port})
                server = await asyncio.start_server(lambda r, w: self._stream(r, w, "TLS"), **where, ssl=context,
                                                    limit=options.max_message_bytes)
                self._servers.append(server)
                self.endpoint.ports_by_transport["TLS"] = server.sockets[0].getsockname()[1]
        except (OSError, ssl.SSLError) as exc:
            await self.stop()
            raise ConfigError(f"the SIP endpoint cannot listen on {options.host}:{options.port} ([sip] host, port, "
                              f"tls_port, tls_cert, tls_key): {getattr(exc, 'strerror', None) or exc}") from None
        log.info("SIP endpoint on %s: %s", options.host,
                 ", ".join(f"{kind} {port}" for kind, port in self.endpoint.ports_by_transport.items()))

    @property
    def port(self) -> int:
        return self.endpoint.ports_by_transport.get("UDP", self.options.port)

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: str) -> None:
        peername = writer.get_extra_info("peername")
        address = (str(peername[0]), int(peername[1]))
        source = address[0]
        if self._held.admit(source, self.options.max_tcp_connections,
                            self.options.max_tcp_connections_per_source) is not None:
            DROPPED.labels("too_many_connections").inc()
            writer.close()
            return
        self._streams[source] += 1
        self._writers.add(writer)

        def send(data: bytes) -> None:
            if not writer.is_closing():
                writer.write(data)

        peer = Peer(kind, address, send)
        first = True
        try:
            while True:
                # A dialog's connection may idle between messages as long as the call lasts; a message, once
                # begun, must arrive whole within STREAM_MESSAGE_S, or half-sent ones would hold it for good.
                async with asyncio.timeout(STREAM_FIRST_MESSAGE_S if first else None):
                    lead = await reader.readexactly(1)
                if lead in b"\r\n":
                    continue  # keep-alive CRLFs between messages (RFC 5626)
                async with asyncio.timeout(STREAM_MESSAGE_S):
                    try:
                        head = lead + await reader.readuntil(b"\r\n\r\n")
                    except (asyncio.LimitOverrunError, ValueError):
                        DROPPED.labels("too_large").inc()
                        break
                    length = CONTENT_LENGTH.search(head)
                    size = int(length[1]) if length else 0
                    if len(head) + size > self.options.max_message_bytes:
                        DROPPED.labels("too_large").inc()
                        break
                    body = await reader.readexactly(size) if size else b""
                first = False
                self.endpoint.received(head + body, peer)
                if writer.transport.get_write_buffer_size() > 16 * self.options.max_message_bytes:
                    break  # a peer that does not read its answers
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            self._streams[source] -= 1
            if not self._streams[source]:
                del self._streams[source]
            self._held.refresh()
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def stop(self) -> None:
        if self._udp is not None:
            self._udp.close()
        for server in self._servers:
            server.close()
        for writer in list(self._writers):
            writer.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        for sock in self._inherited:  # those it never served too
            sock.close()
