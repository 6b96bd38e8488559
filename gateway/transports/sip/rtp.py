"""RTP and RTCP packets (RFC 3550), DTMF events (RFC 4733), and the jitter buffer that puts packets back in
order."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

HEADER = struct.Struct("!BBHII")
EVENT = struct.Struct("!BBH")
DTMF_EVENTS = "0123456789*#ABCD"
MAX_GAP_SAMPLES = 8000  # a hole longer than a second is a clock jump, not lost packets
NTP_EPOCH = 2208988800  # seconds from 1900 to 1970


@dataclass
class Packet:
    payload_type: int
    marker: bool
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes


def parse(data: bytes) -> Packet | None:
    """An RTP packet, or None when ``data`` is not one (RTCP, STUN, garbage)."""
    if len(data) < HEADER.size:
        return None
    first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
    if first >> 6 != 2 or 72 <= second & 0x7F <= 76:  # version 2; payload types 72-76 are RTCP's
        return None
    offset = HEADER.size + 4 * (first & 0x0F)
    if first & 0x10:  # a header extension
        if len(data) < offset + 4:
            return None
        offset += 4 + 4 * int.from_bytes(data[offset + 2 : offset + 4], "big")
    end = len(data)
    if first & 0x20:  # padding: its length is the last byte
        end -= data[-1]
    if offset > end:
        return None
    return Packet(second & 0x7F, bool(second & 0x80), sequence, timestamp, ssrc, data[offset:end])


def build(payload_type: int, sequence: int, timestamp: int, ssrc: int, payload: bytes, marker: bool = False) -> bytes:
    return HEADER.pack(0x80, payload_type | (0x80 if marker else 0), sequence & 0xFFFF, timestamp & 0xFFFFFFFF,
                       ssrc) + payload


def dtmf_event(payload: bytes) -> tuple[str, bool] | None:
    """(key, end of event) of an RFC 4733 telephone-event payload; None for events that are not keys."""
    if len(payload) < EVENT.size:
        return None
    event, flags, _duration = EVENT.unpack_from(payload)
    if event >= len(DTMF_EVENTS):
        return None
    return DTMF_EVENTS[event], bool(flags & 0x80)


def dtmf_payload(key: str, end: bool, duration: int, volume: int = 10) -> bytes:
    return EVENT.pack(DTMF_EVENTS.index(key), (0x80 if end else 0) | volume, duration)


def sender_report(ssrc: int, rtp_timestamp: int, packets: int, octets: int, now: float | None = None) -> bytes:
    """An RTCP sender report with no reception blocks, then an SDES CNAME (a compound packet must have one)."""
    now = time.time() if now is None else now
    seconds = int(now) + NTP_EPOCH
    fraction = int((now % 1) * 2**32)
    report = struct.pack("!BBHIIIIII", 0x80, 200, 6, ssrc, seconds & 0xFFFFFFFF, fraction, rtp_timestamp & 0xFFFFFFFF,
                         packets & 0xFFFFFFFF, octets & 0xFFFFFFFF)
    cname = b"voice-gateway"
    item = bytes([1, len(cname)]) + cname + b"\x00"
    item += b"\x00" * (-len(item) % 4)
    sdes = struct.pack("!BBHI", 0x81, 202, (4 + len(item)) // 4, ssrc) + item
    return report + sdes


def goodbye(ssrc: int) -> bytes:
    return struct.pack("!BBHI", 0x81, 203, 1, ssrc)


MAX_MISORDER = 100  # packets: older than this behind the stream is a restart, not reordering (RFC 3550 A.1)


def _newer(a: int, b: int) -> bool:
    """Sequence number ``a`` comes after ``b`` (16-bit, wrapping)."""
    return 0 < (a - b) & 0xFFFF < 0x8000


class JitterBuffer:
    """Audio packets of one stream back in sequence order.

    A packet that is next in sequence goes out at once: the audio feeds VAD and speech recognition, not a
    loudspeaker, so nothing is held to smooth arrival times. Only a hole waits, for at most ``wait_s``,
    for its packet to arrive late; then it is counted lost and filled with silence (by RTP time, so input
    times stay true). A packet older than what went out is dropped; so is any beyond ``capacity``.

    A stream that starts over (a phone back from hold, a bridge that switched its source) is followed once
    two packets in sequence show it (RFC 3550 A.1): a new SSRC, or a sequence number far behind. Otherwise
    its packets would all read as late, and the caller would go unheard; one stray packet moves nothing.
    """

    def __init__(self, wait_s: float, capacity: int = 64) -> None:
        self.wait_s = wait_s
        self.capacity = capacity
        self._packets: dict[int, tuple[float, int, bytes]] = {}  # sequence → (arrival, timestamp, payload)
        self._next: int | None = None  # the sequence number due next
        self._timestamp = 0  # the RTP time due next
        self._ssrc: int | None = None
        self._probation: tuple[int, int] | None = None  # (SSRC, sequence) that would confirm a new start
        self.lost = 0
        self.late = 0

    def add(self, packet: Packet, now: float) -> None:
        if self._next is None or (packet.ssrc, packet.sequence) == self._probation:
            self._start(packet)
        behind = packet.sequence != self._next and not _newer(packet.sequence, self._next)
        if packet.ssrc != self._ssrc or behind:
            self.late += 1
            if packet.ssrc != self._ssrc or (self._next - packet.sequence) & 0xFFFF > MAX_MISORDER:
                self._probation = (packet.ssrc, (packet.sequence + 1) & 0xFFFF)
            return
        if len(self._packets) >= self.capacity:
            self.late += 1
            return
        self._packets.setdefault(packet.sequence, (now, packet.timestamp, packet.payload))

    def _start(self, packet: Packet) -> None:
        """Follow ``packet``'s stream from it on; what waited behind a hole of the old one is lost."""
        self.lost += len(self._packets)
        self._packets.clear()
        self._next, self._timestamp, self._ssrc, self._probation = packet.sequence, packet.timestamp, packet.ssrc, None

    @property
    def holding(self) -> bool:
        """Packets wait behind a hole."""
        return bool(self._packets)

    def ready(self, now: float) -> list[tuple[int, bytes]]:
        """What can go out now, in order: (samples of silence before it, payload)."""
        out: list[tuple[int, bytes]] = []
        while self._packets and self._next is not None:
            entry = self._packets.pop(self._next, None)
            if entry is None:
                oldest = min(arrival for arrival, _, _ in self._packets.values())
                if now - oldest < self.wait_s and len(self._packets) < self.capacity // 2:
                    break  # the hole's packet may still come
                after = min(self._packets, key=lambda s: (s - self._next) & 0xFFFF)  # type: ignore[operator]
                self.lost += (after - self._next) & 0xFFFF
                self._next = after
                continue
            _, timestamp, payload = entry
            gap = (timestamp - self._timestamp) & 0xFFFFFFFF
            out.append((gap if gap <= MAX_GAP_SAMPLES else 0, payload))
            self._timestamp = (timestamp + len(payload)) & 0xFFFFFFFF
            self._next = (self._next + 1) & 0xFFFF
        return out
