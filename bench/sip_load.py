"""The load side of phone calls: the gateway suite's sessions as SIP calls, G.711 µ-law at 8 kHz over RTP
(``python -m bench gateway --protocol sip``).

Each call is a minimal user agent client in a load-generator process of bench/load.py's Pool, beside the other
calls of its share on the process's one event loop, whose lag it reports as the WebSocket sessions do. Written
here rather than run as phones (bench/phones.py's baresip is a process per call: right for a latency trial, not
for a thousand calls): aiosipua's UAC (the library the gateway parses SIP with: dialogs, the ACK) on a UDP
socket of the call's own for its signalling (a gateway of several workers gets each call's INVITE in the worker
the kernel picks by source address and port: every call has its own), and one for its RTP (an even port, the
next one bound as RTCP's so that the gateway's reports reach no other call).

- INVITE with an SDP offer (PCMU/8000, telephone-event), CONNECT_LEAD_S before the call's start, repeated over
  UDP (RFC 3261's timer A) until the gateway answers; 180, then 200 OK (aiosipua ACKs it). A call answered after
  its start is a late start; one refused or not answered within TIMER_B_S is unanswered: either makes the level
  invalid (bench/validity.py).
- From its start, the scenario's audio (bench/load.py's, resampled to 8 kHz by the gateway's own resampler and
  µ-law encoded, once per process) in 20 ms packets on a real-time clock (sequence number, timestamp and SSRC
  as RFC 3550 has them), how late each went out noted; then silence, as an open microphone sends, until the last
  turn's answer has been heard and has ended (QUIET_S of silence) or END_WAIT_S has passed (a reply still
  going: the caller hangs up on it); then BYE, repeated until its 200 OK.
- The gateway's RTP is taken as it arrives: a packet is audible when a decoded sample is over SILENT (the
  gateway's silence between replies is µ-law's zero), each sample heard at its packet's arrival plus its place
  in the packet. The agent's speech is in runs of audible samples apart by more than GAP_MS of silence, as the
  caller's turns are (a 20 ms packet falls quiet between words: that is no end of a reply).

A phone has no response.cancel: the pipeline scenario's turn 2 reply plays to its end (as GPT-Live's sessions
play it, bench/live_load.py), and the caller talking over turn 1's reply (the barge-in) is the scenario's cut.
What each call measures on the phone's clock, as bench/live_load.py times Live:

- end of speech → first audio (``end_to_audio_ms``): the end of the turn's speech in the audio sent → the first
  audible sample heard after it (a stopwatch's figure: the VAD's silence is in it);
- barge-in: the speech start of the turn that talks over a reply → the last audible sample of that reply (the
  agent's audio stops arriving: silence follows);
- audio errors: RTP from another address than the SDP answer's, a packet missing or out of order in the
  gateway's stream (sequence numbers and timestamps), another SSRC, a packet that is not 20 ms of PCMU, a turn
  with no answer heard, the gateway hanging up first, a BYE not answered.

With the gateway's trace (``join``: a phone call's records name its SIP Call-ID, gateway/runtime/trace.py), what
Realtime sessions time by their events: VAD late (the turn's speech_stopped on the host's monotonic clock, less
when the packet that completed the silence was due: t0 + audio_end_ms + the silence) and stop → first audio
(speech_stopped → the first audible sample heard: the wait for the gateway's next 20 ms media tick is in it).
"""

from __future__ import annotations

import asyncio
import random
import re
import resource
import socket
import struct
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

import numpy as np

from bench.live_load import GAP_MS, SILENT, answers, barge_ins, nearest, speech_spans
from bench.load import CONNECT_LEAD_S, Pool, Sessions, arrivals, scenario, spread_over
from bench.stats import lag_probe, pct
from gateway.audio import RationalResampler, ulaw_decode, ulaw_encode
from gateway.transports.sip import rtp

