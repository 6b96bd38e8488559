"""A call's audio: G.711 over RTP on a port of its own, played on the endpoint's one media clock.

Packets are taken as they arrive (``datagram_received``: checked and queued, nothing awaited) and wake the
call's reader (``arrived``), which takes the caller's input at once (``take_input``): the packets now in
order, decoded and put at 24 kHz, and the keys pressed. Every 20 ms the clock (``MediaClock``) runs each
call's ``tick``: one 20 ms frame of the agent's voice goes out (to where the caller's packets come from:
symmetric RTP), and a hole in the input that has waited long enough is given up. While the caller holds the
call (an offer of sendonly or inactive) no media goes out and the agent's voice waits in its queue: it is heard
from where it stopped once the call is resumed, and nothing unheard counts as heard. Only the caller's
addresses (its SDP's, its signalling's) may send, then only from the port of their first packet, and
only the payload types agreed: any other packet is dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections import deque

import numpy as np
from prometheus_client import Counter

from gateway.audio import RationalResampler, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from gateway.transports.playout import PlayoutQueue
from gateway.transports.sip import rtp
from gateway.transports.sip.ports import rtp_pairs
from gateway.transports.sip.sdp import Offer

log = logging.getLogger(__name__)

RATE = 8000
FRAME = 160  # 20 ms at 8 kHz: the ptime we answer
RTCP_INTERVAL_S = 5.0
DTMF_PACKETS = 5  # 100 ms of a key's tone, then three end packets (RFC 4733 §2.5.1.4)
MAX_QUEUED_PACKETS = 256  # per tick, beyond which a sender is flooding

DROPPED = Counter("gateway_rtp_dropped_total", "RTP and RTCP packets dropped, by why", ["reason"])


class PortPool:
    """Even RTP ports (RTCP on the next) of [sip] rtp_port_min..rtp_port_max, each held by one call (under
    ``serve --workers N``, those of worker ``slot``'s own slice: gateway.transports.sip.ports)."""

    def __init__(self, host: str, low: int, high: int, slot: int = 0, count: int = 1) -> None:
        self.host = host
        self.ports = rtp_pairs(low, high, slot, count)
        random.shuffle(self.ports)
        self.in_use: set[int] = set()

    def open(self) -> tuple[socket.socket, socket.socket] | None:
        """Two bound UDP sockets (RTP, RTCP), or None when every port is taken."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        for port in self.ports:
            if port in self.in_use:
                continue
            pair = []
            try:
                for p in (port, port + 1):
                    sock = socket.socket(family, socket.SOCK_DGRAM)
                    pair.append(sock)
                    sock.bind((self.host, p))
                    sock.setblocking(False)
            except OSError:
                for sock in pair:
                    sock.close()
                continue  # another program holds it
            self.in_use.add(port)
            return pair[0], pair[1]
        return None

    def release(self, port: int) -> None:
        self.in_use.discard(port)


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, stream: RtpStream, rtcp: bool) -> None:
        self.stream = stream
        self.rtcp = rtcp

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.stream.received(data, addr, self.rtcp)

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP port unreachable for a packet we sent: the phone is gone or not yet listening




class RtpStream:
    """One call's RTP session."""

    def __init__(self, offer: Offer, sockets: tuple[socket.socket, socket.socket], jitter_s: float,
                 playout: PlayoutQueue, signalling_host: str) -> None:
        """``signalling_host``: where the INVITE came from; a phone may send its media from there rather
        than from the address its SDP names (a phone behind NAT, or one bound to every interface)."""
        self._signalling_host = signalling_host
        self.use(offer)
        self._sockets = sockets
        self.port = sockets[0].getsockname()[1]
        self.playout = playout
        self._jitter = rtp.JitterBuffer(jitter_s)
        self._upsample = RationalResampler(3, 1)
        self._inbox: deque[tuple[rtp.Packet, float]] = deque()
        self._source: tuple[str, int] | None = None  # the caller's RTP port, latched from its first packet
        self._ssrc = random.getrandbits(32)
        self._sequence = random.getrandbits(16)
        self._timestamp = random.getrandbits(32)
        self._sent_packets = self._sent_octets = 0
        self._talking = False  # a marker bit starts each talkspurt
        self._dtmf_out: deque[str] = deque()
        self._dtmf_sending: tuple[str, int, int] | None = None  # (key, its timestamp, packets sent)
        self._dtmf_in_last: tuple[int, int] | None = None  # (ssrc, timestamp) of the last key reported
        self.last_heard = time.monotonic()
        self._last_report = 0.0
        self._transports: list[asyncio.DatagramTransport] = []
        self.arrived = asyncio.Event()
        """Set when input may be ready for ``take_input``: a packet came, or a hole may have waited enough."""
        self.closed = False

    def use(self, offer: Offer) -> None:
        """Send to and take from what ``offer`` agreed (the caller's offer, or its answer to ours)."""
        self.offer = offer
        self.sending = offer.we_send
        self._hosts = {offer.address, self._signalling_host}
        self.remote = (offer.address, offer.port)
        self._decode = ulaw_decode if offer.codec == "PCMU" else alaw_decode
        self._encode = ulaw_encode if offer.codec == "PCMU" else alaw_encode

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for rtcp, sock in enumerate(self._sockets):
            transport, _ = await loop.create_datagram_endpoint(lambda r=bool(rtcp): _Receiver(self, r), sock=sock)
            self._transports.append(transport)

    def received(self, data: bytes, addr: tuple[str, int], rtcp: bool) -> None:
        # Only the caller's addresses may send; then only the port of its first packet.
        if addr[0] not in self._hosts or (self._source is not None and not rtcp and addr != self._source):
            DROPPED.labels("wrong_source").inc()
            return
        if rtcp:
            return  # reports from the phone: nothing here acts on them
        packet = rtp.parse(data)
        if packet is None:
            DROPPED.labels("not_rtp").inc()
            return
        if packet.payload_type not in (self.offer.payload_type, self.offer.dtmf_payload_type):
            DROPPED.labels("wrong_payload_type").inc()
            return
        if len(self._inbox) >= MAX_QUEUED_PACKETS:
            DROPPED.labels("flood").inc()
            return
        self._source = self._source or addr
        self._inbox.append((packet, time.monotonic()))
        self.arrived.set()

    def send_dtmf(self, digits: str) -> None:
        self._dtmf_out.extend(digits)

    def take_input(self, now: float) -> tuple[bytes, list[str]]:
        """The caller's input ready now: (its audio as pcm16 24 kHz, keys pressed).

        Taken as packets arrive rather than on the clock's tick: a packet in order would otherwise wait up to
        a tick (10 ms on average) before the session hears it, and the end of the caller's speech with it.
        """
        keys: list[str] = []
        while self._inbox:
            packet, arrival = self._inbox.popleft()
            self.last_heard = arrival
            if packet.payload_type == self.offer.dtmf_payload_type:
                event = rtp.dtmf_event(packet.payload)
                if event is not None and self._dtmf_in_last != (packet.ssrc, packet.timestamp):
                    self._dtmf_in_last = (packet.ssrc, packet.timestamp)
                    keys.append(event[0])
                continue
            self._jitter.add(packet, arrival)
        pieces = []
        for gap, payload in self._jitter.ready(now):
            if gap:
                pieces.append(np.zeros(gap, dtype=np.int16))
            pieces.append(self._decode(payload))
        pcm = self._upsample.process(np.concatenate(pieces)).tobytes() if pieces else b""
        return pcm, keys

    def tick(self, now: float) -> list[tuple[str, str]]:
        """One 20 ms step: a frame of the agent's voice out; returns the playout events it reached."""
        if self._jitter.holding:
            self.arrived.set()  # a hole's wait may be over
        events: list[tuple[str, str]] = []
        if self.sending:
            frame, events = self.playout.take()
            self._send_frame(frame)
        if now - self._last_report >= RTCP_INTERVAL_S:
            self._last_report = now
            self._send(rtp.sender_report(self._ssrc, self._timestamp, self._sent_packets, self._sent_octets), True)
        return events

    def _send_frame(self, frame: np.ndarray) -> None:
        if self._dtmf_sending is None and self._dtmf_out and self.offer.dtmf_payload_type is not None:
            self._dtmf_sending = (self._dtmf_out.popleft(), self._timestamp, 0)
        if self._dtmf_sending is not None:
            key, start, sent = self._dtmf_sending
            end = sent >= DTMF_PACKETS
            payload = rtp.dtmf_payload(key, end, FRAME * min(sent + 1, DTMF_PACKETS))
            self._packet(self.offer.dtmf_payload_type, start, payload, marker=sent == 0)  # type: ignore[arg-type]
            self._dtmf_sending = (key, start, sent + 1) if sent < DTMF_PACKETS + 2 else None
        elif np.any(frame):
            self._packet(self.offer.payload_type, self._timestamp, self._encode(frame), marker=not self._talking)
            self._talking = True
        else:
            # Silence still goes out (no comfort-noise negotiation): phones and trunks expect a steady stream.
            self._packet(self.offer.payload_type, self._timestamp, self._encode(frame))
            self._talking = False
        self._timestamp = (self._timestamp + FRAME) & 0xFFFFFFFF

    def _packet(self, payload_type: int, timestamp: int, payload: bytes, marker: bool = False) -> None:
        self._send(rtp.build(payload_type, self._sequence, timestamp, self._ssrc, payload, marker))
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._sent_packets += 1
        self._sent_octets += len(payload)

    def _send(self, data: bytes, rtcp: bool = False) -> None:
        if self.closed or len(self._transports) < 2:
            return
        host, port = self._source if self._source is not None and not rtcp else self.remote
        self._transports[int(rtcp)].sendto(data, (host, port + int(rtcp)))

    def close(self) -> None:
        if self.closed:
            return
        self._send(rtp.goodbye(self._ssrc), True)
        self.closed = True
        self.arrived.set()  # its reader sees it closed
        for transport in self._transports:
            transport.close()
        for sock in self._sockets:
            sock.close()
