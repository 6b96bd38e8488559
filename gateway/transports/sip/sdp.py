"""SDP offer/answer for one audio stream of G.711 at 8 kHz (RFC 4566, RFC 3264), DTMF by RFC 4733.

The answer has a media line for each of the offer's, in its order (RFC 3264 §6): the audio stream taken, and
every other one refused with port 0. Its direction answers the offer's (a hold's sendonly gets recvonly).
An INVITE without an offer gets ours (``offer``), and the caller's answer in its ACK is read as an offer is.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass

# Static payload types (RFC 3551) and the rtpmap names that may carry them dynamically.
CODECS = {"PCMU": 0, "PCMA": 8}
DTMF_PAYLOAD_TYPE = 101  # telephone-event's in an offer of ours
MAX_LINES = 256
DIRECTIONS = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}


class OfferError(ValueError):
    """An offer we cannot answer: 488 Not Acceptable Here (or 400 when it is not SDP at all)."""

    def __init__(self, message: str, status: int = 488) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Offer:
    address: str  # where the caller's RTP comes from and goes to
    port: int
    codec: str  # "PCMU" or "PCMA"
    payload_type: int
    dtmf_payload_type: int | None
    # Every media line offered, in order, as (media, proto, its first format); the audio taken is at ``index``.
    lines: tuple[tuple[str, str, str], ...] = (("audio", "RTP/AVP", "0"),)
    index: int = 0
    direction: str = "sendrecv"  # the offer's, for the audio taken

    @property
    def we_send(self) -> bool:
        """Whether our answer sends media: not to a caller who holds the call (sendonly) or stops it (inactive)."""
        return DIRECTIONS[self.direction] in ("sendrecv", "sendonly")

def parse_offer(text: str) -> Offer:
    """The caller's audio stream, its first codec we speak, and its telephone-event payload type."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("v=0"):
        raise OfferError("The body is not an SDP offer.", 400)
    if len(lines) > MAX_LINES:
        raise OfferError(f"The SDP has more than {MAX_LINES} lines.", 400)
    session_address: str | None = None
    session_direction = "sendrecv"
    media: list[dict[str, object]] = []
    for line in lines:
        kind, _, value = line.partition("=")
        if kind == "m":
            fields = value.split()
            if len(fields) < 4:
                raise OfferError("A media line (m=) is malformed.", 400)
            media.append({"kind": fields[0], "port": fields[1], "proto": fields[2], "formats": fields[3:],
                          "rtpmap": {}, "address": None, "direction": None})
        elif kind == "c":
            fields = value.split()
            if len(fields) < 3 or fields[0] != "IN":
                raise OfferError("A connection line (c=) is malformed.", 400)
            address = fields[2].split("/")[0]
            if media:
                media[-1]["address"] = address
            else:
                session_address = address
        elif kind == "a" and value in DIRECTIONS:
            if media:
                media[-1]["direction"] = value
            else:
                session_direction = value
        elif kind == "a" and media and value.startswith("rtpmap:"):
            number, _, name = value[7:].partition(" ")
            media[-1]["rtpmap"][number] = name  # type: ignore[index]
    audio = next((m for m in media if m["kind"] == "audio" and m["port"] != "0"), None)
    if audio is None:
        raise OfferError("The offer has no audio stream.")
    if audio["proto"] != "RTP/AVP":
        raise OfferError(f"Only plain RTP/AVP is taken, not {audio['proto']} (no SRTP: use TLS to the trunk and a "
                         "private network for media).")
    address = str(audio["address"] or session_address or "")
    try:
        ipaddress.ip_address(address)
        port = int(str(audio["port"]))
    except ValueError:
        raise OfferError("The offer's connection address or port is not an IP address and port.", 400) from None
    if not 1 <= port <= 65535:
        raise OfferError("The offer's port is out of range.", 400)
    rtpmap: dict[str, str] = audio["rtpmap"]  # type: ignore[assignment]
    codec = None
    for number in audio["formats"]:  # type: ignore[attr-defined]
        name = rtpmap.get(number, "").split("/")[0].upper()
        if name in CODECS or (not name and number in ("0", "8")):
            codec = (name or ("PCMU" if number == "0" else "PCMA"), int(number))
            break
    if codec is None:
        raise OfferError("The offer has neither PCMU nor PCMA (G.711 at 8 kHz).")
    dtmf = next((int(n) for n, name in rtpmap.items() if name.lower().startswith("telephone-event/8000")
                 and n.isdigit() and n in audio["formats"]), None)  # type: ignore[operator]
    lines = tuple((str(m["kind"]), str(m["proto"]), str(m["formats"][0])) for m in media)  # type: ignore[index]
    return Offer(address, port, codec[0], codec[1], dtmf, lines, media.index(audio),
                 str(audio["direction"] or session_direction))


def awaited(source: str) -> Offer:
    """Where a call stands whose INVITE had no offer: ours goes in the 200 OK, the caller's answer comes in the
    ACK (RFC 3261 §13.2.1). Until then nothing is sent (inactive), and only the caller's host may send."""
    return Offer(source, 9, "PCMU", CODECS["PCMU"], DTMF_PAYLOAD_TYPE, direction="inactive")


def offer(address: str, port: int, origin: tuple[int, int]) -> str:
    """Our offer, for an INVITE that came without one: both G.711 codecs and telephone-event."""
    lines = _session(address, origin)
    dtmf = DTMF_PAYLOAD_TYPE
    lines += [f"m=audio {port} RTP/AVP {CODECS['PCMU']} {CODECS['PCMA']} {dtmf}",
              f"a=rtpmap:{CODECS['PCMU']} PCMU/8000", f"a=rtpmap:{CODECS['PCMA']} PCMA/8000",
              f"a=rtpmap:{dtmf} telephone-event/8000", f"a=fmtp:{dtmf} 0-16", "a=ptime:20", "a=sendrecv"]
    return "\r\n".join(lines) + "\r\n"


def _session(address: str, origin: tuple[int, int] | None) -> list[str]:
    family = "IP6" if ":" in address else "IP4"
    session, version = origin or (secrets.randbelow(2**31), 1)
    return ["v=0", f"o=voice-gateway {session} {version} IN {family} {address}", "s=voice-gateway",
            f"c=IN {family} {address}", "t=0 0"]


def answer(offer: Offer, address: str, port: int, origin: tuple[int, int] | None = None) -> str:
    """Our answer: the offer's codec and telephone-event, on ``address``:``port``. ``origin``: the o= line's
    session id and version (a dialog keeps its id and counts its answers; None: a new session)."""
    lines = _session(address, origin)
    for i, (kind, proto, first) in enumerate(offer.lines):
        if i != offer.index:
            lines.append(f"m={kind} 0 {proto} {first}")
            continue
        dtmf = offer.dtmf_payload_type
        lines += [f"m=audio {port} RTP/AVP {offer.payload_type}" + (f" {dtmf}" if dtmf is not None else ""),
                  f"a=rtpmap:{offer.payload_type} {offer.codec}/8000"]
        if dtmf is not None:
            lines += [f"a=rtpmap:{dtmf} telephone-event/8000", f"a=fmtp:{dtmf} 0-16"]
        lines += ["a=ptime:20", f"a={DIRECTIONS[offer.direction]}"]
    return "\r\n".join(lines) + "\r\n"
