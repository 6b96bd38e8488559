"""The SIP user-agent server: each INVITE a pending call in the call model, its dialog until BYE.

Written on asyncio rather than taken whole from a library (ARCHITECTURE.md says why); aiosipua parses
and serializes the messages. As a UAS this needs RFC 3261's server transactions for INVITE (a
retransmitted INVITE gets the last answer again; a final answer is repeated over UDP until its ACK, up
to ``[sip] ack_timeout_s``), dialogs (From/To tags, the caller's Contact and Record-Route for the
requests we send in them), and, as a client, BYE and REFER (repeated over UDP until answered). Responses
go back to where the request came from (RFC 3581's symmetric routing), so a forged Via cannot turn the
endpoint into a reflector; in-dialog requests go to the peer the INVITE came from (the phone, or the
proxy that Record-Routes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email
import email.policy
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiosipua import SipMessage, SipRequest, SipResponse, parse_address, parse_cseq
from prometheus_client import Counter

from gateway.audio import RationalResampler
from gateway.config import ConfigError
from gateway.transports.calls.phone_calls import CallError, PhoneCall, PhoneCalls
from gateway.transports.calls.workers import CallWorkers, tally
from gateway.transports.guard import is_loopback
from gateway.transports.playout import MediaClock, PlayoutQueue
from gateway.transports.sip import sdp
from gateway.transports.sip.guard import AllowList, Digest, InviteRate
from gateway.transports.sip.media import FRAME, RATE, PortPool, RtpStream

if TYPE_CHECKING:
    from gateway.config import SipConfig

log = logging.getLogger(__name__)

DROPPED = Counter("gateway_sip_dropped_total", "SIP messages dropped without an answer, by why", ["reason"])
T1, T2 = 0.5, 4.0  # RFC 3261's retransmission timers
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY, UPDATE"
USER_AGENT = "voice-gateway"
ENDED_KEPT_S = 32.0  # an ended call's dialog absorbs retransmissions this long (64 x T1)
MAX_ENDED = 4096
# Headers a webhook never carries (OpenAI leaves out the authorization ones too).
PRIVATE_HEADERS = frozenset({"authorization", "proxy-authorization"})
MAX_WEBHOOK_HEADERS = 64
CONTENT_LENGTH = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*(\d+)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
REASONS = {180: "Ringing", 200: "OK", 202: "Accepted", 302: "Moved Temporarily", 400: "Bad Request",
           401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           420: "Bad Extension", 480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist",
           486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here", 500: "Server Internal Error",
           503: "Service Unavailable", 603: "Decline"}


@dataclass
class Peer:
    """Where a message came from, and how to answer on the same way."""

    transport: str  # "UDP", "TCP" or "TLS"
    addr: tuple[str, int]
    send: Callable[[bytes], None]


def _sdp_body(content_type: str, body: bytes) -> str | None:
    """The SDP of an INVITE's body: the body itself (``application/sdp``, parameters allowed), or the SDP part
    of a ``multipart/mixed`` one (SIP-I carriers send SDP with ISUP); None when there is none."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/sdp":
        return body.decode("utf-8", "replace")
    if kind != "multipart/mixed":
        return None
    message = email.message_from_bytes(b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
                                       + body, policy=email.policy.compat32)
    for part in message.walk() if message.is_multipart() else ():
        if part.get_content_type() == "application/sdp":
            payload = part.get_payload(decode=True)
            return payload.decode("utf-8", "replace") if isinstance(payload, bytes) else None
    return None