RATE = 8000
FRAME = 160  # 20 ms at 8 kHz: one packet's payload
PACKET_S = 0.02
PCMU, TELEPHONE_EVENT = 0, 101
ULAW_SILENCE = b"\xff" * FRAME  # µ-law's zero
# A µ-law byte that decodes over SILENT: a packet's first and last audible samples are found by a regular
# expression (in C) rather than by decoding each of the fifty packets a second a call brings.
LOUD_BYTE = re.compile(b"[" + b"".join(re.escape(bytes([code])) for code in range(256)
                                       if abs(int(ulaw_decode(bytes([code]))[0])) > SILENT) + b"]")
HEADER = struct.Struct("!BBHII")  # RTP's fixed header: what the gateway sends, no CSRC or extension
T1, T2 = 0.5, 4.0  # RFC 3261's retransmission timers
TIMER_B_S = 32.0  # 64 x T1: an INVITE unanswered this long has failed
BYE_WAIT_S = 8.0
QUIET_S = 1.0  # silence after the last turn's answer that ends the call
END_WAIT_S = 15.0  # after the audio: the last answer's tail
# Every 20 ms the gateway's media clock sends each call a packet in the same instant, and a process takes its
# calls' packets one after the other: some 25 µs each on a shared 2-core VM (the receive, and the sendto of the
# call's own packet, are most of it), so 100 calls hold its loop 2.5 ms, within the 5 ms its lag P99 may reach.
CALLS_PER_PROCESS = 100
RTP_PORT_MIN = 20000  # the gateway's RTP ports: below Linux's ephemeral range, where the calls' own ports are


def gateway_settings(port: int, calls: int) -> dict[str, Any]:
    """[sip] and [calls] for a level of ``calls`` calls from this one host: no webhook (the default session answers
    every call), every bound on calls in all and per source, pending or answered, and on INVITEs per second raised
    to the level's size (aligned arrivals send every INVITE in one instant; the rate's burst is a second's worth),
    and RTP ports for twice that many calls."""
    most = max(100, calls)
    return {"sip.enabled": True, "sip.port": port, "sip.max_calls": most, "sip.max_calls_per_source": most,
            "sip.invites_per_second": most, "sip.invites_per_second_per_source": most,
            "sip.rtp_port_min": RTP_PORT_MIN, "sip.rtp_port_max": min(65535, RTP_PORT_MIN + 4 * most),
            "calls.max_pending_calls": most, "calls.max_pending_calls_per_source": most}


def phone_audio(pcm: bytes) -> bytes:
    """pcm16 24 kHz as a phone sends it: 8 kHz µ-law, in whole packets."""
    down = RationalResampler(1, 3)
    samples = np.concatenate([down.process(np.frombuffer(pcm, np.int16)), down.flush()])
    ulaw = ulaw_encode(samples)
    return ulaw + ULAW_SILENCE[: -len(ulaw) % FRAME]


def spans_of(ulaw: bytes) -> list[tuple[float, float]]:
    """Where the turns' speech is in µ-law audio (ms), as bench/live_load.py finds it in pcm."""
    return speech_spans(ulaw_decode(ulaw).tobytes(), rate=RATE)


def rtp_pair() -> tuple[socket.socket, socket.socket]:
    """Two bound UDP sockets on loopback: RTP on an even port, RTCP on the next."""
    for _ in range(200):
        first = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        if port % 2 == 0:
            second = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                second.close()
            else:
                first.setblocking(False)
                return first, second
        first.close()
    raise OSError("no free pair of UDP ports for RTP and RTCP")


