"""The engine process's wire protocol: ZeroMQ multipart messages between gateway processes and an engine process.

An engine process (engine.process) binds one ROUTER socket; each gateway process connects one DEALER
socket to it. A message is a list of frames, the first naming its kind; stream ids are chosen by the
client, 8 bytes, unique per connection. Text is UTF-8, audio pcm16 mono 24 kHz, control payloads JSON.

client -> engine                                 engine -> client
  HELLO  json {pid}                                HELLO  json {instance, voices, languages, kinds, ...}
  PING                                             PONG   instance, load (streams held, ASCII)
  OPEN   sid, json {voice, ...} [, prompt]         PACKET sid, text, pcm
                                                   DONE   sid
  FEED   sid, text                                 ERROR  sid, INPUT | ENGINE, message
  END    sid                                       STATS  token, json
  CANCEL sid                                       RESET  reason (this client's streams here are gone)
  STATS  token                                     VOICE  token, OK | INPUT | ENGINE, voice bytes or message
  PREPARE token, audio, rate, text                 TURN   token, OK | INPUT | ENGINE, P(complete) or message
  TURN   token, audio
  BYE

OPEN's JSON object holds the voice and, when there are any, "language", "instructions", "sampling" (the
stream's own: engine.api.Sampling's fields that are set), "text" (fed before the OPEN left) and "end" (true
when the stream's end came too): as FEED and END would say them. Its optional last frame is a prepared voice
(engine.voices.VoicePrompt.to_bytes). One object, not a frame per field: a burst of requests opens hundreds
of streams at once, and every frame costs the sending event loop a few microseconds.
PREPARE clones a voice from reference audio (float32 little-endian mono samples at `rate`, ASCII; `text` its
transcript, "" = none); VOICE answers it. TURN asks the end-of-turn model (engine.turn_model, on an engine
started with one: its hello's "turns") whether a turn's audio is finished (float32 little-endian mono 16 kHz,
its last 8 s at most); the answer's P(complete) is ASCII. The TURNs that arrive together run as one batch.

An engine process started with the VAD model ([engine] vad_model; its hello's "vad") binds a second ROUTER
socket at vad_endpoint(endpoint), served by a thread of its own so that a VAD step never waits for a TTS
step. Each gateway process's VAD thread sends it one step of its sessions' windows at a time:

client -> engine                                 engine -> client
  token, x, state                                  token, OK, P(speech), state
                                                   token, INPUT | ENGINE, message
x is B windows of 576 float32 (little-endian: 64 samples of context, then 512 new at 16 kHz), state the
LSTM's [2, B, 128] float32 (engine.vad_model); the answer has B float32 probabilities and the next state. The
steps that arrive together run as one batch.

Liveness runs both ways on the heartbeat. A client pings every heartbeat; the engine frees the streams
of a client it has not heard from for MISSED_HEARTBEATS heartbeats (or one it can no longer send to), and
answers RESET if that client speaks again. A client takes an engine it has not heard from for as long, or
whose connection dropped, as gone, and one whose PONG names a new instance as restarted. This module
imports neither torch nor zmq: the client's side uses it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.api import Sampling, TTSError

HELLO, PING, PONG, OPEN, FEED, END, CANCEL, STATS, BYE = (b"hello", b"ping", b"pong", b"open", b"feed", b"end",
                                                          b"cancel", b"stats", b"bye")
PREPARE, TURN = b"prepare", b"turn"
PACKET, DONE, ERROR, RESET, VOICE = b"packet", b"done", b"error", b"reset", b"voice"
INPUT, ENGINE = b"input", b"engine"  # an ERROR's cause: bad input (TTSError), or the engine failed
OK = b"ok"
MISSED_HEARTBEATS = 4
# Messages queued towards one peer before it counts as not keeping up (ZeroMQ's high-water mark): about
# 4 minutes of audio packets of 320 ms for 100 streams; bounds what a stuck peer can hold.
QUEUE_LIMIT = 10_000


class EngineGone(RuntimeError):
    """The engine process stopped or cannot be reached; its streams fail with this."""


def vad_endpoint(endpoint: str) -> str:
    """Where the engine process at `endpoint` serves the VAD: beside its socket file (ipc://PATH.vad), or on the
    next TCP port."""
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + 1}"
    return endpoint + ".vad"


def sid_bytes(n: int) -> bytes:
    return n.to_bytes(8, "big")


@dataclass(frozen=True)
class Open:
    """What an OPEN opens: the stream's voice (a name, or with `prompt` a prepared voice's) and its own
    settings."""

    voice: str
    language: str | None = None  # None: the engine's automatic choice
    prompt: bytes = b""  # engine.voices.VoicePrompt.to_bytes; b"" = none
    instructions: str | None = None
    sampling: Sampling | None = None


def open_frames(sid: bytes, spec: Open, text: str = "", end: bool = False) -> list[bytes]:
    """The OPEN message for stream `sid`, carrying the text fed and the end given before it left."""
    header: dict[str, Any] = {"voice": spec.voice}
    if spec.language:
        header["language"] = spec.language
    if spec.instructions:
        header["instructions"] = spec.instructions
    if spec.sampling is not None:
        header["sampling"] = {k: v for k, v in vars(spec.sampling).items() if v is not None}
    if text:
        header["text"] = text
    if end:
        header["end"] = True
    return [OPEN, sid, json.dumps(header).encode(), *([spec.prompt] if spec.prompt else [])]


def read_open(args: list[bytes]) -> tuple[Open, str, bool]:
    """An OPEN's frames after its sid: what it opens, its text ("" = none) and whether it ends the stream;
    TTSError for a header that is not what open_frames writes."""
    try:
        header = json.loads(args[1])
        voice, language, instructions = header["voice"], header.get("language"), header.get("instructions")
        text, end, sampling = header.get("text", ""), header.get("end", False), header.get("sampling")
        if not all(isinstance(v, str) for v in (voice, text)) or not isinstance(end, bool) or any(
                v is not None and not isinstance(v, str) for v in (language, instructions)):
            raise TypeError
        spec = Open(voice, language or None, args[2] if len(args) > 2 else b"", instructions or None,
                    None if sampling is None else Sampling(**sampling))
    except (ValueError, TypeError, KeyError):
        raise TTSError("the stream's OPEN is not engine.ipc.open_frames's") from None
    return spec, text, end
