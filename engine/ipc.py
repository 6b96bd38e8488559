"""The engine process's wire protocol: ZeroMQ multipart messages between gateway processes and an engine process.

An engine process (engine.process) binds one ROUTER socket; each gateway process connects one DEALER
socket to it. A message is a list of frames, the first naming its kind; stream ids are chosen by the
client, 8 bytes, unique per connection. Text is UTF-8, audio pcm16 mono 24 kHz, control payloads JSON.

client -> engine                                 engine -> client
  HELLO  json {pid}                                HELLO  json {instance, voices, languages, max_text_chars, ...}
  PING                                             PONG   instance, load (streams held, ASCII)
  OPEN   sid, voice, language ("" = auto)          PACKET sid, text, pcm
  FEED   sid, text                                 DONE   sid
  END    sid                                       ERROR  sid, INPUT | ENGINE, message
  CANCEL sid                                       STATS  token, json
  STATS  token                                     RESET  reason (this client's streams here are gone)
  BYE

Liveness runs both ways on the heartbeat. A client pings every heartbeat; the engine frees the streams
of a client it has not heard from for MISSED_HEARTBEATS heartbeats (or one it can no longer send to), and
answers RESET if that client speaks again. A client takes an engine it has not heard from for as long, or
whose connection dropped, as gone, and one whose PONG names a new instance as restarted. This module
imports neither torch nor zmq: the client's side uses it too.
"""

from __future__ import annotations

HELLO, PING, PONG, OPEN, FEED, END, CANCEL, STATS, BYE = (b"hello", b"ping", b"pong", b"open", b"feed", b"end",
                                                          b"cancel", b"stats", b"bye")
PACKET, DONE, ERROR, RESET = b"packet", b"done", b"error", b"reset"
INPUT, ENGINE = b"input", b"engine"  # an ERROR's cause: bad input (TTSError), or the engine failed
MISSED_HEARTBEATS = 4
# Messages queued towards one peer before it counts as not keeping up (ZeroMQ's high-water mark): about
# 4 minutes of audio packets of 320 ms for 100 streams; bounds what a stuck peer can hold.
QUEUE_LIMIT = 10_000


class EngineGone(RuntimeError):
    """The engine process stopped or cannot be reached; its streams fail with this."""


def sid_bytes(n: int) -> bytes:
    return n.to_bytes(8, "big")