class Media(asyncio.DatagramProtocol):
    """The gateway's RTP as the phone hears it: its runs of audible audio, and what was wrong with the stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.DatagramTransport | None = None
        self.source: tuple[str, int] | None = None  # the first packet's: the SDP answer's, checked once known
        self.runs: list[list[float]] = []  # [first, past the last] audible sample of each run (loop time)
        self._last: tuple[int, int, int] | None = None  # (sequence, timestamp, SSRC) of the last packet
        self.foreign = self.broken = self.malformed = self.packets = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        now = self.loop.time()
        if self.source is None:
            self.source = addr
        elif addr != self.source:
            self.foreign += 1
            return
        if len(data) != HEADER.size + FRAME or data[0] != 0x80 or data[1] & 0x7F != PCMU:
            self.malformed += 1
            return
        self.packets += 1
        _, _, sequence, timestamp, ssrc = HEADER.unpack_from(data)
        if self._last is not None and (sequence, timestamp, ssrc) != (
                (self._last[0] + 1) & 0xFFFF, (self._last[1] + FRAME) & 0xFFFFFFFF, self._last[2]):
            self.broken += 1
        self._last = (sequence, timestamp, ssrc)
        if data.endswith(ULAW_SILENCE) or (loud := LOUD_BYTE.search(data, HEADER.size)) is None:
            return
        last = FRAME - LOUD_BYTE.search(data[: HEADER.size - 1 : -1]).start()  # type: ignore[union-attr]
        first, last = now + (loud.start() - HEADER.size) / RATE, now + last / RATE
        if self.runs and first - self.runs[-1][1] <= GAP_MS / 1000:
            self.runs[-1][1] = last
        else:
            self.runs.append([first, last])

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP error for a packet sent before the gateway's port was open, or after it closed

    def errors(self, answer: tuple[str, int]) -> list[str]:
        out = []
        if self.source is not None and self.source != answer:
            out.append(f"RTP from {self.source[0]}:{self.source[1]}, not the SDP answer's {answer[0]}:{answer[1]}")
        if self.foreign:
            out.append(f"{self.foreign} RTP packets from another source")
        if self.broken:
            out.append(f"{self.broken} breaks in the gateway's RTP stream (a packet lost or out of order)")
        if self.malformed:
            out.append(f"{self.malformed} packets not 20 ms of PCMU in plain RTP")
        return out


def _signalling() -> Any:
    """A SIP transport of aiosipua's kind on a UDP socket of its own (its own class binds one and cannot say on
    which port)."""
    from aiosipua import SipTransport  # the load generator's processes only

    class Signalling(SipTransport, asyncio.DatagramProtocol):
        def __init__(self) -> None:
            self.udp: asyncio.DatagramTransport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.udp = transport  # type: ignore[assignment]
            self.local_addr = transport.get_extra_info("sockname")[:2]

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
            self._dispatch(data, (str(addr[0]), int(addr[1])))

        def error_received(self, exc: Exception) -> None:
            pass

        def send(self, message: Any, addr: tuple[str, int]) -> None:
            self.sendto(bytes(message), addr)

        def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
            if self.udp is not None and not self.udp.is_closing():
                self.udp.sendto(data, addr)

    return Signalling()


async def _repeat(signalling: Any, data: bytes, addr: tuple[str, int], answered: asyncio.Event, limit: float,
                  ) -> bool:
    """Send a request again (doubling from T1 up to T2) until ``answered`` or ``limit`` seconds: UDP may lose it."""
    interval, waited = T1, 0.0
    while waited < limit:
        try:
            await asyncio.wait_for(answered.wait(), min(interval, limit - waited))
            return True
        except TimeoutError:
            waited += interval
            signalling.sendto(data, addr)
            interval = min(interval * 2, T2)
    return answered.is_set()


async def phone_call(gateway: tuple[str, int], payloads: list[bytes], spans: list[tuple[float, float]],
                     start_at: float, result: Sessions) -> None:
    """One call: INVITE CONNECT_LEAD_S before ``start_at`` (loop time), the audio from then, BYE at the end."""
    from aiosipua import SipRequest, SipResponse, SipUAC, build_sdp

    loop = asyncio.get_running_loop()
    await asyncio.sleep(start_at - CONNECT_LEAD_S - loop.time())
    rtp_socket, rtcp_socket = rtp_pair()
    media = Media(loop)
    rtp_out, _ = await loop.create_datagram_endpoint(lambda: media, sock=rtp_socket)
    signalling = _signalling()
    await loop.create_datagram_endpoint(lambda: signalling, local_addr=("127.0.0.1", 0))
    uac = SipUAC(signalling)
    responded, bye_answered, hung_up = asyncio.Event(), asyncio.Event(), asyncio.Event()
    microphone: Microphone | None = None

    def received(message: SipRequest | SipResponse, addr: tuple[str, int]) -> None:
        if isinstance(message, SipResponse):
            uac.handle_response(message, addr)
            method = message.cseq.method.upper() if message.cseq else ""
            if method == "INVITE":
                responded.set()
            elif method == "BYE" and message.status_code >= 200:
                bye_answered.set()
        elif message.method.upper() == "BYE":  # the gateway hangs up
            answer = SipResponse(status_code=200, reason_phrase="OK")
            for via in message.get_header_values("via"):
                answer.headers.append("Via", via)
            for name in ("From", "To", "Call-ID", "CSeq"):
                answer.headers.append(name, message.get_header(name) or "")
            signalling.send(answer, addr)
            hung_up.set()
            if microphone is not None:
                microphone.stop()

    signalling.on_message = received
    host, port = signalling.local_addr
    offer = build_sdp("127.0.0.1", rtp_socket.getsockname()[1], PCMU, "PCMU", dtmf_payload_type=TELEPHONE_EVENT)
    call = uac.send_invite(f"sip:phone@{host}:{port}", f"sip:agent@{gateway[0]}:{gateway[1]}", gateway, offer)
    repeating = asyncio.create_task(_repeat(signalling, bytes(call.invite), gateway, responded, TIMER_B_S))
    try:
        try:
            await call.wait_answered(TIMER_B_S)
        except (TimeoutError, RuntimeError) as exc:  # no answer, or a refusal (486 Busy Here, 503, ...)
            result.unanswered.append(str(exc))
            return
        finally:
            repeating.cancel()
        answer = call.sdp_answer.audio if call.sdp_answer is not None else None
        connection = (answer and answer.connection) or (call.sdp_answer and call.sdp_answer.connection)
        if answer is None or connection is None:
            result.unanswered.append("a 200 OK without an SDP answer")
            return
        remote = (connection.address, answer.port)
        if loop.time() > start_at:
            result.late_starts += 1
        t0 = max(start_at, loop.time())
        microphone = Microphone(rtp_out, remote, payloads, spans, t0, media, result)
        if why := await microphone.done:
            result.audio_errors.append(f"{call.call_id}: {why}")
        if hung_up.is_set():
            result.audio_errors.append(f"{call.call_id}: the gateway hung up first")
        else:
            bye = uac.send_bye(call.dialog, gateway)
            if not await _repeat(signalling, bytes(bye), gateway, bye_answered, BYE_WAIT_S):
                result.audio_errors.append(f"{call.call_id}: BYE not answered in {BYE_WAIT_S:g} s")
    finally:
        rtp_out.close()
        rtcp_socket.close()
        signalling.udp.close()
    result.audio_errors += [f"{call.call_id}: {error}" for error in media.errors(remote)]
    heard = answers(spans, t0, [first for first, _ in media.runs])
    result.end_to_audio_ms += heard.values()
    result.barge_in_ms += barge_ins(spans, t0, [(first, last) for first, last in media.runs])
    if len(heard) < len(spans):
        result.audio_errors.append(f"{call.call_id}: {len(heard)} of {len(spans)} turns answered")
    result.sip_calls.append({"line_call_id": call.call_id, "t0_ms": t0 * 1000, "spans": spans,
                             "heard_ms": {k: t0 * 1000 + spans[k][1] + ms for k, ms in heard.items()}})


class Microphone:
    """The call's audio from ``t0`` (loop time) on a real-time clock, then silence until the last turn's answer has
    been heard and has ended: a timer callback a packet (``done`` when it stops), not a task woken for each, as
    fifty packets a second a call are most of the load side's work."""

    def __init__(self, out: asyncio.DatagramTransport, remote: tuple[str, int], payloads: list[bytes],
                 spans: list[tuple[float, float]], t0: float, media: Media, result: Sessions) -> None:
        self.loop = asyncio.get_running_loop()
        self.out, self.remote, self.payloads, self.spans, self.t0 = out, remote, payloads, spans, t0
        self.media, self.result = media, result
        self.ssrc, self.sequence = random.getrandbits(32), random.getrandbits(16)
        self.timestamp = random.getrandbits(32)
        self.sent = 0
        self.done: asyncio.Future[str] = self.loop.create_future()  # why it stopped: "" when the call is over
        self.loop.call_at(t0, self._send)

    def _send(self) -> None:
        if self.done.done():  # the gateway hung up
            return
        i, now = self.sent, self.loop.time()
        due = self.t0 + i * PACKET_S
        if i >= len(self.payloads):
            heard = [first for first, _ in self.media.runs]
            if len(answers(self.spans, self.t0, heard)) == len(self.spans) and due - self.media.runs[-1][1] >= QUIET_S:
                self.done.set_result("")
                return
            if i - len(self.payloads) > END_WAIT_S / PACKET_S:
                # Still talking (random weights never end a reply: up to [engine] max_frames of it, 20 s
                # at the bench's 250): the caller hangs up, as a person would. An unanswered turn is the
                # call's error, counted at its end.
                self.done.set_result("")
                return
        self.result.send_late_ms.append((now - due) * 1000)
        payload = self.payloads[i] if i < len(self.payloads) else ULAW_SILENCE
        self.out.sendto(rtp.build(PCMU, self.sequence + i, self.timestamp + i * FRAME, self.ssrc, payload,
                                  marker=i == 0), self.remote)
        self.sent += 1
        self.loop.call_at(due + PACKET_S, self._send)

    def stop(self) -> None:
        if not self.done.done():
            self.done.set_result("")


