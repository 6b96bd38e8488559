"""RTP, RFC 4733 and SDP: the jitter buffer's order and holes, DTMF events, offers, and a call's stream on
loopback sockets."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from gateway.audio import RationalResampler
from gateway.transports.playout import PlayoutQueue
from gateway.transports.sip import rtp, sdp
from gateway.transports.sip.media import FRAME, RATE, PortPool, RtpStream


def packet(sequence: int, payload: bytes = b"\xff" * 160, ssrc: int = 7) -> rtp.Packet:
    parsed = rtp.parse(rtp.build(0, sequence, sequence * 160, ssrc, payload))
    assert parsed is not None
    return parsed


def test_packets_out_of_order_come_out_in_order_and_a_hole_waits_then_is_silence() -> None:
    buffer = rtp.JitterBuffer(wait_s=0.04)
    buffer.add(packet(10), 0.0)
    assert [len(p) for _, p in buffer.ready(0.0)] == [160]  # in order: out at once, nothing held
    buffer.add(packet(12), 0.02)
    buffer.add(packet(13), 0.02)
    assert buffer.ready(0.03) == []  # 11 may still come
    buffer.add(packet(11, b"\x7f" * 160), 0.035)
    assert [p[:1] for _, p in buffer.ready(0.035)] == [b"\x7f", b"\xff", b"\xff"]
    buffer.add(packet(15), 0.1)
    assert buffer.ready(0.12) == []
    (gap, _), = buffer.ready(0.15)  # 14 is given up on: its 20 ms come back as silence before 15
    assert gap == 160 and buffer.lost == 1
    buffer.add(packet(9), 0.2)  # older than what went out
    assert buffer.ready(0.2) == [] and buffer.late == 1


async def test_the_callers_audio_is_ready_as_its_packet_arrives_and_a_hole_waits_for_the_clock() -> None:
    phone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    phone.bind(("127.0.0.1", 0))
    offer = sdp.Offer("127.0.0.1", phone.getsockname()[1], "PCMU", 0, None)
    sockets = PortPool("127.0.0.1", 42000, 42100).open()
    assert sockets is not None
    stream = RtpStream(offer, sockets, 0.04, PlayoutQueue(RATE, FRAME, lambda: RationalResampler(1, 3)), "127.0.0.1")
    await stream.start()
    try:
        to_us = ("127.0.0.1", stream.port)
        phone.sendto(rtp.build(0, 1, 160, 7, b"\x00" * 160), to_us)
        await asyncio.wait_for(stream.arrived.wait(), 2)  # no clock runs here: the packet woke the reader
        stream.arrived.clear()
        pcm, keys = stream.take_input(time.monotonic())
        assert len(pcm) >= 2 * 3 * 100 and keys == []  # most of its 20 ms at 24 kHz (the resampler holds a few)
        phone.sendto(rtp.build(0, 3, 480, 7, b"\x00" * 160), to_us)  # 2 is missing
        await asyncio.wait_for(stream.arrived.wait(), 2)
        stream.arrived.clear()
        assert stream.take_input(time.monotonic()) == (b"", [])  # 3 waits for 2
        stream.tick(time.monotonic())
        assert stream.arrived.is_set()  # the clock wakes the reader while a hole waits
        stream.arrived.clear()
        await asyncio.sleep(0.05)  # past the hole's 40 ms
        assert len(stream.take_input(time.monotonic())[0]) >= 2 * 3 * 300  # given up on 2: its silence, then 3
    finally:
        stream.close()
        phone.close()


def test_sequence_numbers_wrap() -> None:
    buffer = rtp.JitterBuffer(wait_s=0.04)
    for n in (65534, 65535, 0, 1):
        buffer.add(packet(n), 0.0)
    assert len(buffer.ready(0.0)) == 4


@pytest.mark.parametrize("ssrc", [7, 8])
def test_a_stream_that_starts_over_behind_is_followed_not_dropped_as_late(ssrc: int) -> None:
    """A phone back from hold, or a bridge that switched its source (a new SSRC or not), restarts its sequence
    numbers, here 1050 behind: two packets in sequence confirm it, and the stream is followed from there."""
    buffer = rtp.JitterBuffer(wait_s=0.04)
    for n in range(2000, 2010):
        buffer.add(packet(n), 0.0)
    assert len(buffer.ready(0.0)) == 10
    buffer.add(packet(950, b"\x7f" * 160, ssrc), 0.1)
    assert buffer.ready(0.1) == []  # one packet alone may be a stray
    for n in (951, 952):
        buffer.add(packet(n, b"\x7f" * 160, ssrc), 0.12)
    assert [p[:1] for _, p in buffer.ready(0.12)] == [b"\x7f", b"\x7f"]
    assert buffer.late == 1 and buffer.lost == 0


def test_dtmf_events_round_trip_and_other_events_are_not_keys() -> None:
    assert rtp.dtmf_event(rtp.dtmf_payload("#", True, 800)) == ("#", True)
    assert rtp.dtmf_event(rtp.dtmf_payload("7", False, 160)) == ("7", False)
    assert rtp.dtmf_event(bytes([40, 0, 0, 160])) is None  # a tone, not a key
    assert rtp.dtmf_event(b"\x01") is None


def test_not_rtp_is_none() -> None:
    assert rtp.parse(b"\x00" * 20) is None  # version 0
    assert rtp.parse(rtp.sender_report(1, 2, 3, 4)) is None  # RTCP
    assert rtp.parse(b"\x80\x00") is None
    assert rtp.parse(bytes([0x8F]) + bytes(11)) is None  # 15 CSRCs claimed, none there


def test_an_offer_is_answered_with_its_first_g711_and_its_telephone_event() -> None:
    offer = sdp.parse_offer("v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
                            "m=audio 4000 RTP/AVP 9 8 0 101\r\na=rtpmap:9 G722/8000\r\na=rtpmap:8 PCMA/8000\r\n"
                            "a=rtpmap:101 telephone-event/8000\r\n")
    assert (offer.address, offer.port, offer.codec, offer.payload_type, offer.dtmf_payload_type) == (
        "10.0.0.1", 4000, "PCMA", 8, 101)
    answer = sdp.answer(offer, "192.0.2.5", 20000)
    assert "m=audio 20000 RTP/AVP 8 101" in answer and "c=IN IP4 192.0.2.5" in answer


def test_every_offered_stream_gets_a_line_and_the_direction_answers_the_offers() -> None:
    """RFC 3264 §6: a line for each offered one, in order (video refused with port 0); a format not on the
    audio line is not answered, telephone-event included; a hold's sendonly gets recvonly."""
    offer = sdp.parse_offer("v=0\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\nm=video 5000 RTP/AVP 96\r\n"
                            "a=rtpmap:96 H264/90000\r\nm=audio 4000 RTP/AVP 0\r\na=rtpmap:101 telephone-event/8000"
                            "\r\na=sendonly\r\n")
    assert offer.dtmf_payload_type is None
    answer = sdp.answer(offer, "192.0.2.5", 20000, (77, 2))
    media = [line for line in answer.split("\r\n") if line.startswith("m=")]
    assert media == ["m=video 0 RTP/AVP 96", "m=audio 20000 RTP/AVP 0"]
    assert "a=recvonly" in answer and "o=voice-gateway 77 2 IN IP4 192.0.2.5" in answer


@pytest.mark.parametrize("text, status", [
    ("hello", 400),
    ("v=0\r\nc=IN IP4 10.0.0.1\r\nm=audio 0 RTP/AVP 0\r\n", 488),  # the stream is declined
    ("v=0\r\nc=IN IP4 nowhere\r\nm=audio 4000 RTP/AVP 0\r\n", 400),
    ("v=0\r\nc=IN IP4 10.0.0.1\r\nm=audio 4000 RTP/SAVP 0\r\n", 488),
    ("v=0\r\nc=IN IP4 10.0.0.1\r\nm=video 4000 RTP/AVP 96\r\n", 488),
])
def test_offers_we_cannot_answer(text: str, status: int) -> None:
    with pytest.raises(sdp.OfferError) as refused:
        sdp.parse_offer(text)
    assert refused.value.status == status
