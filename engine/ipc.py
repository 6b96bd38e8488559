"""The engine process's wire protocol: ZeroMQ multipart messages between gateway processes and an engine process.

An engine process (engine.process) binds one ROUTER socket; each gateway process connects one DEALER
socket to it. A message is a list of frames, the first naming its kind; stream ids are chosen by the
client, 8 bytes, unique per connection. Text is UTF-8, audio pcm16 mono 24 kHz, control payloads JSON.

client -> engine                                 engine -> client
  HELLO  json {pid}                                HELLO  json {instance, voices, languages, kinds, ...}
  PING                                             PONG   instance, load (streams held, ASCII)
  OPEN   sid, voice, language ("" = auto)          PACKET sid, text, pcm
         [, prompt, instructions, sampling         DONE   sid
          [, text [, END]]]
  FEED   sid, text                                 ERROR  sid, INPUT | ENGINE, message
  END    sid                                       STATS  token, json
  CANCEL sid                                       RESET  reason (this client's streams here are gone)
  STATS  token                                     VOICE  token, OK | INPUT | ENGINE, voice bytes or message
  PREPARE token, audio, rate, text
  BYE

OPEN's optional frames: a prepared voice (engine.voices.VoicePrompt.to_bytes, "" = none), instructions
("" = none), the stream's own sampling (engine.api.Sampling's fields that are set, as JSON; "" = none), then
the text fed before the OPEN left and END when the stream's end came too: as FEED and END would say them.
PREPARE clones a voice from reference audio (float32 little-endian mono samples at `rate`, ASCII; `text` its
transcript, "" = none); VOICE answers it.

Liveness runs both ways on the heartbeat. A client pings every heartbeat; the engine frees the streams
of a client it has not heard from for MISSED_HEARTBEATS heartbeats (or one it can no longer send to), and
answers RESET if that client speaks again. A client takes an engine it has not heard from for as long, or
whose connection dropped, as gone, and one whose PONG names a new instance as restarted. This module
imports neither torch nor zmq: the client's side uses it too.
"""

from __future__ import annotations

import json

from engine.api import Sampling, TTSError

HELLO, PING, PONG, OPEN, FEED, END, CANCEL, STATS, BYE = (b"hello", b"ping", b"pong", b"open", b"feed", b"end",
                                                          b"cancel", b"stats", b"bye")
PREPARE = b"prepare"
PACKET, DONE, ERROR, RESET, VOICE = b"packet", b"done", b"error", b"reset", b"voice"
INPUT, ENGINE = b"input", b"engine"  # an ERROR's cause: bad input (TTSError), or the engine failed
OK = b"ok"
MISSED_HEARTBEATS = 4
# Messages queued towards one peer before it counts as not keeping up (ZeroMQ's high-water mark): about
# 4 minutes of audio packets of 320 ms for 100 streams; bounds what a stuck peer can hold.
QUEUE_LIMIT = 10_000


class EngineGone(RuntimeError):
    """The engine process stopped or cannot be reached; its streams fail with this."""


def sid_bytes(n: int) -> bytes:
    return n.to_bytes(8, "big")


def sampling_bytes(sampling: Sampling) -> bytes:
    return json.dumps({k: v for k, v in vars(sampling).items() if v is not None}).encode()


def sampling_from_bytes(data: bytes) -> Sampling:
    """OPEN's sampling frame; TTSError for anything but an object of Sampling's fields."""
    try:
        fields = json.loads(data)
        return Sampling(**fields)
    except (ValueError, TypeError):
        raise TTSError("the stream's sampling is not an object of engine.api.Sampling's fields") from None
