"""The WebRTC transport's media and calls: Opus audio tracks, events on the ``oai-events`` channel.

The signalling (POST an SDP offer, get the answer) is HTTP on the gateway's own port
(gateway/transports/webrtc/signalling.py). Each call is one Session with ``server_playout``: the microphone track
feeds the same session logic and VAD as the WebSocket path, the data channel carries the same JSON
events, and the agent's audio goes out on a paced outbound track that knows how much of each item it
has played, so barge-in truncates at the point the listener actually reached.

A call is pending from its answer until its peer connection is up: pending calls are limited by
``[webrtc] max_pending_calls`` in all and ``max_pending_calls_per_client`` for one client address (so one
client's unconnected offers cannot lock out the others), and dropped after ``connect_timeout_s``, apart
from ``[server] max_sessions``, which counts a call only once it is connected. A refusal says when to try
again: when the oldest of the pending calls in the way is dropped.

An offer is checked before aiortc gets it (``sdp_problem``): aiortc accepts an offer without a DTLS
fingerprint, with an ICE password too short to be one or with a BUNDLE group naming a section it lacks, and
fails later in a task of its own.

Behind a balancer the answer names this node: ``[webrtc] advertised_host`` replaces the address of its
host candidates (aiortc binds the interfaces' own addresses, private ones in a pod or behind 1:1 NAT), and
``ice_servers`` adds a TURN relay's candidates for clients that cannot reach the node over UDP.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import re
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer
from aiortc.sdp import SessionDescription

from gateway.audio import Upsampler2x
from gateway.config import ConfigError
from gateway.live.session import LiveSession
from gateway.realtime.session import Session
from gateway.runtime.gateway import Refusal
from gateway.transports.playout import PlayoutQueue
from gateway.transports.sideband import Sideband
from gateway.transports.webrtc.call_base import WebRTCCall, has_media
from gateway.transports.webrtc.live_calls import LiveCall
from gateway.transports.webrtc.media import FRAME_SAMPLES, RTC_RATE, PacedTrack

if TYPE_CHECKING:
    from gateway.runtime.gateway import Gateway
    from gateway.runtime.session_runner import SessionRunner

log = logging.getLogger(__name__)

# Audio a response queues before its playout starts (or resumes after running dry): one frame, so
# a producer at real-time pace whose chunks land just after a frame went out does not run dry at
# the next one; a first chunk of 20 ms or more still starts at once.
CUSHION_SAMPLES = FRAME_SAMPLES

Notify = Callable[[str, str], Awaitable[None]]


class WebRTCOptions(Protocol):
    """The ``[webrtc]`` config section (gateway.config.WebRtcConfig)."""

    max_pending_calls: int
    max_pending_calls_per_client: int
    connect_timeout_s: float
    ice_servers: str
    turn_username: str
    turn_credential_env: str
    jitter_prefetch: int
    advertised_host: str


# --- outbound audio: the server-side playout buffer ---------------------------------------------


class OutboundAudio(PacedTrack):
    """The agent's voice: response audio queued by the session (gateway.transports.playout), upsampled
    24 → 48 kHz and sent in real-time 20 ms frames; silence when nothing is queued. Reports
    output_audio_buffer.started / .stopped through ``notify``."""

    def __init__(self, notify: Notify) -> None:
        super().__init__()
        self._notify = notify
        self.queue = PlayoutQueue(RTC_RATE, FRAME_SAMPLES, Upsampler2x, CUSHION_SAMPLES)

    # Playout interface, called by the runner ---------------------------------------------------

    def play(self, response_id: str, item_id: str, pcm: bytes) -> None:
        self.queue.play(response_id, item_id, pcm)

    def clear(self) -> tuple[str, float] | None:
        return self.queue.clear()

    def finished(self, response_id: str) -> None:
        self.queue.finished(response_id)

    @property
    def underruns(self) -> int:
        return self.queue.underruns

    # MediaStreamTrack -----------------------------------------------------------------------------

    async def next_frame(self) -> np.ndarray:
        samples, events = self.queue.take()
        for kind, response_id in events:
            await self._notify(kind, response_id)
        return samples


# --- one call -------------------------------------------------------------------------------------


def _weakly(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """``method`` called through a weak reference to its object (nothing once the object is gone)."""
    ref = weakref.WeakMethod(method)

    async def call(*args: object) -> None:
        if (bound := ref()) is not None:
            await bound(*args)
    return call


class Call(WebRTCCall):
    """A Realtime call: the session's events also go to its sideband connections, and its playout reports what
    the listener heard."""

    playout: OutboundAudio
    runner: SessionRunner

    def __init__(self, registry: CallRegistry, session: Session, client: str) -> None:
        super().__init__("rtc_" + secrets.token_hex(12), registry, client)
        self.session = session
        # Its parts call back through weak references: like the listeners `close` takes off, strong ones would
        # keep a call that ends until the collector runs.
        self.playout = OutboundAudio(_weakly(self._on_playout))
        self.runner = registry.gateway.new_runner(session, _weakly(self._send), self.playout)
        self.sideband = Sideband()  # wss://.../v1/realtime?call_id=... connections to this call

    async def answer(self, offer_sdp: str) -> str:
        if not has_media(offer_sdp, "audio"):
            # A text-only client (a data channel and no audio): replies in text, nothing to play.
            self.runner.playout = None
            self.session.settings = replace(self.session.settings, modalities=["text"])
            self.session.text_only = True
        return await super().answer(offer_sdp)

    async def _start(self) -> None:
        await self.runner.start()  # session.created

    async def _session_closed(self) -> None:
        await self.sideband.close()

    def _log_closed(self) -> None:
        log.info("call %s closed (%d playout underruns)", self.id, self.playout.underruns)

    async def _on_playout(self, kind: str, response_id: str) -> None:
        if kind == "output_audio_buffer.started":
            await self.runner.playout_started(response_id)
        else:
            await self.runner.playout_stopped(response_id)

    async def _send(self, text: str) -> None:
        await super()._send(text)
        await self.sideband.send(text)


# --- offers ----------------------------------------------------------------------------------------

# Hash functions of a DTLS fingerprint aiortc can check the peer's certificate against (RFC 8122).
FINGERPRINT_HASHES = ("sha-256", "sha-384", "sha-512")
_FINGERPRINT = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){19,63}$")
# RFC 8839: ice-ufrag is 4 to 256 characters, ice-pwd 22 to 256.
ICE_UFRAG_CHARS, ICE_PWD_CHARS = (4, 256), (22, 256)


def sdp_problem(sdp: str) -> str | None:
    """What makes an SDP offer unusable for a peer connection, in words (HTTP 400), or None. aiortc takes
    some of these and fails later, in a task nobody awaits (a missing fingerprint: an AssertionError)."""
    try:
        description = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser fails as it may: a bare AssertionError on a cut m= or c= line,
        # StopIteration on an a=fmtp without its a=rtpmap, ValueError or KeyError on a malformed attribute
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return f"The SDP offer cannot be used: it does not parse ({detail}); check its m=, c= and a= lines."
    if not description.media:
        return "The offer has no media: it needs an audio track (m=audio) and/or a data channel (m=application)."
    # aiortc bundles every section onto the transport of the group's first mid, and onto None when no
    # section has it: the call then fails, and so does its close, in tasks of aiortc's own.
    mids = {media.rtp.muxId for media in description.media}
    for group in description.group:
        missing = [mid for mid in group.items if mid not in mids] if group.semantic == "BUNDLE" else []
        if missing:
            return (f"The offer's BUNDLE group (a=group:BUNDLE) names mid {missing[0]!r}, which no media section "
                    "has (a=mid).")
    for index, media in enumerate(description.media):
        where = f"media section {index} (m={media.kind})"
        if media.dtls is None or not media.dtls.fingerprints:  # aiortc drops both without an a=setup
            return f"The offer has no DTLS fingerprint and role (a=fingerprint, a=setup) for {where}."
        if not any(f.algorithm.lower() in FINGERPRINT_HASHES and _FINGERPRINT.match(f.value)
                   for f in media.dtls.fingerprints):
            return (f"The offer's DTLS fingerprint for {where} is not a {', '.join(FINGERPRINT_HASHES)} hash "
                    "(a=fingerprint:sha-256 AB:CD:...).")
        ufrag, pwd = media.ice.usernameFragment or "", media.ice.password or ""
        if not ICE_UFRAG_CHARS[0] <= len(ufrag) <= ICE_UFRAG_CHARS[1]:
            return f"The offer's ICE username fragment (a=ice-ufrag) for {where} is missing or not 4-256 characters."
        if not ICE_PWD_CHARS[0] <= len(pwd) <= ICE_PWD_CHARS[1]:
            return f"The offer's ICE password (a=ice-pwd) for {where} is missing or not 22-256 characters."
    return None


# --- the calls -------------------------------------------------------------------------------------


# a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ host ...
_HOST_CANDIDATE = re.compile(r"^(a=candidate:\S+ \d+ \S+ \d+ )(\S+)( \d+ typ host(?: .*)?)$")
_CONNECTION = re.compile(r"^c=IN IP([46]) (\S+)$")


def _ip_version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None  # an mDNS name


def advertise(sdp: str, address: str) -> str:
    """``sdp`` with ``address`` in place of its host candidates' own (and in the c= lines that named one),
    for those of the same IP version; ports, and reflexive and relay candidates, stay as they are."""
    version = ipaddress.ip_address(address).version
    lines = sdp.split("\r\n")
    replaced = set()
    for i, line in enumerate(lines):
        match = _HOST_CANDIDATE.match(line)
        if match and _ip_version(match[2]) == version:
            replaced.add(match[2])
            lines[i] = match[1] + address + match[3]
    for i, line in enumerate(lines):
        match = _CONNECTION.match(line)
        if match and match[2] in replaced:
            lines[i] = f"c=IN IP{match[1]} {address}"
    return "\r\n".join(lines)


async def resolve_advertised(host: str) -> str | None:
    """The address ``[webrtc] advertised_host`` names (IPv4 first), None when unset. A name is resolved at
    each call, so a DNS change needs no restart."""
    if not host:
        return None
    if _ip_version(host) is not None:
        return host
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise ConfigError(f"[webrtc] advertised_host {host!r} does not resolve: {exc}") from None
    addresses = [str(info[4][0]) for info in infos]
    return next((a for a in addresses if _ip_version(a) == 4), addresses[0])


def ice_configuration(options: WebRTCOptions) -> RTCConfiguration:
    """No ICE server unless configured: aiortc's default (Google STUN) is unreachable offline, and host
    candidates are enough on loopback and a LAN."""
    urls = [u.strip() for u in options.ice_servers.split(",") if u.strip()]
    credential = os.environ.get(options.turn_credential_env, "") if options.turn_credential_env else ""
    servers = [
        RTCIceServer(urls=url, username=options.turn_username or None, credential=credential or None)
        if url.startswith(("turn:", "turns:"))
        else RTCIceServer(urls=url)
        for url in urls
    ]
    return RTCConfiguration(iceServers=servers)


class CallRegistry:
    """The gateway's calls, pending and connected."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.options: WebRTCOptions = gateway.config.webrtc
        self.rtc_configuration = ice_configuration(self.options)
        self.calls: dict[str, Call | LiveCall] = {}
        self._background: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        return sum(not call.connected for call in self.calls.values())

    def pending_of(self, owner: str | None) -> int:
        """The calls still connecting that a session's ``owner`` (a client secret's id) opened."""
        return sum(not call.connected and call.runner.owner == owner for call in self.calls.values())

    def unavailable(self, client: str) -> Refusal | None:
        """Why no call from ``client`` (its address) can start now (HTTP 503, or 429 for this client's own
        pending calls), or None."""
        if (refusal := self.gateway.unavailable()) is not None:
            return refusal
        pending = [call for call in self.calls.values() if not call.connected]
        options = self.options
        mine = [call for call in pending if call.client == client]
        if len(mine) >= options.max_pending_calls_per_client:
            return Refusal("too_many_pending_calls", "This client has too many calls waiting to connect ([webrtc] "
                           "max_pending_calls_per_client).", self._retry_after(mine), 429)
        if len(pending) >= options.max_pending_calls:
            return Refusal("too_many_pending_calls", "Too many calls waiting to connect ([webrtc] "
                           "max_pending_calls).", self._retry_after(pending))
        return None

    def offer_problem(self, sdp: str) -> str | None:
        """What makes ``sdp`` unusable for a call (``sdp_problem``), for the signalling, which cannot import
        this module (aiortc is an optional extra)."""
        return sdp_problem(sdp)

    def _retry_after(self, pending: list[Call | LiveCall]) -> int:
        """Seconds until the oldest of ``pending`` is dropped for not connecting (the room a retry needs)."""
        oldest = min(call.created for call in pending)
        return max(1, math.ceil(oldest + self.options.connect_timeout_s - time.monotonic()))

    async def answer(self, session: Session, offer_sdp: str, client: str) -> tuple[Call, str]:
        """A new call from ``client`` for ``session`` and the SDP answer to ``offer_sdp``, naming the
        advertised address; aiortc's error if it cannot use the offer, ConfigError if that address cannot be
        found."""
        call = Call(self, session, client)
        return call, await self._answer(call, offer_sdp)

    async def answer_live(self, session: LiveSession, offer_sdp: str, client: str,
                          started: list[Any]) -> tuple[LiveCall, str]:
        """A new GPT-Live call from ``client`` for ``session`` (``started``: its start's effects, sent once its data
        channel opens) and the SDP answer, as ``answer``."""
        call = LiveCall(self, session, client, started)
        return call, await self._answer(call, offer_sdp)

    async def _answer(self, call: WebRTCCall, offer_sdp: str) -> str:
        """``call``, registered, answers ``offer_sdp`` from the advertised address; it is closed if it cannot."""
        self.calls[call.id] = call
        try:
            address = await resolve_advertised(self.options.advertised_host)
            answer = await call.answer(offer_sdp)
            return advertise(answer, address) if address is not None else answer
        except BaseException:
            await call.close()
            raise

    def sideband_call(self, call_id: str) -> Call | None:
        """A connected Realtime call, for a sideband to attach to (a Live call's sideband is Live's own)."""
        call = self.calls.get(call_id)
        return call if isinstance(call, Call) and call.connected else None

    async def hang_up(self, call_id: str) -> bool:
        """End call ``call_id`` from the server's side (POST /v1/realtime/calls/{id}/hangup); False if none."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        await call.close()
        return True

    def connected(self, call: Call | LiveCall) -> None:
        """The call's peer connection is up: from now on it is a session, counted in max_sessions."""
        call.connected = True
        # Offers of one secret that came at once were each let through: the one that would go past stops here.
        why = self.gateway.secret_refusal(call.runner.owner)
        if why is not None or (refusal := self.gateway.admit()) is not None:
            log.info("call %s connected but refused (%s), closing", call.id, why or refusal.message)
            call.close_soon(client_gone=False)
            return
        self.gateway.opened(call.runner, f"WebRTC call {call.id}", call.close)

    async def close_pending(self) -> None:
        """Hang up the calls not connected yet (a draining gateway's: they hold no conversation)."""
        await asyncio.gather(*(call.close() for call in list(self.calls.values()) if not call.connected))

    async def stop(self) -> None:
        await asyncio.gather(*(call.close() for call in list(self.calls.values())))
        await asyncio.gather(*self._background, return_exceptions=True)

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        # Retrieved here, so that no failure is left for the loop to report as "never retrieved".
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("closing a call failed", exc_info=exc)