def call_process(gateway: tuple[str, int], plan: list[float], zero: float, responder: str, cycles: int) -> dict:
    """One load-generator process: its calls, each starting at an offset (s) from the wall time ``zero``."""
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))  # three sockets a call

    async def run() -> Sessions:
        result = Sessions()
        loop = asyncio.get_running_loop()
        ulaw = phone_audio(scenario(responder) * cycles)
        payloads = [ulaw[i : i + FRAME] for i in range(0, len(ulaw), FRAME)]
        spans = spans_of(ulaw)
        lags: list[float] = []
        probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
        base = loop.time() - time.time() + zero
        await asyncio.gather(*(phone_call(gateway, payloads, spans, base + offset, result) for offset in plan))
        probe.cancel()
        result.lag_p99_ms.append(pct(lags, 99))
        return result

    return asdict(asyncio.run(run()))


def run_calls(pool: Pool, gateway: tuple[str, int], n: int, responder: str, cycles: int, spread: float,
              aligned: bool, seed: int) -> tuple[Sessions, float, float]:
    """n calls to the gateway's SIP address over the pool's processes, arriving as bench/load.py's sessions do;
    what they measured, and the level's start and end (wall time)."""
    length_s = len(scenario(responder)) * cycles / 48000
    offsets = arrivals(n, spread or length_s, aligned, random.Random(seed))
    return spread_over(pool, call_process, gateway, offsets, responder, cycles)


def join(result: Sessions, traces: list[dict[str, Any]], silence_ms: float) -> None:
    """The calls' turns in the gateway's trace: each call's VAD lateness and stop → first audio, and its responses'
    statuses, into ``result``."""
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in traces:
        if "line_call_id" in record and "response_id" in record:
            records[record["line_call_id"]].append(record)
    for call in result.sip_calls:
        mine = sorted(records.get(call["line_call_id"], []), key=lambda r: r["at_ms"])
        if not mine:
            result.audio_errors.append(f"{call['line_call_id']}: no turn of the call in the gateway's trace")
        timed: set[int] = set()
        for record in mine:
            result.responses[record["response_id"]] = record["status"]
            if "audio_end_ms" not in record:
                continue
            k = nearest(call["spans"], record["audio_end_ms"])
            if k in timed:
                continue
            timed.add(k)
            result.stop_late_ms.append(record["at_ms"] - call["t0_ms"] - record["audio_end_ms"] - silence_ms)
            if (heard := call["heard_ms"].get(k)) is not None:
                result.first_delta_ms.append(heard - record["at_ms"])