def _tag(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return parse_address(value).tag
    except (ValueError, IndexError):
        return None


class SipLine:
    """One call's dialog and media: the ``Line`` of gateway.transports.calls.phone_calls."""

    kind = "sip"

    def __init__(self, endpoint: SipEndpoint, invite: SipRequest, peer: Peer, offer: sdp.Offer) -> None:
        self.endpoint = endpoint
        self.invite = invite
        self.peer = peer
        self.source = peer.addr[0]
        self.offer = offer
        # An INVITE without an offer (a delayed offer): ours goes in the 200 OK, the answer comes in the ACK.
        self.answer_in_ack = not invite.body.strip()
        self.call_id = invite.call_id or ""
        self.line_call_id = self.call_id
        self.branch = (invite.via[0].branch or "") if invite.via else ""
        self.remote_tag = _tag(invite.get_header("from"))
        self.local_tag = secrets.token_hex(6)
        self.headers = [(name, value) for name, values in invite.headers.items() if name.lower() not in PRIVATE_HEADERS
                        for value in values][:MAX_WEBHOOK_HEADERS]
        self.remote_target = invite.get_header("contact") or ""
        self.route_set = invite.get_header_values("record-route")
        self.cseq = 1
        self.playout = PlayoutQueue(RATE, FRAME, lambda: RationalResampler(1, 3))
        self.state = "early"  # "answered" once 200 OK went out, "ended"
        self.call: PhoneCall | None = None
        self.stream: RtpStream | None = None
        self.last_response: bytes | None = None
        self._retransmit: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._requests: dict[str, asyncio.Task[None]] = {}  # our requests' branches, repeated until answered
        self._sdp_session, self._sdp_version = secrets.randbelow(2**31), 0  # our SDP's o= (RFC 3264 §8)

    # --- the Line interface --------------------------------------------------------------------------

    async def answer(self, call: PhoneCall) -> None:
        if self.state != "early":
            raise CallError(404, f"Call '{call.id}' has ended.", "call_not_found")
        sockets = self.endpoint.ports.open()
        if sockets is None:
            raise CallError(503, "No RTP port is free ([sip] rtp_port_min..rtp_port_max).", "no_media_port")
        stream = RtpStream(self.offer, sockets, self.endpoint.options.jitter_ms / 1000, self.playout, self.source)
        try:
            await stream.start()
        except OSError as exc:
            stream.close()
            self.endpoint.ports.release(stream.port)
            raise CallError(503, f"The call's media cannot start: {exc}", "no_media_port") from None
        if self.state != "early":  # the caller cancelled meanwhile
            stream.close()
            self.endpoint.ports.release(stream.port)
            raise CallError(404, f"Call '{call.id}' has ended.", "call_not_found")
        self.stream = stream
        body = self._offer_sdp() if self.answer_in_ack else self._answer_sdp()
        self.state = "answered"
        self._respond(200, body=body, final=True)
        self.endpoint.clock.add(self, self._tick)
        self._reader = self.endpoint.spawn(self._read(stream, call))
        if self.answer_in_ack:
            log.info("call %s answered with our offer: RTP on %s:%d once the ACK answers it", call.id,
                     self.endpoint.host, stream.port)
        else:
            log.info("call %s answered: RTP %s:%d ↔ %s:%d (%s)", call.id, self.endpoint.host, stream.port,
                     *stream.remote, self.offer.codec)

    async def reject(self, status: int) -> None:
        if self.state == "early":
            self.state = "ended"
            self.endpoint.live.refresh()
            self._respond(status, final=True)

    async def refer(self, target: str) -> None:
        if self.state == "early":
            self.state = "ended"
            self.endpoint.live.refresh()
            self._respond(302, extra={"Contact": f"<{target}>"}, final=True)
        elif self.state == "answered":
            self._request("REFER", {"Refer-To": f"<{target}>", "Referred-By": f"<{self.endpoint.uri(self.peer)}>"})

    async def hang_up(self) -> None:
        if self.state == "answered":
            self._request("BYE")
        self._end()

    def _answer_sdp(self) -> bytes:
        assert self.stream is not None
        self._sdp_version += 1
        origin = (self._sdp_session, self._sdp_version)
        return sdp.answer(self.offer, self.endpoint.host, self.stream.port, origin).encode()

    def _offer_sdp(self) -> bytes:
        assert self.stream is not None
        self._sdp_version += 1
        return sdp.offer(self.endpoint.host, self.stream.port, (self._sdp_session, self._sdp_version)).encode()

    def _take_answer(self, ack: SipRequest) -> None:
        """The caller's answer to our offer, in the ACK of the 200 OK: the media starts. An ACK without a usable
        answer leaves the call with no media, so it is hung up (RFC 3261 §13.3.1.4)."""
        self.answer_in_ack = False
        text = _sdp_body(ack.content_type or "", ack.body)
        try:
            if text is None:
                raise sdp.OfferError("The ACK has no SDP answer to our offer.")
            self.offer = sdp.parse_offer(text)
        except sdp.OfferError as exc:
            log.info("call %s: %s Hanging up.", self.call.id if self.call else self.call_id, exc)
            self._request("BYE")
            self._end(caller=True)
            return
        if self.stream is not None:
            self.stream.use(self.offer)
            log.info("call %s: RTP %s:%d ↔ %s:%d (%s)", self.call.id if self.call else self.call_id,
                     self.endpoint.host, self.stream.port, *self.stream.remote, self.offer.codec)

    def _reoffer(self, request: SipRequest, peer: Peer) -> None:
        """A re-INVITE or UPDATE in the dialog: a hold or resume changes our direction, a refresh changes nothing
        (a new offer's address and codec are not followed: the media stays where it is)."""
        text = _sdp_body(request.content_type or "", request.body)
        if text is not None:
            with contextlib.suppress(sdp.OfferError):
                new = sdp.parse_offer(text)
                self.offer = dataclasses.replace(self.offer, lines=new.lines, index=new.index,
                                                 direction=new.direction)
                if self.stream is not None:
                    self.stream.sending = self.offer.we_send
        # An INVITE without an offer wants ours in the answer; an UPDATE without one, none (RFC 3311).
        wanted = text is not None or request.method.upper() == "INVITE"
        body = self._answer_sdp() if self.stream is not None and wanted else b""
        self.endpoint.respond(request, peer, 200, self.local_tag, body=body, contact=True)

    def send_dtmf(self, digits: str) -> bool:
        if self.stream is None or self.offer.dtmf_payload_type is None:
            return False
        self.stream.send_dtmf(digits)
        return True

    # --- requests from the peer --------------------------------------------------------------------------

    def received(self, request: SipRequest, peer: Peer) -> None:
        method = request.method.upper()
        if method == "INVITE":  # a retransmission (same branch) or a re-INVITE in the dialog
            if not _tag(request.get_header("to")):
                if self.last_response is not None:
                    self.peer.send(self.last_response)
            elif self.state == "answered":
                self._reoffer(request, peer)
            else:
                self.endpoint.respond(request, peer, 481)
        elif method == "UPDATE" and self.state == "answered":  # a session timer's refresh, or a new offer
            self._reoffer(request, peer)
        elif method == "OPTIONS":
            self.endpoint.respond(request, peer, 200, self.local_tag, extra={"Allow": ALLOW,
                                                                             "Accept": "application/sdp"})
        elif method == "ACK":
            if self._retransmit is not None:
                self._retransmit.cancel()
                self._retransmit = None
            if self.answer_in_ack and self.state == "answered":
                self._take_answer(request)
            self.endpoint.forget(self)  # a rejected call's transaction is over
        elif method == "BYE":
            self.endpoint.respond(request, peer, 200, self.local_tag)
            if self.state == "early":  # the INVITE gets its final answer too (RFC 3261 §15.2)
                self._respond(487, final=True)
            self._end(caller=True)
        elif method == "CANCEL":
            self.endpoint.respond(request, peer, 200, self.local_tag)
            if self.state == "early":
                self._respond(487, final=True)
                self._end(caller=True)
        elif method == "INFO":
            self.endpoint.respond(request, peer, 200, self.local_tag)
            key = _info_key(request)
            if key is not None and self.call is not None:
                self.endpoint.spawn(self.call.dtmf(key))
        elif method == "NOTIFY":  # the progress of our REFER (RFC 3515): its final 2xx ends our part
            self.endpoint.respond(request, peer, 200, self.local_tag)
            status = request.text.split(None, 2)
            if len(status) >= 2 and status[0] == "SIP/2.0" and status[1].startswith("2") and self.state == "answered":
                log.info("call %s transferred; hanging up", self.call.id if self.call else self.call_id)
                self._request("BYE")
                self._end(caller=True)  # the caller is the transfer target's now: the call and its session end
        else:
            self.endpoint.respond(request, peer, 405, self.local_tag, extra={"Allow": ALLOW})

    def response(self, message: SipResponse) -> None:
        """An answer to one of our requests: stop repeating it."""
        branch = (message.via[0].branch or "") if message.via else ""
        if message.status_code >= 200 and (task := self._requests.pop(branch, None)) is not None:
            task.cancel()
        if message.status_code >= 300:
            cseq = message.get_header("cseq") or ""
            log.info("call %s: our %s was refused (%d %s)", self.call.id if self.call else self.call_id,
                     cseq.split()[-1] if cseq else "request", message.status_code, message.reason_phrase)

    # --- inside ---------------------------------------------------------------------------------------------

    async def _read(self, stream: RtpStream, call: PhoneCall) -> None:
        """The caller's input, into the session as it arrives."""
        while not stream.closed:
            await stream.arrived.wait()
            stream.arrived.clear()
            try:
                pcm, keys = stream.take_input(time.monotonic())
                if call.runner is not None and pcm:
                    await call.runner.feed_audio(pcm)
                for key in keys:
                    await call.dtmf(key)
            except Exception:
                log.exception("call %s: its input failed", call.id)

    async def _tick(self, now: float) -> None:
        stream, call = self.stream, self.call
        if stream is None or call is None or stream.closed:
            return
        for kind, response_id in stream.tick(now):
            await call.playout_event(kind, response_id)
        if time.monotonic() - stream.last_heard > self.endpoint.options.media_timeout_s:
            log.info("call %s: no RTP for %g s ([sip] media_timeout_s), hanging up", call.id,
                     self.endpoint.options.media_timeout_s)
            await call.calls.hang_up(call)

    def _respond(self, status: int, body: bytes = b"", extra: dict[str, str] | None = None,
                 final: bool = False) -> None:
        data = self.endpoint.respond(self.invite, self.peer, status, self.local_tag if status > 100 else None,
                                     body=body, extra=extra, contact=status < 300)
        self.last_response = data
        if final:
            if self._retransmit is not None:
                self._retransmit.cancel()
            self._retransmit = asyncio.ensure_future(self._repeat_until_ack(data, status))

    async def _repeat_until_ack(self, data: bytes, status: int) -> None:
        """A final answer over UDP is repeated until its ACK (RFC 3261 §13.3.1.4, §17.2.1); over TCP only
        the wait for the ACK remains."""
        interval, waited, limit = T1, 0.0, self.endpoint.options.ack_timeout_s
        while waited < limit:
            await asyncio.sleep(min(interval, limit - waited))
            waited += interval
            if self.peer.transport == "UDP" and waited < limit:
                self.peer.send(data)
            interval = min(interval * 2, T2)
        self._retransmit = None
        if status < 300 and self.state == "answered":
            log.info("call %s: no ACK for the 200 OK in %g s ([sip] ack_timeout_s), hanging up",
                     self.call.id if self.call else self.call_id, limit)
            await self.hang_up()
            if self.call is not None:
                await self.call.ended()
        self.endpoint.forget(self)

    def _request(self, method: str, extra: dict[str, str] | None = None) -> None:
        self.cseq += 1
        branch = "z9hG4bK" + secrets.token_hex(8)
        request = SipRequest(method=method, uri=_uri_of(self.remote_target) or self.invite.uri)
        request.headers.append("Via", f"SIP/2.0/{self.peer.transport} {self.endpoint.sent_by(self.peer)};"
                                      f"branch={branch};rport")
        request.headers.append("Max-Forwards", "70")
        for route in self.route_set:
            request.headers.append("Route", route)
        request.headers.append("From", f"{self.invite.get_header('to')};tag={self.local_tag}")
        request.headers.append("To", self.invite.get_header("from") or "")
        request.headers.append("Call-ID", self.call_id)
        request.headers.append("CSeq", f"{self.cseq} {method}")
        request.headers.append("Contact", f"<{self.endpoint.uri(self.peer)}>")
        request.headers.append("User-Agent", USER_AGENT)
        for name, value in (extra or {}).items():
            request.headers.append(name, value)
        data = bytes(request)
        self.peer.send(data)
        if self.peer.transport == "UDP":
            self._requests[branch] = asyncio.ensure_future(self._repeat(data, branch))

    async def _repeat(self, data: bytes, branch: str) -> None:
        interval, waited = T1, 0.0
        while waited < 64 * T1:
            await asyncio.sleep(interval)
            waited += interval
            self.peer.send(data)
            interval = min(interval * 2, T2)
        self._requests.pop(branch, None)

    def _end(self, caller: bool = False) -> None:
        """The media stops and the call is told (``caller``: the far end ended it)."""
        if self.state == "ended" and self.stream is None:
            return
        self.state = "ended"
        self.endpoint.live.refresh()
        self.endpoint.clock.remove(self)
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        if self.stream is not None:
            self.stream.close()
            self.endpoint.ports.release(self.stream.port)
            self.stream = None
        if self._retransmit is not None and self._retransmit is not asyncio.current_task():
            self._retransmit.cancel()
            self._retransmit = None
        self.endpoint.forget(self)
        if caller and self.call is not None:
            self.endpoint.spawn(self.call.ended())

    def close(self) -> None:
        for task in self._requests.values():
            task.cancel()
        self._requests.clear()
        self._end()


def _uri_of(contact: str) -> str | None:
    try:
        return str(contact[contact.index("<") + 1 : contact.index(">")]) if "<" in contact else contact.split(";")[0]
    except ValueError:
        return None


def _info_key(request: SipRequest) -> str | None:
    """The key of a SIP INFO carrying application/dtmf-relay ("Signal=5") or application/dtmf ("5")."""
    kind = (request.content_type or "").lower()
    text = request.text.strip()
    if kind == "application/dtmf-relay":
        for line in text.splitlines():
            name, _, value = line.partition("=")
            if name.strip().lower() == "signal":
                return value.strip().upper()[:1] or None
    elif kind == "application/dtmf":
        return text.upper()[:1] or None
    return None


class SipEndpoint:
    """The SIP side of the gateway: its lines (calls) and what every request must pass first."""

    def __init__(self, calls: PhoneCalls, options: SipConfig, workers: CallWorkers | None = None) -> None:
        """``workers``: this process's place among ``serve --workers N`` (its RTP ports, the shared bounds)."""
        self.calls = calls
        self.options = options
        self.host = options.advertised_host or options.host
        if self.host in ("", "0.0.0.0", "::"):
            raise ConfigError("option sip.advertised_host: the SIP endpoint listens on every address, so it must be "
                              "told which one phones reach it at (an IP address)")
        slot, count = (workers.slot, workers.count) if workers is not None else (0, 1)
        self.ports = PortPool(options.host if options.host not in ("", "::") else "0.0.0.0", options.rtp_port_min,
                              options.rtp_port_max, slot, count)
        self.clock = MediaClock()
        self.allowed = AllowList(options.allowed_sources)
        self.digest: Digest | None = None
        if options.username:
            password = os.environ.get(options.password_env, "") if options.password_env else ""
            if not password:
                raise ConfigError(f"option sip.username needs the password in the environment variable "
                                  f"{options.password_env or '(sip.password_env is empty)'}")
            self.digest = Digest(options.realm, options.username, password)
        if not is_loopback(options.host) and self.allowed.any and self.digest is None:
            raise ConfigError("option sip.host: refusing to take calls on a non-loopback address from anyone: set "
                              "[sip] allowed_sources (the trunk's addresses) or username (digest authentication)")
        # Each worker takes its share of the gateway's INVITE rate; a source's rate holds in each worker.
        self.rate = InviteRate(options.invites_per_second / count, options.invites_per_second_per_source)
        self.lines: dict[str, SipLine] = {}  # by Call-ID
        # The calls up (not ended), by source, counted against [sip] max_calls across the workers.
        self.live = tally(workers, "sip_calls", lambda: (line.source for line in self.lines.values()
                                                         if line.state != "ended"))
        self._ended: OrderedDict[str, tuple[float, SipLine]] = OrderedDict()
        self.ports_by_transport: dict[str, int] = {}  # the port each transport listens on
        self._tasks: set[asyncio.Task[None]] = set()

    def uri(self, peer: Peer) -> str:
        transport = "" if peer.transport == "UDP" else f";transport={peer.transport.lower()}"
        return f"sip:gateway@{self.sent_by(peer)}{transport}"

    def sent_by(self, peer: Peer) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.ports_by_transport.get(peer.transport, self.options.port)}"

    # --- messages in -------------------------------------------------------------------------------------

    def received(self, data: bytes, peer: Peer) -> None:
        """A message from ``peer`` (its size already checked): answered, handed to its line, or dropped."""
        if not data.strip():
            return  # a keep-alive (RFC 5626 CRLF)
        head, _, body = data.partition(b"\r\n\r\n")
        declared = CONTENT_LENGTH.search(head)
        if declared is not None and int(declared[1]) > len(body):
            DROPPED.labels("malformed").inc()  # a datagram cut short (RFC 3261 §18.3: discarded)
            return
        try:
            message = SipMessage.parse(data)
            if isinstance(message, SipRequest):
                message.method.encode("ascii")
        except (ValueError, IndexError, UnicodeError):
            DROPPED.labels("malformed").inc()
            log.debug("malformed SIP message from %s:%d dropped", *peer.addr)
            return
        try:
            if isinstance(message, SipResponse):
                line = self.lines.get(message.call_id or "")
                if line is not None and self._from_line_peer(line, peer):
                    line.response(message)
                return
            self._request(message, peer)
        except (ValueError, IndexError, KeyError) as exc:  # a header too broken to act on
            DROPPED.labels("malformed").inc()
            log.debug("SIP %s from %s:%d dropped: %s", type(message).__name__, *peer.addr, exc)
        except Exception:  # a bug of ours: the message is lost, never the endpoint (one line per 10 s of them)
            DROPPED.labels("failed").inc()
            log.warning("a SIP message from %s:%d could not be handled", *peer.addr, exc_info=True)

    def _request(self, request: SipRequest, peer: Peer) -> None:
        method = request.method.upper()
        missing = [h for h in ("via", "from", "to", "call-id", "cseq") if not request.get_header(h)]
        if missing:
            if "via" in missing or method == "ACK":
                DROPPED.labels("malformed").inc()
                return
            self.respond(request, peer, 400, extra={"Warning": f'399 voice-gateway "missing {", ".join(missing)}"'})
            return
        parse_cseq(request.get_header("cseq") or "")
        if not self.allowed.allows(peer.addr[0]):
            if method != "ACK":
                self.respond(request, peer, 403)
            return
        call_id = request.call_id or ""
        line = self.lines.get(call_id) or self._ended_line(call_id)
        if line is not None and self._from_line_peer(line, peer):
            line.received(request, peer)
            return
        if method == "INVITE" and not _tag(request.get_header("to")):
            if call_id in self.lines:  # another peer's live dialog: taking it over would orphan that call
                self.respond(request, peer, 400, extra={"Warning": '399 voice-gateway "this Call-ID is in use"'})
                return
            self._invite(request, peer)
        elif method == "OPTIONS":
            self.respond(request, peer, 200, secrets.token_hex(6), extra={"Allow": ALLOW, "Accept": "application/sdp"})
        elif method == "ACK":
            return  # for a dialog we no longer hold: nothing to answer
        elif method in ("BYE", "CANCEL", "INFO", "NOTIFY", "INVITE"):
            self.respond(request, peer, 481)
        else:
            self.respond(request, peer, 405, extra={"Allow": ALLOW})

    def _invite(self, request: SipRequest, peer: Peer) -> None:
        source = peer.addr[0]
        if not self.rate.allow(source):
            DROPPED.labels("invite_rate").inc()
            return
        if self.digest is not None:
            verdict = self.digest.check(request.get_header("authorization"), "INVITE")
            if verdict != "ok":
                response = self._response(request, 401, secrets.token_hex(6))
                for challenge in self.digest.challenges(stale=verdict == "stale"):
                    response.headers.append("WWW-Authenticate", challenge)
                peer.send(bytes(response))
                return
        # Counted in now (the workers share these bounds): any refusal below counts it out again.
        full = self.live.admit(source, self.options.max_calls, self.options.max_calls_per_source)
        if full is not None and full.total:
            self.respond(request, peer, 503, extra={"Retry-After": "5"})
            return
        if full is not None:
            self.respond(request, peer, 486)
            return
        if required := [t.strip() for h in request.get_header_values("require") for t in h.split(",") if t.strip()]:
            # No extension is supported (reliable provisionals, session timers, ...): RFC 3261 §8.2.2.3.
            self.live.refresh()
            self.respond(request, peer, 420, extra={"Unsupported": ", ".join(required)[:200]})
            return
        offer = self._offer(request, peer)
        if offer is None:
            self.live.refresh()
            return
        if (refusal := self.calls.refusal(source, taking=True)) is not None:
            self.live.refresh()
            self.respond(request, peer, 486 if refusal.status == 429 else 503,
                         extra={"Retry-After": str(refusal.retry_after_s)})
            return
        line = SipLine(self, request, peer, offer)
        self.lines[line.call_id] = line
        line._respond(180)
        line.call = self.calls.incoming(line)

    def _offer(self, request: SipRequest, peer: Peer) -> sdp.Offer | None:
        """The INVITE's SDP offer (where it has none, the call awaiting the answer to ours), or None once it was
        refused (488, or the status the offer's fault has)."""
        text = _sdp_body(request.content_type or "", request.body)
        if text is None and not request.body.strip():
            return sdp.awaited(peer.addr[0])  # a delayed offer: ours goes in the 200 OK
        if text is None:
            self.respond(request, peer, 488, extra={"Warning": '399 voice-gateway "the body has no SDP offer"'})
            return None
        try:
            return sdp.parse_offer(text)
        except sdp.OfferError as exc:
            self.respond(request, peer, exc.status, extra={"Warning": f'399 voice-gateway "{str(exc)[:120]}"'})
            return None

    # --- messages out --------------------------------------------------------------------------------------

    def _response(self, request: SipRequest, status: int, to_tag: str | None = None) -> SipResponse:
        response = SipResponse(status_code=status, reason_phrase=REASONS.get(status, "Unknown"))
        for via in request.get_header_values("via"):
            response.headers.append("Via", via)
        response.headers.append("From", request.get_header("from") or "")
        to = request.get_header("to") or ""
        response.headers.append("To", to if to_tag is None or _tag(to) else f"{to};tag={to_tag}")
        response.headers.append("Call-ID", request.call_id or "")
        response.headers.append("CSeq", request.get_header("cseq") or "")
        response.headers.append("Server", USER_AGENT)
        return response

    def respond(self, request: SipRequest, peer: Peer, status: int, to_tag: str | None = None, body: bytes = b"",
                extra: dict[str, str] | None = None, contact: bool = False) -> bytes:
        response = self._response(request, status, to_tag)
        if contact and status >= 101:
            response.headers.append("Contact", f"<{self.uri(peer)}>")
        if status == 200 and request.method.upper() == "INVITE":
            response.headers.append("Allow", ALLOW)
            for route in request.get_header_values("record-route"):
                response.headers.append("Record-Route", route)
        for name, value in (extra or {}).items():
            response.headers.append(name, value)
        if body:
            response.headers.append("Content-Type", "application/sdp")
            response.body = body
        data = bytes(response)
        peer.send(data)
        return data

    # --- lines ------------------------------------------------------------------------------------------------

    def _from_line_peer(self, line: SipLine, peer: Peer) -> bool:
        """A dialog's requests and answers come from the address its INVITE came from."""
        return peer.addr[0] == line.peer.addr[0]

    def _ended_line(self, call_id: str) -> SipLine | None:
        now = time.monotonic()
        while self._ended and next(iter(self._ended.values()))[0] < now:
            self._ended.popitem(last=False)
        entry = self._ended.get(call_id)
        return entry[1] if entry is not None else None

    def forget(self, line: SipLine) -> None:
        """The line's call ended: it no longer counts, but absorbs retransmissions for a while."""
        if self.lines.get(line.call_id) is line and line.state == "ended" and line._retransmit is None:
            del self.lines[line.call_id]
            self._ended[line.call_id] = (time.monotonic() + ENDED_KEPT_S, line)
            while len(self._ended) > MAX_ENDED:
                self._ended.popitem(last=False)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        for line in list(self.lines.values()):
            if line.state == "answered":
                line._request("BYE")
            elif line.state == "early":
                line._respond(503)
            line.close()
        await self.clock.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

